"""Statistics: textbook values, scipy cross-checks, simulated coverage, and the verdict texts."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import optimize as scipy_optimize
from scipy import stats as scipy_stats

from iomatrix.analysis.stats import (
    Comparison,
    adjust,
    bootstrap_interval,
    compare,
    confidence_interval,
    is_skewed,
    mean,
    outliers,
    skewness,
    stdev,
    t_interval,
)

XS = [9.9, 10.1, 10.0, 10.2, 9.8]

# R's t.test(ts1, ts2) prints: t = -1.8325, df = 17.9, p-value = 0.08356,
# 95 percent confidence interval -2.1469104 0.1469104.
TS1 = [11, 9, 10, 11, 10, 12, 9, 11, 12, 9]
TS2 = [11, 13, 10, 13, 12, 9, 11, 12, 12, 11]

# Wikipedia, "Welch's t-test", examples 1 and 2: Welch p = 0.021 (df 24.99), 0.149 (df 9.91).
WIKI_1 = ([27.5, 21.0, 19.0, 23.6, 17.0, 17.9, 16.9, 20.1, 21.9, 22.6, 23.1, 19.6, 19.0, 21.7,
           21.4],
          [27.1, 22.0, 20.8, 23.4, 23.4, 23.5, 25.8, 22.0, 24.8, 20.2, 21.9, 22.1, 22.9, 20.5,
           24.4])
WIKI_2 = ([17.2, 20.9, 22.6, 18.1, 21.7, 21.4, 23.5, 24.2, 14.7, 21.8],
          [21.5, 22.8, 21.0, 23.0, 21.6, 23.6, 22.5, 20.7, 23.4, 21.8, 20.7, 21.7, 21.5, 22.5,
           23.6, 21.5, 22.5, 23.5, 21.5, 21.8])

iops = st.floats(min_value=1.0, max_value=1e7, allow_nan=False, allow_infinity=False)


# --- summaries ---------------------------------------------------------------------------------

def test_mean_and_sample_stdev_by_hand() -> None:
    # Deviations −0.1, 0.1, 0, 0.2, −0.2: sum of squares 0.1, over n − 1 = 4.
    assert mean(XS) == pytest.approx(10.0)
    assert stdev(XS) == pytest.approx(math.sqrt(0.025))


def test_stdev_of_equal_values_is_exactly_zero() -> None:
    assert stdev([0.1] * 7) == 0.0


def test_summaries_refuse_what_they_cannot_compute() -> None:
    with pytest.raises(ValueError, match="no samples"):
        mean([])
    with pytest.raises(ValueError, match="at least 2"):
        stdev([1.0])
    with pytest.raises(ValueError, match="at least 3"):
        skewness([1.0, 2.0])
    with pytest.raises(ValueError, match="finite"):
        mean([1.0, float("nan")])


def test_skewness_is_adjusted_fisher_pearson() -> None:
    xs = [1.0, 2.0, 2.0, 3.0, 9.0, 4.0, 2.5]
    assert skewness(xs) == pytest.approx(scipy_stats.skew(xs, bias=False))
    assert skewness([3.0, 3.0, 3.0]) == 0.0
    assert skewness([1.0, 2.0, 3.0]) == pytest.approx(0.0)


# --- intervals ---------------------------------------------------------------------------------

def test_t_interval_textbook() -> None:
    # s/√n = √(0.025/5) = 0.070711; t(0.975; 4) = 2.7764 from the table → half-width 0.19632.
    ci = t_interval(XS)
    assert ci.method == "t" and ci.n == 5 and ci.confidence == 0.95
    assert ci.half_width == pytest.approx(0.19632, abs=5e-5)
    assert (ci.low, ci.high) == pytest.approx((9.80368, 10.19632), abs=5e-5)
    assert ci.relative == pytest.approx(0.019632, abs=5e-6)
    low, high = scipy_stats.t.interval(0.95, 4, loc=np.mean(XS), scale=scipy_stats.sem(XS))
    assert (ci.low, ci.high) == pytest.approx((low, high), rel=1e-12)


def test_t_interval_other_confidence_against_scipy() -> None:
    ci = t_interval(TS1, confidence=0.99)
    low, high = scipy_stats.t.interval(0.99, 9, loc=np.mean(TS1), scale=scipy_stats.sem(TS1))
    assert (ci.low, ci.high) == pytest.approx((low, high), rel=1e-12)


def test_one_sample_has_no_interval() -> None:
    for ci in (t_interval([5.0]), bootstrap_interval([5.0]), confidence_interval([5.0])):
        assert ci.method == "none" and ci.mean == 5.0 and ci.n == 1
        assert ci.low is ci.high is ci.half_width is ci.relative is None
    with pytest.raises(ValueError):
        t_interval([])


def test_interval_of_constant_samples_has_zero_width() -> None:
    for ci in (t_interval([4.0] * 5), bootstrap_interval([4.0] * 5)):
        assert (ci.low, ci.high, ci.half_width, ci.relative) == (4.0, 4.0, 0.0, 0.0)


def test_relative_half_width_is_none_around_zero() -> None:
    ci = t_interval([-1.0, 1.0, 0.0])
    assert ci.mean == 0.0 and ci.relative is None and ci.half_width > 0


def test_confidence_must_be_a_probability() -> None:
    with pytest.raises(ValueError, match="between 0 and 1"):
        t_interval(XS, confidence=95)


def test_bootstrap_is_deterministic_for_a_seed() -> None:
    xs = list(np.random.default_rng(1).normal(100, 5, 12))
    assert bootstrap_interval(xs, seed=7) == bootstrap_interval(xs, seed=7)
    assert bootstrap_interval(xs, seed=7) != bootstrap_interval(xs, seed=8)


def test_bootstrap_is_close_to_t_on_normal_data() -> None:
    xs = np.random.default_rng(2).normal(1000, 30, 40)
    boot, t = bootstrap_interval(xs), t_interval(xs)
    assert boot.method == "bootstrap" and boot.mean == t.mean
    assert boot.half_width == pytest.approx(t.half_width, rel=0.1)
    assert boot.low == pytest.approx(t.low, rel=0.005)
    assert boot.high == pytest.approx(t.high, rel=0.005)


def test_bootstrap_follows_the_long_tail() -> None:
    xs = np.random.default_rng(3).lognormal(0, 1, 30)
    boot = bootstrap_interval(xs)
    assert boot.high - boot.mean > boot.mean - boot.low


def test_bootstrap_large_sample_spans_blocks() -> None:
    xs = np.random.default_rng(4).normal(50, 2, 300)
    boot = bootstrap_interval(xs, resamples=5000)
    assert boot.low < boot.mean < boot.high
    assert boot.half_width == pytest.approx(t_interval(xs).half_width, rel=0.1)


def test_skewed_samples_select_the_bootstrap() -> None:
    skewed = [100, 101, 99, 100, 102, 98, 100, 101, 160, 99]
    assert skewness(skewed) > 1 and is_skewed(skewed)
    assert confidence_interval(skewed).method == "bootstrap"
    assert confidence_interval(XS + [10.05, 9.95, 10.0]).method == "t"
    # The same shape with fewer than 8 samples is too little to judge skew by.
    assert confidence_interval([100, 101, 99, 100, 160]).method == "t"


def test_t_coverage_is_nominal_on_normal_data() -> None:
    rng = np.random.default_rng(5)
    hits = sum(ci.low <= 50 <= ci.high for ci in (t_interval(rng.normal(50, 4, 6))
                                                   for _ in range(1000)))
    assert 0.93 <= hits / 1000 <= 0.97


@settings(max_examples=60, deadline=None)
@given(st.lists(iops, min_size=2, max_size=30))
def test_interval_contains_the_mean(xs: list[float]) -> None:
    ci = confidence_interval(xs)
    assert ci.low is not None and ci.high is not None
    assert ci.low <= ci.mean <= ci.high
    # high and low are rounded at the mean's magnitude: (high - low) / 2 is exact only to the
    # float spacing there (a half-width of 1.7e-8 around 1e7 is 9 such steps)
    assert ci.half_width == pytest.approx((ci.high - ci.low) / 2,
                                          abs=2 * math.ulp(max(abs(ci.low), abs(ci.high))))


# --- outliers ----------------------------------------------------------------------------------

def test_planted_outlier_is_flagged() -> None:
    xs = [10.0, 10.2, 9.9, 10.1, 10.0, 9.8, 14.0, 10.1]
    assert outliers(xs) == (False,) * 6 + (True, False)


def test_slow_outlier_is_flagged_too() -> None:
    assert outliers([500, 510, 505, 495, 120, 502]) == (False,) * 4 + (True, False)


def test_no_flags_below_four_samples() -> None:
    assert outliers([1.0, 1.0, 100.0]) == (False, False, False)
    assert outliers([]) == ()


def test_no_flags_on_clean_data() -> None:
    assert not any(outliers(list(np.linspace(100, 110, 12))))


# --- comparisons -------------------------------------------------------------------------------

def test_welch_matches_r_textbook_output() -> None:
    c = compare(TS1, TS2)
    assert c.p_value == pytest.approx(0.08356, abs=5e-6)
    assert c.relative == pytest.approx(11.4 / 10.4 - 1)
    assert not c.significant


@pytest.mark.parametrize(("pair", "p"), [(WIKI_1, 0.021), (WIKI_2, 0.149)])
def test_welch_matches_wikipedia(pair: tuple[list[float], list[float]], p: float) -> None:
    assert compare(*pair).p_value == pytest.approx(p, abs=5e-4)


def test_welch_matches_scipy() -> None:
    rng = np.random.default_rng(6)
    a, b = rng.normal(100, 3, 7), rng.normal(103, 9, 12)
    expected = scipy_stats.ttest_ind(b, a, equal_var=False).pvalue
    assert compare(a, b).p_value == pytest.approx(expected, rel=1e-12)


def test_fieller_contains_the_true_ratio_for_big_samples() -> None:
    rng = np.random.default_rng(7)
    c = compare(rng.normal(20_000, 800, 400), rng.normal(21_000, 1500, 300))
    assert c.low is not None and c.high is not None
    assert c.low < 0.05 < c.high
    assert c.high - c.low < 0.03
    assert c.significant


def test_fieller_agrees_with_a_known_case() -> None:
    # With no spread in A, Fieller reduces to B's t-interval divided by mean_a.
    a, b = [10.0, 10.0, 10.0], [10.5, 11.0, 11.5, 12.0]
    ci_b = t_interval(b)
    c = compare(a, b)
    assert (c.low, c.high) == pytest.approx((ci_b.low / 10 - 1, ci_b.high / 10 - 1))


@pytest.mark.parametrize(("n_a", "n_b", "sd_a", "sd_b"), [(5, 5, 5.0, 5.0), (4, 12, 2.0, 10.0)])
def test_fieller_coverage_is_about_95_percent(n_a: int, n_b: int, sd_a: float,
                                              sd_b: float) -> None:
    rng = np.random.default_rng(8)
    hits = 0
    for _ in range(600):
        c = compare(rng.normal(100, sd_a, n_a), rng.normal(105, sd_b, n_b))
        assert c.low is not None and c.high is not None
        hits += c.low <= 0.05 <= c.high
    assert 0.92 <= hits / 600 <= 0.98


def test_significant_verdict_reads_like_the_issue() -> None:
    rng = np.random.default_rng(9)
    c = compare(rng.normal(1000, 10, 8), rng.normal(1040, 10, 8))
    assert c.significant and c.p_value is not None and c.p_value < 0.001
    assert c.low is not None and c.high is not None
    pct = f"+{c.relative * 100:.1f} %"
    assert c.verdict == (f"{pct} (95 % CI +{c.low * 100:.1f} … +{c.high * 100:.1f} %), "
                         "significant (Welch p<0.001)")


def test_no_significant_difference_is_said_when_p_is_at_least_alpha() -> None:
    c = compare(TS1, [x + 0.2 for x in TS1[::-1]])
    assert c.p_value is not None and c.p_value >= 0.05 and not c.significant
    assert c.verdict.startswith("no significant difference (+1.9 %, 95 % CI −")
    assert c.verdict.endswith(f", p={c.p_value:.2g})")


def test_exact_verdict_texts() -> None:
    # Unicode minus, one decimal, p to two significant digits; alpha moves only the verdict.
    c = compare(TS2, TS1)
    assert c.verdict == "no significant difference (−8.8 %, 95 % CI −17.9 … +1.4 %, p=0.084)"
    c = compare(TS2, TS1, alpha=0.1)
    assert c.verdict == "−8.8 % (95 % CI −17.9 … +1.4 %), significant (Welch p=0.084)"


def test_fieller_bounds_solve_the_defining_inequality() -> None:
    # Fieller's set: ratios r with (mean_b − r·mean_a)² ≤ t²(df(R))·(var_b/n_b + r²·var_a/n_a).
    a, b = np.array(TS2, dtype=float), np.array(TS1, dtype=float)
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    ratio = b.mean() / a.mean()
    df = (vb + ratio**2 * va) ** 2 / (vb**2 / (b.size - 1) + (ratio**2 * va) ** 2 / (a.size - 1))
    t = scipy_stats.t.ppf(0.975, df)

    def excess(r: float) -> float:
        return (b.mean() - r * a.mean()) ** 2 - t**2 * (vb + r * r * va)

    low = scipy_optimize.brentq(excess, 0.5, ratio)
    high = scipy_optimize.brentq(excess, ratio, 1.5)
    c = compare(a, b)
    assert (c.low, c.high) == pytest.approx((low - 1, high - 1), abs=1e-9)


def test_rounding_never_hides_which_side_of_alpha_p_is_on() -> None:
    base = compare(TS2, TS1)
    near = base.model_copy(update={"p_value": 0.0499, "significant": True})
    near_verdict = adjust([near])[0].verdict
    assert "p=0.0499" in near_verdict and "Holm-adjusted p=0.0499" in near_verdict


def test_too_few_samples_on_either_side() -> None:
    for a, b in (([1.0], [2.0, 3.0]), ([1.0, 2.0], [3.0]), ([], [1.0, 2.0])):
        c = compare(a, b)
        assert c.verdict.startswith("not enough samples to compare")
        assert c.p_value is None and c.relative is None and not c.significant
    assert compare([], [1.0, 2.0]).mean_a is None


def test_identical_constants_are_no_difference() -> None:
    c = compare([5.0] * 3, [5.0] * 4)
    assert c.p_value == 1.0 and not c.significant and c.constant
    assert c.relative == c.low == c.high == 0.0
    assert c.verdict == "no significant difference (+0.0 %, no variation on either side, p=1)"


def test_different_constants_are_significant_with_p_zero() -> None:
    c = compare([5.0] * 3, [6.0] * 3)
    assert c.p_value == 0.0 and c.significant and c.constant
    assert c.relative == pytest.approx(0.2) and c.low == c.high == c.relative
    assert c.verdict == "+20.0 % (no variation on either side), significant (Welch p=0)"


def test_zero_baseline_has_no_relative_difference() -> None:
    c = compare([-1.0, 1.0, 0.0], [10.0, 11.0, 12.0])
    assert c.relative is None and c.low is None and c.high is None
    assert c.significant
    assert c.verdict.startswith("relative difference undefined: mean of A is 0, significant (")


def test_b_constant_at_zero() -> None:
    # The ratio is exactly 0 when B is constant at 0 and A is clearly away from 0 ...
    c = compare([10.0, 11.0, 12.0], [0.0, 0.0])
    assert c.relative == c.low == c.high == -1.0 and not c.constant
    assert c.verdict.startswith("−100.0 % (95 % CI −100.0 … −100.0 %), significant (Welch p=")
    # ... and unknown when A might be 0 too; then Welch (df = n_a − 1) does not reject either.
    c = compare([1.0, 2.0, 3.0], [0.0, 0.0])
    assert c.low is None and c.high is None and not c.significant
    assert c.verdict == ("no significant difference (−100.0 %, 95 % CI unbounded: "
                         "A is too noisy to divide by, p=0.074)")


def test_noisy_baseline_near_zero_gives_an_unbounded_ci() -> None:
    c = compare([0.1, 5.0, -4.0], [20.0, 30.0, 25.0])
    assert c.relative is not None and c.low is None and c.high is None
    assert "CI unbounded" in c.verdict


def test_one_constant_side_still_tests() -> None:
    # Welch with s_a = 0: t = (x̄_b − x̄_a)/(s_b/√n_b) on n_b − 1 degrees of freedom.
    b = [101.0, 102.0, 103.0, 102.0]
    t = (np.mean(b) - 100.0) / (np.std(b, ddof=1) / 2)
    c = compare([100.0] * 5, b)
    assert c.p_value == pytest.approx(2 * scipy_stats.t.sf(t, 3), rel=1e-9)
    assert not c.constant and c.significant


@settings(max_examples=60, deadline=None)
@given(st.lists(iops, min_size=2, max_size=20))
def test_a_sample_is_never_significantly_different_from_itself(xs: list[float]) -> None:
    c = compare(xs, xs)
    assert not c.significant and c.p_value == pytest.approx(1.0)
    assert c.verdict.startswith("no significant difference")


@settings(max_examples=60, deadline=None)
@given(st.lists(iops, min_size=2, max_size=12), st.lists(iops, min_size=2, max_size=12))
def test_ci_contains_the_estimate_and_verdict_matches_p(a: list[float], b: list[float]) -> None:
    c = compare(a, b)
    assert c.relative is not None and c.p_value is not None
    if c.low is not None and c.high is not None:
        slack = 1e-9 * abs(c.relative) + 1e-12
        assert c.low - slack <= c.relative <= c.high + slack
    assert c.significant == (c.p_value < 0.05)
    assert c.verdict.startswith("no significant difference") != c.significant


# --- multiple comparisons ----------------------------------------------------------------------

def _with_p(ps: list[float | None]) -> list[Comparison]:
    base = compare(TS1, TS2)
    out = []
    for p in ps:
        if p is None:
            out.append(compare([1.0], [2.0]))
        else:
            out.append(base.model_copy(update={"p_value": p, "significant": p < 0.05}))
    return out


def test_holm_by_hand() -> None:
    # Sorted: 0.005·4 = 0.02, 0.01·3 = 0.03, 0.03·2 = 0.06, 0.04·1 = 0.04 → monotone 0.06.
    adjusted = adjust(_with_p([0.01, 0.04, 0.03, 0.005]), "holm")
    assert [c.adjusted_p for c in adjusted] == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert [c.significant for c in adjusted] == [True, False, False, True]
    assert [c.p_value for c in adjusted] == [0.01, 0.04, 0.03, 0.005]
    assert all(c.adjustment == "holm" and c.family == 4 for c in adjusted)


def test_bh_by_hand_and_against_scipy() -> None:
    # Sorted p·m/i: 0.02, 0.02, 0.04, 0.04; running minimum from the top leaves them as they are.
    ps = [0.01, 0.04, 0.03, 0.005]
    adjusted = adjust(_with_p(ps), "bh")
    assert [c.adjusted_p for c in adjusted] == pytest.approx([0.02, 0.04, 0.04, 0.02])
    assert all(c.significant for c in adjusted)
    ps = [0.2, 0.001, 0.04, 0.03, 0.9, 0.012]
    got = [c.adjusted_p for c in adjust(_with_p(ps), "bh")]
    assert got == pytest.approx(list(scipy_stats.false_discovery_control(ps)))


def test_adjusted_p_is_capped_at_one() -> None:
    adjusted = adjust(_with_p([0.6, 0.7, 0.8]), "holm")
    assert [c.adjusted_p for c in adjusted] == pytest.approx([1.0, 1.0, 1.0])


def test_adjustment_is_named_in_the_verdict() -> None:
    holm = adjust(_with_p([0.01, 0.04, 0.03, 0.005]), "holm")
    assert holm[0].verdict.endswith(
        ", significant (Welch p=0.01, Holm-adjusted p=0.03 across 4 comparisons)")
    assert holm[1].verdict.startswith("no significant difference (")
    assert holm[1].verdict.endswith(", p=0.04, Holm-adjusted p=0.06 across 4 comparisons)")
    bh = adjust(_with_p([0.01, 0.04]), "bh")
    assert "Benjamini–Hochberg-adjusted p=0.02 across 2 comparisons" in bh[0].verdict


def test_untestable_comparisons_pass_through_and_do_not_count() -> None:
    adjusted = adjust(_with_p([0.01, None, 0.02]), "holm")
    assert adjusted[1].adjusted_p is None and adjusted[1].family is None
    assert adjusted[1].verdict.startswith("not enough samples")
    assert [adjusted[0].family, adjusted[2].family] == [2, 2]
    assert adjusted[0].adjusted_p == pytest.approx(0.02)
    assert adjust([]) == ()


def test_adjusting_again_starts_from_the_raw_p_values() -> None:
    once = adjust(_with_p([0.01, 0.04, 0.03]), "holm")
    assert adjust(once, "bh") == adjust(_with_p([0.01, 0.04, 0.03]), "bh")


def test_unknown_adjustment_is_refused() -> None:
    with pytest.raises(ValueError, match="holm, bh"):
        adjust(_with_p([0.01]), "bonferroni")  # type: ignore[arg-type]
