"""Stalls: a span of a trial in which no request completed for ``STALL_S`` or more while fio
kept I/O queued. Its mean latency hides it (a 3 s stall in a 60 s trial moves the mean little),
so each trial records whether it had one (``StallCheck``), from completions over time:

- fio's own averaged IOPS log where fio runs on this host (host and blocklayer modes):
  ``write_iops_log`` into the trial's own directory with ``log_avg_msec`` = ``WINDOW_MS``. fio
  writes an entry per window that completed something and none for a window that completed
  nothing (checked with fio 3.33), so a stall is a gap between two entries: no completion
  from the first entry's time to the second's minus one window (or to the end of the
  measured window: fio ends a job whose runtime ran out in a stall once the queued requests
  complete, with no entry after them). Only a local fio writes it:
  fio's client writes a server's logs under the name the SERVER sends (a guest's fio, a node's),
  which no untrusted side may choose on this host.
- QEMU's device counters (``query-blockstats``: requests completed), read about every
  ``COUNTER_INTERVAL_S`` while a guest's fio runs: no completion between two reads that
  counted the same.

Both see completions at a resolution: a stall is recorded when the span seen without one is
``STALL_S`` or longer, which a stall of ``STALL_S`` plus one window (or read interval) always
gives; a shorter one may be missed, never invented. Only spans after the first completion count
(before it fio was starting); QEMU's counters cannot tell a stall the trial ended in from fio
having ended, so in guests only spans up to the last completion count: fio ends a job whose
runtime ran out in a stall once its queued requests complete, so the counter is read once more
after fio ended, and that last increase ends the span. A workload that
paces itself (a rate, think time, an ioping workload) is not judged: its gaps are its own."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from iomatrix.core.model import Frozen

STALL_S = 1.0
"""No completion for this long while I/O was queued is a stall."""
WINDOW_MS = 250
"""fio's ``log_avg_msec`` for the per-window IOPS log."""
COUNTER_INTERVAL_S = 0.25
"""How often QEMU's counters are read while a guest's fio runs."""
LOG_PREFIX = "persecond"
"""The name fio's IOPS log starts with in the trial's directory (``persecond_iops.N.log``)."""
PACING = frozenset({"rate", "rate_iops", "rate_min", "ratemin", "rate_iops_min", "thinktime",
                    "thinktime_spin", "thinktime_blocks", "thinktime_iotime", "latency_target",
                    "max_latency", "startdelay", "flow", "flow_sleep"})
"""fio options with which a job idles on purpose: its gaps are not stalls."""
FIO_LOG = "fio's IOPS log"
QEMU_COUNTERS = "QEMU device counters"


class StallCheck(Frozen):
    """Whether a trial stalled: the spans it went without a completion, or why it was not
    judged."""

    checked: bool
    """Whether the trial was judged (false: ``reason`` says why)."""
    source: str | None = None
    """What the completions were read from: "fio's IOPS log" (``FIO_LOG``) or "QEMU device
    counters" (``QEMU_COUNTERS``)."""
    reason: str | None = None
    """Why it was not judged."""
    longest_s: float | None = None
    """The longest span seen without a completion, seconds."""
    stalls: int = 0
    """Spans of 1 s (``STALL_S``) or more without a completion: the trial stalled when it
    had one."""
    stalled_s: float = 0.0
    """Their total length, seconds."""

    @property
    def stalled(self) -> bool:
        return self.checked and self.stalls > 0


def not_judged(reason: str) -> StallCheck:
    return StallCheck(checked=False, reason=reason)


def from_gaps(gaps: Iterable[float], source: str) -> StallCheck:
    """The check of a trial whose spans without a completion were ``gaps`` (seconds)."""
    found = list(gaps)
    stalls = [g for g in found if g >= STALL_S]
    return StallCheck(checked=True, source=source,
                      longest_s=round(max(found), 3) if found else 0.0,
                      stalls=len(stalls), stalled_s=round(sum(stalls), 3))


def pacing(options: Iterable[tuple[str, str]], rate_iops: int = 0) -> str | None:
    """Why a workload's gaps are its own (it paces itself), or None."""
    if rate_iops:
        return "the workload paces itself (rate_iops)"
    paced = sorted({k for k, v in options if k in PACING and v not in ("0", "")})
    return f"the workload paces itself ({', '.join(paced)})" if paced else None


# -- fio's IOPS log --------------------------------------------------------------------------

def with_iops_log(job: str, directory: Path) -> str:
    """``job`` with fio's averaged IOPS log written into ``directory`` (the trial's own): a
    [global] section before every other, so that every job logs."""
    prefix = directory / LOG_PREFIX
    return (f"[global]\nwrite_iops_log={prefix}\nlog_avg_msec={WINDOW_MS}\n"
            f"per_job_logs=1\n{job}")


def log_files(directory: Path) -> list[Path]:
    """The IOPS logs fio wrote into ``directory`` (one per job)."""
    return sorted(directory.glob(f"{LOG_PREFIX}_iops.*log"))


def remove_logs(directory: Path) -> None:
    for path in log_files(directory):
        path.unlink(missing_ok=True)


def log_times(text: str) -> list[int]:
    """The times (ms from the job's start) of a log's entries that counted a completion; a line
    that is not fio's (``time, value, ddir, bs, offset[, prio]``) is skipped."""
    out = []
    for line in text.splitlines():
        parts = line.split(",")
        if len(parts) < 3:
            continue
        try:
            at, value = int(parts[0]), int(parts[1])
        except ValueError:
            continue
        if value > 0 and at >= 0:
            out.append(at)
    return out


def log_gaps(times: Sequence[int], window_ms: int = WINDOW_MS,
             end_ms: int | None = None) -> list[float]:
    """The spans (s) without a completion between consecutive entries of one or more jobs'
    logs (``times``, merged): an entry at t counts what completed in the window before t.
    With ``end_ms`` (the measured window's length: fio's times count from its start), also
    from the last entry to the end: a stall fio's runtime ran out in (fio then waits for the
    requests still queued) has no entry after it."""
    ordered = sorted(set(times))
    if end_ms is not None and ordered:
        ordered.append(max(end_ms, ordered[-1]))
    return [max(0, b - a - window_ms) / 1000 for a, b in zip(ordered, ordered[1:])]


def check_logs(directory: Path, runtime_ms: int | None = None) -> StallCheck:
    """The check of a trial from the IOPS logs fio wrote into ``directory``; ``runtime_ms``:
    its measured window, as fio reports it."""
    # a workload that asks for an IOPS log of its own (iomatrix.fio.logs) has fio write that
    # one instead, averaged alike: read too, left for the trial's logs
    files = sorted(directory.glob("*_iops.*log"))
    if not files:
        return not_judged("fio wrote no IOPS log")
    times: list[int] = []
    for path in files:
        times += log_times(path.read_text(errors="replace"))
    return from_gaps(log_gaps(times, end_ms=runtime_ms), FIO_LOG)


# -- QEMU's counters -------------------------------------------------------------------------

def counter_gaps(readings: Sequence[tuple[float, int | None]]) -> list[float]:
    """The spans (s) that a cumulative counter of completed requests, read at times
    (``readings``: (seconds, count); None: not read), shows without a completion between its
    first and its last increase: from the first read of a value to the last read of it before
    the value grew (a lower bound: the completions may lie up to a read interval either side)."""
    gaps = []
    first: tuple[float, int] | None = None     # the first read of the current value
    last = 0.0                                 # the last read of it
    increases = 0
    for t, c in readings:
        if c is None:
            continue
        if first is None or c != first[1]:
            if first is not None:
                increases += 1
                if increases > 1:              # before the first increase fio was starting
                    gaps.append(last - first[0])
            first, last = (t, c), t
        else:
            last = t
    return gaps


class CounterSampler:
    """Reads ``read()`` (a cumulative count of completed requests; None when it cannot) about
    every ``interval_s`` in a thread of its own until :meth:`finish`."""

    def __init__(self, read: Callable[[], int | None], interval_s: float = COUNTER_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.read = read
        self.interval_s = interval_s
        self.clock = clock
        self.readings: list[tuple[float, int | None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="stall-sampler", daemon=True)

    def start(self) -> "CounterSampler":
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._read_once()
            self._stop.wait(self.interval_s)

    def _read_once(self) -> None:
        try:
            value = self.read()
        except Exception:          # a monitor gone mid-read: a missing reading, not a crash
            value = None
        self.readings.append((self.clock(), value))

    def finish(self) -> StallCheck:
        """The check, from the readings and one more taken now that fio has ended: a stall
        the trial's runtime ran out in ends with the requests it held completing as fio
        ends, which the thread, waiting out its interval, may never read (its span would
        then lie after the last increase it saw, and count for nothing)."""
        self._stop.set()
        self._thread.join()
        self._read_once()
        if not any(c is not None for _, c in self.readings):
            return not_judged("no count of the disk's completed requests could be read (a "
                              "vhost-user-blk disk, which its daemon serves, or a node's)")
        return from_gaps(counter_gaps(self.readings), QEMU_COUNTERS)
