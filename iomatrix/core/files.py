"""Writing files where other local users may have planted something first, reading a file a
suite names beside itself without being led out of the suite's directory, and reading a file only
its owner could have written."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from pathlib import Path

from iomatrix.core.dirs import distrust, walk
from iomatrix.core.errors import OutputRefused, SuiteError, UnsafeDirectory


def write_file_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` (a regular file, replaced, or a new name in an existing
    directory) through a new temporary file in the same directory, renamed over ``path``: a
    planted temporary name is never written through, and the directory is held open, so a rename
    of it or of its parents in between does not move the file elsewhere. Anything else at
    ``path`` (a directory, FIFO, device, socket or symbolic link), a missing directory, or a
    failed write is OutputRefused in one line. The file gets the usual mode for new files (0666
    less the umask). A directory on the way that another user controls is refused too
    (:func:`iomatrix.core.dirs.walk`): they could swap it for a symlink to where root would
    write instead."""
    try:
        walked = walk(path.parent)
    except UnsafeDirectory as exc:
        raise OutputRefused(f"{path}: {exc}: {_REDIRECT}", hint=_TRUSTED) from None
    except OSError as exc:
        raise OutputRefused(f"{path}: no directory {path.parent} to write it in"
                            + ("" if exc.errno == errno.ENOENT else f" ({os.strerror(exc.errno)})")
                            ) from None
    directory = walked.fd
    try:
        if walked.missing:
            raise OutputRefused(f"{path}: no directory {path.parent} to write it in")
        if path.name in ("", ".", ".."):
            raise OutputRefused(f"{path}: a directory, {_ONLY}")
        with contextlib.suppress(FileNotFoundError):
            found = os.stat(path.name, dir_fd=directory, follow_symlinks=False)
            if not stat.S_ISREG(found.st_mode):
                raise OutputRefused(f"{path}: {file_kind(found.st_mode)}, {_ONLY}")
        tmp = f".{path.name[:200]}.{secrets.token_hex(4)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o666, dir_fd=directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
            os.replace(tmp, path.name, src_dir_fd=directory, dst_dir_fd=directory)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=directory)
            raise
    except OSError as exc:
        raise OutputRefused(f"{path}: cannot write it: {exc.strerror or exc}") from None
    finally:
        os.close(directory)


_ONLY = "where iomatrix writes only a regular file (replacing it) or a new name"
_REDIRECT = "another user could redirect what iomatrix writes there"
_TRUSTED = "write it into a directory only root (or you) can write to, and whose parents are so too"


def output_directory(path: Path) -> Path:
    """``path`` made a directory to write into (with its parents) unless it is one already;
    OutputRefused in one line when something else has its name, another user controls it or a
    directory above it (:func:`iomatrix.core.dirs.walk`), or it cannot be made."""
    try:
        os.close(walk(path).fd)
    except UnsafeDirectory as exc:
        raise OutputRefused(f"{path}: {exc}: {_REDIRECT}", hint=_TRUSTED) from None
    except OSError:
        pass                             # said below
    with contextlib.suppress(OSError):
        found = os.stat(path)
        if not stat.S_ISDIR(found.st_mode):
            raise OutputRefused(f"{path}: {file_kind(found.st_mode)}, not a directory to "
                                "write into")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputRefused(f"{path}: cannot make the directory: {exc.strerror}") from None
    return path


def file_kind(mode: int) -> str:
    """What a file of this ``st_mode`` is, in a few words ("a FIFO (named pipe)")."""
    for test, kind in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "not a regular file"


def read_beside(directory: Path, name: str, where: str, *, max_bytes: int, what: str) -> str:
    """The UTF-8 text of the file ``name`` in ``directory`` (a suite file's: its job files, the
    VM definition it starts from), at most ``max_bytes``. Where it leads is checked before it is
    opened (a device or FIFO is never opened) and again on the open file, so a link swapped in
    between does not lead out either; SuiteError, in one line starting with ``where``, for
    anything else. ``what`` names such files in the messages ("job files")."""
    home = os.path.realpath(directory)

    def within(real: str) -> str:
        if os.path.commonpath([home, real]) != home:
            raise SuiteError(f"{where}: it leads out of the suite's directory: it leads to "
                             f"{real}, outside the suite file's directory {home} (a symbolic "
                             f"link), where {what} must lie")
        return real
    try:
        path = within(os.path.realpath(os.path.join(home, name)))
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise SuiteError(f"{where}: not a regular file")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise SuiteError(f"{where}: cannot open it in {home}: {exc.strerror}") from None
    try:
        within(os.readlink(f"/proc/self/fd/{fd}"))
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SuiteError(f"{where}: not a regular file")
        data = read_at_most(fd, max_bytes)
        if max(info.st_size, len(data)) > max_bytes:
            raise SuiteError(f"{where}: {max(info.st_size, len(data))} bytes or more; {what} "
                             f"may have {max_bytes // 1024} KiB at most")
    finally:
        os.close(fd)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise SuiteError(f"{where}: not UTF-8 text") from None


def read_at_most(fd: int, max_bytes: int) -> bytes:
    """What the open file ``fd`` holds from where it stands, up to ``max_bytes + 1`` bytes (one
    more than the caller allows, to tell a file that holds more), read until its end or that
    much (a read may return less)."""
    data = b""
    while chunk := os.read(fd, max_bytes + 1 - len(data)):
        data += chunk
    return data


def read_owned(path: Path) -> bytes:
    """The bytes of the regular file ``path``, read only if nobody but root and this user could
    have changed them: the file and every directory from ``/`` to it are theirs and writable by
    nobody else (:mod:`iomatrix.core.dirs`). UnsafeDirectory naming what another user controls;
    OSError when it cannot be read."""
    walked = walk(path.parent)
    try:
        if walked.missing:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path))
        fd = os.open(path.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=walked.fd)
    finally:
        os.close(walked.fd)
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(fd)
        why = distrust(info, fd) if stat.S_ISREG(info.st_mode) else "is not a regular file"
        if why is not None:
            raise UnsafeDirectory(f"{path} {why}")
        return file.read()
