"""Cluster nodes on this machine, for the tests of iomatrix over SSH (issue 23): each node is a
network namespace and a UTS namespace of its own (its own interfaces and hostname, which run
ownership records) with its own sshd, Debian's ``/usr/sbin/sshd`` started by the fixture with a
configuration, host key and authorized key made in the test's directory.

The controller (the ``iomatrix run`` under test) runs in a network namespace of its own too,
joined to each node by a veth pair: every address is inside these namespaces, none on the host's
own interfaces (so no test can reach, or be reached from, the machine's network). A command
reaches the nodes when it is wrapped with ``SshCluster.controller(argv)``. The namespaces share
the host's file system and processes' view (no mount or PID namespace): a PostgreSQL server on a
Unix socket serves the controller and every node alike, and a node's files are the host's.

A namespace is held by a ``sleep`` started in it (no ``ip netns`` name, so no bind mount in
/run/netns); stopping kills every process whose network namespace is a node's or the
controller's, and with the last one the namespace and its veth end go. Processes are found by
their namespace's inode number, which the kernel gives again once a namespace is freed (another
xdist worker's new namespace can get a killed node's number within milliseconds): so the fixture
also holds a descriptor of each namespace, from its start until its last check, and no other
namespace can take that number while anything here looks for it. ``kill(node)`` does that
to one node mid-test: what a node losing power looks like from the controller; ``swallow(node)``
makes a node swallow every packet it would send the controller while it runs on, its link up
(a new connection waits out SSH's ConnectTimeout; in a session, each side's SSH notices by its
keepalives).

sshd runs as root and needs its privilege separation directory ``/run/sshd`` (which Debian's
service makes at every start); it is made when missing and left, empty, like the service leaves
it."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from tests.needs import lacking

SSHD = "/usr/sbin/sshd"
REPO = Path(__file__).resolve().parents[1]
"""The tree under test: the nodes' iomatrix imports it (PYTHONPATH), as the controller does,
not whatever tree the virtual environment was installed from (a git worktree shares it)."""
TOOLS = ("unshare", "nsenter", "ip", "ssh", "ssh-keygen", "setpriv")
SUBNET = "10.77"
"""Node ``i`` (from 1) is ``10.77.i.2``, its controller end ``10.77.i.1``: private to the
namespaces, so every test may use the same addresses."""
START_TIMEOUT = 30.0


def problem() -> str | None:
    """Why nodes cannot be made here, or None."""
    if os.geteuid() != 0:
        return "needs root (network and UTS namespaces, sshd)"
    if not os.access(SSHD, os.X_OK):
        return f"no {SSHD}: install openssh-server (./setup.sh --dev)"
    missing = [t for t in TOOLS if shutil.which(t) is None]
    return f"missing {', '.join(missing)}" if missing else None


def _run(argv: Sequence[str], timeout: float = 30) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True,
                          timeout=timeout).stdout


def _holder(*namespaces: str) -> subprocess.Popen[bytes]:
    """A process alone in new namespaces (``--net``, ``--uts``), holding them while it lives;
    it dies with the test process (parent-death signal)."""
    return subprocess.Popen(["setpriv", "--pdeathsig", "KILL", "--", "unshare", *namespaces,
                             "--", "sleep", "infinity"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def _netns(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/net")


def _hold_netns(pid: int) -> tuple[str, int]:
    """``pid``'s network namespace: its name and a descriptor that keeps it (and so its
    number) from being freed; the name is read through the descriptor, so both are the same
    namespace even if ``pid`` has just died."""
    fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    return f"net:[{os.fstat(fd).st_ino}]", fd


def _enter(pid: int, *kinds: str) -> list[str]:
    return ["nsenter", f"--target={pid}", *kinds, "--"]


@dataclass
class SshNode:
    """One node: its name (and hostname), its address, and what runs it."""

    name: str
    address: str
    holder: subprocess.Popen[bytes]
    netns: str = ""
    netns_fd: int = -1
    """Held open from the start to the last check: the namespace's number stays its own."""
    link: str = ""
    """The controller's end of its veth pair."""
    sshd: subprocess.Popen[bytes] | None = None
    port: int = 22
    alive: bool = True

    def enter(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside this node (its network and hostname)."""
        return [*_enter(self.holder.pid, "--net", "--uts"), *argv]


@dataclass
class SshCluster:
    """N nodes, a controller namespace reaching them, and the SSH client's files."""

    directory: Path
    controller_holder: subprocess.Popen[bytes]
    controller_netns: str
    identity: Path
    known_hosts: Path
    user: str = "root"
    nodes: list[SshNode] = field(default_factory=list)
    controller_netns_fd: int = -1
    left: dict[str, list[int]] = field(default_factory=dict)
    """After ``stop()``: the processes still in each namespace (none, if all went)."""
    check_directories: Callable[[], None] = lambda: None
    """Takes the node-directory lock exclusive, to the test's end (``Nodes.check_directories``),
    before a check that no /tmp/iomatrix-fio-* is left: call it once this cluster's nodes hold
    none."""

    def controller(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run where the controller is: in the network namespace reaching the nodes
        (its hostname stays the host's)."""
        return [*_enter(self.controller_holder.pid, "--net"), *argv]

    def ssh(self, node: SshNode, command: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """Run ``command`` on ``node`` over SSH from the controller (for the tests' own checks)."""
        return subprocess.run(self.controller(
            ["ssh", "-F", "none", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
             "-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "ConnectTimeout=10",
             "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3",
             "-i", str(self.identity), "-p", str(node.port), "-l", self.user, node.address,
             command]), capture_output=True, text=True, timeout=timeout)

    def shared_address(self) -> str:
        """An address of the controller's namespace that every node reaches (each through its
        own link), for shared storage served there (a test Ceph, tgtd): added once."""
        address = f"{SUBNET}.0.1"
        if address not in _run(self.controller(["ip", "-4", "addr", "show", "dev", "lo"])):
            _run(self.controller(["ip", "addr", "add", f"{address}/32", "dev", "lo"]))
            for i, node in enumerate(self.nodes, 1):
                _run(node.enter(["ip", "route", "add", f"{address}/32", "via",
                                 f"{SUBNET}.{i}.1"]))
        return address

    def inventory(self, *, extra: str = "") -> str:
        """A TOML inventory of the nodes (iomatrix's ``[[node]]`` tables). A node that drops is
        noticed in 6 s, not 15 (keepalives every 2 s: ``alive_interval``)."""
        tables = [f'[[node]]\nname = "{n.name}"\nhost = "{n.address}"\nuser = "{self.user}"\nport = {n.port}\n'
                  f'identity = "{self.identity}"\nknown_hosts = "{self.known_hosts}"\n'
                  f'alive_interval = 2\n{extra}'
                  for n in self.nodes]
        return "\n".join(tables)

    def processes(self, node: SshNode) -> list[int]:
        """The pids in ``node``'s network namespace (its holder, sshd and whatever SSH started)."""
        return _in_netns(node.netns)

    def leftovers(self, node: SshNode) -> list[str]:
        """What runs on ``node`` beyond its holder and sshd: 'pid command' each."""
        keep = {node.holder.pid, node.sshd.pid if node.sshd else -1}
        return [f"{pid} {_cmdline(pid)}" for pid in self.processes(node) if pid not in keep]

    def kill(self, node: SshNode) -> None:
        """Power ``node`` off: SIGKILL everything in it, so its namespace and link go at once."""
        _kill_all(node.netns)
        for proc in (node.holder, node.sshd):
            if proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=10)
        # the namespace outlives its processes (its descriptor is held): its link goes now, as
        # it would with the node's power
        if node.alive and node.link:
            subprocess.run(self.controller(["ip", "link", "del", node.link]),
                           capture_output=True, timeout=30)
        node.alive = False

    def swallow(self, node: SshNode, on: bool = True) -> None:
        """Make ``node`` swallow, without a word, every packet it would send the controller (a
        blackhole route to the controller's end of its link), or stop (``on`` false). Its link
        stays up, ARP answers, the controller's packets arrive, and it runs on; but nothing
        comes back, as from a firewall that drops: a new TCP connection gets no SYN-ACK and no
        error (SSH's ConnectTimeout ends it), and an open session's keepalives go unanswered
        on both sides (ServerAlive, ClientAlive)."""
        controller_end = node.address.rpartition(".")[0] + ".1"
        _run(node.enter(["ip", "route", "add" if on else "del", "blackhole",
                         f"{controller_end}/32"]))

    def stop(self) -> None:
        """Kill every node and the controller namespace, note in ``left`` what is still in
        each (nothing, normally), then let the namespaces go."""
        for node in self.nodes:
            if node.sshd is not None and node.sshd.poll() is None:
                node.sshd.terminate()
            self.kill(node)
        _kill_all(self.controller_netns)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.controller_holder.wait(timeout=10)
        self.left = {netns: pids for netns in [self.controller_netns, *(n.netns for n in self.nodes)]
                     if netns and (pids := _in_netns(netns))}
        for fd in [self.controller_netns_fd, *(n.netns_fd for n in self.nodes)]:
            if fd >= 0:
                os.close(fd)
        self.controller_netns_fd = -1
        for node in self.nodes:
            node.netns_fd = -1


def _in_netns(netns: str) -> list[int]:
    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{entry.name}/ns/net") == netns:
                    pids.append(int(entry.name))
    return pids


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return "?"


def _kill_all(netns: str) -> None:
    """SIGKILL every process in ``netns`` until none is left (a process may fork meanwhile)."""
    deadline = time.monotonic() + 30
    while (pids := _in_netns(netns)) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def _cache_home() -> str:
    return os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")


def _sshd_config(directory: Path, node: SshNode, host_key: Path, authorized: Path) -> Path:
    config = directory / "sshd_config"
    config.write_text(
        f"ListenAddress {node.address}:{node.port}\n"
        f"HostKey {host_key}\n"
        f"PidFile {directory / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {authorized}\n"
        "PermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        # the keys are in the test's directory, under /tmp (mode 1777), which StrictModes refuses
        "StrictModes no\n"
        "UsePAM no\n"
        "AcceptEnv LANG LC_*\n"
        # each node's own home and state directory (iomatrix keeps a node's share of a run
        # there): the host's home is never written. The home is also what keeps the shell sshd
        # starts (bash, which reads ~/.bashrc when sshd runs it) off this machine's root
        # profile: its pyenv init rehashes under a lock, which a session the test kills can
        # leave behind, and every later session then waits 60 s for it. The guest appliance's
        # cache stays the host's, as on nodes that share a home.
        f"SetEnv HOME={directory / 'home'} XDG_STATE_HOME={directory / 'state'} "
        f"XDG_CACHE_HOME={_cache_home()} PYTHONPATH={REPO}\n"
        "ClientAliveInterval 2\nClientAliveCountMax 3\n"      # as the inventory's keepalives
        "LogLevel INFO\n")
    return config


@contextlib.contextmanager
def ssh_cluster(directory: Path, count: int = 3) -> Iterator[SshCluster]:
    """``count`` nodes named node1... with sshd running, the controller reaching each over SSH
    with the key and known_hosts in ``directory``; all stopped on leaving."""
    directory.mkdir(parents=True, exist_ok=True)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    identity = directory / "id_ed25519"
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "iomatrix-test", "-f", str(identity)])
    authorized = directory / "authorized_keys"
    authorized.write_text(Path(f"{identity}.pub").read_text())
    known_hosts = directory / "known_hosts"
    holder = _holder("--net")
    cluster = SshCluster(directory=directory, controller_holder=holder, controller_netns="",
                         identity=identity, known_hosts=known_hosts)
    try:
        _wait_netns(holder.pid, host=_netns(os.getpid()))
        cluster.controller_netns, cluster.controller_netns_fd = _hold_netns(holder.pid)
        _run(_enter(holder.pid, "--net") + ["ip", "link", "set", "lo", "up"])
        lines = []
        for i in range(1, count + 1):
            node = _start_node(cluster, i, directory / f"node{i}", authorized)
            key = Path(directory / f"node{i}" / "host_key.pub").read_text().split()
            lines.append(f"{node.address} {key[0]} {key[1]}\n")
        known_hosts.write_text("".join(lines))
        for node in cluster.nodes:
            _wait_listening(node, directory / node.name / "sshd.log")
        yield cluster
    finally:
        cluster.stop()


def _wait_netns(pid: int, host: str) -> None:
    """Wait until ``pid`` (an ``unshare``) has left the host's network namespace."""
    deadline = time.monotonic() + START_TIMEOUT
    while _netns(pid) == host:
        if time.monotonic() > deadline:
            raise RuntimeError(f"unshare (pid {pid}) made no namespace")
        time.sleep(0.01)


def _start_node(cluster: SshCluster, i: int, directory: Path, authorized: Path) -> SshNode:
    directory.mkdir()
    (directory / "home").mkdir(mode=0o700)
    name = f"node{i}"
    holder = _holder("--net", "--uts")
    node = SshNode(name=name, address=f"{SUBNET}.{i}.2", holder=holder)
    cluster.nodes.append(node)
    _wait_netns(holder.pid, host=_netns(os.getpid()))
    node.netns, node.netns_fd = _hold_netns(holder.pid)
    controller = _enter(cluster.controller_holder.pid, "--net")
    link = node.link = f"vn{i}"
    _run(controller + ["ip", "link", "add", link, "type", "veth", "peer", "name", "eth0",
                       "netns", str(holder.pid)])
    _run(controller + ["ip", "addr", "add", f"{SUBNET}.{i}.1/24", "dev", link])
    _run(controller + ["ip", "link", "set", link, "up"])
    inside = _enter(holder.pid, "--net", "--uts")
    _run(inside + ["hostname", name])
    _run(inside + ["ip", "addr", "add", f"{node.address}/24", "dev", "eth0"])
    _run(inside + ["ip", "link", "set", "eth0", "up"])
    _run(inside + ["ip", "link", "set", "lo", "up"])
    host_key = directory / "host_key"
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(host_key)])
    config = _sshd_config(directory, node, host_key, authorized)
    with open(directory / "sshd.log", "wb") as log:
        node.sshd = subprocess.Popen(inside + [SSHD, "-D", "-e", "-f", str(config)],
                                     stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                     start_new_session=True)
    return node


def _wait_listening(node: SshNode, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while b"Server listening" not in log.read_bytes():
        if node.sshd is None or node.sshd.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"sshd of {node.name} did not start: {log.read_text()[-500:]}")
        time.sleep(0.02)


class NodeDirectories:
    """A lock over the nodes' fio server directories, ``/tmp/iomatrix-fio-<random>`` (the nodes
    share this host's /tmp): a test that checks none is left holds it exclusive, every other
    test with nodes shared, so that no other test's nodes hold one meanwhile: another xdist
    worker's, or another pytest session's on this host (two worktrees' suites at once). The lock
    file is in /run (root's alone: nodes need root), kept there like /run/sshd."""

    PATH = Path("/run/iomatrix-tests-nodes.lock")

    def __init__(self) -> None:
        self.fd = os.open(self.PATH, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        self.exclusive = False

    def take(self, *, exclusive: bool) -> None:
        """Hold the lock shared or exclusive. From shared to exclusive it is let go first (two
        tests each holding it shared and waiting for it exclusive would wait for ever): call it
        only while this test's nodes hold no directory (between runs)."""
        import fcntl
        if exclusive and self.exclusive:
            return
        if exclusive:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        fcntl.flock(self.fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        self.exclusive = exclusive

    def close(self) -> None:
        os.close(self.fd)


class Nodes:
    """What ``ssh_nodes`` gives: ``nodes(n)`` makes n nodes; ``nodes.check_directories()`` (or
    a cluster's) takes the node-directory lock exclusive, from then to the test's end (see
    :class:`NodeDirectories`), before a check that no /tmp/iomatrix-fio-* is left. Taken only
    then, not for the whole test: while a test's runs run, other workers' tests with nodes run
    too."""

    def __init__(self, stack: contextlib.ExitStack, tmp_path: Path, lock: NodeDirectories) -> None:
        self.stack, self.tmp_path, self.lock = stack, tmp_path, lock
        self.made: list[SshCluster] = []

    def __call__(self, count: int = 3) -> SshCluster:
        cluster = self.stack.enter_context(ssh_cluster(self.tmp_path / f"nodes{len(self.made)}",
                                                       count))
        cluster.check_directories = self.check_directories
        self.made.append(cluster)
        return cluster

    def check_directories(self) -> None:
        self.lock.take(exclusive=True)


@pytest.fixture
def ssh_nodes(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Nodes]:
    """``ssh_nodes(n)``: n nodes over SSH (see the module); stopped after the test, and checked
    to have left nothing. A module whose tests check that no node directory is left says so
    with ``CHECKS_NODE_DIRECTORIES = True`` (the lock exclusive from the start); a test that
    checks it once its runs ended calls ``cluster.check_directories()`` first
    (``test_cluster_load.left_behind`` does)."""
    reason = problem()
    if reason:
        lacking("sshd", reason)
    lock = NodeDirectories()
    with contextlib.ExitStack() as stack:
        stack.callback(lock.close)
        lock.take(exclusive=getattr(request.module, "CHECKS_NODE_DIRECTORIES", False))
        nodes = Nodes(stack, tmp_path, lock)
        made = nodes.made
        yield nodes
    for cluster in made:
        assert cluster.left == {}, f"processes left: {cluster.left}"
