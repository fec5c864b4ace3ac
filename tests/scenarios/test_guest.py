"""guest mode for real, under TCG here: every controller booted and measured, iothread on and off
seen by QEMU, vhost-user-blk, two guests at once, a guest that never becomes ready, Ctrl-C."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from iomatrix.core.errors import InvalidCombination
from iomatrix.drivers.guest import GuestSession
from iomatrix.measure.runner import run_suite
from iomatrix.qemu.args import disk_backend
from iomatrix.store import Store
from iomatrix.store.records import TrialResult
from iomatrix.suite import load_suite
from tests.conftest import BOOT_TIMEOUT, declared_kvm, our_processes, run_guests, write_suite

pytestmark = pytest.mark.slow

METHOD = """
[workloads]
rw = "randread"
iodepth = 4
[method]
mode = "guest"
ramp = 0
runtime = "1s"
accel = "tcg"
vcpus = 1
memory = "384MiB"
""" + BOOT_TIMEOUT


run = run_guests

MAX_STEADY = 90
"""The steady-state test's max_runtime, in seconds: a rule that never stops fio runs it whole."""


def test_every_controller_boots_and_measures(tmp_path: Path, no_leftovers: None) -> None:
    body = """
[matrix]
controller = ["virtio-blk", "virtio-scsi", "virtio-scsi-single", "pvscsi", "sata", "ide", "nvme"]
iothread = false
[[part]]
mode = "guest"
controller = ["virtio-blk", "virtio-scsi-single"]
iothread = true
[[part]]
mode = "guest"
data_path = "vhost-user-blk"
iothread = [false, true]
""" + METHOD.replace('runtime = "1s"', 'runtime = "500ms"')    # 11 boots: each trial short
    outcome, stored = run(tmp_path, body)
    labels = {c.key: c.label for c in stored.configs}
    assert outcome.trials_failed == 0, [(labels[t.config_key], t.wall_seconds, t.reason)
                                        for t in stored.trials if t.reason]
    assert stored.accelerator == "tcg" and stored.emulated
    by_config = {t.config_key: t for t in stored.trials}
    assert len(by_config) == 7 + 2 + 2
    drivers = {"virtio-blk": "virtio_blk", "virtio-scsi": "sd", "virtio-scsi-single": "sd",
               "pvscsi": "sd", "sata": "sd", "ide": "sd", "nvme": "nvme"}
    for key, trial in by_config.items():
        assert trial.accelerator == "tcg" and trial.samples[0].iops > 0
        applied = trial.applied
        assert applied["accel"] == "tcg"
        # the guest saw the disk under test, of the size we gave it
        assert applied["guest.disk"]
        controller = next((p.split("=")[1] for p in key.split("/") if p.startswith("controller=")),
                          "vhost-user-blk")
        if controller in drivers:
            assert applied["guest.driver"].startswith(drivers[controller]), applied
        iothread = "iothread=on" in key
        # iothread on and off, as QEMU reports it (query-iothreads; the daemon's for vhost)
        count = applied.get("daemon.iothreads", applied["iothreads"])
        assert count == ("1" if iothread else "0"), (key, applied)
        assert "qemu-system-x86_64" in trial.command and "-accel tcg" in trial.command


def test_two_guests_give_per_vm_and_aggregate_results(tmp_path: Path, no_leftovers: None) -> None:
    body = "[matrix]\ncontroller = 'virtio-blk'\niothread = true\n" + METHOD.replace(
        'vcpus = 1', 'vcpus = 1\nvms = 2')
    outcome, stored = run(tmp_path, body)
    assert outcome.trials_failed == 0, [t.reason for t in stored.trials]
    (trial,) = stored.trials
    assert [s.vm for s in trial.vm_samples] == [0, 1]
    (agg,) = trial.samples
    # fio's all-clients figure is both guests' I/O over the longer of their runtimes: on a
    # loaded host the two guests' runtimes differ, so it is not the sum of their IOPS
    assert agg.total_ios == sum(s.total_ios for s in trial.vm_samples)
    longest = max(s.runtime_ms for s in trial.vm_samples)
    assert agg.iops == pytest.approx(agg.total_ios / (longest / 1000), rel=0.02)
    assert max(s.iops for s in trial.vm_samples) <= agg.iops <= sum(
        s.iops for s in trial.vm_samples) * 1.001
    assert agg.p50_ns is not None and agg.p99_ns is not None and agg.p99_ns >= agg.p50_ns
    assert trial.command.count("qemu-system-x86_64") == 2
    # QEMU's own counters over the trial (both guests) agree with what fio says it did: fio's
    # count excludes the ramp and in-flight I/O, QEMU's includes them
    qemu_reads = int(trial.applied["blockstats.rd_operations"])
    fio_reads = sum(s.total_ios for s in trial.vm_samples)
    assert fio_reads <= qemu_reads <= fio_reads * 1.2 + 64


def test_guest_steady_state_follows_qemu_counters_and_stops_fio(tmp_path: Path,
                                                                 no_leftovers: None) -> None:
    """fio's client prints its status objects only at the end, so a guest's steady state is
    judged from QEMU's device counters; a rate-limited job is steady and is stopped early.

    Nothing here bounds wall-clock time (a loaded host stretches every interval): the rule's
    own counts are asserted (windows checked from the first that ends at min_runtime, the
    first passing one ending where the verdict says), and fio's runtime against the maximum,
    which fio runs whole when nothing stops it."""
    body = ("[matrix]\ncontroller = 'virtio-blk'\niothread = false\n"
            + METHOD.replace('iodepth = 4', 'iodepth = 4\nrate_iops = 300')
                    .replace('runtime = "1s"', 'steady_state = true\nmin_runtime = "5s"\n'
                                                f'max_runtime = "{MAX_STEADY}s"'))
    outcome, stored = run(tmp_path, body)
    assert outcome.trials_failed == 0, [t.reason for t in stored.trials]
    (trial,) = stored.trials
    steady = trial.steady
    assert steady is not None and steady.verdict is not None
    assert steady.checked is True and steady.source == "QEMU device counters"
    verdict = steady.verdict
    assert verdict.reached is True, steady
    # one-second intervals: the first window checked ends at 5 s (min_runtime), each further
    # one an interval later, and checking stopped at the first that passed
    assert verdict.at_seconds is not None and verdict.windows >= 1, steady
    assert verdict.at_seconds == 5 + verdict.windows - 1, steady
    assert verdict.range_ratio is not None and verdict.range_ratio <= 0.2 + 1e-9, steady
    assert verdict.excursion_ratio is not None and verdict.excursion_ratio <= 0.1 + 1e-9, steady
    (sample,) = trial.samples
    # stopped by SIGINT through the client once steady, not run to its maximum: fio's runtime
    # covers the intervals the rule read (each at least a second, the first perhaps begun
    # before fio's I/O) and ends well short of the maximum (fio's own runtime, which it runs
    # whole unless stopped), at the asked rate
    assert verdict.at_seconds - 2 <= sample.runtime_ms / 1000 < 0.9 * MAX_STEADY, (sample, steady)
    assert sample.iops == pytest.approx(300, rel=0.1)


def test_guest_that_never_gets_ready_fails_its_trials_and_the_run_goes_on(
        tmp_path: Path, no_leftovers: None) -> None:
    body = ("[matrix]\ncontroller = 'virtio-blk'\niothread = false\n"
            "[[part]]\nmode = 'blocklayer'\naio = 'threads'\niothread = false\n"
            + METHOD.replace(BOOT_TIMEOUT, 'boot_timeout = "1s"\n'))
    outcome, stored = run(tmp_path, body)
    guest = [t for t in stored.trials if t.config_key.startswith("guest")]
    other = [t for t in stored.trials if t.config_key.startswith("blocklayer")]
    assert [t.status for t in guest] == ["failed"]
    assert "did not boot" in (guest[0].reason or "") and "not ready within 1 s" in (guest[0].reason or "")
    assert [t.status for t in other] == ["ok"]
    assert stored.status == "complete" and outcome.trials_failed == 1


def test_invalid_guest_combination_is_refused_before_any_boot(tmp_path: Path) -> None:
    suite = load_suite(write_suite(tmp_path, "[matrix]\ncontroller = 'nvme'\niothread = true\n" + METHOD))
    with Store(tmp_path / "r.db") as store:
        with pytest.raises(InvalidCombination, match="Property 'nvme.iothread' not found"):
            run_suite(suite, store)
        assert store.list_runs() == []
    assert not our_processes(str(tmp_path))


def test_sigint_stops_every_guest(tmp_path: Path, no_leftovers: None) -> None:
    body = "[matrix]\ncontroller = ['virtio-blk', 'nvme']\niothread = false\n" + METHOD.replace(
        'runtime = "1s"', 'runtime = "20s"')
    suite = write_suite(tmp_path, body, size="16MiB")
    proc = subprocess.Popen([sys.executable, "-m", "iomatrix", "run", str(suite), "--db", "r.db"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not [p for p in our_processes(str(tmp_path)) if "fio --output-format" in p]:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.1)
        time.sleep(1.0)                       # fio is driving the guest now
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130
    assert not [p for p in our_processes(str(tmp_path)) if "qemu" in p]
    with Store(tmp_path / "r.db") as store:
        assert store.load_run(1).status == "interrupted"


def test_accelerator_probe_boots_the_appliance(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              no_leftovers: None) -> None:
    """auto: KVM only if the appliance's kernel reaches its /init under KVM (not the mere
    existence of /dev/kvm); the same probe under TCG does reach it, so the probe can say yes.
    Either outcome is right on some host; each must be handled completely (and must be the one
    IOMATRIX_EXPECT_KVM declares, when it does). How KVM fails is not this test's business."""
    from iomatrix.appliance.build import MIN_MEMORY_MIB, build_appliance, kernel_cmdline
    from iomatrix.drivers.guest import accel as guest
    from iomatrix.appliance.probe import probe_accel

    appliance = build_appliance()
    tcg = probe_accel("tcg", appliance.kernel, appliance.initrd, timeout=120,  # a slow host too
                      marker="Run /init as init process", memory_mib=MIN_MEMORY_MIB + 128,
                      append=kernel_cmdline("loglevel=7", accel="tcg"))
    assert tcg.usable, tcg.reason
    monkeypatch.setattr(guest, "default_cache_dir", lambda: tmp_path)
    notes: list[str] = []
    accel = guest.resolve_accel("auto", appliance, notes.append)
    if declared_kvm() is not None:
        assert accel == ("kvm" if declared_kvm() else "tcg"), notes
    if accel == "kvm":
        assert notes == []
    else:                                    # e.g. a PVM host: /dev/kvm exists, KVM is unusable
        assert accel == "tcg"
        assert len(notes) == 1 and notes[0].startswith("warning: KVM is not usable")
        assert "emulated" in notes[0]
        with pytest.raises(Exception, match="--accel kvm: KVM is not usable here"):
            guest.resolve_accel("kvm", appliance, notes.append)
    # only a success is remembered until reboot; a failure may pass (a busy host) and is re-probed
    assert bool(list(tmp_path.glob("kvm-probe-*.json"))) == (accel == "kvm")


def test_a_trial_that_outlasts_its_time_says_what_the_guests_disk_did(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_leftovers: None) -> None:
    """A guest trial whose fio client does not finish in time fails with what QEMU counted on
    the guest's disk during the trial and in a second past its time (read while fio still
    runs): a stopped guest or I/O path (nothing completes) is told from a slow one. Here the
    time allowed is made shorter than the trial itself, so the guest's disk is busy throughout
    and the trial is not measured again."""
    from iomatrix.measure import runner
    # a 12 s trial gets 5 s: time enough for the guest's fio to start and do I/O on a loaded host
    monkeypatch.setattr(runner, "FIO_GRACE", -7.0)
    outcome, stored = run(tmp_path, '[matrix]\ncontroller = "virtio-blk"\n'
                          + METHOD.replace('runtime = "1s"', 'runtime = "12s"'))
    assert outcome.trials_failed == 1 and outcome.trials_ok == 0
    (trial,) = stored.trials
    import re
    match = re.fullmatch(r"fio did not finish within 5 s; guest vm0's disk completed ([\d,]+) in "
                         r"the trial, ([\d,]+) in a second past its time", trial.reason or "")
    assert match, trial.reason
    assert int(match[1].replace(",", "")) > 0, trial.reason
    # a busy disk: slow, not stopped, so the trial is not measured again
    assert int(match[2].replace(",", "")) > 0, trial.reason
    with Store(tmp_path / "r.db") as store:
        assert store.trial_history(outcome.run_id) == []
    assert not any("the guests stopped" in n for n in stored.notes), stored.notes


STOPS = ("paused", "sigstopped", "throttled")
STOP_GRACE = 7.0
"""The stop tests' FIO_GRACE: a 1 s trial gets 8 s, less than fio's client needs to give up on
a silent server (~40 s), and several times what a guest's fio under TCG needs for it (a stopped
attempt waits it out whole: the tests' time)."""


def test_trials_whose_guest_stops_are_measured_again_in_a_fresh_boot(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_leftovers: None) -> None:
    """A guest that stops in a trial fails that trial with what its disk did: paused through
    QMP, its fio never finishes and its disk sits idle; its QEMU stopped whole (SIGSTOP), its
    monitor does not answer either; its disk throttled (QMP) to 2 requests a second under 32
    queued, it completes fewer in a second than its fio keeps queued (a stopped NVMe guest in
    CI went on completing 4 a second at QD4). The trial is then measured again after the guest
    is booted afresh: the run keeps the new result, the failed attempt goes whole to the trial
    history, and a run note says so. A trial is measured again at most runner.STOP_RETRIES
    times (test_a_trial_that_outlasts_its_time...: a busy disk is not a stop at all).

    One run of three trials (three block sizes), the first attempt of each stopped one of the
    three ways, in turn: each way fails its own attempt, and each trial is measured again."""
    import os

    from iomatrix.drivers.guest import session as guest
    from iomatrix.measure import runner
    from iomatrix.qemu.qmp import qmp_execute
    monkeypatch.setattr(runner, "FIO_GRACE", STOP_GRACE)
    monkeypatch.setattr(guest, "BLOCKSTATS_TIMEOUT", 2.0)

    def stop(session: GuestSession, how: str) -> None:
        socket = session.guests[0].qmp_socket
        if how == "paused":
            qmp_execute(socket, [("stop", None)])
        elif how == "throttled":
            disk = disk_backend(qmp_execute(socket, [("query-block", None)])[0])
            assert disk is not None
            limits = {k: 0 for k in ("bps", "bps_rd", "bps_wr", "iops_rd", "iops_wr")}
            qmp_execute(socket, [("block_set_io_throttle",
                                  {"id": disk["qdev"], **limits, "iops": 2})])
        else:
            os.kill(session.guests[0].pid, signal.SIGSTOP)

    # each attempt as it starts: (its trial's workload, its QEMU's pid); the attempts stopped
    attempts: list[tuple[str, int]] = []
    stopped: dict[str, tuple[str, int]] = {}          # workload → (how, the stopped QEMU's pid)
    trial, observe, start = runner._Runner._trial, GuestSession.observe, GuestSession.new_trial
    current: list[str] = []

    def each_trial(self, session, workdir, config, workload, k):  # type: ignore[no-untyped-def]
        current[:] = [workload.key]
        return trial(self, session, workdir, config, workload, k)

    def new_trial(self: GuestSession) -> None:
        attempts.append((current[0], self.guests[0].pid))
        start(self)

    def stop_first_attempts(self: GuestSession, fio_pid: int) -> None:
        observe(self, fio_pid)
        if current[0] not in stopped:              # the first attempt of this trial
            how = STOPS[len(stopped)]
            stop(self, how)
            stopped[current[0]] = (how, self.guests[0].pid)

    monkeypatch.setattr(runner._Runner, "_trial", each_trial)
    monkeypatch.setattr(GuestSession, "new_trial", new_trial)
    monkeypatch.setattr(GuestSession, "observe", stop_first_attempts)
    # the tests' helper keeps every such stop in sight of CI's summary
    with pytest.warns(UserWarning, match="the guests stopped"):
        outcome, stored = run(tmp_path, '[matrix]\ncontroller = "virtio-blk"\n' + METHOD.replace(
            "iodepth = 4", 'iodepth = 32\nbs = ["4k", "8k", "16k"]'))
    assert (outcome.trials_ok, outcome.trials_failed) == (3, 0), [t.reason for t in stored.trials]
    assert [how for how, _ in stopped.values()] == list(STOPS), stopped
    assert all(t.status == "ok" and t.samples[0].iops > 0 for t in stored.trials)
    with Store(tmp_path / "r.db") as store:
        retired = store.trial_history(outcome.run_id)
    # every attempt after a trial's first ran in another QEMU than the one stopped (a third
    # attempt, if a real stop struck the second: the helper warned of it); each failed attempt
    # is in the history, and nothing else is
    for workload, (how, pid) in stopped.items():
        pids = [p for w, p in attempts if w == workload]
        assert len(pids) >= 2 and pids[0] == pid and pid not in pids[1:], (how, attempts)
    assert len(retired) == len(attempts) - 3 and all(r.trial.status == "failed" for r in retired)
    said = {"paused": r"guest vm0's disk completed [\d,]+ in the trial, 0 in a second past "
                      r"its time",
            "throttled": r"guest vm0's disk completed [\d,]+ in the trial, \d in a second past "
                         r"its time",
            "sigstopped": r"guest vm0: QEMU did not answer its monitor within 2 s"}
    first: dict[str, TrialResult] = {}
    for r in retired:                                       # oldest first
        first.setdefault(r.trial.workload_key, r.trial)
    for workload, (how, _) in stopped.items():
        reason = first[workload].reason or ""
        assert re.fullmatch(r"fio did not finish within 8 s; " + said[how], reason), (how, reason)
    again = [n for n in stored.notes if "the guests stopped" in n and "measured again after "
             f"booting them afresh (attempt 2 of at most {runner.STOP_RETRIES + 1};" in n]
    assert len(again) == 3, stored.notes


def test_after_a_stop_not_measured_again_the_next_trial_boots_afresh(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_leftovers: None) -> None:
    """A stopped trial that is not measured again (its last attempt; a pilot's trial, one
    measurement of many) fails alone: the next trial of its configuration runs in a fresh boot,
    not on the stopped guest (where it could only wait out its time and fail too), and a run
    note says so. What is asserted is the next trial's QEMU, so a real stop of its own (rare)
    cannot make the test pass or fail.

    One run serves both: one pilot block (pilot = true, one round) whose first trial is
    stopped, then the run's block, whose first trial is stopped on its last attempt (no trial
    is measured again here: STOP_RETRIES 0)."""
    from iomatrix.analysis import trialplan as tp
    from iomatrix.measure import runner
    from iomatrix.qemu.qmp import qmp_execute
    monkeypatch.setattr(runner, "FIO_GRACE", STOP_GRACE)
    monkeypatch.setattr(runner, "STOP_RETRIES", 0)
    monkeypatch.setattr(tp, "PILOT_ROUNDS", 1)          # one pilot block, then the run's round
    block, observe, start = runner._Runner._block, GuestSession.observe, GuestSession.new_trial
    pilot: list[bool] = []
    attempts: list[tuple[bool, int]] = []          # each attempt: (a pilot's?, its QEMU's pid)
    stopped: dict[bool, int] = {}                  # a pilot's? → the stopped QEMU's pid

    def each_block(self, *args, each=None):  # type: ignore[no-untyped-def]
        pilot[:] = [each is not None]
        return block(self, *args, each=each)

    def new_trial(self: GuestSession) -> None:
        attempts.append((pilot[0], self.guests[0].pid))
        start(self)

    def stop_first(self: GuestSession, fio_pid: int) -> None:
        observe(self, fio_pid)
        if pilot[0] not in stopped:          # the first trial of the pilot, and of the run
            qmp_execute(self.guests[0].qmp_socket, [("stop", None)])
            stopped[pilot[0]] = self.guests[0].pid

    monkeypatch.setattr(runner._Runner, "_block", each_block)
    monkeypatch.setattr(GuestSession, "new_trial", new_trial)
    monkeypatch.setattr(GuestSession, "observe", stop_first)
    body = ('[matrix]\ncontroller = "virtio-blk"\n'
            + METHOD.replace('rw = "randread"', 'rw = ["randread", "randwrite"]')
            + "pilot = true\nmax_samples = 3\n")         # the run's rounds: 3, whatever the noise
    with pytest.warns(UserWarning, match="the guests stopped"):
        outcome, stored = run(tmp_path, body)
    assert sorted(stopped) == [False, True], (stopped, attempts)
    for case in (True, False):                  # the pilot's, then the run's
        pids = [pid for p, pid in attempts if p is case]
        assert len(pids) >= 2 and pids[0] == stopped[case] and pids[1] != stopped[case], (
            case, attempts)
    for said in ("in a pilot trial, which is not measured again",
                 "(attempt 1 of at most 1); the trial failed"):
        assert any(f"the guests stopped {said}; the 1 trial(s) after it in this configuration "
                   "are measured after booting them afresh" in n for n in stored.notes), (
            said, stored.notes)
    with Store(tmp_path / "r.db") as store:
        measured, _ = store.load_pilot(outcome.run_id)
    assert len(measured) == 2 and measured[0].iops is None, measured
    first = min(stored.trials, key=lambda t: t.started_at)
    assert first.status == "failed" and "fio did not finish within 8 s" in (first.reason or "")


def test_a_job_that_paces_itself_is_held_to_an_idle_disk() -> None:
    """What a guest's disk may complete in a second past the trial's time and still count as
    stopped: the requests its fio keeps queued, or none for a job that paces itself."""
    from iomatrix.measure.runner import in_flight
    from iomatrix.suite.workloads import Workload
    job = Workload(rw="randread", bs=4096, iodepth=8, numjobs=2)
    assert in_flight(job) == 16
    assert in_flight(job.model_copy(update={"rate_iops": 100})) == 0
    for option in (("rate", "1m"), ("rate_iops", "50"), ("thinktime", "10ms")):
        assert in_flight(job.model_copy(update={"options": (option,)})) == 0, option
    assert in_flight(job.model_copy(update={"options": (("norandommap", "1"),)})) == 16


def test_threads_waiting_in_the_kernel_are_seen() -> None:
    """What a stop's failure names when QEMU's own threads wait in the host's kernel (the host's
    storage, not the guest, stopped): a process writing synchronously, 4 KiB at a time, is
    caught in uninterruptible sleep with the kernel function it waits in; a sleeping one never.
    It writes under /var/tmp, disk-backed by convention (a tmpfs /tmp would never wait)."""
    import tempfile

    from iomatrix.core.proc import blocked_threads
    scratch = tempfile.TemporaryDirectory(dir="/var/tmp", prefix="iomatrix-test-")
    writer = subprocess.Popen(["dd", "if=/dev/zero", f"of={Path(scratch.name) / 'f'}", "bs=4k",
                               "count=200000", "oflag=direct,dsync", "status=none"])
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        seen: dict[int, str] = {}
        deadline = time.monotonic() + 60
        while not seen and time.monotonic() < deadline and writer.poll() is None:
            seen = blocked_threads(writer.pid)
            time.sleep(0.01)
        assert list(seen) == [writer.pid], seen
        assert re.fullmatch(r"dd( \(\w+\))?", seen[writer.pid]), seen
        assert blocked_threads(sleeper.pid) == {}
    finally:
        for p in (writer, sleeper):
            p.kill()
            p.wait()
        scratch.cleanup()
