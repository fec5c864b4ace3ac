"""TOML text → validated ``Suite``. Every error names the file, the key and the bad value."""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from iomatrix.core.errors import SuiteError
from iomatrix.suite.model import Suite

_MESSAGES = {
    "extra_forbidden": "unknown key",
    "missing": "required key is missing",
}


def builtin_suites() -> dict[str, str]:
    """Built-in suite name → its TOML text."""
    folder = resources.files("iomatrix.suite.builtin")
    return {entry.name.removesuffix(".toml"): entry.read_text(encoding="utf-8")
            for entry in sorted(folder.iterdir(), key=lambda e: e.name)
            if entry.name.endswith(".toml")}


def load_suite(ref: str | Path) -> Suite:
    """A suite from a file path, or from a built-in name such as ``quick``."""
    path = Path(ref)
    if path.is_file():
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise SuiteError(f"{path}: cannot read: {exc}") from exc
        return load_suite_text(text, source=str(path))
    builtins = builtin_suites()
    if str(ref) in builtins:
        return load_suite_text(builtins[str(ref)], source=f"builtin:{ref}")
    raise SuiteError(f"{ref}: no such file and no built-in suite of that name",
                     hint="built-in suites: " + ", ".join(builtins))


def load_suite_text(text: str, *, source: str = "<suite>") -> Suite:
    """Validate suite TOML text; ``source`` names it in errors."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SuiteError(f"{source}: TOML syntax error: {exc}") from exc
    except RecursionError:
        raise SuiteError(f"{source}: TOML nested too deeply") from None
    single_workloads = isinstance(raw.get("workloads"), dict)
    if single_workloads:
        raw["workloads"] = [raw["workloads"]]
    raw["source_text"] = text
    raw["source_path"] = source
    try:
        return Suite.model_validate(raw)
    except ValidationError as exc:
        lines = [_describe(err, single_workloads) for err in exc.errors()]
        raise SuiteError(f"{source}: " + f"\n{source}: ".join(lines)) from exc


def _describe(err: Any, single_workloads: bool) -> str:
    loc = list(err["loc"])
    # pydantic appends the failing union/literal branch to loc; keep only keys and indexes.
    loc = [part for part in loc if not (isinstance(part, str) and ("[" in part or part.startswith("function-")))]
    if len(loc) == 1 and err["type"] in ("extra_forbidden", "missing"):
        what = "unknown table" if err["type"] == "extra_forbidden" else "required table is missing"
        return f"[{loc[0]}]: {what}"
    key = _key(loc, single_workloads)
    message = _MESSAGES.get(err["type"], err["msg"])
    message = message.removeprefix("Value error, ")
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
    elif rest or table in ("suite", "target", "matrix", "method"):
        head = f"[{table}]"
    else:
        return str(table)
    text = head
    for part in rest:
        text += f"[{part}]" if isinstance(part, int) else f" {part}"
    return text
