"""TOML text → validated ``Suite``. Every error names the file, the key and the bad value.

A suite file may offer scales: [scale.NAME] tables that change its [target], [matrix] and
[method] key by key and may replace its [[workloads]], [[part]] and [[targets]] lists
(``model.Scale``).
``load_suite(ref, scale=NAME)`` applies one; every scale of a file is validated whenever the
file is loaded, as a whole suite, so a broken scale is found before anyone asks for it.

Nothing edits a suite's text: ``Suite.source_text`` is the file as read, and ``Suite.tables``
the tables it was validated from (a scale applied, with ``[suite] scale`` naming it; the job
files it names carried as [jobfiles]). What a run changes (``measure.prepare``: the VM's disk,
the Proxmox host, ``--target``, a storage id) it changes in those tables, validated again as a
whole (``with_tables``); a run stores them as its spec (``iomatrix.suite.spec``), and a stored
spec is loaded back through the same checks (``suite_of_tables``)."""

from __future__ import annotations

import math
import os
import re
import sys
import tomllib
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from iomatrix.core.errors import SuiteError
from iomatrix.core.trust import US, Author, read_authored
from iomatrix.suite.jobfiles import TABLE as JOBFILES, carry, workload_groups
from iomatrix.suite.fields import DEFAULT_SCALE, SCALE_NAME
from iomatrix.suite.matrix import Reference
from iomatrix.suite.model import Suite
from iomatrix.suite.scale import Scale, ScaleInfo

_MESSAGES = {
    "extra_forbidden": "unknown key",
    "missing": "required key is missing",
}
_INTERNAL = ("scales", "source_text", "source_path", "tables", "author")
"""Suite fields ``load`` fills in; a suite file may not set them."""
MAX_SUITE_BYTES = 16 << 20
"""The largest suite file read (its job files may be carried in it: ``jobfiles.carry``)."""
_MERGED = ("target", "matrix", "method")
"""Tables a scale changes key by key (the lists, [[workloads]] and [[part]], it replaces)."""


def builtin_suites() -> dict[str, str]:
    """Built-in suite name → its TOML text."""
    folder = resources.files("iomatrix.suite.builtin")
    return {entry.name.removesuffix(".toml"): entry.read_text(encoding="utf-8")
            for entry in sorted(folder.iterdir(), key=lambda e: e.name)
            if entry.name.endswith(".toml")}


def load_suite(ref: str | Path, *, scale: str | None = None) -> Suite:
    """A suite from a file path, or from a built-in name such as ``quick``; at ``scale`` (one
    of its [scale.NAME] tables; None or "default": the suite's own tables). Its ``author`` is
    whoever could have written the file (``read_authored``: judged from the descriptor it is
    read from); a built-in suite's is us."""
    path = Path(ref)
    builtins = builtin_suites()
    if path.is_file() or (os.path.lexists(path) and str(ref) not in builtins):
        data, author = read_authored(path, f"suite {path}", max_bytes=MAX_SUITE_BYTES,
                                     error=lambda why: SuiteError(f"{path}: cannot read: {why}"))
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SuiteError(f"{path}: cannot read: {exc}") from None
        return with_author(load_suite_text(text, source=str(path), scale=scale,
                                           directory=path.parent), author)
    if str(ref) in builtins:
        return with_author(load_suite_text(builtins[str(ref)], source=f"builtin:{ref}",
                                           scale=scale), US)
    raise SuiteError(f"{ref}: no such file and no built-in suite of that name",
                     hint="built-in suites: " + ", ".join(builtins))


def load_suite_text(text: str, *, source: str = "<suite>", scale: str | None = None,
                    directory: Path | None = None) -> Suite:
    """Validate suite TOML text (and every scale it offers); ``source`` names it in errors.
    With ``scale``, the suite as that [scale.NAME] table makes it. Job files it names are read
    from ``directory`` (the suite file's) unless it carries them (``jobfiles.carry``)."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SuiteError(f"{source}: TOML syntax error: {exc}") from exc
    except RecursionError:
        raise SuiteError(f"{source}: TOML nested too deeply") from None
    except ValueError:          # the one tomllib lets through: Python's int() digit limit
        raise SuiteError(f"{source}: a number of more than {sys.get_int_max_str_digits()} "
                         "digits") from None
    for key in _INTERNAL:
        if key in raw:
            raise SuiteError(f"{source}: {key}: unknown key")
    read = carry(raw, source=source, directory=directory)
    if read:                  # kept in the tables a run stores: --resume needs no file
        raw[JOBFILES] = read
    scales = _scales(raw.pop("scale", None), source)
    if scales and isinstance(raw.get("suite"), dict) and "scale" in raw["suite"]:
        raise SuiteError(f"{source}: [suite] scale: iomatrix writes it into a suite resolved at "
                         "one scale, which has no [scale.NAME] tables left",
                         hint="choose a scale with `iomatrix run SUITE --scale NAME`")
    infos = tuple(ScaleInfo(name=name, description=s.description) for name, s in scales.items())
    base = _validate(raw, text, source, infos)
    chosen: Suite | None = None
    for name, table in scales.items():
        resolved = _apply(raw, name, table)
        suite = _validate(resolved, text, source, infos, where=f"[scale.{name}] ")
        if name == scale:
            chosen = suite.model_copy(update={"source_path": f"{source} --scale {name}"})
    if scale is None or scale == DEFAULT_SCALE:
        return base
    if chosen is None:
        offered = (f"its scales are {', '.join(scales)}" if scales
                   else "it has no [scale.NAME] tables")
        listing = (f"; `iomatrix suites {source.removeprefix('builtin:')}` prints them"
                   if scales and source.startswith("builtin:") else "")
        raise SuiteError(f"{source}: no scale {scale!r}: {offered}",
                         hint="omit --scale to run the suite's own tables" + listing)
    return chosen


def with_author(suite: Suite, author: Author) -> Suite:
    """``suite`` as written by ``author``: a stored run's suite resumed is its database's
    (``author_of`` of an SQLite file; ``Author(ANYONE)`` for a shared PostgreSQL store)."""
    return suite.model_copy(update={"author": author})


def suite_file(suite: Suite) -> Path | None:
    """The file a suite was loaded from (None for a built-in suite or text without a file):
    files it names ([matrix] from_vm) are looked for beside it."""
    source = suite.source_path
    if suite.scale is not None:
        source = source.removesuffix(f" --scale {suite.scale}")
    if not source or source.startswith("builtin:") or source.startswith("<"):
        return None
    return Path(source)


def with_tables(suite: Suite, table: str, values: Mapping[str, Any], *,
                replace: bool = False) -> Suite:
    """``suite`` with ``values`` set in its [``table``] (``replace``: as that whole table),
    validated again as a whole, as its file would be (its text, scales and author kept): how
    ``measure.prepare`` changes a suite. SuiteError says what the change makes invalid."""
    tables = dict(suite.tables)
    base = tables.get(table)
    tables[table] = dict(values) if replace else {**(base if isinstance(base, dict) else {}),
                                                  **values}
    changed = _validate(tables, suite.source_text, suite.source_path, suite.scales)
    return changed.model_copy(update={"author": suite.author})


def suite_of_tables(tables: Mapping[str, Any], *, text: str, source: str) -> Suite:
    """The suite a run stored as its spec's tables, through every check its file's tables get
    (a stored spec is as untrusted as the text: a key only ``load`` sets, [scale] tables or a
    job file not carried are refused); its author is anyone's until its loader says whose
    (``with_author``)."""
    raw = dict(tables)
    for key in (*_INTERNAL, "scale"):
        if key in raw:
            raise SuiteError(f"{source}: {key}: unknown key")
    carry(raw, source=source, directory=None)      # reads no file: they are carried or refused
    return _validate(raw, text, source, ())


def _scales(value: Any, source: str) -> dict[str, Scale]:
    """The [scale.NAME] tables, checked for their shape and key names."""
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        raise SuiteError(f"{source}: [scale]: write one table per scale, e.g. [scale.quick] "
                         "with [scale.quick.method] beneath it")
    scales: dict[str, Scale] = {}
    for name, table in value.items():
        if not re.fullmatch(SCALE_NAME, name) or len(name) > 40:
            raise SuiteError(f"{source}: [scale.{name}]: a scale's name is letters, digits, "
                             "'.', '_' and '-' (at most 40, starting with a letter or digit)")
        if name == DEFAULT_SCALE:
            raise SuiteError(f"{source}: [scale.{name}]: {DEFAULT_SCALE!r} names the suite's "
                             "own tables; give this scale another name")
        try:
            scales[name] = Scale.model_validate(table)
        except ValidationError as exc:
            lines = [f"[scale.{name}] {err['loc'][0]}: unknown key (a scale holds description, "
                     "target, matrix, method, workloads, part and targets)"
                     if err["type"] == "extra_forbidden" and len(err["loc"]) == 1
                     else f"[scale.{name}] " + _describe(err, False) for err in exc.errors()]
            raise SuiteError(f"{source}: " + f"\n{source}: ".join(lines)) from exc
    return scales


def _apply(raw: dict[str, Any], name: str, scale: Scale) -> dict[str, Any]:
    """The suite's raw tables with one scale applied."""
    out = dict(raw)
    for table in _MERGED:
        changes = getattr(scale, table)
        if changes:
            base = out.get(table, {})
            out[table] = {**(base if isinstance(base, dict) else {}), **changes}
    if scale.workloads is not None:
        out["workloads"] = scale.workloads
    if scale.part is not None:
        out["part"] = scale.part
    if scale.targets is not None:
        out["targets"] = scale.targets
    info = out.get("suite")
    out["suite"] = {**(info if isinstance(info, dict) else {}), "scale": name}
    return out


def _validate(tables: Mapping[str, Any], text: str, source: str,
              scales: tuple[ScaleInfo, ...], *, where: str = "") -> Suite:
    """The suite ``tables`` make, ``text`` its source text; SuiteError naming each bad key."""
    tables = dict(tables)
    raw = dict(tables)
    single_workloads = isinstance(raw.get("workloads"), dict)
    if single_workloads:
        raw["workloads"] = [raw["workloads"]]
    raw["scales"] = scales
    raw["source_text"] = text
    raw["source_path"] = source
    try:
        suite = Suite.model_validate(raw)
    except ValidationError as exc:
        lines = [where + _describe(err, single_workloads) for err in exc.errors()]
        raise SuiteError(f"{source}: " + f"\n{source}: ".join(lines)) from exc
    except RecursionError:
        raise SuiteError(f"{source}: nested too deeply") from None
    workload_groups(suite, where=where)       # a job file iomatrix cannot honour: refused now
    return suite.model_copy(update={"tables": tables})


def _describe(err: Any, single_workloads: bool) -> str:
    loc = list(err["loc"])
    # pydantic appends the failing union/literal branch to loc; keep only keys and indexes.
    loc = [part for part in loc if not (isinstance(part, str) and ("[" in part or part.startswith("function-")))]
    if len(loc) == 1 and err["type"] in ("extra_forbidden", "missing"):
        what = "unknown table" if err["type"] == "extra_forbidden" else "required table is missing"
        return f"[{loc[0]}]: {what}"
    message = _MESSAGES.get(err["type"], err["msg"])
    message = message.removeprefix("Value error, ")
    if not loc:                  # a rule across tables: its message names the keys
        return message
    key = _key(loc, single_workloads)
    if err["type"] == "missing":
        return f"{key}: {message}"
    value = err.get("input")
    if isinstance(value, dict):
        return f"{key}: {message}"
    return f"{key} = {value!r}: {message}"


def _key(loc: list[Any], single_workloads: bool) -> str:
    if not loc:
        return "(top level)"
    table, rest = loc[0], loc[1:]
    if table == "workloads":
        if rest and isinstance(rest[0], int):
            index, rest = rest[0], rest[1:]
            head = "[workloads]" if single_workloads else f"[[workloads]] #{index + 1}"
        else:
            head = "[workloads]"
    elif table == "targets" and rest and isinstance(rest[0], int):
        head, rest = f"[[{table}]] #{rest[0] + 1}", rest[1:]
    elif rest or table in ("suite", "target", "matrix", "method"):
        head = f"[{table}]"
    else:
        return str(table)
    text = head
    for part in rest:
        text += f"[{part}]" if isinstance(part, int) else f" {part}"
    return text


# -- the resolved suite as TOML ---------------------------------------------------------------
_ORDER = ("suite", "target", "matrix", "method")
_ARRAYS = ("targets", "workloads", "part", "finding")
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def tables_text(raw: Mapping[str, Any], source: str) -> str:
    """A suite's validated tables (a run's spec: ``Suite.tables``) as TOML that loads to the
    same suite (``export --format suite``); written anew, never an edit of the user's text."""
    scale = raw.get("suite", {}).get("scale") if isinstance(raw.get("suite"), dict) else None
    lines = [f"# {source}" + (f" at scale {scale!r}: the suite's tables with [scale.{scale}] "
                              "applied," if scale else ": the suite as the run measured it,"),
             "# written by iomatrix (the suite file's comments are not kept)"]
    names = [*_ORDER, *(k for k in raw if k not in _ORDER and k != JOBFILES)]
    for table in names:
        value = raw.get(table)
        if isinstance(value, dict) and table not in _ARRAYS:
            lines += ["", f"[{_toml_key(table)}]", *_table_lines(value)]
        elif isinstance(value, (dict, list)):
            for item in [value] if isinstance(value, dict) else value:
                lines += ["", f"[[{_toml_key(table)}]]", *_table_lines(item)]
    if raw.get(JOBFILES):
        lines += ["", *_jobfiles_lines(raw[JOBFILES])]
    return "\n".join(lines) + "\n"


def toml_table(name: str, values: Mapping[str, Any]) -> str:
    """``[name]`` and its keys, as iomatrix writes the TOML of a suite."""
    return "\n".join([f"[{name}]", *_table_lines(values)]) + "\n"


def _jobfiles_lines(texts: dict[str, str]) -> list[str]:
    """The [jobfiles] table (name → job file text) as TOML that reads back to those texts."""
    return [f"[{JOBFILES}]", *(f"{_toml_string(name)} = {_toml_string(text, multiline=True)}"
                               for name, text in texts.items())]


def _table_lines(table: Mapping[str, Any]) -> list[str]:
    return [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in table.items()]


def _toml_key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else _toml_string(key)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}"
                                for k, v in value.items()) + " }"
    raise SuiteError(f"cannot write {value!r} into a suite file")


def _toml_string(text: str, *, multiline: bool = False) -> str:
    """A TOML basic string; ``multiline``: one in triple quotes keeping ``text``'s line breaks."""
    out = []
    for char in text:
        if char in '"\\':
            out.append("\\" + char)
        elif char == "\n":
            out.append("\n" if multiline else "\\n")
        elif ord(char) < 0x20 and char != "\t" or ord(char) == 0x7F:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(char)
    return f'"""\n{"".join(out)}"""' if multiline else '"' + "".join(out) + '"'
