"""The report's view model: everything a page draws, JSON-ready, built from a stored run.
Drawing code (``iomatrix.report.html``) reads only this."""

from __future__ import annotations

import tomllib
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from iomatrix.results import StoredRun


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ConfigView(_Frozen):
    """One configuration of the run."""

    key: str
    """Stable identifier, e.g. "blocklayer/aio=native/cache=none/format=raw/prealloc=off"."""
    label: str
    """Short human label, e.g. "native · none · raw"."""
    mode: str
    """host | blocklayer | guest"""
    params: dict[str, str]
    """Axis name → value as the suite wrote it (controller, aio, iothread, cache, format, ...)."""
    applied: dict[str, str] = {}
    """What QEMU really applied, as verified (e.g. "file.cache.direct": "true", "aio": "native")."""
    accelerator: str = "none"
    """"tcg" when this configuration's guests were emulated: its label then says so too."""


class PointView(_Frozen):
    """All ok samples of one (configuration, workload), reduced to means; ns and bytes/s."""

    config_key: str
    workload_key: str
    rw: str
    bs: int
    iodepth: int
    numjobs: int
    rate_iops: int | None = None
    samples: int
    failed: int = 0
    read_iops: float | None = None
    write_iops: float | None = None
    iops: float
    """Read + write IOPS."""
    bw_bytes: float
    lat_mean_ns: float | None = None
    lat_p50_ns: float | None = None
    lat_p99_ns: float | None = None
    usr_cpu: float | None = None
    sys_cpu: float | None = None


class FailureView(_Frozen):
    config_key: str
    workload_key: str
    sample_index: int
    reason: str


class ReportData(_Frozen):
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
    notes: tuple[str, ...] = ()
    """Skipped invalid combinations, ignored axes, and other things the reader must know."""
    configs: tuple[ConfigView, ...]
    points: tuple[PointView, ...]
    failures: tuple[FailureView, ...] = ()
    iomatrix_version: str


def build_report_data(run: "StoredRun") -> ReportData:
    """The view model of a stored run."""
    from iomatrix import __version__
    from iomatrix.analysis.points import points

    workloads = {w.key: w for w in run.workloads}
    applied: dict[str, dict[str, str]] = {}
    accel: dict[str, str] = {}
    for trial in run.trials:
        if trial.applied and trial.config_key not in applied:
            applied[trial.config_key] = trial.applied
        if trial.accelerator != "none":
            accel[trial.config_key] = trial.accelerator
    configs = tuple(ConfigView(key=c.key, mode=c.mode, params=c.params,
                               label=c.label + (" [emulated: TCG]" if accel.get(c.key) == "tcg" else ""),
                               applied=applied.get(c.key, {}), accelerator=accel.get(c.key, "none"))
                    for c in run.configs)
    views = []
    for p in points(run):
        w = workloads[p.workload_key]
        views.append(PointView(
            config_key=p.config_key, workload_key=p.workload_key, rw=w.rw, bs=w.bs,
            iodepth=w.iodepth, numjobs=w.numjobs, rate_iops=w.rate_iops or None,
            samples=p.samples, failed=p.failed, read_iops=p.read_iops, write_iops=p.write_iops,
            iops=p.iops or 0.0, bw_bytes=p.bw_bytes or 0.0, lat_mean_ns=p.lat_mean_ns,
            lat_p50_ns=p.lat_p50_ns, lat_p99_ns=p.lat_p99_ns, usr_cpu=p.usr_cpu,
            sys_cpu=p.sys_cpu))
    failures = tuple(FailureView(config_key=t.config_key, workload_key=t.workload_key,
                                 sample_index=t.sample_index, reason=t.reason or "")
                     for t in run.trials if t.status == "failed")
    try:
        description = str(tomllib.loads(run.suite_text).get("suite", {}).get("description", ""))
    except tomllib.TOMLDecodeError:
        description = ""
    return ReportData(
        run_id=run.id, suite_name=run.suite_name, suite_description=description,
        created_at=run.created_at,
        finished_at=run.finished_at, status=run.status, accelerator=run.accelerator,
        emulated=run.emulated, host=run.host, notes=run.notes, configs=configs,
        points=tuple(v for v in views if v.samples > 0), failures=failures,
        iomatrix_version=__version__)
