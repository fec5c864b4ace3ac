"""Scaling answers of a cluster-load run (``[method] concurrent_nodes`` with ``[matrix]
node_count``): per workload and per family of configurations (every setting but the node
count), the cluster's aggregate IOPS, each node's IOPS and the mean latency against the number
of nodes loading the shared target at once, each with a 95 % confidence interval over the
rounds; the share of the one-node figure each node keeps; and the node count past which one
more node adds no IOPS.

**Paired by round.** Every node count of a family is measured once in every round (the rounds
interleave them: ``suite.plan``), so a round's trials at 1, 2 and 3 nodes saw the same drift of
the shared storage. The shares and the gains are therefore taken per round and their intervals
are of those per-round figures (Student t over the rounds with every count measured; one round
gives a figure without an interval).

- **Efficiency** of N nodes: aggregate(N) / (N × aggregate(1)), the fraction of N times the
  one-node figure the cluster reaches; 1.0 is perfect scaling.
- **A node's share**: that node's IOPS at N nodes / aggregate(1): how much of what one node
  alone got it keeps with N − 1 others loading the target too.
- **Where adding a node stops adding IOPS** (:data:`SATURATION_RULE`): the smallest measured
  count N whose paired per-round gain to the next measured count has a 95 % interval reaching
  0 or below; None when every step's interval lies above 0 (not reached within the counts
  measured), or when there are too few rounds to tell (fewer than 2).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from iomatrix.analysis.stats import t_interval
from iomatrix.core.model import Frozen
from iomatrix.vocab.axes import BY_NAME
from iomatrix.store.records import ConfigRecord, StoredRun, TrialRecord, WorkloadRecord
from iomatrix.vocab.words import TrialStatus

COUNT_AXIS = "node_count"
"""The configuration parameter that is the number of nodes loading the target at once."""
SATURATION_RULE = ("adding nodes stops adding IOPS at the smallest node count N whose paired "
                   "per-round gain in aggregate IOPS to the next count measured has a 95 % "
                   "confidence interval reaching 0 or below")


class Figure(Frozen):
    """A mean over rounds, with its 95 % confidence interval (None: fewer than 2 rounds)."""

    mean: float
    low: float | None = None
    high: float | None = None
    n: int = 0
    """How many rounds it is the mean of."""

    @classmethod
    def of(cls, values: Sequence[float]) -> "Figure | None":
        if not values:
            return None
        ci = t_interval(values)
        return cls(mean=ci.mean, low=ci.low, high=ci.high, n=len(values))


class ScalingRow(Frozen):
    """One node count of a curve."""

    nodes: int
    config_key: str
    aggregate_iops: Figure
    """The cluster's IOPS (every node's summed), per round."""
    per_node_iops: Figure
    """aggregate / nodes, per round."""
    latency_us: Figure | None = None
    """The trials' mean request latency over every node's requests (µs)."""
    efficiency: Figure | None = None
    """aggregate(N) / (N × aggregate(1)), paired by round; None without a one-node count."""
    node_iops: dict[str, Figure] = {}
    """Each node's IOPS, by its name."""
    node_latency_us: dict[str, Figure] = {}
    """Each node's mean request latency (µs), by its name."""
    node_share: dict[str, Figure] = {}
    """Each node's IOPS / aggregate(1), paired by round (its share of the one-node figure)."""
    gain_to_next: Figure | None = None
    """aggregate(next count) − aggregate(N), paired by round; None at the last count."""


class ScalingCurve(Frozen):
    """One family of configurations on one workload, against the node count."""

    family: str
    """The configurations' label without the node count."""
    workload_key: str
    workload_label: str
    rows: tuple[ScalingRow, ...]
    saturates_at: int | None = None
    """The node count past which one more node adds no IOPS (:data:`SATURATION_RULE`)."""
    saturation: str = ""
    """``saturates_at`` in a sentence, or why it is not known."""


def has_scaling(run: StoredRun) -> bool:
    """Whether the run measured two node counts or more."""
    return len({c.params.get(COUNT_AXIS) for c in run.configs if COUNT_AXIS in c.params}) >= 2


def scaling(run: StoredRun) -> list[ScalingCurve]:
    """Every family's scaling curve on every workload (empty when the run has no node-count
    axis with two levels or more)."""
    if not has_scaling(run):
        return []
    families: dict[tuple[tuple[str, str], ...], list[ConfigRecord]] = defaultdict(list)
    for config in run.configs:
        if COUNT_AXIS in config.params:
            rest = tuple((k, v) for k, v in config.params.items() if k != COUNT_AXIS)
            families[(("mode", config.mode), *rest)].append(config)
    trials: dict[tuple[str, str], list[TrialRecord]] = defaultdict(list)
    for trial in run.trials:
        # a stalled trial is left out, as from every point (unless loaded with them)
        if (trial.status == TrialStatus.OK and trial.samples
                and (run.with_stalled or not trial.stalled)):
            trials[(trial.config_key, trial.workload_key)].append(trial)
    curves = []
    for configs in families.values():
        configs = sorted(configs, key=lambda c: int(c.params[COUNT_AXIS]))
        for workload in run.workloads:
            by_count = {int(c.params[COUNT_AXIS]): _rounds(trials[(c.key, workload.key)])
                        for c in configs}
            if sum(1 for r in by_count.values() if r) >= 2:
                curves.append(_curve(configs, workload, by_count))
    return curves


def _rounds(trials: Sequence[TrialRecord]) -> dict[int, TrialRecord]:
    """A point's ok trials by round (the last measured where a round has two)."""
    return {t.sample_index: t for t in sorted(trials, key=lambda t: t.started_at)}


def _iops(trial: TrialRecord) -> float:
    return sum(s.iops for s in trial.samples)


def _latency_us(trial: TrialRecord) -> float | None:
    """The trial's mean latency over its directions, weighted by their requests (µs)."""
    known = [(s.lat_mean_ns, s.total_ios) for s in trial.samples
             if s.lat_mean_ns is not None and s.total_ios > 0]
    ios = sum(n for _, n in known)
    return sum(m * n for m, n in known) / ios / 1000 if ios else None


def node_names(trial: TrialRecord) -> dict[int, str]:
    """Which node each per-client figure (``vm`` N) of a cluster trial is (its applied
    ``cluster.nodes``: ``vm0=pve1, vm1=pve2``, or ``vm0=pve1/vm0`` for a node's guests)."""
    names = {}
    for part in trial.applied.get("cluster.nodes", "").split(", "):
        vm, _, label = part.partition("=")
        if vm.startswith("vm") and vm[2:].isdigit() and label:
            names[int(vm[2:])] = label.split("/")[0]
    return names


def _per_node(trial: TrialRecord) -> dict[str, tuple[float, float | None]]:
    """Each node's IOPS in a trial (its guests' summed) and its mean latency over its
    requests (µs); a trial of one client has no per-client figures: its own are that node's."""
    names = node_names(trial)
    if not trial.vm_samples and len(names) == 1:
        return {names[0]: (_iops(trial), _latency_us(trial))}
    iops: dict[str, float] = defaultdict(float)
    lat: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for s in trial.vm_samples:
        if s.vm is not None and s.vm in names:
            iops[names[s.vm]] += s.iops
            if s.lat_mean_ns is not None and s.total_ios > 0:
                lat[names[s.vm]].append((s.lat_mean_ns, s.total_ios))
    return {name: (x, sum(m * n for m, n in lat[name]) / sum(n for _, n in lat[name]) / 1000
                   if lat[name] else None) for name, x in iops.items()}


def _curve(configs: Sequence[ConfigRecord], workload: WorkloadRecord,
           by_count: dict[int, dict[int, TrialRecord]]) -> ScalingCurve:
    counts = [n for n in sorted(by_count) if by_count[n]]
    one = by_count.get(1, {})
    keys = {int(c.params[COUNT_AXIS]): c.key for c in configs}
    rows = []
    for i, n in enumerate(counts):
        rounds = by_count[n]
        agg = {r: _iops(t) for r, t in rounds.items()}
        paired = [r for r in agg if r in one and _iops(one[r]) > 0]
        nodes: dict[str, dict[int, float]] = defaultdict(dict)
        node_lat: dict[str, list[float]] = defaultdict(list)
        for r, t in rounds.items():
            for name, (iops, lat) in _per_node(t).items():
                nodes[name][r] = iops
                if lat is not None:
                    node_lat[name].append(lat)
        after = by_count[counts[i + 1]] if i + 1 < len(counts) else {}
        gains = [_iops(after[r]) - agg[r] for r in agg if r in after]
        latencies = [x for t in rounds.values() if (x := _latency_us(t)) is not None]
        rows.append(ScalingRow(
            nodes=n, config_key=keys[n], aggregate_iops=Figure.of(list(agg.values())),
            per_node_iops=Figure.of([v / n for v in agg.values()]),
            latency_us=Figure.of(latencies),
            efficiency=Figure.of([agg[r] / (n * _iops(one[r])) for r in paired]),
            node_iops={name: f for name, v in nodes.items() if (f := Figure.of(list(v.values())))},
            node_latency_us={name: f for name, v in node_lat.items() if (f := Figure.of(v))},
            node_share={name: f for name, v in nodes.items() if (f := Figure.of(
                [v[r] / _iops(one[r]) for r in v if r in paired]))},
            gain_to_next=Figure.of(gains)))
    at, text = _saturation(rows)
    return ScalingCurve(family=_family(configs[0]), workload_key=workload.key,
                        workload_label=workload.label, rows=tuple(rows), saturates_at=at,
                        saturation=text)


def _saturation(rows: Sequence[ScalingRow]) -> tuple[int | None, str]:
    """Where adding a node stops adding IOPS (:data:`SATURATION_RULE`), and the sentence."""
    for row, following in zip(rows, rows[1:]):
        gain = row.gain_to_next
        if gain is None or gain.low is None:
            return None, (f"not known: the gain from {row.nodes} to {following.nodes} nodes "
                          "has no confidence interval (fewer than 2 rounds measured both)")
        if gain.low <= 0:
            return row.nodes, (f"adding nodes stops adding IOPS at {row.nodes} node"
                               f"{'s' if row.nodes != 1 else ''}: {following.nodes} gave "
                               f"{gain.mean:+,.0f} IOPS (95 % CI {gain.low:+,.0f} to "
                               f"{gain.high:+,.0f}), an interval reaching 0")
    last = rows[-1].nodes
    return None, (f"not reached within {last} nodes: every added node added IOPS (each step's "
                  "95 % CI of the paired gain lies above 0)")


def _family(config: ConfigRecord) -> str:
    """The configuration's label without its node count (the words its axis adds)."""
    words = BY_NAME[COUNT_AXIS].shown_in_label(int(config.params[COUNT_AXIS]))
    return config.label.replace(words, "", 1) if words else config.label
