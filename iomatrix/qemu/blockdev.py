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
from iomatrix.platform.settings import DiskImage, NetworkNode, StorageGraph
from iomatrix.qemu.escape import qemu_bool
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.fields import PveVersion
from iomatrix.vocab.axes import Platform

THROTTLE_NODE = "throttle0"
"""The filter's role name, as iomatrix.qemu.args reads a platform's graph back."""


def expected_node_flags(config: Configuration, *, format_node: bool = True,
                        network: str | None = None) -> dict[str, str]:
    """What ``query-named-block-nodes`` must report for the configuration, flattened as
    ``<node>.<field>`` → value, to compare with what QEMU applied (``format_node``: whether the
    graph has one over the protocol node; ``network``: the protocol node's driver, rbd, which
    must be the one QEMU opened)."""
    flags = cache_flags(config)
    out: dict[str, str] = {f"{FILE_NODE}.driver": network} if network else {}
    roles = ((FILE_NODE, None), (FORMAT_NODE, config.format or "raw"))
    for node, driver in roles if format_node else roles[:1]:
        if driver is not None:
            out[f"{node}.driver"] = driver
        out[f"{node}.cache.direct"] = qemu_bool(flags.direct)
        out[f"{node}.cache.no-flush"] = qemu_bool(flags.no_flush)
    return out


# -- the daemon's graph per platform (blocklayer mode) ----------------------------------------

def daemon_graph(config: Configuration, image: Path, *, is_device: bool = False,
                 size: int | None = None, platform: Platform = "qemu",
                 pve_version: PveVersion | None = None,
                 libvirt: Versions | None = None,
                 network: NetworkNode | None = None) -> StorageGraph:
    """The image's block graph in a qemu-storage-daemon as ``platform`` builds a disk's graph
    for the configuration's settings (``PLATFORMS[platform].storage_graph``): qemu, iomatrix's
    own two nodes; libvirt (at ``libvirt``), its storage and format nodes; proxmox (PVE
    ``pve_version``), qemu-server's layers. A ``network`` volume (rbd) is opened by its
    protocol driver (libvirt's graph of one is not modelled: ValueError). The export goes on
    ``export_node``."""
    return PLATFORMS[platform].storage_graph(
        config, DiskImage(path=str(image), is_device=is_device, size=size, network=network),
        platform_version(pve_version, libvirt))


def expected_daemon_graph(config: Configuration, *, platform: Platform = "qemu",
                          pve_version: PveVersion | None = None,
                          libvirt: Versions | None = None,
                          is_device: bool = False, network: str | None = None) -> dict[str, str]:
    """What a daemon from :func:`daemon_graph` must report over QMP, nodes named by role
    (``file0``, ``disk0``, ``throttle0``): :func:`expected_node_flags`, each node's
    detect-zeroes, the filter, the export's node and the count of throttle groups. QMP does not
    report a node's discard mode, so it is not checked."""
    shape = PLATFORMS[platform].graph_shape(config, platform_version(pve_version, libvirt),
                                            is_device=is_device)
    out = expected_node_flags(config, format_node=shape.format_node, network=network)
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
    (protocol ``file0``, format ``disk0``, filter ``throttle0``), as iomatrix's own graph names
    them; a graph of iomatrix's own is returned unchanged."""
    roles = {"file": FILE_NODE, "host_device": FILE_NODE, "rbd": FILE_NODE, "iscsi": FILE_NODE,
             "raw": FORMAT_NODE, "qcow2": FORMAT_NODE, "throttle": THROTTLE_NODE}
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
