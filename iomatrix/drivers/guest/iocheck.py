"""The guests' foreign-I/O check: what a trial's fio may leave uncounted, and QEMU's counters
read while fio ramps (:class:`RampSampler`).

**Foreign I/O fails the trial** (:meth:`iomatrix.drivers.guest.session.GuestSession.check_trial`):
QEMU's byte counters of each guest's disk (``query-blockstats``) over the trial must not exceed
fio's own count for that guest by more than fio provably leaves uncounted:

* its ramp: fio counts nothing until ``ramp_time`` after its job's start (``td->epoch``, set
  before its first I/O), and resets on the first completion after that. A sampler thread reads
  QEMU's counters every 50 ms until the first I/O shows (at host time ``s``: the epoch was before
  ``s``), then at ``s + ramp × 1.02 + m`` for the margins ``m`` of :data:`MARGINS`; whatever QEMU
  counted up to the first reading whose margin covers :func:`ramp_margin` is allowed: 0.1 s for
  one job (reading and scheduling delays; the 2 % covers the guest's clock, measured within
  0.1 % of the host's under TCG, and exact under KVM's kvmclock), plus 0.25 s per further job:
  the jobs of a group are released together but each opens the device (and sizes its random
  map) before setting its own epoch: up to 0.06 s apart per job measured under TCG (8 jobs on
  1 and 2 vCPUs);
* the I/O that completes as fio resets (one per job) and any still in flight when it stops
  (``iodepth`` per job; fio reaps and counts those, this is a margin): ``numjobs × (iodepth + 1)``
  times the largest block size the workload can issue;
* 1 MiB for the guest kernel itself (it issues none on the disk under test: nothing is mounted,
  fio uses O_DIRECT).

Bytes, not operations: the guest's block layer may split or merge fio's requests, never change
their bytes. Flushes and discards are not compared. What QEMU counted before the trial
(preconditioning, earlier trials) is outside it: each trial starts from a fresh reading.
vhost-user-blk guests are not checked (their QEMU counts nothing; the daemon serves the disk), nor
are trials whose jobs start at staggered times (``startdelay`` with a range) or that end before
the reading after the ramp; ``io_check`` in each sample's applied settings says which.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from iomatrix.core.units import fio_size
from iomatrix.fio.models import FioResult, JobStats
from iomatrix.fio.samples import client_job
from iomatrix.qemu.args import blockstats_of
from iomatrix.suite.workloads import Workload

POLL_SECONDS = 0.05
"""How often the sampler reads QEMU's counters until a guest's first I/O shows."""
CLOCK_TOLERANCE = 0.02
"""How much longer than ``ramp`` (host time) fio's ramp may last by the guest's clock."""
ONE_JOB_MARGIN = 0.1
SKEW_PER_JOB = 0.25
MARGINS = (0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
"""Seconds after ``first I/O + ramp × (1 + CLOCK_TOLERANCE)`` at which the sampler reads what
fio's ramp may have done (one reading each, while the trial lasts)."""
GUEST_SLACK_BYTES = 1 << 20
"""Allowed for I/O of the guest kernel's own on the disk under test (none is expected)."""
_SIZE_OPTIONS = ("bsrange", "blocksize_range", "bssplit")


def query_blockstats(qmp_socket: Path, *, timeout: float = 5.0) -> dict[str, int]:
    """:func:`iomatrix.qemu.args.read_blockstats` with a plain blocking socket, for the sampler
    thread: :func:`iomatrix.qemu.qmp.qmp_execute` runs an event loop and defers Ctrl-C to its
    caller, which must be the main thread."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(str(qmp_socket))
        stream = s.makefile("rb")

        def answer() -> object:
            while True:                        # events may come before the answer
                line = stream.readline()
                if not line:
                    raise ConnectionError("QEMU closed the QMP connection")
                message = json.loads(line)
                if "error" in message:
                    raise ConnectionError(f"QMP error: {message['error']}")
                if "return" in message:
                    return message["return"]

        json.loads(stream.readline() or b"null")            # the greeting
        s.sendall(b'{"execute": "qmp_capabilities"}\n')
        answer()
        s.sendall(b'{"execute": "query-blockstats"}\n')
        stats = answer()
    return blockstats_of(stats)


def bytes_moved(stats: dict[str, int]) -> int:
    """Bytes read and written in QEMU's counters ``stats``."""
    return stats["rd_bytes"] + stats["wr_bytes"]


class RampSampler:
    """QEMU's byte counters of each guest's disk, read in a thread from a trial's start: every
    :data:`POLL_SECONDS` until the guest's first I/O shows, then once for each margin of
    :data:`MARGINS` after the ramp (see the module docstring). ``base`` holds each guest's
    counters before the trial (empty: not counted, e.g. vhost-user-blk)."""

    def __init__(self, sockets: Sequence[Path], base: Sequence[dict[str, int]], ramp: float,
                 lock: threading.Lock) -> None:
        self.sockets = list(sockets)
        self.base = list(base)
        self.ramp = ramp
        self.lock = lock
        self.first_io: list[float | None] = [None] * len(self.sockets)
        self.after_ramp: list[dict[float, int]] = [{} for _ in self.sockets]
        """Per guest: margin → bytes QEMU counted from the trial's start to that reading."""
        self.errors: list[str | None] = [None] * len(self.sockets)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="iomatrix-io-check", daemon=True)

    def start(self) -> RampSampler:
        self._thread.start()
        return self

    def finish(self) -> None:
        """Stop reading (a reading under way ends within its timeout)."""
        self._stop.set()
        self._thread.join(timeout=10)

    def _read(self, index: int) -> int | None:
        try:
            with self.lock:
                stats = query_blockstats(self.sockets[index])
            return bytes_moved(stats) - bytes_moved(self.base[index])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            self.errors[index] = f"QMP: {exc}"
            return None

    def _run(self) -> None:
        margins = sorted(MARGINS)
        while not self._stop.is_set():
            waits = []
            for i in range(len(self.sockets)):
                if not self.base[i] or self.errors[i] is not None:
                    continue
                if self.first_io[i] is None:
                    moved = self._read(i)
                    if moved:
                        self.first_io[i] = time.monotonic()
                    elif moved is not None:
                        waits.append(POLL_SECONDS)
                        continue
                    else:
                        continue
                first = self.first_io[i]
                assert first is not None
                for margin in margins:
                    if margin in self.after_ramp[i]:
                        continue
                    due = first + self.ramp * (1 + CLOCK_TOLERANCE) + margin
                    if time.monotonic() >= due:
                        value = self._read(i)
                        if value is None:
                            break
                        self.after_ramp[i][margin] = value
                    else:
                        waits.append(due - time.monotonic())
                        break
            if not waits:
                return
            self._stop.wait(max(0.0, min(waits)))


def ramp_margin(workload: Workload) -> float:
    """Seconds after ``first I/O + ramp × (1 + CLOCK_TOLERANCE)`` by which every job of
    ``workload`` has ended its ramp (see the module docstring)."""
    return ONE_JOB_MARGIN + SKEW_PER_JOB * (workload.numjobs - 1)


def after_ramp(readings: dict[float, int], workload: Workload) -> tuple[float, int] | None:
    """The first reading (margin, bytes) taken late enough for ``workload``, or None."""
    needed = ramp_margin(workload)
    return next(((m, readings[m]) for m in sorted(readings) if m >= needed - 1e-9), None)


def largest_io(workload: Workload) -> int:
    """The largest request fio can issue for ``workload``: its bs, or the largest size in a
    bsrange/bssplit option (their percentages are below any block size)."""
    sizes = [workload.bs]
    for key, value in workload.options:
        if key in _SIZE_OPTIONS:
            for token in re.split(r"[,:/\-]", value):
                with contextlib.suppress(ValueError):     # passed to fio as written
                    sizes.append(fio_size(token))
    return max(sizes)


def unchecked_reason(workload: Workload) -> str | None:
    """Why the foreign-I/O check cannot bound fio's ramp for ``workload``, or None."""
    for key, value in workload.options:
        if key == "startdelay" and ("-" in value or ":" in value):
            return ("startdelay with a range starts fio's jobs, and their ramps, at different "
                    "times")
    return None


def client_result(result: FioResult, port: int, guests: int) -> JobStats | None:
    """fio's result for the client of the guest on ``port`` (the only one with one guest)."""
    found = client_job(result, port)
    if found is None and guests == 1 and len(result.jobs) == 1:
        found = result.jobs[0]
    return found
