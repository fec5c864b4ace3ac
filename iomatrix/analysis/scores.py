"""Normalized scores (seed 002): one number per configuration from several figures, lower is better.

Seed 002 measures four figures per configuration, each on its own fio workload, and combines them:

    iops       IOPS of 512 B random reads at QD128 (higher is better)
    bw_bytes   bandwidth of 1 MiB random reads at QD32 (higher is better)
    qd1_lat    mean latency of 512 B sequential reads at QD1 (lower is better)
    qd128_lat  mean latency of 512 B random reads at QD128 (lower is better)

Each figure is min-max (unity-based) normalized across the configurations of the run and the
score is the Euclidean magnitude of the normalized vector. Seed 002 writes the normalization as
(x − min)/(max − min) for every figure yet says lower scores are better; here every component is
oriented so that 0 is the best configuration and 1 the worst: (max − x)/(max − min) where higher
is better, (x − min)/(max − min) where lower is. A figure equal for every configuration
normalizes to 0 for all (it cannot tell them apart).

When a run lacks a seed workload, the nearest one stands in and a note says which: the highest
queue depth present for QD128, the lowest for QD1, the largest block size for 1 MiB, the queue
depth closest to 32 for bandwidth, random reads for sequential ones and the reverse, writes when
there are no reads. Rate-limited workloads stand in only when nothing else is left. A metric may
also name its workload: ``FIGURE@WORKLOAD`` (figure iops, bw_bytes, lat_mean_ns or lat_p99_ns;
workload a key or label of the run), and ``qd1_p99``/``qd128_p99`` use the p99 latency.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


from iomatrix.analysis.ioping import is_ioping
from iomatrix.analysis.metrics import METRICS, Metric, get_metric, metric_named
from iomatrix.analysis.points import Point, points
from iomatrix.core.errors import AnalysisError
from iomatrix.store.records import StoredRun, WorkloadRecord
from iomatrix.core.units import format_size
from iomatrix.core.model import Frozen
from iomatrix.vocab.words import Mode

DEFAULT_METRICS = ("iops", "bw_bytes", "qd1_lat", "qd128_lat")
_RANDOM_FIRST = ("randread", "read", "randrw", "rw", "readwrite", "randwrite", "write")
_SEQUENTIAL_FIRST = ("read", "randread", "randrw", "rw", "readwrite", "write", "randwrite")
_MIB = 1 << 20

METHOD = ("Each metric is min-max normalized across the {n} configurations scored in this run "
          "(unity-based, as in seed 002) and oriented so that 0 is the best configuration and 1 "
          "the worst: (max − x)/(max − min) for IOPS and bandwidth, (x − min)/(max − min) for "
          "latency. The score is the Euclidean magnitude √(Σ component²) of the {k} components, "
          "weighted equally: 0 is best on every metric, √{k} ≈ {top:.2f} worst on every one. "
          "Lower is better.")
CAVEAT = ("Scores compare configurations only within this run: the minimum and maximum come from "
          "this run's configurations, so a score means nothing beside another run's, and adding "
          "or removing a configuration changes every score. Normalization also drops the size of "
          "each spread (a 1 % spread in one metric weighs as much as a 3× spread in another), and "
          "scores use point means only: configurations whose figures differ by less than their "
          "confidence intervals still get different scores.")


@dataclass(frozen=True)
class _Spec:
    """How a named metric picks its workload (seed 002's, or the nearest the run has)."""

    figure: str
    rw: tuple[str, ...]
    bs: int
    iodepth: int
    bs_first: bool           # pick the block size before the queue depth (bandwidth)


_SPECS = {
    "iops": _Spec("iops", _RANDOM_FIRST, 512, 128, False),
    "bw_bytes": _Spec("bw_bytes", _RANDOM_FIRST, _MIB, 32, True),
    "qd1_lat": _Spec("lat_mean_ns", _SEQUENTIAL_FIRST, 512, 1, False),
    "qd128_lat": _Spec("lat_mean_ns", _RANDOM_FIRST, 512, 128, False),
    "qd1_p99": _Spec("lat_p99_ns", _SEQUENTIAL_FIRST, 512, 1, False),
    "qd128_p99": _Spec("lat_p99_ns", _RANDOM_FIRST, 512, 128, False),
}
_SPECS["bw"] = _SPECS["bw_bytes"]


class Component(Frozen):
    """One metric of the score: which figure of which workload, and its range in this run."""

    name: str
    """As asked: iops, bw_bytes, qd1_lat, qd128_lat, … or FIGURE@WORKLOAD."""
    figure: str
    """A key of ``metrics.METRICS``: the figure taken from the workload."""
    workload: str
    """Key of the workload the figure is taken from."""
    label: str
    """E.g. "IOPS · 512 randread QD128"."""
    lower_is_better: bool
    minimum: float | None
    maximum: float | None
    constant: bool
    """Every configuration has the same figure: the component is 0 for all."""


class ScoreRow(Frozen):
    """One configuration: its figures, their normalized components (0 best, 1 worst) and score."""

    config_key: str
    label: str
    values: dict[str, float | None]
    """Component name → the point's mean figure (None: not measured)."""
    normalized: dict[str, float | None]
    score: float | None
    """Euclidean magnitude of the components; None when a figure is missing."""
    rank: int | None
    """1 = best; equal scores share a rank."""


class ScoreTable(Frozen):
    """A run's configurations scored as seed 002 does, best first, with the method and caveat."""

    run_id: int
    components: tuple[Component, ...]
    rows: tuple[ScoreRow, ...]
    method: str
    caveat: str
    notes: tuple[str, ...]
    emulated: bool


def _nearest(values: Sequence[int], target: int) -> int:
    """The value closest to ``target`` on a log scale; the larger on a tie."""
    return min(values, key=lambda v: (abs(math.log2(v / target)), -v))


def _pick(name: str, spec: _Spec, candidates: list[WorkloadRecord]) -> tuple[WorkloadRecord, list[str]]:
    """The workload ``spec`` asks for, or its nearest stand-in, and what was substituted."""
    unlimited = [w for w in candidates if not w.rate_iops]
    pool = unlimited or candidates
    rw = next((r for r in spec.rw if any(w.rw == r for w in pool)), pool[0].rw)
    pool = [w for w in pool if w.rw == rw]
    jobs = min(w.numjobs for w in pool)
    pool = [w for w in pool if w.numjobs == jobs]

    def by_bs(ws: list[WorkloadRecord]) -> list[WorkloadRecord]:
        sizes = sorted({w.bs for w in ws})
        if spec.bs in sizes:
            bs = spec.bs
        else:
            bs = sizes[-1] if spec.bs == _MIB else sizes[0]
        return [w for w in ws if w.bs == bs]

    def by_qd(ws: list[WorkloadRecord]) -> list[WorkloadRecord]:
        depths = sorted({w.iodepth for w in ws})
        if spec.iodepth in depths:
            qd = spec.iodepth
        elif spec.bs_first:
            qd = _nearest(depths, spec.iodepth)
        else:
            qd = depths[0] if spec.iodepth == 1 else depths[-1]
        return [w for w in ws if w.iodepth == qd]

    pool = by_qd(by_bs(pool)) if spec.bs_first else by_bs(by_qd(pool))
    chosen = pool[0]
    wanted = f"{format_size(spec.bs)} {spec.rw[0]} QD{spec.iodepth}"
    notes = []
    differs = []
    if chosen.rw != spec.rw[0]:
        differs.append(f"{chosen.rw} for {spec.rw[0]}")
    if chosen.bs != spec.bs:
        differs.append(f"block size {format_size(chosen.bs)}"
                       + (" (the largest present)" if spec.bs == _MIB else " (the smallest present)"))
    if chosen.iodepth != spec.iodepth:
        how = ("the closest present" if spec.bs_first else
               "the lowest present" if spec.iodepth == 1 else "the highest present")
        differs.append(f"QD{chosen.iodepth} ({how})")
    if chosen.numjobs != 1:
        differs.append(f"{chosen.numjobs} jobs")
    if chosen.rate_iops:
        differs.append(f"a rate limit of {chosen.rate_iops} IOPS")
    if is_ioping(chosen.key):
        differs.append("ioping's pace, one request per interval")
    if differs:
        notes.append(f"{name}: this run has no {wanted} workload (seed 002's); used "
                     f"{chosen.label}: " + ", ".join(differs))
    return chosen, notes


def _resolve(name: str, workloads: list[WorkloadRecord]) -> tuple[Metric, WorkloadRecord, list[str]]:
    """Score metric name → (figure, workload, notes)."""
    if "@" in name:
        figure, _, ref = name.partition("@")
        found = metric_named(figure)
        if found is None:
            raise AnalysisError(f"{name!r}: {figure!r} is not a figure",
                                hint=f"figures: {', '.join(METRICS)}")
        chosen = next((w for w in workloads if ref in (w.key, w.label)), None)
        if chosen is None:
            raise AnalysisError(f"{name!r}: no workload {ref!r} measured in this run",
                                hint="workloads: " + ", ".join(w.key for w in workloads))
        return found, chosen, []
    spec = _SPECS.get(name)
    if spec is None:
        raise AnalysisError(f"{name!r}: not a score metric",
                            hint=f"use {', '.join(_SPECS)}, or FIGURE@WORKLOAD "
                                 f"(figure {', '.join(METRICS)})")
    workload, notes = _pick(name, spec, workloads)
    return get_metric(spec.figure), workload, notes


def _value(p: Point | None, figure: str) -> float | None:
    if p is None or not p.samples:
        return None
    return getattr(p, figure)


def _ranks(scores: list[float | None]) -> list[int | None]:
    """Competition ranking (1, 2, 2, 4) of the scores present, lowest first."""
    present = sorted(s for s in scores if s is not None)
    return [None if s is None else present.index(s) + 1 for s in scores]


def scores(run: StoredRun, metrics: Sequence[str] = DEFAULT_METRICS, *,
           include_host: bool = False) -> ScoreTable:
    """Every configuration of the run scored by ``metrics`` (seed 002's four by default), best
    first; configurations missing a figure come last, unscored. The host baseline takes part
    only with ``include_host``."""
    if not metrics:
        raise AnalysisError("no metrics to score", hint=f"e.g. {','.join(DEFAULT_METRICS)}")
    if len(set(metrics)) != len(metrics):
        raise AnalysisError(f"a metric is named twice: {', '.join(metrics)}")
    configs = [c for c in run.configs if include_host or c.mode != Mode.HOST]
    if not configs:
        raise AnalysisError(f"run {run.id} has no configurations to score",
                            hint="only the host baseline was measured; pass include_host")
    found = {(p.config_key, p.workload_key): p for p in points(run)}
    keys = {c.key for c in configs}
    with_samples = {wk for (k, wk), p in found.items() if k in keys and p.samples}
    measured = [w for w in run.workloads if w.key in with_samples]
    if not measured:
        raise AnalysisError(f"run {run.id} has no measured workloads to score")
    components = []
    values: dict[str, list[float | None]] = {}
    notes: list[str] = []
    for name in metrics:
        figure, workload, picked = _resolve(name, measured)
        notes += picked
        column = [_value(found.get((c.key, workload.key)), figure.key) for c in configs]
        present = [v for v in column if v is not None]
        low, high = (min(present), max(present)) if present else (None, None)
        constant = bool(present) and low == high
        if constant:
            notes.append(f"{name}: every configuration has the same {figure.name}; its component "
                         "is 0 for all")
        missing = len(column) - len(present)
        if missing:
            notes.append(f"{name}: {missing} configuration(s) have no {figure.name} for "
                         f"{workload.label} and get no score")
        components.append(Component(name=name, figure=figure.key, workload=workload.key,
                                    label=f"{figure.name} · {workload.label}",
                                    lower_is_better=figure.lower_is_better,
                                    minimum=low, maximum=high, constant=constant))
        values[name] = column
    normalized: dict[str, list[float | None]] = {}
    for comp in components:
        column = values[comp.name]
        if comp.constant or comp.minimum is None or comp.maximum is None:
            normalized[comp.name] = [None if v is None else 0.0 for v in column]
            continue
        span = comp.maximum - comp.minimum
        best = comp.minimum if comp.lower_is_better else comp.maximum
        normalized[comp.name] = [None if v is None else abs(v - best) / span for v in column]
    totals: list[float | None] = []
    for i in range(len(configs)):
        parts = [normalized[c.name][i] for c in components]
        totals.append(None if any(x is None for x in parts)
                      else math.sqrt(sum(x * x for x in parts if x is not None)))
    ranks = _ranks(totals)
    rows = [ScoreRow(config_key=c.key, label=c.label,
                     values={m.name: values[m.name][i] for m in components},
                     normalized={m.name: normalized[m.name][i] for m in components},
                     score=totals[i], rank=ranks[i])
            for i, c in enumerate(configs)]
    rows.sort(key=lambda r: (r.rank is None, r.rank or 0))
    scored = sum(1 for t in totals if t is not None)
    if scored == 1:
        notes.append("only one configuration has every figure: its score is 0 by construction")
    k = len(components)
    return ScoreTable(run_id=run.id, components=tuple(components), rows=tuple(rows),
                      method=METHOD.format(n=scored, k=k, top=math.sqrt(k)), caveat=CAVEAT,
                      notes=tuple(notes), emulated=run.emulated)
