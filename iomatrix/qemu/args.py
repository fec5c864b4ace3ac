"""Configuration → QEMU arguments for a guest and for the qemu-storage-daemon that serves a
vhost-user-blk disk, in one place for every driver (local QEMU now; libvirt and Proxmox map the
same settings). Building is pure; :func:`read_guest_settings` and :func:`read_daemon_settings`
ask a running QEMU over QMP what it applied, to diff with the ``expected_*`` settings.

The disk under test is two ``-blockdev`` nodes with explicit names (see
:func:`iomatrix.qemu.blockdev.blockdev_nodes`) and ``-device`` lines with explicit ids, named
as Proxmox VE names them. iothread and queue options go to the virtio device:

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
                        daemon holds the image and the iothread

virtio-scsi shares one controller among all disks and virtio-scsi-single gives each disk its
own; a guest here has one disk under test, so the two differ only in their ids.

``-blockdev`` has no writeback flag, and a device's ``write-cache=auto`` then means on: the
device gets ``write-cache=off`` for writethrough and directsync, ``on`` otherwise (what PVE 9
and libvirt emit). A vhost-user-blk export gets ``writethrough=on`` instead. Option values
that hold a path have their commas doubled; ``-blockdev`` is JSON, ``-kernel``, ``-initrd``
and ``-append`` are taken verbatim.

That is the ``qemu`` platform. With ``platform = "proxmox"`` (PVE 8 or 9) or ``"libvirt"`` the
disk's arguments are the ones that platform generates for the same settings
(:mod:`iomatrix.platform`): PVE's detect-zeroes, discard, throttle filter and node names,
libvirt's ``libvirt-1-storage`` (and ``-format``) nodes, by libvirt version. Reading back,
nodes are named by their role (``file0`` protocol, ``disk0`` format, ``throttle0`` filter)
whatever the platform called them, and ``backend.node`` is the role of the node the disk
device sits on.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal, NamedTuple

from pydantic import Field

from iomatrix.core.errors import InvalidCombination
from iomatrix.platform import libvirt as lv
from iomatrix.platform import proxmox as pve
from iomatrix.qemu.blockdev import (FILE_NODE, FORMAT_NODE, LIBVIRT_ISCSI, THROTTLE_NODE,
                                   blockdev_nodes, cache_flags, daemon_graph,
                                   expected_node_flags, libvirt_format_node, nodes_by_role,
                                   pve_volume)
from iomatrix.qemu.escape import qemu_bool, qemu_escape
from iomatrix.qemu.qmp import flatten_block_nodes, qmp_execute
from iomatrix.suite.expand import invalid_reason
from iomatrix.suite.model import Configuration, Platform, PveVersion
from iomatrix.target.workspace import Image
from iomatrix.target import iscsi
from iomatrix.core.model import Frozen, on_off

MACHINE = "pc"
"""i440fx, Proxmox VE's default machine; its PIIX IDE controller is always present."""
TCG_CPU = "max"
NVME_SERIAL = "IOMATRIX0"
VHOST_CHARDEV = "vub0"
VHOST_DEVICE = "vhostuserblk0"
VHOST_EXPORT = "export0"
MEMORY_BACKEND = "mem"

# QEMU 7.2's defaults, for what QMP must show when a configuration leaves them unset.
DEFAULT_QUEUE_SIZE = {"virtio-blk-pci": 256, "virtio-scsi-pci": 256, "vhost-user-blk-pci": 128}
NVME_DEFAULT_IOQPAIRS = 64


class _Layout(NamedTuple):
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


_LAYOUTS = {
    "virtio-blk": _Layout("virtio-blk-pci", "virtio0"),
    "virtio-scsi": _Layout("scsi-hd", "scsi0", "virtio-scsi-pci", "scsihw0"),
    "virtio-scsi-single": _Layout("scsi-hd", "scsi0", "virtio-scsi-pci", "virtioscsi0"),
    "pvscsi": _Layout("scsi-hd", "scsi0", "pvscsi", "scsihw0"),
    "lsi": _Layout("scsi-hd", "scsi0", "lsi53c895a", "scsihw0"),
    "megasas": _Layout("scsi-hd", "scsi0", "megasas", "scsihw0"),
    "sata": _Layout("ide-hd", "sata0", "ich9-ahci", "ahci0"),
    "ide": _Layout("ide-hd", "ide0"),
    "nvme": _Layout("nvme", "nvme0"),
    "vhost-user-blk": _Layout("vhost-user-blk-pci", VHOST_DEVICE),
}
_QUEUE_PROPERTIES = {  # hub type → (queue count, queue size) properties
    "virtio-blk-pci": ("num-queues", "queue-size"),
    "vhost-user-blk-pci": ("num-queues", "queue-size"),
    "virtio-scsi-pci": ("num_queues", "virtqueue_size"),
    "nvme": ("max_ioqpairs", ""),
}
_IOTHREAD_HOLDERS = ("virtio-blk-pci", "virtio-scsi-pci")
_DISK_TYPES = {layout.disk for layout in _LAYOUTS.values()}
_CONTROLLER_TYPES = {layout.controller for layout in _LAYOUTS.values()} - {""}


class GuestSpec(Frozen):
    """Everything one guest's command line depends on."""

    config: Configuration
    image: Image
    kernel: Path
    initrd: Path
    append: str
    """The kernel command line."""
    accel: Literal["kvm", "tcg"]
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
        argv += ["--object", f"iothread,id={_iothread_id(VHOST_EXPORT)}"]
        export += f",iothread={_iothread_id(VHOST_EXPORT)}"
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
    if platform == "qemu":
        nodes = _nodes(config, image)
    else:
        graph = daemon_graph(config, image.path, is_device=image.is_device,
                             size=image.size if image.is_device else None, platform=platform,
                             pve_version=pve_version, libvirt=libvirt, lun=image.iscsi)
        for obj in graph.objects:
            argv += ["--object", obj]
        nodes = list(graph.blockdevs)
    for node in nodes:
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
                            is_device: bool = False,
                            protocol: str | None = None) -> dict[str, str]:
    """What :func:`read_guest_settings` must report for a guest started from
    :func:`guest_argv` with ``vcpus`` vCPUs (QEMU's default queue count is the vCPU count) on
    ``platform`` (libvirt: at ``libvirt``; ``is_device``: the image is a block device;
    ``protocol``: the protocol node's driver, where it is checked)."""
    kind = _kind(config)
    flags = cache_flags(config)
    out: dict[str, str] = {}
    if kind != "vhost-user-blk":
        format_node = platform != "libvirt" or libvirt_format_node(config, libvirt, is_device)
        out.update(expected_node_flags(config, format_node=format_node, protocol=protocol))
        out["backend.write-cache"] = on_off(flags.writeback)
        out["backend.node"] = FORMAT_NODE if format_node else FILE_NODE
        out["device.write-cache"] = on_off(flags.writeback)
        if platform == "proxmox":
            # Drive.pm detect_zeroes_cmdline_option: "on" without discard= (PVE 8 sets it on the
            # -drive's top node only); PVE 8's device has no write-cache= ("auto").
            pve9 = (pve_version or pve.DEFAULT_PVE_VERSION) >= 9
            nodes = (FILE_NODE, FORMAT_NODE, THROTTLE_NODE) if pve9 else (FORMAT_NODE,)
            out |= {f"{node}.detect-zeroes": "on" for node in nodes}
            if not pve9:
                out["device.write-cache"] = "auto"
            else:   # the throttle filter: QEMU's default cache flags (none given)
                out["backend.node"] = THROTTLE_NODE
                out |= {f"{THROTTLE_NODE}.driver": "throttle",
                        f"{THROTTLE_NODE}.cache.direct": "false",
                        f"{THROTTLE_NODE}.cache.no-flush": "false"}
    else:
        out["memory.share"] = "true"
    layout = _LAYOUTS[kind]
    hub_type, hub_id = layout.hub
    out["device.type"] = layout.disk
    out["controller.type"] = layout.controller
    in_guest = bool(config.iothread) and hub_type in _IOTHREAD_HOLDERS
    out["device.iothread"] = _iothread_id(hub_id) if in_guest else ""
    if in_guest and platform == "libvirt":
        out["device.iothread"] = "iothread1"      # libvirt numbers <iothreads> from 1
    out["iothreads"] = "1" if in_guest else "0"
    count, size = _QUEUE_PROPERTIES.get(hub_type, ("", ""))
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
    roles = nodes_by_role(nodes)
    role = {old.get("node-name"): new.get("node-name") for old, new in zip(nodes, roles)}
    nodes = roles
    types = {item["name"]: item["type"][len("child<"):-1] for item in peripheral
             if item["type"].startswith("child<")}
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
    for key, prop in zip(("device.num-queues", "device.queue-size"),
                         _QUEUE_PROPERTIES.get(types.get(hub, ""), ("", ""))):
        if prop:
            gets.append((key, hub, prop))
    values = qmp_execute(qmp_socket, [
        ("qom-get", {"path": obj if obj.startswith("/") else f"/machine/peripheral/{obj}",
                     "property": prop}) for _, obj, prop in gets], timeout=timeout)
    out.update((key, _qom_text(value)) for (key, _, _), value in zip(gets, values))
    return out


BLOCKSTATS = ("rd_operations", "wr_operations", "rd_bytes", "wr_bytes", "flush_operations")


def read_blockstats(qmp_socket: Path, *, timeout: float = 10.0) -> dict[str, int]:
    """QEMU's own counters for the disk under test (``query-blockstats`` of its device),
    or an empty dict when the guest's disk is served elsewhere (vhost-user-blk)."""
    # device (BlockBackend) statistics: the I/O the guest device issued to its top node
    stats, = qmp_execute(qmp_socket, [("query-blockstats", None)], timeout=timeout)
    return blockstats_of(stats)


def disk_backend(entries: Any) -> dict[str, Any] | None:
    """The disk under test's entry in a ``query-block`` or ``query-blockstats`` answer: the one
    on iomatrix's own format node, else (other platforms name their nodes themselves, and
    libvirt's raw disks may have no format node) the one disk device's."""
    if not isinstance(entries, list):
        return None
    found = [e for e in entries if isinstance(e, dict) and (e.get("inserted") or "stats" in e)]

    def node(entry: dict[str, Any]) -> object:   # query-block keeps it inside "inserted"
        return (entry.get("inserted") or entry).get("node-name")
    return (next((e for e in found if node(e) == FORMAT_NODE), None)
            or next((e for e in found if e.get("qdev")), None))


def blockstats_of(stats: Any) -> dict[str, int]:
    """:data:`BLOCKSTATS` of the disk under test in a ``query-blockstats`` answer ({}: none,
    e.g. vhost-user-blk, whose disk the daemon serves)."""
    entry = disk_backend(stats)
    return {k: int(entry["stats"][k]) for k in BLOCKSTATS} if entry else {}


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
    guest mode."""
    reason = invalid_reason(config.model_copy(update={"mode": "guest"}),
                            device_target=image.is_device, platform=platform)
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
    kind = _kind(config)
    machine = f"type={MACHINE}"
    argv = [qemu, "-name", f"guest={qemu_escape(spec.name)},debug-threads=on"]
    if kind == "vhost-user-blk":
        # vhost-user needs guest RAM the daemon can map.
        argv += ["-object", f"memory-backend-memfd,id={MEMORY_BACKEND},"
                            f"size={_size(spec.memory_bytes)},share=on"]
        machine += f",memory-backend={MEMORY_BACKEND}"
    argv += ["-machine", machine, "-accel", spec.accel,
             "-cpu", "host" if spec.accel == "kvm" else TCG_CPU,
             "-smp", str(spec.vcpus), "-m", _size(spec.memory_bytes),
             "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
             "-kernel", str(spec.kernel), "-initrd", str(spec.initrd), "-append", spec.append,
             "-chardev", f"file,id=ser0,path={qemu_escape(str(spec.serial_log))}",
             "-serial", "chardev:ser0",
             "-chardev", f"socket,id=qmp0,path={qemu_escape(str(spec.qmp_socket))},"
                         "server=on,wait=off",
             "-mon", "chardev=qmp0,mode=control",
             "-netdev", f"user,id=net0,hostfwd=tcp:127.0.0.1:{spec.host_port}-:{spec.guest_port}",
             "-device", "virtio-net-pci,netdev=net0,id=nic0,romfile="]
    return argv + _disk_args(spec, kind)


def _disk_args(spec: GuestSpec, kind: str) -> list[str]:
    config = spec.config
    if kind not in _LAYOUTS:
        raise InvalidCombination(f"{config.key}: unknown controller {kind!r}")
    if spec.platform != "qemu" and kind != "vhost-user-blk":
        return platform_disk_argv(config, spec.image, platform=spec.platform,
                                  pve_version=spec.pve_version, libvirt=spec.libvirt)
    layout = _LAYOUTS[kind]
    hub_type, hub_id = layout.hub
    # Options go to the device where QEMU looks for them (for a refused configuration, the
    # device QEMU then names in its error).
    hub: dict[str, str] = {}
    if config.iothread and kind != "vhost-user-blk":
        hub["iothread"] = _iothread_id(hub_id)
    count, size = _QUEUE_PROPERTIES.get(hub_type, ("num-queues", "queue-size"))
    if kind == "vhost-user-blk":
        hub[count] = str(vhost_num_queues(config, spec.vcpus))
    elif config.num_queues:
        hub[count] = str(config.num_queues)
    if config.queue_size:
        hub[size or "queue-size"] = str(config.queue_size)

    if kind == "vhost-user-blk":
        if spec.vhost_socket is None:
            raise InvalidCombination(f"{config.key}: vhost-user-blk needs the daemon's socket")
        return ["-chardev", f"socket,id={VHOST_CHARDEV},path={qemu_escape(str(spec.vhost_socket))}",
                "-device", _device(layout.disk, layout.disk_id, {"chardev": VHOST_CHARDEV} | hub)]

    argv: list[str] = []
    if config.iothread:
        argv += ["-object", f"iothread,id={_iothread_id(hub_id)}"]
    for node in _nodes(config, spec.image):
        argv += ["-blockdev", node]
    disk = {"drive": FORMAT_NODE, "write-cache": on_off(cache_flags(config).writeback)}
    if layout.disk == "scsi-hd":
        controller = layout.controller
        disk = {"bus": f"{layout.controller_id}.0", "channel": "0", "scsi-id": "0", "lun": "0"} | disk
        return argv + ["-device", _device(controller, layout.controller_id, hub),
                       "-device", _device(layout.disk, layout.disk_id, disk)]
    if kind == "sata":
        argv += ["-device", f"ahci,id={layout.controller_id}"]
        disk = {"bus": f"{layout.controller_id}.0"} | disk
    elif kind == "ide":
        disk = {"bus": "ide.0", "unit": "0"} | disk   # the PIIX controller of machine pc
    elif kind == "nvme":
        disk = {"serial": NVME_SERIAL} | disk
    return argv + ["-device", _device(layout.disk, layout.disk_id, disk | hub)]


def platform_disk_argv(config: Configuration, image: Image, *, platform: Platform,
                       pve_version: PveVersion | None = None,
                       libvirt: lv.Versions | None = None) -> list[str]:
    """The disk's arguments as ``platform`` generates them for the configuration's settings
    (Proxmox VE: the drive line a user would write, with the image as an absolute path)."""
    kind = _kind(config)
    size = image.size if image.is_device else None
    try:
        if platform == "proxmox":
            drive, scsihw = pve.drive_for(kind, volume=(iscsi.pve_volume(image.iscsi) if image.iscsi
                                                        else str(image.path)),
                                          aio=config.aio, cache=config.cache,
                                          iothread=bool(config.iothread),
                                          fmt=config.format or "raw", num_queues=config.num_queues)
            volume = pve_volume(config, drive, is_device=image.is_device, lun=image.iscsi)
            return list(pve.disk_args(drive, volume, scsihw=scsihw,
                                      version=pve_version or pve.DEFAULT_PVE_VERSION,
                                      size=size, escape=True).argv)
        if image.iscsi is not None:
            raise ValueError(LIBVIRT_ISCSI)
        disk, threads = lv.disk_for(kind, source=str(image.path), block=image.is_device,
                                    aio=config.aio, cache=config.cache,
                                    iothread=bool(config.iothread), fmt=config.format or "raw",
                                    num_queues=config.num_queues, queue_size=config.queue_size)
        return list(lv.disk_args(disk, libvirt or lv.Versions(), iothreads=threads,
                                 size=size).argv)
    except ValueError as exc:
        raise InvalidCombination(f"{config.key}: {exc}") from None


def _nodes(config: Configuration, image: Image) -> list[str]:
    """The protocol and format nodes as JSON ``-blockdev`` values (JSON needs no comma escaping)."""
    size = image.size if image.is_device else None
    return [json.dumps(node, separators=(",", ":"))
            for node in blockdev_nodes(config, image.path, is_device=image.is_device, size=size,
                                       lun=image.iscsi)]


def _device(driver: str, ident: str, props: dict[str, str]) -> str:
    return ",".join([driver, f"id={ident}", *(f"{k}={v}" for k, v in props.items())])


def _size(value: int) -> str:
    """Bytes as QEMU reads a size: whole MiB as ``<n>M``, else ``<n>B`` (a bare -m number is MiB)."""
    return f"{value >> 20}M" if value % (1 << 20) == 0 else f"{value}B"


def _kind(config: Configuration) -> str:
    return "vhost-user-blk" if config.data_path == "vhost-user-blk" else str(config.controller)


def _iothread_id(holder: str) -> str:
    return f"iothread-{holder}"


# -- reading ----------------------------------------------------------------------------------

def _node_settings(flat: dict[str, str]) -> dict[str, str]:
    """The node keys :func:`iomatrix.qemu.blockdev.expected_node_flags` gives: every node's
    cache.direct and cache.no-flush, the format node's driver, and the protocol node's where
    it is a network driver (``expected_guest_settings``' ``protocol``)."""
    return {key: value for key, value in flat.items()
            if key.endswith((".cache.direct", ".cache.no-flush"))
            or key in (f"{FORMAT_NODE}.driver", f"{THROTTLE_NODE}.driver")
            or (key == f"{FILE_NODE}.driver" and value == "iscsi")}


def _qom_text(value: Any) -> str:
    """A qom-get value as text: links as the object's id, booleans as true/false."""
    if isinstance(value, bool):
        return qemu_bool(value)
    text = str(value)
    return text.rsplit("/", 1)[-1] if text.startswith("/") else text


