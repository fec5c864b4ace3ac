"""The results store: migrations, refusal of newer schemas, atomic trials under kill -9."""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from iomatrix.core.errors import RunNotFound, SchemaTooNew, StoreError
from iomatrix.fio.samples import DirectionSample
from iomatrix.store import Store
from iomatrix.store.schema import SCHEMA_VERSION
from iomatrix.suite.model import Configuration, Workload

FIXTURE = Path(__file__).parent / "fixtures/store/schema-v1.db"
CONFIG = Configuration(mode="blocklayer", aio="io_uring", iothread=False, cache="none",
                       format="raw", preallocation="off")
WORKLOAD = Workload(rw="randrw", bs=4096, iodepth=8)


def sample(direction: str, iops: float) -> DirectionSample:
    return DirectionSample(direction=direction, iops=iops, bw_bytes=iops * 4096,
                           io_bytes=int(iops * 4096), total_ios=int(iops), runtime_ms=1000,
                           lat_mean_ns=1e5, p50_ns=9e4, p99_ns=3e5)


def new_run(store: Store) -> int:
    return store.create_run(suite_name="t", suite_source="t.toml", suite_text="[suite]\n",
                            host={"hostname": "h"}, accelerator="none", notes=["a note"],
                            configs=[CONFIG], workloads=[WORKLOAD])


def test_fresh_database_round_trip(tmp_path: Path) -> None:
    with Store(tmp_path / "r.db") as store:
        assert store.version == SCHEMA_VERSION
        run_id = new_run(store)
        store.record_trial(run_id, CONFIG.key, WORKLOAD.key, 0, status="ok", started_at="t0",
                           samples=[sample("read", 100), sample("write", 50)],
                           fio_json='{"x": 1}', applied={"aio": "io_uring"}, command="qsd ...")
        store.record_trial(run_id, CONFIG.key, WORKLOAD.key, 1, status="failed", started_at="t1",
                           reason="boom")
        store.finish_run(run_id, "complete")
        run = store.load_run(store.resolve("last"))
    assert run.status == "complete" and run.notes == ("a note",)
    ok, failed = run.trials
    assert [s.direction for s in ok.samples] == ["read", "write"]
    assert ok.applied == {"aio": "io_uring"} and ok.command == "qsd ..."
    assert failed.reason == "boom" and failed.samples == ()
    with Store(tmp_path / "r.db") as store:
        assert store.fio_json(ok.id) == '{"x": 1}'
        assert store.list_runs()[0].trials_failed == 1


def test_duplicate_trial_is_refused_and_leaves_nothing(tmp_path: Path) -> None:
    with Store(tmp_path / "r.db") as store:
        run_id = new_run(store)
        store.record_trial(run_id, CONFIG.key, WORKLOAD.key, 0, status="ok", started_at="t",
                           samples=[sample("read", 1)])
        with pytest.raises(sqlite3.IntegrityError):
            store.record_trial(run_id, CONFIG.key, WORKLOAD.key, 0, status="ok", started_at="t",
                               samples=[sample("read", 2)])
        assert store.conn.execute("SELECT COUNT(*) FROM samples").fetchone()[0] == 1


def test_resolve_errors(tmp_path: Path) -> None:
    with Store(tmp_path / "r.db") as store:
        with pytest.raises(RunNotFound, match="no runs stored yet"):
            store.resolve("last")
        new_run(store)
        with pytest.raises(RunNotFound, match="no run 7"):
            store.resolve("7")
        with pytest.raises(RunNotFound, match="give a run number"):
            store.resolve("abc")


def test_migrates_committed_v1_database(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    shutil.copy(FIXTURE, db)
    assert sqlite3.connect(db).execute("PRAGMA user_version").fetchone()[0] == 1
    with Store(db) as store:
        assert store.version == SCHEMA_VERSION
        run = store.load_run(1)
        assert run.notes == ()
        (trial,) = run.trials
        assert trial.accelerator == "none" and trial.applied == {} and trial.command == ""
        assert trial.samples[0].iops > 0
        # the migrated database takes new runs
        run_id = new_run(store)
        assert run_id == 2


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "new.db"
    Store(db).close()
    conn = sqlite3.connect(db)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(SchemaTooNew, match="newer than this iomatrix understands"):
        Store(db)


def test_not_a_database(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match="not an iomatrix results database"):
        Store(junk)


WRITER = """
import sys, time
from pathlib import Path
sys.path.insert(0, {root!r})
from tests.test_store import CONFIG, WORKLOAD, new_run, sample
from iomatrix.store import Store

store = Store(sys.argv[1])
run_id = new_run(store)
for k in range(3):
    store.record_trial(run_id, CONFIG.key, WORKLOAD.key, k, status="ok", started_at="t",
                       samples=[sample("read", 10), sample("write", 5)])

def stalled():
    yield sample("read", 10)
    Path(sys.argv[2]).write_text("inside")   # the trial row and one sample are written
    time.sleep(600)
    yield sample("write", 5)

store.record_trial(run_id, CONFIG.key, WORKLOAD.key, 3, status="ok", started_at="t",
                   samples=stalled())
"""


def test_killed_writer_leaves_no_partial_sample(tmp_path: Path) -> None:
    """kill -9 in the middle of a trial's transaction: the trial is absent, not half there."""
    db, flag = tmp_path / "k.db", tmp_path / "flag"
    script = tmp_path / "writer.py"
    script.write_text(WRITER.format(root=str(Path(__file__).parents[1])))
    proc = subprocess.Popen([sys.executable, str(script), str(db), str(flag)])
    try:
        deadline = time.monotonic() + 30
        while not flag.exists():
            assert proc.poll() is None, "writer died early"
            assert time.monotonic() < deadline, "writer never reached the transaction"
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    with Store(db) as store:
        run = store.load_run(1)
        assert run.status == "running"
        assert [t.sample_index for t in run.trials] == [0, 1, 2]
        assert all(len(t.samples) == 2 for t in run.trials)
        orphans = store.conn.execute(
            "SELECT COUNT(*) FROM samples WHERE trial_id NOT IN (SELECT id FROM trials)").fetchone()[0]
        assert orphans == 0


def test_per_vm_samples_round_trip(tmp_path: Path) -> None:
    with Store(tmp_path / "r.db") as store:
        run_id = new_run(store)
        per_vm = [sample("read", 60).model_copy(update={"vm": 0}),
                  sample("read", 40).model_copy(update={"vm": 1})]
        store.record_trial(run_id, CONFIG.key, WORKLOAD.key, 0, status="ok", started_at="t",
                           samples=[sample("read", 100)], vm_samples=per_vm)
        (trial,) = store.load_run(run_id).trials
    assert [s.iops for s in trial.samples] == [100] and trial.samples[0].vm is None
    assert [(s.vm, s.iops) for s in trial.vm_samples] == [(0, 60), (1, 40)]
