"""Runs a suite: expands it, prepares the target, realizes each configuration with its driver,
measures every workload with fio, and stores each trial as it completes. Reports progress through
a callback object; never prints."""

from __future__ import annotations

import random
import shlex
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol


from iomatrix.cluster.ssh import Node
from iomatrix.drivers.base import Driver, Session
from iomatrix.drivers.clusterblock import on_the_nodes
from iomatrix.drivers.guest import GuestDriver
from iomatrix.drivers.guest.kind import GuestKind
from iomatrix.drivers.registry import driver_for
from iomatrix.core.errors import IomatrixError, ToolFailed, TrialFailed
from iomatrix.fio.depth import achieved_depth
from iomatrix.fio.ioping import IopingTool, run_ioping
from iomatrix.fio.jobfile import fill_text, ioping_job_text, job_text
from iomatrix.fio.logs import TrialLogs
from iomatrix.measure.prepare import PreparedRun, prepare
from iomatrix.measure.pvehost import detect_pve
from iomatrix.fio.persecond import not_judged
from iomatrix.measure.stallwatch import StallWatch
from iomatrix.measure.reclaim import run_process
from iomatrix.measure.runopen import (Share, Started, late_notes, open_run, steered_irqs,
                                      take_over)
from iomatrix.measure.trialkey import TrialKey
from iomatrix.measure.watch import CounterWatch, SteadyWatch
from iomatrix.fio.run import output_path, run_fio
from iomatrix.suite.plan import Block, estimate_seconds, plan_round, trial_seconds
from iomatrix.fio.samples import DirectionSample, samples_of, vm_samples_of
from iomatrix.store.records import PilotTrial, SteadyRecord, TrialResult
from iomatrix.store.repo import Store, now
from iomatrix.store.rows import StoredPlan
from iomatrix.suite.expand import Expansion
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.model import Suite
from iomatrix.suite.workloads import Workload
from iomatrix.targets.kind import OpenTarget
from iomatrix.measure.precheck import check_run
from iomatrix.telemetry.host import device_of
from iomatrix.telemetry.perf import perf_problem
from iomatrix.telemetry.probe import TrialProbe
from iomatrix.core.model import Frozen
from iomatrix.vocab.words import Accelerator, Mode, RunStatus, TrialStatus

if TYPE_CHECKING:
    from iomatrix.measure.clusterpilot import NodePilot

FIO_GRACE = 60.0
STOP_RETRIES = 2
"""How many times a trial whose guests stopped (``Session.stalled``) is measured again, each
in a fresh boot: stops come in bursts on a loaded host, so one more attempt was seen to stop too."""


PACING_OPTIONS = ("rate", "thinktime")
"""Prefixes of fio's options with which a job paces itself below what its queue could do
(rate, rate_iops, rate_min..., thinktime, thinktime_blocks...)."""


def in_flight(workload: Workload) -> int:
    """Requests the workload's fio keeps queued in each guest (iodepth × numjobs): a guest
    whose disk completes no more than that in a second past the trial's time stopped
    (``Session.stalled``). 0 for a job that paces itself (rate_iops, fio's rate or thinktime
    options, ioping's one request a second), whose disk may rightly be that slow."""
    paced = (workload.rate_iops or workload.ioping is not None
             or any(name.startswith(PACING_OPTIONS) for name, _ in workload.options))
    return 0 if paced else workload.iodepth * workload.numjobs


class Progress(Protocol):
    """What the runner tells its caller; the CLI draws it, tests record it."""

    def start(self, trials: int, planned_seconds: float) -> None: ...
    def more(self, trials: int, planned_seconds: float) -> None: ...
    def trial_started(self, n: int, config: Configuration, workload: Workload, sample: int) -> None: ...
    def trial_finished(self, n: int, ok: bool, detail: str) -> None: ...
    def note(self, text: str) -> None: ...


class SilentProgress:
    def start(self, trials: int, planned_seconds: float) -> None: ...
    def more(self, trials: int, planned_seconds: float) -> None: ...
    def trial_started(self, n: int, config: Configuration, workload: Workload, sample: int) -> None: ...
    def trial_finished(self, n: int, ok: bool, detail: str) -> None: ...
    def note(self, text: str) -> None: ...


class RunOutcome(Frozen):
    """How a run went, with the time accounting that bench/ reports."""

    run_id: int
    trials_ok: int
    trials_failed: int
    measured_seconds: float
    """Sum of the measurement windows (fio runtime, ramp excluded) of ok trials."""
    wall_seconds: float
    nodes_failed: int = 0
    """Cluster runs: nodes that ended dropped or failed (whose trials may all be stored)."""


def run_suite(suite: Suite, store: Store, *, keep: bool = False,
              progress: Progress | None = None, accel: str | None = None,
              seed: int | None = None, resume: int | None = None,
              retry_failed: bool = False, share: Share | None = None,
              nodes: Sequence[Node] = (), pilot: NodePilot | None = None) -> RunOutcome:
    """Measure every trial of ``suite`` and store it; returns how it went. The run is prepared
    as ``run --plan`` shows it (``measure.prepare``: ``accel`` and ``seed`` override the
    suite's [method] accel and seed). ``resume`` continues that stored run (whose suite must be
    ``suite``), in its own order: only trials it does not have are measured, and with
    ``retry_failed`` its failed trials too (each failed attempt is kept in the run's trial
    history). Ctrl-C stops every process started, removes the images (unless ``keep``) and
    marks the run interrupted. On a Proxmox VE host a new run of a suite that chooses no
    platform measures Proxmox's graph (``iomatrix.measure.pvehost``). With ``[method]
    concurrent_nodes``, ``nodes`` load the target at once (``iomatrix.drivers.cluster``).

    The target is checked before anything is stored or created. This process owns the run while
    it measures (``RunBusy`` if a live process owns it already; a dead owner is taken over), and
    records every directory it creates; what dead processes left behind for this run or this
    target is removed first (``iomatrix.measure.reclaim``).

    With ``share`` this process measures a node's share of a cluster run (``Share``): it
    continues the share where its store has it already, and never owns or ends the cluster's
    own run; with ``pilot`` its pilot's trials go to the cluster's controller, which chooses
    the plan every node follows (``iomatrix.measure.clusterpilot``)."""
    progress = progress or SilentProgress()
    t0 = time.monotonic()
    # a stored run keeps the platform it was started with
    prepared = prepare(suite, accel=accel, seed=seed, pve=detect_pve() if resume is None else None)
    if share is not None:
        prepared = prepared.on_node(share.node)
        resume = store.run_by_uuid(share.run_uuid)
    suite = prepared.suite
    workspace, guests = check_run(prepared, keep, nodes)
    with run_process(store, keep=keep) as me:
        assert me.id is not None and me.scratch is not None
        workdir = me.scratch
        take_over(store, me, suite, resume, share, progress.note)
        drivers = _drivers(suite, prepared.full, workdir, prepared.accelerator, progress, guests)
        accelerator = drivers[Mode.GUEST].accelerator if Mode.GUEST in drivers else "none"
        if suite.method.concurrent_nodes:
            # the nodes boot the guests, as this host would: under its accelerator
            drivers |= on_the_nodes(drivers, suite, workdir, nodes, accelerator, workspace)
        started = open_run(store, me, prepared.under(accelerator), workspace, resume=resume,
                           retry_failed=retry_failed, share=share, nodes=nodes)
        for text in started.notes:
            progress.note(text)
        workspace.for_run(record=me.record, scratch=workdir, run_id=started.run_id)
        runner = _measure(started, store, progress, workspace, workdir, drivers,
                          owned=share is None or not share.shared, process=me.id,
                          pilot=pilot)
    return RunOutcome(run_id=started.run_id, trials_ok=runner.ok, trials_failed=runner.failed,
                      measured_seconds=runner.measured, wall_seconds=time.monotonic() - t0)


def _measure(started: Started, store: Store, progress: Progress, workspace: OpenTarget,
             workdir: Path, drivers: dict[str, Driver], *, owned: bool,
             process: int, pilot: NodePilot | None = None) -> "_Runner":
    """Make the target and measure the run's trials (the pilot's first, when it plans its
    rounds); the run ends complete, failed or interrupted (unless ``owned`` is False: a
    cluster's controller ends it)."""
    status = RunStatus.FAILED
    try:
        runner = _Runner(started.prepared, store, started.run_id, progress, started.done,
                         started.retry, cluster=pilot)
        with workspace, steered_irqs(started, store, progress.note, process):
            workspace.create()
            late_notes(store, started.run_id, progress.note, started.notes, workspace.notes)
            if started.prepared.suite.method.plans_rounds:
                runner.choose_trials(workspace, workdir, drivers)
            runner.run(workspace, workdir, drivers)
        status = RunStatus.COMPLETE
    except KeyboardInterrupt:
        status = RunStatus.INTERRUPTED
        raise
    finally:
        if owned:
            store.finish_run(started.run_id, status)
    return runner


def _drivers(suite: Suite, expansion: Expansion, workdir: Path, accel: str,
             progress: Progress, guests: Sequence[GuestKind] = ()) -> dict[str, Driver]:
    """One driver per mode the run uses, each prepared for the run (for guests: the appliance
    built or found cached, the accelerator resolved, and the suite's kinds of guest)."""
    drivers = {mode: driver_for(mode, suite.method, workdir, accel=accel, note=progress.note)
               for mode in dict.fromkeys(c.mode for c in expansion.configurations)}
    guest = drivers.get(Mode.GUEST)
    if guests and isinstance(guest, GuestDriver):
        guest.use_kinds(guests, progress.note, expansion.configurations)
    return drivers


class _Runner:
    def __init__(self, prepared: PreparedRun, store: Store, run_id: int, progress: Progress,
                 done: set[TrialKey],
                 retry: set[TrialKey] | None = None, *,
                 cluster: NodePilot | None = None) -> None:
        self.prepared = prepared
        self.suite = prepared.suite
        self.method = prepared.suite.method
        self.expansion = prepared.expansion
        self.store = store
        self.run_id = run_id
        self.progress = progress
        self.seed = prepared.seed
        self.done = done
        self.retry = set(retry or ())
        """Failed trials to measure again (--retry-failed), until they are."""
        self.cluster = cluster
        """A node's share: the cluster's one pilot (``clusterpilot``) chooses the plan."""
        self.ok = self.failed = 0
        self.measured = 0.0
        self.accelerator = "none"
        self.n = 0
        self.device: str | None = None
        """The block device of the target measured now, for the host's disk telemetry."""
        self._devices: dict[Path | None, str | None] = {}
        self.perf = perf_problem()
        self.ioping = prepared.ioping
        """ioping, where installed: host-mode ioping workloads run it (fio's equivalent if not)."""
        self.started = False
        """Progress was told a count of trials (by the pilot, before the rounds)."""
        self.pilot: list[TrialResult] | None = None
        """While the pilot measures: where its trials go instead of the store."""
        self.preconditioning = 0.0
        """Seconds spent preconditioning images so far (kept out of the pilot's session cost)."""

    def _todo(self, blocks: list[Block]) -> list[Block]:
        """The blocks with only the trials not stored yet (resume), empty blocks dropped."""
        out = []
        for b in blocks:
            left = tuple(w for w in b.workloads
                         if TrialKey(b.config.key, w.key, b.round) not in self.done)
            if left:
                out.append(b.model_copy(update={"workloads": left}))
        return out

    def run(self, workspace: OpenTarget, workdir: Path,
            drivers: dict[str, Driver]) -> None:
        blocks = self._todo(self.prepared.blocks)
        (self.progress.more if self.started else self.progress.start)(
            sum(len(b.workloads) for b in blocks), estimate_seconds(blocks, self.method))
        for block in blocks:
            self._block(block, workspace, workdir, drivers)

    def choose_trials(self, workspace: OpenTarget, workdir: Path,
                      drivers: dict[str, Driver]) -> None:
        """[method] pilot or target_ci: the runtime and rounds (target_ci alone: the rounds)
        chosen from a pilot (``analysis.trialplan``) replace the suite's for this run. A
        resumed run keeps the plan it stored; a run without one (new, or stopped during its
        pilot) measures the pilot first, stores its trials apart from the run's (never part
        of a gain) and says in the run's notes what was measured and chosen."""
        # a node's share follows the controller's plan: one it has, else its pilot's trials
        # go to the controller, which chooses over every node's
        plan = self.cluster.given if self.cluster else self.store.load_pilot(self.run_id)[1]
        if plan is None:
            plan = self._pilot(workspace, workdir, drivers)
        if plan.choice is None:
            return
        self.prepared = self.prepared.chosen(plan.choice)      # prepare applies the choice
        self.suite, self.method = self.prepared.suite, self.prepared.suite.method

    def _pilot(self, workspace: OpenTarget, workdir: Path,
               drivers: dict[str, Driver]) -> StoredPlan:
        """Measure the pilot, choose, store both and note them; the plan stored (a node's
        share: its trials sent to the controller, and the plan it chose over every node's)."""
        from iomatrix.analysis import trialplan as tp   # scipy: loaded only when asked for

        t0 = time.monotonic()
        base = self.method
        lengths = tp.pilot_lengths(base.chooses_runtime, base.window)
        pairs, per_mode = pilot_points(self.expansion, self.seed)
        rounds = [plan_round(self.expansion, -1 - r, self.seed, pairs)
                  for r in range(tp.PILOT_ROUNDS)]
        count = sum(len(b.workloads) for blocks in rounds for b in blocks) * len(lengths)
        self.progress.start(count, count * (sum(lengths) / len(lengths) + base.ramp))
        self.started = True
        self.progress.note(f"pilot: {count} trials of {' and '.join(per_mode)} at "
                           f"{' and '.join(f'{x:g} s' for x in lengths)} before the "
                           "rounds, to choose "
                           + ("their trial length and number" if len(lengths) > 1 else
                              "their number"))
        collected: list[PilotTrial] = []
        counts = (self.ok, self.failed, self.measured)
        try:
            for r, blocks in enumerate(rounds):
                for block in blocks:
                    start, before, prep = time.monotonic(), len(collected), self.preconditioning
                    self._block(block, workspace, workdir, drivers,
                                each=self._pilot_trial(collected, r, lengths))
                    mine = collected[before:]
                    if mine:
                        outside = (time.monotonic() - start - (self.preconditioning - prep)
                                   - sum(t.wall_s for t in mine))
                        collected[-1] = mine[-1].model_copy(update={"session_s": max(0.0, outside)})
        finally:
            self.method, self.pilot = base, None
            self.ok, self.failed, self.measured = counts
        if self.cluster is not None:        # the controller stores it, with every node's
            return self.cluster.plan(collected)
        plan, note = tp.decide(collected, per_mode, base, time.monotonic() - t0, lengths)
        self.store.record_pilot(self.run_id, collected, plan)
        self.store.add_notes(self.run_id, [note])
        self.progress.note(note)
        return plan

    def _pilot_trial(self, collected: list[PilotTrial], r: int,
                     lengths: tuple[float, ...]) -> "_Each":
        """What a pilot block does with each workload: measure it at each pilot length (in an
        order drawn with the run's seed; one length: the run's own trial, as it is), timing
        each trial whole."""
        base = self.method
        rng = random.Random(f"{self.seed}:pilot:{r}")

        def each(session: Session, workdir: Path, config: Configuration, workload: Workload,
                 k: int) -> None:
            for length in rng.sample(lengths, len(lengths)):
                if len(lengths) > 1:
                    self.method = base.model_copy(update={"runtime": length})
                self.pilot = []
                t = time.monotonic()
                try:
                    self._trial(session, workdir, config, workload, k)
                finally:
                    wall = time.monotonic() - t
                    self.method = base
                    got, self.pilot = self.pilot, None
                ok = [g for g in got if g.status == TrialStatus.OK]
                collected.append(PilotTrial(
                    mode=config.mode, config_key=config.key, workload_key=workload.key, round=r,
                    runtime_s=length, wall_s=wall,
                    iops=sum(s.iops for s in ok[0].samples) if ok else None))
                if session.stalled(in_flight(workload)):   # stopped guests measure no other
                    break                                   # length (_stopped)
        return each

    def _block(self, block: Block, workspace: OpenTarget, workdir: Path,
               drivers: dict[str, Driver], each: "_Each | None" = None) -> None:
        config = block.config
        driver = drivers[config.mode]
        self.accelerator = driver.accelerator
        trials = list(block.workloads)
        retried: dict[str, int] = {}
        try:
            images = workspace.images(driver.images_of(config))
            workspace.verify(images)     # fio and QEMU open them by path: still iomatrix's?
            self.device = self._device(workspace, config)
            while trials:
                with driver.session(config, images) as session:
                    fresh = [i.path for i in images if i.path not in workspace.preconditioned]
                    if self.method.precondition and fresh:
                        self.progress.note(f"preconditioning {', '.join(p.name for p in fresh)}"
                                           f" (writing fully once) through {config.label}")
                        t = time.monotonic()
                        try:
                            self._precondition(session, workdir)
                        except (TrialFailed, ToolFailed) as exc:   # a node gone: named
                            raise TrialFailed(session.failure(str(exc))) from exc
                        self.preconditioning += time.monotonic() - t
                        workspace.preconditioned.update(fresh)
                    while trials:
                        workspace.verify(images)
                        (each or self._trial)(session, workdir, config, trials[0], block.sample)
                        if session.stalled(in_flight(trials[0])):
                            self._stopped(config, trials, block.sample, retried,
                                          pilot=each is not None)
                            break     # out of this session: the rest in a fresh one
                        trials.pop(0)
                    workspace.verify(images)
        except (TrialFailed, ToolFailed) as exc:
            # The configuration could not be brought up: the block's remaining trials fail alike.
            for workload in trials:
                self._begin(config, workload, block.sample)
                self._failed(config, workload, block.sample, str(exc), started=now())

    def _device(self, workspace: OpenTarget, config: Configuration) -> str | None:
        """The /proc/diskstats name of what holds the configuration's images (``storage_of``,
        asked once its images are made: a volume target's device is its volume's), or None."""
        storage = workspace.storage_of(config)
        if storage not in self._devices:
            self._devices[storage] = device_of(storage) if storage else None
        return self._devices[storage]

    def _stopped(self, config: Configuration, trials: list[Workload], k: int,
                 retried: dict[str, int], *, pilot: bool) -> None:
        """The session's guests stopped in the trial of ``trials[0]``, and the block goes on in a
        fresh session: with that trial again (:meth:`_again`), or, once it has stopped
        :data:`STOP_RETRIES` + 1 times or when it was a pilot's (one measurement of many, not
        repeated), with the trials after it, which the stopped guests could not have measured."""
        workload = trials[0]
        tries = retried.get(workload.key, 0)
        if not pilot and tries < STOP_RETRIES:
            retried[workload.key] = tries + 1
            self._again(config, workload, k, tries + 1)
            return
        trials.pop(0)
        if not trials:
            return
        why = ("in a pilot trial, which is not measured again" if pilot
               else f"(attempt {tries + 1} of at most {STOP_RETRIES + 1}); the trial failed")
        text = (f"{now()}: {config.label} {workload.key} #{k}: the guests stopped {why}; the "
                f"{len(trials)} trial(s) after it in this configuration are measured after "
                f"booting them afresh")
        self.store.add_notes(self.run_id, [text])
        self.progress.note(text)

    def _again(self, config: Configuration, workload: Workload, k: int, attempt: int) -> None:
        """The trial just failed because its session stopped (``Session.stalled``): it is
        measured again in a fresh session (``attempt`` is how many times now, at most
        :data:`STOP_RETRIES`), and its failed attempt kept in the run's trial history; a run
        note says so. The counts go back to before the attempt."""
        key = TrialKey(config.key, workload.key, k)
        self.retry.add(key)
        self.n -= 1
        self.failed -= 1
        text = (f"{now()}: {config.label} {workload.key} #{k}: the guests stopped (fio never "
                f"finished, their disks idle or nearly, or their QEMU not answering); measured "
                f"again after booting them afresh (attempt {attempt + 1} of at most "
                f"{STOP_RETRIES + 1}; the failed attempt is kept in the run's trial history)")
        self.store.add_notes(self.run_id, [text])
        self.progress.note(text)

    def _precondition(self, session: Session, workdir: Path) -> None:
        target = session.fio_target()
        size = session.image.size if "size" not in target else None
        clients = session.precondition_clients()
        jobs = [fill_text(target=t, size=size) for t in session.job_targets()[:len(clients) or 1]]
        run_fio(jobs[0], workdir=workdir, timeout=max(600.0, session.image.size / 5e6),
                extra_args=session.fio_args(), env=session.fio_env(), clients=clients,
                client_jobs=jobs if len(jobs) > 1 else ())

    def _trial(self, session: Session, workdir: Path, config: Configuration, workload: Workload,
               k: int) -> None:
        self._begin(config, workload, k)
        session.new_trial()
        started = now()
        method = self.method
        ioping_file = session.ioping_path() if workload.ioping else None
        if self.ioping and ioping_file:
            return self._ioping_trial(session, self.ioping, ioping_file, config, workload, k)
        stalls = StallWatch(session, workload, workdir)
        logs = TrialLogs(workdir, remote=stalls.remote)
        jobs = [(ioping_job_text(workload, target=target) if workload.ioping else
                 job_text(workload, target=target, ramp=method.ramp, runtime=method.window,
                          logs=logs.directory))
                for target in session.job_targets()]
        seconds = trial_seconds(workload, method)
        guests = bool(session.clients())
        watch: SteadyWatch | CounterWatch | None = None
        steady = method.steady_state and not workload.ioping   # a count of requests, not a time
        if steady and guests:
            watch = CounterWatch(session.completed_ios, ramp_s=method.ramp,
                                 min_seconds=method.min_runtime)
        elif steady:
            watch = SteadyWatch(output_path(workdir), ramp=method.ramp > 0,
                                min_seconds=method.min_runtime)
        probe = TrialProbe(session.pids(), self.device, self.perf)
        stalls.start()
        logs.start()
        try:
            with probe:
                fio = run_fio(stalls.job(jobs[0]), workdir=workdir, timeout=seconds + FIO_GRACE,
                              extra_args=session.fio_args(), during=session.observe,
                              during_at=(seconds / 2 if workload.ioping else method.ramp + min(
                                  method.window, method.min_runtime if watch else method.window)
                                  / 2),
                              output_format=session.fio_output_format(),
                              stop_when=(lambda _: watch.poll().reached) if watch else None,
                              status_stream=not guests, env=session.fio_env(),
                              clients=session.fio_clients(), late=session.overdue,
                              client_jobs=jobs if len(jobs) > 1 else ())
            session.check_trial(fio.result, workload)
            # a client without a result (a node gone as fio ended) fails the trial, naming it
            vm_samples = vm_samples_of(fio.result, session.clients())
        except IomatrixError as exc:
            stalls.finish()
            logs.discard()
            self._failed(config, workload, k, session.failure(str(exc)), started=started,
                         applied=session.applied(), command=session.command())
            return
        wrong = session.mismatches()
        job_stats = fio.result.aggregate or fio.result.jobs[0]
        samples = samples_of(fio.result)
        status = TrialStatus.FAILED if wrong else TrialStatus.OK
        depth = achieved_depth(fio.result, workload.iodepth)
        reason = ("QEMU did not apply the configuration as asked: " + "; ".join(wrong)) if wrong else None
        self._record(TrialResult(
            config_key=config.key, workload_key=workload.key, sample_index=k, status=status,
            reason=reason, started_at=started, samples=samples, vm_samples=vm_samples,
            wall_seconds=fio.wall_seconds,
            fio_version=fio.result.fio_version, usr_cpu=job_stats.usr_cpu,
            sys_cpu=job_stats.sys_cpu, ctx=job_stats.ctx, fio_json=fio.raw_json,
            accelerator=self.accelerator, applied=session.applied(), command=session.command(),
            steady=_steady_record(watch), cpu=probe.cost(samples), telemetry=probe.host_series(),
            stall=stalls.finish(samples), depth=depth, logs=logs.collect()))
        if wrong:
            self.failed += 1
            self.progress.trial_finished(self.n, False, reason or "")
            return
        self.ok += 1
        self.measured += max(s.runtime_ms for s in samples) / 1000 if samples else 0.0
        iops = sum(s.iops for s in samples)
        emulated = " (emulated: TCG, measures the emulator)" if self.accelerator == Accelerator.TCG else ""
        figure = (_latency_text(samples, "fio's equivalent of ioping") if workload.ioping
                  else f"{iops:,.0f} IOPS" + (f", {depth.text}" if depth.short else ""))
        self.progress.trial_finished(self.n, True, figure + emulated)

    def _ioping_trial(self, session: Session, tool: IopingTool, file: Path,
                      config: Configuration, workload: Workload, k: int) -> None:
        """An ioping workload measured by ioping itself (host mode): stored like a fio trial,
        its tool named in the trial's version (``tool`` when loaded) and its command."""
        started = now()
        probe = TrialProbe(session.pids(), self.device, self.perf)
        try:
            with probe:
                done = run_ioping(tool, workload, file)
        except IomatrixError as exc:
            self._failed(config, workload, k, str(exc), started=started)
            return
        samples = (done.sample,)
        self._record(TrialResult(
            config_key=config.key, workload_key=workload.key, sample_index=k, status=TrialStatus.OK,
            started_at=started, samples=samples, wall_seconds=done.wall_seconds,
            fio_version=done.version, fio_json=done.output, accelerator=self.accelerator,
            command=shlex.join(done.argv),
            steady=SteadyRecord(checked=False, reason="an ioping workload: a count of requests"),
            stall=not_judged("an ioping workload paces itself"),
            cpu=probe.cost(samples, "ioping (host)"),   # the child it reaped is ioping, not fio
            telemetry=probe.host_series()))
        self.ok += 1
        self.measured += done.sample.runtime_ms / 1000
        self.progress.trial_finished(self.n, True, _latency_text(samples, done.version))

    def _begin(self, config: Configuration, workload: Workload, k: int) -> None:
        self.n += 1
        self.progress.trial_started(self.n, config, workload, k)

    def _record(self, result: TrialResult) -> None:
        """Store a trial; one being retried replaces its failed attempt (kept in the history).
        A pilot's trial is kept for the pilot instead."""
        if self.pilot is not None:
            self.pilot.append(result)
            return
        key = TrialKey.of(result)
        self.store.record_trial(self.run_id, result, replace_failed=key in self.retry)
        self.retry.discard(key)

    def _failed(self, config: Configuration, workload: Workload, k: int, reason: str, *,
                started: str, applied: dict[str, str] | None = None, command: str = "") -> None:
        self._record(TrialResult(
            config_key=config.key, workload_key=workload.key, sample_index=k, status=TrialStatus.FAILED,
            reason=reason, started_at=started, applied=applied or {}, command=command,
            accelerator=self.accelerator))
        self.failed += 1
        self.progress.trial_finished(self.n, False, reason)


NODES_ALL = 1 << 16
"""A configuration without a node count loads every node: more than any ``node_count``."""


_Each = Callable[[Session, Path, Configuration, Workload, int], None]
"""What a block does with each of its workloads (``_Runner._trial``, or a pilot's)."""


def pilot_points(expansion: Expansion, seed: int) -> tuple[
        list[tuple[str, str]], dict[str, tuple[int, int, int]]]:
    """The (configuration, workload) points a pilot measures: per mode, its first two
    configurations (not an A/A twin; under cluster load, those that load the most nodes at
    once, so that every node is measured in the one pilot) on ``PILOT_WORKLOADS`` of their common workloads drawn
    with ``seed`` (ioping workloads, whose length is a count of requests, left out); and per
    mode with such points, (trials a round, sessions a round, the fewest workloads at one
    queue depth: the pairs a gain per queue depth averages over)."""
    from iomatrix.analysis.trialplan import PILOT_WORKLOADS

    rng = random.Random(f"{seed}:pilot")
    pairs: list[tuple[str, str]] = []
    per_mode: dict[str, tuple[int, int, int]] = {}
    for mode in dict.fromkeys(c.mode for c in expansion.configurations):
        configs = [c for c in expansion.configurations if c.mode == mode and not c.aa]
        # under cluster load, those with the most nodes first: the pilot loads every node
        configs = sorted(configs, key=lambda c: -(c.node_count or NODES_ALL))[:2]
        common = [w for w in expansion.workloads_for(configs[0]) if not w.ioping and all(
            w in expansion.workloads_for(c) for c in configs)] if configs else []
        if not common:
            continue
        drawn = rng.sample(common, min(PILOT_WORKLOADS, len(common)))
        pairs += [(c.key, w.key) for c in configs for w in drawn]
        mine = [c for c in expansion.configurations if c.mode == mode]
        timed = [w for c in mine for w in expansion.workloads_for(c) if not w.ioping]
        depths: dict[int, int] = {}
        for w in {w.key: w for w in timed}.values():
            depths[w.iodepth] = depths.get(w.iodepth, 0) + 1
        per_mode[mode] = (len(timed), len(mine), min(depths.values()))
    return pairs, per_mode


def _latency_text(samples: tuple[DirectionSample, ...], tool: str) -> str:
    """A latency trial's progress line: its mean request latency and the tool that measured it."""
    mean = samples[0].lat_mean_ns if samples else None
    return f"{mean / 1000:,.1f} µs mean latency ({tool})" if mean is not None else tool


def _steady_record(watch: "SteadyWatch | CounterWatch | None") -> SteadyRecord:
    """What is stored about steady state with a trial."""
    if watch is None:
        return SteadyRecord(checked=False, reason="steady_state is off")
    if isinstance(watch, CounterWatch):
        if watch.unavailable:
            return SteadyRecord(checked=False,
                                reason="QEMU's device counters are unavailable (vhost-user-blk)")
        return SteadyRecord(checked=True, source="QEMU device counters", verdict=watch.finish())
    return SteadyRecord(checked=True, source="fio status stream", verdict=watch.finish())
