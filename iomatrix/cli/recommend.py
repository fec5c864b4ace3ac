"""``iomatrix recommend RUN --for proxmox|libvirt|qemu``: the settings to use, with evidence."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.table import Table
from rich.text import Text

from iomatrix.cli.common import DEFAULT_DB, Db, RunRef, load_run, out
from iomatrix.platform.proxmox import PLACEHOLDER_VMID, PLACEHOLDER_VOLUME
from iomatrix.platform.proxmox import STORAGE_CHOICES as PROXMOX_STORAGES
from iomatrix.recommend.defaults import PLATFORMS, TITLES

if TYPE_CHECKING:
    from iomatrix.recommend.decide import Recommendation
    from iomatrix.store.records import StoredRun

_SHOWN_STATUS = {"change": "", "choose": "", "keep": " (default)", "not measured": " (default)",
                 "not evaluated": " (default)"}


def _storage_of(stored: "StoredRun") -> str:
    """The Proxmox storage type a run measured: an rbd pool is librbd (krbd with krbd = true),
    whose disks get the aio qemu-server really gives them; anything else "other"."""
    from iomatrix.core.errors import IomatrixError

    try:
        rbd = stored.suite.runnable().target.rbd
    except IomatrixError:            # a suite iomatrix cannot run again (an imported one)
        return "other"
    if rbd is None:
        return "other"
    return "krbd" if rbd.krbd else "rbd"


def recommend(
    run_ref: RunRef,
    platform: Annotated[str, typer.Option("--for", help="proxmox (a qm set line), libvirt (domain XML) or qemu (-blockdev/-device arguments).")],
    db: Db = DEFAULT_DB,
    storage_type: Annotated[Optional[str], typer.Option("--storage-type", help="Proxmox storage type, for its default aio: " + ", ".join(PROXMOX_STORAGES) + ". Default: rbd (krbd with krbd = true) for a run measured on a Ceph pool, else other.")] = None,
    vmid: Annotated[str, typer.Option(help="Proxmox VM id for the qm line.")] = PLACEHOLDER_VMID,
    volume: Annotated[str, typer.Option(help="Proxmox volume (storage:volume) for the qm line.")] = PLACEHOLDER_VOLUME,
    image: Annotated[Optional[str], typer.Option(help="Image path for the libvirt XML and the QEMU arguments.")] = None,
) -> None:
    """Recommend disk settings for Proxmox VE, libvirt or QEMU from a run, with the evidence."""
    from iomatrix.recommend.decide import recommend as build
    from iomatrix.recommend.render import render

    if platform not in PLATFORMS:
        raise typer.BadParameter(f"{platform!r}: choose {', '.join(PLATFORMS)}", param_hint="--for")
    stored = load_run(db, run_ref)
    if storage_type is None:
        storage_type = _storage_of(stored)
    if storage_type not in PROXMOX_STORAGES:
        raise typer.BadParameter(f"{storage_type!r}: choose {', '.join(PROXMOX_STORAGES)}",
                                 param_hint="--storage-type")
    rec = build(stored, platform, storage=storage_type)  # type: ignore[arg-type]
    _print(rec)
    pasted = render(rec.platform, rec.config, vmid=vmid, volume=volume, image=image,
                    storage=storage_type)
    out.print(f"\n# ready to paste ({TITLES[rec.platform]}):", markup=False)
    out.print(pasted.text, markup=False, soft_wrap=True)
    for note in pasted.notes:
        out.print(f"# note: {note}", markup=False, soft_wrap=True)


def _print(rec: Recommendation) -> None:
    from iomatrix.recommend.decide import RULE

    title = TITLES[rec.platform]
    storage = f" (storage type {rec.storage})" if rec.platform == "proxmox" else ""
    out.print(f"run {rec.run_id} · suite {rec.suite_name} · recommendation for {title}{storage}",
              markup=False)
    for warning in rec.warnings:
        out.print(Text(warning, style="bold red"))
    if rec.yours is not None:
        out.print(Text(rec.yours.text, style="bold"))
    for mode, fixed in rec.fixed.items():
        if fixed:
            shown = ", ".join(f"{k}={v}" for k, v in fixed.items())
            out.print(f"{mode} configurations all have {shown}", markup=False)
    table = Table("parameter", "what it does", f"{title} default", "recommended", "evidence",
                  box=None)
    for d in rec.decisions:
        default = d.default.shown + (f"\n({d.default.note})" if d.default.note else "")
        if d.value is None:
            recommended = "not set (QEMU's default)"
        else:
            recommended = d.value + (_SHOWN_STATUS[d.status] if d.default.level else "")
        recommended += " ⚠ see caveat" if d.caveat else ""
        lines = [d.reason]
        if d.mode:
            lines.append(f"[{d.mode} mode; levels {', '.join(d.levels)}]")
        lines += [f"· {e.text()}" for e in d.evidence]
        if d.caveat:
            lines.append(f"⚠ caveat: {d.caveat}")
        table.add_row(Text(d.name), Text(d.what), Text(default), Text(recommended),
                      Text("\n".join(lines)))
    out.print(table)
    out.print(f"rule: {RULE}", markup=False, soft_wrap=True)
    for note in rec.notes:
        out.print(f"note: {note}", markup=False, soft_wrap=True)
