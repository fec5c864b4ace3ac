"""[[workloads]]: the fio jobs (or ioping tests) a suite measures, and one of them as measured
(``Workload``)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import AfterValidator, Field, field_validator, model_validator

from iomatrix.core.model import Frozen
from iomatrix.core.units import format_size
from iomatrix.suite.fields import BlockSize, Duration, Rw, axis_of
from iomatrix.suite.fiooptions import FIO_KEY, fio_option_problem, fio_option_text


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

    rw: axis_of(Rw) = ("randread",)
    """fio's rw: read, write, randread, randwrite, rw (readwrite) or randrw."""
    bs: axis_of(BlockSize) = (4096,)
    """Block size: bytes, or with a unit as fio writes it ("4k", "64k", "1m")."""
    iodepth: axis_of(Annotated[int, Field(ge=1, le=65536)]) = (1,)
    """Queue depth of each job (fio's iodepth)."""
    numjobs: axis_of(Annotated[int, Field(ge=1, le=1024)]) = (1,)
    """fio jobs run at once on the target, each with its own queue."""
    rate_iops: axis_of(Annotated[int, Field(ge=0, le=1_000_000_000)]) = (0,)
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
            if isinstance(key, str) and FIO_KEY.fullmatch(key):
                try:
                    text = fio_option_text(item)
                except ValueError as exc:
                    raise ValueError(f"fio option {key!r}: {exc}") from None
            problem = fio_option_problem(key, text)
            if problem:
                raise ValueError(problem)
            checked[key] = text
        return checked



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
