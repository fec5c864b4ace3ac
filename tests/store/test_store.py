"""The results store: migrations, refusal of newer schemas, atomic trials under kill -9. Every
test runs on both backends: an SQLite file and a PostgreSQL database (``backend``)."""

from __future__ import annotations

import json
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
from iomatrix.store.records import CpuRecord, DepthRecord, SteadyRecord, StoredSuite, TrialResult
from iomatrix.store.schema import SCHEMA_VERSION
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.workloads import Workload
from iomatrix.telemetry.host import DeviceSeries, HostSeries
from iomatrix.telemetry.steady import SteadyState
from tests.conftest import Backend

FIXTURE = Path(__file__).parents[1] / "fixtures/store/schema-v1.db"
CONFIG = Configuration(mode="blocklayer", aio="io_uring", iothread=False, cache="none",
                       format="raw", preallocation="off")
WORKLOAD = Workload(rw="randrw", bs=4096, iodepth=8)


def sample(direction: str, iops: float) -> DirectionSample:
    return DirectionSample(direction=direction, iops=iops, bw_bytes=iops * 4096,
                           io_bytes=int(iops * 4096), total_ios=int(iops), runtime_ms=1000,
                           lat_mean_ns=1e5, p50_ns=9e4, p99_ns=3e5)


def trial(k: int, status: str = "ok", started_at: str = "t", **fields: object) -> TrialResult:
    """A trial of CONFIG × WORKLOAD to store."""
    return TrialResult(config_key=CONFIG.key, workload_key=WORKLOAD.key, sample_index=k,
                       status=status, started_at=started_at, **fields)  # type: ignore[arg-type]


def new_run(store: Store) -> int:
    return store.create_run(suite=StoredSuite(name="t", source="t.toml", text="[suite]\n"),
                            host={"hostname": "h"}, accelerator="none", notes=["a note"],
                            configs=[CONFIG], workloads=[WORKLOAD])


@pytest.mark.slow
def test_fresh_database_round_trip(backend: Backend) -> None:
    with Store(backend.location) as store:
        assert store.version == SCHEMA_VERSION
        run_id = new_run(store)
        store.record_trial(run_id, trial(0, started_at="t0",
                                         samples=[sample("read", 100), sample("write", 50)],
                                         fio_json='{"x": 1}', applied={"aio": "io_uring"},
                                         command="qsd ..."))
        store.record_trial(run_id, trial(1, "failed", started_at="t1", reason="boom"))
        store.finish_run(run_id, "complete")
        run = store.load_run(store.resolve("last"))
    assert run.status == "complete" and run.notes == ("a note",)
    ok, failed = run.trials
    assert [s.direction for s in ok.samples] == ["read", "write"]
    assert ok.applied == {"aio": "io_uring"} and ok.command == "qsd ..."
    assert failed.reason == "boom" and failed.samples == ()
    with Store(backend.location) as store:
        assert store.fio_json(ok.id) == '{"x": 1}'
        assert store.list_runs()[0].trials_failed == 1


def test_duplicate_trial_is_refused_and_leaves_nothing(backend: Backend) -> None:
    with Store(backend.location) as store:
        run_id = new_run(store)
        store.record_trial(run_id, trial(0, samples=[sample("read", 1)]))
        with pytest.raises(StoreError, match=r"#0 is stored already$"):
            store.record_trial(run_id, trial(0, samples=[sample("read", 2)]))
        assert store.conn.execute("SELECT COUNT(*) FROM samples").fetchone()[0] == 1


def test_resolve_errors(backend: Backend) -> None:
    with Store(backend.location) as store:
        with pytest.raises(RunNotFound, match="no runs stored yet"):
            store.resolve("last")
        new_run(store)
        with pytest.raises(RunNotFound, match="no run 7"):
            store.resolve("7")
        with pytest.raises(RunNotFound, match="give a run number"):
            store.resolve("abc")


def v1_database(backend: Backend) -> None:
    """The committed schema-1 database; on PostgreSQL a schema-1 database holding its rows."""
    if backend.kind == "sqlite":
        shutil.copy(FIXTURE, backend.location)
        return
    import psycopg

    Store(backend.location, migrate_to=1).close()
    source = sqlite3.connect(FIXTURE)
    with psycopg.connect(backend.location, autocommit=True) as conn:
        for table in ("runs", "configurations", "workloads", "trials", "samples"):
            cursor = source.execute(f"SELECT * FROM {table}")
            names = [d[0] for d in cursor.description]
            for row in cursor:
                conn.execute(f"INSERT INTO {table} ({', '.join(names)}) "
                             f"VALUES ({', '.join(['%s'] * len(names))})", row)
            if "id" in names:           # rows given their ids: the next one follows them
                conn.execute(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
                             f"(SELECT MAX(id) FROM {table}))")
    source.close()


def test_migrates_committed_v1_database(backend: Backend) -> None:
    v1_database(backend)
    with Store(backend.location, migrate_to=1) as store:
        assert store.version == 1
    with Store(backend.location) as store:
        assert store.version == SCHEMA_VERSION
        run = store.load_run(1)
        assert run.notes == ()
        (old,) = run.trials
        assert old.accelerator == "none" and old.applied == {} and old.command == ""
        assert old.samples[0].iops > 0
        assert old.steady is None and old.cpu is None and store.telemetry(old.id) is None
        # the migrated database takes new runs
        run_id = new_run(store)
        assert run_id == 2


@pytest.mark.parametrize("readonly", [False, True])
def test_newer_schema_is_refused(backend: Backend, readonly: bool) -> None:
    Store(backend.location).close()
    backend.set_version(SCHEMA_VERSION + 1)
    with pytest.raises(SchemaTooNew, match="newer than this iomatrix understands") as caught:
        Store(backend.location, readonly=readonly)
    assert "\n" not in str(caught.value)


def test_not_a_database(backend: Backend) -> None:
    if backend.kind == "sqlite":
        Path(backend.location).write_bytes(b"this is not sqlite" * 100)
    else:
        backend.raw("CREATE TABLE moz_places (id INTEGER PRIMARY KEY, url TEXT)")
    with pytest.raises(StoreError, match="not an iomatrix results database"):
        Store(backend.location)
    if backend.kind == "postgresql":        # refused before anything was written
        assert backend.raw("SELECT table_name FROM information_schema.tables WHERE "
                           "table_schema = 'public'") == [("moz_places",)]


WRITER = """
import sys, time
from pathlib import Path
sys.path.insert(0, {root!r})
from tests.store.test_store import new_run, sample, trial
from iomatrix.store import Store

store = Store(sys.argv[1])
run_id = new_run(store)
for k in range(3):
    store.record_trial(run_id, trial(k, samples=[sample("read", 10), sample("write", 5)]))

class Stalling:   # the store's connection, stalling before a trial's second sample
    def __init__(self, conn):
        self.conn, self.samples = conn, 0
    def execute(self, sql, *args):
        if sql.startswith("INSERT INTO samples"):
            self.samples += 1
            if self.samples == 2:
                Path(sys.argv[2]).write_text("inside")   # the trial row and one sample are written
                time.sleep(600)
        return self.conn.execute(sql, *args)

store.conn = Stalling(store.conn)
store.record_trial(run_id, trial(3, samples=[sample("read", 10), sample("write", 5)]))
"""


@pytest.mark.slow
def test_killed_writer_leaves_no_partial_sample(backend: Backend, tmp_path: Path) -> None:
    """kill -9 in the middle of a trial's transaction: the trial is absent, not half there."""
    db, flag = backend.location, tmp_path / "flag"
    script = tmp_path / "writer.py"
    script.write_text(WRITER.format(root=str(Path(__file__).parents[2])))
    proc = subprocess.Popen([sys.executable, str(script), db, str(flag)])
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


def test_per_vm_samples_round_trip(backend: Backend) -> None:
    with Store(backend.location) as store:
        run_id = new_run(store)
        per_vm = [sample("read", 60).model_copy(update={"vm": 0}),
                  sample("read", 40).model_copy(update={"vm": 1})]
        store.record_trial(run_id, trial(0, samples=[sample("read", 100)], vm_samples=per_vm))
        (stored,) = store.load_run(run_id).trials
    assert [s.iops for s in stored.samples] == [100] and stored.samples[0].vm is None
    assert [(s.vm, s.iops) for s in stored.vm_samples] == [(0, 60), (1, 40)]


def host_series() -> HostSeries:
    """Host telemetry of one second, as a trial stores it."""
    return HostSeries(interval_s=1.0, t=(1.0,), intr_per_s=(5.0,), ctxt_per_s=(7.0,),
                      sampler_cpu_s=0.01,
                      devices={"vda": DeviceSeries(util_pct=(50.0,), queue_depth=(None,),
                                                   read_iops=(1.0,), write_iops=(0.0,),
                                                   read_bytes_s=(4096.0,),
                                                   write_bytes_s=(0.0,))})


def test_steady_cpu_telemetry_and_depth_round_trip(backend: Backend) -> None:
    verdict = SteadyState(reached=True, at_seconds=6.0, windows=2, range_ratio=0.1,
                          excursion_ratio=0.05, rule="SNIA PTS")
    cpu = CpuRecord(window_s=1.0, cpu_s_by_role={"daemon": 0.2, "fio (host)": 0.1},
                    exited_cpu_s=0.0, cpu_s=0.3, voluntary_csw=10, involuntary_csw=1, ios=100,
                    bytes=409600, cpu_us_per_io=3000.0, cpu_ms_per_mib=768.0, csw_per_io=0.11,
                    perf="perf is not installed")
    series = host_series()
    steady = SteadyRecord(checked=True, source="fio status stream", verdict=verdict)
    depth = DepthRecord(asked=32, achieved=3.5, short=True)
    with Store(backend.location) as store:
        run_id = new_run(store)
        trial_id = store.record_trial(run_id, trial(0, samples=[sample("read", 1)],
                                                    steady=steady, cpu=cpu, telemetry=series,
                                                    depth=depth))
        store.record_trial(run_id, trial(1, samples=[sample("read", 1)], steady=SteadyRecord(
            checked=False, reason="steady_state is off")))
        checked, off = store.load_run(run_id).trials
        assert store.telemetry(trial_id) == series and store.telemetry(off.id) is None
        # stored flat, as every run since schema v4
        stored = store.conn.execute("SELECT steady_json FROM trials ORDER BY id").fetchall()
    assert checked.steady == steady and checked.steady.reached and checked.cpu == cpu
    assert checked.depth == depth and off.depth is None          # the asked depth beside it
    assert off.steady == SteadyRecord(checked=False, reason="steady_state is off")
    assert not off.steady.reached and off.cpu is None
    assert json.loads(stored[0][0]) == verdict.model_dump() | {"checked": True,
                                                               "source": "fio status stream"}
    assert json.loads(stored[1][0]) == {"checked": False, "reason": "steady_state is off"}


def test_steady_state_of_the_first_v4_runs(backend: Backend) -> None:
    """They stored the verdict alone, without "checked": a verdict means it was checked."""
    verdict = SteadyState(reached=False, at_seconds=None, windows=3, range_ratio=0.4,
                          excursion_ratio=0.2, rule="SNIA PTS")
    with Store(backend.location) as store:
        run_id = new_run(store)
        trial_id = store.record_trial(run_id, trial(0, samples=[sample("read", 1)]))
        store.conn.execute("UPDATE trials SET steady_json = ? WHERE id = ?",
                           (json.dumps(verdict.model_dump()), trial_id))
        (old,) = store.load_run(run_id).trials
    assert old.steady == SteadyRecord(checked=True, verdict=verdict) and not old.steady.reached


def test_runs_of_one_host_suite_target_or_time_span(backend: Backend) -> None:
    with Store(backend.location) as store:
        for host, target in (("pve1", "/srv/a"), ("pve2", "/srv/b"), ("pve2", "/srv/a")):
            store.create_run(suite=StoredSuite(name=host, source="t.toml", text="[suite]\n"),
                             host={"hostname": host, "target": target}, accelerator="none",
                             notes=[], configs=[CONFIG], workloads=[WORKLOAD])
        for run_id, at in ((1, "2026-11-24T23:59:59+00:00"), (2, "2026-11-25T00:00:00+00:00"),
                           (3, "2026-11-26T08:00:00+00:00")):
            store.conn.execute("UPDATE runs SET created_at = ? WHERE id = ?", (at, run_id))
        ids = lambda **given: [r.id for r in store.list_runs(**given)]  # noqa: E731
        assert ids(host="pve2") == [2, 3] and ids(suite="pve1") == [1]
        assert ids(target="/srv/a") == [1, 3] and ids(host="pve2", target="/srv/a") == [3]
        assert ids(until="2026-11-24") == [1] and ids(since="2026-11-25") == [2, 3]
        assert ids(until="2026-11-24T23:59") == [] and ids(host="nowhere") == []
        assert ids(since="2026-11-25", until="2026-11-25") == [2]
        assert store.list_runs()[0].hostname == "pve1"
        # a cluster run: its controller's hostname, and each node's name and hostname
        cluster = store.create_run(suite=StoredSuite(name="c", source="c.toml", text="[suite]\n"),
                                   host={"hostname": "ctl"}, accelerator="none", notes=[],
                                   configs=[CONFIG], workloads=[WORKLOAD])
        store.add_nodes(cluster, [("alpha", {"host": "10.0.0.1"}, {"hostname": "pve1"}),
                                  ("beta", {"host": "10.0.0.2"}, {"hostname": "pve-b"})])
        assert ids(host="ctl") == ids(host="alpha") == ids(host="pve-b") == [cluster]
        assert ids(host="pve1") == [1, cluster] and ids(host="pve2") == [2, 3]
        assert ids(host="10.0.0.1") == [] and store.list_runs()[-1].nodes == ("alpha", "beta")
