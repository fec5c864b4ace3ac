"""Configuration → QEMU block-layer options, in one place for every driver (qemu-storage-daemon
now, guests later). Cache modes follow QEMU's table (qemu-system(1), checked on 7.2):

    cache=        writeback  direct  no-flush
    writeback     on         off     off
    none          on         on      off
    writethrough  off        off     off
    directsync    off        on      off
    unsafe        on         off     on

``-blockdev`` has no writeback flag: a guest device gets ``write-cache=``, an export ``writethrough=``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


from iomatrix.suite.model import Configuration
from iomatrix.core.model import Frozen
from iomatrix.qemu.escape import qemu_bool


class CacheFlags(Frozen):
    writeback: bool
    direct: bool
    no_flush: bool


CACHE_MODES: dict[str, CacheFlags] = {
    "writeback": CacheFlags(writeback=True, direct=False, no_flush=False),
    "none": CacheFlags(writeback=True, direct=True, no_flush=False),
    "writethrough": CacheFlags(writeback=False, direct=False, no_flush=False),
    "directsync": CacheFlags(writeback=False, direct=True, no_flush=False),
    "unsafe": CacheFlags(writeback=True, direct=False, no_flush=True),
}

FILE_NODE = "file0"
FORMAT_NODE = "disk0"


def cache_flags(config: Configuration) -> CacheFlags:
    return CACHE_MODES[config.cache or "writeback"]


def blockdev_nodes(config: Configuration, image: Path, *, is_device: bool = False,
                   size: int | None = None) -> list[dict[str, Any]]:
    """The protocol node (file or host_device, carrying aio and cache) and the format node above
    it, with explicit node names. Both carry the cache flags: QEMU reports them per node, and an
    explicitly defined child does not inherit them."""
    flags = cache_flags(config)
    cache = {"direct": flags.direct, "no-flush": flags.no_flush}
    file_node: dict[str, Any] = {
        "driver": "host_device" if is_device else "file",
        "filename": str(image),
        "node-name": FILE_NODE,
        "aio": config.aio or "threads",
        "cache": cache,
    }
    format_node: dict[str, Any] = {
        "driver": config.format or "raw",
        "file": FILE_NODE,
        "node-name": FORMAT_NODE,
        "cache": cache,
    }
    if size is not None and (config.format or "raw") == "raw":
        format_node["size"] = size
    return [file_node, format_node]


def expected_node_flags(config: Configuration) -> dict[str, str]:
    """What ``query-named-block-nodes`` must report for the configuration, flattened as
    ``<node>.<field>`` → value, to compare with what QEMU applied."""
    flags = cache_flags(config)
    out: dict[str, str] = {}
    for node, driver in ((FILE_NODE, None), (FORMAT_NODE, config.format or "raw")):
        if driver is not None:
            out[f"{node}.driver"] = driver
        out[f"{node}.cache.direct"] = qemu_bool(flags.direct)
        out[f"{node}.cache.no-flush"] = qemu_bool(flags.no_flush)
    return out


