"""``iomatrix run``: measure a suite, print its plan (``--plan``), finish an interrupted run
(``--resume``), or measure a run's failed trials again (``--resume RUN --retry-failed``).

This module parses the options and prints: the suite is changed and the run prepared in
``iomatrix.measure.prepare``, the plan's lines made in ``measure.planlines``, the run measured
by ``measure.runner`` (or ``measure.cluster`` on the nodes). Those are imported in the functions
that use them, for start-up cost: every command (``iomatrix --help`` too) imports this module,
and the runner brings the drivers, the appliance and the telemetry with it."""

from __future__ import annotations

import contextlib
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from iomatrix.cli.common import (DEFAULT_DB, Db, environment, open_store, out, read_option,
                                 shown_db, write_report)
from iomatrix.cli.status import ExitStatus
from iomatrix.core.files import output_directory
from iomatrix.vocab.words import Accel

if TYPE_CHECKING:
    from iomatrix.cluster.ssh import Node
    from iomatrix.store.records import StoredRun
    from iomatrix.suite.model import Suite


def _said_stalls(db: str, run_id: int) -> None:
    """After a run, each configuration that stalled (``analysis.stalls``): a finding in itself,
    and its stalled trials are out of the figures unless asked."""
    from iomatrix.analysis.stalls import by_config
    from iomatrix.cli.common import load_run

    for one in by_config(load_run(db, str(run_id))):
        out.print(f"stalled: {one.text} (out of its figures unless --with-stalled: "
                  f"iomatrix show {run_id})", markup=False, soft_wrap=True)


def _check_options(*, accel: str | None, retry_failed: bool, resume: str | None,
                   scale: str | None, seed: int | None, storage: str | None,
                   target: Path | None) -> None:
    """BadParameter for options that cannot go together or have no meaning."""
    if accel not in (None, *Accel):
        raise typer.BadParameter(f"{accel!r}: choose kvm, tcg or auto", param_hint="--accel")
    if retry_failed and resume is None:
        raise typer.BadParameter("goes with --resume RUN", param_hint="--retry-failed")
    if scale is not None and resume is not None:
        raise typer.BadParameter("a resumed run keeps the scale it was started at",
                                 param_hint="--scale")
    if seed is not None and resume is not None:
        raise typer.BadParameter("a resumed run keeps the trial order it was started with",
                                 param_hint="--seed")
    if storage is not None and (target is not None or resume is not None):
        raise typer.BadParameter("a resumed run keeps its target" if resume is not None else
                                 "--target names the directory to measure; --storage a "
                                 "storage: give one", param_hint="--storage")
    if seed is not None and not -(2**63) <= seed < 2**63:
        raise typer.BadParameter(f"{seed}: a seed is a 64-bit integer", param_hint="--seed")


def _to_resume(db: str, resume: str, *, retry_failed: bool) -> StoredRun | None:
    """The stored run ``--resume`` names, or None (said on stdout) when it has nothing left to
    do: a complete run is what --resume asks for, so nothing to do is success."""
    from iomatrix.measure.prepare import nothing_to_resume

    with open_store(db) as store:
        stored = store.load_run(store.resolve(resume))
    said = nothing_to_resume(stored, retry_failed=retry_failed)
    if said is not None:
        out.print(said, markup=False, soft_wrap=True)
        return None
    return stored


def _suite(suite: str, db: str, *, scale: str | None, stored: StoredRun | None,
           storage_cfg: Path | None, target: Path | None, storage: str | None,
           targeted: bool) -> Suite:
    """The suite the command line names (``--resume``: the stored run's), as the command line
    changes it (``measure.prepare.for_command_line``); ``targeted``: --target was given (a
    new run on a Proxmox VE host then keeps its directory)."""
    from iomatrix.measure.prepare import for_command_line, resumed_suite
    from iomatrix.measure.pvestorage import host_dir
    from iomatrix.suite import load_suite

    loaded = load_suite(suite, scale=scale) if stored is None else resumed_suite(stored, db)
    if storage_cfg is not None and loaded.target.storage is None and storage is None:
        raise typer.BadParameter("goes with --storage ID or a suite whose [target] names a "
                                 "storage (storage = \"ID\")", param_hint="--storage-cfg")
    cfg = None if storage_cfg is None else (read_option(storage_cfg, "--storage-cfg"),
                                            storage_cfg.absolute().parent)
    err = environment().stderr
    return for_command_line(loaded, storage_cfg=cfg, target=target, storage=storage,
                            pve_dir=None if stored is not None or targeted else host_dir(),
                            note=lambda said: err.print(f"iomatrix: {said}", markup=False,
                                                        soft_wrap=True))


def _show_plan(loaded: Suite, suite: str, *, accel: str | None, seed: int | None,
               stored: StoredRun | None, scale: str | None,
               cluster: "tuple[Node, ...]") -> None:
    """``--plan``: the run prepared as run_suite will prepare it (a new run on a PVE host
    measures Proxmox's graph; a resumed one only its missing trials), and a new suite's
    scales when none was asked for."""
    from iomatrix.measure.planlines import plan_lines
    from iomatrix.measure.prepare import prepare
    from iomatrix.measure.pvehost import detect_pve

    prepared = prepare(loaded, accel=accel, seed=seed,
                       pve=detect_pve() if stored is None else None)
    for line in plan_lines(prepared if stored is None else prepared.resumed(stored)):
        out.print(line.text, markup=False, soft_wrap=not line.wrap)
    if stored is None and scale is None and loaded.scales:
        from iomatrix.cli.suites import scale_lines

        out.print("\n".join(scale_lines(suite, loaded, loaded.name)), markup=False,
                  soft_wrap=True)
    if cluster:
        out.print(f"on each of {len(cluster)} nodes, over SSH: " + ", ".join(
            f"{n.label} ({n.destination()})" for n in cluster), markup=False, soft_wrap=True)


def _interrupt(signum: int, frame: object) -> None:
    from iomatrix.qemu.qmp import defer_interrupt

    if not defer_interrupt():
        raise KeyboardInterrupt


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
    _said_stalls(db, outcome.run_id)
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
    storage: Annotated[Optional[str], typer.Option("--storage", help="Measure this Proxmox VE storage (its id in storage.cfg) in place of the suite's [target] directory: images are made where the storage makes VM disks (a dir storage's images directory, a volume of an LVM-thin pool, ...). On a Proxmox VE host from its /etc/pve/storage.cfg, elsewhere from --storage-cfg. Without it, a built-in suite on a Proxmox VE host measures the storage holding most of the host's VM disks (--plan says which and why); elsewhere /var/tmp/iomatrix. A storage where no volume can be made (no images content, disabled, a type iomatrix cannot measure) is refused.")] = None,
    storage_cfg: Annotated[Optional[Path], typer.Option("--storage-cfg", help="Proxmox VE's storage.cfg (/etc/pve/storage.cfg), for --storage or a [target] storage = \"ID\": an rbd storage is measured as [target] rbd (monhost, username, pool, namespace, krbd; the keyring priv/ceph/ID.keyring and priv/ceph/ID.conf beside the file, as Proxmox VE keeps them), iscsi/iscsidirect (storage = \"ID:lunN\", LUN 0 without :lunN) as [target] iscsi, dir/nfs/cifs as their images directory (nfs/cifs mounted at their path or /mnt/pve/ID), lvmthin as [target] lvmthin (vgname, thinpool), lvm as [target] lvm (vgname; volume_chain with snapshot-as-volume-chain), zfspool as [target] zfs (pool, blocksize, sparse), btrfs as [target] btrfs (path, nocow); on a Proxmox VE host (pvesm on PATH) lvmthin, lvm, zfspool and third-party plugins' storages through pvesm ([target] pvesm: pvesm alloc/path/free under the VM id iomatrix keeps, named iomatrix-volumes). A disabled storage, or one without images content, is refused.")] = None,
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
    _check_options(accel=accel, retry_failed=retry_failed, resume=resume, scale=scale,
                   seed=seed, storage=storage, target=target)
    if report is not None and not show_plan:
        output_directory(report)      # refused now rather than after the run
    # SIGTERM and SIGHUP stop a run as Ctrl-C does: daemons and fio stopped, images removed.
    # SIGINT gets the same handler rather than Python's default: asyncio.run (QMP) replaces only
    # the default handler, with one that cancels its task, and a library that absorbs the
    # cancellation would absorb the Ctrl-C with it.
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _interrupt)
    stored = None if resume is None else _to_resume(db, resume, retry_failed=retry_failed)
    if resume is not None and stored is None:
        return
    loaded = _suite(suite, db, scale=scale, stored=stored, storage_cfg=storage_cfg,
                    target=None if show_plan else target, storage=storage,
                    targeted=target is not None)
    cluster = _cluster_nodes(loaded, nodes, stored)     # refused as a run refuses them
    if show_plan:
        _show_plan(loaded, suite, accel=accel, seed=seed, stored=stored, scale=scale,
                   cluster=cluster)
        return
    resume_id = stored.id if stored is not None else None
    if cluster and not loaded.method.concurrent_nodes:
        _run_cluster(loaded, cluster, db, keep=keep, accel=accel, seed=seed, resume=resume_id,
                     retry_failed=retry_failed, report=report)
    else:
        _run_here(loaded, cluster, db, keep=keep, accel=accel, seed=seed, resume=resume_id,
                  retry_failed=retry_failed, report=report)


def _run_here(loaded: "Suite", cluster: "tuple[Node, ...]", db: str, *, keep: bool,
              accel: str | None, seed: int | None, resume: int | None, retry_failed: bool,
              report: Path | None) -> None:
    """``run`` measured from this host (``iomatrix.measure.runner``); with ``cluster`` (cluster
    load), every node loading the target at once."""
    from iomatrix.cli.progress import TerminalProgress
    from iomatrix.measure.cluster import preflight
    from iomatrix.measure.runner import run_suite

    err = environment().stderr
    if cluster:
        preflight(loaded, cluster, accel=accel)
    with open_store(db, must_exist=False) as store, TerminalProgress(err) as progress:
        try:
            outcome = run_suite(loaded, store, keep=keep, progress=progress, accel=accel,
                                seed=seed, resume=resume, retry_failed=retry_failed,
                                nodes=cluster)
        except KeyboardInterrupt:
            err.print("interrupted: the trials measured so far are stored; the run is marked interrupted")
            raise typer.Exit(ExitStatus.INTERRUPTED) from None
    out.print(f"run {outcome.run_id}: {outcome.trials_ok} trials ok, {outcome.trials_failed} failed, "
              f"{outcome.wall_seconds:.0f} s ({shown_db(db)})")
    _said_stalls(db, outcome.run_id)
    if report is not None:
        path = write_report(db, str(outcome.run_id), report)
        out.print(f"report: {path}")
    if outcome.trials_failed:
        raise typer.Exit(ExitStatus.TRIALS_FAILED)
