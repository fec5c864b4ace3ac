"""Two runs side by side: the same points measured on another host, another storage or after an
upgrade (pure: no I/O).

Configurations are paired first, then points of paired configurations by workload key. By default
a configuration is paired with the one of the same key in the other run, or, when each run has
exactly one configuration, with that one (two imported folders name their configurations after
themselves). ``match`` pairs them otherwise: "workload" pairs, for each workload, the one
configuration of each run that measured it; "A=B" pairs configuration A of run A with B of run B
(a key, a label or an imported folder's name). Runs whose workload sets differ are refused (a
point that exists on one side only cannot be judged, and a silently shrunk matrix hides it);
configurations left unpaired are listed, not compared. Every matched point gets a
``stats.compare`` of its per-sample values (B against A), and the p-values of all matched points
are adjusted together, so "significant" holds across the whole comparison. A percentile of a
mixed workload is compared per direction (percentiles of reads and writes are never averaged).
Host metadata, measurement-method and latency-definition differences are listed for the caller
to show: they are what, besides the configurations, may explain a difference.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from iomatrix.analysis.baselines import Straddle, run_versions, straddled
from iomatrix.analysis.metrics import LATENCY_KEY, LATENCY_NAMES, METRICS, run_latency
from iomatrix.analysis.points import Point, points
from iomatrix.analysis.stats import Adjustment, Comparison, Interval, compare_many, confidence_interval
from iomatrix.core.errors import AnalysisError
from iomatrix.store.records import ConfigRecord, Part, StoredRun
from iomatrix.suite.model import Method
from iomatrix.core.units import format_bytes
from iomatrix.core.model import Frozen, on_off
from iomatrix.vocab.words import Accelerator

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
    stalled: int = 0
    """Its trials that stalled (``analysis.stalls``): out of ``n`` and the figures unless the
    run was loaded with them."""

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
    """Run A's configuration (``config_key_b`` is run B's, the same unless paired otherwise)."""
    config_label: str
    workload_key: str
    workload_label: str
    """The workload's label, and for one direction of a mixed workload " · read" or " · write"."""
    config_key_b: str = ""
    config_label_b: str = ""
    direction: str | None = None
    """"read" or "write": a percentile of a mixed workload, compared per direction."""
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


class Pairing(Frozen):
    """A configuration of run A compared with one of run B, and why these two."""

    a_key: str
    a_label: str
    b_key: str
    b_label: str
    how: Literal["same key", "only configuration", "workload", "mapping"]


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
    version_changes: tuple[Straddle, ...] = ()
    """Changes of ``analysis.baselines`` the two runs lie on either side of."""
    latency_difference: Difference | None = None
    """The metric is a latency and the runs measured different fio latencies (lat, clat)."""
    pairings: tuple[Pairing, ...] = ()
    """Configurations compared with each other, and why."""
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
    """Every host-metadata key whose value differs, in the order A (then B) recorded them (the
    latency an import recorded is compared by ``compare_runs`` itself, with the metric)."""
    keys = [k for k in list(a) + [k for k in b if k not in a] if k != LATENCY_KEY]
    return tuple(Difference(key=k, a=a.get(k), b=b.get(k)) for k in keys if a.get(k) != b.get(k))


Match = str
"""How configurations are paired: "key" (the default), "workload", or "A=B" mappings."""


def _names(config: ConfigRecord) -> set[str]:
    return {config.key, config.label} | ({config.params["source"]} if "source" in config.params
                                         else set())


def _find(run: StoredRun, name: str) -> list[ConfigRecord]:
    return [c for c in run.configs if name in _names(c)]


def _mapping(a: StoredRun, b: StoredRun, text: str) -> tuple[ConfigRecord, ConfigRecord]:
    """``A=B``: configuration A of run A and B of run B, by key, label or imported folder name;
    keys hold "=" themselves, so every split is tried."""
    found = []
    for at in (i for i, ch in enumerate(text) if ch == "="):
        left, right = _find(a, text[:at].strip()), _find(b, text[at + 1:].strip())
        if len(left) == 1 and len(right) == 1:
            found.append((left[0], right[0]))
    if len(found) != 1:
        names_a = ", ".join(c.label for c in a.configs)
        names_b = ", ".join(c.label for c in b.configs)
        why = "names no configuration of each run" if not found else "is ambiguous"
        raise AnalysisError(f"--match {text!r} {why}",
                            hint=f"write CONFIG_A=CONFIG_B with run {a.id}'s configuration "
                                 f"({names_a}) and run {b.id}'s ({names_b}), by label, key or "
                                 "imported folder")
    return found[0]


def pair_configurations(a: StoredRun, b: StoredRun,
                        match: Sequence[Match] = ()) -> tuple[Pairing, ...]:
    """Which configuration of A is compared with which of B (module docstring); AnalysisError
    for a mapping that names no configuration or pairs one twice, and for "workload" when a run
    measured a workload in several configurations."""
    def pairing(ca: ConfigRecord, cb: ConfigRecord, how: str) -> Pairing:
        return Pairing(a_key=ca.key, a_label=ca.label, b_key=cb.key, b_label=cb.label,
                       how=how)  # type: ignore[arg-type]

    match = [m for m in match if m != "key"]
    if "workload" in match:
        if len(match) > 1:
            raise AnalysisError("--match workload cannot be combined with CONFIG_A=CONFIG_B",
                                hint="give either --match workload or the mappings")
        return _by_workload(a, b, pairing)
    if match:
        pairs = [_mapping(a, b, m) for m in match]
        for side, index in (("A", 0), ("B", 1)):
            seen = [p[index].label for p in pairs]
            twice = sorted({x for x in seen if seen.count(x) > 1})
            if twice:
                raise AnalysisError(f"--match pairs run {side}'s configuration {twice[0]} twice")
        return tuple(pairing(ca, cb, "mapping") for ca, cb in pairs)
    keys_b = {c.key: c for c in b.configs}
    same = tuple(pairing(c, keys_b[c.key], "same key") for c in a.configs if c.key in keys_b)
    if not same and len(a.configs) == 1 and len(b.configs) == 1:
        return (pairing(a.configs[0], b.configs[0], "only configuration"),)
    return same


def _by_workload(a: StoredRun, b: StoredRun, pairing: Any) -> tuple[Pairing, ...]:
    def measured(run: StoredRun) -> dict[str, list[str]]:
        """Workload key → the configurations (in the run's order) that measured it."""
        where: dict[str, list[str]] = defaultdict(list)
        for config in run.configs:
            for workload in dict.fromkeys(t.workload_key for t in run.trials
                                          if t.config_key == config.key):
                where[workload].append(config.key)
        return where

    where_a, where_b = measured(a), measured(b)
    labels = {w.key: w.label for w in (*a.workloads, *b.workloads)}
    for run, where in ((a, where_a), (b, where_b)):
        several = next((k for k, v in where.items() if len(v) > 1), None)
        if several is not None:
            names = {c.key: c.label for c in run.configs}
            raise AnalysisError(
                f"--match workload: run {run.id} measured {labels[several]} in "
                f"{len(where[several])} configurations ({', '.join(names[k] for k in where[several])})",
                hint="pair its configurations with --match CONFIG_A=CONFIG_B")
    configs_a = {c.key: c for c in a.configs}
    configs_b = {c.key: c for c in b.configs}
    pairs = dict.fromkeys((where_a[w][0], where_b[w][0]) for w in where_a if w in where_b)
    return tuple(pairing(configs_a[ka], configs_b[kb], "workload") for ka, kb in pairs)


def _method(run: StoredRun) -> Method | None:
    if run.suite.unloaded(Part.METHOD) is not None:
        return None   # a suite text an older iomatrix accepted: nothing to compare it by
    return run.suite.method


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
    return tuple(Difference(key=f, a=_show(f, getattr(ma, f)), b=_show(f, getattr(mb, f)))
                 for f in _METHOD_FIELDS if getattr(ma, f) != getattr(mb, f))


def _emulated_points(run: StoredRun) -> set[tuple[str, str]]:
    return {(t.config_key, t.workload_key) for t in run.trials
            if t.accelerator == Accelerator.TCG and t.samples}


def _side(point: Point, values: tuple[float, ...], emulated: bool) -> Side:
    return Side(n=len(values), failed=point.failed, emulated=emulated, stalled=point.stalled,
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
                 adjustment: Adjustment = "holm", match: Sequence[Match] = ()) -> RunComparison:
    """Run B against run A on ``metric`` (a key of ``metrics.METRICS``), point by point, the
    configurations paired by ``match`` (``pair_configurations``).

    Raises AnalysisError, naming the workloads on each side, when the runs' workload sets differ.
    Each matched point's Welch p-value is adjusted with ``adjustment`` (Holm by default, which
    bounds the chance of any false "significant" across the comparison) over every matched point
    with at least 2 samples a side; points with fewer get a change but no verdict. For latency
    metrics lower is better, so "better" means a significantly lower B. A percentile of a mixed
    workload is compared per direction: one matched point each for its reads and its writes.

    Limit: the test treats each run's samples as independent draws, so it sees only the
    variation within a run. What a run shares across its samples (file layout, cache and
    background load, a warmer disk) moves all of them together and shows as a difference here:
    two back-to-back runs of one suite on one host can differ "significantly". Repeating a run
    shows how large that run-to-run effect is.
    """
    if metric not in METRICS:
        raise ValueError(f"{metric!r}: not a metric; choose one of {', '.join(METRICS)}")
    _require_same_workloads(a, b)
    chosen = METRICS[metric]
    higher = not chosen.lower_is_better
    pairings = pair_configurations(a, b, match)
    workloads = {w.key: w.label for w in a.workloads}
    matched, unpaired = _matched(a, b, pairings, metric)
    adjusted = compare_many([m[6] for m in matched], adjustment=adjustment)
    out = []
    for (pair, workload_key, direction, sa, sb, change, _), c in zip(matched, adjusted,
                                                                      strict=True):
        outcome, verdict = _outcome(c, higher)
        label = workloads[workload_key] + (f" · {direction}" if direction else "")
        out.append(MatchedPoint(config_key=pair.a_key, config_label=pair.a_label,
                                config_key_b=pair.b_key, config_label_b=pair.b_label,
                                workload_key=workload_key, workload_label=label,
                                direction=direction, a=sa, b=sb, change=change, comparison=c,
                                outcome=outcome, verdict=verdict))
    counts: dict[str, int] = defaultdict(int)
    for p in out:
        counts[p.outcome] += 1
    paired_a = {p.a_key for p in pairings}
    paired_b = {p.b_key for p in pairings}
    return RunComparison(
        run_a=a.id, run_b=b.id, metric=metric, higher_is_better=higher, adjustment=adjustment,
        points=tuple(out),
        only_a=tuple(c.label for c in a.configs if c.key not in paired_a),
        only_b=tuple(c.label for c in b.configs if c.key not in paired_b),
        unpaired=tuple(unpaired),
        host_differences=host_differences(a.host, b.host),
        method_differences=method_differences(a, b),
        version_changes=straddled(run_versions(a), run_versions(b)),
        latency_difference=latency_difference(a, b, metric),
        pairings=pairings,
        emulated_a=a.emulated, emulated_b=b.emulated,
        mixed_emulation=any(p.a.emulated != p.b.emulated for p in out),
        summary=Summary(better=counts["better"], worse=counts["worse"],
                        no_difference=counts["no difference"], not_judged=counts["not judged"],
                        family=sum(1 for p in out if p.comparison.p_value is not None)))


_Row = tuple[Pairing, str, str | None, Side, Side, float | None,
             tuple[tuple[float, ...], tuple[float, ...]]]


def _require_same_workloads(a: StoredRun, b: StoredRun) -> None:
    only_in_a, only_in_b = workload_differences(a, b)
    if only_in_a or only_in_b:
        parts = [f"only run {r.id} has {', '.join(labels)}"
                 for r, labels in ((a, only_in_a), (b, only_in_b)) if labels]
        raise AnalysisError(f"runs {a.id} and {b.id} measured different workloads: {'; '.join(parts)}",
                         hint="compare runs of the same suite (see `iomatrix show RUN`)")


def _matched(a: StoredRun, b: StoredRun, pairings: Sequence[Pairing],
             metric: str) -> tuple[list[_Row], list[Unpaired]]:
    """Each point measured in both runs (per direction for a mixed workload's percentile), with
    the values to compare; and the points only one run measured."""
    points_a = {(p.config_key, p.workload_key): p for p in points(a)}
    points_b = {(p.config_key, p.workload_key): p for p in points(b)}
    emulated_a, emulated_b = _emulated_points(a), _emulated_points(b)
    per_direction = METRICS[metric].combine == "percentile"
    matched: list[_Row] = []
    unpaired: list[Unpaired] = []
    for pair in pairings:
        for workload in a.workloads:
            pa = points_a.get((pair.a_key, workload.key))
            pb = points_b.get((pair.b_key, workload.key))
            if pa is None or pb is None:
                if pa is not None or pb is not None:
                    unpaired.append(Unpaired(config_label=pair.a_label,
                                             workload_label=workload.label,
                                             measured_in="a" if pa is not None else "b"))
                continue
            tcg_a = (pair.a_key, workload.key) in emulated_a
            tcg_b = (pair.b_key, workload.key) in emulated_b
            directions: tuple[str | None, ...] = (None,)
            if per_direction and (pa.mixed or pb.mixed):
                directions = ("read", "write")
            for direction in directions:
                va, vb = pa.values(metric, direction), pb.values(metric, direction)
                sa, sb = _side(pa, va, tcg_a), _side(pb, vb, tcg_b)
                change = (sb.mean / sa.mean - 1 if sa.mean is not None and sb.mean is not None
                          and sa.mean != 0 else None)
                matched.append((pair, workload.key, direction, sa, sb, change, (va, vb)))
    return matched, unpaired


def latency_difference(a: StoredRun, b: StoredRun, metric: str) -> Difference | None:
    """When ``metric`` is a latency: the fio latencies it is of in each run, if they differ."""
    chosen = METRICS[metric]
    kind_a, kind_b = chosen.kind(run_latency(a)), chosen.kind(run_latency(b))
    if kind_a is None or kind_a == kind_b:
        return None
    return Difference(key=chosen.name, a=LATENCY_NAMES[kind_a], b=LATENCY_NAMES[kind_b or "lat"])
