"""Cluster load on shared storage (issue 37, ``[method] concurrent_nodes`` on an rbd pool):
three sshd nodes in network namespaces (``tests/sshnodes.py``) and the single-node Ceph
(``tests/ceph.py``), served in the controller's namespace at an address every node reaches;
each node's fio server reads the pool through librbd, on an image of its own (or, with
``shared_image``, on one for all). The same three nodes then measure scaling (``[matrix]
node_count``, ``analysis.scaling``) on a directory."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from iomatrix.analysis.scaling import node_names, scaling
from iomatrix.cli.status import ExitStatus
from iomatrix.core.errors import SuiteError
from iomatrix.core.proc import wait_for
from iomatrix.measure.precheck import check_cluster_load
from iomatrix.measure.prepare import for_command_line
from iomatrix.store import Store
from iomatrix.store.location import parse_location
from iomatrix.store.records import StoredRun
from iomatrix.suite import load_suite_text
from iomatrix.suite.expand import expand
from tests import ceph
from tests.conftest import REPO, TCG_GUEST, cli_result
from tests.needs import needs
from tests.scenarios.test_cluster_load import SUITE as ON_A_DIRECTORY
from tests.scenarios.test_cluster_load import IOMATRIX, finished, fio_on, run_controller
from tests.sshnodes import SshCluster, _cmdline, _in_netns, ssh_nodes  # noqa: F401
from tests.tgt import Tgt, tgtd

SUITE = """[suite]
name = "t"
[target]
size = "16MiB"
rbd = {{ pool = "{pool}", monitors = ["{monitor}"], client = "{client}", keyring = "{keyring}", connect_timeout = 10 }}
[workloads]
rw = "randwrite"
iodepth = 4
[method]
mode = "{mode}"
ramp = 0
runtime = "{runtime}"
samples = 2
seed = 5
concurrent_nodes = true
{extra}
"""


@pytest.fixture
def pool(ssh_nodes: Callable[[int], SshCluster],
         tmp_path: Path) -> Iterator[Callable[[int], tuple[SshCluster, ceph.Cluster]]]:
    """``pool(n)``: n nodes, and a Ceph cluster in the controller's namespace that each
    reaches."""
    made: list[ceph.Cluster] = []

    def make(count: int) -> tuple[SshCluster, ceph.Cluster]:
        cluster = ssh_nodes(count)
        made.append(ceph.Cluster(tmp_path / "ceph", cluster.shared_address(),
                                 cluster.controller([])))
        made[-1].dir.mkdir()
        made[-1].start()
        print(f"\nceph test cluster: started in {made[-1].start_seconds:.1f} s")
        return cluster, made[-1]
    try:
        yield make
    finally:
        for one in made:
            one.stop()


def body(made: ceph.Cluster, runtime: str = "2s", extra: str = "", mode: str = "host") -> str:
    return SUITE.format(pool=ceph.POOL, monitor=made.monitor, client=ceph.CLIENT,
                        keyring=made.keyring, runtime=runtime, extra=extra, mode=mode)


def controller(cluster: SshCluster, tmp_path: Path, db: str, suite: str, *args: str,
               nodes: int = 0) -> subprocess.Popen[str]:
    """``iomatrix run`` of ``suite`` (a run to resume: ``--resume N``) on the cluster's nodes
    (the first ``nodes`` of them, when given), started as the controller (in the namespace
    that reaches them)."""
    path = tmp_path / "t.toml"
    path.write_text(suite)
    inventory = tmp_path / "nodes.toml"
    tables = cluster.inventory(extra=f'ssh_config = "none"\ncommand = "{IOMATRIX}"\n')
    inventory.write_text("[[node]]".join(tables.split("[[node]]")[:nodes + 1 if nodes else None]))
    argv = [sys.executable, "-m", "iomatrix", "run", *(args or [str(path)]), "--nodes",
            str(inventory), "--db", db]
    return subprocess.Popen(cluster.controller(argv), cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "TMPDIR": str(tmp_path)})


def left_nodes(cluster: SshCluster, tmp_path: Path, keep: set[int] = set()) -> list[str]:
    """fio servers and SSH sessions on the nodes (a session's shell removes its server's
    directory last: /tmp/iomatrix-fio-* is not looked at, which another test process's nodes
    may hold meanwhile), forwards' sockets, and the controller's processes but ``keep``."""
    found = [p for node in cluster.nodes if node.alive for p in cluster.leftovers(node)]
    found += [str(p) for p in tmp_path.rglob("*.sock")]
    return found + [f"{pid} {_cmdline(pid)} (controller)"
                    for pid in _in_netns(cluster.controller_netns)
                    if pid != cluster.controller_holder.pid and pid not in keep]


def left(cluster: SshCluster, made: ceph.Cluster, tmp_path: Path) -> list[str]:
    """``left_nodes`` (Ceph's daemons kept), and the run's images in the pool."""
    daemons = {int(p.read_text()) for p in (made.dir / "run").glob("*.pid")}
    return left_nodes(cluster, tmp_path, daemons) + [i for i in made.images()
                                                     if i.startswith("iomatrix-")]


def test_what_cluster_load_on_a_pool_refuses() -> None:
    rbd = '[target]\nsize = "1GiB"\nrbd = { pool = "p", monitors = ["10.0.0.1"] }\n'
    for extra, says in [('mode = "guest"', None), ('mode = "host"\nshared_image = false', None)]:
        suite = load_suite_text(f'[suite]\nname = "t"\n{rbd}[method]\nconcurrent_nodes = true\n'
                                f'{extra}\n')
        if says is None:
            check_cluster_load(suite, expand(suite))
            continue
        with pytest.raises(SuiteError, match=says):
            check_cluster_load(suite, expand(suite))
    krbd = rbd.replace('"10.0.0.1"] }', '"10.0.0.1"], krbd = true }')
    suite = load_suite_text(f'[suite]\nname = "t"\n{krbd}[method]\nconcurrent_nodes = true\n'
                            'mode = "host"\n')
    with pytest.raises(SuiteError, match="krbd = true is not built: each node would map"):
        check_cluster_load(suite, expand(suite))
    # a Proxmox VE rbd storage with krbd 1, resolved on the controller: refused, naming it
    cfg = "rbd: ceph-k\n\tmonhost 10.0.0.1\n\tpool p\n\tkrbd 1\n\tcontent images\n"
    by_id = for_command_line(load_suite_text(
        '[suite]\nname = "t"\n[target]\nsize = "1GiB"\nstorage = "ceph-k"\n[method]\n'
        'concurrent_nodes = true\nmode = "host"\n'), storage_cfg=(cfg, Path("/nonexistent")))
    with pytest.raises(SuiteError) as refused:
        check_cluster_load(by_id, expand(by_id))
    assert str(refused.value).startswith("[method] concurrent_nodes on an rbd pool: krbd 1 of "
                                         "Proxmox VE storage ceph-k is not built: each node ")
    assert "\n" not in str(refused.value)
    on_directory = load_suite_text('[suite]\nname = "t"\n[target]\ndirectory = "/tmp"\n'
                                   'size = "1MiB"\n[method]\nconcurrent_nodes = true\n'
                                   'mode = "blocklayer"\n')
    with pytest.raises(SuiteError, match="blocklayer part on an rbd pool or an iSCSI LUN only"):
        check_cluster_load(on_directory, expand(on_directory))
    lun = load_suite_text('[suite]\nname = "t"\n[target]\nallow_destroy = true\n'
                          '[target.iscsi]\nportal = "192.0.2.1"\ntarget = "iqn.2026-11.a:b"\n'
                          '[method]\nconcurrent_nodes = true\nmode = "guest"\n')
    check_cluster_load(lun, expand(lun))        # each node's guests on regions of the LUN
    lun = load_suite_text(lun.source_text + 'platform = "proxmox"\n')
    with pytest.raises(SuiteError, match="region of the LUN on platform qemu's graph only"):
        check_cluster_load(lun, expand(lun))
    with pytest.raises(SuiteError, match="shared_image is for concurrent_nodes"):
        load_suite_text('[suite]\nname = "t"\n[method]\nshared_image = true\n')


@needs("ceph")
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_pool_from_every_node_in_each_mode(
        pool: Callable[[int], tuple[SshCluster, ceph.Cluster]], tmp_path: Path,
        host_appliance: Path) -> None:
    """Host mode, each node's fio on an image of its own (``node_count`` 2 and 3: three in the
    pool while the 3-node configuration measures); the controller killed with -9 mid-run leaves
    nothing on the nodes, ``clean`` would remove its images, and ``--resume`` reclaims them and
    finishes the run, each trial on its first n nodes. Then a Proxmox VE rbd storage id, one
    image both nodes load (``shared_image``: ``by_storage_id``). Then two nodes each boot a TCG guest on an image of its own, reached by a
    ceph.conf the node wrote itself (QEMU opened rbd on both); then blocklayer, each node's
    qemu-storage-daemon on its own image, a fio server beside it; both with ``node_count`` 1
    and 2 (the first node alone, then both). After each run nothing is
    left on the nodes, here, or in the pool. Last, on the same three nodes, the scaling run of
    ``scales_after_one_pilot`` (node counts 1..3 on a directory, one pilot), then node3 powered
    off mid-run (``powered_off_mid_run``)."""
    cluster, made = pool(3)
    db = str(tmp_path / "r.db")
    proc = controller(cluster, tmp_path, db, body(made, "3s", "[matrix]\nnode_count = [2, 3]"))
    # the first trial runs once the last node's server forked a process for its job
    assert wait_for(lambda: len(fio_on(cluster, cluster.nodes[-1])) > 1 or proc.poll() is not None,
                    timeout=120)
    assert proc.poll() is None, proc.communicate()
    images = [i for i in made.images() if i.startswith("iomatrix-1-")]
    assert len(images) >= 3, images                     # node_count 3's (and 2's, if made)
    proc.kill()
    proc.communicate(timeout=30)
    assert wait_for(lambda: not any(cluster.leftovers(n) for n in cluster.nodes), timeout=30)
    dry = subprocess.run(cluster.controller([sys.executable, "-m", "iomatrix", "clean",
                                             "--dry-run", "--db", db]),
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert all(f"would remove RBD image {ceph.POOL}/{i}" in dry.stdout + dry.stderr
               for i in images), dry.stdout + dry.stderr
    resumed = controller(cluster, tmp_path, db, "", "--resume", "1")
    run = finished(resumed, db)
    assert resumed.returncode == 0 and [t.status for t in run.trials] == ["ok"] * 4, \
        [t.reason for t in run.trials]
    for trial in run.trials:                    # the first n nodes, each on an image of its own
        n = int(trial.config_key.rpartition("=")[2])
        assert node_names(trial) == dict(enumerate(node.name for node in cluster.nodes[:n]))
        per_node = sorted(trial.vm_samples, key=lambda s: s.vm or 0)
        assert [s.vm for s in per_node] == list(range(n)) and all(s.total_ios > 0
                                                                 for s in per_node)
    assert left(cluster, made, tmp_path) == []

    by_storage_id(cluster, made, tmp_path / "id")     # shared_image, two nodes

    third = tmp_path / "g"                  # each of two nodes boots a TCG guest on its own image
    third.mkdir()
    db = str(third / "r.db")
    guests = (TCG_GUEST + '[matrix]\ncontroller = "virtio-blk"\niothread = false\ncache = "none"'
              "\nnode_count = [1, 2]")
    proc = controller(cluster, third, db, body(made, "1s", guests, "guest").replace(
        "samples = 2", "samples = 1").replace("[workloads]", "[workloads]\nbs = \"4k\"", 1),
        nodes=2)
    out, err = proc.communicate(timeout=800)
    assert proc.returncode == 0, out + err
    with Store(parse_location(db)) as store:
        run = store.load_run(1)
    one, two = sorted((t for t in run.trials if t.config_key.startswith("guest/")),
                      key=lambda t: t.config_key)
    assert (one.config_key[-1], two.config_key[-1]) == ("1", "2")
    assert one.status == two.status == "ok", (one.reason, two.reason)
    assert one.applied["cluster.nodes"] == "vm0=node1/vm0"            # node_count 1: node1's
    assert two.applied["cluster.nodes"] == "vm0=node1/vm0, vm1=node2/vm0"
    for trial in (one, two):
        assert trial.applied["file0.driver"] == "rbd" and "node2:file0.driver" not in trial.applied
    assert [s.vm for s in sorted(two.vm_samples, key=lambda s: s.vm or 0)] == [0, 1]
    assert all(s.total_ios > 0 for s in two.vm_samples)
    assert left(cluster, made, third) == []

    second = tmp_path / "b"                 # each node's qemu-storage-daemon on its own image
    second.mkdir()
    proc = controller(cluster, second, str(second / "r.db"), body(
        made, "1s", '[matrix]\ncache = "none"\niothread = false\nnode_count = [1, 2]',
        "blocklayer").replace(
        "samples = 2", "samples = 1"), nodes=2)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, out + err
    with Store(parse_location(str(second / "r.db"))) as store:
        run = store.load_run(1)
    one, two = sorted((t for t in run.trials if t.config_key.startswith("blocklayer/")),
                      key=lambda t: t.config_key)
    assert (one.config_key[-1], two.config_key[-1]) == ("1", "2")
    assert one.status == two.status == "ok", (one.reason, two.reason)
    assert node_names(one) == {0: "node1"} and node_names(two) == {0: "node1", 1: "node2"}
    for trial in (one, two):
        assert trial.applied["file0.driver"] == "rbd" and trial.applied["export"] == "nbd"
        assert "node2:file0.driver" not in trial.applied
    assert sorted(s.vm or 0 for s in two.vm_samples) == [0, 1]
    assert all(s.total_ios > 0 for s in two.vm_samples)
    assert left(cluster, made, second) == []

    scales_after_one_pilot(cluster, made, tmp_path / "n")
    powered_off_mid_run(cluster, made, tmp_path / "off")    # last: node3 stays off


def storage_cfg(directory: Path, stanza: str, keyring: Path | None = None) -> Path:
    """A Proxmox VE directory of the tests' own (``directory``/pve) whose storage.cfg holds
    ``stanza``, and the storage's keyring priv/ceph/ID.keyring (0600) when given."""
    pve = directory / "pve"
    (pve / "priv" / "ceph").mkdir(parents=True)
    (pve / "storage.cfg").write_text(f"dir: local\n\tpath /var/lib/vz\n\n{stanza}")
    if keyring is not None:
        ident = stanza.split(":", 1)[1].split()[0]
        copy = pve / "priv" / "ceph" / f"{ident}.keyring"
        copy.write_text(keyring.read_text())
        copy.chmod(0o600)
    return pve / "storage.cfg"


def by_storage_id(cluster: SshCluster, made: ceph.Cluster, tmp_path: Path) -> None:
    """``[target] storage = "ceph-vm"``, a Proxmox VE rbd storage, under cluster load: the
    controller resolves it once from --storage-cfg (monhost, pool, username; the keyring beside
    it, as /etc/pve/priv/ceph keeps it on every node) and sends the nodes the resolved
    ``[target] rbd``, which each node checks as it checks a suite's own (``nodepool``); two
    nodes on one image for both (``shared_image``): one image recorded, both nodes did I/O, the
    run stored the storage it came from, nothing left."""
    tmp_path.mkdir()
    cfg = storage_cfg(tmp_path, f"rbd: ceph-vm\n\tmonhost {made.monitor}\n\tpool {ceph.POOL}\n"
                      f"\tusername {ceph.CLIENT}\n\tcontent images\n", made.keyring)
    text = body(made, "1s", "shared_image = true").replace("samples = 2", "samples = 1")
    start = text.index("rbd = {")
    text = text[:start] + 'storage = "ceph-vm"' + text[text.index("}\n", start) + 1:]
    db = str(tmp_path / "r.db")
    proc = controller(cluster, tmp_path, db, text, str(tmp_path / "t.toml"), "--storage-cfg",
                      str(cfg), nodes=2)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, out + err
    with Store(parse_location(db)) as store:
        run = store.load_run(1)
    with contextlib.closing(sqlite3.connect(db)) as conn:
        made_images = conn.execute("SELECT path FROM resources WHERE kind = 'rbd-image'"
                                   ).fetchall()
    (trial,) = run.trials
    assert trial.status == "ok", trial.reason
    assert sorted(s.vm or 0 for s in trial.vm_samples) == [0, 1]
    assert all(s.total_ios > 0 for s in trial.vm_samples)
    assert len(made_images) == 1, made_images               # shared_image: one for both
    assert run.suite.spec is not None
    assert run.suite.spec.tables["target"]["from_storage"]["id"] == "ceph-vm"
    assert left(cluster, made, tmp_path) == []


def powered_off_mid_run(cluster: SshCluster, made: ceph.Cluster, tmp_path: Path) -> None:
    """node3 powered off mid-run (``SshCluster.kill``: SIGKILL to every process of its
    namespace, sshd and all under it, then its link gone) while it writes its image, in a run
    of ``node_count`` 2 and 3 (two rounds, interleaved): each trial that takes node3 fails
    naming it (the one it went in mid-write, and the next round's, whose login fails); the
    two-node trials go on, ok in both rounds; the controller reclaims every image (one per
    node) from the pool; nothing is left on the nodes still on, or here. This proves what
    killing a node's fio server mid-trial did (the trial fails naming the node), and more.
    node3 stays off: this is the chain's last run. Its fio server's directory, which a node
    that lost power keeps on its disk (this host's /tmp here), is removed by the test."""
    tmp_path.mkdir()
    db = str(tmp_path / "r.db")
    proc = controller(cluster, tmp_path, db, body(
        made, "2s", "[matrix]\nnode_count = [2, 3]"))
    victim = cluster.nodes[2]
    assert wait_for(lambda: len(fio_on(cluster, victim)) > 1 or proc.poll() is not None,
                    timeout=120)
    assert proc.poll() is None, proc.communicate()
    assert len([i for i in made.images() if i.startswith("iomatrix-1-")]) == 3, made.images()
    lost = {m for pid in cluster.processes(victim)
            for m in re.findall(r"/tmp/iomatrix-fio-[0-9a-f]{16}", _cmdline(pid))}
    assert lost
    cluster.kill(victim)
    for directory in lost:      # what the node kept on its disk, which is this one's
        shutil.rmtree(directory, ignore_errors=True)
    run = finished(proc, db)
    assert proc.returncode == ExitStatus.TRIALS_FAILED, proc.stderr
    by_count = {n: [t for t in run.trials if t.config_key.endswith(f"node_count={n}")]
                for n in (2, 3)}
    assert [t.status for t in by_count[2]] == ["ok", "ok"], [t.reason for t in by_count[2]]
    assert [t.status for t in by_count[3]] == ["failed", "failed"]
    for trial in by_count[3]:
        assert f"node {victim.name}" in (trial.reason or ""), trial.reason
    assert left(cluster, made, tmp_path) == []

COUNTS = ON_A_DIRECTORY.replace("[method]", "[matrix]\nnode_count = [1, 2, 3]\n[method]").replace(
    "samples = 2", "target_ci = 0.5\nmax_samples = 3").replace('"1s"', '"0.5s"')
"""Node counts 1..3, and target_ci: the controller's one pilot chooses the rounds (3: the least
it chooses, and the most this suite allows)."""


def scales_after_one_pilot(cluster: SshCluster, made: ceph.Cluster, tmp_path: Path) -> None:
    """Scaling under cluster load (issue 37): ``[matrix] node_count`` measures 1..3 nodes
    loading the shared target (a directory here) at once in the same run, interleaved round by
    round (every count measured in a round before the next round starts); ``target_ci`` runs
    one pilot for the whole cluster, before the rounds, every node measured in it; each trial
    says which nodes took part (the first n) and gives a figure per node; ``analysis.scaling``
    answers from it (aggregate IOPS the mean of the rounds' sums, per-node IOPS, efficiency 1.0
    at one node, a saturation point, all shown by ``show``); nothing is left on the nodes, here,
    or in /tmp/iomatrix-fio-* (checked under the exclusive node-directory lock). 15 trials of
    0.5 s over SSH (a pilot of 6, 3 rounds of 3 counts)."""
    tmp_path.mkdir()
    names = [n.name for n in cluster.nodes]
    db = str(tmp_path / "r.db")
    proc = run_controller(cluster, tmp_path, db, COUNTS)
    run = finished(proc, db)
    assert proc.returncode == 0, proc.stderr
    assert sorted(c.key for c in run.configs) == [f"host/node_count={n}" for n in (1, 2, 3)]
    with Store(parse_location(db)) as store:
        pilot, plan = store.load_pilot(1)
    assert plan is not None and plan.choice is not None and pilot
    assert {t.config_key for t in pilot} == {"host/node_count=3", "host/node_count=2"}
    assert any(n.startswith("pilot: ") for n in run.notes)
    rounds = plan.choice.rounds
    assert all(t.status == "ok" for t in run.trials) and len(run.trials) == 3 * rounds
    for trial in run.trials:
        n = int(trial.config_key.rpartition("=")[2])
        assert node_names(trial) == dict(enumerate(names[:n]))
        # one client: its figures are the trial's own (fio gives no per-client result)
        assert sorted(s.vm or 0 for s in trial.vm_samples) == (list(range(n)) if n > 1 else [])
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
    cluster.check_directories()
    assert left(cluster, made, tmp_path) + [str(p) for p in Path("/tmp").glob("iomatrix-fio-*")
                                            ] == []


LUN = """[suite]
name = "t"
[target]
allow_destroy = true
[target.iscsi]
portal = "{portal}"
target = "{iqn}"
lun = {lun}
connect_timeout = 20
chap = "{chap}"
[workloads]
rw = "randwrite"
bs = "4k"
iodepth = 4
[method]
mode = "host"
ramp = 0
runtime = "1s"
samples = 1
concurrent_nodes = true
"""


@needs("tgt")
@pytest.mark.slow
@pytest.mark.timeout(600)           # the guest appliance built first, where none is cached
def lun_run(proc: subprocess.Popen[str], db: str, timeout: float = 300) -> tuple[StoredRun, str]:
    """The run ``proc`` stored in ``db``, checked (it ended well, its one trial ok, through
    QEMU's iscsi driver, both nodes with I/O), and what it printed."""
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out + err
    with Store(parse_location(db)) as store:
        run = store.load_run(1)
    (trial,) = run.trials
    assert trial.status == "ok", trial.reason
    assert trial.applied["file0.driver"] == "iscsi"
    assert sorted(s.vm or 0 for s in trial.vm_samples) == [0, 1]
    assert all(s.total_ios > 0 for s in trial.vm_samples)
    return run, out + err


def test_two_nodes_load_a_lun_each_on_a_region_of_its_own(
        ssh_nodes: Callable[[int], SshCluster], tmp_path: Path, host_appliance: Path) -> None:
    """Host mode on an iSCSI LUN (tgtd in the controller's namespace, CHAP on): each node's fio
    on its half of the LUN through a qemu-storage-daemon of its own (libiscsi, the CHAP file
    read on the node): each node preconditioned its own half (neither half is left zero), each
    did I/O, and no session is left on the target, nor anything on the nodes. Then blocklayer
    and guest (TCG) modes, each node's daemon or guest on a raw node limited to its region
    (``lun_regions``), the LUN zeroed before each: each region written, and the MiB past the
    regions (the LUN is 33 MiB, two regions of 16) never."""
    cluster = ssh_nodes(2)
    chap = tmp_path / "chap.toml"
    chap.write_text('user = "u-cluster"\npassword = "p-cluster-secret"\n')
    chap.chmod(0o600)
    with tgtd(tmp_path, 33 << 20, address=cluster.shared_address(),
              wrap=cluster.controller([])) as server:
        lun_by_storage_id(cluster, server, tmp_path / "id")
        server.require_chap("u-cluster", "p-cluster-secret")
        db = str(tmp_path / "r.db")
        proc = controller(cluster, tmp_path, db, LUN.format(
            portal=server.portal, iqn=server.iqn, lun=server.lun, chap=chap))
        _, said = lun_run(proc, db)
        data = server.backing.read_bytes()
        half = len(data) // 2
        assert data[:half].count(0) < half // 2 and data[half:].count(0) < half // 2
        assert server.connections() == ""
        assert "p-cluster-secret" not in said
        assert left_nodes(cluster, tmp_path, {server.pid}) == []
        for mode, extra in [("blocklayer", '[matrix]\ncache = "none"\niothread = false\n'),
                            ("guest", TCG_GUEST + '\n[matrix]\ncontroller = "virtio-blk"\n'
                             'iothread = false\ncache = "none"\n')]:
            _lun_region_run(cluster, tmp_path / mode[0], server, chap, mode, extra)


def _lun_region_run(cluster: SshCluster, where: Path, server: Tgt, chap: Path, mode: str,
                    extra: str) -> None:
    """One run of ``mode`` on two nodes on the LUN zeroed first: ok, each node's disk a 16 MiB
    region (what its guest saw, or its export), each region preconditioned by its node, the
    rest of the LUN untouched, and nothing left. In blocklayer mode the controller is killed
    (-9) once both nodes' daemons are up: no daemon or iSCSI session outlives it, and
    ``--resume`` finishes the run."""
    where.mkdir()
    server.backing.write_bytes(bytes(server.backing.stat().st_size))
    db = str(where / "r.db")
    proc = controller(cluster, where, db, LUN.format(
        portal=server.portal, iqn=server.iqn, lun=server.lun, chap=chap).replace(
            'mode = "host"', f'mode = "{mode}"') + extra)
    if mode == "blocklayer":
        assert wait_for(lambda: proc.poll() is not None or all(
            any("qemu-storage-daemon" in p for p in cluster.leftovers(n))
            for n in cluster.nodes), timeout=120)
        assert proc.poll() is None, proc.communicate()
        proc.kill()
        proc.communicate(timeout=30)
        assert wait_for(lambda: not any(cluster.leftovers(n) for n in cluster.nodes),
                        timeout=30), [cluster.leftovers(n) for n in cluster.nodes]
        assert wait_for(lambda: server.connections() == "", timeout=30), server.connections()
        proc = controller(cluster, where, db, "", "--resume", "1")
    _, said = lun_run(proc, db, timeout=800)
    data = server.backing.read_bytes()
    mib = 1 << 20
    assert len(data) == 33 * mib
    for start in (0, 16 * mib):         # each node's region, written whole by its precondition
        assert data[start:start + 16 * mib].count(0) < 8 * mib, (mode, start)
    assert data[32 * mib:] == bytes(mib), mode       # past both regions: nobody wrote there
    assert server.connections() == ""
    assert "p-cluster-secret" not in said
    assert left_nodes(cluster, where, {server.pid}) == []


def lun_by_storage_id(cluster: SshCluster, server: Tgt, tmp_path: Path) -> None:
    """``[target] storage = "san:lun1"``, a Proxmox VE iscsi storage (no CHAP: storage.cfg
    has none), under cluster load: the controller resolves it once from --storage-cfg (portal,
    target, the LUN as Proxmox VE names it) and sends the nodes the resolved ``[target]
    iscsi``, which each node's ``lun_image`` holds its request to; each node on its region of
    it, both did I/O, the run stored the storage it came from, no session left."""
    tmp_path.mkdir()
    cfg = storage_cfg(tmp_path, f"iscsi: san\n\tportal {server.portal}\n\ttarget "
                      f"{server.iqn}\n\tcontent images\n")
    text = LUN[:LUN.index("[target.iscsi]")] + f'storage = "san:lun{server.lun}"\n' + \
        LUN[LUN.index("[workloads]"):]
    db = str(tmp_path / "r.db")
    proc = controller(cluster, tmp_path, db, text, str(tmp_path / "t.toml"), "--storage-cfg",
                      str(cfg))
    run, _ = lun_run(proc, db)
    assert run.suite.spec is not None
    assert run.suite.spec.tables["target"]["from_storage"]["id"] == f"san:lun{server.lun}"
    assert server.connections() == ""
    assert left_nodes(cluster, tmp_path, {server.pid}) == []
