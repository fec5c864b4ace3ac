"""Configuration → QEMU arguments for a guest and for the qemu-storage-daemon that serves a
vhost-user-blk disk, in one place for every driver (local QEMU now; libvirt and Proxmox map the
same settings). Building is pure; :func:`read_guest_settings` and :func:`read_daemon_settings`
ask a running QEMU over QMP what it applied, to diff with the ``expected_*`` settings.

The disk under test's graph and devices are its platform's
(``iomatrix.platform.PLATFORMS[name].guest_disk_argv``): on platform ``qemu`` iomatrix's own
(:mod:`iomatrix.platform.qemu`: two ``-blockdev`` nodes with explicit names and ``-device``
lines with explicit ids, named as Proxmox VE names them). A vhost-user-blk disk is built here:
its device (``vhostuserblk0``, chardev ``vub0``) takes the queues, and the daemon holds the
image and the iothread; its export gets ``writethrough=on`` where the cache mode has no write
cache. Option values that hold a path have their commas doubled; ``-blockdev`` is JSON,
``-kernel``, ``-initrd`` and ``-append`` are taken verbatim.

With ``platform = "proxmox"`` (PVE 8 or 9) or ``"libvirt"`` the disk's arguments are the ones
that platform generates for the same settings: PVE's detect-zeroes, discard, throttle filter
and node names, libvirt's ``libvirt-1-storage`` (and ``-format``) nodes, by libvirt version,
and what QEMU must report of them is the platform's ``graph_shape``. Reading back,
nodes are named by their role (``file0`` protocol, ``disk0`` format, ``throttle0`` filter)
whatever the platform called them, and ``backend.node`` is the role of the node the disk
device sits on.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import Field

from iomatrix.core.errors import InvalidCombination
from iomatrix.platform import PLATFORMS, platform_version
from iomatrix.platform import libvirt as lv
from iomatrix.platform.qemu import (FILE_NODE, FORMAT_NODE, LAYOUTS, QUEUE_PROPERTIES,
                                    cache_flags, device, hub_options, iothread_id, iothread_ids,
                                    mapping_text, vq_mapping)
from iomatrix.platform.settings import DiskImage, disk_kind
from iomatrix.qemu.blockdev import (THROTTLE_NODE, daemon_graph, expected_node_flags,
                                   nodes_by_role, throttle_flags)
from iomatrix.qemu.escape import qemu_bool, qemu_escape
from iomatrix.qemu.qmp import flatten_block_nodes, qmp_execute
from iomatrix.suite.expand import invalid_reason
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.fields import PveVersion
from iomatrix.vocab.axes import Platform
from iomatrix.targets.workspace import Image
from iomatrix.core.model import Frozen, on_off
from iomatrix.core.wire import QmpObject
from iomatrix.vocab.words import Accelerator, Mode

MACHINE = "pc"
"""i440fx, Proxmox VE's default machine; its PIIX IDE controller is always present."""
TCG_CPU = "max"
VHOST_CHARDEV = "vub0"
VHOST_EXPORT = "export0"
MEMORY_BACKEND = "mem"
SYSTEM_PREFIX = "guestos"
"""Node names and device ids of a user's guest's own disks (its system disk and seed): never the
disk under test, left out of every reading of it."""

# QEMU 7.2's defaults, for what QMP must show when a configuration leaves them unset.
DEFAULT_QUEUE_SIZE = {"virtio-blk-pci": 256, "virtio-scsi-pci": 256, "vhost-user-blk-pci": 128}
NVME_DEFAULT_IOQPAIRS = 64
_IOTHREAD_HOLDERS = ("virtio-blk-pci", "virtio-scsi-pci")
_DISK_TYPES = {layout.disk for layout in LAYOUTS.values()}
_CONTROLLER_TYPES = {layout.controller for layout in LAYOUTS.values()} - {""}


class GuestSpec(Frozen):
    """Everything one guest's command line depends on."""

    config: Configuration
    image: Image
    kernel: Path | None
    """None: the guest boots from its system disk's bootloader (a user's image)."""
    initrd: Path | None
    append: str
    """The kernel command line (with ``kernel``)."""
    accel: Accelerator
    vcpus: int = Field(ge=1)
    memory_bytes: int = Field(ge=1 << 20)
    qmp_socket: Path
    serial_log: Path
    host_port: int = Field(ge=1, le=65535)
    """Host side (on 127.0.0.1) of the user-network forward to ``guest_port`` (fio --server)."""
    guest_port: int = Field(default=8765, ge=1, le=65535)
    vhost_socket: Path | None = None
    """The daemon's vhost-user-blk socket; required when the data path is vhost-user-blk."""
    name: str
    platform: Platform = "qemu"
    """Whose block graph and devices the disk gets (``[method] platform``)."""
    pve_version: PveVersion | None = None
    """With platform proxmox: qemu-server 8 (-drive) or 9 (-blockdev, throttle filter; None)."""
    libvirt: lv.Versions | None = None
    """With platform libvirt: the libvirt and QEMU whose nodes the disk gets (None:
    :class:`iomatrix.platform.libvirt.Versions`' defaults)."""
    system: tuple[str, ...] = ()
    """A user's guest: the arguments of its system disk and seed (ids and nodes named
    :data:`SYSTEM_PREFIX`...), before the disk under test; its user network is then
    ``restrict=on`` (the host's forward to fio is all it has)."""


def guest_argv(spec: GuestSpec, qemu: str = "qemu-system-x86_64") -> list[str]:
    """The QEMU command line of one guest with its disk under test; InvalidCombination, with
    QEMU's own reason, for a configuration QEMU would refuse."""
    _check(spec.config, spec.image, platform=spec.platform)
    return _guest_argv(spec, qemu)


def vhost_daemon_argv(config: Configuration, image: Image, *, socket: Path, qmp_socket: Path,
                      num_queues: int, qsd: str = "qemu-storage-daemon") -> list[str]:
    """The qemu-storage-daemon command line that serves ``image`` as a vhost-user-blk export
    with the configuration's format, aio, cache and iothread, and a QMP monitor.

    QEMU 7.2 bug: an export with an iothread hangs on SIGTERM while a client is connected
    (fixed in 8.0 by 2957dc40a2); stop the guest first, and SIGKILL the daemon after a timeout.
    ``num_queues`` must be at least the guest device's (see :func:`vhost_num_queues`)."""
    _check(config, image)
    if num_queues < 1:
        raise InvalidCombination("num-queues must be greater than 0")
    export = (f"type=vhost-user-blk,id={VHOST_EXPORT},node-name={FORMAT_NODE},"
              f"addr.type=unix,addr.path={qemu_escape(str(socket))},writable=on,"
              f"num-queues={num_queues},writethrough={export_writethrough(config)}")
    argv = storage_daemon_argv(config, image, qmp_socket=qmp_socket, qsd=qsd)
    if config.iothread:
        argv += ["--object", f"iothread,id={iothread_id(VHOST_EXPORT)}"]
        export += f",iothread={iothread_id(VHOST_EXPORT)}"
    return argv + ["--export", export]


def storage_daemon_argv(config: Configuration, image: Image, *, qmp_socket: Path,
                        qsd: str = "qemu-storage-daemon", platform: Platform = "qemu",
                        pve_version: PveVersion | None = None,
                        libvirt: lv.Versions | None = None) -> list[str]:
    """qemu-storage-daemon with a QMP monitor and the image's nodes (format, aio, cache); the
    caller adds its export, on :func:`iomatrix.qemu.blockdev.daemon_graph`'s ``export_node``
    (the format node on platforms qemu and libvirt). With ``platform = "proxmox"`` the nodes
    are the layers qemu-server gives a disk with these settings (detect-zeroes, discard, PVE 9's
    throttle filter and its group); with "libvirt", the nodes that libvirt (``libvirt``)
    gives the disk."""
    argv = [qsd,
            "--chardev", f"socket,id=qmp0,path={qemu_escape(str(qmp_socket))},server=on,wait=off",
            "--monitor", "chardev=qmp0"]
    graph = daemon_graph(config, image.path, is_device=image.is_device,
                         size=image.size if image.is_device else None, platform=platform,
                         pve_version=pve_version, libvirt=libvirt, network=image.network,
                         backing=image.backing, offset=image.offset if image.is_device else 0)
    for obj in graph.objects:
        argv += ["--object", obj]
    for node in graph.blockdevs:
        argv += ["--blockdev", node]
    return argv


def export_writethrough(config: Configuration) -> str:
    """An export's ``writethrough=``: on where the cache mode has no guest write cache."""
    return on_off(not cache_flags(config).writeback)


def vhost_num_queues(config: Configuration, vcpus: int) -> int:
    """Queues of a vhost-user-blk disk, on both sides: the configuration's, else one per vCPU
    (the device defaults to the vCPU count, the export to 1, and QEMU refuses a device that
    asks for more queues than the export offers)."""
    return config.num_queues or vcpus


def expected_guest_settings(config: Configuration, *, vcpus: int, platform: Platform = "qemu",
                            pve_version: PveVersion | None = None,
                            libvirt: lv.Versions | None = None,
                            is_device: bool = False, network: str | None = None,
                            backing: int = 0) -> dict[str, str]:
    """What :func:`read_guest_settings` must report for a guest started from
    :func:`guest_argv` with ``vcpus`` vCPUs (QEMU's default queue count is the vCPU count) on
    ``platform`` (libvirt: at ``libvirt``; ``is_device``: the image is a block device;
    ``network``: the protocol driver, rbd, that must have opened it; ``backing``: the length
    of the image's backing chain)."""
    kind = disk_kind(config)
    flags = cache_flags(config)
    shape = PLATFORMS[platform].graph_shape(config, platform_version(pve_version, libvirt),
                                            is_device=is_device)
    out: dict[str, str] = {}
    if kind != "vhost-user-blk":
        out.update(expected_node_flags(config, format_node=shape.format_node, network=network,
                                       backing=backing))
        roles = {"protocol": FILE_NODE, "format": FORMAT_NODE, "throttle": THROTTLE_NODE}
        # read_guest_settings reports a node's detect-zeroes only where it is on
        out |= {f"{roles[role]}.detect-zeroes": value
                for role, value in shape.detect_zeroes.items() if value != "off"}
        out["backend.write-cache"] = on_off(flags.writeback)
        out["backend.node"] = FORMAT_NODE if shape.format_node else FILE_NODE
        out["device.write-cache"] = shape.device_write_cache or on_off(flags.writeback)
        if shape.throttle:
            out["backend.node"] = THROTTLE_NODE
            out |= throttle_flags()
    else:
        out["memory.share"] = "true"
    layout = LAYOUTS[kind]
    hub_type, hub_id = layout.hub
    out["device.type"] = layout.disk
    out["controller.type"] = layout.controller
    in_guest = bool(config.iothread) and hub_type in _IOTHREAD_HOLDERS
    several = vq_mapping(config, iothread_ids(config, hub_id)) if in_guest else None
    out["device.iothread"] = (shape.iothread or iothread_id(hub_id)) if in_guest and not several else ""
    out["iothreads"] = str(len(several)) if several else "1" if in_guest else "0"
    if several:
        out["device.iothread-vq-mapping"] = mapping_text(several)
    count, size = QUEUE_PROPERTIES.get(hub_type, ("", ""))
    if count:
        default = NVME_DEFAULT_IOQPAIRS if hub_type == "nvme" else vcpus
        out["device.num-queues"] = str(config.num_queues or default)
    if size:
        out["device.queue-size"] = str(config.queue_size or DEFAULT_QUEUE_SIZE[hub_type])
    return out


def read_guest_settings(qmp_socket: Path, *, timeout: float = 10.0) -> dict[str, str]:
    """Ask a running guest QEMU what it applied to the disk under test, with the keys of
    :func:`expected_guest_settings`. ToolFailed when QMP does not answer."""
    nodes, blocks, iothreads, peripheral = qmp_execute(qmp_socket, [
        ("query-named-block-nodes", None), ("query-block", None), ("query-iothreads", None),
        ("qom-list", {"path": "/machine/peripheral"})], timeout=timeout)
    nodes = [n for n in nodes if not _system(n.get("node-name"))]
    roles = nodes_by_role(nodes)
    role = {old.get("node-name"): new.get("node-name") for old, new in zip(nodes, roles)}
    nodes = roles
    types = {item["name"]: item["type"][len("child<"):-1] for item in peripheral
             if item["type"].startswith("child<") and not _system(item["name"])}
    disk = next((name for name, kind in types.items() if kind in _DISK_TYPES), "")
    controller = next((name for name, kind in types.items() if kind in _CONTROLLER_TYPES), "")
    out = _node_settings(flatten_block_nodes(nodes)) | {
        "device.type": types.get(disk, ""), "controller.type": types.get(controller, ""),
        "device.iothread": "", "iothreads": str(len(iothreads))}
    out |= {f"{n['node-name']}.detect-zeroes": str(n["detect_zeroes"]) for n in nodes
            if n.get("detect_zeroes", "off") != "off" and not n["node-name"].startswith("#")}
    backend = disk_backend(blocks)
    if backend is not None:
        out["backend.write-cache"] = on_off(backend["inserted"]["cache"]["writeback"])
        name = backend["inserted"].get("node-name")
        out["backend.node"] = str(role.get(name, name))
    if not disk:
        return out
    # The virtio device (a SCSI disk's controller) holds the iothread and the queues.
    hub = controller if types[disk] == "scsi-hd" else disk
    gets = [("device.write-cache", disk, "write-cache")]   # (key, device id or path, property)
    if types[disk] == "vhost-user-blk-pci":
        gets = [("memory.share", f"/objects/{MEMORY_BACKEND}", "share")]
    if types.get(hub) in _IOTHREAD_HOLDERS:
        gets.append(("device.iothread", hub, "iothread"))
        if len(iothreads) > 1:   # the property is QEMU 9.0's (virtio-scsi: 10.0's)
            gets.append(("device.iothread-vq-mapping", hub, "iothread-vq-mapping"))
    for key, prop in zip(("device.num-queues", "device.queue-size"),
                         QUEUE_PROPERTIES.get(types.get(hub, ""), ("", ""))):
        if prop:
            gets.append((key, hub, prop))
    values = qmp_execute(qmp_socket, [
        ("qom-get", {"path": obj if obj.startswith("/") else f"/machine/peripheral/{obj}",
                     "property": prop}) for _, obj, prop in gets], timeout=timeout)
    out.update((key, mapping_text(value) if prop == "iothread-vq-mapping" else _qom_text(value))
               for (key, _, prop), value in zip(gets, values))
    return out


def read_iothread_ids(qmp_socket: Path, *, timeout: float = 10.0) -> dict[str, int]:
    """The guest's IOThreads (``query-iothreads``): id → host thread id, for what reads their
    threads in /proc (their CPU affinity, where they ran)."""
    iothreads, = qmp_execute(qmp_socket, [("query-iothreads", None)], timeout=timeout)
    return {str(t["id"]): int(t["thread-id"]) for t in iothreads}


BLOCKSTATS = ("rd_operations", "wr_operations", "rd_bytes", "wr_bytes", "flush_operations")


BLOCKSTATS_TIMEOUT = 10.0
"""How long QEMU's monitor is given to answer ``query-blockstats``."""


def read_blockstats(qmp_socket: Path, *, timeout: float = BLOCKSTATS_TIMEOUT) -> dict[str, int]:
    """QEMU's own counters for the disk under test (``query-blockstats`` of its device),
    or an empty dict when the guest's disk is served elsewhere (vhost-user-blk)."""
    # device (BlockBackend) statistics: the I/O the guest device issued to its top node
    stats, = qmp_execute(qmp_socket, [("query-blockstats", None)], timeout=timeout)
    return blockstats_of(stats)


def disk_backend(entries: Any) -> QmpObject | None:
    """The disk under test's entry in a ``query-block`` or ``query-blockstats`` answer: the one
    on iomatrix's own format node, else (other platforms name their nodes themselves, and
    libvirt's raw disks may have no format node) the one disk device's."""
    if not isinstance(entries, list):
        return None
    def node(entry: dict[str, Any]) -> object:   # query-block keeps it inside "inserted"
        return (entry.get("inserted") or entry).get("node-name")

    found = [e for e in entries if isinstance(e, dict) and (e.get("inserted") or "stats" in e)
             and not _system(node(e)) and f"/{SYSTEM_PREFIX}" not in str(e.get("qdev", ""))]
    return (next((e for e in found if node(e) == FORMAT_NODE), None)
            or next((e for e in found if e.get("qdev")), None))


def blockstats_of(stats: Any) -> dict[str, int]:
    """:data:`BLOCKSTATS` of the disk under test in a ``query-blockstats`` answer ({}: none,
    e.g. vhost-user-blk, whose disk the daemon serves)."""
    entry = disk_backend(stats)
    return {k: int(entry["stats"][k]) for k in BLOCKSTATS} if entry else {}


def completed_requests(stats: Mapping[str, int]) -> int:
    """Reads and writes a disk completed, from its :func:`blockstats_of` counters."""
    return stats["rd_operations"] + stats["wr_operations"]


def expected_daemon_settings(config: Configuration) -> dict[str, str]:
    """What :func:`read_daemon_settings` must report for a daemon from :func:`vhost_daemon_argv`."""
    return expected_node_flags(config) | {
        "export.type": "vhost-user-blk", "export.node-name": FORMAT_NODE,
        "iothreads": "1" if config.iothread else "0"}


def read_daemon_settings(qmp_socket: Path, *, timeout: float = 10.0) -> dict[str, str]:
    """Ask a running qemu-storage-daemon what it applied, with the keys of
    :func:`expected_daemon_settings`. ToolFailed when QMP does not answer."""
    # The daemon has no query-iothreads: its iothreads are counted among its objects, whose
    # container exists only once an --object was given.
    nodes, exports, root = qmp_execute(qmp_socket, [
        ("query-named-block-nodes", None), ("query-block-exports", None),
        ("qom-list", {"path": "/"})], timeout=timeout)
    objects: list[dict[str, str]] = []
    if any(child["name"] == "objects" for child in root):
        objects, = qmp_execute(qmp_socket, [("qom-list", {"path": "/objects"})], timeout=timeout)
    export = next((e for e in exports if e["id"] == VHOST_EXPORT), {})
    iothreads = [o for o in objects if o["type"] == "child<iothread>"]
    return _node_settings(flatten_block_nodes(nodes)) | {
        "export.type": str(export.get("type", "")),
        "export.node-name": str(export.get("node-name", "")),
        "iothreads": str(len(iothreads))}


# -- building ---------------------------------------------------------------------------------

def _check(config: Configuration, image: Image, *, platform: Platform = "qemu") -> None:
    """InvalidCombination for what QEMU (or iomatrix, or the platform) refuses, judged as in
    guest mode. A qcow2 on a block device (a volume a target kind made for it: Proxmox VE 9's
    volume chain on an LV) is not a block-device target's one raw image."""
    reason = invalid_reason(config.model_copy(update={"mode": Mode.GUEST}),
                            device_target=image.is_device and image.format == "raw",
                            platform=platform)
    if reason is None and config.data_path != "vhost-user-blk" and config.controller is None:
        reason = "no controller given (every emulated disk needs one)"
    if reason is None and (config.format or "raw") != image.format:
        reason = (f"the image {image.path} is {image.format}, "
                  f"the configuration asks for {config.format or 'raw'}")
    if reason is not None:
        raise InvalidCombination(f"{config.key}: {reason}")


def _guest_argv(spec: GuestSpec, qemu: str) -> list[str]:
    """:func:`guest_argv` without the check, so tests can show what QEMU says to a refused one."""
    config = spec.config
    kind = disk_kind(config)
    machine = f"type={MACHINE}"
    argv = [qemu, "-name", f"guest={qemu_escape(spec.name)},debug-threads=on"]
    if kind == "vhost-user-blk":
        # vhost-user needs guest RAM the daemon can map.
        argv += ["-object", f"memory-backend-memfd,id={MEMORY_BACKEND},"
                            f"size={_size(spec.memory_bytes)},share=on"]
        machine += f",memory-backend={MEMORY_BACKEND}"
    argv += ["-machine", machine, "-accel", spec.accel,
             "-cpu", "host" if spec.accel == Accelerator.KVM else TCG_CPU,
             "-smp", str(spec.vcpus), "-m", _size(spec.memory_bytes),
             "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot"]
    if spec.kernel is not None:
        argv += ["-kernel", str(spec.kernel)]
        if spec.initrd is not None:
            argv += ["-initrd", str(spec.initrd)]
        argv += ["-append", spec.append]
    restrict = ",restrict=on" if spec.system else ""
    argv += [
             "-chardev", f"file,id=ser0,path={qemu_escape(str(spec.serial_log))}",
             "-serial", "chardev:ser0",
             "-chardev", f"socket,id=qmp0,path={qemu_escape(str(spec.qmp_socket))},"
                         "server=on,wait=off",
             "-mon", "chardev=qmp0,mode=control",
             "-netdev", f"user,id=net0{restrict},"
                        f"hostfwd=tcp:127.0.0.1:{spec.host_port}-:{spec.guest_port}",
             "-device", "virtio-net-pci,netdev=net0,id=nic0,romfile=",
             *spec.system]
    return argv + _disk_args(spec, kind)


def _disk_args(spec: GuestSpec, kind: str) -> list[str]:
    """The disk under test's arguments: a vhost-user-blk device on the daemon's socket, else
    the ones its platform gives it."""
    config = spec.config
    if kind != "vhost-user-blk":
        return platform_disk_argv(config, spec.image, platform=spec.platform,
                                  pve_version=spec.pve_version, libvirt=spec.libvirt)
    if spec.vhost_socket is None:
        raise InvalidCombination(f"{config.key}: vhost-user-blk needs the daemon's socket")
    layout = LAYOUTS[kind]
    queues = {"chardev": VHOST_CHARDEV,
              "num-queues": str(vhost_num_queues(config, spec.vcpus))}
    return ["-chardev", f"socket,id={VHOST_CHARDEV},path={qemu_escape(str(spec.vhost_socket))}",
            "-device", device(layout.disk, layout.disk_id, queues | hub_options(config, layout))]


def platform_disk_argv(config: Configuration, image: Image, *, platform: Platform,
                       pve_version: PveVersion | None = None,
                       libvirt: lv.Versions | None = None) -> list[str]:
    """The disk's arguments as ``platform`` generates them for the configuration's settings
    (Proxmox VE: the drive line a user would write, with the image as an absolute path)."""
    disk = DiskImage(path=str(image.path), is_device=image.is_device,
                     size=image.size if image.is_device else None,
                     offset=image.offset if image.is_device else 0, network=image.network,
                     backing=tuple(str(path) for path in image.backing))
    try:
        return PLATFORMS[platform].guest_disk_argv(config, disk,
                                                   platform_version(pve_version, libvirt))
    except ValueError as exc:
        raise InvalidCombination(f"{config.key}: {exc}") from None


def _size(value: int) -> str:
    """Bytes as QEMU reads a size: whole MiB as ``<n>M``, else ``<n>B`` (a bare -m number is MiB)."""
    return f"{value >> 20}M" if value % (1 << 20) == 0 else f"{value}B"


def _system(name: object) -> bool:
    """Whether a node name or device id is a user's guest's own disk (:data:`SYSTEM_PREFIX`)."""
    return isinstance(name, str) and name.startswith(SYSTEM_PREFIX)


# -- reading ----------------------------------------------------------------------------------

def _node_settings(flat: dict[str, str]) -> dict[str, str]:
    """The node keys :func:`iomatrix.qemu.blockdev.expected_node_flags` gives: every node's
    cache.direct and cache.no-flush, the format node's driver and backing depth, a backing
    chain's format drivers, and the protocol node's where it is network storage's (rbd)."""
    return {key: value for key, value in flat.items()
            if key.endswith((".cache.direct", ".cache.no-flush"))
            or key in (f"{FORMAT_NODE}.driver", f"{THROTTLE_NODE}.driver",
                       f"{FORMAT_NODE}.backing-depth")
            or (key.startswith("backing") and key.endswith(".driver") and "-file" not in key)
            or (key == f"{FILE_NODE}.driver" and value not in ("file", "host_device"))}


def _qom_text(value: Any) -> str:
    """A qom-get value as text: links as the object's id, booleans as true/false."""
    if isinstance(value, bool):
        return qemu_bool(value)
    text = str(value)
    return text.rsplit("/", 1)[-1] if text.startswith("/") else text


