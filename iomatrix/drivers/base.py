"""The driver boundary. A Driver turns a Configuration (plus its image) into a Session: the
configuration brought up, with the fio options that reach its disk. The runner never knows which
kind it holds. A guest driver returns a Session whose ``fio_args`` are ``--client`` options.
``iomatrix.drivers.registry`` knows the driver of each mode."""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path

from iomatrix.fio.models import FioResult
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.method import Method
from iomatrix.suite.workloads import Workload
from iomatrix.targets.workspace import Image


class Session(abc.ABC):
    """A configuration brought up and ready for fio; closed by its driver."""

    def __init__(self, config: Configuration, images: Sequence[Image]) -> None:
        self.config = config
        self.images = list(images)

    @property
    def image(self) -> Image:
        """The first (for host and blocklayer modes, the only) image."""
        return self.images[0]

    @abc.abstractmethod
    def fio_target(self) -> dict[str, str]:
        """fio [global] options that make a job reach this configuration's disk."""

    def fio_args(self) -> list[str]:
        """Extra fio command-line arguments (a guest driver adds --client here)."""
        return []

    def fio_env(self) -> dict[str, str]:
        """Environment fio needs besides iomatrix's own (fio's rbd engine: ``CEPH_CONF``)."""
        return {}

    def ioping_path(self) -> Path | None:
        """The file or device ioping reads to reach this configuration's disk, or None where
        it cannot run (guests: the appliance has no ioping; QEMU's block layer: NBD): an ioping
        workload then runs fio's equivalent job (``iomatrix.fio.ioping``)."""
        return None

    def new_trial(self) -> None:
        """Called before each trial: forget what was observed during the previous one."""

    def client_ports(self) -> list[int]:
        """fio server ports of the guests, in guest order (empty without guests)."""
        return []

    def fio_clients(self) -> list[str]:
        """fio servers that each get the trial's job (``fio --client=A job --client=B job``:
        a cluster's nodes); empty when ``fio_args`` says where fio runs."""
        return []

    def client_targets(self) -> list[dict[str, str]]:
        """Per ``fio_clients`` entry, in order, what its job has over ``fio_target`` (a node's
        own image in a pool); empty: every client gets the same job."""
        return []

    def job_targets(self) -> list[dict[str, str]]:
        """The target of each client's job (``client_targets`` over ``fio_target``), or one
        for all."""
        target = self.fio_target()
        return [target | own for own in self.client_targets()] or [target]

    def precondition_clients(self) -> list[str]:
        """The fio servers that precondition the session's images: every one that gets the
        trial's job (each guest writes its own disk)."""
        return self.fio_clients()

    def clients(self) -> list[int | str]:
        """Where each fio client's result comes from, in order (a guest's port, a node's
        forwarded socket path): how per-client figures are matched; empty for one local fio."""
        return list(self.client_ports())

    def overdue(self) -> None:
        """Called when a trial's fio outlasts its time, before it is stopped: a session may
        look then at what the I/O path does (:meth:`failure` tells it)."""

    def failure(self, reason: str) -> str:
        """A failed trial's reason with what this session knows of it (a node whose fio server
        dropped mid-trial, named with why)."""
        return reason

    def stalled(self, in_flight: int = 0) -> bool:
        """After :meth:`failure`: the trial failed because the session itself stopped (its
        guests' fio never finished while every guest's disk sat idle, or completed no more
        requests in a second than the ``in_flight`` its fio keeps queued, so that each took a
        second or more; or its QEMU stopped answering), so a fresh session may measure it.
        The runner then brings the configuration up again and measures the trial again
        (runner.STOP_RETRIES times at most; a pilot's, never), or else the trials after it."""
        return False

    def fio_output_format(self) -> str:
        """fio's --output-format for this session's trials."""
        return "json"

    def completed_ios(self) -> int | None:
        """I/Os completed so far as counted outside fio (QEMU's device counters), for steady
        state where fio's own status stream is not live; None where fio's stream is used."""
        return None

    def check_trial(self, result: FioResult, workload: Workload) -> None:
        """Called after each trial's fio with its result: raise TrialFailed when what was seen
        outside fio contradicts it (a guest's disk did more I/O than fio counted)."""

    def observe(self, fio_pid: int) -> None:
        """Called once while fio runs, to see what the daemon or guest really does."""

    def applied(self) -> dict[str, str]:
        """What was really applied, as verified, flattened to strings; stored with each sample."""
        return {}

    def mismatches(self) -> list[str]:
        """Where the applied settings differ from the configuration; empty when all is as asked."""
        return []

    def command(self) -> str:
        """The command line that realized this configuration (shell-quoted), for the record."""
        return ""

    def pids(self) -> list[int]:
        """Processes serving this configuration, for telemetry."""
        return []


class Driver(abc.ABC):
    """Realizes configurations of one mode."""

    mode: str
    accelerator = "none"
    """How guest CPUs run: "kvm", "tcg", or "none" when the mode boots no guest."""

    def __init__(self, method: Method, workdir: Path) -> None:
        self.method = method
        self.workdir = workdir

    @classmethod
    def prepare(cls, method: Method, workdir: Path, *, accel: str,
                note: Callable[[str], None]) -> Driver:
        """The driver, ready for a run's sessions. ``accel`` (auto, kvm or tcg) is how guests
        should run; what preparing did or chose is told through ``note``. Most modes need
        nothing prepared."""
        return cls(method, workdir)

    def images_of(self, config: Configuration) -> Configuration:
        """The configuration whose images (one per guest) a session of ``config`` takes:
        ``config`` itself, but for guests on a cluster's nodes at once."""
        return config

    @abc.abstractmethod
    def session(self, config: Configuration,
                images: Sequence[Image]) -> contextlib.AbstractContextManager[Session]:
        """Bring ``config`` up on its images (one per guest); on exit, stop everything started."""

