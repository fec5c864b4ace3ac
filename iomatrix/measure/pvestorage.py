"""On a Proxmox VE host the main job measures where the host's VMs live.

A Proxmox VE host is one with ``pveversion`` on the PATH (as ``measure.pvehost`` finds it) and
its configuration directory: /etc/pve, or the directory ``IOMATRIX_PVE_DIR`` names. That
variable is the invoking user's own choice, as ``--storage-cfg`` is (tests point it at a
directory of their own); nothing a suite, a database or another local user writes can choose
it.

Which storage (``ranked``, ``chosen``), from ``storage.cfg`` and this node's VM configurations
(``qemu-server/*.conf``, which /etc/pve links to ``nodes/<this node>/qemu-server``):

1. The storages where a volume can be made (``why_not``): storage.cfg gives them ``images``
   content (or their type does by default: every type but cephfs, pbs and esxi; a plugin's
   type must say so), they are not disabled (``disable 1``), they are available on this node
   (``nodes``), and ``pvesm status`` (where pvesm runs) says they are active.
2. Each one's count of this node's VM disks: the drives of every VM configuration (virtioN,
   scsiN, sataN, ideN, efidisk0, tpmstate0; no CD-ROM, no cloud-init drive, no unused disk)
   whose volume is on it (``ID:…``).
3. The one holding most; on a tie, the first of them in storage.cfg.
4. None holding any (no VMs yet): the first in storage.cfg that is not a file storage (dir,
   nfs, cifs, btrfs, cephfs): where a fresh install puts VM disks (local-lvm on ext4/xfs,
   local-zfs on ZFS); else the first.
5. A storage iomatrix cannot measure (``targets.network.resolve_storage`` refuses it: a type
   it has no kind for, an nfs storage not mounted) is passed over for the next in that order,
   and the note names it with why.
6. None at all: the suite keeps its directory, and the notes say why.

``iomatrix run --storage ID`` names the storage instead, for any suite whose target is one
directory, on a Proxmox VE host or with ``--storage-cfg``; one where no volume can be made is
refused in one line (``why_not``). A user's own [target] is never changed but by the options
they give: the choice replaces only a built-in suite's directory, and ``--target`` wins.
"""

from __future__ import annotations

import os
import re
import socket
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from iomatrix.core.errors import SuiteError, ToolFailed
from iomatrix.core.files import read_beside
from iomatrix.core.proc import run, which
from iomatrix.platform import proxmox as pve
from iomatrix.suite.target import STORAGE_ID
from iomatrix.targets.pvesm import parse_status

PVE_DIR_ENV = "IOMATRIX_PVE_DIR"
"""The environment variable naming the Proxmox VE directory in place of /etc/pve."""
PVE_DIR = Path("/etc/pve")
BUILTIN_DIRECTORY = Path("/var/tmp/iomatrix")
"""The directory the built-in suites measure, which the choice replaces."""
MAX_CONFIG_BYTES = 1 << 20
"""storage.cfg and a VM configuration are read up to this many bytes (larger: not read)."""
MAX_VMS = 10_000
PVESM_TIMEOUT = 60.0
NO_IMAGES = ("cephfs", "pbs", "esxi")
"""Storage types whose default content holds no VM images (pve-storage's plugins)."""
DISK_BUSES = ("virtio", "scsi", "sata", "ide", "efidisk", "tpmstate")


def host_dir(env: Mapping[str, str] | None = None) -> Path | None:
    """This host's Proxmox VE directory when it is a Proxmox VE host (the module's rule);
    None elsewhere."""
    env = os.environ if env is None else env
    if which("pveversion", env) is None:
        return None
    directory = Path(env.get(PVE_DIR_ENV) or PVE_DIR)
    return directory if directory.is_dir() else None


@dataclass(frozen=True)
class HostStorages:
    """What a Proxmox VE directory says about where this node's VMs live."""

    directory: Path
    storages: dict[str, pve.Storage]
    node: str
    disks: Counter[str]
    """Storage id → this node's VM disks on it."""
    status: dict[str, str]
    """Storage id → its status as ``pvesm status`` says it (active, inactive, disabled); empty
    where there is no pvesm (``statuses``)."""

    @property
    def total(self) -> int:
        return sum(self.disks.values())


def _text(directory: Path, name: str) -> str:
    """The file ``name`` in ``directory``, read as a suite's own files are (``read_beside``:
    a regular file within it, UTF-8, at most ``MAX_CONFIG_BYTES``); SuiteError otherwise."""
    return read_beside(directory, name, str(directory / name), max_bytes=MAX_CONFIG_BYTES,
                       what="Proxmox VE's configuration files")


def read_host(directory: Path, text: str | None = None) -> HostStorages:
    """``directory``'s storage.cfg (or ``text``, storage.cfg as given) and its VM
    configurations; SuiteError when storage.cfg cannot be read. A VM configuration that
    cannot be read or parsed counts no disks."""
    if text is None:
        text = _text(directory, "storage.cfg")
    storages = pve.parse_storage_cfg(text)
    disks: Counter[str] = Counter()
    configs = directory / "qemu-server"
    try:
        names = sorted(configs.glob("*.conf"))[:MAX_VMS] if configs.is_dir() else []
    except OSError:
        names = []
    for name in names:
        try:
            vm = pve.parse_config(_text(directory, f"qemu-server/{name.name}"))
        except (SuiteError, ValueError):
            vm = None
        for drive in vm.drives if vm is not None else ():
            ident = drive.volume.partition(":")[0]
            if (drive.bus in DISK_BUSES and not drive.is_cdrom and not drive.is_cloudinit
                    and ":" in drive.volume and ident in storages):
                disks[ident] += 1
    return HostStorages(directory=directory, storages=storages,
                        node=_node(directory), disks=disks, status=statuses())


def statuses(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Each storage's status as ``pvesm status`` on the PATH says it; empty where there is no
    pvesm (not a Proxmox VE host: storage.cfg alone is read) or it fails."""
    tool = which("pvesm", env)
    if tool is None:
        return {}
    try:
        out = run([tool, "status"], timeout=PVESM_TIMEOUT, env=env).stdout
    except ToolFailed:
        return {}
    return {ident: found.status for ident, found in parse_status(out).items()}


def _node(directory: Path) -> str:
    """This node's name: where ``local`` leads (``nodes/<node>``), else the host name."""
    try:
        return Path(os.readlink(directory / "local")).name
    except OSError:
        return socket.gethostname().split(".")[0]


def why_not(storage: pve.Storage, node: str, status: str = "active") -> str | None:
    """Why no volume can be made on ``storage`` from ``node``, as far as storage.cfg and its
    ``status`` (``pvesm status``) say (its type is for ``resolve_storage`` to judge); None when
    one can."""
    if not re.fullmatch(STORAGE_ID, storage.id) or ":" in storage.id:
        return "its id is not a Proxmox VE storage id (a letter, then letters, digits, - _ .)"
    if storage.disable:
        return "it is disabled (disable 1 in storage.cfg)"
    if status != "active":
        return f"it is {status} (pvesm status)"
    if storage.nodes is not None and node not in storage.nodes:
        return f"it is not available on this node, {node} (nodes {','.join(storage.nodes)})"
    images = ("images" in storage.content if storage.content is not None
              else storage.type not in NO_IMAGES and storage.type in pve.STORAGE_TYPES)
    if not images:
        held = ",".join(storage.content or ()) or f"the default of type {storage.type}"
        return f"it holds no VM images (content {held})"
    return None


def _disks(host: HostStorages, ident: str) -> str:
    held = host.disks[ident]
    return f"{held} of this host's {host.total} VM disk{'s' if host.total != 1 else ''}"


def named(host: HostStorages, ident: str) -> str:
    """Why ``--storage ID`` is measured (the note); SuiteError when no volume can be made
    there, one line."""
    storage = host.storages.get(ident)
    if storage is None:
        known = ", ".join(sorted(host.storages)) or "none"
        raise SuiteError(f"--storage {ident}: no such storage in {host.directory / 'storage.cfg'}"
                         f" (it defines: {known})")
    why = why_not(storage, host.node, host.status.get(ident, "active"))
    if why is not None:
        raise SuiteError(f"--storage {ident} ({storage.type}): no volume can be made there: {why}")
    held = f"; it holds {_disks(host, ident)}" if host.total else ""
    return f"measuring {ident} ({storage.type}): --storage {ident}{held}"


def ranked(host: HostStorages) -> list[pve.Storage]:
    """The storages the main job may measure on ``host``, in the order of the module's rule
    (the first that ``resolve_storage`` resolves is measured): those holding this node's VM
    disks, most first (storage.cfg's order on a tie); then, in storage.cfg's order, those
    that are not file storages; then the rest."""
    usable = [s for s in host.storages.values()
              if why_not(s, host.node, host.status.get(s.id, "active")) is None]
    return sorted(usable, key=lambda s: (-host.disks[s.id], host.disks[s.id] == 0
                                         and s.type in pve.FILE_STORAGES))


def chosen(host: HostStorages, best: pve.Storage,
           skipped: list[tuple[pve.Storage, str]]) -> str:
    """The note saying the main job measures ``best`` on ``host``, and why: the storages
    before it in ``ranked`` were ``skipped`` (each with why)."""
    held = host.disks[best.id]
    tied = [s.id for s in host.storages.values() if s.id != best.id and held
            and host.disks[s.id] == held and s not in (k for k, _ in skipped)]
    if held:
        why = f"it holds {_disks(host, best.id)}" + (
            f" (as many as {', '.join(tied)}: the first in storage.cfg)" if tied else "")
    else:
        why = ("this host has no VM disks" if not host.total else
               "no storage holding this host's VM disks can be measured") + (
            "; a fresh Proxmox VE install puts them there (the first storage for VM images in "
            "storage.cfg that is not a file storage)" if best.type not in pve.FILE_STORAGES
            else "; the first storage for VM images in storage.cfg")
    said = "".join(f"; not {s.id} ({s.type}, {host.disks[s.id]} disks): {reason}"
                   for s, reason in skipped if host.disks[s.id])
    return f"measuring {best.id} ({best.type}): {why}{said}"


def none_chosen(host: HostStorages, skipped: list[tuple[pve.Storage, str]]) -> str:
    """The note saying no storage of ``host`` can be measured."""
    said = "".join(f"; {s.id} ({s.type}): {reason}" for s, reason in skipped)
    return (f"this Proxmox VE host's storage.cfg has no storage iomatrix can make a volume on"
            f"{said}: measuring {BUILTIN_DIRECTORY} (--storage ID names one)")
