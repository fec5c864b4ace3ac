"""A disk's ``-blockdev`` nodes as libvirt's qemu driver builds them (pure; qemu_block.c): for
each image of its chain, bottom up, the storage node, a slice node, the format node, by
version."""

from __future__ import annotations

import json
from typing import Any

from iomatrix.platform.libvirt.domain import Disk
from iomatrix.platform.libvirt.elements import host_cdrom
from iomatrix.platform.libvirt.versions import PROPS_REORDERED, Versions


CACHE_FLAGS = {  # cache= → (direct, no-flush, device write-cache)
    "none": (True, False, "on"), "writeback": (False, False, "on"),
    "writethrough": (False, False, "off"), "directsync": (True, False, "off"),
    "unsafe": (False, True, "on")}
BACKING_FORMATS = ("qcow2", "qed", "vmdk", "qcow", "cow", "vhdx", "vpc", "parallels", "vdi")
"""Formats that can have a backing image (VIR_STORAGE_FILE_BACKING and after)."""


def _json(value: dict[str, Any]) -> str:
    return json.dumps(value, separators=(",", ":"))


def image_nodes(disk: Disk, versions: Versions, number: int, size: int | None,
                notes: list[str]) -> list[str]:
    """The disk's -blockdev values, bottom up: its backing images', its data store's (where
    that libvirt reads ``<dataStore>``), then its own; ``number``: its top image's (the data
    store's and the backing images' follow). ``size``: iomatrix's own test area on a block
    device, a raw slice from 0."""
    data = disk.data_store if versions.data_store else None
    first = number + (2 if data is not None else 1)
    out: list[str] = []
    below = None if disk.backing_closed else ""
    for depth in range(len(disk.backing) - 1, -1, -1):
        image = disk.backing[depth]
        nodes = _image(disk, versions, kind=image.kind, path=image.path, fmt=image.format,
                       number=first + depth, top=False, backing=below, size=None, notes=notes)
        out += [_json(node) for node in nodes]
        below = nodes[-1]["node-name"]
    data_node = None
    if data is not None:
        nodes = _image(disk, versions, kind=data.kind, path=data.path, fmt=data.format,
                       number=number + 1, top=False, backing="", size=None, notes=notes,
                       read_only=disk.readonly)
        out += [_json(node) for node in nodes]
        data_node = nodes[-1]["node-name"]
    nodes = _image(disk, versions, kind=disk.kind, path=disk.source, fmt=disk.get("type") or "raw",
                   number=number, top=True, backing=below, size=size, notes=notes,
                   data_file=data_node)
    return out + [_json(node) for node in nodes]


def _flags(disk: Disk) -> dict[str, bool] | None:
    cache = disk.cache
    return None if cache is None else {"direct": CACHE_FLAGS[cache][0],
                                       "no-flush": CACHE_FLAGS[cache][1]}


def _effective(disk: Disk, versions: Versions, top: bool,
               read_only: bool | None = None) -> dict[str, Any]:
    """The keys of the node a device (or an image over it) sits on: read-only, discard and cache
    for the whole chain, detect-zeroes for the top image only up to libvirt 9.x, for the whole
    chain after (:attr:`Versions.zeroes_chain`; qemuDomainPrepareDiskSourceData)."""
    discard = disk.get("discard")
    if discard == "default":
        discard = None       # VIR_DOMAIN_DISK_DISCARD_DEFAULT: libvirt passes no discard
    zeroes = disk.get("detect_zeroes") if top or versions.zeroes_chain else None
    if zeroes == "default":
        zeroes = None        # VIR_DOMAIN_DISK_DETECT_ZEROES_DEFAULT: libvirt passes none either
    if zeroes == "unmap" and discard != "unmap":
        zeroes = "on"        # virDomainDiskGetDetectZeroesMode
    if read_only is None:
        read_only = disk.readonly if top else True
    out: dict[str, Any] = {"read-only": read_only}
    if discard:
        out["discard"] = discard
    if zeroes:
        out["detect-zeroes"] = zeroes
    flags = _flags(disk)
    if flags is not None:
        out["cache"] = flags
    return out


def _image(disk: Disk, versions: Versions, *, kind: str, path: str, fmt: str, number: int,
           top: bool, backing: str | None, size: int | None, notes: list[str],
           read_only: bool | None = None, data_file: str | None = None) -> list[dict[str, Any]]:
    """One image's nodes, bottom up (``backing``: the node under it; None: the chain is
    closed by an empty ``<backingStore/>``; "": nothing said; ``read_only``: a data store's,
    its disk's)."""
    driver = "file"
    if kind == "block":
        driver = "host_device"
        if top and disk.device == "cdrom":
            cdrom, why = host_cdrom(path, fmt)
            driver = "host_cdrom" if cdrom else driver
            notes.append(f"{disk.dev}: {why}")
    name = f"libvirt-{number}-storage"
    storage: dict[str, Any] = {"driver": driver, "filename": path}
    if disk.get("io"):
        storage["aio"] = disk.get("io")
    storage["node-name"] = name
    flags = _flags(disk)
    common: dict[str, Any] = {"auto-read-only": True, "discard": "unmap"}
    cached = common if flags is None else common | {"cache": flags}
    if flags is not None:
        common = ({"cache": flags} | common if versions.libvirt < PROPS_REORDERED else cached)
    effective = _effective(disk, versions, top, read_only)
    piece = disk.slice if top else None
    if piece is None and top and size is not None and fmt == "raw":
        piece = (0, size)
    if fmt == "raw" and piece is not None and versions.libvirt >= PROPS_REORDERED:
        # raw with a <slice>: the slice node is the disk's top (qemu_block.c 10.0 on)
        sliced = {"driver": "raw", "file": name, "offset": piece[0], "size": piece[1],
                  "node-name": f"libvirt-{number}-slice-sto"} | effective
        return [storage | common, sliced]
    if fmt == "raw" and not versions.raw_format_node:
        return [storage | effective]
    nodes = [storage | common]
    if piece is not None and fmt != "raw":
        slice_name = f"libvirt-{number}-slice-sto"
        nodes.append(({"driver": "raw", "file": name, "offset": piece[0], "size": piece[1],
                       "node-name": slice_name} if versions.libvirt >= PROPS_REORDERED else
                      {"driver": "raw", "node-name": slice_name, "offset": piece[0],
                       "size": piece[1], "file": name}) | cached)
    node = {"node-name": f"libvirt-{number}-format"} | effective | {"driver": fmt}
    if fmt == "raw" and piece is not None:
        node |= {"offset": piece[0], "size": piece[1]}
    if top:
        node |= _qcow2(disk, fmt, versions, notes)
    if data_file is not None:
        node["data-file"] = data_file
    node["file"] = nodes[-1]["node-name"]
    if fmt in BACKING_FORMATS and backing != "":
        node["backing"] = backing
    return nodes + [node]


def _qcow2(disk: Disk, fmt: str, versions: Versions, notes: list[str]) -> dict[str, Any]:
    """A top qcow2 image's own keys: ``cache-size`` (``<metadata_cache>``), ``data-file``
    (``<dataStore>``, by version); on another format each is named in a note."""
    out: dict[str, Any] = {}
    if disk.metadata_cache is not None:
        if fmt == "qcow2":
            out["cache-size"] = disk.metadata_cache
        else:
            notes.append(f"{disk.dev}: <metadata_cache> on a {fmt} image is not reproduced by "
                         "iomatrix")
    if disk.data_store is not None and not versions.data_store:
        notes.append(f"{disk.dev}: <source><dataStore> ({disk.data_store.path}) is ignored by "
                     f"libvirt {'.'.join(map(str, versions.libvirt))}: QEMU opens the data file "
                     "the qcow2 header names")
    return out
