"""Findings: a study's conclusions, as its suite's [[finding]] tables state them, checked on a
stored run. For each claim: what the study found (its figure and citation), what this run
measured (the effect with its 95 % CI and a Holm-adjusted p), and a verdict.

Where the claims come from: the run's own suite text (a run keeps its [[finding]] tables), or,
for a run of a built-in suite stored without them, the built-in suite of that name.

How a claim is measured (every figure comes from ``effects.gains``: matched pairs of
configurations that differ only in the claim's axis, one sample → Welch/Fieller, several pairs →
geometric mean of ratios with a t-interval across pairs):

- In each mode it is checked in (``Finding.checked_modes``): guest, and also blocklayer for a
  claim about aio, cache, format or preallocation, so that it is measured natively even where
  guests run emulated. The first mode that measured it decides the claim's verdict (guest, the
  study's own, before blocklayer); every mode's check is kept.
- Only the configurations ``where`` allows and the workloads ``workloads`` picks take part; the
  pairs are pooled over those workloads (one gain), and split by ``per`` (one gain per level).
- effect: the gain of ``level`` over ``reference``. ranking: for each ``best`` level L, the gain
  of every other level over L (each must be worse); for each ``worst`` level, likewise (each must
  be better). baseline: each configuration's figure against bare metal's on the same workload
  (the host-mode point), as a gain whose reference is a copy of bare metal's point beside it.

Verdicts:

- **confirmed** / **contradicted** / **no significant difference** (effect, ranking): a claim
  holds when every one of its gains (each ``per`` level, each ranking comparison) goes the
  expected way; its p-value is the largest of theirs (an intersection-union test). When some go
  the other way, its p-value is the smallest of those times the number of gains (Bonferroni).
  These p-values are Holm-adjusted together across every check of the run's claims (one family;
  ``stats.adjust``); adjusted p < 0.05 confirms or contradicts, otherwise "no significant
  difference". With ``at_least`` (a size, "10%"), a claim whose 95 % CI lies wholly short of
  that size in any gain is contradicted: the run excludes an effect as large as claimed.
- **equivalence**: confirmed when every gain's 95 % CI lies within ±``margin``; contradicted
  when some gain's CI lies wholly outside it (beyond +margin or below −margin); otherwise
  **not decided**. The p-value shown (of any difference, Holm-adjusted with the others) does not
  decide it. **baseline**: confirmed when every CI of the fraction of bare metal lies at or
  above ``at_least``, contradicted when one lies wholly below it, otherwise not decided.
- **not measurable here**, with the reason: guests emulated under TCG (their figures measure
  QEMU's CPU emulator), no configuration of that mode, a level or workload the run lacks, no
  matched pair, or a single pair measured once (no CI and no test).

The CIs are 95 % per gain, not simultaneous; the family adjustment applies to the p-values.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from iomatrix.analysis.baselines import Straddle, run_versions, straddled
from iomatrix.analysis.effects import ALPHA, Gain, axes_of, gains
from iomatrix.analysis.metrics import METRICS
from iomatrix.analysis.pagecache import from_ram_by_level
from iomatrix.analysis.stalls import by_config
from iomatrix.analysis.stats import Comparison, adjust, percent_text
from iomatrix.core.errors import AnalysisError, SuiteError
from iomatrix.core.model import Frozen
from iomatrix.core.units import format_size
from iomatrix.store.records import ConfigRecord, Part, StoredRun, WorkloadRecord
from iomatrix.suite.findings import Finding
from iomatrix.vocab.words import Accelerator, Mode

CONFIRMED = "confirmed"
CONTRADICTED = "contradicted"
NO_DIFFERENCE = "no significant difference"
NOT_DECIDED = "not decided"
NOT_MEASURABLE = "not measurable here"
VERDICTS = (CONFIRMED, CONTRADICTED, NO_DIFFERENCE, NOT_DECIDED, NOT_MEASURABLE)
EMULATED = ("guests ran emulated under TCG: their figures measure QEMU's CPU emulator, not this "
            "hardware")
RULES = ("effect and ranking claims: confirmed or contradicted when the claim's p-value, "
         "Holm-adjusted across every check of this run's claims, is below 0.05 (every gain the "
         "expected way: the largest p; otherwise the smallest p of those the other way × their "
         "number); an at_least size whose 95 % CI falls wholly short contradicts. Equivalence: "
         "every 95 % CI within ±margin confirms, one wholly outside contradicts, otherwise not "
         "decided. Baseline: every 95 % CI of the fraction of bare metal at or above at_least "
         "confirms, one wholly below contradicts, otherwise not decided.")
_BARE = "bare metal"
_MEASURED = "measured"


class Component(Frozen):
    """One gain a check rests on: an effect at one ``per`` level, or one ranking comparison."""

    label: str
    """What it compares: "aio=native", "writeback vs directsync", "all"."""
    relative: float | None
    low: float | None
    high: float | None
    p_value: float | None
    pairs: int
    expect: Literal["better", "worse"] | None = None
    method: str | None = None
    """How the gain was estimated (``Gain.method``: "rounds" = paired by round)."""
    rounds: int | None = None
    verdict: str
    """The gain's own one line (``Gain.verdict``)."""


class Check(Frozen):
    """A claim as measured in one mode."""

    mode: str
    verdict: str
    reason: str = ""
    """Why not measurable, or what decided the verdict."""
    components: tuple[Component, ...] = ()
    relative: float | None = None
    """The gain that decided (the weakest one in the expected direction, or the strongest
    against it); for baseline, as a fraction of bare metal minus 1."""
    low: float | None = None
    high: float | None = None
    p_value: float | None = None
    adjusted_p: float | None = None
    family: int | None = None

    @property
    def measured(self) -> bool:
        return self.verdict != NOT_MEASURABLE


class FindingResult(Frozen):
    finding: Finding
    verdict: str
    mode: str | None
    """The mode whose check decided; None when no mode measured the claim."""
    checks: tuple[Check, ...]
    version_changes: tuple[Straddle, ...] = ()
    """Changes that move baselines between the study's versions (A) and the run's (B)."""

    @property
    def decisive(self) -> Check:
        """The check the verdict comes from (the first one when none measured)."""
        return next((c for c in self.checks if c.mode == self.mode), self.checks[0])


class RunFindings(Frozen):
    run_id: int
    source: str
    """Where the claims came from: "the run's suite" or "built-in suite NAME"."""
    results: tuple[FindingResult, ...]
    family: int
    """Checks whose p-values were adjusted together (Holm)."""
    rules: str = RULES
    stalls: tuple[str, ...] = ()
    """The configurations that stalled, each with its count (``analysis.stalls``): a finding
    of their own, whatever the claims."""


# --- the claims --------------------------------------------------------------------------------

def claims_of(run: StoredRun) -> tuple[tuple[Finding, ...], str]:
    """The run's claims and where they came from: its suite text's [[finding]] tables, else (a
    run of a built-in suite stored without them) the built-in suite's; none for other runs."""
    if (problem := run.suite.unloaded(Part.FINDINGS)) is not None:
        raise AnalysisError(f"run {run.id}: a [[finding]] table of its suite is invalid: "
                            f"{problem}")
    if run.suite.findings:
        return run.suite.findings, "the run's suite"
    name = run.suite.builtin
    if name is not None:
        from iomatrix.suite.load import load_suite

        try:
            suite = load_suite(name)
        except SuiteError:
            return (), "the run's suite"
        return suite.finding, f"built-in suite {name}"
    return (), "the run's suite"


# --- selecting what a claim is about ----------------------------------------------------------

def _where_text(where: dict[str, tuple[str, ...]]) -> str:
    return ", ".join(f"{a}={'/'.join(v)}" for a, v in where.items())


def _workload_filter_text(finding: Finding) -> str:
    w = finding.workloads
    parts = []
    if w.rw:
        parts.append("rw=" + "/".join(w.rw))
    if w.bs:
        parts.append("bs=" + "/".join(format_size(b) for b in w.bs))
    if w.iodepth:
        parts.append("QD " + "/".join(map(str, w.iodepth)))
    if w.numjobs:
        parts.append("numjobs=" + "/".join(map(str, w.numjobs)))
    if w.rate_iops:
        parts.append("rate_iops=" + "/".join(map(str, w.rate_iops)))
    return ", ".join(parts) or "every workload"


def _workloads(run: StoredRun, finding: Finding) -> list[WorkloadRecord]:
    w = finding.workloads
    return [r for r in run.workloads
            if (w.rw is None or r.rw in w.rw) and (w.bs is None or r.bs in w.bs)
            and (w.iodepth is None or r.iodepth in w.iodepth)
            and (w.numjobs is None or r.numjobs in w.numjobs)
            and (w.rate_iops is None or r.rate_iops in w.rate_iops)]


def _subrun(run: StoredRun, configs: Sequence[ConfigRecord], workloads: Sequence[WorkloadRecord],
            extra_trials: Sequence[object] = ()) -> StoredRun:
    keys = {c.key for c in configs}
    wkeys = {w.key for w in workloads}
    trials = tuple(t for t in run.trials if t.config_key in keys and t.workload_key in wkeys)
    return run.model_copy(update={"configs": tuple(configs), "workloads": tuple(workloads),
                                  "trials": trials + tuple(extra_trials)})


def _levels_present(configs: Sequence[ConfigRecord], axis: str) -> list[str]:
    return list(dict.fromkeys(c.params[axis] for c in configs if axis in c.params))


class _Raw(Frozen):
    """A check before the family's adjustment."""

    mode: str
    reason: str = ""
    components: tuple[Component, ...] = ()


def _component(gain: Gain, label: str, expect: Literal["better", "worse"] | None) -> Component:
    return Component(label=label, relative=gain.relative, low=gain.low, high=gain.high,
                     p_value=gain.p_value, pairs=gain.pairs, expect=expect, method=gain.method,
                     rounds=gain.rounds, verdict=gain.verdict)


def _held_label(gain: Gain, fixed: dict[str, str]) -> str:
    held = {**fixed, **gain.held}
    return ", ".join(f"{a}={v}" for a, v in held.items()) or "all"


def _measure(run: StoredRun, finding: Finding, mode: str) -> _Raw:
    """The gains a claim rests on in one mode, or why there are none."""
    by_key = {c.key: c for c in run.configs}
    if mode == Mode.GUEST and (run.accelerator == Accelerator.TCG or any(
            t.accelerator == Accelerator.TCG and by_key.get(t.config_key) is not None
            and by_key[t.config_key].mode == Mode.GUEST for t in run.trials)):
        return _Raw(mode=mode, reason=EMULATED)
    configs = [c for c in run.configs if c.mode == mode]
    if not configs:
        return _Raw(mode=mode, reason=f"this run has no {mode} configurations")
    configs = [c for c in configs
               if all(c.params.get(a) in values for a, values in finding.where.items())]
    if not configs:
        return _Raw(mode=mode, reason=f"no {mode} configuration of this run has "
                                      f"{_where_text(finding.where)}")
    workloads = _workloads(run, finding)
    if not workloads:
        return _Raw(mode=mode, reason="no workload of this run matches "
                                      + _workload_filter_text(finding))
    axis = finding.axis
    present = _levels_present(configs, axis) if axis else []
    wanted = [v for v in (finding.level, finding.reference, *finding.best, *finding.worst)
              if v is not None]
    missing = [v for v in dict.fromkeys(wanted) if v not in present]
    if axis and missing:
        where = f" with {_where_text(finding.where)}" if finding.where else ""
        return _Raw(mode=mode, reason=(
            f"{axis}={'/'.join(missing)} was not measured in {mode} mode here (its {mode} "
            f"configurations{where} have {axis}={', '.join(present) or 'none'})"))
    try:
        if finding.kind == "baseline":
            return _baseline(run, finding, mode, configs, workloads)
        sub = _subrun(run, configs, workloads)
        hold, fixed = _per(sub, finding)
        metric = METRICS[finding.metric].key
        assert axis is not None
        if finding.kind == "ranking":
            return _ranking(sub, finding, mode, present, hold, fixed)
        found = [g for g in gains(sub, axis, metric=metric, reference=finding.reference, by=(),
                                  hold=hold) if g.level == finding.level]
        expect = finding.expect if finding.kind == "effect" else None
        comps = tuple(_component(g, _held_label(g, fixed), expect) for g in found)
    except AnalysisError as exc:
        return _Raw(mode=mode, reason=str(exc))
    if not comps:
        return _Raw(mode=mode, reason=f"no two {mode} configurations differ only in {axis} "
                                      f"({finding.level} against {finding.reference}) on a "
                                      "workload measured on both")
    return _Raw(mode=mode, components=comps)


def _per(sub: StoredRun, finding: Finding) -> tuple[tuple[str, ...], dict[str, str]]:
    """The ``per`` axes that take two or more levels here (held apart), and those with one."""
    axes = axes_of(sub)
    hold = tuple(a for a in finding.per if a in axes)
    fixed = {a: v[0] for a in finding.per if a not in axes
             and (v := _levels_present(sub.configs, a))}
    return hold, fixed


def _ranking(sub: StoredRun, finding: Finding, mode: str, present: list[str],
             hold: tuple[str, ...], fixed: dict[str, str]) -> _Raw:
    assert finding.axis is not None
    among = [v for v in present if not finding.levels or v in finding.levels]
    comps: list[Component] = []
    for group, expect in ((finding.best, "worse"), (finding.worst, "better")):
        for level in group:
            others = [o for o in among if o not in group]
            for g in gains(sub, finding.axis, metric=finding.metric, reference=level, by=(),
                           hold=hold):
                if g.level in others:
                    held = _held_label(g, fixed)
                    label = f"{g.level} vs {level}" + ("" if held == "all" else f" ({held})")
                    comps.append(_component(g, label, expect))  # type: ignore[arg-type]
    if not comps:
        return _Raw(mode=mode, reason=f"no other {finding.axis} level to rank against in "
                                      f"{mode} mode here")
    return _Raw(mode=mode, components=tuple(comps))


def _baseline(run: StoredRun, finding: Finding, mode: str, configs: list[ConfigRecord],
              workloads: list[WorkloadRecord]) -> _Raw:
    """Each chosen configuration beside a copy of bare metal's point (on its own target) on the
    same workloads: a gain of axis "against" (measured over bare metal) is its fraction of bare
    metal − 1."""
    hosts = {c.key for c in run.configs if c.mode == Mode.HOST}
    if not hosts:
        return _Raw(mode=mode, reason="this run has no bare-metal baseline (host mode)")
    if finding.axis is not None:
        configs = [c for c in configs if c.params.get(finding.axis) == finding.level]
    configs = [c for c in configs if str(c.identity.baseline) in hosts]
    wkeys = {w.key for w in workloads}
    paired: list[ConfigRecord] = []
    copies = []
    for c in configs:
        bare = c.key + "#" + _BARE
        paired.append(c.model_copy(update={"params": {**c.params, "against": _MEASURED}}))
        paired.append(ConfigRecord(key=bare, label=_BARE, mode=c.mode,
                                   params={**c.params, "against": _BARE}))
        copies += [t.model_copy(update={"config_key": bare}) for t in run.trials
                   if t.config_key == str(c.identity.baseline) and t.workload_key in wkeys]
    sub = _subrun(run, paired, workloads, copies)
    hold, fixed = _per(sub, finding)
    found = [g for g in gains(sub, "against", metric=finding.metric, reference=_BARE, by=(),
                              hold=hold) if g.level == _MEASURED]
    if not found:
        return _Raw(mode=mode, reason="no workload was measured both here and on bare metal")
    return _Raw(mode=mode, components=tuple(_component(g, _held_label(g, fixed), None)
                                            for g in found))


# --- deciding ----------------------------------------------------------------------------------

def _goes(c: Component, finding: Finding) -> bool:
    """Whether a component's estimate goes the way its claim expects."""
    assert c.relative is not None
    improves = (c.relative > 0) != METRICS[finding.metric].lower_is_better
    return c.relative != 0 and improves == (c.expect == "better")


def _short(c: Component, finding: Finding) -> bool:
    """Whether a component's CI lies wholly short of the claim's ``at_least`` size."""
    assert finding.at_least is not None and c.low is not None and c.high is not None
    lower_better = METRICS[finding.metric].lower_is_better
    sign = 1 if (finding.expect == "better") != lower_better else -1
    return max(sign * c.low, sign * c.high) < finding.at_least


def _unmeasurable_pairs(raw: _Raw) -> str | None:
    lacking = [c for c in raw.components if c.p_value is None or c.low is None or c.high is None]
    if not lacking:
        return None
    c = lacking[0]
    return (f"{'' if c.label == 'all' else c.label + ': '}{c.pairs} matched pair{'s' if c.pairs != 1 else ''} with one sample per "
            "point: no confidence interval or test (more samples, or more workloads of the "
            "claim, would make it measurable)")


def _preliminary(raw: _Raw, finding: Finding) -> tuple[Comparison | None, Component | None, str]:
    """The check's p-value (as a Comparison for ``stats.adjust``), its deciding component and
    the hypothesis it tests ("confirm", "contradict", or a CI rule's verdict)."""
    comps = raw.components
    k = len(comps)
    if finding.kind in ("effect", "ranking"):
        against = [c for c in comps if not _goes(c, finding)]
        if against:
            head = min(against, key=lambda c: c.p_value or 0.0)
            p, hypothesis = min(1.0, k * (head.p_value or 0.0)), "contradict"
        else:
            head = max(comps, key=lambda c: c.p_value or 0.0)
            p, hypothesis = head.p_value or 0.0, "confirm"
    else:
        low_end = min(comps, key=lambda c: c.low or 0.0)
        high_end = max(comps, key=lambda c: c.high or 0.0)
        p = min(1.0, k * min(c.p_value or 0.0 for c in comps))
        if finding.kind == "equivalence":
            m = finding.margin or 0.0
            outside = [c for c in comps if (c.low or 0.0) > m or (c.high or 0.0) < -m]
            if outside:
                head, hypothesis = outside[0], CONTRADICTED
            elif all(-m <= (c.low or 0.0) and (c.high or 0.0) <= m for c in comps):
                head = max((low_end, high_end), key=lambda c: max(-(c.low or 0.0), c.high or 0.0))
                hypothesis = CONFIRMED
            else:
                head = max(comps, key=lambda c: max(-(c.low or 0.0) - m, (c.high or 0.0) - m))
                hypothesis = NOT_DECIDED
        else:
            a = (finding.at_least or 0.0) - 1.0
            head = low_end
            hypothesis = (CONFIRMED if all((c.low or 0.0) >= a for c in comps)
                          else CONTRADICTED if any((c.high or 0.0) < a for c in comps)
                          else NOT_DECIDED)
    comparison = Comparison(n_a=head.pairs, n_b=head.pairs, mean_a=None, mean_b=None,
                            relative=head.relative, low=head.low, high=head.high,
                            confidence=0.95, p_value=p, alpha=ALPHA, significant=p < ALPHA,
                            verdict="")
    return comparison, head, hypothesis


def _published_size(finding: Finding) -> str:
    assert finding.at_least is not None
    return f"{finding.at_least * 100:g} %"


def evaluate(run: StoredRun, claims: Sequence[Finding] | None = None) -> RunFindings:
    """Every claim of ``claims`` (default: ``claims_of(run)``) checked on ``run``."""
    source = "given"
    if claims is None:
        claims, source = claims_of(run)
    raws = [[_measure(run, f, mode) for mode in f.checked_modes] for f in claims]
    prelim: list[tuple[int, int, Comparison, Component, str]] = []
    notes: dict[tuple[int, int], str] = {}
    for i, (finding, checks) in enumerate(zip(claims, raws, strict=True)):
        for j, raw in enumerate(checks):
            if raw.reason:
                continue
            lacking = _unmeasurable_pairs(raw)
            if lacking:
                notes[(i, j)] = lacking
                continue
            comparison, head, hypothesis = _preliminary(raw, finding)
            assert comparison is not None and head is not None
            prelim.append((i, j, comparison, head, hypothesis))
    adjusted = adjust([c for _, _, c, _, _ in prelim])
    decided: dict[tuple[int, int], Check] = {}
    for (i, j, _, head, hypothesis), c in zip(prelim, adjusted, strict=True):
        finding, raw = claims[i], raws[i][j]
        verdict, reason = _decide(finding, raw, head, hypothesis, c)
        reason += _ram_caveat(run, finding, raw.mode)
        decided[(i, j)] = Check(mode=raw.mode, verdict=verdict, reason=reason,
                                components=raw.components, relative=head.relative, low=head.low,
                                high=head.high, p_value=c.p_value, adjusted_p=c.adjusted_p,
                                family=c.family)
    results = []
    versions = run_versions(run)
    for i, (finding, checks) in enumerate(zip(claims, raws, strict=True)):
        out = []
        for j, raw in enumerate(checks):
            if (i, j) in decided:
                out.append(decided[(i, j)])
            else:
                out.append(Check(mode=raw.mode, verdict=NOT_MEASURABLE,
                                 reason=notes.get((i, j), raw.reason),
                                 components=raw.components))
        first = next((c for c in out if c.measured), None)
        results.append(FindingResult(finding=finding,
                                     verdict=first.verdict if first else NOT_MEASURABLE,
                                     mode=first.mode if first else None, checks=tuple(out),
                                     version_changes=straddled(finding.versions, versions)))
    return RunFindings(run_id=run.id, source=source, results=tuple(results), family=len(prelim),
                       stalls=tuple(s.text for s in by_config(run)))


def _ram_caveat(run: StoredRun, finding: Finding, mode: str) -> str:
    """For a claim about cache modes: how many of the compared levels' points in ``mode`` were
    served from the host page cache (``analysis.pagecache``), so that a verdict resting on RAM
    says so, as ``recommend`` does; "" when none was."""
    if finding.axis != "cache":
        return ""
    levels = {x for x in (finding.level, finding.reference, *finding.best, *finding.worst,
                          *finding.levels) if x is not None}
    counts = from_ram_by_level(run, "cache", levels, mode)
    served = [f"cache={level}: {c.from_ram} of {c.points}" for level, c in sorted(counts.items())
              if c.from_ram]
    if not served:
        return ""
    return ("; points served from the host page cache (RAM, not storage): "
            + ", ".join(served))


def _decide(finding: Finding, raw: _Raw, head: Component, hypothesis: str,
            c: Comparison) -> tuple[str, str]:
    p = f"Holm-adjusted p = {c.adjusted_p:.3g} across {c.family} checks"
    if finding.kind in ("effect", "ranking"):
        if finding.at_least is not None:
            short = [x for x in raw.components if _short(x, finding)]
            if short:
                return CONTRADICTED, (f"{short[0].label}: the 95 % CI excludes an effect as large "
                                      f"as {_published_size(finding)}")
        if not c.significant:
            return NO_DIFFERENCE, p
        if hypothesis == "confirm":
            n = len(raw.components)
            return CONFIRMED, (f"{'every one of ' + str(n) + ' gains' if n > 1 else 'the gain'} "
                               f"goes the way the study found; {p}")
        return CONTRADICTED, f"{head.label} goes the other way; {p}"
    if finding.kind == "equivalence":
        m = f"±{(finding.margin or 0) * 100:g} %"
        why = {CONFIRMED: f"every 95 % CI lies within {m}",
               CONTRADICTED: f"{head.label}: the 95 % CI lies wholly outside {m}",
               NOT_DECIDED: f"{head.label}: the 95 % CI reaches beyond {m} without lying "
                            "wholly outside it"}[hypothesis]
        return hypothesis, why
    a = _published_size(finding)
    why = {CONFIRMED: f"every 95 % CI lies at or above {a} of bare metal",
           CONTRADICTED: f"{head.label}: the 95 % CI lies wholly below {a} of bare metal",
           NOT_DECIDED: f"{head.label}: the 95 % CI spans {a} of bare metal"}[hypothesis]
    return hypothesis, why


# --- text ----------------------------------------------------------------------------------------

def effect_text(finding: Finding, check: Check) -> str:
    """The deciding figure of a check as one short text: "+8.1 % (95 % CI +3.0 … +13 %)", or
    "93.1 % of bare metal (95 % CI …)"; "—" when not measured."""
    if check.relative is None:
        return "—"
    if finding.kind == "baseline":
        def pct(x: float | None) -> str:
            return "—" if x is None else f"{(1 + x) * 100:.1f} %"
        return f"{pct(check.relative)} of bare metal (95 % CI {pct(check.low)} … {pct(check.high)})"
    ci = ("" if check.low is None or check.high is None else
          f" (95 % CI {percent_text(check.low)} … {percent_text(check.high)} %)")
    return f"{percent_text(check.relative)} %{ci}"


def check_text(finding: Finding, check: Check) -> str:
    """One line for a check: its verdict, the figure and why."""
    if not check.measured:
        return f"{check.mode}: {NOT_MEASURABLE}: {check.reason}"
    what = METRICS[finding.metric].name
    return f"{check.mode}: {check.verdict}: {what} {effect_text(finding, check)}; {check.reason}"
