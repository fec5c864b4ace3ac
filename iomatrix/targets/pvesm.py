"""A Proxmox VE storage measured through Proxmox's own storage layer (``[target] pvesm``): on a
Proxmox VE host, volumes iomatrix allocates with ``pvesm alloc``, opens where ``pvesm path``
says and removes with ``pvesm free``, so that every storage plugin the host has (third-party
ones too) makes its volumes as it makes a VM's disks. What every volume kind shares (records
before creation, removal at close, reclaim after kill -9, the device checks) is
``iomatrix.targets.volumes``; this module is the backend: pve-storage's command line.

- **Whose volumes.** Proxmox VE names a VM's volumes ``vm-<VMID>-…`` (LvmThinPlugin,
  ZFSPoolPlugin, LVMPlugin alloc_image: "illegal name - should be 'vm-$vmid-*'"), and a VM
  that owns them frees them when it is destroyed. iomatrix's volumes belong to a VM id of its
  own: the VM named ``iomatrix-volumes`` (``VM_NAME``) in ``VMIDS``, made once with ``pvesh
  create /nodes/localhost/qemu`` (qemu-server refuses an id the cluster has, so no ``qm
  create`` or restore takes it afterwards) and found again by its name in ``pvesh get
  /cluster/resources``. The range lies above the ids Proxmox VE hands out itself
  (``/cluster/nextid``: datacenter.cfg ``next-id``, 100 to 999999 unless set) and below its
  limit (999999999). The VM has no disks and is never started. Volumes are
  ``vm-<VMID>-iomatrix-<run>-<token>-…``; nothing else on the storage is touched.
- **Checked first.** ``pvesm status --storage ID --content images``: the storage exists, holds
  VM images, is active, and has the space the run's volumes need written fully (a one-line
  refusal otherwise); ``pvesm list ID --vmid VMID`` names volumes earlier runs left there.
- **Which storages.** Those whose volumes are block devices of this host (``PVESM_TYPES``:
  lvm, lvmthin, zfspool; a local lvm storage with snapshot-as-volume-chain excepted:
  ``through_pvesm``) and every type pve-storage's own plugins do not define (a third-party
  plugin: its ``pvesm path`` must be a block device, else the run stops in one line and frees
  the volume). rbd, iSCSI and directory storages keep their own kinds (``resolve_storage``)."""

from __future__ import annotations

import json
import os
import re
import stat
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple

from iomatrix.core.errors import NotEnoughSpace, TargetError, ToolFailed
from iomatrix.core.proc import require, run
from iomatrix.core.units import format_bytes
from iomatrix.platform import proxmox as pve
from iomatrix.suite.target import Target
from iomatrix.suite.volumes import PvesmTarget
from iomatrix.targets.kind import HostCheck, Probe
from iomatrix.targets.volumes import Backend, VolumeKind, resource

KIND = "pvesm-volume"
"""The store's record kind of a volume iomatrix allocated through pvesm."""
VM_NAME = "iomatrix-volumes"
"""The name of the VM iomatrix's volumes belong to."""
VM_DESCRIPTION = ("Reserved by iomatrix: the VM id its benchmark volumes (vm-<id>-iomatrix-...) "
                  "belong to. It has no disks and is never started.")
VMIDS = range(999_990_000, 1_000_000_000)
"""Where iomatrix looks for its VM id: above Proxmox VE's own next-id range, within its limit."""
PVESM_TYPES = ("lvm", "lvmthin", "zfspool")
"""pve-storage's own types measured through pvesm on a Proxmox VE host: their volumes are
block devices of the host (any type pve-storage does not define is too: a plugin's)."""
TIMEOUT = 120.0
DEVICE_WAIT = 10.0
"""Seconds a new volume's device gets to appear (a zvol's /dev/zvol link: udev; ZFSPoolPlugin
waits likewise)."""


class Status(NamedTuple):
    """One storage's line of ``pvesm status``."""

    storage: str
    type: str
    status: str
    total: int
    used: int
    avail: int


def parse_status(text: str) -> dict[str, Status]:
    """``pvesm status``'s table (pvesm.pm print_status: Name, Type, Status, Total (KiB), Used
    (KiB), Available (KiB), %) → storage id → Status, in bytes."""
    out = {}
    for line in text.splitlines()[1:]:
        cols = line.split()
        if len(cols) >= 6 and all(c.isdigit() for c in cols[3:6]):
            total, used, avail = (int(c) * 1024 for c in cols[3:6])
            out[cols[0]] = Status(cols[0], cols[1], cols[2], total, used, avail)
    return out


def parse_list(text: str) -> list[tuple[str, int | None]]:
    """``pvesm list``'s table (pvesm.pm print_content: Volid, Format, Type, Size, VMID) → each
    volume's (volid, vmid)."""
    out = []
    for line in text.splitlines()[1:]:
        cols = line.split()
        if len(cols) >= 4:
            out.append((cols[0], int(cols[4]) if len(cols) > 4 and cols[4].isdigit() else None))
    return out


def volume_name(volid: str) -> str:
    """The name part of a volume id (``local-lvm:vm-1-x`` → ``vm-1-x``; a directory storage's
    ``local:1/vm-1-x.raw`` → ``vm-1-x.raw``)."""
    return volid.partition(":")[2].rsplit("/", 1)[-1]


def _tool(program: str, *args: str, timeout: float = TIMEOUT) -> str:
    """Run a Proxmox VE tool; its own words in one line when it fails."""
    try:
        return run([require(program, hint="iomatrix measures a storage by id through pvesm on "
                                          "a Proxmox VE host"), *args], timeout=timeout).stdout
    except ToolFailed as exc:
        said = [line for line in (exc.output or "").splitlines() if line.strip()]
        why = said[-1].strip()[:300] if said else str(exc)
        raise TargetError(f"{program} {args[0]} {' '.join(args[1:3])}: {why}") from None


def reserved_vmid(tool: Callable[..., str] = _tool) -> tuple[int | None, set[int]]:
    """iomatrix's VM id (the VM named ``VM_NAME`` in ``VMIDS``), or None; and every VM id the
    cluster has (``pvesh get /cluster/resources --type vm``)."""
    text = tool("pvesh", "get", "/cluster/resources", "--type", "vm", "--output-format", "json")
    try:
        vms = json.loads(text)
        taken = {int(vm["vmid"]) for vm in vms}
    except (ValueError, TypeError, KeyError):
        raise TargetError("pvesh get /cluster/resources: not the JSON list of VMs it prints") \
            from None
    ours = sorted(int(vm["vmid"]) for vm in vms
                  if vm.get("name") == VM_NAME and int(vm["vmid"]) in VMIDS)
    return (ours[0] if ours else None), taken


class PvesmBackend(Backend):
    """One Proxmox VE storage's volumes through pvesm (the module's docstring)."""

    resource_kind = KIND
    noun = "Proxmox VE volume"
    marks = False
    """pvesm keeps no tag with a volume: the name (its VM id, the run and a random token) and
    the record say it is iomatrix's."""

    def __init__(self, storage: str, type_: str | None = None, vmid: int | None = None) -> None:
        self.storage = storage
        self.type = type_
        self.vmid = vmid
        self._reserved = vmid is not None
        self._volids: dict[str, str] = {}

    @property
    def prefix(self) -> str:  # type: ignore[override]
        assert self.vmid is not None, "check() first"
        return f"vm-{self.vmid}-"

    @property
    def where(self) -> str:
        return f"Proxmox VE storage {self.storage}" + (f" ({self.type})" if self.type else "")

    @property
    def spec(self) -> str:
        return self.storage

    def connection(self) -> dict[str, Any]:
        return {"storage": self.storage, "vmid": self.vmid}

    def check(self, count: int, size: int) -> list[str]:
        """The storage holds images, is active and has room for ``count`` volumes of ``size``;
        iomatrix's VM id found (or the one it will reserve chosen)."""
        found = parse_status(_tool("pvesm", "status", "--storage", self.storage))
        status = found.get(self.storage)
        if status is None:
            raise TargetError(f"pvesm status: no storage {self.storage} on this host")
        if self.type and status.type != self.type:
            raise TargetError(f"{self.where}: pvesm says it is of type {status.type}")
        self.type = status.type
        if status.status != "active":
            raise TargetError(f"{self.where} is {status.status}: Proxmox VE cannot allocate "
                              "volumes there")
        images = parse_status(_tool("pvesm", "status", "--storage", self.storage, "--content",
                                    "images"))
        if self.storage not in images:
            raise TargetError(f"{self.where} does not hold VM disk images (its content has no "
                              "'images'): iomatrix allocates volumes as Proxmox VE does a VM's "
                              "disks")
        if count * size > status.avail:
            raise NotEnoughSpace(f"{self.where}: {count} volume(s) of {format_bytes(size)} need "
                                 f"{format_bytes(count * size)}, it has "
                                 f"{format_bytes(status.avail)} free")
        if self.vmid is None:
            self.vmid, taken = reserved_vmid()
            if self.vmid is None:
                self.vmid = next((i for i in VMIDS if i not in taken), None)
                if self.vmid is None:
                    raise TargetError(f"no free VM id in {VMIDS.start}-{VMIDS.stop - 1} for "
                                      "iomatrix's volumes")
            else:
                self._reserved = True
        left = [volid for volid, vmid in self.listing() if vmid == self.vmid]
        return [f"{self.where}: volumes belong to VM {self.vmid} ({VM_NAME}, made for them)"] + (
            [f"{self.where} holds {len(left)} volume(s) of VM {self.vmid} from earlier runs "
             f"({', '.join(left[:3])}{', …' if len(left) > 3 else ''}): `iomatrix clean` "
             "removes those its store recorded"] if left else [])

    def listing(self) -> list[tuple[str, int | None]]:
        return parse_list(_tool("pvesm", "list", self.storage, "--vmid", str(self.vmid)))

    def reserve(self) -> None:
        """Make the VM iomatrix's volumes belong to, once (``pvesh create``: refused when the
        cluster has the id already)."""
        if self._reserved:
            return
        try:
            _tool("pvesh", "create", "/nodes/localhost/qemu", "--vmid", str(self.vmid),
                  "--name", VM_NAME, "--description", VM_DESCRIPTION)
        except TargetError:
            if reserved_vmid()[0] != self.vmid:     # another run made it meanwhile: ours too
                raise
        self._reserved = True

    def create(self, name: str, size: int, tag: str) -> Path:
        self.reserve()
        said = _tool("pvesm", "alloc", self.storage, str(self.vmid), name,
                     f"{-(-size // (1 << 20))}M", "--format", "raw")
        found = re.search(r"successfully created '([^'\s]+)'", said)
        if found is None or volume_name(found.group(1)) != name:
            raise TargetError(f"pvesm alloc {self.storage}: no volume {name} in its answer "
                              f"{said.strip()[:200]!r}")
        volid = self._volids[name] = found.group(1)
        path = Path(_tool("pvesm", "path", volid).strip())
        deadline = time.monotonic() + DEVICE_WAIT
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not path.is_absolute() or not (os.path.exists(path)
                                          and stat.S_ISBLK(os.stat(path).st_mode)):
            raise TargetError(f"{self.where}: pvesm path {volid} is {str(path)[:200]}, not a "
                              "block device of this host: iomatrix measures such a storage by "
                              "its own kind (rbd, iscsi, a directory)")
        return path

    def remove(self, name: str) -> None:
        volid = self._volids.get(name) or next(
            (v for v, _ in self.listing() if volume_name(v) == name), None)
        if volid is None:
            return
        _tool("pvesm", "free", volid)
        self._volids.pop(name, None)

    def listed(self) -> dict[str, set[str]]:
        return {volume_name(volid): set() for volid, vmid in self.listing()
                if vmid == self.vmid}

    def host_fields(self) -> dict[str, str]:
        return {"target": self.where}


def from_connection(data: dict[str, Any]) -> PvesmBackend:
    """The backend a store's record names (in a store another user could have written):
    a storage id, and a VM id that must be the one named ``VM_NAME`` here now."""
    storage, vmid = data.get("storage"), data.get("vmid")
    table = PvesmTarget.model_validate({"storage": storage})
    if not isinstance(vmid, int) or vmid not in VMIDS:
        raise ValueError(f"vmid {vmid!r} is not in iomatrix's range")
    if reserved_vmid()[0] != vmid:
        raise ValueError(f"VM {vmid} is not the one named {VM_NAME} on this host")
    return PvesmBackend(table.storage, vmid=vmid)


def pvesm_of_storage(storage: pve.Storage) -> dict[str, Any]:
    """A storage.cfg storage as ``[target] pvesm`` keys (its id, and its type for the rules
    qemu-server applies to a VM's disks there)."""
    return {"storage": storage.id, "type": storage.type}


def through_pvesm(storage: pve.Storage) -> bool:
    """On a Proxmox VE host, ``storage`` is measured through pvesm (``PVESM_TYPES``, and
    every type pve-storage's own plugins do not define), but for a local (not ``shared``) lvm
    storage with ``snapshot-as-volume-chain``: a VM's qcow2 disk there is a qcow2 on an LV over
    its snapshots' LVs, which iomatrix makes as pve-storage does with LVM's own tools
    (``[target] lvm`` ``volume_chain``, ``iomatrix.targets.lvmchain``), where ``pvesm alloc``
    would make the qcow2 without its chain. A shared one stays with pvesm, whose cluster-wide
    lock alone keeps another node's allocation off its volume group: raw volumes only there."""
    if storage.type == "lvm" and storage.volume_chain and not storage.shared:
        return False
    return storage.type in PVESM_TYPES or storage.type not in pve.STORAGE_TYPES


class PvesmKind(VolumeKind):
    """``[target] pvesm``: a Proxmox VE storage through pvesm (the module's docstring)."""

    keys = ("pvesm",)
    tools = ("pvesm", "pvesh")
    resource = resource(KIND, "Proxmox VE volume", from_connection, ("storage", "vmid"))

    def backend(self, target: Target) -> Backend:
        table = target.pvesm
        assert isinstance(table, PvesmTarget)
        return PvesmBackend(table.storage, table.type)

    def host_checks(self, probe: Probe) -> list[HostCheck]:
        """pvesm and pvesh: a Proxmox VE host's own storage layer."""
        missing = [t for t in self.tools if probe.which(t) is None]
        return [HostCheck(
            name="Proxmox VE storage layer (pvesm)", ok=not missing,
            detail=(f"{', '.join(missing)} not found on PATH: not a Proxmox VE host; a storage "
                    "id is measured with the LVM, ZFS and btrfs tools" if missing else
                    "pvesm and pvesh: storage ids are measured through Proxmox VE's own "
                    "storage layer (pvesm alloc, path, free)"),
            hint="a Proxmox VE host has both (libpve-storage-perl, pve-manager)" if missing
            else None)]
