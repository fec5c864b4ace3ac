"""The four figures iomatrix compares, each defined once: IOPS, bandwidth, mean and p99 latency;
how every figure is written (``figure_text``); and which fio latency a run's latency figures are.

Whatever names, reads, scales, formats or ranks one of them (points, effects, scores, run
comparisons, the CLI's tables and ``--metric`` choices, the report's tables and charts) reads it
from here. A figure is stored in fio's units (I/Os, bytes per second, nanoseconds) and shown in
the unit people read (IOPS, MiB/s, µs), with ``SIGNIFICANT`` significant digits, so that a slow
device's 2.66 IOPS or 0.00977 MiB/s is not rounded away. Points also keep a p50 latency, which
is no metric here: they keep no per-sample p50, so nothing can compare it.

How a sample's two directions (read and write) combine into one figure (``Metric.combine``):
rates add up; a mean latency is the I/O-weighted mean of the directions' means, which is the mean
of all their I/Os; a percentile is never averaged: a sample of one direction gives its own, a
sample of both (a mixed workload) none; each direction's stays (``Point.directions``).

Latency: fio measures the total latency ``lat`` (submission + completion) and the completion
latency ``clat``. A run's latency figures are all of one of them (``run_latency``): ``lat`` for
iomatrix's own runs (their job files set ``lat_percentiles=1``), the one an import chose for its
run (recorded as its ``host["latency"]``); headings say which (``Metric.heading_for``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from iomatrix.core.errors import AnalysisError
from iomatrix.core.model import Frozen
from iomatrix.fio.samples import LATENCIES, DirectionSample, LatencyKind

if TYPE_CHECKING:
    from iomatrix.store.records import StoredRun

MISSING = "—"
"""How a figure that was not measured is shown."""
SIGNIFICANT = 3
"""Significant digits a figure is shown with (never fewer than its whole digits: 12,346)."""


def figure_text(value: float | None, *, significant: int = SIGNIFICANT,
                signed: bool = False) -> str:
    """A number as tables show it: thousands grouped, ``significant`` significant digits but every
    digit of its whole part (12345.6 → "12,346", 2.657 → "2.66", 0.009766 → "0.00977", 0 → "0"),
    a sign when ``signed``; MISSING for None, NaN or infinity. The report's script writes numbers
    by the same rule (``report.js`` ``sig``)."""
    if value is None or isinstance(value, bool) or not math.isfinite(value):
        return MISSING
    sign = "+" if signed else ""
    if value == 0:
        return f"{0:{sign}.0f}"
    rounded = float(f"{value:.{significant}g}")     # 9.996 → 10.0: count the digits it has then
    magnitude = math.floor(math.log10(abs(rounded)))
    decimals = max(0, significant - 1 - magnitude)
    return f"{value:{sign},.{decimals}f}"


Combine = Literal["sum", "weighted", "percentile"]


class Metric(Frozen):
    """One figure: its names, how it is read from samples and shown, and which way is better."""

    key: str
    """The name analysis takes, and the ``Point`` field of the mean: iops, bw_bytes, …"""
    option: str
    """The shorter name the command line takes (``--metric bw``)."""
    stem: str
    """Prefix of its per-sample and interval fields (``Point.bw_samples``, ``PointView.bw_low``)
    and of its charts in the report."""
    name: str
    """Within a sentence: "mean latency"."""
    title: str
    """At the start of a title: "Mean latency"."""
    heading: str
    """Heading of a table column of shown values, for a run of fio's total latency:
    "lat mean µs" (``heading_for`` gives a run's own)."""
    unit: str
    """The unit shown: IOPS, MiB/s, µs."""
    scale: float
    """Stored units per shown unit: a stored figure divided by it is the one shown."""
    significant: int = SIGNIFICANT
    """Significant digits shown (``figure_text``)."""
    lower_is_better: bool
    sample_field: str
    """The ``DirectionSample`` field it is read from."""
    combine: Combine
    """How a sample's read and write figures make the sample's figure (the module's docstring)."""
    latency: Literal["mean", "percentile"] | None = None
    """Which of a run's latency definitions the figure follows (``RunLatency``); None for rates."""

    @property
    def samples(self) -> str:
        """The ``Point`` field of its per-sample values."""
        return f"{self.stem}_samples"

    @property
    def axis(self) -> str:
        """Title of a chart axis of shown values: "mean latency (µs)"."""
        return self.unit if self.name == self.unit else f"{self.name} ({self.unit})"

    def text(self, value: float | None, *, unit: bool = False) -> str:
        """A stored figure as shown: scaled, by ``figure_text``, the unit when asked; MISSING for
        None, NaN or infinity."""
        if value is None or not math.isfinite(value):
            return MISSING
        shown = figure_text(value / self.scale, significant=self.significant)
        return f"{shown} {self.unit}" if unit else shown

    def kind(self, latency: "RunLatency") -> LatencyKind | None:
        """The fio latency this figure is of in a run with ``latency``; None for a rate."""
        if self.latency is None:
            return None
        return latency.mean if self.latency == "mean" else latency.percentiles

    def heading_for(self, latency: "RunLatency") -> str:
        """Its column heading in a run with ``latency``: "clat p99 µs" where the run's
        percentiles are of the completion latency."""
        kind = self.kind(latency)
        if kind is None or kind == "lat":
            return self.heading
        return "c" + self.heading if self.heading.startswith("lat ") else self.heading

    def axis_for(self, latency: "RunLatency") -> str:
        """Its chart axis title in a run with ``latency``: "p99 latency (µs, fio clat)"."""
        kind = self.kind(latency)
        return self.axis if kind is None else f"{self.name} ({self.unit}, fio {kind})"

    def of_sample(self, samples: Sequence[DirectionSample]) -> float | None:
        """The figure of one trial from its directions' samples (``combine``)."""
        return combined(samples, self.sample_field, self.combine)


def combined(samples: Sequence[DirectionSample], field: str, how: Combine) -> float | None:
    """One trial's figure from its directions' ``field``: their sum, their I/O-weighted mean, or
    (a percentile) the one direction's value; None for a percentile of two directions."""
    if how == "sum":
        return sum(getattr(s, field) for s in samples)
    if how == "percentile":
        return getattr(samples[0], field) if len(samples) == 1 else None
    pairs = [(getattr(s, field), s.total_ios) for s in samples if getattr(s, field) is not None]
    total = sum(n for _, n in pairs)
    return sum(v * n for v, n in pairs) / total if total else None


_MIB = 2**20
_NS_PER_US = 1000

METRICS: dict[str, Metric] = {m.key: m for m in (
    Metric(key="iops", option="iops", stem="iops", name="IOPS", title="IOPS", heading="IOPS",
           unit="IOPS", scale=1, lower_is_better=False, sample_field="iops", combine="sum"),
    Metric(key="bw_bytes", option="bw", stem="bw", name="bandwidth", title="Bandwidth",
           heading="MiB/s", unit="MiB/s", scale=_MIB, lower_is_better=False,
           sample_field="bw_bytes", combine="sum"),
    Metric(key="lat_mean_ns", option="lat", stem="lat_mean", name="mean latency",
           title="Mean latency", heading="lat mean µs", unit="µs", scale=_NS_PER_US,
           lower_is_better=True, sample_field="lat_mean_ns", combine="weighted", latency="mean"),
    Metric(key="lat_p99_ns", option="p99", stem="lat_p99", name="p99 latency", title="p99 latency",
           heading="lat p99 µs", unit="µs", scale=_NS_PER_US, lower_is_better=True,
           sample_field="p99_ns", combine="percentile", latency="percentile"),
)}
"""Every metric by key, in the order tables and charts show them."""


def _either(words: list[str]) -> str:
    return ", ".join(words[:-1]) + " or " + words[-1]


KEY_CHOICES = _either(list(METRICS))
"""The metrics' keys as a sentence says them: "iops, bw_bytes, lat_mean_ns or lat_p99_ns"."""
OPTION_CHOICES = _either([m.option for m in METRICS.values()])
"""The command line's metric names as a sentence says them: "iops, bw, lat or p99"."""
OPTION_HELP = _either([m.option if m.option == m.name.lower() else f"{m.option} ({m.name})"
                       for m in METRICS.values()]) + "."
"""``--metric``'s help: each name and what it is."""


def get_metric(key: str) -> Metric:
    """The metric ``key`` names (iops, bw_bytes, lat_mean_ns, lat_p99_ns); AnalysisError, listing
    them, for any other name."""
    try:
        return METRICS[key]
    except KeyError:
        raise AnalysisError(f"{key!r}: not a metric",
                            hint=f"choose one of {', '.join(METRICS)}") from None


def metric_named(text: str) -> Metric | None:
    """The metric ``text`` names by its command-line name or its key (bw or bw_bytes); None for
    any other text."""
    return METRICS.get(text) or next((m for m in METRICS.values() if m.option == text), None)


# --- which latency ---------------------------------------------------------------------------------

LATENCY_KEY = "latency"
"""The run metadata key (``StoredRun.host``) under which an import records its latency: "lat" or
"clat"."""
LATENCY_NAMES: dict[str, str] = {
    "lat": "total latency (fio's lat: submission + completion)",
    "clat": "completion latency (fio's clat: without submission)",
}


class RunLatency(Frozen):
    """Which fio latency a run's mean latencies and its percentiles are of."""

    mean: LatencyKind
    percentiles: LatencyKind

    @property
    def sentence(self) -> str:
        """What the latency columns are, for a table's legend: "latency columns (µs): total
        latency (fio's lat: submission + completion)"."""
        if self.mean == self.percentiles:
            return f"latency columns (µs): {LATENCY_NAMES[self.mean]}"
        return (f"latency columns (µs): the mean of {LATENCY_NAMES[self.mean]}; the percentiles "
                f"of {LATENCY_NAMES[self.percentiles]}")


def run_latency(run: "StoredRun") -> RunLatency:
    """The latency a run's figures are of: what its import recorded; iomatrix's own runs measure
    ``lat`` (their job files set ``lat_percentiles=1``); runs imported before iomatrix recorded it
    hold fio's ``lat`` means beside its default ``clat`` percentiles."""
    recorded = run.host.get(LATENCY_KEY)
    if recorded in LATENCIES:
        return RunLatency(mean=recorded, percentiles=recorded)  # type: ignore[arg-type]
    if run.suite.imported:
        return RunLatency(mean="lat", percentiles="clat")
    return RunLatency(mean="lat", percentiles="lat")
