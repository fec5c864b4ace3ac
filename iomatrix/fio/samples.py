"""fio's results as iomatrix keeps them: one sample per active direction of a trial, with the
aggregate of several clients and each guest's own share."""

from __future__ import annotations


from iomatrix.core.errors import FioParseError
from iomatrix.fio.bins import merge_bins, percentiles_from_bins
from iomatrix.fio.models import DirectionStats, FioResult, Percentiles
from iomatrix.core.model import Frozen


class DirectionSample(Frozen):
    """One direction of one trial. Latencies are fio's total latency (lat_ns), in ns."""

    direction: str
    iops: float
    bw_bytes: float
    io_bytes: int
    total_ios: int
    runtime_ms: int
    lat_mean_ns: float | None = None
    lat_stdev_ns: float | None = None
    lat_min_ns: float | None = None
    lat_max_ns: float | None = None
    p50_ns: float | None = None
    p90_ns: float | None = None
    p99_ns: float | None = None
    p99_9_ns: float | None = None
    p99_99_ns: float | None = None
    vm: int | None = None
    """Which guest, in a per-guest sample of a trial that ran on several; None otherwise."""

    @classmethod
    def from_stats(cls, direction: str, stats: DirectionStats,
                   percentiles: Percentiles | None = None, vm: int | None = None) -> "DirectionSample":
        lat = stats.lat or stats.clat
        pct = percentiles or (lat.percentiles if lat else None)
        return cls(direction=direction, vm=vm, iops=stats.iops, bw_bytes=stats.bw_bytes,
                   io_bytes=stats.io_bytes, total_ios=stats.total_ios,
                   runtime_ms=stats.runtime_ms,
                   lat_mean_ns=lat.mean_ns if lat else None,
                   lat_stdev_ns=lat.stdev_ns if lat else None,
                   lat_min_ns=lat.min_ns if lat else None,
                   lat_max_ns=lat.max_ns if lat else None,
                   p50_ns=pct.p50 if pct else None, p90_ns=pct.p90 if pct else None,
                   p99_ns=pct.p99 if pct else None, p99_9_ns=pct.p99_9 if pct else None,
                   p99_99_ns=pct.p99_99 if pct else None)


def samples_of(result: FioResult) -> tuple[DirectionSample, ...]:
    """The active directions of a fio result: of its one job, or of the "All clients" aggregate,
    whose percentiles come from the clients' merged json+ histograms where fio gives none."""
    if result.aggregate is None:
        job = result.jobs[0]
        return tuple(DirectionSample.from_stats(name, stats)
                     for name, stats in (("read", job.read), ("write", job.write)) if stats.active)
    out = []
    for name in ("read", "write"):
        stats: DirectionStats = getattr(result.aggregate, name)
        if not stats.active:
            continue
        pct = stats.lat.percentiles if stats.lat else None
        histograms = [getattr(j, name).bins for j in result.jobs]
        if (pct is None or pct.p50 is None) and all(h is not None for h in histograms):
            pct = percentiles_from_bins(merge_bins(h for h in histograms if h is not None))
        out.append(DirectionSample.from_stats(name, stats, percentiles=pct))
    return tuple(out)


def vm_samples_of(result: FioResult, ports: list[int]) -> tuple[DirectionSample, ...]:
    """Each guest's own samples when several fio clients ran; none for one. fio lists clients in
    the order their results arrive, so each is matched to its guest by its port."""
    if result.aggregate is None:
        return ()
    by_port = {job.port: job for job in result.jobs}
    out = []
    for index, port in enumerate(ports):
        job = by_port.get(port)
        if job is None:
            raise FioParseError(f"fio returned no result for the guest on port {port}")
        out += [DirectionSample.from_stats(name, stats, vm=index)
                for name, stats in (("read", job.read), ("write", job.write)) if stats.active]
    return tuple(out)
