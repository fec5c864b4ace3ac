"""The results store shared in PostgreSQL (issue 22), on a real server of the tests' own
(``pg_server``): several writers and hosts at once, ownership across hosts by the session lock,
a connection dropped in the middle of a run, one-line refusals, the password kept out of every
output, and ``db copy`` between SQLite and PostgreSQL. What both backends share is tested on
both in test_store.py and test_resume.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from iomatrix.cli.status import ExitStatus
from iomatrix.core.errors import RunBusy, StoreError
from iomatrix.core.owner import this_process
from iomatrix.store import Store
from iomatrix.store.location import parse_location, shown
from iomatrix.store.records import CpuRecord, SteadyRecord
from tests.conftest import Backend, IOMATRIX, cli_result, write_suite
from tests.store.test_store import host_series, new_run, sample, trial

ROOT = Path(__file__).parents[2]

WRITER = """
import os, socket, sys, time
from pathlib import Path
host = sys.argv[3]
Path(sys.argv[2] + "." + str(os.getpid()) + ".started").write_text("")
if host:                                # another host, as far as iomatrix can tell
    socket.gethostname = lambda: host
sys.path.insert(0, {root!r})
from tests.store.test_store import CONFIG, WORKLOAD, sample, trial
from iomatrix.core.owner import this_process
from iomatrix.store import Store
from iomatrix.store.records import StoredSuite

store = Store(sys.argv[1])
me = store.register_process(this_process(), "")
where = {{"hostname": socket.gethostname(), "target": "/srv/" + (host or "here")}}
run_id = store.create_run(suite=StoredSuite(name="t", source="t.toml", text="[suite]"),
                          host=where, accelerator="none", notes=[], configs=[CONFIG],
                          workloads=[WORKLOAD], owner=me)
store.add_resource(me, "scratch", "/nonexistent/iomatrix-run-" + str(run_id), "/nonexistent")
flag = sys.argv[2]
Path(flag + "." + str(os.getpid()) + ".ready").write_text(str(run_id))
while not Path(flag).exists():          # all writers start together
    time.sleep(0.01)
for k in range(int(sys.argv[4])):
    store.record_trial(run_id, trial(k, samples=[sample("read", 10 + k), sample("write", 5)]))
if sys.argv[5] == "hold":               # stay the run's live owner until killed
    print("holding", flush=True)
    time.sleep(600)
store.finish_run(run_id, "complete")
store.end_process(me)
Path(flag + "." + str(os.getpid()) + ".done").write_text("")
"""


def writer(tmp_path: Path, url: str, name: str, host: str, trials: int,
           hold: bool = False) -> subprocess.Popen[str]:
    script = tmp_path / "writer.py"
    # written once, before the first writer starts: each call used to write it again, and a
    # writer whose Python opened it just then, truncated, ran an empty script and ended with
    # exit 0 before its "started" mark ("a writer died early: exit [0, None, None]", twice in
    # Debian 13; 1 in 200 starts here when the file is written again at once)
    if not script.exists():
        partial = script.with_suffix(".partial")
        partial.write_text(WRITER.format(root=str(ROOT)))
        partial.replace(script)
    # stderr in a file of its own, named in start()'s message
    with open(tmp_path / f"{name}.{host or 'here'}.{time.monotonic_ns()}.err", "w") as err:
        return subprocess.Popen([sys.executable, str(script), url, str(tmp_path / name), host,
                                 str(trials), "hold" if hold else "end"], text=True,
                                stdout=subprocess.PIPE, stderr=err)


def _what_writers_said(directory: Path) -> dict[str, str]:
    """The end of each writer's stderr."""
    return {f.name: f.read_text(errors="replace")[-800:] for f in sorted(directory.glob("*.err"))}


def start(flag: Path, procs: list[subprocess.Popen[str]], timeout: float = 60) -> None:
    """Once every writer has made its run, let them all write."""
    deadline = time.monotonic() + timeout
    while len(list(flag.parent.glob(f"{flag.name}.*.ready"))) < len(procs):
        # what each writer got to: its "started" mark, its stderr
        assert all(p.poll() is None for p in procs), (
            f"a writer died early: exit {[p.returncode for p in procs]}, pids "
            f"{[p.pid for p in procs]}, files {sorted(f.name for f in flag.parent.iterdir())}, "
            f"stderr {_what_writers_said(flag.parent)}")
        assert time.monotonic() < deadline, "the writers never got ready"
        time.sleep(0.02)
    flag.write_text("")


@pytest.mark.slow
def test_writers_of_two_hosts_at_once(pg_url: str, tmp_path: Path) -> None:
    """Two processes of this host and one of another write runs at the same moment: every run
    has exactly its trials and samples."""
    procs = [writer(tmp_path, pg_url, "go", host, 40) for host in ("", "", "host-b")]
    try:
        start(tmp_path / "go", procs)
        for p in procs:
            p.wait(timeout=120)
            assert p.returncode == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    with Store(pg_url, readonly=True) as store:
        runs = store.list_runs()
        loaded = [store.load_run(r.id) for r in runs]
    assert sorted(r.hostname for r in runs) == sorted([this_process().host] * 2 + ["host-b"])
    for run in loaded:
        assert run.status == "complete"
        assert [t.sample_index for t in run.trials] == list(range(40))
        assert all([s.iops for s in t.samples] == [10 + t.sample_index, 5] for t in run.trials)
    listed = cli_result("runs", "--db", pg_url, "--host", "host-b").stdout
    assert len(listed.splitlines()) == 2 and "host-b" in listed.splitlines()[1]
    assert cli_result("runs", "--db", pg_url, "--target", "/srv/host-b").stdout == listed


@pytest.mark.slow
def test_another_hosts_live_run_is_never_taken_over(pg_url: str, tmp_path: Path) -> None:
    """The owner's session lock says, to any host, that it lives; once its process is killed
    the server drops the lock and the run can be resumed from here. What it made on its own
    host is never touched from this one."""
    proc = writer(tmp_path, pg_url, "go", "host-b", 2, hold=True)
    try:
        start(tmp_path / "go", [proc])
        assert proc.stdout is not None and proc.stdout.readline() == "holding\n"
        with Store(pg_url) as store:
            me = store.register_process(this_process(), "")
            with pytest.raises(RunBusy, match=r"^run 1 is being measured by pid \d+ on host "
                                              r"host-b since [^()]*$"):
                store.claim_run(1, me)
            listing = cli_result("runs", "--db", pg_url).stdout
            assert "running" in listing and "process gone" not in listing
            dry = cli_result("clean", "--db", pg_url, "--dry-run").stdout
            assert "made on host host-b: `iomatrix clean` there removes it" in dry
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
            owner = store.owner(1)
            assert owner is not None
            deadline = time.monotonic() + 30
            while store.alive(owner)[0]:    # the server ends the dead client's session
                assert time.monotonic() < deadline, "the session lock outlived its process"
                time.sleep(0.05)
            assert store.alive(owner)[1] == "its database session (on host host-b) has ended"
            assert "stopped (process gone; --resume)" in cli_result("runs", "--db",
                                                                    pg_url).stdout
            previous = store.claim_run(1, me)
            assert previous is not None and previous.host == "host-b"
            store.finish_run(1, "interrupted")
            store.end_process(me)
            (left,) = [r for r in store.open_resources() if r.process.host == "host-b"]
            assert left.path == "/nonexistent/iomatrix-run-1"      # never settled from here
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


HOST_SUITE = """
[matrix]
[workloads]
rw = "randread"
bs = ["4k", "8k", "16k", "64k"]
iodepth = [1, 4]
[method]
mode = "host"
baseline = true
samples = 1
ramp = 0
runtime = "500ms"
"""


def terminate_run_session(backend: Backend) -> int:
    """End the server process of the run's connection (its application name is iomatrix; the
    test's own connections have none); how many were ended."""
    rows = backend.raw("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                       "application_name = 'iomatrix' AND datname = current_database()")
    return len(rows)


@pytest.mark.slow
def test_a_dropped_connection_ends_the_run_resumably(pg_url: str, tmp_path: Path,
                                                      no_leftovers: None) -> None:
    backend = Backend("postgresql", pg_url)
    suite = write_suite(tmp_path, HOST_SUITE, size="16MiB")
    proc = subprocess.Popen([*IOMATRIX, "run", str(suite), "--db", pg_url], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None and time.monotonic() < deadline
            counted = backend.raw("SELECT COUNT(*) FROM trials") if backend.raw(
                "SELECT to_regclass('trials') IS NOT NULL")[0][0] else [(0,)]
            if counted[0][0] >= 2:
                break
            time.sleep(0.1)
        assert terminate_run_session(backend) == 1
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == ExitStatus.STORE, err
    lines = err.strip().splitlines()
    assert lines[-2].startswith(f"iomatrix: {pg_url}: the connection to the database was lost (")
    assert lines[-1] == ("iomatrix: hint: what was stored before is kept whole; `iomatrix run "
                         "--resume RUN` measures the rest")
    # nothing half-written: every stored trial has its one sample (randread), no orphan sample
    with Store(pg_url, readonly=True) as store:
        run = store.load_run(1)
    assert run.status == "running" and 2 <= len(run.trials) < 8
    assert all(len(t.samples) == 1 and t.status == "ok" for t in run.trials)
    assert backend.raw("SELECT COUNT(*) FROM samples WHERE trial_id NOT IN "
                       "(SELECT id FROM trials)") == [(0,)]
    assert "stopped (process gone; --resume)" in cli_result("runs", "--db", pg_url).stdout
    before = {(t.config_key, t.workload_key): t.id for t in run.trials}
    done = subprocess.run([*IOMATRIX, "run", "--resume", "1", "--db", pg_url], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    with Store(pg_url, readonly=True) as store:
        run = store.load_run(1)
    assert run.status == "complete" and len(run.trials) == 8       # 1 config × 8 workloads
    after = {(t.config_key, t.workload_key): t.id for t in run.trials}
    assert all(after[k] == v for k, v in before.items())


def test_refusals_are_one_line_with_the_store_status(pg_url: str) -> None:
    password = "wrong-secret-4711"
    wrong = pg_url.replace("iomatrix@", f"iomatrix:{password}@")
    name = pg_url.split("@/")[1].split("?")[0]
    missing = pg_url.replace(f"/{name}?", "/no_such_db?")
    Store(pg_url).close()
    Backend("postgresql", pg_url).set_version(99)
    for url, why in ((wrong, 'password authentication failed for user "iomatrix"'),
                     (missing, 'database "no_such_db" does not exist'),
                     (pg_url, "schema version 99 is newer than this iomatrix understands")):
        for command in (["runs"], ["run", "quick", "--resume", "1"]):
            done = cli_result(*command, "--db", url)
            assert done.returncode == ExitStatus.STORE and done.stdout == ""
            said = [line for line in done.stderr.splitlines()
                    if not line.startswith("iomatrix: hint: ")]    # one line, and a hint
            assert len(said) == 1 and why in said[0], done.stderr
            assert password not in done.stderr
            assert done.stderr.startswith(f"iomatrix: {url.replace(f':{password}', '')}: ")


@pytest.mark.slow
def test_the_password_never_appears_in_output(pg_server: object, pg_url: str,
                                              tmp_path: Path, no_leftovers: None) -> None:
    password = pg_server.password                    # type: ignore[attr-defined]
    with_password = pg_url.replace("iomatrix@", f"iomatrix:{password}@")
    os.environ.pop("PGPASSFILE")                     # only the URL can let us in now
    try:
        suite = write_suite(tmp_path, HOST_SUITE.replace('bs = ["4k", "8k", "16k", "64k"]',
                                                         'bs = "4k"'), size="16MiB")
        done = [cli_result("run", str(suite), "--db", with_password, "--report", "r1",
                           cwd=tmp_path)]
        assert done[0].returncode == 0, done[0].stderr
        fio = ROOT / "tests/fixtures/fio/3.33"
        done.append(cli_result("import", str(fio), "--db", with_password))
        assert done[-1].returncode == 0, done[-1].stderr
        for command in (["runs"], ["show", "1"], ["show", "1", "--command"],
                        ["report", "1", "--out", str(tmp_path / "r2")],
                        ["export", "1"], ["export", "1", "--format", "json"],
                        ["compare", "1", "1"], ["findings", "1"], ["recommend", "1"],
                        ["clean", "--dry-run"], ["db", "copy", with_password,
                                                 str(tmp_path / "c.db")]):
            done.append(cli_result(*command, "--db", with_password)
                        if command[0] != "db" else cli_result(*command))
            assert done[-1].returncode != ExitStatus.ERROR, (command, done[-1].stderr)
        done.append(cli_result("show", "7", "--db", with_password))      # an error names it
        assert done[-1].returncode == ExitStatus.NOT_FOUND
    finally:
        os.environ.update(pg_server.env())            # type: ignore[attr-defined]
    texts = [d.stdout + d.stderr for d in done]
    texts += [p.read_text(errors="replace") for p in tmp_path.rglob("*") if p.is_file()]
    assert pg_url in done[0].stdout                  # named, without its password
    assert not [t[:200] for t in texts if password in t]


def rich_run(store: Store) -> int:
    """A run with everything a trial can hold, a retried failure among it."""
    run_id = new_run(store)
    series = host_series()
    cpu = CpuRecord(window_s=1.0, cpu_s_by_role={"daemon": 0.2}, exited_cpu_s=0.0, cpu_s=1 / 3,
                    voluntary_csw=10, involuntary_csw=1, ios=2**40, bytes=2**52,
                    cpu_us_per_io=3000.0, cpu_ms_per_mib=768.0, csw_per_io=0.11,
                    perf="perf is not installed")
    for k in range(3):
        per_vm = [sample("read", 1 / 7 + k).model_copy(update={"vm": v}) for v in range(2)]
        store.record_trial(run_id, trial(k, started_at=f"t{k}", samples=[
            sample("read", 1 / 3 + k), sample("write", 2.5e9 / 7)], vm_samples=per_vm,
            fio_json=json.dumps({"k": k, "x": "é"}), applied={"aio": "io_uring"},
            command="qsd ...", telemetry=series, cpu=cpu,
            steady=SteadyRecord(checked=False, reason="off")))
    store.record_trial(run_id, trial(3, "failed", started_at="t3", reason="boom"))
    store.record_trial(run_id, trial(3, started_at="t3b", samples=[sample("read", 9.75)]),
                       replace_failed=True)
    store.finish_run(run_id, "complete")
    return run_id


def table_rows(location: str, table: str) -> list[tuple[object, ...]]:
    """Run 1's rows of a table as stored, without the columns that are ids of that store."""
    with Store(location, readonly=True) as store:
        uuid = store.conn.execute("SELECT uuid FROM runs WHERE id = 1").fetchone()[0]
        where = ("uuid = ?" if table == "runs" else
                 "run_id = (SELECT id FROM runs WHERE uuid = ?)" if table != "samples" and
                 table != "vm_samples" else "trial_id IN (SELECT t.id FROM trials t JOIN runs r "
                 "ON r.id = t.run_id WHERE r.uuid = ?)")
        rows = store._dicts(f"SELECT * FROM {table} WHERE {where}", (uuid,))  # noqa: SLF001
    keys = ("id", "run_id", "configuration_id", "workload_id", "trial_id", "owner_id",
            "suite_author")
    return sorted((tuple((k, bytes(v) if isinstance(v, memoryview) else v)
                         for k, v in sorted(r.items()) if k not in keys) for r in rows),
                  key=repr)


def _suite_author(location: str) -> object:
    """Run 1's ``runs.suite_author`` as stored (who could have written its suite)."""
    with Store(location, readonly=True) as store:
        return store.conn.execute("SELECT suite_author FROM runs WHERE id = 1").fetchone()[0]


@pytest.mark.slow
def test_db_copy_round_trips_every_sample(pg_url: str, tmp_path: Path) -> None:
    first, last = tmp_path / "a.db", tmp_path / "b.db"
    with Store(first) as store:
        rich_run(store)
        running = new_run(store)                 # being measured: not copied
    there = cli_result("db", "copy", str(first), pg_url)
    assert there.returncode == 0, there.stderr
    assert there.stdout == (f"run 1: copied as run 1 of {pg_url} (4 trials)\n"
                            f"run {running}: skipped: it is still being measured, or was "
                            "killed: resume it, or let it end, then copy\n")
    back = cli_result("db", "copy", pg_url, str(last))
    assert back.stdout == f"run 1: copied as run 1 of {last} (4 trials)\n"
    for table in ("runs", "configurations", "workloads", "trials", "samples", "vm_samples",
                  "trial_history"):             # every stored value, byte for byte
        rows = table_rows(str(first), table)
        assert rows and rows == table_rows(str(last), table) == table_rows(pg_url, table)
    # but who could have written the suite: anyone, once it was in the shared store
    assert [_suite_author(where) for where in (str(first), pg_url, str(last))] == [None, None, -1]
    with Store(first, readonly=True) as a, Store(last, readonly=True) as b:
        one, two = a.load_run(1), b.load_run(1)
        assert two.suite.author == -1
        two = two.model_copy(update={"suite": two.suite.model_copy(update={"author": None})})
        assert one == two                        # every sample, note, figure and setting
        assert [a.fio_json(t.id) for t in one.trials] == [b.fio_json(t.id) for t in two.trials]
        assert [a.telemetry(t.id) for t in one.trials] == [b.telemetry(t.id) for t in two.trials]
        assert a.trial_history(1) == b.trial_history(1) and len(a.trial_history(1)) == 1
    # again: nothing is added; a trial measured since at the source is
    again = cli_result("db", "copy", str(first), pg_url, "--run", "1")
    assert again.stdout == f"run 1: already run 1 of {pg_url} (nothing new)\n"
    with Store(first) as store:
        store.reopen_run(1)
        store.record_trial(1, trial(4, started_at="t4", samples=[sample("read", 4.5)]))
        store.finish_run(1, "complete")
    more = cli_result("db", "copy", str(first), pg_url, "--run", "1")
    assert more.stdout == f"run 1: run 1 of {pg_url} updated (1 new trials)\n"
    with Store(pg_url, readonly=True) as store:
        assert [r.id for r in store.list_runs()] == [1]
        assert len(store.load_run(1).trials) == 5


@pytest.mark.slow
def test_readonly_session_refuses_writes(pg_url: str) -> None:
    with Store(pg_url) as store:
        new_run(store)
    with Store(pg_url, readonly=True) as store:
        with pytest.raises(StoreError, match="opened read-only"):
            new_run(store)
        with pytest.raises(Exception, match="read-only transaction"):
            store.conn.execute("DELETE FROM runs")
        assert len(store.list_runs()) == 1


@pytest.mark.slow
def test_an_empty_database_is_not_read_but_is_written(pg_url: str) -> None:
    with pytest.raises(StoreError, match=r"not an iomatrix results database \(it is empty\)"):
        Store(pg_url, readonly=True)
    assert cli_result("runs", "--db", pg_url).returncode == ExitStatus.STORE
    with Store(pg_url) as store:
        assert store.version == store.stored_version
        assert store.list_runs() == []


@pytest.mark.parametrize(("given", "expected"), [
    ("postgresql://u:p%40ss@h:5432/db?password=x&sslmode=require",
     "postgresql://u@h:5432/db?sslmode=require"),
    ("postgresql://:pw@/db?host=/run/postgresql", "postgresql:///db?host=/run/postgresql"),
    ("postgresql:///db?host=/run/postgresql", "postgresql:///db?host=/run/postgresql"),
    ("postgres://u:pw@h1,h2/db", "postgres://u@h1,h2/db"),
    ("postgresql://u:pw@h:badport/db", "postgresql://u@h:badport/db"),
    ("r.db", "r.db"),
])
def test_a_url_is_shown_without_its_password(given: str, expected: str) -> None:
    assert shown(given) == expected
    assert "pw" not in repr(parse_location(given))


@pytest.mark.slow
def test_a_role_that_may_not_create_tables_is_refused_in_one_line(pg_server: object,
                                                                   pg_url: str) -> None:
    role = f"r{os.getpid()}"
    pg_server.admin(f"CREATE ROLE {role} LOGIN PASSWORD 'pw-{role}'")  # type: ignore[attr-defined]
    try:
        url = pg_url.replace("iomatrix@", f"{role}:pw-{role}@")
        done = cli_result("import", str(ROOT / "tests/fixtures/fio/3.33"), "--db", url)
    finally:
        pg_server.admin(f"DROP OWNED BY {role}; DROP ROLE {role}",  # type: ignore[attr-defined]
                        dbname=pg_url.split("@/")[1].split("?")[0])
    assert done.returncode == ExitStatus.STORE
    assert done.stderr == (f"iomatrix: {pg_url.replace('iomatrix@', f'{role}@')}: permission "
                           "denied for schema public\n")
