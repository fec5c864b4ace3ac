"""What is mounted where, as this process sees it (``/proc/self/mountinfo``)."""

from __future__ import annotations

import ctypes
import errno
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


def root_is_a_mount(mountinfo: Path = MOUNTINFO) -> bool:
    """Whether this process's root directory is the root of a mount: not so in a chroot into a
    plain directory, where ``mount --make-rprivate /`` is refused and a mount made inside
    cannot be kept from propagating to the namespace the chroot's directory belongs to."""
    return any(m.point == "/" for m in mounts(mountinfo))


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


CLONE_NEWNS = 0x00020000
NOT_A_MOUNT = ("the root directory is not a mount point here (a chroot into a plain directory): "
               "mounts made in it could not be kept private; run iomatrix from a root that is "
               "one (pivot_root, or the chroot's directory bind-mounted onto itself)")


class PrivateMounts:
    """The calling thread in a mount namespace of its own, from ``enter`` to ``leave``: what it
    and the processes it starts mount there is seen by no other process and propagates nowhere
    (every mount in it is made private), and the kernel unmounts it when the last process in
    the namespace ends, even when iomatrix is killed outright. ``leave`` returns the thread to
    the namespace it came from, with the root and working directory it had before ``enter``
    (``setns`` into a mount namespace moves both to that namespace's root: a relative path
    would then resolve from ``/``, and inside a chroot from the host's root); processes started
    meanwhile stay in the private one. Needs CAP_SYS_ADMIN (root); OSError otherwise."""

    def __init__(self) -> None:
        self._home: int | None = None
        self._root: int | None = None
        self._cwd: int | None = None

    @property
    def active(self) -> bool:
        return self._home is not None

    def enter(self) -> None:
        """Move into a new private mount namespace (nothing when already in one)."""
        if self._home is not None:
            return
        from iomatrix.core.proc import require, run

        mount = require("mount")
        if not root_is_a_mount():
            raise OSError(errno.EINVAL, NOT_A_MOUNT)
        libc = ctypes.CDLL(None, use_errno=True)
        # opened here, in the home namespace: the same paths in the private one are its copies
        where = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
        opened = [os.open("/proc/thread-self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)]
        try:
            opened += [os.open("/", where), os.open(".", where)]
            if libc.unshare(CLONE_NEWNS) != 0:
                code = ctypes.get_errno()
                raise OSError(code, f"unshare(CLONE_NEWNS): {os.strerror(code)}")
        except BaseException:
            for fd in opened:
                os.close(fd)
            raise
        self._home, self._root, self._cwd = opened
        try:
            # a copy of a shared mount would still pass mounts made below it back to the host
            run([mount, "--make-rprivate", "/"], timeout=30)
        except BaseException:
            self.leave()
            raise

    def leave(self) -> None:
        """Back to the namespace, root and working directory ``enter`` left (nothing when not
        in one)."""
        if self._home is None:
            return
        libc = ctypes.CDLL(None, use_errno=True)
        home, root, cwd = self._home, self._root, self._cwd
        self._home = self._root = self._cwd = None
        try:
            if libc.setns(home, CLONE_NEWNS) != 0:
                code = ctypes.get_errno()
                raise OSError(code, f"setns back to the host's mount namespace: "
                                    f"{os.strerror(code)}")
            assert root is not None and cwd is not None
            os.fchdir(root)
            os.chroot(".")
            os.fchdir(cwd)
        finally:
            for fd in (home, root, cwd):
                if fd is not None:
                    os.close(fd)
