"""Percentiles from fio's json+ latency histograms. fio reports no percentiles for its
"All clients" aggregate before 3.41, none for jobs summed without group_reporting, and none for
the reads and writes of a mixed workload together; merging their bins gives them exactly as fio
computes them for one job (the value of the first bin whose cumulative count reaches the
percentile): for both directions, what fio itself reports with ``unified_rw_reporting=both``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from iomatrix.fio.models import Percentiles

POINTS = {"p50": 50.0, "p90": 90.0, "p99": 99.0, "p99_9": 99.9, "p99_99": 99.99}


def merge_bins(histograms: Iterable[tuple[tuple[int, int], ...]]) -> tuple[tuple[int, int], ...]:
    """The sum of several (latency ns, count) histograms."""
    total: Counter[int] = Counter()
    for bins in histograms:
        for value, count in bins:
            total[value] += count
    return tuple(sorted(total.items()))


def percentiles_from_bins(bins: tuple[tuple[int, int], ...]) -> Percentiles:
    """fio's percentile rule applied to a histogram; None for every point of an empty one."""
    count = sum(c for _, c in bins)
    if count == 0:
        return Percentiles()
    out: dict[str, float] = {}
    for name, pct in POINTS.items():
        need = pct / 100.0 * count
        running = 0
        for value, c in bins:
            running += c
            if running >= need:
                out[name] = float(value)
                break
    return Percentiles(**out)
