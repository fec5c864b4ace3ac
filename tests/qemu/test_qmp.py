"""A stop signal during a QMP conversation is raised once the conversation ends, never inside
asyncio's event loop (where its clean-up could wait on the socket and the run never stop)."""

from __future__ import annotations

import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from iomatrix.cli.run import _interrupt
from iomatrix.core.errors import ToolFailed
from iomatrix.qemu import qmp
from tests.needs import needs


def test_interrupt_during_qmp_is_raised_after_it(tmp_path: Path) -> None:
    path = tmp_path / "qmp.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)                  # accepts, never greets: the client waits for its timeout
    previous = signal.signal(signal.SIGALRM, _interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        t0 = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            qmp.qmp_execute(path, [("query-status", None)], timeout=1.0)
        # the signal came at 0.2 s; it was held until the conversation gave up at 1 s
        assert time.monotonic() - t0 >= 0.9
        assert qmp.defer_interrupt() is False       # nothing busy, nothing pending any more
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        server.close()


def test_interrupt_outside_qmp_is_raised_at_once() -> None:
    with pytest.raises(KeyboardInterrupt):
        _interrupt(signal.SIGTERM, None)



@pytest.mark.slow
@needs("qemu")
def test_socket_bound_before_listening_is_tried_again(tmp_path: Path) -> None:
    """QEMU binds its monitor socket (the file appears) before it listens: a caller that waited
    for the file and connects in between is refused. That refusal (and a socket file not there
    yet) is retried, here until a real qemu-storage-daemon listens at the path; a socket that
    keeps refusing (a QEMU that died and left it) still fails within REFUSED_RETRY."""
    path = tmp_path / "qmp.sock"
    early = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    early.bind(str(path))             # the file exists; connect() is refused: never listens
    argv = ["qemu-storage-daemon", "--chardev", f"socket,id=m,path={path},server=on,wait=off",
            "--monitor", "chardev=m"]

    def replace_late() -> None:
        time.sleep(0.3)
        early.close()
        path.unlink()
        time.sleep(0.2)               # the client now finds no file at all
        daemon.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    daemon: list[subprocess.Popen[bytes]] = []
    thread = threading.Thread(target=replace_late, daemon=True)
    thread.start()
    try:
        (version,) = qmp.qmp_execute(path, [("query-version", None)], timeout=10.0)
        assert version["qemu"]["major"] >= 7
    finally:
        thread.join(timeout=5)
        for proc in daemon:
            proc.kill()
            proc.wait()

    dead = tmp_path / "dead.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(dead))
    try:
        t0 = time.monotonic()
        with pytest.raises(ToolFailed, match="Connection refused"):
            qmp.qmp_execute(dead, [("query-status", None)], timeout=30.0)
        assert qmp.REFUSED_RETRY - 0.1 <= time.monotonic() - t0 < qmp.REFUSED_RETRY + 5
    finally:
        stale.close()
