"""What a QEMU process really does for I/O, read from /proc while and after it serves requests.
QMP does not report the aio mode, so it is inferred from the kernel objects the process holds:

- native:   a mapping named ``[aio]`` in /proc/PID/maps (the io_setup ring)
- io_uring: a descriptor ``anon_inode:[io_uring]`` in /proc/PID/fd
- threads:  neither; requests go to a pool of worker threads (more threads appear under load)

When QEMU creates them (block/file-posix.c, util/async.c, block/linux-aio.c, block/io_uring.c):

- up to QEMU 8.2 (7.2 tried): ``raw_open_common()`` calls ``aio_setup_linux_aio()`` /
  ``aio_setup_linux_io_uring()`` on the node's AioContext when it opens the file (failing the
  open when it cannot), and ``raw_aio_attach_aio_context()`` again when the node moves to an
  iothread. The ring or descriptor exists from the start: its absence means threads.
- QEMU 9.0 on (commit cd0c0db0aa9, "block/file-posix: set up Linux AIO and io_uring in the
  current thread", merged for 9.0 in December 2023, after 8.2.0): the open sets up
  nothing; ``raw_co_prw()`` and ``raw_co_flush_to_disk()`` call ``raw_check_linux_aio()`` /
  ``raw_check_linux_io_uring()``, which set it up in ``qemu_get_current_aio_context()`` at the
  first aligned read, write or flush, and where that fails print "Unable to use Linux AIO,
  falling back to thread pool" (or "linux io_uring") and use threads from then on. Tried on
  10.0.13: nothing after open, nothing after reading a never-written region (the NBD server
  answers it as a hole from block status, without reading the file), the ring after the first
  write. Once made, a ring lives as long as its AioContext, so a look after a trial sees every
  one made during it. Absent ring, absent fallback line: the file saw no such request yet, and
  the mode cannot be observed; it is never taken for threads.

QMP offers no proof of reads either: a node's ``query-blockstats`` counts nothing but
``wr_highest_offset`` (accounting is a device's, and an export has none; both 7.2 and 10.0).
Not covered: a later QEMU that monitors every AioContext's descriptors with its own io_uring
(proposed in 2025 with ``aio_add_sqe()``) would show a ring under any aio mode."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Literal

from iomatrix.core.model import Frozen
from iomatrix.qemu.version import AIO_SET_UP_AT_FIRST_IO, QemuVersion, shown

FALLBACK = "falling back to thread pool"
"""What QEMU 9.0 on prints when it cannot set up the asked aio mode and uses threads instead."""
UNOBSERVABLE = "not observable"

AioShown = Literal["native", "io_uring", "threads", "not observable"]


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

    def merged(self, later: ProcessIO) -> ProcessIO:
        """What this look and a later one saw together: the most of each kernel object."""
        names = {n: max(self.thread_names.get(n, 0), later.thread_names.get(n, 0))
                 for n in {*self.thread_names, *later.thread_names}}
        return ProcessIO(aio_rings=max(self.aio_rings, later.aio_rings),
                         io_uring_fds=max(self.io_uring_fds, later.io_uring_fds),
                         threads=max(self.threads, later.threads), thread_names=names)


class AioSeen(Frozen):
    """The aio mode a daemon showed over a trial, and why it is taken for that."""

    aio: AioShown
    evidence: str


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


def aio_seen(asked: str, seen: ProcessIO, *, qemu: QemuVersion | None, log: str) -> AioSeen:
    """The aio mode ``seen`` (every look of a trial, merged) proves, read as the module docstring
    says for QEMU ``qemu`` (None: unknown, read as 9.0 on); ``log`` is the daemon's output, where
    QEMU 9.0 on says when it fell back to threads."""
    if seen.aio_rings or seen.io_uring_fds:
        return AioSeen(aio="native" if seen.aio_rings else "io_uring", evidence=seen.evidence())
    fallback = [line.strip() for line in log.splitlines() if FALLBACK in line]
    if fallback:
        return AioSeen(aio="threads", evidence=f"{seen.evidence()}; QEMU: {fallback[-1]}")
    if asked == "threads":
        return AioSeen(aio="threads", evidence=seen.evidence())
    if qemu is not None and qemu < AIO_SET_UP_AT_FIRST_IO:
        return AioSeen(aio="threads", evidence=f"{seen.evidence()}; QEMU {shown(qemu)} sets "
                                               f"up {asked} when it opens the file")
    which = f"QEMU {shown(qemu)}" if qemu is not None else "QEMU (version unknown, as 9.0 on)"
    return AioSeen(aio=UNOBSERVABLE, evidence=(
        f"{seen.evidence()}; {which} sets up {asked} at the file's first read, write or flush "
        "and none reached the file yet (a never-written region reads as a hole without it)"))
