"""A newc (SVR4, no CRC) cpio writer: the format the kernel unpacks an initramfs from."""

from __future__ import annotations

import stat
from typing import BinaryIO


class CpioWriter:
    """Writes a newc cpio archive to a binary file: every entry owned by root, with mtime 0 and
    inode numbers counting from 1, so the same entries always give the same bytes. Call
    :meth:`finish` to write the trailer."""

    def __init__(self, out: BinaryIO) -> None:
        self.out = out
        self.ino = 1
        self.names: set[str] = set()

    def _entry(self, name: str, mode: int, data: bytes = b"", rdev: tuple[int, int] = (0, 0),
               nlink: int = 1) -> None:
        encoded = name.encode() + b"\0"
        header = "070701" + "".join(f"{v:08X}" for v in (
            self.ino, mode, 0, 0, nlink, 0, len(data), 0, 0, rdev[0], rdev[1], len(encoded), 0))
        self.ino += 1
        self.names.add(name)
        for chunk in (header.encode(), encoded, b"\0" * (-(110 + len(encoded)) % 4), data,
                      b"\0" * (-len(data) % 4)):
            self.out.write(chunk)

    def directory(self, name: str) -> None:
        """``name`` and each missing parent of it (``a/b`` writes ``a`` first)."""
        parts = name.split("/")
        for i in range(1, len(parts) + 1):
            sub = "/".join(parts[:i])
            if sub not in self.names:
                self._entry(sub, stat.S_IFDIR | 0o755, nlink=2)

    def file(self, name: str, data: bytes, mode: int = 0o644) -> None:
        """A regular file, after its missing parent directories."""
        if "/" in name:
            self.directory(name.rsplit("/", 1)[0])
        self._entry(name, stat.S_IFREG | mode, data)

    def symlink(self, name: str, target: str) -> None:
        self._entry(name, stat.S_IFLNK | 0o777, target.encode())

    def device(self, name: str, major: int, minor: int) -> None:
        """A character device node."""
        self._entry(name, stat.S_IFCHR | 0o600, rdev=(major, minor))

    def finish(self) -> None:
        self._entry("TRAILER!!!", 0)
