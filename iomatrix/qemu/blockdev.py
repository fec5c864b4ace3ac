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

import json
from pathlib import Path
from typing import Any


from iomatrix.core.errors import InvalidCombination
from iomatrix.platform import libvirt as lv
from iomatrix.platform import proxmox as pve
from iomatrix.suite.model import Configuration, Platform, PveVersion
from iomatrix.core.model import Frozen
from iomatrix.qemu.escape import qemu_bool
from iomatrix.suite.iscsi import IscsiLun
from iomatrix.target import iscsi


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
THROTTLE_NODE = "throttle0"
"""The filter's role name, as iomatrix.qemu.args reads a platform's graph back."""
LIBVIRT_BUS = "virtio-blk"
"""The bus of the ``<disk>`` a daemon's graph is built from on platform libvirt: the nodes do
not depend on it."""
PVE_BUS = "virtio-blk"
"""The bus of the drive line a daemon's graph is built from on platform proxmox: it names the
nodes (``drive-virtio0``), nothing more; the layers do not depend on the bus."""


def cache_flags(config: Configuration) -> CacheFlags:
    return CACHE_MODES[config.cache or "writeback"]


def blockdev_nodes(config: Configuration, image: Path, *, is_device: bool = False,
                   size: int | None = None, lun: IscsiLun | None = None) -> list[dict[str, Any]]:
    """The protocol node (file or host_device, carrying aio and cache; for an iSCSI ``lun``
    libiscsi's, without aio) and the format node above it, with explicit node names. Both carry
    the cache flags: QEMU reports them per node, and an explicitly defined child does not
    inherit them."""
    flags = cache_flags(config)
    cache = {"direct": flags.direct, "no-flush": flags.no_flush}
    file_node: dict[str, Any] = {
        "driver": "host_device" if is_device else "file",
        "filename": str(image),
        "node-name": FILE_NODE,
        "aio": config.aio or "threads",
        "cache": cache,
    }
    if lun is not None:
        file_node = {**iscsi.protocol_node(lun), "node-name": FILE_NODE, "cache": cache}
    format_node: dict[str, Any] = {
        "driver": config.format or "raw",
        "file": FILE_NODE,
        "node-name": FORMAT_NODE,
        "cache": cache,
    }
    if size is not None and (config.format or "raw") == "raw":
        format_node["size"] = size
    return [file_node, format_node]


def expected_node_flags(config: Configuration, *, format_node: bool = True,
                        protocol: str | None = None) -> dict[str, str]:
    """What ``query-named-block-nodes`` must report for the configuration, flattened as
    ``<node>.<field>`` → value, to compare with what QEMU applied (``format_node``: whether the
    graph has one over the protocol node; ``protocol``: the protocol node's driver, where it
    is checked)."""
    flags = cache_flags(config)
    out: dict[str, str] = {}
    roles = ((FILE_NODE, protocol), (FORMAT_NODE, config.format or "raw"))
    for node, driver in roles if format_node else roles[:1]:
        if driver is not None:
            out[f"{node}.driver"] = driver
        out[f"{node}.cache.direct"] = qemu_bool(flags.direct)
        out[f"{node}.cache.no-flush"] = qemu_bool(flags.no_flush)
    return out



LIBVIRT_ISCSI = ("an iSCSI LUN with platform libvirt is not modelled (libvirt's <disk "
                 "type='network'> is not built here): use platform qemu or proxmox")
PVE_NO_CHAP = ("Proxmox VE's iscsidirect storage passes no CHAP credentials to QEMU: a LUN "
               "that needs CHAP cannot be attached as Proxmox VE does (use platform qemu)")

# -- the daemon's graph per platform (blocklayer mode) ----------------------------------------

class DaemonGraph(Frozen):
    """What a qemu-storage-daemon gets for one image: ``--object`` and ``--blockdev`` values
    (JSON) and the node its export sits on."""

    objects: tuple[str, ...] = ()
    blockdevs: tuple[str, ...]
    export_node: str


def daemon_graph(config: Configuration, image: Path, *, is_device: bool = False,
                 size: int | None = None, platform: Platform = "qemu",
                 pve_version: PveVersion | None = None,
                 libvirt: lv.Versions | None = None, lun: IscsiLun | None = None) -> DaemonGraph:
    """The image's block graph in a qemu-storage-daemon as ``platform`` builds a disk's graph
    for the configuration's settings. qemu: iomatrix's own two nodes, the export on the format
    node. libvirt (``libvirt``: the libvirt and QEMU modelled, by default
    :class:`iomatrix.platform.libvirt.Versions`' own): ``libvirt-1-storage`` and, where that
    libvirt gives the disk one, ``libvirt-1-format`` over it
    (:func:`iomatrix.platform.libvirt.disk_args`), the export on the top one. proxmox:
    qemu-server's layers (:func:`iomatrix.platform.proxmox.daemon_graph`): detect-zeroes,
    discard, and on PVE 9 the throttle filter over an empty throttle group, the export on the
    top node. An iSCSI ``lun``: libiscsi's node (proxmox: its ``iscsidirect`` storage)."""
    if platform == "libvirt" and lun is not None:
        raise InvalidCombination(f"{config.key}: {LIBVIRT_ISCSI}")
    if platform == "libvirt":
        disk, _ = lv.disk_for(LIBVIRT_BUS, source=str(image), block=is_device, aio=config.aio,
                              cache=config.cache, iothread=False, fmt=config.format or "raw")
        argv = lv.disk_args(disk, libvirt or lv.Versions(), size=size).argv
        nodes = tuple(argv[i + 1] for i, a in enumerate(argv) if a == "-blockdev")
        return DaemonGraph(blockdevs=nodes, export_node=json.loads(nodes[-1])["node-name"])
    if platform != "proxmox":
        nodes = blockdev_nodes(config, image, is_device=is_device, size=size, lun=lun)
        return DaemonGraph(blockdevs=tuple(json.dumps(n, separators=(",", ":")) for n in nodes),
                           export_node=FORMAT_NODE)
    drive = _pve_drive(config, iscsi.pve_volume(lun) if lun else str(image))
    volume = pve_volume(config, drive, is_device=is_device, lun=lun)
    graph = pve.daemon_graph(drive, volume, version=pve_version or pve.DEFAULT_PVE_VERSION,
                             size=size)
    return DaemonGraph(objects=graph.objects, blockdevs=(graph.blockdev,), export_node=graph.top)


def expected_daemon_graph(config: Configuration, *, platform: Platform = "qemu",
                          pve_version: PveVersion | None = None,
                          libvirt: lv.Versions | None = None,
                          is_device: bool = False, protocol: str | None = None) -> dict[str, str]:
    """What a daemon from :func:`daemon_graph` must report over QMP, nodes named by role
    (``file0``, ``disk0``, ``throttle0``): :func:`expected_node_flags`, each node's
    detect-zeroes, the filter, the export's node and the count of throttle groups. QMP does not
    report a node's discard mode, so it is not checked."""
    format_node = platform != "libvirt" or libvirt_format_node(config, libvirt, is_device)
    out = expected_node_flags(config, format_node=format_node, protocol=protocol)
    roles = {"protocol": FILE_NODE, "format": FORMAT_NODE, "throttle": THROTTLE_NODE}
    if platform != "proxmox":
        zeroes = {"protocol": "off", "format": "off"} if format_node else {"protocol": "off"}
        groups, top = 0, FORMAT_NODE if format_node else FILE_NODE
    else:
        version = pve_version or pve.DEFAULT_PVE_VERSION
        zeroes = pve.daemon_detect_zeroes(_pve_drive(config, "/"), version)
        groups, top = (1, THROTTLE_NODE) if version >= 9 else (0, FORMAT_NODE)
    out |= {f"{roles[role]}.detect-zeroes": value for role, value in zeroes.items()}
    if groups:   # the filter gets no cache option: QEMU's defaults
        out |= {f"{THROTTLE_NODE}.driver": "throttle", f"{THROTTLE_NODE}.cache.direct": "false",
                f"{THROTTLE_NODE}.cache.no-flush": "false"}
    return out | {"export.node": top, "throttle-groups": str(groups)}


def libvirt_format_node(config: Configuration, libvirt: lv.Versions | None,
                        is_device: bool) -> bool:
    """Whether the disk libvirt gets for the configuration has a node in the format role (a
    block device's test area is a raw slice node: :func:`daemon_graph` passes its size)."""
    return lv.has_format_node(config.format or "raw", libvirt or lv.Versions(),
                              sliced=is_device)


def pve_volume(config: Configuration, drive: pve.Drive, *, is_device: bool,
               lun: IscsiLun | None) -> pve.Volume:
    """The drive's volume as qemu-server resolves it: a path, or an iSCSI LUN on an
    ``iscsidirect`` storage (which has no CHAP settings: a LUN that needs CHAP is refused)."""
    if lun is None:
        return pve.resolve_volume(drive, is_device=is_device)
    if lun.chap is not None:
        raise InvalidCombination(f"{config.key}: {PVE_NO_CHAP}")
    return pve.resolve_volume(drive, iscsi.pve_storages(lun))


def _pve_drive(config: Configuration, volume: str) -> pve.Drive:
    drive, _ = pve.drive_for(PVE_BUS, volume=volume, aio=config.aio, cache=config.cache,
                             iothread=False, fmt=config.format or "raw")
    return drive


def nodes_by_role(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``query-named-block-nodes`` with each node named by its role in the disk's graph
    (protocol ``file0``, format ``disk0``, filter ``throttle0``), as iomatrix's own graph names
    them; a graph of iomatrix's own is returned unchanged."""
    roles = {"file": FILE_NODE, "host_device": FILE_NODE, "rbd": FILE_NODE, "iscsi": FILE_NODE,
             "raw": FORMAT_NODE,
             "qcow2": FORMAT_NODE, "throttle": THROTTLE_NODE}
    if any(n.get("node-name") in (FILE_NODE, FORMAT_NODE) for n in nodes):
        return nodes
    out, seen = [], set()
    for node in nodes:
        role = roles.get(str(node.get("drv")))
        if role is not None and role not in seen:
            seen.add(role)
            node = {**node, "node-name": role}
        out.append(node)
    return out
