"""Stalls read from completions over time: fio's own averaged IOPS log (real fio) and a counter
read from outside fio (QEMU's, in guests: tests/scenarios/test_stalls.py runs one for real)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from iomatrix.fio.persecond import (FIO_LOG, QEMU_COUNTERS, STALL_S, CounterSampler,
                                    check_logs, counter_gaps, log_files, log_gaps, log_times,
                                    pacing, remove_logs, with_iops_log)
from tests.needs import needs


@pytest.mark.slow
@needs("fio")
def test_fio_logs_no_entry_for_a_window_without_completions(tmp_path: Path) -> None:
    """Two jobs at once with the log iomatrix asks of fio, one idling 1.5 s after its first 400
    requests: its gap in the log is seen, about the idle time (never more); the other's log
    shows none. The logs are fio's, one per job in the trial's directory, and removed after."""
    data = tmp_path / "data"
    data.write_bytes(b"\0" * (4 << 20))
    job = (f"[global]\nfilename={data}\nrw=randread\nbs=4k\nioengine=psync\ntime_based=1\n"
           "runtime=2\n[idle]\nthinktime=1500ms\nthinktime_blocks=400\n[busy]\n")
    (tmp_path / "job.fio").write_text(with_iops_log(job, tmp_path))
    subprocess.run(["fio", "--output-format=json", "--output=/dev/null", "job.fio"],
                   cwd=tmp_path, check=True, timeout=60)
    idle, busy = log_files(tmp_path)
    assert (idle.name, busy.name) == ("persecond_iops.1.log", "persecond_iops.2.log")
    idle_gaps = log_gaps(log_times(idle.read_text()))
    busy_gaps = log_gaps(log_times(busy.read_text()))
    assert 1.0 <= max(idle_gaps) <= 1.5, idle_gaps
    assert max(busy_gaps) < STALL_S, busy_gaps
    # both logs together: a window in which either job completed something is no stall
    check = check_logs(tmp_path)
    assert check.checked and check.source == FIO_LOG and not check.stalled, check
    remove_logs(tmp_path)
    assert log_files(tmp_path) == []


def test_a_stall_the_runtime_ran_out_in_counts_to_the_end() -> None:
    """fio's log of a job whose last requests waited past its runtime (fio 3.33 on a device
    held mid-trial: entries every 250 ms up to 1505 ms, the job's window 10,216 ms)."""
    times = [250, 501, 753, 1004, 1254, 1505]
    assert max(log_gaps(times)) < STALL_S
    assert log_gaps(times, end_ms=10_216)[-1] == pytest.approx(8.461)
    assert log_gaps(times, end_ms=1_600) == [*log_gaps(times), 0.0]


def test_a_workloads_own_iops_log_is_read_and_kept(tmp_path: Path) -> None:
    """A workload's write_iops_log overrides iomatrix's for its job (iomatrix.fio.logs names
    it ``workload``): that log is read, and left for the trial's logs."""
    own = tmp_path / "workload_iops.1.log"
    own.write_text("250, 100, 0, 4096, 0\n2000, 100, 0, 4096, 0\n")
    check = check_logs(tmp_path)
    assert check.stalled and check.longest_s == 1.5, check
    remove_logs(tmp_path)
    assert own.exists()


def test_counter_gaps_are_between_the_first_and_last_completion() -> None:
    """The span before the first increase (fio connecting) and after the last (fio ended) are
    no stalls; between, a span is from the first read of a value to the last read of it;
    an unread counter is skipped."""
    reads = [(0.0, 10), (0.5, 10), (1.0, 20), (1.25, 30), (1.5, 30), (2.0, None), (2.75, 30),
             (3.0, 40), (3.25, 40), (9.0, 40)]
    assert counter_gaps(reads) == [0.0, 1.5]
    assert counter_gaps([(0.0, 1), (5.0, 1)]) == []


# QEMU 7.2's counters read every 250 ms around a TCG guest's 3 s randread trial (iodepth 4)
# whose disk was held from 1.5 s in for 3 s: the runtime ran out in the hold, and the 4 requests
# it held completed as it was released, fio then ending at once (its runtime_ms 4151)
HELD = [(0.0, 19), (0.25, 19), (0.51, 1218), (0.76, 3139), (1.01, 5818), (1.28, 7883),
        (1.53, 9544), (1.78, 9560), (2.03, 9560), (2.29, 9560), (2.54, 9560), (2.8, 9560),
        (3.06, 9560), (3.31, 9560), (3.57, 9560), (3.83, 9560), (4.08, 9560), (4.34, 9560)]


def test_a_guest_stall_the_runtime_ran_out_in_is_read_after_fio_ends() -> None:
    """The held requests complete as fio ends, between two of the sampler's reads: the sampler
    reads the counter once more when it is finished, so the span counts (it would lie after
    the last increase read, and count for nothing)."""
    assert max(counter_gaps(HELD)) < STALL_S    # what the thread alone had read
    released: list[int] = []
    sampler = CounterSampler(lambda: 9564 if released else 9560, interval_s=3600,
                             clock=iter(4.4 + i / 10 for i in range(100)).__next__)
    sampler.readings = list(HELD)
    sampler.start()
    released.append(1)                          # fio ended: its held requests completed
    check = sampler.finish()
    assert sampler.readings[-1][1] == 9564
    assert check.checked and check.source == QEMU_COUNTERS and check.stalled, check
    assert check.stalls == 1 and check.longest_s is not None and check.longest_s >= 2.5, check


def test_a_workload_that_paces_itself_is_not_judged() -> None:
    assert pacing((), 0) is None
    assert pacing((("thinktime", "0"), ("direct", "1")), 0) is None
    assert pacing((("thinktime", "20ms"),), 0) == "the workload paces itself (thinktime)"
    assert pacing((), 500) == "the workload paces itself (rate_iops)"


@pytest.mark.parametrize("job", ["[global]\nioengine=psync\n[a]\nrw=read\n", "[a]\nrw=read\n"])
def test_the_log_is_asked_of_every_job(job: str, tmp_path: Path) -> None:
    text = with_iops_log(job, tmp_path)
    assert text.startswith(f"[global]\nwrite_iops_log={tmp_path / 'persecond'}\n")
    assert text.endswith(job)
