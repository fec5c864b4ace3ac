"""The run's words that are not axes: how a configuration is measured (``Mode``), the
accelerator asked for and the one that ran, and the status of a trial and of a run. Each is a
``StrEnum``: its members are the strings stored and compared, so ``Mode.GUEST == "guest"``."""

from __future__ import annotations

from enum import StrEnum


class Mode(StrEnum):
    """How a configuration is measured: fio on the target itself (host), through
    qemu-storage-daemon's block layer (blocklayer), or inside guests (guest)."""

    HOST = "host"
    BLOCKLAYER = "blocklayer"
    GUEST = "guest"


class Accel(StrEnum):
    """[method] accel: KVM when a probe boot shows it works, else TCG (auto), or one of them."""

    AUTO = "auto"
    KVM = "kvm"
    TCG = "tcg"


class Accelerator(StrEnum):
    """The accelerator guests ran under (a run's ``accelerator``)."""

    KVM = "kvm"
    TCG = "tcg"


class TrialStatus(StrEnum):
    """A stored trial's status."""

    OK = "ok"
    FAILED = "failed"


class RunStatus(StrEnum):
    """A stored run's status."""

    RUNNING = "running"
    COMPLETE = "complete"
    INTERRUPTED = "interrupted"
    FAILED = "failed"


class QueueStatus(StrEnum):
    """A cluster node's share of a run (its queue of trials): not begun (pending), being
    measured (running), measured (done), ended in error (failed) or lost over SSH (dropped)."""

    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    DROPPED = "dropped"
