"""What a QEMU process really does for I/O, read from /proc while it serves requests. QMP does not
report the aio mode, so it is inferred from the kernel objects the process holds:

- native:   a mapping named ``[aio]`` in /proc/PID/maps (the io_setup ring)
- io_uring: a descriptor ``anon_inode:[io_uring]`` in /proc/PID/fd
- threads:  neither; requests go to a pool of worker threads (more threads appear under load)
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

from iomatrix.core.model import Frozen


class ProcessIO(Frozen):
    """A snapshot of one process's I/O machinery."""

    aio_rings: int
    io_uring_fds: int
    threads: int
    thread_names: dict[str, int]

    @property
    def aio(self) -> str:
        """The aio mode this snapshot shows."""
        if self.aio_rings:
            return "native"
        if self.io_uring_fds:
            return "io_uring"
        return "threads"

    def evidence(self) -> str:
        names = ", ".join(f"{n}×{c}" for n, c in sorted(self.thread_names.items()))
        return (f"[aio] mappings={self.aio_rings}, io_uring fds={self.io_uring_fds}, "
                f"threads={self.threads} ({names})")


def inspect_process(pid: int, proc_root: Path = Path("/proc")) -> ProcessIO:
    """Read maps, fds and thread names of ``pid`` (which must be ours or readable)."""
    base = proc_root / str(pid)
    maps = (base / "maps").read_text()
    rings = sum(1 for line in maps.splitlines() if line.rstrip().endswith("[aio]")
                or "/[aio] (deleted)" in line)
    uring = 0
    for fd in (base / "fd").iterdir():
        try:
            if os.readlink(fd) == "anon_inode:[io_uring]":
                uring += 1
        except OSError:
            continue  # closed while we looked
    names: Counter[str] = Counter()
    for task in (base / "task").iterdir():
        try:
            names[(task / "comm").read_text().strip()] += 1
        except OSError:
            continue
    return ProcessIO(aio_rings=rings, io_uring_fds=uring, threads=sum(names.values()),
                     thread_names=dict(names))
