"""Cluster load (``[method] concurrent_nodes = true``): every node runs ``fio --server`` on the
shared target (host mode), or boots the configuration's guests, each with ``fio --server``
inside (guest mode), and the controller's ONE fio client drives them all in the same trial
(fio's own multi-client: ``fio --client=A job --client=B job``), which gives each node's (each
guest's) result and the "All clients" aggregate in one output.

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

**Guests (guest mode).** A node's SSH session runs ``iomatrix node serve-guests``
(``iomatrix.measure.nodeguests``) with a :class:`GuestRequest` on its standard input: it boots
the configuration's guests on the images the controller made on the shared target, with the
same driver as a local run (same QEMU arguments, same checks of what QEMU applied, same private
network namespace, where each guest's fio server has a forwarded port that nothing outside
the namespace reaches), relays each guest's port to a Unix socket in the session's 0700
directory (``iomatrix.cluster.relay``), and says so in one line (:data:`GUESTS_READY`, which the
controller checks against what it asked). The controller forwards each of those sockets with
``ssh -L`` as above. The session owns the guests: when its standard input ends, the node stops
them, and its namespace, relays and directory go with them. Meanwhile that input carries a
command before and after each trial (:class:`GuestCommand`), by which each node makes a local
run's foreign-I/O check of its own guests (``GuestSession.check_io``) and answers in a line.
A configuration of the user's own image ([guest]) has the image this host opened sent after
the request (``iomatrix.cluster.imagecopy``); the node boots its guests on that copy.

**A node that drops fails the trial.** When a node's ssh ends during a trial (the node died,
the network went), fio's client returns without that node's result and fails; the trial fails
with the node named and what its ssh said (``ClusterSession.failure``). The next trial of the
configuration fails the same way before fio starts.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError

from iomatrix.appliance.ownimage import ImageFile
from iomatrix.cluster.imagecopy import send_image
from iomatrix.cluster.ssh import Node, ssh_argv
from iomatrix.core.errors import TrialFailed
from iomatrix.core.model import Frozen
from iomatrix.core.proc import orphan_guard, read_text, stop, wait_for
from iomatrix.drivers.base import Driver, Session
from iomatrix.drivers.guest.image import ImageGuest
from iomatrix.drivers.guest.kind import GuestKind
from iomatrix.drivers.guest.kinds import kind_for
from iomatrix.drivers.host import HostSession
from iomatrix.fio.models import FioResult
from iomatrix.fio.samples import client_job, start_skew_ms
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.method import Method
from iomatrix.suite.model import Suite
from iomatrix.suite.workloads import Workload
from iomatrix.suite.spec import RunSpec
from iomatrix.targets.workspace import Image
from iomatrix.vocab.words import Accelerator, Mode

PROTOCOL = "IOMATRIX-"
"""How the lines a node's session prints for the controller begin (the others are its words)."""
READY = "IOMATRIX-FIO-READY"
START_TIMEOUT = 30.0
"""How long a node may take to log in and start its fio server."""
DROP_SECONDS = 5.0
"""How long a failed trial waits for a node's session to end, to name the node that dropped."""
STOP_TIMEOUT = 10.0
"""How long a node's session may take to stop its server and remove its directory."""
GUESTS_READY = "IOMATRIX-GUESTS-READY"
GUEST_START_SLACK = 300.0
"""How long a node may take, besides ``[method] boot_timeout``, to log in, build or find its
appliance, probe KVM and start its guests' relays."""
GUEST_STOP_TIMEOUT = 60.0
"""How long a node's session may take to stop its guests and remove its directory."""
GUEST_DIRECTORY = re.compile(r"^/tmp/iomatrix-guests-[0-9a-f]{16}$")
"""The directory a node's guests get (the controller names it, fresh and random; the node
makes it, and refuses one that exists)."""
READY_LINE_LIMIT = 1 << 20
"""The longest line of a node's that is read (its ready line, or an answer)."""
GUESTS_TRIAL = "IOMATRIX-GUESTS-TRIAL"
GUESTS_CHECKED = "IOMATRIX-GUESTS-CHECKED"
ANSWER_TIMEOUT = 30.0
"""How long a node may take to answer a trial's command (read QEMU's counters)."""

SERVE = r"""set -u
d=$1
umask 077
mkdir -m 700 "$d" || { echo "cannot make $d: it exists or its parent is not writable"; exit 3; }
if [ -n "${2:-}" ]; then printf '%s' "$2" >"$d/ceph.conf"; CEPH_CONF=$d/ceph.conf; export CEPH_CONF; fi
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
"""What a node's SSH session runs (POSIX sh; ``$1``: the server's directory; ``$2``, when
given, the ceph.conf its fio reads an rbd pool by, written there): fio's server on a
Unix socket there, until the controller closes the session's standard input (a watcher reading
it from the start then stops the server) or the server ends (the session then ends, saying so).
Every fio process of the server (the server, a process per connection, a process per job, which
leaves the group with ``setsid``) has the server's command line, by which ``pkill`` finds them
all (the whole line: the controller's ssh, when it runs on the node, names the socket too);
the shell ignores SIGPIPE: a controller gone while it starts must not kill it before it cleans
up."""


class NodeSession:
    """One node's SSH session, which owns what the node serves (fio servers, or guests) and
    forwards each of its Unix sockets to one of the controller's (``locals``); ``start``,
    ``ready``, then ``close``."""

    marker = READY
    stop_timeout = STOP_TIMEOUT

    def __init__(self, node: Node, forwards: Sequence[tuple[Path, Path]], log: Path) -> None:
        self.node = node
        self.name = node.label
        self.forwards = list(forwards)
        """(the controller's socket, which fio's client connects to; the node's socket)."""
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def locals(self) -> list[Path]:
        return [local for local, _ in self.forwards]

    def labels(self) -> list[str]:
        """What each forwarded server is, in order, as trials name it."""
        return [self.name]

    def command(self) -> list[str]:
        """The argv the session runs on the node."""
        raise NotImplementedError

    def request(self) -> bytes:
        """What the session's standard input gets first (then it stays open until ``close``)."""
        return b""

    def argv(self) -> list[str]:
        forwards = [a for local, remote in self.forwards for a in ("-L", f"{local}:{remote}")]
        return ssh_argv(self.node, self.command(),
                        options=["-o", "ExitOnForwardFailure=yes", *forwards])

    def start(self) -> NodeSession:
        """Log in and start what the node serves (``ready`` waits for it); TrialFailed naming
        the node when ssh cannot start."""
        with open(self.log, "ab") as out:
            try:
                self.proc = subprocess.Popen(orphan_guard(self.argv()), stdin=subprocess.PIPE,
                                             stdout=out, stderr=subprocess.STDOUT,
                                             start_new_session=True)
            except OSError as exc:
                raise TrialFailed(f"node {self.name}: cannot start ssh: "
                                  f"{exc.strerror or exc}") from exc
        request = self.request()
        if request:
            assert self.proc.stdin is not None
            with contextlib.suppress(OSError):      # a session that ended says why in ``ready``
                self.proc.stdin.write(request)
                self.proc.stdin.flush()
        return self

    def said_ready(self, text: str) -> bool:
        """Whether the node's output ``text`` says it is ready (TrialFailed when it says so
        wrongly)."""
        return self.marker in text

    def ready(self, deadline: float, what: str = "its fio server was") -> None:
        """Wait until what the node serves is reachable here; TrialFailed naming the node, and
        the session ended, when it ends first, says something unexpected, or is not ready by
        ``deadline`` (monotonic)."""
        proc = self.proc
        assert proc is not None
        timeout = max(0.0, deadline - time.monotonic())
        try:
            ready = wait_for(lambda: proc.poll() is not None or (
                self.said_ready(read_text(self.log))
                and all(p.is_socket() for p in self.locals)), timeout=timeout, interval=0.02)
        except TrialFailed:
            self.close()
            raise
        if not ready or proc.poll() is not None:
            why = self.why() if proc.poll() is not None else (
                f"{what} not ready within {timeout:.0f} s")
            self.close()
            raise TrialFailed(f"node {self.name}: {why}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def why(self) -> str:
        """Why the node's session ended, from what ssh and the node printed."""
        code = self.proc.returncode if self.proc is not None else None
        lines = [line for line in read_text(self.log).strip().splitlines()
                 if not line.startswith(PROTOCOL)]
        said = " | ".join(lines[-3:]).replace(self.marker, "").strip(" |")
        return f"its SSH session ended (status {code}): {said or 'nothing said'}"

    def hang_up(self) -> None:
        """Tell the node to stop (its session's standard input ends); ``close`` waits for it."""
        if self.proc is not None and self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()

    def close(self) -> None:
        """End the session: the node stops what it serves and removes its directory;
        ssh is killed if that takes longer than ``stop_timeout``."""
        self.hang_up()
        proc, self.proc = self.proc, None
        if proc is None:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=self.stop_timeout)
        stop(proc, timeout=5)
        for local in self.locals:
            local.unlink(missing_ok=True)     # ssh leaves its forwards' sockets behind


class NodeServer(NodeSession):
    """One node's fio server (host mode), run by :data:`SERVE`."""

    def __init__(self, node: Node, local: Path, log: Path, ceph_conf: str | None = None) -> None:
        self.remote = Path("/tmp") / f"iomatrix-fio-{secrets.token_hex(8)}"
        """The server's directory on the node."""
        super().__init__(node, [(local, self.remote / "fio.sock")], log)
        self.ceph_conf = ceph_conf
        """The ceph.conf (text) the node's fio reads a pool by (``OpenTarget.node_client``)."""

    @property
    def local(self) -> Path:
        return self.forwards[0][0]

    def command(self) -> list[str]:
        conf = [self.ceph_conf] if self.ceph_conf else []    # one word, quoted by ssh_argv
        return ["sh", "-c", SERVE, "iomatrix-fio", str(self.remote), *conf]


class GuestRequest(Frozen):
    """What the controller sends a node's ``iomatrix node serve-guests`` (one JSON line)."""

    suite_text: str
    suite_spec: RunSpec | None = None
    """The suite as the controller prepared it (``iomatrix.suite.spec``); None: ``suite_text``
    is loaded as a suite file."""
    suite_source: str
    config: str
    """The configuration's key in the suite as the node prepares it."""
    accel: Literal["kvm", "tcg"]
    """How the controller's run runs guests: every node's run the same way."""
    directory: str = Field(pattern=GUEST_DIRECTORY.pattern)
    images: tuple[Image, ...] = Field(min_length=1)
    """The node's guests' disks, which the controller made on the shared target."""
    trusted: bool = False
    """As ``iomatrix.measure.nodeside.CheckRequest.trusted``: the suite is the controller's
    user's (a keyring it names may then reach the monitors it names)."""
    image_size: int | None = Field(default=None, ge=0)
    """The configuration boots the user's own image ([guest] image): the controller sends it
    after this request (``iomatrix.cluster.imagecopy``), this many bytes, and the node boots its
    guests on that copy; None: the appliance."""


class GuestsReady(Frozen):
    """What a node's ``serve-guests`` says once its guests are ready (after
    :data:`GUESTS_READY` on one line)."""

    sockets: tuple[str, ...]
    applied: dict[str, str]
    """What QEMU applied, as the first guest's QMP and the guest itself say."""
    wrong: tuple[str, ...] = ()
    """Where QEMU did not apply the configuration as asked."""
    command: str = ""
    notes: tuple[str, ...] = ()


class GuestCommand(Frozen):
    """What the controller tells a node's guests during their session, one JSON line each on
    the session's standard input: ``trial`` N before trial N's fio starts (the node reads
    QEMU's counters and watches fio's ramp, as a local run does), ``check`` N when it has
    ended, with the workload and the bytes fio counted on each of the node's guests (None: no
    result for it). The node answers each with a line (:data:`GUESTS_TRIAL`,
    :data:`GUESTS_CHECKED`)."""

    kind: Literal["trial", "check"]
    n: int
    workload: str = ""
    counted: tuple[int | None, ...] = ()


class GuestsAnswer(Frozen):
    """A node's answer to command ``n``; for a check, its guests' foreign-I/O verdicts
    (``io_check`` of a local run), the lines of those that failed it, and QEMU's counters over
    the trial summed over its guests."""

    n: int
    io_check: str = ""
    foreign: tuple[str, ...] = ()
    blockstats: dict[str, int] = {}


class NodeGuests(NodeSession):
    """One node's guests (guest mode), booted by its ``iomatrix node serve-guests``."""

    marker = GUESTS_READY
    stop_timeout = GUEST_STOP_TIMEOUT
    image: ImageFile | None = None
    """The user's image the request's ``image_size`` announces, sent after it (a subclass's
    session, which boots no guest, has none)."""

    def __init__(self, node: Node, request: GuestRequest, locals_: Sequence[Path],
                 log: Path, image: ImageFile | None = None) -> None:
        self.remote = Path(request.directory)
        super().__init__(node, [(local, self.remote / f"vm{i}.sock")
                                for i, local in enumerate(locals_)], log)
        self.guest_request = request
        self.image = image
        self.info: GuestsReady | None = None
        self._read = 0
        """How far the log has been read for answers (whole lines)."""

    def labels(self) -> list[str]:
        return [f"{self.name}/vm{i}" for i in range(len(self.forwards))]

    def command(self) -> list[str]:
        return [self.node.command, "node", "serve-guests"]

    def request(self) -> bytes:
        return (self.guest_request.model_dump_json() + "\n").encode()

    def start(self) -> NodeGuests:
        """Log in, send the request, and the user's image after it (from a thread: the nodes
        receive theirs side by side; a session that ends first says why in ``ready``)."""
        super().start()
        size = self.guest_request.image_size
        stdin = self.proc.stdin if self.proc is not None else None
        if self.image is not None and size is not None and stdin is not None:
            fd = self.image.descriptor()

            def send() -> None:
                try:
                    with contextlib.suppress(OSError, ValueError):
                        send_image(fd, size, stdin)
                finally:
                    os.close(fd)
            threading.Thread(target=send, name=f"image-{self.name}", daemon=True).start()
        return self

    def said_ready(self, text: str) -> bool:
        """The node's ready line, checked: it must parse, and name exactly the sockets asked
        for (nothing the node prints is used as a path)."""
        ended = text.split("\n")[:-1]             # a line still being written is not read
        line = next((x for x in ended if x.startswith(self.marker + " ")), None)
        if line is None or self.info is not None:
            return self.info is not None
        try:
            if len(line) > READY_LINE_LIMIT:
                raise ValueError(f"{len(line)} bytes")
            info = GuestsReady.model_validate_json(line[len(self.marker) + 1:])
        except (ValueError, ValidationError) as exc:
            raise TrialFailed(f"node {self.name}: its ready line does not parse: "
                              f"{str(exc).splitlines()[0]}") from None
        asked = tuple(str(remote) for _, remote in self.forwards)
        if info.sockets != asked:
            raise TrialFailed(f"node {self.name}: its guests are on {', '.join(info.sockets)}, "
                              f"not on {', '.join(asked)} as asked")
        self.info = info
        return True

    def tell(self, command: GuestCommand) -> None:
        """Send the node ``command`` (a session that ended hears nothing: ``answer`` says so)."""
        if self.proc is not None and self.proc.stdin is not None:
            with contextlib.suppress(OSError, ValueError):
                self.proc.stdin.write((command.model_dump_json() + "\n").encode())
                self.proc.stdin.flush()

    def answer(self, marker: str, n: int, deadline: float) -> GuestsAnswer | None:
        """The node's answer to command ``n`` (a line after ``marker``), once written whole;
        None when its session ends first, or it gives none by ``deadline`` (monotonic)."""
        found: list[GuestsAnswer] = []

        def look() -> bool:
            with contextlib.suppress(OSError), open(self.log, "rb") as log:
                log.seek(self._read)
                text = log.read()
                whole = text[:text.rfind(b"\n") + 1]
                self._read += len(whole)
                for line in whole.decode(errors="replace").split("\n"):
                    if line.startswith(marker + " ") and len(line) < READY_LINE_LIMIT:
                        with contextlib.suppress(ValueError):
                            answer = GuestsAnswer.model_validate_json(line[len(marker) + 1:])
                            if answer.n == n:
                                found.append(answer)
            return bool(found) or not self.alive()

        wait_for(look, timeout=max(0.0, deadline - time.monotonic()), interval=0.01)
        return found[0] if found else None


class NodesLoad(Session):
    """What a configuration's session on every node at once does alike in host and guest
    mode: ``servers``, one per node, each forwarding one fio server or more."""

    servers: list[NodeSession]
    _skew = ""

    def new_trial(self) -> None:
        self._skew = ""

    def check_trial(self, result: FioResult, workload: Workload) -> None:
        skew = start_skew_ms(result)
        self._skew = (f"{skew} ms" if skew is not None else
                      "not measured: fio before 3.36 reports no job start")

    def fio_clients(self) -> list[str]:
        if any(not s.alive() for s in self.servers):
            raise TrialFailed("a node's fio server is gone")      # named by ``failure``
        return [f"sock:{p}" for s in self.servers for p in s.locals]

    def clients(self) -> list[int | str]:
        return [str(p) for s in self.servers for p in s.locals]

    def ioping_path(self) -> Path | None:
        return None             # ioping would run here, not on the nodes: fio's equivalent

    def failure(self, reason: str) -> str:
        # a node whose server ended takes a moment to end its session after fio noticed
        wait_for(lambda: any(not s.alive() for s in self.servers), timeout=DROP_SECONDS)
        dropped = [f"node {s.name} dropped: {s.why()}" for s in self.servers if not s.alive()]
        return "; ".join([*dropped, reason])

    def applied(self) -> dict[str, str]:
        """Which node (and guest) each per-client figure (``vm`` N) is, and how far apart (by
        the nodes' clocks) their jobs started in the last trial."""
        labels = [label for s in self.servers for label in s.labels()]
        skew = {"cluster.start_skew": self._skew} if self._skew else {}
        return {"cluster.nodes": ", ".join(f"vm{i}={x}" for i, x in enumerate(labels))} | skew


class ClusterSession(NodesLoad, HostSession):
    """A host-mode configuration on every node at once: the same job to each node's server."""

    def __init__(self, config: Configuration, images: Sequence[Image], engine: str,
                 servers: Sequence[NodeServer]) -> None:
        HostSession.__init__(self, config, images, engine)
        self.servers = list(servers)

    def precondition_clients(self) -> list[str]:
        return self.fio_clients()[:1]      # one writer: the nodes share the target


class ClusterDriver(Driver):
    """host mode on a cluster's nodes at once (``[method] concurrent_nodes``)."""

    mode = Mode.HOST

    def __init__(self, method: Method, workdir: Path, nodes: Sequence[Node],
                 ceph_conf: str | None = None) -> None:
        super().__init__(method, workdir)
        self.nodes = list(nodes)
        self.sessions = 0
        self.ceph_conf = ceph_conf
        """``OpenTarget.node_client``: the target is a pool, which each node's fio reads."""

    def images_of(self, config: Configuration) -> Configuration:
        return own_images(config, node_count(config, len(self.nodes)), self.ceph_conf,
                          self.method)

    @contextlib.contextmanager
    def session(self, config: Configuration, images: Sequence[Image]) -> Iterator[Session]:
        self.sessions += 1
        with contextlib.ExitStack() as stack:
            servers = []
            for index, node in enumerate(taking_part(config, self.nodes)):
                # short names: Unix socket paths must stay under 108 bytes
                base = self.workdir / f"n{self.sessions}-{index}"
                server = NodeServer(node, Path(f"{base}.sock"), Path(f"{base}.log"),
                                    self.ceph_conf)
                stack.callback(server.close)
                servers.append(server.start())
            deadline = time.monotonic() + START_TIMEOUT      # the nodes log in side by side
            for server in servers:
                server.ready(deadline)
            own = self.ceph_conf is not None and not self.method.shared_image
            kind = PoolSession if own else ClusterSession
            yield kind(config, images, self.method.engine, servers)


def own_images(config: Configuration, nodes: int, ceph_conf: str | None,
               method: Method) -> Configuration:
    """``config`` as the controller makes a host-mode configuration's images under cluster
    load: in a pool (``ceph_conf``), one image of each of the ``nodes`` taking part (``vms`` =
    ``nodes``: image ``i`` is node ``i``'s, named by the run and ``i``), unless ``[method]
    shared_image``."""
    if ceph_conf is None or method.shared_image:
        return config
    return config.model_copy(update={"vms": nodes})


class PoolSession(ClusterSession):
    """A host-mode configuration on every node at once, each node's fio on an image of its own
    in the pool (``own_images``): each node's job names its image, and each node's fio
    preconditions its own."""

    def client_targets(self) -> list[dict[str, str]]:
        return [{**image.network.fio, "size": str(image.size)} for image in self.images
                if image.network is not None]

    def precondition_clients(self) -> list[str]:
        return self.fio_clients()


def taking_part(config: Configuration, nodes: Sequence[Node]) -> list[Node]:
    """The nodes that load the target in ``config``'s trials: the first ``node_count`` of
    ``nodes`` ([matrix] node_count), or every node where it sets none."""
    return list(nodes)[:config.node_count] if config.node_count else list(nodes)


def node_count(config: Configuration, nodes: int) -> int:
    """How many of ``nodes`` nodes take part in ``config``'s trials (``taking_part``)."""
    return min(config.node_count, nodes) if config.node_count else nodes


def on_every_node(config: Configuration, nodes: int) -> Configuration:
    """``config`` as the controller makes its images under cluster load: a guest
    configuration's ``vms`` guests on each of the nodes that take part of ``nodes``
    (``node_count``), each with a disk of its own."""
    if config.mode != Mode.GUEST:
        return config
    return config.model_copy(update={"vms": (config.vms or 1) * node_count(config, nodes)})


class ClusterGuestSession(NodesLoad):
    """A guest-mode configuration on every node at once: the same job to every guest of every
    node, through the sockets each node's session forwards."""

    def __init__(self, config: Configuration, images: Sequence[Image],
                 servers: Sequence[NodeGuests]) -> None:
        super().__init__(config, images)
        self.servers = list(servers)
        self.guests = list(servers)
        infos = [s.info for s in self.guests]
        assert all(i is not None for i in infos)
        self.infos: list[GuestsReady] = [i for i in infos if i is not None]
        self._n = 0
        self._answers: dict[str, GuestsAnswer | None] = {}
        disks = {s.name: i.applied.get("guest.disk", "") for s, i in zip(self.guests, self.infos)}
        if len(set(disks.values())) != 1 or not next(iter(disks.values())):
            raise TrialFailed("the nodes' guests do not see the disk under test alike: "
                              + ", ".join(f"{n}: {d or 'none'}" for n, d in disks.items()))
        self.disk = next(iter(disks.values()))

    def fio_target(self) -> dict[str, str]:
        return {"ioengine": "libaio", "direct": "1", "filename": f"/dev/{self.disk}"}

    def fio_output_format(self) -> str:
        return "json+"

    def new_trial(self) -> None:
        """Every node reads its guests' counters before fio starts (as a local run does)."""
        super().new_trial()
        self._n += 1
        self._answers = {}
        for s in self.guests:
            s.tell(GuestCommand(kind="trial", n=self._n))
        deadline = time.monotonic() + ANSWER_TIMEOUT
        for s in self.guests:      # one that does not answer is not checked (or is gone)
            s.answer(GUESTS_TRIAL, self._n, deadline)

    def check_trial(self, result: FioResult, workload: Workload) -> None:
        """TrialFailed naming the node when QEMU saw more I/O on a guest's disk there than fio
        counted (each node checks its own guests: ``GuestSession.check_io``)."""
        super().check_trial(result, workload)
        for s in self.guests:
            jobs = [client_job(result, str(local)) for local in s.locals]
            s.tell(GuestCommand(kind="check", n=self._n, workload=workload.key, counted=tuple(
                None if j is None else j.read.io_bytes + j.write.io_bytes for j in jobs)))
        deadline = time.monotonic() + ANSWER_TIMEOUT
        self._answers = {s.name: s.answer(GUESTS_CHECKED, self._n, deadline)
                         for s in self.guests}
        foreign = [f"node {name}: {line}" for name, a in self._answers.items() if a is not None
                   for line in a.foreign]
        if foreign:
            raise TrialFailed("foreign I/O on the disk under test during the trial (another "
                              "process used a guest's disk): " + "; ".join(foreign))

    def applied(self) -> dict[str, str]:
        """The first node's guests' settings as QEMU applied them; another node's where they
        differ, under its name (``pve2:guest.queues``); which node and guest each per-client
        figure is; each node's foreign-I/O verdicts, and QEMU's counters over the last trial
        summed over every guest of every node."""
        first = self.infos[0].applied
        others = {f"{s.name}:{key}": value for s, info in zip(self.guests[1:], self.infos[1:])
                  for key, value in info.applied.items() if first.get(key) != value}
        answers = self._answers
        checks = {"io_check": "; ".join(
            f"{name}: {a.io_check if a is not None else 'not checked: no answer'}"
            for name, a in answers.items())} if answers else {}
        counters: dict[str, str] = {}
        if answers and all(a is not None and a.blockstats for a in answers.values()):
            keys = set.intersection(*(set(a.blockstats) for a in answers.values() if a))
            counters = {f"blockstats.{k}": str(sum(a.blockstats[k] for a in answers.values()
                                                   if a)) for k in sorted(keys)}
        return first | others | super().applied() | counters | checks

    def mismatches(self) -> list[str]:
        return [f"node {s.name}: {w}" for s, info in zip(self.guests, self.infos)
                for w in info.wrong]

    def command(self) -> str:
        return "\n".join(f"# node {s.name}\n{info.command}"
                         for s, info in zip(self.guests, self.infos))


class ClusterGuestDriver(Driver):
    """guest mode on a cluster's nodes at once (``[method] concurrent_nodes``): each node
    boots ``vms`` guests on disks the controller made on the shared target, or on a LUN each
    on a region of its own of it (``regions``: the LUN split per node, then per guest)."""

    mode = Mode.GUEST

    def __init__(self, method: Method, workdir: Path, nodes: Sequence[Node], *, suite: Suite,
                 accelerator: str, kinds: Sequence[GuestKind] = (),
                 regions: Callable[[Image, int, int], list[Image]] | None = None) -> None:
        super().__init__(method, workdir)
        self.nodes = list(nodes)
        self.suite = suite
        self.accelerator = accelerator
        self.sessions = 0
        self.kinds = list(kinds)
        """The suite's kinds of guest as this host opened them (the user's image: sent)."""
        self.regions = regions

    def images_of(self, config: Configuration) -> Configuration:
        return on_every_node(config, len(self.nodes))

    @contextlib.contextmanager
    def session(self, config: Configuration, images: Sequence[Image]) -> Iterator[Session]:
        self.sessions += 1
        vms = config.vms or 1
        part = taking_part(config, self.nodes)
        if self.regions is not None:
            images = self.regions(images[0], len(part), vms)
        if len(images) != vms * len(part):
            raise TrialFailed(f"{len(images)} disks for {vms} guests on each of "
                              f"{len(part)} nodes")
        if self.accelerator not in tuple(Accelerator):
            raise TrialFailed(f"guests cannot run under {self.accelerator!r}")
        own = own_image(self.kinds, config)
        image = own.image if own is not None else None
        with contextlib.ExitStack() as stack:
            nodes = []
            for index, node in enumerate(part):
                request = GuestRequest(
                    suite_text=self.suite.source_text, suite_spec=RunSpec.of(self.suite),
                    suite_source=self.suite.source_path,
                    config=config.key, accel=self.accelerator,  # type: ignore[arg-type]
                    directory=f"/tmp/iomatrix-guests-{secrets.token_hex(8)}",
                    trusted=self.suite.author.trusted,
                    images=tuple(images[index * vms:(index + 1) * vms]),
                    image_size=None if image is None else os.fstat(image.fd).st_size)
                # short names: Unix socket paths must stay under 108 bytes
                base = self.workdir / f"n{self.sessions}-{index}"
                guests = NodeGuests(node, request, [Path(f"{base}v{j}.sock") for j in range(vms)],
                                    Path(f"{base}.log"), image)
                stack.callback(guests.close)
                nodes.append(guests.start())
            for guests in nodes:         # every node stops its guests at once, then each is awaited
                stack.callback(guests.hang_up)
            # the nodes boot side by side
            boot = self.method.boot_timeout
            if own is not None:
                boot = max(boot, own.own.ready_seconds(self.accelerator))
            deadline = time.monotonic() + boot + GUEST_START_SLACK
            for guests in nodes:
                guests.ready(deadline, "its guests were")
            yield ClusterGuestSession(config, images, nodes)


def own_image(kinds: Sequence[GuestKind], config: Configuration) -> ImageGuest | None:
    """The user's image (opened here) that ``config``'s guests boot, or None (the appliance)."""
    kind = kind_for(kinds, config) if kinds else None
    return kind if isinstance(kind, ImageGuest) and kind.image is not None else None
