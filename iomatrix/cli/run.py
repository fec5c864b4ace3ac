"""``iomatrix run``: measure a suite, print its plan (``--plan``), finish an interrupted run
(``--resume``), or measure a run's failed trials again (``--resume RUN --retry-failed``)."""

from __future__ import annotations

import contextlib
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from iomatrix.cli.common import (DEFAULT_DB, Db, environment, open_store, out, shown_db,
                                 write_report)
from iomatrix.cli.status import ExitStatus
from iomatrix.core.errors import SuiteError
from iomatrix.core.trust import Author
from iomatrix.core.files import output_directory

if TYPE_CHECKING:
    from iomatrix.cluster.ssh import Node
    from iomatrix.measure.prepare import PreparedRun
    from iomatrix.store.records import StoredRun
    from iomatrix.suite.model import Suite


def _print_plan(prepared: PreparedRun) -> None:
    """The trials in order, the sessions and the estimate, without running anything; for
    guests asked to run under tcg, as the run would go with emulated guests."""
    from iomatrix.suite.plan import duration_text, estimate_seconds
    from iomatrix.targets.targets import describe_plans

    suite, full, expansion = prepared.suite, prepared.full, prepared.expansion
    seed, blocks = prepared.seed, prepared.blocks
    n = _print_trials(prepared)
    boots = sum((b.config.vms or 1) for b in blocks if b.config.mode == "guest")
    starts = sum(1 for b in blocks if b.config.mode == "blocklayer")
    seconds = estimate_seconds(blocks, suite.method)
    extra = ""
    if suite.method.plans_rounds:
        extra = "; a pilot first, which chooses the rounds (below)"
    bound = "up to" if suite.method.steady_state else "about"
    out.print(f"{n} trials in {len(blocks)} sessions ({boots} VM boots, {starts} daemon starts), "
              f"{bound} {duration_text(seconds)} plus preconditioning{extra}", markup=False)
    out.print(f"trial order: seed {seed}" + (f", drawn for this plan: `--seed {seed}` measures "
                                            "in this order (a run without a seed draws its own)"
                                            if prepared.drawn else ""),
              markup=False, soft_wrap=True)
    _print_stopping(prepared)
    for note in prepared.host_notes:
        out.print(note, markup=False, soft_wrap=True)
    from iomatrix.suite.expand import reference_lines

    for line in reference_lines(suite):      # the user's VM disk ([matrix] from_vm)
        out.print(line, markup=False, soft_wrap=True)
    if suite.method.aa:
        twin = next((c for c in expansion.configurations if c.aa), None)
        if twin is not None:
            out.print(f"A/A calibration: {twin.label.removesuffix(' (A/A twin)')} is measured twice (as itself and as its "
                      "twin aa=twin) in every round, so the run reports how often its method "
                      "calls two identical configurations different, and its noise floor",
                      markup=False, soft_wrap=True)
    if any(c.mode == "guest" for c in expansion.configurations):
        _print_guest_notes(prepared)
    if suite.scale is not None:
        described = {s.name: s.description for s in suite.scales}
        out.print(f"scale {suite.scale}" + (f": {described[suite.scale]}"
                                             if described.get(suite.scale) else ""),
                  markup=False, soft_wrap=True)
    from iomatrix.suite.jobfiles import workload_groups

    for note in [*workload_groups(suite)[1], *prepared.notes]:   # job files replaced; ioping
        out.print(f"note: {note}", markup=False, soft_wrap=True)
    for line in describe_plans(prepared.targets, full.configurations):
        out.print(line, markup=False, soft_wrap=True)
    from iomatrix.targets.workspace import plan_lines

    for line in plan_lines(suite.target, full.configurations):   # the page cache, working_set
        out.print(f"warning: {line}" if line.startswith("page cache") else line,
                  markup=False, soft_wrap=True)


def _print_trials(prepared: PreparedRun) -> int:
    """Each session of the plan and its trials, numbered; the count of trials."""
    n = 0
    for block in prepared.blocks:
        session = {"host": "fio on the target", "blocklayer": "qemu-storage-daemon start",
                   "guest": f"boot {block.config.vms or 1} VM(s)"}[block.config.mode]
        out.print(f"round {block.round + 1} · {block.config.label} · {session}", markup=False)
        for w in block.workloads:
            n += 1
            out.print(f"  {n:>4}  {w.label}", markup=False)
    return n


def _print_stopping(prepared: PreparedRun) -> None:
    """How the run decides its rounds: the pilot's plan, or the stopping rule."""
    suite, expansion, seed = prepared.suite, prepared.expansion, prepared.seed
    method = suite.method
    if method.plans_rounds:
        from iomatrix.analysis.trialplan import (DEFAULT_TARGET, PILOT_ROUNDS, pilot_lengths,
                                                 plan_text)
        from iomatrix.measure.runner import pilot_points

        pairs, per_mode = pilot_points(expansion, seed)
        _, rounds = method.fixed_by_suite
        lengths = pilot_lengths(method.chooses_runtime, method.window)
        out.print(plan_text(len(pairs) * PILOT_ROUNDS * len(lengths), list(per_mode),
                            method.target_ci or DEFAULT_TARGET, max_rounds=method.max_samples,
                            max_runtime=method.max_runtime,
                            runtime=None if method.chooses_runtime else method.window,
                            rounds=rounds if method.pilot else None, lengths=lengths,
                            min_rounds=method.samples, steady=method.steady_state),
                  markup=False, soft_wrap=True)
    else:
        from iomatrix.analysis.paired import stopping_rule

        out.print(stopping_rule(method.samples), markup=False, soft_wrap=True)


def _print_guest_notes(prepared: PreparedRun) -> None:
    """What the estimate assumes of guests, the user's own guest, and the guest fio's state."""
    from iomatrix.suite.plan import duration_text, estimate_seconds

    suite, full = prepared.suite, prepared.full
    fewer = ""
    if full.under_tcg:
        tcg_blocks = prepared.under("tcg").blocks
        fewer = (f"; with emulated guests (TCG, or --accel tcg) "
                 f"{sum(len(b.workloads) for b in tcg_blocks)} trials, about "
                 f"{duration_text(estimate_seconds(tcg_blocks, suite.method))}")
    out.print("guest estimates assume TCG boots (about 3 s); under KVM they are shorter"
              + fewer, markup=False)
    own = suite.guest
    if own is not None:
        out.print(f"guest {own.label}: {own.image} ({own.os}), booted through a throwaway "
                  "overlay in the run's directory (the image is only read); ready within "
                  f"{own.ready_seconds('kvm'):.0f} s under KVM, "
                  f"{own.ready_seconds('tcg'):.0f} s under TCG, or its trials fail with the "
                  "console's last lines; its boots take longer than the estimate says "
                  "(Debian 12 with cloud-init: about a minute under TCG)", markup=False, soft_wrap=True)
        _print_overlay_space(prepared)
    from iomatrix.appliance.guestfio import guest_fio_status
    from iomatrix.appliance.kernel import default_cache_dir

    status = guest_fio_status(default_cache_dir())   # without building anything
    if not status.cached:
        out.print(status.detail if status.ok else f"warning: {status.detail}", markup=False,
                  soft_wrap=True)


def _print_overlay_space(prepared: PreparedRun) -> None:
    """The worst case of the user's guest's overlays, against the free space where they go."""
    import shutil
    import tempfile

    from iomatrix.appliance.ownimage import open_guest_image, overlay_worst_case
    from iomatrix.core.errors import EnvironmentProblem
    from iomatrix.core.units import format_bytes

    own = prepared.suite.guest
    assert own is not None
    guests = own.guests_at_once(prepared.full.configurations, prepared.suite.method.vms)
    try:        # the run's own checks: qemu-img reads no file the suite may not name
        with open_guest_image(own, prepared.suite.author) as image:
            each = overlay_worst_case(image.base)
    except (EnvironmentProblem, SuiteError) as exc:
        out.print(f"warning: {exc}", markup=False, soft_wrap=True)
        return
    tmp = tempfile.gettempdir()
    out.print(f"guest {own.label}: its overlays grow with what the guest writes to its system "
              f"disk; worst case (the whole disk rewritten) {format_bytes(each)} per guest, "
              f"{format_bytes(guests * each)} for the {guests} guest(s) booted at once, in "
              f"{tmp} ({format_bytes(shutil.disk_usage(tmp).free)} free; the run refuses to "
              "start below that)", markup=False, soft_wrap=True)


def _check_options(*, accel: str | None, retry_failed: bool, resume: str | None,
                   scale: str | None, seed: int | None) -> None:
    """BadParameter for options that cannot go together or have no meaning."""
    if accel not in (None, "auto", "kvm", "tcg"):
        raise typer.BadParameter(f"{accel!r}: choose kvm, tcg or auto", param_hint="--accel")
    if retry_failed and resume is None:
        raise typer.BadParameter("goes with --resume RUN", param_hint="--retry-failed")
    if scale is not None and resume is not None:
        raise typer.BadParameter("a resumed run keeps the scale it was started at",
                                 param_hint="--scale")
    if seed is not None and resume is not None:
        raise typer.BadParameter("a resumed run keeps the trial order it was started with",
                                 param_hint="--seed")
    if seed is not None and not -(2**63) <= seed < 2**63:
        raise typer.BadParameter(f"{seed}: a seed is a 64-bit integer", param_hint="--seed")


def resumed_author(stored: StoredRun, db: str) -> Author:
    """Who could have written the suite of the run ``stored`` that --resume measures again:
    the weaker of who could have when the run was made and who could have written the results
    database ``db`` since (``StoredSuite.written_by``; a run made before that was recorded, by
    the database's alone)."""
    from iomatrix.core.text import printable
    from iomatrix.store.location import location_author, parse_location

    return stored.suite.written_by(location_author(parse_location(db)), f"the suite of run "
                                   f"{stored.id} ({printable(stored.suite.source)[:200]})")


def _to_resume(db: Path, resume: str, *, retry_failed: bool) -> StoredRun | None:
    """The stored run ``--resume`` names, or None (said on stdout) when it has nothing left to
    do: a complete run is what --resume asks for, so nothing to do is success."""
    with open_store(db) as store:
        stored = store.load_run(store.resolve(resume))
    failed = sum(1 for t in stored.trials if t.status == "failed")
    if stored.status == "complete" and not retry_failed:
        out.print(f"run {stored.id} is complete: nothing to do" + (
            f" ({failed} of its trials failed: `iomatrix run --resume {stored.id} "
            "--retry-failed` measures them again)" if failed else ""), markup=False,
            soft_wrap=True)
        return None
    if stored.status == "complete" and not failed:
        out.print(f"run {stored.id} is complete and none of its trials failed: nothing "
                  "to retry", markup=False, soft_wrap=True)
        return None
    return stored


def _show_plan(loaded: Suite, suite: str, *, accel: str | None, seed: int | None,
               stored: StoredRun | None, scale: str | None) -> None:
    """``--plan``: the run prepared as run_suite will prepare it (a new run on a PVE host
    measures Proxmox's graph; a resumed one only its missing trials), and a new suite's
    scales when none was asked for."""
    from iomatrix.measure.prepare import prepare
    from iomatrix.measure.pvehost import detect_pve

    prepared = prepare(loaded, accel=accel, seed=seed,
                       pve=detect_pve() if stored is None else None)
    _print_plan(prepared if stored is None else prepared.resumed(stored))
    if stored is None and scale is None and loaded.scales:
        from iomatrix.cli.suites import scale_lines

        out.print("\n".join(scale_lines(suite, loaded, loaded.name)), markup=False,
                  soft_wrap=True)


def _with_target(loaded: Suite, target: Path) -> Suite:
    """The suite with ``--target`` as its one directory target; SuiteError for a suite whose
    target is a device or that names several."""
    if loaded.target.directory is None:
        raise SuiteError(f"{loaded.source_path}: --target replaces a directory target, "
                         "but this suite names a device or network storage")
    if loaded.targets:
        raise SuiteError(f"{loaded.source_path}: --target replaces the directory of one "
                         f"target, but this suite names {len(loaded.targets)} in [[targets]]",
                         hint="edit their directories in the suite file")
    # validated like the suite's own [target]: --target is as untrusted as the file
    target_model = type(loaded.target).model_validate(
        {**loaded.target.model_dump(), "directory": str(target)})
    return loaded.model_copy(update={"target": target_model})


def _interrupt(signum: int, frame: object) -> None:
    from iomatrix.qemu.qmp import defer_interrupt

    if not defer_interrupt():
        raise KeyboardInterrupt


def _storage_target(suite: "Suite", storage_cfg: Path | None) -> "Suite":
    """``suite`` with a [target] storage = "ID" resolved from ``storage_cfg``."""
    if suite.target.storage is None:
        if storage_cfg is not None:
            raise typer.BadParameter("goes with a suite whose [target] names a storage "
                                     "(storage = \"ID\")", param_hint="--storage-cfg")
        return suite
    if storage_cfg is None:
        raise SuiteError(f"{suite.source_path}: [target] storage = {suite.target.storage!r} "
                         "names a Proxmox VE storage",
                         hint="give --storage-cfg /etc/pve/storage.cfg")
    from iomatrix.cli.translate import _read
    from iomatrix.core.mounts import is_mounted
    from iomatrix.platform.proxmox import parse_storage_cfg
    from iomatrix.targets.network import resolve_storage

    storages = parse_storage_cfg(_read(storage_cfg, "--storage-cfg"))
    try:
        resolved = resolve_storage(suite.target, storages, storage_cfg.absolute().parent,
                                   mounted=is_mounted)
    except ValueError as exc:
        raise SuiteError(f"{suite.source_path}: [target] storage: {exc}") from None
    return suite.model_copy(update={"target": resolved})


def _cluster_nodes(loaded: "Suite", given: str | None,
                   stored: "StoredRun | None") -> "tuple[Node, ...]":
    """The nodes a run measures on: a resumed cluster run's own (``resume_nodes``), else
    ``--nodes`` or the suite's [nodes]; () for a run of this host."""
    from iomatrix.measure.cluster import resolve_nodes, resume_nodes

    if stored is not None and stored.nodes:
        return resume_nodes(loaded, given, [(n.name, n.node) for n in stored.nodes])
    if stored is not None and given is not None:
        raise typer.BadParameter("the run was measured on this host alone", param_hint="--nodes")
    return resolve_nodes(loaded, given) if stored is None else ()


def _run_cluster(loaded: "Suite", nodes: "tuple[Node, ...]", db: str, *, keep: bool,
                 accel: str | None, seed: int | None, resume: int | None, retry_failed: bool,
                 report: Path | None) -> None:
    """``run`` on the cluster's nodes (``iomatrix.measure.cluster``)."""
    from iomatrix.cli.progress import ClusterTerminalProgress
    from iomatrix.measure.cluster import nodes_store, preflight, run_cluster

    shared = nodes_store(db)
    err = environment().stderr
    with contextlib.ExitStack() as stack:
        try:
            facts = preflight(loaded, nodes, accel=accel)  # before the store is made or opened
            store = stack.enter_context(open_store(db, must_exist=False))
            progress = stack.enter_context(ClusterTerminalProgress(err))
            outcome = run_cluster(loaded, nodes, store, db=shared, keep=keep, progress=progress,
                                  accel=accel, seed=seed, resume=resume,
                                  retry_failed=retry_failed, facts=facts)
        except KeyboardInterrupt:
            err.print("interrupted: every node was stopped; the trials measured so far are "
                      "stored; the run is marked interrupted")
            raise typer.Exit(ExitStatus.INTERRUPTED) from None
    out.print(f"run {outcome.run_id}: {len(nodes)} nodes, {outcome.trials_ok} trials ok, "
              f"{outcome.trials_failed} failed, {outcome.wall_seconds:.0f} s ({shown_db(db)})")
    if report is not None:
        out.print(f"report: {write_report(db, str(outcome.run_id), report)}")
    if outcome.trials_failed:
        raise typer.Exit(ExitStatus.TRIALS_FAILED)
    if outcome.nodes_failed:        # each measured its share, but one ended with an error
        err.print(f"iomatrix: {outcome.nodes_failed} node(s) ended with an error after "
                  "measuring their share (said above): check what they left behind",
                  markup=False, soft_wrap=True)
        raise typer.Exit(ExitStatus.NODES)


def run(
    suite: Annotated[str, typer.Argument(help="Suite file (TOML) or built-in suite name (see `iomatrix suites`).")] = "quick",
    db: Db = DEFAULT_DB,
    target: Annotated[Optional[Path], typer.Option(help="Use this directory as the target instead of the suite's [target] directory (with [target] filesystems: the directory the filesystems are measured in).")] = None,
    storage_cfg: Annotated[Optional[Path], typer.Option("--storage-cfg", help="Proxmox VE's storage.cfg (/etc/pve/storage.cfg), for a [target] storage = \"ID\": an rbd storage is measured as [target] rbd (monhost, username, pool, namespace, krbd; the keyring priv/ceph/ID.keyring and priv/ceph/ID.conf beside the file, as Proxmox VE keeps them), iscsi/iscsidirect (storage = \"ID:lunN\", LUN 0 without :lunN) as [target] iscsi, dir/nfs/cifs as their images directory (nfs/cifs mounted at their path or /mnt/pve/ID).")] = None,
    keep: Annotated[bool, typer.Option(help="Keep the images and the run's scratch directory.")] = False,
    report: Annotated[Optional[Path], typer.Option(help="Write the HTML report into this directory when the run ends.")] = None,
    accel: Annotated[Optional[str], typer.Option(help="How guests run: kvm, tcg, or auto (KVM when a probe boot works, else TCG). Overrides [method] accel.")] = None,
    show_plan: Annotated[bool, typer.Option("--plan", help="Print the trials in order, the sessions (daemon starts, VM boots) and the estimated time; run nothing.")] = False,
    resume: Annotated[Optional[str], typer.Option(help="Continue this stored run (a number or 'last'): measure only the trials it lacks. SUITE is then ignored.")] = None,
    scale: Annotated[Optional[str], typer.Option(help="Run the suite at this scale: one of its [scale.NAME] tables (built-in suites have quick and full; `iomatrix suites NAME` lists them). Without it, the suite's own tables.")] = None,
    retry_failed: Annotated[bool, typer.Option("--retry-failed", help="With --resume: also measure the run's failed trials again (complete or not); each failed attempt is kept, with its reason, in the run's trial history.")] = False,
    seed: Annotated[Optional[int], typer.Option(help="Shuffle the trial order with this seed (overrides [method] seed): --plan prints the seed of the order it shows, and a run given it measures in that order. Without any, each run draws its own.")] = None,
    nodes: Annotated[Optional[str], typer.Option(help="Run the suite on each of these cluster nodes over SSH, as one run with a node axis (overrides the suite's [nodes]): [user@]host[:port],... ; a TOML inventory file (hosts = [...] or [[node]] tables: host, name, user, port, identity, known_hosts, ssh_config, command); or 'pve': every node of this Proxmox VE cluster (/etc/pve/.members). With --resume: the run's own nodes, named again (ssh_config and command come only from an inventory only root, or you, can write).")] = None,
) -> None:
    """Run a suite: every configuration × workload, stored as one run."""
    from iomatrix.cli.progress import TerminalProgress
    from iomatrix.measure.runner import run_suite
    from iomatrix.suite import load_suite
    from iomatrix.suite.load import with_author

    _check_options(accel=accel, retry_failed=retry_failed, resume=resume, scale=scale,
                   seed=seed)
    if report is not None and not show_plan:
        output_directory(report)      # refused now rather than after the run
    # SIGTERM and SIGHUP stop a run as Ctrl-C does: daemons and fio stopped, images removed.
    # SIGINT gets the same handler rather than Python's default: asyncio.run (QMP) replaces only
    # the default handler, with one that cancels its task, and a library that absorbs the
    # cancellation would absorb the Ctrl-C with it.
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _interrupt)
    stored = None
    if resume is not None:
        stored = _to_resume(db, resume, retry_failed=retry_failed)
        if stored is None:
            return
        loaded = with_author(stored.suite.runnable(), resumed_author(stored, db))
    else:
        from iomatrix.translate.fromvm import resolve_vm

        loaded = resolve_vm(load_suite(suite, scale=scale))
    loaded = _storage_target(loaded, storage_cfg)
    if show_plan:
        cluster = _cluster_nodes(loaded, nodes, stored)     # refused as a run refuses them
        _show_plan(loaded, suite, accel=accel, seed=seed, stored=stored, scale=scale)
        if cluster:
            out.print(f"on each of {len(cluster)} nodes, over SSH: " + ", ".join(
                f"{n.label} ({n.destination()})" for n in cluster), markup=False, soft_wrap=True)
        return
    if target is not None:
        loaded = _with_target(loaded, target)
    resume_id = stored.id if stored is not None else None
    err = environment().stderr
    cluster = _cluster_nodes(loaded, nodes, stored)
    if cluster and not loaded.method.concurrent_nodes:
        _run_cluster(loaded, cluster, db, keep=keep, accel=accel, seed=seed, resume=resume_id,
                     retry_failed=retry_failed, report=report)
        return
    if cluster:      # cluster load: measured from here, every node loading the target at once
        from iomatrix.measure.cluster import preflight

        preflight(loaded, cluster, accel=accel)
    with open_store(db, must_exist=False) as store, TerminalProgress(err) as progress:
        try:
            outcome = run_suite(loaded, store, keep=keep, progress=progress, accel=accel,
                                seed=seed, resume=resume_id, retry_failed=retry_failed,
                                nodes=cluster)
        except KeyboardInterrupt:
            err.print("interrupted: the trials measured so far are stored; the run is marked interrupted")
            raise typer.Exit(ExitStatus.INTERRUPTED) from None
    out.print(f"run {outcome.run_id}: {outcome.trials_ok} trials ok, {outcome.trials_failed} failed, "
              f"{outcome.wall_seconds:.0f} s ({shown_db(db)})")
    if report is not None:
        path = write_report(db, str(outcome.run_id), report)
        out.print(f"report: {path}")
    if outcome.trials_failed:
        raise typer.Exit(ExitStatus.TRIALS_FAILED)
