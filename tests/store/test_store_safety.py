"""Opening the results store safely (issue 13): several processes creating one file at once, and
opening without side effects: read-only opens write nothing, and a file that is not an iomatrix
database (or is one from a newer iomatrix) is refused byte for byte unchanged."""

from __future__ import annotations

import hashlib
import multiprocessing
from multiprocessing.context import BaseContext
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from iomatrix.core.errors import SchemaTooNew, StoreError
from iomatrix.store import Store
from iomatrix.store.records import StoredSuite
from iomatrix.store.schema import APPLICATION_ID, SCHEMA_VERSION
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.workloads import Workload
from tests.needs import lacking

ROOT = Path(__file__).parents[2]
V1 = Path(__file__).parents[1] / "fixtures/store/schema-v1.db"
CONFIG = Configuration(mode="blocklayer", aio="io_uring", iothread=False, cache="none",
                       format="raw", preallocation="off")
WORKLOAD = Workload(rw="randrw", bs=4096, iodepth=8)
SIDECARS = ("-wal", "-shm", "-journal")


def add_run(store: Store) -> int:
    return store.create_run(suite=StoredSuite(name="t", source="t.toml", text="[suite]\n"),
                            host={"hostname": "h"}, accelerator="none", notes=[],
                            configs=[CONFIG], workloads=[WORKLOAD])


def snapshot(path: Path) -> tuple[str, list[str]]:
    """The file's hash and the names in its directory: what must not change."""
    return hashlib.sha256(path.read_bytes()).hexdigest(), sorted(os.listdir(path.parent))


def refused(path: Path, kind: type[StoreError] = StoreError, **kwargs: bool) -> str:
    with pytest.raises(kind) as caught:
        Store(path, **kwargs)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{path}: ")
    return message


def foreign_sqlite(path: Path, *, wal: bool = False, user_version: int = 0) -> None:
    conn = sqlite3.connect(path)
    if wal:
        conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("CREATE TABLE moz_places (id INTEGER PRIMARY KEY, url TEXT)")
    conn.execute("INSERT INTO moz_places (url) VALUES ('https://example.org')")
    conn.execute(f"PRAGMA user_version = {user_version}")
    conn.commit()
    conn.close()


# -- problem 4: creation and migration race-free ---------------------------------------------

def _open_at_once(path: str, barrier: object, results: object) -> None:
    barrier.wait()  # type: ignore[attr-defined]
    try:
        with Store(path) as store:
            results.put(("ok", store.version))  # type: ignore[attr-defined]
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        results.put((type(exc).__name__, str(exc)))  # type: ignore[attr-defined]


def _processes() -> BaseContext:
    """Where the tests' processes come from: a fork server, a process of Python's started for
    it alone (single-threaded, this module loaded in it once), not forks of the pytest worker,
    which runs threads (execnet's): Python 3.12+ warns that forking it may deadlock."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    return ctx


def _race(path: Path, processes: int = 4) -> list[tuple[str, object]]:
    ctx = _processes()
    barrier, results = ctx.Barrier(processes), ctx.Queue()
    procs = [ctx.Process(target=_open_at_once, args=(str(path), barrier, results))
             for _ in range(processes)]
    for p in procs:
        p.start()
    outcomes = [results.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return outcomes


@pytest.mark.slow
def test_processes_creating_one_new_database_at_once_all_succeed(tmp_path: Path) -> None:
    for attempt in range(15):
        db = tmp_path / f"new{attempt}.db"
        assert _race(db) == [("ok", SCHEMA_VERSION)] * 4, f"attempt {attempt}"
        conn = sqlite3.connect(db)
        assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        conn.close()


@pytest.mark.slow
def test_processes_migrating_one_old_database_at_once_all_succeed(tmp_path: Path) -> None:
    for attempt in range(5):
        db = tmp_path / f"old{attempt}.db"
        shutil.copy(V1, db)
        assert _race(db) == [("ok", SCHEMA_VERSION)] * 4, f"attempt {attempt}"
        with Store(db, readonly=True) as store:
            assert [r.id for r in store.list_runs()] == [1]


# -- problem 10: opening has no side effects -------------------------------------------------

@pytest.mark.parametrize("wal", [False, True], ids=["rollback", "wal"])
@pytest.mark.parametrize("readonly", [True, False], ids=["readonly", "writable"])
def test_foreign_sqlite_database_is_refused_unchanged(tmp_path: Path, readonly: bool,
                                                      wal: bool) -> None:
    db = tmp_path / "other.sqlite"
    foreign_sqlite(db, wal=wal, user_version=3)
    before = snapshot(db)
    message = refused(db, readonly=readonly)
    assert "not an iomatrix results database (it holds the tables moz_places)" in message
    assert snapshot(db) == before


def test_foreign_application_id_is_refused_unchanged(tmp_path: Path) -> None:
    db = tmp_path / "other.sqlite"
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA application_id = 1234")   # set, but no table yet
    conn.close()
    before = snapshot(db)
    for readonly in (True, False):
        assert "application_id is 0x000004d2" in refused(db, readonly=readonly)
    assert snapshot(db) == before


@pytest.mark.parametrize("readonly", [True, False], ids=["readonly", "writable"])
def test_file_that_is_not_sqlite_is_refused_unchanged(tmp_path: Path, readonly: bool) -> None:
    db = tmp_path / "notes.txt"
    db.write_text("shopping list\n" * 50)
    before = snapshot(db)
    assert refused(db, readonly=readonly).endswith(
        "not an iomatrix results database (not an SQLite file)")
    assert snapshot(db) == before


@pytest.mark.parametrize("readonly", [True, False], ids=["readonly", "writable"])
def test_future_schema_is_refused_unchanged_and_not_switched_to_wal(tmp_path: Path,
                                                                    readonly: bool) -> None:
    db = tmp_path / "future.db"
    Store(db).close()
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA journal_mode = DELETE")
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    before = snapshot(db)
    assert "newer than this iomatrix understands" in refused(db, SchemaTooNew, readonly=readonly)
    assert snapshot(db) == before
    assert db.read_bytes()[18:20] == b"\x01\x01"      # still a rollback-journal database


def test_readonly_open_of_a_missing_file_creates_nothing(tmp_path: Path) -> None:
    db = tmp_path / "missing.db"
    assert refused(db, readonly=True).endswith("no results database here")
    assert os.listdir(tmp_path) == []


def test_readonly_open_of_an_empty_file_is_refused_unchanged(tmp_path: Path) -> None:
    db = tmp_path / "empty.db"
    db.touch()
    assert "(the file is empty)" in refused(db, readonly=True)
    assert os.listdir(tmp_path) == ["empty.db"] and db.stat().st_size == 0


def test_readonly_open_reads_without_writing(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    with Store(db) as store:
        run_id = add_run(store)
    assert snapshot(db)[1] == ["r.db"]             # a clean close leaves no -wal or -shm
    before = snapshot(db)
    with Store(db, readonly=True) as store:
        assert store.load_run(store.resolve("last")).id == run_id
        with pytest.raises(StoreError, match="opened read-only"):
            store.finish_run(run_id, "complete")
        with pytest.raises(StoreError, match="readonly|read-only|query_only"):
            store.conn.execute("DELETE FROM runs")      # SQLite refuses it: one line
    assert snapshot(db) == before


def test_readonly_open_migrates_an_old_schema_in_memory_only(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    shutil.copy(V1, db)
    before = snapshot(db)
    with Store(db, readonly=True) as store:
        assert store.version == SCHEMA_VERSION
        (trial,) = store.load_run(1).trials
        assert trial.samples[0].iops > 0
    assert snapshot(db) == before
    assert sqlite3.connect(db).execute("PRAGMA user_version").fetchone()[0] == 1


def test_readonly_open_sees_what_a_live_writer_committed(tmp_path: Path) -> None:
    db = tmp_path / "live.db"
    with Store(db) as writer:
        add_run(writer)                            # committed, still in the -wal file
        with Store(db, readonly=True) as reader:
            assert len(reader.list_runs()) == 1
        add_run(writer)
    with Store(db, readonly=True) as reader:
        assert len(reader.list_runs()) == 2
    assert sorted(os.listdir(tmp_path)) == ["live.db"]


READ_ONLY_MEDIA = """
import sys
sys.path.insert(0, {root!r})
from iomatrix.core.errors import StoreError
from iomatrix.store import Store
with Store(sys.argv[1], readonly=True) as store:
    print(len(store.list_runs()))
try:
    Store(sys.argv[1])
except StoreError as exc:
    print(exc)
"""


@pytest.mark.slow
def test_wal_database_on_read_only_media_can_be_read(tmp_path: Path) -> None:
    """A read-only bind mount (a private mount namespace, so root is needed)."""
    media, mount = tmp_path / "media", tmp_path / "mnt"
    media.mkdir()
    mount.mkdir()
    with Store(media / "r.db") as store:
        add_run(store)
    script = tmp_path / "read.py"
    script.write_text(READ_ONLY_MEDIA.format(root=str(ROOT)))
    if shutil.which("unshare") is None or subprocess.run(
            ["unshare", "-m", "true"], capture_output=True).returncode != 0:
        lacking("mount-namespace", "needs unshare -m (root) to make a read-only mount")
    done = subprocess.run(
        ["unshare", "-m", "sh", "-c",
         f'mount --bind "{media}" "{mount}" && mount -o remount,bind,ro "{mount}" && '
         f'exec "{sys.executable}" "{script}" "{mount}/r.db"'],
        capture_output=True, text=True, timeout=60)
    if "mount" in done.stderr and done.returncode != 0:
        lacking("mount-namespace", f"cannot make a read-only mount here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    count, error = done.stdout.splitlines()
    assert count == "1"
    assert error == f"{mount}/r.db: cannot write the results database (the file or its " \
                    "directory is read-only)"
    assert os.listdir(media) == ["r.db"]


# -- odd paths: one clean StoreError line each -----------------------------------------------

@pytest.mark.parametrize("readonly", [True, False], ids=["readonly", "writable"])
def test_directory_is_refused(tmp_path: Path, readonly: bool) -> None:
    assert refused(tmp_path, readonly=readonly).endswith("is a directory, not a results database")
    assert os.listdir(tmp_path) == []


def test_missing_directory_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "no" / "such" / "r.db"
    assert "cannot create the results database: no directory" in refused(db)
    assert os.listdir(tmp_path) == []


def test_symlink_to_a_database_elsewhere(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "links").mkdir()
    link = tmp_path / "links" / "r.db"
    link.symlink_to(tmp_path / "real" / "r.db")     # dangling until the database is made
    assert refused(link, readonly=True).endswith("no results database here")
    with Store(link) as store:
        add_run(store)
        assert sorted(os.listdir(tmp_path / "real")) == ["r.db", "r.db-shm", "r.db-wal"]
    before = snapshot(tmp_path / "real" / "r.db")
    with Store(link, readonly=True) as store:
        assert len(store.list_runs()) == 1
    assert snapshot(tmp_path / "real" / "r.db") == before
    assert os.listdir(tmp_path / "links") == ["r.db"]


def _open_as_nobody(path: str, results: object) -> None:
    try:
        if os.geteuid() == 0:
            os.setgid(65534)
            os.setuid(65534)
        Store(path, readonly=True).close()
        results.put("opened")  # type: ignore[attr-defined]
    except StoreError as exc:
        results.put(str(exc))  # type: ignore[attr-defined]
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        results.put(f"{type(exc).__name__}: {exc}")  # type: ignore[attr-defined]


def test_unreadable_file_is_refused() -> None:
    """Root reads any file, so the check runs in a child that has become nobody."""
    where = Path(tempfile.mkdtemp(prefix="iomatrix-perm-"))
    try:
        where.chmod(0o755)
        db = where / "r.db"
        with Store(db) as store:
            add_run(store)
        db.chmod(0o000 if os.geteuid() else 0o600)
        ctx = _processes()
        results = ctx.Queue()
        child = ctx.Process(target=_open_as_nobody, args=(str(db), results))
        child.start()
        message = results.get(timeout=60)
        child.join(timeout=60)
        assert message == f"{db}: cannot read the results database: Permission denied"
    finally:
        shutil.rmtree(where)


# -- the read-only commands ------------------------------------------------------------------

READING_COMMANDS = [["runs"], ["show", "last"], ["export", "last"], ["scores", "last"],
                    ["effect", "last", "--axis", "cache"], ["recommend", "last", "--for", "qemu"],
                    ["compare", "1", "last"]]


@pytest.mark.parametrize("command", READING_COMMANDS, ids=lambda c: c[0])
def test_reading_commands_leave_other_files_unchanged(tmp_path: Path,
                                                      command: list[str]) -> None:
    """`iomatrix runs --db other.sqlite` once added five tables to it and switched it to WAL."""
    from tests.conftest import cli

    foreign, junk, future = tmp_path / "other.sqlite", tmp_path / "junk.db", tmp_path / "f.db"
    foreign_sqlite(foreign)
    junk.write_text("not a database\n" * 20)
    Store(future).close()
    conn = sqlite3.connect(future)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    before = {p: snapshot(p) for p in (foreign, junk, future)}
    for db, expected in ((foreign, "not an iomatrix results database (it holds the tables "
                                   "moz_places)"),
                         (junk, "not an iomatrix results database (not an SQLite file)"),
                         (future, f"schema version {SCHEMA_VERSION + 1} is newer"),
                         (tmp_path / "missing.db", "no results database here")):
        code, output = cli(*command, "--db", str(db))
        first = output.splitlines()[0]
        assert code == 8 and first.startswith(f"iomatrix: {db}: ") and expected in first, output
    assert {p: snapshot(p) for p in before} == before
    assert not (tmp_path / "missing.db").exists()


def test_reading_commands_read_an_old_database_without_migrating_it(tmp_path: Path) -> None:
    from tests.conftest import cli

    db = tmp_path / "old.db"
    shutil.copy(V1, db)
    before = snapshot(db)
    for command in (["runs"], ["show", "1"], ["export", "1", "--format", "json"]):
        code, output = cli(*command, "--db", str(db))
        assert code == 0 and "old" in output, output
    assert snapshot(db) == before
