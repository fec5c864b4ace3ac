"""Cluster load (issue 23, ``[method] concurrent_nodes``): one fio client here drives the fio
servers of several nodes in the same trial, and each node's figures and the cluster's aggregate
are stored like a single host's."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from iomatrix.core.proc import stop, wait_for
from iomatrix.fio.parse import parse_fio_output
from iomatrix.fio.run import run_fio
from iomatrix.fio.samples import samples_of, start_skew_ms, vm_samples_of
from iomatrix.store import Store
from iomatrix.store.location import parse_location
from tests.conftest import write_suite
from tests.sshnodes import SshCluster, SshNode, _cmdline, _in_netns, ssh_nodes  # noqa: F401

ROOT = Path(__file__).parent.parent

FIXTURES = Path(__file__).parent / "fixtures/fio"
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


def control(suite: str, inventory: str, db: str) -> None:
    """The controller (run inside the nodes' controller namespace by the tests): ``suite``
    measured on the nodes of ``inventory`` into ``db``."""
    from iomatrix.cluster.ssh import load_inventory
    from iomatrix.measure.runner import run_suite
    from iomatrix.store import Store
    from iomatrix.store.location import parse_location
    from iomatrix.suite import load_suite

    with Store(parse_location(db)) as store:
        outcome = run_suite(load_suite(suite), store, nodes=load_inventory(Path(inventory)))
    print(json.dumps({"run": outcome.run_id, "ok": outcome.trials_ok,
                      "failed": outcome.trials_failed}))


def run_controller(cluster: SshCluster, tmp_path: Path, db: str, body: str = SUITE,
                   **popen: object) -> subprocess.Popen[str]:
    suite = write_suite(tmp_path, body, size="8MiB")
    inventory = tmp_path / "nodes.toml"
    inventory.write_text(cluster.inventory())
    argv = [sys.executable, "-c", "import sys; from tests.test_cluster_load import control; "
            "control(*sys.argv[1:])", str(suite), str(inventory), db]
    return subprocess.Popen(cluster.controller(argv), cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "TMPDIR": str(tmp_path)}, **popen)  # type: ignore[call-overload]


def fio_on(cluster: SshCluster, node: SshNode) -> list[int]:
    """The fio processes on ``node``: its server, and those it forked for a job."""
    return [pid for pid in cluster.processes(node) if _cmdline(pid).startswith("fio ")]


def left_behind(cluster: SshCluster, tmp_path: Path) -> list[str]:
    """fio servers, SSH sessions, forwards' sockets and node directories still there."""
    left = [p for node in cluster.nodes if node.alive for p in cluster.leftovers(node)]
    left += [str(p) for p in Path("/tmp").glob("iomatrix-fio-*")]
    left += [str(p) for p in tmp_path.rglob("*.sock")]
    left += [f"{pid} (controller)" for pid in _in_netns(cluster.controller_netns)
             if pid != cluster.controller_holder.pid]
    return left


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_three_nodes_load_the_target_at_once(ssh_nodes: Callable[[int], SshCluster],
                                             tmp_path: Path, backend: str,
                                             request: pytest.FixtureRequest) -> None:
    cluster = ssh_nodes(3)
    db = str(tmp_path / "r.db") if backend == "sqlite" else request.getfixturevalue("pg_url")
    proc = run_controller(cluster, tmp_path, db)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    done = json.loads(out.splitlines()[-1])
    assert (done["ok"], done["failed"]) == (2, 0), err
    with Store(parse_location(db)) as store:
        run = store.load_run(done["run"])
    assert run.host["nodes"] == ", ".join(n.address for n in cluster.nodes)
    rounds: dict[str, list[int]] = {}
    for trial in run.trials:
        rounds.setdefault(trial.workload_key, []).append(trial.sample_index)
        assert trial.applied["cluster.nodes"] == ", ".join(
            f"vm{i}={n.address}" for i, n in enumerate(cluster.nodes))
        assert "cluster.start_skew" in trial.applied
        (aggregate,) = trial.samples
        per_node = sorted(trial.vm_samples, key=lambda s: s.vm or 0)
        assert [s.vm for s in per_node] == [0, 1, 2]
        assert all(s.total_ios > 0 for s in per_node)
        assert aggregate.total_ios == sum(s.total_ios for s in per_node)
    assert sorted(map(sorted, rounds.values())) == [[0, 1]]   # one trial a round, paired by it
    assert left_behind(cluster, tmp_path) == []


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
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    done = json.loads(out.splitlines()[-1])
    assert (done["ok"], done["failed"]) == (1, 1), err    # the next round has the node again
    with Store(parse_location(str(tmp_path / "r.db"))) as store:
        run = store.load_run(done["run"])
    (failed,) = [t for t in run.trials if t.status == "failed"]
    assert failed.sample_index == 0
    assert f"node {victim.address} dropped during the trial" in (failed.reason or "")
    assert "fio --server ended" in (failed.reason or "")
    assert left_behind(cluster, tmp_path) == []


def test_a_killed_controller_leaves_nothing_on_the_nodes(
        ssh_nodes: Callable[[int], SshCluster], tmp_path: Path) -> None:
    cluster = ssh_nodes(2)
    proc = run_controller(cluster, tmp_path, str(tmp_path / "r.db"), SUITE.replace('"1s"', '"30s"'))
    # the first trial runs once the last node's server forked a process for its job
    assert wait_for(lambda: len(fio_on(cluster, cluster.nodes[-1])) > 1 or proc.poll() is not None,
                    timeout=120)
    proc.kill()                                            # kill -9: no clean-up of its own
    proc.communicate(timeout=30)
    assert wait_for(lambda: not any(cluster.leftovers(n) for n in cluster.nodes)
                    and not list(Path("/tmp").glob("iomatrix-fio-*")), timeout=30), \
        [cluster.leftovers(n) for n in cluster.nodes]
