"""blocklayer mode under cluster load (``[method] concurrent_nodes``) on an rbd pool or an iSCSI
LUN (each node on a region of its own of it: ``region_images``): each node's
SSH session runs ``iomatrix node serve-blocklayer`` (``iomatrix.measure.nodeblock``) with a
:class:`~iomatrix.drivers.cluster.GuestRequest` on its standard input, which starts a local
run's qemu-storage-daemon on the node's image in the pool (the same driver: the same graph,
the same checks of what QEMU applied, read back over QMP) and a fio server beside it, both in
a fresh 0700 directory the controller names, and says so in one line (:data:`BLOCK_READY`).
The controller forwards the fio server's socket with ``ssh -L`` as in host mode and gives each
node a job aimed at that node's own export (``blocklayer.export_target`` of the directory IT
named: nothing the node prints is used as a path or a job option). The session owns the
daemon and the server: when its standard input ends, the node stops both and removes the
directory."""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from iomatrix.cluster.ssh import Node
from iomatrix.drivers.base import Driver, Session
from iomatrix.core.errors import TrialFailed
from iomatrix.drivers.blocklayer import export_target
from iomatrix.drivers.guest import GuestDriver
from iomatrix.drivers.host import USERSPACE
from iomatrix.drivers.cluster import (GUEST_START_SLACK, ClusterDriver, ClusterGuestDriver,
                                      ClusterGuestSession, GuestRequest, GuestsReady,
                                      NodeGuests, NodesLoad, NodeSession, taking_part)
from iomatrix.fio.models import FioResult
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.method import Method
from iomatrix.suite.model import Suite
from iomatrix.suite.spec import RunSpec
from iomatrix.suite.workloads import Workload
from iomatrix.targets.kind import OpenTarget
from iomatrix.targets.workspace import Image
from iomatrix.vocab.words import Mode

BLOCK_READY = "IOMATRIX-BLOCK-READY"
"""What a node's ``serve-blocklayer`` prints before its :class:`GuestsReady` line."""
FIO_SOCKET = "fio.sock"
DAEMON_DIRECTORY = "qsd"
"""Where the node's blocklayer driver keeps its daemon's sockets, in the session's directory."""


class NodeBlock(NodeGuests):
    """One node's qemu-storage-daemon and fio server (blocklayer mode)."""

    marker = BLOCK_READY

    def __init__(self, node: Node, request: GuestRequest, local: Path, log: Path) -> None:
        self.remote = Path(request.directory)
        NodeSession.__init__(self, node, [(local, self.remote / FIO_SOCKET)], log)
        self.guest_request = request
        self.info: GuestsReady | None = None
        self._read = 0
        self.image = None
        """No user's guest image to send (``NodeGuests.start``): a daemon boots no guest."""

    def labels(self) -> list[str]:
        return [self.name]

    def command(self) -> list[str]:
        return [self.node.command, "node", "serve-blocklayer"]


class ClusterBlockSession(ClusterGuestSession):
    """A blocklayer configuration on every node at once: each node's fio on its own daemon's
    export (what each applied as ``ClusterGuestSession.applied`` reports it)."""

    def __init__(self, config: Configuration, images: Sequence[Image],
                 servers: Sequence[NodeBlock], engine: str, own: bool,
                 regions: bool = False) -> None:
        NodesLoad.__init__(self, config, images)
        self.servers = list(servers)
        self.guests = list(servers)
        self.infos = [s.info for s in servers if s.info is not None]
        assert len(self.infos) == len(self.servers)
        self._n = 0
        self._answers = {}
        self.engine = engine
        self.own = own or regions
        """Each node on an image (a region) of its own: each preconditions its own."""
        self.regions = regions
        """The nodes share one volume (a LUN), each on a region of it (``regions``)."""

    def fio_target(self) -> dict[str, str]:
        return self.client_targets()[0]

    def client_targets(self) -> list[dict[str, str]]:
        config = self.config.model_copy(update=USERSPACE) if self.regions else self.config
        targets = [export_target(config, s.remote / DAEMON_DIRECTORY, self.engine,
                                 self.image.size) for s in self.servers]
        if not self.regions:
            return targets
        return [t | r for t, r in zip(targets, regions(self.image.size, len(targets)))]

    def fio_output_format(self) -> str:
        return "json"

    def new_trial(self) -> None:
        NodesLoad.new_trial(self)

    def check_trial(self, result: FioResult, workload: Workload) -> None:
        NodesLoad.check_trial(self, result, workload)

    def precondition_clients(self) -> list[str]:
        return self.fio_clients() if self.own else self.fio_clients()[:1]


def regions(size: int, nodes: int, what: str = "nodes") -> list[dict[str, str]]:
    """fio's ``offset`` and ``size`` of each of ``nodes`` nodes' (``what``) equal regions of a
    volume of ``size`` bytes (whole MiB each, the rest unused)."""
    each = size // nodes >> 20 << 20
    if each <= 0:
        raise TrialFailed(f"a volume of {size} bytes has no MiB for each of {nodes} {what}")
    return [{"offset": str(i * each), "size": str(each)} for i in range(nodes)]


def region_images(image: Image, nodes: int, vms: int = 1) -> list[Image]:
    """A LUN (``image``) split as cluster load splits it: one equal region per node, as fio's
    in host mode (``regions``), each split again into one per guest, node by node: each a disk
    that is a raw node over the LUN limited to its region (``Image.offset``, ``Image.size``),
    from the LUN's size as the controller found it (``IscsiLun.check``)."""
    out = []
    for node in regions(image.size, nodes):
        start = int(node["offset"])
        for vm in regions(int(node["size"]), vms, "guests of a node"):
            out.append(image.model_copy(update={"offset": start + int(vm["offset"]),
                                                "size": int(vm["size"])}))
    return out


class ClusterBlockDriver(ClusterDriver):
    """blocklayer mode on a cluster's nodes at once, on an rbd pool: each node's daemon on an
    image of its own there (``own_images``), or on one for all (``shared_image``); on an iSCSI
    LUN (``lun``), each node's daemon on a region of its own of it (``region_images``)."""

    mode = Mode.BLOCKLAYER
    regions = False
    """Each node on a region of one volume (``ClusterLunDriver``)."""

    def __init__(self, method: Method, workdir: Path, nodes: Sequence[Node], *, suite: Suite,
                 accelerator: str, ceph_conf: str | None, lun: bool = False) -> None:
        super().__init__(method, workdir, nodes, ceph_conf)
        self.suite = suite
        self.accelerator = accelerator
        self.lun = lun

    @contextlib.contextmanager
    def session(self, config: Configuration, images: Sequence[Image]) -> Iterator[Session]:
        self.sessions += 1
        part = taking_part(config, self.nodes)
        if self.lun:
            images = region_images(images[0], len(part))
        own = self.lun or (len(images) >= len(part) and not self.method.shared_image
                           and not self.regions)
        with contextlib.ExitStack() as stack:
            nodes = []
            for index, node in enumerate(part):
                request = GuestRequest(
                    suite_text=self.suite.source_text, suite_spec=RunSpec.of(self.suite),
                    suite_source=self.suite.source_path, config=config.key,
                    accel="kvm" if self.accelerator == "kvm" else "tcg",   # no guest: unused
                    directory=f"/tmp/iomatrix-guests-{secrets.token_hex(8)}",
                    trusted=self.suite.author.trusted,
                    images=(images[index if own else 0],))
                base = self.workdir / f"b{self.sessions}-{index}"     # under 108 bytes
                block = NodeBlock(node, request, Path(f"{base}.sock"), Path(f"{base}.log"))
                stack.callback(block.close)
                nodes.append(block.start())
            for block in nodes:         # every node stops at once, then each is awaited
                stack.callback(block.hang_up)
            deadline = time.monotonic() + GUEST_START_SLACK
            for block in nodes:
                block.ready(deadline, "its qemu-storage-daemon was")
            yield ClusterBlockSession(config, images, nodes, self.method.engine, own,
                                      self.regions)


class ClusterLunDriver(ClusterBlockDriver):
    """host mode on a cluster's nodes at once, on an iSCSI LUN: each node's fio on a region of
    its own of the LUN (``regions``), through a qemu-storage-daemon of the node's (libiscsi,
    raw, cache=none, NBD: as a local host-mode run reaches a LUN without the kernel
    initiator)."""

    mode = Mode.HOST
    regions = True


def on_the_nodes(drivers: dict[str, Driver], suite: Suite, workdir: Path, nodes: Sequence[Node],
                 accelerator: str, target: OpenTarget) -> dict[str, Driver]:
    """The drivers of a run under cluster load, for the modes of ``drivers`` (a local run's):
    each mode's on every node at once, as ``target`` is reached there (``node_client``: an rbd
    pool; ``node_regions``: a LUN)."""
    ceph_conf = target.node_client()
    out: dict[str, Driver] = {Mode.HOST: ClusterDriver(suite.method, workdir, nodes, ceph_conf)}
    if target.node_regions():
        out[Mode.HOST] = ClusterLunDriver(suite.method, workdir, nodes, suite=suite,
                                          accelerator=accelerator, ceph_conf=None)
    if Mode.BLOCKLAYER in drivers:
        out[Mode.BLOCKLAYER] = ClusterBlockDriver(suite.method, workdir, nodes, suite=suite,
                                                  accelerator=accelerator, ceph_conf=ceph_conf,
                                                  lun=target.node_regions())
    if Mode.GUEST in drivers:
        local = drivers[Mode.GUEST]       # the suite's kinds of guest, opened here
        out[Mode.GUEST] = ClusterGuestDriver(suite.method, workdir, nodes, suite=suite,
                                             accelerator=accelerator,
                                             kinds=local.kinds if isinstance(local, GuestDriver) else (),
                                             regions=region_images if target.node_regions()
                                             else None)
    return out
