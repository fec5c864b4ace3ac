"""A suite on every node of a cluster (issue 23), against real sshd nodes (tests/sshnodes.py):
one run with a node axis, into SQLite (each node's share fetched over SSH) and PostgreSQL (the
nodes write into it), a node refused before anything runs, a node killed mid-run, the
controller killed with SIGKILL and the run resumed; nothing left on any node."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from iomatrix.store import Store
from iomatrix.testing.pgserver import USER
from tests.conftest import REPO
from tests.sshnodes import SshCluster, ssh_nodes  # noqa: F401 (a fixture)

IOMATRIX = str(REPO / ".venv" / "bin" / "iomatrix")


def _suite(tmp_path: Path, cluster: SshCluster, *, workloads: int = 1, runtime: str = "1s",
           extra: str = "") -> Path:
    """A host-mode suite of short trials whose [nodes] are the cluster's (an inventory file)."""
    inventory = tmp_path / "nodes.toml"
    inventory.write_text(cluster.inventory(
        extra=f'ssh_config = "none"\ncommand = "{IOMATRIX}"\n'))
    suite = tmp_path / "cluster.toml"
    bs = ", ".join(f'"{4 << i}k"' for i in range(workloads))
    suite.write_text(f'[suite]\nname = "cluster"\n[target]\ndirectory = "{tmp_path / "target"}"\n'
                     f'size = "16MiB"\n[workloads]\nrw = ["randread"]\nbs = [{bs}]\n'
                     f'iodepth = [1]\n[method]\nmode = "host"\nramp = "0s"\n'
                     f'runtime = "{runtime}"\n{extra}[nodes]\ninventory = "nodes.toml"\n')
    return suite


def _iomatrix(cluster: SshCluster, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``iomatrix ARGS`` run as the controller (in the namespace that reaches the nodes)."""
    return subprocess.run(cluster.controller([sys.executable, "-m", "iomatrix", *args]),
                          capture_output=True, text=True, timeout=timeout, cwd=REPO)


def _nothing_left(cluster: SshCluster, tmp_path: Path) -> None:
    """No process of the run on any node or the controller, no share of a run on a node, no
    image or run directory in the target. (A node killed outright keeps what its iomatrix had
    on disk, as a machine that lost power does, until iomatrix runs there again: the test
    removes that first.)"""
    deadline = time.monotonic() + 60
    while any(cluster.leftovers(n) for n in cluster.nodes if n.alive):
        assert time.monotonic() < deadline, {n.name: cluster.leftovers(n) for n in cluster.nodes}
        time.sleep(0.2)
    from tests.sshnodes import _in_netns
    assert _in_netns(cluster.controller_netns) == [cluster.controller_holder.pid]
    for node in (n for n in cluster.nodes if n.alive):
        shares = cluster.directory / node.name / "state"
        assert not shares.exists() or list(shares.rglob("*.db")) == []
    target = tmp_path / "target"
    assert not target.exists() or list(target.iterdir()) == []


def _run(store: str) -> tuple[dict[str, str], dict[str, tuple[str, str | None]], dict[str, str]]:
    """The one run in ``store``: configuration key → node; node → (status, reason); and per
    node its trials' statuses joined ("ok ok failed")."""
    with Store(store) as s:
        run = s.load_run(1)
    nodes = {c.key: c.params.get("node", "") for c in run.configs}
    trials: dict[str, list[str]] = {}
    for t in run.trials:
        trials.setdefault(nodes[t.config_key], []).append(t.status)
    return (nodes, {n.name: (n.status, n.reason) for n in run.nodes},
            {k: " ".join(sorted(v)) for k, v in trials.items()})


def test_three_nodes_into_sqlite(ssh_nodes, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cluster: SshCluster = ssh_nodes(3)
    suite = _suite(tmp_path, cluster)
    db = str(tmp_path / "r.db")
    done = _iomatrix(cluster, "run", str(suite), "--db", db)
    assert done.returncode == 0, done.stderr
    assert "run 1: 3 nodes, 3 trials ok, 0 failed" in done.stdout
    configs, nodes, trials = _run(db)
    assert sorted(configs.values()) == ["node1", "node2", "node3"]
    assert nodes == {f"node{i}": ("done", None) for i in (1, 2, 3)}
    assert trials == {f"node{i}": "ok" for i in (1, 2, 3)}
    with Store(db) as s:
        run = s.load_run(1)
    # each node's metadata is its own (its hostname, from its own UTS namespace)
    assert [n.host["hostname"] for n in run.nodes] == ["node1", "node2", "node3"]
    shown = _iomatrix(cluster, "show", "1", "--db", db)
    assert all(f"host (bare metal) @node{i}" in shown.stdout for i in (1, 2, 3)), shown.stdout
    _nothing_left(cluster, tmp_path)


def test_three_nodes_into_postgresql(ssh_nodes, tmp_path: Path, pg_server) -> None:  # type: ignore[no-untyped-def]
    cluster: SshCluster = ssh_nodes(3)
    name = f"cluster{os.getpid()}"
    pg_server.create_database(name)
    # the nodes reach the server as the controller does; the password travels in the request
    # on the SSH session's stdin, never on a command line
    url = f"postgresql://{USER}:{pg_server.password}@/{name}?host={pg_server.socket}"
    try:
        done = _iomatrix(cluster, "run", str(_suite(tmp_path, cluster)), "--db", url)
        assert done.returncode == 0, done.stderr
        configs, nodes, trials = _run(url)
        assert sorted(configs.values()) == ["node1", "node2", "node3"]
        assert nodes == {f"node{i}": ("done", None) for i in (1, 2, 3)}
        assert trials == {f"node{i}": "ok" for i in (1, 2, 3)}
        # the nodes wrote their trials themselves: their processes are in the store, by host
        hosts = {r[0] for r in pg_server.admin("SELECT host FROM processes", dbname=name)}
        assert {"node1", "node2", "node3"} <= hosts
        assert pg_server.password not in done.stdout + done.stderr
        _nothing_left(cluster, tmp_path)
    finally:
        pg_server.admin(f'DROP DATABASE "{name}" WITH (FORCE)')


def test_an_unreachable_node_is_refused_before_anything_runs(ssh_nodes, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cluster: SshCluster = ssh_nodes(2)
    suite = _suite(tmp_path, cluster)
    ssh = (f'user = "root"\nidentity = "{cluster.identity}"\n'
           f'known_hosts = "{cluster.known_hosts}"\nssh_config = "none"\n')
    one, two = cluster.nodes
    # node1 as it should be; node2 without iomatrix; a third node where nothing answers
    (tmp_path / "nodes.toml").write_text(
        f'[[node]]\nname = "node1"\nhost = "{one.address}"\ncommand = "{IOMATRIX}"\n{ssh}'
        f'[[node]]\nname = "node2"\nhost = "{two.address}"\ncommand = "/nonexistent/iomatrix"\n{ssh}'
        f'[[node]]\nname = "gone"\nhost = "10.77.99.2"\ncommand = "{IOMATRIX}"\n{ssh}')
    db = tmp_path / "r.db"
    t = time.monotonic()
    done = _iomatrix(cluster, "run", str(suite), "--db", str(db))
    assert done.returncode == 11, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 3, done.stderr                 # one line per node refused, and a hint
    assert lines[0] == ("iomatrix: node node2: '/nonexistent/iomatrix' not found on the node "
                        "(install iomatrix there, or give the node's command in the inventory)")
    assert lines[1].startswith("iomatrix: node gone (root@10.77.99.2): unreachable over SSH: "
                               "ssh: connect to host 10.77.99.2 port 22: ")
    assert lines[2].startswith("iomatrix: hint: nothing was run or stored")
    assert time.monotonic() - t < 120               # ConnectTimeout, not TCP's minutes
    assert not db.exists()                          # nothing stored
    _nothing_left(cluster, tmp_path)


def _wait_for(proc: subprocess.Popen[str], *texts: str, log: list[str],
              timeout: float = 300) -> None:
    """Read ``proc``'s stderr into ``log`` until each of ``texts`` has been in a line."""
    assert proc.stderr is not None
    deadline = time.monotonic() + timeout
    waiting = set(texts)
    for line in proc.stderr:
        log.append(line)
        waiting -= {t for t in waiting if t in line}
        if not waiting:
            return
        assert time.monotonic() < deadline, "".join(log)
    raise AssertionError(f"{waiting} never came: {''.join(log)}")


def _start(cluster: SshCluster, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(cluster.controller([sys.executable, "-m", "iomatrix", *args]),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)


def test_a_node_killed_mid_run_fails_its_trials_and_the_others_go_on(ssh_nodes, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cluster: SshCluster = ssh_nodes(3)
    suite = _suite(tmp_path, cluster, workloads=4, runtime="2s")
    db = str(tmp_path / "r.db")
    proc = _start(cluster, "run", str(suite), "--db", db)
    log: list[str] = []
    try:
        _wait_for(proc, "node2: trial ok", log=log)
        cluster.kill(cluster.nodes[1])                 # node2 loses power
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 6, "".join(log) + err
    _, nodes, trials = _run(db)
    assert nodes["node2"][0] == "dropped" and "SSH lost node node2" in (nodes["node2"][1] or "")
    assert nodes["node1"] == nodes["node3"] == ("done", None)
    assert trials["node1"] == trials["node3"] == "ok ok ok ok"
    assert "failed" in trials["node2"] and trials["node2"].startswith("failed")
    with Store(db) as s:
        reasons = {t.reason for t in s.load_run(1).trials if t.status == "failed"}
    assert len(reasons) == 1 and "SSH lost node node2" in reasons.pop()
    left = list((tmp_path / "target").glob("iomatrix-*"))
    assert len(left) == 1 and "on node2 " in (left[0] / ".iomatrix").read_text()  # the dead node's
    shutil.rmtree(tmp_path / "target")
    _nothing_left(cluster, tmp_path)


def test_a_node_killed_stops_every_node_when_the_suite_says_so(ssh_nodes, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cluster: SshCluster = ssh_nodes(2)
    suite = _suite(tmp_path, cluster, workloads=4, runtime="2s",
                   extra='on_node_failure = "stop"\n')
    db = str(tmp_path / "r.db")
    proc = _start(cluster, "run", str(suite), "--db", db)
    log: list[str] = []
    try:
        _wait_for(proc, "node1: trial ok", "node2: trial ok", log=log)
        cluster.kill(cluster.nodes[1])
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 11, "".join(log) + err
    assert err.splitlines()[-2].startswith("iomatrix: node node2: dropped: SSH lost node node2"), err
    _, nodes, trials = _run(db)
    assert nodes["node2"][0] == "dropped"
    assert nodes["node1"] == ("pending", "stopped with the run"), err
    # what each measured is kept, nothing is called failed: --resume measures the rest
    assert "failed" not in " ".join(trials.values()), err
    assert 1 <= trials["node1"].count("ok") < 4, err   # its share so far, copied in
    with Store(db) as s:
        assert s.load_run(1).status == "interrupted"
    from tests.sshnodes import _in_netns
    deadline = time.monotonic() + 60
    while cluster.leftovers(cluster.nodes[0]) or _in_netns(cluster.controller_netns) != [
            cluster.controller_holder.pid]:
        assert time.monotonic() < deadline, cluster.leftovers(cluster.nodes[0])
        time.sleep(0.2)


def test_the_controller_killed_leaves_nothing_and_resumes(ssh_nodes, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cluster: SshCluster = ssh_nodes(3)
    suite = _suite(tmp_path, cluster, workloads=3, runtime="2s")
    db = str(tmp_path / "r.db")
    proc = _start(cluster, "run", str(suite), "--db", db)
    log: list[str] = []
    try:
        _wait_for(proc, ": trial ok", log=log)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # every node's iomatrix sees its session end, stops and cleans up: nothing left anywhere
    _nothing_left_but_shares(cluster)
    with Store(db) as s:
        assert s.load_run(1).status == "running"      # its owner died
    done = _iomatrix(cluster, "run", "--resume", "1", "--db", db)
    assert done.returncode == 0, done.stderr
    configs, nodes, trials = _run(db)
    assert nodes == {f"node{i}": ("done", None) for i in (1, 2, 3)}
    assert trials == {f"node{i}": "ok ok ok" for i in (1, 2, 3)}
    with Store(db) as s:
        assert s.load_run(1).status == "complete"
    _nothing_left(cluster, tmp_path)


def _nothing_left_but_shares(cluster: SshCluster) -> None:
    """No process of the killed run on any node or on the controller (a node's share of the
    run stays on the node, for --resume)."""
    from tests.sshnodes import _in_netns

    deadline = time.monotonic() + 90
    while (any(cluster.leftovers(n) for n in cluster.nodes)
           or _in_netns(cluster.controller_netns) != [cluster.controller_holder.pid]):
        assert time.monotonic() < deadline, (
            {n.name: cluster.leftovers(n) for n in cluster.nodes},
            _in_netns(cluster.controller_netns))
        time.sleep(0.2)
