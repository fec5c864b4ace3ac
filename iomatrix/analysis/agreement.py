"""Whether two tools measure the same thing: equivalence of paired measurements.

The design is a crossover: each round measures the same target with both tools, in an order
drawn per round, so that drift of a shared host falls on both alike. Each round gives the log
of the ratio of their figures (A / B). Their centre is the Hodges-Lehmann estimate (the median
of the Walsh averages, the pairwise means of the log ratios), with its distribution-free 90 %
confidence interval from the signed-rank distribution (Hollander & Wolfe, Nonparametric
Statistical Methods, §3.2; exact up to 300 rounds, normal beyond). A round that a burst of the
host hit in one tool's run only (a tenfold ratio now and then on a shared machine) moves it
by one rank, where it would widen a t-interval tenfold. It assumes the rounds independent and
their log ratios symmetric about their centre. Two one-sided tests at α = 0.05 (Schuirmann's
TOST) are that interval:

- **agree**: it lies within [1 / (1 + margin), 1 + margin];
- **differ**: it lies wholly outside that range;
- **undecided** otherwise: too few rounds, or too much noise, to tell. Equivalence has to be
  shown, never assumed from a difference that is merely not significant.

The default margin, 0.80 to 1.25, is that of average bioequivalence (FDA guidance
"Statistical Approaches to Establishing Bioequivalence", 2001): two formulations whose 90 %
interval of the ratio lies within it are taken as interchangeable. For ioping and fio it is
small beside what seed 001 §9 reads from their figures: 2.5× between cache modes and 2×
between host and guest."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Literal

from iomatrix.core.model import Frozen

MARGIN = 0.25
"""Equivalence margin: the ratio must lie within [1 / 1.25, 1.25] = [0.80, 1.25]."""
CONFIDENCE = 0.90
"""The interval of two one-sided tests at α = 0.05."""
_EXACT_UP_TO = 300


class Agreement(Frozen):
    """A against B over paired rounds: the centre of their ratios, its interval, the verdict."""

    rounds: int
    ratio: float
    """The Hodges-Lehmann estimate of A / B (a median ratio)."""
    low: float
    high: float
    confidence: float
    """The interval's coverage: at least the confidence asked (the signed-rank distribution is
    discrete)."""
    margin: float
    verdict: Literal["agree", "differ", "undecided"]

    @property
    def text(self) -> str:
        """The verdict with its figures, in one line."""
        return (f"{self.verdict}: ratio {self.ratio:.3f}, {self.confidence:.0%} CI "
                f"{self.low:.3f} to {self.high:.3f} (Hodges-Lehmann, {self.rounds} rounds; "
                f"equivalence range {1 / (1 + self.margin):.2f} to {1 + self.margin:.2f})")


def agreement(a: Sequence[float], b: Sequence[float], *, margin: float = MARGIN,
              confidence: float = CONFIDENCE) -> Agreement:
    """Whether figures ``a`` and ``b`` (one of each per round, positive) agree within
    ``margin``; ValueError below the rounds an interval at ``confidence`` needs (5 at 90 %)
    or for a non-positive figure."""
    if len(a) != len(b):
        raise ValueError(f"{len(a)} figures of A against {len(b)} of B: pair them by round")
    if any(not x > 0 for x in (*a, *b)):
        raise ValueError("figures must be positive to compare as ratios")
    logs = [math.log(x / y) for x, y in zip(a, b)]
    n = len(logs)
    walsh = sorted((logs[i] + logs[j]) / 2 for i in range(n) for j in range(i, n))
    k, coverage = _rank(n, 1 - confidence)
    if k < 1:
        raise ValueError(f"{n} rounds cannot give a {confidence:.0%} interval")
    low, high = math.exp(walsh[k - 1]), math.exp(walsh[len(walsh) - k])
    bottom, top = 1 / (1 + margin), 1 + margin
    verdict: Literal["agree", "differ", "undecided"] = (
        "agree" if bottom <= low and high <= top else
        "differ" if high < bottom or low > top else "undecided")
    return Agreement(rounds=n, ratio=math.exp(statistics.median(walsh)), low=low, high=high,
                     confidence=coverage, margin=margin, verdict=verdict)


def _rank(n: int, alpha: float) -> tuple[int, float]:
    """The rank k of the Walsh averages bounding the interval ([k-th, (M+1-k)-th] of M): the
    largest with P(T+ < k) ≤ α/2 under the null, T+ the signed-rank statistic of n values;
    and the interval's coverage 1 − 2 P(T+ < k). 0 when no k is small enough."""
    if n > _EXACT_UP_TO:
        mean, sd = n * (n + 1) / 4, math.sqrt(n * (n + 1) * (2 * n + 1) / 24)
        k = math.floor(mean - statistics.NormalDist().inv_cdf(1 - alpha / 2) * sd + 0.5)
        return k, 1 - alpha
    counts = [1]                               # subsets of {1..n} by their sum
    for r in range(1, n + 1):
        counts = [x + (counts[t - r] if t >= r else 0) for t, x in
                  enumerate(counts + [0] * r)]
    total = 2 ** n
    below, k = 0, 0
    for t, c in enumerate(counts):             # P(T+ <= t), growing
        if (below + c) / total > alpha / 2:
            break
        below += c
        k = t + 1
    return k, 1 - 2 * below / total
