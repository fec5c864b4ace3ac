"""``analysis.scaling`` on stored cluster-load runs whose figures are written by hand: each
round's aggregate and per-node IOPS at 1, 2 and 3 nodes, and what follows from them."""

from __future__ import annotations

from pathlib import Path

import pytest

from iomatrix.analysis.scaling import has_scaling, scaling
from iomatrix.analysis.stats import t_interval
from iomatrix.fio.persecond import StallCheck
from iomatrix.fio.samples import DirectionSample
from iomatrix.store import Store
from iomatrix.store.records import StoredRun, StoredSuite, TrialResult
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.workloads import Workload
from iomatrix.vocab.words import RunStatus, TrialStatus

NODES = ("pve1", "pve2", "pve3")
WORKLOAD = Workload(rw="randread", bs=4096, iodepth=8)


def _sample(iops: float, lat_us: float, vm: int | None = None) -> DirectionSample:
    return DirectionSample(direction="read", iops=iops, bw_bytes=iops * 4096,
                           io_bytes=int(iops * 4096), total_ios=int(iops), runtime_ms=1000,
                           lat_mean_ns=lat_us * 1000, vm=vm)


def cluster_run(tmp_path: Path, per_node: dict[int, list[list[float]]],
                counts: tuple[int, ...] = (1, 2, 3),
                stalled: tuple[int, int] | None = None) -> StoredRun:
    """A stored run whose trial at n nodes in round r gives node i ``per_node[n][r][i]`` IOPS
    (latency: 10 µs × n), as a cluster-load run stores it: the aggregate, each node's share as
    a per-client sample (none for one node), which node each is in ``cluster.nodes``;
    ``stalled``: (n, r) the trial that stalled."""
    configs = [Configuration(mode="host", node_count=n) for n in counts]
    with Store(tmp_path / "r.db") as store:
        run_id = store.create_run(suite=StoredSuite(name="s", source="synthetic", text=""),
                                  host={"hostname": "h"}, accelerator="none", notes=[],
                                  configs=configs, workloads=[WORKLOAD], seed=0)
        for config in configs:
            n = config.node_count or 0
            for r, figures in enumerate(per_node[n]):
                vms = tuple(_sample(x, 10 * n, vm=i) for i, x in enumerate(figures)) if n > 1 else ()
                store.record_trial(run_id, TrialResult(
                    config_key=config.key, workload_key=WORKLOAD.key, sample_index=r,
                    status=TrialStatus.OK, started_at=f"2026-01-01T00:0{r}:0{n}",
                    samples=(_sample(sum(figures), 10 * n),), vm_samples=vms,
                    stall=StallCheck(checked=True, stalls=1, longest_s=2.0, stalled_s=2.0)
                    if stalled == (n, r) else None,
                    applied={"cluster.nodes": ", ".join(f"vm{i}={x}"
                                                        for i, x in enumerate(NODES[:n]))}))
        store.finish_run(run_id, RunStatus.COMPLETE)
        return store.load_run(run_id)


SATURATING = {1: [[1000], [1100], [900]],
              2: [[900, 880], [950, 1000], [800, 820]],
              3: [[600, 610, 620], [700, 640, 650], [560, 570, 600]]}
"""Two nodes add IOPS in every round; a third adds some in one round, loses in others."""


def test_aggregate_efficiency_shares_and_where_adding_a_node_stops(tmp_path: Path) -> None:
    run = cluster_run(tmp_path, SATURATING)
    assert has_scaling(run)
    (curve,) = scaling(run)
    assert curve.family == "host (bare metal)" and curve.workload_key == WORKLOAD.key
    one, two, three = curve.rows
    assert [r.nodes for r in curve.rows] == [1, 2, 3]
    aggregates = {n: [sum(x) for x in SATURATING[n]] for n in (1, 2, 3)}
    for row in curve.rows:
        ci = t_interval(aggregates[row.nodes])
        assert (row.aggregate_iops.mean, row.aggregate_iops.low, row.aggregate_iops.high) == \
            pytest.approx((ci.mean, ci.low, ci.high))
        assert row.per_node_iops.mean == pytest.approx(ci.mean / row.nodes)
        assert row.latency_us is not None and row.latency_us.mean == pytest.approx(10 * row.nodes)
        assert sorted(row.node_iops) == list(NODES[:row.nodes])
        assert {n: f.mean for n, f in row.node_latency_us.items()} == pytest.approx(
            {n: 10 * row.nodes for n in NODES[:row.nodes]})
    # efficiency paired by round: aggregate(N) / (N × aggregate(1)) of the same round
    ratios = [a / (3 * o) for a, o in zip(aggregates[3], aggregates[1])]
    assert three.efficiency is not None
    assert three.efficiency.mean == pytest.approx(sum(ratios) / 3)
    assert one.efficiency is not None and one.efficiency.mean == pytest.approx(1.0)
    # each node's share of the one-node figure, paired by round
    shares = [SATURATING[2][r][1] / aggregates[1][r] for r in range(3)]
    assert two.node_share["pve2"].mean == pytest.approx(sum(shares) / 3)
    assert one.node_share["pve1"].mean == pytest.approx(1.0)   # one client: the aggregate
    # 1 → 2 adds IOPS in every round (its interval above 0), 2 → 3 does not
    assert one.gain_to_next is not None and one.gain_to_next.low is not None
    assert one.gain_to_next.low > 0
    assert two.gain_to_next is not None and two.gain_to_next.low is not None
    assert two.gain_to_next.low <= 0 and three.gain_to_next is None
    assert curve.saturates_at == 2 and "stops adding IOPS at 2 nodes" in curve.saturation


def test_every_node_adding_iops_is_not_saturation(tmp_path: Path) -> None:
    linear = {n: [[1000 + 10 * r] * n for r in range(3)] for n in (1, 2, 3)}
    (curve,) = scaling(cluster_run(tmp_path, linear))
    assert curve.saturates_at is None and "not reached within 3 nodes" in curve.saturation
    assert all(r.efficiency is not None and r.efficiency.mean == pytest.approx(1.0)
               for r in curve.rows)


def test_one_round_gives_figures_without_intervals(tmp_path: Path) -> None:
    (curve,) = scaling(cluster_run(tmp_path, {n: SATURATING[n][:1] for n in (1, 2, 3)}))
    assert all(r.aggregate_iops.low is None for r in curve.rows)
    assert curve.saturates_at is None and curve.saturation.startswith("not known")


def test_a_run_of_one_node_count_has_no_scaling(tmp_path: Path) -> None:
    run = cluster_run(tmp_path, {2: SATURATING[2]}, counts=(2,))
    assert not has_scaling(run) and scaling(run) == []


def test_a_stalled_trial_is_left_out_as_from_every_point(tmp_path: Path) -> None:
    run = cluster_run(tmp_path, SATURATING, stalled=(3, 1))
    (curve,) = scaling(run)
    assert curve.rows[2].aggregate_iops.n == 2 and curve.rows[1].aggregate_iops.n == 3
    assert curve.rows[2].aggregate_iops.mean == pytest.approx(
        (sum(SATURATING[3][0]) + sum(SATURATING[3][2])) / 2)
    (kept,) = scaling(run.model_copy(update={"with_stalled": True}))
    assert kept.rows[2].aggregate_iops.n == 3
