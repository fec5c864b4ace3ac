"""Telemetry for real: one fio run observed from /proc (per thread, and after its job process
exited), by perf and by the host sampler; QEMU under TCG and qemu-storage-daemon classified into
roles by their thread names and by the thread ids QMP reports."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from iomatrix.fio.status import last_result
from iomatrix.fio.models import JobStats
from iomatrix.core.proc import managed, orphan_guard, stop, wait_for, which
from iomatrix.qemu.qmp import qmp_execute
from iomatrix.telemetry import (HostSampler, HostSeries, PerfCounts, PerfStat, ThreadTimes,
                                classify, cpu_delta, device_of, per_io, per_mb, perf_problem,
                                process_tree, snapshot)
from tests.conftest import our_processes
from tests.needs import need

pytestmark = pytest.mark.slow

RUNTIME = 3
SOFTWARE_EVENTS = ("task-clock", "context-switches")


class Observed:
    """A 3 s fio randwrite on the disk holding /var/tmp, watched by everything at once."""

    def __init__(self, workdir: Path, datadir: Path) -> None:
        self.device = device_of(Path("/var/tmp"))
        job = workdir / "job.fio"
        job.write_text(f"[w]\nioengine=libaio\ndirect=1\nfilename={datadir / 'data'}\nsize=32M\n"
                       f"rw=randwrite\nbs=4k\niodepth=4\ntime_based=1\nruntime={RUNTIME}\n")
        out = workdir / "fio.json"
        sampled_from = time.monotonic()
        sampler = HostSampler(0.5, devices=[self.device] if self.device else []).start()
        proc = subprocess.Popen(orphan_guard(["fio", "--output-format=json", f"--output={out}",
                                              str(job)]),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        self.pid = proc.pid
        self.first: ThreadTimes | None = None       # first snapshot with the job process
        self.last: ThreadTimes | None = None        # last one with the job process
        self.perf: PerfCounts | None = None
        self.perf_window: tuple[ThreadTimes, ThreadTimes] | None = None
        self.perf_unrun_s = 0.0
        """CPU time the kernel took from all CPUs over the perf window (steal, irq, softirq)."""
        try:
            while os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is None:
                shot = snapshot([proc.pid])
                if any(t.pid != proc.pid for t in shot.threads):
                    self.first = self.first or shot
                    self.last = shot
                    if self.perf_window is None and which("perf"):
                        self._count_with_perf(proc.pid)
                time.sleep(0.02)
            # fio has exited but is not reaped: its zombie still shows its final totals.
            self.zombie = snapshot([proc.pid])
        finally:
            _signal_tree(proc.pid, signal.SIGCONT)
            stop(proc)
            self.host: HostSeries = sampler.stop()
            self.sampled_s = time.monotonic() - sampled_from
        self.returncode = proc.returncode
        self.result = last_result(out.read_text())

    def _count_with_perf(self, pid: int) -> None:
        """perf stat on fio's processes, fio running only while perf counts: fio is stopped
        (SIGSTOP) while perf attaches and while it stops, so the /proc snapshots taken then
        hold exactly the CPU time perf counted, whatever the load (perf may take long to start)."""
        _stopped(pid)
        before, unrun = snapshot([pid]), _unrun_seconds()
        perf = PerfStat(process_tree([pid]), events=SOFTWARE_EVENTS).start()
        try:
            if wait_for(lambda: perf.pid is None or _counting(perf.pid), timeout=60):
                _signal_tree(pid, signal.SIGCONT)
                time.sleep(1.5)
                _stopped(pid)
            self.perf_window = (before, snapshot([pid]))
            self.perf_unrun_s = _unrun_seconds() - unrun
        finally:
            counts = perf.stop()
            _signal_tree(pid, signal.SIGCONT)
        self.perf = counts


def _signal_tree(pid: int, sig: int) -> None:
    """``sig`` to ``pid`` and its descendants (fio's job processes have sessions of their own)."""
    for each in process_tree([pid]):
        with contextlib.suppress(ProcessLookupError):
            os.kill(each, sig)


def _stopped(pid: int) -> None:
    """SIGSTOP ``pid`` and its descendants; back when every thread of them is stopped."""
    _signal_tree(pid, signal.SIGSTOP)

    def states() -> set[str]:
        found = set()
        for p in process_tree([pid]):
            for task in Path(f"/proc/{p}/task").glob("*/stat"):
                with contextlib.suppress(OSError):
                    found.add(task.read_text().rpartition(")")[2].split()[0])
        return found - {"Z", "X"}

    assert wait_for(lambda: states() <= {"T", "t"}, timeout=30), states()


def _counting(perf_pid: int) -> bool:
    """Whether perf stat has opened its counters and sleeps between its checks: it enables the
    counters before it first sleeps (tools/perf/builtin-stat.c: enable_counters(), then
    dispatch_events())."""
    try:
        state = Path(f"/proc/{perf_pid}/stat").read_text().rpartition(")")[2].split()[0]
        fds = [os.readlink(fd) for fd in Path(f"/proc/{perf_pid}/fd").iterdir()]
    except OSError:
        return False
    return state == "S" and "anon_inode:[perf_event]" in fds


def _unrun_seconds() -> float:
    """steal + irq + softirq of all CPUs so far (/proc/stat): time perf's task-clock can count
    for a thread that its /proc CPU time leaves out (the scheduler's task clock excludes steal
    with CONFIG_PARAVIRT_TIME_ACCOUNTING, irq time with CONFIG_IRQ_TIME_ACCOUNTING)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()
    irq, softirq, steal = (int(fields[i]) for i in (6, 7, 8))
    return (irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> Observed:
    workdir = tmp_path_factory.mktemp("fio")
    datadir = Path(tempfile.mkdtemp(prefix="iomatrix-test-", dir="/var/tmp"))
    try:
        seen = Observed(workdir, datadir)
    finally:
        shutil.rmtree(datadir)
    assert not our_processes(str(workdir)), "fio outlived the test"
    return seen


def _job(observed: Observed) -> JobStats:
    assert observed.returncode == 0
    return observed.result.jobs[0]


def _fio_cpu(observed: Observed) -> float:
    """The job process's CPU seconds as fio measured them (getrusage() in the job process)."""
    job = _job(observed)
    return (job.usr_cpu + job.sys_cpu) / 100 * job.job_runtime_ms / 1000


def test_proc_cpu_of_the_job_process_agrees_with_fio(observed: Observed) -> None:
    """fio's usr_cpu+sys_cpu are percent of the job's runtime, from getrusage() in the job
    process; /proc reads the same kernel counters, per thread while the job process lives and,
    once fio reaped it, in fio's cutime+cstime (which fio's zombie keeps). That whole-life total
    is compared, not the last thread snapshot: on a loaded host the snapshot loop may sleep
    long past the job's end. Tolerance 5 % + 30 ms: /proc truncates to 10 ms ticks and counts
    the job's setup and teardown outside fio's runtime window. Measured here: within 2 %."""
    job = _job(observed)
    fio_cpu = _fio_cpu(observed)
    total = next(p.children_cpu_s for p in observed.zombie.processes if p.pid == observed.pid)
    assert abs(total - fio_cpu) <= 0.05 * fio_cpu + 0.03, (total, fio_cpu)
    assert observed.last is not None
    child = [t for t in observed.last.threads if t.pid != observed.pid]
    tick = 1 / os.sysconf("SC_CLK_TCK")
    assert 0 < sum(t.cpu_s for t in child) <= total + 2 * tick * len(child)
    # fio's ctx is the job process's voluntary + involuntary switches at its end; the last
    # snapshot came before the end, so it saw no more (but the few of the job's teardown).
    # (That they are the same counters, equal over the same stretch, is checked against perf.)
    switches = sum(t.voluntary + t.involuntary for t in child)
    assert 0 < switches <= job.ctx + 50, (switches, job.ctx)


def test_cpu_delta_groups_fio_threads_and_normalizes(observed: Observed) -> None:
    assert observed.first is not None and observed.last is not None
    cost = cpu_delta(observed.first, observed.last)
    assert [r.role for r in cost.roles] == ["fio"]
    fio = cost.role("fio")
    assert fio is not None and fio.threads >= 2 and fio.cpu_s > 0.1
    assert fio.voluntary > 0
    assert cost.vanished == 0 and cost.lost_processes == 0
    ios = _job(observed).write.total_ios
    per = per_io(cost, ios)
    assert per.unit == "I/O" and 0 < per.cpu_s < 1e-3 and per.voluntary > 0
    assert per.by_role["fio"] == pytest.approx(fio.cpu_s / ios)
    mib = per_mb(cost, _job(observed).write.io_bytes)
    assert mib.unit == "MiB" and mib.cpu_s == pytest.approx(per.cpu_s * 256, rel=1e-9)
    with pytest.raises(ValueError):
        per_io(cost, 0)


def test_exited_job_process_is_recovered_from_the_zombie(observed: Observed) -> None:
    """The job process is gone after fio's end, but fio reaped it: its CPU since the first
    snapshot is in fio's cutime+cstime, and cpu_delta puts it in exited_cpu_s."""
    assert observed.first is not None and observed.last is not None
    cost = cpu_delta(observed.first, observed.zombie)
    assert cost.vanished >= 2 and cost.lost_processes == 0
    seen = cpu_delta(observed.first, observed.last)
    child_seen = sum(r.cpu_s for r in seen.roles) - (cost.cpu_s - cost.exited_cpu_s)
    # At least what the thread snapshots saw of the job process (counters only grow; each
    # thread truncated to ticks twice), at most the job's whole life as fio measured it less
    # what the first snapshot had seen (the same 5 % + 30 ms as above), however late the last
    # snapshot came.
    tick = 1 / os.sysconf("SC_CLK_TCK")
    job_threads = [t for t in observed.first.threads if t.pid != observed.pid]
    before_first = sum(t.cpu_s for t in job_threads)
    fio_cpu = _fio_cpu(observed)
    assert child_seen - 2 * tick * len(job_threads) <= cost.exited_cpu_s, (cost, child_seen)
    assert cost.exited_cpu_s <= fio_cpu - before_first + 0.05 * fio_cpu + 0.03, (
        cost, fio_cpu, before_first)


def test_host_sampler_sees_the_writes(observed: Observed) -> None:
    host = observed.host
    assert len(host.t) == len(host.intr_per_s) == len(host.ctxt_per_s)
    # one interval per 0.5 s for as long as it ran (fio's start and end included), all of fio's
    assert len(host.t) >= RUNTIME / 0.5
    assert abs(len(host.t) - observed.sampled_s / 0.5) <= 2, (len(host.t), observed.sampled_s)
    assert min(host.intr_per_s) > 0 and min(host.ctxt_per_s) > 0
    # Its own cost: a few ms of CPU for a few seconds of sampling every 0.5 s.
    assert host.sampler_cpu_s < 0.005 * host.t[-1] + 0.01, host.sampler_cpu_s
    if observed.device is None:      # btrfs, ZFS, tmpfs, overlay...: no block device of its own
        pytest.skip("/var/tmp is on a file system without a block device of its own: the "
                    "per-device series cannot be checked on this host")
    assert observed.device in host.devices
    disk = host.devices[observed.device]
    assert len(host.t) == len(disk.util_pct) == len(disk.write_iops)
    assert max(u or 0 for u in disk.util_pct) > 0
    assert max(q or 0 for q in disk.queue_depth) > 0
    # the device did at least fio's direct writes, in the busiest interval at least at fio's
    # mean rate (half of it: fio's runtime and the intervals do not line up)
    assert max(w or 0 for w in disk.write_iops) >= 0.5 * _job(observed).write.iops, (
        max(w or 0 for w in disk.write_iops), _job(observed).write.iops)


def test_perf_software_events_agree_with_proc(observed: Observed) -> None:
    """perf's counts agree with /proc's over the same execution: the attach-and-SIGINT path
    works even where hardware counters are missing. fio ran only while perf counted (see
    ``Observed._count_with_perf``), so the figures differ only as the kernel makes them:

    - context switches: both count each switch away from a thread in ``__schedule()``; a
      stopping thread shows state T just before its last switch, so one per thread at each end.
    - CPU time, above: task-clock (the perf clock while the thread is on a CPU) also counts what
      the scheduler's task clock, and so /proc, leaves out: steal time
      (CONFIG_PARAVIRT_TIME_ACCOUNTING) and irq time (CONFIG_IRQ_TIME_ACCOUNTING), at most what
      /proc/stat says all CPUs lost to them over the window (three fields in ticks, steal
      booked at each CPU's next tick). That is what failed the old check under load, which
      also compared a /proc window longer than perf's: 0.656 s against 0.55 s.
    - CPU time, below: /proc's utime and stime are whole ticks, each truncated; and for a
      thread that sleeps thousands of times a second the scheduler's clock gives more than
      perf's (seen here with /proc/PID/task/*/schedstat, in ns: 5 to 26 %, 1 to 11 µs a
      switch, idle or loaded; perf's cpu-clock agrees with its task-clock; both clocks are
      read at different points of each switch, the cause is not pinned down further): at
      least half, then.

    No allowance for load: under load the window stretches, and both figures with it."""
    need("perf")
    assert observed.perf is not None and observed.perf_window is not None
    task_clock = observed.perf.counts["task-clock"]
    switches = observed.perf.counts["context-switches"]
    assert task_clock is not None and switches
    before, after = observed.perf_window
    threads = {t.tid for t in before.threads} | {t.tid for t in after.threads}
    seen = {(t.tid, t.start_ticks): t.voluntary + t.involuntary for t in before.threads}
    proc_switches = sum(t.voluntary + t.involuntary - seen.get((t.tid, t.start_ticks), 0)
                        for t in after.threads)
    assert abs(switches - proc_switches) <= 2 * len(threads), (switches, proc_switches)
    proc_cpu = cpu_delta(before, after).cpu_s
    assert proc_cpu > 0.05, proc_cpu                      # fio ran in the window
    tick = 1 / os.sysconf("SC_CLK_TCK")
    truncated = 2 * tick * len(threads)
    booked_late = tick * (3 + (os.cpu_count() or 1))
    seconds = task_clock / 1000                            # task-clock is in ms
    assert (proc_cpu - truncated) / 2 <= seconds, (seconds, proc_cpu)
    assert seconds <= proc_cpu + truncated + observed.perf_unrun_s + booked_late, (
        seconds, proc_cpu, observed.perf_unrun_s)
    assert observed.perf.per(1000)["task-clock"] == pytest.approx(seconds)


def test_perf_detection_gives_counts_or_a_reason(tmp_path: Path, no_leftovers: None) -> None:
    problem = perf_problem()
    if problem is None:
        busy = subprocess.Popen(["sh", "-c", "while :; do :; done"], start_new_session=True)
        try:
            with PerfStat([busy.pid]) as perf:
                time.sleep(0.3)
                counts = perf.stop()
        finally:
            stop(busy)
        assert counts.cycles and counts.instructions
    else:
        assert re.fullmatch(r"perf not installed \(apt-get install linux-perf\)"
                            r"|perf reports cycles not supported (in this VM|on this host) .*"
                            r"|perf may not count here: .*|perf does not match .*"
                            r"|perf (stat failed|counted no cycles|cannot run).*", problem), problem
    assert perf_problem("/nonexistent/perf") == "perf not installed (apt-get install linux-perf)"


# --- roles ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("process, thread, main, role", [
    ("qemu-system-x86", "qemu-system-x86", True, "main loop"),
    ("qemu-system-x86", "CPU 0/KVM", False, "vcpu"),
    ("qemu-system-x86", "CPU 3/TCG", False, "vcpu"),
    ("qemu-system-x86", "IO iothread0", False, "iothread"),
    ("qemu-system-x86", "worker", False, "worker pool"),
    ("qemu-system-x86", "call_rcu", False, "other"),
    ("qemu-storage-da", "qemu-storage-da", True, "daemon"),
    ("qemu-storage-da", "qemu-storage-da", False, "daemon"),
    ("fio", "fio", False, "fio"),
    ("sh", "sh", True, "other"),
])
def test_classify(process: str, thread: str, main: bool, role: str) -> None:
    assert classify(process, thread, main=main) == role


def _qemu(tmp_path: Path, *, named: bool) -> tuple[ThreadTimes, ThreadTimes, list, list]:
    """Two snapshots 0.3 s apart of a QEMU under TCG, stopped (-S), with 2 vCPUs and an
    iothread; and what QMP says about its vCPUs and iothreads."""
    qmp = tmp_path / "qmp.sock"
    argv = ["qemu-system-x86_64", "-name", "guest=x,debug-threads=on" if named else "guest=x",
            "-S", "-display", "none", "-nodefaults", "-machine", "q35,accel=tcg", "-smp", "2",
            "-m", "128", "-object", "iothread,id=iothread0",
            "-qmp", f"unix:{qmp},server=on,wait=off"]
    with managed(argv, log=tmp_path / "qemu.log") as proc:
        assert wait_for(lambda: qmp.exists() or proc.poll() is not None, timeout=20)
        cpus, iothreads = qmp_execute(qmp, [("query-cpus-fast", None), ("query-iothreads", None)])
        before = snapshot([proc.pid])
        time.sleep(0.3)
        after = snapshot([proc.pid])
    return before, after, cpus, iothreads


def test_qemu_tcg_threads_by_role(tmp_path: Path, no_leftovers: None) -> None:
    before, after, cpus, iothreads = _qemu(tmp_path, named=True)
    names = {t.tid: t.thread for t in after.threads}
    vcpus = {c["thread-id"] for c in cpus}
    assert {names[tid] for tid in vcpus} == {"CPU 0/TCG", "CPU 1/TCG"}
    assert names[iothreads[0]["thread-id"]] == "IO iothread0"
    cost = cpu_delta(before, after)
    roles = {r.role: r.threads for r in cost.roles}
    # The monitor has an iothread of its own ("IO mon_iothread"); call_rcu is "other".
    assert roles == {"vcpu": 2, "iothread": 2, "main loop": 1, "other": 1}
    assert cost.role("vcpu") is not None and cost.appeared == cost.vanished == 0
    with pytest.raises(ValueError):
        cpu_delta(before, after, roles={1: "gpu"})


def test_unnamed_qemu_threads_take_roles_from_qmp(tmp_path: Path, no_leftovers: None) -> None:
    """Without debug-threads every thread is "qemu-system-x86"; QMP's thread ids say which are
    vCPUs and iothreads."""
    before, after, cpus, iothreads = _qemu(tmp_path, named=False)
    assert {t.thread for t in after.threads} == {"qemu-system-x86"}
    untold = {r.role: r.threads for r in cpu_delta(before, after).roles}
    assert untold == {"main loop": 1, "other": 5}
    told = {c["thread-id"]: "vcpu" for c in cpus} | {i["thread-id"]: "iothread"
                                                     for i in iothreads}
    roles = {r.role: r.threads for r in cpu_delta(before, after, roles=told).roles}
    assert roles == {"vcpu": 2, "iothread": 1, "main loop": 1, "other": 2}


def test_storage_daemon_threads_are_the_daemon(tmp_path: Path, no_leftovers: None) -> None:
    """QEMU 7.2's qemu-storage-daemon cannot name its threads (no debug-threads option) and has
    no query-iothreads: every thread is "qemu-storage-da" and counts as daemon."""
    image = tmp_path / "disk.raw"
    with open(image, "wb") as f:
        f.truncate(16 << 20)
    qmp = tmp_path / "qmp.sock"
    argv = ["qemu-storage-daemon", "--chardev", f"socket,id=m,path={qmp},server=on,wait=off",
            "--monitor", "chardev=m", "--object", "iothread,id=iot0",
            "--blockdev", f"driver=file,node-name=f,filename={image}"]
    with managed(argv, log=tmp_path / "qsd.log") as proc:
        assert wait_for(lambda: qmp.exists() or proc.poll() is not None, timeout=20)
        before = snapshot([proc.pid])
        time.sleep(0.2)
        after = snapshot([proc.pid])
    assert len(after.threads) >= 3
    assert {t.thread for t in after.threads} == {"qemu-storage-da"}
    cost = cpu_delta(before, after)
    assert [(r.role, r.threads) for r in cost.roles] == [("daemon", len(after.threads))]
