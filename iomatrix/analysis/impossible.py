"""Impossible figures: points faster than the run's own bare metal (the host-mode point on the
same target and workload, ``ConfigKey.baseline``). Nothing between a guest (or QEMU's block
layer) and the storage makes the storage faster, so such a figure measured a cache that answered
instead of the storage (the host page cache, librbd's cache, a RAID controller's, ZFS's ARC)
or writes that were not made durable. Longhorn's kbench refuses such figures; iomatrix marks
them with the rule's name and keeps them out of recommendations (``without_faster``).

A point is faster than bare metal when, beyond the 95 % CIs of both means, its IOPS are higher,
its mean latency lower, or (a workload that writes) its bandwidth higher: its interval lies
wholly beyond bare metal's. With fewer than two samples on either side there is no interval:
then the means must differ by more than ``MARGIN``. The [RAM] rule (``analysis.pagecache``)
says why for the host page cache alone, from what reached the device; this one needs no
telemetry, so it holds for any cache."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from iomatrix.analysis.points import Point, points
from iomatrix.analysis.stats import interval_bounds
from iomatrix.core.model import Frozen
from iomatrix.store.records import ConfigRecord, StoredRun

MARK = "[>BARE]"
"""How ``show`` marks a point faster than bare metal."""
MARGIN = 0.25
"""With no interval (one sample on a side): how far beyond bare metal's mean a figure must be."""
RULE = (f"{MARK}: faster than this run's own bare metal (host mode, same target and workload) "
        "beyond both 95 % CIs (IOPS or, for writes, bandwidth above it; mean latency below it; "
        f"with a single sample, beyond {MARGIN:.0%} of its mean): a cache answered (the host page "
        "cache, librbd's, a RAID controller's, ZFS's ARC) or writes were not made durable, so "
        "the figure does not measure the storage. Such points are kept out of recommendations")


class Faster(Frozen):
    """A point faster than its bare metal, and in what."""

    config_key: str
    workload_key: str
    why: tuple[str, ...]
    """What was faster, for people: ``IOPS 3.1× bare metal's``."""

    @property
    def text(self) -> str:
        return "; ".join(self.why)


def _beyond(mine: Sequence[float], bare: Sequence[float], higher: bool) -> bool:
    """Whether ``mine``'s mean lies beyond ``bare``'s (above with ``higher``, else below),
    their 95 % intervals apart, or by ``MARGIN`` without an interval."""
    if not mine or not bare:
        return False
    (low, high), (bare_low, bare_high) = interval_bounds(mine), interval_bounds(bare)
    if None in (low, high, bare_low, bare_high):
        a, b = sum(mine) / len(mine), sum(bare) / len(bare)
        return a > b * (1 + MARGIN) if higher else a * (1 + MARGIN) < b
    assert low is not None and high is not None and bare_low is not None and bare_high is not None
    return low > bare_high if higher else high < bare_low


def _why(p: Point, b: Point, writes: bool) -> tuple[str, ...]:
    found = []
    if _beyond(p.iops_samples, b.iops_samples, higher=True) and p.iops and b.iops:
        found.append(f"IOPS {p.iops / b.iops:.1f}× bare metal's")
    if writes and _beyond(p.bw_samples, b.bw_samples, higher=True) and p.bw_bytes and b.bw_bytes:
        found.append(f"write bandwidth {p.bw_bytes / b.bw_bytes:.1f}× bare metal's")
    if (_beyond(p.lat_mean_samples, b.lat_mean_samples, higher=False)
            and p.lat_mean_ns and b.lat_mean_ns):
        found.append(f"mean latency {p.lat_mean_ns / b.lat_mean_ns:.2f}× bare metal's")
    return tuple(found)


def faster_than_bare(found: Iterable[Point], configs: Iterable[ConfigRecord],
                     writes: Iterable[str]) -> dict[tuple[str, str], Faster]:
    """(configuration, workload) → how it was faster, for every point of ``found`` faster than
    its bare-metal point; ``writes``: the keys of the workloads that write."""
    found = list(found)
    baseline = {c.key: str(c.identity.baseline) for c in configs}
    base = {(p.config_key, p.workload_key): p for p in found
            if baseline.get(p.config_key) == p.config_key and p.samples}
    writing = set(writes)
    out = {}
    for p in found:
        b = base.get((baseline.get(p.config_key, p.config_key), p.workload_key))
        if b is None or b is p or not p.samples:
            continue
        why = _why(p, b, p.workload_key in writing)
        if why:
            out[(p.config_key, p.workload_key)] = Faster(
                config_key=p.config_key, workload_key=p.workload_key, why=why)
    return out


def of_run(run: StoredRun) -> dict[tuple[str, str], Faster]:
    """``faster_than_bare`` of every point of ``run``."""
    writes = [w.key for w in run.workloads if "write" in w.rw or w.rw in ("rw", "randrw")]
    return faster_than_bare(points(run), run.configs, writes)


def without_faster(run: StoredRun) -> tuple[StoredRun, str]:
    """``run`` without the trials of its points faster than bare metal, and a note saying what
    was left out ("" when nothing was)."""
    faster = of_run(run)
    if not faster:
        return run, ""
    kept = tuple(t for t in run.trials if (t.config_key, t.workload_key) not in faster)
    labels = {c.key: c.label for c in run.configs}
    named = sorted({labels.get(k, k) for k, _ in faster})
    return run.model_copy(update={"trials": kept}), (
        f"{len(faster)} point(s) faster than bare metal left out ({MARK}: a cache answered, "
        f"not the storage): {', '.join(named)}")
