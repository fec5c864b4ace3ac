"""Workload → fio job file text (pure)."""

from __future__ import annotations

from collections.abc import Mapping

from iomatrix.suite.model import Workload
from iomatrix.core.units import fio_duration

PERCENTILES = "50:90:99:99.9:99.99"


def job_text(workload: Workload, *, target: Mapping[str, str], ramp: float, runtime: float,
             name: str = "iomatrix") -> str:
    """A job file measuring ``workload`` for ``runtime`` seconds after ``ramp``, on ``target``
    (fio options naming the engine and the file, device or URI)."""
    lines = ["[global]"]
    lines += [f"{k}={v}" for k, v in target.items()]
    lines += [
        "time_based=1",
        f"ramp_time={fio_duration(ramp)}" if ramp > 0 else "ramp_time=0",
        f"runtime={fio_duration(runtime)}",
        "group_reporting=1",
        "lat_percentiles=1",
        f"percentile_list={PERCENTILES}",
        "randrepeat=0",
        f"[{name}]",
        f"rw={workload.rw}",
        f"bs={workload.bs}",
        f"iodepth={workload.iodepth}",
        f"numjobs={workload.numjobs}",
    ]
    if workload.rate_iops:
        lines.append(f"rate_iops={workload.rate_iops}")
    lines += [f"{k}={v}" for k, v in workload.options]
    return "\n".join(lines) + "\n"


def fill_text(*, target: Mapping[str, str], size: int | None, name: str = "precondition") -> str:
    """A job file that writes the whole target once, sequentially, with incompressible data."""
    lines = ["[global]"]
    lines += [f"{k}={v}" for k, v in target.items()]
    if size is not None:
        lines.append(f"size={size}")
    lines += [f"[{name}]", "rw=write", "bs=1m", "iodepth=16", "numjobs=1",
              "refill_buffers=1", "end_fsync=1"]
    return "\n".join(lines) + "\n"
