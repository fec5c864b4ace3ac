"""The SQLite file under a store: what it must be before SQLite touches it (a regular SQLite
file, in a place nobody but root and this user controls), how it is opened and switched to WAL,
and its statements failing as the store's errors."""

from __future__ import annotations

import os
import sqlite3
import stat
import time
from pathlib import Path
from typing import Any

from iomatrix.core.dirs import MAX_SYMLINKS, distrust, sticky_shared, walk
from iomatrix.core.errors import DamagedStore, StoreError, UnsafeDirectory
from iomatrix.store.schema import identify


class SqliteConnection:
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

    def __enter__(self) -> "SqliteConnection":
        self.raw.__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        return self.raw.__exit__(*exc)


_SQLITE_MAGIC = b"SQLite format 3\0"


def check_file(path: Path, readonly: bool) -> bytes:
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


def check_place(path: Path, links: int = 0) -> None:
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
        return                                   # check_file says what is wrong with it
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
                check_place(Path(os.path.join(walked.real, target)), links + 1)
                continue
            if why is not None:
                raise StoreError(f"{walked.real / name} {why}: {where}", hint=hint)
    finally:
        os.close(walked.fd)


def connect(target: Path | str, where: str, *, uri: bool = False) -> sqlite3.Connection:
    try:
        return sqlite3.connect(target, isolation_level=None, timeout=30, uri=uri)
    except sqlite3.Error as exc:
        raise StoreError(f"{where}: cannot open the results database ({exc})") from exc


def switch_to_wal(conn: sqlite3.Connection, timeout: float = 30) -> None:
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


def identify_once(conn: sqlite3.Connection, where: str) -> int:
    """``identify`` in one read transaction."""
    conn.execute("BEGIN")
    try:
        return identify(conn, where)
    finally:
        if conn.in_transaction:
            conn.execute("COMMIT")
