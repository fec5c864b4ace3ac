"""blocklayer mode: qemu-storage-daemon holds the image with the configuration's format, aio and
cache; fio drives it from the host. Without iothread the export is NBD (fio's nbd engine); with
iothread it is FUSE, on every QEMU so that runs on different hosts measure the same path: QEMU
7.2 aborts an NBD export that has an iothread when a client disconnects (an assertion in
``nbd_blockdev_client_closed``), which 10.0 no longer does (both tried; the NBD server's client
list went to the main loop thread for 9.0, f816310d0c3). What QEMU applied is read back over QMP
(per node) and from /proc (aio: looked at while fio runs and once it ended, read as
:func:`iomatrix.qemu.procinspect.aio_seen` says for the daemon's QEMU version).

``[method] platform = "proxmox"`` gives the daemon the layers a Proxmox VE disk has for the same
settings (``pve_version``: 8, detect-zeroes on the format node; 9, detect-zeroes and discard on
every node and a throttle filter over an empty throttle group), the export on the top node;
``platform = "libvirt"`` gives it the nodes libvirt gives the disk (``libvirt-1-storage``, and
``libvirt-1-format`` over it unless libvirt 10.1 or later with QEMU 9.0 or later leaves a raw
disk without: :mod:`iomatrix.drivers.versions` says which libvirt). The nodes are read back by
role (``file0``, ``disk0``, ``throttle0``) as in guest mode."""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from iomatrix.drivers.base import Driver, Session
from iomatrix.drivers.versions import method_versions
from iomatrix.core.errors import ToolFailed, TrialFailed
from iomatrix.core.mounts import force_unmount, is_mounted
from iomatrix.core.proc import log_tail, managed, reaper, require, wait_for
from iomatrix.platform import libvirt as lv
from iomatrix.qemu.affinity import Pinning
from iomatrix.qemu.args import export_writethrough, storage_daemon_argv
from iomatrix.qemu.blockdev import daemon_graph, expected_daemon_graph, nodes_by_role
from iomatrix.qemu.escape import qemu_escape
from iomatrix.qemu.procinspect import UNOBSERVABLE, AioSeen, ProcessIO, aio_seen, inspect_process
from iomatrix.qemu.qmp import flatten_block_nodes, qmp_execute
from iomatrix.qemu.version import QemuVersion, from_qmp
from iomatrix.fio.models import FioResult
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.method import Method
from iomatrix.suite.workloads import Workload
from iomatrix.targets.remote import reveal
from iomatrix.targets.workspace import Image
from iomatrix.vocab.words import Mode

START_TIMEOUT = 15.0


def daemon_argv(config: Configuration, image: Image, workdir: Path, qsd: str,
                method: Method | None = None, libvirt: lv.Versions | None = None) -> list[str]:
    """The qemu-storage-daemon command line for a configuration: NBD export, or FUSE with an
    iothread; the graph as ``method.platform`` builds it (libvirt: at ``libvirt``)."""
    platform = method.platform if method else "qemu"
    pve_version = method.pve_version if method else None
    argv = storage_daemon_argv(config, image, qmp_socket=workdir / "qmp.sock", qsd=qsd,
                               platform=platform, pve_version=pve_version, libvirt=libvirt)
    top = daemon_graph(config, image.path, is_device=image.is_device,
                       size=image.size if image.is_device else None, platform=platform,
                       pve_version=pve_version, libvirt=libvirt,
                       network=image.network, backing=image.backing).export_node
    common = f"id=exp0,node-name={top},writable=on,writethrough={export_writethrough(config)}"
    if config.iothread:
        mountpoint = qemu_escape(str(workdir / "fuse.img"))
        return argv + ["--object", "iothread,id=iot0",
                       "--export", f"type=fuse,{common},mountpoint={mountpoint},iothread=iot0"]
    nbd = qemu_escape(str(workdir / "nbd.sock"))
    return argv + ["--nbd-server", f"addr.type=unix,addr.path={nbd}",
                   "--export", f"type=nbd,{common},name=disk"]


def export_target(config: Configuration, workdir: Path, engine: str,
                  size: int) -> dict[str, str]:
    """The fio options that reach a daemon's export in ``workdir`` (``daemon_argv``): its FUSE
    file with an iothread, else its NBD socket."""
    if config.iothread:
        return {"ioengine": engine, "direct": "1", "filename": str(workdir / "fuse.img"),
                "size": str(size)}
    return {"ioengine": "nbd", "uri": f"nbd+unix:///disk?socket={workdir / 'nbd.sock'}"}


class BlocklayerSession(Session):
    def __init__(self, config: Configuration, images: Sequence[Image], workdir: Path,
                 argv: list[str], pid: int, nodes: dict[str, str], engine: str,
                 expected: dict[str, str] | None = None, qemu: QemuVersion | None = None,
                 pinning: Pinning | None = None) -> None:
        super().__init__(config, images)
        self.pinning = pinning or Pinning.start(config, None)
        """The daemon's main loop and IOThreads pinned, and fio's CPUs (``vcpu_affinity``)."""
        self.workdir = workdir
        self.argv = argv
        self.pid = pid
        self.nodes = nodes
        self.engine = engine
        self.expected = expected if expected is not None else expected_daemon_graph(config)
        self.qemu = qemu
        """The daemon's QEMU version, as it answers ``query-version``; None: unknown."""
        self.seen: ProcessIO | None = None
        """Every look of the current trial, merged."""

    def fio_target(self) -> dict[str, str]:
        return export_target(self.config, self.workdir, self.engine, self.image.size) | \
            self.pinning.fio_options()

    def new_trial(self) -> None:
        self.seen = None
        self.pinning.new_trial()

    def observe(self, fio_pid: int) -> None:
        self._look()
        self.pinning.observe_fio(fio_pid)

    def check_trial(self, result: FioResult, workload: Workload) -> None:
        """Look at the daemon again now that fio's I/O is done: from QEMU 9.0 on the aio ring
        appears only once a request reached the file (see :mod:`iomatrix.qemu.procinspect`)."""
        self._look()

    def _look(self) -> None:
        with contextlib.suppress(OSError):
            now = inspect_process(self.pid)
            self.seen = now if self.seen is None else self.seen.merged(now)

    def aio(self) -> AioSeen | None:
        """The aio mode the daemon showed over this trial; None before any look, and on a
        volume whose protocol driver has no aio mode (``NetworkVolume.aio_not_evaluated``:
        libiscsi)."""
        if self.seen is None or self._aio_not_evaluated() is not None:
            return None
        log = self.workdir / "daemon.log"
        text = log.read_text(errors="replace") if log.is_file() else ""
        return aio_seen(self.config.aio, self.seen, qemu=self.qemu, log=text)

    def _aio_not_evaluated(self) -> str | None:
        network = self.image.network
        return network.aio_not_evaluated if network is not None else None

    def applied(self) -> dict[str, str]:
        out = dict(self.nodes)
        out["export"] = "fuse+iothread" if self.config.iothread else "nbd"
        seen = self.aio()
        not_evaluated = self._aio_not_evaluated()
        if not_evaluated is not None:
            out["aio"] = not_evaluated
        if seen is not None:
            out["aio"] = seen.aio
            out["aio.evidence"] = seen.evidence
        return out | self.pinning.applied()

    def mismatches(self) -> list[str]:
        wrong = [f"{key}: asked {want}, QEMU reports {self.nodes.get(key, 'nothing')}"
                 for key, want in self.expected.items()
                 if self.nodes.get(key) != want]
        wrong += self.pinning.mismatches()
        if self.image.network is not None:     # no aio on network storage (librbd, libiscsi)
            return wrong
        seen = self.aio()
        if seen is None:
            wrong.append("aio: not observed while fio ran")
        elif seen.aio not in (self.config.aio, UNOBSERVABLE):
            wrong.append(f"aio: asked {self.config.aio}, the daemon shows {seen.aio} "
                         f"({seen.evidence})")
        return wrong

    def command(self) -> str:
        return shlex.join(self.argv)

    def pids(self) -> list[int]:
        return [self.pid]


class BlocklayerDriver(Driver):
    mode = Mode.BLOCKLAYER

    def __init__(self, method: Method, workdir: Path) -> None:
        super().__init__(method, workdir)
        self.libvirt: lv.Versions | None = None
        """With platform libvirt: the libvirt (and its QEMU) whose nodes the daemon holds."""

    @classmethod
    def prepare(cls, method: Method, workdir: Path, *, accel: str,
                note: Callable[[str], None]) -> Driver:
        driver = cls(method, workdir)
        modelled = method_versions(method, "qemu-storage-daemon")
        if modelled is not None:
            driver.libvirt, source = modelled
            note(f"the daemon holds the block graph of {driver.libvirt.label} (libvirt: "
                 f"{source})")
        return driver

    @contextlib.contextmanager
    def session(self, config: Configuration, images: Sequence[Image]) -> Iterator[Session]:
        image = images[0]
        workdir = self.workdir / "qsd"
        workdir.mkdir(parents=True, exist_ok=True)
        for stale in ("qmp.sock", "nbd.sock"):
            (workdir / stale).unlink(missing_ok=True)
        mountpoint = workdir / "fuse.img"
        if config.iothread:
            mountpoint.touch()
        argv = daemon_argv(config, image, workdir, require("qemu-storage-daemon"), self.method,
                           self.libvirt)
        log = workdir / "daemon.log"
        log.write_text("")
        try:
            with (managed(reveal(argv, image.network), log=log, stop_timeout=10) as proc,
                  reaper(proc, log=workdir / "reaper.log",
                         unmount=mountpoint if config.iothread else None)):
                ready = wait_for(lambda: proc.poll() is not None or _ready(config, workdir),
                                 timeout=START_TIMEOUT)
                if proc.poll() is not None or not ready:
                    raise TrialFailed(f"qemu-storage-daemon did not start: "
                                      f"{log_tail(log) or 'no output'}")
                try:
                    nodes = read_graph(workdir / "qmp.sock")
                    version, = qmp_execute(workdir / "qmp.sock", [("query-version", None)])
                except ToolFailed as exc:
                    raise TrialFailed(f"qemu-storage-daemon: {exc}; {log_tail(log)}") from exc
                expected = expected_daemon_graph(config, platform=self.method.platform,
                                                 pve_version=self.method.pve_version,
                                                 libvirt=self.libvirt,
                                                 is_device=image.is_device,
                                                 network=image.network and image.network.protocol,
                                                 backing=len(image.backing))
                pinning = Pinning.start(config, None if image.network else image.path,
                                        qmp_socket=workdir / "qmp.sock", pid=proc.pid,
                                        vcpus=False)
                yield BlocklayerSession(config, images, workdir, argv, proc.pid, nodes,
                                        self.method.engine, expected, qemu=from_qmp(version),
                                        pinning=pinning)
        finally:
            if config.iothread:
                force_unmount(mountpoint)   # only if the daemon died before unmounting
                mountpoint.unlink(missing_ok=True)


def read_graph(qmp_socket: Path) -> dict[str, str]:
    """What a running daemon applied, with the keys of
    :func:`iomatrix.qemu.blockdev.expected_daemon_graph`: every named node's driver, cache
    flags and detect-zeroes (nodes named by role), the export's node and the throttle groups."""
    raw, exports, root = qmp_execute(qmp_socket, [
        ("query-named-block-nodes", None), ("query-block-exports", None),
        ("qom-list", {"path": "/"})])
    nodes = nodes_by_role(raw)
    role = {old.get("node-name"): new.get("node-name") for old, new in zip(raw, nodes)}
    out = flatten_block_nodes(nodes)
    out |= {f"{n['node-name']}.detect-zeroes": str(n.get("detect_zeroes")) for n in nodes
            if n.get("node-name") and not n["node-name"].startswith("#")}
    objects: list[dict[str, str]] = []
    if any(child["name"] == "objects" for child in root):   # only once an --object exists
        objects, = qmp_execute(qmp_socket, [("qom-list", {"path": "/objects"})])
    out["throttle-groups"] = str(sum(o["type"] == "child<throttle-group>" for o in objects))
    top = next((str(e.get("node-name")) for e in exports if e.get("id") == "exp0"), "")
    out["export.node"] = str(role.get(top, top))
    return out


def _ready(config: Configuration, workdir: Path) -> bool:
    if not (workdir / "qmp.sock").exists():
        return False
    if config.iothread:
        return is_mounted(workdir / "fuse.img")
    return (workdir / "nbd.sock").exists()
