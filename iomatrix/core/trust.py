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
from dataclasses import dataclass
from pathlib import Path

from iomatrix.core.dirs import MAX_SYMLINKS, distrust, walk
from iomatrix.core.errors import UnsafeDirectory, UntrustedFile


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
    """Who could have written the file ``path``: nobody but us when it and every directory
    above it pass ``distrust``; else its owner, or ``ANYONE`` when the directories let any
    other user swap it."""
    where = what or str(path)
    try:
        info = os.stat(path)
    except OSError:
        return Author(ANYONE, where)
    try:
        _check_chain(Path(os.path.abspath(path)))
    except UnsafeDirectory:
        owner = info.st_uid
        if owner in (0, os.geteuid()) or _dir_writable_by_others(Path(os.path.abspath(path))):
            return Author(ANYONE, where)
        return Author(owner, where)
    return Author(None, where)


def _dir_writable_by_others(path: Path) -> bool:
    """Whether a directory above ``path`` is one that other users (not only the file's owner)
    could write names into."""
    for parent in path.parents:
        try:
            info = os.stat(parent)
        except OSError:
            return True
        if info.st_mode & stat.S_IWOTH and not info.st_mode & stat.S_ISVTX:
            return True
    return False


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


def _check_chain(path: Path, depth: int = 0) -> os.stat_result:
    """Judge every directory to ``path`` and ``path`` itself (a symlink's target likewise)."""
    if depth > MAX_SYMLINKS:
        raise UnsafeDirectory(f"{path}: too many symlinks on the way (a loop?)")
    walked = walk(path.parent)
    try:
        if walked.missing:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path))
        fd = os.open(path.name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=walked.fd)
        try:
            info = os.fstat(fd)
            if stat.S_ISLNK(info.st_mode):
                target = os.readlink(path.name, dir_fd=walked.fd)
                return _check_chain(walked.real / target, depth + 1)
        finally:
            os.close(fd)
    finally:
        os.close(walked.fd)
    why = distrust(info)
    if why is not None:
        raise UnsafeDirectory(f"{path} {why}")
    return info


def readable_by(path: Path, author: Author) -> bool:
    """Whether ``author`` can already read the file ``path`` (and search every directory to it):
    always for us; for ``ANYONE``, by its mode bits for others; for a user, as the kernel would
    decide by owner, groups and mode bits (ACLs are not consulted: a file readable only through
    an ACL entry is judged unreadable, which refuses rather than discloses)."""
    if author.uid is None:
        return True
    real = Path(os.path.realpath(path))
    chain = [*reversed(real.parents), real]
    for i, part in enumerate(chain):
        try:
            info = os.stat(part)
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
