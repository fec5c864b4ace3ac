"""Stored results as the rest of iomatrix reads them: a run, its configurations, workloads and
trials, each trial with its per-direction samples. Produced by ``iomatrix.store``; read by
analysis, show, export and report. A trial to be stored is a ``TrialResult``."""

from __future__ import annotations

import tomllib
from functools import cached_property
from typing import Any

from pydantic import computed_field

from iomatrix.fio.samples import DirectionSample
from iomatrix.suite.model import method_of_vm
from iomatrix.core.model import Frozen
from iomatrix.telemetry.host import HostSeries
from iomatrix.telemetry.pagecache import DeviceShare
from iomatrix.telemetry.steady import SteadyState


class SteadyRecord(Frozen):
    """What a trial recorded about steady state: the SNIA PTS verdict and what it was judged
    from, or why it was not judged."""

    checked: bool
    source: str | None = None
    """What the rule was applied to: "fio status stream" or "QEMU device counters" (None for
    runs that did not record it)."""
    reason: str | None = None
    """Why steady state was not checked."""
    verdict: SteadyState | None = None

    @property
    def reached(self) -> bool:
        """Checked, and the rule was met."""
        return self.checked and self.verdict is not None and self.verdict.reached


class CpuRecord(Frozen):
    """What a trial cost the host's CPU (``iomatrix.telemetry.probe``): the serving processes
    by thread role plus the host fio, per I/O and per MiB, context switches, perf counts."""

    window_s: float
    cpu_s_by_role: dict[str, float]
    """CPU seconds per thread role, "fio (host)" included."""
    exited_cpu_s: float
    """CPU seconds of threads and processes that ended during the trial (role unknown)."""
    cpu_s: float
    voluntary_csw: int
    involuntary_csw: int
    ios: int
    bytes: int
    cpu_us_per_io: float | None
    cpu_ms_per_mib: float | None
    csw_per_io: float | None
    perf: dict[str, float | None] | str
    """perf's counts per event, or why perf did not count."""
    cycles_per_io: float | None = None


class TrialResult(Frozen):
    """One trial as measured, or failed with its reason: what ``Store.record_trial`` stores."""

    config_key: str
    workload_key: str
    sample_index: int
    status: str
    started_at: str
    reason: str | None = None
    samples: tuple[DirectionSample, ...] = ()
    vm_samples: tuple[DirectionSample, ...] = ()
    wall_seconds: float | None = None
    fio_version: str | None = None
    """The version of what measured the trial, as it names itself: fio's, or ioping's for an
    ioping workload that ioping ran ("ioping 1.3")."""
    usr_cpu: float | None = None
    sys_cpu: float | None = None
    ctx: int | None = None
    fio_json: str | None = None
    """fio's own output, as it wrote it (ioping's, for a trial ioping ran)."""
    accelerator: str = "none"
    applied: dict[str, str] = {}
    command: str = ""
    steady: SteadyRecord | None = None
    cpu: CpuRecord | None = None
    telemetry: HostSeries | None = None


class TrialRecord(Frozen):
    """One trial as stored: ok with samples, or failed with its reason."""

    id: int
    config_key: str
    workload_key: str
    sample_index: int
    status: str
    reason: str | None
    started_at: str
    wall_seconds: float | None
    accelerator: str
    usr_cpu: float | None
    sys_cpu: float | None
    ctx: int | None
    applied: dict[str, str]
    command: str
    steady: SteadyRecord | None = None
    """Whether and when the SNIA steady-state rule was met (None for failed trials and older
    runs)."""
    cpu: CpuRecord | None = None
    """CPU cost of the trial (None for failed trials, imported and older runs)."""
    tool: str | None = None
    """What measured it, as it names itself: "fio-3.33", or "ioping 1.3" for an ioping
    workload in host mode (stored in the trial's fio_version); None for a failed trial."""
    samples: tuple[DirectionSample, ...]
    vm_samples: tuple[DirectionSample, ...] = ()
    """Per-guest samples when several guests ran the trial; ``samples`` is then their aggregate."""
    device_share: DeviceShare | None = None
    """For an ok trial of a configuration that uses the host page cache: the share of fio's
    bytes that reached the target's device, derived from the stored host telemetry and samples
    when the run is loaded (``iomatrix.telemetry.pagecache``); None otherwise."""


class ConfigRecord(Frozen):
    key: str
    label: str
    mode: str
    params: dict[str, str]


class WorkloadRecord(Frozen):
    key: str
    label: str
    rw: str
    bs: int
    iodepth: int
    numjobs: int
    rate_iops: int
    options: dict[str, str]


class RunSummary(Frozen):
    id: int
    suite_name: str
    created_at: str
    finished_at: str | None
    status: str
    accelerator: str
    trials_ok: int
    trials_failed: int


class SuiteSettings(Frozen):
    """What a run's suite text says about the run, as written: its description and its [method]
    table (values as in the TOML, no defaults filled in; platform and pve_version as a suite
    made from a VM follows them, ``suite.model.method_of_vm``). Empty where the text is not
    TOML."""

    description: str = ""
    method: dict[str, Any] = {}
    target: dict[str, Any] = {}
    findings: tuple[dict[str, Any], ...] = ()
    """The [[finding]] tables, unvalidated."""


def suite_settings(text: str) -> SuiteSettings:
    """What a stored suite text says, as written; empty where the text is not TOML."""
    try:
        tables = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return SuiteSettings()

    def table(name: str) -> dict[str, Any]:
        value = tables.get(name, {})
        return dict(value) if isinstance(value, dict) else {}

    findings = tables.get("finding", [])
    return SuiteSettings(
        description=str(table("suite").get("description", "")),
        method=method_of_vm(table("method"), tables.get("matrix")),
        target=table("target"),
        findings=tuple(f for f in findings if isinstance(f, dict))
        if isinstance(findings, list) else ())


class StoredRun(Frozen):
    """A whole run as stored."""

    id: int
    suite_name: str
    suite_source: str
    suite_text: str
    created_at: str
    finished_at: str | None
    status: str
    accelerator: str
    iomatrix_version: str
    host: dict[str, str]
    notes: tuple[str, ...]
    seed: int | None = None
    configs: tuple[ConfigRecord, ...]
    workloads: tuple[WorkloadRecord, ...]
    trials: tuple[TrialRecord, ...]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def emulated(self) -> bool:
        """Whether any measured figure of the run came from guests under TCG."""
        return any(t.accelerator == "tcg" and t.samples for t in self.trials)

    @cached_property
    def suite_settings(self) -> SuiteSettings:
        """The suite text's settings, parsed once (a stored run is immutable)."""
        return suite_settings(self.suite_text)


class ProcessRecord(Frozen):
    """An iomatrix process that measured (or measures) runs: who it was, precisely enough that
    a later process with the same pid is not taken for it (``iomatrix.core.owner``)."""

    id: int
    pid: int
    host: str
    boot_id: str
    start_ticks: int
    uid: int
    lock_path: str
    """The file it holds an exclusive flock on while it lives."""
    started_at: str
    ended_at: str | None = None
    lock_dev: int | None = None
    lock_ino: int | None = None
    """The lock file's device and inode, recorded once it was made (None before, or by an
    iomatrix older than schema 6): a file in its place with another inode is not its lock."""


class ResourceRecord(Frozen):
    """Something a process created on disk, recorded before it was created: a scratch
    directory under $TMPDIR, an image directory in the target, or a target directory (and its
    parents) that did not exist."""

    id: int
    kind: str
    """scratch | workspace | parent"""
    path: str
    within: str
    """The directory it was created in (resolved): it is removed only while still there."""
    keep: bool
    """Created by a run with --keep: never removed by iomatrix."""
    created_at: str
    run_id: int | None
    run_status: str | None
    process: ProcessRecord


class RetiredTrial(Frozen):
    """A failed trial that ``--retry-failed`` measured again, kept whole."""

    retired_at: str
    trial: TrialRecord
