"""IOThreads per disk, queues and CPU affinity in a recommendation (pure): how a run's
configurations compare as IOThread counts, and what each platform can be told.

A run stores one IOThread as ``iothread=on`` with no ``iothreads`` level (the axis's unset 1 is
hidden from keys), and N as ``iothreads=N``: the two never pair in the effects analysis. The
IOThread count is therefore decided on a view of the run's guest configurations that have an
IOThread (``iothread=on``), each with its count as ``iothreads`` ("1" where unset) and no
``iothread`` level: N IOThreads against one, everything else held. Whether to have an IOThread
at all stays the ``iothread`` parameter's decision.
"""

from __future__ import annotations

from iomatrix.analysis.points import only_configs
from iomatrix.platform.settings import PlatformDefault, default
from iomatrix.store.records import StoredRun
from iomatrix.vocab.axes import CPU_LEVERS, Platform

THREADS = "iothreads"
ONE = "1"
THREADS_DEFAULT = default(ONE, "1 (one IOThread per disk, with iothread on)",
                          note="several IOThreads per disk need QEMU's iothread-vq-mapping: "
                               "virtio-blk from QEMU 9.0, virtio-scsi from QEMU 10.0")

LEVERS = CPU_LEVERS
"""The parameters that decide how a disk's I/O uses the host's CPUs (issue 35's levers): from
guests under TCG, whose vCPUs are QEMU's emulator competing for the same host CPUs, their
evidence measures the emulator and is shown, never recommended."""
EMULATED = ("not evaluated: measured only in guests under TCG, whose emulated vCPUs compete "
            "with QEMU's threads for the host's CPUs, so how {axis} spreads the disk's work "
            "measures the emulator, not this hardware (the evidence is shown); measure under "
            "KVM for a recommendation; keep the default")

PVE_TEXT = {
    THREADS: "qm set cannot express several IOThreads per disk: qemu-server (9.2) has a boolean "
             "iothread (iothread=1: one IOThread per disk, on virtio disks and "
             "virtio-scsi-single); an RFC for several (pve-devel, July 2025) is not merged. "
             "Keep iothread=1 on the drive and give the IOThreads and the device's "
             "iothread-vq-mapping through the VM's args: line, which qemu-server does not "
             "manage (it is not checked, migrated or shown in the GUI); needs QEMU 9.0 "
             "(virtio-blk) or 10.0 (virtio-scsi)",
    "vq_mapping": "only through args: (see iothreads): qm set has no queue-to-IOThread mapping",
    "num_queues": "qm set expresses it as queues=N on a scsi drive of a virtio-scsi-single "
                  "controller (from 2); a virtio (virtio-blk) drive has no queues= option",
    "queue_size": "qm set has no virtqueue size option: only through args:",
    "vcpu_affinity": "qm set --affinity <cpus> pins the whole QEMU process (vCPUs, IOThreads "
                     "and main loop together); a separate vCPU set is not a qm set option",
    "iothread_affinity": "qm set has no IOThread affinity: --affinity pins every thread of the "
                         "VM to one set; a separate set needs taskset on the IOThreads' thread "
                         "ids (QMP query-iothreads) after each start, e.g. from a hookscript",
    "main_affinity": "qm set has no main-loop affinity: --affinity pins every thread of the VM "
                     "to one set; a separate set needs taskset after each start",
}
"""What Proxmox VE's ``qm set`` can say of each axis, and what only ``args:`` (or a
hookscript) can: shown with the parameter whenever the run measured it."""


def thread_count(run: StoredRun) -> StoredRun | None:
    """The guest part of ``run`` as IOThread counts (the module's docstring); None when no
    configuration has more than one IOThread (nothing to compare with one)."""
    if not any(THREADS in c.params for c in run.configs):
        return None
    keep = {c.key for c in run.configs if c.params.get("iothread") == "on"}
    part = only_configs(run, keep)
    configs = tuple(c.model_copy(update={"params": {
        **{k: v for k, v in c.params.items() if k not in ("iothread", THREADS)},
        THREADS: c.params.get(THREADS, ONE)}}) for c in part.configs)
    return part.model_copy(update={"configs": configs})


def platform_text(platform: Platform, axis: str) -> str:
    """What ``platform`` can be told of ``axis`` where that needs saying ("" otherwise)."""
    return PVE_TEXT.get(axis, "") if platform == "proxmox" else ""


def axis_default(platform_defaults: dict[str, PlatformDefault], axis: str) -> PlatformDefault:
    """The platform's default of ``axis``: the IOThread count's is one; an axis the platform's
    module states no default for has none (the run's reference level stands in)."""
    if axis == THREADS:
        return THREADS_DEFAULT
    return platform_defaults.get(axis) or default(None, "not set", "no platform default stated")
