"""A stored run → which disk settings to use on a platform, each with its evidence (pure).

The rule (``RULE``, printed by ``iomatrix recommend``):

1. Evidence comes from guest-mode configurations (the whole stack). A parameter the guest part
   does not vary is taken from blocklayer configurations when it is one that mode measures
   faithfully (aio, cache, format, preallocation); never from host-mode ones.
2. For each parameter the evidence varies, every other level is compared with the platform's
   default by :func:`iomatrix.analysis.effects.overall` on IOPS (every matched pair of the run,
   p-values Holm-adjusted across the parameter's levels) and on mean latency.
3. A level other than the default is recommended only when its IOPS are significantly higher
   (adjusted) and its latency is not significantly higher. Of several such levels, the one with
   the largest IOPS gain. Otherwise: keep the default, with the verdict that says why.
4. Where the platform has no default (libvirt and QEMU name the bus in the XML or command line),
   the levels are compared with the effects analysis's reference level instead, which is kept
   unless another level is significantly better as in 3.
5. Not varied by the run: "not measured: keep the default". Varied, but without the platform's
   default among the levels: "not evaluated: keep the default". A level the platform cannot be
   told to use (NVMe on Proxmox) is shown, never recommended.
6. cache=unsafe is never recommended (it ignores the guest's flushes); cache=writeback, whenever
   it is the outcome, carries a caveat: safe only while the guest flushes.
7. The recommended changes are applied strongest first; one that would make a combination QEMU
   7.2 refuses (:func:`iomatrix.suite.expand.invalid_reason`, e.g. aio=native without a direct
   cache) is tried again once the others are in, and dropped, with QEMU's reason, if it is
   still refused: of two changes that exclude each other, the stronger stays.
8. A run whose guests ran under TCG measured QEMU's CPU emulator: the recommendation says so.
9. A finding transfers to a platform only if the guests had that platform's block graph and
   devices: a run made with ``[method] platform`` equal to the target platform says so; one made
   with another (iomatrix's own ``qemu`` graph by default) carries a warning naming what differed.
10. On Proxmox's librbd storage (``rbd`` without krbd) a disk gets no aio at all: the aio
    parameter is "not evaluated" and no aio= is written.
11. A cache level whose evidence was served from RAM (points ``show`` marks [RAM]: less than
    half of fio's read or write bytes reached the target's device, ``analysis.pagecache``) is
    not recommended: keep the default, saying why, unless the suite said RAM is what it
    measures (``[target] working_set = "in-ram"``), when it may be, with that caveat. Any
    parameter whose evidence holds such points says so in its caveat.
12. A run made from the user's VM (``[matrix] from_vm``) also answers relative to it
    (``Recommendation.yours``): the VM's measured configuration with the settings the run
    decided on taken from the recommendation, against the VM's own, over every workload,
    paired by round (``analysis.yourvm``); a setting the run did not measure stays the VM's,
    and a combination the run did not measure as a whole is said to have no direct comparison.
13. Beside every gain, the level's host CPU per I/O against the reference's over the same pairs
    (``analysis.cpucost``, seed 002's efficiency): what the gain costs the host, never a reason.
    An IOThread count is decided on the configurations with an IOThread, N against one
    (``recommend.threads``); an IOThread count, queue count, queue mapping or CPU affinity
    measured only in guests under TCG is not evaluated (their evidence measures the emulator); for Proxmox VE, what ``qm set`` can express of IOThreads, queues
    and affinity and what only ``args:`` can is said with the parameter.
14. Points faster than the run's own bare metal (``show`` marks them [>BARE],
    ``analysis.impossible``: a cache answered, or writes were not made durable) are left out of
    the evidence, and a note says which.
"""

from __future__ import annotations

from typing import Literal


from iomatrix.analysis.cpucost import CpuPerIo, cpu_per_io
from iomatrix.analysis.effects import Gain, axes_of, default_reference, overall
from iomatrix.analysis.impossible import without_faster
from iomatrix.analysis.pagecache import ADVICE, from_ram_by_level, share_range, working_set
from iomatrix.analysis.points import only_configs
from iomatrix.analysis.yourvm import VmGain, your_vm
from iomatrix.telemetry.pagecache import RAM_SHARE
from iomatrix.platform import PLATFORMS as MODULES
from iomatrix.platform import proxmox as pve
from iomatrix.platform.proxmox import NO_AIO_STORAGES
from iomatrix.recommend.defaults import (FALLBACK, NAMES, NOT_SETTINGS, TITLES, UNEXPRESSIBLE,
                                         Platform, defaults)
from iomatrix.recommend.threads import (EMULATED, LEVERS, THREADS, axis_default, platform_text,
                                       thread_count)
from iomatrix.platform.settings import PlatformDefault
from iomatrix.store.records import StoredRun
from iomatrix.suite.expand import invalid_reason
from iomatrix.suite.configuration import Configuration
from iomatrix.core.model import Frozen
from iomatrix.vocab.axes import BLOCKLAYER_AXES, BY_NAME, DEFAULT_UNSET, PARAMETERS, WHAT
from iomatrix.vocab.words import Mode

RULE = (
    "A level other than the platform's default is recommended only when its IOPS are "
    "significantly higher than the default's (every matched pair of configurations in the run, "
    "Holm-adjusted across the parameter's levels) and its mean latency is not significantly "
    "higher; otherwise keep the default. Evidence comes from guest mode, or for aio, cache, "
    "format and preallocation from blocklayer mode when the guests did not vary them. "
    "cache=unsafe is never recommended; cache=writeback comes with a caveat. Changes are applied "
    "strongest first, and one that would form a combination QEMU 7.2 refuses is dropped. "
    "A cache level measured mostly from the host page cache ([RAM]: less than half of fio's "
    "bytes reached the device) is not recommended unless the suite set [target] working_set = "
    "\"in-ram\"; evidence holding such points carries a caveat. Each gain is shown with the "
    "host CPU per I/O it costs; several IOThreads per disk are compared with one IOThread. An "
    "IOThread count, queue count or CPU affinity measured only in guests under TCG is not "
    "recommended. Points faster than the run's own bare metal ([>BARE]) are no evidence.")

IOPS = "iops"
LATENCY = "lat_mean_ns"
EVIDENCE_MODES = (Mode.GUEST, Mode.BLOCKLAYER)

CACHE_CAVEATS = {
    "unsafe": "cache=unsafe ignores the guest's flushes: a host crash or power loss can corrupt "
              "the guest's filesystems; only for scratch VMs that can be rebuilt",
    "writeback": "cache=writeback holds writes in the host page cache until the guest flushes: "
                 "safe only while the guest issues flushes (filesystem barriers on, the default "
                 "on current Linux); a host crash loses what was not flushed",
}
NEVER = {("cache", "unsafe")}
"""Levels never recommended, whatever they measure."""

Status = Literal["change", "keep", "choose", "not measured", "not evaluated"]


class Evidence(Frozen):
    """One level against the reference: IOPS and mean-latency gains, and why it may not be
    recommended on this platform ("" when it may)."""

    level: str
    iops: Gain
    latency: Gain
    barred: str = ""
    cpu: CpuPerIo | None = None
    """The level's host CPU per I/O against the reference's, over the same pairs: shown beside
    the gain, never a reason (seed 002's efficiency)."""

    @property
    def qualifies(self) -> bool:
        """Significantly more IOPS, latency not significantly worse (rule 3)."""
        return self.iops.better is True and self.latency.better is not False

    def text(self) -> str:
        """The IOPS verdict in full, and the latency in short."""
        cpu = f"; {self.cpu.text()}" if self.cpu is not None and self.cpu.pairs else ""
        return (f"{self.level} vs {self.iops.reference}: IOPS {self.iops.verdict}; "
                f"mean latency {_short(self.latency)}{cpu}")


def _short(gain: Gain) -> str:
    """A gain in a few words: its change and CI, and whether it is significant (adjusted)."""
    if gain.relative is None:
        return "not compared (" + gain.verdict.split(":")[0] + ")"
    text = _figure(gain)
    if gain.better is None:
        return f"no significant difference, {text}"
    return f"{text}, significantly {'better' if gain.better else 'worse'}"


def _figure(gain: Gain, what: str = "", tail: str = "") -> str:
    """A compared gain's change and CI: ``+23.4 % IOPS (95 % CI +18.0 … +29.1 %)``, ``tail``
    inside the brackets."""
    assert gain.relative is not None
    text = f"{gain.relative * 100:+.1f} %" + (f" {what}" if what else "")
    ci = ("" if gain.low is None or gain.high is None else
          f"95 % CI {gain.low * 100:+.1f} … {gain.high * 100:+.1f} %")
    inside = ci + tail if ci else tail.removeprefix(", ")
    return (text + (f" ({inside})" if inside else "")).replace("-", "\u2212")


class Decision(Frozen):
    """What to do with one parameter, and why."""

    axis: str
    name: str
    what: str
    default: PlatformDefault
    status: Status
    value: str | None
    """The level to use; None only for a parameter left to the platform (queues: QEMU's)."""
    reason: str
    mode: str | None = None
    """The mode whose configurations gave the evidence."""
    levels: tuple[str, ...] = ()
    evidence: tuple[Evidence, ...] = ()
    caveat: str = ""
    gain: float | None = None
    """The IOPS gain behind a change (its strength when changes conflict)."""


class YoursAnswer(Frozen):
    """The recommendation relative to the user's VM (``[matrix] from_vm``): the recommended
    settings as measured in the same rounds against the VM's own (``analysis.yourvm``)."""

    vm: str
    """``100.conf scsi0``."""
    settings: str
    """The VM's disk settings, as its file states them in iomatrix's words."""
    measured: str
    """The label of the configuration that measured the VM's disk."""
    status: Literal["keep", "change", "not measured", "no better"]
    """keep: the recommendation is the VM's settings; change: the recommended settings measured
    significantly more IOPS than the VM's; no better: measured, but not significantly better;
    not measured: that combination was not measured as a whole in the VM's mode."""
    text: str
    gain: VmGain | None = None
    """The recommended configuration against the VM's (status change or no better)."""
    best: VmGain | None = None
    """The configuration with the largest significant IOPS gain over the VM's (latency not
    significantly worse), when it is not the recommended one."""


class Recommendation(Frozen):
    """The settings to use on a platform, per parameter, with the configuration they make."""

    platform: Platform
    run_id: int
    suite_name: str
    emulated: bool
    storage: str
    measured_on: str = ""
    """The storage the evidence comes from (``Target.described``: "lvmthin local-lvm"); ""
    where the run's suite does not load (imported results)."""
    decisions: tuple[Decision, ...]
    config: Configuration
    """The whole recommended disk setup, valid for QEMU 7.2 (guest mode)."""
    fixed: dict[str, dict[str, str]]
    """mode → the parameters its configurations all share (what the evidence was measured with)."""
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    yours: YoursAnswer | None = None
    """Relative to the user's VM, for a run made from one (``[matrix] from_vm``)."""


def _only(run: StoredRun, mode: str) -> StoredRun:
    """The run restricted to one mode's configurations and trials."""
    return only_configs(run, {c.key for c in run.configs if c.mode == mode})


def _fixed(run: StoredRun) -> dict[str, str]:
    """Parameters with one value across every configuration of the (one-mode) run."""
    values: dict[str, list[str]] = {}
    for config in run.configs:
        for axis in [*values, *(a for a in config.params if a not in values)]:
            values.setdefault(axis, []).append(config.params.get(axis, ""))
    return {axis: v[0] for axis, v in values.items()
            if len(set(v)) == 1 and v[0] and len(v) == len(run.configs)}


def _parameters(run: StoredRun) -> list[str]:
    """The parameters decided for ``run``: every one, but an optional one (``Axis.optional``:
    discard) only where the run measured it."""
    measured = {axis for config in run.configs for axis in config.params}
    return [a for a in PARAMETERS if not BY_NAME[a].optional or a in measured]


def recommend(run: StoredRun, platform: Platform, *, storage: str = "other") -> Recommendation:
    """The recommendation for ``platform`` from ``run`` (see the module docstring for the rule)."""
    run, left_out = without_faster(run)      # impossible figures are no evidence
    base = defaults(platform, storage=storage)
    parts = {mode: _only(run, mode) for mode in EVIDENCE_MODES
             if any(c.mode == mode for c in run.configs)}
    axes = {mode: axes_of(part) for mode, part in parts.items()}
    fixed = {mode: _fixed(part) for mode, part in parts.items()}
    notes: list[str] = [left_out] if left_out else []
    decisions = [_decide(platform, axis, axis_default(base, axis), *_seen_as(axis, parts, axes),
                         fixed) for axis in _parameters(run)]
    if platform == "proxmox" and storage in NO_AIO_STORAGES:
        decisions = [d.model_copy(update={
            "status": "not evaluated", "value": FALLBACK["aio"], "gain": None,
            "reason": f"aio does nothing on {NO_AIO_STORAGES[storage]}: qemu-server gives an rbd "
                      "node no aio (Blockdev.pm generate_file_blockdev: only file, host_device "
                      "and host_cdrom nodes), so whatever the run measured for aio does not "
                      "apply; no aio= is written"}) if d.axis == "aio" else d for d in decisions]
    for axis, why in NOT_SETTINGS.items():
        # data_path's QEMU default (emulated) is stored as no value: any set one means it varied
        if any(axis in found for found in axes.values()) or (axis == "data_path" and any(
                "data_path" in c.params for part in parts.values() for c in part.configs)):
            notes.append(f"{axis} (set in this run) is not turned into a setting: {why}"
                         + (f"; {how}" if (how := platform_text(platform, axis)) else ""))
    config, decisions, dropped = _assemble(platform, storage, decisions)
    notes += dropped
    warnings = stalled_warnings(run)
    if run.emulated:
        native = any(d.mode == Mode.BLOCKLAYER for d in decisions)
        warnings.append("EMULATED (TCG): the guests' CPU was emulated; guest evidence measures "
                        "QEMU's emulator, not this hardware"
                        + ("; blocklayer evidence (no guest) ran natively" if native else ""))
    graph_warning, graph_note = _graph(run, platform, parts)
    warnings += graph_warning
    notes += graph_note
    if not parts:
        warnings.append(f"run {run.id} has no guest or blocklayer configurations: nothing to base "
                        "a recommendation on; every parameter keeps the platform's default")
    target = run.suite.suite.target if run.suite.suite is not None else None
    table = target.network if target is not None else None
    if table is not None:       # what evidence on its images must carry (a volume chain's)
        warnings += dict.fromkeys(c for c in (table.caveat(config.params.get("format"))
                                              for config in run.configs) if c)
    return Recommendation(platform=platform, run_id=run.id, suite_name=run.suite.name,
                          emulated=run.emulated, storage=storage,
                          measured_on=target.described if target is not None else "",
                          decisions=tuple(decisions),
                          config=config, fixed=fixed, warnings=tuple(warnings), notes=tuple(notes),
                          yours=_yours(run, config, decisions))


def stalled_warnings(run: StoredRun) -> list[str]:
    """Each configuration that stalled (``analysis.stalls``): a finding whatever its gains,
    which are measured without its stalled trials unless the run was loaded with them."""
    from iomatrix.analysis.stalls import by_config

    how = ("its stalled trials are in the evidence (--with-stalled)" if run.with_stalled else
           "its stalled trials are no evidence here (--with-stalled keeps them): a setting "
           "that stalls is a finding whatever its gain")
    return [f"stalled: {one.text}; {how}" for one in by_config(run)]


def _yours(run: StoredRun, config: Configuration, decisions: list[Decision]
           ) -> YoursAnswer | None:
    """The recommended ``config`` against the user's VM disk, measured in the VM's mode: the
    VM's configuration with the settings the run decided on from evidence (in blocklayer mode
    only aio, cache, format and preallocation) taken from the recommendation; a setting the
    run did not measure or evaluate stays the VM's."""
    vm = your_vm(run)
    if vm is None:
        return None
    mode = vm.config.mode
    decided = {d.axis for d in decisions if d.status in ("change", "keep", "choose")}
    axes = [a for a in (BLOCKLAYER_AXES if mode == Mode.BLOCKLAYER else PARAMETERS)
            if a in decided]
    recommended = config.params()
    want = dict(vm.config.params)
    for axis in axes:
        if axis in recommended:
            want[axis] = recommended[axis]
        else:
            want.pop(axis, None)
    name = f"{vm.from_vm} {vm.reference.disk}"
    head = f"your VM ({name}) uses {vm.reference.settings()}"
    candidates = [g for g in vm.gains if g.iops.better is True and g.latency.better is not False]
    best = max(candidates, key=lambda g: g.iops.relative or 0.0, default=None)
    if want == vm.config.params:
        text = (f"{head}: this run recommends the same ({vm.uses(axes)} in {mode} mode): keep "
                "them" if axes else f"{head}: this run compared none of these settings in "
                "matched pairs, so it recommends no change")
        if best is None:
            return YoursAnswer(vm=name, settings=vm.reference.settings(),
                               measured=vm.config.label, status="keep",
                               text=text + "; no measured configuration has significantly more "
                                           "IOPS than your VM's")
        return YoursAnswer(vm=name, settings=vm.reference.settings(), measured=vm.config.label,
                           status="keep", best=best,
                           text=text + f"; though {_changes(best)} measured {_vs(best)}")
    gain = vm.against(want)
    if gain is None:
        changes = ", ".join(f"{a}={want.get(a, '—')}" for a in axes
                            if want.get(a) != vm.config.params.get(a))
        text = (f"{head}; the recommended {changes} was not measured as a whole in {mode} mode "
                "in this run, so it has no direct comparison with your VM (the parameters "
                "above rest on matched pairs)")
        if best is not None:
            text += f"; measured against your VM, {_changes(best)} gives {_vs(best)}"
        return YoursAnswer(vm=name, settings=vm.reference.settings(), measured=vm.config.label,
                           status="not measured", text=text, best=best)
    better = gain.iops.better is True and gain.latency.better is not False
    uses = vm.uses(list(gain.differs))
    text = f"your VM ({name}) uses {uses}; {_changes(gain)} gives {_vs(gain)}"
    if not better:
        text += ": not significantly better than your VM here, so changing buys nothing this " \
                "run can show"
    if best is not None and best.key != gain.key:
        text += f"; the largest measured gain over your VM: {_changes(best)}, {_vs(best)}"
    return YoursAnswer(vm=name, settings=vm.reference.settings(), measured=vm.config.label,
                       status="change" if better else "no better", text=text, gain=gain,
                       best=best if best is not None and best.key != gain.key else None)


def _changes(gain: VmGain) -> str:
    """What a configuration changes against the VM's: ``aio=io_uring with cache=none``."""
    return " with ".join(f"{a}={v}" for a, v in gain.differs.items()) or gain.label


def _vs(gain: VmGain) -> str:
    """A configuration's gains over the VM's in a few words: ``+23.4 % IOPS (95 % CI +18.0 …
    +29.1 %, significant), mean latency −19.0 % (…, significant)``."""
    words = []
    for figure, what in ((gain.iops, "IOPS"), (gain.latency, "mean latency")):
        if figure.relative is None:
            words.append(f"{what} not compared ({figure.verdict.split(':')[0]})")
            continue
        sig = ", significant" if figure.better is not None else ", not significant"
        words.append(_figure(figure, "IOPS", sig) if what == "IOPS"
                     else f"{what} {_figure(figure, tail=sig)}")
    return ", ".join(words)


def _graph(run: StoredRun, platform: Platform, parts: dict[str, StoredRun]
           ) -> tuple[list[str], list[str]]:
    """Rule 9: (warnings, notes) on whether the measured block graph was ``platform``'s."""
    if platform == "qemu" or not parts:
        return [], []
    method = run.suite.method
    measured = method.platform
    if measured == platform and Mode.GUEST in parts:
        version = (f", PVE {method.pve_version or pve.DEFAULT_PVE_VERSION}"
                   if platform == "proxmox" else "")
        note = (f"the guests were measured with {TITLES[platform]}'s own block graph and devices "
                f'([method] platform = "{platform}"{version}): the findings transfer to it')
        if Mode.BLOCKLAYER in parts:
            note += "; blocklayer evidence (qemu-storage-daemon) had its block layers too"
        return [], [note]
    if measured == platform:
        return [], [f"the blocklayer evidence was measured with {TITLES[platform]}'s block layers "
                    f'in qemu-storage-daemon ([method] platform = "{platform}"); guest devices '
                    "were not measured"]
    return [f"the measured block graph differed from {TITLES[platform]}'s: run {run.id} was made "
            f'with [method] platform = "{measured}" ('
            + ("iomatrix's own graph" if measured == "qemu"
               else f"{TITLES.get(measured, measured)}'s graph")  # type: ignore[call-overload]
            + f"); {MODULES[platform].GRAPH_DIFFERENCE}. Measure with platform = \"{platform}\" "
            "for findings that transfer"], []


def _seen_as(axis: str, parts: dict[str, StoredRun], axes: dict[str, dict[str, list[str]]]
             ) -> tuple[dict[str, StoredRun], dict[str, dict[str, list[str]]]]:
    """The run's parts and axes as ``axis`` is decided on them: the IOThread count on the guest
    configurations with an IOThread, each with its count (``recommend.threads``)."""
    if axis != THREADS:
        return parts, axes
    view = thread_count(parts[Mode.GUEST]) if Mode.GUEST in parts else None
    if view is None:
        return {}, {}
    return {Mode.GUEST: view}, {Mode.GUEST: axes_of(view)}


def _evidence_mode(axis: str, axes: dict[str, dict[str, list[str]]]) -> str | None:
    if axis in axes.get(Mode.GUEST, {}):
        return Mode.GUEST
    if axis in BLOCKLAYER_AXES and axis in axes.get(Mode.BLOCKLAYER, {}):
        return Mode.BLOCKLAYER
    return None


def _decide(platform: Platform, axis: str, default: PlatformDefault, parts: dict[str, StoredRun],
            axes: dict[str, dict[str, list[str]]], fixed: dict[str, dict[str, str]]) -> Decision:
    common = dict(axis=axis, name=NAMES[platform].get(axis, axis), what=WHAT[axis],
                  default=default)
    mode = _evidence_mode(axis, axes)
    unpaired = _unpaired(axis, parts)
    if mode is None and unpaired:
        return Decision(**common, status="not evaluated", value=default.level, mode=unpaired[0],
                        levels=tuple(unpaired[1]),
                        reason=f"not evaluated: the run compared {', '.join(unpaired[1])} with "
                               "QEMU's default, which is stored as no value and so has no twin to "
                               "pair with; keep the default")
    if mode is None:
        reason = "not measured: keep the default"
        if axis == "iothread" and "iothread" in axes.get(Mode.BLOCKLAYER, {}):
            reason = ("not evaluated: blocklayer's iothread compares a FUSE export with an "
                      "iothread to an NBD export, not a guest's iothread; keep the default")
        measured = next((f[axis] for f in fixed.values() if axis in f), None)
        value = default.level
        if value is None:
            # Without a platform default the disk must still be named: as measured, else
            # iomatrix's own default.
            value = measured or FALLBACK.get(axis)
            if value is not None:
                reason = f"not measured: {value} (no platform default; " + (
                    "the one value the run used)" if measured else "iomatrix's default)")
        elif measured is not None and measured != value:
            reason += f" (the run used {measured} only, so it cannot say {measured} is better)"
        return Decision(**common, status="not measured", value=value, reason=reason)
    run, levels = parts[mode], axes[mode][axis]
    if default.level is not None and default.level not in levels:
        return Decision(**common, status="not evaluated", value=default.level, mode=mode,
                        levels=tuple(levels),
                        reason=f"not evaluated: the run measured {', '.join(levels)} but not the "
                               f"default {default.level}; keep the default")
    reference = default.level or default_reference(axis, levels)
    evidence = tuple(
        Evidence(level=level, iops=overall(run, axis, level, metric=IOPS, reference=reference),
                 latency=overall(run, axis, level, metric=LATENCY, reference=reference),
                 barred=_barred(platform, axis, level),
                 cpu=cpu_per_io(run, axis, level, reference))
        for level in levels if level != reference)
    ram, ram_caveat = _from_ram(run, axis, levels)
    if axis == "cache" and working_set(run) != "in-ram":   # rule 11
        evidence = tuple(e.model_copy(update={"barred": _join([e.barred, ram[e.level]])})
                         if ram.get(e.level) else e for e in evidence)
    common.update(mode=mode, levels=tuple(levels), evidence=evidence)
    if axis in LEVERS and mode == Mode.GUEST and run.emulated:
        return Decision(**common, status="not evaluated", value=default.level,
                        reason=EMULATED.format(axis=axis),
                        caveat=_join([ram_caveat, platform_text(platform, axis)]))
    qualified = [e for e in evidence if e.qualifies]
    eligible = [e for e in qualified if not e.barred]
    caveats = [CACHE_CAVEATS[e.level] for e in qualified if e.barred and e.level in CACHE_CAVEATS]
    caveats += [ram_caveat, platform_text(platform, axis)]
    if eligible:
        best = max(eligible, key=lambda e: e.iops.relative or 0.0)
        cost = f"; {best.cpu.text()}" if best.cpu is not None and best.cpu.pairs else ""
        return Decision(**common, status="change" if default.level else "choose",
                        value=best.level, gain=best.iops.relative,
                        reason=f"use {best.level}: significantly more IOPS than {reference}, "
                               f"mean latency not significantly higher{cost}",
                        caveat=_join([CACHE_CAVEATS.get(best.level, ""), *caveats]))
    what = "the default" if default.level else f"{reference} (no platform default)"
    if qualified:
        barred = qualified[0]
        why = f"{barred.level} measured better but {barred.barred}"
    elif any(e.iops.better is True for e in evidence):
        worse = next(e for e in evidence if e.iops.better is True)
        why = f"{worse.level} has more IOPS but significantly higher latency ({worse.latency.verdict})"
    elif evidence and all(e.iops.better is False for e in evidence):
        why = "every other level has significantly fewer IOPS"
    else:
        why = "no level has significantly more IOPS"
    status: Status = "keep" if default.level else "choose"
    return Decision(**common, status=status, value=reference, reason=f"keep {what}: {why}",
                    caveat=_join(caveats))


def _from_ram(run: StoredRun, axis: str, levels: list[str]) -> tuple[dict[str, str], str]:
    """Rule 11: per level of ``axis``, why its evidence cannot carry a recommendation when some
    of its points were served from RAM (absent when none was); and the caveat naming every
    level with such points ("" when none has)."""
    counts = from_ram_by_level(run, axis, levels)
    shares = {level: c.shares for level, c in counts.items()}
    flagged = {level: (c.from_ram, c.points) for level, c in counts.items() if c.from_ram}
    if not flagged:
        return {}, ""
    below = f"less than {RAM_SHARE:.0%} of fio's bytes reached the target's device"
    why = {level: f"{n} of {total} of its points were served from the host page cache "
                  f"({below}): the figures measure RAM, not storage; {ADVICE}"
           for level, (n, total) in flagged.items()}
    listed = ", ".join(f"{axis}={level}: {n} of {total} points, "
                       f"{share_range(shares[level])} reached the device"
                       for level, (n, total) in flagged.items())
    if working_set(run) == "in-ram":
        caveat = (f"evidence served from RAM, as the suite asked ([target] working_set = "
                  f"\"in-ram\"): {listed}; it says nothing about the storage")
    else:
        caveat = (f"evidence served from the host page cache (RAM, not storage; {below}): "
                  f"{listed}")
    return why, caveat


def _unpaired(axis: str, parts: dict[str, StoredRun]) -> tuple[str, list[str]] | None:
    """(mode, levels) when some configurations of a mode set ``axis`` and others leave it at
    QEMU's default (num_queues, queue_size): the effects analysis pairs only set values."""
    if axis not in DEFAULT_UNSET:
        return None
    for mode, part in parts.items():
        values = [c.params.get(axis) for c in part.configs]
        if None in values and any(v is not None for v in values):
            return mode, list(dict.fromkeys(v for v in values if v is not None))
    return None


def _join(parts: list[str]) -> str:
    return "; ".join(dict.fromkeys(p for p in parts if p))


def _barred(platform: Platform, axis: str, level: str) -> str:
    if (axis, level) in NEVER:
        return CACHE_CAVEATS.get(level, "it is never recommended")
    return UNEXPRESSIBLE[platform].get((axis, level), "")


def _config(values: dict[str, str | None]) -> Configuration:
    """The guest configuration of ``values``; an axis at its unset level (one IOThread,
    round-robin) as no level, as a run stores it."""
    levels = {axis: BY_NAME[axis].level_of(value) for axis, value in values.items()}
    return Configuration(mode=Mode.GUEST, **{
        axis: None if BY_NAME[axis].unset is not None and level == BY_NAME[axis].unset
        and BY_NAME[axis].type is not bool else level for axis, level in levels.items()})


def _assemble(platform: Platform, storage: str, decisions: list[Decision]
              ) -> tuple[Configuration, list[Decision], list[str]]:
    """Start from the platform's defaults (iomatrix's own where the platform has none, which
    together are always valid) and apply every decided value that differs, the changes strongest
    first; one that would make a combination QEMU 7.2 refuses is tried again after the others,
    and dropped with QEMU's reason if still refused (rule 7). Defaults that depend on other
    settings (Proxmox's aio on the cache, iothread on the bus) follow the settings chosen."""
    by_axis = {d.axis: d for d in decisions}
    start = {d.axis: d.default.level if d.default.level is not None else FALLBACK.get(d.axis)
             for d in decisions}
    moves = sorted((d for d in decisions if d.value != start[d.axis]),
                   key=lambda d: (d.status != "change", -(d.gain or 0.0)))
    chosen: dict[str, str] = {}
    notes: list[str] = []

    def values(chosen: dict[str, str]) -> dict[str, str | None]:
        out = start | chosen
        derived = defaults(platform, storage=storage, settings={k: v for k, v in out.items() if v})
        for axis in ("aio", "iothread"):
            if axis not in chosen and by_axis[axis].default.level is not None:
                out[axis] = derived[axis].level
        return out

    # Passes until nothing more fits: a change refused now may fit once a weaker one is in
    # (aio=native after cache=none, where the default cache is writeback).
    refused: dict[str, str] = {}
    pending = moves
    while pending:
        refused = {}
        for move in pending:
            trial = chosen | {move.axis: str(move.value)}
            reason = invalid_reason(_config(values(trial)))
            if reason is None:
                chosen = trial
            else:
                refused[move.axis] = reason
        if len(refused) == len(pending):
            break
        pending = [m for m in pending if m.axis in refused]
    for move in (m for m in moves if m.axis in refused):
        reason = refused[move.axis]
        fallback = start[move.axis]
        notes.append(f"{move.axis}={move.value} dropped: with the other settings chosen it forms "
                     f"a combination QEMU 7.2 refuses ({reason})")
        by_axis[move.axis] = move.model_copy(update={
            "status": "keep" if move.default.level is not None else move.status,
            "value": fallback, "gain": None,
            "reason": f"keep {'the default ' if move.default.level else ''}{fallback}: "
                      f"{move.value} measured better ({move.reason}) but QEMU 7.2 refuses it "
                      f"with the other settings: {reason}"})
    final = values(chosen)
    config = _config(final)
    out = []
    for d in decisions:
        d = by_axis[d.axis]
        value = final.get(d.axis)
        update: dict[str, object] = {}
        if value != d.value:
            update = {"value": value, "reason": d.reason + " (with the settings chosen, the "
                      f"platform's default is {value})"}
        caveat = CACHE_CAVEATS.get(str(value), "") if d.axis == "cache" else ""
        if caveat and caveat not in d.caveat:
            update["caveat"] = _join([d.caveat, caveat])
        out.append(d.model_copy(update=update) if update else d)
    return config, out, notes
