"""Proxmox VE 9's snapshots as a volume chain on thick LVM (``[target] lvm`` ``volume_chain``):
a qcow2 on a logical volume, with ``snapshots`` that many LVs under it as its backing chain.

The graph for a qcow2 on a block device with backing images, for each platform (pure), and
what QEMU reports of it; the LVM runs are on the LVM stand-in (``tests/fixtures/standins/lvm``:
loop devices handed out as logical volumes), since this kernel has no device-mapper."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from iomatrix.platform.settings import backing_node
from iomatrix.qemu.blockdev import daemon_graph, expected_daemon_graph, nodes_by_role
from iomatrix.suite.configuration import Configuration


def _config(**kw: Any) -> Configuration:
    values: dict[str, Any] = dict(mode="blocklayer", aio="native", cache="none", format="qcow2",
                                  iothread=False, preallocation="metadata")
    return Configuration(**(values | kw))


def _nodes(blockdevs: tuple[str, ...]) -> list[dict[str, Any]]:
    return [json.loads(node) for node in blockdevs]


# -- the graph (pure) -------------------------------------------------------------------------

def test_qemu_graph_opens_the_chain_as_nodes_of_its_own() -> None:
    """iomatrix's own graph: each backing image a protocol node like the top's and a read-only
    qcow2 node over it, deepest first, the top's format node naming the nearest; the deepest
    opens nothing its header names; a qcow2 on a device is never sliced (no ``size``)."""
    chain = (Path("/dev/vg/snap2"), Path("/dev/vg/snap1"))
    graph = daemon_graph(_config(), Path("/dev/vg/top"), is_device=True, size=1 << 26,
                         backing=chain)
    nodes = _nodes(graph.blockdevs)
    assert [n["node-name"] for n in nodes] == [
        "backing2-file", "backing2", "backing1-file", "backing1", "file0", "disk0"]
    by_name = {n["node-name"]: n for n in nodes}
    assert by_name["disk0"]["backing"] == "backing1" and "size" not in by_name["disk0"]
    assert by_name["backing1"]["backing"] == "backing2" and by_name["backing2"]["backing"] is None
    assert [by_name[backing_node(d)[1]]["filename"] for d in (1, 2)] == [str(p) for p in chain]
    for depth in (1, 2):
        fmt, file = (by_name[name] for name in backing_node(depth))
        assert fmt["driver"] == "qcow2" and fmt["read-only"] and file["read-only"]
        assert file["driver"] == "host_device" and file["aio"] == "native"
        assert file["cache"] == fmt["cache"] == by_name["disk0"]["cache"]
    plain = _nodes(daemon_graph(_config(), Path("/dev/vg/top"), is_device=True).blockdevs)
    assert [n["node-name"] for n in plain] == ["file0", "disk0"] and "backing" not in plain[1]


def test_proxmox_graph_nests_the_chain_as_qemu_server() -> None:
    """PVE 9 (Blockdev.pm generate_backing_chain_blockdev): each snapshot's layers nested as the
    ``backing`` of the one above, node names hashed with the snapshot's name, every qcow2 node
    with ``discard-no-unref`` (bug #6543); PVE 8 and libvirt refuse a chain in one line."""
    chain = (Path("/dev/vg/snap2"), Path("/dev/vg/snap1"))
    graph = daemon_graph(_config(), Path("/dev/vg/top"), is_device=True, platform="proxmox",
                         pve_version=9, backing=chain)
    top, = _nodes(graph.blockdevs)
    fmt = top["file"]
    seen = []
    while fmt is not None:
        assert fmt["driver"] == "qcow2" and fmt["discard-no-unref"] is True
        assert fmt["file"]["driver"] == "host_device" and fmt["file"]["aio"] == "native"
        seen.append((fmt["node-name"], fmt["file"]["node-name"], fmt["file"]["filename"]))
        fmt = fmt.get("backing")
    assert [path for _, _, path in seen] == ["/dev/vg/top", *map(str, chain)]
    names = [name for node in seen for name in node[:2]]
    assert len(set(names)) == len(names)
    for version, platform in ((8, "proxmox"), (None, "libvirt")):
        with pytest.raises(ValueError, match="chain"):
            daemon_graph(_config(), Path("/dev/vg/top"), is_device=True, platform=platform,
                         pve_version=version, backing=chain)


def test_nodes_by_role_reads_a_nested_chain_by_depth() -> None:
    """QEMU lists a nested chain's nodes deepest first (as a PVE 9 daemon holds them): roles
    come from each qcow2 node's backing depth and the file it opens, not from the order."""
    listed = [
        {"node-name": "drive-virtio0", "drv": "throttle", "file": "json:{}",
         "backing_file_depth": 2},
        {"node-name": "fb", "drv": "qcow2", "file": "/dev/loop7", "backing_file_depth": 0},
        {"node-name": "eb", "drv": "host_device", "file": "/dev/loop7", "backing_file_depth": 0},
        {"node-name": "ft", "drv": "qcow2", "file": "/dev/loop8", "backing_file_depth": 1},
        {"node-name": "et", "drv": "host_device", "file": "/dev/loop8", "backing_file_depth": 0}]
    named = {n["node-name"]: n["file"] for n in nodes_by_role(listed)}
    assert named == {"throttle0": "json:{}", "backing1": "/dev/loop7",
                     "backing1-file": "/dev/loop7", "disk0": "/dev/loop8", "file0": "/dev/loop8"}
    want = expected_daemon_graph(_config(), platform="proxmox", pve_version=9, is_device=True,
                                 backing=1)
    assert want["disk0.backing-depth"] == "1" and want["backing1.driver"] == "qcow2"
