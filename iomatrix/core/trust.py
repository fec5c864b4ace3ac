"""Rule 1: which files named by untrusted input root may hand to another program.

A suite, an inventory, a database row, an image header and a guest's console are written by
whoever wrote them, not by the user who runs iomatrix (often root). When such input names a
path or a program that iomatrix hands to another program running with its privileges (ssh's
identity and known_hosts, librados' keyring, QEMU's image, kernel and initrd, a backing or data
file), the name is used only if nobody but the invoking user could have chosen what it points
to: the file is owned by root or by the invoking user and writable by nobody else, and so is
every directory from ``/`` to it (``iomatrix.core.dirs.distrust``; symlinks on the way are
judged as the directories holding them). That is the CHAP file's rule, generalised.

A second rule holds for a file whose contents reach the input's author (a guest reads its
image, kernel and initrd; what the guest prints is stored and shown): the author must be able to
read it already (``readable_by``), so that a suite never makes root read ``/etc/shadow`` for
its author. ``author_of`` says who could have written an input file: nobody but us, one other
user, or anyone.

Refusals are ``UntrustedFile`` (a ``SuiteError``: exit status 3), one line naming the key, the
file and why."""

from __future__ import annotations

import errno
import os
import pwd
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from iomatrix.core.dirs import MAX_SYMLINKS, distrust, posix_acl, refuse_planted, walk
from iomatrix.core.errors import UnsafeDirectory, UntrustedFile
from iomatrix.core.files import file_kind, read_at_most


ANYONE = -1
"""``Author.uid`` of input that any user could have written (a world-writable directory, a
shared database)."""


@dataclass(frozen=True)
class Author:
    """Who could have written an input: ``uid`` None when nobody but root or the invoking user
    could have; else that user's uid, or ``ANYONE``."""

    uid: int | None
    where: str = ""
    """The input, as a refusal names it (``suite /home/bob/x.toml``)."""

    @property
    def trusted(self) -> bool:
        return self.uid is None


US = Author(None, "the command line")
"""Input the invoking user gave (the command line, their own files)."""


def author_of(path: Path, what: str = "") -> Author:
    """Who could have written the file ``path`` (``open_authored``); ``ANYONE`` when it cannot
    be reached. To read the file too, use ``read_authored``: the author of what was read."""
    try:
        fd, author = open_authored(path, what)
    except OSError:
        return Author(ANYONE, what or str(path))
    os.close(fd)
    return author


def open_authored(path: Path, what: str = "") -> tuple[int, Author]:
    """An ``O_PATH`` descriptor of the file ``path`` leads to (the caller closes it), and who
    could have written what it holds, judged from that descriptor: nobody but us when it and
    every directory to it pass ``distrust`` (``_open_chain``); else its owner when nobody else
    but root or us could have changed what the path leads to (``_sole_writer``), or ``ANYONE``.
    OSError when it cannot be reached."""
    where, absolute = what or str(path), Path(os.path.abspath(path))
    try:
        return _open_chain(absolute), Author(None, where)
    except UnsafeDirectory:
        pass
    fd = os.open(absolute, os.O_PATH | os.O_CLOEXEC)
    try:
        owner = os.fstat(fd).st_uid
        real = Path(os.readlink(f"/proc/self/fd/{fd}"))
        if owner in (0, os.geteuid()) or not _sole_writer((absolute, real), owner):
            return fd, Author(ANYONE, where)
    except BaseException:
        os.close(fd)
        raise
    return fd, Author(owner, where)


def _sole_writer(paths: tuple[Path, ...], owner: int) -> bool:
    """Whether nobody but root, us and ``owner`` could have changed where ``paths`` lead: every
    directory above them and each symlink on the way is one of theirs, and no directory but a
    sticky one (as /tmp: only a name's owner moves it) may be written by a group (nor through an
    ACL: its mask is the group's bits) or by every user."""
    seen = [p for path in paths for p in (path, *path.parents)]
    for place in dict.fromkeys(seen):
        try:
            info = os.lstat(place)
        except OSError:
            return False
        if place in paths and not stat.S_ISLNK(info.st_mode):
            continue                                    # the file itself: its owner wrote it
        if info.st_uid not in (0, os.geteuid(), owner):
            return False
        mode = info.st_mode
        if stat.S_ISDIR(mode) and mode & (stat.S_IWGRP | stat.S_IWOTH) \
                and not mode & stat.S_ISVTX:
            return False
    return True


def read_authored(path: Path, what: str, *, max_bytes: int,
                  error: Callable[[str], Exception]) -> tuple[bytes, Author]:
    """The bytes of the regular file ``path`` and who could have written them
    (``open_authored``), both of one descriptor: a file swapped in between is neither read nor
    judged. A FIFO or device is never opened for reading; ``error(why)`` is raised when it is
    not a regular file, holds more than ``max_bytes``, or cannot be read."""
    try:
        held, author = open_authored(path, what)
    except OSError as exc:
        raise error(exc.strerror or str(exc)) from None
    try:
        info = os.fstat(held)
        if not stat.S_ISREG(info.st_mode):
            raise error(f"{file_kind(info.st_mode)}, not a regular file")
        fd = os.open(f"/proc/self/fd/{held}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            data = read_at_most(fd, max_bytes)
        finally:
            os.close(fd)
    except OSError as exc:
        raise error(exc.strerror or str(exc)) from None
    finally:
        os.close(held)
    if len(data) > max_bytes:
        raise error(f"larger than {max_bytes} bytes")
    return data, author


def chosen_by_us(path: str | Path, key: str, program: str) -> Path:
    """``path`` as it was given, once it passes rule 1 (module docstring): the file and every
    directory on the way owned by root or the invoking user and writable by nobody else.
    ``UntrustedFile`` in one line naming ``key``, the file and why; ``program`` is what it would
    be handed to (``ssh``, ``QEMU``)."""
    given = Path(path)
    if not given.is_absolute() or "\0" in str(given):
        raise UntrustedFile(f"{key}: {str(given)!r} is not an absolute path")
    try:
        _check_chain(given)
    except UnsafeDirectory as exc:
        raise UntrustedFile(f"{key}: {exc}: another user could choose what {program} reads "
                            "there") from None
    except FileNotFoundError:
        raise UntrustedFile(f"{key}: {given} does not exist") from None
    except OSError as exc:
        raise UntrustedFile(f"{key}: {given}: {exc.strerror}") from None
    return given


def private_file(path: str | Path, key: str, program: str) -> Path:
    """A file of secrets named by input (a Ceph keyring, an iSCSI CHAP file), as ``path`` was
    given, once it passes rule 1 (``chosen_by_us``) and is a regular file that no user but its
    owner may read or write (``mode & 0o077 == 0``): what it holds is a key.
    ``UntrustedFile`` in one line naming ``key``, the file and why."""
    given = chosen_by_us(path, key, program)
    try:
        info = os.stat(given)
    except OSError as exc:
        raise UntrustedFile(f"{key}: {given}: {exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise UntrustedFile(f"{key}: {given} is not a regular file")
    if info.st_mode & 0o077:
        raise UntrustedFile(f"{key}: {given} can be read or written by other users (mode "
                            f"{stat.S_IMODE(info.st_mode):04o}), and it holds a key",
                            hint=f"chmod 600 {given}")
    return given


def _check_chain(path: Path) -> None:
    """Judge every directory to ``path`` and ``path`` itself (``_open_chain``)."""
    os.close(_open_chain(path))


def _open_chain(path: Path, depth: int = 0) -> int:
    """An ``O_PATH`` descriptor of the file ``path`` leads to, once every directory to it and the
    file itself pass ``distrust`` (a symlink's target likewise, a symlink in a sticky shared
    directory only if root or we made it: ``refuse_planted``, as ``walk`` does on the way).
    UnsafeDirectory otherwise, OSError when it cannot be reached; the caller closes it."""
    if depth > MAX_SYMLINKS:
        raise UnsafeDirectory(f"{path}: too many symlinks on the way (a loop?)")
    walked = walk(path.parent)
    try:
        if walked.missing:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path))
        fd = os.open(path.name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=walked.fd)
        try:
            info = os.fstat(fd)
            why = None if stat.S_ISLNK(info.st_mode) else distrust(info, fd)
            if why is not None:
                raise UnsafeDirectory(f"{path} {why}")
            if stat.S_ISLNK(info.st_mode):
                refuse_planted(os.fstat(walked.fd), info, walked.real / path.name)
                target = os.readlink(path.name, dir_fd=walked.fd)
        except BaseException:
            os.close(fd)
            raise
    finally:
        os.close(walked.fd)
    if not stat.S_ISLNK(info.st_mode):
        return fd
    os.close(fd)
    return _open_chain(walked.real / target, depth + 1)


def readable_by(path: Path, author: Author) -> bool:
    """Whether ``author`` can already read the file ``path`` (and search every directory to it):
    always for us; for ``ANYONE``, by its mode bits for others; for a user, as the kernel would
    decide by owner, groups and mode bits. A file or directory on the way with an ACL is judged
    unreadable (its entries may deny a user what its mode bits allow, or grant what they do
    not): that refuses rather than discloses."""
    if author.uid is None:
        return True
    real = Path(os.path.realpath(path))
    chain = [*reversed(real.parents), real]
    for i, part in enumerate(chain):
        try:
            info = os.stat(part)
            if author.uid != 0 and posix_acl(part):
                return False
        except OSError:
            return False
        want = stat.S_IROTH if i == len(chain) - 1 else stat.S_IXOTH
        if not _permits(info, author.uid, want):
            return False
    return True


def _permits(info: os.stat_result, uid: int, other_bit: int) -> bool:
    """Whether ``uid`` has the permission whose bit for others is ``other_bit``."""
    mode = info.st_mode
    if uid == ANYONE:
        return bool(mode & other_bit)
    if uid == 0:
        return True
    if info.st_uid == uid:
        return bool(mode & (other_bit << 6))
    if info.st_gid in _groups(uid):
        return bool(mode & (other_bit << 3))
    return bool(mode & other_bit)


def _groups(uid: int) -> set[int]:
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        return set()
    return set(os.getgrouplist(entry.pw_name, entry.pw_gid))


def readable_for(path: str | Path, key: str, author: Author) -> None:
    """``UntrustedFile`` unless ``author`` can already read ``path`` (``readable_by``): what the
    guest reads from it may reach them."""
    if not readable_by(Path(path), author):
        who = "every user" if author.uid == ANYONE else _name(author.uid)
        raise UntrustedFile(f"{key}: {path} is not readable by {who}, who wrote "
                            f"{author.where or 'the input'}: the guest would show them its "
                            "contents", hint="give a file its author may read, or name it on "
                                             "the command line")


def _name(uid: int | None) -> str:
    try:
        return f"{pwd.getpwuid(uid or 0).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"
