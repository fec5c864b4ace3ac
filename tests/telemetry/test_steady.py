"""Steady state: the SNIA PTS rule on synthetic series, and fio's real status-interval stream read
while fio runs, stopped with SIGINT once steady."""

from __future__ import annotations

import math
import signal
import subprocess
import time
from pathlib import Path

import pytest

from iomatrix.telemetry.steady import first_steady, snia_rule
from iomatrix.core.errors import FioParseError
from iomatrix.fio.status import (SIGINT_EXIT, StatusReport, StatusStream, interval_iops, intervals,
                                 last_result)
from iomatrix.measure.watch import CounterWatch, SteadyWatch
from iomatrix.fio.parse import parse_fio_output
from iomatrix.core.proc import orphan_guard, stop
from tests.conftest import our_processes

# --- the rule ------------------------------------------------------------------------------------


def test_flat_window_is_steady() -> None:
    ok, range_ratio, excursion_ratio = snia_rule([100, 100, 100, 100, 100])
    assert ok and range_ratio == 0 and excursion_ratio == 0


def test_rule_limits_are_inclusive() -> None:
    # range exactly 20 % of the mean, no trend: passes
    ok, range_ratio, excursion_ratio = snia_rule([90, 110, 100, 90, 110])
    assert ok and math.isclose(range_ratio, 0.2) and excursion_ratio < 0.1
    ok, range_ratio, _ = snia_rule([89, 111, 100, 89, 111])
    assert not ok and range_ratio > 0.2


def test_slow_drift_passes_range_but_fails_slope() -> None:
    # +2.8 % per interval: range 11.2 % of the mean (< 20 %), line excursion 11.2 % (> 10 %)
    window = [100 + 2.8 * i for i in range(5)]
    ok, range_ratio, excursion_ratio = snia_rule(window)
    assert range_ratio < 0.2
    assert excursion_ratio > 0.1
    assert not ok
    state = first_steady([100 * 1.028 ** i for i in range(40)], 1.0)
    assert not state.reached and state.windows == 36


def test_noise_without_trend_passes_slope_but_not_range() -> None:
    ok, range_ratio, excursion_ratio = snia_rule([70, 130, 100, 130, 70])
    assert not ok and range_ratio > 0.2 and excursion_ratio == 0


def test_converging_series_is_steady_at_the_end_of_the_first_good_window() -> None:
    # A warm-up that decays towards 1000 IOPS, 0.5 s intervals.
    series = [1000 + 4000 * 0.5 ** i for i in range(20)]
    state = first_steady(series, 0.5)
    assert state.reached
    # Window i holds values i..i+4. The range is first within 20 % at i = 5 (11 %), but the
    # decay still tilts the line there (excursion 10.7 %); i = 6 passes both (5.7 %, 5.5 %) and
    # ends after interval 11: 5.5 s, the 7th window checked.
    assert snia_rule(series[5:10])[1] <= 0.2 and not snia_rule(series[5:10])[0]
    assert state.at_seconds == 5.5
    assert state.windows == 7
    assert state.range_ratio is not None and state.range_ratio <= 0.2
    assert state.excursion_ratio is not None and state.excursion_ratio <= 0.1
    assert "SNIA PTS" in state.rule


def test_never_converging_series() -> None:
    series = [1000 if i % 2 else 500 for i in range(30)]
    state = first_steady(series, 1.0)
    assert not state.reached and state.at_seconds is None
    assert state.windows == 26
    assert state.range_ratio is not None and state.range_ratio > 0.2


def test_min_seconds_delays_the_first_window_checked() -> None:
    series = [1000.0] * 20
    assert first_steady(series, 1.0).at_seconds == 5.0
    state = first_steady(series, 1.0, min_seconds=12)
    assert state.at_seconds == 12.0 and state.windows == 1
    short = first_steady(series[:10], 1.0, min_seconds=12)
    assert not short.reached and short.windows == 0 and short.range_ratio is None


def test_too_short_and_invalid_input() -> None:
    assert not first_steady([1.0, 1.0, 1.0], 1.0).reached
    with pytest.raises(ValueError):
        snia_rule([1.0])
    with pytest.raises(ValueError):
        snia_rule([1.0, math.nan, 1.0])
    with pytest.raises(ValueError):
        first_steady([1.0] * 10, 0.0)
    ok, range_ratio, _ = snia_rule([0, 0, 0, 0, 0])   # no I/O is never steady
    assert not ok and range_ratio == math.inf


# --- fio's status stream, for real ---------------------------------------------------------------


def _job(directory: Path, *, runtime: int, ramp: int = 0, rate_iops: int = 0) -> Path:
    data = directory / "data"
    with open(data, "wb") as f:
        f.truncate(32 << 20)
    lines = ["[j]", "ioengine=psync", "direct=1", f"filename={data}", "size=32M", "rw=randread",
             "bs=4k", "time_based=1", f"runtime={runtime}"]
    if ramp:
        lines.append(f"ramp_time={ramp}")
    if rate_iops:
        lines.append(f"rate_iops={rate_iops}")
    job = directory / "job.fio"
    job.write_text("\n".join(lines) + "\n")
    return job


def _start_fio(job: Path, out: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(orphan_guard(["fio", "--output-format=json", f"--output={out}",
                                          "--status-interval=1", str(job)]),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, start_new_session=True)


class LiveRun:
    """A real 4 s fio run with --status-interval=1, its file polled every 50 ms as it grew."""

    def __init__(self, directory: Path) -> None:
        self.out = directory / "fio.json"
        stream = StatusStream(self.out)
        self.before_start = stream.poll()
        proc = _start_fio(_job(directory, runtime=4), self.out)
        self.arrivals: list[tuple[float, StatusReport]] = []
        try:
            while proc.poll() is None:
                self.arrivals += [(time.monotonic(), r) for r in stream.poll()]
                time.sleep(0.05)
        finally:
            stop(proc)
        self.returncode = proc.returncode
        self.arrivals += [(time.monotonic(), r) for r in stream.poll()]
        self.reports = [r for _, r in self.arrivals]
        self.text = self.out.read_text()
        (directory / "data").unlink()


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> LiveRun:
    directory = tmp_path_factory.mktemp("live")
    run = LiveRun(directory)
    assert not our_processes(str(directory))
    return run


@pytest.mark.slow
def test_status_stream_read_live_then_final_object(live: LiveRun) -> None:
    assert live.before_start == []    # no file yet
    assert live.returncode == 0
    reports = live.reports
    # One object per second while running (4; fio skips a tick when it is late), then the
    # final one: all complete.
    assert 4 <= len(reports) <= 5
    # the final one covers the whole runtime: fio stops at the first check past 4 s, which a
    # loaded host can make a few hundred ms late
    assert 4000 <= reports[-1].runtime_ms < 4750
    runtimes = [r.runtime_ms for r in reports]
    assert runtimes == sorted(runtimes) and runtimes[0] < 1000
    # They arrived while fio ran, about a second apart.
    gaps = [b[0] - a[0] for a, b in zip(live.arrivals, live.arrivals[1:-1])]
    assert all(0.7 < g < 2.3 for g in gaps), gaps
    assert last_result(live.text) == reports[-1].result
    # parse_fio_output sees only the first object: the first second, not the result.
    assert parse_fio_output(live.text).jobs[0].job_runtime_ms == reports[0].runtime_ms < 1000
    totals = [r.total_ios for r in reports]
    assert totals == sorted(totals)
    assert sum(i.ios for i in intervals(reports)) == reports[-1].total_ios
    assert all(iops > 0 for iops in interval_iops(reports))


@pytest.mark.slow
def test_sigint_once_steady_after_ramp(tmp_path: Path, no_leftovers: None) -> None:
    """rate_iops makes the job steady; ramp_time=2 shows fio's counter reset. The watch ignores
    the ramp, sees 5 steady intervals, fio stops on SIGINT and writes its final result."""
    out = tmp_path / "fio.json"
    watch = SteadyWatch(out, ramp=True, min_seconds=5)
    proc = _start_fio(_job(tmp_path, runtime=60, ramp=2, rate_iops=500), out)
    t0 = time.monotonic()
    try:
        while proc.poll() is None and time.monotonic() - t0 < 30:
            if watch.poll().reached:
                proc.send_signal(signal.SIGINT)
                proc.wait(timeout=10)
                break
            time.sleep(0.5)
    finally:
        stop(proc)
    stopped_after = time.monotonic() - t0
    assert proc.returncode == SIGINT_EXIT
    state = watch.finish()
    assert state.reached and state.at_seconds is not None and state.at_seconds >= 5.0
    reports = watch.stream.reports
    marks = [i.ramp for i in intervals(reports, ramp=True)]
    # Ramp objects (cumulative since the start), then fio's reset, then measured intervals.
    assert 1 <= marks.count(True) <= 2 and marks == sorted(marks, reverse=True)
    ramp_end = marks.count(True)
    assert reports[ramp_end].runtime_ms < reports[ramp_end - 1].runtime_ms + 500
    final = last_result(out.read_text())
    assert final == reports[-1].result
    runtime_s = final.jobs[0].job_runtime_ms / 1000
    assert 5 <= runtime_s < stopped_after - 1.5     # measured time only: the ramp is excluded
    assert 0.9 * 500 < final.jobs[0].read.iops < 1.1 * 500


@pytest.mark.slow
def test_partial_objects_wait_for_the_rest(tmp_path: Path, live: LiveRun) -> None:
    """A real fio status file, replayed in pieces: an object counts only once complete."""
    real_stream = live.text
    expected = live.reports
    growing = tmp_path / "growing.json"
    stream = StatusStream(growing)
    seen = []
    step = 777   # aligned with nothing in particular
    for end in range(step, len(real_stream) + step, step):
        growing.write_text(real_stream[:end])
        new = stream.poll()
        assert len(new) <= 1
        seen += new
    assert seen == expected
    assert seen[-1].result == last_result(real_stream)


@pytest.mark.slow
def test_bare_nan_in_a_status_object_is_read(tmp_path: Path, live: LiveRun) -> None:
    """fio prints a NaN as a bare nan; the stream reads it as parse_fio_output does."""
    first = live.text[:live.text.index("\n}\n") + 3]
    path = tmp_path / "nan.json"
    path.write_text(first.replace('"usr_cpu" : ', '"usr_cpu" : nan, "x" : ', 1))
    reports = StatusStream(path).poll()
    assert len(reports) == 1 and math.isnan(reports[0].result.jobs[0].usr_cpu)


def test_last_result_without_any_object() -> None:
    with pytest.raises(FioParseError):
        last_result('fio: some error\n{ "fio version"')


class _Counter:
    """A cumulative I/O counter and a clock stepped by hand: the counter rises by ``rates[i]``
    I/Os per second during second i."""

    def __init__(self, rates: list[float]) -> None:
        self.rates = rates
        self.t = 0.0

    def count(self) -> int:
        whole = int(self.t)
        return int(sum(self.rates[:whole]) + (self.t - whole) * self.rates[min(whole, len(self.rates) - 1)])


def test_counter_watch_skips_connect_and_ramp_then_applies_the_rule() -> None:
    # 2 s connecting (no I/O), 2 s ramp at a different rate, then steady at 1000 I/O per second
    counter = _Counter([0, 0, 400, 400] + [1000] * 10)
    watch = CounterWatch(counter.count, ramp_s=2, min_seconds=3, clock=lambda: counter.t)
    verdicts = []
    for step in range(0, 13 * 4 + 1):
        counter.t = step * 0.25
        verdicts.append((counter.t, watch.poll()))
    # the connect and ramp seconds are not in the series: only the 1000/s seconds are
    assert watch.series and all(v == pytest.approx(1000) for v in watch.series)
    first = next(t for t, v in verdicts if v.reached)
    # 2 s connect + 2 s ramp + 5 intervals of the window = 9 s
    assert first == pytest.approx(9.0)
    assert verdicts[-1][1].at_seconds == pytest.approx(5.0)


def test_counter_watch_never_steady_on_a_drifting_counter() -> None:
    counter = _Counter([100 + 60 * i for i in range(20)])
    watch = CounterWatch(counter.count, clock=lambda: counter.t)
    for step in range(0, 20 * 2):
        counter.t = step * 0.5
        state = watch.poll()
    assert not state.reached and state.windows > 0


def test_counter_watch_without_counters_is_never_steady() -> None:
    watch = CounterWatch(lambda: None, clock=lambda: 5.0)
    assert not watch.poll().reached and watch.unavailable and watch.series == []
