"""Resume after a real kill -9 of a running `iomatrix run`: nothing lost, nothing duplicated;
on an SQLite file and on PostgreSQL."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from iomatrix.store import Store
from tests.conftest import Backend, IOMATRIX, cli_result, write_suite

pytestmark = pytest.mark.slow

BODY = """
[matrix]
aio = ["io_uring", "threads"]
cache = "none"
iothread = false
[workloads]
rw = "randread"
iodepth = [1, 8]
[method]
mode = "blocklayer"
baseline = true
samples = 2
seed = 7
ramp = 0
runtime = "500ms"
"""


def stored_trials(db: str) -> dict[tuple[str, str, int], tuple[int, str, float]]:
    with Store(db) as store:
        run = store.load_run(1)
    return {(t.config_key, t.workload_key, t.sample_index):
            (t.id, t.status, sum(s.iops for s in t.samples)) for t in run.trials}


def test_resume_after_kill_9(backend: Backend, tmp_path: Path, no_leftovers: None) -> None:
    suite = write_suite(tmp_path, BODY, size="16MiB")
    db = backend.location
    proc = subprocess.Popen([*IOMATRIX, "run", str(suite), "--db", db], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 90
    while True:                                  # kill once a few trials are stored
        assert proc.poll() is None and time.monotonic() < deadline
        if backend.kind == "postgresql" or Path(db).exists():
            try:
                if len(stored_trials(db)) >= 4:
                    break
            except Exception:
                pass
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    before = stored_trials(db)
    assert 4 <= len(before) < 12
    with Store(db) as store:
        assert store.load_run(1).status == "running"       # killed: nobody could say otherwise
    done = subprocess.run([*IOMATRIX, "run", "--resume", "1", "--db", db], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    after = stored_trials(db)
    # 3 configurations × 2 workloads × 2 samples, each exactly once (the store's unique key)
    assert len(after) == 12
    for key, value in before.items():
        assert after[key] == value              # nothing stored before was touched
    with Store(db) as store:
        run = store.load_run(1)
    assert run.status == "complete" and run.seed == 7
    again = cli_result("run", "--resume", "1", "--db", db, cwd=tmp_path)
    assert again.returncode == 0 and again.stdout == "run 1 is complete: nothing to do\n"
