"""Sizes and durations as people write them in suites ("8GiB", "4k", "500ms", "20m"), and sizes
as fio reads them in job files and in the job options of its results: one grammar, two meanings.

A suite's own sizes are binary whatever the spelling (4k = 4KiB = 4096). fio's text means what
fio makes of it (parse.c ``str_to_decimal`` and ``__get_mult_bytes``; fio 3.33 and 3.39 alike,
``fio --debug=parse``): under its default ``kb_base=1024``, k, kb and K are 1024 but kib is 1000,
fio swapping the IEC prefixes "for compatibility"; ``kb_base=1000`` swaps them back (k = 1000,
kib = 1024)."""

from __future__ import annotations

import re

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)(i?)(b?)\s*$", re.IGNORECASE)
_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5}
_FIO_HEX = re.compile(r"0[xX][0-9a-fA-F]{1,16}")
_OTHER_BASE = {1024: 1000, 1000: 1024}
"""fio's kb_base → what an IEC unit (kib, mib...) multiplies by under it."""
_FIO_MAX = 1 << 63
"""fio reads sizes into a signed 64-bit number."""
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$", re.IGNORECASE)
_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_size(text: str | int) -> int:
    """Bytes in a suite's size; suffixes are binary whatever the spelling (4k = 4KiB = 4096,
    1G = 1GiB = 2**30)."""
    if isinstance(text, bool):
        raise ValueError(f"not a size: {text!r}")
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"size must not be negative: {text}")
        return text
    return _bytes(str(text), kb_base=None)


def fio_size(text: str, *, kb_base: int = 1024) -> int:
    """Bytes in a size as fio reads it under ``kb_base`` (1024, fio's default, or 1000); 0x… is
    hexadecimal. Raises ValueError for a form fio reads otherwise than it looks: a fraction
    (fio reads 1.5k as 1) or a blank (4 k is 4 to fio)."""
    if kb_base not in _OTHER_BASE:
        raise ValueError(f"kb_base={kb_base}: fio takes 1024 or 1000")
    try:
        if _FIO_HEX.fullmatch(text):
            size = int(text, 16)
        elif re.search(r"[\s.]", text) or not text.isascii():
            raise ValueError
        else:
            size = _bytes(text, kb_base=kb_base)
    except ValueError:
        raise ValueError(f"{text!r} is not a size fio and iomatrix read alike (write e.g. "
                         "4096, 4k or 64k)") from None
    if size >= _FIO_MAX:
        raise ValueError(f"{text!r} is beyond the sizes fio reads")
    return size


def _bytes(text: str, *, kb_base: int | None) -> int:
    """The one size grammar: a number and an optional k/m/g/t/p unit (i and b optional),
    binary for a suite (``kb_base`` None), as fio reads it otherwise."""
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"not a size: {text!r} (write e.g. 4k, 512, 8GiB)")
    unit, iec = m.group(2).lower(), bool(m.group(3) and m.group(4))    # fio: 4ki is 4k
    base = 1024 if kb_base is None else _OTHER_BASE[kb_base] if iec else kb_base
    if kb_base is not None:         # fio's: whole digits (fio_size refuses a fraction)
        return int(m.group(1)) * base ** _POWERS[unit]
    value = float(m.group(1)) * base ** _POWERS[unit]
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
        try:
            return float(text)
        except OverflowError:               # an int beyond any double
            raise ValueError("not a duration (too long)") from None
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
