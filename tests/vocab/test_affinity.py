"""The CPU affinity axes (issue 35): vcpu_affinity, iothread_affinity and main_affinity, declared
once in ``iomatrix.vocab.axes``; their CPU sets parsed strictly (``iomatrix.core.cpuset``), a
suite that names none unchanged, a suite that names them keyed and labelled by them."""

from __future__ import annotations

from pathlib import Path

import pytest

from iomatrix.core import cpuset
from iomatrix.core.errors import SuiteError
from iomatrix.suite.expand import expand
from iomatrix.vocab.axes import AFFINITY_AXES, CONFIG_AXES, MODE_AXES, NOT_SETTINGS, PARAMETERS
from tests.vocab.test_discard import axis_suite

def test_declared_once_with_their_modes() -> None:
    assert all(axis in CONFIG_AXES for axis in AFFINITY_AXES)
    # fio's own cpus_allowed; how many cluster nodes load the target at once
    assert MODE_AXES["host"] == ("node_count", "vcpu_affinity")
    assert all(axis in MODE_AXES["guest"] and axis in MODE_AXES["blocklayer"]
               for axis in AFFINITY_AXES)
    assert not set(AFFINITY_AXES) & set(PARAMETERS)     # not a disk setting recommend decides
    assert set(AFFINITY_AXES) <= set(NOT_SETTINGS)


@pytest.mark.parametrize("text, canonical", [
    ("0", "0"), ("1,0", "0-1"), ("0-3,8", "0-3,8"), (" 3, 1-2 ,7 ", "1-3,7"), ("NUMA", "numa"),
    ("5-5", "5")])
def test_cpu_sets_are_canonical(text: str, canonical: str) -> None:
    assert cpuset.level(text) == canonical
    if canonical != "numa":
        assert cpuset.parse(canonical) == cpuset.parse(text)


@pytest.mark.parametrize("text", ["", "a", "0-", "-1", "3-1", "0,,1", "0;ls", "0 1", "0x1",
                                  "8192", "0-99999", "all", "$(id)"])
def test_cpu_sets_refused(text: str) -> None:
    with pytest.raises(ValueError):
        cpuset.level(text)
    with pytest.raises(SuiteError, match="vcpu_affinity"):
        axis_suite(matrix=f'vcpu_affinity = ["{text}"]')


def test_unset_changes_no_key_and_set_ones_are_keyed_and_labelled() -> None:
    plain = expand(axis_suite()).configurations
    assert all("affinity" not in c.key and "@" not in c.label for c in plain)
    pinned = expand(axis_suite(matrix='vcpu_affinity = ["1,0", "1"]\niothread_affinity = "numa"\n'
                                  'main_affinity = "0"')).configurations
    keys = [c.key for c in pinned]
    assert len(keys) == 2 and len(set(keys)) == 2
    assert all("iothread_affinity=numa" in k and "main_affinity=0" in k for k in keys)
    assert {c.vcpu_affinity for c in pinned} == {"0-1", "1"}
    # blocklayer: fio runs where vcpu_affinity says
    assert {c.label.split(" fio@")[1] for c in pinned} == {"0-1", "1"}
    assert all(" iothread@numa main@0" in c.label for c in pinned)
    guest = expand(axis_suite("guest", 'vcpu_affinity = "0"')).configurations
    assert [c.label.count(" vcpu@0") for c in guest if c.mode == "guest"] == [1]
    host = expand(axis_suite("host", 'vcpu_affinity = "1"')).configurations
    assert [(c.key, c.label) for c in host] == [("host/vcpu_affinity=1",
                                                 "host (bare metal) fio@1")]


def test_host_facts(tmp_path: Path) -> None:
    """online CPUs, a device's NUMA node and "numa" resolved, on a /sys of our own."""
    (tmp_path / "devices/system/cpu").mkdir(parents=True)
    (tmp_path / "devices/system/cpu/online").write_text("0-3\n")
    (tmp_path / "devices/system/node/node1").mkdir(parents=True)
    (tmp_path / "devices/system/node/node1/cpulist").write_text("2-3\n")
    for name, node in (("nvme0n1", "1"), ("loop0", None), ("vda", "-1")):
        (tmp_path / "class/block" / name / "device").mkdir(parents=True)
        if node is not None:
            (tmp_path / "class/block" / name / "device/numa_node").write_text(node + "\n")
    assert cpuset.resolve("numa", "/dev/nvme0n1", tmp_path) == (frozenset({2, 3}), "")
    for device in ("loop0", "vda", None):
        cpus, note = cpuset.resolve("numa", device, tmp_path)
        assert cpus == frozenset(range(4)) and "no NUMA node" in note and "0-3" in note
    assert cpuset.resolve("1,3", "loop0", tmp_path) == (frozenset({1, 3}), "")
    with pytest.raises(ValueError, match=r"CPU 4-5 is not an online CPU of this host \(online: "
                                         r"0-3\)"):
        cpuset.resolve("0,4-5", None, tmp_path)
    assert cpuset.online() >= {0}                       # this host's own
