"""Writing files where other local users may have planted something first."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


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
