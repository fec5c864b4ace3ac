"""What qemu-server cannot say of a disk, said in the VM's ``args:`` line, and read back
(pure): several IOThreads serving one disk's queues (QEMU's ``iothread-vq-mapping``), and the
VM's CPU ``affinity``.

qemu-server 9.2's drive option ``iothread`` is a boolean: one IOThread per disk (an RFC for
several, posted to pve-devel in July 2025, is not merged). A disk with several is therefore
attached in ``args:`` as plain QEMU arguments (``-object iothread`` per thread, its
``-blockdev`` nodes, a ``-device`` in JSON syntax, which ``iothread-vq-mapping`` needs), with
ids of iomatrix's own (``iomatrix-…``) that none of qemu-server's collide with. qemu-server
splits ``args:`` as a shell would (PVE::Tools::split_args) and appends it to its command line.
It does not manage such a disk: :data:`ARGS_WARNING`.

``affinity`` (QemuServer.pm config_to_command) runs QEMU under ``taskset --cpu-list
--all-tasks``: every thread of the VM (vCPUs, IOThreads, main loop) on one CPU set.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from iomatrix.core.model import Frozen
from iomatrix.platform.qemu import cache_flags
from iomatrix.platform.settings import DiskSettings, disk_kind
from iomatrix.core.cpuset import NUMA
from iomatrix.vocab.axes import AFFINITY_AXES, vq_groups

ARGS_WARNING = ("warning: qemu-server does not manage a disk given in args: it is outside qm's "
                "disk options (qm config lists no drive for it, vzdump does not back it up, "
                "snapshots leave it out), and a disk reconfiguration or a migration may not "
                "carry it; do not attach the same volume as a drive too")
ARGS_CONTROLLERS = {"virtio-blk": "virtio-blk-pci", "virtio-scsi-single": "virtio-scsi-pci",
                    "virtio-scsi": "virtio-scsi-pci"}
"""Controllers whose device takes ``iothread-vq-mapping`` (virtio-blk from QEMU 9.0,
virtio-scsi from 10.0; Proxmox VE 9 ships QEMU 10)."""
PREFIX = "iomatrix-"
NUMA_PLACEHOLDER = "<the CPUs of the disk's NUMA node>"
"""What ``--affinity`` shows for the level ``numa`` where no host is at hand: the CPU list of
the node the target device sits on (/sys/block/DEV/device/numa_node, then
/sys/devices/system/node/nodeN/cpulist)."""


def _json(value: dict[str, Any]) -> str:
    return json.dumps(value, separators=(",", ":"))


def several_iothreads(settings: DiskSettings) -> bool:
    """Whether ``settings`` ask for more IOThreads on the disk than qemu-server gives (one)."""
    return bool(settings.iothread and (settings.iothreads or 0) > 1)


def disk_args(settings: DiskSettings, path: str) -> list[str]:
    """The plain QEMU arguments for a disk with several IOThreads on ``path`` (a volume's path:
    ``pvesm path STORAGE:VOLUME``). ValueError for a controller without the mapping."""
    kind = disk_kind(settings)
    if kind not in ARGS_CONTROLLERS:
        raise ValueError(f"{kind} has no iothread-vq-mapping (virtio-blk and virtio-scsi only)")
    count = settings.iothreads or 1
    groups = vq_groups(settings.vq_mapping)
    mapping = [{"iothread": f"{PREFIX}iothread{i}"} | ({"vqs": list(groups[i])} if groups else {})
               for i in range(count)]
    flags = cache_flags(settings)
    cache = {"direct": flags.direct, "no-flush": flags.no_flush}
    argv: list[str] = []
    for i in range(count):
        argv += ["-object", f"iothread,id={PREFIX}iothread{i}"]
    storage: dict[str, Any] = {"driver": "host_device" if path.startswith("/dev/") else "file",
                               "filename": path, "node-name": f"{PREFIX}file0", "cache": cache,
                               "aio": settings.aio or "threads"}
    fmt: dict[str, Any] = {"driver": settings.format or "raw", "file": f"{PREFIX}file0",
                           "node-name": f"{PREFIX}disk0", "cache": cache}
    if settings.discard:
        storage["discard"] = fmt["discard"] = settings.discard
    argv += ["-blockdev", _json(storage), "-blockdev", _json(fmt)]
    hub: dict[str, Any] = {"iothread-vq-mapping": mapping}
    write_cache = "on" if flags.writeback else "off"
    if kind == "virtio-blk":
        if settings.num_queues:
            hub["num-queues"] = settings.num_queues
        if settings.queue_size:
            hub["queue-size"] = settings.queue_size
        return argv + ["-device", _json({"driver": "virtio-blk-pci", "id": f"{PREFIX}virtio0",
                                         "drive": f"{PREFIX}disk0", "write-cache": write_cache}
                                        | hub)]
    if settings.num_queues:
        hub["num_queues"] = settings.num_queues
    if settings.queue_size:
        hub["virtqueue_size"] = settings.queue_size
    return argv + ["-device", _json({"driver": "virtio-scsi-pci", "id": f"{PREFIX}scsihw0"} | hub),
                   "-device", _json({"driver": "scsi-hd", "bus": f"{PREFIX}scsihw0.0",
                                     "drive": f"{PREFIX}disk0", "id": f"{PREFIX}scsi0",
                                     "write-cache": write_cache})]


def args_line(argv: list[str]) -> str:
    """``argv`` as the ``args:`` value qemu-server splits back into it (shell quoting)."""
    return " ".join(shlex.quote(a) for a in argv)


def _sets(settings: DiskSettings) -> dict[str, str | None]:
    return {a: getattr(settings, a, None) for a in AFFINITY_AXES}


def affinity_refusal(settings: DiskSettings) -> str | None:
    """Why qm set cannot pin the VM as ``settings`` ask: ``affinity`` pins every thread of the
    VM to one set, so the sets given must be one."""
    given = _sets(settings)
    if len({v for v in given.values() if v}) < 2:
        return None
    return ("Proxmox VE's affinity pins every thread of the VM to one CPU set: "
            + ", ".join(f"{a} {v}" for a, v in given.items() if v)
            + " cannot be said with qm set (only by a hookscript running taskset per thread)")


def affinity_of(settings: DiskSettings) -> tuple[str | None, str | None]:
    """The VM's ``affinity`` for ``settings``' CPU sets, and why there is none or what it does
    beyond them (a thread left unpinned is pinned with the rest)."""
    given = _sets(settings)
    sets = {v for v in given.values() if v}
    if len(sets) != 1:
        return None, affinity_refusal(settings)
    found = sets.pop()
    unset = [a for a, v in given.items() if not v]
    note = None
    if unset:
        note = (f"--affinity {found} pins every thread of the VM (QEMU runs under taskset "
                f"--all-tasks): {', '.join(unset)} too, which the run left unpinned")
    return (NUMA_PLACEHOLDER if found == NUMA else found), note


class ArgsDisk(Frozen):
    """A disk an ``args:`` line attaches with several IOThreads (:func:`parse_args`)."""

    name: str
    """Its device's id."""
    controller: str
    iothreads: int
    vq_mapping: str | None = None
    num_queues: int | None = None
    queue_size: int | None = None
    aio: str = "threads"
    cache_direct: bool = False
    cache_no_flush: bool = False
    write_cache: bool = True
    format: str = "raw"
    path: str = ""


def parse_args(text: str) -> tuple[tuple[ArgsDisk, ...], tuple[str, ...]]:
    """The disks an ``args:`` value attaches with ``iothread-vq-mapping`` (JSON ``-device``),
    their nodes read from its ``-blockdev`` values; and notes on what else it holds. An
    ``args:`` line is untrusted: ValueError for one that does not split, a JSON value that
    is not an object is named, not followed."""
    try:
        argv = shlex.split(text)
    except ValueError as exc:
        raise ValueError(f"args: does not split as qemu-server splits it: {exc}") from None
    nodes: dict[str, dict[str, Any]] = {}
    devices: list[dict[str, Any]] = []
    notes: list[str] = []
    for option, value in zip(argv, argv[1:]):
        if option not in ("-blockdev", "-device") or not value.startswith("{"):
            continue
        try:
            parsed = json.loads(value)
        except ValueError:
            notes.append(f"args: {option} {value[:60]!r} is not JSON iomatrix reads")
            continue
        if not isinstance(parsed, dict):
            continue
        if option == "-blockdev" and isinstance(parsed.get("node-name"), str):
            nodes[parsed["node-name"]] = parsed
        elif option == "-device":
            devices.append(parsed)
    buses = {str(d.get("bus", "")).partition(".")[0]: d for d in devices if d.get("drive")}
    disks = []
    for device in devices:
        mapping = device.get("iothread-vq-mapping")
        if not isinstance(mapping, list) or not mapping:
            continue
        disks.append(_args_disk(device, mapping, nodes, buses))
    return tuple(disks), tuple(notes)


def _args_disk(device: dict[str, Any], mapping: list[Any], nodes: dict[str, dict[str, Any]],
               buses: dict[str, dict[str, Any]]) -> ArgsDisk:
    ident = str(device.get("id", "?"))
    scsi = device.get("driver") == "virtio-scsi-pci"
    disk = buses.get(ident, {}) if scsi else device
    queues = [e.get("vqs") for e in mapping if isinstance(e, dict)]
    explicit = None
    if all(isinstance(q, list) and q for q in queues):
        explicit = ":".join(",".join(str(int(v)) for v in q) for q in queues)  # type: ignore[union-attr]
    top = nodes.get(str(disk.get("drive", "")), {})
    below = nodes.get(str(top.get("file", "")), top)
    cache = top.get("cache") if isinstance(top.get("cache"), dict) else {}
    count = device.get("num_queues" if scsi else "num-queues")
    size = device.get("virtqueue_size" if scsi else "queue-size")
    return ArgsDisk(
        name=str(disk.get("id", ident)), controller="virtio-scsi-single" if scsi else "virtio-blk",
        iothreads=len(mapping), vq_mapping=explicit,
        num_queues=int(count) if isinstance(count, int) else None,
        queue_size=int(size) if isinstance(size, int) else None,
        aio=str(below.get("aio", "threads")), cache_direct=bool(cache.get("direct", False)),
        cache_no_flush=bool(cache.get("no-flush", False)),
        write_cache=disk.get("write-cache", "on") != "off",
        format=str(top.get("driver", "raw")) if top is not below else "raw",
        path=str(below.get("filename", "")))
