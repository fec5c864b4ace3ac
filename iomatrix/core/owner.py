"""Who is running: a process named so that it cannot be mistaken for another one later, and
whether such a process still lives.

A pid alone is not an identity: pids are reused. A process is (host, boot, pid, start time),
the start time being field 22 of ``/proc/PID/stat`` (clock ticks after boot), which a later
process with the same pid does not share. A live iomatrix run also holds an exclusive ``flock``
on a lock file of its own; the kernel drops it when the process dies, however it dies. Any
user can hold a flock on a file of that name once the run's directory is gone, so a lock
counts only as the file the process made: its device and inode as recorded, its owner the
process's user, mode 0600 (``LockFile``)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import stat
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


class LockFile(NamedTuple):
    """A lock file as its process made it (``HeldLock``) and the store recorded it."""

    path: str
    dev: int
    ino: int
    uid: int
    """Its owner: the user the process ran as."""


def lock_held(lock: LockFile) -> bool:
    """Whether ``lock`` is still the file its process made (a regular file of that device and
    inode, owned by its user, mode 0600; a symlink is not followed) and some open file holds an
    exclusive ``flock`` on it. Anything else in its place is not held."""
    try:
        before = os.lstat(lock.path)
        if not _made(before, lock):        # looked at before opening: no FIFO or device is opened
            return False
        fd = os.open(lock.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if not _made(os.fstat(fd), lock):
            return False
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)                                # releases our shared lock, if taken
    return False


def _made(info: os.stat_result, lock: LockFile) -> bool:
    return (stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o600
            and info.st_uid == lock.uid and (info.st_dev, info.st_ino) == (lock.dev, lock.ino))


class HeldLock:
    """An exclusive ``flock`` on a new file (mode 0600), held until ``release`` (or the
    process's end). ``info`` is its status, for the record (``LockFile``)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                                       | os.O_CLOEXEC, 0o600)
        os.fchmod(self._fd, 0o600)              # whatever the umask
        fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self.info = os.fstat(self._fd)

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


def liveness(owner: Identity, lock: LockFile | None = None, *, me: Identity | None = None,
             proc: Path = PROC) -> tuple[bool, str]:
    """Whether ``owner`` still runs, and why it is judged so. Its lock held (``lock_held``)
    means alive; on this host and boot, alive means a process with its pid and its start time
    exists (the pid alone could be a newer process's). A process on another host cannot be seen
    from here: it counts as alive, so that nothing it may still use is touched."""
    me = me or this_process()
    if owner.host != me.host:
        return True, f"on host {owner.host} (cannot tell from {me.host} whether it still runs)"
    if lock is not None and lock_held(lock):
        return True, "it holds its lock"
    if owner.boot_id and me.boot_id and owner.boot_id != me.boot_id:
        return False, "the host has rebooted since"
    now = start_ticks(owner.pid, proc)
    if now is None:
        return False, f"pid {owner.pid} is gone"
    if now != owner.start_ticks:
        return False, f"pid {owner.pid} is gone (a newer process has that pid now)"
    return True, f"pid {owner.pid} runs"
