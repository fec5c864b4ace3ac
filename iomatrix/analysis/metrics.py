"""The four figures iomatrix compares, each defined once: IOPS, bandwidth, mean and p99 latency.

Whatever names, reads, scales, formats or ranks one of them (points, effects, scores, run
comparisons, the CLI's tables and ``--metric`` choices, the report's tables and charts) reads it
from here. A figure is stored in fio's units (I/Os, bytes per second, nanoseconds) and shown in
the unit people read (IOPS, MiB/s, µs). Points also keep a p50 latency, which is no metric here:
they keep no per-sample p50, so nothing can compare it.
"""

from __future__ import annotations

import math

from iomatrix.core.errors import AnalysisError
from iomatrix.core.model import Frozen

MISSING = "—"
"""How a figure that was not measured is shown."""


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
    """Heading of a table column of shown values: "lat mean µs"."""
    unit: str
    """The unit shown: IOPS, MiB/s, µs."""
    scale: float
    """Stored units per shown unit: a stored figure divided by it is the one shown."""
    digits: int
    """Decimals shown."""
    lower_is_better: bool
    sample_field: str
    """The ``DirectionSample`` field it is read from."""
    additive: bool
    """True: a sample's read and write figures add up (a rate); False: their I/O-count-weighted
    mean (a latency)."""

    @property
    def samples(self) -> str:
        """The ``Point`` field of its per-sample values."""
        return f"{self.stem}_samples"

    @property
    def axis(self) -> str:
        """Title of a chart axis of shown values: "mean latency (µs)"."""
        return self.unit if self.name == self.unit else f"{self.name} ({self.unit})"

    def text(self, value: float | None, *, unit: bool = False) -> str:
        """A stored figure as shown: scaled, thousands grouped, ``digits`` decimals, the unit when
        asked; MISSING for None, NaN or infinity."""
        if value is None or not math.isfinite(value):
            return MISSING
        shown = f"{value / self.scale:,.{self.digits}f}"
        return f"{shown} {self.unit}" if unit else shown


_MIB = 2**20
_NS_PER_US = 1000

METRICS: dict[str, Metric] = {m.key: m for m in (
    Metric(key="iops", option="iops", stem="iops", name="IOPS", title="IOPS", heading="IOPS",
           unit="IOPS", scale=1, digits=0, lower_is_better=False, sample_field="iops",
           additive=True),
    Metric(key="bw_bytes", option="bw", stem="bw", name="bandwidth", title="Bandwidth",
           heading="MiB/s", unit="MiB/s", scale=_MIB, digits=1, lower_is_better=False,
           sample_field="bw_bytes", additive=True),
    Metric(key="lat_mean_ns", option="lat", stem="lat_mean", name="mean latency",
           title="Mean latency", heading="lat mean µs", unit="µs", scale=_NS_PER_US, digits=1,
           lower_is_better=True, sample_field="lat_mean_ns", additive=False),
    Metric(key="lat_p99_ns", option="p99", stem="lat_p99", name="p99 latency", title="p99 latency",
           heading="lat p99 µs", unit="µs", scale=_NS_PER_US, digits=1, lower_is_better=True,
           sample_field="p99_ns", additive=False),
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
