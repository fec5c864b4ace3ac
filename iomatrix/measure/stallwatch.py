"""Whether a trial stalled (``iomatrix.fio.persecond``), read where its completions can be seen:
fio's own IOPS log where fio runs on this host, QEMU's device counters where a remote fio
(a guest's, a node's) runs the job and the session counts its disks' requests."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from iomatrix.drivers.base import Session
from iomatrix.fio.persecond import (CounterSampler, StallCheck, check_logs, not_judged, pacing,
                                    remove_logs, with_iops_log)
from iomatrix.fio.samples import DirectionSample
from iomatrix.suite.workloads import Workload


class StallWatch:
    """One trial's stall check: ``job`` adds what fio must log, ``start`` and ``finish`` run
    around fio (``finish`` also after a failure: it removes the logs)."""

    def __init__(self, session: Session, workload: Workload, workdir: Path) -> None:
        self.session = session
        self.workdir = workdir
        self.remote = bool(session.clients()) or any(
            a.startswith("--client") for a in session.fio_args())
        self.reason = ("an ioping workload paces itself" if workload.ioping
                       else pacing(workload.options, workload.rate_iops))
        self._sampler: CounterSampler | None = None

    def job(self, text: str) -> str:
        """The trial's job file, logging its IOPS into the trial's directory where fio is
        local (a remote fio's logs would be written under a name the remote side chooses)."""
        return text if self.reason or self.remote else with_iops_log(text, self.workdir)

    def start(self) -> None:
        remove_logs(self.workdir)
        if self.reason is None and self.remote:
            self._sampler = CounterSampler(self.session.completed_ios).start()

    def finish(self, samples: Sequence[DirectionSample] = ()) -> StallCheck:
        """The check, from the trial's ``samples`` too (none after a failure)."""
        runtime_ms = max((s.runtime_ms for s in samples), default=None)
        sampler, self._sampler = self._sampler, None
        try:
            if self.reason is not None:
                return not_judged(self.reason)
            if sampler is not None:
                return sampler.finish()
            if self.remote:
                return not_judged("a remote fio's completions are not counted here")
            return check_logs(self.workdir, runtime_ms)
        finally:
            remove_logs(self.workdir)
