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
addr=…``), ``bootindex``, the rest of the VM.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Literal

from iomatrix.core.model import Frozen

PveVersion = Literal[8, 9]
PVE_VERSIONS: tuple[PveVersion, ...] = (8, 9)
DEFAULT_PVE_VERSION: PveVersion = 9
BUSES = ("virtio", "scsi", "sata", "ide")
SCSIHW = ("lsi", "lsi53c810", "virtio-scsi-pci", "virtio-scsi-single", "megasas", "pvscsi")
SCSIHW_DEFAULT = "lsi"
"""QemuServer.pm ``$confdesc->{scsihw}``: ``default => 'lsi'`` (the GUI offers virtio-scsi-single
for new Linux VMs, but a configuration without ``scsihw:`` gets lsi)."""
DRIVE_KEY = re.compile(r"^(virtio|scsi|sata|ide)(\d+)$")
OMITTED = ("PCI addresses (bus=pci.N,addr=…) and bootindex are left out: they place the device "
           "in the VM, they do not change its I/O")

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

FILE_STORAGES = ("dir", "nfs", "cifs", "btrfs", "glusterfs", "cephfs")
BLOCK_STORAGES = ("lvm", "lvmthin", "zfspool")
STORAGE_TYPES = (*FILE_STORAGES, *BLOCK_STORAGES, "rbd")


class Storage(Frozen):
    """One storage of ``/etc/pve/storage.cfg``, as far as a drive's arguments depend on it."""

    id: str
    type: str
    path: str | None = None
    vgname: str | None = None
    pool: str | None = None
    krbd: bool = False
    nocow: bool = False

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
        if key in ("path", "vgname", "pool"):
            current[key] = value
        elif key in ("krbd", "nocow"):
            current[key] = value not in ("0", "")
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
    def unknown(self) -> tuple[str, ...]:
        known = {*IO_OPTIONS, *UNMODELLED_OPTIONS, *NON_QEMU_OPTIONS}
        return tuple(k for k, _ in self.options if k not in known)

    @property
    def unmodelled(self) -> tuple[str, ...]:
        return tuple(k for k, _ in self.options if k in UNMODELLED_OPTIONS)


def parse_drive(key: str, text: str) -> Drive:
    """A drive line's value (Drive.pm parse_drive: the volume first, or ``file=``)."""
    if not DRIVE_KEY.match(key):
        raise ValueError(f"{key!r} is not a drive key (virtioN, scsiN, sataN, ideN)")
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


def parse_config(text: str) -> VmConfig:
    """A VM configuration as ``/etc/pve/qemu-server/ID.conf`` holds it or ``qm config ID``
    prints it: ``key: value`` lines, ``#`` comments (the description); snapshot sections
    (``[name]``) and what follows them are not the current configuration."""
    scsihw = machine = None
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
        if key == "scsihw":
            scsihw = value
        elif key == "machine":
            machine = value
        elif DRIVE_KEY.match(key):
            drives.append(parse_drive(key, value))
        else:
            ignored.append(key)
    return VmConfig(scsihw=scsihw, machine=machine, drives=tuple(drives), ignored=tuple(ignored))


def version_of_machine(machine: str | None, default: PveVersion = DEFAULT_PVE_VERSION) -> PveVersion:
    """PVE generation from ``machine:`` (QemuServer.pm: ``min_version($machine_version, 10, 0)``
    selects -blockdev): a pinned version below 10.0 gets PVE 8's -drive."""
    found = re.search(r"(\d+)\.(\d+)", machine or "")
    if found is None:
        return default
    return 9 if int(found.group(1)) >= 10 else 8


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

    driver: Literal["file", "host_device", "rbd"]
    path: str
    """filename; for rbd ``pool/image``."""
    format: str
    storage: str
    """Storage.kind, or "path" for a drive given as an absolute path."""
    volid: str
    """What qemu-server hashes into node names (the volume as written)."""


def resolve_volume(drive: Drive, storages: dict[str, Storage] | None = None, *,
                   is_device: bool | None = None) -> Volume:
    """The drive's volume → path, driver and format (PVE::Storage::path / qemu_blockdev_options
    for the storage types below). ValueError for a storage it does not know."""
    volid = drive.volume
    fmt_option = drive.get("format")
    if volid.startswith("/"):
        device = volid.startswith("/dev/") if is_device is None else is_device
        return Volume(driver="host_device" if device else "file", path=volid,
                      format=fmt_option or "raw", storage="path", volid=volid)
    store, sep, volname = volid.partition(":")
    if not sep:
        raise ValueError(f"{drive.key}: {volid!r} is neither STORAGE:VOLUME nor an absolute path")
    storage = {**DEFAULT_STORAGES, **(storages or {})}.get(store)
    if storage is None:
        raise ValueError(f"{drive.key}: storage {store!r} is not in storage.cfg (give --storage-cfg "
                         f"or --storage {store}=TYPE)")
    ext = volname.rsplit(".", 1)[-1] if "." in volname.rsplit("/", 1)[-1] else "raw"
    fmt = ext if ext in ("raw", "qcow2", "vmdk") else "raw"
    if storage.type in FILE_STORAGES:
        base = storage.path or f"/mnt/pve/{store}"
        path = f"{base}/images/{volname}"
        if storage.type == "btrfs":    # BTRFSPlugin: a subvolume per raw disk, disk.raw inside
            path = f"{base}/images/{volname.rsplit('.', 1)[0]}/disk.raw"
        return Volume(driver="file", path=path, format=fmt, storage=storage.kind, volid=volid)
    if storage.type in ("lvm", "lvmthin"):
        return Volume(driver="host_device", path=f"/dev/{storage.vgname or store}/{volname}",
                      format="raw", storage=storage.kind, volid=volid)
    if storage.type == "zfspool":
        return Volume(driver="host_device", path=f"/dev/zvol/{storage.pool or store}/{volname}",
                      format="raw", storage=storage.kind, volid=volid)
    if storage.type == "rbd":
        pool = storage.pool or "rbd"
        if storage.krbd:
            return Volume(driver="host_device", path=f"/dev/rbd-pve/<fsid>/{pool}/{volname}",
                          format="raw", storage="krbd", volid=volid)
        return Volume(driver="rbd", path=f"{pool}/{volname}", format="raw", storage="rbd",
                      volid=volid)
    raise ValueError(f"{drive.key}: storage type {storage.type!r} ({store}) is not modelled "
                     f"(known: {', '.join(STORAGE_TYPES)})")


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


class DiskArgs(Frozen):
    """One disk's QEMU arguments as qemu-server generates them, and what was not reproduced."""

    argv: tuple[str, ...]
    notes: tuple[str, ...] = ()
    iothread: str | None = None
    """The iothread object's id, when the disk (or its controller) gets one."""


def disk_args(drive: Drive, volume: Volume, *, scsihw: str | None, version: PveVersion,
              size: int | None = None, escape: bool = False) -> DiskArgs:
    """The ``-object``/``-device``/``-drive``/``-blockdev`` arguments qemu-server's
    config_to_command emits for ``drive`` (one disk, in its order: objects, controller, drive,
    device). ``size`` limits a raw format node (Blockdev.pm generate_format_blockdev's
    ``size`` option); ``escape`` doubles commas in a path (qemu-server's paths have none)."""
    if drive.is_cdrom:
        raise ValueError(f"{drive.key}: a CD-ROM is not a disk under test")
    notes: list[str] = []
    drive_id = drive.key
    direct = uses_cache_direct(drive.get("cache"), volume.storage)
    hw = scsihw or SCSIHW_DEFAULT
    objects: list[str] = []
    devices: list[str] = []
    iothread = None
    # config_to_command: an iothread for virtio drives; for scsi only on virtio-scsi-single.
    if drive.flag("iothread"):
        if drive.bus == "virtio":
            iothread = f"iothread-{drive_id}"
        elif drive.bus == "scsi" and scsihw == "virtio-scsi-single":
            iothread = f"iothread-virtioscsi{drive.index}"
        else:
            notes.append(f"{drive_id}: iothread=1 is ignored by qemu-server here (only virtio "
                         "disks and scsihw virtio-scsi-single get an iothread)")
    if iothread:
        objects += ["-object", f"iothread,id={iothread}"]
    if version >= 9:
        objects += ["-object", _json(_throttle_group(drive_id))]
    controller = controller_of(drive, scsihw)
    queues = drive.get("queues")
    if controller is not None:
        ctype, cid, _ = controller
        props = f"{ctype},id={cid}"
        if ctype == "ahci":
            props += ",multifunction=on"
        elif iothread and drive.bus == "scsi":
            props += f",iothread={iothread}"
        if drive.bus == "scsi" and scsihw == "virtio-scsi-single" and queues:
            props += f",num_queues={queues}"
        devices += ["-device", props]
    if queues and not (drive.bus == "scsi" and scsihw == "virtio-scsi-single"):
        notes.append(f"{drive_id}: queues={queues} is ignored by qemu-server here (only scsi "
                     "drives on virtio-scsi-single)")
    if drive.flag("ssd") and drive.bus == "virtio":
        notes.append(f"{drive_id}: ssd=1 has no effect on a virtio drive (no rotation_rate)")
    aio = aio_option(drive.get("aio"), volume.storage, direct)
    if version >= 9:
        devices += ["-blockdev", _json(_blockdev(drive, volume, direct, aio, size))]
        if volume.driver == "rbd":
            notes.append(f"{drive_id}: librbd gets no aio (Blockdev.pm generate_file_blockdev "
                         "sets aio only on file, host_device and host_cdrom nodes); its monitor "
                         "hosts and auth are left out")
    else:
        devices += ["-drive", _drive_line(drive, volume, direct, aio, size, escape)]
        if volume.driver == "rbd":
            notes.append(f"{drive_id}: librbd ignores -drive's aio=; its monitor hosts and auth "
                         "are left out of rbd:")
    devices += ["-device", _device(drive, hw, version, controller)]
    for name in drive.unmodelled:
        notes.append(f"{drive_id}: {name}={drive.get(name)} is not reproduced by iomatrix")
    for name in drive.unknown:
        notes.append(f"{drive_id}: {name}={drive.get(name)} is not a qemu-server drive option "
                     "iomatrix knows")
    return DiskArgs(argv=tuple(objects + devices), notes=tuple(notes), iothread=iothread)


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
        group = _throttle_group(drive.key)
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


def _throttle_group(drive_id: str) -> dict[str, Any]:
    """Blockdev.pm generate_throttle_group for a drive without limits."""
    return {"id": f"throttle-drive-{drive_id}", "limits": {}, "qom-type": "throttle-group"}


def _blockdev(drive: Drive, volume: Volume, direct: bool, aio: str,
              size: int | None) -> dict[str, Any]:
    """Blockdev.pm generate_drive_blockdev: throttle → format → file, nested; add_common_options
    puts discard (unmap with discard=on, else ignore), detect-zeroes and read-only on each."""
    common = {"discard": "unmap" if drive.get("discard") == "on" else "ignore",
              "detect-zeroes": detect_zeroes_option(drive), "read-only": False}
    cache = {"direct": direct, "no-flush": drive.get("cache") == "unsafe"}
    if volume.driver == "rbd":
        pool, image = volume.path.split("/", 1)
        file_node: dict[str, Any] = {"driver": "rbd", "pool": pool, "image": image}
    else:
        file_node = {"driver": volume.driver, "filename": volume.path, "aio": aio}
    file_node |= {"cache": cache, "node-name": node_name("file", drive.key, volume.volid)} | common
    fmt: dict[str, Any] = {"node-name": node_name("fmt", drive.key, volume.volid),
                           "driver": volume.format, "file": file_node, "cache": cache} | common
    if size is not None and volume.format == "raw":
        fmt["size"] = size
    return {"driver": "throttle", "node-name": f"drive-{drive.key}",
            "throttle-group": f"throttle-drive-{drive.key}", "file": fmt} | common


def _drive_line(drive: Drive, volume: Volume, direct: bool, aio: str, size: int | None,
                escape: bool) -> str:
    """qemu-server 8.3 print_drive_commandline_full: ``file=,if=none,id=``, then the drive's own
    options in the order heads secs cyls trans media cache rerror werror aio discard, then
    ``format=``, ``cache=none`` when no cache is given but it is direct, the default ``aio=``
    when none is given, and ``detect-zeroes=``."""
    if volume.driver == "rbd":
        path = f"rbd:{volume.path}"
    else:
        path = volume.path.replace(",", ",,") if escape else volume.path
    line = f"file={path},if=none,id=drive-{drive.key}"
    for name in ("heads", "secs", "cyls", "trans", "media", "cache", "rerror", "werror", "aio",
                 "discard"):
        if drive.get(name) is not None:
            line += f",{name}={drive.get(name)}"
    line += f",format={volume.format}"
    if size is not None and volume.format == "raw":
        line += f",size={size}"
    if not drive.get("cache") and direct:
        line += ",cache=none"
    if not drive.get("aio"):
        line += f",aio={aio}"
    return line + f",detect-zeroes={detect_zeroes_option(drive)}"


def _device(drive: Drive, scsihw: str, version: PveVersion,
            controller: tuple[str, str, str] | None) -> str:
    """DriveDevice.pm print_drivedevice_full for a disk (not a CD-ROM), without PCI address and
    bootindex."""
    drive_id = drive.key
    ssd = bool(drive.flag("ssd"))
    if drive.bus == "virtio":
        device = f"virtio-blk-pci,drive=drive-{drive_id},id={drive_id}"
        if drive.flag("iothread"):
            device += f",iothread=iothread-{drive_id}"
    elif drive.bus == "scsi":
        assert controller is not None
        bus = controller[2]
        if scsihw.startswith("lsi") or scsihw == "pvscsi":
            per = 7 if scsihw.startswith("lsi") else 256
            device = f"scsi-hd,bus={bus},scsi-id={drive.index % per}"
        else:
            device = f"scsi-hd,bus={bus},channel=0,scsi-id=0,lun={drive.index}"
        device += f",drive=drive-{drive_id},id={drive_id}"
        if version >= 9:
            device += f",device_id=drive-{drive_id}"
        if ssd:
            device += ",rotation_rate=1"
    else:
        if drive.bus == "ide":
            device = f"ide-hd,bus=ide.{drive.index // 2},unit={drive.index % 2}"
        else:
            assert controller is not None
            device = f"ide-hd,bus={controller[2]}"
        device += f",drive=drive-{drive_id},id={drive_id}"
        if ssd:
            device += ",rotation_rate=1"
    if version >= 9:
        cache = drive.get("cache")
        device += ",write-cache=" + ("off" if cache in ("writethrough", "directsync") else "on")
    return device


# -- iomatrix configurations ------------------------------------------------------------------

CONTROLLER_BUS: dict[str, tuple[str, str | None]] = {
    "virtio-blk": ("virtio", None), "virtio-scsi": ("scsi", "virtio-scsi-pci"),
    "virtio-scsi-single": ("scsi", "virtio-scsi-single"), "pvscsi": ("scsi", "pvscsi"),
    "lsi": ("scsi", "lsi"), "megasas": ("scsi", "megasas"), "sata": ("sata", None),
    "ide": ("ide", None)}
"""iomatrix controller → (drive bus, scsihw)."""
SCSIHW_CONTROLLER = {"virtio-scsi-pci": "virtio-scsi", "virtio-scsi-single": "virtio-scsi-single",
                     "pvscsi": "pvscsi", "lsi": "lsi", "megasas": "megasas"}


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
