"""Runs of several nodes side by side (pure: no I/O): which node or storage is slower than the
reference run, by how much, and how sure we are.

Each other run is compared with the reference (the first) point by point with
``crossrun.compare_runs`` (configurations paired by key). Two runs share no rounds, so each
point's comparison is unpaired: Welch's test on the two runs' samples, Holm-adjusted across that
node's points. A node's summary pairs by point instead: the same (configuration, workload)
measured on both nodes is one pair, and the node's change is the geometric mean over its points
of mean_node / mean_reference − 1, with a t interval and a one-sample t-test of the log ratios
(``stats.log_ratio_test``; the points are treated as independent, though they share the run's
host state). A change is called only when the test says so AND it is larger than the noise floor:
the larger of the two runs' A/A noise floors (``paired.noise_floor``) where the runs measured an
A/A twin. Without one the floor is unknown, and the page says that the run-to-run spread of one
node (what a second run of the same suite on the same node would show) is not in these figures.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Literal

from iomatrix.analysis.baselines import Straddle
from iomatrix.analysis.crossrun import Difference, RunComparison, compare_runs
from iomatrix.analysis.effects import refuse_concurrent_nodes
from iomatrix.analysis.metrics import METRICS
from iomatrix.analysis.paired import noise_floor
from iomatrix.analysis.stats import log_ratio_test, percent_text
from iomatrix.core.errors import AnalysisError
from iomatrix.core.model import Frozen
from iomatrix.store.records import StoredRun
from iomatrix.suite.fields import NODE_AXIS

Standing = Literal["reference", "slower", "faster", "within noise", "no significant difference",
                   "not judged"]
POINT_METHOD = "unpaired: Welch per point (two runs share no rounds), Holm-adjusted across the node's points"
NODE_METHOD = "paired by point: geometric mean of the per-point ratios, t-test of their logs"


def by_node(run: StoredRun) -> list[StoredRun]:
    """A cluster run (``run.nodes``: configurations with node=NAME) as one run per node, in the
    run's node order, so that ``compare_fleet`` compares its nodes as it compares hosts' runs:
    each with that node's configurations under their keys without the node, its trials, and
    the node's own host metadata. AnalysisError for a run of one host."""
    if not run.nodes:
        raise AnalysisError(f"run {run.id} was measured on one host, not on a cluster's nodes",
                            hint="compare it with another run: `iomatrix compare RUN_A RUN_B`")
    refuse_concurrent_nodes(run)
    out = []
    for node in run.nodes:
        configs = [c for c in run.configs if c.params.get(NODE_AXIS) == node.name]
        plain = {c.key: c.model_copy(update={
            "params": {k: v for k, v in c.params.items() if k != NODE_AXIS},
            "label": c.label.replace(f" @{node.name}", "")}) for c in configs}
        renamed = {key: str(c.identity) for key, c in plain.items()}
        out.append(run.model_copy(update={
            "configs": tuple(c.model_copy(update={"key": renamed[k]}) for k, c in plain.items()),
            "trials": tuple(t.model_copy(update={"config_key": renamed[t.config_key]})
                            for t in run.trials if t.config_key in renamed),
            "host": {**node.host, "hostname": node.name}, "nodes": ()}))
    return out


def stalls_by_node(runs: Sequence[StoredRun]) -> list[str]:
    """Each run's configurations that stalled (``analysis.stalls``), named by node: a node
    whose configurations stall is a finding in itself, whatever its figures."""
    from iomatrix.analysis.stalls import by_config

    kept = " (in its figures: --with-stalled)"
    return [f"stalls: {node_name(run)} (run {run.id}): {one.text}"
            + (kept if run.with_stalled else "") for run in runs for one in by_config(run)]


def node_name(run: StoredRun) -> str:
    """The node a run measured: its hostname as the run recorded it."""
    return run.host.get("hostname") or f"run {run.id}"


def storage_name(run: StoredRun) -> str:
    """The storage a run measured: its target and the target's filesystem."""
    target, fs = run.host.get("target", "?"), run.host.get("target_fs")
    return f"{target} ({fs})" if fs else target


class Node(Frozen):
    """One run of the fleet against the reference run."""

    run: int
    node: str
    storage: str
    standing: Standing
    points: int = 0
    """Points measured on both nodes (the pairs of the node's summary)."""
    better: int = 0
    worse: int = 0
    no_difference: int = 0
    not_judged: int = 0
    change: float | None = None
    """Geometric mean over the points of mean_node / mean_reference − 1."""
    low: float | None = None
    high: float | None = None
    p_value: float | None = None
    noise_floor: float | None = None
    """The larger A/A noise floor of this run and the reference; None when either has none."""
    verdict: str = ""
    differences: tuple[Difference, ...] = ()
    """Host metadata that differs from the reference's (besides the hostname)."""
    version_changes: tuple[Straddle, ...] = ()
    """Changes that move a baseline between the reference's versions and this node's."""


class Fleet(Frozen):
    """N runs against the first, on one metric."""

    metric: str
    higher_is_better: bool
    reference: int
    nodes: tuple[Node, ...]
    """The reference first, then the others in the order given."""
    comparisons: tuple[RunComparison, ...]
    """Each other run's point-by-point comparison with the reference, in the same order."""
    point_method: str = POINT_METHOD
    node_method: str = NODE_METHOD


def _summary(c: RunComparison) -> tuple[int, float | None, float | None, float | None,
                                        float | None]:
    """Pairs, geometric-mean change, its CI and p-value, over the points with a mean on both
    sides above 0."""
    logs = [math.log(p.b.mean / p.a.mean) for p in c.points
            if p.a.mean is not None and p.b.mean is not None and p.a.mean > 0 and p.b.mean > 0]
    if not logs:
        return 0, None, None, None, None
    if len(logs) == 1:
        return 1, math.expm1(logs[0]), None, None, None
    test = log_ratio_test(logs)
    i = test.interval
    return (len(logs), math.expm1(i.mean), None if i.low is None else math.expm1(i.low),
            None if i.high is None else math.expm1(i.high), test.p_value)


def _floor(a: StoredRun, b: StoredRun, metric: str) -> float | None:
    floors = [noise_floor(a, metric), noise_floor(b, metric)]
    return None if None in floors else max(floors)  # type: ignore[type-var]


def _standing(change: float | None, p: float | None, floor: float | None,
              higher: bool) -> Standing:
    if change is None or p is None:
        return "not judged"
    if p >= 0.05:
        return "no significant difference"
    if floor is not None and abs(change) <= floor:
        return "within noise"
    return "faster" if (change > 0) == higher else "slower"


def _verdict(standing: Standing, n: int, change: float | None, low: float | None,
             high: float | None, floor: float | None, metric: str) -> str:
    name = METRICS[metric].name
    if standing == "not judged":
        return (f"not judged: {n} point(s) measured on both nodes; a node's change needs at "
                "least 2")
    effect = f"{percent_text(change)} % {name}"   # type: ignore[arg-type]
    if low is not None and high is not None:
        effect += f" (95 % CI {percent_text(low)} … {percent_text(high)} % over {n} points)"
    floor_text = ("no A/A noise floor measured" if floor is None
                  else f"noise floor ±{floor * 100:.1f} %")
    if standing == "within noise":
        return f"{effect}: significant, but within the {floor_text}"
    if standing == "no significant difference":
        return f"no significant difference: {effect}; {floor_text}"
    return f"{standing}: {effect}; {floor_text}"


def compare_fleet(runs: Sequence[StoredRun], *, metric: str = "iops") -> Fleet:
    """Every run after the first against the first (see the module docstring); AnalysisError
    below 2 runs or when a run's workloads differ from the reference's."""
    if len(runs) < 2:
        raise AnalysisError("a fleet comparison needs at least 2 runs",
                            hint="give the reference run first, then the runs of the other nodes")
    if metric not in METRICS:
        raise ValueError(f"{metric!r}: not a metric; choose one of {', '.join(METRICS)}")
    higher = not METRICS[metric].lower_is_better
    ref, others = runs[0], runs[1:]
    nodes = [Node(run=ref.id, node=node_name(ref), storage=storage_name(ref),
                  standing="reference", noise_floor=noise_floor(ref, metric),
                  verdict="the reference: every other node is compared with it")]
    comparisons = []
    for run in others:
        c = compare_runs(ref, run, metric=metric)
        comparisons.append(c)
        n, change, low, high, p = _summary(c)
        floor = _floor(ref, run, metric)
        standing = _standing(change, p, floor, higher)
        s = c.summary
        nodes.append(Node(
            run=run.id, node=node_name(run), storage=storage_name(run), standing=standing,
            points=n, better=s.better, worse=s.worse, no_difference=s.no_difference,
            not_judged=s.not_judged, change=change, low=low, high=high, p_value=p,
            noise_floor=floor, verdict=_verdict(standing, n, change, low, high, floor, metric),
            differences=tuple(d for d in c.host_differences if d.key != "hostname"),
            version_changes=c.version_changes))
    return Fleet(metric=metric, higher_is_better=higher, reference=ref.id, nodes=tuple(nodes),
                 comparisons=tuple(comparisons))


def slowest_first(fleet: Fleet) -> list[Node]:
    """The compared nodes, the one furthest behind the reference first (the reference last)."""
    def key(n: Node) -> float:
        if n.change is None:
            return math.inf
        return n.change if fleet.higher_is_better else -n.change
    return sorted(fleet.nodes[1:], key=key) + [fleet.nodes[0]]


def by_storage(fleet: Fleet) -> dict[str, float | None]:
    """Storage → the median change of its nodes against the reference (None when none has one)."""
    out: dict[str, list[float]] = {}
    for n in fleet.nodes[1:]:
        out.setdefault(n.storage, [])
        if n.change is not None:
            out[n.storage].append(n.change)
    return {k: statistics.median(v) if v else None for k, v in out.items()}
