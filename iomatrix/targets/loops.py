"""Loop devices over files iomatrix created: attached with direct I/O, found again by their
backing file (after ``kill -9`` too: ``iomatrix.measure.reclaim``), detached.

A loop device is the kernel's, not a process's: one that iomatrix attached outlives it unless
it is detached or marked to detach itself when its last user closes it (autoclear, which
``losetup -d`` sets on a device that is still mounted). Which devices are iomatrix's is decided
by their backing file alone: a file inside a directory iomatrix created and recorded."""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

from iomatrix.core.errors import TargetError
from iomatrix.core.proc import require, run

SYS_BLOCK = Path("/sys/block")
_DELETED = " (deleted)"


class Loop(NamedTuple):
    device: str
    """/dev/loopN"""
    backing: str
    """The backing file's path as the kernel names it (without " (deleted)")."""
    deleted: bool
    direct_io: bool
    autoclear: bool


def loops(sys_block: Path = SYS_BLOCK) -> list[Loop]:
    """Every attached loop device."""
    found = []
    for entry in sorted(sys_block.glob("loop*")):
        try:
            backing = (entry / "loop/backing_file").read_text().rstrip("\n")
        except OSError:
            continue                    # not attached
        found.append(Loop(device=f"/dev/{entry.name}", backing=backing.removesuffix(_DELETED),
                          deleted=backing.endswith(_DELETED),
                          direct_io=_flag(entry / "loop/dio"),
                          autoclear=_flag(entry / "loop/autoclear")))
    return found


def _flag(path: Path) -> bool:
    try:
        return path.read_text().strip() == "1"
    except OSError:
        return False


def backed_in(directory: str | os.PathLike[str], sys_block: Path = SYS_BLOCK) -> list[Loop]:
    """The loop devices whose backing file is inside ``directory``."""
    inside = os.path.realpath(directory).rstrip("/") + "/"
    return [loop for loop in loops(sys_block) if loop.backing.startswith(inside)]


def attach(file: Path, made: os.stat_result, sys_block: Path = SYS_BLOCK) -> Loop:
    """A free loop device over ``file`` (which iomatrix created: ``made`` is its status), with
    direct I/O where the file's filesystem allows it, so that the loop device does not read and
    write through the host page cache. Checked afterwards to be backed by ``file`` and nothing
    else: its path as the kernel names it, its device and inode as ``made``."""
    losetup = require("losetup", hint="install it: apt-get install mount")
    done = run([losetup, "--find", "--show", "--direct-io=on", str(file)], timeout=60)
    device = done.stdout.strip()
    real = os.path.realpath(file)
    loop = next((lo for lo in loops(sys_block) if lo.device == device), None)
    if loop is None or loop.backing != real:
        raise TargetError(f"losetup attached {file} as {device!r}, but the kernel shows "
                          f"{loop.backing if loop else 'no such loop device'} behind it")
    shown = run([losetup, "--list", "--noheadings", "--raw", "--output", "BACK-INO,BACK-MAJ:MIN",
                 device], timeout=60).stdout.replace("\\x20", " ").split()
    expected = [str(made.st_ino), f"{os.major(made.st_dev)}:{os.minor(made.st_dev)}"]
    if shown != expected:
        raise TargetError(f"losetup attached {device} to inode {' on '.join(shown) or '?'}, "
                          f"not to the file iomatrix made ({' on '.join(expected)})")
    return loop


def detach(device: str) -> None:
    """Detach a loop device (one still in use, e.g. mounted, detaches itself when its last
    user closes it)."""
    losetup = require("losetup", hint="install it: apt-get install mount")
    run([losetup, "-d", device], timeout=60, check=False)
