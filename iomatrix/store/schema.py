"""Ordered schema migrations. The database's ``PRAGMA user_version`` is the number of migrations
applied; each runs in its own transaction, so a crash mid-migration leaves the previous version.

History:
  1  runs, configurations, workloads, trials (one per measured or failed trial), samples (one per
     trial and direction: read / write)
  2  what QEMU really applied and the command that realized it, per trial; the accelerator per
     trial; the run's notes (skipped combinations, ignored axes)
  3  vm_samples: each guest's own figures when several guests run a trial at once (samples then
     hold the aggregate)
  4  the run's shuffle seed; per trial: steady state, CPU cost, host telemetry (JSON)
  5  ownership and clean-up: the processes that measured (pid, host, boot, start time, uid, lock
     file), the run's current owner, what each process created on disk (scratch directories,
     image directories, target directories) and whether it was removed; trial_history keeps a
     failed trial, whole, when --retry-failed measures it again
  6  the device and inode of each process's lock file, recorded once made: a file planted
     under its name is not its lock (``iomatrix.core.owner.LockFile``)
  7  the run's uuid: the same run in two stores (``iomatrix db copy``) is known by it; the runs
     made before it get one drawn at random
  8  resources on network storage: a kind ``<storage>-<thing>`` (``rbd-image``: an RBD image a
     run created, its path ``pool[/namespace]/name``, its ``within`` the connection as JSON,
     file paths only: ``iomatrix.targets.rbd``); PostgreSQL swaps the table's check
     rather than rebuilding the table (``PG_MIGRATIONS``)
  9  pilot_trials: the trials a run's pilot measured to choose its trial length and rounds
     (``[method] pilot``; never part of a gain), and trial_plans: what it chose and why (JSON)
  10 run_nodes: the nodes of a cluster run ([nodes]; its configurations carry node=NAME), how
     SSH reached each (``iomatrix.cluster.ssh.Node``, JSON), its host metadata from its preflight,
     and how its share went (pending, running, done, failed, dropped) with the reason
  11 who could have written a run's suite (``runs.suite_author``, ``StoredSuite.author``): the
     invoking user's uid when nobody but root or that user could have, another user's uid, or
     -1 for anyone (an imported run's); NULL for the runs made before it, which ``--resume``
     judges by who could have written the store alone, as it did
  12 the run's spec (``runs.spec_json``, ``iomatrix.suite.spec.RunSpec``): the suite as the run
     measured it, resolved once (scale, job files, the VM's disk, the Proxmox host, a storage
     id, --target), as JSON beside its text, which is now the user's, untouched; NULL for the
     runs made before it, whose spec is derived from their text when they are loaded
  13 per trial: whether it stalled (``trials.stall_json``, ``iomatrix.fio.persecond.StallCheck``:
     a span of a second or more without a completion while fio kept I/O queued); {} for the
     trials made before it, which were not checked
  14 the queue depth each trial achieved beside the one it asked (``trials.depth_json``,
     ``iomatrix.fio.depth.DepthRecord``; a trial well short of its depth is flagged); {} for
     failed trials and the trials made before it
  15 per trial: the latency, bandwidth and IOPS logs its workload asked for (``write_lat_log``
     ...), as fio wrote them into the trial's own directory (``trials.logs_json``: file name →
     text); {} where none was asked for

Every migration also sets ``PRAGMA application_id`` to ``APPLICATION_ID``: the mark by which
iomatrix knows its own files. Databases made before the mark are known by their tables. Anything
else (another program's database, a schema newer than this iomatrix) is refused before a byte of
it is written.

PostgreSQL (``iomatrix.store.pg``) runs the same migrations, their types translated
(``pg_script``), and keeps the version and the mark in a table of its own, ``iomatrix_schema``;
a database holding other tables and not that one is not iomatrix's.
"""

from __future__ import annotations

import re
import sqlite3
from typing import Any

from iomatrix.core.errors import SchemaTooNew, StoreError

MIGRATIONS: tuple[str, ...] = (
    # 1
    """
    CREATE TABLE runs (
        id INTEGER PRIMARY KEY,
        suite_name TEXT NOT NULL,
        suite_source TEXT NOT NULL,
        suite_text TEXT NOT NULL,
        created_at TEXT NOT NULL,
        finished_at TEXT,
        status TEXT NOT NULL CHECK (status IN ('running', 'complete', 'interrupted', 'failed')),
        host_json TEXT NOT NULL,
        accelerator TEXT NOT NULL,
        iomatrix_version TEXT NOT NULL
    );
    CREATE TABLE configurations (
        id INTEGER PRIMARY KEY,
        run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        key TEXT NOT NULL,
        label TEXT NOT NULL,
        mode TEXT NOT NULL,
        params_json TEXT NOT NULL,
        UNIQUE (run_id, key)
    );
    CREATE TABLE workloads (
        id INTEGER PRIMARY KEY,
        run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        key TEXT NOT NULL,
        label TEXT NOT NULL,
        rw TEXT NOT NULL,
        bs INTEGER NOT NULL,
        iodepth INTEGER NOT NULL,
        numjobs INTEGER NOT NULL,
        rate_iops INTEGER NOT NULL,
        options_json TEXT NOT NULL,
        UNIQUE (run_id, key)
    );
    CREATE TABLE trials (
        id INTEGER PRIMARY KEY,
        run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        configuration_id INTEGER NOT NULL REFERENCES configurations(id) ON DELETE CASCADE,
        workload_id INTEGER NOT NULL REFERENCES workloads(id) ON DELETE CASCADE,
        sample_index INTEGER NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('ok', 'failed')),
        reason TEXT,
        started_at TEXT NOT NULL,
        wall_seconds REAL,
        fio_version TEXT,
        usr_cpu REAL,
        sys_cpu REAL,
        ctx INTEGER,
        fio_json BLOB,
        UNIQUE (configuration_id, workload_id, sample_index)
    );
    CREATE TABLE samples (
        trial_id INTEGER NOT NULL REFERENCES trials(id) ON DELETE CASCADE,
        direction TEXT NOT NULL CHECK (direction IN ('read', 'write')),
        iops REAL NOT NULL,
        bw_bytes REAL NOT NULL,
        io_bytes INTEGER NOT NULL,
        total_ios INTEGER NOT NULL,
        runtime_ms INTEGER NOT NULL,
        lat_mean_ns REAL,
        lat_stdev_ns REAL,
        lat_min_ns REAL,
        lat_max_ns REAL,
        p50_ns REAL,
        p90_ns REAL,
        p99_ns REAL,
        p99_9_ns REAL,
        p99_99_ns REAL,
        PRIMARY KEY (trial_id, direction)
    );
    CREATE INDEX trials_by_run ON trials(run_id);
    """,
    # 2
    """
    ALTER TABLE runs ADD COLUMN notes_json TEXT NOT NULL DEFAULT '[]';
    ALTER TABLE trials ADD COLUMN accelerator TEXT NOT NULL DEFAULT 'none';
    ALTER TABLE trials ADD COLUMN applied_json TEXT NOT NULL DEFAULT '{}';
    ALTER TABLE trials ADD COLUMN command TEXT NOT NULL DEFAULT '';
    """,
    # 3
    """
    CREATE TABLE vm_samples (
        trial_id INTEGER NOT NULL REFERENCES trials(id) ON DELETE CASCADE,
        vm INTEGER NOT NULL,
        direction TEXT NOT NULL CHECK (direction IN ('read', 'write')),
        iops REAL NOT NULL,
        bw_bytes REAL NOT NULL,
        io_bytes INTEGER NOT NULL,
        total_ios INTEGER NOT NULL,
        runtime_ms INTEGER NOT NULL,
        lat_mean_ns REAL,
        lat_stdev_ns REAL,
        lat_min_ns REAL,
        lat_max_ns REAL,
        p50_ns REAL,
        p90_ns REAL,
        p99_ns REAL,
        p99_9_ns REAL,
        p99_99_ns REAL,
        PRIMARY KEY (trial_id, vm, direction)
    );
    """,
    # 4
    """
    ALTER TABLE runs ADD COLUMN seed INTEGER;
    ALTER TABLE trials ADD COLUMN steady_json TEXT NOT NULL DEFAULT '{}';
    ALTER TABLE trials ADD COLUMN cpu_json TEXT NOT NULL DEFAULT '{}';
    ALTER TABLE trials ADD COLUMN telemetry_json TEXT NOT NULL DEFAULT '{}';
    """,
    # 5
    """
    CREATE TABLE processes (
        id INTEGER PRIMARY KEY,
        pid INTEGER NOT NULL,
        host TEXT NOT NULL,
        boot_id TEXT NOT NULL,
        start_ticks INTEGER NOT NULL,
        uid INTEGER NOT NULL,
        lock_path TEXT NOT NULL,
        started_at TEXT NOT NULL,
        ended_at TEXT
    );
    ALTER TABLE runs ADD COLUMN owner_id INTEGER REFERENCES processes(id);
    CREATE TABLE resources (
        id INTEGER PRIMARY KEY,
        process_id INTEGER NOT NULL REFERENCES processes(id),
        run_id INTEGER REFERENCES runs(id) ON DELETE SET NULL,
        kind TEXT NOT NULL CHECK (kind IN ('scratch', 'workspace', 'parent')),
        path TEXT NOT NULL,
        within TEXT NOT NULL,
        keep INTEGER NOT NULL DEFAULT 0,
        created_at TEXT NOT NULL,
        removed_at TEXT,
        outcome TEXT
    );
    CREATE INDEX resources_open ON resources(removed_at);
    CREATE TABLE trial_history (
        id INTEGER PRIMARY KEY,
        run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        config_key TEXT NOT NULL,
        workload_key TEXT NOT NULL,
        sample_index INTEGER NOT NULL,
        status TEXT NOT NULL,
        reason TEXT,
        started_at TEXT NOT NULL,
        retired_at TEXT NOT NULL,
        trial_json TEXT NOT NULL,
        telemetry_json TEXT NOT NULL,
        fio_json BLOB
    );
    """,
    # 6
    """
    ALTER TABLE processes ADD COLUMN lock_dev INTEGER;
    ALTER TABLE processes ADD COLUMN lock_ino INTEGER;
    """,
    # 7
    """
    ALTER TABLE runs ADD COLUMN uuid TEXT;
    UPDATE runs SET uuid = lower(hex(randomblob(16)));
    CREATE UNIQUE INDEX runs_by_uuid ON runs(uuid);
    """,
    # 8
    """
    CREATE TABLE resources_8 (
        id INTEGER PRIMARY KEY,
        process_id INTEGER NOT NULL REFERENCES processes(id),
        run_id INTEGER REFERENCES runs(id) ON DELETE SET NULL,
        kind TEXT NOT NULL CHECK (kind IN ('scratch', 'workspace', 'parent')
                                  OR kind GLOB '[a-z]*-[a-z]*'),
        path TEXT NOT NULL,
        within TEXT NOT NULL,
        keep INTEGER NOT NULL DEFAULT 0,
        created_at TEXT NOT NULL,
        removed_at TEXT,
        outcome TEXT
    );
    INSERT INTO resources_8 SELECT id, process_id, run_id, kind, path, within, keep, created_at,
        removed_at, outcome FROM resources;
    DROP TABLE resources;
    ALTER TABLE resources_8 RENAME TO resources;
    CREATE INDEX resources_open ON resources(removed_at);
    """,
    # 9
    """
    CREATE TABLE pilot_trials (
        id INTEGER PRIMARY KEY,
        run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        mode TEXT NOT NULL,
        config_key TEXT NOT NULL,
        workload_key TEXT NOT NULL,
        round INTEGER NOT NULL,
        runtime_s REAL NOT NULL,
        iops REAL,
        wall_s REAL NOT NULL,
        session_s REAL NOT NULL
    );
    CREATE TABLE trial_plans (
        run_id INTEGER NOT NULL PRIMARY KEY REFERENCES runs(id) ON DELETE CASCADE,
        plan_json TEXT NOT NULL
    );
    """,
    # 10
    """
    CREATE TABLE run_nodes (
        run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        name TEXT NOT NULL,
        position INTEGER NOT NULL,
        node_json TEXT NOT NULL,
        host_json TEXT NOT NULL DEFAULT '{}',
        status TEXT NOT NULL DEFAULT 'pending'
            CHECK (status IN ('pending', 'running', 'done', 'failed', 'dropped')),
        reason TEXT,
        PRIMARY KEY (run_id, name)
    );
    """,
    # 11
    """
    ALTER TABLE runs ADD COLUMN suite_author INTEGER;
    """,
    # 12
    """
    ALTER TABLE runs ADD COLUMN spec_json TEXT;
    """,
    # 13
    """
    ALTER TABLE trials ADD COLUMN stall_json TEXT NOT NULL DEFAULT '{}';
    """,
    # 14
    """
    ALTER TABLE trials ADD COLUMN depth_json TEXT NOT NULL DEFAULT '{}';
    """,
    # 15
    """
    ALTER TABLE trials ADD COLUMN logs_json TEXT NOT NULL DEFAULT '{}';
    """,
)

SCHEMA_VERSION = len(MIGRATIONS)

PG_MIGRATIONS: dict[int, str] = {
    # 8: PostgreSQL changes a table's check in place; rebuilding the table as SQLite must would
    # leave its identity sequence behind the copied ids
    8: """
    ALTER TABLE resources DROP CONSTRAINT resources_kind_check;
    ALTER TABLE resources ADD CONSTRAINT resources_kind_check
        CHECK (kind IN ('scratch', 'workspace', 'parent') OR kind ~ '^[a-z].*-[a-z]');
    """,
}
"""Migrations (by number) that PostgreSQL runs in words of its own instead of ``MIGRATIONS``'."""

APPLICATION_ID = 0x696F6D78
"""``PRAGMA application_id`` of an iomatrix results database: "iomx"."""

IOMATRIX_TABLES = frozenset({"runs", "configurations", "workloads", "trials", "samples"})
"""The tables of schema 1: how a database made before ``APPLICATION_ID`` is recognized."""


META = "iomatrix_schema"
"""On PostgreSQL: the table of one row that holds ``APPLICATION_ID`` and the schema version."""

_PG_TYPES = ((r"\bINTEGER PRIMARY KEY\b", "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY"),
             (r"\bINTEGER\b", "BIGINT"), (r"\bREAL\b", "DOUBLE PRECISION"),
             (r"\bBLOB\b", "BYTEA"),
             (r"lower\(hex\(randomblob\(16\)\)\)", "replace(gen_random_uuid()::text, '-', '')"))


def pg_script(script: str) -> str:
    """A migration as PostgreSQL takes it: SQLite's types (64-bit integers, doubles, blobs,
    rowid keys) and its one function named in PostgreSQL's words."""
    for pattern, replacement in _PG_TYPES:
        script = re.sub(pattern, replacement, script)
    return script


def current_version(conn: Any) -> int:
    if getattr(conn, "dialect", "sqlite") == "postgresql":
        row = conn.execute(f"SELECT version FROM {META}").fetchone()
        return int(row[0]) if row else 0
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def identify(conn: sqlite3.Connection, where: str = "database") -> int:
    """The schema version of the iomatrix results database on ``conn``; 0 for an empty database
    (a new file). Reads only. Raises ``StoreError`` for a database that is not iomatrix's, and
    ``SchemaTooNew`` for one newer than this iomatrix. Call it inside a transaction, so that what
    it reads is one state of the file."""
    app_id = int(conn.execute("PRAGMA application_id").fetchone()[0])
    version = current_version(conn)
    objects = conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()[0]
    tables = sorted(r[0] for r in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND substr(name, 1, 7) != 'sqlite_'"))
    if app_id in (0, APPLICATION_ID) and version == 0 and objects == 0:
        return 0
    if app_id == APPLICATION_ID or (app_id == 0 and version > 0 and IOMATRIX_TABLES <= set(tables)):
        if version > SCHEMA_VERSION:
            raise SchemaTooNew(f"{where}: schema version {version} is newer than this iomatrix "
                               f"understands ({SCHEMA_VERSION})")
        return version
    if app_id != 0:
        why = f"its application_id is {app_id:#010x}"
    elif tables:
        why = "it holds the tables " + ", ".join(tables[:6]) + (", ..." if len(tables) > 6 else "")
    else:
        why = f"schema version {version} but no iomatrix tables"
    raise StoreError(f"{where}: not an iomatrix results database ({why})")


def migrate(conn: sqlite3.Connection, upto: int = SCHEMA_VERSION, *,
            where: str = "database") -> int:
    """Apply the migrations the database lacks, all in one transaction (a new file's nine
    took nine journal syncs, 0.1 s, in every test that made a database); the version reached.
    The transaction reads the version it starts from only once it holds the write lock, so
    processes that open a new file at once create it once. Refuses, unchanged, a database that
    ``identify`` refuses. The connection must be in autocommit mode (isolation_level=None)."""
    conn.execute("BEGIN")                   # a consistent read; up to date needs no write lock
    try:
        version = identify(conn, where)
    finally:
        if conn.in_transaction:
            conn.execute("COMMIT")
    if version < upto:
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = identify(conn, where)
            while version < upto:
                for statement in _statements(MIGRATIONS[version]):
                    conn.execute(statement)
                conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                version += 1
                conn.execute(f"PRAGMA user_version = {version}")
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
    return version


def identify_pg(conn: Any, where: str) -> int:
    """``identify`` for a PostgreSQL database: 0 when its schema (the connection's
    ``current_schema()``) holds no table at all. Reads only."""
    tables = sorted(r[0] for r in conn.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"))
    if not tables:
        return 0
    if META not in tables:
        raise StoreError(f"{where}: not an iomatrix results database (it holds the tables "
                         + ", ".join(tables[:6]) + (", ..." if len(tables) > 6 else "") + ")")
    row = conn.execute(f"SELECT application_id, version FROM {META}").fetchone()
    if row is None or int(row[0]) != APPLICATION_ID:
        raise StoreError(f"{where}: not an iomatrix results database (its {META} table is "
                         "not iomatrix's)")
    if int(row[1]) > SCHEMA_VERSION:
        raise SchemaTooNew(f"{where}: schema version {row[1]} is newer than this iomatrix "
                           f"understands ({SCHEMA_VERSION})")
    return int(row[1])


def migrate_pg(conn: Any, upto: int = SCHEMA_VERSION, *, where: str, lock: tuple[int, int]) -> int:
    """``migrate`` for PostgreSQL: each migration in one transaction that holds the writers'
    advisory ``lock`` and reads the version only then (DDL is transactional there too)."""
    version = identify_pg(conn, where)
    while version < upto:
        conn.execute("BEGIN")
        try:
            conn.execute("SELECT pg_advisory_xact_lock(?, ?)", lock)
            version = identify_pg(conn, where)
            if version < upto:
                if version == 0:
                    conn.execute(f"CREATE TABLE {META} (application_id BIGINT NOT NULL, "
                                 "version BIGINT NOT NULL)")
                    conn.execute(f"INSERT INTO {META} VALUES (?, 0)", (APPLICATION_ID,))
                script = PG_MIGRATIONS.get(version + 1) or pg_script(MIGRATIONS[version])
                for statement in _statements(script):
                    conn.execute(statement)
                version += 1
                conn.execute(f"UPDATE {META} SET version = ?", (version,))
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
    return version


def _statements(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip()]
