"""One job group of a fio result (fio's ``groupid``: jobs that ran at once) as iomatrix stores
it: its one workload, from the jobs' options as fio read them, and its samples, the jobs summed
as fio's ``group_reporting`` sums them (``iomatrix.store.ingest`` reads the results)."""

from __future__ import annotations

import math
from collections.abc import Mapping

from iomatrix.core.units import fio_size
from iomatrix.fio.models import DirectionStats, FioResult, JobStats
from iomatrix.fio.parse import JobSection
from iomatrix.fio.samples import (DEFAULT_LATENCY, DirectionSample, LatencyKind, distribution,
                                  merged_percentiles, samples_of)
from iomatrix.suite.workloads import Workload

# Engines fio runs at queue depth 1 whatever iodepth says ("queue depth will be capped at 1").
SYNC_ENGINES = frozenset({"sync", "psync", "vsync", "pvsync", "pvsync2", "mmap", "splice"})
DEFAULT_ENGINE = "psync"  # fio's default on Linux when a job names none
FIO_UINT = 2**32 - 1
"""The largest iodepth, numjobs or rate_iops: fio keeps them in unsigned ints."""
_TRUE = {"", "1", "true", "yes", "on"}


class Unsupported(Exception):
    """A job group iomatrix cannot store as one workload; the message says why."""


def group_workload(members: list[tuple[JobSection, JobStats]],
                   options: list[dict[str, str]], *,
                   clients_per_host: bool) -> tuple[Workload, Workload, list[str]]:
    """The one workload of a job group as fio ran it, as its options asked for it, and notes on
    where the two differ."""
    shapes = {_shape(opts): opts for opts in options}
    if len(shapes) > 1:
        described = " and ".join(sorted({_describe(s) for s in shapes}))
        raise Unsupported(f"its jobs ran different workloads at once ({described}); "
                          "iomatrix stores one workload per trial")
    (shape, opts), = shapes.items()
    rw, bs, iodepth, rate_iops, extra = shape
    # numjobs: clones of one job share its name; each job section counts its own numjobs.
    host_of = (lambda job: (job.hostname, job.port)) if clients_per_host else (lambda job: None)
    first_host = host_of(members[0][1])
    names: dict[str, int] = {}
    for (_, job), o in zip(members, options):
        if host_of(job) == first_host:
            names.setdefault(job.name, _positive(o.get("numjobs", "1"), "numjobs"))
    numjobs = sum(names.values())
    asked = Workload(rw=rw, bs=bs, iodepth=iodepth, numjobs=numjobs, rate_iops=rate_iops,
                     options=extra)
    engine = opts.get("ioengine") or DEFAULT_ENGINE
    if iodepth > 1 and engine.split(":")[0] in SYNC_ENGINES:
        note = (f"iodepth={iodepth} with the synchronous engine {engine}: stored as QD1, "
                "as fio ran it")
        return asked.model_copy(update={"iodepth": 1}), asked, [note]
    return asked, asked, []


_Shape = tuple[str, int, int, int, tuple[tuple[str, str], ...]]


def _shape(opts: Mapping[str, str]) -> _Shape:
    """(rw, bs, iodepth, rate_iops, extra options) of one job's options."""
    rw = (opts.get("rw") or opts.get("readwrite") or "read").split(":")[0].strip()
    rw = "rw" if rw == "readwrite" else rw  # one fio workload, two names
    for key in ("bsrange", "bssplit", "blocksize_range"):
        if opts.get(key):
            raise Unsupported(f"mixed block sizes ({key}={opts[key]}): a workload has one bs")
    bs = _one_value(opts.get("bs") or opts.get("blocksize") or "4k", "bs")
    if "-" in bs or ":" in bs:
        raise Unsupported(f"a range of block sizes (bs={bs}): a workload has one bs")
    try:       # fio's text, read as fio read it (4KiB is 4000 bytes under kb_base=1024)
        bs_bytes = fio_size(bs, kb_base=int(opts.get("kb_base") or 1024))
    except ValueError:
        raise Unsupported(f"block size {bs!r} is not a size iomatrix reads") from None
    iodepth = _positive(opts.get("iodepth", "1"), "iodepth")
    rate_iops = _positive(_one_value(opts.get("rate_iops", "0"), "rate_iops") or "0",
                          "rate_iops", least=0)
    extra: dict[str, str] = {}
    if rw in ("rw", "randrw"):
        if opts.get("rwmixread"):
            extra["rwmixread"] = str(_positive(opts["rwmixread"], "rwmixread", least=0, most=100))
        elif opts.get("rwmixwrite"):
            extra["rwmixread"] = str(100 - _positive(opts["rwmixwrite"], "rwmixwrite", least=0,
                                                     most=100))
        else:
            extra["rwmixread"] = "50"
    if opts.get("ioengine"):
        extra["ioengine"] = opts["ioengine"]
    direct = (opts.get("direct", "0").strip().lower() in _TRUE
              or opts.get("buffered", "1").strip().lower() not in _TRUE)
    if not direct:
        extra["direct"] = "0"
    for key in ("rate", "fsync", "fdatasync"):
        if opts.get(key) and opts[key] != "0":
            extra[key] = opts[key]
    return rw, bs_bytes, iodepth, rate_iops, tuple(sorted(extra.items()))


def _describe(shape: _Shape) -> str:
    rw, bs, iodepth, _, _ = shape
    return f"{rw} bs={bs} iodepth={iodepth}"


def _one_value(text: str, key: str) -> str:
    """fio's "read,write[,trim]" option values: one value, or the same for every direction."""
    values = {v.strip() for v in str(text).split(",") if v.strip()}
    if len(values) > 1:
        raise Unsupported(f"different values per direction ({key}={text}): a workload has one")
    return values.pop() if values else ""


def group_samples(result: FioResult, jobs: list[JobStats], client: bool, groups: int,
                  latency: LatencyKind = DEFAULT_LATENCY) -> tuple[DirectionSample, ...]:
    """The group's samples, of ``latency``: fio's own figures for one job (or fio's "All
    clients" aggregate), otherwise the jobs summed as group_reporting would."""
    if client and result.aggregate is not None and groups == 1:
        return samples_of(result, latency)
    if len(jobs) == 1:
        return tuple(DirectionSample.from_stats(name, stats, latency=latency) for name, stats in
                     (("read", jobs[0].read), ("write", jobs[0].write)) if stats.active)
    out = []
    for name in ("read", "write"):
        stats = [getattr(j, name) for j in jobs]
        if any(s.active for s in stats):
            out.append(_summed(name, stats, latency))
    return tuple(out)


def _summed(direction: str, stats: list[DirectionStats],
            latency: LatencyKind = DEFAULT_LATENCY) -> DirectionSample:
    """Jobs that ran at once, as one: counts and rates add up; latency moments are pooled over
    the I/Os of every job; percentiles come from the merged json+ histograms, and are absent
    without them (percentiles of different jobs cannot be combined)."""
    active = [s for s in stats if s.active]
    lats = [(distribution(s, latency), s.total_ios) for s in active]
    lat_mean = lat_stdev = lat_min = lat_max = None
    if all(lat is not None for lat, _ in lats):
        n = sum(count for _, count in lats)
        lat_mean = sum(lat.mean_ns * count for lat, count in lats if lat) / n
        variance = sum(count * (lat.stdev_ns ** 2 + (lat.mean_ns - lat_mean) ** 2)
                       for lat, count in lats if lat) / n
        lat_stdev = math.sqrt(variance)
        lat_min = min(lat.min_ns for lat, _ in lats if lat)
        lat_max = max(lat.max_ns for lat, _ in lats if lat)
    pct = merged_percentiles(active, latency)
    return DirectionSample(
        direction=direction, iops=sum(s.iops for s in stats),
        bw_bytes=sum(s.bw_bytes for s in stats),
        io_bytes=sum(s.io_bytes for s in stats), total_ios=sum(s.total_ios for s in stats),
        runtime_ms=max(s.runtime_ms for s in stats), lat_mean_ns=lat_mean, lat_stdev_ns=lat_stdev,
        lat_min_ns=lat_min, lat_max_ns=lat_max,
        p50_ns=pct.p50 if pct else None, p90_ns=pct.p90 if pct else None,
        p99_ns=pct.p99 if pct else None, p99_9_ns=pct.p99_9 if pct else None,
        p99_99_ns=pct.p99_99 if pct else None)


def _number(text: str, key: str) -> float:
    try:
        return float(str(text).strip())
    except ValueError:
        raise Unsupported(f"{key}={text!r} is not a number") from None


def _positive(text: str, key: str, *, least: int = 1, most: int = FIO_UINT) -> int:
    value = _number(text, key)
    if not least <= value <= most or not value.is_integer():
        raise Unsupported(f"{key}={str(text)[:40]!r} is not a whole number from {least} to "
                          f"{most}")
    return int(value)
