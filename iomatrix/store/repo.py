"""Everything iomatrix reads from and writes to the results database: an SQLite file, or a
PostgreSQL database (``iomatrix.store.pg`` says how the two differ). Each trial is written in
one transaction with its samples, so a crash never leaves a half-written sample."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

from iomatrix.core.errors import StoreError
from iomatrix.store.base import now
from iomatrix.store.copying import CopyOutcome, Copying
from iomatrix.store.location import Location, PgUrl, parse_location
from iomatrix.store.owners import Ownership, identity, lock_of
from iomatrix.store.pg import WRITE_LOCK
from iomatrix.store.pg import connect as pg_connect
from iomatrix.store.runs import Runs
from iomatrix.store.schema import SCHEMA_VERSION, identify_pg, migrate, migrate_pg
from iomatrix.store.sqlite import (SqliteConnection, check_file, check_place, connect,
                                   identify_once, switch_to_wal)

__all__ = ["CopyOutcome", "Store", "identity", "lock_of", "now"]
"""Store is the facade; the rest is re-exported for the code that imports it from here."""


class Store(Runs, Ownership, Copying):
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
        if isinstance(found, PgUrl):
            self.path = None
            self.url = found
            self.conn = self._open_pg(found, migrate_to)
            return
        self.path, self.url = found, None
        check_place(found)
        header = check_file(found, readonly)
        try:
            self.conn = SqliteConnection(self._open_readonly(header, migrate_to) if readonly
                                         else self._open_writable(migrate_to), self.where)
        except sqlite3.DatabaseError as exc:
            what = ("not an iomatrix results database" if "not a database" in str(exc)
                    else "cannot use the results database")
            raise StoreError(f"{self.path}: {what} ({exc})") from exc

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
        conn = connect(self.path, str(self.path))
        try:
            conn.execute("PRAGMA foreign_keys = ON")
            conn.execute("PRAGMA synchronous = NORMAL")
            migrate(conn, migrate_to, where=str(self.path))
            switch_to_wal(conn)
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
        conn = connect(f"{real.as_uri()}?mode=ro" + ("&immutable=1" if immutable else ""),
                       str(self.path), uri=True)
        try:
            try:
                version = identify_once(conn, str(self.path))
            except sqlite3.OperationalError:
                if not wal or immutable:
                    raise
                # a WAL database with a -wal file, on read-only media without its -shm file:
                # only its main file can be read
                conn.close()
                conn = connect(f"{real.as_uri()}?mode=ro&immutable=1", str(self.path),
                               uri=True)
                version = identify_once(conn, str(self.path))
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
