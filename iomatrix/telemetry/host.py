"""Host telemetry during a trial: a background thread samples /proc/diskstats and /proc/stat.

Per block device and interval, from differences of /proc/diskstats counters (the same ones
iostat reads): utilization = time with I/O in flight (``io_ticks``) / interval, average queue
depth = time-weighted requests in flight (``time_in_queue``) / interval, read and write IOPS and
bytes/s (sectors of 512 bytes). Host-wide: interrupts/s (the total on /proc/stat's ``intr`` line)
and context switches/s (``ctxt``). One sample costs two small file reads; the sampler measures its
own CPU time (:attr:`HostSeries.sampler_cpu_s`).
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from iomatrix.core.model import Frozen

SECTOR = 512
# The final, partial interval is kept only when it is at least this fraction of an interval.
_MIN_PARTIAL = 0.2


class DeviceSeries(Frozen):
    """One block device, one value per interval (None where the device was absent)."""

    util_pct: tuple[float | None, ...]
    queue_depth: tuple[float | None, ...]
    read_iops: tuple[float | None, ...]
    write_iops: tuple[float | None, ...]
    read_bytes_s: tuple[float | None, ...]
    write_bytes_s: tuple[float | None, ...]


class HostSeries(Frozen):
    """Host time series of one trial, one value per interval."""

    interval_s: float
    t: tuple[float, ...]
    """End of each interval, seconds after start()."""
    devices: dict[str, DeviceSeries]
    """Devices that were named or had any I/O."""
    intr_per_s: tuple[float, ...]
    ctxt_per_s: tuple[float, ...]
    sampler_cpu_s: float
    """CPU time the sampler thread itself used."""
    target_device: str | None = None
    """The /proc/diskstats name of the device holding the target (``device_of``), as the
    trial's probe found it: "" when there is none (tmpfs, overlay, btrfs); None in series
    stored before it was recorded (``iomatrix.telemetry.pagecache``)."""


class _Raw:
    """One reading of both files."""

    __slots__ = ("at", "disks", "intr", "ctxt")

    def __init__(self, proc: Path) -> None:
        self.at = time.monotonic()
        self.disks: dict[str, tuple[int, ...]] = {}
        with open(proc / "diskstats", "rb") as f:
            for line in f.read().decode().splitlines():
                parts = line.split()
                if len(parts) >= 14:
                    # reads, read sectors, writes, write sectors, io_ticks, time_in_queue
                    self.disks[parts[2]] = (int(parts[3]), int(parts[5]), int(parts[7]),
                                            int(parts[9]), int(parts[12]), int(parts[13]))
        self.intr = self.ctxt = 0
        with open(proc / "stat", "rb") as f:
            for line in f.read().decode().splitlines():
                if line.startswith("intr "):
                    self.intr = int(line.split(maxsplit=2)[1])
                elif line.startswith("ctxt "):
                    self.ctxt = int(line.split()[1])


class HostSampler:
    """Samples every ``interval_s`` between :meth:`start` and :meth:`stop` in a daemon thread;
    ``devices`` (names as in /proc/diskstats, e.g. "vda") are kept even when idle. As a context
    manager it always stops; the series is then in :attr:`series`."""

    def __init__(self, interval_s: float = 1.0, *, devices: Iterable[str] = (),
                 proc: Path = Path("/proc")) -> None:
        if interval_s <= 0:
            raise ValueError(f"sampling interval must be positive, got {interval_s}")
        self.interval_s = interval_s
        self.named = {d.removeprefix("/dev/") for d in devices}
        self.proc = proc
        self.series: HostSeries | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._readings: list[_Raw] = []
        self._cpu_s = 0.0
        self._error: BaseException | None = None

    def start(self) -> HostSampler:
        if self._thread is not None:
            raise RuntimeError("HostSampler already started")
        self._readings = [_Raw(self.proc)]
        self._thread = threading.Thread(target=self._loop, name="iomatrix-host-sampler",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> HostSeries:
        """Stop sampling (taking a last, partial sample) and return the series."""
        if self._thread is None:
            raise RuntimeError("HostSampler.stop() before start()")
        self._stop.set()
        self._thread.join(timeout=10 * self.interval_s + 5)
        if self._error is not None:
            raise self._error
        self.series = _series(self._readings, self.interval_s, self.named, self._cpu_s)
        return self.series

    def __enter__(self) -> HostSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self.series is None and self._thread is not None:
            self.stop()

    def _loop(self) -> None:
        cpu0 = time.thread_time()
        start = self._readings[0].at
        tick = 1
        try:
            while not self._stop.wait(max(0.0, start + tick * self.interval_s - time.monotonic())):
                self._readings.append(_Raw(self.proc))
                tick = int((time.monotonic() - start) / self.interval_s) + 1
            last = _Raw(self.proc)
            if last.at - self._readings[-1].at >= _MIN_PARTIAL * self.interval_s:
                self._readings.append(last)
        except BaseException as exc:   # handed to stop()
            self._error = exc
        finally:
            self._cpu_s = time.thread_time() - cpu0


def device_of(path: Path) -> str | None:
    """The /proc/diskstats name of the block device holding ``path`` ("vda", "dm-0"), or of
    ``path`` itself when it is a block device ("loop0" for /dev/loop0); None for file systems
    without one (tmpfs, overlay, NFS, btrfs)."""
    st = os.stat(path)
    dev = st.st_rdev if stat.S_ISBLK(st.st_mode) else st.st_dev
    link = Path("/sys/dev/block") / f"{os.major(dev)}:{os.minor(dev)}"
    try:
        return Path(os.readlink(link)).name
    except OSError:
        return None


def _series(readings: list[_Raw], interval_s: float, named: set[str],
            sampler_cpu_s: float) -> HostSeries:
    pairs = list(zip(readings, readings[1:]))
    start = readings[0].at
    names = sorted(named | {name for a, b in pairs for name in b.disks
                            if name in a.disks and b.disks[name] != a.disks[name]})
    columns: dict[str, list[list[float | None]]] = {name: [[] for _ in range(6)]
                                                   for name in names}
    for a, b in pairs:
        ms = (b.at - a.at) * 1000.0
        for name in names:
            cols = columns[name]
            if name not in a.disks or name not in b.disks:
                for col in cols:
                    col.append(None)
                continue
            reads, rsect, writes, wsect, ticks, queue = (
                y - x for x, y in zip(a.disks[name], b.disks[name]))
            cols[0].append(min(100.0, 100.0 * ticks / ms))
            cols[1].append(queue / ms)
            cols[2].append(reads * 1000.0 / ms)
            cols[3].append(writes * 1000.0 / ms)
            cols[4].append(rsect * SECTOR * 1000.0 / ms)
            cols[5].append(wsect * SECTOR * 1000.0 / ms)
    devices = {name: DeviceSeries(util_pct=tuple(c[0]), queue_depth=tuple(c[1]),
                                  read_iops=tuple(c[2]), write_iops=tuple(c[3]),
                                  read_bytes_s=tuple(c[4]), write_bytes_s=tuple(c[5]))
               for name, c in columns.items()}
    return HostSeries(
        interval_s=interval_s,
        t=tuple(b.at - start for _, b in pairs),
        devices=devices,
        intr_per_s=tuple((b.intr - a.intr) / (b.at - a.at) for a, b in pairs),
        ctxt_per_s=tuple((b.ctxt - a.ctxt) / (b.at - a.at) for a, b in pairs),
        sampler_cpu_s=sampler_cpu_s)
