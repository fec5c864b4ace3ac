"""Cluster load (``[method] concurrent_nodes = true``): every node runs ``fio --server`` on the
shared target, and the controller's ONE fio client drives them all in the same trial (fio's own
multi-client: ``fio --client=A job --client=B job``), which gives each node's result and the
"All clients" aggregate in one output.

**Nothing listens beyond the node.** fio's server has no authentication, so on each node it
listens on a Unix socket in a directory of its own (mode 0700, a fresh random name: ``mkdir``
fails on one planted there), and the controller reaches it through the node's SSH session's
stream-local forward (``ssh -L CONTROLLER_SOCKET:NODE_SOCKET``) onto a socket in the run's
0700 scratch directory. fio reports a Unix-socket client's path as its hostname, by which each
node's result is matched.

**The SSH session owns the node's server.** The remote shell (:data:`SERVE`) starts fio's
server, says it is ready, and waits on its standard input, which is the controller's pipe: when
the controller closes it, or dies (kill -9: its ssh gets SIGTERM from the kernel, the
connection closes, sshd closes the pipe), the shell stops every fio process of the server
(found by the server's socket in their command line) and removes the directory. ``pkill``
(procps) must be on the node.

**A node that drops fails the trial.** When a node's ssh ends during a trial (the node died,
the network went), fio's client returns without that node's result and fails; the trial fails
with the node named and what its ssh said (``ClusterSession.failure``). The next trial of the
configuration fails the same way before fio starts.
"""

from __future__ import annotations

import contextlib
import secrets
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from iomatrix.cluster.ssh import Node, ssh_argv
from iomatrix.core.errors import TrialFailed
from iomatrix.core.proc import log_tail, orphan_guard, read_text, stop, wait_for
from iomatrix.drivers.base import Driver, Session
from iomatrix.drivers.host import HostSession
from iomatrix.fio.models import FioResult
from iomatrix.fio.samples import start_skew_ms
from iomatrix.suite.model import Configuration, Method, Workload
from iomatrix.target.workspace import Image

READY = "IOMATRIX-FIO-READY"
START_TIMEOUT = 30.0
"""How long a node may take to log in and start its fio server."""
DROP_SECONDS = 5.0
"""How long a failed trial waits for a node's session to end, to name the node that dropped."""
STOP_TIMEOUT = 10.0
"""How long a node's session may take to stop its server and remove its directory."""

SERVE = r"""set -u
d=$1
umask 077
mkdir -m 700 "$d" || { echo "cannot make $d: it exists or its parent is not writable"; exit 3; }
fio --server=sock:"$d/fio.sock" >"$d/server.log" 2>&1 &
f=$!
p="^fio --server=sock:$d/fio\.sock\$"
trap '' PIPE
exec 3<&0
{ read -r _ <&3 || :; pkill -TERM -f "$p"; } &
w=$!
while [ ! -S "$d/fio.sock" ] && kill -0 "$f" 2>/dev/null; do sleep 0.05; done
[ -S "$d/fio.sock" ] && echo IOMATRIX-FIO-READY
wait "$f"
s=$?
x=0
if kill -KILL "$w" 2>/dev/null; then
  echo "fio --server ended (status $s): $(tail -n 3 "$d/server.log")"; x=5
fi
n=0
while pkill -TERM -f "$p" && [ $n -lt 50 ]; do sleep 0.1; n=$((n + 1)); done
pkill -KILL -f "$p"
wait
rm -rf "$d"
exit $x
"""
"""What a node's SSH session runs (POSIX sh; ``$1``: the server's directory): fio's server on a
Unix socket there, until the controller closes the session's standard input (a watcher reading
it from the start then stops the server) or the server ends (the session then ends, saying so).
Every fio process of the server (the server, a process per connection, a process per job, which
leaves the group with ``setsid``) has the server's command line, by which ``pkill`` finds them
all (the whole line: the controller's ssh, when it runs on the node, names the socket too);
the shell ignores SIGPIPE: a controller gone while it starts must not kill it before it cleans
up."""


class NodeServer:
    """One node's fio server, reached through its SSH session's forward (see the module
    docstring); ``start``, ``ready``, then ``close``."""

    def __init__(self, node: Node, local: Path, log: Path) -> None:
        self.node = node
        self.name = node.label
        self.local = local
        """The forward's socket on the controller, which fio's client connects to."""
        self.log = log
        self.remote = Path("/tmp") / f"iomatrix-fio-{secrets.token_hex(8)}"
        """The server's directory on the node."""
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        """The server's address for fio's ``--client``."""
        return f"sock:{self.local}"

    def argv(self) -> list[str]:
        return ssh_argv(self.node, ["sh", "-c", SERVE, "iomatrix-fio", str(self.remote)],
                        options=["-o", "ExitOnForwardFailure=yes",
                                 "-L", f"{self.local}:{self.remote}/fio.sock"])

    def start(self) -> NodeServer:
        """Log in and start the server (``ready`` waits for it); TrialFailed naming the node
        when ssh cannot start."""
        with open(self.log, "ab") as out:
            try:
                self.proc = subprocess.Popen(orphan_guard(self.argv()), stdin=subprocess.PIPE,
                                             stdout=out, stderr=subprocess.STDOUT,
                                             start_new_session=True)
            except OSError as exc:
                raise TrialFailed(f"node {self.name}: cannot start ssh: "
                                  f"{exc.strerror or exc}") from exc
        return self

    def ready(self, deadline: float) -> None:
        """Wait until the node's server is reachable here; TrialFailed naming the node, and
        the session ended, when it ends first or is not by ``deadline`` (monotonic)."""
        proc = self.proc
        assert proc is not None
        ready = wait_for(lambda: proc.poll() is not None or (
            READY in read_text(self.log) and self.local.is_socket()),
            timeout=max(0.0, deadline - time.monotonic()), interval=0.02)
        if not ready or proc.poll() is not None:
            why = self.why() if proc.poll() is not None else (
                f"its fio server was not ready within {START_TIMEOUT:.0f} s")
            self.close()
            raise TrialFailed(f"node {self.name}: {why}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def why(self) -> str:
        """Why the node's session ended, from what ssh and the remote shell printed."""
        code = self.proc.returncode if self.proc is not None else None
        said = log_tail(self.log, 3).replace(READY, "").strip(" |")
        return f"its SSH session ended (status {code}): {said or 'nothing said'}"

    def close(self) -> None:
        """End the session: the node stops its server and removes its directory (see
        :data:`SERVE`); ssh is killed if that takes longer than :data:`STOP_TIMEOUT`."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        with contextlib.suppress(OSError):
            if proc.stdin is not None:
                proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=STOP_TIMEOUT)
        stop(proc, timeout=5)
        self.local.unlink(missing_ok=True)     # ssh leaves its forward's socket behind


class ClusterSession(HostSession):
    """A host-mode configuration on every node at once: the same job to each node's server."""

    def __init__(self, config: Configuration, images: Sequence[Image], engine: str,
                 servers: Sequence[NodeServer]) -> None:
        super().__init__(config, images, engine)
        self.servers = list(servers)
        self._skew = ""

    def new_trial(self) -> None:
        self._skew = ""

    def check_trial(self, result: FioResult, workload: Workload) -> None:
        skew = start_skew_ms(result)
        self._skew = (f"{skew} ms" if skew is not None else
                      "not measured: fio before 3.36 reports no job start")

    def fio_clients(self) -> list[str]:
        if any(not s.alive() for s in self.servers):
            raise TrialFailed("a node's fio server is gone")      # named by ``failure``
        return [s.address for s in self.servers]

    def clients(self) -> list[int | str]:
        return [str(s.local) for s in self.servers]

    def ioping_path(self) -> Path | None:
        return None             # ioping would run here, not on the nodes: fio's equivalent

    def failure(self, reason: str) -> str:
        # a node whose server ended takes a moment to end its session after fio noticed
        wait_for(lambda: any(not s.alive() for s in self.servers), timeout=DROP_SECONDS)
        dropped = [f"node {s.name} dropped: {s.why()}" for s in self.servers if not s.alive()]
        return "; ".join([*dropped, reason])

    def applied(self) -> dict[str, str]:
        """Which node each per-client figure (``vm`` N) is, and how far apart (by the nodes'
        clocks) their jobs started in the last trial."""
        skew = {"cluster.start_skew": self._skew} if self._skew else {}
        return {"cluster.nodes": ", ".join(f"vm{i}={s.name}"
                                           for i, s in enumerate(self.servers))} | skew


class ClusterDriver(Driver):
    """host mode on a cluster's nodes at once (``[method] concurrent_nodes``)."""

    mode = "host"

    def __init__(self, method: Method, workdir: Path, nodes: Sequence[Node]) -> None:
        super().__init__(method, workdir)
        self.nodes = list(nodes)
        self.sessions = 0

    @contextlib.contextmanager
    def session(self, config: Configuration, images: Sequence[Image]) -> Iterator[Session]:
        self.sessions += 1
        with contextlib.ExitStack() as stack:
            servers = []
            for index, node in enumerate(self.nodes):
                # short names: Unix socket paths must stay under 108 bytes
                base = self.workdir / f"n{self.sessions}-{index}"
                server = NodeServer(node, Path(f"{base}.sock"), Path(f"{base}.log"))
                stack.callback(server.close)
                servers.append(server.start())
            deadline = time.monotonic() + START_TIMEOUT      # the nodes log in side by side
            for server in servers:
                server.ready(deadline)
            yield ClusterSession(config, images, self.method.engine, servers)
