"""Proxmox VE's defaults as recommend compares with them (reference §1), what qemu-server
refuses, and the ``qm set`` line a user pastes for a disk's settings (pure)."""

from __future__ import annotations

from iomatrix.core.model import on_off
from iomatrix.platform.proxmox.args import (ARGS_WARNING, affinity_of, affinity_refusal,
                                            args_line, several_iothreads)
from iomatrix.platform.proxmox.args import disk_args as args_disk_argv
from iomatrix.platform.proxmox.rules import aio_option, uses_cache_direct
from iomatrix.platform.qemu import queue_defaults
from iomatrix.platform.settings import DiskSettings, Pasted, PlatformDefault, default, disk_kind


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
    if several_iothreads(settings):
        return ("several IOThreads per disk are not qemu-server's (its iothread is one per disk): "
                "only an args: line gives them, whose disk is plain QEMU's: measure it with "
                "platform = \"qemu\"")
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
    return affinity_refusal(settings)


PLACEHOLDER_VMID = "<vmid>"
PLACEHOLDER_VOLUME = "<storage>:<volume>"

# -- defaults, as recommend compares with them (reference §1) ------------------------------------
TITLE = "Proxmox VE"
GRAPH_DIFFERENCE = ("Proxmox VE gives every disk detect-zeroes=on (unmap with discard=on), "
                    "discard on every node, and in PVE 9 a throttle filter node with an empty "
                    "throttle group above it; its controllers and iothread naming are "
                    "qemu-server's")
"""How qemu-server's block graph differs from iomatrix's own (plain QEMU's)."""
DISCARD_OPTION = {"ignore": "ignore", "unmap": "on"}
"""The ``discard`` axis's levels as a Proxmox VE drive writes them (Drive.pm: ``ignore|on``);
``on`` also makes qemu-server's detect-zeroes ``unmap`` (rules.detect_zeroes_option)."""
NAMES = {"controller": "SCSI controller / bus (scsihw, virtioN|scsiN|sataN|ideN)",
         "aio": "Async IO (aio=)", "iothread": "IO thread (iothread=)",
         "cache": "Cache (cache=)", "format": "volume format",
         "preallocation": "preallocation (storage option)",
         "num_queues": "queues= (scsi)", "queue_size": "virtqueue size",
         "discard": "Discard (discard=on)"}
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
        "discard": default("ignore", "ignore (Discard unticked)",
                           note="discard unset: qemu-server passes discard=ignore (PVE 9: on "
                                "every node) and detect-zeroes=on"),
        **queue_defaults()}


def qm_set(settings: DiskSettings, *, vmid: str = PLACEHOLDER_VMID,
           volume: str = PLACEHOLDER_VOLUME,
           storage: str = "other") -> tuple[list[str], list[str]]:
    """The ``qm set <vmid> [--scsihw …] --<bus>0 <volume>,aio=…,iothread=…,cache=…
    [,discard=on|ignore][,queues=N]`` argv a user pastes for ``settings``, and notes on what it
    leaves out.

    qemu-server gives an iothread only to virtio disks and to SCSI disks on virtio-scsi-single;
    on virtio-scsi-pci it warns and ignores it, and sata/ide drives have no such key (§1). For one
    disk, virtio-scsi with an iothread is what virtio-scsi-single is, so that is what is written.
    ``queues=`` exists for SCSI disks on virtio-scsi-single only, and from 2 up."""
    controller = str(settings.controller)
    if controller not in CONTROLLER_BUS:
        raise ValueError(f"Proxmox VE has no drive bus for {controller}")
    notes: list[str] = []
    affinity, why = affinity_of(settings)
    notes += [why] if why else []
    pinned = ["--affinity", affinity] if affinity else []
    if several_iothreads(settings):
        path = volume if volume.startswith("/") else f"<path of {volume}: pvesm path {volume}>"
        notes.append(f"{settings.iothreads} IOThreads on one disk: qemu-server 9.2's iothread is "
                     "one per disk, so the disk goes in args: as plain QEMU arguments "
                     "(iothread-vq-mapping), not as a drive")
        notes.append(ARGS_WARNING)
        line = args_line(args_disk_argv(settings, path))
        return ["qm", "set", vmid, *pinned, "--args", line], notes
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
    if settings.discard:
        options.append(f"discard={DISCARD_OPTION[settings.discard]}")
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
    argv = ["qm", "set", vmid, *pinned]
    if scsihw is not None:
        argv += ["--scsihw", scsihw]
    argv += [f"--{bus}0", ",".join([volume, *options])]
    return argv, notes


def pasted(settings: DiskSettings, *, vmid: str = PLACEHOLDER_VMID,
           volume: str = PLACEHOLDER_VOLUME, storage: str = "other", **_: str | None) -> Pasted:
    """The ``qm set`` line of :func:`qm_set`."""
    argv, notes = qm_set(settings, vmid=vmid, volume=volume, storage=storage)
    return Pasted(text=" ".join(argv), notes=tuple(notes), argv=tuple(argv))
