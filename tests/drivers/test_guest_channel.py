"""The channel to the guests is iomatrix's alone (issue 13, item 2), and I/O that fio did not do
fails its trial.

* Another, unprivileged user (``nobody``, through ``setpriv``, on the host's own network) cannot
  reach a running guest's fio server, nor any socket of the run (QMP, vhost-user) nor its scratch
  directory, while a trial runs; nor can root from the host's network: the forward exists only in
  the session's private network namespace, which is gone with its processes (also after kill -9).
* A second fio client, started from iomatrix's own namespace during a trial, makes that trial
  fail with the difference between QEMU's and fio's counts; clean trials pass, with the verdict.
* Where no namespace can be made, runs warn and go on; ``iomatrix doctor`` says why.

The guest tests boot real guests (under TCG here) and need root (setpriv, nsenter, namespaces);
elsewhere they are skipped with the reason."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from iomatrix.core.errors import EnvironmentProblem
from iomatrix.core.proc import network_namespace, private_network, private_network_problem, run
from iomatrix.drivers.guest import PRIVATE, SHARED, GuestSession
from iomatrix.drivers.guest import driver as guest_driver
from iomatrix.drivers.guest.iocheck import (MARGINS, after_ramp, client_result, largest_io,
                                            ramp_margin, unchecked_reason)
from iomatrix.fio.models import DirectionStats, FioResult, JobStats
from iomatrix.diagnose import doctor
from iomatrix.suite.workloads import Workload
from tests.conftest import BOOT_TIMEOUT, REPO, as_nobody, our_processes, run_guests, write_suite
from tests.needs import needs

ROOT = os.geteuid() == 0
OTHER_PYTHON = shutil.which("python3", path="/usr/bin:/bin")
"""An interpreter another user can run (this one may live in root's home)."""
needs_root = needs("attacker", "qemu", "fio")
"""Root (setpriv to another user, nsenter, network namespaces), util-linux, QEMU, fio and a system
python3."""

METHOD = """
[method]
mode = "guest"
ramp = "1s"
runtime = "3s"
accel = "tcg"
vcpus = 1
memory = "384MiB"
""" + BOOT_TIMEOUT
NO_RAMP = METHOD.replace('ramp = "1s"', "ramp = 0")
"""For tests not about the foreign-I/O check across a ramp (QEMU counts the ramp, fio does not);
half-way through the 3 s runtime, when a trial is observed, the ~1 s fio's client takes to start
is over and fio drives the guests."""

PROBE = r"""
import errno, json, os, socket, sys
ports, sockets, directory = json.loads(sys.argv[1])
def outcome(action):
    try:
        action()
        return "ok"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))
def tcp(port):
    with socket.create_connection(("127.0.0.1", port), timeout=5):
        pass
def unix(path):
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(5)
        s.connect(path)
print(json.dumps({
    "uid": os.getuid(),
    "tcp": {str(p): outcome(lambda: tcp(p)) for p in ports},
    "unix": {p: outcome(lambda: unix(p)) for p in sockets},
    "listdir": outcome(lambda: os.listdir(directory)),
    "parent": outcome(lambda: os.listdir(os.path.dirname(directory))),
    "exists": os.path.exists(directory),
}))
"""


def _on_host_network(argv: list[str], host_net: int) -> list[str]:
    """``argv`` run in the network namespace whose descriptor is ``host_net``."""
    return ["nsenter", f"--net=/proc/self/fd/{host_net}", "--", *argv]


def _probe(argv_prefix: list[str], host_net: int, ports: list[int], sockets: list[str],
           directory: Path) -> dict:  # type: ignore[type-arg]
    argv = argv_prefix + [str(OTHER_PYTHON), "-c", PROBE,
                          json.dumps([ports, sockets, str(directory)])]
    done = subprocess.run(_on_host_network(argv, host_net), capture_output=True, text=True,
                          timeout=60, pass_fds=(host_net,), cwd="/")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def _holders(netns: int, *, started_by: int | None = None) -> list[str]:
    """Processes in the network namespace with inode ``netns`` (with ``started_by``, clock ticks
    since boot: only those started by then). A namespace's inode number is reused once it is
    freed, so a namespace made later by anything else on the host can carry the same number:
    its processes, started after the run ended, are not the run's."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.stat(entry / "ns" / "net").st_ino == netns and (
                        started_by is None or _started(entry) <= started_by):
                    found.append(entry.name)
            except OSError:
                continue
    return found


def _ours(pid: str, session: list[int]) -> bool:
    """The process is one of the session's (its guests and daemons) or this test's process or a
    descendant of it. Another test's process (a second pytest worker, started long before) can
    hold a namespace made later with a reused inode number, when that process unshares a thread
    into a new namespace of its own: it is not the run's."""
    here = os.getpid()
    current = int(pid)
    if current in session:
        return True
    while current > 1:
        if current == here:
            return True
        try:
            current = int(Path(f"/proc/{current}/stat").read_text().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            return False
    return False


def _started(proc: Path) -> int:
    """A process's start time, clock ticks since boot (/proc/PID/stat field 22)."""
    return int((proc / "stat").read_text().rpartition(")")[2].split()[19])


def _ticks_now() -> int:
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK"))


@pytest.fixture
def open_tmpdir(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """TMPDIR (where the run's scratch directory goes) in a directory every user may enter and
    list, so that only the scratch directory's own mode keeps the other user out; afterwards
    nothing that mentions it may still run."""
    base = next(d for d in ("/var/tmp", "/tmp") if os.path.isdir(d)
                and os.stat(d).st_mode & 0o1777 == 0o1777)
    path = Path(tempfile.mkdtemp(prefix="iomatrix-channel-", dir=base)).resolve()
    path.chmod(0o755)
    monkeypatch.setattr(tempfile, "tempdir", str(path))
    monkeypatch.setenv("TMPDIR", str(path))
    try:
        yield path
        assert not our_processes(str(path)), our_processes(str(path))
    finally:
        shutil.rmtree(path, ignore_errors=True)


_run = run_guests


# --- (a) nobody else reaches the guests ----------------------------------------------------------

@pytest.mark.slow
@needs_root
def test_another_user_cannot_reach_a_running_guest_or_the_runs_sockets(
        tmp_path: Path, open_tmpdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    body = """
[matrix]
controller = "virtio-blk"
iothread = false
vms = 2
[[part]]
mode = "guest"
data_path = "vhost-user-blk"
iothread = false
[workloads]
rw = "randread"
iodepth = 4
""" + NO_RAMP
    home = network_namespace()
    host_net = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    seen: list[dict] = []  # type: ignore[type-arg]
    observe = GuestSession.observe

    def probing(self: GuestSession, fio_pid: int) -> None:
        """While fio drives the guests: try everything as nobody, and root's TCP from outside."""
        observe(self, fio_pid)
        scratch = self.hosts_file.parent.parent
        sockets = sorted(str(p) for p in scratch.rglob("*") if stat.S_ISSOCK(p.lstat().st_mode))
        ports = self.client_ports()
        seen.append({
            "netns": network_namespace(), "mode": stat.S_IMODE(scratch.stat().st_mode),
            "sockets": sockets,
            "channel": self.channel, "pids": self.pids(),
            "nobody": _probe(as_nobody([]), host_net, ports, sockets, scratch),
            "root outside": _probe([], host_net, ports, [], scratch)})

    monkeypatch.setattr(GuestSession, "observe", probing)
    try:
        outcome, stored = _run(tmp_path, body)
        ended = _ticks_now()
    finally:
        os.close(host_net)
    assert outcome.trials_failed == 0, [t.reason for t in stored.trials]
    assert len(seen) == 2                                  # one trial per session
    for found in seen:
        kinds = {Path(s).name for s in found["sockets"]}
        assert "qmp" in kinds, found["sockets"]            # every guest's QMP socket, and
        assert found["mode"] == 0o700
        nobody, outside = found["nobody"], found["root outside"]
        assert nobody["uid"] == pwd.getpwnam("nobody").pw_uid
        # the other user sees the scratch directory (its parent is open) but cannot enter it
        assert nobody["exists"] and nobody["parent"] == "ok" and nobody["listdir"] == "EACCES"
        assert set(nobody["unix"].values()) == {"EACCES"}, nobody["unix"]
        # the forwarded ports are closed on the host's network, for anyone: they exist only in
        # the session's own namespace
        assert set(nobody["tcp"].values()) == {"ECONNREFUSED"}, nobody["tcp"]
        assert set(outside["tcp"].values()) == {"ECONNREFUSED"}, outside["tcp"]
        assert found["channel"] == PRIVATE and found["netns"] != home
    assert {"vub", "dqmp"} <= {Path(s).name for s in seen[1]["sockets"]} | {
        Path(s).name for s in seen[0]["sockets"]}           # vhost-user and daemon QMP too
    for trial in stored.trials:
        assert trial.applied["guest.channel"] == PRIVATE
    # this thread is back home, and the namespaces ended with their processes
    assert network_namespace() == home
    for found in seen:
        assert [p for p in _holders(found["netns"], started_by=ended)
                if _ours(p, found["pids"])] == []


@pytest.mark.slow
@needs_root
def test_kill_9_of_iomatrix_leaves_no_guest_and_no_namespace(tmp_path: Path,
                                                              no_leftovers: None) -> None:
    body = "[matrix]\ncontroller = 'virtio-blk'\niothread = false\n" + METHOD.replace(
        'runtime = "3s"', 'runtime = "60s"')
    suite = write_suite(tmp_path, body, size="16MiB")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "iomatrix", "run", str(suite), "--db", "r.db"],
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=env)
    try:
        deadline = time.monotonic() + 150
        while not [p for p in our_processes(str(tmp_path)) if "fio --output-format" in p]:
            assert proc.poll() is None, "iomatrix exited before fio ran"
            assert time.monotonic() < deadline, "fio never ran"
            time.sleep(0.1)
        qemus = [int(p.split()[0]) for p in our_processes(str(tmp_path)) if "qemu-system" in p]
        assert qemus
        private = {os.stat(f"/proc/{pid}/ns/net").st_ino for pid in qemus}
        assert network_namespace() not in private and len(private) == 1
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    (netns,) = private
    deadline = time.monotonic() + 30
    while _holders(netns) or our_processes(str(tmp_path)):    # QEMU, and fio's client too
        assert time.monotonic() < deadline, (_holders(netns), our_processes(str(tmp_path)))
        time.sleep(0.2)


@pytest.mark.slow
def test_without_a_private_namespace_runs_warn_and_record_it(
        tmp_path: Path, no_leftovers: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Forced here (as for a user who is not root): the guests use the host's loopback."""
    monkeypatch.setattr(guest_driver, "private_network_problem",
                        lambda: "cannot create a network namespace: simulated")
    notes: list[str] = []

    class Notes:
        def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
            return notes.append if name == "note" else (lambda *a, **k: None)

    body = ("[matrix]\ncontroller = 'virtio-blk'\niothread = false\n"
            + NO_RAMP.replace('runtime = "3s"', 'runtime = "1s"'))
    outcome, stored = _run(tmp_path, body, progress=Notes())
    assert outcome.trials_failed == 0, [t.reason for t in stored.trials]
    warning = [n for n in notes if "fio servers will listen on 127.0.0.1" in n]
    assert len(warning) == 1 and warning[0].startswith("warning: ") and "simulated" in warning[0]
    assert "run iomatrix as root" in warning[0]
    (trial,) = stored.trials
    assert trial.applied["guest.channel"] == f"{SHARED} (cannot create a network namespace: simulated)"


# --- (b) foreign I/O fails the trial -------------------------------------------------------------

@pytest.mark.slow
@needs_root
def test_a_second_fio_client_during_a_trial_fails_it_with_the_difference(
        tmp_path: Path, no_leftovers: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's attack, from inside iomatrix's own namespace (the only place the guest's fio
    server can be reached from): a second client runs a job on the guest's disk while the first
    trial measures. The second trial, left alone, passes with QEMU's and fio's counts agreeing
    within the bound (after a 1 s ramp, which QEMU counts and fio does not)."""
    assert hasattr(guest_driver.Session, "check_trial"), (
        "the runner must call Session.check_trial(fio.result, workload) after each trial's fio")
    body = ("[matrix]\ncontroller = 'virtio-blk'\niothread = false\n[workloads]\nrw = 'randread'\n"
            "iodepth = [2, 4]\n" + METHOD.replace('runtime = "3s"', 'runtime = "4s"')
            + "seed = 1\n")
    observe = GuestSession.observe
    foreign: list[str] = []

    def intrude(self: GuestSession, fio_pid: int) -> None:
        observe(self, fio_pid)
        if foreign:
            return
        job = self.hosts_file.parent / "foreign.fio"
        job.write_text(f"[foreign]\nfilename=/dev/{self.disk.name}\nrw=randread\nbs=64k\n"
                       "iodepth=8\nioengine=libaio\ndirect=1\nruntime=1\ntime_based=1\n")
        out = run(["fio", f"--client=ip:127.0.0.1,{self.client_ports()[0]}",
                   "--output-format=json", str(job)], timeout=120).stdout
        foreign.append(out)

    monkeypatch.setattr(GuestSession, "observe", intrude)
    outcome, stored = _run(tmp_path, body)
    assert len(foreign) == 1 and '"jobname" : "foreign"' in foreign[0]
    failed = [t for t in stored.trials if t.status == "failed"]
    ok = [t for t in stored.trials if t.status == "ok"]
    assert len(failed) == 1 and len(ok) == 1, [(t.status, t.reason) for t in stored.trials]
    reason = failed[0].reason or ""
    assert reason.startswith("foreign I/O on the disk under test during the trial"), reason
    assert "vm0's disk moved" in reason and "fio counted" in reason and "beyond the" in reason
    assert "FOREIGN I/O" in failed[0].applied["io_check"]
    assert ok[0].applied["io_check"].startswith("vm0 ok: QEMU "), ok[0].applied
    assert outcome.trials_failed == 1


# --- pieces --------------------------------------------------------------------------------------

@needs_root
def test_the_private_namespace_is_per_thread_has_loopback_and_is_left(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = network_namespace()
    monkeypatch.chdir(tmp_path)
    root = os.stat("/")
    with private_network() as inside:
        assert inside == network_namespace() != home
        with socket.socket() as server, socket.socket() as client:
            server.bind(("127.0.0.1", 0))
            server.listen()
            client.connect(server.getsockname())           # lo is up
        done = subprocess.run(["readlink", "/proc/self/ns/net"], capture_output=True, text=True)
        assert done.stdout.strip() == f"net:[{inside}]"     # children start inside
    assert network_namespace() == home
    assert _holders(inside) == []
    # unlike a mount namespace's, setns into a network namespace keeps root and directory
    assert os.getcwd() == str(tmp_path)
    assert (os.stat("/").st_dev, os.stat("/").st_ino) == (root.st_dev, root.st_ino)


@needs_root
def test_an_unprivileged_user_cannot_make_one_and_doctor_says_why(
        monkeypatch: pytest.MonkeyPatch) -> None:
    done = subprocess.run(as_nobody([str(OTHER_PYTHON), "-c",
                                      "from iomatrix.core.proc import private_network_problem; "
                                      "print(private_network_problem())"]),
                          capture_output=True, text=True, timeout=60, cwd="/",
                          env={"PYTHONPATH": str(REPO), "PATH": os.environ["PATH"]})
    assert done.stdout.strip() == "cannot create a network namespace: not permitted (needs " \
                                  "CAP_SYS_ADMIN)", done.stderr
    assert private_network_problem() is None                 # root here
    assert doctor.check_guest_channel().ok

    @contextlib.contextmanager
    def refused():  # type: ignore[no-untyped-def]
        raise EnvironmentProblem("cannot create a network namespace: simulated", hint="be root")
        yield

    monkeypatch.setattr(doctor, "private_network", refused)
    check = doctor.check_guest_channel()
    assert not check.ok and not check.required and check.hint == "be root"
    assert "every local user" in check.detail and "simulated" in check.detail


def _workload(**kw: object) -> Workload:
    return Workload(**({"rw": "randread", "bs": 4096, "iodepth": 1} | kw))  # type: ignore[arg-type]


def test_the_largest_request_a_workload_can_issue() -> None:
    assert largest_io(_workload(bs=8192)) == 8192
    assert largest_io(_workload(options=(("bsrange", "4k-256k"),))) == 256 << 10
    assert largest_io(_workload(options=(("bssplit", "4k/10:64k/50:1m/40"),))) == 1 << 20
    assert unchecked_reason(_workload()) is None
    assert unchecked_reason(_workload(options=(("startdelay", "2s"),))) is None
    assert "startdelay" in (unchecked_reason(_workload(options=(("startdelay", "1-3"),))) or "")


def test_the_reading_after_the_ramp_waits_longer_for_more_jobs() -> None:
    readings = {m: int(m * 1000) for m in MARGINS[:5]}          # taken up to 2 s after the ramp
    assert ramp_margin(_workload()) == 0.1
    assert after_ramp(readings, _workload()) == (0.1, 100)
    assert ramp_margin(_workload(numjobs=4)) == pytest.approx(0.85)
    assert after_ramp(readings, _workload(numjobs=4)) == (1.0, 1000)
    assert after_ramp(readings, _workload(numjobs=8)) == (2.0, 2000)
    assert after_ramp(readings, _workload(numjobs=9)) is None    # the trial ended before


def _job(port: int | None) -> JobStats:
    idle = DirectionStats(io_bytes=0, total_ios=0, runtime_ms=0, iops=0.0, bw_bytes=0.0,
                          lat=None, clat=None)
    return JobStats(name="j", port=port, read=idle, write=idle, usr_cpu=0.0, sys_cpu=0.0, ctx=0)


def test_each_guest_is_matched_to_its_clients_result() -> None:
    two = FioResult(fio_version="fio-3.33", timestamp=None, jobs=(_job(8766), _job(8765)))
    assert client_result(two, 8765, 2) is two.jobs[1]
    assert client_result(two, 9999, 2) is None
    one = FioResult(fio_version="fio-3.33", timestamp=None, jobs=(_job(None),))
    assert client_result(one, 8765, 1) is one.jobs[0]
