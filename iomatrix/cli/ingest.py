"""``iomatrix import DIR``: existing fio JSON results stored as a run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from iomatrix.cli.common import DEFAULT_DB, Db, open_store, out, shown_db

SHOWN = 20
"""Skipped files and warnings listed one by one; the rest are counted."""


def import_(
    directory: Annotated[Path, typer.Argument(
        help="Directory of fio --output-format=json (or json+) files, searched recursively, "
             "as bench-fio or pbench-fio leave them; or one such file.",
        metavar="DIR", exists=True, file_okay=True, dir_okay=True, readable=True)],
    name: Annotated[Optional[str], typer.Option(help="Name of the run (default: the directory's name).")] = None,
    mode: Annotated[Optional[str], typer.Option(help="How fio reached the storage: host, blocklayer, guest, or imported (unknown). Default: host, noted as assumed.")] = None,
    db: Db = DEFAULT_DB,
) -> None:
    """Import existing fio JSON results as a run, to show, report, export and compare them."""
    from iomatrix.store.ingest import MODES, scan, store_scan

    if mode is not None and mode not in MODES:
        raise typer.BadParameter(f"{mode!r}: choose {', '.join(MODES)}", param_hint="--mode")
    found = scan(directory)  # before the database is opened: a failed import creates no file
    with open_store(db, must_exist=False) as store:
        summary = store_scan(store, found, name=name, mode=mode)
    line = lambda text: out.print(text, markup=False, soft_wrap=True)  # noqa: E731
    line(f"run {summary.run_id}: imported {summary.files} fio result files from {directory} ({shown_db(db)})")
    line(f"  configurations ({len(summary.configurations)}): " + "; ".join(summary.configurations))
    line(f"  workloads ({len(summary.workloads)}): " + "; ".join(summary.workloads))
    line(f"  trials: {summary.trials_ok} ok, {summary.trials_failed} failed (fio reported an error)")
    if summary.skipped:
        line(f"  skipped ({len(summary.skipped)}):")
        for s in summary.skipped[:SHOWN]:
            line(f"    {s.path}: {s.reason}")
        if len(summary.skipped) > SHOWN:
            line(f"    … and {len(summary.skipped) - SHOWN} more")
    for w in summary.warnings[:SHOWN]:
        line(f"  note: {w}")
    if len(summary.warnings) > SHOWN:
        line(f"  … and {len(summary.warnings) - SHOWN} more notes")
    if summary.other_files:
        line(f"  not fio output: {summary.other_files} other files (job files, logs, tool data)")
    line(f"  {summary.notes[-1]}")
