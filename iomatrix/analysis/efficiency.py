"""Bare-metal efficiency (seed 003): each point beside the host-mode point of the same workload
on the same target in the same run (in a run of several targets, each target's own). IOPS and bandwidth as % of bare metal; latency as the
microseconds added to the bare-metal mean latency. Whether the IOPS differ from bare metal at all
is Welch's test on the samples (``stats.compare``), Holm-adjusted across every point of the run
that has a baseline: "no significant difference" is then the answer, not a bare percentage."""

from __future__ import annotations
from collections.abc import Iterable

from iomatrix.analysis.points import Point
from iomatrix.analysis.stats import Comparison, compare_many
from iomatrix.core.model import Frozen
from iomatrix.store.records import ConfigRecord


class Efficiency(Frozen):
    config_key: str
    workload_key: str
    iops_pct: float | None
    bw_pct: float | None
    added_lat_us: float | None
    """Mean latency minus the bare-metal mean latency, in µs."""
    added_p99_us: float | None
    iops_vs_bare: Comparison
    """This point's IOPS against bare metal's (B against A), adjusted across the run."""

    @property
    def iops_text(self) -> str:
        """The % of bare metal as it may be shown: qualified by its significance."""
        c = self.iops_vs_bare
        pct = "—" if self.iops_pct is None else f"{self.iops_pct:.1f}%"
        if c.p_value is None:
            return f"{pct} (untested: n<2)"
        return pct if c.significant else f"{pct} (no significant difference)"


def efficiency(points: list[Point],
               configs: Iterable[ConfigRecord]) -> dict[tuple[str, str], Efficiency]:
    """(configuration, workload) → efficiency, for every point of the run's ``configs`` that
    has a baseline point (the host-mode point on its own target, ``ConfigKey.baseline``) of the
    same workload with samples; empty when the run has no baseline."""
    baseline = {c.key: str(c.identity.baseline) for c in configs}
    base = {(p.config_key, p.workload_key): p for p in points
            if baseline[p.config_key] == p.config_key and p.samples}
    pairs = [(p, base[(baseline[p.config_key], p.workload_key)]) for p in points
             if p.samples and baseline[p.config_key] != p.config_key
             and (baseline[p.config_key], p.workload_key) in base]
    tests = compare_many([(b.iops_samples, p.iops_samples) for p, b in pairs], adjustment="holm")
    return {(p.config_key, p.workload_key): Efficiency(
                config_key=p.config_key, workload_key=p.workload_key,
                iops_pct=_pct(p.iops, b.iops), bw_pct=_pct(p.bw_bytes, b.bw_bytes),
                added_lat_us=_diff_us(p.lat_mean_ns, b.lat_mean_ns),
                added_p99_us=_diff_us(p.lat_p99_ns, b.lat_p99_ns), iops_vs_bare=test)
            for (p, b), test in zip(pairs, tests, strict=True)}


def _pct(value: float | None, base: float | None) -> float | None:
    return None if value is None or not base else 100.0 * value / base


def _diff_us(value: float | None, base: float | None) -> float | None:
    return None if value is None or base is None else (value - base) / 1000.0
