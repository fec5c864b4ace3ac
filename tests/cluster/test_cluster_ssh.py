"""Naming nodes (host lists, TOML inventories, a Proxmox VE cluster's .members) and the ssh argv
iomatrix runs on them, run for real against the sshd nodes of tests/sshnodes.py."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from iomatrix.cluster import ssh
from iomatrix.cluster.ssh import Node
from iomatrix.core.errors import NodesError
from tests.sshnodes import SshCluster, ssh_nodes  # noqa: F401 (a fixture)

PVE = Path(__file__).parents[1] / "fixtures" / "pve"


def test_host_lists() -> None:
    nodes = ssh.parse_host_list("pve1, admin@10.0.0.2:2222 [fe80::1%eth0]:22", {"port": 22})
    assert nodes == (Node(host="pve1", port=22), Node(host="10.0.0.2", user="admin", port=2222),
                     Node(host="fe80::1%eth0", port=22))
    assert nodes[1].destination() == "admin@10.0.0.2:2222"
    for bad, why in [("a:99999", "not 1-65535"), ("user@", "not [user@]host"), ("", "no nodes"),
                     ("a a", "named twice"), ("-oProxyCommand=x", "not a host name")]:
        with pytest.raises(NodesError, match=re.escape(why)):
            ssh.parse_host_list(bad)


def test_inventory_file(tmp_path: Path) -> None:
    (tmp_path / "nodes.toml").write_text(
        'user = "root"\nidentity = "keys/id"\nhosts = ["n1", "n2:2200"]\n'
        '[[node]]\nhost = "10.1.1.3"\nname = "n3"\nknown_hosts = "/etc/ssh/n3_known"\n'
        'command = "/opt/iomatrix/bin/iomatrix"\n')
    nodes = ssh.resolve(str(tmp_path / "nodes.toml"))
    key = str(tmp_path / "keys/id")
    assert nodes == (Node(host="n1", user="root", identity=key),
                     Node(host="n2", user="root", port=2200, identity=key),
                     Node(host="10.1.1.3", name="n3", user="root", identity=key,
                          known_hosts="/etc/ssh/n3_known", command="/opt/iomatrix/bin/iomatrix"))
    assert [n.label for n in nodes] == ["n1", "n2", "n3"]
    for text, why in [('hosts = ["a"]\nport = "22"', "port must be an integer"),
                      ('[[node]]\nuser = "x"', "node 1: no host"),
                      ('[[node]]\nhost = "a"\npasword = "x"', "unknown key 'pasword'"),
                      ('hosts = ["a"]\nhost_key_alias = "b"', "unknown key 'host_key_alias'"),
                      ('[[node]]\nhost = "a"\nname = "../x"', "name '../x' is not"),
                      ('hosts = ["a"]\nalive_interval = 0', "alive_interval 0 is not 1-3600"),
                      ('[[node]]\nhost = "a"\nalive_interval = "2"',
                       "alive_interval must be an integer"),
                      ("hosts = [", "not TOML")]:
        (tmp_path / "bad.toml").write_text(text)
        with pytest.raises(NodesError, match=why):
            ssh.load_inventory(tmp_path / "bad.toml")


def test_keepalives_are_a_node_s_alive_interval(tmp_path: Path) -> None:
    """How soon a silent node is dropped: SSH's keepalive interval, 5 s unless an inventory
    (for all its nodes, or one) or a suite's [nodes] says otherwise (a test's nodes: 2 s)."""
    from iomatrix.core.errors import SuiteError
    from iomatrix.measure.cluster import resolve_nodes
    from iomatrix.suite import load_suite_text

    (tmp_path / "nodes.toml").write_text('alive_interval = 2\nhosts = ["n1"]\n'
                                         '[[node]]\nhost = "n2"\nalive_interval = 30\n')
    nodes = ssh.resolve(str(tmp_path / "nodes.toml"))
    assert [n.alive_interval for n in nodes] == [2, 30]
    assert "ServerAliveInterval=2" in ssh.ssh_argv(nodes[0], ["true"])
    assert "ServerAliveInterval=5" in ssh.ssh_argv(Node(host="n3"), ["true"])
    suite = ('[suite]\nname = "c"\n[target]\ndirectory = "/srv/bench"\nsize = "1GiB"\n[workloads]\n'
             'rw = "randread"\n[method]\nmode = "host"\n[nodes]\nhosts = ["n1", "n2"]\n')
    listed = resolve_nodes(load_suite_text(suite + "alive_interval = 3\n", source="t"), None)
    assert [n.alive_interval for n in listed] == [3, 3]
    with pytest.raises(SuiteError, match="alive_interval"):
        load_suite_text(suite + "alive_interval = 0\n", source="t")
    # a database row's (untrusted) is held to the same: an integer in its range, or refused
    assert ssh.stored_node({"host": "n1", "alive_interval": 7}, "n1", "row").alive_interval == 7
    for bad in ("2 -oProxyCommand=x", 0, 3601, True, 2.5):
        with pytest.raises(NodesError, match="^row: alive_interval"):
            ssh.stored_node({"host": "n1", "alive_interval": bad}, "n1", "row")


def test_proxmox_members(tmp_path: Path) -> None:
    (tmp_path / "nodes" / "pve2").mkdir(parents=True)
    (tmp_path / "nodes" / "pve2" / "ssh_known_hosts").write_text("pve2 ssh-ed25519 AAAA\n")
    nodes = ssh.parse_pve_members((PVE / "members-3nodes").read_text(),
                                  nodes_dir=tmp_path / "nodes")
    # in the cluster's node order, as root at the cluster address, the host key by node name
    assert [(n.name, n.host, n.user, n.host_key_alias) for n in nodes] == [
        ("pve1", "192.168.10.11", "root", "pve1"), ("pve2", "192.168.10.12", "root", "pve2"),
        ("pve3", "192.168.10.13", "root", "pve3")]
    assert nodes[1].known_hosts == str(tmp_path / "nodes/pve2/ssh_known_hosts")
    assert nodes[0].known_hosts is None          # PVE before 8.1: the system's known_hosts
    with pytest.raises(NodesError, match=r"^node pve3: offline in the Proxmox VE cluster"):
        ssh.parse_pve_members((PVE / "members-offline").read_text())
    with pytest.raises(NodesError, match="not in a cluster"):
        ssh.parse_pve_members((PVE / "members-standalone").read_text())


@pytest.mark.slow
def test_ssh_argv_reaches_a_node_and_refuses_what_it_must(ssh_nodes) -> None:  # type: ignore[no-untyped-def]
    cluster: SshCluster = ssh_nodes(2)
    node = Node(host=cluster.nodes[1].address, user="root", identity=str(cluster.identity),
                known_hosts=str(cluster.known_hosts), ssh_config="none")

    def run(n: Node, *command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(cluster.controller(ssh.ssh_argv(n, command, connect_timeout=3)),
                              capture_output=True, text=True, timeout=60)
    # the command's words arrive as they were, whatever the node's shell makes of quotes
    said = run(node, "printf", "%s|", "it's", "$HOME", "a b")
    assert (said.returncode, said.stdout) == (0, "it's|$HOME|a b|")
    assert run(node, "hostname").stdout.strip() == "node2"
    # a host key the user's known_hosts lacks is refused, never accepted
    empty = cluster.directory / "empty_known_hosts"
    empty.write_text("")
    refused = run(Node(**{**node.__dict__, "known_hosts": str(empty)}), "true")
    assert refused.returncode == 255 and "Host key verification failed" in refused.stderr
    # no prompt waits for a password: a key the node does not know fails at once
    stranger = cluster.directory / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)],
                   check=True, timeout=30)
    denied = run(Node(**{**node.__dict__, "identity": str(stranger)}), "true")
    assert denied.returncode == 255 and "Permission denied" in denied.stderr
    # an address where nothing answers is given up within the connect timeout
    silent = run(Node(**{**node.__dict__, "host": "10.77.200.2"}), "true")
    assert silent.returncode == 255
