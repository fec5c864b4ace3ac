"""PVE 9's block graph (pure): qemu-server's nested ``-blockdev`` (Blockdev.pm
generate_drive_blockdev: a ``throttle`` filter ``drive-<key>`` over the format node
``f<hash>`` over the protocol node ``e<hash>``) and its throttle group, and the same layers as
a qemu-storage-daemon holds them (blocklayer mode; PVE 8's spelled as ``-blockdev`` too)."""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from iomatrix.core.model import Frozen
from iomatrix.platform.proxmox.config import Drive, PveVersion
from iomatrix.platform.proxmox.rules import (aio_option, detect_zeroes_option, throttle_limits,
                                             uses_cache_direct)
from iomatrix.platform.proxmox.storage import Volume


def node_name(kind: Literal["file", "fmt"], drive_id: str, volid: str,
              snap: str | None = None) -> str:
    """Blockdev.pm get_node_name: ``e`` (file) or ``f`` (format) and the first 30 hex digits of
    sha256("drive=<id>,volid=<volid>"), with ``snap=<snap>,`` before the volid for a snapshot's
    node in a backing chain."""
    info = f"drive={drive_id}," + (f"snap={snap}," if snap is not None else "") + f"volid={volid}"
    digest = hashlib.sha256(info.encode()).hexdigest()[:30]
    return ("e" if kind == "file" else "f") + digest


def to_json(value: dict[str, Any]) -> str:
    """qemu-server's ``to_json($x, { canonical => 1 })``: sorted keys, no blanks."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


class DaemonGraph(Frozen):
    """One disk's block graph as a qemu-storage-daemon holds it (blocklayer mode): the layers a
    PVE disk has, without the guest device. The daemon has no ``-drive``."""

    objects: tuple[str, ...]
    """``--object`` values (JSON): PVE 9's empty throttle group."""
    blockdev: str
    """The one nested ``--blockdev`` value (JSON)."""
    top: str
    """The node the guest device attaches to (here: the export's node)."""
    throttle_group: str | None = None
    """The throttle group's id (PVE 9)."""


def daemon_graph(drive: Drive, volume: Volume, *, version: PveVersion,
                 size: int | None = None) -> DaemonGraph:
    """The block graph qemu-server builds for ``drive``, as ``--object``/``--blockdev`` values.

    PVE 9: exactly its ``-blockdev`` (throttle ``drive-<key>`` → format → protocol, discard and
    detect-zeroes on every node) over its empty throttle group. PVE 8: what QEMU makes of its
    ``-drive`` line, spelled as ``-blockdev``: the format node with the drive's cache, discard
    and detect-zeroes, over a protocol node with aio and cache; detect-zeroes stays off there
    (not inherited) and discard is unmap (QEMU's block.c ``bdrv_inherited_options``: a format
    node's protocol child defaults to ``discard=unmap``). QEMU names -drive's nodes itself
    (``#blockN``); here they get PVE 9's names (``node_name``)."""
    direct = uses_cache_direct(drive.get("cache"), volume.storage)
    aio = aio_option(drive.get("aio"), volume.storage, direct)
    graph = drive_blockdev(drive, volume, direct, aio, size)
    if version >= 9:
        group = throttle_group(drive)
        return DaemonGraph(objects=(to_json(group),), blockdev=to_json(graph),
                           top=graph["node-name"], throttle_group=group["id"])
    fmt = graph["file"]
    fmt["file"] = {k: v for k, v in fmt["file"].items() if k != "detect-zeroes"} | {
        "discard": "unmap"}
    return DaemonGraph(objects=(), blockdev=to_json(fmt), top=fmt["node-name"])


def daemon_detect_zeroes(drive: Drive, version: PveVersion) -> dict[str, str]:
    """detect-zeroes per layer of :func:`daemon_graph` (``protocol``, ``format``, ``throttle``),
    as ``query-named-block-nodes`` must report it."""
    value = detect_zeroes_option(drive)
    if version >= 9:
        return {"protocol": value, "format": value, "throttle": value}
    return {"protocol": "off", "format": value}


def throttle_group(drive: Drive) -> dict[str, Any]:
    """Blockdev.pm generate_throttle_group: the drive's limits (none: an empty group)."""
    limits = {name: int(float(value)) for name, value in throttle_limits(drive)}
    return {"id": f"throttle-drive-{drive.key}", "limits": limits, "qom-type": "throttle-group"}


def drive_blockdev(drive: Drive, volume: Volume, direct: bool, aio: str,
                   size: int | None, *, read_only: bool = False) -> dict[str, Any]:
    """Blockdev.pm generate_drive_blockdev: throttle → format → file, nested; add_common_options
    puts discard (unmap with discard=on, else ignore) and detect-zeroes on each node of a disk
    (a CD-ROM gets neither), and read-only on each (``ro=1``, a CD-ROM, a template). A
    ``scsiblock`` drive gets no throttle filter: its format node is the top."""
    common: dict[str, Any] = {}
    if not drive.is_cdrom:
        common = {"discard": "unmap" if drive.get("discard") == "on" else "ignore",
                  "detect-zeroes": detect_zeroes_option(drive)}
    common["read-only"] = bool(drive.flag("ro")) or drive.is_cdrom or read_only
    cache = {"direct": direct, "no-flush": drive.get("cache") == "unsafe"}
    if volume.driver == "rbd" and drive.bus == "efidisk":   # bug #3329: librbd's own cache
        cache = {"direct": False, "no-flush": False}
    file_node: dict[str, Any] = {"driver": volume.driver, **volume.node}
    if volume.driver in ("file", "host_device", "host_cdrom"):
        file_node |= {"filename": volume.path, "aio": aio}
    file_node |= {"cache": cache, "node-name": node_name("file", drive.key, volume.volid)} | common
    fmt: dict[str, Any] = {"node-name": node_name("fmt", drive.key, volume.volid),
                           "driver": volume.format, "file": file_node, "cache": cache} | common
    if size is not None and volume.format == "raw":
        fmt["size"] = size
    if volume.volume_chain:
        fmt["discard-no-unref"] = True
    fmt |= _backing(drive, volume, fmt)
    if drive.flag("scsiblock"):
        return fmt | {"node-name": f"drive-{drive.key}"}
    return {"driver": "throttle", "node-name": f"drive-{drive.key}",
            "throttle-group": f"throttle-drive-{drive.key}", "file": fmt} | common


def _backing(drive: Drive, volume: Volume, fmt: dict[str, Any]) -> dict[str, Any]:
    """Blockdev.pm generate_backing_chain_blockdev: each volume of ``volume.chain`` as the top's
    layers again (its own file and format nodes, the snapshot's name in their node names), the
    next one as its ``backing``. iomatrix's snapshots are ``snapN``, ``snap1`` the oldest (the
    chain's base); an empty dict without a chain."""
    below: dict[str, Any] = {}
    for depth in range(len(volume.chain), 0, -1):
        snap = f"snap{len(volume.chain) - depth + 1}"
        file_node = fmt["file"] | {"filename": volume.chain[depth - 1],
                                   "node-name": node_name("file", drive.key, volume.volid, snap)}
        layer = {k: v for k, v in fmt.items() if k != "size"} | {
            "node-name": node_name("fmt", drive.key, volume.volid, snap), "file": file_node}
        below = {"backing": layer | below}
    return below
