"""Typed fio results. Parsed once at the edge (``iomatrix.fio.parse``); nothing downstream sees
fio's JSON. Times are nanoseconds, bandwidth bytes per second, CPU percent of one core as fio
reports it."""

from __future__ import annotations

from iomatrix.core.model import Frozen


class Percentiles(Frozen):
    """Latency percentiles in ns; None where fio did not report that percentile."""

    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    p99_9: float | None = None
    p99_99: float | None = None


class Latency(Frozen):
    """One latency distribution (fio's lat_ns, clat_ns or slat_ns), with the percentiles and the
    json+ histogram fio computed of this distribution (never of another one)."""

    min_ns: float
    max_ns: float
    mean_ns: float
    stdev_ns: float
    percentiles: Percentiles = Percentiles()
    bins: tuple[tuple[int, int], ...] | None = None
    """json+ histogram of this distribution: (upper bound ns, count) pairs, when fio wrote it."""


class DirectionStats(Frozen):
    """What fio measured in one direction (read or write) of one job."""

    io_bytes: int
    total_ios: int
    runtime_ms: int
    iops: float
    bw_bytes: float
    lat: Latency | None
    """Total latency (submission + completion); None when fio did not report it."""
    clat: Latency | None
    """Completion latency."""
    percentile_source: str | None = None
    """The distribution fio computed percentiles of, "lat" preferred when it did of both;
    None when it computed none."""
    bins: tuple[tuple[int, int], ...] | None = None
    """json+ histogram of ``percentile_source``'s distribution (each ``Latency`` has its own)."""

    @property
    def active(self) -> bool:
        return self.total_ios > 0


class JobStats(Frozen):
    """One job group of fio's output (or one client's, or the "All clients" aggregate)."""

    name: str
    hostname: str | None = None
    port: int | None = None
    error: int = 0
    job_runtime_ms: int = 0
    read: DirectionStats
    write: DirectionStats
    usr_cpu: float
    sys_cpu: float
    ctx: int
    majf: int = 0
    minf: int = 0
    job_start_ms: int | None = None
    """When the job started, ms since 1970 by its host's clock (fio >= 3.36 writes it; None
    before): how far apart the clients of one trial started."""
    depth_levels: tuple[tuple[int, float], ...] = ()
    """fio's ``iodepth_level``: (least depth of the bucket, % of I/Os issued at it), buckets 1,
    2, 4, 8, 16, 32 and 64 (">=64"); empty where fio wrote none (``iomatrix.fio.depth``)."""


class FioResult(Frozen):
    """One fio invocation's result."""

    fio_version: str
    timestamp: int | None
    """When fio finished (Unix time); None from fio before 2.2.8, which wrote none."""
    jobs: tuple[JobStats, ...]
    """Per job (or per client in client/server mode); never includes the aggregate."""
    aggregate: JobStats | None = None
    """fio's "All clients" entry, present with more than one client."""
    prelude: str = ""
    """Text fio printed before the JSON (client/server progress lines), kept for diagnosis."""
