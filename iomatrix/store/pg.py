"""The store's PostgreSQL connection: psycopg 3 (the ``postgres`` extra), behind the few calls
``repo`` makes of an ``sqlite3.Connection`` (``execute``, ``in_transaction``, ``close``).

The two dialects differ here in few enough places that a translation this thin says them all,
where an SQL toolkit would be a run-time dependency for every SQLite user:

- placeholders: ``?`` becomes ``%s`` (a literal ``%`` is doubled); no statement of the store
  holds a ``?`` or ``%`` inside a string literal;
- types in the migrations (``schema.pg_script``): ``INTEGER`` is ``BIGINT`` (SQLite's integers
  are 64-bit), ``REAL`` ``DOUBLE PRECISION``, ``BLOB`` ``BYTEA``, a rowid key an identity column;
- a new row's id: ``RETURNING id`` (``Store._insert``) where SQLite has ``lastrowid``;
- the schema version and the file's mark: the table ``iomatrix_schema`` where SQLite has
  ``PRAGMA user_version`` and ``application_id``;
- locking: a write transaction takes one transaction-level advisory lock (``WRITE_LOCK``), so
  writers take turns as SQLite's ``BEGIN IMMEDIATE`` makes them; a measuring process holds a
  session-level advisory lock on its process id (``Store.register_process``) that says, to
  every host, that it lives.

A connection that breaks (the server restarted, the backend terminated, the network gone)
raises ``StoreError`` with libpq's reason, the password struck from it; nothing reconnects, so
a process never writes again on a session whose locks it has lost."""

from __future__ import annotations

import functools
from typing import Any

from iomatrix.core.errors import DamagedStore, StoreError
from iomatrix.store.location import PgUrl, strike
from iomatrix.store.schema import APPLICATION_ID

WRITE_LOCK = (APPLICATION_ID, 0)
"""The advisory lock every write transaction holds: the second key of a process's own lock is
its id in ``processes``, which is never 0."""


DAMAGED = frozenset({"42P01", "42703", "42804", "22P02"})
"""SQLSTATEs of tables not of the shape iomatrix made (undefined table or column, a column of
another type): someone with the role changed them (``rows.DamagedStore``)."""


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError:
        raise StoreError("PostgreSQL results databases need psycopg 3, which is not installed",
                         hint="install iomatrix with its postgres extra (`uv sync --extra "
                              "postgres`, or `pip install 'psycopg[binary]'`)") from None
    return psycopg


def connect(url: PgUrl, *, readonly: bool) -> "PgConnection":
    """A connection in autocommit mode (``repo`` begins and ends its transactions itself);
    ``readonly`` makes the server refuse any write on it."""
    psycopg = _psycopg()
    try:
        raw = psycopg.connect(url.url, autocommit=True, connect_timeout=30,
                              application_name="iomatrix")
    except psycopg.Error as exc:
        raise StoreError(f"{url.shown}: cannot connect: {reason(exc, url)}") from None
    conn = PgConnection(raw, url)
    try:
        if readonly:
            conn.execute("SET default_transaction_read_only = on")
        conn.execute("SET lock_timeout = '60s'")
    except BaseException:
        conn.close()
        raise
    return conn


def reason(exc: BaseException, url: PgUrl) -> str:
    """libpq's or the server's reason, on one line, without the URL's password."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    # the first lines say why; DETAIL, HINT and the statement quoted with a caret under it do not
    text = "; ".join(line for line in lines
                     if not line.startswith(("DETAIL", "HINT", "LINE ", "^")))
    text = text.removeprefix("connection failed: ")
    return strike(text or type(exc).__name__, url.secrets)


@functools.lru_cache(maxsize=512)
def _sql(statement: str) -> str:
    return statement.replace("%", "%%").replace("?", "%s")


class PgConnection:
    """A psycopg connection answering as ``repo`` asks an ``sqlite3.Connection``."""

    dialect = "postgresql"

    def __init__(self, raw: Any, url: PgUrl) -> None:
        self.raw = raw
        self.url = url
        self._psycopg = _psycopg()

    def execute(self, statement: str, params: tuple[Any, ...] | list[Any] = ()) -> Any:
        try:
            return self.raw.execute(_sql(statement), tuple(params))
        except self._psycopg.errors.IntegrityError:
            raise
        except self._psycopg.Error as exc:   # the server's refusals too (no CREATE right, ...)
            raise self._failure(exc) from None

    def insert_rows(self, table: str, names: list[str], rows: list[tuple[Any, ...]], *,
                    keyed: bool) -> list[int]:
        """``rows`` (values of the columns ``names``) into ``table`` with one COPY, not a round
        trip each; with ``keyed``, each row's id taken from the table's identity sequence first,
        ascending as the rows go (a run's trials are read back in the order of their ids)."""
        if not rows:
            return []
        ids: list[int] = []
        if keyed:
            ids = sorted(int(r[0]) for r in self.execute(
                "SELECT nextval(pg_get_serial_sequence(?, 'id')) FROM generate_series(1, ?)",
                (table, len(rows))).fetchall())
            names = ["id", *names]
            rows = [(i, *row) for i, row in zip(ids, rows, strict=True)]
        try:
            with self.raw.cursor() as cursor, cursor.copy(
                    f"COPY {table} ({', '.join(names)}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
        except self._psycopg.errors.IntegrityError:
            raise
        except self._psycopg.Error as exc:
            raise self._failure(exc) from None
        return ids

    def _failure(self, exc: BaseException) -> StoreError:
        """A psycopg error as the StoreError to raise, with the server's or libpq's reason."""
        if self.raw.closed or self.raw.broken:
            return StoreError(f"{self.url.shown}: the connection to the database was lost "
                              f"({reason(exc, self.url)})",
                              hint="what was stored before is kept whole; `iomatrix run "
                                   "--resume RUN` measures the rest")
        if getattr(exc, "sqlstate", None) in DAMAGED:
            return DamagedStore(f"database damaged: {self.url.shown}: {reason(exc, self.url)}")
        return StoreError(f"{self.url.shown}: {reason(exc, self.url)}")

    @property
    def in_transaction(self) -> bool:
        status = self.raw.info.transaction_status
        return not self.raw.broken and status != self._psycopg.pq.TransactionStatus.IDLE

    def session_pid(self) -> int:
        """The server process serving this connection (``pg_terminate_backend`` ends it)."""
        return int(self.raw.info.backend_pid)

    def close(self) -> None:
        self.raw.close()
