"""How much of a trial's I/O reached the target's block device, rather than the host page cache.

A cache mode without ``cache.direct`` (writethrough, writeback, unsafe; QEMU's default when no
cache is given) makes QEMU read and write its image through the host page cache: an image that
fits in RAM, read once (preconditioning writes it whole), is then served from RAM, and the figures
measure memory, not storage. What is measured, per direction, from what every trial already
stores (no extra probe):

  share = device bytes/s ÷ fio bytes/s

*device bytes/s*: the target's block device's read (write) bytes in /proc/diskstats
(``iomatrix.telemetry.host``: sampled every second during the trial), over the sampling intervals
that lie wholly inside fio's measured window (all intervals when none does, as in a trial shorter
than a second). The sampler starts before fio does, and on a busy host fio may take a second or
more to start its jobs, so the window is placed from the series' end, which is when fio had
exited: the last ``runtime`` seconds, never before ``ramp`` (fio cannot start before the sampler),
less the final interval, which holds fio's exit and teardown. *fio bytes/s*: fio's own read
(write) bandwidth over that window, summed over its directions' samples (guests: their aggregate).

Reads: a share near 0 means the reads were served from RAM; near 1 that they reached the device
(readahead or qcow2 metadata may take it above 1). Writes: a share counts only what the kernel
wrote to the device DURING the trial; with writeback (and unsafe) the page cache absorbs writes and
writes them back later (after ``vm.dirty_expire_centisecs``, 30 s by default, or under memory
pressure), so a low write share means the trial measured the page cache taking writes, which a
longer or larger workload would not sustain. The device also carries whatever else the host
writes to it meanwhile (the share then errs towards "reached the device", never towards RAM).

The share is unknown when the target's device could not be found (tmpfs, overlay, NFS, a
multi-device file system such as btrfs: ``host.device_of``), or the trial stored no telemetry
(imported runs, runs before iomatrix sampled the host)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from iomatrix.core.model import Frozen
from iomatrix.fio.samples import DirectionSample
from iomatrix.suite.fields import uses_page_cache
from iomatrix.telemetry.host import HostSeries

__all__ = ["RAM_SHARE", "DeviceShare", "device_share", "mean_share", "stored_device",
           "uses_page_cache"]

RAM_SHARE = 0.5
"""Below this share of fio's bytes reaching the device, a direction was served from RAM."""

UNKNOWN_DEVICE = ("the target's block device could not be found (tmpfs, overlay, NFS or a "
                  "multi-device file system such as btrfs), so what reached storage is unknown")
NO_TELEMETRY = "the trial stored no host disk telemetry (imported, or measured before iomatrix "\
               "sampled the host), so what reached storage is unknown"


class DeviceShare(Frozen):
    """Of one trial (or, averaged, one point): the share of fio's read and write bytes that
    reached the target's device (module docstring). None for a direction fio did not measure,
    and for both when unknown (``reason`` says why)."""

    device: str | None = None
    read: float | None = None
    write: float | None = None
    reason: str | None = None
    """Why the share is unknown; None when it is known."""

    @property
    def known(self) -> bool:
        return self.reason is None and (self.read is not None or self.write is not None)

    @property
    def from_ram(self) -> bool:
        """Mostly served from RAM: less than ``RAM_SHARE`` of the read bytes, or of the write
        bytes, reached the device during the trial."""
        return any(v is not None and v < RAM_SHARE for v in (self.read, self.write))

    def text(self) -> str:
        """E.g. "reads 2 %, writes 0 % reached vda", or why it is unknown."""
        if not self.known:
            return f"unknown: {self.reason or 'no direction measured'}"
        parts = [f"{name} {value:.0%}" for name, value in (("reads", self.read),
                                                            ("writes", self.write))
                 if value is not None]
        return f"{', '.join(parts)} reached {self.device or 'the device'}"


def device_share(series: HostSeries | None, samples: Sequence[DirectionSample], *,
                 ramp_s: float, device: str | None = None) -> DeviceShare:
    """The share of one trial's fio bytes that reached the target's device. ``device`` is the
    /proc/diskstats name to use when ``series`` predates naming one (``stored_device``)."""
    if series is None or not series.t:
        return DeviceShare(reason=NO_TELEMETRY)
    name = series.target_device if series.target_device is not None else device
    if not name or name not in series.devices:
        return DeviceShare(reason=UNKNOWN_DEVICE)
    disk = series.devices[name]
    runtime_s = max((s.runtime_ms for s in samples), default=0) / 1000
    starts = (0.0, *series.t[:-1])
    # anchored at the end (module docstring): counting from the start put fio's late start
    # under load inside the window (0.68 of cache=none's reads "reached" the device)
    begin = max(ramp_s, series.t[-1] - runtime_s)
    inside = [i for i, a in enumerate(starts[:-1]) if a >= begin]
    chosen = inside or list(range(len(series.t)))

    def rate(values: tuple[float | None, ...]) -> float | None:
        pairs = [(values[i], series.t[i] - starts[i]) for i in chosen if values[i] is not None]
        seconds = sum(dt for _, dt in pairs)
        return sum(v * dt for v, dt in pairs) / seconds if seconds > 0 else None  # type: ignore[operator]

    def share(direction: str, values: tuple[float | None, ...]) -> float | None:
        fio = sum(s.bw_bytes for s in samples if s.direction == direction)
        measured = rate(values)
        if fio <= 0 or measured is None:
            return None
        return round(measured / fio, 4)

    read = share("read", disk.read_bytes_s)
    write = share("write", disk.write_bytes_s)
    if read is None and write is None:
        return DeviceShare(device=name, reason="fio moved no bytes in the trial")
    return DeviceShare(device=name, read=read, write=write)


def mean_share(shares: Iterable[DeviceShare]) -> DeviceShare | None:
    """The point's share: per direction, the mean over its trials whose share is known; the
    first reason when none is known; None without trials."""
    shares = list(shares)
    if not shares:
        return None
    known = [s for s in shares if s.known]
    if not known:
        return DeviceShare(reason=shares[0].reason or "no direction measured")

    def mean(values: list[float | None]) -> float | None:
        present = [v for v in values if v is not None]
        return round(sum(present) / len(present), 4) if present else None

    devices = {s.device for s in known}
    return DeviceShare(device=devices.pop() if len(devices) == 1 else None,
                       read=mean([s.read for s in known]), write=mean([s.write for s in known]))


def stored_device(host: Mapping[str, Any]) -> str | None:
    """The diskstats name the run's host metadata suggests for its target (``/dev/vda1`` →
    ``vda1``), for series stored before they named the target's device."""
    source = str(host.get("target_device", ""))
    return Path(source).name if source.startswith("/dev/") else None
