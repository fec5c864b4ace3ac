"""``[matrix] node_count`` (issue 37): which nodes a configuration's trials load, the disks a
guest configuration gets on them, and what a suite or a run is refused for."""

from __future__ import annotations

import pytest

from iomatrix.cluster.ssh import Node
from iomatrix.core.errors import SuiteError
from iomatrix.drivers.cluster import on_every_node, taking_part
from iomatrix.measure.precheck import check_node_counts
from iomatrix.measure.prepare import prepare
from iomatrix.suite import load_suite_text
from iomatrix.suite.configuration import Configuration

NODES = [Node(host=f"pve{i}") for i in (1, 2, 3)]
SUITE = """[suite]
name = "t"
[target]
directory = "/var/tmp/iomatrix-t"
size = "16MiB"
[workloads]
rw = "randread"
[matrix]
node_count = [1, 3]
vms = [2]
[method]
mode = "{mode}"
{extra}
"""


def test_the_first_node_count_nodes_take_part_each_with_its_guests_disks() -> None:
    guest = Configuration(mode="guest", vms=2, node_count=2)
    assert taking_part(guest, NODES) == NODES[:2]
    assert on_every_node(guest, len(NODES)).vms == 4          # 2 guests on each of 2 nodes
    every = Configuration(mode="guest", vms=2)                # no count: every node
    assert taking_part(every, NODES) == NODES and on_every_node(every, 3).vms == 6
    host = Configuration(mode="host", node_count=1)
    assert taking_part(host, NODES) == NODES[:1] and on_every_node(host, 3) == host


def test_node_counts_are_configurations_keyed_and_labelled_by_them() -> None:
    suite = load_suite_text(SUITE.format(mode="guest", extra="concurrent_nodes = true"))
    configs = prepare(suite).full.configurations
    assert [c.node_count for c in configs] == [1, 3]
    assert [c.key.rpartition("/")[2] for c in configs] == ["node_count=1", "node_count=3"]
    assert configs[1].label.endswith("×2 VMs on 3 nodes")
    check_node_counts(prepare(suite).full, NODES)
    with pytest.raises(SuiteError, match="node_count 3: the run has 2 node"):
        check_node_counts(prepare(suite).full, NODES[:2])


def test_node_counts_in_blocklayer_mode() -> None:
    suite = load_suite_text(SUITE.replace("vms = [2]\n", "").format(
        mode="blocklayer", extra="concurrent_nodes = true"))
    assert [c.node_count for c in prepare(suite).full.configurations] == [1, 3]


def test_node_count_needs_cluster_load() -> None:
    with pytest.raises(SuiteError, match="needs \\[method\\] concurrent_nodes"):
        load_suite_text(SUITE.format(mode="host", extra=""))


def test_a_run_without_node_count_keeps_its_keys() -> None:
    text = SUITE.replace("node_count = [1, 3]\n", "").format(mode="host",
                                                             extra="concurrent_nodes = true")
    (config,) = prepare(load_suite_text(text)).full.configurations
    assert config.key == "host" and config.label == "host (bare metal)"
