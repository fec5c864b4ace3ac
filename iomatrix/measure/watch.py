"""Watches that decide, while fio runs, whether its throughput has reached steady state (the SNIA
rule of ``iomatrix.telemetry.steady``), from fio's own status stream or from a device counter read
outside fio (QEMU's, for guests)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

from iomatrix.fio.status import StatusReport, StatusStream, interval_iops
from iomatrix.telemetry.steady import PTS_WINDOW, SteadyState, first_steady

__all__ = ["SteadyWatch", "CounterWatch"]


class SteadyWatch:
    """Follows a status stream and says whether the measured (non-ramp) interval IOPS have met
    the SNIA PTS rule (``iomatrix.telemetry.steady``) at or after ``min_seconds``. The maximum
    runtime is fio's own ``runtime``."""

    def __init__(self, path: Path, *, interval_s: float = 1.0, ramp: bool = False,
                 window: int = PTS_WINDOW, min_seconds: float = 0.0) -> None:
        self.stream = StatusStream(path)
        self.interval_s = interval_s
        self.ramp = ramp
        self.window = window
        self.min_seconds = min_seconds

    def poll(self) -> SteadyState:
        """Read what fio wrote since the last call; the verdict over every report so far."""
        self.stream.poll()
        return self._verdict(self.stream.reports)

    def finish(self) -> SteadyState:
        """After fio exited: the verdict without the final object (its interval is a fraction
        of one, from the last report to the stop)."""
        self.stream.poll()
        return self._verdict(self.stream.reports[:-1])

    def _verdict(self, reports: Sequence[StatusReport]) -> SteadyState:
        return first_steady(interval_iops(reports, ramp=self.ramp), self.interval_s,
                            window=self.window, min_seconds=self.min_seconds)


class CounterWatch:
    """Steady state from a cumulative I/O counter read from outside fio (QEMU's device counters
    of a guest), sampled about once per ``interval_s``: per-interval IOPS are the counter's
    increase over the time between two reads. Intervals before the first I/O (fio's client and
    server still connecting) are not counted, then ``ramp_s`` seconds of fio's ramp; the SNIA
    rule then applies as for :class:`SteadyWatch`. ``read`` returning None stops the watch
    (never steady)."""

    def __init__(self, read: Callable[[], int | None], *, interval_s: float = 1.0,
                 ramp_s: float = 0.0, window: int = PTS_WINDOW, min_seconds: float = 0.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.read = read
        self.interval_s = interval_s
        self.ramp_s = ramp_s
        self.window = window
        self.min_seconds = min_seconds
        self.clock = clock
        self.series: list[float] = []
        self.unavailable = False
        self._last: tuple[float, int] | None = None
        self._io_started: float | None = None

    def poll(self) -> SteadyState:
        """Read the counter when an interval has passed; the verdict over the series so far."""
        now = self.clock()
        if not self.unavailable and (self._last is None or now - self._last[0] >= self.interval_s):
            count = self.read()
            if count is None:
                self.unavailable = True
            else:
                if self._last is not None:
                    t0, c0 = self._last
                    if count > c0 and self._io_started is None:
                        self._io_started = t0
                    if self._io_started is not None and t0 >= self._io_started + self.ramp_s - 1e-9:
                        self.series.append((count - c0) / (now - t0))
                self._last = (now, count)
        return self.finish()

    def finish(self) -> SteadyState:
        """The verdict over the intervals read so far (a partial last interval is never read)."""
        return first_steady(self.series, self.interval_s, window=self.window,
                            min_seconds=self.min_seconds)
