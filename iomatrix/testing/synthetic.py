"""Synthetic runs: made-up results written to a real store, for the tests and benchmarks of the
analysis and the report (hand-computed datasets, or 10,000 points at once). Nothing here is ever
measured: every synthetic run is named "synthetic" and carries a note saying so."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple

from iomatrix.fio.persecond import FIO_LOG, from_gaps
from iomatrix.fio.samples import DirectionSample
from iomatrix.store import Store
from iomatrix.store.records import StoredRun, StoredSuite, TrialResult
from iomatrix.suite.load import toml_table
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.workloads import Workload
from iomatrix.telemetry.probe import CpuRecord
from iomatrix.vocab.words import RunStatus, TrialStatus

NOTE = "SYNTHETIC: these figures were generated for a test or benchmark, not measured"


class Figures(NamedTuple):
    """One sample of one point: IOPS, bandwidth (bytes/s), mean and p99 latency (ns), and
    optionally the host CPU per I/O (µs), stored as the trial's CPU record (one role), and the
    longest span it went without a completion (s), stored as its stall check (a stall from
    ``persecond.STALL_S``; None: not judged)."""

    iops: float
    bw_bytes: float
    lat_mean_ns: float
    p99_ns: float
    cpu_us_per_io: float | None = None
    stall_s: float | None = None


Generator = Callable[[Configuration, Workload, int], Figures | None]
"""(configuration, workload, sample index) → its figures, or None for a failed trial."""


def configurations(mode: str, axes: Mapping[str, Iterable[object]]) -> list[Configuration]:
    """Every combination of ``axes`` (axis → values, as Configuration fields) in ``mode``."""
    names = list(axes)
    return [Configuration(mode=mode, **dict(zip(names, combo)))  # type: ignore[arg-type]
            for combo in itertools.product(*(list(axes[n]) for n in names))]


def write_run(store: Store, configs: list[Configuration], workloads: list[Workload],
              figures: Generator, *, samples: int = 3, accelerator: str = "none",
              host: Mapping[str, str] | None = None, name: str = "synthetic",
              method: Mapping[str, str | int] | None = None,
              target: Mapping[str, object] | None = None) -> int:
    """A finished run in ``store`` whose trials carry ``figures``; returns its id. Each trial's
    one direction is the workload's (read for reads and mixed workloads, write for writes).
    ``method`` goes into the stored suite text's [method] table (e.g. platform = "proxmox"),
    ``target`` into its [target] table (the suite then loads: recommend names its storage)."""
    text = toml_table("suite", {"name": name}) + (toml_table("method", method) if method else "")
    text += toml_table("target", target) if target else ""
    run_id = store.create_run(
        suite=StoredSuite(name=name, source="synthetic", text=text),
        host=dict(host or {"hostname": "synthetic", "target": "synthetic", "target_fs": "none"}),
        accelerator=accelerator, notes=[NOTE], configs=configs, workloads=workloads, seed=0)
    for index in range(samples):
        for config in configs:
            for workload in workloads:
                f = figures(config, workload, index)
                if f is None:
                    store.record_trial(run_id, TrialResult(
                        config_key=config.key, workload_key=workload.key, sample_index=index,
                        status=TrialStatus.FAILED, started_at="2026-01-01T00:00:00",
                        reason="synthetic failure", accelerator=accelerator))
                    continue
                direction = "write" if "write" in workload.rw and "rw" not in workload.rw else "read"
                sample = DirectionSample(
                    direction=direction, iops=f.iops, bw_bytes=f.bw_bytes,
                    io_bytes=int(f.bw_bytes * 10), total_ios=max(1, int(f.iops * 10)),
                    runtime_ms=10_000, lat_mean_ns=f.lat_mean_ns, p50_ns=f.lat_mean_ns,
                    p99_ns=f.p99_ns)
                store.record_trial(run_id, TrialResult(
                    config_key=config.key, workload_key=workload.key, sample_index=index,
                    status=TrialStatus.OK, started_at="2026-01-01T00:00:00", samples=(sample,),
                    wall_seconds=10.0, accelerator=accelerator, cpu=_cpu(f, sample),
                    stall=None if f.stall_s is None else from_gaps([f.stall_s], FIO_LOG)))
    store.finish_run(run_id, RunStatus.COMPLETE)
    return run_id


def _cpu(f: Figures, sample: DirectionSample) -> CpuRecord | None:
    """The CPU record of a synthetic trial that states its CPU per I/O (one role, "synthetic")."""
    if f.cpu_us_per_io is None:
        return None
    cpu_s = f.cpu_us_per_io * sample.total_ios / 1e6
    return CpuRecord(window_s=10.0, cpu_s_by_role={"synthetic": cpu_s}, exited_cpu_s=0.0,
                     cpu_s=cpu_s, voluntary_csw=0, involuntary_csw=0, ios=sample.total_ios,
                     bytes=sample.io_bytes, cpu_us_per_io=f.cpu_us_per_io,
                     cpu_ms_per_mib=None, csw_per_io=None, perf="synthetic")


def stored_run(db: str | os.PathLike[str], configs: list[Configuration],
               workloads: list[Workload], figures: Generator, **how: object) -> StoredRun:
    """A synthetic run (``write_run`` with ``how``: samples, accelerator, host, name, method,
    target)
    written into the store at ``db`` (made if need be), as ``load_run`` reads it back."""
    with Store(db) as store:
        return store.load_run(write_run(store, configs, workloads, figures,
                                        **how))  # type: ignore[arg-type]
