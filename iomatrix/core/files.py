"""Writing files where other local users may have planted something first, and reading a file a
suite names beside itself without being led out of the suite's directory."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from iomatrix.core.errors import SuiteError


def write_file_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a new temporary file in the same directory, renamed over
    ``path``: a planted ``path`` or temporary name (a symlink, a FIFO) is replaced, never written
    through. The file gets the usual mode for new files (0666 less the umask)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
        data = b""
        while chunk := os.read(fd, max_bytes + 1 - len(data)):     # a read may return less
            data += chunk
        if max(info.st_size, len(data)) > max_bytes:
            raise SuiteError(f"{where}: {max(info.st_size, len(data))} bytes or more; {what} "
                             f"may have {max_bytes // 1024} KiB at most")
    finally:
        os.close(fd)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise SuiteError(f"{where}: not UTF-8 text") from None
