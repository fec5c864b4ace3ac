"""Configuration → QEMU arguments for a guest and for the qemu-storage-daemon that serves a
vhost-user-blk disk, in one place for every driver (local QEMU now; libvirt and Proxmox map the
same settings). Pure: nothing here starts a process, except :func:`read_guest_settings` and
:func:`read_daemon_settings`, which ask a running one over QMP what it applied.

The disk under test is two ``-blockdev`` nodes with explicit names (see
:func:`iomatrix.qemu.blockdev.blockdev_nodes`) and the controller's ``-device`` lines with
explicit ids, named as Proxmox VE names them:

    controller          devices (ids)                                  iothread on   queues
    virtio-blk          virtio-blk-pci (virtio0)                       the device    num-queues, queue-size
    virtio-scsi         virtio-scsi-pci (scsihw0) + scsi-hd (scsi0)    controller    num_queues, virtqueue_size
    virtio-scsi-single  virtio-scsi-pci (virtioscsi0) + scsi-hd        controller    num_queues, virtqueue_size
    pvscsi              pvscsi (scsihw0) + scsi-hd (scsi0)             -             -
    sata                ahci (ahci0) + ide-hd (sata0)                  -             -
    ide                 ide-hd (ide0) on the PIIX bus ide.0            -             -
    nvme                nvme (nvme0, serial= is mandatory)             -             max_ioqpairs
    vhost-user-blk      vhost-user-blk-pci (vhostuserblk0)             the daemon    num-queues, queue-size

virtio-scsi shares one controller among all disks and virtio-scsi-single gives each disk its
own; a guest here has one disk under test, so the two differ only in their ids.

``-blockdev`` has no writeback flag, and a device's ``write-cache=auto`` then means on: the
device gets ``write-cache=off`` for writethrough and directsync, ``on`` otherwise (what PVE 9
and libvirt emit). A vhost-user-blk export gets ``writethrough=on`` instead.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from iomatrix.errors import InvalidCombination
from iomatrix.qemu.blockdev import FORMAT_NODE, blockdev_nodes, cache_flags, expected_node_flags
from iomatrix.qemu.kvm import qemu_escape
from iomatrix.qemu.qmp import flatten_block_nodes, qmp_execute
from iomatrix.suite.expand import invalid_reason
from iomatrix.suite.model import Configuration
from iomatrix.target import Image

MACHINE = "pc"
"""i440fx, Proxmox VE's default machine; its PIIX IDE controller is always present."""
TCG_CPU = "max"
NVME_SERIAL = "IOMATRIX0"
VHOST_CHARDEV = "vub0"
VHOST_DEVICE = "vhostuserblk0"
VHOST_EXPORT = "export0"
MEMORY_BACKEND = "mem"

# QEMU 7.2's defaults, for what QMP must show when a configuration leaves them unset.
DEFAULT_QUEUE_SIZE = {"virtio-blk": 256, "virtio-scsi": 256, "virtio-scsi-single": 256,
                      "vhost-user-blk": 128}
NVME_DEFAULT_IOQPAIRS = 64

_SCSI_CONTROLLER_ID = {"virtio-scsi": "scsihw0", "virtio-scsi-single": "virtioscsi0",
                       "pvscsi": "scsihw0"}
_QUEUE_PROPERTY = {"virtio-blk": "num-queues", "virtio-scsi": "num_queues",
                   "virtio-scsi-single": "num_queues", "nvme": "max_ioqpairs",
                   "vhost-user-blk": "num-queues"}
_SIZE_PROPERTY = {"virtio-blk": "queue-size", "virtio-scsi": "virtqueue_size",
                  "virtio-scsi-single": "virtqueue_size", "vhost-user-blk": "queue-size"}
_DISK_TYPES = ("virtio-blk-pci", "scsi-hd", "ide-hd", "nvme", "vhost-user-blk-pci")
_CONTROLLER_TYPES = ("virtio-scsi-pci", "pvscsi", "ich9-ahci")
_IOTHREAD_HOLDERS = ("virtio-blk-pci", "virtio-scsi-pci")


class GuestSpec(BaseModel):
    """Everything one guest's command line depends on."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    config: Configuration
    image: Image
    kernel: Path
    initrd: Path
    append: str
    """The kernel command line."""
    accel: Literal["kvm", "tcg"]
    vcpus: int
    memory_bytes: int
    qmp_socket: Path
    serial_log: Path
    host_port: int
    """Host side (on 127.0.0.1) of the user-network forward to ``guest_port`` (fio --server)."""
    guest_port: int = 8765
    vhost_socket: Path | None = None
    """The daemon's vhost-user-blk socket; required when the data path is vhost-user-blk."""
    name: str


def guest_argv(spec: GuestSpec, qemu: str = "qemu-system-x86_64") -> list[str]:
    """The QEMU command line of one guest with its disk under test; InvalidCombination, with
    QEMU's own reason, for a configuration QEMU would refuse."""
    _check(spec.config, spec.image)
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
    argv = [qsd,
            "--chardev", f"socket,id=qmp0,path={qemu_escape(str(qmp_socket))},server=on,wait=off",
            "--monitor", "chardev=qmp0"]
    export = (f"type=vhost-user-blk,id={VHOST_EXPORT},node-name={FORMAT_NODE},"
              f"addr.type=unix,addr.path={qemu_escape(str(socket))},writable=on,"
              f"num-queues={num_queues},writethrough={_onoff(not cache_flags(config).writeback)}")
    if config.iothread:
        argv += ["--object", f"iothread,id={_iothread_id(VHOST_EXPORT)}"]
        export += f",iothread={_iothread_id(VHOST_EXPORT)}"
    for node in _nodes(config, image):
        argv += ["--blockdev", node]
    return argv + ["--export", export]


def vhost_num_queues(config: Configuration, vcpus: int) -> int:
    """Queues of a vhost-user-blk disk, on both sides: the configuration's, else one per vCPU
    (the device defaults to the vCPU count, the export to 1, and QEMU refuses a device that
    asks for more queues than the export offers)."""
    return config.num_queues or vcpus


def expected_guest_settings(config: Configuration, *, vcpus: int) -> dict[str, str]:
    """What :func:`read_guest_settings` must report for a guest started from
    :func:`guest_argv` with ``vcpus`` vCPUs (QEMU's default queue count is the vCPU count)."""
    kind = _kind(config)
    flags = cache_flags(config)
    out: dict[str, str] = {}
    if kind != "vhost-user-blk":
        out.update(expected_node_flags(config))
        out["backend.write-cache"] = _onoff(flags.writeback)
        out["device.write-cache"] = _onoff(flags.writeback)
    else:
        out["memory.share"] = "true"
    device, controller = _device_types(kind)
    out["device.type"] = device
    out["controller.type"] = controller
    holds_iothread = kind in ("virtio-blk", "virtio-scsi", "virtio-scsi-single")
    out["device.iothread"] = _iothread_id(_iothread_holder(kind)) if config.iothread and holds_iothread else ""
    out["iothreads"] = "1" if config.iothread and holds_iothread else "0"
    if kind in _QUEUE_PROPERTY:
        default = NVME_DEFAULT_IOQPAIRS if kind == "nvme" else vcpus
        out["device.num-queues"] = str(config.num_queues or default)
    if kind in _SIZE_PROPERTY:
        out["device.queue-size"] = str(config.queue_size or DEFAULT_QUEUE_SIZE[kind])
    return out


def read_guest_settings(qmp_socket: Path, *, timeout: float = 10.0) -> dict[str, str]:
    """Ask a running guest QEMU what it applied to the disk under test, with the keys of
    :func:`expected_guest_settings`. ToolFailed when QMP does not answer."""
    nodes, blocks, iothreads, peripheral = qmp_execute(qmp_socket, [
        ("query-named-block-nodes", None), ("query-block", None), ("query-iothreads", None),
        ("qom-list", {"path": "/machine/peripheral"})], timeout=timeout)
    types = {item["name"]: item["type"][len("child<"):-1] for item in peripheral
             if item["type"].startswith("child<")}
    disk = next((name for name, kind in types.items() if kind in _DISK_TYPES), None)
    controller = next((name for name, kind in types.items() if kind in _CONTROLLER_TYPES), None)
    out: dict[str, str] = {}
    out.update(_node_settings(flatten_block_nodes(nodes)))
    if disk is None:
        return out | {"device.type": "", "controller.type": "", "iothreads": str(len(iothreads))}
    device_type = types[disk]
    holder = disk if device_type in _IOTHREAD_HOLDERS else controller
    queues_on = controller if device_type == "scsi-hd" else disk
    queue_type = types.get(queues_on or "", "")
    gets: list[tuple[str, str, str]] = []   # (key, object, property)
    if device_type != "vhost-user-blk-pci":
        gets.append(("device.write-cache", disk, "write-cache"))
    else:
        gets.append(("memory.share", f"/objects/{MEMORY_BACKEND}", "share"))
    if holder is not None and types[holder] in _IOTHREAD_HOLDERS:
        gets.append(("device.iothread", holder, "iothread"))
    queue_props = {"virtio-blk-pci": ("num-queues", "queue-size"),
                   "vhost-user-blk-pci": ("num-queues", "queue-size"),
                   "virtio-scsi-pci": ("num_queues", "virtqueue_size"),
                   "nvme": ("max_ioqpairs", None)}.get(queue_type, (None, None))
    if queue_props[0]:
        gets.append(("device.num-queues", queues_on, queue_props[0]))  # type: ignore[arg-type]
    if queue_props[1]:
        gets.append(("device.queue-size", queues_on, queue_props[1]))  # type: ignore[arg-type]
    values = qmp_execute(qmp_socket, [
        ("qom-get", {"path": obj if obj.startswith("/") else f"/machine/peripheral/{obj}",
                     "property": prop}) for _, obj, prop in gets], timeout=timeout)
    for (key, _, _), value in zip(gets, values):
        out[key] = _qom_text(value)
    out.setdefault("device.iothread", "")
    out["device.type"] = device_type
    out["controller.type"] = types[controller] if controller else ""
    out["iothreads"] = str(len(iothreads))
    backend = next((b for b in blocks if (b.get("inserted") or {}).get("node-name") == FORMAT_NODE),
                   None)
    if backend is not None:
        out["backend.write-cache"] = _onoff(backend["inserted"]["cache"]["writeback"])
    return out


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

def _check(config: Configuration, image: Image) -> None:
    """InvalidCombination for what QEMU (or iomatrix) refuses, judged as in guest mode."""
    reason = invalid_reason(config.model_copy(update={"mode": "guest"}),
                            device_target=image.is_device)
    if reason is None and config.data_path != "vhost-user-blk" and config.controller is None:
        reason = "no controller given (every emulated disk needs one)"
    if reason is None and (config.format or "raw") != image.format:
        reason = f"the image {image.path} is {image.format}, the configuration asks for {config.format}"
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
                            f"size={spec.memory_bytes},share=on"]
        machine += f",memory-backend={MEMORY_BACKEND}"
    argv += ["-machine", machine, "-accel", spec.accel,
             "-cpu", "host" if spec.accel == "kvm" else TCG_CPU,
             "-smp", str(spec.vcpus), "-m", f"{spec.memory_bytes}B",
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
    if kind == "vhost-user-blk":
        if spec.vhost_socket is None:
            raise InvalidCombination(f"{config.key}: vhost-user-blk needs the daemon's socket")
        device = (f"vhost-user-blk-pci,id={VHOST_DEVICE},chardev={VHOST_CHARDEV},"
                  f"num-queues={vhost_num_queues(config, spec.vcpus)}")
        if config.queue_size:
            device += f",queue-size={config.queue_size}"
        return ["-chardev", f"socket,id={VHOST_CHARDEV},path={qemu_escape(str(spec.vhost_socket))}",
                "-device", device]

    argv: list[str] = []
    holder = _iothread_holder(kind)
    if config.iothread:
        argv += ["-object", f"iothread,id={_iothread_id(holder)}"]
    for node in _nodes(config, spec.image):
        argv += ["-blockdev", node]
    # Options go where QEMU looks for them; for a refused configuration that is where QEMU
    # then names the device that lacks the property.
    disk: dict[str, str] = {"drive": FORMAT_NODE,
                            "write-cache": _onoff(cache_flags(config).writeback)}
    hba: dict[str, str] = {}
    queue_props = hba if kind in _SCSI_CONTROLLER_ID else disk
    if config.iothread:
        (hba if kind in _SCSI_CONTROLLER_ID else disk)["iothread"] = _iothread_id(holder)
    if config.num_queues:
        queue_props[_QUEUE_PROPERTY.get(kind, "num-queues")] = str(config.num_queues)
    if config.queue_size:
        queue_props[_SIZE_PROPERTY.get(kind, "queue-size")] = str(config.queue_size)

    if kind == "virtio-blk":
        argv += ["-device", _device("virtio-blk-pci", "virtio0", disk)]
    elif kind in _SCSI_CONTROLLER_ID:
        hba_type = "pvscsi" if kind == "pvscsi" else "virtio-scsi-pci"
        argv += ["-device", _device(hba_type, holder, hba),
                 "-device", _device("scsi-hd", "scsi0", {"bus": f"{holder}.0", "channel": "0",
                                                         "scsi-id": "0", "lun": "0"} | disk)]
    elif kind == "sata":
        argv += ["-device", "ahci,id=ahci0",
                 "-device", _device("ide-hd", "sata0", {"bus": "ahci0.0"} | disk)]
    elif kind == "ide":
        argv += ["-device", _device("ide-hd", "ide0", {"bus": "ide.0", "unit": "0"} | disk)]
    elif kind == "nvme":
        argv += ["-device", _device("nvme", "nvme0", {"serial": NVME_SERIAL} | disk)]
    else:
        raise InvalidCombination(f"{config.key}: unknown controller {kind!r}")
    return argv


def _nodes(config: Configuration, image: Image) -> list[str]:
    """The protocol and format nodes as JSON ``-blockdev`` values (JSON needs no comma escaping)."""
    size = image.size if image.is_device else None
    return [json.dumps(node, separators=(",", ":"))
            for node in blockdev_nodes(config, image.path, is_device=image.is_device, size=size)]


def _device(driver: str, ident: str, props: dict[str, str]) -> str:
    return ",".join([driver, f"id={ident}", *(f"{k}={v}" for k, v in props.items())])


def _kind(config: Configuration) -> str:
    return "vhost-user-blk" if config.data_path == "vhost-user-blk" else str(config.controller)


def _iothread_holder(kind: str) -> str:
    """The id of the device (or export) that owns the disk's iothread."""
    return {"virtio-blk": "virtio0", "sata": "sata0", "ide": "ide0", "nvme": "nvme0",
            "vhost-user-blk": VHOST_EXPORT}.get(kind) or _SCSI_CONTROLLER_ID[kind]


def _iothread_id(holder: str) -> str:
    return f"iothread-{holder}"


def _device_types(kind: str) -> tuple[str, str]:
    """(disk device, controller) QOM types as qom-list shows them; "" for no controller."""
    return {"virtio-blk": ("virtio-blk-pci", ""), "virtio-scsi": ("scsi-hd", "virtio-scsi-pci"),
            "virtio-scsi-single": ("scsi-hd", "virtio-scsi-pci"), "pvscsi": ("scsi-hd", "pvscsi"),
            "sata": ("ide-hd", "ich9-ahci"), "ide": ("ide-hd", ""), "nvme": ("nvme", ""),
            "vhost-user-blk": ("vhost-user-blk-pci", "")}[kind]


# -- reading ----------------------------------------------------------------------------------

def _node_settings(flat: dict[str, str]) -> dict[str, str]:
    """The node keys :func:`iomatrix.qemu.blockdev.expected_node_flags` gives: every node's
    cache.direct and cache.no-flush, and the format node's driver."""
    return {key: value for key, value in flat.items()
            if key.endswith((".cache.direct", ".cache.no-flush")) or key == f"{FORMAT_NODE}.driver"}


def _qom_text(value: Any) -> str:
    """A qom-get value as text: links as the object's id, booleans as true/false."""
    if isinstance(value, bool):
        return "true" if value else "false"
    text = str(value)
    return text.rsplit("/", 1)[-1] if text.startswith("/") else text


def _onoff(value: bool) -> str:
    return "on" if value else "off"
