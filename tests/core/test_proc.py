"""``core.proc.stop``: a process iomatrix started in a session of its own is stopped with
everything of its group (fio's job processes), not only itself."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from iomatrix.core.proc import group_members, is_stopped, managed, stop, wait_for

# The leader ends on SIGTERM at once; its child (a job process, say) ignores SIGTERM and ends a
# moment later by itself, or not at all with ``forever``.
LEADER = ('(trap "" TERM; {child}) & echo $! > {pidfile}; trap "exit 0" TERM; '
          'while :; do sleep 0.05; done')


def _group_alive(pgid: int) -> bool:
    """A live process of the group is left (a zombie is not: this machine's init may never
    reap one whose parent ended)."""
    return bool(group_members(pgid))


def _start(tmp_path: Path, child: str) -> tuple[subprocess.Popen[bytes], int]:
    pidfile = tmp_path / "child.pid"
    proc = subprocess.Popen(["/bin/sh", "-c", LEADER.format(child=child, pidfile=pidfile)],
                            start_new_session=True)
    while not pidfile.exists() or not pidfile.read_text().strip():
        assert proc.poll() is None
    return proc, int(pidfile.read_text())


@pytest.mark.parametrize("child,timeout", [("sleep 1", 30.0), ("sleep 600", 0.5)])
def test_stop_returns_once_nothing_of_the_group_is_left(tmp_path: Path, child: str,
                                                        timeout: float) -> None:
    """A member that outlives the leader's SIGTERM is waited for (``sleep 1``: it ends by
    itself), or killed once ``timeout`` has passed (``sleep 600``); either way no process of the
    group is left when ``stop`` returns, and the leader is reaped."""
    proc, child_pid = _start(tmp_path, child)
    assert {proc.pid, child_pid} <= set(group_members(proc.pid))
    stop(proc, timeout=timeout)
    assert proc.returncode is not None
    assert not _group_alive(proc.pid), f"child {child_pid} of the group outlived stop()"


def test_managed_leaves_no_member_of_its_group(tmp_path: Path) -> None:
    """``managed`` stops what it started the same way on leaving its block."""
    pidfile = tmp_path / "child.pid"
    with managed(["/bin/sh", "-c", LEADER.format(child="sleep 600", pidfile=pidfile)],
                 log=tmp_path / "log", stop_timeout=0.5) as proc:
        while not pidfile.exists() or not pidfile.read_text().strip():
            assert proc.poll() is None
    assert not _group_alive(proc.pid)


def test_a_stopped_process_ends_on_its_sigterm(tmp_path: Path) -> None:
    """A process stopped whole (SIGSTOP, as a stuck guest's QEMU was in CI) is continued after
    its SIGTERM, so it ends on that (its TERM trap: status 0), not on the SIGKILL that a TERM
    left pending would have come to after ``timeout``."""
    proc, _ = _start(tmp_path, "sleep 1")
    assert not is_stopped(proc.pid)
    proc.send_signal(signal.SIGSTOP)
    assert wait_for(lambda: is_stopped(proc.pid), timeout=30)
    stop(proc, timeout=60)
    assert proc.returncode == 0 and not is_stopped(proc.pid)
