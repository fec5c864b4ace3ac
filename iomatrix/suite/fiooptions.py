"""The fio options a workload may set: an allow-list with the shape of each value, and why the
others are refused."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import Field


# -- fio options a workload may set ---------------------------------------------------------------
# fio runs as root, from a suite that may come from anyone, and its job file is text. So a
# workload's extra ``options`` pass an ALLOW-list: an option fio adds later, or one overlooked
# here, is refused until someone has checked that it is safe. The list was made from fio 3.33's
# ``fio --cmdhelp=all`` (every job option, with its type, range and valid values) and
# ``fio --enghelp=libaio`` / ``--enghelp=io_uring`` (the only engines whose options can apply:
# iomatrix alone chooses the engine); tests/attacks/test_hardening.py checks every name and choice here
# against the installed fio. An option is listed only if, whatever its value, it names no file,
# directory, device, cgroup or sysfs entry, runs no command and touches no file but the one
# iomatrix points the job at; where one spelling of a value could still name a file
# (``mem=mmap:FILE``), the value's shape excludes it. Values also pass ``_FIO_VALUE``: no line
# break (a new option or ``[section]``), no ``$`` (fio expands ``${VAR}`` and ``$ncpus``, and
# hands keyword expressions to bc), no quotes, backslashes, ``=``, ``;``, ``#`` or blanks.
_NUM = r"\d+(?:\.\d+)?[A-Za-z%]{0,4}"
"""One fio number: 70, 4k, 1.5m, 10ms, 2MiB, 50%."""
_NUMS = rf"{_NUM}(?:/(?:{_NUM})?|[-,:]{_NUM})*"
"""Numbers in fio's list and range syntax: 1k-4k,8k-16k (bsrange), 4k/50:64k/ (bssplit),
10m,5m (rate: reads, writes), 99:99.9 (latency_percentile). A number starts it and follows
every '-', ',' and ':' (only a bssplit share after '/' may be left empty): never a path."""
_BOOL = (r"[01]", "0 or 1 (or true/false)")
_UINT = (_NUM, "a number such as 70, 4k or 10ms")
_INT = (r"-?\d+", "a whole number")
_LIST = (_NUMS, "numbers in fio's list syntax, such as 4k/50:64k/50, 1k-4k or 10m,5m")


def _choice(*names: str, param: str | None = None) -> tuple[str, str]:
    """One of fio's named values, with ``:PARAM`` after it where ``param`` allows."""
    alt = "(?:" + "|".join(map(re.escape, names)) + ")"
    return (alt + (f"(?::{param})?" if param else ""),
            "one of " + ", ".join(names) + (" (a :number may follow)" if param else ""))


FIO_OPTION_SHAPES: dict[str, tuple[str, str]] = {
    # Block sizes, alignment and mixes beside [workloads] bs: numbers only.
    "ba": _LIST, "blockalign": _LIST, "bsrange": _LIST, "blocksize_range": _LIST,
    "bssplit": _LIST, "bs_unaligned": _BOOL, "blocksize_unaligned": _BOOL,
    # The random and sequential offset pattern: numbers and fio's fixed names.
    "randrepeat": _BOOL, "allrandrepeat": _BOOL, "randseed": _UINT, "norandommap": _BOOL,
    "random_generator": _choice("tausworthe", "lfsr", "tausworthe64"),
    "random_distribution": _choice("random", "zipf", "pareto", "normal", "zoned", "zoned_abs",
                                   param=_NUMS),
    "percentage_random": _LIST, "rw_sequencer": _choice("sequential", "identical"),
    "offset_align": _UINT, "number_ios": _UINT,
    # Mixed workloads (percent of reads/writes).
    "rwmixread": _UINT, "rwmixwrite": _UINT,
    # Queueing inside the job: how many I/Os are submitted and reaped at once.
    "iodepth_batch": _UINT, "iodepth_batch_submit": _UINT, "iodepth_batch_complete_min": _UINT,
    "iodepth_batch_complete": _UINT, "iodepth_batch_complete_max": _UINT, "iodepth_low": _UINT,
    "serialize_overlap": _BOOL, "io_submit_mode": _choice("inline", "offload"),
    # Flushes and syncs of the job's own file (the target): counts, on/off, fio's sync names.
    "fsync": _UINT, "fdatasync": _UINT, "write_barrier": _UINT, "end_fsync": _BOOL,
    "fsync_on_close": _BOOL, "sync": _choice("none", "0", "sync", "1", "dsync"),
    "sync_file_range": (r"(?:wait_before|write|wait_after)(?:,(?:wait_before|write|wait_after))*"
                        rf"(?::{_NUM})?",
                        "wait_before, write or wait_after, comma-joined, :N after"),
    "fadvise_hint": _choice("0", "1", "random", "sequential"), "invalidate": _BOOL,
    "write_hint": _choice("none", "short", "medium", "long", "extreme"), "overwrite": _BOOL,
    # Pacing: rates, think time, latency targets, delays, loops (numbers and durations).
    "rate": _LIST, "rate_min": _LIST, "ratemin": _LIST, "rate_iops_min": _LIST,
    "rate_process": _choice("linear", "poisson"), "rate_cycle": _UINT, "ratecycle": _UINT,
    "rate_ignore_thinktime": _BOOL, "thinktime": _UINT, "thinktime_spin": _UINT,
    "thinktime_blocks": _UINT, "thinktime_blocks_type": _choice("complete", "issue"),
    "thinktime_iotime": _UINT, "max_latency": _UINT, "latency_target": _UINT,
    "latency_window": _UINT, "latency_percentile": _LIST, "latency_run": _BOOL,
    "startdelay": _LIST, "loops": _UINT,
    # Jobs as threads of one fio process rather than processes (seed 002's job files).
    "thread": _BOOL,
    # fio's token-based flow control between the jobs of one fio (weights and ids: numbers).
    "flow": _UINT, "flow_id": _UINT, "flow_sleep": _UINT,
    # The NUMA nodes whose CPUs the job runs on (node numbers, as libnuma parses them).
    "numa_cpu_nodes": (r"\d{1,4}(?:[-,]\d{1,4}){0,63}", "NUMA node numbers: 0, 0-1 or 0,2"),
    # Zones of the target walked in strides (zbd, which resets a zoned device's zones, is not).
    "zonemode": ("none|strided", "none or strided; not zbd, which resets a zoned device's zones"),
    "zonesize": _UINT, "zonerange": _UINT,
    "zoneskip": _UINT,
    # CPU and I/O priority of the job (numbers; no cpu sets, which differ per host and guest).
    "nice": _INT, "prio": _UINT, "prioclass": _UINT,
    # What the data buffers hold and where they live in memory; mem/iomem only without a
    # ``:FILE`` (mmap:FILE and mmaphuge:FILE create or truncate FILE).
    "mem": _choice("malloc", "shm", "shmhuge", "mmap", "mmapshared", "mmaphuge"),
    "iomem": _choice("malloc", "shm", "shmhuge", "mmap", "mmapshared", "mmaphuge"),
    "zero_buffers": _BOOL, "refill_buffers": _BOOL, "scramble_buffers": _BOOL,
    "buffer_pattern": (r"0x[0-9A-Fa-f]+|\d+", "a number, or 0x and hex digits"),
    "buffer_compress_percentage": _UINT,
    "buffer_compress_chunk": _UINT, "dedupe_percentage": _UINT,
    "dedupe_mode": _choice("repeat", "working_set"), "dedupe_working_set_percentage": _UINT,
    "dedupe_global": _BOOL,
    # What fio reports beside what iomatrix asks for (numbers and on/off; no logs).
    "clat_percentiles": _BOOL, "slat_percentiles": _BOOL, "significant_figures": _UINT,
    "bwavgtime": _UINT, "iopsavgtime": _UINT, "disk_util": _BOOL,
    "clocksource": _choice("gettimeofday", "clock_gettime", "cpu"),
    # fio's latency, bandwidth and IOPS logs: "1" only (the workload asked for it); iomatrix
    # names the file, in the trial's own directory (iomatrix.fio.logs), never a path given here.
    **{key: (r"1", "1: iomatrix writes the log into the trial's own directory")
       for key in ("write_lat_log", "write_bw_log", "write_iops_log")},
    # What those logs record beside each entry: on/off.
    "log_offset": _BOOL, "log_max_value": _BOOL, "log_prio": _BOOL,
    # fio's own steady-state detection (README: "fio's own ss options can be passed").
    "steadystate": _choice("iops", "iops_slope", "bw", "bw_slope", param=_NUM),
    "ss": _choice("iops", "iops_slope", "bw", "bw_slope", param=_NUM),
    "steadystate_duration": _UINT, "ss_dur": _UINT,
    "steadystate_ramp_time": _UINT, "ss_ramp": _UINT,
    # libaio and io_uring engine options (fio --enghelp): polling, registered buffers and files,
    # submission threads, per-command priority. Numbers and on/off; none names a path.
    "userspace_reap": _BOOL, "nowait": _BOOL, "hipri": _BOOL, "fixedbufs": _BOOL,
    "registerfiles": _BOOL, "sqthread_poll": _BOOL, "sqthread_poll_cpu": _UINT,
    "nonvectored": _INT, "force_async": _UINT, "cmdprio_percentage": _LIST,
    "cmdprio_class": _LIST, "cmdprio": _LIST,
}
"""fio option → the shape its value must have: (regular expression matched whole, in words)."""
WORKLOAD_FIO_OPTIONS = frozenset(FIO_OPTION_SHAPES)
LOG_OPTIONS = frozenset({"write_lat_log", "write_bw_log", "write_iops_log"})
"""The log options above: the job fio runs names each log itself (``iomatrix.fio.logs``)."""
ENGINE_FIO_OPTIONS = frozenset({
    "userspace_reap", "nowait", "hipri", "fixedbufs", "registerfiles", "sqthread_poll",
    "sqthread_poll_cpu", "nonvectored", "force_async", "cmdprio_percentage", "cmdprio_class",
    "cmdprio"})
"""The options above that belong to fio's libaio and io_uring engines (``fio --enghelp=ENGINE``):
fio knows each only in a job of an engine that has it."""
_NUMBERS = (_BOOL, _UINT, _INT, _LIST)
"""Shapes of values fio reads as numbers: one that starts with a letter or '/' is none to fio."""
_SHAPES = {name: re.compile(shape) for name, (shape, _) in FIO_OPTION_SHAPES.items()}

# Why the options fio knows but a workload may not set are refused, for the one-line message.
SET_BY_IOMATRIX: dict[str, str] = {
    "rw": "[workloads] rw", "readwrite": "[workloads] rw", "bs": "[workloads] bs",
    "blocksize": "[workloads] bs", "iodepth": "[workloads] iodepth",
    "numjobs": "[workloads] numjobs", "rate_iops": "[workloads] rate_iops",
    "ioengine": "[method] engine", "runtime": "[method] runtime", "timeout": "[method] runtime",
    "time_based": "[method] runtime", "ramp_time": "[method] ramp",
    "filename": "[target]", "directory": "[target]", "size": "[target] size", "uri": "[target]",
    "direct": "nothing: iomatrix always measures direct I/O",
    "buffered": "nothing: iomatrix always measures direct I/O",
    "name": "nothing: iomatrix names its jobs", "group_reporting": "nothing: iomatrix sets it",
    "lat_percentiles": "nothing: iomatrix sets it", "percentile_list": "nothing: iomatrix sets it",
}
_REFUSED_BECAUSE: tuple[tuple[tuple[str, ...], str], ...] = (
    (("exec_", "trigger"), "it runs a command"),
    (("cgroup", "uid", "gid"), "it moves fio into another cgroup or user"),
    (("ioscheduler",), "it writes to the device's sysfs queue/scheduler"),
    (("write_", "read_iolog", "replay_", "merge_blktrace", "log_", "per_job_logs",
      "verify_state", "filename_format", "opendir", "unique_filename", "nrfiles",
      "nr_files", "openfiles", "file_service_type", "profile"),
     "it names, creates or reads files other than the target"),
    (("fill_device", "fill_fs", "file_append", "offset", "fileoffset", "filesize", "io_size",
      "io_limit", "fallocate", "create_", "unlink"),
     "it reaches beyond the image iomatrix created, or creates, grows or deletes files"),
    (("allow_mounted_write", "allow_file_create"), "it turns off one of fio's own safety checks"),
)
SAFETY = "a safety refusal"
"""A refusal because the option (or value) could reach beyond the target as root: a file, a
command, another cgroup, the host's environment."""
SCOPE = "outside what iomatrix measures"
"""A refusal because iomatrix does not measure what the option asks for (another engine, buffered
I/O, a value iomatrix sets itself), or fio would not read it as it is written."""
FIO_KEY = re.compile(r"[a-z][a-z0-9_]*")
FIO_VAR = r"[A-Za-z_][A-Za-z0-9_]{0,63}"
"""A name a job file's ``${NAME}`` may take from the suite's [fio_vars] table."""
FioVarName = Annotated[str, Field(pattern=rf"^{FIO_VAR}$")]
FioVarValue = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.%,:/-]{1,200}$")]
"""A [fio_vars] value: what an option value may hold (``_FIO_VALUE``): no blank, line break,
'$', '=', ';', '#', quote or backslash, so that it cannot end a line, start another or expand."""
_FIO_VALUE = re.compile(r"[A-Za-z0-9_.%,:/-]{1,200}")


def fio_option_text(value: object) -> str:
    """A TOML option value as fio reads it: booleans as 1/0 (fio refuses on/off), numbers as
    written. Raises ValueError for anything else (tables, arrays, dates)."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"{value!r} is not a number fio reads")
        return repr(value)
    if isinstance(value, str):
        return value
    raise ValueError(f"a {type(value).__name__} is not an option value (write a string, number "
                     "or true/false)")


def refusal_kind(key: str, value: str) -> str:
    """Whether ``fio_option_problem``'s refusal of ``key=value`` is ``SAFETY`` or ``SCOPE``:
    an option iomatrix sets itself, or a number fio would not read, is out of scope; one that
    names files, runs commands or is not known to touch nothing but the target is refused for
    safety, as is a value of another shape than the one that excludes paths."""
    if isinstance(key, str) and key in SET_BY_IOMATRIX:
        return SCOPE
    if isinstance(key, str) and key in _SHAPES and isinstance(value, str) \
            and _FIO_VALUE.fullmatch(value) and FIO_OPTION_SHAPES[key] in _NUMBERS \
            and (value[0].isalpha() or value[0] == "/"):
        return SCOPE
    return SAFETY


def fio_option_problem(key: str, value: str) -> str | None:
    """Why a workload may not pass ``key=value`` to fio (one line naming the option), or None."""
    if not isinstance(key, str) or not FIO_KEY.fullmatch(key):
        return f"{key!r} is not a fio option name (lower-case letters, digits and _)"
    if key not in _SHAPES:
        if key in SET_BY_IOMATRIX:
            return f"fio option {key!r} is set by iomatrix; use {SET_BY_IOMATRIX[key]}"
        for prefixes, why in _REFUSED_BECAUSE:
            if key.startswith(prefixes):
                return f"fio option {key!r} is refused: {why} (fio runs as root)"
        return (f"fio option {key!r} is not one iomatrix lets a workload set (fio runs as root, so "
                "only options known to touch nothing but the target pass; see "
                "WORKLOAD_FIO_OPTIONS in iomatrix/suite/fiooptions.py)")
    if not isinstance(value, str) or not _FIO_VALUE.fullmatch(value):
        return (f"fio option {key!r}: value {value!r} may hold only letters, digits and "
                "_ . % , : / - (no line break, '$', '=', brackets, quotes or blanks), 1 to 200 of them")
    if not _SHAPES[key].fullmatch(value):
        if key in ("mem", "iomem") and ":" in value:
            return (f"fio option {key!r} = {value!r}: a ':FILE' after the memory type makes fio "
                    "create or truncate that file; write the type alone (e.g. mmap, shmhuge)")
        shape, words = FIO_OPTION_SHAPES[key]
        if (shape, words) in _NUMBERS and (value[0].isalpha() or value[0] == "/"):
            # fio's number parsers (strtoll, its split lists) read no number from it: refused
            return (f"fio option {key!r}: value {value!r} does not have the form fio expects "
                    f"(expected {words})")
        return f"fio option {key!r}: value {value!r} is not one iomatrix passes on (expected {words})"
    return None

