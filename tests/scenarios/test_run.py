"""A whole run for real, through the library and the command line: host baseline plus
blocklayer, stored, shown, exported; clean-up on success and on Ctrl-C."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from iomatrix.cli.status import ExitStatus
from iomatrix.drivers.registry import DRIVERS, driver_for
from iomatrix.measure.runner import run_suite
from iomatrix.qemu.version import installed, shown
from iomatrix.store import Store
from iomatrix.suite import load_suite
from iomatrix.suite.expand import NBD_IOTHREAD_SURVIVES_FROM
from iomatrix.vocab.words import Mode
from iomatrix.suite.method import Method
from tests.browser import open_page
from tests.conftest import IOMATRIX, REPO, cli_result, our_processes, write_suite
from tests.needs import need

pytestmark = pytest.mark.slow

SMALL = """
[matrix]
aio = ["native", "threads"]
cache = ["none", "writeback"]
format = ["raw", "qcow2"]
iothread = false
skip_invalid = true
[[workloads]]
rw = "randread"
bs = "4k"
iodepth = [1, 16]
[[workloads]]
rw = "randwrite"
bs = "4k"
iodepth = 16
[method]
mode = "blocklayer"
baseline = true
ramp = "200ms"
runtime = "1s"
"""



def test_run_stores_every_trial_and_cleans_up(tmp_path: Path, no_leftovers: None) -> None:
    # 0.5 s trials: fio's own runtimes still add up to 21 of them, the 200 ms ramps left out
    body = SMALL.replace('runtime = "1s"', 'runtime = "500ms"')
    suite = load_suite(write_suite(tmp_path, body, size="32MiB"))
    with Store(tmp_path / "r.db") as store:
        outcome = run_suite(suite, store)
        run = store.load_run(outcome.run_id)
    # host + native/none × 2 formats + threads × 2 caches × 2 formats = 7 configurations
    assert len(run.configs) == 7 and len(run.workloads) == 3
    assert outcome.trials_ok == 21 and outcome.trials_failed == 0
    assert run.status == "complete"
    assert all(t.status == "ok" and t.samples for t in run.trials)
    assert any("skipped" in n and "aio=native" in n for n in run.notes)
    # the export note names QEMU 7.2's NBD abort only where a QEMU before 9.0 runs
    export, = [n for n in run.notes if "iothread in blocklayer mode" in n]
    qsd = installed("qemu-storage-daemon")
    assert qsd is not None and run.host["qemu_storage_daemon"].startswith(shown(qsd))
    assert ("can abort an NBD export" in export) == (qsd < NBD_IOTHREAD_SURVIVES_FROM)
    for t in run.trials:
        if t.config_key != "host":
            assert t.applied["aio"] == t.config_key.split("aio=")[1].split("/")[0]
            assert "qemu-storage-daemon" in t.command
        direction = "read" if t.workload_key.startswith("randread") else "write"
        assert [s.direction for s in t.samples] == [direction]
        assert t.samples[0].iops > 0 and t.samples[0].p99_ns >= t.samples[0].p50_ns
    assert run.host["fio"].startswith("fio-3") and run.host["target_fs"]
    # the versions that move a baseline (analysis.baselines), as this host has them
    qemu = installed("qemu-system-x86_64")
    assert qemu is not None and run.host["machine"] == f"pc-i440fx-{qemu[0]}.{qemu[1]}"
    zfs = Path("/sys/module/zfs/version")
    assert run.host["zfs"] == (zfs.read_text().strip() if zfs.exists() else "not loaded")
    assert (run.host["ceph"][0].isdigit()) == (shutil.which("rbd") is not None)
    # measured: fio's own runtimes, each at least the 0.5 s asked (more on a loaded host: fio
    # stops at its first check past the runtime), none holding its trial's 200 ms ramp
    runtimes = [max(s.runtime_ms for s in t.samples) / 1000 for t in run.trials]
    assert outcome.measured_seconds == pytest.approx(sum(runtimes))
    assert all(r >= 0.5 for r in runtimes), runtimes
    assert all(r <= t.wall_seconds - 0.2 for r, t in zip(runtimes, run.trials))
    # images and the scratch directory are gone; the target directory we created too
    assert not (tmp_path / "target").exists()


def test_precondition_writes_images_fully(tmp_path: Path, no_leftovers: None) -> None:
    """Preconditioning comes before the trials: one short workload is enough to see it."""
    body = SMALL.replace('aio = ["native", "threads"]', 'aio = "io_uring"').replace(
        'cache = ["none", "writeback"]', 'cache = "none"').replace(
        'iodepth = [1, 16]', 'iodepth = 1').replace(
        '[[workloads]]\nrw = "randwrite"\nbs = "4k"\niodepth = 16\n', '').replace(
        'runtime = "1s"', 'runtime = "500ms"')
    assert body.count("[[workloads]]") == 1 and 'runtime = "500ms"' in body
    suite = load_suite(write_suite(tmp_path, body, size="16MiB"))
    with Store(tmp_path / "r.db") as store:
        outcome = run_suite(suite, store, keep=True)
    (workdir,) = (tmp_path / "target").glob("iomatrix-*")
    for image in workdir.glob("disk-*"):
        assert image.stat().st_blocks * 512 >= 16 << 20, image   # every block written once
    assert outcome.trials_failed == 0


def test_cli_run_show_export_report(tmp_path: Path, no_leftovers: None) -> None:
    body = SMALL.replace('aio = ["native", "threads"]', 'aio = "threads"').replace(
        'cache = ["none", "writeback"]', 'cache = "none"').replace('format = ["raw", "qcow2"]', 'format = "raw"').replace(
        'runtime = "1s"', 'runtime = "500ms"')
    suite = write_suite(tmp_path, body, size="16MiB")
    run = cli_result("run", str(suite), "--db", "r.db", "--report", "rep", cwd=tmp_path,
              own_process=True, check=0)
    assert "run 1: 6 trials ok, 0 failed" in run.stdout
    assert "[6/6]" in run.stderr            # plain progress lines when not on a terminal
    runs = cli_result("runs", "--db", "r.db", cwd=tmp_path, check=0).stdout
    assert " t " in runs and "complete" in runs
    show = cli_result("show", "last", "--db", "r.db", cwd=tmp_path, check=0).stdout
    assert "host (bare metal)" in show and "blocklayer threads/none/raw" in show
    assert show.count("4k randread QD16") == 2
    rows = list(csv.DictReader(io.StringIO(cli_result("export", "1", "--db", "r.db", cwd=tmp_path, check=0).stdout)))
    assert len(rows) == 6 and {r["status"] for r in rows} == {"ok"}
    assert all(float(r["iops"]) > 0 for r in rows)
    data = json.loads(cli_result("export", "1", "--format", "json", "--db", "r.db", cwd=tmp_path, check=0).stdout)
    assert len(data["trials"]) == 6 and data["suite_text"] == suite.read_text()
    page = tmp_path / "rep/index.html"
    assert page.is_file()
    need("chromium")
    with open_page(page, block_network=True) as report:
        assert report.problems == []
        # one IOPS and one p99 chart per workload group (randread 4k, randwrite 4k)
        assert report.count(".chart .main-svg") >= 4
        traces = report.evaluate("[...document.querySelectorAll('#performance .chart')].map("
                                 "c => c.querySelectorAll('.scatterlayer .trace').length)")
        assert traces and all(n == 2 for n in traces)    # host baseline + the blocklayer config
        report.screenshot(REPO / "test-artifacts/run-report.png")


@pytest.mark.parametrize("args, status, message", [
    (["run", "nope.toml"], ExitStatus.SUITE_INVALID, "nope.toml: no such file and no built-in suite"),
    (["show", "1", "--db", "missing.db"], ExitStatus.STORE, "missing.db: no results database here"),
    (["export", "1", "--format", "xml"], ExitStatus.USAGE, "choose csv or json"),
    (["suites", "nope"], ExitStatus.SUITE_INVALID, "nope: no built-in suite of that name"),
    (["frobnicate"], ExitStatus.USAGE, "No such command"),
])
def test_cli_bad_input_gives_one_line_and_status(tmp_path: Path, args: list[str], status: int,
                                                 message: str) -> None:
    proc = cli_result(*args, cwd=tmp_path, check=status)
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_cli_not_found_and_not_enough_space(tmp_path: Path) -> None:
    suite = write_suite(tmp_path, SMALL, size="64TiB")
    proc = cli_result("run", str(suite), "--db", "r.db", cwd=tmp_path, check=ExitStatus.TARGET)
    assert "free" in proc.stderr and "need" in proc.stderr
    assert not list((tmp_path / "target").glob("*"))   # nothing was created
    proc = cli_result("show", "9", "--db", "r.db", cwd=tmp_path, check=ExitStatus.NOT_FOUND)
    assert "no run 9" in proc.stderr


def _trials_stored(db: Path) -> int:
    if not db.exists():
        return 0
    try:
        with Store(db) as store:
            return sum(r.trials_ok + r.trials_failed for r in store.list_runs())
    except Exception:   # the run is creating the database right now
        return 0


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_stops_everything_and_marks_run_interrupted(tmp_path: Path, no_leftovers: None,
                                                          signum: int) -> None:
    suite = write_suite(tmp_path, SMALL, size="16MiB")   # signalled while a 1 s trial runs
    proc = subprocess.Popen([*IOMATRIX, "run", str(suite), "--db", "r.db"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        # wait until a trial is stored and a blocklayer trial runs (daemon and fio alive)
        while not (_trials_stored(tmp_path / "r.db") and
                   [p for p in our_processes(str(tmp_path)) if "qemu-storage-daemon" in p] and
                   [p for p in our_processes(str(tmp_path)) if "fio --output" in p]):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == ExitStatus.INTERRUPTED, err
    assert "interrupted" in err
    with Store(tmp_path / "r.db") as store:
        run = store.load_run(1)
    assert run.status == "interrupted"
    assert 1 <= len(run.trials) < 21
    assert not (tmp_path / "target").exists()


def test_run_on_a_block_device(tmp_path: Path, loop_device: Path, no_leftovers: None) -> None:
    """host and blocklayer on a real (loop) block device named with allow_destroy."""
    suite_path = tmp_path / "dev.toml"
    suite_path.write_text(f"""
[suite]
name = "dev"
[target]
device = "{loop_device}"
allow_destroy = true
size = "32MiB"
[matrix]
aio = ["native", "io_uring"]
cache = "none"
iothread = false
[workloads]
rw = ["randread", "randwrite"]
iodepth = 8
[method]
mode = "blocklayer"
baseline = true
ramp = 0
runtime = "500ms"
""")
    with Store(tmp_path / "r.db") as store:
        outcome = run_suite(load_suite(suite_path), store)
        run = store.load_run(outcome.run_id)
    assert outcome.trials_failed == 0 and outcome.trials_ok == 6, [t.reason for t in run.trials]
    assert run.host["target_fs"] == "(raw block device)"
    blocklayer = [t for t in run.trials if t.config_key != "host"]
    assert all(t.applied["file0.driver"] == "host_device" for t in blocklayer)
    assert loop_device.exists()       # the device itself is never removed


def _fio_jobs(marker: str) -> list[int]:
    """fio's job processes (a fio whose parent is a fio) that mention ``marker``."""
    fio = {int(p.split()[0]) for p in our_processes(marker) if p.split(" ", 2)[1] == "fio:"}
    jobs = []
    for pid in fio:
        try:
            if int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]) in fio:
                jobs.append(pid)
        except (OSError, ValueError, IndexError):
            continue
    return jobs


@pytest.mark.parametrize("daemon", ["running", "stuck"])
def test_kill_9_leaves_no_daemon_or_fio_running(tmp_path: Path, no_leftovers: None,
                                                daemon: str) -> None:
    """iomatrix killed outright cannot clean up, but the kernel stops what it started
    (parent-death signal): no qemu-storage-daemon, fio or FUSE mount outlives it. "stuck": the
    daemon does not end on its SIGTERM (stopped with SIGSTOP just before the kill, a stand-in
    for the daemon CI once saw waiting on the FUSE export's in-flight I/O while fio waited on
    it): fio's job then waits in the kernel on the export, and only iomatrix's reaper (kill the
    daemon, which aborts the FUSE connection, and unmount) ends both. "running": fio's job
    processes cannot stop (stopped with SIGSTOP just before the kill, a stand-in for the job
    CI saw deadlocked in a futex wait once fio's main process had died, in a session of its
    own): only iomatrix's reaper of fio (``proc.reaped``) ends them."""
    body = SMALL.replace('runtime = "1s"', 'runtime = "3s"').replace("iothread = false", "iothread = true")
    suite = write_suite(tmp_path, body, size="16MiB")
    proc = subprocess.Popen([*IOMATRIX, "run", str(suite), "--db", "r.db"], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    # both at once: fio started inside the daemon's session, on its FUSE export
    while not all(any(name in p for p in our_processes(str(tmp_path)))
                  for name in ("qemu-storage-da", " fio: ")):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.5)       # fio's I/O under way
    if daemon == "stuck":
        for p in our_processes(str(tmp_path)):
            if "qemu-storage-da" in p:
                os.kill(int(p.split()[0]), signal.SIGSTOP)
    else:
        while not (jobs := _fio_jobs(str(tmp_path))):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        for job in jobs:
            os.kill(job, signal.SIGSTOP)
    proc.kill()
    proc.wait(timeout=10)
    deadline = time.monotonic() + 120     # the reaper's grace is 5 s; this only ends a hang
    while our_processes(str(tmp_path)):
        assert time.monotonic() < deadline, our_processes(str(tmp_path))
        time.sleep(0.1)
    assert not [m for m in Path("/proc/self/mountinfo").read_text().splitlines() if str(tmp_path) in m]


def test_the_registry_has_a_driver_for_every_mode(tmp_path: Path) -> None:
    """The runner asks it alike for every mode; those that boot no guest prepare nothing (guest
    preparation, the appliance and the accelerator, runs for real in test_guest)."""
    assert set(DRIVERS) == set(Mode)
    notes: list[str] = []
    for mode in ("host", "blocklayer"):
        driver = driver_for(mode, Method(), tmp_path, accel="auto", note=notes.append)
        assert driver.mode == mode and driver.accelerator == "none"
    assert notes == []
