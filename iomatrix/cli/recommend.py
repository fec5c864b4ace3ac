"""``iomatrix recommend RUN [--for proxmox|libvirt|qemu] [--explain]``: the settings to use, the
verdict first (``iomatrix.recommend.verdict``), then what to paste."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Optional

import typer

from iomatrix.cli.common import DEFAULT_DB, Db, RunRef, WithStalled, load_run, out
from iomatrix.platform.proxmox import PLACEHOLDER_VMID, PLACEHOLDER_VOLUME
from iomatrix.platform.proxmox import STORAGE_CHOICES as PROXMOX_STORAGES
from iomatrix.recommend.defaults import PLATFORMS

if TYPE_CHECKING:
    from iomatrix.store.records import StoredRun

MAX_WIDTH = 100
"""recommend reads well in a terminal of 100 columns: no line is longer, nor than the terminal."""


def _storage_of(stored: "StoredRun") -> str:
    """The Proxmox storage type a run measured (``Target.storage_kind``): its target's table's
    (an rbd pool is librbd, krbd with krbd = true), else the type of the Proxmox VE storage it
    was resolved from, whose disks get the aio qemu-server really gives them; anything else
    "other"."""
    from iomatrix.core.errors import IomatrixError

    try:
        kind = stored.suite.runnable().target.storage_kind
    except IomatrixError:            # a suite iomatrix cannot run again (an imported one)
        return "other"
    return kind if kind in PROXMOX_STORAGES else "other"


def recommend(
    run_ref: RunRef,
    platform: Annotated[Optional[str], typer.Option("--for", help="proxmox (a qm set line), libvirt (domain XML) or qemu (-blockdev/-device arguments). Default: what the run was made for: Proxmox VE for a run measured with its block graph ([method] platform = \"proxmox\") or on a Proxmox VE host, libvirt for one measured with libvirt's, else QEMU.")] = None,
    db: Db = DEFAULT_DB,
    storage_type: Annotated[Optional[str], typer.Option("--storage-type", help="Proxmox storage type, for its default aio: " + ", ".join(PROXMOX_STORAGES) + ". Default: the type of the storage the run measured (rbd, krbd with krbd = true, for a Ceph pool; a Proxmox VE storage's own type when the run measured one by its id: lvmthin, dir, ...), else other.")] = None,
    vmid: Annotated[str, typer.Option(help="Proxmox VM id for the qm line.")] = PLACEHOLDER_VMID,
    volume: Annotated[str, typer.Option(help="Proxmox volume (storage:volume) for the qm line.")] = PLACEHOLDER_VOLUME,
    image: Annotated[Optional[str], typer.Option(help="Image path for the libvirt XML and the QEMU arguments.")] = None,
    explain: Annotated[bool, typer.Option("--explain", help="Also print the evidence behind each line: per parameter what it does, the platform's default, why, and every level's IOPS and latency against the reference; the notes and the rule.")] = False,
    with_stalled: WithStalled = False,
) -> None:
    """Recommend disk settings for Proxmox VE, libvirt or QEMU from a run: the verdict first
    (one line per setting: set, keep or not measured, with the gain and its 95 % CI), then the
    text to paste; --explain adds the evidence."""
    from iomatrix.recommend.decide import recommend as build
    from iomatrix.recommend.render import render
    from iomatrix.recommend.verdict import explain as evidence
    from iomatrix.recommend.verdict import header, made_for, paste_block, verdict

    if platform is not None and platform not in PLATFORMS:
        raise typer.BadParameter(f"{platform!r}: choose {', '.join(PLATFORMS)}", param_hint="--for")
    stored = load_run(db, run_ref, with_stalled=with_stalled)
    why = None
    if platform is None:
        platform, why = made_for(stored)
    if storage_type is None:
        storage_type = _storage_of(stored)
    if storage_type not in PROXMOX_STORAGES:
        raise typer.BadParameter(f"{storage_type!r}: choose {', '.join(PROXMOX_STORAGES)}",
                                 param_hint="--storage-type")
    rec = build(stored, platform, storage=storage_type)  # type: ignore[arg-type]
    pasted = render(rec.platform, rec.config, vmid=vmid, volume=volume, image=image,
                    storage=storage_type)
    width = min(out.width, MAX_WIDTH)
    lines = [*header(rec, width, why), "", *verdict(rec, width)]
    if explain:
        lines += ["", *evidence(rec, width)]
    else:
        lines.append(f"(the evidence behind each line: iomatrix recommend {run_ref} --explain)")
    lines += ["", *paste_block(rec.platform, pasted, width)]
    for line in lines:
        out.print(line, markup=False, soft_wrap=True)
