"""Two runs side by side: the same points measured on another host, another storage or after an
upgrade (pure: no I/O).

Points are matched by configuration key and workload key. Runs whose workload sets differ are
refused (a point that exists on one side only cannot be judged, and a silently shrunk matrix
hides it); configurations present in one run only are listed, not compared. Every matched point
gets a ``stats.compare`` of its per-sample values (B against A), and the p-values of all matched
points are adjusted together, so "significant" holds across the whole comparison. Host metadata
and measurement-method differences are listed for the caller to show: they are what, besides
the configurations, may explain a difference.
"""

from __future__ import annotations

import tomllib
from collections import defaultdict
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import ValidationError

from iomatrix.analysis.metrics import METRICS
from iomatrix.analysis.points import Point, points
from iomatrix.analysis.stats import Adjustment, Comparison, Interval, adjust, compare, confidence_interval
from iomatrix.core.errors import AnalysisError
from iomatrix.store.records import StoredRun
from iomatrix.suite.model import Method
from iomatrix.core.units import format_bytes
from iomatrix.core.model import Frozen, on_off

# Method fields that change what a trial measures; samples/target_ci/seed only change how
# precisely, which the statistics already account for.
_METHOD_FIELDS = ("ramp", "runtime", "steady_state", "min_runtime", "max_runtime", "engine",
                  "precondition", "vms", "vcpus", "memory")

Outcome = Literal["better", "worse", "no difference", "not judged"]


class Side(Frozen):
    """One run's figures for one point: ok samples, failed trials, whether any ran under TCG, and
    the confidence interval of the mean (None without a sample)."""

    n: int
    failed: int
    emulated: bool
    ci: Interval | None

    @property
    def mean(self) -> float | None:
        return None if self.ci is None else self.ci.mean


class MatchedPoint(Frozen):
    """One (configuration, workload) measured in both runs, B against A.

    ``change`` is mean_b / mean_a − 1 whenever both sides have a sample and mean_a ≠ 0, even
    below 2 samples a side where ``comparison`` gives no estimate; ``outcome`` then says
    "not judged". ``comparison`` carries the family-adjusted p-value and the long verdict.
    """

    config_key: str
    config_label: str
    workload_key: str
    workload_label: str
    a: Side
    b: Side
    change: float | None
    comparison: Comparison
    outcome: Outcome
    verdict: str
    """Short verdict for a table cell: "significantly better", "no significant difference", …"""


class Difference(Frozen):
    """A key whose value differs between the runs; None where a run did not record it."""

    key: str
    a: str | None
    b: str | None


class Unpaired(Frozen):
    """A point of a configuration both runs have, measured in only one of them (an unfinished run)."""

    config_label: str
    workload_label: str
    measured_in: Literal["a", "b"]


class Summary(Frozen):
    better: int
    worse: int
    no_difference: int
    not_judged: int
    family: int
    """How many comparisons were adjusted together (those with at least 2 samples a side)."""


class RunComparison(Frozen):
    """Run B against run A on one metric: matched points, what could not be matched, and what else
    differs between the runs."""

    run_a: int
    run_b: int
    metric: str
    higher_is_better: bool
    adjustment: Adjustment
    points: tuple[MatchedPoint, ...]
    only_a: tuple[str, ...]
    """Labels of configurations measured in A only."""
    only_b: tuple[str, ...]
    unpaired: tuple[Unpaired, ...]
    host_differences: tuple[Difference, ...]
    method_differences: tuple[Difference, ...]
    emulated_a: bool
    emulated_b: bool
    mixed_emulation: bool
    """Some matched point ran under TCG in one run and natively in the other."""
    summary: Summary


def workload_differences(a: StoredRun, b: StoredRun) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Labels of the workloads only run A has, and those only run B has."""
    keys_a = {w.key for w in a.workloads}
    keys_b = {w.key for w in b.workloads}
    return (tuple(w.label for w in a.workloads if w.key not in keys_b),
            tuple(w.label for w in b.workloads if w.key not in keys_a))


def host_differences(a: Mapping[str, str], b: Mapping[str, str]) -> tuple[Difference, ...]:
    """Every host-metadata key whose value differs, in the order A (then B) recorded them."""
    keys = list(a) + [k for k in b if k not in a]
    return tuple(Difference(key=k, a=a.get(k), b=b.get(k)) for k in keys if a.get(k) != b.get(k))


def _method(run: StoredRun) -> dict[str, Any] | None:
    try:
        raw = tomllib.loads(run.suite_text).get("method", {})
        method = Method.model_validate(raw)
    except (tomllib.TOMLDecodeError, ValidationError):
        return None   # a suite text an older iomatrix accepted: nothing to compare it by
    return {f: getattr(method, f) for f in _METHOD_FIELDS}


def _show(field: str, value: object) -> str:
    if isinstance(value, bool):
        return on_off(value)
    if field == "memory":
        return format_bytes(float(value))  # type: ignore[arg-type]
    if isinstance(value, float):
        return f"{value:g}s"
    return str(value)


def method_differences(a: StoredRun, b: StoredRun) -> tuple[Difference, ...]:
    """The measurement-method settings (ramp, runtime, engine, …) the two suites set differently."""
    ma, mb = _method(a), _method(b)
    if ma is None or mb is None:
        return ()
    return tuple(Difference(key=f, a=_show(f, ma[f]), b=_show(f, mb[f]))
                 for f in _METHOD_FIELDS if ma[f] != mb[f])


def _emulated_points(run: StoredRun) -> set[tuple[str, str]]:
    return {(t.config_key, t.workload_key) for t in run.trials
            if t.accelerator == "tcg" and t.samples}


def _side(point: Point, metric: str, emulated: bool) -> Side:
    values = point.values(metric)
    return Side(n=len(values), failed=point.failed, emulated=emulated,
                ci=confidence_interval(values) if values else None)


def _outcome(c: Comparison, higher_is_better: bool) -> tuple[Outcome, str]:
    if c.p_value is None:
        return "not judged", (f"significance cannot be judged (n={c.n_a} vs n={c.n_b}; "
                              "needs at least 2 each)")
    if not c.significant:
        return "no difference", "no significant difference"
    assert c.mean_a is not None and c.mean_b is not None   # both sides have samples
    outcome: Outcome = "better" if (c.mean_b > c.mean_a) == higher_is_better else "worse"
    note = " (no variation on either side)" if c.constant else ""
    return outcome, f"significantly {outcome}{note}"


def compare_runs(a: StoredRun, b: StoredRun, *, metric: str = "iops",
                 adjustment: Adjustment = "holm") -> RunComparison:
    """Run B against run A on ``metric`` (a key of ``metrics.METRICS``), point by point.

    Raises AnalysisError, naming the workloads on each side, when the runs' workload sets differ.
    Each matched point's Welch p-value is adjusted with ``adjustment`` (Holm by default, which
    bounds the chance of any false "significant" across the comparison) over every matched point
    with at least 2 samples a side; points with fewer get a change but no verdict. For latency
    metrics lower is better, so "better" means a significantly lower B.

    Limit: the test treats each run's samples as independent draws, so it sees only the
    variation within a run. What a run shares across its samples (file layout, cache and
    background load, a warmer disk) moves all of them together and shows as a difference here:
    two back-to-back runs of one suite on one host can differ "significantly". Repeating a run
    shows how large that run-to-run effect is.
    """
    if metric not in METRICS:
        raise ValueError(f"{metric!r}: not a metric; choose one of {', '.join(METRICS)}")
    only_in_a, only_in_b = workload_differences(a, b)
    if only_in_a or only_in_b:
        parts = [f"only run {r.id} has {', '.join(labels)}"
                 for r, labels in ((a, only_in_a), (b, only_in_b)) if labels]
        raise AnalysisError(f"runs {a.id} and {b.id} measured different workloads: {'; '.join(parts)}",
                         hint="compare runs of the same suite (see `iomatrix show RUN`)")
    higher = not METRICS[metric].lower_is_better
    points_a = {(p.config_key, p.workload_key): p for p in points(a)}
    points_b = {(p.config_key, p.workload_key): p for p in points(b)}
    emulated_a, emulated_b = _emulated_points(a), _emulated_points(b)
    configs_b = {c.key for c in b.configs}
    configs_a = {c.key for c in a.configs}
    labels = {c.key: c.label for c in (*b.configs, *a.configs)}
    workloads = {w.key: w.label for w in a.workloads}

    matched: list[tuple[str, str, Side, Side, float | None, Comparison]] = []
    unpaired: list[Unpaired] = []
    for config in a.configs:
        if config.key not in configs_b:
            continue
        for workload in a.workloads:
            key = (config.key, workload.key)
            pa, pb = points_a.get(key), points_b.get(key)
            if pa is None or pb is None:
                if pa is not None or pb is not None:
                    unpaired.append(Unpaired(config_label=config.label,
                                             workload_label=workload.label,
                                             measured_in="a" if pa is not None else "b"))
                continue
            sa, sb = _side(pa, metric, key in emulated_a), _side(pb, metric, key in emulated_b)
            change = (sb.mean / sa.mean - 1 if sa.mean is not None and sb.mean is not None
                      and sa.mean != 0 else None)
            matched.append((*key, sa, sb, change, compare(pa.values(metric), pb.values(metric))))

    adjusted = adjust([m[5] for m in matched], adjustment)
    out = []
    for (config_key, workload_key, sa, sb, change, _), c in zip(matched, adjusted, strict=True):
        outcome, verdict = _outcome(c, higher)
        out.append(MatchedPoint(config_key=config_key, config_label=labels[config_key],
                                workload_key=workload_key, workload_label=workloads[workload_key],
                                a=sa, b=sb, change=change, comparison=c, outcome=outcome,
                                verdict=verdict))
    counts: dict[str, int] = defaultdict(int)
    for p in out:
        counts[p.outcome] += 1
    return RunComparison(
        run_a=a.id, run_b=b.id, metric=metric, higher_is_better=higher, adjustment=adjustment,
        points=tuple(out),
        only_a=tuple(c.label for c in a.configs if c.key not in configs_b),
        only_b=tuple(c.label for c in b.configs if c.key not in configs_a),
        unpaired=tuple(unpaired),
        host_differences=host_differences(a.host, b.host),
        method_differences=method_differences(a, b),
        emulated_a=a.emulated, emulated_b=b.emulated,
        mixed_emulation=any(p.a.emulated != p.b.emulated for p in out),
        summary=Summary(better=counts["better"], worse=counts["worse"],
                        no_difference=counts["no difference"], not_judged=counts["not judged"],
                        family=sum(1 for p in out if p.comparison.p_value is not None)))
