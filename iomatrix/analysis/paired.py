"""What a run asks of its gains, and how well its own method tells identical things apart.

- ``needing_more``: adaptive repetition on gains. ``target_ci`` (a relative half-width, 0.02)
  applies to the gains a run's answers rest on: the matrix axes' gains per queue depth (what
  ``iomatrix effect`` and the report show) and its findings' gains. A gain is finished when
  its 95 % CI half-width ((high − low) / 2, in gain units: 0.02 = ±2 percentage points) is
  within the target (paired over at least ``MIN_ROUNDS`` rounds), or, for a finding's gain, when the finding is decided (confirmed or
  contradicted, with the CI clear of its ``at_least`` size) and nothing else is asked of it.
  The next round measures the points every unfinished gain rests on (and their A/A twins);
  when every gain is finished the rounds stop, whatever the CIs of single points. A run with
  no gain (one configuration per mode) falls back to the point rule (``stats.needs_more``).
  Gains are paired by round (``effects``), so drift common to a round cancels and the number
  of rounds, not the length of a trial, narrows them: under drift, shorter trials and more
  rounds reach the target sooner.
- ``aa_report``: A/A calibration. With ``[method] aa = true`` one configuration is measured
  twice, under its own key and as its twin (``aa=twin``), in the same interleaving. Each
  workload's twin-against-original gain is computed with the run's own method; how often it is
  called significant (Holm-adjusted, and unadjusted) is the method's false-difference rate here,
  and the A/A CI half-widths are the noise floor: a gain smaller than it is indistinguishable
  from measuring the same thing twice. ``mde`` of each gain is the minimal detectable effect at
  the rounds it reached.
"""

from __future__ import annotations

from collections.abc import Sequence

from iomatrix.analysis.effects import HOST, Gain, axes_of, gains
from iomatrix.analysis.points import only_configs
from iomatrix.core.model import Frozen
from iomatrix.store.records import ConfigRecord, StoredRun

AA = "aa"
"""The parameter that marks an A/A twin (``Configuration.aa``)."""
TWIN = "twin"


def is_twin(config: ConfigRecord) -> bool:
    return config.params.get(AA) == TWIN


def _source_of(run: StoredRun, twin: ConfigRecord) -> ConfigRecord | None:
    want = {k: v for k, v in twin.params.items() if k != AA}
    return next((c for c in run.configs if not is_twin(c) and c.mode == twin.mode
                 and c.params == want), None)


# --- A/A --------------------------------------------------------------------------------------

class AAReport(Frozen):
    """The A/A pair of a run: its configuration, per-workload gains and what they add up to."""

    config: str
    """The configuration measured twice (its label)."""
    gains: tuple[Gain, ...]
    """The twin against the original, per workload."""
    tested: int
    """Gains with a p-value."""
    significant: int
    """Called significantly different after Holm adjustment across the A/A family."""
    significant_raw: int
    """... before adjustment (p < 0.05): the per-comparison false-difference rate."""
    noise_floor: float | None
    """Median over workloads of the A/A 95 % CI half-width (relative): the smallest gain this
    run tells from measuring the same thing twice."""
    worst: float | None
    """The largest A/A CI half-width."""
    mde: float | None
    """Median minimal detectable effect (80 % power) of the A/A gains."""
    methods: tuple[str, ...]

    @property
    def rate(self) -> float | None:
        return self.significant_raw / self.tested if self.tested else None

    def text(self) -> str:
        if not self.tested:
            return f"A/A ({self.config}): no workload measured twice in two rounds or more"
        floor = "—" if self.noise_floor is None else f"±{self.noise_floor * 100:.1f} %"
        worst = "—" if self.worst is None else f"±{self.worst * 100:.1f} %"
        mde = "—" if self.mde is None else f"{self.mde * 100:.1f} %"
        return (f"A/A ({self.config} measured twice, {'/'.join(self.methods)}): "
                f"{self.significant_raw} of {self.tested} workloads called different at p < 0.05 "
                f"({self.significant} after Holm; expected about {0.05 * self.tested:.1f} by "
                f"chance); noise floor (median A/A 95 % CI) {floor}, widest {worst}; minimal "
                f"detectable effect {mde}")


def _median(xs: list[float]) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def aa_report(run: StoredRun, metric: str = "iops", *, paired: bool = True) -> AAReport | None:
    """The run's A/A calibration, or None when it measured no twin (``paired=False``: with the
    unpaired methods, for comparison)."""
    twin = next((c for c in run.configs if is_twin(c)), None)
    if twin is None:
        return None
    source = _source_of(run, twin)
    if source is None:
        return None
    sub = only_configs(run, {twin.key, source.key})
    # bare metal never takes part in gains: an A/A of the host baseline is compared under a
    # mode of its own
    sub = sub.model_copy(update={"configs": tuple(
        c.model_copy(update={"params": {**c.params, AA: TWIN if is_twin(c) else "original"},
                             "mode": "host-aa" if c.mode == HOST else c.mode})
        for c in sub.configs)})
    found = gains(sub, AA, metric=metric, reference="original", by=("workload",), paired=paired)
    tested = [g for g in found if g.p_value is not None]
    widths = [(g.high - g.low) / 2 for g in tested if g.low is not None and g.high is not None]
    return AAReport(
        config=source.label, gains=tuple(found), tested=len(tested),
        significant=sum(g.significant for g in tested),
        significant_raw=sum((g.p_value or 1.0) < 0.05 for g in tested),
        noise_floor=_median(widths), worst=max(widths) if widths else None,
        mde=_median([g.mde for g in tested if g.mde is not None]),
        methods=tuple(dict.fromkeys(g.method for g in tested)))


def noise_floor(run: StoredRun, metric: str = "iops") -> float | None:
    """The run's A/A noise floor (``AAReport.noise_floor``), or None without a twin."""
    aa = aa_report(run, metric)
    return aa.noise_floor if aa else None


# --- adaptive repetition on gains ---------------------------------------------------------------

Point = tuple[str, str]


MIN_ROUNDS = 3
"""A gain is finished only once paired over at least this many rounds (2 degrees of freedom):
a first round's spread across pairs is no measure of how well more rounds would know it."""


def _half(g: Gain) -> float | None:
    if g.method != "rounds" or (g.rounds or 0) < MIN_ROUNDS:
        return None
    return None if g.low is None or g.high is None else (g.high - g.low) / 2


def _members(run: StoredRun, configs: Sequence[ConfigRecord], axis: str, levels: set[str],
             workloads: set[str]) -> set[Point]:
    return {(c.key, w) for c in configs if c.params.get(axis) in levels for w in workloads}


def _axis_asks(run: StoredRun, target: float) -> tuple[int, set[Point]]:
    """(gains asked, points of the unfinished ones) for every mode's axes, per queue depth."""
    asked, wanting = 0, set()
    for mode in dict.fromkeys(c.mode for c in run.configs if c.mode != HOST):
        part = only_configs(run, {c.key for c in run.configs if c.mode == mode and not is_twin(c)})
        for axis in axes_of(part):
            for g in gains(part, axis, by=("iodepth",)):
                asked += 1
                half = _half(g)
                if half is not None and half <= target:
                    continue
                wl = {w.key for w in part.workloads if w.iodepth == g.iodepth}
                wanting |= _members(part, part.configs, axis, {g.level, g.reference}, wl)
    return asked, wanting


def _finding_asks(run: StoredRun, target: float) -> tuple[int, set[Point]]:
    """(checks asked, points of the undecided ones) of the run's findings."""
    from iomatrix.analysis.findings import CONFIRMED, CONTRADICTED, _workloads, claims_of, evaluate

    claims, _ = claims_of(run)
    if not claims:
        return 0, set()
    asked, wanting = 0, set()
    for result in evaluate(run, claims).results:
        f = result.finding
        for check in result.checks:
            if not check.measured and not check.components:
                continue   # not measurable here for a reason more rounds do not change
            asked += 1
            paired = bool(check.components) and all(
                c.method == "rounds" and (c.rounds or 0) >= MIN_ROUNDS for c in check.components)
            halves = [(c.high - c.low) / 2 for c in check.components
                      if c.low is not None and c.high is not None]
            within = len(halves) == len(check.components) and max(halves, default=1.0) <= target
            if paired and (within or check.verdict in (CONFIRMED, CONTRADICTED)):
                continue
            configs = [c for c in run.configs if c.mode == check.mode and not is_twin(c)
                       and all(c.params.get(a) in v for a, v in f.where.items())]
            wl = {w.key for w in _workloads(run, f)}
            if f.axis is not None:
                levels = {v for v in (f.level, f.reference, *f.best, *f.worst) if v} or \
                    {c.params.get(f.axis, "") for c in configs}
                wanting |= _members(run, configs, f.axis, levels, wl)
            else:
                wanting |= {(c.key, w) for c in configs for w in wl}
            if f.kind == "baseline":
                wanting |= {(c.key, w) for c in run.configs if c.mode == HOST for w in wl}
    return asked, wanting


def needing_more(run: StoredRun, target: float, candidates: Sequence[Point]) -> list[Point]:
    """The points of ``candidates`` the next adaptive round measures (see the module
    docstring): those of unfinished gains and their A/A twins; without any gain, those whose
    own IOPS CI is wider than ``target``."""
    asked_axes, wanting = _axis_asks(run, target)
    asked_findings, more = _finding_asks(run, target)
    wanting |= more
    if asked_axes + asked_findings == 0:
        from iomatrix.analysis.stats import needs_more

        iops: dict[Point, list[float]] = {}
        for t in run.trials:
            if t.status == "ok":
                iops.setdefault((t.config_key, t.workload_key), []).append(
                    sum(s.iops for s in t.samples))
        return [p for p in candidates if needs_more(iops.get(p, []), target)]
    twins = {}
    for c in run.configs:
        if is_twin(c):
            source = _source_of(run, c)
            if source is not None:
                twins[source.key] = c.key
    wanting |= {(twins[c], w) for c, w in wanting if c in twins}
    if wanting:
        # the bare-metal baseline stays in every round, so that bare metal pairs with each
        wanting |= {p for p in candidates if p[0].startswith(HOST + "/") or p[0] == HOST}
    return [p for p in candidates if p in wanting]


def stopping_rule(target: float | None, max_samples: int, samples: int) -> str:
    """What ``run --plan`` says about adaptive repetition."""
    if target is None:
        return (f"fixed rounds: {samples} per point; gains paired by round (drift common to a "
                "round cancels)")
    return (f"paired gains: after {samples} rounds, rounds continue (up to {max_samples}) while "
            f"some gain the run reports (each axis per queue depth, each finding) has a 95 % CI "
            f"wider than ±{target * 100:g} percentage points and is not decided; a round "
            "measures only the points of those gains. Gains are paired by round, so drift "
            "common to a round cancels and rounds, not trial length, narrow them: when drift "
            "dominates, shorter trials with more rounds reach the target sooner (iomatrix "
            "doctor estimates the drift). With no gain to ask about, points repeat until their "
            "own IOPS CI is within the target.")
