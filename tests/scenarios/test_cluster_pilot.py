"""One pilot for a cluster whose nodes each measure their own share (issue 37, item 3): every
node measures its pilot at once, the controller stores all their pilot trials and chooses one
plan over them, and every node then measures exactly that plan, also when the controller is
killed once the plan is chosen and the run resumed (no second pilot). One short real run on two
sshd nodes (tests/sshnodes.py)."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from iomatrix.analysis import trialplan as tp
from iomatrix.store import Store
from tests.conftest import cli_result
from tests.scenarios.test_cluster import (_interrupted, _iomatrix, _nothing_left,
                                          _nothing_left_but_shares, _suite)
from tests.sshnodes import SshCluster, ssh_nodes  # noqa: F401 (a fixture)

WORKLOADS = 2


@pytest.mark.slow     # ~50 s (80 s at load 11): per node a pilot of 6 trials of 1 s, the
# controller killed, then 3 or 4 rounds of 2 on --resume
def test_nodes_measuring_their_own_share_follow_one_pilot(
        ssh_nodes: Callable[[int], SshCluster], tmp_path: Path) -> None:
    cluster = ssh_nodes(2)
    names = [n.name for n in cluster.nodes]
    suite = _suite(tmp_path, cluster, workloads=WORKLOADS,
                   extra='target_ci = "50%"\nmax_samples = 4\n')
    db = str(tmp_path / "r.db")
    # the controller killed as soon as it has chosen: the pilot and plan are stored
    _interrupted(cluster, suite, db, ("chosen: trials of",),
                 lambda proc: proc.send_signal(signal.SIGKILL))
    _nothing_left_but_shares(cluster)
    with Store(db) as store:
        first = store.load_pilot(1)
    done = _iomatrix(cluster, "run", "--resume", "1", "--db", db)
    assert done.returncode == 0, done.stderr
    assert "pilot: " not in done.stderr          # no node measured a second pilot
    with Store(db) as store:
        run = store.load_run(1)
        pilot, plan = store.load_pilot(1)
    assert (pilot, plan) == first and run.status == "complete"
    node_of = {c.key: c.params.get("node", "") for c in run.configs}
    # every node's pilot trials, on the controller: each node measured its own, at the run's
    # own trial length (target_ci chooses the rounds only), in every pilot round
    assert sorted(node_of.values()) == names
    for name in names:
        mine = [t for t in pilot if node_of[t.config_key] == name]
        assert len(mine) == tp.PILOT_ROUNDS * WORKLOADS, pilot
        assert {t.round for t in mine} == set(range(tp.PILOT_ROUNDS))
        assert all(t.runtime_s == 1.0 and t.iops and t.iops > 0 for t in mine)
    # one plan, every node's: each node measured exactly its rounds, nothing failed
    assert plan is not None and plan.choice is not None and len(plan.noise) == 1
    rounds = plan.choice.rounds
    assert tp.MIN_ROUNDS <= rounds <= 4
    for name in names:
        samples = sorted(t.sample_index for t in run.trials if node_of[t.config_key] == name)
        assert samples == sorted(list(range(rounds)) * WORKLOADS), (name, samples)
    assert all(t.status == "ok" for t in run.trials)
    assert {n.name: n.status for n in run.nodes} == {name: "done" for name in names}
    # the note says what was measured and chosen, once, as for one host, counting every node
    (note,) = [n for n in run.notes if n.startswith("pilot:")]
    assert note.startswith(f"pilot: {len(pilot)} trials") and "chosen:" in note
    assert all(name in note for name in names)
    shown = cli_result("show", "1", "--db", db)
    assert shown.returncode == 0 and note[:60] in shown.stdout, shown.stdout
    _nothing_left(cluster, tmp_path)
