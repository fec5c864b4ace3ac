"""``iomatrix db``: the results databases themselves; ``db copy`` moves runs between them (an
SQLite file and a PostgreSQL database, either way), so that a host that measured on its own
can publish its runs to a shared store later."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from iomatrix.cli.common import open_store, out, shown_db

app = typer.Typer(name="db", help="Results databases: copy runs between an SQLite file and "
                                  "PostgreSQL.", no_args_is_help=True)


@app.command("copy")
def copy(
    source: Annotated[str, typer.Argument(metavar="SRC", help="The database to copy from: an SQLite file or a PostgreSQL URL (read only).")],
    dest: Annotated[str, typer.Argument(metavar="DST", help="The database to copy into: an SQLite file (made if missing) or a PostgreSQL URL.")],
    runs: Annotated[Optional[list[int]], typer.Option("--run", help="Copy this run of SRC (repeatable); default every run.")] = None,
) -> None:
    """Copy runs from SRC into DST. A run is known by its uuid: copying it again adds only the
    trials DST lacks (none, if it has not changed), never a second copy of the run."""
    with open_store(source) as src, open_store(dest, must_exist=False) as dst:
        chosen = runs if runs else [r.id for r in src.list_runs()]
        for run_id in chosen:
            done = dst.copy_run(src, run_id)
            where = f"run {done.copy_id} of {shown_db(dest)}"
            text = {"copied": f"copied as {where} ({done.detail})",
                    "updated": f"{where} updated ({done.detail})",
                    "present": f"already {where} ({done.detail})",
                    "skipped": f"skipped: {done.detail}"}[done.action]
            out.print(f"run {run_id}: {text}", markup=False, soft_wrap=True)
