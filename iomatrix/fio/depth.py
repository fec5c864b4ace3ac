"""The queue depth fio achieved, beside the one a workload asked for (fio's tracker: #875, the
asked depth not reached; #1073, fio issuing synchronous I/O on Windows; windowsaio in general).

fio reports no mean depth; it reports ``iodepth_level``: the share of its I/Os issued while the
number in flight was in each bucket, the buckets named by their least depth (fio's
``io_u_mark_depth``): 1 (0-1), 2 (2-3), 4 (4-7), 8 (8-15), 16 (16-31), 32 (32-63), 64
(``>=64``). :func:`achieved_depth` is the mean of those least depths, weighted by the shares
(and by each job's I/Os where fio reports several jobs or clients): a lower bound of the mean
depth, never above the true one, and above half of it (each bucket's least depth is more than
half of any depth in it). Above 64 it says 64: fio counts no higher.

A trial is **short** of its depth (:data:`SHORT_RULE`) when that bound is below half the asked
depth. Since the bound is more than half the true mean, a short trial's true mean depth is below
the asked one for certain, whatever the spread inside the buckets; a trial that keeps the asked
depth all along is never flagged (its bucket's least depth is more than half of it)."""

from __future__ import annotations

from collections.abc import Sequence

from iomatrix.core.model import Frozen
from iomatrix.fio.models import FioResult, JobStats

LEVELS: tuple[tuple[str, int], ...] = (
    ("1", 1), ("2", 2), ("4", 4), ("8", 8), ("16", 16), ("32", 32), (">=64", 64))
"""fio's ``iodepth_level`` keys with the least depth each stands for."""
SHORT_RULE = "achieved depth (fio's iodepth_level, lower bound) below half the asked depth"


class DepthRecord(Frozen):
    """The queue depth of one trial: ``asked`` (the workload's iodepth), ``achieved``
    (:func:`achieved_depth`; None when fio reported no levels) and ``short`` (see
    :data:`SHORT_RULE`)."""

    asked: int
    achieved: float | None = None
    short: bool = False

    @property
    def text(self) -> str:
        """"QD asked 32, achieved 7.5 (short)" for people."""
        if self.achieved is None:
            return f"QD asked {self.asked}, achieved unknown"
        return (f"QD asked {self.asked}, achieved {self.achieved:.1f}"
                + (f" (short: {SHORT_RULE})" if self.short else ""))


def job_depth(job: JobStats) -> float | None:
    """One job's lower bound of its mean depth, or None when fio reported no levels."""
    total = sum(share for _, share in job.depth_levels)
    if total <= 0:
        return None
    return sum(depth * share for depth, share in job.depth_levels) / total


def achieved_depth(result: FioResult, asked: int) -> DepthRecord:
    """The depth ``result``'s jobs achieved (weighted by their I/Os), beside ``asked``."""
    return depth_record([j for j in result.jobs if not j.error], asked)


def depth_record(jobs: Sequence[JobStats], asked: int) -> DepthRecord:
    weighted = [(d, j.read.total_ios + j.write.total_ios) for j in jobs
                if (d := job_depth(j)) is not None]
    ios = sum(n for _, n in weighted)
    if not weighted or ios <= 0:
        return DepthRecord(asked=asked)
    achieved = round(sum(d * n for d, n in weighted) / ios, 2)
    return DepthRecord(asked=asked, achieved=achieved, short=achieved < asked / 2)
