"""What ``iomatrix run --plan`` prints, made from the prepared run (``measure.prepare``): the
trials in order, the sessions and the estimate, how the rounds are decided, and the notes of
the host, the guests and the targets. Nothing runs; the CLI prints the lines as they come."""

from __future__ import annotations

import shutil
import tempfile

from iomatrix.analysis.paired import stopping_rule
from iomatrix.appliance.guestfio import guest_fio_status
from iomatrix.appliance.kernel import default_cache_dir
from iomatrix.appliance.ownimage import open_guest_image, overlay_worst_case
from iomatrix.appliance.winfio import BUILD_ESTIMATE, windows_fio
from iomatrix.core.errors import EnvironmentProblem, GuestFioUnavailable, SuiteError
from iomatrix.core.model import Frozen
from iomatrix.core.units import format_bytes
from iomatrix.measure.prepare import PreparedRun
from iomatrix.suite.expand import reference_lines
from iomatrix.suite.jobfiles import workload_groups
from iomatrix.suite.plan import duration_text, estimate_seconds
from iomatrix.targets.targets import describe_plans
from iomatrix.targets.workspace import plan_lines as target_lines
from iomatrix.vocab.words import Accelerator, Mode


class Line(Frozen):
    """One line of the plan; ``wrap``: the terminal may break it (the short ones), else it is
    printed whole (soft wrap)."""

    text: str
    wrap: bool = False


def plan_lines(prepared: PreparedRun) -> list[Line]:
    """The plan of ``prepared``; for guests asked to run under tcg, as the run would go with
    emulated guests."""
    suite, full, expansion = prepared.suite, prepared.full, prepared.expansion
    seed, blocks = prepared.seed, prepared.blocks
    lines, n = _trials(prepared)
    boots = sum((b.config.vms or 1) for b in blocks if b.config.mode == Mode.GUEST)
    starts = sum(1 for b in blocks if b.config.mode == Mode.BLOCKLAYER)
    seconds = estimate_seconds(blocks, suite.method)
    extra = "; a pilot first, which chooses the rounds (below)" if suite.method.plans_rounds else ""
    bound = "up to" if suite.method.steady_state else "about"
    lines.append(Line(text=f"{n} trials in {len(blocks)} sessions ({boots} VM boots, {starts} "
                      f"daemon starts), {bound} {duration_text(seconds)} plus "
                      f"preconditioning{extra}", wrap=True))
    lines.append(Line(text=f"trial order: seed {seed}" + (
        f", drawn for this plan: `--seed {seed}` measures in this order (a run without a seed "
        "draws its own)" if prepared.drawn else "")))
    lines.append(Line(text=_stopping(prepared)))
    texts = [*([] if prepared.targets else [f"target: {suite.target.described}"]),
             *prepared.host_notes, *reference_lines(suite)]   # the user's VM disk (from_vm)
    twin = next((c for c in expansion.configurations if c.aa), None) if suite.method.aa else None
    if twin is not None:
        texts.append(f"A/A calibration: {twin.label.removesuffix(' (A/A twin)')} is measured "
                     "twice (as itself and as its twin aa=twin) in every round, so the run "
                     "reports how often its method calls two identical configurations "
                     "different, and its noise floor")
    lines += [Line(text=t) for t in texts]
    if any(c.mode == Mode.GUEST for c in expansion.configurations):
        lines += _guest_notes(prepared)
    if suite.scale is not None:
        described = {s.name: s.description for s in suite.scales}
        lines.append(Line(text=f"scale {suite.scale}" + (
            f": {described[suite.scale]}" if described.get(suite.scale) else "")))
    lines += [Line(text=f"note: {note}")       # job files replaced; ioping
              for note in [*workload_groups(suite)[1], *prepared.notes]]
    lines += [Line(text=t) for t in describe_plans(prepared.targets, full.configurations)]
    lines += [Line(text=f"warning: {t}" if t.startswith("page cache") else t)
              for t in target_lines(suite.target, full.configurations)]  # page cache, working_set
    return lines


def _trials(prepared: PreparedRun) -> tuple[list[Line], int]:
    """Each session of the plan and its trials, numbered; and the count of trials."""
    lines, n = [], 0
    for block in prepared.blocks:
        session = {Mode.HOST: "fio on the target", Mode.BLOCKLAYER: "qemu-storage-daemon start",
                   Mode.GUEST: f"boot {block.config.vms or 1} VM(s)"}[block.config.mode]
        lines.append(Line(text=f"round {block.round + 1} · {block.config.label} · {session}",
                          wrap=True))
        for w in block.workloads:
            n += 1
            lines.append(Line(text=f"  {n:>4}  {w.label}", wrap=True))
    return lines, n


def _stopping(prepared: PreparedRun) -> str:
    """How the run decides its rounds: the pilot's plan, or the stopping rule."""
    method = prepared.suite.method
    if not method.plans_rounds:
        return stopping_rule(method.samples)
    from iomatrix.analysis import trialplan as tp   # scipy: loaded only when asked for
    from iomatrix.measure.runner import pilot_points    # the runner: loaded only for a pilot

    pairs, per_mode = pilot_points(prepared.expansion, prepared.seed)
    _, rounds = method.fixed_by_suite
    lengths = tp.pilot_lengths(method.chooses_runtime, method.window)
    return tp.plan_text(len(pairs) * tp.PILOT_ROUNDS * len(lengths), list(per_mode),
                        method.target_ci or tp.DEFAULT_TARGET, max_rounds=method.max_samples,
                        max_runtime=method.max_runtime,
                        runtime=None if method.chooses_runtime else method.window,
                        rounds=rounds if method.pilot else None, lengths=lengths,
                        min_rounds=method.samples, steady=method.steady_state)


def _guest_notes(prepared: PreparedRun) -> list[Line]:
    """What the estimate assumes of guests, the user's own guest, and the guest fio's state."""
    suite, full = prepared.suite, prepared.full
    fewer = ""
    if full.under_tcg:
        tcg_blocks = prepared.under(Accelerator.TCG).blocks
        fewer = (f"; with emulated guests (TCG, or --accel tcg) "
                 f"{sum(len(b.workloads) for b in tcg_blocks)} trials, about "
                 f"{duration_text(estimate_seconds(tcg_blocks, suite.method))}")
    lines = [Line(text="guest estimates assume TCG boots (about 3 s); under KVM they are "
                       "shorter" + fewer, wrap=True)]
    own = suite.guest
    if own is not None:
        lines.append(Line(text=(
            f"guest {own.label}: {own.image} ({own.os}), booted through a throwaway overlay in "
            "the run's directory (the image is only read); ready within "
            f"{own.ready_seconds(Accelerator.KVM):.0f} s under KVM, "
            f"{own.ready_seconds(Accelerator.TCG):.0f} s "
            "under TCG, or its trials fail with the console's last lines; its boots take "
            "longer than the estimate says (Debian 12 with cloud-init: about a minute under "
            "TCG)")))
        lines.append(Line(text=_overlay_space(prepared)))
        if own.os == "windows":
            lines.append(Line(text=_windows_fio(), wrap=True))
    status = guest_fio_status(default_cache_dir())   # without building anything
    if not status.cached:
        lines.append(Line(text=status.detail if status.ok else f"warning: {status.detail}"))
    return lines


def _windows_fio() -> str:
    """Whether the Windows guest's fio.exe is cached, or what building it will cost or why it
    cannot be had (nothing is built)."""
    try:
        found = windows_fio(default_cache_dir(), fetch=False)
    except GuestFioUnavailable as exc:
        if "not built yet" in str(exc):
            return (f"the Windows guest's fio.exe is cross-built at the run's start from the host "
                    f"fio's Debian source ({BUILD_ESTIMATE}, once)")
        return f"warning: the Windows guest's fio.exe cannot be had: {exc}"
    except EnvironmentProblem as exc:
        return f"warning: {exc}"
    return (f"the Windows guest's fio.exe: {found.version}, cross-built from the Debian source "
            f"{found.source} (cached)")


def _overlay_space(prepared: PreparedRun) -> str:
    """The worst case of the user's guest's overlays, against the free space where they go."""
    own = prepared.suite.guest
    assert own is not None
    guests = own.guests_at_once(prepared.full.configurations, prepared.suite.method.vms)
    try:        # the run's own checks: qemu-img reads no file the suite may not name
        with open_guest_image(own, prepared.suite.author) as image:
            each = overlay_worst_case(image.base)
    except (EnvironmentProblem, SuiteError) as exc:
        return f"warning: {exc}"
    tmp = tempfile.gettempdir()
    return (f"guest {own.label}: its overlays grow with what the guest writes to its system "
            f"disk; worst case (the whole disk rewritten) {format_bytes(each)} per guest, "
            f"{format_bytes(guests * each)} for the {guests} guest(s) booted at once, in "
            f"{tmp} ({format_bytes(shutil.disk_usage(tmp).free)} free; the run refuses to "
            "start below that)")
