"""A suite on every node of a cluster (issue 23), against real sshd nodes (tests/sshnodes.py):
one run with a node axis, into SQLite (each node's share fetched over SSH) and PostgreSQL (the
nodes write into it), a node refused before anything runs, a node killed mid-run, the
controller killed with SIGKILL and the run resumed; nothing left on any node."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from iomatrix.cluster.ssh import CONNECT_TIMEOUT
from iomatrix.measure.cluster import PREFLIGHT_TIMEOUT
from iomatrix.store import Store
from iomatrix.testing.pgserver import USER
from tests.conftest import BOOT_TIMEOUT, REPO, cli_result
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


def _iomatrix_on_a_terminal(cluster: SshCluster, *args: str,
                            timeout: float = 600) -> tuple[int, str, str]:
    """``_iomatrix`` with its stderr a terminal (160 columns): its exit status, stdout, and what
    the terminal got (escape sequences removed, carriage returns kept)."""
    import pty

    main, child = pty.openpty()
    proc = subprocess.Popen(cluster.controller([sys.executable, "-m", "iomatrix", *args]),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=child,
                            text=True, cwd=REPO,
                            env={**os.environ, "TERM": "xterm", "COLUMNS": "160", "LINES": "40"})
    os.close(child)
    got = bytearray()

    def read() -> None:
        with contextlib.suppress(OSError):      # EIO: every writer has closed the terminal
            while chunk := os.read(main, 65536):
                got.extend(chunk)
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        stdout, _ = proc.communicate(timeout=timeout)
        reader.join(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(main)
    return (proc.returncode, stdout,
            re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", got.decode(errors="replace")))


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


@pytest.mark.slow
def test_three_nodes_into_sqlite(ssh_nodes, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cluster: SshCluster = ssh_nodes(3)
    suite = _suite(tmp_path, cluster)
    db = str(tmp_path / "r.db")
    done = _iomatrix(cluster, "run", str(suite), "--db", db)
    assert done.returncode == 0, done.stderr
    assert "run 1: 3 nodes, 3 trials ok, 0 failed" in done.stdout
    # progress into a pipe: plain lines, no bar redrawn with carriage returns or escapes; a
    # line per trial with the node's count, all nodes' and the ETA; a line per node event
    assert "\r" not in done.stderr and "\x1b" not in done.stderr, repr(done.stderr)
    lines = done.stderr.splitlines()
    assert re.fullmatch(r"3 trials on 3 nodes at once, about \d+ s planned: node1 1, node2 1, "
                        r"node3 1", lines[0]), done.stderr
    for i in (1, 2, 3):
        assert any(re.fullmatch(rf"node{i}: 1 trials, about \d+ s planned", line)
                   for line in lines), done.stderr
        assert any(re.fullmatch(rf"node{i} \[1/1\] ok: host \(bare metal\) @node{i} · 4k "
                                r"randread QD1: .+ \(all nodes [123]/3, ETA \d+:\d\d\)", line)
                   for line in lines), done.stderr
        assert f"node{i}: done, 1 trials ok, 0 failed" in lines, done.stderr
    assert len([line for line in lines if not line.startswith("note: ")]) == 10, done.stderr
    configs, nodes, trials = _run(db)
    assert sorted(configs.values()) == ["node1", "node2", "node3"]
    assert nodes == {f"node{i}": ("done", None) for i in (1, 2, 3)}
    assert trials == {f"node{i}": "ok" for i in (1, 2, 3)}
    with Store(db) as s:
        run = s.load_run(1)
    # each node's metadata is its own (its hostname, from its own UTS namespace)
    assert [n.host["hostname"] for n in run.nodes] == ["node1", "node2", "node3"]
    # what reads the store runs in this process: it needs no node
    shown = cli_result("show", "1", "--db", db)
    assert all(f"host (bare metal) @node{i}" in shown.stdout for i in (1, 2, 3)), shown.stdout
    assert "nodes: node1 (node1): done; node2 (node2): done; node3 (node3): done" in shown.stdout
    # the nodes compared as a fleet, each against the first
    compared = cli_result("compare", "1", "--db", db)
    assert compared.returncode == 0, compared.stderr
    assert [line.split()[0] for line in compared.stdout.splitlines()
            if line.startswith("node") and "(run 1)" in line] == ["node2", "node3"]
    # `runs --host` finds a cluster run by any of its nodes, as by its controller
    for host in ("node2", socket.gethostname()):
        listed = cli_result("runs", "--db", db, "--host", host)
        assert "3 nodes: node1, node2, node3" in listed.stdout, (host, listed.stdout)
    assert cli_result("runs", "--db", db, "--host", "node4").stdout.strip() == "no runs match"
    # a copy of the run keeps its nodes
    copied = cli_result("db", "copy", db, str(tmp_path / "copy.db"))
    assert copied.returncode == 0, copied.stderr
    with Store(str(tmp_path / "copy.db")) as s:
        assert s.load_run(1).nodes == run.nodes
    _nothing_left(cluster, tmp_path)


def _pg_with_password(request: pytest.FixtureRequest) -> str:
    """A new database on the session's server (``pg_url``), its URL with the password: the
    password never leaves the controller, so the nodes keep their shares and the controller
    copies them in, as with SQLite."""
    url = request.getfixturevalue("pg_url")
    password = request.getfixturevalue("pg_server").password
    return url.replace(f"postgresql://{USER}@", f"postgresql://{USER}:{password}@", 1)


def _pg_the_nodes_log_in_to(cluster: SshCluster, request: pytest.FixtureRequest) -> str:
    """A new database on the session's server (``pg_url``, no password in it), which each node
    logs in to with its own credentials (the password in the ``~/.pgpass`` of its home): the
    nodes write their trials into it themselves."""
    url = request.getfixturevalue("pg_url")
    for node in cluster.nodes:
        pgpass = cluster.directory / node.name / "home" / ".pgpass"
        pgpass.write_text(request.getfixturevalue("pg_server").pgpass.read_text())
        pgpass.chmod(0o600)
    return url


@pytest.mark.slow
def test_three_nodes_into_postgresql(ssh_nodes, tmp_path: Path, request: pytest.FixtureRequest) -> None:  # type: ignore[no-untyped-def]
    cluster: SshCluster = ssh_nodes(3)
    url = _pg_the_nodes_log_in_to(cluster, request)
    # on a terminal: a bar per node and one for all nodes, each with its count and ETA; the
    # node events as lines; no line per trial
    code, stdout, shown = _iomatrix_on_a_terminal(cluster, "run", str(_suite(tmp_path, cluster)),
                                                  "--db", url)
    assert code == 0, shown
    assert "\r" in shown, shown                              # the bars, redrawn
    drawn = {line.strip() for line in shown.replace("\r", "\n").splitlines()}
    for i in (1, 2, 3):
        assert any(re.fullmatch(rf"node{i} +\S+ 1/1 +done +[0-9:]+ ETA 0:00", line)
                   for line in drawn), shown
        assert f"node{i}: done, 1 trials ok, 0 failed" in drawn, shown
        assert f"node{i} [1/1]" not in shown
    # all nodes: their count, and an ETA from iomatrix's estimate before any trial ended
    assert any(re.fullmatch(r"all nodes +\S+ 0/3 +[0-9:]+ ETA (?!0:00)\d+:\d\d", line)
               for line in drawn), shown
    assert any(re.fullmatch(r"all nodes +\S+ 3/3 +[0-9:]+ ETA 0:00", line)
               for line in drawn), shown
    configs, nodes, trials = _run(url)
    assert sorted(configs.values()) == ["node1", "node2", "node3"]
    assert nodes == {f"node{i}": ("done", None) for i in (1, 2, 3)}
    assert trials == {f"node{i}": "ok" for i in (1, 2, 3)}
    # the nodes wrote their trials themselves: their processes are in the store, by host
    with Store(url) as s:
        hosts = {r[0] for r in s.conn.execute("SELECT host FROM processes").fetchall()}
    assert {"node1", "node2", "node3"} <= hosts
    assert request.getfixturevalue("pg_server").password not in stdout + shown
    _nothing_left(cluster, tmp_path)


@pytest.mark.slow
def test_nodes_unlike_the_controller_are_refused_before_anything_runs(ssh_nodes, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cluster: SshCluster = ssh_nodes(3)
    suite = _suite(tmp_path, cluster)
    ssh = (f'user = "root"\nidentity = "{cluster.identity}"\n'
           f'known_hosts = "{cluster.known_hosts}"\nssh_config = "none"\n')
    # node2's iomatrix finds another fio first: a stand-in that only says its version (a second
    # fio version cannot be installed beside Debian's), so it is never run to measure
    bin_dir = tmp_path / "otherfio"
    bin_dir.mkdir()
    (bin_dir / "fio").write_text("#!/bin/sh\n# stand-in: another fio version\necho fio-3.99\n")
    wrapper = tmp_path / "iomatrix-otherfio"
    wrapper.write_text(f'#!/bin/sh\nPATH={bin_dir}:$PATH exec {IOMATRIX} "$@"\n')
    for script in (bin_dir / "fio", wrapper):
        script.chmod(0o755)
    one, two, three = cluster.nodes
    # node1 swallowing every packet (a firewall that drops); node2 with another fio; node3
    # without iomatrix; a fourth node at an address no route leads to
    cluster.swallow(one)
    (tmp_path / "nodes.toml").write_text(
        f'[[node]]\nname = "node1"\nhost = "{one.address}"\ncommand = "{IOMATRIX}"\n{ssh}'
        f'[[node]]\nname = "node2"\nhost = "{two.address}"\ncommand = "{wrapper}"\n{ssh}'
        f'[[node]]\nname = "node3"\nhost = "{three.address}"\ncommand = "/nonexistent/iomatrix"\n{ssh}'
        f'[[node]]\nname = "gone"\nhost = "10.77.99.2"\ncommand = "{IOMATRIX}"\n{ssh}')
    # the plan names the nodes without reaching them
    plan = cli_result("run", str(suite), "--plan")
    assert plan.returncode == 0, plan.stderr
    assert ("on each of 4 nodes, over SSH: node1 (root@10.77.1.2), node2 (root@10.77.2.2), "
            "node3 (root@10.77.3.2), gone (root@10.77.99.2)") in plan.stdout
    db = tmp_path / "r.db"
    t = time.monotonic()
    done = _iomatrix(cluster, "run", str(suite), "--db", str(db))
    took = time.monotonic() - t
    assert done.returncode == 11, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 5, done.stderr                 # one line per node refused, and a hint
    # SSH's ConnectTimeout gave up on node1, not TCP (its SYN retries take 127 s) nor iomatrix's
    # bound on a preflight (PREFLIGHT_TIMEOUT: "no answer within 120 s")
    assert lines[0] == ("iomatrix: node node1 (root@10.77.1.2): unreachable over SSH: ssh: "
                        "connect to host 10.77.1.2 port 22: Connection timed out"), done.stderr
    assert CONNECT_TIMEOUT <= took < PREFLIGHT_TIMEOUT
    fio = subprocess.run(["fio", "--version"], capture_output=True, text=True, timeout=30)
    assert lines[1] == (f"iomatrix: node node2: fio is fio-3.99, the controller's is "
                        f"{fio.stdout.strip()}")
    assert lines[2] == ("iomatrix: node node3: '/nonexistent/iomatrix' not found on the node "
                        "(install iomatrix there, or give the node's command in the inventory)")
    assert lines[3].startswith("iomatrix: node gone (root@10.77.99.2): unreachable over SSH: "
                               "ssh: connect to host 10.77.99.2 port 22: ")
    assert lines[4].startswith("iomatrix: hint: nothing was run or stored")
    assert not db.exists()                          # nothing stored
    cluster.swallow(one, on=False)
    # a target too small for the images, on every node: each node says so
    suite.write_text(suite.read_text().replace('size = "16MiB"', 'size = "64PiB"'))
    (tmp_path / "nodes.toml").write_text(cluster.inventory(
        extra=f'ssh_config = "none"\ncommand = "{IOMATRIX}"\n'))
    small = _iomatrix(cluster, "run", str(suite), "--db", str(db))
    assert small.returncode == 11, small.stderr
    refused = small.stderr.splitlines()[:-1]
    assert [line.split(":")[1].strip() for line in refused] == ["node node1", "node node2",
                                                                 "node node3"], small.stderr
    assert all("free" in line for line in refused), small.stderr
    assert not db.exists()
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


def _interrupted(cluster: SshCluster, suite: Path, db: str, waits: tuple[str, ...],
                 act: Callable[[subprocess.Popen[str]], None]) -> tuple[int, str]:
    """Run ``suite`` as the controller; once its progress has said each of ``waits``, ``act``
    on it (kill a node, signal the controller); its exit status and stderr once it ended."""
    proc = subprocess.Popen(
        cluster.controller([sys.executable, "-m", "iomatrix", "run", str(suite), "--db", db]),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    log: list[str] = []
    try:
        _wait_for(proc, *waits, log=log)
        act(proc)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, "".join(log) + err


@pytest.mark.slow
def test_nodes_lost_mid_run_fail_their_trials_and_the_others_go_on(ssh_nodes, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cluster: SshCluster = ssh_nodes(3)
    suite = _suite(tmp_path, cluster, workloads=4, runtime="2s")
    db = str(tmp_path / "r.db")
    node1, node2, node3 = cluster.nodes

    def lose(proc: subprocess.Popen[str]) -> None:
        cluster.kill(node2)            # loses power
        cluster.swallow(node3)         # goes silent (its link up), and runs on
    code, err = _interrupted(cluster, suite, db, ("node2 [1/4] ok", "node3 [1/4] ok"), lose)
    assert code == 6, err
    _, nodes, trials = _run(db)
    assert nodes["node1"] == ("done", None)
    assert trials["node1"] == "ok ok ok ok"
    for name in ("node2", "node3"):
        status, reason = nodes[name]
        assert status == "dropped" and reason is not None and reason.startswith(
            f"SSH lost node {name}: "), nodes
        # what the controller had not received fails, with the reason; nothing is lost silently
        assert trials[name].startswith("failed") and len(trials[name].split()) == 4, trials
    # the silent node: SSH's keepalives (ServerAliveInterval × ServerAliveCountMax) gave up
    assert nodes["node3"][1] == "SSH lost node node3: Timeout, server 10.77.3.2 not responding.", nodes
    assert ("node3: dropped, 0 trials ok, 4 failed: SSH lost node node3: Timeout, server "
            "10.77.3.2 not responding.") in err.splitlines(), err
    with Store(db) as s:
        reasons = {t.reason for t in s.load_run(1).trials if t.status == "failed"}
    assert reasons == {nodes["node2"][1], nodes["node3"][1]}
    # node3 runs on: its sshd gave up on the controller, its iomatrix saw the session end and
    # cleaned up as on Ctrl-C (images removed); node2 died with its images on disk
    deadline = time.monotonic() + 120
    while cluster.leftovers(node3):
        assert time.monotonic() < deadline, cluster.leftovers(node3)
        time.sleep(0.5)
    left = list((tmp_path / "target").glob("iomatrix-*"))
    assert len(left) == 1 and "on node2 " in (left[0] / ".iomatrix").read_text(), left
    shutil.rmtree(tmp_path / "target")
    for path in (cluster.directory / "node3" / "state").rglob("*.db"):
        path.unlink()                  # node3's share, which the controller could not fetch
    _nothing_left(cluster, tmp_path)


@pytest.mark.slow
def test_a_node_killed_stops_every_node_when_the_suite_says_so(ssh_nodes, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cluster: SshCluster = ssh_nodes(2)
    suite = _suite(tmp_path, cluster, workloads=4, runtime="2s",
                   extra='on_node_failure = "stop"\n')
    db = str(tmp_path / "r.db")
    code, err = _interrupted(cluster, suite, db, ("node1 [1/4] ok", "node2 [1/4] ok"),
                             lambda proc: cluster.kill(cluster.nodes[1]))
    assert code == 11, err
    assert err.splitlines()[-2].startswith("iomatrix: node node2: dropped: SSH lost node node2"), err
    _, nodes, trials = _run(db)
    assert nodes["node2"][0] == "dropped"
    assert nodes["node1"] == ("pending", "stopped with the run"), err
    # what each measured is kept, nothing is called failed: --resume measures the rest
    assert "failed" not in " ".join(trials.values()), err
    assert 1 <= trials["node1"].count("ok") < 4, err   # its share so far, copied in
    with Store(db) as s:
        assert s.load_run(1).status == "interrupted"
    _nothing_left_but_shares(cluster)


@pytest.mark.slow
def test_a_node_that_fails_after_measuring_keeps_what_it_measured(ssh_nodes, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A node's iomatrix that ends with an error after its trials were stored (as one did when
    its clean-up raced another node's over a shared target) fails the node, with what it said,
    but its share is still copied in: no measured trial is called failed."""
    cluster: SshCluster = ssh_nodes(2)
    suite = _suite(tmp_path, cluster, workloads=2)
    wrapper = tmp_path / "fails-after.sh"
    wrapper.write_text(f'#!/bin/sh\nif [ "$1 $2" = "node run" ]; then "{IOMATRIX}" "$@"\n'
                       f'  echo "the clean-up failed (injected)" >&2; exit 1; fi\n'
                       f'exec "{IOMATRIX}" "$@"\n')
    wrapper.chmod(0o755)
    inventory = tmp_path / "nodes.toml"
    first, second = inventory.read_text().split("[[node]]")[1:]
    inventory.write_text("[[node]]" + first + "[[node]]"
                         + second.replace(f'command = "{IOMATRIX}"', f'command = "{wrapper}"'))
    db = str(tmp_path / "r.db")
    done = _iomatrix(cluster, "run", str(suite), "--db", db)
    assert done.returncode == 11, done.stderr     # every trial ok, but a node ended in error
    assert done.stderr.splitlines()[-1] == (
        "iomatrix: 1 node(s) ended with an error after measuring their share (said above): "
        "check what they left behind"), done.stderr
    assert ("node2: failed, 2 trials ok, 0 failed: iomatrix on node node2 ended with exit "
            "status 1: the clean-up failed (injected)") in done.stderr.splitlines(), done.stderr
    _, nodes, trials = _run(db)
    assert nodes["node1"] == ("done", None)
    assert nodes["node2"] == ("failed", "iomatrix on node node2 ended with exit status 1: "
                                        "the clean-up failed (injected)"), done.stderr
    assert trials == {"node1": "ok ok", "node2": "ok ok"}, done.stderr
    _nothing_left(cluster, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("store", ["sqlite", "postgresql"])
def test_the_controller_killed_leaves_nothing_and_resumes(ssh_nodes, tmp_path: Path, store: str,
                                                          request: pytest.FixtureRequest) -> None:  # type: ignore[no-untyped-def]
    cluster: SshCluster = ssh_nodes(3)
    suite = _suite(tmp_path, cluster, workloads=3, runtime="2s")
    db = str(tmp_path / "r.db") if store == "sqlite" else _pg_with_password(request)
    _interrupted(cluster, suite, db, ("] ok: ",), lambda proc: proc.send_signal(signal.SIGKILL))
    # every node's iomatrix sees its session end, stops and cleans up: nothing left anywhere
    _nothing_left_but_shares(cluster)
    with Store(db) as s:
        assert s.load_run(1).status == "running"      # its owner died
    done = _iomatrix(cluster, "run", "--resume", "1", "--db", db)
    assert done.returncode == 0, done.stderr
    _, nodes, trials = _run(db)
    assert nodes == {f"node{i}": ("done", None) for i in (1, 2, 3)}
    assert trials == {f"node{i}": "ok ok ok" for i in (1, 2, 3)}
    with Store(db) as s:
        assert s.load_run(1).status == "complete"
    _nothing_left(cluster, tmp_path)


@pytest.mark.slow
def test_ctrl_c_on_the_controller_stops_every_node(ssh_nodes, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cluster: SshCluster = ssh_nodes(2)
    suite = _suite(tmp_path, cluster, workloads=3, runtime="2s")
    db = str(tmp_path / "r.db")
    code, err = _interrupted(cluster, suite, db, ("] ok: ",),
                             lambda proc: proc.send_signal(signal.SIGINT))
    assert code == 130, err
    assert "interrupted: every node was stopped" in err
    with Store(db) as s:
        assert s.load_run(1).status == "interrupted"
    # the nodes had stopped and cleaned up before the controller exited
    assert all(cluster.leftovers(n) == [] for n in cluster.nodes)
    assert list((tmp_path / "target").glob("iomatrix-*")) == []     # images removed
    _nothing_left_but_shares(cluster)


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


@pytest.mark.slow
def test_three_nodes_one_guest_each(ssh_nodes, tmp_path: Path,  # type: ignore[no-untyped-def]
                                   host_appliance: Path) -> None:
    """Guest mode on every node: each node boots its own appliance VM (emulated: TCG) and
    measures it; one short trial each."""
    cluster: SshCluster = ssh_nodes(3)
    suite = _suite(tmp_path, cluster)
    suite.write_text(suite.read_text().replace('mode = "host"\n', (
        'mode = "guest"\naccel = "tcg"\nvcpus = 1\nmemory = "384MiB"\n' + BOOT_TIMEOUT
    )).replace("[workloads]", '[matrix]\ncontroller = "virtio-blk"\n[workloads]'))
    db = str(tmp_path / "r.db")
    done = _iomatrix(cluster, "run", str(suite), "--db", db, timeout=900)
    assert done.returncode == 0, done.stderr
    _, nodes, trials = _run(db)
    assert nodes == {f"node{i}": ("done", None) for i in (1, 2, 3)}
    assert trials == {f"node{i}": "ok" for i in (1, 2, 3)}
    with Store(db) as s:
        run = s.load_run(1)
    assert all(t.accelerator == "tcg" and "qemu-system-x86_64" in t.command for t in run.trials)
    _nothing_left(cluster, tmp_path)
