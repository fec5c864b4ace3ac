"""An iomatrix disk as a Proxmox VE drive line and back (pure): the drive a user writes for a
disk's settings, the arguments and block graph qemu-server gives it in a guest and in a
qemu-storage-daemon, and what a drive of a VM configuration amounts to as iomatrix values."""

from __future__ import annotations

from iomatrix.platform.proxmox.blockdev import daemon_detect_zeroes, daemon_graph
from iomatrix.platform.proxmox.config import DEFAULT_PVE_VERSION, SCSIHW_DEFAULT, Drive, PveVersion
from iomatrix.platform.proxmox.defaults import CONTROLLER_BUS, DISCARD_OPTION, SCSIHW_CONTROLLER
from iomatrix.platform.proxmox.drive import disk_args
from iomatrix.platform.proxmox.rules import aio_option, uses_cache_direct
from iomatrix.platform.proxmox.storage import Volume, resolve_volume
from iomatrix.platform.settings import DiskImage, DiskSettings, GraphShape, StorageGraph, disk_kind
from iomatrix.platform.values import DiskValues


def drive_for(controller: str, *, volume: str, aio: str | None, cache: str | None,
              iothread: bool, fmt: str = "raw", num_queues: int | None = None,
              discard: str | None = None,
              extra: tuple[tuple[str, str], ...] = ()) -> tuple[Drive, str | None]:
    """The drive line (and scsihw) a Proxmox VE user writes for an iomatrix configuration; its
    options in qemu-server's own order (alphabetical, as ``qm config`` prints them). discard
    unmap is Proxmox VE's ``discard=on`` (Drive.pm: ``ignore|on``)."""
    if controller not in CONTROLLER_BUS:
        raise ValueError(f"Proxmox VE has no drive bus for {controller}")
    bus, scsihw = CONTROLLER_BUS[controller]
    options: dict[str, str] = dict(extra)
    if aio:
        options["aio"] = aio
    if cache:
        options["cache"] = cache
    if discard:
        options["discard"] = DISCARD_OPTION[discard]
    if volume.startswith("/") and fmt != "raw":
        options["format"] = fmt
    if iothread:
        options["iothread"] = "1"
    if num_queues:
        options["queues"] = str(num_queues)
    return Drive(key=f"{bus}0", volume=volume, options=tuple(sorted(options.items()))), scsihw


def configuration_of(drive: Drive, scsihw: str | None, volume: Volume) -> DiskValues:
    """What qemu-server makes of a drive, as iomatrix configuration values (controller, aio,
    iothread, cache, format, discard, num_queues), with notes on what the values cannot say.
    ValueError for a discard= qemu-server does not take (Drive.pm: ``ignore|on``)."""
    discard = _discard_of(drive)
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
    return DiskValues(controller=controller, aio=aio, iothread=iothread, cache=cache,
                      format=volume.format, discard=discard,
                      num_queues=int(queues) if queues and drive.bus == "scsi"
                      and scsihw == "virtio-scsi-single" else None, notes=tuple(notes))


def _discard_of(drive: Drive) -> str | None:
    """The drive's discard as the axis's level: ``on`` is unmap, ``ignore`` ignore; None when
    the drive sets none (qemu-server then passes no discard: QEMU's ignore)."""
    given = drive.get("discard")
    if given is None:
        return None
    level = next((axis for axis, option in DISCARD_OPTION.items() if option == given), None)
    if level is None:
        raise ValueError(f"{drive.key}: discard={given}: Proxmox VE takes discard=on or "
                         "discard=ignore")
    return level


# -- a disk's settings as qemu-server gives them to a guest and a storage daemon ---------------

DAEMON_BUS = "virtio-blk"
"""The bus of the drive line a daemon's graph is built from: it names the nodes
(``drive-virtio0``), nothing more; the layers do not depend on the bus."""


def _drive(settings: DiskSettings, controller: str, volume: str,
           guest: bool) -> tuple[Drive, str | None]:
    """The drive line (and scsihw) for ``settings`` (``guest``: with its iothread and queues)."""
    return drive_for(controller, volume=volume, aio=settings.aio, cache=settings.cache,
                     iothread=guest and bool(settings.iothread), fmt=settings.format or "raw",
                     num_queues=settings.num_queues if guest else None,
                     discard=settings.discard)


def guest_disk_argv(settings: DiskSettings, image: DiskImage,
                    version: PveVersion | None = None) -> list[str]:
    """The disk's arguments qemu-server (``version``, by default 9) generates for the drive line
    a user would write for ``settings``, with the image as an absolute path. ValueError for
    what it refuses."""
    drive, scsihw = _drive(settings, disk_kind(settings), image.path, guest=True)
    volume = _volume(drive, image, version)
    objects = [a for obj in (image.network.objects if image.network else ()) for a in
               ("-object", obj)]
    return objects + list(disk_args(drive, volume, scsihw=scsihw,
                                    version=version or DEFAULT_PVE_VERSION, size=image.size,
                                    escape=True).argv)


def _volume(drive: Drive, image: DiskImage, version: PveVersion | None) -> Volume:
    """The drive's volume: the image's path, or a volume on network storage as qemu-server
    resolves one on its storage (pve-storage's qemu_blockdev_options and path). A qcow2 with a
    backing chain is a volume of an LVM storage with ``snapshot-as-volume-chain``: its chain
    nested under it, ``discard-no-unref`` on its format nodes (PVE 9 only: ValueError on 8)."""
    if image.backing:
        if (version or DEFAULT_PVE_VERSION) < 9:
            raise ValueError("qcow2 volume chains (snapshot-as-volume-chain) are Proxmox VE 9's")
        return resolve_volume(drive, is_device=image.is_device).model_copy(update={
            "volume_chain": True, "backing": True, "chain": image.backing})
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
    volume = _volume(drive, image, version)
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
