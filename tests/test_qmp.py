"""A stop signal during a QMP conversation is raised once the conversation ends, never inside
asyncio's event loop (where its clean-up could wait on the socket and the run never stop)."""

from __future__ import annotations

import signal
import socket
import time
from pathlib import Path

import pytest

from iomatrix.cli.run import _interrupt
from iomatrix.qemu import qmp


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
