"""Who owns a run, and what it made: the processes that measure runs (recorded before they create
anything, with the lock file each holds), whether one still runs, a run claimed by a process,
and the resources (images, scratch directories, ...) each made and nobody has removed yet."""

from __future__ import annotations

import os
from typing import Any

from iomatrix.core.errors import RunBusy, RunNotFound
from iomatrix.core.owner import Identity, LockFile, liveness, this_process
from iomatrix.store.base import StoreBase, now
from iomatrix.store.records import ProcessRecord, ResourceRecord
from iomatrix.store.rows import typed, within
from iomatrix.store.schema import APPLICATION_ID


class Ownership(StoreBase):
    """Processes, run owners and resources (the part of ``Store`` that knows their SQL)."""

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


    def running_runs(self) -> list[tuple[int, ProcessRecord | None]]:
        """The runs marked running, each with its owner (None: an older iomatrix ran it)."""
        return [(run_id, self.owner(run_id)) for (run_id,) in self.conn.execute(
            "SELECT id FROM runs WHERE status = 'running' ORDER BY id").fetchall()]


_PROCESS = ("p.id, p.pid, p.host, p.boot_id, p.start_ticks, p.uid, p.lock_path, p.started_at, "
            "p.ended_at, p.lock_dev, p.lock_ino")


def _process(row: Any) -> ProcessRecord:
    return typed(ProcessRecord, "processes", row[0], id=row[0], pid=row[1], host=row[2],
                 boot_id=row[3], start_ticks=row[4], uid=row[5], lock_path=row[6],
                 started_at=row[7], ended_at=row[8], lock_dev=row[9], lock_ino=row[10])


def identity(process: ProcessRecord) -> Identity:
    """A recorded process as ``iomatrix.core.owner`` names processes."""
    return Identity(pid=process.pid, host=process.host, boot_id=process.boot_id,
                    start_ticks=process.start_ticks, uid=process.uid)


def lock_of(process: ProcessRecord) -> LockFile | None:
    """The lock file the process made, as recorded; None when it did not record one."""
    if process.lock_dev is None or process.lock_ino is None or not process.lock_path:
        return None
    return LockFile(process.lock_path, process.lock_dev, process.lock_ino, process.uid)
