"""Choosing a run's trial length and rounds from a pilot's measured noise (pure).

The model: in round r a gain's paired statistic (the mean log ratio of its pairs) is the true
gain plus within-trial noise of variance ``within / (pairs · T)`` (a trial of T seconds averages
T seconds of I/O: its noise shrinks as 1/√T) plus drift that pairing does not cancel, of
variance ``drift`` per round (between the blocks of one round; taken as shared by every pair of
a gain, which is conservative: drift independent across pairs would shrink by ``pairs`` too).
After R rounds the 95 % CI half-width is t(R−1) · √(V(T) / R), V(T) = within/(pairs·T) + drift.
Each round costs ``n_trials · (T + fixed) + n_sessions · session`` seconds: ``fixed`` is what a
trial costs beyond its runtime (ramp, fio's start, the runner), ``session`` what bringing a
configuration up costs once per block (the daemon or guests start and stop).

``choose`` minimises the wall time R · cost(T) subject to the half-width ≤ target for every
configuration class (mode) of the run, over integer R ≥ ``MIN_ROUNDS`` and T within bounds.
With t(R−1) taken as constant the continuous optimum is the classical T* = √(a·c / b) with
a = within/pairs, c = fixed + session/trials-per-block, b = drift: longer trials where fixed
costs are high and drift is low, shorter ones (more rounds) where drift dominates.

``estimate`` reads the pilot: every pilot workload measured on two configurations of a class at
two trial lengths T1 < T2 in each of a few rounds, back to back in one session. Within a round
the difference between a workload's log ratio at T1 and at T2 shares that round's drift, so its
variance is within · (1/T1 + 1/T2): that gives ``within`` free of drift. Across rounds the log
ratio's variance at length L is within/L + drift, which gives ``drift``. A class with one
configuration (no gain to pair) uses log IOPS instead of log ratios: its drift then includes
everything a round moves (nothing cancels it).

Limits: a pilot of a few rounds knows a variance to within a factor of about two (2 to 4
degrees of freedom per figure), so the chosen R reaches the target about half the time, and the
run says how wide it got; the pilot's workloads stand for all of the run's (their noise is
pooled); one T serves the whole run.

When the suite fixes the trial (its runtime, or steady state) only R is chosen, and the pilot
measures at that trial alone (``pilot_lengths``): the spread of the log ratios across its
workloads within a round gives ``within``, their common move from round to round ``drift``
(``_by_workloads``). This is how ``target_ci`` chooses its rounds.

The stop rule is fixed: R is chosen from the pilot only, whose trials are not part of any gain,
and the run then measures exactly R rounds. No look at the gains decides when to stop, so a
gain's test keeps its nominal false-positive rate (5 % for an A/A pair): given R, the rounds are
independent of it. Stopping the first time a CI is narrow enough (what ``target_ci`` did
before: after each round, until every gain was within the target) does not: a CI is narrow by
chance when its variance estimate is small, which is when a difference looks largest; the
mean at the stop is unbiased, but its t statistic's denominator is selected small
(``tests/analysis/test_trialplan.py`` measures both).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence

import numpy as np
from scipy import stats as _scipy

from iomatrix.core.model import Frozen
from iomatrix.store.records import PilotTrial
from iomatrix.store.rows import PlanChoice, StoredPlan
from iomatrix.suite.method import Method

MIN_ROUNDS = 3
"""A gain needs 2 degrees of freedom across rounds."""
PILOT_LENGTHS = (1.0, 4.0)
"""The pilot's two trial lengths (seconds): 1 s shows within-trial noise, 4 s how it shrinks."""
PILOT_ROUNDS = 3
PILOT_WORKLOADS = 2
"""Workloads per class the pilot measures (drawn with the run's seed)."""
DEFAULT_TARGET = 0.02
"""The target half-width when the suite gives no target_ci: ±2 percentage points."""
MIN_RUNTIME = 0.5
"""fio's shortest runtime the suite accepts (``Method.runtime``)."""


class Noise(Frozen):
    """What the pilot measured for one configuration class (mode)."""

    mode: str
    within: float
    """Variance of one pair's log ratio from within-trial noise, times seconds (a: σ² = a/T)."""
    drift: float
    """Variance per round of a pair's log ratio that pairing does not cancel (b)."""
    fixed: float
    """Seconds a trial costs beyond its runtime (c)."""
    session: float
    """Seconds a block costs beyond its trials (daemon or guests up and down)."""
    trials: int
    """Trials per round in the run for this class (its points)."""
    sessions: int
    """Blocks per round in the run (its configurations)."""
    pairs: int
    """Pairs a gain averages over per round (the fewest workloads at one queue depth)."""
    paired: bool
    """False: one configuration, log IOPS not log ratios."""
    df: int
    """Degrees of freedom behind ``within`` (those behind ``drift`` are about as many)."""

    def variance(self, runtime: float) -> float:
        """V(T): a gain's per-round variance at trial length ``runtime``."""
        return self.within / (self.pairs * runtime) + self.drift

    def round_seconds(self, runtime: float) -> float:
        return self.trials * (runtime + self.fixed) + self.sessions * self.session

    def text(self) -> str:
        what = "log ratio of two configurations" if self.paired else "log IOPS (one configuration)"
        return (f"{self.mode}: within-trial noise σ = {math.sqrt(self.within) * 100:.1f} % at "
                f"1 s ({what}, shrinking as 1/√T), drift per round not cancelled "
                f"{math.sqrt(self.drift) * 100:.1f} %, fixed cost {self.fixed:.2f} s a trial "
                f"beyond its runtime and {self.session:.2f} s a session; {self.trials} trials "
                f"and {self.sessions} sessions a round; a gain pairs {self.pairs} workload(s) a "
                f"round; {self.df} degrees of freedom")


class Choice(PlanChoice):
    """The trial length and rounds chosen, with why (its fields: ``PlanChoice``, as a resumed
    run reads them back from its store)."""

    def text(self) -> str:
        how = []
        if self.fixed_runtime:
            how.append("the suite's runtime")
        if self.fixed_rounds:
            how.append("rounds (samples) fixed by the suite")
        why = (f"continuous optimum √(a·c/b) = {self.optimum:.2f} s" if self.optimum is not None
               else "no drift measured: each round more only buys a smaller t quantile, "
               "against its trials' fixed cost")
        reach = (f"expected widest 95 % CI ±{self.half_width * 100:.2f} pp (target "
                 f"±{self.target * 100:g} pp)" if self.reached else
                 f"the target ±{self.target * 100:g} pp is out of reach within the bounds: "
                 f"expected widest ±{self.half_width * 100:.2f} pp")
        return (f"chosen: trials of {self.runtime:.2f} s × {self.rounds} rounds, about "
                f"{self.seconds:.0f} s; {reach}; {why}"
                + (f" ({'; '.join(how)})" if how else "")
                + "; the rounds are fixed now (no look at the gains decides when to stop)")


@functools.lru_cache(maxsize=None)
def _t(rounds: int) -> float:
    return float(_scipy.t.ppf(0.975, rounds - 1))


def _variance(xs: Sequence[float]) -> tuple[float, int]:
    """(sum of squared deviations, degrees of freedom) of one group."""
    if len(xs) < 2:
        return 0.0, 0
    a = np.asarray(xs, dtype=float)
    return float(((a - a.mean()) ** 2).sum()), len(xs) - 1


def estimate(trials: Sequence[PilotTrial], *, mode: str, trials_per_round: int,
             sessions_per_round: int, pairs: int,
             nodes: Mapping[str, str] | None = None) -> Noise | None:
    """A class's noise and costs from its pilot trials (the module's method); None when the
    pilot gave too little (fewer than two complete rounds).

    ``nodes`` (a configuration's key → its node) is for a run whose nodes each measure their
    own share: each node's pilot pairs two configurations of its own, and one estimate pools
    the nodes, each node's workloads counted as workloads of their own (within-trial noise and
    fixed costs averaged over every node; drift is what a round moves on all of them, a node's
    own drift counted as within-trial noise). ``trials_per_round`` and ``sessions_per_round``
    are then one node's (the nodes measure side by side)."""
    ok = [t for t in trials if t.mode == mode and t.iops is not None and t.iops > 0]
    mine = [t for t in trials if t.mode == mode]
    node = (lambda key: nodes.get(key, "")) if nodes else (lambda key: "")
    configs: dict[str, list[str]] = {}
    for key in dict.fromkeys(t.config_key for t in mine):
        configs.setdefault(node(key), []).append(key)
    paired = bool(configs) and all(len(cs) >= 2 for cs in configs.values())
    chosen = {g: cs[:2] if paired else cs[:1] for g, cs in configs.items()}
    lengths = sorted({t.runtime_s for t in ok})
    if not lengths or not chosen:
        return None
    logs: dict[tuple[str, str, int, float], dict[str, float]] = {}
    for t in ok:
        logs.setdefault((node(t.config_key), t.workload_key, t.round, t.runtime_s), {})[
            t.config_key] = math.log(t.iops)  # type: ignore[arg-type]
    value: dict[tuple[tuple[str, str], int, float], float] = {}
    for (g, w, r, length), got in logs.items():
        cs = chosen.get(g, [])
        if cs and all(c in got for c in cs):
            value[((g, w), r, length)] = got[cs[0]] - got[cs[1]] if paired else got[cs[0]]
    found = (_by_lengths(value, lengths[0], lengths[-1]) if len(lengths) > 1
             else _by_workloads(value, lengths[0]))
    if found is None:
        return None
    within, drift, df = found
    walls = [t.wall_s - t.runtime_s for t in mine]
    sessions = [t.session_s for t in mine if t.session_s > 0]
    return Noise(mode=mode, within=within, drift=drift, fixed=max(0.0, float(np.mean(walls))),
                 session=float(np.mean(sessions)) if sessions else 0.0,
                 trials=trials_per_round, sessions=sessions_per_round,
                 pairs=max(1, pairs) if paired else 1, paired=paired, df=df)


Workload = tuple[str, str]
"""A pilot workload as the estimate groups it: (its node, or "" on one host; its key)."""


def _by_lengths(value: Mapping[tuple[Workload, int, float], float], t1: float,
                t2: float) -> tuple[float, float, int] | None:
    """(within, drift, df) from two lengths: the T1 − T2 difference inside one round shares
    the round's drift (centred per workload); across rounds at each length, less within/T."""
    ss, df = 0.0, 0
    groups: dict[Workload, list[float]] = {}
    for (w, r, length), x in value.items():
        if length == t1 and (w, r, t2) in value:
            groups.setdefault(w, []).append(x - value[(w, r, t2)])
    for xs in groups.values():
        s, d = _variance(xs)
        ss, df = ss + s, df + d
    if df == 0:
        return None
    within = ss / df / (1 / t1 + 1 / t2)
    drifts = []
    for length in (t1, t2):
        ss_l, df_l = 0.0, 0
        for w in groups:
            s, d = _variance([x for (ww, _, ll), x in value.items() if ww == w and ll == length])
            ss_l, df_l = ss_l + s, df_l + d
        if df_l:
            drifts.append(ss_l / df_l - within / length)
    return within, max(0.0, float(np.mean(drifts))) if drifts else 0.0, df


def _by_workloads(value: Mapping[tuple[Workload, int, float], float],
                  length: float) -> tuple[float, float, int] | None:
    """(within, drift, df) from one length (the run's own trial, when the suite fixes it):
    workloads × rounds as a two-way layout, x = gain of the workload + drift of the round +
    residual. The residual mean square is what a round's workloads do not share (a/T, averaged
    down by a gain's pairs); (MS rounds − MS residual)/W is the drift they share (b). One
    workload: everything across rounds is counted as drift (nothing to tell them apart).
    Several nodes: a layout per node (a gain is one node's, and so is its drift), their sums
    of squares pooled."""
    layouts = [x for g in sorted({w[0] for w, _, _ in value})
               if (x := _layout(value, g, length)) is not None]
    if not layouts:
        return None
    many = [x for x in layouts if x.shape[0] > 1]
    if not many:                # one workload a node
        ss, df = 0.0, 0
        for x in layouts:
            s, d = _variance(list(x[0]))
            ss, df = ss + s, df + d
        return 0.0, ss / df, df
    ss_resid, df = 0.0, 0
    for x in many:
        resid = x - x.mean(axis=1, keepdims=True) - x.mean(axis=0) + x.mean()
        ss_resid, df = ss_resid + float((resid ** 2).sum()), df + (x.shape[0] - 1) * (x.shape[1] - 1)
    ms_resid = ss_resid / df
    drifts, weights = [], []
    for x in many:
        n_w, n_r = x.shape
        by_round = x.mean(axis=0)
        ms_rounds = n_w * float(((by_round - by_round.mean()) ** 2).sum()) / (n_r - 1)
        drifts.append((ms_rounds - ms_resid) / n_w)
        weights.append(n_r - 1)
    return ms_resid * length, max(0.0, float(np.average(drifts, weights=weights))), df


def _layout(value: Mapping[tuple[Workload, int, float], float], node: str,
            length: float) -> np.ndarray | None:
    """One node's workloads × its complete rounds (None: fewer than two)."""
    workloads = sorted({w for w, _, _ in value if w[0] == node})
    rounds = sorted(r for r in {r for w, r, _ in value if w[0] == node}
                    if all((w, r, length) in value for w in workloads))
    if len(rounds) < 2:
        return None
    return np.array([[value[(w, r, length)] for r in rounds] for w in workloads])


def choose(noises: Sequence[Noise], target: float, *, max_rounds: int,
           min_runtime: float = MIN_RUNTIME, max_runtime: float = 600.0,
           runtime: float | None = None, rounds: int | None = None,
           min_rounds: int = MIN_ROUNDS) -> Choice:
    """The T and R that reach ``target`` (95 % CI half-width, log units) for every class in the
    least wall time (see the module docstring). ``runtime`` or ``rounds`` given: that one is
    kept and only the other chosen. Rounds lie in [max(MIN_ROUNDS, min_rounds), max_rounds]
    unless given. The target binds the classes with gains (two configurations); a class of
    one configuration (the bare-metal baseline) only where no class has a gain, as its points'
    CIs are then what the run asks about; every class's trials count in the wall time."""
    if not noises:
        raise ValueError("no class to plan")
    # what the run asks about: its gains; a class's points (log IOPS) only in a run with none
    asked = [n for n in noises if n.paired] or list(noises)
    lo_r = rounds if rounds is not None else max(MIN_ROUNDS, min_rounds)
    hi_r = rounds if rounds is not None else max(lo_r, max_rounds)
    best: tuple[float, float, int, float] | None = None
    widest: tuple[float, float, int, float] | None = None
    for r in range(lo_r, hi_r + 1):
        need = target ** 2 * r / _t(r) ** 2      # the largest V(T) that reaches the target
        if runtime is not None:
            t = runtime
        else:
            t = min_runtime
            for n in asked:
                room = need - n.drift
                t = max(t, math.inf if room <= 0 else n.within / n.pairs / room)
        feasible = t <= (runtime if runtime is not None else max_runtime)
        t_used = min(t, runtime if runtime is not None else max_runtime)
        seconds = r * sum(n.round_seconds(t_used) for n in noises)
        half = max(_t(r) * math.sqrt(n.variance(t_used) / r) for n in asked)
        if feasible and half <= target * (1 + 1e-9) and (best is None or seconds < best[0]):
            best = (seconds, t_used, r, half)
        if widest is None or half < widest[3]:
            widest = (seconds, t_used, r, half)
    chosen = best or widest
    assert chosen is not None
    seconds, t_used, r, half = chosen
    binding = max(asked, key=lambda n: n.variance(t_used))
    c = binding.fixed + binding.session * binding.sessions / max(1, binding.trials)
    optimum = (math.sqrt(binding.within / binding.pairs * c / binding.drift)
               if binding.drift > 0 else None)
    return Choice(runtime=t_used, rounds=r, seconds=seconds, half_width=half, target=target,
                  optimum=optimum, reached=best is not None, fixed_runtime=runtime is not None,
                  fixed_rounds=rounds is not None)


def decide(trials: Sequence[PilotTrial], per_mode: Mapping[str, tuple[int, int, int]],
           method: Method, seconds: float, lengths: Sequence[float],
           nodes: Mapping[str, str] | None = None) -> tuple[StoredPlan, str]:
    """The plan a pilot's ``trials`` choose under ``method`` (each class's ``estimate`` from
    its (trials, sessions, pairs) a round in ``per_mode``, then ``choose``), and the run's note
    saying what was measured and chosen; too little measured: no choice, the suite's runtime
    and rounds kept. ``seconds``: the pilot's time; ``nodes`` as ``estimate``'s."""
    _, samples = method.fixed_by_suite
    noises = [n for mode, (per_round, sessions, pairs) in per_mode.items()
              if (n := estimate(trials, mode=mode, trials_per_round=per_round,
                                sessions_per_round=sessions, pairs=pairs,
                                nodes=nodes)) is not None]
    if not noises:
        return trial_plan(seconds, (), None), (
            f"pilot: {len(trials)} trials ({seconds:.0f} s) gave too little to choose from "
            f"(failed trials, or a class with a single round); the suite's runtime "
            f"({method.runtime:g} s) and rounds ({method.samples}) are used")
    choice = choose(noises, method.target_ci or DEFAULT_TARGET, max_rounds=method.max_samples,
                    max_runtime=method.max_runtime,
                    runtime=None if method.chooses_runtime else method.window,
                    rounds=samples if method.pilot else None, min_rounds=method.samples)
    note = pilot_choice_note(noises, choice, seconds, len(trials), lengths,
                             steady=method.steady_state)
    return trial_plan(seconds, noises, choice), note


def trial_plan(pilot_seconds: float, noises: Sequence[Noise], choice: Choice | None) -> StoredPlan:
    """The run's trial plan as it is stored and read back (``store.rows.StoredPlan``): the
    pilot's time, its noise per class (shown only) and the choice (None: the pilot gave too
    little to choose from)."""
    return StoredPlan(pilot_seconds=pilot_seconds, noise=tuple(n.model_dump() for n in noises),
                      choice=choice)


def pilot_lengths(chooses_runtime: bool, window: float) -> tuple[float, ...]:
    """The trial lengths a pilot measures: 1 s and 4 s when it chooses the runtime (how noise
    shrinks with length), else the run's own trial only (``window``: its runtime, or the
    longest a steady-state trial may take), which is all that choosing rounds needs."""
    return PILOT_LENGTHS if chooses_runtime else (window,)


def _lengths_text(lengths: Sequence[float], steady: bool = False) -> str:
    if steady:
        return f"at the run's own steady-state trials (up to {lengths[0]:g} s)"
    if len(lengths) == 1:
        return f"at the run's own trial length ({lengths[0]:g} s)"
    return "at " + " and ".join(f"{x:g} s" for x in lengths)


def pilot_choice_note(noises: Mapping[str, Noise] | Sequence[Noise], choice: Choice,
                      pilot_seconds: float, pilot_trials: int,
                      lengths: Sequence[float] = PILOT_LENGTHS, steady: bool = False) -> str:
    """The run note that says what the pilot measured and what was chosen and why."""
    listed = noises.values() if isinstance(noises, Mapping) else noises
    return (f"pilot: {pilot_trials} trials ({pilot_seconds:.0f} s, counted in the run's wall "
            f"time, stored apart from its trials) {_lengths_text(lengths, steady)}, {PILOT_ROUNDS} "
            "rounds; measured " + "; ".join(n.text() for n in listed) + ". " + choice.text())


def plan_text(pilot_trials: int, modes: Sequence[str], target: float, *, max_rounds: int,
              max_runtime: float, runtime: float | None, rounds: int | None,
              lengths: Sequence[float] = PILOT_LENGTHS, min_rounds: int = MIN_ROUNDS,
              steady: bool = False) -> str:
    """What ``run --plan`` says of a run with a pilot (``[method] pilot``, or ``target_ci``,
    whose rounds a pilot chooses): what it will measure, and how it will choose (the rounds
    listed above are the suite's own, which the choice replaces)."""
    keep = ["its steady-state trials" if steady else
            f"the suite's runtime {runtime:g} s" if runtime is not None else "",
            f"{rounds} rounds (samples, fixed by the suite)" if rounds is not None else ""]
    kept = "; it keeps " + " and ".join(k for k in keep if k) if any(keep) else ""
    low = max(MIN_ROUNDS, min_rounds)
    span = f"{low} to {max(low, max_rounds)}"
    chosen = (f"the number of rounds ({span})" if len(lengths) == 1 else
              f"the trial length (at most {max_runtime:g} s)" if rounds is not None else
              f"the trial length (at most {max_runtime:g} s) and rounds ({span})")
    return (f"pilot: first {pilot_trials} trials of {' and '.join(modes)} ({PILOT_ROUNDS} rounds "
            f"of two configurations on up to {PILOT_WORKLOADS} workloads, "
            f"{_lengths_text(lengths, steady)}; counted in the run's time, stored apart from its "
            f"trials) measure the noise of a gain per round: within a trial"
            + (" and how it shrinks with trial length" if len(lengths) > 1 else "")
            + f", the drift between rounds that pairing leaves, and the fixed cost of a trial "
            f"and of a session; then it chooses {chosen} with the least wall time to a 95 % CI "
            f"within ±{target * 100:g} pp on every gain, replacing the rounds listed "
            f"above{kept}. The rounds are then fixed: no "
            f"look at the gains decides when to stop, so an A/A pair is called different at "
            f"the nominal 5 %.")
