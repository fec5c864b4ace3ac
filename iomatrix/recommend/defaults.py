"""The parameters a recommendation decides, and each platform's defaults, names and limits as
its module in :mod:`iomatrix.platform` states them (pure).

The platform modules transcribe ``docs/qemu-disk-options.md``. A value that the reference does
not document is not invented: the platform then has no default for that parameter
(``PlatformDefault.level`` None) and the recommendation compares against a measured reference
level instead.
"""

from __future__ import annotations

from typing import cast

from iomatrix.platform import PLATFORMS as MODULES
from iomatrix.platform.settings import PlatformDefault
from iomatrix.suite.fields import Platform
from iomatrix.suite.matrix import Matrix

PLATFORMS = cast(tuple[Platform, ...], tuple(MODULES))
"""Every platform, in the registry's order (the order recommend shows them in)."""
TITLES: dict[Platform, str] = {p: MODULES[p].TITLE for p in PLATFORMS}

PARAMETERS = ("controller", "aio", "iothread", "cache", "format", "preallocation", "num_queues",
              "queue_size")
"""The disk settings a recommendation decides, in the order it shows them."""

NOT_SETTINGS = {
    "vms": "the number of guests measured at once, not a disk setting",
    "data_path": "vhost-user-blk needs a qemu-storage-daemon beside the guest; iomatrix does not "
                 "render that setup for a platform",
    "target": "the storage measured, not a disk setting: each recommended level rests on pairs "
              "measured on the same target, pooled over the targets (gains held per target "
              "are in `iomatrix analyze` and the report)",
}
"""Run axes that a recommendation reports but does not turn into a setting, and why."""

BLOCKLAYER_PARAMETERS = ("aio", "cache", "format", "preallocation")
"""What a blocklayer run (qemu-storage-daemon, no guest) measures faithfully. Its iothread axis is
the FUSE export's thread against an NBD export, not a guest device's iothread."""

WHAT = {
    "controller": "the disk controller (bus) the guest sees",
    "aio": "how QEMU submits I/O to the host: Linux AIO (native), io_uring, or a thread pool",
    "iothread": "a dedicated event-loop thread for the disk, off QEMU's main loop",
    "cache": "host page cache use and whether the guest sees a volatile write cache",
    "format": "image format: raw, or qcow2 (thin, snapshots, a metadata layer)",
    "preallocation": "how much of the image is allocated when it is created",
    "num_queues": "virtqueues of the device (NVMe: I/O queue pairs)",
    "queue_size": "entries per virtqueue",
}

NAMES: dict[Platform, dict[str, str]] = {p: MODULES[p].NAMES for p in PLATFORMS}
"""Each parameter as each platform names it."""
UNEXPRESSIBLE: dict[Platform, dict[tuple[str, str], str]] = {
    p: MODULES[p].UNEXPRESSIBLE for p in PLATFORMS}
"""(axis, level) a platform cannot be told to use."""


def defaults(platform: Platform, *, storage: str = "other",
             settings: dict[str, str] | None = None) -> dict[str, PlatformDefault]:
    """Every parameter's default on ``platform``. Defaults that depend on other settings
    (Proxmox's aio on the cache, iothread on the controller) follow ``settings``."""
    result: dict[str, PlatformDefault] = MODULES[platform].defaults(storage=storage,
                                                                    settings=settings)
    return result


FALLBACK = {axis: _fallback for axis, _fallback in (
    ("controller", Matrix.model_fields["controller"].default[0]),
    ("aio", Matrix.model_fields["aio"].default[0]),
    ("cache", Matrix.model_fields["cache"].default[0]),
    ("format", Matrix.model_fields["format"].default[0]),
    ("preallocation", Matrix.model_fields["preallocation"].default[0]),
)}
"""What is rendered for a parameter the platform has no default for and the run did not measure:
iomatrix's own matrix defaults (Proxmox VE's choices for a new Linux VM)."""
