"""Samples → points. A point is every ok sample of one (configuration, workload); its figures are
arithmetic means over samples. Within a sample, read and write IOPS and bandwidth add up, mean
latencies are their I/O-weighted mean (the mean of all the sample's I/Os), and percentiles are
never averaged: a mixed workload's point has no percentile of its own (None), and each direction's
figures, percentiles included, are in ``Point.directions`` (``metrics.Metric.combine``)."""

from __future__ import annotations

from collections import defaultdict
from statistics import fmean

from iomatrix.analysis.metrics import METRICS, combined, get_metric
from iomatrix.analysis.stats import Interval, confidence_interval
from iomatrix.fio.samples import DirectionSample
from iomatrix.store.records import StoredRun, TrialRecord
from iomatrix.telemetry.pagecache import DeviceShare, mean_share, uses_page_cache
from iomatrix.core.model import Frozen
from iomatrix.vocab.words import TrialStatus


class DirectionFigures(Frozen):
    """One direction (read or write) of a mixed workload's point: means over the samples that
    measured it, and each metric's per-sample values (by metric key)."""

    iops: float | None = None
    bw_bytes: float | None = None
    lat_mean_ns: float | None = None
    lat_p50_ns: float | None = None
    lat_p99_ns: float | None = None
    values: dict[str, tuple[float, ...]] = {}


class Point(Frozen):
    config_key: str
    workload_key: str
    samples: int
    failed: int
    read_iops: float | None
    write_iops: float | None
    iops: float | None
    bw_bytes: float | None
    lat_mean_ns: float | None
    lat_p50_ns: float | None
    """Percentiles: of the point's one direction; None for a mixed workload (``directions``)."""
    lat_p99_ns: float | None
    usr_cpu: float | None
    sys_cpu: float | None
    iops_ci: Interval | None = None
    """95 % confidence interval of the mean IOPS (t, or bootstrap when skewed); None below 2
    samples."""
    iops_samples: tuple[float, ...] = ()
    """Each ok sample's IOPS (read + write), in trial order: what significance tests compare."""
    bw_samples: tuple[float, ...] = ()
    lat_mean_samples: tuple[float, ...] = ()
    """Each ok sample's mean latency (ns) where fio reported one."""
    lat_p99_samples: tuple[float, ...] = ()
    cpu_us_per_io: float | None = None
    """Mean over samples of the host CPU time (every process iomatrix started) per I/O, in µs."""
    steady_checked: int = 0
    """Samples whose steady state was checked, and of those, how many reached it."""
    steady_reached: int = 0
    directions: dict[str, DirectionFigures] = {}
    """A mixed workload's directions ("read", "write") each on its own; empty when the point's
    samples measured one direction."""
    stalled: int = 0
    """Its ok trials that stalled (``iomatrix.analysis.stalls``): left out of ``samples`` and
    every figure unless the run was loaded with them (``StoredRun.with_stalled``)."""
    device_share: DeviceShare | None = None
    """A configuration that uses the host page cache: the share of fio's read and write bytes
    that reached the target's device, mean over the samples (``iomatrix.telemetry.pagecache``);
    None for direct I/O."""

    @property
    def from_ram(self) -> bool:
        """Mostly served from the host page cache (``iomatrix.analysis.pagecache.RULE``)."""
        return self.device_share is not None and self.device_share.from_ram

    @property
    def mixed(self) -> bool:
        """Whether the point measured reads and writes (its percentiles are per direction)."""
        return bool(self.directions)

    def values(self, metric: str, direction: str | None = None) -> tuple[float, ...]:
        """The per-sample values of ``metric`` (a key of ``metrics.METRICS``), of the point or of
        one of its ``directions``."""
        if direction is not None:
            figures = self.directions.get(direction)
            return figures.values.get(get_metric(metric).key, ()) if figures else ()
        return getattr(self, _SAMPLES.get(metric) or get_metric(metric).samples)


_SAMPLES = {m.key: m.samples for m in METRICS.values()}   # a dict: effects asks millions of times


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return fmean(present) if present else None


def _direction(trial: TrialRecord, name: str) -> float | None:
    return next((s.iops for s in trial.samples if s.direction == name), None)


def _directions(ok: list[TrialRecord]) -> dict[str, DirectionFigures]:
    """Each direction of a mixed workload's samples on its own; empty unless some sample
    measured both."""
    if not any(len(t.samples) > 1 for t in ok):
        return {}
    out = {}
    for name in ("read", "write"):
        mine = [s for t in ok for s in t.samples if s.direction == name]
        values = {m.key: tuple(v for s in mine if (v := getattr(s, m.sample_field)) is not None)
                  for m in METRICS.values()}
        out[name] = DirectionFigures(
            iops=_mean([s.iops for s in mine]), bw_bytes=_mean([s.bw_bytes for s in mine]),
            lat_mean_ns=_mean([s.lat_mean_ns for s in mine]),
            lat_p50_ns=_mean([s.p50_ns for s in mine]),
            lat_p99_ns=_mean([s.p99_ns for s in mine]), values=values)
    return out


_Figures = dict[str, float | tuple[float, ...] | None]
"""A point's figures by ``Point`` field: a mean (None: none measured), or per-sample values."""


def _figures(ok: list[TrialRecord]) -> _Figures:
    """A point's figures from its ok trials: each metric's mean and per-sample values
    (``Metric.of_sample``), its read and write IOPS and its p50."""
    figures: _Figures = {}
    for metric in METRICS.values():
        values = [v for t in ok if (v := metric.of_sample(t.samples)) is not None]
        figures[metric.key] = fmean(values) if values else None
        figures[metric.samples] = tuple(values)
    return figures | {
        "read_iops": _mean([_direction(t, "read") for t in ok]),
        "write_iops": _mean([_direction(t, "write") for t in ok]),
        "lat_p50_ns": _mean([combined(t.samples, "p50_ns", "percentile") for t in ok])}


def _one_direction(samples: list[DirectionSample]) -> _Figures:
    """``_figures`` of trials that each measured one direction (``samples``, one a trial), as
    ``combined`` computes them, without a call per trial and figure: 10,000 points are 40,000
    figures. Of one direction, a rate's sum is 0.0 + the rate (what ``sum`` adds), a weighted
    mean (0.0 + value × I/Os) / I/Os, a percentile the direction's own."""
    figures: _Figures = {}
    for metric in METRICS.values():
        field = metric.sample_field
        if metric.combine == "sum":
            values = [0.0 + getattr(s, field) for s in samples]
        elif metric.combine == "percentile":
            values = [v for s in samples if (v := getattr(s, field)) is not None]
        else:
            values = [(0.0 + v * s.total_ios) / s.total_ios for s in samples
                      if (v := getattr(s, field)) is not None and s.total_ios]
        figures[metric.key] = fmean(values) if values else None
        figures[metric.samples] = tuple(values)
    return figures | {
        "read_iops": _mean([s.iops if s.direction == "read" else None for s in samples]),
        "write_iops": _mean([s.iops if s.direction == "write" else None for s in samples]),
        "lat_p50_ns": _mean([s.p50_ns for s in samples])}


def _checked(trial: TrialRecord) -> bool:
    return trial.steady is not None and trial.steady.checked


_CACHE: dict[int, tuple[StoredRun, list[Point]]] = {}
_CACHE_SIZE = 8
_SUBSETS: dict[tuple[int, frozenset[str]], tuple[StoredRun, StoredRun]] = {}


def points(run: StoredRun) -> list[Point]:
    """One point per (configuration, workload) that has trials, in the run's order.

    A stored run is immutable, so the points of the last few runs asked for are kept (by object
    identity, holding the run so that its id cannot be reused): the report, effects, scores and
    recommend each ask for them, and a 10,000-point run takes seconds to reduce."""
    cached = _CACHE.get(id(run))
    if cached is not None and cached[0] is run:
        return list(cached[1])
    found = _points(run)
    if len(_CACHE) >= _CACHE_SIZE:
        _CACHE.pop(next(iter(_CACHE)))
    _CACHE[id(run)] = (run, found)
    return list(found)


def only_configs(run: StoredRun, keys: set[str]) -> StoredRun:
    """``run`` restricted to the configurations ``keys`` and their trials. Its points are those
    of ``run`` for those configurations (a point depends on its own trials only), so they are
    taken from there rather than reduced again. The same restriction asked again is the same
    object, so that what is kept per run object (gains) is found again: ``recommend`` restricts
    the run to each mode once per platform."""
    key = (id(run), frozenset(keys))
    kept = _SUBSETS.get(key)
    if kept is not None and kept[0] is run:
        return kept[1]
    sub = run.model_copy(update={"configs": tuple(c for c in run.configs if c.key in keys),
                                 "trials": tuple(t for t in run.trials if t.config_key in keys)})
    found = [p for p in points(run) if p.config_key in keys]
    if len(_CACHE) >= _CACHE_SIZE:
        _CACHE.pop(next(iter(_CACHE)))
    _CACHE[id(sub)] = (sub, found)
    if len(_SUBSETS) >= _CACHE_SIZE:
        _SUBSETS.pop(next(iter(_SUBSETS)))
    _SUBSETS[key] = (run, sub)
    return sub


def _points(run: StoredRun) -> list[Point]:
    groups: dict[tuple[str, str], list[TrialRecord]] = defaultdict(list)
    suite = run.suite.suite
    # network storage QEMU reaches with a client of its own (librbd, libiscsi) has no host
    # page cache between: its points are not judged for [RAM]
    page_cache = suite is None or suite.target.host_page_cache
    for trial in run.trials:
        groups[(trial.config_key, trial.workload_key)].append(trial)
    out = []
    for config in run.configs:
        for workload in run.workloads:
            trials = groups.get((config.key, workload.key))
            if not trials:
                continue
            ok = [t for t in trials if t.status == TrialStatus.OK]
            stalls = sum(1 for t in ok if t.stalled)
            if stalls and not run.with_stalled:
                ok = [t for t in ok if not t.stalled]
            one = [t.samples[0] for t in ok if len(t.samples) == 1]
            if len(one) == len(ok):
                figures, directions = _one_direction(one), {}
            else:
                figures, directions = _figures(ok), _directions(ok)
            out.append(Point(
                config_key=config.key, workload_key=workload.key, samples=len(ok),
                stalled=stalls, failed=sum(1 for t in trials if t.status != TrialStatus.OK),
                usr_cpu=_mean([t.usr_cpu for t in ok]),
                sys_cpu=_mean([t.sys_cpu for t in ok]),
                iops_ci=confidence_interval(figures["iops_samples"]) if len(ok) >= 2 else None,
                **figures,
                cpu_us_per_io=_mean([t.cpu.cpu_us_per_io if t.cpu else None for t in ok]),
                steady_checked=sum(1 for t in ok if _checked(t)),
                steady_reached=sum(1 for t in ok if t.steady is not None and t.steady.reached),
                directions=directions,
                device_share=(mean_share(t.device_share for t in ok if t.device_share)
                              if page_cache and uses_page_cache(config.mode, config.params)
                              else None),
            ))
    return out
