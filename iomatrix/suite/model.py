"""The suite as iomatrix understands it, after validation: frozen models, no loose dicts.
The pydantic schema here is also what ``load`` validates a TOML file against."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (AfterValidator, BeforeValidator, Field, StrictBool, field_validator,
                      model_validator)

from iomatrix.core.units import format_size, parse_duration, parse_size
from iomatrix.core.model import Frozen, shown

Mode = Literal["host", "blocklayer", "guest"]
Controller = Literal["virtio-blk", "virtio-scsi", "virtio-scsi-single", "pvscsi", "sata", "ide", "nvme"]
Aio = Literal["native", "io_uring", "threads"]
Cache = Literal["none", "directsync", "writethrough", "writeback", "unsafe"]
Format = Literal["raw", "qcow2"]
Preallocation = Literal["off", "metadata", "falloc", "full"]
DataPath = Literal["emulated", "vhost-user-blk"]
Accel = Literal["auto", "kvm", "tcg"]
Rw = Literal["read", "write", "randread", "randwrite", "rw", "readwrite", "randrw"]

CONFIG_AXES = ("controller", "data_path", "aio", "iothread", "cache", "format", "preallocation",
               "num_queues", "queue_size", "vms")
CONTROLLERS: tuple[str, ...] = Controller.__args__  # type: ignore[attr-defined]
IOTHREAD_CONTROLLERS = ("virtio-blk", "virtio-scsi", "virtio-scsi-single")
DIRECT_CACHES = ("none", "directsync")

# fio options that iomatrix itself sets from the suite, or that would let fio touch files or
# devices other than the target, run commands, or undo direct I/O; a workload may not set them.
RESERVED_FIO_OPTIONS = frozenset({
    "name", "filename", "directory", "ioengine", "size", "runtime", "ramp_time", "time_based",
    "output-format", "output", "direct", "rw", "readwrite", "bs", "blocksize", "iodepth",
    "numjobs", "rate_iops", "uri", "group_reporting", "lat_percentiles", "percentile_list",
    "opendir", "filename_format", "unique_filename", "buffered", "timeout", "exec_prerun",
    "exec_postrun", "write_iolog", "read_iolog", "write_bw_log", "write_lat_log",
    "write_iops_log", "write_hist_log", "replay_redirect", "unlink", "unlink_each_loop",
    "create_only", "offset", "offset_increment", "filesize", "io_size", "io_limit", "nrfiles",
    "ioscheduler", "trim_backlog", "verify", "pre_read", "thread", "cpus_allowed",
})
_FIO_KEY = re.compile(r"^[a-z][a-z0-9_]*$")


def _as_tuple(value: Any) -> Any:
    """An axis may be written as one value or a list of values."""
    if isinstance(value, (list, tuple)):
        return tuple(value)
    return (value,)


def _size(value: Any) -> int:
    return parse_size(value)


def _duration(value: Any) -> float:
    return parse_duration(value)


def _fraction(value: Any) -> float:
    """ "2%" or 0.02 → 0.02."""
    try:
        if isinstance(value, str) and value.strip().endswith("%"):
            return float(value.strip()[:-1]) / 100
        if not isinstance(value, bool) and isinstance(value, (int, float, str)):
            return float(value)
    except ValueError:
        pass
    raise ValueError(f"not a percentage: {value!r} (write e.g. \"2%\")")


def _sector_multiple(value: int) -> int:
    if value < 512 or value % 512:
        raise ValueError(f"block size {value} is not a multiple of 512 (direct I/O needs that)")
    return value


Size = Annotated[int, BeforeValidator(_size)]
BlockSize = Annotated[int, BeforeValidator(_size), AfterValidator(_sector_multiple)]
Duration = Annotated[float, BeforeValidator(_duration)]
Fraction = Annotated[float, BeforeValidator(_fraction), Field(gt=0, lt=1)]


def _axis(item_type: Any) -> Any:
    return Annotated[tuple[item_type, ...], BeforeValidator(_as_tuple), Field(min_length=1)]


class SuiteInfo(Frozen):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    description: str = ""


class Target(Frozen):
    """Where the images live: a directory (files are created there) or a whole block device."""

    directory: Path | None = None
    size: Size | None = None
    device: Path | None = None
    allow_destroy: bool = False

    @model_validator(mode="after")
    def _one_kind(self) -> "Target":
        if (self.directory is None) == (self.device is None):
            raise ValueError("give either directory (with size) or device (with allow_destroy = true)")
        if self.directory is not None and self.size is None:
            raise ValueError("a directory target needs a size, e.g. size = \"4GiB\"")
        if self.size is not None and self.size < 1024 * 1024:
            raise ValueError(f"size {self.size} is below the minimum of 1MiB")
        if self.device is not None and not self.allow_destroy:
            raise ValueError(f"device {self.device} is written to and destroyed; "
                             "say so with allow_destroy = true")
        return self


class Matrix(Frozen):
    """The disk settings swept; defaults are Proxmox VE's for a new Linux VM."""

    controller: _axis(Controller) = ("virtio-scsi-single",)
    aio: _axis(Aio) = ("io_uring",)
    iothread: _axis(StrictBool) = (True,)
    cache: _axis(Cache) = ("none",)
    format: _axis(Format) = ("raw",)
    preallocation: _axis(Preallocation) = ("off",)
    data_path: _axis(DataPath) = ("emulated",)
    """emulated: QEMU's device model serves the disk; vhost-user-blk: qemu-storage-daemon does."""
    num_queues: _axis(Annotated[int, Field(ge=0)]) = (0,)
    """Virtqueues (virtio-blk, virtio-scsi, vhost-user-blk) or I/O queue pairs (nvme); 0 = QEMU's default."""
    queue_size: _axis(Annotated[int, Field(ge=0)]) = (0,)
    """Entries per virtqueue; 0 = QEMU's default."""
    vms: _axis(Annotated[int, Field(ge=1, le=64)]) | None = None
    """Guests booted at once per configuration (guest mode); overrides [method] vms."""
    skip_invalid: bool = False


class Part(Matrix):
    """An extra part of a suite: its own mode and matrix, the suite's target and workloads."""

    mode: Mode
    under_tcg: Literal["all", "one", "skip"] = "all"
    """When guests run emulated (TCG): every trial, only the first configuration's first
    workload (to show the chain works), or none."""


class WorkloadGroup(Frozen):
    """One [workloads] table: the cross product of its axes."""

    rw: _axis(Rw) = ("randread",)
    bs: _axis(BlockSize) = (4096,)
    iodepth: _axis(Annotated[int, Field(ge=1, le=65536)]) = (1,)
    numjobs: _axis(Annotated[int, Field(ge=1, le=1024)]) = (1,)
    rate_iops: _axis(Annotated[int, Field(ge=0)]) = (0,)
    """0 means unlimited."""
    options: dict[str, str | int | float | bool] = {}
    """Extra fio options applied as written (e.g. rwmixread = 70)."""

    @field_validator("options")
    @classmethod
    def _not_reserved(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key, item in value.items():
            if not _FIO_KEY.match(key):
                raise ValueError(f"{key!r} is not a fio option name")
            if key in RESERVED_FIO_OPTIONS:
                raise ValueError(f"fio option {key!r} is set by iomatrix or not allowed (it could "
                                 "reach beyond the target); use the matching [workloads] or "
                                 "[method] key")
            if any(c in str(item) for c in "\n\r=[]"):
                raise ValueError(f"fio option {key!r}: value {item!r} may not contain a line "
                                 "break, '=' or brackets")
        return value


class Method(Frozen):
    mode: Mode = "blocklayer"
    ramp: Duration = 2.0
    runtime: Duration = 10.0
    samples: int = Field(default=1, ge=1, le=1000)
    """Fixed repetitions of every point, interleaved across configurations."""
    target_ci: Fraction | None = None
    """Repeat a point (up to max_samples) until the 95 % CI half-width of its mean IOPS is
    within this fraction of the mean ("2%")."""
    max_samples: int = Field(default=10, ge=1, le=1000)
    seed: int | None = None
    """Seed of the trial order's shuffle; a random one is drawn and recorded when absent."""
    steady_state: bool = False
    """Run each trial until its per-second IOPS meet the SNIA PTS rule (last 5 seconds: range
    <= 20 % of their mean, least-squares excursion <= 10 %), between min_runtime and
    max_runtime; runtime is then not used. Host and blocklayer modes."""
    min_runtime: Duration = 5.0
    max_runtime: Duration = 60.0
    baseline: bool = False
    """Also measure every workload in host mode on the same target (the bare-metal baseline)."""
    engine: Literal["libaio", "io_uring", "psync"] = "libaio"
    """fio's engine for host mode and FUSE exports."""
    precondition: bool = True
    """Write every image fully once before measuring, so reads touch the disk."""
    vms: int = Field(default=1, ge=1, le=64)
    """Guests booted at once per configuration, each with its own image (guest mode)."""
    vcpus: int = Field(default=2, ge=1, le=64)
    memory: Size = 512 * 1024 * 1024
    """Guest memory."""
    accel: Accel = "auto"
    """auto: KVM when a probe boot shows it works, otherwise TCG (emulated, said everywhere)."""
    boot_timeout: Duration = 120.0
    """How long a guest may take to become ready before its trials fail."""

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
        return self

    @property
    def window(self) -> float:
        """The longest measurement window of a trial (ramp excluded)."""
        return self.max_runtime if self.steady_state else self.runtime


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
    source_text: str = ""
    source_path: str = ""

    @property
    def name(self) -> str:
        return self.suite.name


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

    def params(self) -> dict[str, str]:
        """Axis → value for the axes this configuration sets, in a stable order."""
        out: dict[str, str] = {}
        for axis in CONFIG_AXES:
            value = getattr(self, axis)
            if value is not None:
                out[axis] = shown(value)
        return out

    @property
    def key(self) -> str:
        """Stable identity, e.g. ``blocklayer/aio=native/cache=none/format=raw/...``."""
        return "/".join([self.mode, *(f"{k}={v}" for k, v in self.params().items())])

    @property
    def label(self) -> str:
        """Short legend text: ``blocklayer native/none/raw`` (+ ``iothread``, ``prealloc=...``)."""
        if self.mode == "host":
            return "host (bare metal)"
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
        return text


class Workload(Frozen):
    """One fio job as measured: rw, block size, queue depth, jobs, rate limit, extra options."""

    rw: str
    bs: int
    iodepth: int
    numjobs: int = 1
    rate_iops: int = 0
    options: tuple[tuple[str, str], ...] = ()

    @property
    def key(self) -> str:
        parts = [self.rw, format_size(self.bs), f"qd{self.iodepth}", f"nj{self.numjobs}"]
        if self.rate_iops:
            parts.append(f"rate{self.rate_iops}")
        parts.extend(f"{k}={v}" for k, v in self.options)
        return "/".join(parts)

    @property
    def label(self) -> str:
        text = f"{format_size(self.bs)} {self.rw} QD{self.iodepth}"
        if self.numjobs > 1:
            text += f" ×{self.numjobs} jobs"
        if self.rate_iops:
            text += f" @{self.rate_iops} IOPS"
        return text
