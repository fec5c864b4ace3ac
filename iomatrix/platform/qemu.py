"""Plain QEMU 7.2 (reference §3, §4): what a disk gets when the command line sets nothing, and
the names its settings have there. The arguments themselves are iomatrix's own guest's
(:func:`iomatrix.qemu.args.guest_argv`)."""

from __future__ import annotations

from iomatrix.platform.settings import DiskSettings, PlatformDefault, default

TITLE = "QEMU 7.2"
PLACEHOLDER_IMAGE = "disk"
"""The image path recommend shows without ``--image`` (plus ``.raw``/``.qcow2``)."""
NAMES = {"controller": "-device", "aio": "\"aio\" (file node)",
         "iothread": "-object iothread + iothread=",
         "cache": "\"cache\" {direct, no-flush} + write-cache=", "format": "format node driver",
         "preallocation": "qemu-img create -o preallocation=",
         "num_queues": "num-queues / num_queues", "queue_size": "queue-size / virtqueue_size"}
"""Each parameter as QEMU names it."""
UNEXPRESSIBLE: dict[tuple[str, str], str] = {}
"""(axis, level) QEMU cannot be told to use: none."""


def refusal(settings: DiskSettings) -> str | None:
    """QEMU's own refusals are suite.expand.invalid_reason's; plain QEMU adds none."""
    return None


def queue_defaults() -> dict[str, PlatformDefault]:
    """QEMU's num_queues and queue_size when nothing sets them (every platform here leaves them
    to QEMU)."""
    return {"num_queues": default(None, "QEMU's (one per vCPU)",
                                  "not set: QEMU 7.2 gives one queue per vCPU"),
            "queue_size": default(None, "QEMU's (256)",
                                  "not set: QEMU 7.2's virtqueue size is 256")}


def defaults(*, storage: str = "other", settings: dict[str, str] | None = None,
             where: str = "command line", fmt: str = "the driver") -> dict[str, PlatformDefault]:
    """Every parameter's default when ``where`` (the command line; libvirt: the XML) sets
    nothing; ``fmt`` names what gives the format."""
    return {
        "controller": default(None, f"no default: the {where} names it"),
        "aio": default("threads", note="io/aio not given: QEMU's default thread pool"),
        "iothread": default("off", note="no iothread unless one is configured"),
        "cache": default("writeback", note="cache not given: QEMU's default, writeback (§3)"),
        "format": default(None, f"none ({fmt} names it)"),
        "preallocation": default(None, "none (chosen at image creation)"),
        **queue_defaults()}
