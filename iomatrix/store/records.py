"""Stored results as the rest of iomatrix reads them: a run, its configurations, workloads and
trials, each trial with its per-direction samples. Produced by ``iomatrix.store``; read by
analysis, show, export and report."""

from __future__ import annotations

from typing import Any

from pydantic import computed_field

from iomatrix.fio.samples import DirectionSample
from iomatrix.core.model import Frozen


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
    steady: dict[str, Any] = {}
    """Whether and when the SNIA steady-state rule was met (empty for older runs)."""
    cpu: dict[str, Any] = {}
    """CPU cost of the trial: by role, per I/O and per MiB, context switches, perf counts."""
    samples: tuple[DirectionSample, ...]
    vm_samples: tuple[DirectionSample, ...] = ()
    """Per-guest samples when several guests ran the trial; ``samples`` is then their aggregate."""


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
