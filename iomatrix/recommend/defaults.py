"""What each platform does with a disk when nobody sets anything, and what it accepts (pure).

Everything here is transcribed from ``docs/qemu-disk-options.md`` (the project's notes on
Proxmox qemu-server, libvirt and QEMU 7.2); each table names the section it comes from. A value
that the reference does not document is not invented: the platform then has no default for that
parameter (``PlatformDefault.level`` None) and the recommendation compares against a measured
reference level instead.
"""

from __future__ import annotations

from typing import Literal


from iomatrix.suite.model import DIRECT_CACHES, Matrix
from iomatrix.core.model import Frozen, on_off
from iomatrix.platform import libvirt as lv
from iomatrix.platform import proxmox as pve
from iomatrix.platform.proxmox import NO_AIO_STORAGES

Platform = Literal["proxmox", "libvirt", "qemu"]
PLATFORMS: tuple[Platform, ...] = ("proxmox", "libvirt", "qemu")
TITLES: dict[Platform, str] = {"proxmox": "Proxmox VE", "libvirt": "libvirt", "qemu": "QEMU 7.2"}

PARAMETERS = ("controller", "aio", "iothread", "cache", "format", "preallocation", "num_queues",
              "queue_size")
"""The disk settings a recommendation decides, in the order it shows them."""

NOT_SETTINGS = {
    "vms": "the number of guests measured at once, not a disk setting",
    "data_path": "vhost-user-blk needs a qemu-storage-daemon beside the guest; iomatrix does not "
                 "render that setup for a platform",
    "target": "the storage measured, not a disk setting: each recommended level rests on pairs "
              "measured on the same target, pooled over the targets (gains held per target "
              "are in `iomatrix analyze` and the report)",
}
"""Run axes that a recommendation reports but does not turn into a setting, and why."""

BLOCKLAYER_PARAMETERS = ("aio", "cache", "format", "preallocation")
"""What a blocklayer run (qemu-storage-daemon, no guest) measures faithfully. Its iothread axis is
the FUSE export's thread against an NBD export, not a guest device's iothread."""

WHAT = {
    "controller": "the disk controller (bus) the guest sees",
    "aio": "how QEMU submits I/O to the host: Linux AIO (native), io_uring, or a thread pool",
    "iothread": "a dedicated event-loop thread for the disk, off QEMU's main loop",
    "cache": "host page cache use and whether the guest sees a volatile write cache",
    "format": "image format: raw, or qcow2 (thin, snapshots, a metadata layer)",
    "preallocation": "how much of the image is allocated when it is created",
    "num_queues": "virtqueues of the device (NVMe: I/O queue pairs)",
    "queue_size": "entries per virtqueue",
}

NAMES: dict[Platform, dict[str, str]] = {
    "proxmox": {"controller": "SCSI controller / bus (scsihw, virtioN|scsiN|sataN|ideN)",
                "aio": "Async IO (aio=)", "iothread": "IO thread (iothread=)",
                "cache": "Cache (cache=)", "format": "volume format",
                "preallocation": "preallocation (storage option)",
                "num_queues": "queues= (scsi)", "queue_size": "virtqueue size"},
    "libvirt": {"controller": "<target bus=> / <controller model=>",
                "aio": "<driver io=>", "iothread": "<iothreads> + iothread=",
                "cache": "<driver cache=>", "format": "<driver type=>",
                "preallocation": "preallocation (image creation)",
                "num_queues": "queues=", "queue_size": "queue_size="},
    "qemu": {"controller": "-device", "aio": "\"aio\" (file node)",
             "iothread": "-object iothread + iothread=",
             "cache": "\"cache\" {direct, no-flush} + write-cache=", "format": "format node driver",
             "preallocation": "qemu-img create -o preallocation=",
             "num_queues": "num-queues / num_queues", "queue_size": "queue-size / virtqueue_size"},
}

# -- Proxmox VE (reference §1) ----------------------------------------------------------------
PROXMOX_STORAGES = ("other", "dir", "lvm", "lvmthin", "zfspool", "rbd", "krbd", "cifs", "nfs",
                    "btrfs", "btrfs-nocow")
"""Storage types ``--storage-type`` accepts; "other" means any storage without an exception.
"rbd" is librbd (rbd without krbd); "btrfs-nocow" a btrfs storage with ``nocow 1``."""

NON_IO_URING_STORAGES = {"lvm": "thick LVM (qemu-server 7.0-11)",
                         "krbd": "rbd with krbd and a non-direct cache (qemu-server 7.0-6)",
                         "cifs": "CIFS (qemu-server 7.2-5, #4099)"}
"""Storages on which qemu-server's default aio is not io_uring (§1 "Default aio", point 2)."""

PROXMOX_SCSIHW = ("lsi", "megasas", "pvscsi", "virtio-scsi-pci", "virtio-scsi-single")
PROXMOX_IOTHREAD_CONTROLLERS = ("virtio-blk", "virtio-scsi-single")
"""Where qemu-server creates an iothread. QemuServer.pm config_to_command: ``push @$cmd,
'-object', "iothread,id=iothread-$ds" if $drive->{iothread}`` for virtio drives, and for scsi
``if ($conf->{scsihw} && $conf->{scsihw} eq "virtio-scsi-single" && $drive->{iothread})``, else
``log_warn("iothread is only valid with virtio disk or virtio-scsi-single controller,
ignoring")``: on virtio-scsi-pci iothread=1 is ignored."""
"""``scsihw`` values the reference names (§1 "iothread"); the schema default is lsi."""
PROXMOX_AIO = ("native", "io_uring", "threads")
PROXMOX_CACHE = ("none", "writethrough", "writeback", "directsync", "unsafe")
"""Values of a drive's ``cache=`` (§1 "Direct cache" table)."""

# -- libvirt (reference §2) -------------------------------------------------------------------
LIBVIRT_IO = ("native", "threads", "io_uring")
LIBVIRT_CACHE = ("none", "writethrough", "writeback", "directsync", "unsafe")

UNEXPRESSIBLE: dict[Platform, dict[tuple[str, str], str]] = {
    "proxmox": pve.REFUSED,
    "libvirt": lv.UNEXPRESSIBLE,
    "qemu": {},
}
"""(axis, level) a platform cannot be told to use."""


class PlatformDefault(Frozen):
    """A platform's default for one parameter: the level it amounts to (as a run spells it), or
    None when the platform has none (the user's XML or command line must name it), and the words
    to show."""

    level: str | None
    shown: str
    note: str = ""


def _d(level: str | None, shown: str | None = None, note: str = "") -> PlatformDefault:
    return PlatformDefault(level=level, shown=shown or (level or "none"), note=note)


def proxmox_aio_default(storage: str, cache: str | None) -> str | None:
    """qemu-server's aio when a drive gives none (§1 "Default aio"): io_uring, except on thick
    LVM, krbd and CIFS, where it is native if the cache is direct and threads otherwise; None on
    librbd, whose disks get no aio (``NO_AIO_STORAGES``)."""
    if storage in NO_AIO_STORAGES:
        return None
    direct = cache in DIRECT_CACHES
    if storage == "krbd":   # the exception covers a non-direct cache only
        return "io_uring" if direct else "threads"
    if storage in NON_IO_URING_STORAGES:
        return "native" if direct else "threads"
    return "io_uring"


def proxmox_cache_default(storage: str) -> str:
    """The cache a drive without ``cache=`` gets (§1 table, row "unset"): ``cache=none``, except
    on btrfs without nocow, where qemu-server passes nothing and QEMU's writeback applies.
    qemu-server Drive.pm drive_uses_cache_direct: ``elsif (!drive_is_cdrom($drive) && !($scfg &&
    $scfg->{type} eq 'btrfs' && !$scfg->{nocow})) { $cache_direct = 1; }``: btrfs with nocow
    ("btrfs-nocow") is direct, cache=none, like any other storage."""
    return "writeback" if storage == "btrfs" else "none"


def defaults(platform: Platform, *, storage: str = "other",
             settings: dict[str, str] | None = None) -> dict[str, PlatformDefault]:
    """Every parameter's default on ``platform``. Defaults that depend on other settings
    (Proxmox's aio on the cache, iothread on the controller) follow ``settings``."""
    settings = settings or {}
    queues = _d(None, "QEMU's (one per vCPU)", "not set: QEMU 7.2 gives one queue per vCPU")
    size = _d(None, "QEMU's (256)", "not set: QEMU 7.2's virtqueue size is 256")
    if platform == "proxmox":
        cache = proxmox_cache_default(storage)
        aio = proxmox_aio_default(storage, settings.get("cache", cache))
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
        # on virtio-scsi-pci qemu-server ignores it (PROXMOX_IOTHREAD_CONTROLLERS).
        iothread = on_off(controller in PROXMOX_IOTHREAD_CONTROLLERS)
        iothread_shown = "on" if iothread == "on" else (
            "off (ignored by qemu-server on virtio-scsi-pci)" if controller == "virtio-scsi"
            else "off (not on this bus)")
        return {
            "controller": _d("virtio-scsi-single", note="GUI default for new Linux VMs since "
                             "PVE 7.3; the schema default scsihw is lsi"),
            "aio": _d(aio, "none (librbd: no aio)" if aio is None else None, note=aio_note),
            "iothread": _d(iothread, iothread_shown,
                           note="ticked by the GUI for new Linux VMs since PVE 7.3 (schema "
                                "default off); virtio disks and virtio-scsi-single only"),
            "cache": _d(cache, "none (cache unset)" if cache == "none" else "unset → QEMU's writeback",
                        note="an unset cache means cache=none, except on btrfs"),
            "format": _d(None, "set by the storage", "chosen when the volume is allocated"),
            "preallocation": _d(None, "set by the storage", "a storage option, not a drive one"),
            "num_queues": queues, "queue_size": size}
    no_bus = "no default: the " + ("XML" if platform == "libvirt" else "command line") + " names it"
    return {
        "controller": _d(None, no_bus),
        "aio": _d("threads", note="io/aio not given: QEMU's default thread pool"),
        "iothread": _d("off", note="no iothread unless one is configured"),
        "cache": _d("writeback", note="cache not given: QEMU's default, writeback (§3)"),
        "format": _d(None, "none (" + ("type=" if platform == "libvirt" else "the driver")
                     + " names it)"),
        "preallocation": _d(None, "none (chosen at image creation)"),
        "num_queues": queues, "queue_size": size}


FALLBACK = {axis: _fallback for axis, _fallback in (
    ("controller", Matrix.model_fields["controller"].default[0]),
    ("aio", Matrix.model_fields["aio"].default[0]),
    ("cache", Matrix.model_fields["cache"].default[0]),
    ("format", Matrix.model_fields["format"].default[0]),
    ("preallocation", Matrix.model_fields["preallocation"].default[0]),
)}
"""What is rendered for a parameter the platform has no default for and the run did not measure:
iomatrix's own matrix defaults (Proxmox VE's choices for a new Linux VM)."""
