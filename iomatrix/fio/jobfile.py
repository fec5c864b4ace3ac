"""Workload → fio job file text (pure).

fio reads a job file line by line, as ``key=value`` under ``[section]`` headers, expands ``$``
(``${VAR}``, ``$ncpus``) and splits ``filename`` at ``:``. Every line written here is checked
so that no value can start a line, a section or a variable: the workload's options against the
suite's allow-list again (they were checked when the suite was loaded; this is the last gate
before fio runs as root), the target's values (paths iomatrix made under [target], or a
``--target`` given on the command line) for line breaks, ``$`` and backslashes, with ``:`` in a
file name escaped as fio wants (``\\:``)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from iomatrix.core.errors import SuiteError, TargetError
from iomatrix.core.units import fio_duration
from iomatrix.fio.logs import job_lines as log_lines
from iomatrix.suite.fiooptions import LOG_OPTIONS, fio_option_problem
from iomatrix.suite.workloads import IOPING_WORKING_SET, Workload

PERCENTILES = "50:90:99:99.9:99.99"
IOPING_CAP = 30.0
"""Seconds an ioping-equivalent job may overrun its requests and intervals before fio stops
itself (before the runner's own timeout, which allows a minute)."""

_KEY = re.compile(r"[a-z][a-z0-9_]*")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_UNSAFE = re.compile(r"[\x00-\x1f\x7f$\\]")
WINDOWS_DRIVE = re.compile(r"\\\\\.\\PhysicalDrive[0-9]{1,3}")
"""A Windows guest's disk as fio there names it (``\\\\.\\PhysicalDrive1``): the one value
with backslashes a target may have; fio treats a backslash as an escape only before ``:``."""
FILE_OPTIONS = ("filename",)
"""Target options whose value fio splits into files at ``:`` (escaped here)."""


def job_text(workload: Workload, *, target: Mapping[str, str], ramp: float, runtime: float,
             name: str = "iomatrix", logs: Path | None = None) -> str:
    """A job file measuring ``workload`` for ``runtime`` seconds after ``ramp``, on ``target``
    (fio options naming the engine and the file, device or URI); the logs the workload asks
    for written into ``logs`` (the trial's own directory; None: left out, ``iomatrix.fio.logs``)."""
    lines = ["[global]"]
    lines += _target_lines(target)
    lines += [
        "time_based=1",
        f"ramp_time={fio_duration(ramp)}" if ramp > 0 else "ramp_time=0",
        f"runtime={fio_duration(runtime)}",
        "group_reporting=1",
        "lat_percentiles=1",
        f"percentile_list={PERCENTILES}",
        "randrepeat=0",
        _section(name),
        f"rw={_plain(workload.rw)}",
        f"bs={int(workload.bs)}",
        f"iodepth={int(workload.iodepth)}",
        f"numjobs={int(workload.numjobs)}",
    ]
    if workload.rate_iops:
        lines.append(f"rate_iops={int(workload.rate_iops)}")
    lines += _option_lines((k, v) for k, v in workload.options if k not in LOG_OPTIONS)
    if logs is not None and _UNSAFE.search(str(logs)):
        raise TargetError(f"{logs}: the trial's directory may not hold control characters, '$' "
                          "or '\\'")
    lines += log_lines(workload.options, logs)
    return "\n".join(lines) + "\n"


def ioping_job_text(workload: Workload, *, target: Mapping[str, str],
                    name: str = "iomatrix") -> str:
    """fio's equivalent of an ioping workload on ``target``: ``count`` reads of ``bs`` at random
    offsets (drawn with replacement) in the first 1 MiB, direct, one at a time through pread(2)
    (psync; nbd where fio reaches the disk over NBD), a think time of one interval after each,
    every one counted (no ramp, not time based). ``iomatrix.fio.ioping`` says why."""
    spec = workload.ioping
    if spec is None:
        raise SuiteError(f"workload {workload.key} is not an ioping workload")
    reach = {**target, "size": str(IOPING_WORKING_SET)}
    if reach.get("ioengine") != "nbd":
        reach["ioengine"] = "psync"
    lines = ["[global]", *_target_lines(reach),
             f"runtime={fio_duration(spec.seconds + IOPING_CAP)}",   # a bound: not time_based
             "group_reporting=1", "lat_percentiles=1", f"percentile_list={PERCENTILES}",
             "randrepeat=0", "norandommap=1",
             _section(name), "rw=randread", f"bs={int(workload.bs)}", "iodepth=1", "numjobs=1",
             f"thinktime={int(round(spec.interval * 1e6))}", f"number_ios={int(spec.count)}"]
    return "\n".join(lines) + "\n"


def fill_text(*, target: Mapping[str, str], size: int | None, name: str = "precondition") -> str:
    """A job file that writes the whole target once, sequentially, with incompressible data."""
    lines = ["[global]"]
    lines += _target_lines(target)
    if size is not None:
        lines.append(f"size={int(size)}")
    lines += [_section(name), "rw=write", "bs=1m", "iodepth=16", "numjobs=1",
              "refill_buffers=1", "end_fsync=1"]
    return "\n".join(lines) + "\n"


def _section(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise SuiteError(f"fio job name {name!r}: letters, digits, '.', '_' and '-' only")
    return f"[{name}]"


def _plain(word: str) -> str:
    if not _KEY.fullmatch(word):
        raise SuiteError(f"fio rw={word!r}: not an I/O pattern")
    return word


def _target_lines(target: Mapping[str, str]) -> list[str]:
    lines = []
    for key, value in target.items():
        text = str(value)
        windows = key == "filename" and WINDOWS_DRIVE.fullmatch(text) is not None
        if not _KEY.fullmatch(key) or (_UNSAFE.search(text) and not windows) \
                or text != text.strip() or not text:
            raise TargetError(f"fio {key}={text!r}: the target's path may not hold control "
                              "characters, '$', '\\' or surrounding blanks (fio reads them as "
                              "a line break, a variable or an escape)")
        if key in FILE_OPTIONS:
            text = text.replace(":", "\\:")
        lines.append(f"{key}={text}")
    return lines


def _option_lines(options: Iterable[tuple[str, str]]) -> list[str]:
    lines = []
    for key, value in options:
        problem = fio_option_problem(key, value)
        if problem:
            raise SuiteError(f"[workloads] options: {problem}")
        lines.append(f"{key}={value}")
    return lines
