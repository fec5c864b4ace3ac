"""Runs a suite: expands it, prepares the target, realizes each configuration with its driver,
measures every workload with fio, and stores each trial as it completes. Reports progress through
a callback object; never prints."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel, ConfigDict

from iomatrix.drivers.base import Driver, Session, driver_for
from iomatrix.errors import IomatrixError, ToolFailed, TrialFailed
from iomatrix.fio.jobfile import fill_text, job_text
from iomatrix.fio.run import run_fio
from iomatrix.hostinfo import host_metadata
from iomatrix.proc import require
from iomatrix.results import samples_of, vm_samples_of
from iomatrix.store.repo import Store, now
from iomatrix.suite.expand import Expansion, expand
from iomatrix.suite.model import Configuration, Suite, Workload
from iomatrix.target import Workspace

# What a trial costs beyond ramp + runtime (fio start, daemon start shared over its workloads):
# used only for the ETA shown before the first trials have been timed.
TRIAL_OVERHEAD = 0.3
FIO_GRACE = 60.0


class Progress(Protocol):
    """What the runner tells its caller; the CLI draws it, tests record it."""

    def start(self, trials: int, planned_seconds: float) -> None: ...
    def trial_started(self, n: int, config: Configuration, workload: Workload, sample: int) -> None: ...
    def trial_finished(self, n: int, ok: bool, detail: str) -> None: ...
    def note(self, text: str) -> None: ...


class SilentProgress:
    def start(self, trials: int, planned_seconds: float) -> None: ...
    def trial_started(self, n: int, config: Configuration, workload: Workload, sample: int) -> None: ...
    def trial_finished(self, n: int, ok: bool, detail: str) -> None: ...
    def note(self, text: str) -> None: ...


class RunOutcome(BaseModel):
    """How a run went, with the time accounting that bench/ reports."""

    model_config = ConfigDict(frozen=True)
    run_id: int
    trials_ok: int
    trials_failed: int
    measured_seconds: float
    """Sum of the measurement windows (fio runtime, ramp excluded) of ok trials."""
    wall_seconds: float


def planned_seconds(suite: Suite, expansion: Expansion) -> float:
    """Estimated wall time of a suite's trials."""
    per_trial = suite.method.ramp + suite.method.runtime + TRIAL_OVERHEAD
    return expansion.trials_per_sample * suite.method.samples * per_trial


def tools_for(expansion: Expansion) -> list[str]:
    """The programs a run needs, checked before anything starts."""
    tools = ["fio", "qemu-img"]
    configs = expansion.configurations
    if any(c.mode == "blocklayer" or c.data_path == "vhost-user-blk" for c in configs):
        tools.append("qemu-storage-daemon")
    if any(c.mode == "blocklayer" and c.iothread for c in configs):
        tools.append("fusermount3")
    if any(c.mode == "guest" for c in configs):
        tools.append("qemu-system-x86_64")
    return tools


def run_suite(suite: Suite, store: Store, *, keep: bool = False,
              progress: Progress | None = None, accel: str | None = None) -> RunOutcome:
    """Measure every trial of ``suite`` and store it; returns how it went. ``accel`` overrides
    the suite's [method] accel. Ctrl-C stops every process started, removes the images (unless
    ``keep``) and marks the run interrupted."""
    progress = progress or SilentProgress()
    t0 = time.monotonic()
    expansion = expand(suite)
    for tool in tools_for(expansion):
        require(tool)
    with _scratch(keep) as workdir:
        drivers = _drivers(suite, expansion, workdir, accel or suite.method.accel, progress)
        accelerator = drivers["guest"].accelerator if "guest" in drivers else "none"
        expansion = expansion.for_accel(accelerator)
        target_path = suite.target.directory or suite.target.device
        host = host_metadata(target_path, accelerator=accelerator)
        run_id = store.create_run(suite_name=suite.name, suite_source=suite.source_path,
                                  suite_text=suite.source_text, host=host,
                                  accelerator=accelerator, notes=expansion.notes,
                                  configs=expansion.configurations,
                                  workloads=expansion.workloads)
        for text in expansion.notes:
            progress.note(text)
        runner = _Runner(suite, expansion, store, run_id, progress)
        status = "failed"
        try:
            with Workspace(suite.target, keep=keep) as workspace:
                workspace.open(expansion.configurations)
                runner.run(workspace, workdir, drivers)
            status = "complete"
        except KeyboardInterrupt:
            status = "interrupted"
            raise
        finally:
            store.finish_run(run_id, status)
    return RunOutcome(run_id=run_id, trials_ok=runner.ok, trials_failed=runner.failed,
                      measured_seconds=runner.measured, wall_seconds=time.monotonic() - t0)


def _drivers(suite: Suite, expansion: Expansion, workdir: Path, accel: str,
             progress: Progress) -> dict[str, Driver]:
    """One driver per mode the run uses; for guests the appliance is built (or found cached)
    and the accelerator resolved first."""
    drivers: dict[str, Driver] = {}
    for mode in dict.fromkeys(c.mode for c in expansion.configurations):
        if mode == "guest":
            from iomatrix.drivers.guest import prepare_guests

            drivers[mode] = prepare_guests(suite.method, workdir, accel, progress.note)
        else:
            drivers[mode] = driver_for(mode, suite.method, workdir)
    return drivers


@contextmanager
def _scratch(keep: bool) -> Iterator[Path]:
    """Sockets, job files and daemon logs of this run."""
    # resolved: mount points are compared with /proc/self/mountinfo, which holds real paths
    path = Path(tempfile.mkdtemp(prefix="iomatrix-run-")).resolve()
    try:
        yield path
    finally:
        if not keep:
            shutil.rmtree(path, ignore_errors=True)


class _Runner:
    def __init__(self, suite: Suite, expansion: Expansion, store: Store, run_id: int,
                 progress: Progress) -> None:
        self.suite = suite
        self.method = suite.method
        self.expansion = expansion
        self.store = store
        self.run_id = run_id
        self.progress = progress
        self.ok = self.failed = 0
        self.measured = 0.0
        self.accelerator = "none"
        self.n = 0

    def run(self, workspace: Workspace, workdir: Path, drivers: dict[str, Driver]) -> None:
        self.progress.start(self.expansion.trials_per_sample * self.method.samples,
                            planned_seconds(self.suite, self.expansion))
        for config in self.expansion.configurations:
            driver = drivers[config.mode]
            self.accelerator = driver.accelerator
            trials = [(w, k) for w in self.expansion.workloads_for(config)
                      for k in range(self.method.samples)]
            try:
                images = workspace.images(config)
                with driver.session(config, images) as session:
                    fresh = [i.path for i in images if i.path not in workspace.preconditioned]
                    if self.method.precondition and fresh:
                        self.progress.note(f"preconditioning {', '.join(p.name for p in fresh)} "
                                           f"(writing fully once) through {config.label}")
                        self._precondition(session, workdir)
                        workspace.preconditioned.update(fresh)
                    while trials:
                        workload, k = trials[0]
                        self._trial(session, workdir, config, workload, k)
                        trials.pop(0)
            except (TrialFailed, ToolFailed) as exc:
                # The configuration could not be brought up: its remaining trials fail alike.
                for workload, k in trials:
                    self._begin(config, workload, k)
                    self._failed(config, workload, k, str(exc), started=now())

    def _precondition(self, session: Session, workdir: Path) -> None:
        target = session.fio_target()
        size = session.image.size if "size" not in target else None
        job = fill_text(target=target, size=size)
        run_fio(job, workdir=workdir, timeout=max(600.0, session.image.size / 5e6),
                extra_args=session.fio_args())

    def _trial(self, session: Session, workdir: Path, config: Configuration, workload: Workload,
               k: int) -> None:
        self._begin(config, workload, k)
        session.new_trial()
        started = now()
        job = job_text(workload, target=session.fio_target(), ramp=self.method.ramp,
                       runtime=self.method.runtime)
        try:
            fio = run_fio(job, workdir=workdir,
                          timeout=self.method.ramp + self.method.runtime + FIO_GRACE,
                          extra_args=session.fio_args(), during=session.observe,
                          during_at=self.method.ramp + self.method.runtime / 2,
                          output_format=session.fio_output_format())
        except IomatrixError as exc:
            self._failed(config, workload, k, str(exc), started=started,
                         applied=session.applied(), command=session.command())
            return
        wrong = session.mismatches()
        job_stats = fio.result.aggregate or fio.result.jobs[0]
        samples = samples_of(fio.result)
        vm_samples = vm_samples_of(fio.result, session.client_ports())
        status = "failed" if wrong else "ok"
        reason = ("QEMU did not apply the configuration as asked: " + "; ".join(wrong)) if wrong else None
        self.store.record_trial(
            self.run_id, config.key, workload.key, k, status=status, reason=reason,
            started_at=started, samples=samples, vm_samples=vm_samples,
            wall_seconds=fio.wall_seconds,
            fio_version=fio.result.fio_version, usr_cpu=job_stats.usr_cpu,
            sys_cpu=job_stats.sys_cpu, ctx=job_stats.ctx, fio_json=fio.raw_json,
            accelerator=self.accelerator, applied=session.applied(), command=session.command())
        if wrong:
            self.failed += 1
            self.progress.trial_finished(self.n, False, reason or "")
            return
        self.ok += 1
        self.measured += max(s.runtime_ms for s in samples) / 1000 if samples else 0.0
        iops = sum(s.iops for s in samples)
        emulated = " (emulated: TCG, measures the emulator)" if self.accelerator == "tcg" else ""
        self.progress.trial_finished(self.n, True, f"{iops:,.0f} IOPS{emulated}")

    def _begin(self, config: Configuration, workload: Workload, k: int) -> None:
        self.n += 1
        self.progress.trial_started(self.n, config, workload, k)

    def _failed(self, config: Configuration, workload: Workload, k: int, reason: str, *,
                started: str, applied: dict[str, str] | None = None, command: str = "") -> None:
        self.store.record_trial(self.run_id, config.key, workload.key, k, status="failed",
                                reason=reason, started_at=started, applied=applied,
                                command=command, accelerator=self.accelerator)
        self.failed += 1
        self.progress.trial_finished(self.n, False, reason)
