"""What is mounted where, as this process sees it (``/proc/self/mountinfo``)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import NamedTuple

MOUNTINFO = Path("/proc/self/mountinfo")
_OCTAL = re.compile(r"\\([0-7]{3})")


class Mount(NamedTuple):
    point: str
    fstype: str
    source: str
    device: str
    """major:minor of the mounted device."""


def mounts(mountinfo: Path = MOUNTINFO) -> list[Mount]:
    """Every mount; octal escapes in mount points decoded."""
    found = []
    for line in mountinfo.read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, rest = left.split(), right.split()
        if len(fields) >= 5 and len(rest) >= 2:
            point = _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), fields[4])
            found.append(Mount(point, rest[0], rest[1], fields[2]))
    return found


def fstype(path: str | os.PathLike[str]) -> str | None:
    """The filesystem type mounted at ``path``, or None when nothing is mounted there."""
    target = os.fspath(path)
    return next((m.fstype for m in mounts() if m.point == target), None)


def is_mounted(path: str | os.PathLike[str]) -> bool:
    """Whether something is mounted at exactly ``path``."""
    return fstype(path) is not None


def mount_of(path: str | os.PathLike[str], mountinfo: Path = MOUNTINFO) -> Mount | None:
    """The mount holding ``path`` (the longest mount point that contains it)."""
    real = os.path.realpath(path)
    best: Mount | None = None
    for m in mounts(mountinfo):
        inside = real == m.point or real.startswith(m.point.rstrip("/") + "/")
        if inside and (best is None or len(m.point) >= len(best.point)):
            best = m
    return best


def force_unmount(path: str | os.PathLike[str]) -> None:
    """Detach a FUSE mount left by a daemon that died before unmounting (fusermount3 -u -z,
    then umount -l); nothing when nothing is mounted there."""
    from iomatrix.core.proc import run, which

    for tool, flags in (("fusermount3", ["-u", "-z"]), ("umount", ["-l"])):
        found = which(tool)
        if is_mounted(path) and found:
            run([found, *flags, os.fspath(path)], timeout=10, check=False)
