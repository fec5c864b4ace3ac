"""Proxmox VE's qemu-server: a drive line → the QEMU arguments it generates (pure).

Transcribed from qemu-server's source (``src/PVE/QemuServer.pm`` ``config_to_command`` and
``print_drive_commandline_full``, ``src/PVE/QemuServer/Drive.pm``, ``DriveDevice.pm``
``print_drivedevice_full`` and ``scsihw_infos``, ``Blockdev.pm`` ``generate_drive_blockdev``)
and checked against its ``test/cfg2cmd`` fixtures; docs/proxmox-options.md has the table.

Two generations:

- **PVE 8** (qemu-server 8.x, and any VM whose machine version is below 10.0): one ``-drive
  file=…,if=none,id=drive-<bus><n>,…`` per disk; QEMU names the nodes itself.
- **PVE 9** (qemu-server 9.x with machine version 10.0 or later): an empty ``throttle-group``
  object per disk and one nested ``-blockdev``: a ``throttle`` filter node ``drive-<bus><n>`` over
  the format node ``f<hash>`` over the protocol node ``e<hash>``, every node with ``discard``
  and ``detect-zeroes``; the device gets ``write-cache=`` (and SCSI disks ``device_id=``).

What does not bear on I/O is left out and said so (``OMITTED``): PCI addresses (``bus=pci.N,
addr=…``) and the rest of the VM. A drive's ``bootindex`` is qemu-server's (:func:`boot_order`).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import urllib.parse
from typing import Any, Callable, Literal, NamedTuple

from iomatrix.core.model import Frozen, on_off
from iomatrix.platform.qemu import queue_defaults
from iomatrix.platform.settings import (DiskImage, DiskSettings, GraphShape, Pasted,
                                        PlatformDefault, StorageGraph, default, disk_kind)

PveVersion = Literal[8, 9]
PVE_VERSIONS: tuple[PveVersion, ...] = (8, 9)
DEFAULT_PVE_VERSION: PveVersion = 9
BUSES = ("virtio", "scsi", "sata", "ide")
SCSIHW = ("lsi", "lsi53c810", "virtio-scsi-pci", "virtio-scsi-single", "megasas", "pvscsi")
SCSIHW_DEFAULT = "lsi"
"""QemuServer.pm ``$confdesc->{scsihw}``: ``default => 'lsi'`` (the GUI offers virtio-scsi-single
for new Linux VMs, but a configuration without ``scsihw:`` gets lsi)."""
DRIVE_KEY = re.compile(r"^(virtio|scsi|sata|ide|efidisk|tpmstate)(\d+)$")
OMITTED = ("PCI addresses (bus=pci.N,addr=…) are left out: they place the device in the VM, "
           "they do not change its I/O")

# Drive options (Drive.pm %drivedesc_base and the per-bus formats) by what iomatrix does with them.
IO_OPTIONS = ("aio", "cache", "discard", "detect_zeroes", "iothread", "ssd", "queues", "format",
              "media")
"""Options that change the block graph or device, and are modelled here."""
THROTTLE_OPTIONS = tuple(f"{kind}{d}{m}" for kind in ("mbps", "iops") for d in ("", "_rd", "_wr")
                         for m in ("", "_max")) + tuple(
    f"{kind}{d}_max_length" for kind in ("bps", "iops") for d in ("", "_rd", "_wr"))
UNMODELLED_OPTIONS = (*THROTTLE_OPTIONS, "ro", "rerror", "werror", "serial", "wwn", "model",
                      "vendor", "product", "scsiblock", "snapshot", "cyls", "heads", "secs",
                      "trans")
"""qemu-server options that reach QEMU but that iomatrix does not reproduce (throttling limits,
error policy, identity strings, passthrough): named when a drive has them."""
NON_QEMU_OPTIONS = ("size", "backup", "replicate", "shared", "import-from", "file")
"""Options that never reach QEMU (bookkeeping of qemu-server and the storage layer)."""

FILE_STORAGES = ("dir", "nfs", "cifs", "btrfs", "cephfs")
BLOCK_STORAGES = ("lvm", "lvmthin", "zfspool", "iscsi")
STORAGE_TYPES = (*FILE_STORAGES, *BLOCK_STORAGES, "rbd", "zfs", "iscsidirect")
CDROM_PATH = "/dev/cdrom"
"""Drive.pm get_cdrom_path: the first of /dev/cdrom, /dev/cdrom1, /dev/cdrom2 that exists."""
CEPH_PRIV = "/etc/pve/priv/ceph"


class Storage(Frozen):
    """One storage of ``/etc/pve/storage.cfg``, as far as a drive's arguments depend on it."""

    id: str
    type: str
    path: str | None = None
    vgname: str | None = None
    pool: str | None = None
    krbd: bool = False
    nocow: bool = False
    monhost: str | None = None
    """rbd: the monitors of an external cluster; none: a cluster Proxmox VE manages (pveceph)."""
    username: str | None = None
    namespace: str | None = None
    fsid: str | None = None
    """rbd with krbd: the cluster's fsid, in ``/dev/rbd-pve/<fsid>/…``. A host's storage.cfg
    does not hold it (qemu-server asks the monitors, or reads /etc/pve/ceph.conf); the copy
    given to iomatrix may (``fsid <uuid>``, as qemu-server's own tests write it)."""
    portal: str | None = None
    target: str | None = None
    content: tuple[str, ...] | None = None
    """The content types it holds; None when storage.cfg does not say (the type's default)."""
    content_dirs: tuple[tuple[str, str], ...] = ()
    volume_chain: bool = False
    """``snapshot-as-volume-chain 1``: snapshots as qcow2 backing files."""
    keyring: bool = True
    """rbd: /etc/pve/priv/ceph/ID.keyring exists (Proxmox VE writes it when the storage is
    added): cephx as ``username``. False: no auth (``auth-client-required`` none)."""
    ceph_conf: bool = True
    """rbd with monhost: /etc/pve/priv/ceph/ID.conf exists (written when the storage is added)."""

    @property
    def kind(self) -> str:
        """The storage as the aio and cache rules see it: rbd with krbd is "krbd", btrfs without
        nocow "btrfs", with it "btrfs-nocow"."""
        if self.type == "rbd":
            return "krbd" if self.krbd else "rbd"
        if self.type == "btrfs" and self.nocow:
            return "btrfs-nocow"
        return self.type


DEFAULT_STORAGES = {
    "local": Storage(id="local", type="dir", path="/var/lib/vz"),
    "local-lvm": Storage(id="local-lvm", type="lvmthin", vgname="pve"),
    "local-zfs": Storage(id="local-zfs", type="zfspool", pool="rpool/data"),
}
"""What a fresh Proxmox VE installation's storage.cfg defines (ext4/xfs: local + local-lvm;
ZFS: local + local-zfs)."""
_CFG_TEXT = ("path", "vgname", "pool", "monhost", "username", "namespace", "fsid", "portal",
             "target")
_CFG_FLAGS = {"krbd": "krbd", "nocow": "nocow", "snapshot-as-volume-chain": "volume_chain"}


def parse_storage_cfg(text: str) -> dict[str, Storage]:
    """``/etc/pve/storage.cfg`` → storage id → Storage (``TYPE: ID`` headers, indented
    ``key value`` lines)."""
    out: dict[str, Storage] = {}
    current: dict[str, Any] | None = None
    for raw in [*text.splitlines(), ""]:
        line = raw.rstrip()
        header = re.match(r"^([a-z0-9]+):\s*(\S+)\s*$", line)
        if header or not line.strip():
            if current is not None:
                out[current["id"]] = Storage(**current)
                current = None
            if header:
                current = {"type": header.group(1), "id": header.group(2)}
            continue
        if current is None or line.lstrip().startswith("#"):
            continue
        key, _, value = line.strip().partition(" ")
        value = value.strip()
        if key in _CFG_TEXT:
            current[key] = value
        elif key in _CFG_FLAGS:
            current[_CFG_FLAGS[key]] = value not in ("0", "")
        elif key == "content":
            current["content"] = tuple(c for c in value.split(",") if c)
        elif key == "content-dirs":
            current["content_dirs"] = tuple(tuple(p.split("=", 1)) for p in value.split(",")
                                            if "=" in p)
    return out


class Drive(Frozen):
    """One drive line of a VM configuration: ``scsi0: local-lvm:vm-100-disk-0,aio=native,…``."""

    key: str
    volume: str
    options: tuple[tuple[str, str], ...] = ()
    """Every ``key=value`` after the volume, as written, in order."""

    @property
    def bus(self) -> str:
        return DRIVE_KEY.match(self.key).group(1)  # type: ignore[union-attr]

    @property
    def index(self) -> int:
        return int(DRIVE_KEY.match(self.key).group(2))  # type: ignore[union-attr]

    def get(self, name: str) -> str | None:
        return next((v for k, v in self.options if k == name), None)

    def flag(self, name: str) -> bool | None:
        """A boolean option as qemu-server reads it (1/on/yes/true), None when absent."""
        value = self.get(name)
        return None if value is None else value.lower() in ("1", "on", "yes", "true")

    @property
    def is_cdrom(self) -> bool:
        """Drive.pm drive_is_cdrom: ``media=cdrom``."""
        return self.get("media") == "cdrom"

    @property
    def is_cloudinit(self) -> bool:
        """Drive.pm drive_is_cloudinit: a ``[vm-N-]cloudinit[.fmt]`` volume."""
        return re.search(r"[:/](?:vm-\d+-)?cloudinit(?:\.(?:raw|qcow2|vmdk|qed|cloop|qcow|cow))?$",
                         self.volume) is not None

    @property
    def unknown(self) -> tuple[str, ...]:
        known = {*IO_OPTIONS, *UNMODELLED_OPTIONS, *NON_QEMU_OPTIONS}
        return tuple(k for k, _ in self.options if k not in known)

    @property
    def unmodelled(self) -> tuple[str, ...]:
        return tuple(k for k, _ in self.options if k in UNMODELLED_OPTIONS)


def parse_drive(key: str, text: str) -> Drive:
    """A drive line's value (Drive.pm parse_drive: the volume first, or ``file=``)."""
    if not DRIVE_KEY.match(key):
        raise ValueError(f"{key!r} is not a drive key (virtioN, scsiN, sataN, ideN, efidisk0, "
                         "tpmstate0)")
    parts = [p for p in text.strip().split(",") if p]
    if not parts:
        raise ValueError(f"{key}: empty drive")
    volume = ""
    options: list[tuple[str, str]] = []
    for i, part in enumerate(parts):
        name, eq, value = part.partition("=")
        if not eq:
            if i != 0:
                raise ValueError(f"{key}: option {part!r} has no value")
            volume = part
        elif name == "file" or (name == "volume" and not volume):
            volume = value
        else:
            options.append((name, value))
    if not volume:
        raise ValueError(f"{key}: no volume")
    return Drive(key=key, volume=volume, options=tuple(options))


class VmConfig(Frozen):
    """The disk-relevant part of a VM configuration."""

    scsihw: str | None
    machine: str | None
    drives: tuple[Drive, ...]
    ignored: tuple[str, ...] = ()
    """Keys of the configuration that do not bear on the disks (named, not dropped silently)."""
    template: bool = False
    bios: str | None = None
    ostype: str | None = None
    meta: str | None = None
    cvm: str | None = None
    """``amd-sev`` type (std, es, snp) or ``tdx``: a confidential VM's firmware."""
    arch: str | None = None
    boot: str | None = None
    """``boot:`` as written (None: not given; "" given empty)."""
    bootdisk: str | None = None

    @property
    def windows(self) -> bool:
        """Helpers.pm windows_version: a Windows ostype."""
        return bool(self.ostype) and re.match(r"^(win\d+|wxp|w2k[38]?|wvista)$",
                                              self.ostype or "") is not None


def parse_config(text: str) -> VmConfig:
    """A VM configuration as ``/etc/pve/qemu-server/ID.conf`` holds it or ``qm config ID``
    prints it: ``key: value`` lines, ``#`` comments (the description); snapshot sections
    (``[name]``) and what follows them are not the current configuration."""
    values: dict[str, Any] = {"scsihw": None, "machine": None}
    drives: list[Drive] = []
    ignored: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            break
        key, sep, value = line.partition(":")
        if not sep:
            raise ValueError(f"not a configuration line: {raw!r}")
        key, value = key.strip(), value.strip()
        if key in ("scsihw", "machine", "bios", "ostype", "meta", "arch", "boot", "bootdisk"):
            values[key] = value
        elif key == "template":
            values["template"] = value in ("1", "on", "yes", "true")
        elif key in ("amd-sev", "intel-tdx"):
            kind = re.search(r"(?:^|,)(?:type=)?(std|es|snp)(?:,|$)", value)
            values["cvm"] = "tdx" if key == "intel-tdx" else kind.group(1) if kind else "std"
        elif DRIVE_KEY.match(key):
            drives.append(parse_drive(key, value))
        else:
            ignored.append(key)
    return VmConfig(drives=tuple(drives), ignored=tuple(ignored), **values)


def boot_order(vm: VmConfig) -> dict[str, int]:
    """Each drive's bootindex (QemuServer.pm device_bootorder). ``boot: order=a;b;…`` numbers
    the devices listed from 100. Without ``boot:``, or with a legacy ``boot: [acdn]{1,4}``
    (bootorder_from_legacy, default ``cdn``), each letter's number is 100 times its place; in
    drive order a CD-ROM (cloud-init's is not) takes the ``d`` number and counts it up, any
    other drive counts the ``c`` number up and only ``bootdisk`` takes it. A ``boot:`` with
    neither gives no drive one. A template is started without ``boot:`` and ``bootdisk:``."""
    boot, bootdisk = (None, None) if vm.template else (vm.boot, vm.bootdisk)
    items = dict(i.split("=", 1) if "=" in i else ("legacy", i)
                 for i in (boot or "").split(",") if i.strip())
    if boot is not None and not items.get("legacy"):
        devices = [d for d in re.split(r"[;\s]+", items.get("order", "")) if d]
        return {dev: 100 + i for i, dev in enumerate(devices)}
    number = {letter: 100 * (i + 1) for i, letter in enumerate(items.get("legacy") or "cdn")}
    out: dict[str, int] = {}
    for drive in sorted(vm.drives, key=lambda d: drive_order(d.key)):
        letter = "d" if drive.is_cdrom and not drive.is_cloudinit else "c"
        if letter not in number:
            continue
        if letter == "d" or drive.key == bootdisk:
            out[drive.key] = number[letter]
        number[letter] += 1
    return out


# -- machine versions -------------------------------------------------------------------------

def machine_type(vm: VmConfig) -> str | None:
    """The ``machine:`` type (``pc-q35-8.1``, ``q35``), None when unset. A template's is
    always unset: qemu-server starts a template (for backups) with a minimal configuration of
    its disks, scsihw, bios and name only (QemuServer.pm config_to_command)."""
    if vm.template or not vm.machine:
        return None
    items = vm.machine.split(",")
    typed = next((i[5:] for i in items if i.startswith("type=")), None)
    return typed or next((i for i in items if "=" not in i), None)


def is_q35(vm: VmConfig) -> bool:
    """Machine.pm machine_type_is_q35."""
    kind = machine_type(vm) or ""
    return kind == "q35" or kind.startswith("pc-q35-")


def pinned_version(vm: VmConfig) -> tuple[int, int, int] | None:
    """The machine version (major, minor, pve) the VM runs with, None for the host's newest
    (Machine.pm get_vm_machine, extract_version): a pinned ``machine:`` (a missing ``+pveN``
    is 0); a Windows VM without one is pinned to 5.1, or to the QEMU version it was created
    with from 9.1 on (``meta: creation-qemu=``)."""
    kind = machine_type(vm)
    if not kind or kind in ("pc", "q35", "virt"):
        if not vm.windows or vm.template:
            return None
        created = re.search(r"creation-qemu=(\d+)\.(\d+)", vm.meta or "")
        if created and (int(created.group(1)), int(created.group(2))) >= (9, 1):
            return int(created.group(1)), int(created.group(2)), 0
        return 5, 1, 0
    found = re.match(r"^(?:pc(?:-i440fx|-q35)?|virt)-(\d+)\.(\d+)(?:\.\d+)?(?:\+pve(\d+))?", kind)
    if found is None:
        return None
    return int(found.group(1)), int(found.group(2)), int(found.group(3) or 0)


def version_of_machine(vm: VmConfig, host: PveVersion = DEFAULT_PVE_VERSION) -> PveVersion:
    """The generation of the VM's disk arguments on a ``host`` of that PVE version
    (QemuServer.pm: ``min_version($machine_version, 10, 0)`` selects -blockdev): PVE 9 gives a
    machine below 10.0 PVE 8's -drive."""
    pinned = pinned_version(vm)
    return 9 if host >= 9 and (pinned is None or pinned[:2] >= (10, 0)) else 8


def version_of_pveversion(line: str) -> PveVersion | None:
    """PVE generation from ``pveversion``'s line, pve-manager's major version (``pve-manager/
    9.0.3/025864202ebb6109 (running kernel: 6.14.8-2-pve)``); None for another generation or
    anything else."""
    found = re.match(r"pve-manager/(\d{1,3})\.\d", line.strip())
    major = int(found.group(1)) if found else None
    return next((v for v in PVE_VERSIONS if v == major), None)


# -- volumes ----------------------------------------------------------------------------------

class Volume(Frozen):
    """Where a drive's data is, as QEMU opens it."""

    driver: Literal["file", "host_device", "host_cdrom", "rbd", "iscsi"]
    path: str
    """filename; for rbd ``pool/image``; for iscsi ``iscsi://portal/target/lun``."""
    format: str
    storage: str
    """Storage.kind, or "path" for a drive given as an absolute path."""
    volid: str
    """What qemu-server hashes into node names (the volume as written)."""
    node: dict[str, Any] = {}
    """The protocol node's options besides driver, filename and qemu-server's own (rbd: pool,
    image, servers, auth; iscsi: portal, target, lun): pve-storage's qemu_blockdev_options."""
    drive_file: str | None = None
    """``-drive file=`` where it is not ``path`` (``rbd:…``): PVE::Storage::path."""
    volume_chain: bool = False
    """A qcow2 volume on a storage with ``snapshot-as-volume-chain``."""
    backing: bool = False
    """qemu-server gives it the qcow2 backing chain the storage reports (snapshot method
    "mixed": qcow2 on LVM, or on a directory storage keeping snapshots as a volume chain)."""
    notes: tuple[str, ...] = ()
    """What was assumed where the storage's definition does not say."""


_ISO = re.compile(r"^iso/([^/]+\.(?:iso|img))$", re.IGNORECASE)


def resolve_volume(drive: Drive, storages: dict[str, Storage] | None = None, *,
                   is_device: bool | None = None) -> Volume:
    """The drive's volume → path, driver and format (pve-storage 9.1's parse_volname, path and
    qemu_blockdev_options for each storage type). ValueError, with qemu-server's words where it
    refuses too, for a volume it cannot open."""
    volid = drive.volume
    if volid == "cdrom":
        return Volume(driver="host_cdrom", path=CDROM_PATH, format="raw", storage="path",
                      volid=volid, notes=(f"{drive.key}: the host's CD-ROM drive: qemu-server "
                                          "takes the first of /dev/cdrom, /dev/cdrom1, "
                                          f"/dev/cdrom2 that exists; {CDROM_PATH} assumed",))
    if volid.startswith("/"):
        device = volid.startswith("/dev/") if is_device is None else is_device
        driver = ("host_cdrom" if drive.is_cdrom else "host_device") if device else "file"
        return Volume(driver=driver, path=volid, format=drive.get("format") or "raw",
                      storage="path", volid=volid)
    store, sep, volname = volid.partition(":")
    if not sep:
        raise ValueError(f"{drive.key}: {volid!r} is neither STORAGE:VOLUME nor an absolute path")
    storage = {**DEFAULT_STORAGES, **(storages or {})}.get(store)
    if storage is None:
        raise ValueError(f"{drive.key}: storage {store!r} is not in storage.cfg (give --storage-cfg "
                         f"or --storage {store}=TYPE)")
    iso = _ISO.match(volname) if storage.type in FILE_STORAGES else None
    vtype = "iso" if iso else "images"
    # qemu-server's own messages (check_volume_storage_type, print_drive_commandline_full)
    if storage.content is not None and vtype not in storage.content:
        raise ValueError(f"storage '{store}' does not support content-type '{vtype}'")
    if iso and drive.get("media") is None:
        raise ValueError(f"{drive.key}: explicit media parameter is required for iso images")
    resolver = _RESOLVERS.get(storage.type)
    if resolver is None:
        raise ValueError(f"{drive.key}: storage type {storage.type!r} ({store}) is not modelled "
                         f"(known: {', '.join(STORAGE_TYPES)})")
    return resolver(_OnStorage(drive, store, storage, volname, []))


class _OnStorage(NamedTuple):
    """A drive's volume on its storage, being resolved; ``notes`` collects what was assumed."""

    drive: Drive
    store: str
    storage: Storage
    volname: str
    notes: list[str]

    def given(self, value: str | None, what: str, assumed: str) -> str:
        """``value``, or ``assumed`` with a note where the storage's definition does not say."""
        if value:
            return value
        self.notes.append(f"{self.drive.key}: storage {self.store} ({self.storage.type}) does not "
                          f"say its {what}: {assumed} assumed (give --storage-cfg with its "
                          "definition)")
        return assumed

    def volume(self, driver: Literal["file", "host_device"], path: str, fmt: str = "raw",
               **more: Any) -> Volume:
        return Volume(driver=driver, path=path, format=fmt, storage=self.storage.kind,
                      volid=self.drive.volume, notes=tuple(self.notes), **more)

    def unparsable(self, kind: str) -> ValueError:
        return ValueError(f"{self.drive.key}: unable to parse {kind} volume name '{self.volname}'")


def _file_volume(at: _OnStorage) -> Volume:
    """A directory-like storage (Plugin.pm, BTRFSPlugin.pm): an image or an ISO."""
    drive, storage = at.drive, at.storage
    iso = _ISO.match(at.volname)
    vtype = "iso" if iso else "images"
    default = "/var/lib/vz" if storage.type == "dir" else f"/mnt/pve/{at.store}"
    base = at.given(storage.path, "path", default)
    subdir = dict(storage.content_dirs).get(vtype, "template/iso" if iso else "images")
    if iso:
        return at.volume("file", f"{base}/{subdir}/{iso.group(1)}")
    vmid, name, fmt = _dir_image(drive.key, at.volname)
    path = f"{base}/{subdir}/{vmid}/{name}"
    if storage.type == "btrfs" and fmt == "raw":   # BTRFSPlugin: a subvolume per raw disk
        path = f"{base}/{subdir}/{vmid}/{name[:-4]}/disk.raw"
    chain = storage.volume_chain and fmt == "qcow2"
    return at.volume("file", path, fmt, volume_chain=chain,
                     backing=chain and storage.type in ("dir", "nfs", "cifs"))


def _lvm_volume(at: _OnStorage) -> Volume:
    """LVMPlugin.pm, LvmThinPlugin.pm: a logical volume (thick LVM: raw, or qcow2 in it)."""
    volname, thick = at.volname, at.storage.type == "lvm"
    if not re.match(r"^(vm|base)-\d+-[a-z0-9\-_.]*[a-z0-9]$", volname, re.IGNORECASE) or (
            thick and volname.startswith("base-")):
        raise at.unparsable("lvm")
    fmt = "qcow2" if thick and volname.endswith(".qcow2") else "raw"
    path = f"/dev/{at.given(at.storage.vgname, 'volume group', at.store)}/{volname}"
    return at.volume("host_device", path, fmt,
                     volume_chain=at.storage.volume_chain and fmt == "qcow2",
                     backing=fmt == "qcow2")


def _zfs_volume(at: _OnStorage) -> Volume:
    """ZFSPoolPlugin.pm (a zvol) and ZFSPlugin.pm (ZFS over iSCSI)."""
    found = re.match(r"^(?:(?:base|basevol)-\d+-\S+/)?((base|basevol|vm|subvol)-\d+-\S+)$",
                     at.volname)
    if found is None:
        raise at.unparsable("zfs")
    if found.group(2) in ("subvol", "basevol"):
        raise ValueError(f"{at.drive.key}: volume '{at.volname}' not usable as VM image")
    pool = at.given(at.storage.pool, "pool", at.store)
    if at.storage.type == "zfspool":
        return at.volume("host_device", f"/dev/zvol/{pool}/{found.group(1)}")
    # ZFS over iSCSI: ZFSPlugin qemu_blockdev_options asks the target for the LUN (ssh)
    portal = at.given(at.storage.portal, "portal", "<portal>")
    target = at.given(at.storage.target, "target", "<target>")
    at.notes.append(f"{at.drive.key}: ZFS over iSCSI: qemu-server asks the target for the LUN of "
                    f"{pool}/{found.group(1)} (over ssh); LUN 0 assumed")
    return _iscsi(portal, target, 0, at.storage.kind, at.drive.volume, at.notes)


def _iscsi_volume(at: _OnStorage) -> Volume:
    """ISCSIPlugin.pm (the kernel's initiator: a /dev/disk/by-id device) and
    ISCSIDirectPlugin.pm (QEMU's own: ``lunN``)."""
    if at.storage.type == "iscsi":
        found = re.match(r"^\d+\.\d+\.\d+\.([^/\s]+)$", at.volname)
        if found is None:
            raise at.unparsable("iscsi")
        return at.volume("host_device", f"/dev/disk/by-id/{found.group(1)}")
    found = re.match(r"^lun(\d+)$", at.volname)
    if found is None:
        raise at.unparsable("iscsi")
    return _iscsi(at.given(at.storage.portal, "portal", "<portal>"),
                  at.given(at.storage.target, "target", "<target>"), found.group(1),
                  at.storage.kind, at.drive.volume, at.notes)


def _dir_image(key: str, volname: str) -> tuple[str, str, str]:
    """Plugin.pm parse_volname for an image: ``VMID/NAME`` or a linked clone's
    ``BASEVMID/BASENAME/VMID/NAME`` → (vmid, name, format)."""
    found = re.match(r"^(?:\d+/\S+/)?(\d+)/([^/\s]+)$", volname)
    if found is None:
        raise ValueError(f"{key}: unable to parse directory volume name '{volname}'")
    fmt = found.group(2).rsplit(".", 1)[-1] if "." in found.group(2) else ""
    if fmt not in ("raw", "qcow2", "vmdk", "subvol"):
        raise ValueError(f"{key}: unable to parse volume filename '{found.group(2)}'")
    if fmt == "subvol":
        raise ValueError(f"{key}: volume '{volname}' - not a QEMU image format 'subvol'")
    return found.group(1), found.group(2), fmt


def _iscsi(portal: str, target: str, lun: int | str, kind: str, volid: str,
           notes: list[str]) -> Volume:
    """An iSCSI LUN opened by QEMU's own initiator (libiscsi)."""
    return Volume(driver="iscsi", path=f"iscsi://{portal}/{target}/{lun}", format="raw",
                  storage=kind, volid=volid, node={"lun": lun, "portal": portal,
                                                   "target": target, "transport": "tcp"},
                  notes=tuple(notes))


def _rbd(at: _OnStorage) -> Volume:
    """RBDPlugin.pm path and qemu_blockdev_options; ceph_connect_option for the monitors,
    configuration file and auth."""
    drive, storage, volname, notes = at.drive, at.storage, at.volname, at.notes
    found = re.match(r"^(?:base-\d+-\S+/)?((?:base)?(?:vm)?-\d+-\S+)$", volname)
    if found is None:
        raise ValueError(f"{drive.key}: unable to parse rbd volume name '{volname}'")
    image = found.group(1)
    if not storage.pool:
        notes.append(f"{drive.key}: storage {storage.id} (rbd) names no pool: Proxmox VE's "
                     "default, rbd")
    pool = storage.pool or "rbd"
    spec = "/".join(p for p in (pool, storage.namespace, image) if p)
    if storage.krbd:
        fsid = storage.fsid or "<fsid>"
        if not storage.fsid:
            notes.append(f"{drive.key}: krbd's device is /dev/rbd-pve/<fsid>/…: qemu-server "
                         "takes the fsid from " + ("the monitors" if storage.monhost else
                                                   "/etc/pve/ceph.conf ([global] fsid)")
                         + "; `ceph fsid` prints it (add `fsid <uuid>` to the storage's section "
                         "of the storage.cfg given)")
        return Volume(driver="host_device", path=f"/dev/rbd-pve/{fsid}/{spec}", format="raw",
                      storage="krbd", volid=drive.volume, notes=tuple(notes))
    keyring = f"{CEPH_PRIV}/{storage.id}.keyring"
    user = storage.username or "admin"
    conf = None
    if storage.monhost is None:
        conf = "/etc/pve/ceph.conf"
        notes.append(f"{drive.key}: storage {storage.id} names no monhost: a cluster Proxmox VE "
                     "manages (pveceph), whose /etc/pve/ceph.conf names the monitors")
    elif storage.ceph_conf:
        conf = f"{CEPH_PRIV}/{storage.id}.conf"
    # ceph_connect_option looks for these files; Proxmox VE writes them when the storage is added
    assumed = [f for f, there in ((keyring, storage.keyring), (conf, conf != "/etc/pve/ceph.conf"))
               if there and f]
    if assumed:
        notes.append(f"{drive.key}: {' and '.join(assumed)} assumed to exist (Proxmox VE writes "
                     "them when the storage is added)" + (f": cephx as {user}" if storage.keyring
                                                           else ""))
    node: dict[str, Any] = {"pool": pool, "image": image}
    if storage.namespace:
        node["namespace"] = storage.namespace
    if conf:
        node["conf"] = conf
    drive_file = f"rbd:{spec}" + (f":conf={conf}" if conf else "")
    if storage.monhost is not None:
        auth = "cephx" if storage.keyring else "none"
        hosts = [_host_and_port(m) for m in re.split(r"[,;\s]+", storage.monhost.strip()) if m]
        node["server"] = [{"host": host, "port": port or "3300"} for host, port in hosts]
        node["auth-client-required"] = [auth]
        listed = ";".join((f"[{h}]" if ":" in h else h) + (f":{p}" if p else "")
                          for h, p in hosts).replace(":", "\\:")
        drive_file += f":mon_host={listed}:auth_supported={auth}"
    if storage.keyring:
        node["user"] = user
        drive_file += f":id={user}:keyring={keyring}"
    return Volume(driver="rbd", path=f"{pool}/{image}", format="raw", storage="rbd",
                  volid=drive.volume, node=node, drive_file=drive_file, notes=tuple(notes))


_RESOLVERS: dict[str, Callable[[_OnStorage], Volume]] = {
    **{kind: _file_volume for kind in FILE_STORAGES}, "lvm": _lvm_volume,
    "lvmthin": _lvm_volume, "zfspool": _zfs_volume, "zfs": _zfs_volume, "iscsi": _iscsi_volume,
    "iscsidirect": _iscsi_volume, "rbd": _rbd}
"""Storage type → how its volumes resolve (every one of STORAGE_TYPES)."""


def _host_and_port(address: str) -> tuple[str, str | None]:
    """PVE::Tools parse_host_and_port: ``host[:port]``, ``[v6][:port]``, or a bare IPv6."""
    bracketed = re.match(r"^\[([^\]]+)\](?::(\d+))?$", address)
    if bracketed:
        return bracketed.group(1), bracketed.group(2)
    if address.count(":") == 1:
        host, _, port = address.partition(":")
        return host, port
    return address, None


# -- Drive.pm rules ---------------------------------------------------------------------------

def uses_cache_direct(cache: str | None, storage: str, *, cdrom: bool = False) -> bool:
    """Drive.pm drive_uses_cache_direct: a given cache is direct when none/off/directsync; no
    cache is direct unless the drive is a CD-ROM or on btrfs without nocow."""
    if cache:
        return cache in ("off", "none", "directsync")
    return not cdrom and storage != "btrfs"


def allows_io_uring_default(storage: str, direct: bool) -> bool:
    """Drive.pm storage_allows_io_uring_default: not on krbd with a non-direct cache, not on
    (thick) LVM, not on CIFS."""
    if storage == "krbd" and not direct:
        return False
    return storage not in ("lvm", "cifs")


def aio_option(aio: str | None, storage: str, direct: bool) -> str:
    """Drive.pm aio_cmdline_option: a given aio unchanged; else io_uring where allowed, else
    native with a direct cache and threads without."""
    if aio:
        return aio
    if allows_io_uring_default(storage, direct):
        return "io_uring"
    return "native" if direct else "threads"


def detect_zeroes_option(drive: Drive) -> str:
    """Drive.pm detect_zeroes_cmdline_option: off when detect_zeroes=0; unmap with discard=on,
    on with discard=ignore; on when neither is given ("This used to be our default")."""
    if drive.flag("detect_zeroes") is False:
        return "off"
    discard = drive.get("discard")
    if discard:
        return "unmap" if discard == "on" else "on"
    return "on"


def node_name(kind: Literal["file", "fmt"], drive_id: str, volid: str) -> str:
    """Blockdev.pm get_node_name: ``e`` (file) or ``f`` (format) and the first 30 hex digits of
    sha256("drive=<id>,volid=<volid>")."""
    digest = hashlib.sha256(f"drive={drive_id},volid={volid}".encode()).hexdigest()[:30]
    return ("e" if kind == "file" else "f") + digest


def controller_of(drive: Drive, scsihw: str | None) -> tuple[str, str, str] | None:
    """(QEMU type, id, disk bus) of the controller a drive needs, or None (virtio-blk; IDE is the
    machine's own). DriveDevice.pm scsihw_infos: lsi* hold 7 disks per controller, virtio-scsi-single
    one (``virtioscsiN``), the others 256 (``scsihwN``); sata: 6 per ``ahciN``."""
    if drive.bus == "scsi":
        hw = scsihw or SCSIHW_DEFAULT
        if hw.startswith("lsi"):
            per, prefix = 7, "scsihw"
        elif hw == "virtio-scsi-single":
            per, prefix = 1, "virtioscsi"
        else:
            per, prefix = 256, "scsihw"
        ident = f"{prefix}{drive.index // per}"
        return ("virtio-scsi-pci" if hw.startswith("virtio-scsi-single") else hw), ident, f"{ident}.0"
    if drive.bus == "sata":
        ident = f"ahci{drive.index // 6}"
        return "ahci", ident, f"{ident}.{drive.index % 6}"
    return None


def drive_order(key: str) -> tuple[int, int]:
    """Drive.pm valid_drive_names: the order config_to_command adds drives in (ide, scsi,
    virtio, sata, then efidisk0 and tpmstate0)."""
    found = DRIVE_KEY.match(key)
    if found is None:
        raise ValueError(f"{key!r} is not a drive key")
    return ("ide", "scsi", "virtio", "sata", "efidisk", "tpmstate").index(found.group(1)), int(
        found.group(2))


class DiskArgs(Frozen):
    """One disk's QEMU arguments as qemu-server generates them, and what was not reproduced."""

    argv: tuple[str, ...]
    notes: tuple[str, ...] = ()
    iothread: str | None = None
    """The iothread object's id, when the disk (or its controller) gets one."""


def disk_args(drive: Drive, volume: Volume | None, *, scsihw: str | None, version: PveVersion,
              size: int | None = None, escape: bool = False, host: PveVersion | None = None,
              template: bool = False, q35: bool = False, controller: bool = True,
              bootindex: int | None = None) -> DiskArgs:
    """The ``-object``/``-device``/``-drive``/``-blockdev`` arguments qemu-server's
    config_to_command emits for ``drive`` (a disk or CD-ROM, in its order: objects,
    controller, drive, device); ``volume`` None for an empty drive (``none``).

    ``version``: the generation (8: ``-drive``, 9: ``-blockdev``); ``host``: the qemu-server
    writing it (PVE 9 writes ``-drive`` for machines below 10.0, in its own order), by default
    ``version``. ``template``: a template's read-only graph; ``q35``: that machine's IDE buses;
    ``controller`` False when an earlier drive on the same controller added it; ``bootindex``
    the device's (:func:`boot_order`). ``size`` limits a raw format node (Blockdev.pm
    generate_format_blockdev's ``size``); ``escape`` doubles commas in a path (qemu-server's
    paths have none)."""
    notes: list[str] = list(volume.notes) if volume else []
    drive_id = drive.key
    storage = volume.storage if volume else "path"
    direct = uses_cache_direct(drive.get("cache"), storage, cdrom=drive.is_cdrom)
    objects: list[str] = []
    iothread = _iothread(drive, scsihw, notes)
    if iothread:
        objects += ["-object", f"iothread,id={iothread}"]
    if version >= 9 and volume is not None:
        objects += ["-object", _json(_throttle_group(drive))]
    where = controller_of(drive, scsihw)
    added = _controller_device(drive, scsihw, where, iothread, notes)   # notes even when not added
    devices = added if controller else []
    if drive.flag("ssd") and drive.bus == "virtio":
        notes.append(f"{drive_id}: ssd=1 has no effect on a virtio drive (no rotation_rate)")
    aio = aio_option(drive.get("aio"), storage, direct)
    if version >= 9:
        if volume is not None and drive.flag("snapshot"):   # Blockdev.pm generate_file_blockdev
            raise ValueError(f"{drive_id}: 'snapshot' option is not yet supported for '-blockdev'")
        if volume is not None:
            devices += ["-blockdev", _json(_blockdev(drive, volume, direct, aio, size,
                                                     read_only=template))]
        if volume is not None and volume.driver == "rbd":
            notes.append(f"{drive_id}: librbd gets no aio (Blockdev.pm generate_file_blockdev "
                         "sets aio only on file, host_device and host_cdrom nodes)")
    else:
        if volume is not None and volume.volume_chain:
            raise ValueError(f"storage for '{drive.volume}' is configured for snapshots as a "
                             "volume chain - this requires QEMU machine version >= 10.0")
        line = _drive_line(drive, volume, direct, aio, size, escape, host or version)
        if template and drive.bus not in ("ide", "sata"):
            line += ",readonly=on"
        devices += ["-drive", line]
        if volume is not None and volume.driver == "rbd":
            notes.append(f"{drive_id}: librbd ignores -drive's aio=")
    scsi_block = bool(drive.flag("scsiblock")) and storage == "path"
    if scsi_block:
        notes.append(f"{drive_id}: scsiblock=1 on {drive.volume}: scsi-block, as qemu-server "
                     "makes it for a SCSI disk (it asks the device; a device that is not SCSI "
                     "gets scsi-hd)")
    devices += ["-device", _device(drive, scsihw, version, where, template=template, q35=q35,
                                   attached=volume is not None, scsi_block=scsi_block,
                                   bootindex=bootindex)]
    for name in drive.unmodelled:
        notes.append(f"{drive_id}: {name}={drive.get(name)} is not reproduced by iomatrix in a "
                     "measurement (the arguments carry it, a measured disk runs without it)")
    for name in drive.unknown:
        notes.append(f"{drive_id}: {name}={drive.get(name)} is not a qemu-server drive option "
                     "iomatrix knows")
    return DiskArgs(argv=tuple(objects + devices), notes=tuple(notes), iothread=iothread)


def _iothread(drive: Drive, scsihw: str | None, notes: list[str]) -> str | None:
    """config_to_command: the iothread's id for a virtio drive, and for a scsi drive only on
    virtio-scsi-single; elsewhere iothread=1 is ignored (noted)."""
    if not drive.flag("iothread"):
        return None
    if drive.bus == "virtio":
        return f"iothread-{drive.key}"
    if drive.bus == "scsi" and scsihw == "virtio-scsi-single":
        return f"iothread-virtioscsi{drive.index}"
    notes.append(f"{drive.key}: iothread=1 is ignored by qemu-server here (only virtio "
                 "disks and scsihw virtio-scsi-single get an iothread)")
    return None


def _controller_device(drive: Drive, scsihw: str | None, where: tuple[str, str, str] | None,
                       iothread: str | None, notes: list[str]) -> list[str]:
    """The ``-device`` of the drive's controller (none for virtio-blk and IDE): AHCI
    multifunction, a SCSI controller with the iothread and, on virtio-scsi-single, the drive's
    ``queues`` (which qemu-server ignores elsewhere: noted)."""
    queues = drive.get("queues")
    single = drive.bus == "scsi" and scsihw == "virtio-scsi-single"
    if queues and not single:
        notes.append(f"{drive.key}: queues={queues} is ignored by qemu-server here (only scsi "
                     "drives on virtio-scsi-single)")
    if where is None:
        return []
    ctype, cid, _ = where
    props = f"{ctype},id={cid}"
    if ctype == "ahci":
        props += ",multifunction=on"
    elif iothread and drive.bus == "scsi":
        props += f",iothread={iothread}"
    if single and queues:
        props += f",num_queues={queues}"
    return ["-device", props]


OVMF_DIR = "/usr/share/pve-edk2-firmware/"
OVMF_VARS_SIZE = {"2m": 128 << 10, "4m": 528 << 10}
"""Sizes of pve-edk2-firmware's vars templates (OVMF_VARS.fd, OVMF_VARS_4M*.fd): a raw EFI
disk's format node is limited to them."""


def ovmf_code(drive: Drive, *, q35: bool, cvm: str | None,
              host: PveVersion = DEFAULT_PVE_VERSION) -> tuple[str, int]:
    """OVMF.pm get_ovmf_files (x86_64): the firmware code image for the EFI disk's type, and
    the size of its vars template. The secure-boot code needs SMM, which only q35 has; AMD
    SEV's code is OVMF_CVM_CODE_4M.fd up to qemu-server 8, OVMF_SEV_CODE_4M.fd from 9."""
    if cvm in ("std", "es"):
        code = "OVMF_SEV_CODE_4M.fd" if host >= 9 else "OVMF_CVM_CODE_4M.fd"
        return f"{OVMF_DIR}/{code}", OVMF_VARS_SIZE["4m"]
    if drive.get("efitype") == "4m":
        code = "OVMF_CODE_4M.secboot.fd" if q35 else "OVMF_CODE_4M.fd"
        return f"{OVMF_DIR}/{code}", OVMF_VARS_SIZE["4m"]
    return f"{OVMF_DIR}/OVMF_CODE.fd", OVMF_VARS_SIZE["2m"]


def efidisk_args(drive: Drive, volume: Volume, *, version: PveVersion,
                 host: PveVersion | None = None, q35: bool = False, cvm: str | None = None,
                 template: bool = False, machine: tuple[int, int, int] | None = None) -> DiskArgs:
    """The firmware's two flash devices qemu-server attaches for ``bios: ovmf`` (OVMF.pm
    print_ovmf_commandline): the read-only code image and the EFI disk, the writable vars.
    PVE 9: ``-blockdev`` nodes (the vars under a throttle filter, cache writeback unless given,
    bug #3329) named in ``-machine pflash0=,pflash1=``; PVE 8: two ``-drive if=pflash``.
    ``machine``: a pinned machine version (below 4.1+pve2 a raw vars drive gets no size)."""
    code, vars_size = ovmf_code(drive, q35=q35, cvm=cvm, host=host or version)
    notes = list(volume.notes)
    size = vars_size if volume.format == "raw" else None
    if version >= 9:
        vars_drive = drive if drive.get("cache") else drive.model_copy(
            update={"options": (*drive.options, ("cache", "writeback"))})
        direct = uses_cache_direct(vars_drive.get("cache"), volume.storage)
        graph = _blockdev(vars_drive, volume, direct,
                          aio_option(drive.get("aio"), volume.storage, direct), size,
                          read_only=template)
        code_node = {"driver": "raw", "file": {"driver": "file", "filename": code},
                     "node-name": "pflash0", "read-only": True}
        argv = ["-object", _json(_throttle_group(drive)), "-blockdev", _json(code_node),
                "-blockdev", _json(graph), "-machine", "pflash0=pflash0,pflash1=drive-efidisk0"]
    else:
        path = volume.drive_file or volume.path
        line = "if=pflash,unit=1,id=drive-efidisk0"
        if volume.driver == "rbd":
            line += ",cache=writeback"
            path += ":rbd_cache_policy=writeback"
        line += f",format={volume.format},file={path}"
        if size is not None and (machine is None or machine >= (4, 1, 2)):
            line += f",size={size}"
        if template:
            line += ",readonly=on"
        argv = ["-drive", f"if=pflash,unit=0,format=raw,readonly=on,file={code}", "-drive", line]
    return DiskArgs(argv=tuple(argv), notes=tuple(notes))


def tpm_args(vmid: str) -> tuple[str, ...]:
    """QemuServer.pm add_tpm_device: QEMU talks to swtpm over a socket; swtpm, not QEMU, opens
    the tpmstate volume."""
    return ("-chardev", f"socket,id=tpmchar,path=/var/run/qemu-server/{vmid}.swtpm",
            "-tpmdev", "emulator,id=tpmdev,chardev=tpmchar", "-device", "tpm-tis,tpmdev=tpmdev")


def _json(value: dict[str, Any]) -> str:
    """qemu-server's ``to_json($x, { canonical => 1 })``: sorted keys, no blanks."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


class DaemonGraph(Frozen):
    """One disk's block graph as a qemu-storage-daemon holds it (blocklayer mode): the layers a
    PVE disk has, without the guest device. The daemon has no ``-drive``."""

    objects: tuple[str, ...]
    """``--object`` values (JSON): PVE 9's empty throttle group."""
    blockdev: str
    """The one nested ``--blockdev`` value (JSON)."""
    top: str
    """The node the guest device attaches to (here: the export's node)."""
    throttle_group: str | None = None
    """The throttle group's id (PVE 9)."""


def daemon_graph(drive: Drive, volume: Volume, *, version: PveVersion,
                 size: int | None = None) -> DaemonGraph:
    """The block graph qemu-server builds for ``drive``, as ``--object``/``--blockdev`` values.

    PVE 9: exactly its ``-blockdev`` (throttle ``drive-<key>`` → format → protocol, discard and
    detect-zeroes on every node) over its empty throttle group. PVE 8: what QEMU makes of its
    ``-drive`` line, spelled as ``-blockdev``: the format node with the drive's cache, discard
    and detect-zeroes, over a protocol node with aio and cache; detect-zeroes stays off there
    (not inherited) and discard is unmap (QEMU's block.c ``bdrv_inherited_options``: a format
    node's protocol child defaults to ``discard=unmap``). QEMU names -drive's nodes itself
    (``#blockN``); here they get PVE 9's names (``node_name``)."""
    direct = uses_cache_direct(drive.get("cache"), volume.storage)
    aio = aio_option(drive.get("aio"), volume.storage, direct)
    graph = _blockdev(drive, volume, direct, aio, size)
    if version >= 9:
        group = _throttle_group(drive)
        return DaemonGraph(objects=(_json(group),), blockdev=_json(graph), top=graph["node-name"],
                           throttle_group=group["id"])
    fmt = graph["file"]
    fmt["file"] = {k: v for k, v in fmt["file"].items() if k != "detect-zeroes"} | {
        "discard": "unmap"}
    return DaemonGraph(objects=(), blockdev=_json(fmt), top=fmt["node-name"])


def daemon_detect_zeroes(drive: Drive, version: PveVersion) -> dict[str, str]:
    """detect-zeroes per layer of :func:`daemon_graph` (``protocol``, ``format``, ``throttle``),
    as ``query-named-block-nodes`` must report it."""
    value = detect_zeroes_option(drive)
    if version >= 9:
        return {"protocol": value, "format": value, "throttle": value}
    return {"protocol": "off", "format": value}


def _throttle_group(drive: Drive) -> dict[str, Any]:
    """Blockdev.pm generate_throttle_group: the drive's limits (none: an empty group)."""
    limits = {name: int(float(value)) for name, value in _limits(drive)}
    return {"id": f"throttle-drive-{drive.key}", "limits": limits, "qom-type": "throttle-group"}


def _limits(drive: Drive) -> list[tuple[str, str]]:
    """The drive's throttling limits as QEMU names them, in qemu-server's order, with the
    values as it writes them on a ``-drive`` line (MB/s in bytes; the deprecated ``bps*``
    options turned into MB/s as Drive.pm parse_drive does)."""
    out = []
    for suffix, qmp in (("", "-total"), ("_rd", "-read"), ("_wr", "-write")):
        mbps = drive.get(f"mbps{suffix}")
        if mbps is None and drive.get(f"bps{suffix}") is not None:
            mbps = f"{float(drive.get(f'bps{suffix}') or 0) / (1 << 20):.3f}"
        for name, option, value in ((f"bps{qmp}", f"mbps{suffix}", mbps),
                                    (f"bps{qmp}-max", f"mbps{suffix}_max",
                                     drive.get(f"mbps{suffix}_max"))):
            if value is not None and (number := _finite(drive, option, value, 1 << 20)):
                out.append((name, str(int(number))))
        for name, option in ((f"bps{qmp}-max-length", f"bps{suffix}_max_length"),
                             (f"iops{qmp}", f"iops{suffix}"),
                             (f"iops{qmp}-max", f"iops{suffix}_max"),
                             (f"iops{qmp}-max-length", f"iops{suffix}_max_length")):
            value = drive.get(option)
            if value is not None and _finite(drive, option, value):
                out.append((name, value))
    return out


def _finite(drive: Drive, option: str, value: str, scale: int = 1) -> float:
    """``value`` times ``scale``; ValueError naming ``option`` when that is not a finite number
    (a number of 400 digits is infinite as a float)."""
    try:
        number = float(value) * scale
    except ValueError:
        number = math.nan
    if not math.isfinite(number):
        raise ValueError(f"{drive.key}: {option}={value[:40]}: not a number qemu-server takes")
    return number


def _blockdev(drive: Drive, volume: Volume, direct: bool, aio: str,
              size: int | None, *, read_only: bool = False) -> dict[str, Any]:
    """Blockdev.pm generate_drive_blockdev: throttle → format → file, nested; add_common_options
    puts discard (unmap with discard=on, else ignore) and detect-zeroes on each node of a disk
    (a CD-ROM gets neither), and read-only on each (``ro=1``, a CD-ROM, a template). A
    ``scsiblock`` drive gets no throttle filter: its format node is the top."""
    common: dict[str, Any] = {}
    if not drive.is_cdrom:
        common = {"discard": "unmap" if drive.get("discard") == "on" else "ignore",
                  "detect-zeroes": detect_zeroes_option(drive)}
    common["read-only"] = bool(drive.flag("ro")) or drive.is_cdrom or read_only
    cache = {"direct": direct, "no-flush": drive.get("cache") == "unsafe"}
    if volume.driver == "rbd" and drive.bus == "efidisk":   # bug #3329: librbd's own cache
        cache = {"direct": False, "no-flush": False}
    file_node: dict[str, Any] = {"driver": volume.driver, **volume.node}
    if volume.driver in ("file", "host_device", "host_cdrom"):
        file_node |= {"filename": volume.path, "aio": aio}
    file_node |= {"cache": cache, "node-name": node_name("file", drive.key, volume.volid)} | common
    fmt: dict[str, Any] = {"node-name": node_name("fmt", drive.key, volume.volid),
                           "driver": volume.format, "file": file_node, "cache": cache} | common
    if size is not None and volume.format == "raw":
        fmt["size"] = size
    if volume.volume_chain:
        fmt["discard-no-unref"] = True
    if drive.flag("scsiblock"):
        return fmt | {"node-name": f"drive-{drive.key}"}
    return {"driver": "throttle", "node-name": f"drive-{drive.key}",
            "throttle-group": f"throttle-drive-{drive.key}", "file": fmt} | common


def _drive_line(drive: Drive, volume: Volume | None, direct: bool, aio: str, size: int | None,
                escape: bool, host: PveVersion) -> str:
    """print_drive_commandline_full: ``file=,if=none,id=``, the drive's own options, throttling,
    ``format=``, ``cache=none`` when no cache is given but it is direct, ``aio=`` and
    ``detect-zeroes=`` (not for a CD-ROM). qemu-server 8.3 writes a given aio among the drive's
    options (heads secs cyls trans media cache rerror werror aio discard) and adds the default
    only when none is given; 9.x writes ``aio=`` always, after the cache."""
    if volume is None:
        path = ""
    elif volume.drive_file:
        path = volume.drive_file
    else:
        path = volume.path.replace(",", ",,") if escape else volume.path
    own = (("heads", "secs", "cyls", "trans", "media", "cache", "rerror", "werror", "aio",
            "discard") if host < 9 else ("media", "cache", "rerror", "werror", "discard"))
    line = (f"file={path}," if path else "") + f"if=none,id=drive-{drive.key}"
    for name in own:
        if drive.get(name) is not None:
            line += f",{name}={drive.get(name)}"
    if drive.get("snapshot") is not None:
        line += ",snapshot=" + on_off(bool(drive.flag("snapshot")))
    if drive.get("ro") is not None:
        line += ",readonly=" + on_off(bool(drive.flag("ro")))
    line += "".join(f",throttling.{name}={value}" for name, value in _limits(drive))
    if volume is not None:
        line += f",format={volume.format}"
        if size is not None and volume.format == "raw":
            line += f",size={size}"
    if not drive.get("cache") and direct:
        line += ",cache=none"
    if host >= 9 or not drive.get("aio"):
        line += f",aio={aio}"
    return line + ("" if drive.is_cdrom else f",detect-zeroes={detect_zeroes_option(drive)}")


def _device(drive: Drive, scsihw: str | None, version: PveVersion,
            controller: tuple[str, str, str] | None, *, template: bool = False,
            q35: bool = False, attached: bool = True, scsi_block: bool = False,
            bootindex: int | None = None) -> str:
    """DriveDevice.pm print_drivedevice_full, without PCI address. A template's
    SATA and IDE drives are ide-cd on PVE 9 (IDE cannot be read-only; a template is only
    started for backups, which read the block node); q35 has one unit per IDE bus."""
    drive_id = drive.key
    blockdev = version >= 9
    attach = f",drive=drive-{drive_id}" if attached or not blockdev else ""
    write_cache = True
    if drive.bus == "virtio":
        device = f"virtio-blk-pci{attach},id={drive_id}"
        if drive.flag("iothread"):
            device += f",iothread=iothread-{drive_id}"
    elif drive.bus == "scsi":
        assert controller is not None
        kind = ("cd" if drive.is_cdrom or drive.is_cloudinit else "block" if scsi_block
                else "hd")
        hw = scsihw or SCSIHW_DEFAULT
        if hw.startswith("lsi") or hw == "pvscsi":
            per = 7 if hw.startswith("lsi") else 256
            device = f"scsi-{kind},bus={controller[2]},scsi-id={drive.index % per}"
        else:
            device = f"scsi-{kind},bus={controller[2]},channel=0,scsi-id=0,lun={drive.index}"
        device += f"{attach},id={drive_id}"
        if blockdev and kind != "block":
            device += f",device_id=drive-{drive_id}"
        if drive.flag("ssd") and kind != "cd":
            device += ",rotation_rate=1"
        device += f",wwn={drive.get('wwn')}" if drive.get("wwn") else ""
        if kind == "block":
            write_cache = False
        else:
            device += "".join(f",{k}={drive.get(k)}" for k in ("vendor", "product") if drive.get(k))
    else:
        bus, unit = divmod(drive.index, 6 if drive.bus == "sata" else 2)
        if q35 and drive.bus == "ide":
            bus, unit = bus + 2 * (unit % 2), 0
        kind = "cd" if drive.is_cdrom or (template and blockdev) else "hd"
        device = f"ide-{kind}," + (f"bus=ide.{bus},unit={unit}" if drive.bus == "ide"
                                   else f"bus=ahci{bus}.{unit}")
        device += f"{attach},id={drive_id}"
        if kind == "hd":
            device += f",model={_unescaped(drive.get('model'))}" if drive.get("model") else ""
            device += ",rotation_rate=1" if drive.flag("ssd") else ""
        device += f",wwn={drive.get('wwn')}" if drive.get("wwn") else ""
    if bootindex:
        device += f",bootindex={bootindex}"
    if drive.get("serial"):
        device += f",serial={_unescaped(drive.get('serial'))}"
    if blockdev:
        if not drive.is_cdrom and write_cache:
            cache = drive.get("cache")
            device += ",write-cache=" + ("off" if cache in ("writethrough", "directsync") else "on")
        device += "".join(f",{k}={drive.get(k)}" for k in ("rerror", "werror") if drive.get(k))
    return device


def _unescaped(value: str | None) -> str:
    """DriveDevice.pm: serial= and model= are URL-encoded in the configuration; decoded, and a
    comma doubled for QEMU's parser."""
    return urllib.parse.unquote(value or "").replace(",", ",,")


# -- iomatrix configurations ------------------------------------------------------------------

CONTROLLER_BUS: dict[str, tuple[str, str | None]] = {
    "virtio-blk": ("virtio", None), "virtio-scsi": ("scsi", "virtio-scsi-pci"),
    "virtio-scsi-single": ("scsi", "virtio-scsi-single"), "pvscsi": ("scsi", "pvscsi"),
    "lsi": ("scsi", "lsi"), "megasas": ("scsi", "megasas"), "sata": ("sata", None),
    "ide": ("ide", None)}
"""iomatrix controller → (drive bus, scsihw)."""
SCSIHW_CONTROLLER = {"virtio-scsi-pci": "virtio-scsi", "virtio-scsi-single": "virtio-scsi-single",
                     "pvscsi": "pvscsi", "lsi": "lsi", "megasas": "megasas"}
UNEXPRESSIBLE = {("controller", "nvme"): "Proxmox VE has no NVMe drive bus (virtioN, scsiN, "
                                         "sataN, ideN only)"}
"""(axis, level) a Proxmox VE drive cannot be told to use, and why."""
NO_AIO_STORAGES = {"rbd": "librbd (rbd without krbd)"}
"""Storages whose disks get no aio at all. qemu-server Blockdev.pm generate_file_blockdev:
``# only certain drivers have the aio setting`` / ``if ($driver eq 'file' || $driver eq
'host_cdrom' || $driver eq 'host_device')``: an rbd node gets none (PVE 9); PVE 8's -drive passes
one, which librbd ignores. So an aio setting does nothing there."""


def refusal(settings: DiskSettings) -> str | None:
    """Why qemu-server cannot give a guest ``settings`` (docs/proxmox-options.md), or None."""
    kind = disk_kind(settings)
    if ("controller", kind) in UNEXPRESSIBLE:
        return UNEXPRESSIBLE[("controller", kind)]
    if kind == "vhost-user-blk":
        return "qemu-server does not attach vhost-user-blk disks"
    if settings.iothread and kind not in ("virtio-blk", "virtio-scsi-single"):
        # QemuServer.pm config_to_command: "iothread is only valid with virtio disk or
        # virtio-scsi-single controller, ignoring"; sata/ide drives have no iothread option.
        return (f"qemu-server ignores iothread=1 on {kind} (only virtio disks and scsihw "
                "virtio-scsi-single get an iothread): the guest would run without one")
    if settings.num_queues and (kind != "virtio-scsi-single" or settings.num_queues < 2):
        return ("qemu-server passes queues= only for scsi drives on virtio-scsi-single, "
                "from 2 up (Drive.pm %queues_fmt minimum 2; config_to_command)")
    if settings.queue_size:
        return "qemu-server has no virtqueue-size option"
    return None


PLACEHOLDER_VMID = "<vmid>"
PLACEHOLDER_VOLUME = "<storage>:<volume>"

# -- defaults, as recommend compares with them (reference §1) ------------------------------------
TITLE = "Proxmox VE"
GRAPH_DIFFERENCE = ("Proxmox VE gives every disk detect-zeroes=on (unmap with discard=on), "
                    "discard on every node, and in PVE 9 a throttle filter node with an empty "
                    "throttle group above it; its controllers and iothread naming are "
                    "qemu-server's")
"""How qemu-server's block graph differs from iomatrix's own (plain QEMU's)."""
NAMES = {"controller": "SCSI controller / bus (scsihw, virtioN|scsiN|sataN|ideN)",
         "aio": "Async IO (aio=)", "iothread": "IO thread (iothread=)",
         "cache": "Cache (cache=)", "format": "volume format",
         "preallocation": "preallocation (storage option)",
         "num_queues": "queues= (scsi)", "queue_size": "virtqueue size"}
"""Each parameter as the Proxmox VE GUI or ``qm`` names it."""
STORAGE_CHOICES = ("other", "dir", "lvm", "lvmthin", "zfspool", "rbd", "krbd", "cifs", "nfs",
                   "btrfs", "btrfs-nocow")
"""Storage types ``--storage-type`` accepts; "other" means any storage without an exception.
"rbd" is librbd (rbd without krbd); "btrfs-nocow" a btrfs storage with ``nocow 1``."""
NON_IO_URING_STORAGES = {"lvm": "thick LVM (qemu-server 7.0-11)",
                         "krbd": "rbd with krbd and a non-direct cache (qemu-server 7.0-6)",
                         "cifs": "CIFS (qemu-server 7.2-5, #4099)"}
"""Storages on which qemu-server's default aio is not io_uring (§1 "Default aio", point 2;
:func:`allows_io_uring_default`)."""
IOTHREAD_CONTROLLERS = ("virtio-blk", "virtio-scsi-single")
"""Where qemu-server creates an iothread. QemuServer.pm config_to_command: ``push @$cmd,
'-object', "iothread,id=iothread-$ds" if $drive->{iothread}`` for virtio drives, and for scsi
``if ($conf->{scsihw} && $conf->{scsihw} eq "virtio-scsi-single" && $drive->{iothread})``, else
``log_warn("iothread is only valid with virtio disk or virtio-scsi-single controller,
ignoring")``: on virtio-scsi-pci iothread=1 is ignored."""


def aio_default(storage: str, cache: str | None) -> str | None:
    """qemu-server's aio when a drive gives none (§1 "Default aio", :func:`aio_option`):
    io_uring, except on thick LVM, krbd and CIFS, where it is native if the cache is direct and
    threads otherwise; None on librbd, whose disks get no aio (``NO_AIO_STORAGES``)."""
    if storage in NO_AIO_STORAGES:
        return None
    return aio_option(None, storage, uses_cache_direct(cache, storage))


def cache_default(storage: str) -> str:
    """The cache a drive without ``cache=`` gets (§1 table, row "unset"): ``cache=none``, except
    on btrfs without nocow, where qemu-server passes nothing and QEMU's writeback applies
    (:func:`uses_cache_direct`); btrfs with nocow ("btrfs-nocow") is direct like any other."""
    return "none" if uses_cache_direct(None, storage) else "writeback"


def defaults(*, storage: str = "other",
             settings: dict[str, str] | None = None) -> dict[str, PlatformDefault]:
    """Every parameter's default for a new Linux VM's disk on ``storage``; aio follows the cache
    and iothread the controller in ``settings``."""
    settings = settings or {}
    cache = cache_default(storage)
    aio = aio_default(storage, settings.get("cache", cache))
    aio_note = ("io_uring except on thick LVM, krbd (non-direct cache) and CIFS, where it is "
                "native with a direct cache, else threads")
    if storage in NO_AIO_STORAGES:
        aio_note = (f"{NO_AIO_STORAGES[storage]}: qemu-server passes no aio (only file, "
                    "host_device and host_cdrom nodes get one): an aio setting does nothing")
    elif storage == "krbd":
        aio_note = f"{NON_IO_URING_STORAGES[storage]}: io_uring with a direct cache, else threads"
    elif storage in NON_IO_URING_STORAGES:
        aio_note = f"{NON_IO_URING_STORAGES[storage]}: native with a direct cache, else threads"
    controller = settings.get("controller", "virtio-scsi-single")
    # The GUI ticks IO thread for new Linux VMs on virtio-scsi-single and virtio disks only;
    # on virtio-scsi-pci qemu-server ignores it (IOTHREAD_CONTROLLERS).
    iothread = on_off(controller in IOTHREAD_CONTROLLERS)
    iothread_shown = "on" if iothread == "on" else (
        "off (ignored by qemu-server on virtio-scsi-pci)" if controller == "virtio-scsi"
        else "off (not on this bus)")
    return {
        "controller": default("virtio-scsi-single", note="GUI default for new Linux VMs since "
                              "PVE 7.3; the schema default scsihw is lsi"),
        "aio": default(aio, "none (librbd: no aio)" if aio is None else None, note=aio_note),
        "iothread": default(iothread, iothread_shown,
                            note="ticked by the GUI for new Linux VMs since PVE 7.3 (schema "
                                 "default off); virtio disks and virtio-scsi-single only"),
        "cache": default(cache, "none (cache unset)" if cache == "none" else
                         "unset → QEMU's writeback",
                         note="an unset cache means cache=none, except on btrfs"),
        "format": default(None, "set by the storage", "chosen when the volume is allocated"),
        "preallocation": default(None, "set by the storage", "a storage option, not a drive one"),
        **queue_defaults()}


def qm_set(settings: DiskSettings, *, vmid: str = PLACEHOLDER_VMID,
           volume: str = PLACEHOLDER_VOLUME,
           storage: str = "other") -> tuple[list[str], list[str]]:
    """The ``qm set <vmid> [--scsihw …] --<bus>0 <volume>,aio=…,iothread=…,cache=…[,queues=N]``
    argv a user pastes for ``settings``, and notes on what it leaves out.

    qemu-server gives an iothread only to virtio disks and to SCSI disks on virtio-scsi-single;
    on virtio-scsi-pci it warns and ignores it, and sata/ide drives have no such key (§1). For one
    disk, virtio-scsi with an iothread is what virtio-scsi-single is, so that is what is written.
    ``queues=`` exists for SCSI disks on virtio-scsi-single only, and from 2 up."""
    controller = str(settings.controller)
    if controller not in CONTROLLER_BUS:
        raise ValueError(f"Proxmox VE has no drive bus for {controller}")
    notes: list[str] = []
    bus, scsihw = CONTROLLER_BUS[controller]
    if controller == "virtio-scsi" and settings.iothread:
        scsihw = "virtio-scsi-single"
        notes.append("measured as virtio-scsi with an iothread: for one disk that is Proxmox's "
                     "virtio-scsi-single (qemu-server ignores iothread on virtio-scsi-pci)")
    options = [f"aio={settings.aio or 'threads'}"]
    if storage in NO_AIO_STORAGES:
        # Blockdev.pm generate_file_blockdev: an rbd node gets no aio; writing one does nothing
        options = []
        notes.append(f"no aio= written: on {NO_AIO_STORAGES[storage]} qemu-server passes none")
    if bus == "virtio" or scsihw == "virtio-scsi-single":
        options.append(f"iothread={1 if settings.iothread else 0}")
    options.append(f"cache={settings.cache or 'writeback'}")
    if settings.num_queues:
        if scsihw == "virtio-scsi-single" and settings.num_queues >= 2:
            options.append(f"queues={settings.num_queues}")
        else:
            notes.append(f"num_queues={settings.num_queues} left out: qemu-server passes queues= "
                         "only for SCSI disks on virtio-scsi-single, from 2 up")
    if settings.queue_size:
        notes.append(f"queue_size={settings.queue_size} left out: qemu-server has no "
                     "virtqueue-size option")
    if (settings.format or "raw") != "raw" or (settings.preallocation or "off") != "off":
        notes.append(f"the volume must be {settings.format or 'raw'}: format and preallocation "
                     "are chosen when the volume is allocated (by the storage), not by qm set")
    argv = ["qm", "set", vmid]
    if scsihw is not None:
        argv += ["--scsihw", scsihw]
    argv += [f"--{bus}0", ",".join([volume, *options])]
    return argv, notes


def drive_for(controller: str, *, volume: str, aio: str | None, cache: str | None,
              iothread: bool, fmt: str = "raw", num_queues: int | None = None,
              extra: tuple[tuple[str, str], ...] = ()) -> tuple[Drive, str | None]:
    """The drive line (and scsihw) a Proxmox VE user writes for an iomatrix configuration; its
    options in qemu-server's own order (alphabetical, as ``qm config`` prints them)."""
    if controller not in CONTROLLER_BUS:
        raise ValueError(f"Proxmox VE has no drive bus for {controller}")
    bus, scsihw = CONTROLLER_BUS[controller]
    options: dict[str, str] = dict(extra)
    if aio:
        options["aio"] = aio
    if cache:
        options["cache"] = cache
    if volume.startswith("/") and fmt != "raw":
        options["format"] = fmt
    if iothread:
        options["iothread"] = "1"
    if num_queues:
        options["queues"] = str(num_queues)
    return Drive(key=f"{bus}0", volume=volume, options=tuple(sorted(options.items()))), scsihw


def configuration_of(drive: Drive, scsihw: str | None, volume: Volume) -> tuple[dict[str, Any], list[str]]:
    """What qemu-server makes of a drive, as iomatrix configuration values (controller, aio,
    iothread, cache, format, num_queues), with notes on what the values cannot say."""
    notes: list[str] = []
    hw = scsihw or SCSIHW_DEFAULT
    if drive.bus == "scsi":
        controller = SCSIHW_CONTROLLER.get(hw)
        if controller is None:
            notes.append(f"{drive.key}: scsihw {hw} is not one of iomatrix's controllers")
        if scsihw is None:
            notes.append(f"{drive.key}: no scsihw: qemu-server's default, lsi")
    else:
        controller = {"virtio": "virtio-blk", "sata": "sata", "ide": "ide"}[drive.bus]
    direct = uses_cache_direct(drive.get("cache"), volume.storage)
    given = drive.get("cache")
    cache = ("none" if given == "off" else given) or ("none" if direct else "writeback")
    if not given:
        notes.append(f"{drive.key}: no cache= given: " + (
            "qemu-server adds cache=none" if direct else
            "on btrfs without nocow qemu-server adds nothing: QEMU's writeback"))
    aio: str | None = aio_option(drive.get("aio"), volume.storage, direct)
    if volume.driver == "rbd":
        aio = None
        notes.append(f"{drive.key}: librbd (rbd without krbd) has no aio: qemu-server passes none "
                     "(PVE 9) or librbd ignores it (PVE 8)")
    elif not drive.get("aio"):
        notes.append(f"{drive.key}: no aio= given: qemu-server's default on {volume.storage} "
                     f"with this cache is {aio}")
    iothread = bool(drive.flag("iothread")) and (
        drive.bus == "virtio" or (drive.bus == "scsi" and scsihw == "virtio-scsi-single"))
    queues = drive.get("queues")
    values: dict[str, Any] = {
        "controller": controller, "aio": aio, "iothread": iothread, "cache": cache,
        "format": volume.format,
        "num_queues": int(queues) if queues and drive.bus == "scsi"
        and scsihw == "virtio-scsi-single" else None}
    return values, notes


# -- a disk's settings as qemu-server gives them to a guest and a storage daemon ---------------

DAEMON_BUS = "virtio-blk"
"""The bus of the drive line a daemon's graph is built from: it names the nodes
(``drive-virtio0``), nothing more; the layers do not depend on the bus."""


def _drive(settings: DiskSettings, controller: str, volume: str,
           guest: bool) -> tuple[Drive, str | None]:
    """The drive line (and scsihw) for ``settings`` (``guest``: with its iothread and queues)."""
    return drive_for(controller, volume=volume, aio=settings.aio, cache=settings.cache,
                     iothread=guest and bool(settings.iothread), fmt=settings.format or "raw",
                     num_queues=settings.num_queues if guest else None)


def guest_disk_argv(settings: DiskSettings, image: DiskImage,
                    version: PveVersion | None = None) -> list[str]:
    """The disk's arguments qemu-server (``version``, by default 9) generates for the drive line
    a user would write for ``settings``, with the image as an absolute path. ValueError for
    what it refuses."""
    drive, scsihw = _drive(settings, disk_kind(settings), image.path, guest=True)
    volume = _volume(drive, image)
    objects = [a for obj in (image.network.objects if image.network else ()) for a in
               ("-object", obj)]
    return objects + list(disk_args(drive, volume, scsihw=scsihw,
                                    version=version or DEFAULT_PVE_VERSION, size=image.size,
                                    escape=True).argv)


def _volume(drive: Drive, image: DiskImage) -> Volume:
    """The drive's volume: the image's path, or a volume on network storage as qemu-server
    resolves one on its storage (pve-storage's qemu_blockdev_options and path)."""
    if image.network is None:
        return resolve_volume(drive, is_device=image.is_device)
    network = image.network
    return Volume(driver=network.protocol, path=network.name, format="raw",
                  storage=network.protocol, volid=f"iomatrix:{network.name}",
                  node=network.node, drive_file=network.drive_file)


def storage_graph(settings: DiskSettings, image: DiskImage,
                  version: PveVersion | None = None) -> StorageGraph:
    """qemu-server's layers (:func:`daemon_graph`): detect-zeroes, discard, and on PVE 9 the
    throttle filter over an empty throttle group, the export on the top node."""
    drive, _ = _drive(settings, DAEMON_BUS, image.path, guest=False)
    volume = _volume(drive, image)
    graph = daemon_graph(drive, volume, version=version or DEFAULT_PVE_VERSION, size=image.size)
    needed = image.network.objects if image.network is not None else ()
    return StorageGraph(objects=needed + graph.objects, blockdevs=(graph.blockdev,),
                        export_node=graph.top)


def graph_shape(settings: DiskSettings, version: PveVersion | None = None, *,
                is_device: bool = False) -> GraphShape:
    """Drive.pm detect_zeroes_cmdline_option on every node (PVE 8: the -drive's top node only;
    :func:`daemon_detect_zeroes`); PVE 9's throttle filter on top; PVE 8's device has no
    write-cache= (``auto``)."""
    pve = version or DEFAULT_PVE_VERSION
    drive, _ = _drive(settings, DAEMON_BUS, "/", guest=False)
    return GraphShape(detect_zeroes=daemon_detect_zeroes(drive, pve), throttle=pve >= 9,
                      device_write_cache=None if pve >= 9 else "auto")


def pasted(settings: DiskSettings, *, vmid: str = PLACEHOLDER_VMID,
           volume: str = PLACEHOLDER_VOLUME, storage: str = "other", **_: str | None) -> Pasted:
    """The ``qm set`` line of :func:`qm_set`."""
    argv, notes = qm_set(settings, vmid=vmid, volume=volume, storage=storage)
    return Pasted(text=" ".join(argv), notes=tuple(notes), argv=tuple(argv))
