"""Every axis of a configuration, declared once (``AXES``): its name, its levels, the modes and
platforms that honour it, how a label shows it, what it means in blocklayer mode and what
``recommend`` says it is. Everything that lists axes is derived from here: ``CONFIG_AXES``,
``BLOCKLAYER_AXES``, the mode's axes, the levels a finding may name, ``DiskSettings`` (and so
``suite.configuration.Configuration``'s fields), recommend's parameters and their words.

Adding an axis: declare it here (and its Literal), give the suite its [matrix] key
(``suite.matrix.Matrix``), and render it in each platform that honours it (``discard`` is the
example: its renderings are in ``iomatrix.platform.qemu``, ``platform.proxmox.disk`` and
``defaults``, ``platform.libvirt.disk`` and ``defaults``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Optional

from pydantic import create_model

from iomatrix.core.model import Frozen
from iomatrix.vocab.words import Mode

Controller = Literal["virtio-blk", "virtio-scsi", "virtio-scsi-single", "pvscsi", "lsi", "megasas",
                     "sata", "ide", "nvme"]
Aio = Literal["native", "io_uring", "threads"]
Cache = Literal["none", "directsync", "writethrough", "writeback", "unsafe"]
Format = Literal["raw", "qcow2"]
Preallocation = Literal["off", "metadata", "falloc", "full"]
DataPath = Literal["emulated", "vhost-user-blk"]
Discard = Literal["ignore", "unmap"]
Platform = Literal["qemu", "proxmox", "libvirt"]
"""Whose block graph and devices a guest gets for a configuration (iomatrix.platform)."""

PLATFORMS_ALL: tuple[Platform, ...] = ("qemu", "proxmox", "libvirt")
QEMU_MODES = (Mode.BLOCKLAYER, Mode.GUEST)
VQ_ROUND_ROBIN = "round-robin"
"""``vq_mapping``'s default: QEMU deals the queues to the IOThreads in turn (queue i to thread
i mod N), what ``iothread-vq-mapping`` listing only the threads gives."""
AFFINITY_AXES = ("vcpu_affinity", "iothread_affinity", "main_affinity")
"""Host CPU sets ("0-1,3", or "numa": the target device's NUMA node's CPUs; unset: not pinned)
for the threads that run the workload (a guest's vCPUs; fio itself where it runs on the host),
QEMU's IOThreads and QEMU's main loop (its main thread), pinned after QEMU starts as libvirt
pins them (``iomatrix.qemu.affinity``)."""
CPU_LEVERS = ("iothreads", "vq_mapping", "num_queues", *AFFINITY_AXES)
"""The axes that decide how a disk's work is spread over the host's CPUs (issue 35): evidence on
them from guests under TCG measures QEMU's emulator (``recommend.threads``)."""
AFFINITY_NOT_SETTING = ("CPU placement of QEMU's threads on this host's CPUs, not a disk "
                        "setting: libvirt's <cputune>, Proxmox VE's affinity")
CORE = "core"
"""``Axis.label``: the level is one of the ``/``-joined words of a label (``native/none/raw``)."""


def _flag(word: str) -> Callable[[Any], str]:
    return lambda value: f" {word}" if value else ""


def _named(template: str, hidden: tuple[Any, ...] = (None,)) -> Callable[[Any], str]:
    return lambda value: "" if value in hidden else template.format(value)


@dataclass(frozen=True)
class Axis:
    """One axis of a configuration."""

    name: str
    type: Any
    """The level's type: a Literal of its levels, bool or int (str: a name, such as a guest's)."""
    modes: tuple[Mode, ...]
    """The modes that honour it (host mode honours only where fio runs, vcpu_affinity: fio runs
    on the target itself)."""
    platforms: tuple[Platform, ...] = ()
    """The platforms that render it as a disk setting (empty: not a disk setting)."""
    label: Callable[[Any], str] | str = ""
    """How a configuration's label shows a level: CORE (one of its ``/``-joined words), or a
    function of the level giving the words appended (empty where nothing shows)."""
    blocklayer: str = ""
    """Its meaning in blocklayer mode (qemu-storage-daemon, no guest), or for an axis that mode
    does not honour, why (the note that it is ignored says so); empty where it has none."""
    faithful_in_blocklayer: bool = False
    """Blocklayer mode measures it as a guest has it: a claim on it is checked there too."""
    what: str = ""
    """What ``recommend`` says it is; empty: not a setting recommend decides."""
    not_setting: str = ""
    """Why ``recommend`` reports it but does not turn it into a setting."""
    unset: Any = None
    """The level that means "as QEMU does by default", stored as no level at all."""
    claimed: bool = True
    """A [[finding]] may name it as its axis."""
    optional: bool = False
    """``recommend`` decides it only for a run that measured it: a run that never named it gets
    every platform's advice as before the axis existed."""

    @property
    def levels(self) -> tuple[str, ...] | None:
        """Its levels as a configuration shows them (on/off for a switch); None: numbers or
        names."""
        if self.type is bool:
            return ("on", "off")
        args = getattr(self.type, "__args__", None)
        return tuple(args) if args and all(isinstance(a, str) for a in args) else None

    def level_of(self, text: str | None) -> Any:
        """A level from the text a configuration shows it as (``Configuration.params``): on/off
        → a switch, digits → a number (none: None)."""
        if self.type is bool:
            return text == "on"
        if self.type is int:
            return int(text) if text else None
        return text

    def shown_in_label(self, value: Any) -> str:
        """The words this level adds to a label (not for a CORE axis)."""
        if self.label == CORE or not self.label:
            return ""
        return self.label(value)  # type: ignore[operator]


AXES: tuple[Axis, ...] = (
    Axis("controller", Controller, (Mode.GUEST,), PLATFORMS_ALL, label=CORE,
         what="the disk controller (bus) the guest sees"),
    Axis("data_path", DataPath, (Mode.GUEST,), label=CORE, unset="emulated",
         not_setting="vhost-user-blk needs a qemu-storage-daemon beside the guest; iomatrix does "
                     "not render that setup for a platform"),
    Axis("aio", Aio, QEMU_MODES, PLATFORMS_ALL, label=CORE, faithful_in_blocklayer=True,
         blocklayer="how qemu-storage-daemon submits I/O, as a guest's QEMU does",
         what="how QEMU submits I/O to the host: Linux AIO (native), io_uring, or a thread pool"),
    Axis("iothread", bool, QEMU_MODES, PLATFORMS_ALL, label=_flag("iothread"),
         blocklayer="the export: on = FUSE export with an iothread, off = NBD export (not a "
                    "guest device's iothread)",
         what="a dedicated event-loop thread for the disk, off QEMU's main loop"),
    Axis("iothreads", int, (Mode.GUEST,), PLATFORMS_ALL, label=_named("×{}", (None, 1)),
         unset=1, optional=True,
         blocklayer="qemu-storage-daemon's exports take one IOThread each before QEMU 10.1 "
                    "(block-export-add's list of IOThreads, which NBD and vhost-user-blk exports "
                    "refuse): iomatrix gives each export one",
         what="IOThreads serving the disk's queues (QEMU's iothread-vq-mapping; with iothread "
              "on): queues spread over several event loops"),
    Axis("vq_mapping", str, (Mode.GUEST,), PLATFORMS_ALL, label=_named(" vq={}"),
         unset=VQ_ROUND_ROBIN, optional=True,
         what="which of the disk's IOThreads serves which queue: round-robin, or an explicit "
              "mapping (\"0,1:2,3\": queues 0 and 1 to the first thread, 2 and 3 to the second)"),
    Axis("cache", Cache, QEMU_MODES, PLATFORMS_ALL, label=CORE, faithful_in_blocklayer=True,
         blocklayer="the daemon's cache mode, as a guest's QEMU has it",
         what="host page cache use and whether the guest sees a volatile write cache"),
    Axis("format", Format, QEMU_MODES, PLATFORMS_ALL, label=CORE, faithful_in_blocklayer=True,
         blocklayer="the image format the daemon opens, as a guest's QEMU does",
         what="image format: raw, or qcow2 (thin, snapshots, a metadata layer)"),
    Axis("preallocation", Preallocation, QEMU_MODES, PLATFORMS_ALL,
         label=_named(" prealloc={}", (None, "off")), faithful_in_blocklayer=True,
         blocklayer="how the image is allocated when it is created, as for a guest",
         what="how much of the image is allocated when it is created"),
    Axis("discard", Discard, QEMU_MODES, PLATFORMS_ALL, label=_named(" discard={}"),
         faithful_in_blocklayer=True, optional=True,
         blocklayer="whether the daemon's nodes pass discard requests down, as a guest's do",
         what="whether the guest's discard (TRIM/UNMAP) requests reach the storage: ignore "
              "drops them, unmap passes them down (freeing space on thin storage)"),
    Axis("num_queues", int, (Mode.GUEST,), PLATFORMS_ALL, label=_named(" q={}", (None, 0)),
         unset=0, what="virtqueues of the device (NVMe: I/O queue pairs)"),
    Axis("queue_size", int, (Mode.GUEST,), PLATFORMS_ALL, label=_named(" qs={}", (None, 0)),
         unset=0, what="entries per virtqueue"),
    Axis("vms", int, (Mode.GUEST,), label=lambda v: f" ×{v} VMs" if v and v > 1 else "",
         not_setting="the number of guests measured at once, not a disk setting"),
    Axis("node_count", int, (Mode.HOST, Mode.BLOCKLAYER, Mode.GUEST),
         label=lambda v: f" on {v} node{'s' if v != 1 else ''}" if v else "", claimed=False,
         blocklayer="how many nodes' qemu-storage-daemons load the shared target at once",
         not_setting="how many of the cluster's nodes load the shared target at once "
                     "([method] concurrent_nodes), not a disk setting"),
    Axis("guest", str, (Mode.GUEST,), label=_named(" in {}"), claimed=False),
    Axis("vcpu_affinity", str, (Mode.GUEST, Mode.BLOCKLAYER, Mode.HOST),
         label=_named(" vcpu@{}"),
         blocklayer="fio's cpus_allowed: fio runs on the host, where a guest's vCPUs would",
         not_setting=AFFINITY_NOT_SETTING),
    Axis("iothread_affinity", str, QEMU_MODES, label=_named(" iothread@{}"),
         blocklayer="the CPUs of the daemon's threads but its main loop (its IOThreads, RCU "
                    "and monitor threads)", not_setting=AFFINITY_NOT_SETTING),
    Axis("main_affinity", str, QEMU_MODES, label=_named(" main@{}"),
         blocklayer="the daemon's main loop's CPUs", not_setting=AFFINITY_NOT_SETTING),
)
"""Every axis, in the order a configuration's key names them."""

BY_NAME: dict[str, Axis] = {a.name: a for a in AXES}
CONFIG_AXES: tuple[str, ...] = tuple(BY_NAME)
"""The axes a configuration may set (``Configuration.params`` names them in this order)."""
MODE_AXES: dict[str, tuple[str, ...]] = {
    str(mode): tuple(a.name for a in AXES if mode in a.modes) for mode in Mode}
"""The axes each mode uses; host runs fio on the target itself: no QEMU setting applies (only
the CPUs fio runs on, vcpu_affinity)."""
BLOCKLAYER_AXES: tuple[str, ...] = tuple(a.name for a in AXES if a.faithful_in_blocklayer)
"""Axes QEMU's block layer has as a guest does: a claim about one of them is checked in
blocklayer mode too (measured natively where guests are emulated)."""
CLAIMED_AXES: tuple[str, ...] = tuple(a.name for a in AXES if a.claimed)
"""The axes a [[finding]] may name (beside the target)."""
AXIS_VALUES: dict[str, tuple[str, ...]] = {a.name: lvl for a in AXES if (lvl := a.levels)}
"""The levels of each axis that has named ones, as a configuration shows them."""
PARAMETERS: tuple[str, ...] = tuple(a.name for a in AXES if a.what)
"""The disk settings a recommendation decides, in the order it shows them."""
WHAT: dict[str, str] = {a.name: a.what for a in AXES if a.what}
"""Each parameter in words, as recommend shows it."""
NOT_SETTINGS: dict[str, str] = {a.name: a.not_setting for a in AXES if a.not_setting}
"""Run axes that a recommendation reports but does not turn into a setting, and why."""
DEFAULT_UNSET: tuple[str, ...] = tuple(a.name for a in AXES if a.type is int and a.unset == 0)
"""Counting axes whose 0 is QEMU's default, stored as no level."""
VQ_MAPPING_PATTERN = r"^(round-robin|[0-9]{1,5}(,[0-9]{1,5})*(:[0-9]{1,5}(,[0-9]{1,5})*)*)$"
"""``vq_mapping``'s text: round-robin, or each IOThread's queues, threads apart by ``:``."""


def vq_groups(mapping: str | None) -> tuple[tuple[int, ...], ...] | None:
    """An explicit ``vq_mapping`` as each IOThread's queues in thread order (``"0,1:2,3"`` →
    ((0, 1), (2, 3))); None for round-robin or no mapping."""
    if mapping is None or mapping == VQ_ROUND_ROBIN:
        return None
    return tuple(tuple(int(q) for q in group.split(",")) for group in mapping.split(":"))


CONTROLLERS: tuple[str, ...] = Controller.__args__  # type: ignore[attr-defined]
IOTHREAD_CONTROLLERS = ("virtio-blk", "virtio-scsi", "virtio-scsi-single")
DIRECT_CACHES = ("none", "directsync")

DiskSettings = create_model(  # type: ignore[call-overload]
    "DiskSettings", __base__=Frozen, __module__=__name__,
    **{a.name: (Optional[a.type], None) for a in AXES if a.platforms or a.name == "data_path"})
"""One disk's settings as iomatrix names them (every axis a platform renders, and the data
path); None where a setting is not given. ``Configuration`` is one, with its run's axes."""
DiskSettings.__doc__ = ("One disk's settings as iomatrix names them; None where a setting is "
                        "not given.")
RUN_AXES: tuple[str, ...] = tuple(a for a in CONFIG_AXES if a not in DiskSettings.model_fields)
"""The axes that are not a disk's settings (how many guests, which guest)."""
AxisLevels = create_model(  # type: ignore[call-overload]
    "AxisLevels", __base__=DiskSettings, __module__=__name__,
    **{name: (Optional[BY_NAME[name].type], None) for name in RUN_AXES})
"""A level (or None) for every axis: what a configuration sets (``Configuration``)."""
AxisLevels.__doc__ = "A level (or None) for every axis of a configuration."
