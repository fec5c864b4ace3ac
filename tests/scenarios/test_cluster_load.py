"""Cluster load (issue 23, ``[method] concurrent_nodes``): one fio client here drives the fio
servers of several nodes in the same trial, and each node's figures and the cluster's aggregate
are stored like a single host's."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from iomatrix.core.proc import stop, wait_for
from iomatrix.fio.parse import parse_fio_output, version_of
from iomatrix.fio.run import run_fio
from iomatrix.fio.samples import samples_of, start_skew_ms, vm_samples_of
from iomatrix.store import Store
from iomatrix.store.location import parse_location
from iomatrix.cli.status import ExitStatus
from iomatrix.core.errors import SuiteError
from iomatrix.measure.runner import run_suite
from iomatrix.suite import load_suite, load_suite_text
from iomatrix.store.records import StoredRun
from tests.conftest import REPO, cli_result, write_suite
from tests.sshnodes import SshCluster, SshNode, _cmdline, _in_netns, ssh_nodes  # noqa: F401

IOMATRIX = str(REPO / ".venv" / "bin" / "iomatrix")

FIXTURES = Path(__file__).parents[1] / "fixtures/fio"
JOB = """[global]
ioengine=psync
filename={file}
size=4M
rw=randread
bs=4k
time_based=1
runtime=1
[t]
"""


def test_start_skew_from_fios_own_job_start() -> None:
    new = parse_fio_output((FIXTURES / "3.41/client2-randread.out").read_text())
    starts = sorted(j.job_start_ms for j in new.jobs if j.job_start_ms is not None)
    assert len(starts) == 2 and start_skew_ms(new) == starts[1] - starts[0]
    old = parse_fio_output((FIXTURES / "3.33/client2-randread.out").read_text())
    assert start_skew_ms(old) is None          # fio before 3.36 writes no job start


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[list[Path]]:
    """Two fio servers on Unix sockets of the test's directory (as nodes' forwards are)."""
    socks = [tmp_path / f"s{i}.sock" for i in range(2)]
    procs = [subprocess.Popen(["fio", f"--server=sock:{s}"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True) for s in socks]
    try:
        assert wait_for(lambda: all(s.is_socket() for s in socks), timeout=20)
        yield socks
    finally:
        for proc in procs:
            stop(proc)


@pytest.mark.slow
def test_one_client_drives_every_server_in_the_same_trial(tmp_path: Path,
                                                          servers: list[Path]) -> None:
    work = tmp_path / "w"
    work.mkdir()
    fio = run_fio(JOB.format(file=tmp_path / "target"), workdir=work, timeout=60,
                  clients=[f"sock:{s}" for s in servers], output_format="json+")
    assert fio.argv[-4:] == (f"--client=sock:{servers[0]}", str(work / "job.fio"),
                             f"--client=sock:{servers[1]}", str(work / "job.fio"))
    (aggregate,) = samples_of(fio.result)
    per_node = vm_samples_of(fio.result, [str(s) for s in servers])
    assert [s.vm for s in per_node] == [0, 1]
    by_host = {j.hostname: j.read.total_ios for j in fio.result.jobs}
    assert [s.total_ios for s in per_node] == [by_host[str(s)] for s in servers]
    assert aggregate.total_ios == sum(s.total_ios for s in per_node) > 0


# --- over SSH: nodes made by tests/sshnodes.py -----------------------------------------------

SUITE = """
[workloads]
rw = "randread"
iodepth = 4
[method]
mode = "host"
engine = "psync"
ramp = 0
runtime = "1s"
samples = 2
seed = 5
concurrent_nodes = true
"""


def run_controller(cluster: SshCluster, tmp_path: Path, db: str, body: str = SUITE,
                   ) -> subprocess.Popen[str]:
    """``iomatrix run`` of ``body`` on the cluster's nodes, started as the controller (in the
    namespace that reaches the nodes)."""
    suite = write_suite(tmp_path, body, size="8MiB")
    inventory = tmp_path / "nodes.toml"
    inventory.write_text(cluster.inventory(extra=f'ssh_config = "none"\ncommand = "{IOMATRIX}"\n'))
    argv = [sys.executable, "-m", "iomatrix", "run", str(suite), "--nodes", str(inventory),
            "--db", db]
    return subprocess.Popen(cluster.controller(argv), cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "TMPDIR": str(tmp_path)})


def finished(proc: subprocess.Popen[str], db: str) -> StoredRun:
    """The run ``proc`` stored in ``db``, once it ended."""
    out, err = proc.communicate(timeout=300)
    assert out.startswith("run 1:"), err
    with Store(parse_location(db)) as store:
        return store.load_run(1)


def fio_on(cluster: SshCluster, node: SshNode) -> list[int]:
    """The fio processes on ``node``: its server, and those it forked for a job."""
    return [pid for pid in cluster.processes(node) if _cmdline(pid).startswith("fio ")]


def left_behind(cluster: SshCluster, tmp_path: Path) -> list[str]:
    """fio servers, SSH sessions, forwards' sockets and node directories still there (once the
    run ended: the node-directory lock is taken exclusive first, so no other xdist worker's
    nodes hold one)."""
    cluster.check_directories()
    left = [p for node in cluster.nodes if node.alive for p in cluster.leftovers(node)]
    left += [str(p) for p in Path("/tmp").glob("iomatrix-fio-*")]
    left += [str(p) for p in tmp_path.rglob("*.sock")]
    left += [f"{pid} (controller)" for pid in _in_netns(cluster.controller_netns)
             if pid != cluster.controller_holder.pid]
    return left


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_three_nodes_load_the_target_at_once(ssh_nodes: Callable[[int], SshCluster],
                                             tmp_path: Path, backend: str,
                                             request: pytest.FixtureRequest) -> None:
    cluster = ssh_nodes(3)
    db = str(tmp_path / "r.db") if backend == "sqlite" else request.getfixturevalue("pg_url")
    proc = run_controller(cluster, tmp_path, db)
    run = finished(proc, db)
    assert proc.returncode == 0 and [t.status for t in run.trials] == ["ok", "ok"]
    assert [n.name for n in run.nodes] == [n.name for n in cluster.nodes]
    assert run.host["nodes"] == ", ".join(n.name for n in cluster.nodes)
    rounds: dict[str, list[int]] = {}
    for trial in run.trials:
        rounds.setdefault(trial.workload_key, []).append(trial.sample_index)
        assert trial.applied["cluster.nodes"] == ", ".join(
            f"vm{i}={n.name}" for i, n in enumerate(cluster.nodes))
        new_fio = (version_of(trial.tool or "") or (0, 0, 0)) >= (3, 36, 0)   # job_start
        assert re.fullmatch(r"\d+ ms" if new_fio else "not measured: .*",
                            trial.applied["cluster.start_skew"])
        (aggregate,) = trial.samples
        per_node = sorted(trial.vm_samples, key=lambda s: s.vm or 0)
        assert [s.vm for s in per_node] == [0, 1, 2]
        assert all(s.total_ios > 0 for s in per_node)
        assert aggregate.total_ios == sum(s.total_ios for s in per_node)
    assert sorted(map(sorted, rounds.values())) == [[0, 1]]   # one trial a round, paired by it
    assert left_behind(cluster, tmp_path) == []
    shown = cli_result("show", "1", "--db", db)
    assert "nodes, loading the target at once in every trial: node1, node2, node3" in shown.stdout
    compared = cli_result("compare", "1", "--db", db)
    assert compared.returncode != 0 and "from every node at once" in compared.stderr


@pytest.mark.slow
def test_a_node_whose_server_drops_fails_the_trial_naming_it(
        ssh_nodes: Callable[[int], SshCluster], tmp_path: Path) -> None:
    cluster = ssh_nodes(3)
    body = SUITE.replace('"1s"', '"3s"')
    proc = run_controller(cluster, tmp_path, str(tmp_path / "r.db"), body)
    victim = cluster.nodes[2]
    # the first trial runs once the victim's server forked a process for its job
    assert wait_for(lambda: len(fio_on(cluster, victim)) > 1 or proc.poll() is not None,
                    timeout=120)
    for pid in fio_on(cluster, victim):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    run = finished(proc, str(tmp_path / "r.db"))
    assert proc.returncode == ExitStatus.TRIALS_FAILED
    (failed,) = [t for t in run.trials if t.status == "failed"]   # the next round has it again
    assert failed.sample_index == 0
    assert f"node {victim.name} dropped: its SSH session ended" in (failed.reason or "")
    assert "fio --server ended" in (failed.reason or "")
    assert left_behind(cluster, tmp_path) == []


@pytest.mark.slow
def test_a_killed_controller_leaves_nothing_on_the_nodes_and_resumes(
        ssh_nodes: Callable[[int], SshCluster], tmp_path: Path) -> None:
    cluster = ssh_nodes(2)
    db = str(tmp_path / "r.db")
    proc = run_controller(cluster, tmp_path, db, SUITE.replace('"1s"', '"3s"'))
    # the first trial runs once the last node's server forked a process for its job
    assert wait_for(lambda: len(fio_on(cluster, cluster.nodes[-1])) > 1 or proc.poll() is not None,
                    timeout=120)
    proc.kill()                                            # kill -9: no clean-up of its own
    proc.communicate(timeout=30)
    assert wait_for(lambda: not any(cluster.leftovers(n) for n in cluster.nodes), timeout=30), \
        [cluster.leftovers(n) for n in cluster.nodes]
    cluster.check_directories()           # its nodes' sessions ended: none of theirs is held
    assert wait_for(lambda: not list(Path("/tmp").glob("iomatrix-fio-*")), timeout=30)
    # its nodes named again, by the inventory that named them (a stored row's command is not
    # taken on trust)
    resumed = subprocess.Popen(cluster.controller(
        [sys.executable, "-m", "iomatrix", "run", "--resume", "1", "--nodes",
         str(tmp_path / "nodes.toml"), "--db", db]), cwd=REPO,
        text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "TMPDIR": str(tmp_path)})
    run = finished(resumed, db)
    assert resumed.returncode == 0 and [t.status for t in run.trials] == ["ok", "ok"]
    assert all(len(t.vm_samples) == 2 for t in run.trials)
    assert left_behind(cluster, tmp_path) == []


@pytest.mark.parametrize("extra, says", [
    ('mode = "host"\nsteady_state = true', "only when the trial ends"),
    ('mode = "host"\non_node_failure = "stop"', "not built for concurrent_nodes"),
])
def test_what_cluster_load_refuses(extra: str, says: str) -> None:
    with pytest.raises(SuiteError, match=says):
        load_suite_text(f'[suite]\nname = "t"\n[method]\nconcurrent_nodes = true\n{extra}\n')


def test_cluster_load_needs_nodes(tmp_path: Path) -> None:
    suite = load_suite(write_suite(tmp_path, SUITE))
    with Store(tmp_path / "r.db") as store, pytest.raises(SuiteError, match="--nodes"):
        run_suite(suite, store)
    assert not (tmp_path / "target").exists()


@pytest.mark.slow
def test_a_controller_killed_while_nodes_start_leaves_nothing(
        ssh_nodes: Callable[[int], SshCluster], tmp_path: Path) -> None:
    cluster = ssh_nodes(2)
    proc = run_controller(cluster, tmp_path, str(tmp_path / "r.db"))
    # the nodes' sessions are starting: a shell on a node (not the preflight's iomatrix)
    assert wait_for(lambda: any(_cmdline(p).startswith("sh -c set -u") for n in cluster.nodes
                                for p in cluster.processes(n)) or proc.poll() is not None,
                    timeout=120, interval=0.005)
    proc.kill()
    proc.communicate(timeout=30)
    assert wait_for(lambda: not any(cluster.leftovers(n) for n in cluster.nodes), timeout=30), \
        [cluster.leftovers(n) for n in cluster.nodes]
    cluster.check_directories()           # its nodes' sessions ended: none of theirs is held
    assert wait_for(lambda: not list(Path("/tmp").glob("iomatrix-fio-*")), timeout=30)
