"""The value types and checks a suite's tables share: sizes, durations, fractions, printable
text, and the names a run gives its target and node axes (the axes themselves and their
levels: ``iomatrix.vocab``)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field

from iomatrix.core import cpuset
from iomatrix.core.units import format_bytes, parse_duration, parse_size
from iomatrix.vocab.axes import DIRECT_CACHES
from iomatrix.vocab.words import Mode

PveVersion = Literal[8, 9]
WorkingSet = Literal["size", "exceed-ram", "in-ram"]
"""[target] working_set: how large the images are against the host's page cache (``Target``)."""
Rw = Literal["read", "write", "randread", "randwrite", "rw", "readwrite", "randrw"]

YOUR_VM = "(your VM)"
"""What the label of the configuration of the user's VM ends with (``Configuration.yours``)."""
APPLIANCE = "appliance"
"""The ``guest`` axis's value for iomatrix's own appliance (beside a [guest] image's name)."""


def uses_page_cache(mode: str, params: Mapping[str, str]) -> bool:
    """Whether a configuration's I/O goes through the host page cache: a QEMU mode (blocklayer,
    guest) whose cache mode is not a direct one (none, directsync): writethrough, writeback,
    unsafe, with any aio (native needs a direct cache). Host mode is fio with ``direct=1``; a
    configuration that names no cache mode (imported results) is not judged. ``params`` as
    ``Configuration.params()`` or a stored configuration's."""
    cache = params.get("cache")
    return mode != Mode.HOST and cache is not None and cache not in DIRECT_CACHES


def as_tuple(value: Any) -> Any:
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


def fraction(value: Any) -> float:
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
layer cannot import (tests/attacks/test_hardening.py checks they agree)."""


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
Fraction = Annotated[float, BeforeValidator(fraction), Field(gt=0, lt=1)]


CpuSet = Annotated[str, Field(max_length=200), AfterValidator(cpuset.level)]
"""A host CPU set ("0-1,3", canonical as Linux writes it) or "numa"; whether the host has those
CPUs is checked before the run (``measure.precheck``)."""


def axis_of(item_type: Any) -> Any:
    return Annotated[tuple[item_type, ...], BeforeValidator(as_tuple), Field(min_length=1)]


CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""Control characters (a tab and a line break aside): terminal escapes have no place in a suite."""


def _printable(value: str) -> str:
    if CONTROL.search(value):
        raise ValueError("may not hold control characters")
    return value


Printable = Annotated[str, AfterValidator(_printable)]
"""Text from the suite that iomatrix prints: no terminal control characters."""


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

