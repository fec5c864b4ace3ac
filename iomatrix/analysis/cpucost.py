"""CPU per I/O beside a gain (seed 002's efficiency: host CPU time per I/O under the same
workload): one level of an axis against a reference, over the same matched pairs the effects
analysis compares (two configurations identical but for the axis, each workload), from each
point's host CPU per I/O (``Point.cpu_us_per_io``: every process iomatrix started, the host fio
included, ``telemetry.probe``).

``relative`` is the geometric mean of the pairs' ratios − 1 (+0.30: the level costs 30 % more
CPU per I/O); its 95 % interval is the t (or, skewed, bootstrap) interval of the mean log ratio
(``stats.log_ratio_test``) from 2 pairs up. It is shown beside a gain, never a reason to
recommend: a level is recommended on its IOPS and latency (``recommend.decide``), and what it
costs the host is said with it."""

from __future__ import annotations

import math

from iomatrix.analysis.effects import twins
from iomatrix.analysis.points import points
from iomatrix.analysis.stats import log_ratio_test
from iomatrix.core.model import Frozen
from iomatrix.store.records import StoredRun


class CpuPerIo(Frozen):
    """One level's host CPU per I/O against the reference's, over matched pairs."""

    level: str
    reference: str
    pairs: int
    """Matched point pairs with a CPU per I/O on both sides."""
    level_us: float | None
    """Mean CPU µs per I/O of the level's paired points (None without pairs)."""
    reference_us: float | None
    relative: float | None
    low: float | None = None
    high: float | None = None

    def short(self) -> str:
        """``CPU per I/O +30.2 %`` ("" without pairs)."""
        if self.relative is None:
            return ""
        return f"CPU per I/O {self.relative * 100:+.1f} %".replace("-", "\u2212")

    def text(self) -> str:
        """``CPU per I/O +30.2 % (95 % CI +21.0 … +40.1 %; 41.2 vs 31.6 µs, 6 pairs)``, or why
        there is none."""
        if self.relative is None or self.level_us is None or self.reference_us is None:
            return "CPU per I/O not measured"
        ci = ("" if self.low is None or self.high is None else
              f"95 % CI {self.low * 100:+.1f} … {self.high * 100:+.1f} %; ")
        pairs = f"{self.pairs} pair" + ("s" if self.pairs != 1 else "")
        return (f"CPU per I/O {self.relative * 100:+.1f} % ({ci}{self.level_us:.3g} vs "
                f"{self.reference_us:.3g} µs, {pairs})").replace("-", "\u2212")


def cpu_per_io(run: StoredRun, axis: str, level: str, reference: str) -> CpuPerIo:
    """``level``'s host CPU per I/O against ``reference``'s over the run's matched pairs."""
    cost = {(p.config_key, p.workload_key): p.cpu_us_per_io for p in points(run)
            if p.cpu_us_per_io is not None and p.cpu_us_per_io > 0}
    pairs = [(cost[(ref.key, w.key)], cost[(other.key, w.key)])
             for ref, other in twins(run, axis, level, reference) for w in run.workloads
             if (ref.key, w.key) in cost and (other.key, w.key) in cost]
    if not pairs:
        return CpuPerIo(level=level, reference=reference, pairs=0, level_us=None,
                        reference_us=None, relative=None)
    logs = [math.log(b / a) for a, b in pairs]
    mean = sum(logs) / len(logs)
    low = high = None
    if len(logs) >= 2:
        interval = log_ratio_test(logs).interval
        if interval.low is not None and interval.high is not None:
            low, high = math.exp(interval.low) - 1, math.exp(interval.high) - 1
    return CpuPerIo(level=level, reference=reference, pairs=len(pairs),
                    level_us=sum(b for _, b in pairs) / len(pairs),
                    reference_us=sum(a for a, _ in pairs) / len(pairs),
                    relative=math.exp(mean) - 1, low=low, high=high)
