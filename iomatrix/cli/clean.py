"""``iomatrix clean``: remove what killed runs left on disk (scratch directories, images, target
directories iomatrix created), as the results database recorded it, and the libvirt domains of
dead iomatrix runs (at qemu:///system); never what a live run uses,
never anything iomatrix did not create (see ``iomatrix.measure.reclaim``)."""

from __future__ import annotations

from typing import Annotated

import typer

from iomatrix.cli.common import DEFAULT_DB, Db, open_store, out


def clean(
    db: Db = DEFAULT_DB,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would be removed; remove nothing and leave the database as it is.")] = False,
) -> None:
    """Remove the scratch directories and images that killed runs left behind, and put back
    the IRQs they steered."""
    from iomatrix.measure.reclaim import describe, reclaim

    open_store(db).close()                  # a missing or foreign file is refused, unchanged
    with open_store(db, writable=not dry_run) as store:
        results = reclaim(store, dry_run=dry_run)
        gone = [(run_id, owner, why) for run_id, owner in store.running_runs()
                if owner is not None for alive, why in [store.alive(owner)] if not alive]
    for r in results:
        out.print(describe(r), markup=False, highlight=False)
    from iomatrix.measure.reclaim import reclaim_libvirt_domains
    domains = reclaim_libvirt_domains(dry_run=dry_run)
    for line in domains:
        out.print(line, markup=False, highlight=False)
    for run_id, owner, why in gone:
        out.print(f"run {run_id}: its process (pid {owner.pid}, since {owner.started_at}) "
                  f"is gone ({why}); `iomatrix run --resume {run_id}` finishes it",
                  markup=False, highlight=False)
    removed = [r for r in results if r.action in ("removed", "would remove")]
    freed = sum(r.bytes for r in removed) / 2**20
    left = sum(1 for r in results if r.action == "left")
    if not results and not domains:
        out.print("nothing to clean", markup=False)
    elif dry_run:
        out.print(f"would remove {len(removed)} ({freed:.1f} MiB), leave {left}; nothing removed "
                  "(--dry-run)", markup=False)
    else:
        out.print(f"removed {len(removed)} ({freed:.1f} MiB), left {left}", markup=False)
