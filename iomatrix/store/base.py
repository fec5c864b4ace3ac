"""What every part of the store stands on: its connection (SQLite's, or PostgreSQL's answering
as it), the transaction each write runs in, the new row's id, and the time as stored."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from iomatrix.core.errors import StoreError
from iomatrix.core.trust import Author
from iomatrix.store.location import PgUrl, location_author
from iomatrix.store.pg import WRITE_LOCK
from iomatrix.store.schema import current_version


Row = dict[str, Any]
"""A row as one query gave it, column → value (a run copied between stores)."""


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class StoreBase:
    """The connection and the few things each part of ``Store`` (runs, owners, copying) does
    with it; ``iomatrix.store.repo.Store`` opens it."""

    conn: Any
    where: str
    """The database, named in every message (without a password)."""
    readonly: bool
    stored_version: int
    path: Path | None
    url: PgUrl | None

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

    def _dicts(self, statement: str, params: tuple[Any, ...]) -> list[Row]:
        cursor = self.conn.execute(statement, params)
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, r)) for r in cursor.fetchall()]

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
