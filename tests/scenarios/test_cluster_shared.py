"""Cluster load on shared storage (issue 37, ``[method] concurrent_nodes`` on an rbd pool):
three sshd nodes in network namespaces (``tests/sshnodes.py``) and the single-node Ceph
(``tests/ceph.py``), served in the controller's namespace at an address every node reaches;
each node's fio server reads the pool through librbd, on an image of its own (or, with
``shared_image``, on one for all)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from iomatrix.cli.status import ExitStatus
from iomatrix.core.errors import SuiteError
from iomatrix.core.proc import wait_for
from iomatrix.measure.precheck import check_cluster_load
from iomatrix.suite import load_suite_text
from iomatrix.suite.expand import expand
from tests import ceph
from tests.conftest import REPO
from tests.needs import needs
from tests.scenarios.test_cluster_load import (IOMATRIX, alone_with_node_directories,  # noqa: F401
                                               finished, fio_on)
from tests.sshnodes import SshCluster, _cmdline, _in_netns, ssh_nodes  # noqa: F401

SUITE = """[suite]
name = "t"
[target]
size = "16MiB"
rbd = {{ pool = "{pool}", monitors = ["{monitor}"], client = "{client}", keyring = "{keyring}", connect_timeout = 10 }}
[workloads]
rw = "randwrite"
iodepth = 4
[method]
mode = "host"
ramp = 0
runtime = "{runtime}"
samples = 2
seed = 5
concurrent_nodes = true
{extra}
"""


@pytest.fixture
def pool(ssh_nodes: Callable[[int], SshCluster],
         tmp_path: Path) -> Iterator[tuple[SshCluster, ceph.Cluster]]:
    """Three nodes, and a Ceph cluster in the controller's namespace that each reaches."""
    cluster = ssh_nodes(3)
    made = ceph.Cluster(tmp_path / "ceph", cluster.shared_address(),
                        cluster.controller([]))
    made.dir.mkdir()
    try:
        made.start()
        print(f"\nceph test cluster: started in {made.start_seconds:.1f} s")
        yield cluster, made
    finally:
        made.stop()


def body(made: ceph.Cluster, runtime: str = "2s", extra: str = "") -> str:
    return SUITE.format(pool=ceph.POOL, monitor=made.monitor, client=ceph.CLIENT,
                        keyring=made.keyring, runtime=runtime, extra=extra)


def controller(cluster: SshCluster, tmp_path: Path, db: str, suite: str,
               *args: str) -> subprocess.Popen[str]:
    """``iomatrix run`` of ``suite`` (a run to resume: ``--resume N``) on the cluster's nodes,
    started as the controller (in the namespace that reaches them)."""
    path = tmp_path / "t.toml"
    path.write_text(suite)
    inventory = tmp_path / "nodes.toml"
    inventory.write_text(cluster.inventory(extra=f'ssh_config = "none"\ncommand = "{IOMATRIX}"\n'))
    argv = [sys.executable, "-m", "iomatrix", "run", *(args or [str(path)]), "--nodes",
            str(inventory), "--db", db]
    return subprocess.Popen(cluster.controller(argv), cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "TMPDIR": str(tmp_path)})


def left(cluster: SshCluster, made: ceph.Cluster, tmp_path: Path) -> list[str]:
    """fio servers and SSH sessions on the nodes, their directories, forwards' sockets, the
    controller's processes besides Ceph's daemons, and the run's images in the pool."""
    daemons = {int(p.read_text()) for p in (made.dir / "run").glob("*.pid")}
    found = [p for node in cluster.nodes if node.alive for p in cluster.leftovers(node)]
    found += [str(p) for p in Path("/tmp").glob("iomatrix-fio-*")]
    found += [str(p) for p in tmp_path.rglob("*.sock")]
    found += [f"{pid} {_cmdline(pid)} (controller)" for pid in _in_netns(cluster.controller_netns)
              if pid != cluster.controller_holder.pid and pid not in daemons]
    return found + [i for i in made.images() if i.startswith("iomatrix-")]


def test_what_cluster_load_on_a_pool_refuses() -> None:
    rbd = '[target]\nsize = "1GiB"\nrbd = { pool = "p", monitors = ["10.0.0.1"] }\n'
    for extra, says in [('mode = "guest"', "host mode only"),
                        ('mode = "host"\nshared_image = false', None)]:
        suite = load_suite_text(f'[suite]\nname = "t"\n{rbd}[method]\nconcurrent_nodes = true\n'
                                f'{extra}\n')
        if says is None:
            check_cluster_load(suite, expand(suite))
            continue
        with pytest.raises(SuiteError, match=says):
            check_cluster_load(suite, expand(suite))
    with pytest.raises(SuiteError, match="shared_image is for concurrent_nodes"):
        load_suite_text('[suite]\nname = "t"\n[method]\nshared_image = true\n')


@needs("ceph")
@pytest.mark.slow
def test_three_nodes_load_a_pool_each_on_its_own_image(
        pool: tuple[SshCluster, ceph.Cluster], tmp_path: Path) -> None:
    """Each node's fio on an image of its own (three in the pool while the run measures); the
    controller killed with -9 mid-run leaves nothing on the nodes, and ``--resume`` reclaims
    its images and finishes the run; then one image all nodes load (``shared_image``), with a
    node killed mid-run: the trial fails naming it, and nothing is left anywhere."""
    cluster, made = pool
    db = str(tmp_path / "r.db")
    proc = controller(cluster, tmp_path, db, body(made, "3s"))
    # the first trial runs once the last node's server forked a process for its job
    assert wait_for(lambda: len(fio_on(cluster, cluster.nodes[-1])) > 1 or proc.poll() is not None,
                    timeout=120)
    assert proc.poll() is None, proc.communicate()
    images = [i for i in made.images() if i.startswith("iomatrix-1-")]
    assert len(images) == 3, images
    proc.kill()
    proc.communicate(timeout=30)
    assert wait_for(lambda: not any(cluster.leftovers(n) for n in cluster.nodes), timeout=30)
    resumed = controller(cluster, tmp_path, db, "", "--resume", "1")
    run = finished(resumed, db)
    assert resumed.returncode == 0 and [t.status for t in run.trials] == ["ok", "ok"], \
        [t.reason for t in run.trials]
    for trial in run.trials:
        per_node = sorted(trial.vm_samples, key=lambda s: s.vm or 0)
        assert [s.vm for s in per_node] == [0, 1, 2] and all(s.total_ios > 0 for s in per_node)
    assert left(cluster, made, tmp_path) == []

    second = tmp_path / "s"
    second.mkdir()
    db2 = str(second / "r.db")
    proc = controller(cluster, second, db2, body(made, "4s", "shared_image = true"))
    victim = cluster.nodes[2]
    assert wait_for(lambda: len(fio_on(cluster, victim)) > 1 or proc.poll() is not None,
                    timeout=120)
    assert proc.poll() is None, proc.communicate()
    assert len([i for i in made.images() if i.startswith("iomatrix-1-")]) == 1, made.images()
    for pid in fio_on(cluster, victim):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    run = finished(proc, db2)
    assert proc.returncode == ExitStatus.TRIALS_FAILED
    (failed,) = [t for t in run.trials if t.status == "failed"]
    assert f"node {victim.name} dropped" in (failed.reason or "")
    assert left(cluster, made, second) == []
