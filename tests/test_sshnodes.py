"""The SSH node fixture itself (tests/sshnodes.py): real sshd in namespaces, reachable only
from the controller's namespace, each node with its own hostname, nothing left after."""

from __future__ import annotations

import subprocess

import pytest

from tests.sshnodes import SshCluster, _in_netns, ssh_nodes  # noqa: F401 (a fixture)


@pytest.mark.slow
def test_nodes_answer_over_ssh_with_their_own_hostnames(ssh_nodes) -> None:  # type: ignore[no-untyped-def]
    cluster: SshCluster = ssh_nodes(3)
    names = [cluster.ssh(node, "hostname").stdout.strip() for node in cluster.nodes]
    assert names == ["node1", "node2", "node3"]
    # the addresses exist only inside the namespaces: the host's own stack does not reach them
    outside = subprocess.run(["ssh", "-F", "none", "-o", "BatchMode=yes", "-o",
                              "ConnectTimeout=2", cluster.nodes[0].address, "true"],
                             capture_output=True, text=True, timeout=30)
    assert outside.returncode == 255
    # a host key the known_hosts file does not hold is refused, not accepted
    cluster.known_hosts.write_text(cluster.known_hosts.read_text().splitlines()[1] + "\n")
    refused = cluster.ssh(cluster.nodes[0], "true")
    assert refused.returncode == 255 and "Host key verification failed" in refused.stderr


def test_a_killed_node_leaves_nothing(ssh_nodes) -> None:  # type: ignore[no-untyped-def]
    cluster: SshCluster = ssh_nodes(2)
    node = cluster.nodes[1]
    session = subprocess.Popen(cluster.controller(
        ["ssh", "-F", "none", "-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={cluster.known_hosts}",
         "-i", str(cluster.identity), "-l", "root", node.address, "sleep 600"]),
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert _wait(lambda: any("sleep 600" in line for line in cluster.leftovers(node)))
        cluster.kill(node)
        assert cluster.processes(node) == []
        assert cluster.ssh(cluster.nodes[0], "true").returncode == 0
    finally:
        session.kill()
        session.wait(timeout=30)


def _wait(predicate, timeout: float = 30) -> bool:  # type: ignore[no-untyped-def]
    import time
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
