"""The node's side of blocklayer mode under cluster load (``iomatrix node serve-blocklayer``,
started by the controller's ``iomatrix.drivers.clusterblock.ClusterBlockDriver`` over SSH): a
local run's qemu-storage-daemon on the node's image in the suite's rbd pool (reached by the
node's own ceph.conf: ``iomatrix.measure.nodepool``), or on the suite's iSCSI LUN (libiscsi, as
a local host-mode run without the kernel initiator reaches it; in blocklayer mode a raw node
limited to the node's region of it: ``nodepool.lun_regions``), and a fio server
on a Unix socket beside it, both in a fresh 0700 directory, said in one line; kept until the session's standard input
ends (SIGHUP), then stopped (every fio process of the server, found by its command line, as
the host-mode session's shell finds them) and the directory removed. Nothing listens on a
network: the daemon's export and the server are Unix sockets in that directory."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import IO

from iomatrix.core.errors import NodesError, TrialFailed
from iomatrix.core.proc import log_tail, managed, wait_for
from iomatrix.drivers.cluster import GuestRequest, GuestsReady
from iomatrix.drivers.clusterblock import BLOCK_READY, DAEMON_DIRECTORY, FIO_SOCKET
from iomatrix.drivers.host import USERSPACE
from iomatrix.drivers.registry import driver_for
from iomatrix.measure.nodeside import watch_stdin
from iomatrix.measure.nodeguests import requested
from iomatrix.measure.nodepool import lun_image, lun_regions, pool_images
from iomatrix.vocab.words import Mode

WATCH_SECONDS = 0.5
"""How often the node looks whether its daemon or fio server has ended while it serves."""
FIO_START = 30.0


def serve_blocklayer(request: GuestRequest, stdin: int, out: IO[str]) -> None:
    """Start and serve what ``request`` asks for until interrupted (KeyboardInterrupt: SIGHUP,
    raised when ``stdin`` ends), then stop it and remove its directory; raises when it cannot
    start or ends on its own (a line saying why)."""
    watch_stdin(stdin)
    directory = Path(request.directory)
    try:
        os.mkdir(directory, 0o700)
    except OSError as exc:
        raise NodesError(f"cannot make {directory}: {exc.strerror} (a directory planted "
                         "there is never used)") from None
    try:
        _serve(request, directory, out)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _serve(request: GuestRequest, directory: Path, out: IO[str]) -> None:
    prepared, config = requested(request, Mode.BLOCKLAYER, Mode.HOST)
    suite = prepared.suite
    method = suite.method
    if suite.target.iscsi is not None and config.mode == Mode.HOST:      # as HostDriver does
        images = [lun_image(request.images, suite, directory)]
        config = config.model_copy(update=USERSPACE)
        method = method.model_copy(update={"platform": "qemu"})
    elif suite.target.rbd is not None and config.mode == Mode.BLOCKLAYER:
        images = pool_images(request.images, config.model_copy(update={"vms": 1}), suite,
                             directory)
    elif suite.target.iscsi is not None and config.mode == Mode.BLOCKLAYER:
        images = lun_regions(request.images, config.model_copy(update={"vms": 1}), suite,
                             directory)
    else:
        raise NodesError("a daemon on the node under cluster load is built for an rbd pool "
                         "and an iSCSI LUN only")
    notes: list[str] = []
    driver = driver_for(Mode.BLOCKLAYER, method, directory, accel=request.accel,
                        note=notes.append)
    socket = directory / FIO_SOCKET
    with driver.session(config, images) as session, \
            managed(["fio", f"--server=sock:{socket}"], log=directory / "fio.log") as fio:
        assert (directory / DAEMON_DIRECTORY).is_dir(), "the driver's own directory"
        try:
            if not wait_for(lambda: socket.is_socket() or fio.poll() is not None,
                            timeout=FIO_START) or fio.poll() is not None:
                raise NodesError(f"fio --server did not start: {log_tail(directory / 'fio.log')}")
            ready = GuestsReady(sockets=(str(socket),), applied=session.applied(),
                                wrong=tuple(session.mismatches()), command=session.command(),
                                notes=tuple(notes))
            out.write(f"{BLOCK_READY} {ready.model_dump_json()}\n")
            out.flush()
            while True:
                time.sleep(WATCH_SECONDS)
                if fio.poll() is not None:
                    raise TrialFailed(f"fio --server ended (status {fio.returncode}): "
                                      f"{log_tail(directory / 'fio.log')}")
                if any(not _alive(pid) for pid in session.pids()):
                    raise TrialFailed("qemu-storage-daemon ended: "
                                      f"{log_tail(directory / DAEMON_DIRECTORY / 'daemon.log')}")
        finally:
            _stop_jobs(socket)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError):     # a zombie (the driver reaps it) is gone
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    return True


def _stop_jobs(socket: Path) -> None:
    """Stop every fio process of the server on ``socket`` (a job's process leaves the server's
    group), as the host-mode session's shell does."""
    pattern = f"^fio --server=sock:{socket}$"
    for signal_name in ("TERM", "KILL"):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(["pkill", f"-{signal_name}", "-f", pattern], timeout=10,
                           capture_output=True)
        time.sleep(0.2)
