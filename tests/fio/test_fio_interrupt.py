"""A Ctrl-C that comes while fio is being started (between the fork and iomatrix holding the
process) stops fio before iomatrix goes on ending: it does not run on until its parent-death
signal, after iomatrix has ended (CI once found such an fio left by ``test_lvm``'s Ctrl-C)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

import iomatrix.fio.run as fio_run
from iomatrix.core.proc import group_members
from tests.needs import needs


@needs("fio")
def test_a_ctrl_c_while_fio_starts_stops_fio(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[subprocess.Popen[bytes]] = []
    real = subprocess.Popen

    def popen_then_ctrl_c(*args, **kwargs):  # type: ignore[no-untyped-def]
        proc = real(*args, **kwargs)
        started.append(proc)
        os.kill(os.getpid(), signal.SIGINT)         # as the user's Ctrl-C at that moment
        return proc

    monkeypatch.setattr(fio_run.subprocess, "Popen", popen_then_ctrl_c)
    job = (f"[j]\nioengine=psync\nrw=read\nbs=4k\nsize=1m\ntime_based=1\nruntime=60\n"
           f"filename={tmp_path / 'f'}\n")
    with pytest.raises(KeyboardInterrupt):
        fio_run.run_fio(job, workdir=tmp_path, timeout=120)
    (proc,) = started
    assert proc.poll() is not None, "fio still runs after the Ctrl-C"
    assert group_members(proc.pid) == []
