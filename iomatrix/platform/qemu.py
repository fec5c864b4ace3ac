"""Plain QEMU 7.2 (reference §3, §4): what a disk gets when the command line sets nothing, the
names its settings have there, and iomatrix's own graph and devices for a disk (the ``qemu``
platform: what iomatrix's guests get, and what recommend prints for QEMU).

The disk is two ``-blockdev`` nodes with explicit names (:func:`blockdev_nodes`) and
``-device`` lines with explicit ids, named as Proxmox VE names them; iothread and queue options
go to the virtio device:

    controller          disk device (id)            controller (id)                 options on
    virtio-blk          virtio-blk-pci (virtio0)    -                               the disk
    virtio-scsi         scsi-hd (scsi0)             virtio-scsi-pci (scsihw0)       controller
    virtio-scsi-single  scsi-hd (scsi0)             virtio-scsi-pci (virtioscsi0)   controller
    pvscsi              scsi-hd (scsi0)             pvscsi (scsihw0)                -
    lsi                 scsi-hd (scsi0)             lsi53c895a (scsihw0)            -
    megasas             scsi-hd (scsi0)             megasas (scsihw0)               -
    sata                ide-hd (sata0)              ahci (ahci0)                    -
    ide                 ide-hd (ide0)               the PIIX controller of pc       -
    nvme                nvme (nvme0; serial= set)   -                               max_ioqpairs
    vhost-user-blk      vhost-user-blk-pci (vhostuserblk0), chardev vub0            queues; the
                        daemon holds the image and the iothread (iomatrix.qemu.args)

virtio-scsi shares one controller among all disks and virtio-scsi-single gives each disk its
own; a guest here has one disk under test, so the two differ only in their ids.

Cache modes follow QEMU's table (qemu-system(1), checked on 7.2):

    cache=        writeback  direct  no-flush
    writeback     on         off     off
    none          on         on      off
    writethrough  off        off     off
    directsync    off        on      off
    unsafe        on         off     on

``-blockdev`` has no writeback flag, and a device's ``write-cache=auto`` then means on: the
device gets ``write-cache=off`` for writethrough and directsync, ``on`` otherwise (what PVE 9
and libvirt emit).
"""

from __future__ import annotations

import json
import shlex
from typing import Any, NamedTuple

from iomatrix.core.model import Frozen, on_off
from iomatrix.core.wire import QmpObject
from iomatrix.vocab.axes import VQ_ROUND_ROBIN, vq_groups
from iomatrix.platform.settings import (DiskImage, DiskSettings, GraphShape, Pasted,
                                        PlatformDefault, StorageGraph, backing_node, default,
                                        disk_kind, image_notes)

TITLE = "QEMU 7.2"
PLACEHOLDER_IMAGE = "disk"
"""The image path recommend shows without ``--image`` (plus ``.raw``/``.qcow2``)."""
NAMES = {"controller": "-device", "aio": "\"aio\" (file node)",
         "iothread": "-object iothread + iothread=",
         "cache": "\"cache\" {direct, no-flush} + write-cache=", "format": "format node driver",
         "preallocation": "qemu-img create -o preallocation=",
         "num_queues": "num-queues / num_queues", "queue_size": "queue-size / virtqueue_size",
         "discard": "\"discard\" (both nodes)",
         "iothreads": "-object iothread ×N + iothread-vq-mapping (QEMU >= 9.0)",
         "vq_mapping": "iothread-vq-mapping's vqs"}
"""Each parameter as QEMU names it."""
UNEXPRESSIBLE: dict[tuple[str, str], str] = {}
"""(axis, level) QEMU cannot be told to use: none."""

FILE_NODE = "file0"
FORMAT_NODE = "disk0"
NVME_SERIAL = "IOMATRIX0"
VHOST_DEVICE = "vhostuserblk0"


class CacheFlags(Frozen):
    writeback: bool
    direct: bool
    no_flush: bool


CACHE_MODES: dict[str, CacheFlags] = {
    "writeback": CacheFlags(writeback=True, direct=False, no_flush=False),
    "none": CacheFlags(writeback=True, direct=True, no_flush=False),
    "writethrough": CacheFlags(writeback=False, direct=False, no_flush=False),
    "directsync": CacheFlags(writeback=False, direct=True, no_flush=False),
    "unsafe": CacheFlags(writeback=True, direct=False, no_flush=True),
}


def cache_flags(settings: DiskSettings) -> CacheFlags:
    return CACHE_MODES[settings.cache or "writeback"]


class Layout(NamedTuple):
    """The devices of one controller kind: QOM types and ids ("" for no separate controller)."""

    disk: str
    disk_id: str
    controller: str = ""
    controller_id: str = ""

    @property
    def hub(self) -> tuple[str, str]:
        """(type, id) of the device that takes iothread and queue options: a SCSI disk's
        controller, otherwise the disk device itself."""
        if self.disk == "scsi-hd":
            return self.controller, self.controller_id
        return self.disk, self.disk_id


LAYOUTS = {
    "virtio-blk": Layout("virtio-blk-pci", "virtio0"),
    "virtio-scsi": Layout("scsi-hd", "scsi0", "virtio-scsi-pci", "scsihw0"),
    "virtio-scsi-single": Layout("scsi-hd", "scsi0", "virtio-scsi-pci", "virtioscsi0"),
    "pvscsi": Layout("scsi-hd", "scsi0", "pvscsi", "scsihw0"),
    "lsi": Layout("scsi-hd", "scsi0", "lsi53c895a", "scsihw0"),
    "megasas": Layout("scsi-hd", "scsi0", "megasas", "scsihw0"),
    "sata": Layout("ide-hd", "sata0", "ich9-ahci", "ahci0"),
    "ide": Layout("ide-hd", "ide0"),
    "nvme": Layout("nvme", "nvme0"),
    "vhost-user-blk": Layout("vhost-user-blk-pci", VHOST_DEVICE),
}
QUEUE_PROPERTIES = {  # hub type → (queue count, queue size) properties
    "virtio-blk-pci": ("num-queues", "queue-size"),
    "vhost-user-blk-pci": ("num-queues", "queue-size"),
    "virtio-scsi-pci": ("num_queues", "virtqueue_size"),
    "nvme": ("max_ioqpairs", ""),
}


def iothread_id(holder: str) -> str:
    return f"iothread-{holder}"


def iothread_ids(settings: DiskSettings, holder: str) -> list[str]:
    """The IOThread objects a disk's device gets: none, one (``iothread-HOLDER``), or with
    ``iothreads`` that many (``iothread-HOLDER-0``, ``-1``, ...)."""
    if not settings.iothread:
        return []
    if (settings.iothreads or 1) == 1:
        return [iothread_id(holder)]
    return [f"{iothread_id(holder)}-{i}" for i in range(settings.iothreads)]


def vq_mapping(settings: DiskSettings, ids: list[str]) -> list[QmpObject] | None:
    """QEMU's ``iothread-vq-mapping`` (QAPI ``IOThreadVirtQueueMapping`` objects) for a disk
    served by several IOThreads (``ids``): the threads alone (QEMU deals the queues round-robin), or each with its queues (``vqs``);
    None for one IOThread or none."""
    if len(ids) < 2:
        return None
    groups = vq_groups(settings.vq_mapping)
    if groups is None:
        return [{"iothread": ident} for ident in ids]
    return [{"iothread": ident, "vqs": list(queues)} for ident, queues in zip(ids, groups)]


def mapping_text(mapping: Any) -> str:
    """An ``iothread-vq-mapping`` (as given, or as QOM reads it back) in the words iomatrix
    compares, whatever the threads are named: ``round-robin×N`` or the queues per thread
    (``0,1:2,3``, the ``vq_mapping`` axis's form); "" for none."""
    if not isinstance(mapping, list) or not mapping:
        return ""
    if not any(entry.get("vqs") for entry in mapping):
        return f"{VQ_ROUND_ROBIN}×{len(mapping)}"
    return ":".join(",".join(map(str, entry.get("vqs") or ())) for entry in mapping)


def device(driver: str, ident: str, props: dict[str, str]) -> str:
    return ",".join([driver, f"id={ident}", *(f"{k}={v}" for k, v in props.items())])


def json_device(driver: str, ident: str, props: dict[str, str],
                mapping: list[dict[str, Any]] | None = None) -> str:
    """A ``-device`` in JSON, the only syntax that can give ``iothread-vq-mapping`` (a list);
    JSON is typed, so numbers go as numbers."""
    typed: dict[str, Any] = {k: int(v) if v.isdigit() else v for k, v in props.items()}
    if mapping is not None:
        typed["iothread-vq-mapping"] = mapping
    return json.dumps({"driver": driver, "id": ident, **typed}, separators=(",", ":"))


def refusal(settings: DiskSettings) -> str | None:
    """QEMU's own refusals are suite.expand.invalid_reason's; plain QEMU adds none."""
    return None


def queue_defaults() -> dict[str, PlatformDefault]:
    """QEMU's num_queues and queue_size when nothing sets them (every platform here leaves them
    to QEMU)."""
    return {"num_queues": default(None, "QEMU's (one per vCPU)",
                                  "not set: QEMU 7.2 gives one queue per vCPU"),
            "queue_size": default(None, "QEMU's (256)",
                                  "not set: QEMU 7.2's virtqueue size is 256")}


def defaults(*, storage: str = "other", settings: dict[str, str] | None = None,
             where: str = "command line", fmt: str = "the driver") -> dict[str, PlatformDefault]:
    """Every parameter's default when ``where`` (the command line; libvirt: the XML) sets
    nothing; ``fmt`` names what gives the format."""
    return {
        "controller": default(None, f"no default: the {where} names it"),
        "aio": default("threads", note="io/aio not given: QEMU's default thread pool"),
        "iothread": default("off", note="no iothread unless one is configured"),
        "cache": default("writeback", note="cache not given: QEMU's default, writeback (§3)"),
        "format": default(None, f"none ({fmt} names it)"),
        "preallocation": default(None, "none (chosen at image creation)"),
        "discard": default("ignore", note="discard not given: QEMU's default, ignore (the "
                                          "guest's discard requests are dropped)"),
        "iothreads": default(None, "one (with iothread)",
                             "not set: one IOThread serves the disk with iothread on, none without"),
        "vq_mapping": default("round-robin", note="iothread-vq-mapping without vqs: QEMU deals "
                                                  "the queues to the IOThreads in turn"),
        **queue_defaults()}


# -- the block graph and the disk's arguments -------------------------------------------------

def blockdev_nodes(settings: DiskSettings, image: DiskImage) -> list[dict[str, Any]]:
    """The protocol node (file or host_device, carrying aio and cache; for a volume on network
    storage its driver, rbd, with no aio) and the format node above it, with explicit node
    names. Both carry the cache flags: QEMU reports them per node, and an explicitly defined
    child does not inherit them; likewise a discard mode, when the configuration names one (each
    node drops or passes down discard requests by its own). A qcow2 image's backing chain comes
    first (:func:`_backing_nodes`), the format node's ``backing`` naming its top."""
    flags = cache_flags(settings)
    cache = {"direct": flags.direct, "no-flush": flags.no_flush}
    file_node: dict[str, Any] = {
        "driver": "host_device" if image.is_device else "file",
        "filename": image.path,
        "node-name": FILE_NODE,
        "aio": settings.aio or "threads",
        "cache": cache,
    }
    if image.network is not None:
        file_node = {"driver": image.network.protocol, **image.network.node,
                     "node-name": FILE_NODE, "cache": cache}
    format_node: dict[str, Any] = {
        "driver": settings.format or "raw",
        "file": FILE_NODE,
        "node-name": FORMAT_NODE,
        "cache": cache,
    }
    if image.size is not None and (settings.format or "raw") == "raw":
        format_node["size"] = image.size
        if image.offset:
            format_node["offset"] = image.offset
    if settings.discard is not None:
        file_node["discard"] = format_node["discard"] = settings.discard
    chain = _backing_nodes(file_node, format_node, image)
    if chain:
        format_node["backing"] = backing_node(1)[0]
    return [*chain, file_node, format_node]


def _backing_nodes(file_node: dict[str, Any], format_node: dict[str, Any],
                   image: DiskImage) -> list[dict[str, Any]]:
    """The image's backing chain (``DiskImage.backing``), deepest first so each is defined
    before the node above names it: per image a protocol node like the top's (aio, cache,
    discard) and a qcow2 node over it, both read-only, as QEMU opens a backing file itself;
    the deepest has ``backing: null`` (whatever its header says is never opened)."""
    nodes: list[dict[str, Any]] = []
    for depth in range(len(image.backing), 0, -1):
        fmt_name, file_name = backing_node(depth)
        below = backing_node(depth + 1)[0] if depth < len(image.backing) else None
        nodes += [file_node | {"filename": image.backing[depth - 1], "node-name": file_name,
                               "read-only": True},
                  {k: v for k, v in format_node.items() if k != "size"} | {
                      "driver": "qcow2", "file": file_name, "node-name": fmt_name,
                      "read-only": True, "backing": below}]
    return nodes


def _blockdevs(settings: DiskSettings, image: DiskImage) -> list[str]:
    """:func:`blockdev_nodes` as JSON ``-blockdev`` values (JSON needs no comma escaping)."""
    return [json.dumps(node, separators=(",", ":")) for node in blockdev_nodes(settings, image)]


def hub_options(settings: DiskSettings, layout: Layout) -> dict[str, str]:
    """The iothread and queue options of the device QEMU looks for them on (for a refused
    configuration, the device QEMU then names in its error); vhost-user-blk's queue count is
    its caller's."""
    hub_type, hub_id = layout.hub
    hub: dict[str, str] = {}
    if settings.iothread and hub_type != "vhost-user-blk-pci" and (settings.iothreads or 1) == 1:
        hub["iothread"] = iothread_id(hub_id)   # several: iothread-vq-mapping (_hub_device)
    count, size = QUEUE_PROPERTIES.get(hub_type, ("num-queues", "queue-size"))
    if settings.num_queues:
        hub[count] = str(settings.num_queues)
    if settings.queue_size:
        hub[size or "queue-size"] = str(settings.queue_size)
    return hub


def guest_disk_argv(settings: DiskSettings, image: DiskImage, version: object = None) -> list[str]:
    """The disk's ``-object iothread``, ``-blockdev`` and ``-device`` arguments in iomatrix's
    own guest (no checks: a configuration QEMU refuses gets the arguments QEMU then refuses).
    ValueError for a kind of disk with no devices here (vhost-user-blk: the daemon's)."""
    kind = disk_kind(settings)
    if kind not in LAYOUTS:
        raise ValueError(f"unknown controller {kind!r}")
    if kind == "vhost-user-blk":
        raise ValueError("vhost-user-blk is served by a qemu-storage-daemon: its -device needs "
                         "the daemon's socket")
    layout = LAYOUTS[kind]
    hub = hub_options(settings, layout)
    argv = [a for obj in _objects(image) for a in ("-object", obj)]
    for ident in iothread_ids(settings, layout.hub[1]):
        argv += ["-object", f"iothread,id={ident}"]
    for node in _blockdevs(settings, image):
        argv += ["-blockdev", node]
    disk = {"drive": FORMAT_NODE, "write-cache": on_off(cache_flags(settings).writeback)}
    if layout.disk == "scsi-hd":
        disk = {"bus": f"{layout.controller_id}.0", "channel": "0", "scsi-id": "0",
                "lun": "0"} | disk
        controller = _hub_device(settings, layout.controller, layout.controller_id, hub)
        scsi = device(layout.disk, layout.disk_id, disk)
        if controller.startswith("{"):   # QEMU 7.2 makes JSON devices after the others: one
            scsi = json_device(layout.disk, layout.disk_id, disk)   # syntax keeps their order
        return argv + ["-device", controller, "-device", scsi]
    if kind == "sata":
        argv += ["-device", f"ahci,id={layout.controller_id}"]
        disk = {"bus": f"{layout.controller_id}.0"} | disk
    elif kind == "ide":
        disk = {"bus": "ide.0", "unit": "0"} | disk   # the PIIX controller of machine pc
    elif kind == "nvme":
        disk = {"serial": NVME_SERIAL} | disk
    return argv + ["-device", _hub_device(settings, layout.disk, layout.disk_id, disk | hub)]


def _hub_device(settings: DiskSettings, driver: str, ident: str, props: dict[str, str]) -> str:
    """The device holding the disk's IOThreads: with several, in JSON with its
    ``iothread-vq-mapping``; otherwise as every other ``-device`` line."""
    mapping = vq_mapping(settings, iothread_ids(settings, ident))
    if mapping is None:
        return device(driver, ident, props)
    return json_device(driver, ident, props, mapping)


def storage_graph(settings: DiskSettings, image: DiskImage, version: object = None) -> StorageGraph:
    """iomatrix's own two nodes in a qemu-storage-daemon, the export on the format node."""
    return StorageGraph(objects=_objects(image), blockdevs=tuple(_blockdevs(settings, image)),
                        export_node=FORMAT_NODE)


def _objects(image: DiskImage) -> tuple[str, ...]:
    """The objects a network volume's protocol node needs (an iSCSI CHAP secret)."""
    return image.network.objects if image.network is not None else ()


def graph_shape(settings: DiskSettings, version: object = None, *,
                is_device: bool = False) -> GraphShape:
    """Both nodes, detect-zeroes off, no filter, iomatrix's own device and iothread."""
    return GraphShape(detect_zeroes={"protocol": "off", "format": "off"})


def pasted(settings: DiskSettings, *, image: str | None = None, **_: str) -> Pasted:
    """The disk's ``-object iothread``, ``-blockdev`` and ``-device`` arguments, exactly as
    iomatrix starts its own guests, to add to a ``qemu-system-x86_64`` command line (on ``image``,
    by default :data:`PLACEHOLDER_IMAGE`)."""
    path = image or f"{PLACEHOLDER_IMAGE}.{settings.format or 'raw'}"
    argv = guest_disk_argv(settings, DiskImage(path=path))
    lines = [" ".join(shlex.quote(a) for a in argv[i:i + 2]) for i in range(0, len(argv), 2)]
    notes = image_notes(settings, "qemu-img create")
    if (settings.iothreads or 1) > 1:
        notes.append("iothread-vq-mapping (several IOThreads) needs QEMU 9.0 for virtio-blk, "
                     "10.0 for virtio-scsi")
    if path.startswith("/dev/"):
        notes.append('for a block device, write "driver":"host_device" instead of "file"')
    return Pasted(text=" \\\n".join(lines), notes=tuple(notes), argv=tuple(argv))
