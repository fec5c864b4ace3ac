"""Who is running: a process named so that it cannot be mistaken for another one later, and
whether such a process still lives.

A pid alone is not an identity: pids are reused. A process is (host, boot, pid, start time),
the start time being field 22 of ``/proc/PID/stat`` (clock ticks after boot), which a later
process with the same pid does not share. A live iomatrix run also holds an exclusive ``flock``
on a lock file of its own; the kernel drops it when the process dies, however it dies."""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from pathlib import Path
from typing import NamedTuple

PROC = Path("/proc")


class Identity(NamedTuple):
    """A process, as recorded with what it owns."""

    pid: int
    host: str
    boot_id: str
    start_ticks: int
    uid: int


def start_ticks(pid: int, proc: Path = PROC) -> int | None:
    """When process ``pid`` started (clock ticks after boot), or None when there is no such
    process (or it is a zombie: dead, only not reaped yet)."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except (OSError, ValueError):
        return None
    fields = stat[stat.rindex(")") + 2:].split()    # the name may hold spaces and parentheses
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])                          # field 22 of proc(5), counted after the name


def boot_id(proc: Path = PROC) -> str:
    """This boot of this kernel: after a reboot, pids and start times begin again."""
    try:
        return (proc / "sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def this_process() -> Identity:
    pid = os.getpid()
    return Identity(pid=pid, host=socket.gethostname(), boot_id=boot_id(),
                    start_ticks=start_ticks(pid) or 0, uid=os.geteuid())


def lock_held(path: str | os.PathLike[str]) -> bool:
    """Whether some open file holds an exclusive ``flock`` on ``path`` (a missing file, or one
    that cannot be opened, is not held). A symlink is not followed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)                                # releases our shared lock, if taken
    return False


class HeldLock:
    """An exclusive ``flock`` on a new file, held until ``release`` (or the process's end)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                                       | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


def liveness(owner: Identity, lock: str = "", *, me: Identity | None = None,
             proc: Path = PROC) -> tuple[bool, str]:
    """Whether ``owner`` still runs, and why it is judged so. Its lock held means alive; on this
    host and boot, alive means a process with its pid and its start time exists (the pid alone
    could be a newer process's). A process on another host cannot be seen from here: it counts
    as alive, so that nothing it may still use is touched."""
    me = me or this_process()
    if owner.host != me.host:
        return True, f"on host {owner.host} (cannot tell from {me.host} whether it still runs)"
    if lock and lock_held(lock):
        return True, "it holds its lock"
    if owner.boot_id and me.boot_id and owner.boot_id != me.boot_id:
        return False, "the host has rebooted since"
    now = start_ticks(owner.pid, proc)
    if now is None:
        return False, f"pid {owner.pid} is gone"
    if now != owner.start_ticks:
        return False, f"pid {owner.pid} is gone (a newer process has that pid now)"
    return True, f"pid {owner.pid} runs"
