"""Statistics over the samples of one point (pure: no I/O, no global state, seeded randomness).

Samples are the per-trial figures of one (configuration, workload), e.g. IOPS of each repetition.
Every function assumes the samples are independent draws of the same quantity; none can repair
drift (a disk warming up, a page cache filling) — that shows as extra spread, not as bias we catch.

- ``mean``, ``stdev``, ``skewness``: the summary numbers.
- ``t_interval``, ``bootstrap_interval``, ``confidence_interval``: how sure we are of a mean.
- ``outliers``: which samples sit outside Tukey's fences.
- ``compare`` and ``adjust``: is configuration B different from A on a workload, and does that hold
  up across the whole matrix. A difference is never returned as a bare ratio: its verdict says
  "no significant difference" when that is the answer.
- ``log_ratio_test`` and ``minimal_detectable``: the mean of log ratios (per round, for gains
  paired by round; per pair) with its interval and test, and the smallest effect n of them
  detect; ``analysis.effects`` builds gains on them.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any, Literal

import numpy as np
from iomatrix.core.model import Frozen
from scipy import stats as _scipy

# Sample-size and skew thresholds of the t/bootstrap switch; see ``confidence_interval``.
_BOOTSTRAP_MIN_N = 8
_BOOTSTRAP_MIN_SKEW = 1.0
# Tukey's fence factor: 1.5 × IQR marks "outside" values on a box plot.
_TUKEY_K = 1.5
_OUTLIER_MIN_N = 4
# Bootstrap resampling works on blocks of at most this many drawn indices, bounding memory.
_BLOCK = 1 << 20
_MINUS = "\u2212"


class Interval(Frozen):
    """A confidence interval of a mean. ``method`` "none" (n < 2): the bounds are unknown (None).

    ``half_width`` is (high − low) / 2, which for an asymmetric bootstrap interval is not the
    distance from the mean to either bound. ``relative`` is half_width / |mean|; None when the
    mean is 0 or the bounds are unknown.
    """

    mean: float
    low: float | None
    high: float | None
    half_width: float | None
    relative: float | None
    method: Literal["t", "bootstrap", "none"]
    n: int
    confidence: float


Adjustment = Literal["holm", "bh"]


class Comparison(Frozen):
    """B against A on one workload: relative difference of means, its CI, Welch's test, verdict.

    ``relative`` is mean_b / mean_a − 1; ``low``/``high`` its confidence bounds (None when
    unbounded or unavailable). ``p_value`` is Welch's two-sided p; ``adjusted_p`` the
    multiple-comparison adjusted one once ``adjust`` has run (``adjustment`` names the method and
    ``family`` the number of comparisons adjusted together). ``significant`` uses the adjusted
    p-value when there is one. ``verdict`` is the one line to show wherever the difference is shown.
    """

    n_a: int
    n_b: int
    mean_a: float | None
    mean_b: float | None
    relative: float | None
    low: float | None
    high: float | None
    confidence: float
    p_value: float | None
    alpha: float
    adjusted_p: float | None = None
    adjustment: Adjustment | None = None
    family: int | None = None
    significant: bool
    constant: bool = False
    verdict: str


@functools.lru_cache(maxsize=4096)
def _t_quantile(q: float, df: float) -> float:
    """Student's t quantile (scipy's ppf costs ~0.1 ms a call: tens of thousands per report)."""
    return float(_scipy.t.ppf(q, df))


def _array(xs: Sequence[float]) -> np.ndarray:
    arr = np.asarray(xs, dtype=float)
    if arr.ndim != 1:
        raise ValueError("samples must be a flat sequence of numbers")
    if not np.all(np.isfinite(arr)):
        raise ValueError("samples must be finite numbers (no NaN or infinity)")
    return arr


def _summary(xs: Sequence[float]) -> tuple[int, float, float, bool]:
    """n, mean, sample standard deviation (0.0 below 2 samples) and whether all are equal, in
    plain Python: the samples of a point are few, and numpy's per-call cost (~20 µs) dominated
    reports of 10,000 points. Same validation as ``_array``; the mean is exact (``math.fsum``)."""
    try:
        vals = [float(x) for x in xs]
    except TypeError:
        raise ValueError("samples must be a flat sequence of numbers") from None
    if not all(math.isfinite(v) for v in vals):
        raise ValueError("samples must be finite numbers (no NaN or infinity)")
    n = len(vals)
    if n == 0:
        return 0, math.nan, 0.0, False
    first = vals[0]
    if all(v == first for v in vals):
        return n, first, 0.0, True
    m = math.fsum(vals) / n
    sd = math.sqrt(math.fsum((v - m) ** 2 for v in vals) / (n - 1)) if n > 1 else 0.0
    return n, m, sd, False


def _nonempty(xs: Sequence[float]) -> np.ndarray:
    arr = _array(xs)
    if arr.size == 0:
        raise ValueError("no samples")
    return arr


def _check_level(name: str, value: float) -> None:
    if not 0.0 < value < 1.0:
        raise ValueError(f"{name} must be strictly between 0 and 1, got {value!r}")


def _constant(arr: np.ndarray) -> bool:
    # Exact test: numpy's variance of equal floats can come out as 1e-34 rather than 0.
    return bool(arr.size > 0 and np.all(arr == arr[0]))


def _mean(arr: np.ndarray) -> float:
    return float(arr[0]) if _constant(arr) else float(np.mean(arr))


def _stdev(arr: np.ndarray) -> float:
    return 0.0 if _constant(arr) else float(np.std(arr, ddof=1))


def mean(xs: Sequence[float]) -> float:
    """Arithmetic mean of the samples; ValueError when there are none."""
    return _mean(_nonempty(xs))


def stdev(xs: Sequence[float]) -> float:
    """Sample standard deviation (Bessel's n − 1 denominator); ValueError below two samples.

    Exactly 0.0 when all samples are equal.
    """
    arr = _array(xs)
    if arr.size < 2:
        raise ValueError(f"the sample standard deviation needs at least 2 samples, got {arr.size}")
    return _stdev(arr)


def skewness(xs: Sequence[float]) -> float:
    """Adjusted Fisher–Pearson skewness G1 = g1·√(n(n−1))/(n−2); ValueError below three samples.

    G1 is the sample-size-corrected third standardised moment (what spreadsheets and
    ``scipy.stats.skew(bias=False)`` report). It is itself noisy: its standard error is about
    √(6/n), ≈0.87 at n = 8, so small samples give only a rough reading. Constant samples give 0.0.
    """
    arr = _array(xs)
    n = arr.size
    if n < 3:
        raise ValueError(f"skewness needs at least 3 samples, got {n}")
    if _constant(arr):
        return 0.0
    dev = arr - arr.mean()
    m2 = float(np.mean(dev ** 2))
    m3 = float(np.mean(dev ** 3))
    g1 = m3 / m2 ** 1.5
    return g1 * math.sqrt(n * (n - 1)) / (n - 2)


def _relative(half_width: float, centre: float) -> float | None:
    return half_width / abs(centre) if centre != 0 else None


def _unknown(arr: np.ndarray, confidence: float) -> Interval:
    return Interval(mean=_mean(arr), low=None, high=None, half_width=None, relative=None,
                    method="none", n=int(arr.size), confidence=confidence)


def t_interval(xs: Sequence[float], confidence: float = 0.95) -> Interval:
    """Student-t interval of the mean: x̄ ± t(1−(1−c)/2; n−1) · s/√n.

    Exact when the samples are normal and independent; for other shapes it relies on the central
    limit theorem, so with few, skewed samples its coverage falls short of ``confidence`` on the
    long-tail side. n < 2 gives method "none" (no spread, no interval); ValueError when empty.
    """
    return t_interval_sd(xs, confidence)[0]


def t_interval_sd(xs: Sequence[float], confidence: float = 0.95) -> tuple[Interval, float]:
    """``t_interval`` and the samples' standard deviation (0.0 below 2 samples or when all are
    equal), from one pass over them: a gain's interval and its minimal detectable effect rest
    on the same tens of thousands of log ratios."""
    _check_level("confidence", confidence)
    n, centre, sd, _ = _summary(xs)
    if n == 0:
        raise ValueError("no samples")
    if n < 2:
        return Interval(mean=centre, low=None, high=None, half_width=None, relative=None,
                        method="none", n=n, confidence=confidence), sd
    hw = _t_half_width(n, sd, confidence)
    return Interval(mean=centre, low=centre - hw, high=centre + hw, half_width=hw,
                    relative=_relative(hw, centre), method="t", n=n, confidence=confidence), sd


def _t_half_width(n: int, sd: float, confidence: float) -> float:
    return _t_quantile(0.5 + confidence / 2, n - 1) * sd / math.sqrt(n)


def bootstrap_interval(xs: Sequence[float], confidence: float = 0.95, resamples: int = 10_000,
                       seed: int = 0) -> Interval:
    """Percentile bootstrap interval of the mean, expanded for small samples (Hesterberg 2015).

    Draws ``resamples`` resamples with replacement (seeded, so reproducible) and takes quantiles
    of their means. The plain percentile interval uses the (1−c)/2 and (1+c)/2 quantiles and is
    too narrow for small n: it ignores the n−1 correction and cannot reach beyond the samples
    (simulated: ≈ 85 % coverage at n = 5 and ≈ 88 % at n = 8 for a nominal 95 % on normal data).
    The expanded form takes the α′/2 and 1 − α′/2 quantiles with
    α′/2 = Φ(−√(n/(n−1)) · t(1−(1−c)/2; n−1)), which matches the t-interval's width on normal
    data and keeps the bootstrap's asymmetry on skewed data.

    Limits: it is still an approximation. On strongly skewed data (lognormal, σ = 1) a nominal
    95 % covers ≈ 85 % at n = 10 and ≈ 90 % at n = 40 — a little better than the t-interval, not
    exact; with 2–4 samples it is essentially the range of the samples. Its half-width is half
    the interval's length; the mean need not sit in the middle. n < 2 gives method "none".
    """
    _check_level("confidence", confidence)
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, got {resamples}")
    arr = _nonempty(xs)
    n = arr.size
    if n < 2:
        return _unknown(arr, confidence)
    centre = _mean(arr)
    if _constant(arr):
        low = high = centre
    else:
        rng = np.random.default_rng(seed)
        rows = max(1, _BLOCK // n)
        means = np.concatenate([
            arr[rng.integers(0, n, size=(min(rows, resamples - start), n))].mean(axis=1)
            for start in range(0, resamples, rows)
        ])
        tail = float(_scipy.norm.cdf(-math.sqrt(n / (n - 1))
                                     * _t_quantile(0.5 + confidence / 2, n - 1)))
        low, high = (float(q) for q in np.quantile(means, [tail, 1 - tail]))
    hw = (high - low) / 2
    return Interval(mean=centre, low=low, high=high, half_width=hw,
                    relative=_relative(hw, centre), method="bootstrap", n=n,
                    confidence=confidence)


def is_skewed(xs: Sequence[float]) -> bool:
    """The bootstrap switch: n ≥ 8 and |adjusted Fisher–Pearson skewness| > 1."""
    return len(xs) >= _BOOTSTRAP_MIN_N and abs(skewness(xs)) > _BOOTSTRAP_MIN_SKEW


def confidence_interval(xs: Sequence[float], confidence: float = 0.95, seed: int = 0) -> Interval:
    """The interval to show for a mean: the bootstrap interval when the samples are skewed, else t.

    Rule: ``bootstrap_interval`` when n ≥ 8 and |G1| > 1 (G1 = adjusted Fisher–Pearson skewness;
    |G1| > 1 is the usual "highly skewed" mark), ``t_interval`` otherwise. Below 8 samples G1 is
    too noisy to act on (standard error ≈ √(6/n)) and the bootstrap is little more than the range
    of the samples, so t is used. For skewed samples the bootstrap gives asymmetric bounds (longer
    on the tail side) and covers slightly better than t, but neither reaches the nominal level
    for small n: see ``bootstrap_interval``.
    """
    if is_skewed(xs):
        return bootstrap_interval(xs, confidence, seed=seed)
    return t_interval(xs, confidence)


def interval_bounds(xs: Sequence[float], confidence: float = 0.95) -> tuple[float | None,
                                                                          float | None]:
    """``confidence_interval(xs)``'s low and high ((None, None) below 2 samples), without the
    Interval: a report asks for three of them per point."""
    if len(xs) < 2:
        return None, None
    if is_skewed(xs):
        ci = bootstrap_interval(xs, confidence)
        return ci.low, ci.high
    _check_level("confidence", confidence)
    n, centre, sd, _ = _summary(xs)
    hw = _t_half_width(n, sd, confidence)
    return centre - hw, centre + hw


def outliers(xs: Sequence[float]) -> tuple[bool, ...]:
    """Flags for samples outside Tukey's fences [Q1 − 1.5·IQR, Q3 + 1.5·IQR]; none below 4 samples.

    Why Tukey rather than median ± k·MAD: the fences assume no distribution (the MAD's usual 1.4826
    scale assumes normal data, and IOPS samples are often skewed), and they flag exactly the
    points a box plot of the same samples draws as dots. Quartiles are numpy's linear
    interpolation (Hyndman–Fan type 7). Limits: with 4–7 samples the quartiles are coarse and a
    single wild value widens the IQR it is judged by; if more than half the samples tie, the IQR
    is 0 and every differing value is flagged. A flag means "look at this trial", not "drop it".
    """
    arr = _array(xs)
    if arr.size < _OUTLIER_MIN_N:
        return (False,) * arr.size
    q1, q3 = (float(q) for q in np.percentile(arr, [25, 75]))
    reach = _TUKEY_K * (q3 - q1)
    return tuple(bool(x < q1 - reach or x > q3 + reach) for x in arr)


def _welch_df(va: float, vb: float, n_a: int, n_b: int, r: float) -> float:
    # Welch–Satterthwaite df of the pivot mean_b − r·mean_a; va, vb are variances of the means.
    num = (vb + r * r * va) ** 2
    den = vb * vb / (n_b - 1) + (r * r * va) ** 2 / (n_a - 1)
    # den = 0 only when B is constant at 0 (R = 0, vb = 0): then only A contributes, df = n_a − 1.
    return num / den if den > 0 else float(n_a - 1)


def _fieller(ma: float, mb: float, va: float, vb: float,
             t: float) -> tuple[float, float] | None:
    """Fieller's bounds for mean_b/mean_a at the t quantile ``t``, or None when the confidence
    set is unbounded."""
    # r is inside the set when (mb − r·ma)² ≤ t²(vb + r²·va): a quadratic a·r² + b·r + c ≤ 0.
    a = ma * ma - t * t * va
    if a <= 0:  # mean_a is not clearly away from 0: the set is unbounded
        return None
    disc = max(t * t * (va * mb * mb + vb * a), 0.0)
    root = math.sqrt(disc)
    return (ma * mb - root) / a, (ma * mb + root) / a


def percent_text(x: float) -> str:
    return f"{x * 100:+.1f}".replace("-", _MINUS)


def p_text(p: float, alpha: float) -> str:
    if p == 0:
        return "=0"
    if p < 0.001:
        return "<0.001"
    text = f"{p:.2g}"
    if (float(text) < alpha) != (p < alpha):  # rounding would hide which side of alpha p is on
        text = f"{p:.3g}"
    return "=" + text


ADJUSTMENT_NAMES = {"holm": "Holm", "bh": "Benjamini–Hochberg"}


def _verdict(c: Comparison | SimpleNamespace) -> str:
    if c.p_value is None:
        return f"not enough samples to compare (n={c.n_a} vs n={c.n_b}; need at least 2 each)"
    if c.adjustment is not None and c.adjusted_p is not None:
        adjusted = (f", {ADJUSTMENT_NAMES[c.adjustment]}-adjusted p{p_text(c.adjusted_p, c.alpha)}"
                    f" across {c.family} comparison{'s' if c.family != 1 else ''}")
    else:
        adjusted = ""
    level = f"{c.confidence * 100:g} %"
    if c.relative is None:
        effect = "relative difference undefined: mean of A is 0"
    elif c.constant:
        effect = f"{percent_text(c.relative)} %, no variation on either side"
    elif c.low is None or c.high is None:
        effect = f"{percent_text(c.relative)} %, {level} CI unbounded: A is too noisy to divide by"
    else:
        effect = f"{percent_text(c.relative)} %, {level} CI {percent_text(c.low)} … {percent_text(c.high)} %"
    if not c.significant:
        return f"no significant difference ({effect}, p{p_text(c.p_value, c.alpha)}{adjusted})"
    head, _, rest = effect.partition(", ")
    where = f"{head} ({rest})" if rest else head
    return f"{where}, significant (Welch p{p_text(c.p_value, c.alpha)}{adjusted})"


def compare(a: Sequence[float], b: Sequence[float], *, confidence: float = 0.95,
            alpha: float = 0.05) -> Comparison:
    """B against A: relative difference of means with a Fieller CI, Welch's t-test and a verdict.

    - Relative difference: mean_b / mean_a − 1.
    - CI: Fieller's theorem for the ratio of means of two independent samples, with variances
      not assumed equal and the Welch–Satterthwaite degrees of freedom of the pivot
      mean_b − R·mean_a taken at the estimate R (an approximation: the exact df varies along the
      interval). Unlike the delta method, Fieller's interval is asymmetric as a ratio should be
      and admits when the baseline is too noisy for a ratio: if mean_a is not significantly
      away from 0 the set is unbounded and ``low``/``high`` are None.
    - Test: Welch's two-sided t-test (``scipy.stats.ttest_ind(b, a, equal_var=False)``, computed
      from the means and standard deviations); ``significant`` is p < alpha. Test and CI share
      the pivot, so they agree except at the margin where the two df values differ (simulated
      with 2–9 samples a side: disagreements only for p between about 0.03 and 0.07). An
      unbounded CI can still come with a significant test: Fieller's set is then two rays that
      exclude "no difference".
    - Fewer than 2 samples on either side: no estimate at all (an unqualified ratio is what the
      verdict exists to avoid), p None, not significant.
    - Both sides constant: equal constants give p = 1 (no difference); different constants give
      p = 0, significant, and a zero-width CI — the t statistic is infinite. That is the limit of
      the test, but constant samples usually mean a counter that did not measure, so the verdict
      says "no variation on either side".
    - mean_a = 0: the relative difference is undefined (None); the test still runs.
    Independence of the trials is assumed; trials run back to back can correlate.
    """
    return compare_many([(a, b)], confidence=confidence, alpha=alpha)[0]


def compare_many(pairs: Sequence[tuple[Sequence[float], Sequence[float]]], *,
                 confidence: float = 0.95, alpha: float = 0.05,
                 adjustment: Adjustment | None = None) -> tuple[Comparison, ...]:
    """``compare`` of each (a, b), in order, then ``adjust``ed together when ``adjustment`` is
    given: the same Comparisons, with Welch's test and the t quantiles computed for the whole
    batch at once (a run of 10,000 points makes 10,000 comparisons)."""
    _check_level("confidence", confidence)
    _check_level("alpha", alpha)
    if adjustment is not None and adjustment not in ADJUSTMENT_NAMES:
        raise ValueError(f"unknown adjustment {adjustment!r}; "
                         f"use one of: {', '.join(ADJUSTMENT_NAMES)}")
    # one sequence is often on the A side of many pairs (bare metal's samples, in efficiency)
    summaries: dict[int, tuple[int, float, float, bool]] = {}

    def summary(xs: Sequence[float]) -> tuple[int, float, float, bool]:
        found = summaries.get(id(xs))    # ``pairs`` holds every xs: no id is reused meanwhile
        if found is None:
            found = summaries[id(xs)] = _summary(xs)
        return found

    rows = [(*summary(a), *summary(b)) for a, b in pairs]
    # Welch's test from summary statistics, so that a constant side has a standard deviation of
    # exactly 0 (ttest_ind recomputes it and warns about cancellation); otherwise the same test.
    tested = [i for i, (n_a, _, _, const_a, n_b, _, _, const_b) in enumerate(rows)
              if n_a >= 2 and n_b >= 2 and not (const_a and const_b)]
    p_values: dict[int, float] = {}
    bounds: dict[int, tuple[float, float] | None] = {}
    if tested:
        n_a, ma, sa, _, n_b, mb, sb, _ = (np.array(col, dtype=float)
                                          for col in zip(*(rows[i] for i in tested)))
        ps = _scipy.ttest_ind_from_stats(mb, sb, n_b, ma, sa, n_a, equal_var=False).pvalue
        p_values = dict(zip(tested, (float(p) for p in np.atleast_1d(ps)), strict=True))
        # Fieller's bounds where the ratio is defined, with one t quantile call for all of them
        fieller = [i for i in tested if rows[i][1] != 0]
        moments = {}
        for i in fieller:
            na, a_mean, a_sd, _, nb, b_mean, b_sd, _ = rows[i]
            va, vb = a_sd * a_sd / na, b_sd * b_sd / nb
            moments[i] = (a_mean, b_mean, va, vb,
                          _welch_df(va, vb, na, nb, b_mean / a_mean))
        if fieller:
            ts = np.atleast_1d(_scipy.t.ppf(0.5 + confidence / 2,
                                            np.array([moments[i][4] for i in fieller])))
            bounds = {i: _fieller(*moments[i][:4], float(t)) for i, t in zip(fieller, ts, strict=True)}
    out: list[dict[str, Any]] = []
    for i, (n_a, ma, _, const_a, n_b, mb, _, const_b) in enumerate(rows):
        sides = dict(n_a=n_a, n_b=n_b, mean_a=ma if n_a else None, mean_b=mb if n_b else None,
                     confidence=confidence, alpha=alpha)
        if n_a < 2 or n_b < 2:
            out.append(dict(sides, relative=None, low=None, high=None, p_value=None,
                            significant=False))
            continue
        relative = mb / ma - 1 if ma != 0 else None
        constant = const_a and const_b
        low = high = None
        if constant:
            p = 1.0 if ma == mb else 0.0
            low = high = relative
        else:
            p = p_values[i]
            found = bounds.get(i)
            if found is not None:
                low, high = found[0] - 1, found[1] - 1
        out.append(dict(sides, relative=relative, low=low, high=high, p_value=p,
                        significant=p < alpha, constant=constant))
    if adjustment is not None:
        _adjust_fields(out, adjustment)
    return tuple(_made(fields) for fields in out)


def _made(fields: dict[str, Any]) -> Comparison:
    """The Comparison of ``fields`` with the verdict they call for (validated once)."""
    # the fields as attributes, for _verdict to read (model_construct costs three validations)
    draft = SimpleNamespace(**({"adjusted_p": None, "adjustment": None, "family": None,
                                "constant": False} | fields))
    return Comparison(**fields, verdict=_verdict(draft))


def _holm(ps: np.ndarray) -> np.ndarray:
    m = ps.size
    order = np.argsort(ps, kind="stable")
    stepped = np.maximum.accumulate(np.minimum(1.0, (m - np.arange(m)) * ps[order]))
    out = np.empty(m)
    out[order] = stepped
    return out


def _bh(ps: np.ndarray) -> np.ndarray:
    m = ps.size
    order = np.argsort(ps, kind="stable")
    scaled = ps[order] * m / np.arange(1, m + 1)
    stepped = np.minimum(1.0, np.minimum.accumulate(scaled[::-1])[::-1])
    out = np.empty(m)
    out[order] = stepped
    return out


def adjust(comparisons: Sequence[Comparison],
           method: Adjustment = "holm") -> tuple[Comparison, ...]:
    """The comparisons of one matrix with p-values adjusted for multiple comparisons, in order.

    - "holm": Holm–Bonferroni step-down; controls the family-wise error rate (the chance of any
      false "significant") under any dependence between the comparisons.
    - "bh": Benjamini–Hochberg step-up; controls the false discovery rate (the expected share of
      false ones among those called significant). Proven for independent or positively dependent
      tests, which comparisons against a shared baseline usually are; more power than Holm.
    The family is the comparisons that have a p-value (those with too few samples pass through
    unchanged). Adjustment always starts from the raw Welch p-values, so adjusting again replaces
    the previous adjustment. ``significant`` becomes adjusted p < alpha; the CIs stay
    per-comparison (not simultaneous) intervals, so near the threshold a CI may exclude 0 while
    the adjusted verdict says "no significant difference".
    """
    if method not in ADJUSTMENT_NAMES:
        raise ValueError(f"unknown adjustment {method!r}; "
                         f"use one of: {', '.join(ADJUSTMENT_NAMES)}")
    out = [{k: v for k, v in c if k != "verdict"} for c in comparisons]
    _adjust_fields(out, method)
    return tuple(_made(fields) if c.p_value is not None else c
                 for fields, c in zip(out, comparisons, strict=True))


def _adjust_fields(comparisons: list[dict[str, Any]], method: Adjustment) -> None:
    """``adjust`` on the fields of comparisons, in place."""
    tested = [c for c in comparisons if c["p_value"] is not None]
    if not tested:
        return
    ps = np.array([c["p_value"] for c in tested], dtype=float)
    adjusted = _holm(ps) if method == "holm" else _bh(ps)
    for c, q in zip(tested, adjusted, strict=True):
        c.update(adjusted_p=float(q), adjustment=method, family=len(tested),
                 significant=bool(q < c["alpha"]))


class LogRatioTest(Frozen):
    """The mean of some log ratios (one per round, or one per pair) with its confidence interval
    and a one-sample t-test against 0. ``interval.method`` says which interval: "t", or
    "bootstrap" when the log ratios are skewed (``is_skewed``: n ≥ 8 and |G1| > 1). ``constant``:
    every log ratio equal up to rounding (then the interval has no width and p is 1 or 0)."""

    interval: Interval
    p_value: float
    constant: bool
    sd: float
    """Standard deviation of the log ratios (0.0 when constant)."""


# Log ratios closer than this are equal up to floating-point rounding (1e-12 ≈ 1e-10 %).
_SAME_LOG_RATIO = 1e-12


def log_ratio_test(logs: Sequence[float], confidence: float = 0.95,
                   seed: int = 0) -> LogRatioTest:
    """Interval and test of the mean of ``logs`` (at least 2 values).

    Interval: ``confidence_interval`` (Student t; the expanded percentile bootstrap when the
    values are skewed: n ≥ 8 and |G1| > 1). Test: one-sample t-test of the values against 0,
    whichever interval is shown (the bootstrap gives no p-value of its own; the t-test's
    validity rests on the mean of n log ratios being near normal, which is why skew switches
    the interval and not the test). Values equal up to rounding: zero-width interval at their
    value, p = 1 when that is 0, else 0 (as ``compare`` treats constant samples)."""
    _check_level("confidence", confidence)
    n, centre, sd, _ = _summary(logs)
    if n < 2:
        raise ValueError(f"a log-ratio test needs at least 2 values, got {n}")
    if max(logs) - min(logs) <= _SAME_LOG_RATIO:
        p = 1.0 if abs(centre) <= _SAME_LOG_RATIO else 0.0
        interval = Interval(mean=centre, low=centre, high=centre, half_width=0.0,
                            relative=0.0 if centre else None, method="t", n=n,
                            confidence=confidence)
        return LogRatioTest(interval=interval, p_value=p, constant=True, sd=0.0)
    interval = confidence_interval(logs, confidence, seed=seed)
    t = centre / (sd / math.sqrt(n))
    p = float(2 * _scipy.t.sf(abs(t), n - 1))
    return LogRatioTest(interval=interval, p_value=p, constant=False, sd=sd)


def minimal_detectable(sd: float, n: int, *, alpha: float = 0.05, power: float = 0.8) -> float | None:
    """The smallest true mean (on the scale of ``sd``) that a two-sided one-sample t-test at
    ``alpha`` detects with probability ``power``, from n values of standard deviation ``sd``:
    (t(1 − α/2; n−1) + t(power; n−1)) · sd/√n (the usual approximation of the noncentral t).
    None below 2 values."""
    if n < 2:
        return None
    return (_t_quantile(1 - alpha / 2, n - 1) + _t_quantile(power, n - 1)) * sd / math.sqrt(n)
