"""What a run asks of its gains, and how well its own method tells identical things apart.

- How many rounds a run measures is fixed before its rounds start: by ``samples``, or by a
  pilot (``analysis.trialplan``) for ``pilot`` and ``target_ci``. No look at the gains decides
  when to stop (adaptive repetition on gains, which stopped once every gain looked narrow
  enough, called an A/A pair different in 7-10 % of runs at a nominal 5 %; removed).
- ``aa_report``: A/A calibration. With ``[method] aa = true`` one configuration is measured
  twice, under its own key and as its twin (``aa=twin``), in the same interleaving. Each
  workload's twin-against-original gain is computed with the run's own method; how often it is
  called significant (Holm-adjusted, and unadjusted) is the method's false-difference rate here,
  and the A/A CI half-widths are the noise floor: a gain smaller than it is indistinguishable
  from measuring the same thing twice. ``mde`` of each gain is the minimal detectable effect at
  the rounds it reached.
"""

from __future__ import annotations

from iomatrix.analysis.effects import Gain, gains
from iomatrix.analysis.points import only_configs
from iomatrix.core.model import Frozen
from iomatrix.store.records import ConfigRecord, StoredRun
from iomatrix.vocab.words import Mode

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
                             "mode": "host-aa" if c.mode == Mode.HOST else c.mode})
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


def stopping_rule(samples: int) -> str:
    """What ``run --plan`` says of a run whose rounds no pilot chooses (no target_ci)."""
    return (f"fixed rounds: {samples} per point; gains paired by round (drift common to a "
            "round cancels)")
