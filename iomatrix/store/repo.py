"""Everything iomatrix reads from and writes to the SQLite results file. Each trial is written in
one transaction with its samples, so a crash never leaves a half-written sample."""

from __future__ import annotations

import json
import sqlite3
import zlib
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from iomatrix import __version__
from iomatrix.core.errors import RunNotFound, SchemaTooNew, StoreError
from iomatrix.fio.samples import DirectionSample
from iomatrix.store.records import (ConfigRecord, RunSummary, StoredRun, TrialRecord,
                              WorkloadRecord)
from iomatrix.store.schema import SCHEMA_VERSION, current_version, migrate
from iomatrix.suite.model import Configuration, Workload

_SAMPLE_COLUMNS = ("direction", "iops", "bw_bytes", "io_bytes", "total_ios", "runtime_ms",
                   "lat_mean_ns", "lat_stdev_ns", "lat_min_ns", "lat_max_ns", "p50_ns", "p90_ns",
                   "p99_ns", "p99_9_ns", "p99_99_ns")


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class Store:
    """The results database. Opening it migrates it forward; a newer schema is refused."""

    def __init__(self, path: Path | str, *, migrate_to: int = SCHEMA_VERSION) -> None:
        self.path = Path(path)
        try:
            self.conn = sqlite3.connect(self.path, isolation_level=None, timeout=30)
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot open the results database: {exc}") from exc
        try:
            self.conn.execute("PRAGMA foreign_keys = ON")
            self.conn.execute("PRAGMA journal_mode = WAL")
            self.conn.execute("PRAGMA synchronous = NORMAL")
            version = current_version(self.conn)
            if version > SCHEMA_VERSION:
                raise SchemaTooNew(f"{self.path}: schema version {version} is newer than this "
                                   f"iomatrix understands ({SCHEMA_VERSION})")
            migrate(self.conn, migrate_to)
        except sqlite3.DatabaseError as exc:
            self.conn.close()
            raise StoreError(f"{self.path}: not an iomatrix results database ({exc})") from exc
        except BaseException:
            self.conn.close()
            raise

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def version(self) -> int:
        return current_version(self.conn)

    # -- writing ---------------------------------------------------------------------------
    def create_run(self, *, suite_name: str, suite_source: str, suite_text: str,
                   host: Mapping[str, str], accelerator: str, notes: Iterable[str],
                   configs: Iterable[Configuration], workloads: Iterable[Workload],
                   seed: int | None = None) -> int:
        """A new run with its configurations and workloads; its id."""
        with self._transaction():
            run_id = self.conn.execute(
                "INSERT INTO runs (suite_name, suite_source, suite_text, created_at, status, "
                "host_json, accelerator, iomatrix_version, notes_json, seed) "
                "VALUES (?, ?, ?, ?, 'running', ?, ?, ?, ?, ?)",
                (suite_name, suite_source, suite_text, now(), json.dumps(dict(host)), accelerator,
                 __version__, json.dumps(list(notes)), seed)).lastrowid
            for c in configs:
                self.conn.execute(
                    "INSERT INTO configurations (run_id, key, label, mode, params_json) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (run_id, c.key, c.label, c.mode, json.dumps(c.params())))
            for w in workloads:
                self.conn.execute(
                    "INSERT INTO workloads (run_id, key, label, rw, bs, iodepth, numjobs, "
                    "rate_iops, options_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (run_id, w.key, w.label, w.rw, w.bs, w.iodepth, w.numjobs, w.rate_iops,
                     json.dumps(dict(w.options))))
        assert run_id is not None
        return run_id

    def record_trial(self, run_id: int, config_key: str, workload_key: str, sample_index: int,
                     *, status: str, started_at: str, reason: str | None = None,
                     samples: Iterable[DirectionSample] = (),
                     vm_samples: Iterable[DirectionSample] = (), wall_seconds: float | None = None,
                     fio_version: str | None = None, usr_cpu: float | None = None,
                     sys_cpu: float | None = None, ctx: int | None = None,
                     fio_json: str | None = None, accelerator: str = "none",
                     applied: Mapping[str, str] | None = None, command: str = "",
                     steady: Mapping[str, Any] | None = None, cpu: Mapping[str, Any] | None = None,
                     telemetry: Mapping[str, Any] | None = None) -> int:
        """One trial and its samples, atomically; the trial's id."""
        with self._transaction():
            cid = self._id("configurations", run_id, config_key)
            wid = self._id("workloads", run_id, workload_key)
            trial_id = self.conn.execute(
                "INSERT INTO trials (run_id, configuration_id, workload_id, sample_index, status, "
                "reason, started_at, wall_seconds, fio_version, usr_cpu, sys_cpu, ctx, fio_json, "
                "accelerator, applied_json, command, steady_json, cpu_json, telemetry_json) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (run_id, cid, wid, sample_index, status, reason, started_at, wall_seconds,
                 fio_version, usr_cpu, sys_cpu, ctx,
                 zlib.compress(fio_json.encode()) if fio_json else None, accelerator,
                 json.dumps(dict(applied or {}), sort_keys=True), command,
                 json.dumps(dict(steady or {})), json.dumps(dict(cpu or {})),
                 json.dumps(dict(telemetry or {})))).lastrowid
            placeholders = ", ".join("?" * (len(_SAMPLE_COLUMNS) + 1))
            for s in samples:
                self.conn.execute(
                    f"INSERT INTO samples (trial_id, {', '.join(_SAMPLE_COLUMNS)}) "
                    f"VALUES ({placeholders})",
                    (trial_id, *(getattr(s, c) for c in _SAMPLE_COLUMNS)))
            for s in vm_samples:
                self.conn.execute(
                    f"INSERT INTO vm_samples (trial_id, vm, {', '.join(_SAMPLE_COLUMNS)}) "
                    f"VALUES (?, {placeholders})",
                    (trial_id, s.vm, *(getattr(s, c) for c in _SAMPLE_COLUMNS)))
        assert trial_id is not None
        return trial_id

    def finish_run(self, run_id: int, status: str) -> None:
        with self._transaction():
            self.conn.execute("UPDATE runs SET status = ?, finished_at = ? WHERE id = ?",
                              (status, now(), run_id))

    def reopen_run(self, run_id: int) -> None:
        """Mark a run running again, for --resume."""
        with self._transaction():
            self.conn.execute("UPDATE runs SET status = 'running', finished_at = NULL "
                              "WHERE id = ?", (run_id,))

    # -- reading ---------------------------------------------------------------------------
    def list_runs(self) -> list[RunSummary]:
        rows = self.conn.execute(
            "SELECT r.id, r.suite_name, r.created_at, r.finished_at, r.status, r.accelerator, "
            "  (SELECT COUNT(*) FROM trials t WHERE t.run_id = r.id AND t.status = 'ok'), "
            "  (SELECT COUNT(*) FROM trials t WHERE t.run_id = r.id AND t.status = 'failed') "
            "FROM runs r ORDER BY r.id").fetchall()
        return [RunSummary(id=r[0], suite_name=r[1], created_at=r[2], finished_at=r[3],
                           status=r[4], accelerator=r[5], trials_ok=r[6], trials_failed=r[7])
                for r in rows]

    def resolve(self, ref: str) -> int:
        """A run id from ``ref``: a number, or ``last``."""
        if ref == "last":
            row = self.conn.execute("SELECT MAX(id) FROM runs").fetchone()
            if row[0] is None:
                raise RunNotFound(f"{self.path}: no runs stored yet")
            return int(row[0])
        if not ref.isdigit():
            raise RunNotFound(f"run {ref!r}: give a run number or 'last'")
        if self.conn.execute("SELECT 1 FROM runs WHERE id = ?", (int(ref),)).fetchone() is None:
            raise RunNotFound(f"{self.path}: no run {ref}")
        return int(ref)

    def load_run(self, run_id: int) -> StoredRun:
        row = self.conn.execute(
            "SELECT id, suite_name, suite_source, suite_text, created_at, finished_at, status, "
            "accelerator, iomatrix_version, host_json, notes_json, seed FROM runs WHERE id = ?",
            (run_id,)).fetchone()
        if row is None:
            raise RunNotFound(f"{self.path}: no run {run_id}")
        configs = tuple(
            ConfigRecord(key=r[0], label=r[1], mode=r[2], params=json.loads(r[3]))
            for r in self.conn.execute("SELECT key, label, mode, params_json FROM configurations "
                                       "WHERE run_id = ? ORDER BY id", (run_id,)))
        workloads = tuple(
            WorkloadRecord(key=r[0], label=r[1], rw=r[2], bs=r[3], iodepth=r[4], numjobs=r[5],
                           rate_iops=r[6], options=json.loads(r[7]))
            for r in self.conn.execute("SELECT key, label, rw, bs, iodepth, numjobs, rate_iops, "
                                       "options_json FROM workloads WHERE run_id = ? ORDER BY id",
                                       (run_id,)))
        samples = self._samples("samples", run_id)
        vm_samples = self._samples("vm_samples", run_id)
        trials = tuple(
            TrialRecord(id=r[0], config_key=r[1], workload_key=r[2], sample_index=r[3], status=r[4],
                        reason=r[5], started_at=r[6], wall_seconds=r[7], accelerator=r[8],
                        usr_cpu=r[9], sys_cpu=r[10], ctx=r[11], applied=json.loads(r[12]),
                        command=r[13], steady=json.loads(r[14]), cpu=json.loads(r[15]),
                        samples=tuple(samples.get(r[0], ())),
                        vm_samples=tuple(vm_samples.get(r[0], ())))
            for r in self.conn.execute(
                "SELECT t.id, c.key, w.key, t.sample_index, t.status, t.reason, t.started_at, "
                "t.wall_seconds, t.accelerator, t.usr_cpu, t.sys_cpu, t.ctx, t.applied_json, "
                "t.command, t.steady_json, t.cpu_json FROM trials t "
                "JOIN configurations c ON c.id = t.configuration_id "
                "JOIN workloads w ON w.id = t.workload_id WHERE t.run_id = ? ORDER BY t.id",
                (run_id,)))
        return StoredRun(id=row[0], suite_name=row[1], suite_source=row[2], suite_text=row[3],
                         created_at=row[4], finished_at=row[5], status=row[6], accelerator=row[7],
                         iomatrix_version=row[8], host=json.loads(row[9]),
                         notes=tuple(json.loads(row[10])), seed=row[11], configs=configs,
                         workloads=workloads, trials=trials)

    def telemetry(self, trial_id: int) -> dict[str, Any]:
        """The host time series recorded during a trial (disk utilization, interrupts, ...)."""
        row = self.conn.execute("SELECT telemetry_json FROM trials WHERE id = ?",
                                (trial_id,)).fetchone()
        return json.loads(row[0]) if row else {}

    def fio_json(self, trial_id: int) -> str | None:
        """The raw fio JSON stored with a trial."""
        row = self.conn.execute("SELECT fio_json FROM trials WHERE id = ?", (trial_id,)).fetchone()
        return zlib.decompress(row[0]).decode() if row and row[0] else None

    # -- helpers ---------------------------------------------------------------------------
    def _samples(self, table: str, run_id: int) -> dict[int, list[DirectionSample]]:
        """Trial id → its rows of ``samples`` or ``vm_samples``, for one run."""
        vm = "s.vm" if table == "vm_samples" else "NULL"
        out: dict[int, list[DirectionSample]] = {}
        for r in self.conn.execute(
                f"SELECT s.trial_id, {vm}, {', '.join('s.' + c for c in _SAMPLE_COLUMNS)} "
                f"FROM {table} s JOIN trials t ON t.id = s.trial_id WHERE t.run_id = ? "
                f"ORDER BY s.trial_id, {vm}, s.direction", (run_id,)):
            out.setdefault(r[0], []).append(
                DirectionSample(vm=r[1], **dict(zip(_SAMPLE_COLUMNS, r[2:]))))
        return out

    def _id(self, table: str, run_id: int, key: str) -> int:
        row = self.conn.execute(f"SELECT id FROM {table} WHERE run_id = ? AND key = ?",
                                (run_id, key)).fetchone()
        if row is None:
            raise StoreError(f"run {run_id} has no {table[:-1]} {key!r}")
        return int(row[0])

    def _transaction(self) -> "_Transaction":
        return _Transaction(self.conn)


class _Transaction:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self) -> None:
        self.conn.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: Any, *rest: object) -> None:
        self.conn.execute("ROLLBACK" if exc_type else "COMMIT")
