"""Scaling under cluster load (issue 37): ``[matrix] node_count`` measures 1..N nodes loading
the shared target at once in the same run, interleaved round by round, and
``analysis.scaling`` answers from it; ``target_ci`` runs one pilot for the whole cluster. One
small host-mode run on three sshd nodes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from iomatrix.analysis.scaling import node_names, scaling
from iomatrix.store import Store
from iomatrix.store.location import parse_location
from tests.conftest import cli_result
from tests.scenarios.test_cluster_load import SUITE, finished, left_behind, run_controller
from tests.sshnodes import SshCluster, ssh_nodes  # noqa: F401

CHECKS_NODE_DIRECTORIES = True
"""``left_behind`` checks that no node's /tmp/iomatrix-fio-* is left
(``tests.sshnodes.node_directories``)."""

COUNTS = SUITE.replace("[method]", "[matrix]\nnode_count = [1, 2, 3]\n[method]").replace(
    "samples = 2", "target_ci = 0.5\nmax_samples = 3").replace('"1s"', '"0.5s"')
"""Node counts 1..3, and target_ci: the controller's one pilot chooses the rounds (3: the least
it chooses, and the most this suite allows)."""


@pytest.mark.slow     # ~70 s: 15 trials of 0.5 s over SSH (a pilot of 6, 3 rounds of 3 counts), checked once
def test_node_counts_interleave_and_scale_after_one_pilot(ssh_nodes: Callable[[int], SshCluster],
                                          tmp_path: Path) -> None:
    cluster = ssh_nodes(3)
    names = [n.name for n in cluster.nodes]
    db = str(tmp_path / "r.db")
    proc = run_controller(cluster, tmp_path, db, COUNTS)
    run = finished(proc, db)
    assert proc.returncode == 0, proc.stderr
    assert sorted(c.key for c in run.configs) == [f"host/node_count={n}" for n in (1, 2, 3)]
    # one pilot for the whole cluster, before the rounds: every node measured in it
    with Store(parse_location(db)) as store:
        pilot, plan = store.load_pilot(1)
    assert plan is not None and plan.choice is not None and pilot
    assert {t.config_key for t in pilot} == {"host/node_count=3", "host/node_count=2"}
    assert any(n.startswith("pilot: ") for n in run.notes)
    rounds = plan.choice.rounds
    assert all(t.status == "ok" for t in run.trials) and len(run.trials) == 3 * rounds
    for trial in run.trials:
        n = int(trial.config_key.rpartition("=")[2])
        # the first n nodes took part, and the trial says which
        assert node_names(trial) == dict(enumerate(names[:n]))
        # one client: its figures are the trial's own (fio gives no per-client result)
        assert sorted(s.vm or 0 for s in trial.vm_samples) == (list(range(n)) if n > 1 else [])
    # interleaved: every round measures every count before the next round starts
    order = [t.sample_index for t in sorted(run.trials, key=lambda t: t.started_at)]
    assert order == [r for r in range(rounds) for _ in range(3)]
    (curve,) = scaling(run)
    assert [r.nodes for r in curve.rows] == [1, 2, 3]
    for row in curve.rows:
        mine = [t for t in run.trials if t.config_key == row.config_key]
        sums = [sum(s.iops for s in t.samples) for t in mine]
        assert row.aggregate_iops.mean == pytest.approx(sum(sums) / rounds)
        assert row.aggregate_iops.low is not None and row.aggregate_iops.n == rounds
        assert sorted(row.node_iops) == names[:row.nodes]
        assert row.efficiency is not None
    assert curve.rows[0].efficiency is not None and curve.rows[0].efficiency.mean == 1.0
    assert curve.saturation
    shown = cli_result("show", "1", "--db", db)
    assert "scaling" in shown.stdout.lower() and curve.saturation.split(":")[0] in shown.stdout
    assert left_behind(cluster, tmp_path) == []

