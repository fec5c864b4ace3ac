"""CPU affinity for real (issue 35): a TCG guest's vCPUs, IOThread and main loop, and
qemu-storage-daemon's IOThread and main loop, pinned after start and read back from /proc
(``Cpus_allowed_list``); a thread re-pinned behind iomatrix's back fails the check with the
difference; fio's cpus_allowed in host and blocklayer modes in its job and its own JSON; a CPU
set beyond the host's refused in one line; "numa" on a loop device falls back with a note."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from iomatrix.core import cpuset
from iomatrix.drivers.blocklayer import BlocklayerDriver
from iomatrix.fio.jobfile import job_text
from iomatrix.fio.run import run_fio
from iomatrix.qemu.affinity import placement, read_thread
from iomatrix.store import Store
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.method import Method
from iomatrix.suite.target import Target
from iomatrix.suite.workloads import Workload
from iomatrix.targets.workspace import Workspace
from tests.conftest import BOOT_TIMEOUT, cli_result, run_guests, write_suite

TWO = cpuset.online() >= {0, 1}
needs_two = pytest.mark.skipif(not TWO, reason="needs CPUs 0 and 1 online")


@pytest.mark.slow
@needs_two
@pytest.mark.parametrize("fio, iothread, main", [("0", "1", "0"), ("1", "0", "1")])
def test_daemon_threads_pinned_read_back_and_repinning_caught(
        tmp_path: Path, no_leftovers: None, fio: str, iothread: str, main: str) -> None:
    config = Configuration(mode="blocklayer", aio="threads", cache="none", format="raw",
                           iothread=True, preallocation="off", vcpu_affinity=fio,
                           iothread_affinity=iothread, main_affinity=main)
    method = Method(mode="blocklayer", ramp=0, runtime=1)
    with Workspace(Target(directory=tmp_path / "target", size=32 << 20)) as ws:
        ws.open([config])
        image = ws.image(config)
        with BlocklayerDriver(method, tmp_path / "work").session(config, [image]) as session:
            job = job_text(Workload(rw="randread", bs=4096, iodepth=4),
                           target=session.fio_target(), ramp=0, runtime=1)
            session.new_trial()
            run = run_fio(job, workdir=tmp_path, timeout=30, during=session.observe,
                          during_at=0.5)
            applied, wrong = session.applied(), session.mismatches()
            pinned = session.pinning.threads
            # behind iomatrix's back: a thread of the daemon moved to the other CPU (the
            # first it started, which lasts while it runs)
            moved = next(t for t in pinned if t.role == "iothread")
            os.sched_setaffinity(moved.tid, {1 - int(iothread)})
            repinned = session.mismatches()
    assert f"cpus_allowed={fio}\ncpus_allowed_policy=shared\n" in job
    options = json.loads(run.raw_json)["global options"]
    assert (options["cpus_allowed"], options["cpus_allowed_policy"]) == (fio, "shared")
    assert wrong == [], wrong
    assert applied["affinity.main"] == main
    daemon = {k: v for k, v in applied.items() if k.startswith("affinity.daemon.")
              and not k.endswith(".ran_on")}
    # its IOThread, RCU and monitor threads: at least those three
    assert len(daemon) >= 3 and set(daemon.values()) == {iothread}, applied
    assert applied["affinity.main.ran_on"].isdigit()
    assert applied["affinity.iothread.asked"] == iothread
    seen = {k: v for k, v in applied.items() if k.startswith("affinity.fio.")
            and not k.endswith(".ran_on")}
    assert seen and set(seen.values()) == {fio}, applied
    assert [t.name for t in pinned] == ["main", *(f"daemon.{t.tid}" for t in pinned[1:])]
    assert repinned == [f"affinity.daemon.{moved.tid} (thread {moved.tid}): asked {iothread}, "
                        f"/proc shows Cpus_allowed_list {1 - int(iothread)}"]


@pytest.mark.slow
@needs_two
def test_guest_threads_pinned_and_host_fio_allowed(tmp_path: Path, no_leftovers: None) -> None:
    """One TCG guest with two vCPUs and an IOThread, each role on its own CPU; a host-mode
    part whose fio runs on CPU 1: one run, its trials' applied records."""
    body = """
[matrix]
controller = "virtio-blk"
iothread = true
vcpu_affinity = "1"
iothread_affinity = "0"
main_affinity = "1"
[[part]]
mode = "host"
vcpu_affinity = "1"
[workloads]
rw = "randread"
iodepth = 2
[method]
mode = "guest"
baseline = false
ramp = 0
runtime = "500ms"
accel = "tcg"
vcpus = 2
memory = "384MiB"
""" + BOOT_TIMEOUT
    outcome, stored = run_guests(tmp_path, body)
    assert outcome.trials_failed == 0, [t.reason for t in stored.trials]
    by_mode = {t.config_key.split("/")[0]: t for t in stored.trials}
    guest = by_mode["guest"].applied
    vcpus = {k: v for k, v in guest.items()
             if k.startswith("affinity.vcpu") and k[len("affinity.vcpu"):].isdigit()}
    assert vcpus and set(vcpus.values()) == {"1"}, guest
    assert "affinity.vcpu0" in vcpus and set(vcpus) <= {"affinity.vcpu0", "affinity.vcpu1"}
    assert guest["affinity.vcpu.asked"] == "1"
    iothreads = [v for k, v in guest.items()
                 if k.startswith("affinity.iothread.") and k.count(".") == 2 and k != "affinity.iothread.asked"]
    assert iothreads == ["0"], guest
    assert guest["affinity.main"] == "1"
    host = by_mode["host"]
    with Store(tmp_path / "r.db") as store:
        raw = store.fio_json(host.id)
    assert raw is not None and json.loads(raw)["global options"]["cpus_allowed"] == "1"
    fio = {k: v for k, v in host.applied.items() if k.startswith("affinity.fio.")
           and not k.endswith(".ran_on")}
    assert fio and set(fio.values()) == {"1"}, host.applied


def test_cpus_beyond_the_host_refused_in_one_line(tmp_path: Path) -> None:
    beyond = max(cpuset.online()) + 1
    suite = write_suite(tmp_path, f"""
[method]
mode = "host"
[matrix]
vcpu_affinity = ["0", "{beyond}-{beyond + 2}"]
[[workloads]]
rw = "randread"
""")
    proc = cli_result("run", str(suite), "--db", str(tmp_path / "r.db"), cwd=tmp_path,
                      check=None)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    line = next(l for l in proc.stderr.splitlines() if "vcpu_affinity" in l)
    assert (f'vcpu_affinity = "{beyond}-{beyond + 2}": CPU {beyond}-{beyond + 2} is not an '
            f"online CPU of this host (online: {cpuset.shown(cpuset.online())})") in line
    assert not (tmp_path / "target").exists() or not any((tmp_path / "target").iterdir())


def test_numa_on_a_loop_device_falls_back_with_a_note(loop_device: Path) -> None:
    config = Configuration(mode="guest", main_affinity="numa", iothread_affinity="0")
    where = placement(config, loop_device)
    online = cpuset.online()
    assert where.cpus == {"main": online, "iothread": frozenset({0})}
    assert where.notes == (f"the target device {loop_device.name} has no NUMA node (a loop "
                           f"device, or a disk without NUMA information): \"numa\" means every "
                           f"online CPU, {cpuset.shown(online)}",)
    assert where.applied()["affinity.main.asked"] == cpuset.shown(online)


def test_proc_readback_of_this_thread() -> None:
    """``read_thread`` reads what the kernel says of a thread: this one, pinned and restored."""
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {0})
        allowed, ran = read_thread(os.getpid(), os.getpid())
        assert allowed == frozenset({0}) and ran == 0
    finally:
        os.sched_setaffinity(0, before)
    assert read_thread(os.getpid(), os.getpid())[0] == frozenset(before)
