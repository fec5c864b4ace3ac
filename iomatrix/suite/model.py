"""The suite as iomatrix understands it, after validation: frozen models, no loose dicts.
The pydantic schema here is also what ``load`` validates a TOML file against."""

from __future__ import annotations

import os
import re
from pathlib import Path
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Literal

from pydantic import (AfterValidator, BeforeValidator, Field, StrictBool, ValidationInfo,
                      field_validator, model_validator)

from iomatrix.cluster.ssh import parse_destination, text_problem
from iomatrix.core.errors import NodesError
from iomatrix.core.units import format_bytes, format_size, parse_duration, parse_size
from iomatrix.core.model import Frozen, shown
from iomatrix.core.trust import ANYONE, Author
from iomatrix.suite.network import NETWORK_KINDS, IscsiTarget, RbdTarget

Mode = Literal["host", "blocklayer", "guest"]
Controller = Literal["virtio-blk", "virtio-scsi", "virtio-scsi-single", "pvscsi", "lsi", "megasas",
                     "sata", "ide", "nvme"]
Aio = Literal["native", "io_uring", "threads"]
Cache = Literal["none", "directsync", "writethrough", "writeback", "unsafe"]
Format = Literal["raw", "qcow2"]
Preallocation = Literal["off", "metadata", "falloc", "full"]
DataPath = Literal["emulated", "vhost-user-blk"]
Accel = Literal["auto", "kvm", "tcg"]
Platform = Literal["qemu", "proxmox", "libvirt"]
"""Whose block graph and devices a guest gets for a configuration (iomatrix.platform)."""
PveVersion = Literal[8, 9]
WorkingSet = Literal["size", "exceed-ram", "in-ram"]
"""[target] working_set: how large the images are against the host's page cache (``Target``)."""
Rw = Literal["read", "write", "randread", "randwrite", "rw", "readwrite", "randrw"]

YOUR_VM = "(your VM)"
"""What the label of the configuration of the user's VM ends with (``Configuration.yours``)."""
CONFIG_AXES = ("controller", "data_path", "aio", "iothread", "cache", "format", "preallocation",
               "num_queues", "queue_size", "vms", "guest")
APPLIANCE = "appliance"
"""The ``guest`` axis's value for iomatrix's own appliance (beside a [guest] image's name)."""
CONTROLLERS: tuple[str, ...] = Controller.__args__  # type: ignore[attr-defined]
IOTHREAD_CONTROLLERS = ("virtio-blk", "virtio-scsi", "virtio-scsi-single")
DIRECT_CACHES = ("none", "directsync")


def uses_page_cache(mode: str, params: Mapping[str, str]) -> bool:
    """Whether a configuration's I/O goes through the host page cache: a QEMU mode (blocklayer,
    guest) whose cache mode is not a direct one (none, directsync): writethrough, writeback,
    unsafe, with any aio (native needs a direct cache). Host mode is fio with ``direct=1``; a
    configuration that names no cache mode (imported results) is not judged. ``params`` as
    ``Configuration.params()`` or a stored configuration's."""
    cache = params.get("cache")
    return mode != "host" and cache is not None and cache not in DIRECT_CACHES


# -- fio options a workload may set ---------------------------------------------------------------
# fio runs as root, from a suite that may come from anyone, and its job file is text. So a
# workload's extra ``options`` pass an ALLOW-list: an option fio adds later, or one overlooked
# here, is refused until someone has checked that it is safe. The list was made from fio 3.33's
# ``fio --cmdhelp=all`` (every job option, with its type, range and valid values) and
# ``fio --enghelp=libaio`` / ``--enghelp=io_uring`` (the only engines whose options can apply:
# iomatrix alone chooses the engine); tests/test_hardening.py checks every name and choice here
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
_FIO_KEY = re.compile(r"[a-z][a-z0-9_]*")
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


def fio_option_problem(key: str, value: str) -> str | None:
    """Why a workload may not pass ``key=value`` to fio (one line naming the option), or None."""
    if not isinstance(key, str) or not _FIO_KEY.fullmatch(key):
        return f"{key!r} is not a fio option name (lower-case letters, digits and _)"
    if key not in _SHAPES:
        if key in SET_BY_IOMATRIX:
            return f"fio option {key!r} is set by iomatrix; use {SET_BY_IOMATRIX[key]}"
        for prefixes, why in _REFUSED_BECAUSE:
            if key.startswith(prefixes):
                return f"fio option {key!r} is refused: {why} (fio runs as root)"
        return (f"fio option {key!r} is not one iomatrix lets a workload set (fio runs as root, so "
                "only options known to touch nothing but the target pass; see "
                "WORKLOAD_FIO_OPTIONS in iomatrix/suite/model.py)")
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


def _as_tuple(value: Any) -> Any:
    """An axis may be written as one value or a list of values."""
    if isinstance(value, (list, tuple)):
        return tuple(value)
    return (value,)


MAX_SIZE = 1 << 60
"""The largest size a suite may write (1 EiB): beyond it numbers overflow SQLite and fio."""
MAX_DURATION = 30 * 24 * 3600.0
"""The longest duration a suite may write (30 days)."""


def _size(value: Any) -> int:
    try:
        size = parse_size(value)
    except OverflowError:
        raise ValueError("not a size (too large)") from None
    if size > MAX_SIZE:
        raise ValueError("above the largest size iomatrix takes (1 EiB)")
    return size


def _duration(value: Any) -> float:
    seconds = parse_duration(value)
    if not seconds <= MAX_DURATION:    # also refuses inf and nan
        raise ValueError("above the longest duration iomatrix takes (30 days)")
    return seconds


def _fraction(value: Any) -> float:
    """ "2%" or 0.02 → 0.02."""
    try:
        if isinstance(value, str) and value.strip().endswith("%"):
            return float(value.strip()[:-1]) / 100
        if not isinstance(value, bool) and isinstance(value, (int, float, str)):
            return float(value)
    except (ValueError, OverflowError):     # OverflowError: an int beyond any double
        pass
    raise ValueError(f"not a percentage: {value!r} (write e.g. \"2%\")")


def _sector_multiple(value: int) -> int:
    if value < 512 or value % 512:
        raise ValueError(f"block size {value} is not a multiple of 512 (direct I/O needs that)")
    return value


MIN_GUEST_MEMORY_MIB = 320
"""Guest memory the appliance needs to boot: iomatrix.appliance.build.MIN_MEMORY_MIB, which this
layer cannot import (tests/test_hardening.py checks they agree)."""


def _guest_memory(value: Any) -> int:
    """ "512MiB" → bytes; a unit is required (a bare 512 would be 512 bytes), whole MiB, and at
    least what the guest appliance needs to boot."""
    if not isinstance(value, str) or not re.search(r"\d\s*[kKmMgGtTpP]", value):
        raise ValueError("write guest memory with a unit, e.g. memory = \"512MiB\" "
                         "(a bare number would be bytes)")
    size = _size(value)
    if size % (1 << 20):
        raise ValueError(f"guest memory must be a whole number of MiB ({format_bytes(size)})")
    if size < MIN_GUEST_MEMORY_MIB << 20:
        raise ValueError(f"guest memory {format_bytes(size)} is below the "
                         f"{MIN_GUEST_MEMORY_MIB} MiB the guest appliance needs to boot")
    return size


Size = Annotated[int, BeforeValidator(_size)]
GuestMemory = Annotated[int, BeforeValidator(_guest_memory)]
BlockSize = Annotated[int, BeforeValidator(_size), AfterValidator(_sector_multiple)]
Duration = Annotated[float, BeforeValidator(_duration)]
Fraction = Annotated[float, BeforeValidator(_fraction), Field(gt=0, lt=1)]


def _axis(item_type: Any) -> Any:
    return Annotated[tuple[item_type, ...], BeforeValidator(_as_tuple), Field(min_length=1)]


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""Control characters (a tab and a line break aside): terminal escapes have no place in a suite."""


def _printable(value: str) -> str:
    if _CONTROL.search(value):
        raise ValueError("may not hold control characters")
    return value


Printable = Annotated[str, AfterValidator(_printable)]
"""Text from the suite that iomatrix prints: no terminal control characters."""

_UNSAFE_PATH = re.compile(r"[\x00-\x1f\x7f$\\]")
"""What a target path may not hold: fio reads its job file line by line and expands ``$``
(``${VAR}``, ``$ncpus``); ``\\`` is its escape character (iomatrix escapes ``:`` as ``\\:``)."""


TargetFilesystem = Literal["ext4", "xfs", "btrfs"]
"""The filesystems a run can measure side by side on one directory ([target] filesystems)."""
TARGET_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
"""What a target may be called: it is part of configuration keys (``.../target=NAME``)."""
TARGET_AXIS = "target"
"""The configuration parameter naming the target of a run that measures several."""
NODE_AXIS = "node"
"""The configuration parameter naming the node that measured it, in a cluster run."""

SCALE_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
"""What a scale may be called (a [scale.NAME] table, ``iomatrix run --scale NAME``)."""
DEFAULT_SCALE = "default"
"""The name of a suite's own tables, without any [scale.NAME] applied (no ``--scale``)."""


class SuiteInfo(Frozen):
    name: str = Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    """The suite's name: letters, digits, ``.``, ``_`` and ``-`` (stored with every run;
    ``iomatrix runs --suite`` finds its runs by it)."""
    description: Printable = Field(default="", max_length=10_000)
    """What the suite measures, in a sentence or two (``iomatrix suites`` shows it)."""
    scale: str | None = Field(default=None, max_length=40, pattern=SCALE_NAME)
    """The scale these tables were resolved at: written by iomatrix into the suite text it
    stores for a run started with ``--scale`` (that text has no [scale.NAME] tables left)."""


def _target_path(value: Path | None, key: str) -> Path | None:
    """A [target] path as fio and qemu-img will get it: absolute (a relative ``nbd:x`` would
    read as a protocol to qemu-img), with nothing fio reads as syntax."""
    if value is None:
        return None
    text = str(value)
    if _UNSAFE_PATH.search(text):
        raise ValueError("a target path may not hold control characters, '$' or '\\' "
                         "(fio would read them as a line break, a variable or an escape)")
    if text != text.strip():
        raise ValueError("a target path may not begin or end with a blank")
    if key == "device" and not value.is_absolute():
        raise ValueError("write the device's full path, e.g. /dev/sdb")
    if value.is_absolute():
        return value
    try:
        return Path.cwd() / value
    except OSError as exc:
        raise ValueError(f"a relative path needs a current directory ({exc.strerror}); "
                         "write the full path") from None


STORAGE_ID = r"^[A-Za-z][A-Za-z0-9\-_.]*(?::[A-Za-z0-9\-_.]{1,100})?$"
"""A Proxmox VE storage id (pve-storage's ``pve-storage-id`` format); for an iSCSI storage,
with the LUN as Proxmox VE names its volumes (``ID:lunN``, checked by ``resolve_storage``)."""


class Target(Frozen):
    """Where the images live: a directory (files are created there), a whole block device, or
    network storage (``network``: a Ceph RBD pool, or an iSCSI LUN, a whole device), or a Proxmox VE storage named by its id
    (``storage``, resolved into one of those from storage.cfg before the run:
    ``iomatrix.targets.network.resolve_storage``)."""

    directory: Path | None = None
    """A directory on the storage to measure: the run makes a private directory there for its
    images and removes it at the end. It and every directory above it must be root's (or the
    user's) and writable by nobody else."""
    size: Size | None = None
    """The size of each image ("4GiB"); on a device, the region measured (default: all of it).
    Needed for a directory and a Ceph pool."""
    device: Path | None = None
    """A whole block device ("/dev/nvme1n1"), written to and destroyed: needs
    ``allow_destroy = true``, and is refused while it (or a partition of it) is mounted, is swap,
    has holders (LVM, MD, dm-crypt) or cannot be opened exclusively."""
    allow_destroy: bool = False
    """Says that the device or iSCSI LUN may be written to: what is on it is destroyed."""
    rbd: RbdTarget | None = None
    """A Ceph RBD pool (``[target] rbd = { pool = ..., conf = ... }``): iomatrix creates its own
    images there and removes them (``RbdTarget``)."""
    iscsi: IscsiTarget | None = None
    """[target.iscsi]: an iSCSI LUN, written to and destroyed like a device
    (``iomatrix.targets.iscsi``)."""
    storage: str | None = Field(default=None, max_length=100, pattern=STORAGE_ID)
    """A Proxmox VE storage id (``ID:lunN`` for a LUN of an iSCSI storage); ``iomatrix run
    --storage-cfg`` says where its definition is."""
    allow_tmpfs: bool = False
    """The directory is on tmpfs (RAM) on purpose: no warning that figures measure memory."""
    working_set: WorkingSet = "size"
    """For cache modes that use the host page cache (writethrough, writeback, unsafe): "size",
    images of ``size`` (a run notes when they fit in the page cache); "exceed-ram", images of
    twice the host's RAM (at least ``size``) so the page cache cannot hold them
    (``iomatrix.targets.workspace``); "in-ram", a working set that fits in RAM is what is meant
    to be measured (no note; recommend still says so)."""

    @field_validator("directory", "device")
    @classmethod
    def _path(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        return _target_path(value, info.field_name)

    filesystems: tuple[TargetFilesystem, ...] = ()
    """Several targets from one directory, one per filesystem named (each a target of that name,
    ``Suite.named_targets``): the directory itself for the filesystem it is on, a filesystem
    iomatrix makes on a loop device backed by a file in the run's directory for every other
    (``iomatrix.targets.targets``); one whose mkfs or kernel support is missing is skipped, with
    a note."""

    @field_validator("filesystems", mode="before")
    @classmethod
    def _listed(cls, value: Any) -> Any:
        return _as_tuple(value)

    @model_validator(mode="after")
    def _one_kind(self) -> "Target":
        given = [k for k in ("directory", "device", *NETWORK_KINDS, "storage")
                 if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give one of directory (with size), device (with allow_destroy = "
                             "true), " + ", ".join(NETWORK_KINDS) + " (a table, with size) or "
                             "storage (a Proxmox VE storage id)"
                             + (f", not {' and '.join(given)}" if given else ""))
        if (self.rbd is not None and self.size is None  # a LUN's size is its own
                and self.working_set != "exceed-ram"):
            raise ValueError(f"a {given[0]} target needs a size for the images iomatrix creates "
                             "there, e.g. size = \"4GiB\"")
        if self.filesystems and self.directory is None:
            raise ValueError("filesystems are made in a directory target (a device is measured "
                             "as it is): give directory, or drop filesystems")
        if len(set(self.filesystems)) != len(self.filesystems):
            raise ValueError("filesystems names a filesystem twice")
        if self.directory is not None and self.size is None and self.working_set != "exceed-ram":
            raise ValueError("a directory target needs a size, e.g. size = \"4GiB\" (or "
                             "working_set = \"exceed-ram\": twice the host's RAM)")
        if self.size is not None and self.size < 1024 * 1024:
            raise ValueError(f"size {self.size} is below the minimum of 1MiB")
        if self.device is not None and not self.allow_destroy:
            raise ValueError(f"device {self.device} is written to and destroyed; "
                             "say so with allow_destroy = true")
        if self.iscsi is not None and not self.allow_destroy:
            raise ValueError(f"iSCSI LUN {self.iscsi.url} is written to and destroyed; "
                             "say so with allow_destroy = true")
        return self

    @property
    def network(self) -> "RbdTarget | IscsiTarget | None":
        """The network storage table given (``NETWORK_KINDS``), or None."""
        return next((getattr(self, k) for k in NETWORK_KINDS if getattr(self, k) is not None),
                    None)

    @property
    def kind(self) -> str:
        """directory, device, storage, or the network kind (rbd, iscsi)."""
        return next(k for k in ("directory", "device", *NETWORK_KINDS, "storage")
                    if getattr(self, k) is not None)


def _vm_file(value: str | None) -> str | None:
    """A file a suite names beside itself ([matrix] from_vm, storage_cfg): relative, inside the
    suite's directory (where symlinks lead is checked when iomatrix reads it)."""
    if value is None:
        return None
    path = Path(value)
    if _CONTROL.search(value) or not value.strip():
        raise ValueError("write a file name beside the suite, e.g. \"100.conf\"")
    if path.is_absolute() or ".." in path.parts:
        raise ValueError("must be a path inside the suite's directory (no absolute path, no "
                         "'..'): copy the file beside the suite")
    return value


VmFile = Annotated[str | None, AfterValidator(_vm_file), Field(max_length=255)]


class Reference(Frozen):
    """The disk of the user's VM (``[matrix] from_vm`` and ``disk``) as plain settings: what
    iomatrix read from the file (``iomatrix.translate.vm``), written by iomatrix into the
    suite text a run stores (``[matrix.reference]``), so that ``--resume``, ``recommend``,
    ``show`` and the report need the file no more. The run measures it as its reference
    configuration, in the same rounds as the matrix."""

    platform: Literal["proxmox", "libvirt"]
    """Whose definition the VM's is: proxmox (``ID.conf``) or libvirt (domain XML)."""
    pve_version: PveVersion | None = None
    """Proxmox VE: the generation whose command line the VM gets (its machine version)."""
    disk: str = Field(max_length=32, pattern=r"^[a-z]+[0-9a-z]*$")
    """The disk's name in the definition: ``scsi0``, ``virtio0`` (Proxmox VE) or ``vda``
    (libvirt)."""
    written: Printable = ""
    """The disk as the file states it."""
    storage: Printable = ""
    """Where the volume lives on the VM's host (storage type, or file/block)."""
    controller: Controller | None = None
    """The disk's controller (bus)."""
    aio: Aio | None = None
    """None: a disk on librbd, which has no aio."""
    iothread: StrictBool = False
    """Whether the disk has an iothread."""
    cache: Cache
    """The disk's cache mode."""
    format: Format
    """The disk's image format."""
    num_queues: int = Field(default=0, ge=0, le=65535)
    """The disk's queues; 0: QEMU's default."""
    queue_size: int = Field(default=0, ge=0, le=65535)
    """The disk's virtqueue size; 0: QEMU's default."""
    notes: tuple[Printable, ...] = ()
    """What the file sets that iomatrix does not reproduce, or reads as a default."""

    def settings(self) -> str:
        """The disk's I/O settings in words: ``aio=threads, cache=writeback, …``."""
        values = {"controller": self.controller, "aio": self.aio,
                  "iothread": "on" if self.iothread else "off", "cache": self.cache,
                  "format": self.format, "num_queues": self.num_queues or None,
                  "queue_size": self.queue_size or None}
        return ", ".join(f"{k}={v}" for k, v in values.items() if v is not None)
class NamedTarget(Target):
    """One [[targets]] table: a target of its own name in a run that measures several (each
    configuration on each target, each target with its own bare-metal baseline). Keys it does
    not give come from [target] (which then holds only what the targets share: size,
    working_set, allow_tmpfs)."""

    name: str = Field(min_length=1, max_length=40, pattern=TARGET_NAME)
    """What the target is called: letters, digits, ``.``, ``_`` and ``-``; part of every
    configuration's key (``.../target=NAME``) and label (``... on NAME``)."""
    filesystem: TargetFilesystem | None = None
    """The directory's filesystem must be this one: the directory itself when it is on it,
    otherwise a filesystem iomatrix makes on a loop device backed by a file in the run's
    directory there; the run is refused when that cannot be done (mkfs or kernel support
    missing)."""

    @model_validator(mode="after")
    def _single(self) -> "NamedTarget":
        if self.filesystems:
            raise ValueError("filesystems is a [target] key; a [[targets]] table names one "
                             "filesystem (filesystem = \"xfs\")")
        if self.filesystem is not None and self.directory is None:
            raise ValueError("filesystem is made in a directory target: give directory")
        if self.directory is None and self.device is None:
            raise ValueError(f"a {self.kind} target is measured in a run of its own ([target]), "
                             "not as one of several [[targets]]")
        return self


class Matrix(Frozen):
    """The disk settings swept; defaults are Proxmox VE's for a new Linux VM."""

    controller: _axis(Controller) = ("virtio-scsi-single",)
    """The disk controller (bus) the guest sees: virtio-blk, virtio-scsi, virtio-scsi-single,
    pvscsi, lsi, megasas, sata, ide or nvme (guest mode)."""
    aio: _axis(Aio) = ("io_uring",)
    """How QEMU submits I/O to the host: native (Linux AIO; needs a direct cache, none or
    directsync), io_uring, or threads (a thread pool)."""
    iothread: _axis(StrictBool) = (True,)
    """A dedicated event-loop thread for the disk, off QEMU's main loop (guest mode; in
    blocklayer mode it picks a FUSE export with an iothread over an NBD export)."""
    cache: _axis(Cache) = ("none",)
    """QEMU's cache mode: none, directsync, writethrough, writeback or unsafe (writethrough,
    writeback and unsafe go through the host page cache)."""
    format: _axis(Format) = ("raw",)
    """The image format: raw or qcow2."""
    preallocation: _axis(Preallocation) = ("off",)
    """How much of each image is allocated when it is created: off, metadata (qcow2), falloc
    or full."""
    data_path: _axis(DataPath) = ("emulated",)
    """emulated: QEMU's device model serves the disk; vhost-user-blk: qemu-storage-daemon does."""
    num_queues: _axis(Annotated[int, Field(ge=0, le=65535)]) = (0,)
    """Virtqueues (virtio-blk, virtio-scsi, vhost-user-blk) or I/O queue pairs (nvme); 0 = QEMU's default."""
    queue_size: _axis(Annotated[int, Field(ge=0, le=65535)]) = (0,)
    """Entries per virtqueue; 0 = QEMU's default."""
    vms: _axis(Annotated[int, Field(ge=1, le=64)]) | None = None
    """Guests booted at once per configuration (guest mode); overrides [method] vms."""
    guest: _axis(Annotated[str, Field(max_length=40, pattern=TARGET_NAME)]) | None = None
    """Which guest measures each configuration (guest mode): "appliance" and/or the [guest]
    image's name. Absent: the [guest] image when there is one, else the appliance (and then
    the configurations' keys name no guest, as before the axis existed)."""
    skip_invalid: bool = False
    """Drop the combinations QEMU refuses (aio=native without a direct cache, raw with
    preallocation=metadata, an iothread on a controller that has none), listing them, instead of
    refusing the suite."""
    from_vm: VmFile = None
    """A VM definition beside the suite (a Proxmox VE ``ID.conf`` or ``qm config`` output, or
    ``virsh dumpxml`` output): its disk's settings are measured in the same rounds as the
    reference configuration (``Reference``), whether or not the matrix holds them."""
    disk: str | None = Field(default=None, max_length=32, pattern=r"^[a-z]+[0-9a-z]*$")
    """Which disk of ``from_vm``: ``scsi0`` (Proxmox VE) or the target dev, ``vda`` (libvirt);
    may be left out when the VM has one disk."""
    storage_cfg: VmFile = None
    """Proxmox VE's ``/etc/pve/storage.cfg`` beside the suite, for storages other than a fresh
    installation's (local, local-lvm, local-zfs)."""
    reference: Reference | None = None
    """``from_vm``'s disk as iomatrix read it; written by iomatrix into a run's stored suite."""

    @model_validator(mode="after")
    def _vm_keys(self) -> "Matrix":
        if self.from_vm is None:
            given = [k for k in ("disk", "storage_cfg", "reference") if getattr(self, k) is not None]
            if given:
                raise ValueError(f"{given[0]} goes with from_vm (the VM definition it reads)")
        return self


class Part(Matrix):
    """An extra part of a suite: its own mode and matrix, the suite's target and workloads."""

    mode: Mode
    """The part's mode: host, blocklayer or guest."""
    under_tcg: Literal["all", "one", "skip"] = "all"
    """When guests run emulated (TCG): every trial, only the first configuration's first
    workload (to show the chain works), or none."""

    @model_validator(mode="after")
    def _no_vm(self) -> "Part":
        if self.from_vm is not None:
            raise ValueError("from_vm belongs in [matrix]: the suite's own mode measures the VM")
        return self


IOPING_WORKING_SET = 1 << 20
"""The bytes an ioping workload reads from: the 1 MiB file ``ioping DIR`` writes (-S)."""


def _whole_ms(value: float) -> float:
    if round(value * 1000, 6) != int(round(value * 1000)) or not 0 <= value <= 60:
        raise ValueError("the interval between ioping's requests is whole milliseconds, at most 60s")
    return value


class Ioping(Frozen):
    """``[[workloads]] ioping = { count = 10, interval = "1s" }``: seed 001 §9's latency test,
    ``ioping -c COUNT -i INTERVAL``: COUNT single random reads of ``bs`` from a 1 MiB working
    set, each missing the page cache, one per INTERVAL, each timed; every request counts.
    Host mode runs ioping itself where it is installed, every other mode (and a host without
    it) fio's equivalent job; ``iomatrix.fio.ioping`` says what each does and why they agree."""

    count: int = Field(default=10, ge=2, le=100_000)
    """Requests, as ioping's ``-c`` (at least 2)."""
    interval: Annotated[Duration, AfterValidator(_whole_ms)] = 1.0
    """Time between requests, as ioping's ``-i`` ("1s", "20ms"): whole milliseconds."""

    @property
    def interval_text(self) -> str:
        """The interval as ioping and fio both read it: "1s", "20ms"."""
        ms = int(round(self.interval * 1000))
        return f"{ms // 1000}s" if ms and ms % 1000 == 0 else f"{ms}ms"

    @property
    def seconds(self) -> float:
        """How long the requests take: one interval after each (fio's think time; ioping
        skips the one after the last)."""
        return self.count * self.interval

    @property
    def token(self) -> str:
        """The ioping part of a workload key: ``ioping=c10,i1s``."""
        return f"ioping=c{self.count},i{self.interval_text}"

    @classmethod
    def of_key(cls, key: str) -> "Ioping | None":
        """The ioping settings a stored workload key names (``token``), or None."""
        m = re.search(r"(?:^|/)ioping=c(\d+),i(\d+m?s)$", key)
        return cls(count=int(m.group(1)), interval=m.group(2)) if m else None


class WorkloadGroup(Frozen):
    """One [workloads] table: the cross product of its axes."""

    rw: _axis(Rw) = ("randread",)
    """fio's rw: read, write, randread, randwrite, rw (readwrite) or randrw."""
    bs: _axis(BlockSize) = (4096,)
    """Block size: bytes, or with a unit as fio writes it ("4k", "64k", "1m")."""
    iodepth: _axis(Annotated[int, Field(ge=1, le=65536)]) = (1,)
    """Queue depth of each job (fio's iodepth)."""
    numjobs: _axis(Annotated[int, Field(ge=1, le=1024)]) = (1,)
    """fio jobs run at once on the target, each with its own queue."""
    rate_iops: _axis(Annotated[int, Field(ge=0, le=1_000_000_000)]) = (0,)
    """0 means unlimited."""
    options: dict[str, str] = {}
    """Extra fio options (e.g. rwmixread = 70), each on WORKLOAD_FIO_OPTIONS with a value of
    its shape; true/false are written 1/0, as fio reads them."""
    jobfile: str | None = Field(default=None, max_length=255)
    """A fio job file beside the suite file whose jobs are the workloads (iomatrix.suite.jobfiles);
    the table then has no other key."""
    ioping: Ioping | None = None
    """An ioping latency test (``Ioping``) instead of a fio job: rw, iodepth, numjobs,
    rate_iops and options are ioping's own and may not be set; bs is its request size."""

    @model_validator(mode="after")
    def _jobfile_alone(self) -> "WorkloadGroup":
        others = sorted(self.model_fields_set - {"jobfile"})
        if self.jobfile is not None and others:
            raise ValueError(f"a table with jobfile takes its workloads from the job file; "
                             f"write {others[0]} there, not beside it")
        return self

    @model_validator(mode="after")
    def _ioping_alone(self) -> "WorkloadGroup":
        if self.ioping is None:
            return self
        fixed = {"rw": ("randread",), "iodepth": (1,), "numjobs": (1,), "rate_iops": (0,),
                 "options": {}}
        for key, value in fixed.items():
            if getattr(self, key) != value:
                raise ValueError(f"ioping reads one random block at a time, paced by its "
                                 f"interval: {key} cannot be set beside ioping (bs can)")
        if max(self.bs) > IOPING_WORKING_SET:
            raise ValueError("ioping's requests (bs) cannot exceed its 1 MiB working set")
        return self

    @field_validator("options", mode="before")
    @classmethod
    def _allowed(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value                # pydantic says it is not a table
        checked: dict[str, str] = {}
        for key, item in value.items():
            text = ""
            if isinstance(key, str) and _FIO_KEY.fullmatch(key):
                try:
                    text = fio_option_text(item)
                except ValueError as exc:
                    raise ValueError(f"fio option {key!r}: {exc}") from None
            problem = fio_option_problem(key, text)
            if problem:
                raise ValueError(problem)
            checked[key] = text
        return checked


GuestOs = Literal["linux", "windows"]


class OwnGuest(Frozen):
    """[guest]: the user's own disk image as the guest (``iomatrix.appliance.ownimage``). It is
    booted through a throwaway qcow2 overlay in the run's directory (the image is only read);
    a Linux cloud image needs no preparation (a NoCloud seed starts fio in it), a Windows
    image is prepared once (docs: "Measure with your own guest")."""

    image: Path
    """The base image, qcow2 or raw, as an absolute path."""
    name: str | None = Field(default=None, max_length=40, pattern=TARGET_NAME)
    """The guest's name on the ``guest`` axis; default: the image's file name without suffix."""
    os: GuestOs = "linux"
    """linux (a NoCloud seed starts fio in it) or windows (prepared once; fio then runs with
    windowsaio on the disk as the guest names it)."""
    kernel: Path | None = None
    """Boot this kernel (and ``initrd``) with ``-kernel`` instead of the image's bootloader:
    an image that is a bare filesystem (no partition table, no bootloader)."""
    initrd: Path | None = None
    """With ``kernel``: its initrd."""
    append: Printable = Field(default="root=/dev/vda rw", max_length=1000)
    """The kernel command line with ``kernel`` (console=ttyS0 is added)."""
    ready_timeout: Duration = 120.0
    """How long the guest may take to print its ready marker under KVM; under TCG
    :data:`TCG_READY_FACTOR` times as long (a distribution boots its whole userspace)."""

    @field_validator("image", "kernel", "initrd")
    @classmethod
    def _absolute(cls, value: Path | None) -> Path | None:
        if value is None:
            return None
        text = str(value)
        if not value.is_absolute() or ".." in value.parts or _CONTROL.search(text) \
                or "\n" in text:
            raise ValueError("give an absolute path without '..' (the image is only read, "
                             "through an overlay in the run's directory)")
        return value

    @model_validator(mode="after")
    def _kernel_pair(self) -> "OwnGuest":
        if self.initrd is not None and self.kernel is None:
            raise ValueError("initrd goes with kernel")
        if self.os == "windows" and self.kernel is not None:
            raise ValueError("kernel is for a Linux image without a bootloader")
        return self

    @property
    def label(self) -> str:
        """Its value on the ``guest`` axis."""
        if self.name is not None:
            return self.name
        stem = re.sub(r"[^A-Za-z0-9._-]", "-", self.image.name.split(".")[0]).strip("-._")
        return (stem or "image")[:40]

    def ready_seconds(self, accel: str) -> float:
        """How long it may take to become ready under ``accel``."""
        return self.ready_timeout * (TCG_READY_FACTOR if accel == "tcg" else 1)

    def guests_at_once(self, configs: Iterable[Configuration], vms: int) -> int:
        """The most guests of this image one session of ``configs`` boots (``vms``: [method]
        vms, for a configuration that names none)."""
        return max((c.vms or vms for c in configs if c.guest == self.label), default=1)


TCG_READY_FACTOR = 5
"""A real distribution's boot under TCG, against KVM: Debian 12 with cloud-init became ready in
58-73 s on 2 busy cores (the appliance: 5-6 s; ``bench/own_guest.py``), and took over 160 s of
guest uptime at a load of 13; under KVM the same boot takes seconds."""


class Method(Frozen):
    mode: Mode = "blocklayer"
    """How each configuration is measured: host (fio directly on the target), blocklayer
    (qemu-storage-daemon holds the image, fio drives it from the host) or guest (VMs, fio inside)."""
    ramp: Duration = 2.0
    """fio's ramp time before each trial measures ("2s")."""
    runtime: Duration = 10.0
    """How long each trial measures ("10s"); not used with steady_state."""
    samples: int = Field(default=1, ge=1, le=1000)
    """Fixed repetitions of every point, interleaved across configurations."""
    target_ci: Fraction | None = None
    """The 95 % CI half-width every gain should reach ("2%": ±2 percentage points; with no
    gain, a point's mean IOPS, relative): a pilot at the run's own trial length measures the
    noise first, and the rounds (samples to max_samples) that reach it in the least time are
    chosen, then measured whatever the gains show (``analysis.trialplan``; no stopping when a
    CI first looks narrow, which would call an A/A pair different too often). false: rounds
    fixed by samples (as when absent, for a [scale.NAME] table to switch off what the suite's
    own [method] switched on)."""
    max_samples: int = Field(default=10, ge=1, le=1000)
    """With target_ci or pilot: at most this many rounds (``samples``: at least)."""
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**63)
    """Seed of the trial order's shuffle; a random one is drawn and recorded when absent."""
    steady_state: bool = False
    """Run each trial until its per-second IOPS meet the SNIA PTS rule (last 5 seconds: range
    <= 20 % of their mean, least-squares excursion <= 10 %), between min_runtime and
    max_runtime; runtime is then not used. Host and blocklayer modes."""
    min_runtime: Duration = 5.0
    """With steady_state, no trial stops before this."""
    max_runtime: Duration = 60.0
    """With steady_state, a trial stops at this even if not steady; with pilot, the longest
    trial it may choose."""
    baseline: bool = False
    """Also measure every workload in host mode on the same target (the bare-metal baseline)."""
    on_node_failure: Literal["continue", "stop"] = "continue"
    """A run of several nodes ([nodes]) when one drops mid-run: its unmeasured trials fail with
    the reason and the others go on ("continue"), or every node stops and the run ends
    interrupted ("stop")."""
    engine: Literal["libaio", "io_uring", "psync"] = "libaio"
    """fio's engine for host mode and FUSE exports."""
    precondition: bool = True
    """Write every image fully once before measuring, so reads touch the disk."""
    vms: int = Field(default=1, ge=1, le=64)
    """Guests booted at once per configuration, each with its own image (guest mode)."""
    vcpus: int = Field(default=2, ge=1, le=64)
    """vCPUs of each guest (guest mode)."""
    memory: GuestMemory = 512 * 1024 * 1024
    """Guest memory, with a unit ("512MiB"), whole MiB, at least MIN_GUEST_MEMORY_MIB."""
    accel: Accel = "auto"
    """auto: KVM when a probe boot shows it works, otherwise TCG (emulated, said everywhere)."""
    boot_timeout: Duration = 120.0
    """How long a guest may take to become ready before its trials fail."""
    platform: Platform = "qemu"
    """Guest and blocklayer mode: build each configuration's disk as this platform would (qemu:
    iomatrix's own two -blockdev nodes; proxmox: qemu-server's graph, detect-zeroes, discard,
    throttle node; libvirt: libvirt's nodes and devices). See docs/proxmox-options.md."""
    pve_version: PveVersion | None = None
    """With platform = "proxmox": 8 (-drive, machine < 10.0) or 9 (-blockdev under a throttle
    filter; the default)."""
    libvirt_uri: str | None = None
    """With platform = "libvirt": run the guests through this libvirtd (``"qemu:///system"``):
    iomatrix writes each guest's domain XML and starts it with ``virsh create``
    (iomatrix.drivers.libvirt). Absent: iomatrix's own QEMU with libvirt's block graph."""
    libvirt_version: str | None = Field(default=None, pattern=r"^[0-9]+\.[0-9]+(\.[0-9]+)?$")
    """With platform = "libvirt" and no libvirt_uri: the libvirt whose block graph the disks get
    ("11.3"), with the QEMU that runs them (libvirt 10.1 and later give a raw disk no format
    node on QEMU 9.0 and later). Absent: the libvirt installed here, else 11.3. Through a
    libvirtd (libvirt_uri) the daemon's own version is used."""
    aa: bool = False
    """A/A calibration: measure the first configuration of the matrix twice (as itself and as
    its twin, key ``.../aa=twin``) in the same rounds; the run then reports how often its own
    method calls the identical pair different, and its noise floor (``analysis.paired``)."""
    pilot: bool = False
    """Choose runtime and rounds from a pilot measured at the start of the run: its noise at
    two trial lengths, its drift between rounds and its fixed cost per trial and session; the
    least wall time to target_ci (±2 pp when absent) on every gain (``analysis.trialplan``),
    with trials of at most max_runtime and at most max_samples rounds. A runtime or samples the
    suite gives is kept and only the other chosen (a runtime: the pilot measures at it alone,
    as for target_ci). The rounds are then fixed: no look at the gains decides when to stop."""
    concurrent_nodes: bool = False
    """Cluster load: every node of the run loads the shared target at once, each trial driven
    by one fio client here through each node's SSH session (``iomatrix.drivers.cluster``);
    each node's figures are stored as a per-client share of the cluster's aggregate. The
    target must be the same shared storage, at the same path, here and on every node. Host
    mode, or guest mode: each node boots ``vms`` guests, each on a disk of its own there, and
    every guest of every node gets the job (``iomatrix.drivers.cluster``)."""

    @model_validator(mode="after")
    def _pve_version_needs_proxmox(self) -> "Method":
        if self.pve_version is not None and self.platform != "proxmox":
            raise ValueError(f'pve_version is for platform = "proxmox" (platform is '
                             f'"{self.platform}")')
        for key in ("libvirt_uri", "libvirt_version"):
            if getattr(self, key) is not None and self.platform != "libvirt":
                raise ValueError(f'{key} is for platform = "libvirt" (platform is '
                                 f'"{self.platform}")')
        if self.libvirt_uri is not None and self.libvirt_version is not None:
            raise ValueError("libvirt_version models a libvirt; with libvirt_uri the daemon's "
                             "own version is used: drop one")
        return self

    @field_validator("target_ci", mode="before")
    @classmethod
    def _off(cls, value: Any) -> Any:
        return None if value is False else value

    @field_validator("runtime")
    @classmethod
    def _positive(cls, value: float) -> float:
        if value < 0.5:
            raise ValueError("runtime must be at least 500ms")
        return value

    @model_validator(mode="after")
    def _runtimes(self) -> "Method":
        if self.steady_state and not 5 <= self.min_runtime <= self.max_runtime:
            raise ValueError("steady_state needs 5s <= min_runtime <= max_runtime "
                             "(the rule looks at the last 5 one-second intervals)")
        if self.max_samples < self.samples:
            raise ValueError(f"max_samples ({self.max_samples}) is below samples ({self.samples})")
        if self.pilot and self.steady_state:
            raise ValueError("pilot chooses each trial's runtime; steady_state lets each trial "
                             "choose its own: drop one")
        if self.concurrent_nodes and self.mode not in ("host", "guest"):
            raise ValueError('concurrent_nodes loads the target from the nodes in mode = "host" '
                             f'or "guest" only, so far (mode is "{self.mode}")')
        if self.concurrent_nodes and self.on_node_failure == "stop":
            raise ValueError('on_node_failure = "stop" is not built for concurrent_nodes, whose '
                             "trial fails where a node drops and whose next round starts it "
                             "again")
        if self.concurrent_nodes and self.steady_state:
            raise ValueError("steady_state cannot follow a trial of concurrent_nodes: fio's "
                             "client reports the nodes' I/O only when the trial ends")
        if self.pilot and {"runtime", "samples"} <= self.model_fields_set:
            raise ValueError("pilot chooses runtime and samples, and the suite fixes both: "
                             "drop one of them, or pilot")
        return self

    @property
    def plans_rounds(self) -> bool:
        """A pilot chooses the rounds (pilot, or target_ci)."""
        return self.pilot or self.target_ci is not None

    @property
    def chooses_runtime(self) -> bool:
        """The pilot chooses the trial length too: pilot = true and the suite fixes neither
        runtime nor steady state."""
        return self.pilot and not self.steady_state and "runtime" not in self.model_fields_set

    @property
    def fixed_by_suite(self) -> tuple[float | None, int | None]:
        """(runtime, samples) as the suite fixed them for a pilot to keep; None: not given."""
        fields = self.model_fields_set
        return (self.runtime if "runtime" in fields else None,
                self.samples if "samples" in fields else None)

    @property
    def window(self) -> float:
        """The longest measurement window of a trial (ramp excluded)."""
        return self.max_runtime if self.steady_state else self.runtime


class ScaleInfo(Frozen):
    """One [scale.NAME] table of a suite, as ``iomatrix suites`` and ``run --plan`` list it."""

    name: str = Field(max_length=40, pattern=SCALE_NAME)
    description: Printable = Field(default="", max_length=10_000)


class Scale(Frozen):
    """A [scale.NAME] table: how the suite changes at that scale (``run --scale NAME``).
    [target], [matrix] and [method] keys given here replace the suite's own, key by key; a
    [[workloads]], [[part]] or [[targets]] list given here replaces the suite's whole list. The
    result is validated as a whole suite. Values are checked there, names here (unknown keys
    refused)."""

    description: Printable = Field(default="", max_length=10_000)
    """What the scale is for ("a few minutes: ..."); ``iomatrix suites`` and ``run --plan``
    show it."""
    target: dict[str, Any] = {}
    """``[scale.NAME.target]``: [target] keys that replace the suite's own, key by key."""
    matrix: dict[str, Any] = {}
    """``[scale.NAME.matrix]``: [matrix] keys that replace the suite's own, key by key."""
    method: dict[str, Any] = {}
    """``[scale.NAME.method]``: [method] keys that replace the suite's own, key by key."""
    workloads: list[dict[str, Any]] | None = None
    """``[[scale.NAME.workloads]]``: replaces the suite's whole [[workloads]] list."""
    part: list[dict[str, Any]] | None = None
    """``[[scale.NAME.part]]``: replaces the suite's whole [[part]] list."""
    targets: list[dict[str, Any]] | None = None
    """``[[scale.NAME.targets]]``: replaces the suite's whole [[targets]] list."""

    @field_validator("workloads", mode="before")
    @classmethod
    def _one_table(cls, value: Any) -> Any:
        return [value] if isinstance(value, dict) else value

    @field_validator("target", "matrix", "method")
    @classmethod
    def _known_keys(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        model = {"target": Target, "matrix": Matrix, "method": Method}[str(info.field_name)]
        unknown = sorted(set(value) - set(model.model_fields))
        if unknown:
            raise ValueError(f"unknown key {unknown[0]!r} (not a [{info.field_name}] key)")
        return value


# -- findings: a study's conclusions as claims a run can check --------------------------------
FindingKind = Literal["effect", "ranking", "equivalence", "baseline"]
FindingMetric = Literal["iops", "bw_bytes", "lat_mean_ns", "lat_p99_ns"]
FindingMode = Literal["guest", "blocklayer"]
FINDING_ID = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
BLOCKLAYER_AXES = ("aio", "cache", "format", "preallocation")
"""Axes QEMU's block layer has as the study meant them: a claim about one of them is checked in
blocklayer mode too (measured natively where guests are emulated). iothread is not among them:
in blocklayer mode it picks the export (FUSE or NBD), not the guest's IOThread."""
_AXIS_VALUES: dict[str, tuple[str, ...]] = {
    "controller": CONTROLLERS, "aio": Aio.__args__, "cache": Cache.__args__,  # type: ignore[attr-defined]
    "format": Format.__args__, "preallocation": Preallocation.__args__,  # type: ignore[attr-defined]
    "data_path": DataPath.__args__, "iothread": ("on", "off"),  # type: ignore[attr-defined]
}


def _levels(value: Any) -> Any:
    """A level or list of levels as a configuration shows it: true → "on", 8 → "8"."""
    if isinstance(value, (list, tuple)):
        return tuple(shown(v) for v in value)
    return shown(value) if isinstance(value, (bool, int, str)) else value


Level = Annotated[str, BeforeValidator(_levels)]
Levels = Annotated[tuple[str, ...], BeforeValidator(lambda v: _levels(_as_tuple(v)))]
Percent = Annotated[float, BeforeValidator(_fraction), Field(gt=0, le=100)]
"""A percentage that may exceed 100 % ("214%" of bare metal): "90%" or 0.9."""


class FindingWorkloads(Frozen):
    """Which of a run's workloads a claim is about; an absent key takes every value."""

    rw: tuple[Rw, ...] | None = None
    """Only these fio rw values."""
    bs: tuple[BlockSize, ...] | None = None
    """Only these block sizes."""
    iodepth: tuple[Annotated[int, Field(ge=1)], ...] | None = None
    """Only these queue depths."""
    numjobs: tuple[Annotated[int, Field(ge=1)], ...] | None = None
    """Only these job counts."""
    rate_iops: tuple[Annotated[int, Field(ge=0)], ...] | None = None
    """Only these IOPS caps."""

    @field_validator("rw", "bs", "iodepth", "numjobs", "rate_iops", mode="before")
    @classmethod
    def _listed(cls, value: Any) -> Any:
        return None if value is None else _as_tuple(value)


class Finding(Frozen):
    """One [[finding]] table: a conclusion of the study a suite transcribes, with the figure it
    published and a form a stored run can check (``iomatrix.analysis.findings``).

    kind effect: ``level`` of ``axis`` against ``reference`` on ``metric`` is ``expect``
    (better or worse, in the metric's own sense: lower latency is better), optionally by
    ``at_least`` (a fraction: "10%"). ranking: the ``best`` levels beat every other level
    (of ``levels``, default all the run has), the ``worst`` are beaten by every other.
    equivalence: ``level`` and ``reference`` within ±``margin``. baseline: the configurations
    with ``axis`` = ``level`` reach ``at_least`` of bare metal ("90%"; may exceed 100 %).
    Every kind: ``where`` keeps only configurations with those values, ``per`` must hold at
    each level of those axes separately, ``workloads`` picks the workloads, ``modes`` the modes
    it is checked in (default: guest, and blocklayer where ``axis`` is one of BLOCKLAYER_AXES)."""

    id: str = Field(min_length=1, max_length=60, pattern=FINDING_ID)
    """The claim's name within the suite: letters, digits, ``.``, ``_`` and ``-``."""
    study: Printable = Field(min_length=1, max_length=200)
    """The citation: seed and section ("seed 000 §FINDINGS")."""
    claim: Printable = Field(min_length=1, max_length=1000)
    """The conclusion, as the study states it."""
    published: Printable = Field(min_length=1, max_length=1000)
    """The figure the study published for it, in its words and numbers."""
    kind: FindingKind
    """The form of the claim: effect, ranking, equivalence or baseline (above)."""
    axis: Literal["controller", "data_path", "aio", "iothread", "cache", "format",
                  "preallocation", "num_queues", "queue_size", "vms", "target"] | None = None
    """target: the run's targets by name ([[targets]] name, or a [target] filesystems entry)."""
    level: Level | None = None
    """The level the claim is about (effect, equivalence, baseline)."""
    reference: Level | None = None
    """The level it is compared with (effect, equivalence)."""
    best: Levels = ()
    """ranking: the levels that beat every other."""
    worst: Levels = ()
    """ranking: the levels every other beats."""
    levels: Levels = ()
    """ranking: the levels compared; absent: every level the run has."""
    metric: FindingMetric = "iops"
    """What is compared: iops, bw_bytes, lat_mean_ns or lat_p99_ns."""
    expect: Literal["better", "worse"] | None = None
    """effect: better or worse, in the metric's own sense (lower latency is better)."""
    at_least: Percent | None = None
    """effect: by at least this much ("10%"); baseline: at least this share of bare metal
    ("90%")."""
    margin: Fraction | None = None
    """equivalence: within plus or minus this ("5%")."""
    where: dict[str, Levels] = {}
    """Only the configurations with these values (``{ cache = "none" }``)."""
    per: tuple[str, ...] = ()
    """Axes at each level of which the claim must hold separately."""
    workloads: FindingWorkloads = FindingWorkloads()
    """Which of the run's workloads the claim is about (``FindingWorkloads``); absent: all."""
    modes: tuple[FindingMode, ...] = ()
    """Empty: the default above, guest first (the study's own mode decides where measured)."""

    @field_validator("per", "modes", mode="before")
    @classmethod
    def _listed(cls, value: Any) -> Any:
        return _as_tuple(value)

    @model_validator(mode="after")
    def _complete(self) -> "Finding":
        need = {"effect": ("axis", "level", "reference", "expect"),
                "ranking": ("axis",), "equivalence": ("axis", "level", "reference", "margin"),
                "baseline": ("at_least",)}[self.kind]
        for key in need:
            if getattr(self, key) is None:
                raise ValueError(f"a {self.kind} finding needs {key}")
        if self.kind == "ranking" and not (self.best or self.worst):
            raise ValueError("a ranking finding needs best or worst (or both)")
        if self.kind == "baseline" and (self.axis is None) != (self.level is None):
            raise ValueError("a baseline finding names axis and level together (or neither)")
        if self.kind in ("effect", "equivalence") and self.level == self.reference:
            raise ValueError(f"level and reference are both {self.level!r}")
        if set(self.best) & set(self.worst):
            raise ValueError("a level cannot be both best and worst")
        if self.at_least is not None and self.kind not in ("effect", "baseline"):
            raise ValueError(f"at_least is for effect and baseline findings, not {self.kind}")
        if self.at_least is not None and self.kind == "effect" and self.at_least >= 1 \
                and self.metric in ("lat_mean_ns", "lat_p99_ns"):
            raise ValueError("a latency cannot fall by 100 % or more")
        for axis in (*self.per, *self.where):
            if axis not in (*CONFIG_AXES, TARGET_AXIS):
                raise ValueError(f"{axis!r} is not an axis ({', '.join(CONFIG_AXES)}, "
                                 f"{TARGET_AXIS})")
        if self.axis is not None and (self.axis in self.per or self.axis in self.where):
            raise ValueError(f"{self.axis} is the axis compared: it cannot be in per or where")
        named = [(self.axis, v) for v in (self.level, self.reference, *self.best, *self.worst,
                                          *self.levels) if v is not None]
        named += [(a, v) for a, values in self.where.items() for v in values]
        for axis, value in named:
            allowed = _AXIS_VALUES.get(axis or "")
            if allowed is not None and value not in allowed:
                raise ValueError(f"{axis} has no level {value!r} ({', '.join(allowed)})")
            if allowed is None and axis not in (None, TARGET_AXIS) and not value.isdigit():
                raise ValueError(f"{axis} levels are numbers, not {value!r}")
        return self

    @property
    def checked_modes(self) -> tuple[str, ...]:
        """The modes the claim is checked in, the one that decides first where measured."""
        if self.modes:
            return self.modes
        return ("guest", "blocklayer") if self.axis in BLOCKLAYER_AXES else ("guest",)


def method_of_vm(method: dict[str, Any], matrix: Any) -> dict[str, Any]:
    """A [method] table (raw, as written) as a suite made from a VM runs it: platform follows
    the VM's ([matrix] reference: proxmox for a PVE config, libvirt for a domain) unless the
    table sets it, and pve_version the VM's machine likewise."""
    reference = matrix.get("reference") if isinstance(matrix, dict) else None
    if not isinstance(reference, dict) or reference.get("platform") not in ("proxmox", "libvirt"):
        return method
    method = dict(method)
    method.setdefault("platform", reference["platform"])
    if method["platform"] == "proxmox" and reference.get("pve_version") is not None:
        method.setdefault("pve_version", reference["pve_version"])
    return method
def _twice(values: list[str]) -> str | None:
    """The first value that occurs more than once."""
    return next((v for v in values if values.count(v) > 1), None)


class Nodes(Frozen):
    """[nodes]: the nodes that each measure the suite, named one way (``hosts``, an
    ``inventory`` file, or this Proxmox VE cluster's members), with what SSH needs for all of
    them (``iomatrix.cluster.ssh``)."""

    hosts: tuple[str, ...] = ()
    """``[user@]host[:port]`` of each node."""
    inventory: str | None = None
    """A TOML inventory file (``hosts = [...]`` and/or ``[[node]]`` tables), relative to the suite."""
    proxmox: bool = False
    """Every node of the Proxmox VE cluster this host is in (``/etc/pve/.members``)."""
    user: str | None = None
    """The user SSH logs in as on every node (``user@`` in ``hosts`` wins)."""
    port: int | None = Field(default=None, ge=1, le=65535)
    """SSH's port on every node (``:port`` in ``hosts`` wins)."""
    identity: str | None = None
    """The private key SSH uses (rule 1: only a file nobody but root or the user could have
    written)."""
    known_hosts: str | None = None
    """The known_hosts file with every node's host key; absent: the user's and the
    system's. An unknown or changed key refuses the node."""
    ssh_config: str | None = None
    """Refused: a suite never hands ssh a config file (root's ssh would run its ProxyCommand)."""
    command: str | None = None
    """Refused: the program a node runs is iomatrix on its login PATH, or what root's own
    inventory says (``iomatrix.cluster.ssh.untrusted``), never a suite's string."""

    @field_validator("hosts", "inventory", "user", "identity", "known_hosts")
    @classmethod
    def _text(cls, value: Any) -> Any:
        for text in value if isinstance(value, tuple) else (value,):
            why = text_problem(text) if isinstance(text, str) else None
            if why:
                raise ValueError(why)
        return value

    @field_validator("ssh_config", "command")
    @classmethod
    def _own(cls, value: str | None, info: ValidationInfo) -> None:
        if value is not None:
            what = ("an ssh_config file (ssh would run its ProxyCommand)"
                    if info.field_name == "ssh_config" else "the program the nodes run")
            raise ValueError(f"a suite never names {what}: give it in an inventory only root "
                             "(or you) can write (--nodes FILE, or [nodes] inventory)")
        return None

    @model_validator(mode="after")
    def _one_way(self) -> "Nodes":
        ways = [w for w, given in (("hosts", bool(self.hosts)), ("inventory", self.inventory),
                                   ("proxmox", self.proxmox)) if given]
        if len(ways) != 1:
            raise ValueError("name the nodes one way: hosts = [...], inventory = \"FILE\" or "
                             "proxmox = true" + (f" (not {' and '.join(ways)})" if ways else ""))
        for host in self.hosts:
            try:
                parse_destination(host)
            except NodesError as exc:
                raise ValueError(str(exc)) from None
        return self

    def defaults(self) -> dict[str, Any]:
        """What the table sets for every node (``iomatrix.cluster.ssh.DEFAULT_KEYS``)."""
        return {k: v for k in ("user", "port", "identity", "known_hosts")
                if (v := getattr(self, k)) is not None}


class Suite(Frozen):
    """A validated suite file."""

    suite: SuiteInfo
    target: Target
    matrix: Matrix = Matrix()
    workloads: tuple[WorkloadGroup, ...] = (WorkloadGroup(),)
    method: Method = Method()
    part: tuple[Part, ...] = ()
    """[[part]] tables: more modes measured in the same run (e.g. a few guest configurations
    beside a blocklayer sweep)."""
    finding: tuple[Finding, ...] = ()
    """[[finding]] tables: the study's conclusions as claims a run can check (``Finding``)."""
    targets: tuple[NamedTarget, ...] = ()
    """[[targets]] tables: several targets measured in one run (``named_targets``)."""
    guest: OwnGuest | None = None
    """[guest]: the user's own image as the guest (``OwnGuest``)."""
    nodes: Nodes | None = None
    """[nodes]: the cluster nodes that each run the suite (``Nodes``); None: this host only."""

    @model_validator(mode="before")
    @classmethod
    def _shared_target(cls, data: Any) -> Any:
        """With [[targets]], [target] holds what they share (size, working_set, allow_tmpfs):
        each table takes the keys it does not give from there, and ``target`` becomes the first
        of them (the run's primary target: its host metadata, the target its notes name)."""
        if not isinstance(data, dict) or not data.get("targets"):
            return data
        shared, tables = data.get("target", {}), data["targets"]
        if not isinstance(shared, dict) or not isinstance(tables, list):
            return data                 # pydantic says what is wrong with them
        for key in ("directory", "device", "allow_destroy", "filesystems", *NETWORK_KINDS,
                    "storage"):
            if key in shared:
                raise ValueError(f"[target] {key}: with [[targets]], each target names its own "
                                 "directory or device; [target] holds only what they share "
                                 "(size, working_set, allow_tmpfs)")
        tables = [{**shared, **t} if isinstance(t, dict) else t for t in tables]
        first = tables[0] if isinstance(tables[0], dict) else {}
        primary = {k: v for k, v in first.items() if k in Target.model_fields}
        return {**data, "target": primary, "targets": tables}

    @field_validator("targets")
    @classmethod
    def _unique_names(cls, value: tuple[NamedTarget, ...]) -> tuple[NamedTarget, ...]:
        twice = _twice([t.name for t in value])
        if twice is not None:
            raise ValueError(f"two targets are called {twice!r}")
        if _twice([os.path.realpath(t.device) for t in value if t.device is not None]):
            raise ValueError("two targets name the same device")
        return value

    @property
    def named_targets(self) -> tuple[NamedTarget, ...]:
        """The targets of a run that measures several, each configuration on each: the
        [[targets]] tables, or one per [target] filesystems entry (named after it); empty for
        a run of one target (its configurations then name none)."""
        if self.targets:
            return self.targets
        shared = self.target.model_dump(exclude={"filesystems"})
        return tuple(NamedTarget(**shared, name=fs, filesystem=fs)
                     for fs in self.target.filesystems)

    @model_validator(mode="before")
    @classmethod
    def _platform_of_vm(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not isinstance(data.get("method", {}), dict):
            return data
        return {**data, "method": method_of_vm(data.get("method", {}), data.get("matrix"))}

    @model_validator(mode="after")
    def _vm_needs_qemu(self) -> "Suite":
        if self.matrix.from_vm is not None and self.method.mode == "host":
            raise ValueError("[matrix] from_vm: host mode measures no QEMU settings; set [method] "
                             "mode to blocklayer or guest to measure the VM's disk")
        return self

    @model_validator(mode="after")
    def _guests_named(self) -> "Suite":
        own = None if self.guest is None else self.guest.label
        if own is not None and self.method.libvirt_uri is not None:
            raise ValueError("[guest] image: its guests run under iomatrix's own QEMU; drop "
                             "[method] libvirt_uri (libvirt's block graph is kept without it)")
        for value in self.matrix.guest or ():
            if value not in (APPLIANCE, own):
                raise ValueError(f"[matrix] guest: {value!r} is neither {APPLIANCE!r} nor the "
                                 "[guest] image's name" + (f" ({own!r})" if own else
                                                           " (there is no [guest] table)"))
        return self

    @field_validator("finding")
    @classmethod
    def _unique_ids(cls, value: tuple[Finding, ...]) -> tuple[Finding, ...]:
        twice = _twice([f.id for f in value])
        if twice is not None:
            raise ValueError(f"two findings have the id {twice!r}")
        return value
    scales: tuple[ScaleInfo, ...] = ()
    """The [scale.NAME] tables of the suite file (set by ``load``), whichever scale this is."""
    jobfiles: dict[str, str] = {}
    """The [jobfiles] table: job file name → its text, as the suite carried it or ``load`` read
    it (iomatrix.suite.jobfiles); stored with the run's suite text."""
    source_text: str = ""
    source_path: str = ""
    author: Author = Field(default=Author(ANYONE, "a suite of unknown origin"), exclude=True)
    """Who could have written the suite (``iomatrix.core.trust.author_of`` of its file, set by
    ``load``): files it names that reach a guest must be readable by them already. A suite made
    from text counts as anyone's until its loader says whose (``load.with_author``)."""

    def destroy_refused(self) -> str | None:
        """Why this suite may not destroy the device or LUN it names (``allow_destroy``): only
        a suite nobody but root or the invoking user could have written may; None when it may
        or names none."""
        if self.author.trusted:
            return None
        for target in (self.target, *self.targets):
            named = target.device or (target.iscsi.url if target.iscsi is not None else None)
            if target.allow_destroy and named is not None:
                return (f"[target] allow_destroy: {named} would be overwritten as asked by "
                        f"{self.author.where or 'a suite of unknown origin'}, which another "
                        "user could have written")
        return None

    @property
    def name(self) -> str:
        return self.suite.name

    @property
    def scale(self) -> str | None:
        """The scale this suite was resolved at; None for the suite's own tables."""
        return self.suite.scale


class ConfigKey(Frozen):
    """A configuration's identity, typed: its mode and the settings that tell it apart
    (``Configuration.params``, in that order). ``str(key)`` is the text runs store and are
    compared, resumed and reported by (``blocklayer/aio=native/cache=none/...``): it is
    written, never read back into parts."""

    mode: str
    params: tuple[tuple[str, str], ...] = ()

    def __str__(self) -> str:
        return "/".join([self.mode, *(f"{k}={v}" for k, v in self.params)])

    @property
    def settings(self) -> str:
        """The key without its mode: ``aio=native/cache=none/...``."""
        return str(self).partition("/")[2]

    @property
    def target(self) -> str | None:
        """The target's name in a run that measures several; None in a run of one."""
        return dict(self.params).get(TARGET_AXIS)

    @property
    def baseline(self) -> "ConfigKey":
        """The bare-metal baseline this configuration is measured against: the host-mode
        configuration on the same target (``host``, or ``host/target=NAME``)."""
        target = self.target
        return ConfigKey(mode="host", params=() if target is None else ((TARGET_AXIS, target),))


class Configuration(Frozen):
    """One point of the disk matrix. Fields that the mode ignores are None."""

    mode: Mode
    controller: str | None = None
    aio: str | None = None
    iothread: bool | None = None
    cache: str | None = None
    format: str | None = None
    preallocation: str | None = None
    data_path: str | None = None
    """None or "emulated": QEMU's device model; "vhost-user-blk": served by qemu-storage-daemon."""
    num_queues: int | None = None
    queue_size: int | None = None
    vms: int | None = None
    guest: str | None = None
    """Guest mode: "appliance" or the [guest] image's name; None: the appliance, in a run
    whose matrix names no guest (keys as before the ``guest`` axis)."""
    aa: bool | None = None
    """True: the A/A twin of the configuration with the same settings (``[method] aa``): measured
    again under its own key (``.../aa=twin``) in the same rounds, never compared with others."""
    yours: bool | None = None
    """True: the disk of the user's VM (``[matrix] from_vm``), the configuration ``recommend``
    answers relative to. Not part of the key: a matrix configuration with the same settings is
    the same point, labelled as the VM's."""
    target: str | None = None
    """The target's name in a run that measures several (``Suite.named_targets``); None when
    the run has one target."""
    node: str | None = None
    """The node that measures it in a run of a cluster's nodes ([nodes]); None on one host."""

    def params(self) -> dict[str, str]:
        """Axis → value for the axes this configuration sets, in a stable order (the node, then
        the target where the run has several; an A/A twin adds aa = twin)."""
        out: dict[str, str] = {}
        if self.node is not None:
            out[NODE_AXIS] = self.node
        if self.target is not None:
            out[TARGET_AXIS] = self.target
        for axis in CONFIG_AXES:
            value = getattr(self, axis)
            if value is not None:
                out[axis] = shown(value)
        if self.aa:
            out["aa"] = "twin"
        return out

    @property
    def identity(self) -> ConfigKey:
        """Its key, typed."""
        return ConfigKey(mode=self.mode, params=tuple(self.params().items()))

    @property
    def key(self) -> str:
        """Stable identity, e.g. ``blocklayer/aio=native/cache=none/format=raw/...``."""
        return str(self.identity)

    @property
    def label(self) -> str:
        """Short legend text: ``blocklayer native/none/raw`` (+ ``iothread``, ``prealloc=...``,
        `` on TARGET``)."""
        where = "" if self.target is None else f" on {self.target}"
        if self.node is not None:
            where += f" @{self.node}"
        if self.mode == "host":
            return "host (bare metal)" + where
        device = "vhost-user-blk" if self.data_path == "vhost-user-blk" else self.controller
        core = [v for v in (device, self.aio, self.cache, self.format) if v is not None]
        text = f"{self.mode} " + "/".join(core)
        if self.iothread:
            text += " iothread"
        if self.preallocation not in (None, "off"):
            text += f" prealloc={self.preallocation}"
        if self.num_queues:
            text += f" q={self.num_queues}"
        if self.queue_size:
            text += f" qs={self.queue_size}"
        if self.vms and self.vms > 1:
            text += f" ×{self.vms} VMs"
        if self.guest is not None:
            text += f" in {self.guest}"
        text += where
        if self.aa:
            text += " (A/A twin)"
        if self.yours:
            text += f" {YOUR_VM}"
        return text


SPLIT_OPTIONS = ("bssplit", "bsrange", "blocksize_range")
"""Options that give fio's block sizes in place of bs (bssplit first: it wins in fio)."""


def block_sizes(bs: int, options: Mapping[str, str]) -> str:
    """The block sizes a workload issues, as a legend says them: ``4k``, or the split or range
    fio draws from instead of bs (``bssplit 4k/50:64k/50``)."""
    key = next((k for k in SPLIT_OPTIONS if options.get(k)), None)
    return format_size(bs) if key is None else f"{key} {options[key]}"


class Workload(Frozen):
    """One fio job as measured: rw, block size, queue depth, jobs, rate limit, extra options."""

    rw: str
    bs: int
    iodepth: int
    numjobs: int = 1
    rate_iops: int = 0
    options: tuple[tuple[str, str], ...] = ()
    ioping: Ioping | None = None
    """Measured as ioping measures (``Ioping``), not as a time-based fio job."""

    @property
    def key(self) -> str:
        parts = [self.rw, format_size(self.bs), f"qd{self.iodepth}", f"nj{self.numjobs}"]
        if self.rate_iops:
            parts.append(f"rate{self.rate_iops}")
        parts.extend(f"{k}={v}" for k, v in self.options)
        if self.ioping:
            parts.append(self.ioping.token)
        return "/".join(parts)

    @property
    def label(self) -> str:
        if self.ioping:
            return (f"ioping -c {self.ioping.count} -i {self.ioping.interval_text} "
                    f"({format_size(self.bs)} randread QD1)")
        text = f"{block_sizes(self.bs, dict(self.options))} {self.rw} QD{self.iodepth}"
        if self.numjobs > 1:
            text += f" ×{self.numjobs} jobs"
        if self.rate_iops:
            text += f" @{self.rate_iops} IOPS"
        return text
