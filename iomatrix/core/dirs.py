"""Directories nobody else controls: where iomatrix, usually as root, creates and writes files.

Who may write to a directory decides what its names point to; its owner decides who may write
to it. A directory iomatrix writes into is therefore trusted only when every directory on the
way from ``/`` is owned by root or by the user iomatrix runs as, and writable by nobody else;
otherwise another user could rename a directory during a run and put a symlink where an image
is about to be opened, and root would write into whatever it points to. One exception: a
sticky world-writable directory owned by root (``/tmp``, ``/var/tmp``), where anyone may create
names but only a name's owner may rename or remove it. There only what root (or iomatrix's user)
owns is used, and iomatrix creates its own directories exclusively (``make_private``), never
taking one that another user made first. A symlink on the way is followed: it is as trusted as
the directory that holds it (in a sticky directory, as its owner).

The walk opens each directory relative to the one before, without following a symlink it has
not judged, and hands back a descriptor of the deepest: what iomatrix creates there is created
relative to it (``O_NOFOLLOW``, ``O_EXCL``), so that no rename elsewhere redirects it."""

from __future__ import annotations

import contextlib
import errno
import functools
import grp
import os
import pwd
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from iomatrix.core.errors import EnvironmentProblem, UnsafeDirectory
from iomatrix.core.proc import signals_deferred

MAX_SYMLINKS = 40
"""As the kernel: more symlinks than this on one path is a loop."""
_OPEN = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


def _owner(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _group(gid: int) -> str:
    try:
        return f"{grp.getgrgid(gid).gr_name} (gid {gid})"
    except KeyError:
        return f"gid {gid}"


def _trusted_uids() -> tuple[int, ...]:
    return (0, os.geteuid())


def distrust(info: os.stat_result, fd: int) -> str | None:
    """Why another user controls a directory (or file) with this status, open as ``fd`` (an
    ``O_PATH`` descriptor will do): "is owned by ...", "is writable by ...", "has an ACL that
    may let other users write" (with an ACL, the group's mode bits are its mask: what its
    entries for other users and groups may grant at most), or "is in procfs" (whose links, such
    as /proc/PID/root, lead where the kernel says, not where their text does); None when only
    root or iomatrix's user does."""
    me = os.geteuid()
    if info.st_dev in _procfs():
        return "is in procfs, whose links lead where the kernel says, not where their text does"
    if info.st_uid not in _trusted_uids():
        return f"is owned by {_owner(info.st_uid)}, not root" + (f" or {_owner(me)}" if me else "")
    mode = info.st_mode
    if mode & stat.S_IWOTH and not (mode & stat.S_ISVTX and info.st_uid == 0):
        return f"is writable by every user, mode {stat.S_IMODE(mode):04o}"
    groups = (0,) if me == 0 else (0, os.getegid())
    if mode & stat.S_IWGRP and info.st_gid not in groups:
        return f"is writable by group {_group(info.st_gid)}, mode {stat.S_IMODE(mode):04o}"
    if mode & stat.S_IWGRP and posix_acl(fd):
        return f"has an ACL that may let other users write (mode {stat.S_IMODE(mode):04o})"
    return None


def posix_acl(file: int | Path) -> bool:
    """Whether ``file`` (an open descriptor, ``O_PATH`` too, or a path without symlinks) has a
    POSIX access ACL: entries for users or groups beyond its owner, group and others (the
    kernel keeps none for an ACL its mode bits say whole). OSError when it cannot be asked."""
    where = f"/proc/self/fd/{file}" if isinstance(file, int) else file
    try:
        os.getxattr(where, "system.posix_acl_access")
    except OSError as exc:
        if exc.errno in (errno.ENODATA, errno.EOPNOTSUPP):
            return False
        raise
    return True


@functools.cache
def _procfs() -> frozenset[int]:
    """The devices (``st_dev``) of the procfs mounts this process sees (none without /proc)."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as file:
            lines = file.read().splitlines()
    except OSError:
        return frozenset()
    devices = set()
    for line in lines:
        fields, _, rest = line.partition(" - ")
        numbers = fields.split()[2:3]
        if rest.split()[:1] == ["proc"] and numbers and numbers[0].count(":") == 1:
            major, minor = numbers[0].split(":")
            devices.add(os.makedev(int(major), int(minor)))
    return frozenset(devices)


def sticky_shared(info: os.stat_result) -> bool:
    """A directory anyone may create names in, whose names only their owners may move."""
    return bool(info.st_mode & stat.S_IWOTH and info.st_mode & stat.S_ISVTX)


def refuse_planted(directory: os.stat_result, link: os.stat_result, path: Path) -> None:
    """UnsafeDirectory when the symlink ``path`` (status ``link``) lies in a directory (status
    ``directory``) where every user may create names (``sticky_shared``, as /tmp) and neither
    root nor iomatrix's user made it: whoever did may point it anywhere at any time, so it is
    never followed (as the kernel's fs.protected_symlinks would not, were it on)."""
    if sticky_shared(directory) and link.st_uid not in _trusted_uids():
        raise UnsafeDirectory(f"{path} is a symlink that {_owner(link.st_uid)} made in "
                              f"{path.parent}, which every user may write to")


class Walked(NamedTuple):
    """The deepest existing directory of a path, held open, and what is missing below it."""

    fd: int
    """An ``O_PATH`` descriptor of the directory: give it as ``dir_fd``; the caller closes it."""
    real: Path
    """The directory's path with every symlink resolved (as the walk found it)."""
    missing: tuple[str, ...]
    """The names below it that do not exist yet, outermost first."""


def walk(path: Path) -> Walked:
    """Open ``path`` (or its deepest existing ancestor) as described in the module's docstring.
    ``UnsafeDirectory`` naming the first directory on the way that another user controls;
    ``NotADirectoryError`` (its filename: which) for a name on the way that is not a directory,
    other ``OSError`` for a directory that cannot be opened."""
    walker = _Walker(Path(os.path.abspath(path)))
    try:
        return walker.walk()
    except BaseException:
        os.close(walker.fd)
        raise


class _Walker:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = os.open("/", _OPEN | os.O_DIRECTORY)

    def _move(self, fd: int) -> None:
        os.close(self.fd)
        self.fd = fd

    def walk(self) -> Walked:
        path = self.path
        real: list[str] = []
        names = list(path.parts[1:])
        info = _judged(self.fd, Path("/"))
        links = 0
        while names:
            name = names.pop(0)
            here = Path("/", *real)
            if name == "..":
                if real:
                    real.pop()
                    self._move(os.open("..", _OPEN | os.O_DIRECTORY, dir_fd=self.fd))
                    info = os.fstat(self.fd)
                continue
            try:
                child = os.open(name, _OPEN, dir_fd=self.fd)
            except FileNotFoundError:
                return Walked(self.fd, here, (name, *names))
            child_info = os.fstat(child)
            if stat.S_ISLNK(child_info.st_mode):
                try:
                    refuse_planted(info, child_info, here / name)
                    links += 1
                    if links > MAX_SYMLINKS:
                        raise UnsafeDirectory(f"{path}: too many symlinks on the way (a loop?)")
                    target = os.readlink(name, dir_fd=self.fd)
                finally:
                    os.close(child)
                if target.startswith("/"):
                    self._move(os.open("/", _OPEN | os.O_DIRECTORY))
                    real = []
                    info = os.fstat(self.fd)
                names = [*Path(target).parts[1 if target.startswith("/") else 0:], *names]
                continue
            self._move(child)
            if not stat.S_ISDIR(child_info.st_mode):
                raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(here / name))
            real.append(name)
            info = _judged(self.fd, Path("/", *real))
        return Walked(self.fd, Path("/", *real), ())


def walk_tmpdir() -> Walked:
    """``walk`` of ``$TMPDIR`` (``tempfile.gettempdir()``), which must exist: EnvironmentProblem
    in one line, with the fix, when another user controls it (as under ``sudo -E``)."""
    given = Path(tempfile.gettempdir())
    try:
        walked = walk(given)
    except UnsafeDirectory as exc:
        raise EnvironmentProblem(f"TMPDIR {given}: {exc}: another user could redirect the "
                                 "files iomatrix makes there (sockets, job files, probes)", hint="set TMPDIR to a "
                                 "directory only root (or you) can write to, e.g. /tmp") from exc
    if walked.missing:
        os.close(walked.fd)
        raise EnvironmentProblem(f"TMPDIR {given}: {walked.real / walked.missing[0]} does not "
                                 "exist", hint="set TMPDIR to an existing directory")
    return walked


@contextlib.contextmanager
def private_tempdir(prefix: str, parent: Path | None = None) -> Iterator[Path]:
    """A new directory (0700, ``tempfile.mkdtemp``) in ``parent`` (default ``$TMPDIR``: see
    ``walk_tmpdir``), made only once nobody else controls ``parent`` (``walk``:
    ``UnsafeDirectory`` otherwise), and removed with what it holds afterwards. Since then no
    other user can rename it or a directory above it, what is made in it by path stays in it."""
    walked = walk_tmpdir() if parent is None else walk(parent)
    os.close(walked.fd)
    if walked.missing:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT),
                                str(walked.real / walked.missing[0]))
    with tempfile.TemporaryDirectory(prefix=prefix, dir=walked.real) as made:
        yield Path(made)


def _judged(fd: int, directory: Path) -> os.stat_result:
    info = os.fstat(fd)
    why = distrust(info, fd)
    if why is not None:
        raise UnsafeDirectory(f"{directory} {why}")
    return info


def make_private(parent_fd: int, parent: Path, name: str, *, reuse: bool,
                 marker: str | None = None) -> tuple[int, bool]:
    """Create directory ``name`` (mode 0700) in ``parent`` (open as ``parent_fd``), with its
    ``marker`` written in it, and open it: (an ``O_PATH`` descriptor, whether it was created
    now). Ctrl-C and the like wait until it is marked: iomatrix never leaves a directory it made
    unmarked, unless killed outright. With ``reuse``, an existing one is opened instead, and
    taken only when nobody else controls it (``distrust``: ``UnsafeDirectory`` otherwise);
    without, ``FileExistsError``."""
    with signals_deferred():
        created = True
        try:
            os.mkdir(name, 0o700, dir_fd=parent_fd)
        except FileExistsError:
            if not reuse:
                raise
            created = False
        try:
            fd = os.open(name, _OPEN | os.O_DIRECTORY, dir_fd=parent_fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise UnsafeDirectory(f"{parent / name} is not a directory (a symlink or a file "
                                      "took its place)") from exc
            raise
        try:
            _judged(fd, parent / name)
            if created and marker is not None:
                write_marker(fd, marker)
        except BaseException:
            os.close(fd)
            raise
    return fd, created


def same_file(a: os.stat_result, b: os.stat_result) -> bool:
    """Whether two statuses are of one file (device and inode)."""
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


MARKER = ".iomatrix"
"""The file iomatrix writes in each directory it makes, saying what it made it for: a directory
is removed only while it carries it (``iomatrix.measure.reclaim``)."""
MARKER_MAX = 4096


def parent_marker(path: Path) -> str:
    """The marker of a target directory (or a parent of one) that iomatrix made at ``path``."""
    return f"made by iomatrix: target directory {path}\n"


def write_marker(dir_fd: int, text: str) -> None:
    """Write ``MARKER`` (mode 0600) holding ``text`` into the directory ``dir_fd``, exclusively."""
    fd = os.open(MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600, dir_fd=dir_fd)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def read_marker(dir_fd: int) -> str | None:
    """The text of the ``MARKER`` in the directory ``dir_fd``: None unless it is a regular file
    (not a symlink) owned by the user iomatrix runs as, which only that user (or root) can have
    written in a directory of that user's."""
    try:
        fd = os.open(MARKER, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=dir_fd)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
            return None
        return os.read(fd, MARKER_MAX).decode(errors="replace")
    finally:
        os.close(fd)


def remove_empty(parent_fd: int, name: str, marker: str) -> str | None:
    """Remove the directory ``name`` of ``parent_fd`` if it holds nothing but its ``MARKER``
    reading ``marker``: None once removed, else why not. If something is put in it meanwhile,
    it keeps its marker. Several runs may try at once (runs sharing a target directory, on one
    host or on cluster nodes over shared storage): one removes it, the others are told why not."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                     dir_fd=parent_fd)
    except OSError as exc:
        return f"cannot open it: {exc.strerror}"
    try:
        entries = os.listdir(fd)
        if entries and entries != [MARKER]:
            return "not empty"
        if read_marker(fd) != marker:
            return f"it does not carry iomatrix's marker ({MARKER}) for it"
        with signals_deferred():            # never left unmarked by a Ctrl-C in between
            try:
                os.unlink(MARKER, dir_fd=fd)
            except FileNotFoundError:       # another run over it (another node of a shared
                return "another iomatrix is removing it"   # target) took it first
            try:
                os.rmdir(name, dir_fd=parent_fd)
            except OSError as exc:
                with contextlib.suppress(OSError):
                    write_marker(fd, marker)
                return ("not empty" if exc.errno == errno.ENOTEMPTY
                        else f"cannot remove: {exc.strerror}")
        return None
    finally:
        os.close(fd)
