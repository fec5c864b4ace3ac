"""What one trial cost the host, measured around its fio run: per-thread CPU and context
switches of the processes serving the configuration (daemon, QEMU: by role from thread names),
the host fio's own CPU (its reaped children, from getrusage), cycles and instructions where perf
can count them, and the host's disk and interrupt time series."""

from __future__ import annotations

import resource
from collections.abc import Iterable, Sequence

from iomatrix.core.model import Frozen
from iomatrix.fio.samples import DirectionSample
from iomatrix.telemetry.host import HostSampler, HostSeries
from iomatrix.telemetry.perf import PerfCounts, PerfStat
from iomatrix.telemetry.procstat import CpuCost, ThreadTimes, cpu_delta, snapshot


class CpuRecord(Frozen):
    """What a trial cost the host's CPU (``TrialProbe.cost``): the serving processes
    by thread role plus the host fio, per I/O and per MiB, context switches, perf counts."""

    window_s: float
    cpu_s_by_role: dict[str, float]
    """CPU seconds per thread role, "fio (host)" included."""
    exited_cpu_s: float
    """CPU seconds of threads and processes that ended during the trial (role unknown)."""
    cpu_s: float
    voluntary_csw: int
    involuntary_csw: int
    ios: int
    bytes: int
    cpu_us_per_io: float | None
    cpu_ms_per_mib: float | None
    csw_per_io: float | None
    perf: dict[str, float | None] | str
    """perf's counts per event, or why perf did not count."""
    cycles_per_io: float | None = None


class TrialProbe:
    """A context manager around one fio run; ``cost`` and ``host_series`` afterwards."""

    def __init__(self, pids: Iterable[int], device: str | None, perf_problem: str | None) -> None:
        self.pids = list(pids)
        self.device = device
        self.perf_problem = perf_problem
        self._sampler = HostSampler(1.0, devices=[device] if device else [])
        self._perf: PerfStat | None = None
        self._before: ThreadTimes | None = None
        self._after: ThreadTimes | None = None
        self._children: tuple[resource.struct_rusage, resource.struct_rusage] | None = None
        self._series: HostSeries | None = None
        self._counts: PerfCounts | None = None

    def __enter__(self) -> "TrialProbe":
        self._before = snapshot(self.pids)
        start_children = resource.getrusage(resource.RUSAGE_CHILDREN)
        self._children = (start_children, start_children)
        if self.perf_problem is None and self.pids:
            self._perf = PerfStat(self.pids).start()
        self._sampler.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._series = self._sampler.stop().model_copy(update={"target_device": self.device or ""})
        if self._perf is not None:
            self._counts = self._perf.stop()
        self._after = snapshot(self.pids)
        assert self._children is not None
        self._children = (self._children[0], resource.getrusage(resource.RUSAGE_CHILDREN))

    def cost(self, samples: Sequence[DirectionSample], fio_role: str = "fio (host)") -> CpuRecord:
        """CPU per I/O and per MiB, by role, with context switches and perf counts; the host
        child the run reaped (fio, or ioping) under ``fio_role``."""
        assert self._before is not None and self._after is not None and self._children
        serving: CpuCost = cpu_delta(self._before, self._after)
        start, end = self._children
        fio_cpu = (end.ru_utime - start.ru_utime) + (end.ru_stime - start.ru_stime)
        fio_csw = (end.ru_nvcsw - start.ru_nvcsw, end.ru_nivcsw - start.ru_nivcsw)
        ios = sum(s.total_ios for s in samples)
        nbytes = sum(s.io_bytes for s in samples)
        roles = {r.role: round(r.cpu_s, 6) for r in serving.roles}
        total = serving.cpu_s + fio_cpu
        perf: dict[str, float | None] | str = self.perf_problem or "no process to count"
        cycles_per_io = None
        if self._counts is not None:
            perf = dict(self._counts.counts)
            cycles = self._counts.cycles
            cycles_per_io = round(cycles / ios, 1) if cycles and ios else None
        return CpuRecord(
            window_s=round(serving.seconds, 3),
            cpu_s_by_role=roles | {fio_role: round(fio_cpu, 6)},
            exited_cpu_s=round(serving.exited_cpu_s, 6),
            cpu_s=round(total, 6),
            voluntary_csw=serving.voluntary + fio_csw[0],
            involuntary_csw=sum(r.involuntary for r in serving.roles) + fio_csw[1],
            ios=ios,
            bytes=nbytes,
            cpu_us_per_io=round(total / ios * 1e6, 3) if ios else None,
            cpu_ms_per_mib=round(total / (nbytes / 2**20) * 1e3, 3) if nbytes else None,
            csw_per_io=round((serving.voluntary + fio_csw[0]) / ios, 4) if ios else None,
            perf=perf, cycles_per_io=cycles_per_io)

    def host_series(self) -> HostSeries | None:
        """The host's disk and interrupt series over the trial (None before it ended)."""
        return self._series
