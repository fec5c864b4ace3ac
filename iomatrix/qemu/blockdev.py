"""A disk's block graph for qemu-storage-daemon and what QEMU must report of it, for every
platform: each platform module builds its graph (``PLATFORMS[name].storage_graph``) and says
its shape (``graph_shape``); this module dispatches and reads nodes back by their role.
"""

from __future__ import annotations

from pathlib import Path

from iomatrix.core.wire import QmpObject
from iomatrix.platform import PLATFORMS, platform_version
from iomatrix.platform.libvirt import Versions
from iomatrix.platform.qemu import FILE_NODE, FORMAT_NODE, cache_flags
from iomatrix.platform.settings import DiskImage, NetworkNode, StorageGraph, backing_node
from iomatrix.qemu.escape import qemu_bool
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.fields import PveVersion
from iomatrix.vocab.axes import Platform

THROTTLE_NODE = "throttle0"
"""The filter's role name, as iomatrix.qemu.args reads a platform's graph back."""


def expected_node_flags(config: Configuration, *, format_node: bool = True,
                        network: str | None = None, backing: int = 0) -> dict[str, str]:
    """What ``query-named-block-nodes`` must report for the configuration, flattened as
    ``<node>.<field>`` → value, to compare with what QEMU applied (``format_node``: whether the
    graph has one over the protocol node; ``network``: the protocol node's driver, rbd, which
    must be the one QEMU opened; ``backing``: the length of the image's backing chain, each
    image of it a qcow2 with the top's cache flags, the top's depth QEMU's own count)."""
    flags = cache_flags(config)
    out: dict[str, str] = {f"{FILE_NODE}.driver": network} if network else {}
    roles = [(FILE_NODE, None), (FORMAT_NODE, config.format or "raw")]
    roles = roles if format_node else roles[:1]
    for depth in range(1, backing + 1):
        fmt_name, file_name = backing_node(depth)
        roles += [(file_name, None), (fmt_name, "qcow2")]
    for node, driver in roles:
        if driver is not None:
            out[f"{node}.driver"] = driver
        out[f"{node}.cache.direct"] = qemu_bool(flags.direct)
        out[f"{node}.cache.no-flush"] = qemu_bool(flags.no_flush)
    if backing:
        out[f"{FORMAT_NODE}.backing-depth"] = str(backing)
    return out


# -- the daemon's graph per platform (blocklayer mode) ----------------------------------------

def daemon_graph(config: Configuration, image: Path, *, is_device: bool = False,
                 size: int | None = None, platform: Platform = "qemu",
                 pve_version: PveVersion | None = None,
                 libvirt: Versions | None = None,
                 network: NetworkNode | None = None,
                 backing: tuple[Path, ...] = (), offset: int = 0) -> StorageGraph:
    """The image's block graph in a qemu-storage-daemon as ``platform`` builds a disk's graph
    for the configuration's settings (``PLATFORMS[platform].storage_graph``): qemu, iomatrix's
    own two nodes; libvirt (at ``libvirt``), its storage and format nodes; proxmox (PVE
    ``pve_version``), qemu-server's layers. A ``network`` volume (rbd) is opened by its
    protocol driver (libvirt's graph of one is not modelled: ValueError); a qcow2's
    ``backing`` chain (nearest first) gets nodes of its own; a device's raw node from ``offset``
    (``size`` bytes: a region of it). The export goes on ``export_node``."""
    disk = DiskImage(path=str(image), is_device=is_device, size=size, offset=offset,
                     network=network,
                     backing=tuple(str(path) for path in backing))
    return PLATFORMS[platform].storage_graph(config, disk, platform_version(pve_version, libvirt))


def expected_daemon_graph(config: Configuration, *, platform: Platform = "qemu",
                          pve_version: PveVersion | None = None,
                          libvirt: Versions | None = None,
                          is_device: bool = False, network: str | None = None,
                          backing: int = 0) -> dict[str, str]:
    """What a daemon from :func:`daemon_graph` must report over QMP, nodes named by role
    (``file0``, ``disk0``, ``throttle0``, a backing chain's ``backing1``…):
    :func:`expected_node_flags`, each node's detect-zeroes, the filter, the export's node and
    the count of throttle groups. QMP does not report a node's discard mode, so it is not
    checked."""
    shape = PLATFORMS[platform].graph_shape(config, platform_version(pve_version, libvirt),
                                            is_device=is_device)
    out = expected_node_flags(config, format_node=shape.format_node, network=network,
                              backing=backing)
    roles = {"protocol": FILE_NODE, "format": FORMAT_NODE, "throttle": THROTTLE_NODE}
    out |= {f"{roles[role]}.detect-zeroes": value for role, value in shape.detect_zeroes.items()}
    if shape.throttle:
        out |= throttle_flags()
    top = THROTTLE_NODE if shape.throttle else FORMAT_NODE if shape.format_node else FILE_NODE
    return out | {"export.node": top, "throttle-groups": str(int(shape.throttle))}


def throttle_flags() -> dict[str, str]:
    """What QEMU reports of a throttle filter: it gets no cache option, so QEMU's defaults."""
    return {f"{THROTTLE_NODE}.driver": "throttle", f"{THROTTLE_NODE}.cache.direct": "false",
            f"{THROTTLE_NODE}.cache.no-flush": "false"}


def nodes_by_role(nodes: list[QmpObject]) -> list[QmpObject]:
    """``query-named-block-nodes`` with each node named by its role in the disk's graph
    (protocol ``file0``, format ``disk0``, filter ``throttle0``, a backing chain's
    :func:`_chain_roles`), as iomatrix's own graph names them; a graph of iomatrix's own is
    returned unchanged."""
    roles = {"file": FILE_NODE, "host_device": FILE_NODE, "rbd": FILE_NODE, "iscsi": FILE_NODE,
             "raw": FORMAT_NODE, "qcow2": FORMAT_NODE, "throttle": THROTTLE_NODE}
    if any(n.get("node-name") in (FILE_NODE, FORMAT_NODE) for n in nodes):
        return nodes
    chain = _chain_roles(nodes)
    out, seen = [], set(chain.values())
    for node in nodes:
        role = chain.get(str(node.get("node-name")))
        if role is None and roles.get(str(node.get("drv"))) not in seen:
            role = roles.get(str(node.get("drv")))
        if role is not None:
            seen.add(role)
            node = {**node, "node-name": role}
        out.append(node)
    return out


def _chain_roles(nodes: list[QmpObject]) -> dict[str, str]:
    """node-name → role for a qcow2 with a backing chain (QEMU lists a nested chain's nodes
    deepest first): its qcow2 nodes by their ``backing_file_depth`` (the deepest count: the
    top, ``disk0``; one less: ``backing1``…), each protocol node by the file its qcow2 node
    opens. Empty without a chain."""
    formats = sorted((n for n in nodes if n.get("drv") == "qcow2"),
                     key=lambda n: -int(n.get("backing_file_depth") or 0))
    top = int(formats[0].get("backing_file_depth") or 0) if formats else 0
    if not top:
        return {}
    out: dict[str, str] = {}
    by_file: dict[str, str] = {}
    for node in formats:
        depth = top - int(node.get("backing_file_depth") or 0)
        fmt_name, file_name = backing_node(depth) if depth else (FORMAT_NODE, FILE_NODE)
        out[str(node.get("node-name"))] = fmt_name
        by_file[str(node.get("file"))] = file_name
    for node in nodes:
        if node.get("drv") in ("file", "host_device") and str(node.get("file")) in by_file:
            out[str(node.get("node-name"))] = by_file[str(node.get("file"))]
    return out
