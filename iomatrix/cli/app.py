"""``iomatrix``: the command line. This module builds the Typer app from the command modules (one
per command or group of commands, each importing only ``common`` and ``status``) and turns errors
into one stderr line and an exit status."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Optional

import typer

from iomatrix import __version__
from iomatrix.cli import (analyze, appliance, clean, compare, db, doctor, findings, ingest, node,
                          recommend, results, run, suites, translate)
from iomatrix.cli.common import err, out
from iomatrix.cli.status import EPILOG, status_for
from iomatrix.core.errors import IomatrixError
from iomatrix.core.text import printable

app = typer.Typer(
    name="iomatrix",
    help="Which virtual-disk settings should this QEMU/KVM host use, and how sure are we? "
         "iomatrix sweeps disk configurations, measures them with fio and stores the results.",
    epilog=EPILOG, no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
    # help texts name suite tables ([target], [[targets]], [method]): printed as written, not
    # read as rich markup (which took them for tags and printed "[]")
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]})

_state = {"traceback": False}


def _version(value: bool) -> None:
    if value:
        out.print(f"iomatrix {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    traceback: Annotated[bool, typer.Option("--traceback", help="Show the full traceback of an error.")] = False,
    version: Annotated[Optional[bool], typer.Option("--version", callback=_version, is_eager=True,
                                                    help="Print the version and exit.")] = None,
) -> None:
    _state["traceback"] = traceback


# In the order --help lists them.
for command in (run.run, results.runs, results.show, results.report, results.export,
                suites.suites, doctor.doctor, analyze.effect, analyze.scores, compare.compare):
    app.command()(command)
app.command("import")(ingest.import_)
app.command()(recommend.recommend)
app.command()(translate.translate)
app.command()(clean.clean)
app.command()(findings.findings)
app.add_typer(appliance.app)
app.add_typer(db.app)
app.add_typer(node.app)


@functools.cache
def _command() -> Callable[..., Any]:
    """The app as a Click command, built once per process: calling ``app`` builds it again each
    time from the functions' signatures (0.1 s), which the tests, running thousands of commands
    in one process, paid on every one. (Typer's ``__call__`` adds only its pretty tracebacks,
    which this app turns off.)"""
    return typer.main.get_command(app)


def main(args: Sequence[str] | None = None) -> None:
    """Console entry point: runs the app on ``args`` (default: the process's arguments) and turns
    errors into one stderr line and an exit status. Always ends with ``SystemExit``."""
    try:
        _command()(args=None if args is None else list(args))
    except IomatrixError as exc:
        if _state["traceback"]:
            raise
        for line in str(exc).strip("\n").split("\n"):
            err.print(f"iomatrix: {printable(line)}", markup=False)
        if exc.hint:
            err.print(f"iomatrix: hint: {printable(exc.hint)}", markup=False)
        sys.exit(status_for(exc))

