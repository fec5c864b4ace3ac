"""The report's view model: everything a page draws, JSON-ready, built from a stored run.
Drawing code (``iomatrix.report.html``) reads only this.

Every figure here was measured or is computed from measured figures by ``iomatrix.analysis``
(means, confidence intervals, gains, scores, % of bare metal). A value that was not measured is
None, never 0 or a guess. Points are indexed (``PointView.config``/``workload`` point into
``ReportData.configs``/``workloads``) so that a run of 10,000 points stays a few MB of JSON.
"""

from __future__ import annotations

import gc
import math
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from statistics import fmean
from typing import TYPE_CHECKING, Any, NamedTuple

from iomatrix.core.units import format_size
from iomatrix.report.levers import LeverView, family_label, levers_of
from iomatrix.core.model import Frozen, shown
from iomatrix.suite.method import Method
from iomatrix.suite.workloads import Ioping, block_sizes
from iomatrix.vocab.words import Accelerator, TrialStatus

from iomatrix.analysis.scaling import ScalingCurve, scaling

if TYPE_CHECKING:
    from iomatrix.analysis.points import Point
    from iomatrix.store.records import StoredRun, TrialRecord, WorkloadRecord

DEFAULT_CI_TARGET = 0.05
"""The CI half-width (fraction of the mean) above which a point is flagged when the suite set no
``target_ci``: pbench-fio's 5 % acceptance limit."""
GAIN_METRICS = ("iops", "lat_mean_ns")
"""The metrics whose gains per queue depth the report shows (a selector picks one), as seed 000
shows them. Bandwidth is left out: on one workload it is IOPS × block size, so its gains are the
IOPS gains; p99 is left out because each metric costs one ``effects.gains`` call per axis."""
STEADY_MISSED = "steady"
CI_OVER = "ci"
FAILED = "failed"
FROM_RAM = "ram"
STALLED = "stalled"
FASTER_THAN_BARE = "bare"
TCG_TAG = " [emulated: TCG]"


class ConfigView(Frozen):
    """One configuration of the run."""

    key: str
    """Stable identifier, e.g. "blocklayer/aio=native/cache=none/format=raw"."""
    label: str
    """Short human label, e.g. "blocklayer native/none/raw"; ends in "[emulated: TCG]" when its
    guests were emulated."""
    mode: str
    """host | blocklayer | guest"""
    params: dict[str, str]
    """Axis name → value as the suite wrote it (controller, aio, iothread, cache, format, ...)."""
    applied: dict[str, str] = {}
    """What QEMU really applied, as verified (e.g. "file.cache.direct": "true", "aio": "native")."""
    accelerator: str = "none"
    """"tcg" when this configuration's guests were emulated: its label then says so too."""
    family: str | None = None
    """With a vms axis: the label of this configuration without its VM count (one scaling
    curve per family)."""
    levers: dict[str, LeverView] = {}
    """Lever (``LEVERS``) → where this configuration sits on its chart, for the levers the run
    varies; absent where it takes no part (host mode, no IOThread count)."""


class GroupView(Frozen):
    """Workloads that share one chart: same rw, bs, numjobs and rate limit; x is iodepth."""

    slug: str
    title: str
    rw: str
    bs: int
    numjobs: int
    rate_iops: int | None = None


class WorkloadView(Frozen):
    key: str
    label: str
    rw: str
    bs: int
    bs_label: str
    """The block size as the suite would write it: "4k", or the split fio draws sizes from
    ("bssplit 4k/50:64k/50")."""
    iodepth: int
    numjobs: int
    rate_iops: int | None = None
    group: int
    """Index into ``ReportData.groups``."""


class PointView(Frozen):
    """All ok samples of one (configuration, workload), reduced to means; ns and bytes/s.
    ``*_low``/``*_high`` bound a 95 % confidence interval of the mean (None below 2 samples)."""

    config: int
    """Index into ``ReportData.configs``."""
    workload: int
    """Index into ``ReportData.workloads``."""
    samples: int
    stalled: int = 0
    """Its stalled trials: out of its figures unless ``--with-stalled``."""
    failed: int = 0
    iops: float | None = None
    """Read + write IOPS."""
    iops_low: float | None = None
    iops_high: float | None = None
    ci_relative: float | None = None
    """Half-width of the IOPS CI as a fraction of the mean."""
    read_iops: float | None = None
    write_iops: float | None = None
    bw_bytes: float | None = None
    bw_low: float | None = None
    bw_high: float | None = None
    lat_mean_ns: float | None = None
    lat_mean_low: float | None = None
    lat_mean_high: float | None = None
    lat_p50_ns: float | None = None
    """Percentiles: of the point's one direction; None for a mixed workload (``read_*``,
    ``write_*``: percentiles of reads and writes are never averaged)."""
    lat_p99_ns: float | None = None
    lat_p99_low: float | None = None
    lat_p99_high: float | None = None
    read_lat_p50_ns: float | None = None
    """A mixed workload's reads and writes, each on its own."""
    read_lat_p99_ns: float | None = None
    write_lat_p50_ns: float | None = None
    write_lat_p99_ns: float | None = None
    usr_cpu: float | None = None
    sys_cpu: float | None = None
    """fio's own usr/sys CPU %."""
    cpu_us_per_io: float | None = None
    """Host CPU time per I/O of every process serving the disk (QEMU threads, fio), µs."""
    cpu_ms_per_mib: float | None = None
    csw_per_io: float | None = None
    """Voluntary context switches per I/O."""
    cycles_per_io: float | None = None
    """CPU cycles per I/O counted by perf, where perf could count."""
    cpu_roles: dict[str, float] = {}
    """Role (vcpu, iothread, main loop, worker pool, daemon, fio (host), ...) → µs per I/O."""
    steady_checked: int = 0
    """Samples on which the SNIA steady-state rule was checked."""
    steady_reached: int = 0
    iops_pct: float | None = None
    """IOPS as % of the host (bare-metal) point of the same workload."""
    bare_significant: bool | None = None
    """Whether those IOPS differ significantly from bare metal's (Welch, Holm-adjusted across
    the run); None when untested (fewer than 2 samples on a side)."""
    bw_pct: float | None = None
    added_lat_us: float | None = None
    """Mean latency minus the bare-metal mean latency, µs."""
    added_p99_us: float | None = None
    vm_iops: tuple[float, ...] = ()
    """Each guest's mean IOPS, when several guests ran the point."""
    flags: tuple[str, ...] = ()
    """Why this point deserves less trust: ``STEADY_MISSED`` (some sample did not reach steady
    state), ``CI_OVER`` (the IOPS CI is wider than the target), ``FAILED`` (some sample failed),
    ``FROM_RAM`` (served from the host page cache: ``analysis.pagecache.RULE``), ``STALLED``
    (``analysis.stalls.RULE``), ``FASTER_THAN_BARE`` (``analysis.impossible.RULE``).
    A point with one sample has no CI and is not flagged for it (the quality summary counts
    them)."""


class GainView(Frozen):
    """One level of an axis against its reference at one queue depth (``analysis.effects``)."""

    level: str
    held: dict[str, str] = {}
    iodepth: int | None = None
    pairs: int
    relative: float | None = None
    low: float | None = None
    high: float | None = None
    p_value: float | None = None
    adjusted_p: float | None = None
    significant: bool
    better: bool | None = None
    """True: the level is significantly better than the reference; False: significantly worse;
    None: no significant difference."""
    verdict: str
    method: str = ""
    """How it was estimated: "paired: 5 rounds", "unpaired: across pairs", "unpaired: Welch"."""
    mde: float | None = None
    """Minimal detectable effect (relative) at the rounds or pairs reached."""
    noise_floor: float | None = None
    """The run's A/A noise floor (relative CI half-width of an identical pair); None without
    an A/A twin."""


class GainSetView(Frozen):
    """The gains of one ``effects.gains`` call: one chart."""

    axis: str
    reference: str
    metric: str
    """A key of ``analysis.metrics.METRICS`` (iops, lat_mean_ns, ...)."""
    hold: tuple[str, ...] = ()
    gains: tuple[GainView, ...]


class ComponentView(Frozen):
    name: str
    figure: str
    """A key of ``analysis.metrics.METRICS`` (iops, lat_mean_ns, ...)."""
    label: str
    """E.g. "IOPS · 512 randread QD128"."""
    lower_is_better: bool
    minimum: float | None = None
    maximum: float | None = None
    constant: bool = False


class ScoreRowView(Frozen):
    config: int
    """Index into ``ReportData.configs``."""
    values: dict[str, float | None]
    normalized: dict[str, float | None]
    score: float | None = None
    rank: int | None = None


class ScoresView(Frozen):
    """Seed 002's normalized scores (``analysis.scores``), best first; lower is better."""

    components: tuple[ComponentView, ...]
    rows: tuple[ScoreRowView, ...]
    method: str
    caveat: str
    notes: tuple[str, ...] = ()


class DecisionView(Frozen):
    """What to do with one parameter on one platform, and why (``recommend.Decision``)."""

    name: str
    what: str
    default: str
    value: str | None = None
    status: str
    reason: str
    mode: str | None = None
    levels: tuple[str, ...] = ()
    evidence: tuple[str, ...] = ()
    caveat: str = ""


class RecommendationView(Frozen):
    platform: str
    title: str
    storage: str
    measured_on: str = ""
    """The storage the evidence comes from (``Recommendation.measured_on``)."""
    decisions: tuple[DecisionView, ...]
    text: str
    """Ready to paste (``qm set`` line, domain XML, QEMU arguments); "" when it could not be
    rendered (``text_notes`` says why)."""
    text_notes: tuple[str, ...] = ()
    fixed: dict[str, str] = {}
    """Mode → the settings all its configurations shared ("aio=native, cache=none")."""
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    yours: str = ""
    """The recommendation relative to the user's VM (a run made with [matrix] from_vm)."""


class FindingView(Frozen):
    """One claim of the study the suite transcribes, checked on the run
    (``iomatrix.analysis.findings``)."""

    id: str
    study: str
    """The citation: seed and section."""
    claim: str
    published: str
    verdict: str
    """confirmed, contradicted, no significant difference, not decided, not measurable here."""
    mode: str | None = None
    """The mode whose check decided; None when none measured the claim."""
    measured: str = "—"
    """The deciding effect with its 95 % CI, as text."""
    adjusted_p: float | None = None
    checks: tuple[str, ...] = ()
    """One line per mode checked: its verdict, figure and reason."""


class QualityView(Frozen):
    """How far the run's figures can be trusted, counted."""

    trials_ok: int
    trials_failed: int
    points: int
    points_without_ci: int
    """Points with fewer than 2 ok samples: no confidence interval."""
    points_ci_over: int
    ci_target: float
    ci_target_source: str
    steady_checked: int
    """Trials on which the steady-state rule was checked."""
    steady_reached: int
    steady_unchecked: dict[str, int] = {}
    """Why the rule was not checked → how many trials."""
    points_steady_missed: int
    points_flagged: int
    points_page_cache: int = 0
    """Points of configurations that read and write through the host page cache."""
    points_from_ram: int = 0
    """Of those, the points served from RAM (``analysis.pagecache.RULE``)."""
    points_ram_unknown: int = 0
    """Of those, the points whose share reaching the device could not be measured."""
    ram_rule: str = ""
    ram_unknown: tuple[str, ...] = ()
    """Why the share is unknown, each reason once."""
    stalls: tuple[str, ...] = ()
    """The configurations that stalled, each with its count (``analysis.stalls.RULE``)."""
    points_faster: int = 0
    """Points faster than the run's bare metal (``analysis.impossible.RULE``)."""
    stall_rule: str = ""
    faster_rule: str = ""


class FailureView(Frozen):
    config: int
    workload: int
    sample_index: int
    reason: str


class ReportData(Frozen):
    """A whole run, ready to draw."""

    run_id: int
    suite_name: str
    suite_description: str = ""
    created_at: str
    finished_at: str | None = None
    status: str
    accelerator: str
    """"kvm", "tcg" or "none" (no guest: host and blocklayer modes)."""
    emulated: bool
    """True when any sample was measured under TCG: the page must say so."""
    host: dict[str, str]
    """Host metadata: hostname, kernel, cpu, cores, memory, qemu, fio, target filesystem, ..."""
    method: dict[str, str] = {}
    """The suite's [method] settings as it wrote them (none are filled in from defaults)."""
    latency_mean: str = "lat"
    """The fio latency the mean latencies are of: "lat" (total) or "clat" (completion)."""
    latency_percentiles: str = "lat"
    """The fio latency the percentiles are of."""
    latency_note: str = ""
    """What the latency columns are, in a sentence (``metrics.RunLatency.sentence``)."""
    notes: tuple[str, ...] = ()
    """Skipped invalid combinations, ignored axes, and other things the reader must know."""
    axes: dict[str, tuple[str, ...]] = {}
    """Every configuration axis that takes two or more values (and "mode" when the run has
    several), with its values in order of first use."""
    configs: tuple[ConfigView, ...]
    groups: tuple[GroupView, ...] = ()
    workloads: tuple[WorkloadView, ...] = ()
    points: tuple[PointView, ...]
    gains: tuple[GainSetView, ...] = ()
    aa: str = ""
    """The A/A calibration in a sentence (``analysis.paired.AAReport.text``); empty without."""
    scores: ScoresView | None = None
    scores_absent: str = ""
    """Why there are no scores, when there are none."""
    recommendations: tuple[RecommendationView, ...] = ()
    recommendation_rule: str = ""
    quality: QualityView
    failures: tuple[FailureView, ...] = ()
    iomatrix_version: str
    samples_csv: str = ""
    findings: tuple[FindingView, ...] = ()
    """The study's claims checked on this run; empty when its suite states none."""
    findings_rules: str = ""
    """How findings are decided, in words."""
    node_scaling: tuple["ScalingCurve", ...] = ()
    """A cluster-load run with node counts: each family's figures against the number of nodes
    (``analysis.scaling``)."""
    """The raw samples as CSV (``iomatrix.report.export.samples_csv``), offered for download."""


# --- building ----------------------------------------------------------------------------------


def build_report_data(run: "StoredRun") -> ReportData:
    """The view model of a stored run."""
    with _cyclic_gc_paused():
        return _build(run)


@contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off while the view model is built, as it was before after.
    A 10,000-point run is millions of objects that all live until the page is written; every
    full collection walks them all again, for nothing (the analysis makes no cycles): a fifth
    of the time. Reference counting still frees everything that is dropped."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _build(run: "StoredRun") -> ReportData:
    from iomatrix import __version__
    from iomatrix.analysis.efficiency import efficiency
    from iomatrix.analysis.impossible import of_run
    from iomatrix.analysis.metrics import run_latency
    from iomatrix.analysis.points import points
    from iomatrix.report.export import samples_csv

    pts = points(run)
    configs = _configs(run)
    groups, workloads = _workloads(run)
    config_index = {c.key: i for i, c in enumerate(configs)}
    workload_index = {w.key: i for i, w in enumerate(workloads)}
    target, source = _ci_target(run.suite.method)
    eff = efficiency(pts, run.configs)
    faster = of_run(run)
    trials: dict[tuple[str, str], list[TrialRecord]] = defaultdict(list)
    for trial in run.trials:
        if trial.status == TrialStatus.OK:
            trials[(trial.config_key, trial.workload_key)].append(trial)
    views = [_point(p, config_index[p.config_key], workload_index[p.workload_key],
                    trials.get((p.config_key, p.workload_key), []),
                    eff.get((p.config_key, p.workload_key)), target,
                    faster=(p.config_key, p.workload_key) in faster)
             for p in pts if p.samples > 0]
    failures = tuple(FailureView(config=config_index[t.config_key],
                                 workload=workload_index[t.workload_key],
                                 sample_index=t.sample_index, reason=t.reason or "")
                     for t in run.trials if t.status == TrialStatus.FAILED)
    latency = run_latency(run)
    scores, scores_absent = _scores(run, config_index)
    recommendations, recommendation_rule = _recommendations(run)
    findings, findings_rules = _findings(run)
    return ReportData(
        latency_mean=latency.mean, latency_percentiles=latency.percentiles,
        latency_note=latency.sentence,
        run_id=run.id, suite_name=run.suite.name, suite_description=run.suite.description,
        created_at=run.created_at, finished_at=run.finished_at, status=run.status,
        accelerator=run.accelerator, emulated=run.emulated, host=run.host,
        method={k: shown(v) for k, v in run.suite.written_method.items()}, notes=run.notes,
        axes=_axes(configs), configs=configs, groups=groups, workloads=workloads,
        points=tuple(views), gains=_gains(run), aa=_aa(run), scores=scores,
        scores_absent=scores_absent, recommendations=recommendations,
        recommendation_rule=recommendation_rule, quality=_quality(run, views, target, source),
        failures=failures, iomatrix_version=__version__, samples_csv=samples_csv(run),
        findings=findings, findings_rules=findings_rules, node_scaling=tuple(scaling(run)))


def _findings(run: "StoredRun") -> tuple[tuple[FindingView, ...], str]:
    """The study's claims (its suite's [[finding]] tables) checked on the run."""
    from iomatrix.analysis.findings import NOT_MEASURABLE, check_text, effect_text, evaluate

    found = evaluate(run)
    views = []
    for r in found.results:
        check = r.decisive
        measured = r.verdict != NOT_MEASURABLE
        views.append(FindingView(
            id=r.finding.id, study=r.finding.study, claim=r.finding.claim,
            published=r.finding.published, verdict=r.verdict, mode=r.mode,
            measured=effect_text(r.finding, check) if measured else "—",
            adjusted_p=check.adjusted_p if measured else None,
            checks=tuple(check_text(r.finding, c) for c in r.checks)))
    return tuple(views), found.rules if views else ""


def _configs(run: "StoredRun") -> tuple[ConfigView, ...]:
    applied: dict[str, dict[str, str]] = {}
    accel: dict[str, str] = {}
    for trial in run.trials:
        if trial.applied and trial.config_key not in applied:
            applied[trial.config_key] = trial.applied
        if trial.accelerator != "none":
            accel[trial.config_key] = trial.accelerator
    scaling = len({c.params.get("vms") for c in run.configs if "vms" in c.params}) >= 2
    on_levers = levers_of(run.configs)
    out = []
    for c in run.configs:
        tcg = TCG_TAG if accel.get(c.key) == Accelerator.TCG else ""
        family = family_label(c.mode, c.params) + tcg if scaling and "vms" in c.params else None
        levers = {lever: view.model_copy(update={"family": view.family + tcg})
                  for lever, view in on_levers.get(c.key, {}).items()}
        out.append(ConfigView(key=c.key, label=c.label + tcg, mode=c.mode, params=c.params,
                              applied=applied.get(c.key, {}), accelerator=accel.get(c.key, "none"),
                              family=family, levers=levers))
    return tuple(out)


def _axes(configs: Sequence[ConfigView]) -> dict[str, tuple[str, ...]]:
    levels: dict[str, list[str]] = {}
    modes = list(dict.fromkeys(c.mode for c in configs))
    if len(modes) >= 2:
        levels["mode"] = modes
    for c in configs:
        for axis, value in c.params.items():
            seen = levels.setdefault(axis, [])
            if value not in seen:
                seen.append(value)
    return {axis: tuple(values) for axis, values in levels.items() if len(values) >= 2}


def _workloads(run: "StoredRun") -> tuple[tuple[GroupView, ...], tuple[WorkloadView, ...]]:
    """Chart groups (rw in order of first appearance, then bs, numjobs, rate ascending) and the
    workloads, each pointing at its group."""
    rw_order: dict[str, int] = {}
    keys = set()
    for w in run.workloads:
        rw_order.setdefault(w.rw, len(rw_order))
        keys.add(_group_key(w))
    ordered = sorted(keys, key=lambda k: (k[4], rw_order[k[0]], k[1], k[2],
                                          -1 if k[3] is None else k[3]))
    groups = tuple(_group(*k) for k in ordered)
    index = {k: i for i, k in enumerate(ordered)}
    workloads = tuple(
        WorkloadView(key=w.key, label=w.label, rw=w.rw, bs=w.bs,
                     bs_label=block_sizes(w.bs, w.options), iodepth=w.iodepth,
                     numjobs=w.numjobs, rate_iops=w.rate_iops or None, group=index[_group_key(w)])
        for w in run.workloads)
    return groups, workloads


def _group_key(w: "WorkloadRecord") -> tuple[str, int, int, int | None, str]:
    """A workload's chart group: rw, bs, jobs, rate; an ioping workload (paced) has its own."""
    spec = Ioping.of_key(w.key)
    return (w.rw, w.bs, w.numjobs, w.rate_iops or None, spec.token if spec else "")


def _group(rw: str, bs: int, numjobs: int, rate: int | None, ioping: str = "") -> GroupView:
    jobs = "1 job" if numjobs == 1 else f"{numjobs} jobs"
    parts = [rw, format_size(bs), jobs]
    slug = f"{rw}-{format_size(bs)}-j{numjobs}"
    if rate is not None:
        parts.append(f"rate {rate:,} IOPS")
        slug += f"-r{rate}"
    if ioping:
        spec = Ioping.of_key(ioping)
        assert spec is not None
        parts = [f"ioping -c {spec.count} -i {spec.interval_text}", format_size(bs),
                 "one request per interval: its IOPS are its pace, its latency the figure "
                 "(seed 001 §9)"]
        slug += f"-ioping-c{spec.count}-i{spec.interval_text}"
    return GroupView(slug=slug, title=" · ".join(parts), rw=rw, bs=bs, numjobs=numjobs,
                     rate_iops=rate)


def _ci_target(method: Method) -> tuple[float, str]:
    """The suite's target_ci, or the report's default when it set none (or one we cannot read)."""
    if method.target_ci is not None:
        return method.target_ci, "the suite's target_ci"
    return DEFAULT_CI_TARGET, "the report's default (the suite set no target_ci)"


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _mean(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None and math.isfinite(v)]
    return fmean(present) if present else None


def _interval(values: Sequence[float]) -> tuple[float | None, float | None]:
    from iomatrix.analysis.stats import interval_bounds

    low, high = interval_bounds(values)
    return _finite(low), _finite(high)


class _Cpu(NamedTuple):
    """A point's CPU cost beyond its µs per I/O (``_cpu``)."""

    cpu_ms_per_mib: float | None
    csw_per_io: float | None
    cycles_per_io: float | None
    cpu_roles: dict[str, float]


def _cpu(trials: Sequence["TrialRecord"]) -> _Cpu:
    """Means over the samples that recorded CPU cost (µs per I/O is the point's own); roles as
    µs per I/O."""
    costs = [t.cpu for t in trials if t.cpu]
    if not costs:
        return _Cpu(None, None, None, {})
    roles: dict[str, list[float]] = defaultdict(list)
    for cost in costs:
        ios = cost.ios
        if not ios:
            continue
        for role, seconds in cost.cpu_s_by_role.items():
            roles[role].append(seconds / ios * 1e6)
    return _Cpu(cpu_ms_per_mib=_mean(c.cpu_ms_per_mib for c in costs),
                csw_per_io=_mean(c.csw_per_io for c in costs),
                cycles_per_io=_mean(c.cycles_per_io for c in costs),
                cpu_roles={role: fmean(v) for role, v in roles.items()})


def _vm_iops(trials: Sequence["TrialRecord"]) -> tuple[float, ...]:
    if not any(t.vm_samples for t in trials):   # one guest: most points of most runs
        return ()
    per_vm: dict[int, list[float]] = defaultdict(list)
    for t in trials:
        sums: dict[int, float] = defaultdict(float)
        for s in t.vm_samples:
            if s.vm is not None:
                sums[s.vm] += s.iops
        for vm, iops in sums.items():
            per_vm[vm].append(iops)
    return tuple(fmean(per_vm[vm]) for vm in sorted(per_vm))


def _point(p: "Point", config: int, workload: int, trials: Sequence["TrialRecord"],
           eff: Any, target: float, *, faster: bool = False) -> PointView:
    ci = p.iops_ci
    bw_low, bw_high = _interval(p.bw_samples)
    mean_low, mean_high = _interval(p.lat_mean_samples)
    p99_low, p99_high = _interval(p.lat_p99_samples)
    checked, reached = p.steady_checked, p.steady_reached
    relative = _finite(ci.relative) if ci is not None else None
    flags = []
    if checked > reached:
        flags.append(STEADY_MISSED)
    if p.samples >= 2 and relative is not None and relative > target:
        flags.append(CI_OVER)
    if p.failed:
        flags.append(FAILED)
    if p.from_ram:
        flags.append(FROM_RAM)
    if p.stalled:
        flags.append(STALLED)
    if faster:
        flags.append(FASTER_THAN_BARE)
    cpu = _cpu(trials)
    return PointView(
        config=config, workload=workload, samples=p.samples, failed=p.failed, stalled=p.stalled,
        iops=_finite(p.iops), iops_low=_finite(ci.low) if ci else None,
        iops_high=_finite(ci.high) if ci else None, ci_relative=relative,
        read_iops=_finite(p.read_iops), write_iops=_finite(p.write_iops),
        bw_bytes=_finite(p.bw_bytes), bw_low=bw_low, bw_high=bw_high,
        lat_mean_ns=_finite(p.lat_mean_ns), lat_mean_low=mean_low, lat_mean_high=mean_high,
        lat_p50_ns=_finite(p.lat_p50_ns), lat_p99_ns=_finite(p.lat_p99_ns),
        lat_p99_low=p99_low, lat_p99_high=p99_high,
        **{f"{name}_{field}": _finite(getattr(d, field)) for name, d in p.directions.items()
           for field in ("lat_p50_ns", "lat_p99_ns")},
        usr_cpu=_finite(p.usr_cpu), sys_cpu=_finite(p.sys_cpu),
        cpu_us_per_io=_finite(p.cpu_us_per_io), cpu_ms_per_mib=cpu.cpu_ms_per_mib,
        csw_per_io=cpu.csw_per_io, cycles_per_io=cpu.cycles_per_io, cpu_roles=cpu.cpu_roles,
        steady_checked=checked, steady_reached=reached,
        iops_pct=_finite(eff.iops_pct) if eff else None,
        bare_significant=(None if eff is None or eff.iops_vs_bare.p_value is None
                          else eff.iops_vs_bare.significant),
        bw_pct=_finite(eff.bw_pct) if eff else None,
        added_lat_us=_finite(eff.added_lat_us) if eff else None,
        added_p99_us=_finite(eff.added_p99_us) if eff else None,
        vm_iops=_vm_iops(trials), flags=tuple(flags))


def _quality(run: "StoredRun", views: Sequence[PointView], target: float,
             source: str) -> QualityView:
    from iomatrix.analysis.pagecache import ADVICE, RULE, summary
    from iomatrix.analysis.points import points
    from iomatrix.analysis import impossible, stalls

    ram = summary(points(run))
    unchecked: dict[str, int] = defaultdict(int)
    for t in run.trials:
        if t.status == TrialStatus.OK and t.steady is not None and not t.steady.checked:
            unchecked[t.steady.reason or "not checked"] += 1
    return QualityView(
        trials_ok=sum(t.status == TrialStatus.OK for t in run.trials),
        trials_failed=sum(t.status == TrialStatus.FAILED for t in run.trials),
        points=len(views), points_without_ci=sum(v.samples < 2 for v in views),
        points_ci_over=sum(v.samples >= 2 and v.ci_relative is not None and v.ci_relative > target
                           for v in views),
        ci_target=target, ci_target_source=source,
        steady_checked=sum(v.steady_checked for v in views),
        steady_reached=sum(v.steady_reached for v in views), steady_unchecked=dict(unchecked),
        points_steady_missed=sum(v.steady_checked > v.steady_reached for v in views),
        points_flagged=sum(bool(v.flags) for v in views),
        points_page_cache=ram.points, points_from_ram=ram.from_ram,
        points_ram_unknown=ram.unknown, ram_rule=f"{RULE}; {ADVICE}" if ram.points else "",
        ram_unknown=ram.reasons, stalls=tuple(s.text for s in stalls.by_config(run)),
        stall_rule=stalls.RULE, faster_rule=impossible.RULE,
        points_faster=sum(FASTER_THAN_BARE in v.flags for v in views))


def _gains(run: "StoredRun") -> tuple[GainSetView, ...]:
    """Per queue depth, each axis's levels against its reference, pooled over the other axes;
    with exactly two axes (seed 000's aio × iothread), also held at each level of the other."""
    from iomatrix.analysis.effects import axes_of, default_reference, gains
    from iomatrix.analysis.paired import noise_floor

    axes = axes_of(run)
    floors = {m: noise_floor(run, m) for m in GAIN_METRICS} if axes else {}
    out = []
    for axis, levels in axes.items():
        holds: list[tuple[str, ...]] = [()]
        if len(axes) == 2:
            holds.append(tuple(a for a in axes if a != axis))
        for hold in holds:
            for metric in GAIN_METRICS:
                found = gains(run, axis, metric=metric, hold=hold)
                if not found:
                    continue
                out.append(GainSetView(
                    axis=axis, reference=default_reference(axis, levels), metric=metric,
                    hold=hold, gains=tuple(
                        GainView(level=g.level, held=g.held, iodepth=g.iodepth, pairs=g.pairs,
                                 relative=_finite(g.relative), low=_finite(g.low),
                                 high=_finite(g.high), p_value=g.p_value,
                                 adjusted_p=g.adjusted_p, significant=g.significant,
                                 better=g.better, verdict=g.verdict, method=_method(g),
                                 mde=_finite(g.mde), noise_floor=floors.get(metric))
                        for g in found)))
    return tuple(out)


def _method(g: Any) -> str:
    if g.method == "rounds":
        return f"paired by round: {g.rounds} rounds" + (", bootstrap" if g.interval == "bootstrap"
                                                        else "")
    return {"pairs": "unpaired: across pairs", "samples": "unpaired: Welch"}.get(g.method, "")


def _aa(run: "StoredRun") -> str:
    from iomatrix.analysis.paired import aa_report

    aa = aa_report(run)
    return "" if aa is None else aa.text()


def _scores(run: "StoredRun", config_index: dict[str, int]) -> tuple[ScoresView | None, str]:
    """The run's scores table, or None and why there is none."""
    from iomatrix.analysis.scores import scores
    from iomatrix.core.errors import IomatrixError

    try:
        table = scores(run)
    except IomatrixError as exc:
        return None, str(exc)
    return ScoresView(
        components=tuple(ComponentView(name=c.name, figure=c.figure, label=c.label,
                                       lower_is_better=c.lower_is_better, minimum=c.minimum,
                                       maximum=c.maximum, constant=c.constant)
                         for c in table.components),
        rows=tuple(ScoreRowView(config=config_index[r.config_key], values=r.values,
                                normalized=r.normalized, score=_finite(r.score), rank=r.rank)
                   for r in table.rows),
        method=table.method, caveat=table.caveat, notes=table.notes), ""


def _recommendations(run: "StoredRun") -> tuple[tuple[RecommendationView, ...], str]:
    """The recommendation for every platform, with the text to paste (placeholders for the VM,
    volume and image, as ``iomatrix recommend`` prints without its options)."""
    from iomatrix.core.errors import IomatrixError
    from iomatrix.recommend.decide import RULE, recommend
    from iomatrix.recommend.defaults import PLATFORMS, TITLES
    from iomatrix.recommend.render import render

    out = []
    for platform in PLATFORMS:
        try:
            rec = recommend(run, platform)
        except IomatrixError as exc:   # the report still shows everything else
            out.append(RecommendationView(platform=platform, title=TITLES[platform], storage="",
                                          decisions=(), text="",
                                          warnings=(f"no recommendation: {exc}",)))
            continue
        try:
            pasted = render(platform, rec.config)
            text, text_notes = pasted.text, pasted.notes
        except IomatrixError as exc:
            text, text_notes = "", (f"cannot be rendered: {exc}",)
        out.append(RecommendationView(
            platform=platform, title=TITLES[platform], storage=rec.storage,
            measured_on=rec.measured_on,
            decisions=tuple(DecisionView(
                name=d.name, what=d.what,
                default=d.default.shown + (f" ({d.default.note})" if d.default.note else ""),
                value=d.value, status=d.status, reason=d.reason, mode=d.mode, levels=d.levels,
                evidence=tuple(e.text() for e in d.evidence), caveat=d.caveat)
                for d in rec.decisions),
            text=text, text_notes=tuple(text_notes),
            fixed={mode: ", ".join(f"{k}={v}" for k, v in fixed.items())
                   for mode, fixed in rec.fixed.items() if fixed},
            warnings=rec.warnings, notes=rec.notes,
            yours=rec.yours.text if rec.yours is not None else ""))
    return tuple(out), RULE
