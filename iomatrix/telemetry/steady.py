"""Steady state as SNIA's Solid State Storage Performance Test Specification (PTS) defines it.

A *measurement window* is ``window`` consecutive rounds (PTS: 5) of one tracked value (here the
IOPS of one status interval). The window is steady when both hold:

- range: ``max − min`` of the values is at most 20 % of their mean;
- slope: the excursion of the least-squares line fitted through the window, ``|slope| × (n − 1)``
  (the line's ``max − min`` across the window), is at most 10 % of their mean.

Limits: the rule says nothing about a device that is steady at a level it will leave later (an SSD
before its SLC cache fills looks steady); with few I/Os per interval, sampling noise alone can
exceed 20 % and the rule never passes (fio issue #1510 is the same effect for fio's own ``ss``);
a series whose mean is zero (no I/O) is never steady.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from iomatrix.core.model import Frozen

RANGE_LIMIT = 0.20
EXCURSION_LIMIT = 0.10
PTS_WINDOW = 5
RULE = ("SNIA PTS steady state: over {window} consecutive intervals, max-min <= 20 % of their "
        "mean and the excursion of the least-squares line <= 10 % of their mean")
# Ratios are compared with this much slack, so that a window exactly at a limit passes despite
# floating-point rounding.
_EPSILON = 1e-12


class SteadyState(Frozen):
    """Whether and when a series met the SNIA PTS rule."""

    reached: bool
    at_seconds: float | None
    """End of the first window that met the rule, in seconds from the series' start."""
    windows: int
    """How many windows were checked (the one that passed included)."""
    range_ratio: float | None
    """(max − min) / mean of the last window checked; None when no window was checked."""
    excursion_ratio: float | None
    """Least-squares line excursion / mean of the last window checked; None likewise."""
    rule: str


def snia_rule(values: Sequence[float]) -> tuple[bool, float, float]:
    """Whether one window (PTS: 5 values) meets the SNIA PTS rule; its (max − min) / mean and
    least-squares excursion / mean. A window with mean <= 0 fails with both ratios infinite."""
    n = len(values)
    if n < 2:
        raise ValueError(f"a steady-state window needs at least 2 values, got {n}")
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"steady-state values must be finite: {list(values)}")
    mean = math.fsum(values) / n
    if mean <= 0:
        return False, math.inf, math.inf
    x_mean = (n - 1) / 2
    sxx = math.fsum((i - x_mean) ** 2 for i in range(n))
    sxy = math.fsum((i - x_mean) * (v - mean) for i, v in enumerate(values))
    excursion = abs(sxy / sxx) * (n - 1)
    range_ratio = (max(values) - min(values)) / mean
    excursion_ratio = excursion / mean
    ok = range_ratio <= RANGE_LIMIT + _EPSILON and excursion_ratio <= EXCURSION_LIMIT + _EPSILON
    return ok, range_ratio, excursion_ratio


def first_steady(series: Sequence[float], interval_s: float, *, window: int = PTS_WINDOW,
                 min_seconds: float = 0.0) -> SteadyState:
    """The first window of ``series`` (one value per ``interval_s``) that meets the SNIA PTS
    rule and ends at or after ``min_seconds``; windows slide by one interval.

    A maximum runtime is the caller's: pass only the intervals measured before it."""
    if interval_s <= 0:
        raise ValueError(f"interval must be positive, got {interval_s}")
    if window < 2:
        raise ValueError(f"a steady-state window needs at least 2 intervals, got {window}")
    rule = RULE.format(window=window)
    checked = 0
    range_ratio: float | None = None
    excursion_ratio: float | None = None
    for end in range(window, len(series) + 1):
        at = end * interval_s
        if at + _EPSILON < min_seconds:
            continue
        ok, range_ratio, excursion_ratio = snia_rule(series[end - window:end])
        checked += 1
        if ok:
            return SteadyState(reached=True, at_seconds=at, windows=checked,
                               range_ratio=range_ratio, excursion_ratio=excursion_ratio, rule=rule)
    return SteadyState(reached=False, at_seconds=None, windows=checked, range_ratio=range_ratio,
                       excursion_ratio=excursion_ratio, rule=rule)
