"""Cluster load on an iSCSI LUN in guest and blocklayer modes: how the controller splits the LUN
(``clusterblock.region_images``), one equal region per node, each split again per guest."""

from __future__ import annotations

from pathlib import Path

import pytest

from iomatrix.core.errors import TrialFailed
from iomatrix.drivers.clusterblock import region_images
from iomatrix.targets.workspace import Image

MIB = 1 << 20


def lun(size: int) -> Image:
    return Image(path=Path("iscsi://192.0.2.1:3260/iqn.2026-11.org.example:t/1"), format="raw",
                 preallocation="off", size=size, is_device=True)


@pytest.mark.parametrize("size, nodes, vms, want", [
    (33 * MIB, 2, 1, [(0, 16), (16, 16)]),
    (33 * MIB, 2, 2, [(0, 8), (8, 8), (16, 8), (24, 8)]),
    (64 * MIB, 3, 2, [(0, 10), (10, 10), (21, 10), (31, 10), (42, 10), (52, 10)]),
    (5 * MIB + 7, 1, 3, [(0, 1), (1, 1), (2, 1)]),
])
def test_each_node_gets_a_region_and_its_guests_split_it(size: int, nodes: int, vms: int,
                                                         want: list[tuple[int, int]]) -> None:
    got = region_images(lun(size), nodes, vms)
    assert [(i.offset // MIB, i.size // MIB) for i in got] == want
    assert all(i.offset % MIB == 0 and i.size % MIB == 0 for i in got)
    assert all(a.offset + a.size <= b.offset for a, b in zip(got, got[1:]))
    assert got[-1].offset + got[-1].size <= size
    assert {i.path for i in got} == {lun(size).path} and all(i.is_device for i in got)


def test_a_lun_with_no_whole_mib_for_each_is_refused() -> None:
    with pytest.raises(TrialFailed, match="no MiB for each of 3 nodes"):
        region_images(lun(2 * MIB), 3)
    with pytest.raises(TrialFailed, match="no MiB for each of 2 guests of a node"):
        region_images(lun(3 * MIB), 2, 2)
