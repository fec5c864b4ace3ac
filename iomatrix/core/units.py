"""Sizes and durations as people write them in suites ("8GiB", "4k", "500ms", "20m")."""

from __future__ import annotations

import re

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)(i?)(b?)\s*$", re.IGNORECASE)
_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$", re.IGNORECASE)
_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_size(text: str | int) -> int:
    """Bytes in a size; suffixes are binary as in fio (4k = 4096, 1G = 1GiB = 2**30)."""
    if isinstance(text, bool):
        raise ValueError(f"not a size: {text!r}")
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"size must not be negative: {text}")
        return text
    m = _SIZE.match(str(text))
    if not m:
        raise ValueError(f"not a size: {text!r} (write e.g. 4k, 512, 8GiB)")
    number, unit = float(m.group(1)), m.group(2).lower()
    value = number * 1024 ** _POWERS[unit]
    if value != int(value):
        raise ValueError(f"not a whole number of bytes: {text!r}")
    return int(value)


def parse_duration(text: str | int | float) -> float:
    """Seconds in a duration ("500ms", "3s", "20m", "1h"; a bare number is seconds)."""
    if isinstance(text, bool):
        raise ValueError(f"not a duration: {text!r}")
    if isinstance(text, (int, float)):
        if text < 0:
            raise ValueError(f"duration must not be negative: {text}")
        return float(text)
    m = _DURATION.match(str(text))
    if not m:
        raise ValueError(f"not a duration: {text!r} (write e.g. 500ms, 3s, 20m)")
    unit = m.group(2).lower() if m.group(2) else None
    return float(m.group(1)) * _SECONDS[unit]


def format_size(n: int) -> str:
    """The shortest exact binary form of a byte count: 4096 -> '4k', 1048576 -> '1m'."""
    for suffix, power in (("p", 5), ("t", 4), ("g", 3), ("m", 2), ("k", 1)):
        unit = 1024 ** power
        if n >= unit and n % unit == 0:
            return f"{n // unit}{suffix}"
    return str(n)


def format_bytes(n: float) -> str:
    """A human size with one decimal: 1536 -> '1.5 KiB'."""
    for suffix in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or suffix == "TiB":
            return f"{n:.0f} {suffix}" if suffix == "B" else f"{n:.1f} {suffix}"
        n /= 1024
    raise AssertionError("unreachable")


def fio_duration(seconds: float) -> str:
    """A duration in the form fio accepts: whole milliseconds."""
    return f"{int(round(seconds * 1000))}ms"
