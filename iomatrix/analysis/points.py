"""Samples → points. A point is every ok sample of one (configuration, workload); its figures are
arithmetic means over samples. Within a sample, read and write IOPS and bandwidth add up; latency
figures are the I/O-count-weighted mean of the two directions (exact for single-direction
workloads, an approximation for mixed ones, whose per-direction figures stay in the export)."""

from __future__ import annotations

from collections import defaultdict
from statistics import fmean
from typing import Any

from iomatrix.analysis.metrics import METRICS, get_metric
from iomatrix.analysis.stats import Interval, confidence_interval
from iomatrix.fio.samples import DirectionSample
from iomatrix.store.records import StoredRun, TrialRecord
from iomatrix.core.model import Frozen


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

    def values(self, metric: str) -> tuple[float, ...]:
        """The per-sample values of ``metric`` (a key of ``metrics.METRICS``)."""
        return getattr(self, _SAMPLES.get(metric) or get_metric(metric).samples)


_SAMPLES = {m.key: m.samples for m in METRICS.values()}   # a dict: effects asks millions of times


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return fmean(present) if present else None


def _weighted(samples: tuple[DirectionSample, ...], field: str) -> float | None:
    pairs = [(getattr(s, field), s.total_ios) for s in samples if getattr(s, field) is not None]
    total = sum(n for _, n in pairs)
    return sum(v * n for v, n in pairs) / total if total else None


def _direction(trial: TrialRecord, name: str) -> float | None:
    return next((s.iops for s in trial.samples if s.direction == name), None)


def _checked(trial: TrialRecord) -> bool:
    return trial.steady is not None and trial.steady.checked


_CACHE: dict[int, tuple[StoredRun, list[Point]]] = {}
_CACHE_SIZE = 8


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
    taken from there rather than reduced again."""
    sub = run.model_copy(update={"configs": tuple(c for c in run.configs if c.key in keys),
                                 "trials": tuple(t for t in run.trials if t.config_key in keys)})
    found = [p for p in points(run) if p.config_key in keys]
    if len(_CACHE) >= _CACHE_SIZE:
        _CACHE.pop(next(iter(_CACHE)))
    _CACHE[id(sub)] = (sub, found)
    return sub


def _points(run: StoredRun) -> list[Point]:
    groups: dict[tuple[str, str], list[TrialRecord]] = defaultdict(list)
    for trial in run.trials:
        groups[(trial.config_key, trial.workload_key)].append(trial)
    out = []
    for config in run.configs:
        for workload in run.workloads:
            trials = groups.get((config.key, workload.key))
            if not trials:
                continue
            ok = [t for t in trials if t.status == "ok"]
            figures: dict[str, Any] = {}   # each metric's mean and per-sample values
            for metric in METRICS.values():
                field = metric.sample_field
                if metric.additive:   # a rate: the directions add up
                    values = [sum(getattr(s, field) for s in t.samples) for t in ok]
                else:                 # a latency: the directions' I/O-weighted mean
                    values = [v for t in ok if (v := _weighted(t.samples, field)) is not None]
                figures[metric.key] = fmean(values) if values else None
                figures[metric.samples] = tuple(values)
            out.append(Point(
                config_key=config.key, workload_key=workload.key, samples=len(ok),
                failed=len(trials) - len(ok),
                read_iops=_mean([_direction(t, "read") for t in ok]),
                write_iops=_mean([_direction(t, "write") for t in ok]),
                lat_p50_ns=_mean([_weighted(t.samples, "p50_ns") for t in ok]),
                usr_cpu=_mean([t.usr_cpu for t in ok]),
                sys_cpu=_mean([t.sys_cpu for t in ok]),
                iops_ci=confidence_interval(figures["iops_samples"]) if len(ok) >= 2 else None,
                **figures,
                cpu_us_per_io=_mean([t.cpu.cpu_us_per_io if t.cpu else None for t in ok]),
                steady_checked=sum(1 for t in ok if _checked(t)),
                steady_reached=sum(1 for t in ok if t.steady is not None and t.steady.reached),
            ))
    return out
