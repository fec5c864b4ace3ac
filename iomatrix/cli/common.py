"""What the command modules share: the environment they print to, the database and run options,
the run loader, and the pieces of output more than one command shows.

Commands print through ``out`` and ``err``, which write to the current ``Environment``'s consoles,
each a ``Terminal``. A test swaps the environment to run a command in-process and read what it
printed::

    with use_environment(Environment(stdout=Terminal(file=buf), stderr=Terminal(file=errs))):
        main(["show", "1", "--db", str(db)])
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer
from rich.console import Console
from rich.segment import Segment
from rich.text import Text

from iomatrix.core.text import printable

if TYPE_CHECKING:
    from collections.abc import Iterable

    from iomatrix.store import Store
    from iomatrix.store.records import StoredRun


class Terminal(Console):
    """The console every command prints through: what it prints shows text, never obeys it.

    Most of what iomatrix prints was written by someone else: a suite's names, a database's rows,
    a guest's console, fio's messages. Here no string is read as rich markup (``[link=…]`` would
    become a terminal hyperlink) or emoji codes unless a call asks for it (``markup=True``, for
    iomatrix's own literal text), and every character a terminal would obey (ESC, C1, bidi
    overrides: ``core.text.printable``) is written as a visible escape: strings before layout
    (``render_str``), and every segment of text on its way out, whatever built it (``Text``,
    tables, progress bars), rich's own cursor controls aside."""

    def __init__(self, **options: Any) -> None:
        options.setdefault("markup", False)
        options.setdefault("emoji", False)
        super().__init__(**options)

    def render_str(self, text: str, **options: Any) -> Text:
        return super().render_str(printable(text, lines=True), **options)

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        return super()._render_buffer(
            segment if segment.control else
            Segment(printable(segment.text, lines=True), segment.style, segment.control)
            for segment in buffer)


def _stdout() -> Console:
    # Piped output keeps whole table rows on one line: easier to grep and diff than 80 columns.
    return Terminal(highlight=False, width=None if sys.stdout.isatty() else 200)


def _stderr() -> Console:
    return Terminal(stderr=True, highlight=False, soft_wrap=True)


@dataclass(frozen=True)
class Environment:
    """Where a command's output goes: ``stdout`` for results, ``stderr`` for progress, warnings
    and errors. The default writes to the process's standard streams; tests replace it."""

    stdout: Console = field(default_factory=_stdout)
    stderr: Console = field(default_factory=_stderr)


_current: ContextVar[Environment] = ContextVar("iomatrix_environment", default=Environment())


def environment() -> Environment:
    """The environment commands run in now."""
    return _current.get()


@contextmanager
def use_environment(env: Environment) -> Iterator[Environment]:
    """Run the commands invoked inside the block in ``env``; the previous one is restored after."""
    token = _current.set(env)
    try:
        yield env
    finally:
        _current.reset(token)


class _CurrentConsole:
    """One console of the current environment, looked up at each use: command modules import
    ``out`` once, and a test's ``use_environment`` still reaches them."""

    def __init__(self, stream: str) -> None:
        self._stream = stream

    def __getattr__(self, name: str) -> object:
        return getattr(getattr(_current.get(), self._stream), name)


out = cast(Console, _CurrentConsole("stdout"))
err = cast(Console, _CurrentConsole("stderr"))

Db = Annotated[str, typer.Option("--db", envvar="IOMATRIX_DB", show_default=True,
                                 help="Results database: an SQLite file, or a PostgreSQL URL "
                                      "(postgresql://USER@HOST/DBNAME; the password from "
                                      "~/.pgpass or PGPASSWORD). Default from IOMATRIX_DB.")]
RunRef = Annotated[str, typer.Argument(help="Run number (see `iomatrix runs`), or 'last'.")]
WithStalled = Annotated[bool, typer.Option(
    "--with-stalled", help="Keep the trials that stalled (a second or more without a completed "
                           "request while fio kept I/O queued) in their points' figures and in "
                           "gains; by default they are left out, and listed.")]
DEFAULT_DB = "iomatrix.db"


def open_store(db: str, *, must_exist: bool = True, writable: bool = False) -> Store:
    """The results database ``db`` (a file or a PostgreSQL URL); unless ``must_exist`` is
    false, a missing file is an error. It is opened read-only when it must exist, unless
    ``writable``."""
    from iomatrix.core.errors import StoreError
    from iomatrix.store import Store
    from iomatrix.store.location import parse_location

    where = parse_location(db)
    if must_exist and isinstance(where, Path) and not where.exists():
        raise StoreError(f"{db}: no results database here", hint="run a suite first, or pass --db")
    # the commands that need the database to exist only read it
    return Store(where, readonly=must_exist and not writable)


def shown_db(db: str) -> str:
    """``--db`` as output names it: a PostgreSQL URL without its password."""
    from iomatrix.store.location import shown

    return shown(db)


def load_run(db: str, run_ref: str, *, with_stalled: bool = False) -> StoredRun:
    """The stored run ``run_ref`` (a number or 'last') of the database ``db``; its points keep
    their stalled trials with ``with_stalled``."""
    from iomatrix.analysis.stalls import with_stalled as keeping

    with open_store(db) as store:
        run = store.load_run(store.resolve(run_ref))
    return keeping(run) if with_stalled else run


def write_report(db: str, run_ref: str, out_dir: Path, *, with_stalled: bool = False) -> Path:
    """The HTML report of run ``run_ref`` written into ``out_dir``; returns the page's path."""
    from iomatrix.report.data import build_report_data
    from iomatrix.report.html import write_report as write

    return write(build_report_data(load_run(db, run_ref, with_stalled=with_stalled)), out_dir)


EMULATED = Text("EMULATED (TCG): guest figures measure QEMU's CPU emulator, not this hardware",
                style="bold red")


def p_column(p: float | None) -> str:
    """A p-value as a table column shows it."""
    return "—" if p is None else "<0.001" if p < 0.001 else f"{p:.3f}"


MAX_OPTION_BYTES = 1 << 20
"""The largest file an option names that is read whole: a VM's configuration or domain XML,
or a storage.cfg, has a few KiB."""


def read_option(path: Path, param_hint: str = "FILE") -> str:
    """A VM configuration or storage.cfg the user names (``param_hint``): UTF-8 text, at most
    ``MAX_OPTION_BYTES``; BadParameter for anything else."""
    try:
        with open(path, "rb") as file:
            return option_text(file.read(MAX_OPTION_BYTES + 1), str(path), param_hint)
    except OSError as exc:
        raise typer.BadParameter(f"{path}: {exc.strerror}", param_hint=param_hint) from None


def option_text(data: bytes, name: str, param_hint: str = "FILE") -> str:
    if len(data) > MAX_OPTION_BYTES:
        raise typer.BadParameter(f"{name}: more than {MAX_OPTION_BYTES >> 20} MiB: not a VM "
                                 "configuration", param_hint=param_hint)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise typer.BadParameter(f"{name}: not UTF-8 text (byte {exc.start})",
                                 param_hint=param_hint) from None
