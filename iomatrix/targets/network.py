"""A Proxmox VE storage id (``[target] storage = "ID"``) resolved into the [target] it names, by
the kind of storage its type is (``TargetKind.storage_types``, ``iomatrix.targets.registry``).
What every network kind shares as a run opens it is ``iomatrix.targets.remote``."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from iomatrix.core.proc import which
from iomatrix.platform import proxmox as pve
from iomatrix.suite.target import KIND_KEYS, Target
from iomatrix.targets.pvesm import pvesm_of_storage, through_pvesm
from iomatrix.targets.registry import KINDS

ALLOCATING = ("lvm", "lvmthin", "zfspool", "btrfs")
"""Storage types whose kinds make volumes of their own there, as Proxmox VE allocates a VM's
disks: refused, as there, when disabled or without ``images`` content."""


def on_proxmox_host() -> bool:
    """This host is a Proxmox VE node: ``pvesm`` (Proxmox's storage layer) is on PATH."""
    return which("pvesm") is not None


def resolve_storage(target: Target, storages: dict[str, pve.Storage], pve_dir: Path, *,
                    mounted: Callable[[Path], bool] | None = None,
                    pve_host: bool | None = None) -> Target:
    """A ``[target] storage = "ID"`` (``"ID:lunN"`` for a LUN) as the [target] it names in
    ``storages`` (a parsed storage.cfg in ``pve_dir``, /etc/pve on Proxmox VE), where Proxmox VE
    itself would put a VM's disks: by the kind whose ``TargetKind.storage_types`` has the
    storage's type (``TargetKind.of_storage``): rbd → ``rbd`` (``rbd.rbd_of_storage``);
    iscsidirect (libiscsi) and iscsi (open-iscsi) → ``iscsi``, the storage's portal and target
    and the LUN named as Proxmox VE names its volumes (LUN 0 when none is:
    ``iscsi.lun_of_storage``); dir/nfs/cifs → ``directory``, the storage's images directory
    (``workspace.directory_of_storage``); lvm → ``lvm`` (``volume_chain`` with
    snapshot-as-volume-chain), lvmthin → ``lvmthin``, zfspool → ``zfs``, btrfs → ``btrfs``, each
    refused where Proxmox VE would allocate nothing (disabled, no ``images`` content). On a
    Proxmox VE host (``pve_host``; None: ``pvesm`` on PATH, ``on_proxmox_host``) a storage
    pvesm allocates block volumes on (lvm, lvmthin, zfspool, a third-party plugin's:
    ``pvesm.through_pvesm``) → ``pvesm``, through Proxmox's own storage layer, but a local lvm
    storage with snapshot-as-volume-chain → ``lvm`` with ``volume_chain`` (its qcow2 chains). Any other target
    is returned as it is. ``ValueError`` says what cannot be measured."""
    if target.storage is None:
        return target
    ident, _, volume = target.storage.partition(":")
    storage = storages.get(ident)
    if storage is None:
        known = ", ".join(sorted(storages)) or "none"
        raise ValueError(f"storage {ident!r} is not in the storage.cfg given (it defines: {known})")
    rest = target.model_dump(exclude=set(KIND_KEYS), exclude_none=True)
    pvesm = (on_proxmox_host() if pve_host is None else pve_host) and through_pvesm(storage)
    kind = None if pvesm else next((k for k in dict.fromkeys(KINDS.values())
                                    if storage.type in k.storage_types), None)
    if volume and (kind is None or not kind.storage_volumes):
        raise ValueError(f"storage {ident} ({storage.type}) is not an iSCSI storage: name it "
                         f"without ':{volume}'")
    if (pvesm or storage.type in ALLOCATING) and storage.allocation_problem():
        raise ValueError(storage.allocation_problem())
    if pvesm:
        return Target.model_validate({**rest, "pvesm": pvesm_of_storage(storage)})
    if kind is not None:
        return Target.model_validate({**rest, **kind.of_storage(storage, volume, pve_dir,
                                                                 mounted=mounted)})
    raise ValueError(f"storage {ident} is of type {storage.type}: iomatrix measures "
                     f"{', '.join(sorted({t for k in KINDS.values() for t in k.storage_types}))} "
                     "storages by their id, and on a Proxmox VE host (pvesm) every storage its "
                     "plugins allocate block volumes on (a device or directory of any other: "
                     "give it as [target] device or directory)")
