"""Drive.pm's rules for a drive's options (pure): whether its cache is direct, the aio and
detect-zeroes it gets, and its throttling limits as QEMU names them. Both generations' arguments
(:mod:`.drive`, :mod:`.blockdev`) apply them."""

from __future__ import annotations

import math

from iomatrix.platform.proxmox.config import Drive


def uses_cache_direct(cache: str | None, storage: str, *, cdrom: bool = False) -> bool:
    """Drive.pm drive_uses_cache_direct: a given cache is direct when none/off/directsync; no
    cache is direct unless the drive is a CD-ROM or on btrfs without nocow."""
    if cache:
        return cache in ("off", "none", "directsync")
    return not cdrom and storage != "btrfs"


def allows_io_uring_default(storage: str, direct: bool) -> bool:
    """Drive.pm storage_allows_io_uring_default: not on krbd with a non-direct cache, not on
    (thick) LVM, not on CIFS."""
    if storage == "krbd" and not direct:
        return False
    return storage not in ("lvm", "cifs")


def aio_option(aio: str | None, storage: str, direct: bool) -> str:
    """Drive.pm aio_cmdline_option: a given aio unchanged; else io_uring where allowed, else
    native with a direct cache and threads without."""
    if aio:
        return aio
    if allows_io_uring_default(storage, direct):
        return "io_uring"
    return "native" if direct else "threads"


def detect_zeroes_option(drive: Drive) -> str:
    """Drive.pm detect_zeroes_cmdline_option: off when detect_zeroes=0; unmap with discard=on,
    on with discard=ignore; on when neither is given ("This used to be our default")."""
    if drive.flag("detect_zeroes") is False:
        return "off"
    discard = drive.get("discard")
    if discard:
        return "unmap" if discard == "on" else "on"
    return "on"


def throttle_limits(drive: Drive) -> list[tuple[str, str]]:
    """The drive's throttling limits as QEMU names them, in qemu-server's order, with the
    values as it writes them on a ``-drive`` line (MB/s in bytes; the deprecated ``bps*``
    options turned into MB/s as Drive.pm parse_drive does)."""
    out = []
    for suffix, qmp in (("", "-total"), ("_rd", "-read"), ("_wr", "-write")):
        mbps = drive.get(f"mbps{suffix}")
        if mbps is None and drive.get(f"bps{suffix}") is not None:
            mbps = f"{float(drive.get(f'bps{suffix}') or 0) / (1 << 20):.3f}"
        for name, option, value in ((f"bps{qmp}", f"mbps{suffix}", mbps),
                                    (f"bps{qmp}-max", f"mbps{suffix}_max",
                                     drive.get(f"mbps{suffix}_max"))):
            if value is not None and (number := _finite(drive, option, value, 1 << 20)):
                out.append((name, str(int(number))))
        for name, option in ((f"bps{qmp}-max-length", f"bps{suffix}_max_length"),
                             (f"iops{qmp}", f"iops{suffix}"),
                             (f"iops{qmp}-max", f"iops{suffix}_max"),
                             (f"iops{qmp}-max-length", f"iops{suffix}_max_length")):
            value = drive.get(option)
            if value is not None and _finite(drive, option, value):
                out.append((name, value))
    return out


def _finite(drive: Drive, option: str, value: str, scale: int = 1) -> float:
    """``value`` times ``scale``; ValueError naming ``option`` when that is not a finite number
    (a number of 400 digits is infinite as a float)."""
    try:
        number = float(value) * scale
    except ValueError:
        number = math.nan
    if not math.isfinite(number):
        raise ValueError(f"{drive.key}: {option}={value[:40]}: not a number qemu-server takes")
    return number
