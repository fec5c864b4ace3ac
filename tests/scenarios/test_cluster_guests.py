"""Cluster load in guest mode (issue 23, ``[method] concurrent_nodes`` with ``mode = "guest"``):
every node boots its guests (``iomatrix node serve-guests``, under TCG here) on disks the
controller made on the shared target, and one fio client here drives every guest of every node
in the same trial, through Unix sockets each node's SSH session forwards."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from iomatrix.cli.status import ExitStatus
from iomatrix.cluster.ssh import Node
from iomatrix.core.errors import FioParseError, SuiteError, TrialFailed
from iomatrix.core.proc import wait_for
from iomatrix.drivers.cluster import GUESTS_READY, GuestRequest, NodeGuests
from iomatrix.fio.parse import parse_fio_output
from iomatrix.fio.samples import vm_samples_of
from iomatrix.measure.runner import run_suite
from iomatrix.store import Store
from iomatrix.store.location import parse_location
from iomatrix.store.records import StoredRun, TrialRecord
from iomatrix.suite import load_suite, load_suite_text
from iomatrix.targets.workspace import Image
from tests.conftest import BOOT_TIMEOUT, REPO, cli_result, write_suite
from tests.sshnodes import SshCluster, _cmdline, _in_netns, ssh_nodes  # noqa: F401
from tests.scenarios.test_cluster_load import FIXTURES, IOMATRIX, run_controller
from tests.scenarios.test_own_guest import DEBIAN_BOOTS, _sha256, debian12  # noqa: F401

GUESTS = """
[matrix]
controller = "virtio-blk"
iothread = false
[workloads]
rw = "randread"
iodepth = [1, 4]
[method]
mode = "guest"
accel = "tcg"
vcpus = 1
memory = "384MiB"
""" + BOOT_TIMEOUT + """ramp = 0
runtime = "1s"
samples = 1
seed = 5
concurrent_nodes = true
"""
GUEST_DIRECTORY = re.compile(r"/tmp/iomatrix-guests-[0-9a-f]{16}")
SLOW = pytest.mark.timeout(900)
"""Two nodes boot a guest each under TCG (twice, with --resume), on a host that may be loaded."""


def finished(proc: subprocess.Popen[str], db: str) -> StoredRun:
    """The run ``proc`` stored in ``db``, once it ended (booting guests under TCG on a loaded
    host takes its time)."""
    out, err = proc.communicate(timeout=800)
    assert out.startswith("run 1:"), err
    with Store(parse_location(db)) as store:
        return store.load_run(1)


def on_node(cluster: SshCluster, name: str) -> list[str]:
    """Every process the node's SSH sessions started, wherever it is now (the guests and the
    node's iomatrix are in a private network namespace): found by the environment sshd gives
    the node's sessions."""
    mark = f"XDG_STATE_HOME={cluster.directory / name / 'state'}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                environ = Path(f"/proc/{entry.name}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if mark in environ:
                found.append(f"{entry.name} {_cmdline(int(entry.name))}")
    return found


def guest_directories(lines: list[str]) -> set[str]:
    return {m.group(0) for line in lines for m in GUEST_DIRECTORY.finditer(line)}


def nothing_left(cluster: SshCluster, tmp_path: Path, directories: set[str], *,
                 here: bool = True) -> None:
    """No guest, node iomatrix, relay socket directory or SSH session of the run left on any
    node (the guests' namespaces end with their last process); with ``here``, no process,
    forward's socket or disk of the run left by the controller either."""
    def sessions() -> list[str]:        # an SSH session's processes, until sshd has reaped them
        return [p for n in cluster.nodes if n.alive for p in cluster.leftovers(n)]
    assert wait_for(lambda: not any(on_node(cluster, n.name) for n in cluster.nodes)
                    and not any(Path(d).exists() for d in directories) and not sessions(),
                    timeout=120), (
        [on_node(cluster, n.name) for n in cluster.nodes], directories, sessions())
    if here:
        assert list(tmp_path.rglob("*.sock")) == []
        assert wait_for(lambda: _in_netns(cluster.controller_netns)
                        == [cluster.controller_holder.pid], timeout=30)
        assert list((tmp_path / "target").glob("iomatrix-*")) == []


def per_node(trial: TrialRecord) -> dict[str, int]:
    """Each node's I/Os in a trial: its guests' per-client figures, by the trial's map of them."""
    names = dict(pair.split("=") for pair in trial.applied["cluster.nodes"].split(", "))
    out: dict[str, int] = {}
    for sample in trial.vm_samples:
        node = names[f"vm{sample.vm}"].split("/")[0]
        out[node] = out.get(node, 0) + sample.total_ios
    return out


@pytest.mark.slow
@SLOW
@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_guests_of_two_nodes_load_the_target_at_once(ssh_nodes: Callable[[int], SshCluster],
                                                      tmp_path: Path, backend: str,
                                                      request: pytest.FixtureRequest,
                                                      host_appliance: Path) -> None:
    cluster = ssh_nodes(2)
    db = str(tmp_path / "r.db") if backend == "sqlite" else request.getfixturevalue("pg_url")
    proc = run_controller(cluster, tmp_path, db, GUESTS)
    run = finished(proc, db)
    assert proc.returncode == 0, [t.reason for t in run.trials]
    assert [t.status for t in run.trials] == ["ok", "ok"]
    assert run.accelerator == "tcg" and run.emulated
    assert [n.name for n in run.nodes] == ["node1", "node2"]
    for trial in run.trials:
        applied = trial.applied
        assert trial.accelerator == "tcg"
        assert applied["cluster.nodes"] == "vm0=node1/vm0, vm1=node2/vm0"
        # what each node's QEMU applied and its guest saw, checked there as a local run does
        assert applied["accel"] == "tcg" and applied["guest.disk"] == "vda"
        assert applied["guest.driver"] == "virtio_blk"
        assert applied["guest.channel"] == "private network namespace"
        assert not any(k.startswith("node2:") for k in applied), applied   # alike on both
        # each node checked its guest's disk against what fio counted there (a local run's check)
        assert re.fullmatch(r"node1: vm0 (ok|not checked): .*; node2: vm0 (ok|not checked): .*",
                            applied["io_check"]), applied["io_check"]
        assert int(applied["blockstats.rd_bytes"]) >= sum(s.io_bytes for s in trial.vm_samples)
        assert trial.command.count("qemu-system-x86_64") == 2
        assert "# node node1\n" in trial.command and "# node node2\n" in trial.command
        (aggregate,) = trial.samples
        per_vm = sorted(trial.vm_samples, key=lambda s: s.vm or 0)
        assert [s.vm for s in per_vm] == [0, 1] and all(s.total_ios > 0 for s in per_vm)
        # fio's "All clients": every client's I/Os, over the longest client's runtime
        assert aggregate.total_ios == sum(s.total_ios for s in per_vm)
        assert aggregate.runtime_ms == max(s.runtime_ms for s in per_vm)
        assert aggregate.iops == pytest.approx(aggregate.total_ios * 1000 / aggregate.runtime_ms,
                                               rel=1e-3)
        assert per_node(trial) == {"node1": per_vm[0].total_ios, "node2": per_vm[1].total_ios}
    shown = cli_result("show", "1", "--db", db)
    assert "nodes, loading the target at once in every trial: node1, node2" in shown.stdout
    nothing_left(cluster, tmp_path, guest_directories([t.command for t in run.trials]))


@pytest.mark.slow
@SLOW
def test_a_killed_node_fails_its_trials_naming_it_and_the_run_goes_on(
        ssh_nodes: Callable[[int], SshCluster], tmp_path: Path, host_appliance: Path) -> None:
    cluster = ssh_nodes(2)
    db = str(tmp_path / "r.db")
    proc = in_a_trial(cluster, tmp_path, db, runtime="4s")
    victim = cluster.nodes[1]
    survivor = guest_directories(on_node(cluster, "node1"))
    assert len(survivor) == 1, survivor
    lost = guest_directories(on_node(cluster, victim.name))
    cluster.kill(victim)                     # as a node losing power looks from here
    for directory in lost:                   # what the node kept on its disk, which is this one's
        shutil.rmtree(directory, ignore_errors=True)
    run = finished(proc, db)
    assert proc.returncode == ExitStatus.TRIALS_FAILED
    assert [t.status for t in run.trials] == ["failed", "failed"], [t.reason for t in run.trials]
    for trial in run.trials:
        assert f"node {victim.name} dropped: its SSH session ended" in (trial.reason or "")
        assert "node node1" not in (trial.reason or "")
    # the other node stopped its guests when the run ended; the killed one's died with it (a
    # node that lost power keeps its directory under /tmp until it is cleaned)
    nothing_left(cluster, tmp_path, survivor)


@pytest.mark.slow
@SLOW
def test_a_killed_controller_leaves_nothing_on_the_nodes_and_resumes(
        ssh_nodes: Callable[[int], SshCluster], tmp_path: Path, host_appliance: Path) -> None:
    cluster = ssh_nodes(2)
    db = str(tmp_path / "r.db")
    proc = in_a_trial(cluster, tmp_path, db, runtime="3s")
    directories = guest_directories([p for n in cluster.nodes for p in on_node(cluster, n.name)])
    assert len(directories) == 2, directories
    proc.kill()                                            # kill -9: no clean-up of its own
    proc.communicate(timeout=30)
    # every node sees its session end: its guests stopped, their namespace and directory gone
    # (the disks and the scratch directory are the controller's: --resume reclaims them)
    nothing_left(cluster, tmp_path, directories, here=False)
    # its nodes named again, by the inventory that named them (a stored row's command is not
    # taken on trust)
    resumed = subprocess.Popen(cluster.controller(
        [sys.executable, "-m", "iomatrix", "run", "--resume", "1", "--nodes",
         str(tmp_path / "nodes.toml"), "--db", db]), cwd=REPO,
        text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "TMPDIR": str(tmp_path)})
    run = finished(resumed, db)
    assert resumed.returncode == 0, [t.reason for t in run.trials]
    assert [t.status for t in run.trials] == ["ok", "ok"]
    assert all(len(t.vm_samples) == 2 for t in run.trials)
    nothing_left(cluster, tmp_path, directories | guest_directories([t.command for t in run.trials]))


@pytest.mark.slow
@SLOW
def test_ctrl_c_on_the_controller_stops_every_nodes_guests(
        ssh_nodes: Callable[[int], SshCluster], tmp_path: Path, host_appliance: Path) -> None:
    cluster = ssh_nodes(2)
    db = str(tmp_path / "r.db")
    proc = in_a_trial(cluster, tmp_path, db, runtime="3s", vms=2)
    fio = [_cmdline(p) for p in _in_netns(cluster.controller_netns) if "json+" in _cmdline(p)]
    assert [len(re.findall(r"--client=sock:\S+v[01]\.sock ", f)) for f in fio] == [4]
    on_nodes = [p for n in cluster.nodes for p in on_node(cluster, n.name)]
    assert sum("qemu-system-x86_64" in p for p in on_nodes) == 4
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == ExitStatus.INTERRUPTED, err
    with Store(db) as store:
        assert store.load_run(1).status == "interrupted"
    # the nodes stopped their guests before the controller ended, which removed its disks
    assert not any(on_node(cluster, n.name) for n in cluster.nodes)
    nothing_left(cluster, tmp_path, guest_directories(on_nodes))


def in_a_trial(cluster: SshCluster, tmp_path: Path, db: str, *, runtime: str,
               vms: int = 1) -> subprocess.Popen[str]:
    """The controller of a run of trials of ``runtime`` with ``vms`` guests on each node, once
    its first trial's fio client (json+: not the preconditioning's) runs."""
    proc = run_controller(cluster, tmp_path, db, GUESTS.replace('"1s"', f'"{runtime}"')
                          + f"vms = {vms}\n")

    def trial() -> bool:
        return any("--output-format=json+" in _cmdline(pid) and "--client=sock:" in _cmdline(pid)
                   for pid in _in_netns(cluster.controller_netns))
    assert wait_for(lambda: trial() or proc.poll() is not None, timeout=600)
    assert proc.poll() is None, proc.communicate()
    return proc


# --- without booting: the relay, and what the node and the controller refuse ----------------

def test_the_relay_carries_a_unix_socket_to_a_port_both_ways(tmp_path: Path) -> None:
    from iomatrix.cluster.relay import Relay

    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        relay = Relay(tmp_path / "r.sock", port).start()
        try:
            for _ in range(2):                          # a connection each, as fio's trials
                with socket.socket(socket.AF_UNIX) as client:
                    client.connect(str(tmp_path / "r.sock"))
                    conn, _ = server.accept()
                    with conn:
                        client.sendall(b"job")
                        client.shutdown(socket.SHUT_WR)
                        assert conn.recv(16) == b"job" and conn.recv(16) == b""
                        conn.sendall(b"result")
                    assert client.recv(16) == b"result" and client.recv(16) == b""
        finally:
            relay.close()
    assert not (tmp_path / "r.sock").exists()
    with socket.socket(socket.AF_UNIX) as late, pytest.raises(OSError):
        late.connect(str(tmp_path / "r.sock"))


def serve(request: dict[str, object], image: bytes = b"") -> subprocess.CompletedProcess[str]:
    """``iomatrix node serve-guests`` given ``request`` (and ``image``, the stream of a user's
    image, after it), its stdin held open as the controller holds it (its end would stop the
    node as an interrupt)."""
    proc = subprocess.Popen([IOMATRIX, "node", "serve-guests"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    with contextlib.suppress(BrokenPipeError):
        proc.stdin.write(json.dumps(request).encode() + b"\n" + image)
        proc.stdin.flush()
    try:
        proc.wait(timeout=120)
    finally:
        proc.stdin.close()
        proc.kill()
    return subprocess.CompletedProcess(proc.args, proc.wait(), proc.stdout.read().decode(),
                                       proc.stderr.read().decode())


@pytest.mark.slow
def test_the_node_refuses_a_request_it_cannot_trust(tmp_path: Path) -> None:
    suite = write_suite(tmp_path, GUESTS)
    planted = tmp_path / "planted.raw"
    planted.write_bytes(b"")
    base = {"suite_text": suite.read_text(), "suite_source": str(suite),
            "config": "guest/x", "accel": "tcg",
            "directory": "/tmp/iomatrix-guests-0123456789abcdef",
            "images": [{"path": str(planted), "format": "raw", "preallocation": "off",
                        "size": 1 << 20}]}
    elsewhere = serve(base | {"directory": "/etc/iomatrix"})
    assert elsewhere.returncode != 0 and elsewhere.stdout == ""
    assert "not a guest request: directory" in elsewhere.stderr
    assert len(elsewhere.stderr.strip().splitlines()) == 1
    from iomatrix.measure.prepare import prepare

    key = prepare(load_suite(suite)).full.configurations[0].key
    directory = f"/tmp/iomatrix-guests-{os.urandom(8).hex()}"
    outside = serve(base | {"config": key, "directory": directory})
    assert outside.returncode != 0 and f"disk {planted}: not an image" in outside.stderr
    assert not Path(directory).exists()                     # made, and removed again
    Path(directory).mkdir(mode=0o700)
    try:
        there = serve(base | {"config": key, "directory": directory})
        assert there.returncode != 0 and f"cannot make {directory}" in there.stderr
    finally:
        Path(directory).rmdir()
    unknown = serve(base | {"config": "guest/controller=floppy", "directory": directory})
    assert unknown.returncode != 0 and "no guest configuration" in unknown.stderr


def test_the_controller_believes_no_socket_the_node_did_not_get(tmp_path: Path) -> None:
    request = GuestRequest(suite_text="", suite_source="t", config="guest/x", accel="tcg",
                           directory="/tmp/iomatrix-guests-0123456789abcdef",
                           images=(Image(path=tmp_path / "d", format="raw", preallocation="off",
                                         size=1),))
    guests = NodeGuests(Node(host="n", name="n"), request, [tmp_path / "l.sock"],
                        tmp_path / "n.log")
    asked = {"sockets": ["/tmp/iomatrix-guests-0123456789abcdef/vm0.sock"], "applied": {}}
    assert guests.said_ready(f"booting\n{GUESTS_READY} {json.dumps(asked)}\n")
    for wrong in ({**asked, "sockets": ["/run/elsewhere.sock"]}, {**asked, "applied": []}):
        again = NodeGuests(Node(host="n", name="n"), request, [tmp_path / "l.sock"],
                           tmp_path / "n.log")
        with pytest.raises(TrialFailed, match="node n: its "):
            again.said_ready(f"{GUESTS_READY} {json.dumps(wrong)}\n")
    assert [a for a in guests.argv() if a.startswith(str(tmp_path))] == [
        f"{tmp_path / 'l.sock'}:/tmp/iomatrix-guests-0123456789abcdef/vm0.sock"]


def test_a_trial_without_every_clients_result_is_not_one() -> None:
    """fio's client can end well when a server's connection drops (a node killed as its guest
    ran the job): the result of the servers that stayed is not the trial's."""
    result = parse_fio_output((FIXTURES / "3.41/client2-randread.out").read_text())
    ports = [job.port for job in result.jobs]
    assert len(vm_samples_of(result, ports)) == 2
    with pytest.raises(FioParseError, match="no result for the client at 1"):
        vm_samples_of(result, [ports[0], 1])
    alone = result.model_copy(update={"jobs": result.jobs[:1], "aggregate": None})
    with pytest.raises(FioParseError, match=f"no result for the client at {ports[1]}"):
        vm_samples_of(alone, ports)


@pytest.mark.parametrize("extra, says", [
    ('[[part]]\nmode = "blocklayer"\n', "a blocklayer part on an rbd pool or an iSCSI LUN only"),
    ('[guest]\nname = "mine"\nimage = "/nonexistent.raw"\nkernel = "/nonexistent"\n',
     "kernel and initrd are not sent to the nodes"),
])
def test_what_cluster_load_of_guests_refuses(tmp_path: Path, extra: str, says: str) -> None:
    suite = load_suite(write_suite(tmp_path, GUESTS + extra))
    with Store(tmp_path / "r.db") as store, pytest.raises(SuiteError, match=says):
        run_suite(suite, store, nodes=[Node(host="n")])
    assert not (tmp_path / "target").exists()


@pytest.mark.slow
@DEBIAN_BOOTS
def test_the_users_own_image_boots_on_two_nodes_each_from_a_copy_of_its_own(
        ssh_nodes: Callable[[int], SshCluster], tmp_path: Path, host_appliance: Path,
        debian12) -> None:  # type: ignore[no-untyped-def]
    """[guest] image under cluster load, with the tests' real Debian 12 image (the cheapest
    real OS image the own-guest tests use: 1.5 GiB sparse, ~750 MB of data, booted through its
    own GRUB under TCG): the controller sends each node the image it opened (its data only),
    each node boots its guest on that copy in the session's own directory, through an overlay,
    and one fio client drives both guests at once. The user's image is unchanged, and no
    copy, overlay, guest or session is left on any node."""
    before = _sha256(debian12.image)
    body = (GUESTS.replace("iodepth = [1, 4]", "iodepth = 1").replace(
        'memory = "384MiB"\n', "") + f'[guest]\nname = "debian12"\nimage = "{debian12.image}"\n')
    proc = run_controller(cluster := ssh_nodes(2), tmp_path, str(tmp_path / "r.db"), body)
    run = finished(proc, str(tmp_path / "r.db"))
    assert proc.returncode == 0, [t.reason for t in run.trials]
    (trial,) = run.trials
    assert trial.status == "ok" and trial.config_key.endswith("guest=debian12")
    applied = trial.applied
    assert applied["guest.os"].startswith("Debian GNU/Linux 12"), applied
    assert applied["cluster.nodes"] == "vm0=node1/vm0, vm1=node2/vm0"
    assert not any(k.startswith("node2:") for k in applied), applied      # alike on both
    assert per_node(trial)["node1"] > 0 and per_node(trial)["node2"] > 0
    # each node's QEMU read the copy in its own session's directory, never the user's file
    commands = trial.command.split("# node ")[1:]
    copies = [re.findall(r"opaque=(/tmp/iomatrix-guests-[0-9a-f]{16})/guest-image", c)
              for c in commands]
    assert [len(c) for c in copies] == [1, 1] and copies[0] != copies[1], trial.command
    assert str(debian12.image) not in trial.command
    assert _sha256(debian12.image) == before
    nothing_left(cluster, tmp_path, guest_directories([trial.command]))


def test_a_nodes_preflight_leaves_the_controllers_guest_image_to_the_controller(
        tmp_path: Path) -> None:
    """Under cluster load the [guest] image named in the suite is the controller's (it sends
    it; the node checks the copy): a node's preflight does not look for it there. A node that
    measures its own share runs the image itself, and says it is missing."""
    from iomatrix.measure.nodeside import node_facts

    for load, said in (("true", ()), ("false", ("[guest] image: /nonexistent/c.qcow2 does not "
                                                "exist",))):
        text = (f'[suite]\nname = "t"\n[target]\ndirectory = "{tmp_path}"\nsize = "16MiB"\n'
                f'[method]\nmode = "guest"\nconcurrent_nodes = {load}\n'
                '[guest]\nimage = "/nonexistent/c.qcow2"\n')
        assert node_facts(load_suite_text(text, source="t")).problems == said
