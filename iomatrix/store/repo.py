"""Everything iomatrix reads from and writes to the results database: an SQLite file, or a
PostgreSQL database (``iomatrix.store.pg`` says how the two differ). Each trial is written in
one transaction with its samples, so a crash never leaves a half-written sample."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import stat
import time
import uuid
import zlib
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NamedTuple

from iomatrix import __version__
from iomatrix.core.dirs import MAX_SYMLINKS, distrust, sticky_shared, walk
from iomatrix.core.errors import DamagedStore, RunBusy, RunNotFound, StoreError, UnsafeDirectory
from iomatrix.core.owner import Identity, LockFile, liveness, this_process
from iomatrix.fio.samples import DirectionSample
from iomatrix.store.records import (ConfigRecord, PilotTrial, ProcessRecord, ResourceRecord,
                                    NodeRecord, RetiredTrial, RunSummary, SteadyRecord, StoredRun,
                                    StoredSuite, TrialRecord, TrialResult, WorkloadRecord,
                                    author_uid, suite_author)
from iomatrix.store.rows import StoredPlan, check_row, damaged, decode, inflate, typed, within
from iomatrix.core.trust import Author
from iomatrix.store.location import Location, PgUrl, location_author, parse_location
from iomatrix.store.pg import WRITE_LOCK
from iomatrix.store.pg import connect as pg_connect
from iomatrix.store.schema import (APPLICATION_ID, SCHEMA_VERSION, current_version, identify, identify_pg,
                                   migrate, migrate_pg)
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.workloads import Workload
from iomatrix.telemetry.host import HostSeries
from iomatrix.telemetry.pagecache import device_share, stored_device, uses_page_cache

_SAMPLE_COLUMNS = ("direction", "iops", "bw_bytes", "io_bytes", "total_ios", "runtime_ms",
                   "lat_mean_ns", "lat_stdev_ns", "lat_min_ns", "lat_max_ns", "p50_ns", "p90_ns",
                   "p99_ns", "p99_9_ns", "p99_99_ns")


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class Store:
    """The results database. Opening it migrates it forward; a newer schema is refused, and so
    is any file that is not an iomatrix database, before anything is written to it.

    ``readonly=True`` opens for reading only: the file, and the files beside it, are left as they
    are. A missing or empty file is refused rather than created; an older schema is migrated in
    a private copy in memory, not on disk; writing raises ``StoreError``.

    ``location`` is a path (SQLite) or a ``postgresql://`` URL (``iomatrix.store.location``).
    On PostgreSQL a read-only store is a read-only session (the server refuses writes), and a
    database of an older schema is refused by it rather than migrated: a command that writes
    migrates it. ``where`` names the database in every message, without a password."""

    def __init__(self, location: Location | str, *, migrate_to: int = SCHEMA_VERSION,
                 readonly: bool = False) -> None:
        found = parse_location(location) if isinstance(location, str) else location
        self.readonly = readonly
        self.stored_version = migrate_to
        """The schema version of the database itself: lower than ``version`` when a read-only
        open migrated an older file in memory."""
        self.where = str(found)
        self.conn: Any
        if isinstance(found, PgUrl):
            self.path: Path | None = None
            self.url: PgUrl | None = found
            self.conn = self._open_pg(found, migrate_to)
            return
        self.path, self.url = found, None
        _check_place(found)
        header = _check_file(found, readonly)
        try:
            self.conn = _SqliteConnection(self._open_readonly(header, migrate_to) if readonly
                                          else self._open_writable(migrate_to), self.where)
        except sqlite3.DatabaseError as exc:
            what = ("not an iomatrix results database" if "not a database" in str(exc)
                    else "cannot use the results database")
            raise StoreError(f"{self.path}: {what} ({exc})") from exc

    @property
    def postgres(self) -> bool:
        return self.url is not None

    @property
    def author(self) -> Author:
        """Who could have written this store (``location.location_author``): its rows are
        their input."""
        location = self.url if self.url is not None else self.path
        assert location is not None
        return location_author(location)

    def _open_pg(self, url: PgUrl, migrate_to: int) -> Any:
        conn = pg_connect(url, readonly=self.readonly)
        try:
            if self.readonly:
                version = identify_pg(conn, self.where)
                if version == 0:
                    raise StoreError(f"{self.where}: not an iomatrix results database (it is "
                                     "empty)", hint="run a suite first, or pass --db")
                if version < migrate_to:
                    raise StoreError(f"{self.where}: schema version {version} is older than "
                                     f"this iomatrix's ({migrate_to}); a read-only command does "
                                     "not migrate it", hint="run a command that writes once "
                                     "(`iomatrix clean --db ...` does)")
            else:
                migrate_pg(conn, migrate_to, where=self.where, lock=WRITE_LOCK)
            return conn
        except BaseException:
            conn.close()
            raise

    def _open_writable(self, migrate_to: int) -> sqlite3.Connection:
        """Creates the file if need be. The database is identified, and migrated, each time
        under the write lock, before it is switched to WAL."""
        conn = _connect(self.path, str(self.path))
        try:
            conn.execute("PRAGMA foreign_keys = ON")
            conn.execute("PRAGMA synchronous = NORMAL")
            migrate(conn, migrate_to, where=str(self.path))
            _switch_to_wal(conn)
            return conn
        except BaseException:
            conn.close()
            raise

    def _open_readonly(self, header: bytes, migrate_to: int) -> sqlite3.Connection:
        """``mode=ro``; and ``immutable=1`` for a WAL database that no one has open (no -wal
        file beside it: all of it is in the main file), since a read-only connection to it would
        create -wal and -shm files, and cannot be made at all on read-only media."""
        real = Path(os.path.realpath(self.path))
        wal = header[18:20] == b"\x02\x02"
        immutable = wal and not Path(f"{real}-wal").exists()
        conn = _connect(f"{real.as_uri()}?mode=ro" + ("&immutable=1" if immutable else ""),
                        str(self.path), uri=True)
        try:
            try:
                version = _identify(conn, str(self.path))
            except sqlite3.OperationalError:
                if not wal or immutable:
                    raise
                # a WAL database with a -wal file, on read-only media without its -shm file:
                # only its main file can be read
                conn.close()
                conn = _connect(f"{real.as_uri()}?mode=ro&immutable=1", str(self.path),
                                uri=True)
                version = _identify(conn, str(self.path))
            if version == 0:
                raise StoreError(f"{self.path}: not an iomatrix results database (it is empty)")
            self.stored_version = version
            if version < migrate_to:
                copy = sqlite3.connect(":memory:", isolation_level=None)
                conn.backup(copy)
                conn.close()
                conn = copy
                migrate(conn, migrate_to, where=str(self.path))
            conn.execute("PRAGMA query_only = ON")
            return conn
        except BaseException:
            conn.close()
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

    def _insert(self, statement: str, params: tuple[Any, ...]) -> int:
        """Run an INSERT into a table keyed by ``id``; the new row's id."""
        if self.postgres:
            return int(self.conn.execute(statement + " RETURNING id", params).fetchone()[0])
        rowid = self.conn.execute(statement, params).lastrowid
        assert rowid is not None
        return int(rowid)

    # -- writing ---------------------------------------------------------------------------
    def create_run(self, *, suite: StoredSuite, host: Mapping[str, str], accelerator: str,
                   notes: Iterable[str], configs: Iterable[Configuration],
                   workloads: Iterable[Workload], seed: int | None = None,
                   owner: int | None = None, run_uuid: str | None = None) -> int:
        """A new run of ``suite`` with its configurations and workloads; its id. ``owner`` (a
        process from ``register_process``) owns it from the start, and its resources are the
        run's. ``run_uuid``: the uuid of the run this one is a part of (a node's share of a
        cluster run, kept on the node until it is copied into the cluster's); else a new one."""
        with self._transaction():
            run_id = self._insert(
                "INSERT INTO runs (suite_name, suite_source, suite_text, created_at, status, "
                "host_json, accelerator, iomatrix_version, notes_json, seed, owner_id, uuid, "
                "suite_author, spec_json) VALUES "
                "(?, ?, ?, ?, 'running', ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (suite.name, suite.source, suite.text, now(), json.dumps(dict(host)), accelerator,
                 __version__, json.dumps(list(notes)), seed, owner, run_uuid or uuid.uuid4().hex,
                 suite.author, None if suite.spec is None else suite.spec.to_json()))
            if owner is not None:
                self.conn.execute("UPDATE resources SET run_id = ? WHERE process_id = ? "
                                  "AND run_id IS NULL", (run_id, owner))
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
        return run_id

    def record_trial(self, run_id: int, result: TrialResult, *,
                     replace_failed: bool = False) -> int:
        """One trial and its samples, atomically; the trial's id. With ``replace_failed``, a
        failed trial stored under the same key moves, whole, to the run's trial history in the
        same transaction (``trial_history``); an ok one still makes this a duplicate, refused
        with ``StoreError`` and nothing written."""
        try:
            return self._record_trial(run_id, result, replace_failed)
        except Exception as exc:
            # a unique key: SQLite's message, PostgreSQL's SQLSTATE unique_violation
            if not ((isinstance(exc, sqlite3.IntegrityError) and "UNIQUE" in str(exc))
                    or getattr(exc, "sqlstate", None) == "23505"):
                raise
            raise StoreError(f"run {run_id}: trial {result.config_key} × {result.workload_key} "
                             f"#{result.sample_index} is stored already") from exc

    def _record_trial(self, run_id: int, result: TrialResult, replace_failed: bool) -> int:
        with self._transaction():
            cid = self._id("configurations", run_id, result.config_key)
            wid = self._id("workloads", run_id, result.workload_key)
            if replace_failed:
                self._retire_failed(run_id, cid, wid, result.sample_index)
            trial_id = self._insert(
                "INSERT INTO trials (run_id, configuration_id, workload_id, sample_index, status, "
                "reason, started_at, wall_seconds, fio_version, usr_cpu, sys_cpu, ctx, fio_json, "
                "accelerator, applied_json, command, steady_json, cpu_json, telemetry_json) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (run_id, cid, wid, result.sample_index, result.status, result.reason,
                 result.started_at, result.wall_seconds, result.fio_version, result.usr_cpu,
                 result.sys_cpu, result.ctx,
                 zlib.compress(result.fio_json.encode()) if result.fio_json else None,
                 result.accelerator, json.dumps(result.applied, sort_keys=True), result.command,
                 json.dumps(_stored_steady(result.steady)),
                 json.dumps(result.cpu.model_dump() if result.cpu else {}),
                 json.dumps(result.telemetry.model_dump() if result.telemetry else {})))
            placeholders = ", ".join("?" * (len(_SAMPLE_COLUMNS) + 1))
            for s in result.samples:
                self.conn.execute(
                    f"INSERT INTO samples (trial_id, {', '.join(_SAMPLE_COLUMNS)}) "
                    f"VALUES ({placeholders})",
                    (trial_id, *(getattr(s, c) for c in _SAMPLE_COLUMNS)))
            for s in result.vm_samples:
                self.conn.execute(
                    f"INSERT INTO vm_samples (trial_id, vm, {', '.join(_SAMPLE_COLUMNS)}) "
                    f"VALUES (?, {placeholders})",
                    (trial_id, s.vm, *(getattr(s, c) for c in _SAMPLE_COLUMNS)))
        return trial_id

    def add_nodes(self, run_id: int, nodes: Iterable[tuple[str, Mapping[str, Any],
                                                           Mapping[str, str]]]) -> None:
        """The nodes of a cluster run: (name, its ``Node`` fields, its host metadata) each."""
        with self._transaction():
            for i, (name, node, host) in enumerate(nodes):
                self.conn.execute("INSERT INTO run_nodes (run_id, name, position, node_json, "
                                  "host_json) VALUES (?, ?, ?, ?, ?)",
                                  (run_id, name, i, json.dumps(dict(node)), json.dumps(dict(host))))

    def set_node(self, run_id: int, name: str, status: str, reason: str | None = None,
                 host: Mapping[str, str] | None = None) -> None:
        """How a node's share of a cluster run goes (and its host metadata, when known anew)."""
        with self._transaction():
            self.conn.execute("UPDATE run_nodes SET status = ?, reason = ? WHERE run_id = ? "
                              "AND name = ?", (status, reason, run_id, name))
            if host is not None:
                self.conn.execute("UPDATE run_nodes SET host_json = ? WHERE run_id = ? AND "
                                  "name = ?", (json.dumps(dict(host)), run_id, name))

    def run_by_uuid(self, run_uuid: str) -> int | None:
        """The run known by ``run_uuid`` in this store, or None."""
        row = self.conn.execute("SELECT id FROM runs WHERE uuid = ?", (run_uuid,)).fetchone()
        return int(row[0]) if row else None

    def run_uuid(self, run_id: int) -> str:
        row = self.conn.execute("SELECT uuid FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            raise RunNotFound(f"{self.where}: no run {run_id}")
        return str(row[0])

    def finish_run(self, run_id: int, status: str) -> None:
        """The run's final status; it has no owner any more."""
        with self._transaction():
            self.conn.execute("UPDATE runs SET status = ?, finished_at = ?, owner_id = NULL "
                              "WHERE id = ?", (status, now(), run_id))

    def reopen_run(self, run_id: int) -> None:
        """Mark a run running again, for --resume."""
        with self._transaction():
            self.conn.execute("UPDATE runs SET status = 'running', finished_at = NULL "
                              "WHERE id = ?", (run_id,))

    def add_notes(self, run_id: int, notes: Iterable[str]) -> None:
        """Append notes to a run's (those it already has are not repeated)."""
        with self._transaction():
            row = self.conn.execute("SELECT notes_json FROM runs WHERE id = ?",
                                    (run_id,)).fetchone()
            if row is None:
                raise RunNotFound(f"{self.where}: no run {run_id}")
            have = list(decode("runs", "notes_json", run_id, row[0]))
            have += [n for n in dict.fromkeys(notes) if n not in have]
            self.conn.execute("UPDATE runs SET notes_json = ? WHERE id = ?",
                              (json.dumps(have), run_id))

    def record_pilot(self, run_id: int, trials: Iterable[PilotTrial], plan: StoredPlan) -> None:
        """A run's pilot trials and the trial plan chosen from them (``[method] pilot``), at
        once; a pilot stored before (an interrupted run's) is replaced."""
        with self._transaction():
            self.conn.execute("DELETE FROM pilot_trials WHERE run_id = ?", (run_id,))
            for t in trials:
                self.conn.execute(
                    "INSERT INTO pilot_trials (run_id, mode, config_key, workload_key, round, "
                    "runtime_s, iops, wall_s, session_s) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (run_id, t.mode, t.config_key, t.workload_key, t.round, t.runtime_s, t.iops,
                     t.wall_s, t.session_s))
            # DELETE and INSERT rather than INSERT OR REPLACE: the same words on PostgreSQL
            self.conn.execute("DELETE FROM trial_plans WHERE run_id = ?", (run_id,))
            self.conn.execute("INSERT INTO trial_plans (run_id, plan_json) VALUES (?, ?)",
                              (run_id, json.dumps(plan.model_dump(), sort_keys=True)))

    # -- ownership and clean-up --------------------------------------------------------------
    def register_process(self, me: Identity, lock_path: str) -> int:
        """Record this process (see ``iomatrix.core.owner``), before it creates anything. On
        PostgreSQL the connection then holds, for the process's life, a session-level advisory
        lock on the process's id: the server drops it when the session ends, however the
        process ends, and every host sees whether it is held (``alive``)."""
        with self._transaction():
            pid = self._insert(
                "INSERT INTO processes (pid, host, boot_id, start_ticks, uid, lock_path, "
                "started_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (me.pid, me.host, me.boot_id, me.start_ticks, me.uid, lock_path, now()))
        if self.postgres:
            self.conn.execute("SELECT pg_advisory_lock(?::int, ?::int)", (APPLICATION_ID, pid))
        return pid

    def lock_made(self, process_id: int, info: os.stat_result) -> None:
        """Record the device and inode of the lock file the process has made and holds."""
        with self._transaction():
            self.conn.execute("UPDATE processes SET lock_dev = ?, lock_ino = ? WHERE id = ?",
                              (info.st_dev, info.st_ino, process_id))

    def end_process(self, process_id: int) -> None:
        """The process is ending: it owns no run any more."""
        with self._transaction():
            self.conn.execute("UPDATE runs SET owner_id = NULL WHERE owner_id = ?", (process_id,))
            self.conn.execute("UPDATE processes SET ended_at = ? WHERE id = ?",
                              (now(), process_id))
        if self.postgres:
            self.conn.execute("SELECT pg_advisory_unlock(?::int, ?::int)",
                              (APPLICATION_ID, process_id))

    def alive(self, process: ProcessRecord) -> tuple[bool, str]:
        """Whether a recorded process still runs, and why it is judged so
        (``iomatrix.core.owner.liveness``). On PostgreSQL its session lock decides for a
        process of another host: held, it lives; released, its session has ended and it can
        never write again (nothing reconnects). On this host a process that still runs after
        losing its session is alive too: what it made on disk may still be in use."""
        if self.postgres:
            held = self.conn.execute(
                "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted AND "
                "database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
                "AND classid = ?::bigint::oid AND objid = ?::bigint::oid AND objsubid = 2",
                (APPLICATION_ID, process.id)).fetchone()
            if held:
                return True, f"its database session (on host {process.host}) holds its lock"
            if process.host != this_process().host:
                return False, f"its database session (on host {process.host}) has ended"
        return liveness(identity(process), lock_of(process))

    def owner(self, run_id: int) -> ProcessRecord | None:
        """The process that owns the run now (it may have died without saying so), or None."""
        row = self.conn.execute(f"SELECT {_PROCESS} FROM runs r JOIN processes p "
                                "ON p.id = r.owner_id WHERE r.id = ?", (run_id,)).fetchone()
        return _process(row) if row else None

    def claim_run(self, run_id: int, process_id: int) -> ProcessRecord | None:
        """Make the process the run's owner, atomically. Returns the previous owner when it was
        a process that died (taken over); ``RunBusy`` when a live process owns the run."""
        with self._transaction():
            if self.conn.execute("SELECT 1 FROM runs WHERE id = ?", (run_id,)).fetchone() is None:
                raise RunNotFound(f"{self.where}: no run {run_id}")
            previous = self.owner(run_id)
            if previous is not None and previous.id != process_id:
                me = this_process()
                alive, _ = self.alive(previous)
                if alive:
                    seen = ("" if self.postgres else
                            " (whether it still runs cannot be seen from here)")
                    where = ("" if previous.host == me.host else
                             f" on host {previous.host}{seen}")
                    raise RunBusy(f"run {run_id} is being measured by pid {previous.pid}{where} "
                                  f"since {previous.started_at}: wait for it to end, or stop "
                                  "it, then resume")
            self.conn.execute("UPDATE runs SET owner_id = ? WHERE id = ?", (process_id, run_id))
            self.conn.execute("UPDATE resources SET run_id = ? WHERE process_id = ? "
                              "AND run_id IS NULL", (run_id, process_id))
        return previous if previous is not None and previous.id != process_id else None

    def add_resource(self, process_id: int, kind: str, path: str, within: str, *,
                     run_id: int | None = None, keep: bool = False) -> int:
        """Record, before creating it, something the process is about to create on disk."""
        with self._transaction():
            return self._insert(
                "INSERT INTO resources (process_id, run_id, kind, path, within, keep, "
                "created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (process_id, run_id, kind, path, within, int(keep), now()))

    def settle_resource(self, resource_id: int, outcome: str) -> None:
        """A resource is gone (removed, or found gone), or is left for good: ``outcome`` says
        which; it is no longer looked after."""
        with self._transaction():
            self.conn.execute("UPDATE resources SET removed_at = ?, outcome = ? WHERE id = ?",
                              (now(), outcome, resource_id))

    def open_resources(self, process_id: int | None = None) -> list[ResourceRecord]:
        """What processes created and nobody has removed yet (of one process, or all)."""
        where = "" if process_id is None else " AND x.process_id = ?"
        rows = self.conn.execute(
            f"SELECT x.id, x.kind, x.path, x.within, x.keep, x.created_at, x.run_id, r.status, "
            f"{_PROCESS} FROM resources x JOIN processes p ON p.id = x.process_id "
            f"LEFT JOIN runs r ON r.id = x.run_id WHERE x.removed_at IS NULL{where} "
            f"ORDER BY x.id", () if process_id is None else (process_id,)).fetchall()
        return [typed(ResourceRecord, "resources", r[0], id=r[0], kind=r[1], path=r[2],
                      within=within(r[1], r[0], r[3]), keep=r[4], created_at=r[5], run_id=r[6],
                      run_status=r[7], process=_process(r[8:])) for r in rows]

    # -- copying between stores --------------------------------------------------------------
    def copy_run(self, source: "Store", run_id: int, *, share: bool = False) -> CopyOutcome:
        """Run ``run_id`` of ``source`` into this store, in one transaction, known by its uuid:
        a run this store lacks is added whole (under a new number; without its owner, its
        processes and what they made on disk, which are the source host's); a run it has gets
        the trials it lacks, a trial measured again (``--retry-failed``) replaces the stored
        one, and the run's status, end and notes follow the source's. Every value is copied as
        stored: samples, raw fio output, telemetry. A run still being measured is not copied.
        With ``share`` the source run is a node's share of this store's cluster run: only its
        trials (and their history) are copied, whatever its status; the run keeps its own."""
        (run,) = source._dicts("SELECT * FROM runs WHERE id = ?", (run_id,)) or [None]
        if run is None:
            raise RunNotFound(f"{source.where}: no run {run_id}")
        if source.stored_version < 7:
            raise StoreError(f"{source.where}: schema version {source.stored_version} keeps no "
                             "run uuids, by which a copied run is known again",
                             hint="open it once with a command that writes (`iomatrix clean "
                                  "--db ...`) to migrate it")
        if run["status"] == "running" and not share:
            return CopyOutcome(run_id, None, "skipped", "it is still being measured, or was "
                               "killed: resume it, or let it end, then copy")
        configs = source._dicts("SELECT * FROM configurations WHERE run_id = ? ORDER BY id",
                                (run_id,))
        workloads = source._dicts("SELECT * FROM workloads WHERE run_id = ? ORDER BY id",
                                  (run_id,))
        trials = source._dicts(
            "SELECT t.*, c.key AS config_key, w.key AS workload_key FROM trials t "
            "JOIN configurations c ON c.id = t.configuration_id "
            "JOIN workloads w ON w.id = t.workload_id WHERE t.run_id = ? ORDER BY t.id", (run_id,))
        samples = {table: _grouped(source._dicts(
            f"SELECT s.* FROM {table} s JOIN trials t ON t.id = s.trial_id WHERE t.run_id = ?",
            (run_id,))) for table in ("samples", "vm_samples")}
        history = source._dicts("SELECT * FROM trial_history WHERE run_id = ? ORDER BY id",
                                (run_id,))
        pilot = [source._dicts(f"SELECT * FROM {table} WHERE run_id = ?", (run_id,))
                 for table in ("pilot_trials", "trial_plans")] if source.stored_version >= 9 else []
        nodes = (source._dicts("SELECT * FROM run_nodes WHERE run_id = ?", (run_id,))
                 if source.stored_version >= 10 else [])
        _check_copied({"runs": [run], "configurations": configs, "workloads": workloads,
                       "trials": trials, "trial_history": history, "run_nodes": nodes,
                       **dict(zip(("pilot_trials", "trial_plans"), pilot))})
        with self._transaction():
            row = self.conn.execute("SELECT id FROM runs WHERE uuid = ?", (run["uuid"],)).fetchone()
            if row is None and share:
                raise RunNotFound(f"{self.where}: no cluster run {run['uuid']} to copy a node's "
                                  "share into")
            if row is None:
                # who could have written the suite: the row's, unless the source store (a
                # shared one, say) let another user change it
                author = suite_author(run.get("suite_author"), source.author, source.where)
                run["suite_author"] = (run.get("suite_author") if author.trusted
                                       else author_uid(author))
                (dst,) = self._insert_rows("runs", [run], skip=("id", "owner_id"))
                for table, rows in (("configurations", configs), ("workloads", workloads),
                                    ("run_nodes", nodes)):
                    self._insert_rows(table, [{**r, "run_id": dst} for r in rows], skip=("id",),
                                      keyed=table != "run_nodes")
            elif share:
                dst = int(row[0])
            else:
                dst = int(row[0])
                self.conn.execute("UPDATE runs SET status = ?, finished_at = ?, notes_json = ? "
                                  "WHERE id = ?", (run["status"], run["finished_at"],
                                                   run["notes_json"], dst))
            ids = {table: {r[0]: r[1] for r in self.conn.execute(
                f"SELECT key, id FROM {table} WHERE run_id = ?", (dst,))}
                for table in ("configurations", "workloads")}
            have = {(r[0], r[1], r[2]): (r[3], r[4]) for r in self.conn.execute(
                "SELECT c.key, w.key, t.sample_index, t.id, t.started_at FROM trials t "
                "JOIN configurations c ON c.id = t.configuration_id "
                "JOIN workloads w ON w.id = t.workload_id WHERE t.run_id = ?", (dst,))}
            new = []
            for t in trials:
                stored = have.get((t["config_key"], t["workload_key"], t["sample_index"]))
                if stored is not None and stored[1] == t["started_at"]:
                    continue                            # the same trial
                if stored is not None:                  # measured again at the source
                    self.conn.execute("DELETE FROM trials WHERE id = ?", (stored[0],))
                new.append(t)
            trial_ids = self._insert_rows("trials", [{
                **t, "run_id": dst, "configuration_id": ids["configurations"][t["config_key"]],
                "workload_id": ids["workloads"][t["workload_key"]]} for t in new],
                skip=("id", "config_key", "workload_key"))
            for table, by_trial in samples.items():
                self._insert_rows(table, [{**s, "trial_id": trial_id}
                                          for t, trial_id in zip(new, trial_ids, strict=True)
                                          for s in by_trial.get(t["id"], ())], keyed=False)
            added = len(new)
            retired = {(r[0], r[1], r[2], r[3]) for r in self.conn.execute(
                "SELECT config_key, workload_key, sample_index, retired_at FROM trial_history "
                "WHERE run_id = ?", (dst,))}
            self._insert_rows("trial_history", [
                {**h, "run_id": dst} for h in history if (h["config_key"], h["workload_key"],
                                                          h["sample_index"], h["retired_at"])
                not in retired], skip=("id",))
            # the source's pilot, whole; a node's share carries none (the run's is the controller's)
            for table, rows in zip(("pilot_trials", "trial_plans"), [] if share else pilot):
                self.conn.execute(f"DELETE FROM {table} WHERE run_id = ?", (dst,))
                self._insert_rows(table, [{**r, "run_id": dst} for r in rows], skip=("id",),
                                  keyed=False)
        if row is None:
            return CopyOutcome(run_id, dst, "copied", f"{added} trials")
        return CopyOutcome(run_id, dst, "updated" if added else "present",
                           f"{added} new trials" if added else "nothing new")

    def _dicts(self, statement: str, params: tuple[Any, ...]) -> list[dict[str, Any]]:
        cursor = self.conn.execute(statement, params)
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, r)) for r in cursor.fetchall()]

    def _insert_rows(self, table: str, rows: list[dict[str, Any]], *,
                     skip: tuple[str, ...] = (), keyed: bool = True) -> list[int]:
        """Insert ``rows`` (column → value, as one query of another store gave them: the same
        columns each) but ``skip``; their new ids, in order, when the table is ``keyed`` by one.
        PostgreSQL gets them in one COPY: a round trip per row made copying a 30,000-trial run
        take half a minute."""
        if not rows:
            return []
        names = [n for n in rows[0] if n not in skip]
        values = [tuple(bytes(v) if isinstance(v, memoryview) else v for v in
                        (row[n] for n in names)) for row in rows]
        if self.postgres:
            return self.conn.insert_rows(table, names, values, keyed=keyed)
        statement = (f"INSERT INTO {table} ({', '.join(names)}) "
                     f"VALUES ({', '.join('?' * len(names))})")
        if keyed:
            return [self._insert(statement, v) for v in values]
        self.conn.executemany(statement, values)
        return []

    def running_runs(self) -> list[tuple[int, ProcessRecord | None]]:
        """The runs marked running, each with its owner (None: an older iomatrix ran it)."""
        return [(run_id, self.owner(run_id)) for (run_id,) in self.conn.execute(
            "SELECT id FROM runs WHERE status = 'running' ORDER BY id").fetchall()]

    def trial_history(self, run_id: int) -> list[RetiredTrial]:
        """The failed trials measured again (--retry-failed, or a trial whose guests stopped),
        oldest first, as they were."""
        return [typed(RetiredTrial, "trial_history", r[0], retired_at=r[1],
                      trial=decode("trial_history", "trial_json", r[0], r[2]))
                for r in self.conn.execute("SELECT id, retired_at, trial_json FROM trial_history "
                                           "WHERE run_id = ? ORDER BY id", (run_id,))]

    # -- reading ---------------------------------------------------------------------------
    def list_runs(self, *, host: str | None = None, suite: str | None = None,
                  target: str | None = None, since: str | None = None,
                  until: str | None = None) -> list[RunSummary]:
        """The stored runs, oldest first; those of one host (its hostname; a cluster run's,
        the controller's or a node's, by node name or hostname), suite, target (the
        directory or device, or one of its [[targets]]) and started within [since, until]
        (ISO dates or times, UTC; a date alone means the whole day), where given."""
        # compared here, not in SQL: PostgreSQL orders text by the database's locale
        end = None if until is None else until + ("~" if len(until) <= 10 else "")
        rows = self.conn.execute(
            "SELECT r.id, r.suite_name, r.created_at, r.finished_at, r.status, r.accelerator, "
            "  (SELECT COUNT(*) FROM trials t WHERE t.run_id = r.id AND t.status = 'ok'), "
            "  (SELECT COUNT(*) FROM trials t WHERE t.run_id = r.id AND t.status = 'failed'), "
            "  r.host_json FROM runs r ORDER BY r.id").fetchall()
        nodes: dict[int, list[str]] = {}
        hosts: dict[int, set[str]] = {}      # a cluster run's nodes: by name and hostname
        if self.version >= 10:
            for run_id, name, position, node_host in self.conn.execute(
                    "SELECT run_id, name, position, host_json FROM run_nodes "
                    "ORDER BY run_id, position"):
                where = _node_row(run_id, position)
                nodes.setdefault(run_id, []).append(_text("run_nodes", "name", where, name))
                hosts.setdefault(run_id, set()).update({name, decode(
                    "run_nodes", "host_json", where, node_host).get("hostname", "")} - {""})
        found = []
        for r in rows:
            meta = decode("runs", "host_json", r[0], r[8])
            places = meta.get("targets") or meta.get("target") or ""
            summary = typed(RunSummary, "runs", r[0], {"hostname": "host_json"}, id=r[0],
                            suite_name=r[1], created_at=r[2], finished_at=r[3], status=r[4],
                            accelerator=r[5], trials_ok=r[6], trials_failed=r[7],
                            hostname=meta.get("hostname", ""), target=places,
                            nodes=tuple(nodes.get(r[0], ())))
            if ((suite is not None and r[1] != suite) or (since is not None and r[2] < since)
                    or (end is not None and r[2] >= end)):
                continue
            if (host is not None and host not in summary.hostname.split(", ")
                    and host not in hosts.get(r[0], ())):
                continue
            if target is not None and target not in places.split(", "):
                continue
            found.append(summary)
        return found

    def resolve(self, ref: str) -> int:
        """A run id from ``ref``: a number, or ``last``."""
        if ref == "last":
            row = self.conn.execute("SELECT MAX(id) FROM runs").fetchone()
            if row[0] is None:
                raise RunNotFound(f"{self.where}: no runs stored yet")
            if not isinstance(row[0], int):
                raise damaged("runs", "id", f"{row[0]!r:.40}", "not a number")
            return row[0]
        if not re.fullmatch(r"[0-9]+", ref):        # str.isdigit() takes "²" and "٣" too
            raise RunNotFound(f"run {ref!r}: give a run number or 'last'")
        # SQLite's integers have at most 19 digits: a longer number is no run's
        if len(ref) > 18 or self.conn.execute("SELECT 1 FROM runs WHERE id = ?",
                                              (int(ref),)).fetchone() is None:
            raise RunNotFound(f"{self.where}: no run "
                              f"{ref if len(ref) <= 40 else ref[:37] + '...'}")
        return int(ref)

    def load_run(self, run_id: int) -> StoredRun:
        row = self.conn.execute(
            "SELECT id, suite_name, suite_source, suite_text, created_at, finished_at, status, "
            "accelerator, iomatrix_version, host_json, notes_json, seed, "
            + ("suite_author" if self.version >= 11 else "NULL") + ", "
            + ("spec_json" if self.version >= 12 else "NULL") + " FROM runs WHERE id = ?",
            (run_id,)).fetchone()
        if row is None:
            raise RunNotFound(f"{self.where}: no run {run_id}")
        spec = None if row[13] is None else decode("runs", "spec_json", run_id, row[13])
        suite = typed(StoredSuite, "runs", run_id, {"name": "suite_name", "source": "suite_source",
                                                    "text": "suite_text", "author": "suite_author",
                                                    "spec": "spec_json"},
                      name=row[1], source=row[2], text=row[3], author=row[12], spec=spec)
        host = decode("runs", "host_json", run_id, row[9])
        configs = tuple(
            typed(ConfigRecord, "configurations", r[0], {"params": "params_json"}, key=r[1],
                  label=r[2], mode=r[3], params=decode("configurations", "params_json", r[0], r[4]))
            for r in self.conn.execute("SELECT id, key, label, mode, params_json FROM "
                                       "configurations WHERE run_id = ? ORDER BY id", (run_id,)))
        workloads = tuple(
            typed(WorkloadRecord, "workloads", r[0], {"options": "options_json"}, key=r[1],
                  label=r[2], rw=r[3], bs=r[4], iodepth=r[5], numjobs=r[6], rate_iops=r[7],
                  options=decode("workloads", "options_json", r[0], r[8]))
            for r in self.conn.execute("SELECT id, key, label, rw, bs, iodepth, numjobs, "
                                       "rate_iops, options_json FROM workloads WHERE run_id = ? "
                                       "ORDER BY id", (run_id,)))
        trials = self._with_device_shares(run_id, self._trials("t.run_id = ?", run_id),
                                          ramp_s=suite.method.ramp, fallback=stored_device(host))
        return typed(StoredRun, "runs", run_id, {"host": "host_json", "notes": "notes_json"},
                     id=row[0], suite=suite, created_at=row[4], finished_at=row[5], status=row[6],
                     accelerator=row[7], iomatrix_version=row[8], host=host,
                     notes=decode("runs", "notes_json", run_id, row[10]), seed=row[11],
                     configs=configs, workloads=workloads, trials=trials,
                     nodes=self._nodes(run_id) if self.version >= 10 else ())

    def _nodes(self, run_id: int) -> tuple[NodeRecord, ...]:
        """The nodes of a cluster run, in their order (schema 10)."""
        return tuple(
            typed(NodeRecord, "run_nodes", where, {"node": "node_json", "host": "host_json"},
                  name=r[0], node=decode("run_nodes", "node_json", where, r[1]),
                  host=decode("run_nodes", "host_json", where, r[2]), status=r[3], reason=r[4])
            for r in self.conn.execute("SELECT name, node_json, host_json, status, reason, "
                                       "position FROM run_nodes WHERE run_id = ? ORDER BY "
                                       "position", (run_id,))
            for where in [_node_row(run_id, r[5])])

    def load_pilot(self, run_id: int) -> tuple[tuple[PilotTrial, ...], StoredPlan | None]:
        """A run's pilot trials and its trial plan (None: the run had no pilot, or it did not
        finish); a database older than schema 9 has neither."""
        if self.version < 9:
            return (), None
        trials = tuple(
            typed(PilotTrial, "pilot_trials", r[0], mode=r[1], config_key=r[2], workload_key=r[3],
                  round=r[4], runtime_s=r[5], iops=r[6], wall_s=r[7], session_s=r[8])
            for r in self.conn.execute(
                "SELECT id, mode, config_key, workload_key, round, runtime_s, iops, wall_s, "
                "session_s FROM pilot_trials WHERE run_id = ? ORDER BY id", (run_id,)))
        row = self.conn.execute("SELECT plan_json FROM trial_plans WHERE run_id = ?",
                                (run_id,)).fetchone()
        return trials, None if row is None else decode("trial_plans", "plan_json", run_id, row[0])

    def _trials(self, where: str, key: int) -> tuple[TrialRecord, ...]:
        """The trials ``where`` (a condition on ``t``, one parameter) says, with samples."""
        samples = self._samples("samples", where, key)
        vm_samples = self._samples("vm_samples", where, key)
        return tuple(
            typed(TrialRecord, "trials", r[0], _TRIAL_COLUMNS, id=r[0], config_key=r[1],
                  workload_key=r[2], sample_index=r[3], status=r[4], reason=r[5],
                  started_at=r[6], wall_seconds=r[7], accelerator=r[8], usr_cpu=r[9],
                  sys_cpu=r[10], ctx=r[11], applied=decode("trials", "applied_json", r[0], r[12]),
                  command=r[13], steady=decode("trials", "steady_json", r[0], r[14]),
                  cpu=decode("trials", "cpu_json", r[0], r[15]), tool=r[16],
                  samples=tuple(samples.get(r[0], ())), vm_samples=tuple(vm_samples.get(r[0], ())))
            for r in self.conn.execute(
                "SELECT t.id, c.key, w.key, t.sample_index, t.status, t.reason, t.started_at, "
                "t.wall_seconds, t.accelerator, t.usr_cpu, t.sys_cpu, t.ctx, t.applied_json, "
                "t.command, t.steady_json, t.cpu_json, t.fio_version FROM trials t "
                "JOIN configurations c ON c.id = t.configuration_id "
                f"JOIN workloads w ON w.id = t.workload_id WHERE {where} ORDER BY t.id",
                (key,)))

    def _with_device_shares(self, run_id: int, trials: tuple[TrialRecord, ...], *,
                            ramp_s: float, fallback: str | None) -> tuple[TrialRecord, ...]:
        """``trials`` with the ok trials of page-cache configurations carrying the share of
        fio's bytes that reached the target's device (``iomatrix.telemetry.pagecache``), derived
        from their stored telemetry; only those trials' telemetry is read."""
        ids = [r[0] for r in self.conn.execute(
            "SELECT id, mode, params_json FROM configurations WHERE run_id = ?", (run_id,))
            if uses_page_cache(str(r[1]), decode("configurations", "params_json", r[0], r[2]))]
        if not ids:
            return trials
        series: dict[int, HostSeries | None] = {}
        for first in range(0, len(ids), 500):
            chunk = ids[first:first + 500]
            for trial_id, text in self.conn.execute(
                    "SELECT id, telemetry_json FROM trials WHERE run_id = ? AND status = 'ok' AND "
                    f"configuration_id IN ({', '.join('?' * len(chunk))})", (run_id, *chunk)):
                series[trial_id] = decode("trials", "telemetry_json", trial_id,
                                           "{}" if text in (None, "") else text)
        return tuple(
            t.model_copy(update={"device_share": device_share(
                series[t.id], t.samples, ramp_s=ramp_s, device=fallback)})
            if t.id in series else t for t in trials)

    def telemetry(self, trial_id: int) -> HostSeries | None:
        """The host time series recorded during a trial (disk utilization, interrupts, ...);
        None when it recorded none (failed, imported and older trials)."""
        row = self.conn.execute("SELECT telemetry_json FROM trials WHERE id = ?",
                                (trial_id,)).fetchone()
        return decode("trials", "telemetry_json", trial_id, row[0]) if row else None

    def fio_json(self, trial_id: int) -> str | None:
        """The raw fio JSON stored with a trial."""
        row = self.conn.execute("SELECT fio_json FROM trials WHERE id = ?", (trial_id,)).fetchone()
        return inflate("trials", "fio_json", trial_id, row[0]) if row else None

    # -- helpers ---------------------------------------------------------------------------
    def _samples(self, table: str, where: str, key: int) -> dict[int, list[DirectionSample]]:
        """Trial id → its rows of ``samples`` or ``vm_samples``, for the trials ``where``
        (a condition on ``t``, one parameter) says."""
        vm = "s.vm" if table == "vm_samples" else "NULL"
        out: dict[int, list[DirectionSample]] = {}
        for r in self.conn.execute(
                f"SELECT s.trial_id, {vm}, {', '.join('s.' + c for c in _SAMPLE_COLUMNS)} "
                f"FROM {table} s JOIN trials t ON t.id = s.trial_id WHERE {where} "
                f"ORDER BY s.trial_id, {'s.vm, ' if vm == 's.vm' else ''}s.direction", (key,)):
            out.setdefault(r[0], []).append(typed(DirectionSample, table, f"of trial {r[0]}",
                                                  vm=r[1], **dict(zip(_SAMPLE_COLUMNS, r[2:]))))
        return out

    def _retire_failed(self, run_id: int, cid: int, wid: int, sample_index: int) -> None:
        """Inside a transaction: move the failed trial of that key, with its samples, raw fio
        output and telemetry, to ``trial_history``; nothing when there is none."""
        row = self.conn.execute(
            "SELECT id, telemetry_json, fio_json FROM trials WHERE configuration_id = ? AND "
            "workload_id = ? AND sample_index = ? AND status = 'failed'",
            (cid, wid, sample_index)).fetchone()
        if row is None:
            return
        (old,) = self._trials("t.id = ?", row[0])
        self.conn.execute(
            "INSERT INTO trial_history (run_id, config_key, workload_key, sample_index, status, "
            "reason, started_at, retired_at, trial_json, telemetry_json, fio_json) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (run_id, old.config_key, old.workload_key, old.sample_index, old.status, old.reason,
             old.started_at, now(), old.model_dump_json(), row[1], row[2]))
        self.conn.execute("DELETE FROM trials WHERE id = ?", (row[0],))

    def _id(self, table: str, run_id: int, key: str) -> int:
        row = self.conn.execute(f"SELECT id FROM {table} WHERE run_id = ? AND key = ?",
                                (run_id, key)).fetchone()
        if row is None:
            raise StoreError(f"run {run_id} has no {table[:-1]} {key!r}")
        return int(row[0])

    def _transaction(self) -> "_Transaction":
        if self.readonly:
            raise StoreError(f"{self.where}: opened read-only")
        return _Transaction(self.conn, self.postgres)


class CopyOutcome(NamedTuple):
    """What ``Store.copy_run`` did with one run."""

    source_id: int
    copy_id: int | None
    action: str
    """copied | updated | present | skipped"""
    detail: str


def _grouped(rows: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """Sample rows by their trial's id."""
    out: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        out.setdefault(r["trial_id"], []).append(r)
    return out


def _stored_steady(steady: SteadyRecord | None) -> dict[str, Any]:
    """Steady state as stored since schema v4: flat, the verdict's fields beside "checked" and
    "source" (or "checked": false and "reason"); nothing for a failed trial."""
    if steady is None:
        return {}
    out: dict[str, Any] = steady.verdict.model_dump() if steady.verdict else {}
    out["checked"] = steady.checked
    for key in ("source", "reason"):
        if getattr(steady, key) is not None:
            out[key] = getattr(steady, key)
    return out


_PROCESS = ("p.id, p.pid, p.host, p.boot_id, p.start_ticks, p.uid, p.lock_path, p.started_at, "
            "p.ended_at, p.lock_dev, p.lock_ino")


def _process(row: Any) -> ProcessRecord:
    return typed(ProcessRecord, "processes", row[0], id=row[0], pid=row[1], host=row[2],
                 boot_id=row[3], start_ticks=row[4], uid=row[5], lock_path=row[6],
                 started_at=row[7], ended_at=row[8], lock_dev=row[9], lock_ino=row[10])


def _check_copied(tables: Mapping[str, list[dict[str, Any]]]) -> None:
    """``DamagedStore`` unless every row a run's copy carries reads back as the store reads
    it (``rows.check_row``): a damaged row is not spread to another store."""
    for table, rows in tables.items():
        for r in rows:
            check_row(table, r, _node_row(r.get("run_id"), r.get("position"))
                      if table == "run_nodes" else r.get("id", r.get("run_id")))


def _node_row(run_id: object, position: object) -> str:
    """How a row of ``run_nodes`` (keyed by run and name) is named when it is damaged."""
    return f"{position} of run {run_id}"


def _text(table: str, column: str, row: object, value: Any) -> str:
    if not isinstance(value, str):
        raise damaged(table, column, row, "not text")
    return value


_TRIAL_COLUMNS = {"applied": "applied_json", "steady": "steady_json", "cpu": "cpu_json",
                  "tool": "fio_version", "config_key": "configuration_id",
                  "workload_key": "workload_id"}
"""The columns of ``trials`` that a ``TrialRecord``'s fields are read from, where the names
differ."""


def identity(process: ProcessRecord) -> Identity:
    """A recorded process as ``iomatrix.core.owner`` names processes."""
    return Identity(pid=process.pid, host=process.host, boot_id=process.boot_id,
                    start_ticks=process.start_ticks, uid=process.uid)


def lock_of(process: ProcessRecord) -> LockFile | None:
    """The lock file the process made, as recorded; None when it did not record one."""
    if process.lock_dev is None or process.lock_ino is None or not process.lock_path:
        return None
    return LockFile(process.lock_path, process.lock_dev, process.lock_ino, process.uid)


class _SqliteConnection:
    """An ``sqlite3.Connection`` whose statements fail as the store's errors: a file whose
    tables are not what iomatrix made (a crafted one: a column missing, a table of another
    shape) or whose pages are corrupt is ``DamagedStore``, one that cannot be used now (locked,
    full, read-only) ``StoreError``; in one line naming it, not a traceback. A broken unique
    key stays ``sqlite3.IntegrityError`` (``Store.record_trial`` says which trial)."""

    def __init__(self, raw: sqlite3.Connection, where: str) -> None:
        self.raw = raw
        self.where = where

    def execute(self, statement: str, params: Any = ()) -> sqlite3.Cursor:
        return self._run(self.raw.execute, statement, params)

    def executemany(self, statement: str, rows: Any) -> sqlite3.Cursor:
        return self._run(self.raw.executemany, statement, rows)

    def _run(self, call: Any, statement: str, params: Any) -> sqlite3.Cursor:
        try:
            return call(statement, params)
        except sqlite3.IntegrityError:
            raise
        except sqlite3.DatabaseError as exc:
            raise self._failure(exc) from None

    def _failure(self, exc: sqlite3.DatabaseError) -> StoreError:
        if isinstance(exc, sqlite3.OperationalError) and not str(exc).startswith(
                ("no such", "table ", "malformed")):
            return StoreError(f"{self.where}: {exc}")
        return DamagedStore(f"database damaged: {self.where}: {exc}")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)

    def __enter__(self) -> "_SqliteConnection":
        self.raw.__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        return self.raw.__exit__(*exc)


class _Transaction:
    def __init__(self, conn: Any, postgres: bool) -> None:
        self.conn = conn
        self.postgres = postgres

    def __enter__(self) -> None:
        if self.postgres:                   # writers take turns, as BEGIN IMMEDIATE has them
            self.conn.execute("BEGIN")
            self.conn.execute("SELECT pg_advisory_xact_lock(?::int, ?::int)", WRITE_LOCK)
        else:
            self.conn.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: Any, *rest: object) -> None:
        if not exc_type:
            self.conn.execute("COMMIT")
        elif self.conn.in_transaction:     # SQLite may have rolled back already (disk full, ...)
            self.conn.execute("ROLLBACK")


_SQLITE_MAGIC = b"SQLite format 3\0"


def _check_file(path: Path, readonly: bool) -> bytes:
    """The first 100 bytes of the database file (the SQLite header), or b"" for a new file;
    refuses, with one line and before SQLite touches it, what cannot be a results database."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        if readonly:
            raise StoreError(f"{path}: no results database here") from None
        parent = Path(os.path.realpath(path)).parent
        if not parent.is_dir():
            raise StoreError(f"{path}: cannot create the results database: "
                             f"no directory {parent}") from None
        if not os.access(parent, os.W_OK):
            raise StoreError(f"{path}: cannot create the results database: the directory "
                             f"{parent} is read-only") from None
        return b""
    except OSError as exc:
        raise StoreError(f"{path}: cannot open the results database: {exc.strerror}") from None
    if stat.S_ISDIR(info.st_mode):
        raise StoreError(f"{path}: is a directory, not a results database")
    if not stat.S_ISREG(info.st_mode):
        raise StoreError(f"{path}: not a regular file, not a results database")
    try:
        with open(path, "rb") as f:
            header = f.read(100)
    except OSError as exc:
        raise StoreError(f"{path}: cannot read the results database: {exc.strerror}") from None
    if header and not header.startswith(_SQLITE_MAGIC):
        raise StoreError(f"{path}: not an iomatrix results database (not an SQLite file)")
    if readonly and not header:
        raise StoreError(f"{path}: not an iomatrix results database (the file is empty)")
    if not readonly and not (os.access(path, os.W_OK)
                             and os.access(Path(os.path.realpath(path)).parent, os.W_OK)):
        raise StoreError(f"{path}: cannot write the results database (the file or its directory "
                         f"is read-only)")
    return header


SQLITE_BESIDE = ("", "-wal", "-shm", "-journal")
"""The database file and the files SQLite makes beside it, which it opens by name."""


def _check_place(path: Path, links: int = 0) -> None:
    """StoreError unless nobody but root and this user controls the database ``path``: every
    directory from ``/`` to it (``iomatrix.core.dirs.walk``), and the file and the files SQLite
    opens beside it (by name, following symlinks: one another user planted as the ``-wal`` or
    ``-shm`` name would have root write its journal into whatever it points to). A symlink
    there that root or this user made is followed and its target checked the same way."""
    where = ("another user could swap the database, or the files SQLite writes beside it, "
             "while iomatrix uses it")
    hint = ("keep the results database in a directory only root (or you) can write to: copy it "
            "there, or run iomatrix as the user who owns it")
    try:
        walked = walk(path.parent)
    except UnsafeDirectory as exc:
        raise StoreError(f"{path}: {exc}: {where}", hint=hint) from None
    except OSError:
        return                                   # _check_file says what is wrong with it
    try:
        if walked.missing:
            return
        shared = sticky_shared(os.fstat(walked.fd))
        for suffix in SQLITE_BESIDE:
            name = path.name + suffix
            try:
                fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=walked.fd)
            except FileNotFoundError:
                continue
            try:
                info = os.fstat(fd)
                why = distrust(info, fd)
            finally:
                os.close(fd)
            if stat.S_ISLNK(info.st_mode) and not (shared and info.st_uid not in (0, os.geteuid())):
                if links >= MAX_SYMLINKS:
                    raise StoreError(f"{path}: too many symlinks on the way (a loop?)")
                target = os.readlink(name, dir_fd=walked.fd)
                _check_place(Path(os.path.join(walked.real, target)), links + 1)
                continue
            if why is not None:
                raise StoreError(f"{walked.real / name} {why}: {where}", hint=hint)
    finally:
        os.close(walked.fd)


def _connect(target: Path | str, where: str, *, uri: bool = False) -> sqlite3.Connection:
    try:
        return sqlite3.connect(target, isolation_level=None, timeout=30, uri=uri)
    except sqlite3.Error as exc:
        raise StoreError(f"{where}: cannot open the results database ({exc})") from exc


def _switch_to_wal(conn: sqlite3.Connection, timeout: float = 30) -> None:
    """``PRAGMA journal_mode = WAL``. Switching needs the file to itself, and SQLite does not
    always wait for that (the busy timeout does not cover it): while other processes open the
    same new file, try again."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _identify(conn: sqlite3.Connection, where: str) -> int:
    """``identify`` in one read transaction."""
    conn.execute("BEGIN")
    try:
        return identify(conn, where)
    finally:
        if conn.in_transaction:
            conn.execute("COMMIT")
