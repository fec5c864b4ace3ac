"""Effects of one axis (seed 000): how much a level of an axis changes a figure against a reference
level, with everything else held fixed.

- Matched pair: two non-host configurations of the same mode that are identical except for
  ``axis`` (one at ``level``, one at ``reference``), measured on the same workload. Host-mode
  configurations (the bare-metal baseline) take part only in the ``node`` axis of a cluster
  run, where each node's bare-metal figures are what its nodes are compared by. Its nodes
  measure their shares side by side, so round r of one node is paired with round r of another
  (about the same time, not the same host: drift of the shared storage cancels, a node's own
  does not). A run whose nodes loaded the target at once in every trial has no node axis.
- A gain rests on the pairs of one group: per queue depth by default (``by``), so that, as in
  seed 000, the gain at QD1 is an average over the block sizes (and any other workload settings);
  ``hold`` keeps other axes apart (``hold=("aio",)``: the iothread gain per aio mode).
- ``relative`` is level / reference − 1 of the metric's mean: +0.12 = the level's figure is 12 %
  higher. Higher is better for iops and bw_bytes; for lat_mean_ns and lat_p99_ns a NEGATIVE
  relative means lower latency, i.e. better (``Gain.better`` says which way it went).

How pairs are combined, and how sure we are:

- One pair: ``stats.compare`` on the two points' samples (Welch's test, Fieller CI of the ratio of
  means). Below 2 samples on either side there is no estimate and no significance.
- Several pairs: the geometric mean of the per-pair ratios of means, i.e. the mean over pairs of
  log(mean_level / mean_reference), with a Student-t interval across pairs (``stats.t_interval``)
  back-transformed with exp, and a one-sample t-test of the log ratios against 0. Each pair counts
  once whatever its sample count, and the spread across pairs carries both measurement noise and
  the real variation of the effect over the workloads averaged, so the interval answers "what is
  the typical gain over these workloads", not "how precisely was each point measured"; this also
  works when each point was measured once, as in seed 000. Logs make A→B and B→A reciprocal;
  seed 000 averaged the percentages arithmetically, which differs by second-order terms
  (≈ variance of the gains / 2). Limits: pairs are treated as independent, though pairs that share
  a configuration were measured in the same session and can correlate; pairs with a mean of 0 on
  either side (nothing measured) have no log ratio and are left out (``excluded``).
- Paired by round (method "rounds", the default wherever it applies): a run measured in
  interleaved rounds (``rounds_known``: every run iomatrix measured; not imports, whose sample
  indices only count each point's files) measures every configuration once per round, so a
  drift of the host within minutes lands on both sides of a pair alike. The gain is then
  estimated from ratios within rounds (duet benchmarking, Bulej et al. 2020; randomized
  multiple interleaved trials, Abedi & Brecht 2017): for each round r in which every pair of the
  group was measured on both sides (``rounds``; others are ``rounds_excluded``),
  d_r = mean over pairs of log(level_r / reference_r); the gain is exp(mean d_r) − 1 with a
  Student-t interval across rounds, or the expanded percentile bootstrap when the d_r are
  skewed (n ≥ 8 and |adjusted Fisher–Pearson skewness| > 1, ``stats.is_skewed``), and a
  one-sample t-test of the d_r against 0 (``stats.log_ratio_test``). Drift common to a round
  cancels in d_r, and whatever drifts between the two sides within a round (one block after
  the other) stays in the spread of the d_r, so it is counted, not hidden. The workloads of a
  group are fixed: the interval says how precisely the average gain over exactly these
  workloads is known (what more rounds can narrow, and what ``target_ci`` asks of gains), not
  how the gain varies between workloads (``by=("workload",)`` shows that). Fewer than 2 such
  rounds: the unpaired methods below. ``mde`` is the minimal detectable effect at the rounds
  (or pairs) reached: (t(0.975) + t(0.8)) · sd/√n on the log scale, as a relative gain.
  Caveat: a trial measured again later (``--retry-failed``, a resumed run's missing trials)
  keeps its round's index though not its round's time; it still pairs, but its drift does not
  cancel (it widens the interval rather than biasing it).
- Every gain of one ``gains`` call is one family: p-values are adjusted together
  (``stats.adjust``, Holm by default) and ``significant`` uses the adjusted p. CIs stay
  per-gain (95 %, not simultaneous).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import computed_field
from scipy import stats as _scipy

from iomatrix.analysis.metrics import METRICS, get_metric
from iomatrix.analysis.points import points
from iomatrix.analysis.stats import (ADJUSTMENT_NAMES, Adjustment, Comparison, LogRatioTest,
                                     adjust, compare, log_ratio_test, minimal_detectable, p_text,
                                     percent_text, t_interval_sd)
from iomatrix.core.errors import AnalysisError
from iomatrix.store.records import ConfigRecord, StoredRun
from iomatrix.core.model import Frozen
from iomatrix.suite.fields import NODE_AXIS
from iomatrix.vocab.words import Mode, TrialStatus

BY = ("iodepth", "bs", "rw", "workload")
"""What ``by`` may group on: workload settings, or each workload on its own."""
CONFIDENCE = 0.95
ALPHA = 0.05
# Log ratios closer than this are equal up to floating-point rounding (1e-12 ≈ 1e-10 %).
_SAME_LOG_RATIO = 1e-12


class Gain(Frozen):
    """One level of an axis against the reference level, for one metric and one group of pairs.

    ``relative`` is mean(level) / mean(reference) − 1 (the geometric mean of the per-pair ratios
    when there are several pairs): +0.12 = 12 % higher. For iops and bw_bytes higher is better;
    for lat_mean_ns and lat_p99_ns a NEGATIVE relative means lower latency (better). ``low`` and
    ``high`` bound it at 95 % (None when unknown or unbounded). ``significant`` uses the
    adjusted p-value (``adjustment`` across ``family`` gains). ``method``: "samples" (one pair:
    Welch/Fieller on its samples), "pairs" (several: t across pairs of log ratios), "none" (no
    usable pair), "rounds" (paired by round: t, or bootstrap when skewed, across rounds of
    the per-round mean log ratio; see the module docstring). ``verdict`` is the one line to
    show with it.
    """

    axis: str
    level: str
    reference: str
    metric: str
    held: dict[str, str]
    """Other axes held fixed for this gain ({} = pooled over all of them)."""
    iodepth: int | None
    """The queue depth this gain is for (None = all depths)."""
    bs: int | None = None
    rw: str | None = None
    workload: str | None = None
    """The workload key when the gain is for one workload."""
    pairs: int
    """Matched point pairs the gain rests on."""
    excluded: int = 0
    """Matched pairs left out because one side's mean is 0 (no log ratio)."""
    relative: float | None
    low: float | None
    high: float | None
    p_value: float | None
    adjusted_p: float | None
    adjustment: str | None = None
    family: int | None = None
    significant: bool
    method: Literal["rounds", "samples", "pairs", "none"]
    rounds: int | None = None
    """Method "rounds": the rounds the gain rests on (each with every pair measured)."""
    rounds_excluded: int = 0
    """Method "rounds": rounds left out because some pair lacked a side in them."""
    interval: Literal["t", "bootstrap"] | None = None
    """Which interval ``low``/``high`` are (methods "rounds" and "pairs")."""
    mde: float | None = None
    """Minimal detectable effect (relative, 80 % power at α = 0.05) at the rounds or pairs
    reached; None for method "samples" and "none"."""
    verdict: str

    @computed_field  # type: ignore[prop-decorator]
    @property
    def better(self) -> bool | None:
        """True when the level is significantly better than the reference, False when
        significantly worse, None when there is no significant difference."""
        if not self.significant or self.relative is None or self.relative == 0:
            return None
        return (self.relative < 0) == METRICS[self.metric].lower_is_better


def _takes_part(config: ConfigRecord, axis: str) -> bool:
    """Whether ``config`` has a level of ``axis`` to compare: the host baseline only of the
    node axis (module docstring)."""
    return axis in config.params and (config.mode != Mode.HOST or axis == NODE_AXIS)


def axes_of(run: StoredRun) -> dict[str, list[str]]:
    """Axis → its levels in the order configurations first use them, for the axes that take at
    least two levels among the run's non-host configurations (and, in a cluster run, its
    host-mode ones for the node axis)."""
    levels: dict[str, list[str]] = {}
    for config in run.configs:
        for axis, value in config.params.items():
            if not _takes_part(config, axis):
                continue
            seen = levels.setdefault(axis, [])
            if value not in seen:
                seen.append(value)
    return {axis: values for axis, values in levels.items() if len(values) >= 2}


def default_reference(axis: str, levels: list[str]) -> str:
    """The level other levels are compared against: native for aio, off for iothread (when
    present), else the first level."""
    preferred = {"aio": "native", "iothread": "off"}.get(axis)
    return preferred if preferred in levels else levels[0]


def rounds_known(run: StoredRun) -> bool:
    """Whether the run's sample index is its round (every configuration measured once per
    round, interleaved: ``suite.plan``). True for the runs iomatrix measured; False for imports
    (their index counts each point's files in time order) and for synthetic runs, unless their
    host metadata says ``trial_order = "rounds"``."""
    if run.host.get("trial_order") == "rounds":
        return True
    return run.seed is not None and not run.suite.imported and run.suite.source != "synthetic"


_ROUNDS: dict[tuple[int, str], tuple[StoredRun, dict[tuple[str, str], dict[int, float]]]] = {}


def round_values(run: StoredRun, metric: str) -> dict[tuple[str, str], dict[int, float]]:
    """(configuration key, workload key) → round (sample index) → the ok trial's figure."""
    key = (id(run), metric)
    cached = _ROUNDS.get(key)
    if cached is not None and cached[0] is run:
        return cached[1]
    m = get_metric(metric)
    out: dict[tuple[str, str], dict[int, float]] = {}
    for t in run.trials:
        if (t.status == TrialStatus.OK and (run.with_stalled or not t.stalled)
                and (v := m.of_sample(t.samples)) is not None):
            out.setdefault((t.config_key, t.workload_key), {})[t.sample_index] = v
    if len(_ROUNDS) >= _GAINS_SIZE:
        _ROUNDS.pop(next(iter(_ROUNDS)))
    _ROUNDS[key] = (run, out)
    return out


class _Group:
    """The matched pairs of one gain, column-wise, in the order they are met (by twin, then by
    workload): each pair's reference and level configuration (rows of ``_Columns``), its
    workload (index into the run's workloads), the means of its two sides and, where the run's
    rounds are known, each side's figure by round. A large matrix has millions of pairs: as
    columns they cost no object each."""

    __slots__ = ("columns", "ref", "other", "workload", "ma", "mb", "ra", "rb")

    def __init__(self, columns: "_Columns") -> None:
        self.columns = columns
        self.ref: list[int] = []
        self.other: list[int] = []
        self.workload: list[int] = []
        self.ma: list[float] = []
        self.mb: list[float] = []
        self.ra: list[dict[int, float]] | None = None
        self.rb: list[dict[int, float]] | None = None

    def __len__(self) -> int:
        return len(self.ma)

    def samples(self, i: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """Pair ``i``'s per-sample values: the reference's, then the level's."""
        values, w = self.columns.values, self.workload[i]
        return values[self.ref[i]][w], values[self.other[i]][w]  # type: ignore[return-value]


def _axis_levels(run: StoredRun, axis: str) -> list[str]:
    axes = axes_of(run)
    if axis == NODE_AXIS and run.nodes:
        refuse_concurrent_nodes(run)
    if axis not in axes:
        listed = "; ".join(f"{a} ({', '.join(v)})" for a, v in axes.items()) or "none"
        raise AnalysisError(f"run {run.id}: {axis!r} is not an axis with two or more levels",
                            hint=f"axes of run {run.id}: {listed}")
    return axes[axis]


def refuse_concurrent_nodes(run: StoredRun) -> None:
    """AnalysisError for a cluster run whose nodes loaded the target at once: none of its
    trials is one node's."""
    if run.suite.method.concurrent_nodes:
        raise AnalysisError(f"run {run.id} loaded its target from every node at once: each of "
                            "its trials holds every node's share, not one node's",
                            hint=f"`iomatrix show {run.id}`; the trials' cluster.nodes says "
                                 "which vm is which node")


def _check_level(run: StoredRun, axis: str, level: str, levels: list[str]) -> None:
    if level not in levels:
        raise AnalysisError(f"run {run.id}: {axis} has no level {level!r}",
                            hint=f"levels of {axis}: {', '.join(levels)}")


@dataclass(frozen=True)
class _Columns:
    """A run's points of one metric as a configuration × workload table (rows in the run's
    configuration order, columns in its workload order)."""

    row: dict[str, int]
    """Configuration key → its row."""
    values: list[list[tuple[float, ...] | None]]
    """Each point's per-sample values; None where it has none."""
    present: np.ndarray
    """Where a point has values (bool)."""
    means: np.ndarray
    """Their means (``math.fsum`` / n, exactly as before: 0 where absent)."""


_COLUMNS: dict[tuple[int, str], tuple[StoredRun, _Columns]] = {}


def _columns(run: StoredRun, metric: str) -> _Columns:
    """The run's points of ``metric`` column-wise: read once per run and metric, rather than
    once per pair and ``gains`` call."""
    key = (id(run), metric)
    cached = _COLUMNS.get(key)
    if cached is not None and cached[0] is run:
        return cached[1]
    index = {w.key: i for i, w in enumerate(run.workloads)}
    row = {c.key: i for i, c in enumerate(run.configs)}
    shape = (len(run.configs), len(run.workloads))
    values: list[list[tuple[float, ...] | None]] = [[None] * shape[1] for _ in run.configs]
    present = np.zeros(shape, dtype=bool)
    means = np.zeros(shape)
    for p in points(run):
        found = p.values(metric)
        r, w = row.get(p.config_key), index.get(p.workload_key)
        if found and r is not None and w is not None:
            values[r][w] = found
            present[r, w] = True
            means[r, w] = math.fsum(found) / len(found)
    out = _Columns(row=row, values=values, present=present, means=means)
    if len(_COLUMNS) >= _GAINS_SIZE:
        _COLUMNS.pop(next(iter(_COLUMNS)))
    _COLUMNS[key] = (run, out)
    return out


def twins(run: StoredRun, axis: str, level: str, reference: str
           ) -> list[tuple[ConfigRecord, ConfigRecord]]:
    """(reference configuration, level configuration): two configurations of the same mode
    identical but for ``axis`` (host-mode ones only for the node axis)."""
    twins: dict[tuple[str, tuple[tuple[str, str], ...]], dict[str, ConfigRecord]] = {}
    for config in run.configs:
        if not _takes_part(config, axis):
            continue
        rest = tuple(sorted((k, v) for k, v in config.params.items() if k != axis))
        twins.setdefault((config.mode, rest), {})[config.params[axis]] = config
    return [(by_level[reference], by_level[level]) for by_level in twins.values()
            if reference in by_level and level in by_level]


def _workload_groups(run: StoredRun, by: Sequence[str]) -> dict[tuple[object, ...], np.ndarray]:
    """The ``by`` values of the run's workloads → the indices of the workloads that have them,
    ascending."""
    found: dict[tuple[object, ...], list[int]] = {}
    for i, w in enumerate(run.workloads):
        found.setdefault(tuple(w.key if f == "workload" else getattr(w, f) for f in by),
                         []).append(i)
    return {k: np.array(v, dtype=np.intp) for k, v in found.items()}


class _Estimate(Frozen):
    """A group's estimate before adjustment: the comparison and how it was made."""

    comparison: Comparison
    method: str
    excluded: int = 0
    rounds: int | None = None
    rounds_excluded: int = 0
    interval: str | None = None
    mde: float | None = None


def _by_rounds(group: _Group) -> _Estimate | None:
    """The paired-by-round estimate of a group, or None when fewer than 2 rounds measured
    every usable pair on both sides (or the rounds are unknown)."""
    if group.ra is None or group.rb is None:
        return None
    usable = [(ra, rb) for ma, mb, ra, rb in zip(group.ma, group.mb, group.ra, group.rb)
              if ma > 0 and mb > 0]
    if not usable:
        return None
    common: set[int] | None = None
    seen: set[int] = set()
    for ra, rb in usable:
        seen |= ra.keys() | rb.keys()
        both = {r for r in ra.keys() & rb.keys() if ra[r] > 0 and rb[r] > 0}
        common = both if common is None else common & both
    if common is None or len(common) < 2:
        return None
    rounds = sorted(common)
    logs = [math.fsum(math.log(rb[r] / ra[r]) for ra, rb in usable) / len(usable)
            for r in rounds]
    test = log_ratio_test(logs, CONFIDENCE)
    c = _log_comparison(test, len(rounds))
    return _Estimate(comparison=c, method="rounds", excluded=len(group) - len(usable),
                     rounds=len(rounds), rounds_excluded=len(seen - common),
                     interval=test.interval.method, mde=_mde(test.sd, test.interval.n))


def _log_comparison(test: LogRatioTest, n: int) -> Comparison:
    i = test.interval
    assert i.low is not None and i.high is not None
    return Comparison(n_a=n, n_b=n, mean_a=None, mean_b=None, relative=math.expm1(i.mean),
                      low=math.expm1(i.low), high=math.expm1(i.high), confidence=CONFIDENCE,
                      p_value=test.p_value, alpha=ALPHA, significant=test.p_value < ALPHA,
                      constant=test.constant, verdict="")


def _mde(sd: float, n: int) -> float | None:
    """The minimal detectable effect of ``n`` log ratios of standard deviation ``sd``
    (``LogRatioTest.sd``: 0.0 when they are equal up to rounding), as a relative gain."""
    d = minimal_detectable(sd, n, alpha=ALPHA)
    return None if d is None else math.expm1(d)


def _estimate(group: _Group) -> _Estimate:
    """Paired by round where the rounds allow it, else the unpaired methods."""
    paired = _by_rounds(group)
    if paired is not None:
        return paired
    c, method, excluded, sd = _unadjusted(group)
    # the log ratios' LogRatioTest.sd, without testing them again
    mde = _mde(0.0 if c.constant else sd, c.n_a) if method == "pairs" else None
    return _Estimate(comparison=c, method=method, excluded=excluded,
                     interval="t" if method == "pairs" else None, mde=mde)


def _unadjusted(group: _Group) -> tuple[Comparison, str, int, float]:
    """The group's comparison before adjustment (unpaired), its method, the pairs left out,
    and the standard deviation of the log ratios of the pairs kept (method "pairs")."""
    if len(group) == 1:
        return (compare(*group.samples(0), confidence=CONFIDENCE, alpha=ALPHA), "samples", 0,
                0.0)
    ma, mb = np.array(group.ma), np.array(group.mb)
    kept = (ma > 0) & (mb > 0)
    usable = np.flatnonzero(kept)
    excluded = len(group) - len(usable)
    if len(usable) == 1:
        c = compare(*group.samples(int(usable[0])), confidence=CONFIDENCE, alpha=ALPHA)
        return c, "samples", excluded, 0.0
    n = len(usable)
    if n == 0:
        return (Comparison(n_a=0, n_b=0, mean_a=None, mean_b=None, relative=None, low=None,
                           high=None, confidence=CONFIDENCE, p_value=None, alpha=ALPHA,
                           significant=False, verdict=""), "none", excluded, 0.0)
    # IEEE division is exact to the last bit whoever does it; the logs stay math.log's
    log_list = [math.log(r) for r in (mb[kept] / ma[kept]).tolist()]
    logs = np.array(log_list)
    interval, sd = t_interval_sd(log_list, CONFIDENCE)
    assert interval.low is not None and interval.high is not None
    low, high = interval.low, interval.high
    # Ratios equal up to rounding: the t statistic is 0/0 or ±∞; same convention as
    # stats.compare for constant samples.
    constant = float(np.ptp(logs)) <= _SAME_LOG_RATIO
    if constant:
        p = 1.0 if abs(interval.mean) <= _SAME_LOG_RATIO else 0.0
        low = high = interval.mean
    else:
        p = float(_scipy.ttest_1samp(logs, 0.0).pvalue)
    return (Comparison(n_a=n, n_b=n, mean_a=None, mean_b=None, relative=math.expm1(interval.mean),
                       low=math.expm1(low), high=math.expm1(high), confidence=CONFIDENCE,
                       p_value=p, alpha=ALPHA, significant=p < ALPHA, constant=constant,
                       verdict=""),
            "pairs", excluded, sd)


def _pairs_verdict(c: Comparison, excluded: int, estimate: "_Estimate | None" = None) -> str:
    """The verdict of a gain over several pairs (or paired by round), worded as
    ``stats.compare`` words its own."""
    assert c.relative is not None and c.low is not None and c.high is not None
    assert c.p_value is not None
    head = f"{percent_text(c.relative)} %"
    paired = estimate is not None and estimate.method == "rounds"
    if paired:
        assert estimate is not None
        unit = f"{c.n_a} rounds, paired by round"
        if c.constant:
            detail = f"the same in each of {c.n_a} rounds, paired by round"
        else:
            boot = " (bootstrap: skewed)" if estimate.interval == "bootstrap" else ""
            detail = (f"{c.confidence * 100:g} % CI{boot} {percent_text(c.low)} … "
                      f"{percent_text(c.high)} % over {unit}")
        if estimate.rounds_excluded:
            detail += f"; {estimate.rounds_excluded} rounds left out, a side missing"
    elif c.constant:
        detail = f"the same in each of {c.n_a} pairs"
    else:
        detail = (f"{c.confidence * 100:g} % CI {percent_text(c.low)} … {percent_text(c.high)} % "
                  f"over {c.n_a} pairs")
    if excluded:
        detail += f"; {excluded} more left out, a mean of 0"
    test = (f"t-test of per-round log ratios p{p_text(c.p_value, c.alpha)}" if paired else
            f"t-test of log ratios p{p_text(c.p_value, c.alpha)}")
    if c.adjustment is not None and c.adjusted_p is not None:
        test += (f", {ADJUSTMENT_NAMES[c.adjustment]}-adjusted p{p_text(c.adjusted_p, c.alpha)}"
                 f" across {c.family} comparison{'s' if c.family != 1 else ''}")
    if not c.significant:
        return f"no significant difference ({head}, {detail}, {test})"
    return f"{head} ({detail}), significant ({test})"


def _no_pairs(axis: str, level: str, reference: str, metric: str) -> Gain:
    return Gain(axis=axis, level=level, reference=reference, metric=metric, held={}, iodepth=None,
                pairs=0, relative=None, low=None, high=None, p_value=None, adjusted_p=None,
                significant=False, method="none",
                verdict=f"no matched pairs: no configuration with {axis}={level} has a twin with "
                        f"{axis}={reference} measured on the same workload")


_GAINS: dict[tuple[object, ...], tuple[StoredRun, list[Gain]]] = {}
_GAINS_SIZE = 256


def gains(run: StoredRun, axis: str, *, metric: str = "iops", reference: str | None = None,
          by: tuple[str, ...] = ("iodepth",), hold: tuple[str, ...] = (),
          adjustment: Adjustment = "holm", paired: bool = True) -> list[Gain]:
    """Gain of every non-reference level of ``axis`` over ``reference``, one per group of matched
    pairs (``by`` × ``hold``), adjusted for multiple comparisons as one family; groups without a
    pair are absent. Ordered by level, held levels, then the ``by`` values (ascending).
    ``paired=False`` uses the unpaired methods even where rounds are known (for comparison).

    A stored run is immutable: answers are kept per run object (held, so that its id is not
    reused), since the report, ``overall`` and ``recommend`` ask the same questions again."""
    key = (id(run), axis, metric, reference, tuple(by), tuple(hold), adjustment, paired)
    cached = _GAINS.get(key)
    if cached is not None and cached[0] is run:
        return list(cached[1])
    found = _gains(run, axis, metric=metric, reference=reference, by=tuple(by), hold=tuple(hold),
                   adjustment=adjustment, paired=paired)
    if len(_GAINS) >= _GAINS_SIZE:
        _GAINS.pop(next(iter(_GAINS)))
    _GAINS[key] = (run, found)
    return list(found)


def _checked_axes(run: StoredRun, axis: str, by: tuple[str, ...],
                  hold: tuple[str, ...]) -> dict[str, list[str]]:
    """The run's axes (``axes_of``), once ``by`` and ``hold`` are found to name what can be
    grouped by and held; raises AnalysisError for the first that does not."""
    for field in by:
        if field not in BY:
            raise AnalysisError(f"cannot group by {field!r}", hint=f"group by {', '.join(BY)}")
    axes = axes_of(run)
    for other in hold:
        if other == axis:
            raise AnalysisError(f"{axis} is the axis measured: it cannot also be held")
        if other not in axes and other != "mode":
            raise AnalysisError(f"run {run.id}: cannot hold {other!r}, not an axis with two or "
                                "more levels", hint=f"axes of run {run.id}: {', '.join(axes)}")
    return axes


def _gains(run: StoredRun, axis: str, *, metric: str, reference: str | None,
           by: tuple[str, ...], hold: tuple[str, ...], adjustment: Adjustment,
           paired: bool = True) -> list[Gain]:
    get_metric(metric)   # raises for an unknown name
    levels = _axis_levels(run, axis)
    reference = default_reference(axis, levels) if reference is None else reference
    _check_level(run, axis, reference, levels)
    axes = _checked_axes(run, axis, by, hold)
    by_round = round_values(run, metric) if paired and rounds_known(run) else None
    workload_order = {w.key: i for i, w in enumerate(run.workloads)}
    rw_order = {rw: i for i, rw in enumerate(dict.fromkeys(w.rw for w in run.workloads))}
    held_order = {a: {v: i for i, v in enumerate(axes.get(a, []))} for a in hold}
    columns = _columns(run, metric)
    by_workloads = _workload_groups(run, by)
    groups: dict[tuple[str, tuple[str, ...], tuple[object, ...]], _Group] = {}
    for level in levels:
        if level == reference:
            continue
        for ref, config in twins(run, axis, level, reference):
            held = tuple(config.mode if a == "mode" else config.params.get(a, "n/a")
                         for a in hold)
            r, o = columns.row[ref.key], columns.row[config.key]
            both = columns.present[r] & columns.present[o]
            for group_key, workloads in by_workloads.items():
                found = workloads[both[workloads]]
                if not len(found):
                    continue
                group = groups.get((level, held, group_key))
                if group is None:
                    group = groups[(level, held, group_key)] = _Group(columns)
                group.ref += [r] * len(found)
                group.other += [o] * len(found)
                group.workload += found.tolist()
                group.ma += columns.means[r, found].tolist()
                group.mb += columns.means[o, found].tolist()
    if by_round is not None:
        keys_of = [c.key for c in run.configs]
        for group in groups.values():
            wkeys = [run.workloads[w].key for w in group.workload]
            group.ra = [by_round.get((keys_of[r], wk), {}) for r, wk in zip(group.ref, wkeys)]
            group.rb = [by_round.get((keys_of[o], wk), {}) for o, wk in zip(group.other, wkeys)]

    def order(key: tuple[str, tuple[str, ...], tuple[object, ...]]) -> tuple[object, ...]:
        level, held, group = key
        by_rank = [workload_order[v] if f == "workload" else rw_order[v] if f == "rw" else v
                   for f, v in zip(by, group, strict=True)]
        held_rank = [held_order[a].get(v, len(held_order[a])) for a, v in zip(hold, held, strict=True)]
        return (levels.index(level), held_rank, held, by_rank)

    keys = sorted(groups, key=order)
    computed = [_estimate(groups[k]) for k in keys]
    adjusted = adjust([e.comparison for e in computed], adjustment)
    out = []
    for key, c, e in zip(keys, adjusted, computed, strict=True):
        level, held, group = key
        method, excluded = e.method, e.excluded
        pairs = groups[key]
        fields = dict(zip(by, group, strict=True))
        one = run.workloads[pairs.workload[0]] if "workload" in fields else None
        verdict = _pairs_verdict(c, excluded, e) if method in ("pairs", "rounds") else (
            "no usable pair: every pair has a mean of 0 on one side" if method == "none" else c.verdict)
        out.append(Gain(
            axis=axis, level=level, reference=reference, metric=metric,
            held=dict(zip(hold, held, strict=True)),
            iodepth=one.iodepth if one else fields.get("iodepth"),  # type: ignore[arg-type]
            bs=one.bs if one else fields.get("bs"),  # type: ignore[arg-type]
            rw=one.rw if one else fields.get("rw"),  # type: ignore[arg-type]
            workload=one.key if one else None,
            pairs=len(pairs) - excluded, excluded=excluded, relative=c.relative, low=c.low,
            high=c.high, p_value=c.p_value, adjusted_p=c.adjusted_p, adjustment=c.adjustment,
            family=c.family, significant=c.significant, method=method,  # type: ignore[arg-type]
            rounds=e.rounds, rounds_excluded=e.rounds_excluded,
            interval=e.interval, mde=e.mde, verdict=verdict))  # type: ignore[arg-type]
    return out


def overall(run: StoredRun, axis: str, level: str, *, metric: str = "iops",
            reference: str | None = None) -> Gain:
    """One gain of ``level`` over ``reference`` across every matched pair of the run (all
    workloads, all other axes); its p-value is adjusted across the axis's non-reference levels.
    With no matched pair, a Gain with pairs=0 whose verdict says so."""
    get_metric(metric)   # raises for an unknown name
    levels = _axis_levels(run, axis)
    reference = default_reference(axis, levels) if reference is None else reference
    _check_level(run, axis, reference, levels)
    _check_level(run, axis, level, levels)
    if level == reference:
        raise AnalysisError(f"{axis}={level} is the reference: compare another level with it",
                            hint=f"levels of {axis}: {', '.join(levels)}")
    found = next((g for g in gains(run, axis, metric=metric, reference=reference, by=())
                  if g.level == level), None)
    return found if found is not None else _no_pairs(axis, level, reference, metric)
