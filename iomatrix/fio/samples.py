"""fio's results as iomatrix keeps them: one sample per active direction of a trial, with the
aggregate of several clients and each guest's own share.

A sample's latency figures (mean, spread, extremes and percentiles) all describe ONE of fio's
latency distributions, named by ``Latency``: ``lat``, the total latency (submission +
completion), or ``clat``, the completion latency alone. fio computes percentiles of ``lat`` only
with ``lat_percentiles=1`` (iomatrix's job files set it; fio before 3.1 cannot), so a sample of
the other distribution has no percentiles rather than another distribution's.

A mixed workload's percentiles are per direction: percentiles of two directions cannot be
averaged into one. ``mixed_percentiles`` gives the true percentiles of both directions together,
from fio's json+ histograms, where fio wrote them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from iomatrix.core.errors import FioParseError
from iomatrix.fio.bins import merge_bins, percentiles_from_bins
from iomatrix.fio.models import DirectionStats, FioResult, JobStats, Latency, Percentiles
from iomatrix.core.model import Frozen

LatencyKind = Literal["lat", "clat"]
LATENCIES: tuple[LatencyKind, ...] = ("lat", "clat")
DEFAULT_LATENCY: LatencyKind = "lat"
"""What iomatrix's own runs measure: their job files set ``lat_percentiles=1``."""


class DirectionSample(Frozen):
    """One direction of one trial. Latencies in ns, all of one fio distribution (``lat`` unless
    the run says ``clat``: see the module's docstring)."""

    direction: str
    """read or write."""
    iops: float
    """I/O operations per second."""
    bw_bytes: float
    """Bandwidth, bytes per second."""
    io_bytes: int
    """Bytes transferred in the measured window."""
    total_ios: int
    """Requests completed in the measured window."""
    runtime_ms: int
    """The measured window, ms (the ramp excluded)."""
    lat_mean_ns: float | None = None
    """Mean latency, ns."""
    lat_stdev_ns: float | None = None
    """Standard deviation of the latency, ns."""
    lat_min_ns: float | None = None
    """Lowest latency, ns."""
    lat_max_ns: float | None = None
    """Highest latency, ns."""
    p50_ns: float | None = None
    """Median latency, ns."""
    p90_ns: float | None = None
    """90th percentile of the latency, ns."""
    p99_ns: float | None = None
    """99th percentile of the latency, ns."""
    p99_9_ns: float | None = None
    """99.9th percentile of the latency, ns."""
    p99_99_ns: float | None = None
    """99.99th percentile of the latency, ns."""
    vm: int | None = None
    """Which guest, in a per-guest sample of a trial that ran on several; None otherwise."""

    @classmethod
    def from_stats(cls, direction: str, stats: DirectionStats,
                   percentiles: Percentiles | None = None, vm: int | None = None, *,
                   latency: LatencyKind = DEFAULT_LATENCY) -> "DirectionSample":
        """The sample of one direction, its latency figures all of ``latency``'s distribution;
        ``percentiles`` (of that distribution, e.g. from merged histograms) replace fio's."""
        dist = distribution(stats, latency)
        pct = percentiles if percentiles is not None else (dist.percentiles if dist else None)
        return cls(direction=direction, vm=vm, iops=stats.iops, bw_bytes=stats.bw_bytes,
                   io_bytes=stats.io_bytes, total_ios=stats.total_ios,
                   runtime_ms=stats.runtime_ms,
                   lat_mean_ns=dist.mean_ns if dist else None,
                   lat_stdev_ns=dist.stdev_ns if dist else None,
                   lat_min_ns=dist.min_ns if dist else None,
                   lat_max_ns=dist.max_ns if dist else None,
                   p50_ns=pct.p50 if pct else None, p90_ns=pct.p90 if pct else None,
                   p99_ns=pct.p99 if pct else None, p99_9_ns=pct.p99_9 if pct else None,
                   p99_99_ns=pct.p99_99 if pct else None)


def distribution(stats: DirectionStats, latency: LatencyKind) -> Latency | None:
    """``stats``'s ``lat`` or ``clat`` distribution (None where fio did not measure it)."""
    if latency not in LATENCIES:
        raise ValueError(f"latency {latency!r}: choose lat or clat")
    return stats.lat if latency == "lat" else stats.clat


def has_percentiles(stats: DirectionStats, latency: LatencyKind) -> bool:
    """Whether fio computed percentiles of ``latency``'s distribution for this direction."""
    dist = distribution(stats, latency)
    return dist is not None and dist.percentiles.p50 is not None


def merged_percentiles(stats: Sequence[DirectionStats],
                       latency: LatencyKind) -> Percentiles | None:
    """The percentiles of several directions' I/Os together (jobs or clients that ran at once,
    or the two directions of a mixed workload), from their merged json+ histograms of
    ``latency``'s distribution; None unless every active one has its histogram."""
    active = [s for s in stats if s.active]
    histograms = [d.bins if (d := distribution(s, latency)) is not None else None for s in active]
    if not histograms or any(h is None for h in histograms):
        return None
    return percentiles_from_bins(merge_bins(h for h in histograms if h is not None))


def mixed_percentiles(read: DirectionStats, write: DirectionStats,
                      latency: LatencyKind = DEFAULT_LATENCY) -> Percentiles | None:
    """The true percentiles of a mixed workload's reads and writes together, from both
    directions' json+ histograms; None without them (never an average of the two)."""
    if not (read.active and write.active):
        return None
    return merged_percentiles([read, write], latency)


def samples_of(result: FioResult,
               latency: LatencyKind = DEFAULT_LATENCY) -> tuple[DirectionSample, ...]:
    """The active directions of a fio result: of its one job, or of the "All clients" aggregate,
    whose percentiles come from the clients' merged json+ histograms where fio gives none."""
    if result.aggregate is None:
        job = result.jobs[0]
        return tuple(DirectionSample.from_stats(name, stats, latency=latency)
                     for name, stats in (("read", job.read), ("write", job.write)) if stats.active)
    out = []
    for name in ("read", "write"):
        stats: DirectionStats = getattr(result.aggregate, name)
        if not stats.active:
            continue
        pct = None
        if not has_percentiles(stats, latency):
            pct = merged_percentiles([getattr(j, name) for j in result.jobs], latency)
        out.append(DirectionSample.from_stats(name, stats, percentiles=pct, latency=latency))
    return tuple(out)


def vm_samples_of(result: FioResult, clients: Sequence[int | str],
                  latency: LatencyKind = DEFAULT_LATENCY) -> tuple[DirectionSample, ...]:
    """Each client's own samples (a guest's, or a cluster node's) when several fio clients ran;
    none for one. fio lists clients in the order their results arrive, so each is matched to
    its place in ``clients`` by its server's address: a port (servers on a loopback) or a Unix
    socket's path (which fio reports as the client's hostname). FioParseError when a client
    has no result: fio's client can end well with the results of the servers that stayed (and
    without an aggregate, with one left), which are not the trial's."""
    if len(clients) < 2:
        return ()
    out = []
    for index, client in enumerate(clients):
        job = client_job(result, client)
        if job is None:
            raise FioParseError(f"fio returned no result for the client at {client}")
        out += [DirectionSample.from_stats(name, stats, vm=index, latency=latency)
                for name, stats in (("read", job.read), ("write", job.write)) if stats.active]
    return tuple(out)


def client_job(result: FioResult, client: int | str) -> JobStats | None:
    """The result of the client whose server is at ``client`` (a port, or a Unix socket's path),
    None when fio returned none for it."""
    return next((job for job in result.jobs
                 if (job.hostname if isinstance(client, str) else job.port) == client), None)


def start_skew_ms(result: FioResult) -> int | None:
    """How far apart (ms) the clients of one multi-client run started their jobs, from each
    job's start time by its own host's clock (so it includes the hosts' clock offsets); None
    for one client or from fio before 3.36, which reports no start time."""
    starts = [job.job_start_ms for job in result.jobs]
    if len(starts) < 2 or any(s is None for s in starts):
        return None
    known = [s for s in starts if s is not None]
    return max(known) - min(known)
