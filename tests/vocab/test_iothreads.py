"""The ``iothreads`` and ``vq_mapping`` axes (issue 35): declared once in ``iomatrix.vocab.axes``,
hidden from keys and labels when unset, and the combinations iomatrix refuses before anything
runs, with QEMU's own words where QEMU states the rule (hw/virtio/iothread-vq-mapping.c)."""

from __future__ import annotations

from typing import Any

import pytest

from iomatrix.core.errors import InvalidCombination, SuiteError
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.expand import expand, iothreads_reason
from iomatrix.suite.load import load_suite_text
from iomatrix.vocab.axes import (BLOCKLAYER_AXES, CONFIG_AXES, DEFAULT_UNSET, MODE_AXES,
                                 PARAMETERS, vq_groups)

SUITE = """
[suite]
name = "iothreads"
[method]
mode = "{mode}"
[target]
size = "64MiB"
directory = "/srv/bench"
[matrix]
controller = "{controller}"
{matrix}
[[workloads]]
rw = "randread"
"""


def _expand(matrix: str, mode: str = "guest", controller: str = "virtio-blk") -> Any:
    return expand(load_suite_text(SUITE.format(mode=mode, matrix=matrix, controller=controller)))


def test_declared_once_guest_only_and_unset_hidden() -> None:
    assert CONFIG_AXES.index("iothreads") == CONFIG_AXES.index("iothread") + 1
    assert {"iothreads", "vq_mapping"} <= set(MODE_AXES["guest"]) & set(PARAMETERS)
    assert not {"iothreads", "vq_mapping"} & (set(MODE_AXES["blocklayer"]) | set(BLOCKLAYER_AXES))
    assert "iothreads" not in DEFAULT_UNSET          # unset is a level (one IOThread), not QEMU's guess
    plain = Configuration(mode="guest", controller="virtio-blk", iothread=True, cache="none")
    assert "iothreads" not in plain.key and plain.label == "guest virtio-blk/none iothread"
    two = plain.model_copy(update={"iothreads": 2, "vq_mapping": "0:1", "num_queues": 2})
    assert two.key == ("guest/controller=virtio-blk/iothread=on/iothreads=2/vq_mapping=0:1/"
                       "cache=none/num_queues=2")
    assert two.label == "guest virtio-blk/none iothread×2 vq=0:1 q=2"
    assert vq_groups("0,1:2,3") == ((0, 1), (2, 3)) and vq_groups("round-robin") is None


def test_one_thread_and_round_robin_are_the_unset_levels() -> None:
    """iothreads = 1 is iothread = true's single IOThread and round-robin QEMU's default: both
    stored as no level, so the keys of runs before the axes existed stay as they were."""
    keys = [c.key for c in _expand('iothread = true\niothreads = [1, 2]\n'
                                   'vq_mapping = "round-robin"').configurations]
    assert keys == [
        "guest/controller=virtio-blk/aio=io_uring/iothread=on/cache=none/format=raw/"
        "preallocation=off/vms=1",
        "guest/controller=virtio-blk/aio=io_uring/iothread=on/iothreads=2/cache=none/format=raw/"
        "preallocation=off/vms=1"]


@pytest.mark.parametrize(("matrix", "controller", "reason"), [
    ("iothread = false\niothreads = 2", "virtio-blk", "iothreads = 2 needs iothread = true"),
    ('iothreads = 2\nvq_mapping = "0:1:2"\nnum_queues = 3', "virtio-blk",
     "vq_mapping 0:1:2 names 3 IOThread(s) but iothreads = 2"),
    ('iothreads = 2\nvq_mapping = "0:1"', "virtio-blk", "vq_mapping 0:1 needs num_queues"),
    ('iothreads = 2\nvq_mapping = "0:1,4"\nnum_queues = 4', "virtio-scsi-single",
     "vq index 4 for IOThread 1 must be less than num_queues 4"),
    ('iothreads = 2\nvq_mapping = "0,1:1"\nnum_queues = 2', "virtio-blk",
     "cannot assign vq 1 to IOThread 1 because it is already assigned"),
    ('iothreads = 2\nvq_mapping = "0:2"\nnum_queues = 3', "virtio-blk",
     "missing vq 1 IOThread assignment in iothread-vq-mapping"),
    ("iothreads = 2", "nvme", "Property 'nvme.iothread' not found"),
    ('iothreads = 2\ndata_path = "vhost-user-blk"', "virtio-blk",
     "Property 'vhost-user-blk-pci.iothread-vq-mapping' not found"),
    ('vq_mapping = "0:1"\nnum_queues = 2', "virtio-blk", "vq_mapping needs iothreads"),
])
def test_refused_in_one_line(matrix: str, controller: str, reason: str) -> None:
    text = matrix if "iothread =" in matrix else "iothread = true\n" + matrix
    with pytest.raises(InvalidCombination) as caught:
        _expand(text, controller=controller)
    assert reason in str(caught.value) and "\n" not in str(caught.value)


def test_a_mapping_iomatrix_cannot_read_is_refused_by_the_suite() -> None:
    for bad in ('"0;1"', '"0:"', '"/tmp/x"', '"-1"'):
        with pytest.raises(SuiteError, match="vq_mapping"):
            _expand(f"iothread = true\niothreads = 2\nvq_mapping = {bad}")
    with pytest.raises(SuiteError, match="iothreads"):
        _expand("iothread = true\niothreads = 0")


def test_blocklayer_notes_the_axis_is_not_measured() -> None:
    expansion = _expand("iothread = true\niothreads = [2, 4]", mode="blocklayer")
    assert all(c.iothreads is None for c in expansion.configurations)
    (note,) = [n for n in expansion.notes if "iothreads is ignored" in n]
    assert note.startswith("[matrix] iothreads is ignored in blocklayer mode (values 2, 4 not "
                           "used): qemu-storage-daemon's exports take one IOThread each before "
                           "QEMU 10.1")


def test_a_valid_explicit_mapping_passes() -> None:
    config = Configuration(mode="guest", controller="virtio-scsi", iothread=True, iothreads=2,
                           vq_mapping="0,2:1,3", num_queues=4)
    assert iothreads_reason(config) is None
