"""MkDocs hook: the reference pages written from the code at build time, so they never go stale.

A page holds a marker line where generated text goes:

- ``<!-- generated: cli -->``: every command, argument and option of the Typer app
  (``iomatrix.cli.app``), with the help texts ``--help`` prints;
- ``<!-- generated: suite-keys -->``: every key of a suite file, table by table, with its type,
  default and description: the docstring under the field in the pydantic model
  (``iomatrix.suite.model`` and the table modules beside it: ``iomatrix.suite.target``...);
- ``<!-- generated: exit-status -->``: the exit statuses of ``iomatrix.cli.status.ExitStatus``,
  each described by the comment beside (and under) its member;
- ``<!-- generated: versions -->``: the store's schema version and the export format's;
- ``<!-- generated: baseline-changes -->``: the version changes that move a baseline
  (``iomatrix.analysis.baselines.CHANGES``), each with its source.

And ``changelog.md`` is the repository's CHANGELOG.md. tests/test_site.py builds the site and
calls these functions.
"""

from __future__ import annotations

import ast
import enum
import inspect
import io
import re
import textwrap
import tokenize
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.M)


# -- the command line ------------------------------------------------------------------------

def _cell(text: str) -> str:
    """Text in one cell of a Markdown table: one line, its pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def _commands() -> list[tuple[str, Any, Any]]:
    """(full name, click command, its context) of the app and every command under it, in the
    order ``--help`` lists them."""
    import typer.main

    from iomatrix.cli.app import app

    root = typer.main.get_command(app)
    context_class = type(root).context_class
    found: list[tuple[str, Any, Any]] = []

    def walk(name: str, command: Any, parent: Any) -> None:
        ctx = context_class(command, info_name=name.split()[-1], parent=parent)
        found.append((name, command, ctx))
        for sub_name, sub in getattr(command, "commands", {}).items():
            if not getattr(sub, "hidden", False):
                walk(f"{name} {sub_name}", sub, ctx)

    walk("iomatrix", root, None)
    return found


def cli_commands() -> dict[str, list[str]]:
    """Every command's full name (``iomatrix db copy``) and its options (``--for``) and
    arguments as ``--help`` shows them (``RUN [RUN...] <list[str]>``): what the CLI reference
    must hold (tests/test_site.py)."""
    found = {}
    for name, command, ctx in _commands():
        found[name] = [o for p in command.params if getattr(p, "param_type_name", "") == "option"
                       for o in (*p.opts, *p.secondary_opts)]
        found[name] += [p.get_help_record(ctx)[0] for p in command.params
                        if getattr(p, "param_type_name", "") == "argument"]
    return found


def cli_reference() -> str:
    """Markdown: each command's usage, help, arguments and options."""
    parts = []
    for name, command, ctx in _commands():
        level = "#" * min(2 + name.count(" ") - 1, 4) if name != "iomatrix" else "##"
        usage = " ".join([name, *command.collect_usage_pieces(ctx)])
        parts.append(f"{level} `{name}`\n\n```\n{usage}\n```\n")
        if command.help:
            parts.append(inspect.cleandoc(command.help).replace("\b\n", "") + "\n")
        rows = [p.get_help_record(ctx) for p in command.params
                if not getattr(p, "hidden", False)]
        rows = [r for r in rows if r]
        if rows:
            parts.append("| argument or option | what it does |\n|---|---|")
            parts.extend(f"| `{_cell(term)}` | {_cell(text)} |" for term, text in rows)
            parts.append("")
        if getattr(command, "commands", None):
            listed = ", ".join(f"`{name} {sub}`" for sub, c in command.commands.items()
                               if not getattr(c, "hidden", False))
            parts.append(f"Commands: {listed}.\n")
        if command.epilog and name == "iomatrix":
            parts.append(command.epilog + "\n")
    return "\n".join(parts)


# -- suite keys ------------------------------------------------------------------------------

def field_docstrings(model: type[BaseModel]) -> dict[str, str]:
    """The docstring written under each field of ``model`` and of the models it derives from
    (a subclass's own wins)."""
    docs: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)) or cls is BaseModel:
            continue
        try:
            source = textwrap.dedent(inspect.getsource(cls))
        except (OSError, TypeError):
            continue
        body = ast.parse(source).body[0]
        assert isinstance(body, ast.ClassDef)
        statements = body.body
        for statement, after in zip(statements, statements[1:]):
            if (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
                    and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)):
                docs[statement.target.id] = inspect.cleandoc(after.value.value)
    return docs


def _unwrap(annotation: Any) -> tuple[Any, bool]:
    """(the model or type inside Optional/tuple/Annotated, whether it is a list of them)."""
    listed = False
    while True:
        origin = typing.get_origin(annotation)
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if origin is typing.Annotated:
            annotation = args[0]
        elif origin in (typing.Union, types.UnionType) and len(args) == 1:
            annotation = args[0]
        elif origin is tuple and args and (len(args) == 1 or args[-1] is Ellipsis):
            annotation, listed = args[0], True
        else:
            return annotation, listed


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _type_name(annotation: Any) -> str:
    """A field's type as a suite writes it."""
    inner, listed = _unwrap(annotation)
    origin = typing.get_origin(inner)
    if origin is typing.Literal:
        text = " \\| ".join(f'`"{v}"`' if isinstance(v, str) else f"`{v}`".lower()
                            for v in typing.get_args(inner))
    elif isinstance(inner, type) and issubclass(inner, enum.Enum):
        text = " \\| ".join(f'`"{v.value}"`' for v in inner)
    elif origin in (typing.Union, types.UnionType):
        text = " or ".join(_type_name(a) for a in typing.get_args(inner) if a is not type(None))
    elif origin is dict:
        text = "table"
    elif isinstance(inner, type) and issubclass(inner, bool):
        text = "boolean"
    elif isinstance(inner, type) and issubclass(inner, int):
        text = "integer"
    elif isinstance(inner, type) and issubclass(inner, float):
        text = "number"
    elif _is_model(inner):
        text = "table"
    else:
        text = "string"
    return f"list of {text}" if listed else text


def _default(field: Any) -> str:
    if field.is_required():
        return "required"
    value = field.default
    if value is None or value == () or value == {}:
        return "—"
    if isinstance(value, BaseModel):
        return "—"
    if isinstance(value, tuple) and len(value) == 1:
        value = value[0]
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, tuple):
        return "`[" + ", ".join(f'"{v}"' if isinstance(v, str) else str(v) for v in value) + "]`"
    return f"`{value}`"


def suite_tables() -> list[tuple[str, type[BaseModel]]]:
    """Every table of a suite file and the model that reads it, in the order a suite is
    written: ``[target]``, ``[target.rbd]``, ``[[workloads]]``..."""
    from iomatrix.suite.load import _INTERNAL
    from iomatrix.suite.model import Suite
    from iomatrix.suite.scale import Scale

    tables: list[tuple[str, type[BaseModel]]] = []

    def walk(name: str, model: type[BaseModel]) -> None:
        tables.append((name, model))
        for key, field in model.model_fields.items():
            inner, listed = _unwrap(field.annotation)
            if _is_model(inner):
                walk(f"{name} {key}", inner)

    for key, field in Suite.model_fields.items():
        if key in _INTERNAL:
            continue
        inner, listed = _unwrap(field.annotation)
        if _is_model(inner):
            walk(f"[[{key}]]" if listed else f"[{key}]", inner)
    tables.append(("[scale.NAME]", Scale))
    return tables


def suite_keys() -> dict[str, list[str]]:
    """Every table and its keys: what the suite reference must hold (tests/test_site.py)."""
    return {name: list(model.model_fields) for name, model in suite_tables()}


def suite_reference() -> str:
    """Markdown: per table, each key's type, default and description."""
    parts = []
    for name, model in suite_tables():
        table, _, key = name.partition(" ")
        parts.append(f"### `{key}` in `{table}`\n" if key else f"### `{table}`\n")
        if model.__doc__ and model.__doc__ is not BaseModel.__doc__:
            parts.append(inspect.cleandoc(model.__doc__) + "\n")
        docs = field_docstrings(model)
        parts.append("| key | type | default | what it does |\n|---|---|---|---|")
        for key, field in model.model_fields.items():
            parts.append(f"| `{key}` | {_type_name(field.annotation)} | {_default(field)} | "
                         f"{_cell(docs.get(key, ''))} |")
        parts.append("")
    parts.append("### `[jobfiles]`\n\nThe job files a suite carries itself, `name = \"text\"` "
                 "(a run stores the files its `[[workloads]]` name so: `export --format suite` "
                 "gives them back); a suite with this table reads none from disk.\n")
    return "\n".join(parts)


# -- exit statuses and versions --------------------------------------------------------------

def exit_statuses() -> list[tuple[int, str, str]]:
    """(code, name, description) of every exit status: the comment beside each member of
    ``ExitStatus`` and the comment lines under it."""
    from iomatrix.cli import status

    source = inspect.getsource(status.ExitStatus)
    comments: dict[str, list[str]] = {}
    member = None
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.NAME and token.start[1] == 4 and token.string.isupper():
            member = token.string
        elif token.type == tokenize.COMMENT and member is not None:
            comments.setdefault(member, []).append(token.string.lstrip("#").strip())
    return [(s.value, s.name, " ".join(comments.get(s.name, []))) for s in status.ExitStatus]


def exit_status_reference() -> str:
    rows = ["| code | name | meaning |", "|---|---|---|"]
    rows += [f"| {code} | `{name}` | {_cell(text)} |" for code, name, text in exit_statuses()]
    return "\n".join(rows) + "\n"


def versions_reference() -> str:
    from iomatrix import __version__
    from iomatrix.store.records import EXPORT_FORMAT_VERSION
    from iomatrix.store.schema import SCHEMA_VERSION

    return (f"| what | version |\n|---|---|\n| iomatrix | {__version__} |\n"
            f"| results database schema (`PRAGMA user_version`) | {SCHEMA_VERSION} |\n"
            f"| JSON export (`format_version`) | {EXPORT_FORMAT_VERSION} |\n")


def _commit(url: str) -> str:
    found = re.search(r"[0-9a-f]{10,40}", url)
    return found.group(0)[:10] if found else url


def baseline_changes() -> str:
    from iomatrix.analysis.baselines import CHANGES

    rows = ["| component | from | what changes | where | source |", "|---|---|---|---|---|"]
    rows += [f"| {c.component} | {'.'.join(map(str, c.boundary[:2]))} | {_cell(c.changes)} | "
             f"{_cell(c.applies)} | [{_commit(c.source)}]({c.source}) |"
             for c in CHANGES]
    return "\n".join(rows) + "\n"


def _model_table(model: type[BaseModel], extra: tuple[tuple[str, str, str], ...] = ()) -> str:
    """A table of ``model``'s serialized keys: (key, type, description) rows, ``extra`` first."""
    docs = field_docstrings(model)
    rows = ["| key | type | what it holds |", "|---|---|---|"]
    rows += [f"| `{k}` | {t} | {_cell(d)} |" for k, t, d in extra]
    rows += [f"| `{key}` | {_type_name(field.annotation)} | {_cell(docs.get(key, ''))} |"
             for key, field in model.model_fields.items() if not field.exclude]
    for key, computed in model.model_computed_fields.items():
        rows.append(f"| `{key}` | {_type_name(computed.return_type)} | "
                    f"{_cell(inspect.cleandoc(computed.description or ''))} |")
    return "\n".join(rows) + "\n"


def export_reference() -> str:
    """Markdown: the keys of ``export --format json``, the run's and those of what it holds."""
    from iomatrix.fio.persecond import StallCheck
    from iomatrix.fio.samples import DirectionSample
    from iomatrix.store.records import (ConfigRecord, NodeRecord, StoredRun, TrialRecord,
                                        WorkloadRecord)

    run = _model_table(StoredRun, (
        ("format_version", "integer", "the export format's version (above)"),
        ("suite_name", "string", "the suite's name"),
        ("suite_source", "string", "where the suite came from: a file (with `--scale NAME`), "
                                   "`builtin:NAME`, or `import:PATH` for imported results"),
        ("suite_text", "string", "the suite's TOML as the run keeps it: `export --format suite` "
                                 "writes it, and it runs again")))
    parts = [f"### The run\n\n{run}"]
    for title, model in (("`configs`: one per configuration", ConfigRecord),
                         ("`workloads`: one per workload", WorkloadRecord),
                         ("`trials`: one per trial (a workload measured once on a "
                          "configuration)", TrialRecord),
                         ("`samples` and `vm_samples` of a trial: one per direction (read, "
                          "write)", DirectionSample),
                         ("`stall` of a trial: whether it stalled (null for a failed or "
                          "imported trial)", StallCheck),
                         ("`nodes`: one per node of a cluster run", NodeRecord)):
        parts.append(f"### {title}\n\n{_model_table(model)}")
    return "\n".join(parts)


def schema_history() -> str:
    """The store's migrations as ``iomatrix/store/schema.py`` lists them."""
    from iomatrix.store import schema

    doc = inspect.cleandoc(schema.__doc__ or "")
    history = doc.split("History:", 1)[1].split("\n\n", 1)[0]
    items = re.split(r"\n(?=\s*\d+ )", history.strip("\n"))
    return "\n".join(f"{i.split()[0]}. {' '.join(i.split()[1:])}" for i in items) + "\n"


def recommend_rule() -> str:
    """The decision rule as ``iomatrix.recommend.decide`` states it (its module docstring's
    numbered list) and as ``recommend --explain`` prints it (``RULE``)."""
    from iomatrix.recommend import decide

    doc = inspect.cleandoc(decide.__doc__ or "")
    numbered = doc[doc.index("\n1. "):].strip("\n")
    items = re.split(r"\n(?=\d+\. )", numbered)
    items = [re.sub(r":\w+:`", "`", " ".join(i.split())) for i in items]
    return "\n".join(items) + f"\n\nIn one paragraph, as " \
        f"`recommend --explain` prints it:\n\n> {decide.RULE}\n"


GENERATORS = {"recommend-rule": recommend_rule, "cli": cli_reference, "suite-keys": suite_reference,
              "exit-status": exit_status_reference, "versions": versions_reference,
              "baseline-changes": baseline_changes,
              "export-json": export_reference, "schema-history": schema_history}


# -- MkDocs events ---------------------------------------------------------------------------

def on_files(files: Any, config: Any) -> Any:
    """Adds changelog.md: the repository's CHANGELOG.md, its links into docs/ (right where it
    lies, at the repository's root) made relative to the site's root."""
    from mkdocs.structure.files import File

    text = (ROOT / "CHANGELOG.md").read_text().replace("](docs/", "](")
    files.append(File.generated(config, "changelog.md", content=text))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Each marker replaced by what its generator writes now."""
    return MARKER.sub(lambda m: GENERATORS[m.group(1)](), markdown)

