"""``iomatrix suites``: the built-in suites, or one of them as TOML."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.table import Table

from iomatrix.cli.common import out
from iomatrix.core.errors import SuiteError


def suites(name: Annotated[Optional[str], typer.Argument(help="Print this built-in suite's TOML.")] = None) -> None:
    """List the built-in suites, or print one."""
    from iomatrix.suite import builtin_suites, load_suite_text

    texts = builtin_suites()
    if name is not None:
        if name not in texts:
            raise SuiteError(f"{name}: no built-in suite of that name",
                             hint="built-in suites: " + ", ".join(texts))
        out.print(texts[name], markup=False)
        return
    table = Table("suite", "mode", "description", box=None)
    for key, text in texts.items():
        s = load_suite_text(text, source=f"builtin:{key}")
        table.add_row(key, s.method.mode + (" + host baseline" if s.method.baseline else ""),
                      s.suite.description)
    out.print(table)
