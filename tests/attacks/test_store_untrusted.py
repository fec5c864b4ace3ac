"""The store is untrusted input (issue 31 item 5, F7, F10): a database another user crafted, or
a row anyone with a shared PostgreSQL store's role wrote, is read back into the types iomatrix
wrote; a value that does not fit stops every command that reads it in one line,
``database damaged: TABLE.COLUMN row N: why``, with exit status 8, never a traceback. A
malformed PostgreSQL URL is one line that never shows its password.

The crafted databases are written by a real unprivileged user (``attacker``) and handed to root,
who copies them into a directory of its own (as ``iomatrix`` asks of a database another user
owns) and runs the real commands on them. A stored suite is loaded again from its text and
checked on ``run --resume`` as a fresh run's is. The fuzz at the end gives every store column
every kind of value, and ``runs`` and ``db copy`` malformed URLs, counting cases and tracebacks
for ``bench/attacks.py``."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import sqlite3
import subprocess
import tempfile
import traceback
import zlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from iomatrix.cli.status import ExitStatus
from iomatrix.core.errors import DamagedStore
from iomatrix.core.owner import this_process
from iomatrix.store import Store
from iomatrix.store.records import CpuRecord, PilotTrial, SteadyRecord, StoredSuite
from iomatrix.store.rows import COLUMNS, StoredPlan
from iomatrix.suite.configuration import Configuration
from iomatrix.telemetry.steady import SteadyState
from tests.conftest import ATTACKS, Attack, Backend, Fuzzed, User, as_user, cli_result
from tests.needs import needs
from tests.attacks.test_attacks_fuzz import fuzz_count
from tests.store.test_store import CONFIG, WORKLOAD, host_series, sample, trial
from tests.attacks.test_untrusted_inputs import DOCUMENTED, one_line

CACHED = Configuration(mode="blocklayer", aio="threads", iothread=False, cache="writeback",
                       format="raw", preallocation="off")
"""A configuration through the page cache: loading its run reads its trials' telemetry."""
NODE = {"host": "192.0.2.7", "name": "node1", "user": "root", "port": 22, "identity": None,
        "known_hosts": None, "host_key_alias": None, "ssh_config": None, "command": "iomatrix"}
PLAN = {"pilot_seconds": 12.5, "noise": [{"mode": "blocklayer", "within": 0.01, "df": 3}],
        "choice": {"runtime": 5.0, "rounds": 4, "seconds": 100.0, "half_width": 0.02,
                   "target": 0.03, "optimum": None, "reached": True}}


def rich_run(store: Store) -> int:
    """An interrupted cluster run holding a value in every JSON column of the schema."""
    steady = SteadyRecord(checked=True, source="fio status stream", verdict=SteadyState(
        reached=True, at_seconds=6.0, windows=2, range_ratio=0.1, excursion_ratio=0.05,
        rule="SNIA PTS"))
    cpu = CpuRecord(window_s=1.0, cpu_s_by_role={"daemon": 0.2}, exited_cpu_s=0.0, cpu_s=0.2,
                    voluntary_csw=10, involuntary_csw=1, ios=100, bytes=409600,
                    cpu_us_per_io=2000.0, cpu_ms_per_mib=512.0, csw_per_io=0.11, perf="off")
    run_id = store.create_run(
        suite=StoredSuite(name="t", source="t.toml", text="[suite]\nname = \"t\"\n"),
        host={"hostname": "h", "target": "/var/tmp/t", "target_fs": "ext4", "nodes": "node1"},
        accelerator="none", notes=["a note"], configs=[CONFIG, CACHED], workloads=[WORKLOAD])
    for config in (CONFIG, CACHED):
        store.record_trial(run_id, trial(0).model_copy(update={
            "config_key": config.key, "samples": (sample("read", 100), sample("write", 50)),
            "fio_json": '{"x": 1}', "applied": {"fmt0.cache.direct": "on"}, "command": "qsd",
            "steady": steady, "cpu": cpu, "telemetry": host_series()}))
    store.record_trial(run_id, trial(1, "failed", reason="boom"))
    store.record_trial(run_id, trial(1, started_at="t1", samples=(sample("read", 9),)),
                       replace_failed=True)
    store.add_nodes(run_id, [("node1", NODE, {"hostname": "n1", "kernel": "6.1"})])
    store.record_pilot(run_id, [PilotTrial(mode="blocklayer", config_key=CONFIG.key,
                                           workload_key=WORKLOAD.key, round=0, runtime_s=1.0,
                                           iops=5.0, wall_s=2.0)], StoredPlan.model_validate(PLAN))
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead = store.register_process(this_process()._replace(pid=gone.pid), "")
    store.add_resource(dead, "scratch", "/tmp/iomatrix-run-x", "/tmp", run_id=run_id)
    store.finish_run(run_id, "interrupted")
    return run_id


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The database of ``rich_run``, as root made it."""
    db = tmp_path_factory.mktemp("made") / "r.db"
    with Store(db) as store:
        rich_run(store)
    return db


# -- what a crafted value looks like, column by column -----------------------------------------

LOADED = [c for c in COLUMNS if c[0] not in ("trial_history", "trial_plans")]
"""The JSON columns every command that loads a run reads (trial_history and trial_plans are
read by a resumed run's measuring: tested below through the store)."""
KEYS = {"runs": "id", "configurations": "id", "workloads": "id", "trials": "id",
        "trial_history": "id", "trial_plans": "run_id", "run_nodes": "position"}
VALID = {("runs", "host_json"): {"hostname": "h"}, ("runs", "notes_json"): ["a"],
         ("configurations", "params_json"): {"cache": "none"},
         ("workloads", "options_json"): {"rwmixread": "70"},
         ("trials", "applied_json"): {"aio": "native"},
         ("trials", "steady_json"): {"checked": False, "reason": "off"},
         ("trials", "cpu_json"): {}, ("trials", "telemetry_json"): {},
         ("trials", "stall_json"): {}, ("trials", "depth_json"): {},
         ("trials", "logs_json"): {"workload_lat.1.log": "250, 81000, 0, 0, 0\n"},
         ("run_nodes", "node_json"): NODE, ("run_nodes", "host_json"): {"hostname": "n1"},
         ("runs", "spec_json"): {"version": 1, "tables": {"suite": {"name": "t"},
                                                          "target": {"directory": "/tmp/t"}}}}


def damages(table: str, column: str) -> dict[str, tuple[str, str]]:
    """Three values iomatrix never writes into ``table.column``, each with what the refusal
    says of it: not JSON, JSON of the wrong type, and a value iomatrix writes there with a key
    it does not write (a control character in a QEMU property's name; an element that is no
    text among the notes)."""
    valid = VALID[table, column]
    said = "unknown key"
    if isinstance(valid, list):
        extra, said = [*valid, {"k": 1}], "1: Input should be a valid string"
    elif column == "logs_json":      # a log's name is a pattern: fio's names for iomatrix's
        extra, said = {**valid, "../evil": "x"}, "bad key '../evil'"
    elif column != "applied_json":
        extra = {**valid, "proxy_command" if column == "node_json" else "evil": "x"}
    else:
        extra, said = {**valid, "aio\u001b[2J": "x"}, "bad key 'aio\\x1b[2J'"
    return {"bad JSON": ('{"hostname": "h",', "not JSON (JSONDecodeError)"),
            "wrong type": ("7", "Input should be a valid dictionary") if isinstance(valid, dict)
            else ('{"a": 1}', "Input should be a valid tuple"),
            "unknown key": (json.dumps(extra), said)}


CRAFT = r'''
import json, shutil, sqlite3, sys
base, edits = sys.argv[1], json.loads(sys.argv[2])
for name, statement in edits.items():
    shutil.copy(base, name)
    c = sqlite3.connect(name)
    c.execute(statement[0], [bytes.fromhex(p["hex"]) if isinstance(p, dict) else p
                             for p in statement[1]])
    c.commit()
    c.close()
'''


@pytest.fixture
def theirs(attacker: User) -> Iterator[Path]:
    """A directory the attacker owns, in one root and the attacker both reach."""
    area = Path(tempfile.mkdtemp(prefix="iomatrix-store-", dir="/var/tmp"))
    try:
        area.chmod(0o755)
        (area / "theirs").mkdir()
        os.chown(area / "theirs", attacker.uid, attacker.gid)
        yield area / "theirs"
    finally:
        shutil.rmtree(area, ignore_errors=True)


def crafted(user: User, made: Path, theirs: Path, into: Path,
            edits: dict[str, tuple[str, list[object]]]) -> dict[str, Path]:
    """Copies of ``made`` that ``user`` edits (name → an UPDATE and its parameters), each
    handed back to root, who copies it into ``into`` (its own directory)."""
    base = theirs / "given.db"
    shutil.copy(made, base)
    shutil.chown(base, user.uid, user.gid)
    named = {name: str(theirs / f"{i}.db") for i, name in enumerate(edits)}
    given = {named[n]: (s, [{"hex": p.hex()} if isinstance(p, bytes) else p for p in params])
             for n, (s, params) in edits.items()}
    edit = as_user(user, CRAFT, str(base), json.dumps(given))
    _, err = edit.communicate(timeout=120)
    assert edit.returncode == 0, err
    copies = {}
    for name, path in named.items():
        copies[name] = into / Path(path).name
        shutil.copyfile(path, copies[name])
    return copies


def commands(out: Path) -> dict[str, list[str]]:
    """Every command that loads a run, as its test runs it."""
    return {"show": ["show", "1"], "compare": ["compare", "1", "1"],
            "report": ["report", "1", "--out", str(out)], "export": ["export", "1"],
            "export json": ["export", "1", "--format", "json"],
            "run --resume": ["run", "--resume", "1"]}


def assert_damaged(done: subprocess.CompletedProcess[str], table: str, column: str) -> str:
    line = one_line(done, ExitStatus.STORE)
    assert line.startswith(f"iomatrix: database damaged: {table}.{column} row "), line
    assert done.stdout == "", done.stdout
    return line


@ATTACKS
@pytest.mark.parametrize(("table", "column"), LOADED, ids=[f"{t}.{c}" for t, c in LOADED])
def test_a_crafted_json_column_is_one_line_for_every_command(
        made: Path, theirs: Path, tmp_path: Path, attacker: User, attack: Attack,
        table: str, column: str) -> None:
    """Bad JSON, JSON of the wrong type, or an unknown key in ``table.column`` of a database
    the attacker crafted: show, compare, report, export (CSV and JSON) and run --resume each
    refuse in one line naming the column and the row, exit status 8; runs too, for the two
    columns it reads."""
    attack(f"F10 / issue 31.5: a crafted {table}.{column} (show, compare, report, export, "
           "run --resume)", "refused")
    key = KEYS[table]
    cases = damages(table, column)
    # the first row; of telemetry, the CACHED trial's (2), the one loading the run reads
    first = "2" if column == "telemetry_json" else f"(SELECT MIN({key}) FROM {table})"
    edits = {what: (f"UPDATE {table} SET {column} = ? WHERE {key} = {first}", [value])
             for what, (value, _) in cases.items()}
    for what, db in crafted(attacker, made, theirs, tmp_path, edits).items():
        runs = ["runs"] if column == "host_json" else []
        for name, argv in {**commands(tmp_path / "report"), **dict.fromkeys(runs, runs)}.items():
            done = cli_result(*argv, "--db", str(db), cwd=tmp_path)
            line = assert_damaged(done, table, column)
            assert cases[what][1] in line, (what, name, line)
        assert not (tmp_path / "report").exists()


@ATTACKS
def test_a_crafted_column_that_is_not_json_text_or_a_crafted_table_is_one_line(
        made: Path, theirs: Path, tmp_path: Path, attacker: User, attack: Attack) -> None:
    """Values of another type than text in a JSON column (SQLite keeps any type in any
    column), a non-numeric key, and a table of another shape (a column dropped): one line,
    exit status 8, for the commands that read them."""
    attack("F10: a crafted database's column types and table shapes (runs, show)", "refused")
    edits = {"blob": ("UPDATE runs SET host_json = ?", [b"\x00\xff"]),
             "number": ("UPDATE trials SET cpu_json = 7 WHERE id = ?", [1]),
             "text id": ("UPDATE samples SET iops = 'many' WHERE trial_id = ?", [1]),
             "no column": ("ALTER TABLE runs DROP COLUMN notes_json", [])}
    copies = crafted(attacker, made, theirs, tmp_path, edits)
    expected = {"blob": "runs.host_json row 1: not JSON", "number": "trials.cpu_json row 1: "
                "Input should be a valid dictionary", "text id": "samples.iops row of trial 1:",
                "no column": "no such column: notes_json"}
    for what, db in copies.items():
        for argv in (["show", "1"], ["runs"]) if what == "blob" else (["show", "1"],):
            line = one_line(cli_result(*argv, "--db", str(db)), ExitStatus.STORE)
            assert line.startswith("iomatrix: database damaged: ") and expected[what] in line, \
                (what, line)


@ATTACKS
def test_a_crafted_resource_is_one_line_for_clean(
        made: Path, theirs: Path, tmp_path: Path, attacker: User, attack: Attack) -> None:
    """resources.within and kind of a database the attacker crafted: a directory's within
    that is no absolute path, a kind iomatrix never records, an RBD image's connection that is
    not JSON, has a key a connection does not have, or is no object: ``clean`` (and its
    --dry-run) refuses in one line before it looks at anything."""
    attack("F4 / issue 31.5: a crafted resources row (clean)", "refused")
    rbd = "UPDATE resources SET kind = 'rbd-image', within = ?"
    edits = {"relative": ("UPDATE resources SET within = ?", ["tmp"]),
             "kind": ("UPDATE resources SET kind = 'home-dir'", []),
             "rbd not JSON": (rbd, ['{"pool": ']),
             "rbd unknown key": (rbd, [json.dumps({"pool": "rbd", "monitors": ["h"],
                                                   "log_file": "/etc/ld.so.preload"})]),
             "rbd list": (rbd, ['["rbd"]'])}
    why = {"relative": "resources.within row 1: not an absolute path",
           "kind": "resources.kind row 1: not one of scratch, workspace, parent, rbd-image",
           "rbd not JSON": "resources.within row 1: ", "rbd list": "resources.within row 1: ",
           "rbd unknown key": "resources.within row 1: unknown key 'log_file'"}
    for what, db in crafted(attacker, made, theirs, tmp_path, edits).items():
        for dry in (["--dry-run"], []):
            line = one_line(cli_result("clean", *dry, "--db", str(db)), ExitStatus.STORE)
            assert line.startswith(f"iomatrix: database damaged: {why[what]}"), (what, line)


RBD_SUITE = """
[suite]
name = "rbd"
[target]
rbd = {{ pool = "rbd", conf = "{conf}", connect_timeout = 3 }}
size = "16MiB"
[workloads]
rw = "randread"
bs = "4k"
[method]
mode = "host"
runtime = "1s"
ramp = 0
samples = 1
"""


@ATTACKS
@needs("rbd")
def test_a_stored_suite_is_checked_on_resume_as_on_a_fresh_run(
        theirs: Path, tmp_path: Path, attacker: User, attack: Attack) -> None:
    """A stored run's suite is its spec (and its text), loaded again: the attacker turns the
    [target] rbd conf of an interrupted run into their own ceph.conf (log_file naming a file
    root would create), in both. ``run --resume`` refuses it in the very line a fresh run of
    that suite gets (exit status 3), before rbd starts: the canary is never made."""
    attack("F4 / issue 31.5: a stored suite's [target] rbd conf (run --resume)", "refused")
    from iomatrix.measure.prepare import prepare
    from iomatrix.suite.load import load_suite_text

    canary = theirs.parent / "canary"
    ours = theirs.parent / "ceph.conf"
    ours.write_text("[global]\nmon_host = 192.0.2.1\n")
    evil = theirs / "ceph.conf"
    evil.write_text(f"[global]\nmon_host = 192.0.2.1\nlog_file = {canary}\n")
    os.chown(evil, attacker.uid, attacker.gid)
    made = tmp_path / "made.db"
    suite = load_suite_text(RBD_SUITE.format(conf=ours), source=str(tmp_path / "s.toml"))
    expansion = prepare(suite).expansion
    with Store(made) as store:
        run_id = store.create_run(suite=StoredSuite.of(suite), host={"hostname": "h"},
                                  accelerator="none", notes=[], workloads=expansion.workloads,
                                  configs=expansion.configurations)
        store.finish_run(run_id, "interrupted")
    db = crafted(attacker, made, theirs, tmp_path, {"conf": (
        "UPDATE runs SET suite_text = replace(suite_text, ?, ?), "
        "spec_json = replace(spec_json, ?, ?)", [str(ours), str(evil)] * 2)})
    fresh = tmp_path / "fresh.toml"
    fresh.write_text(RBD_SUITE.format(conf=evil))
    said = [one_line(cli_result("run", *argv, "--db", str(tmp_path / name)),
                     ExitStatus.SUITE_INVALID)
            for argv, name in ((["--resume", "1"], db["conf"].name), ([str(fresh)], "new.db"))]
    assert said[0] == said[1] == (
        f"iomatrix: [target] rbd conf: {theirs} is owned by {attacker.name} (uid "
        f"{attacker.uid}), not root: another user could choose what librados reads there"), said
    assert not canary.exists()


# -- the columns only a resumed run's measuring reads, through the store -----------------------

@pytest.mark.slow
@pytest.mark.parametrize(("statement", "read", "expected"), [
    ("UPDATE trial_history SET trial_json = '{\"id\": 1}'", "history",
     "trial_history.trial_json row 1: "),
    ("UPDATE trial_history SET trial_json = '[]'", "history", "trial_history.trial_json row 1: "),
    ("UPDATE trial_plans SET plan_json = '{\"pilot_seconds\": 1, \"exec\": 1}'", "pilot",
     "trial_plans.plan_json row 1: unknown key 'exec'"),
    ("UPDATE trial_plans SET plan_json = '{\"pilot_seconds\": 1, \"choice\": {\"runtime\": 5, "
     "\"rounds\": 0, \"seconds\": 0, \"half_width\": 0, \"target\": 0, \"optimum\": null, "
     "\"reached\": true}}'", "pilot", "trial_plans.plan_json row 1: choice.rounds: "),
    ("UPDATE trial_plans SET plan_json = 'nope'", "pilot", "trial_plans.plan_json row 1: not JSON"),
    ("UPDATE pilot_trials SET runtime_s = 'x'", "pilot", "pilot_trials.runtime_s row 1: "),
    ("UPDATE trials SET fio_json = ? WHERE id = 1", "fio", "trials.fio_json row 1: more than "),
    ("UPDATE trials SET fio_json = ? WHERE id = 1", "fio", "trials.fio_json row 1: not "),
    ("UPDATE trials SET telemetry_json = '{\"t\": 1}' WHERE id = 1", "telemetry",
     "trials.telemetry_json row 1: "),
], ids=["history-type", "history-list", "plan-key", "plan-rounds", "plan-json", "pilot-type",
        "fio-bomb", "fio-garbage", "telemetry"])
def test_the_columns_a_resumed_run_reads_are_typed(backend: Backend, statement: str, read: str,
                                                   expected: str) -> None:
    """trial_history, trial_plans, pilot_trials, fio's compressed output and a trial's
    telemetry, as a resumed run's measuring (and a copy) read them: ``DamagedStore`` in one
    line; a blob that would decompress to gigabytes is refused at the bound, not inflated."""
    if backend.kind == "postgresql" and "'x'" in statement:
        pytest.skip("PostgreSQL keeps a column's type: a REAL holds no text")
    with Store(backend.location) as store:
        run_id = rich_run(store)
    # 300 MiB of zeros in 300 KiB; or no zlib stream at all
    blob = zlib.compress(bytes(300 << 20), 9) if "more than" in expected else b"\x00\xff"
    backend.raw(statement, (blob,) if "?" in statement else ())
    with Store(backend.location) as store, pytest.raises(DamagedStore) as caught:
        {"history": lambda: store.trial_history(run_id), "pilot": lambda: store.load_pilot(run_id),
         "fio": lambda: store.fio_json(1), "telemetry": lambda: store.telemetry(1)}[read]()
    assert str(caught.value).startswith(f"database damaged: {expected}"), str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_valid_run_reads_back_whole(backend: Backend) -> None:
    """What the typed reading accepts: every column of a run iomatrix wrote."""
    with Store(backend.location) as store:
        run_id = rich_run(store)
        run = store.load_run(run_id)
        assert run.host["nodes"] == "node1" and run.nodes[0].node == NODE
        assert run.trials[0].steady is not None and run.trials[0].steady.reached
        assert store.load_pilot(run_id)[1].model_dump(mode="json") == {**PLAN, "choice": {
            **PLAN["choice"], "fixed_runtime": False, "fixed_rounds": False}}
        assert len(store.trial_history(run_id)) == 1 and store.fio_json(1) == '{"x": 1}'
        assert store.open_resources()[0].within == "/tmp"


def test_a_damaged_run_is_not_copied(tmp_path: Path, pg_url: str) -> None:
    """``db copy`` reads what it copies as the store reads it: a damaged row is not spread
    into the shared store (nothing of the run is copied)."""
    source = tmp_path / "s.db"
    with Store(source) as store:
        rich_run(store)
        store.conn.execute("UPDATE run_nodes SET node_json = '{\"host\": \"h\", \"x\": 1}'")
    done = cli_result("db", "copy", str(source), pg_url)
    line = one_line(done, ExitStatus.STORE)
    assert line == "iomatrix: database damaged: run_nodes.node_json row 0 of run 1: unknown key 'x'"
    assert Backend("postgresql", pg_url).raw("SELECT COUNT(*) FROM runs") == [(0,)]


@pytest.mark.parametrize(("table", "column", "value"), [
    ("run_nodes", "node_json", '{"host": "h", "ssh_config": "/tmp/evil", "proxy": "x"}'),
    ("runs", "host_json", '{"hostname": ["h"]}'),
    ("trials", "steady_json", '{"checked": true, "reached": "yes"}')])
def test_a_row_of_the_shared_store_is_typed(pg_url: str, tmp_path: Path, table: str,
                                            column: str, value: str) -> None:
    """A row anyone with the shared PostgreSQL store's role wrote: the same one line, exit
    status 8, for every command that reads it."""
    with Store(pg_url) as store:
        rich_run(store)
    Backend("postgresql", pg_url).raw(f"UPDATE {table} SET {column} = ?", (value,))
    argvs = [*commands(tmp_path / "report").values(), *([["runs"]] if column == "host_json"
                                                          else [])]
    for argv in argvs:
        assert_damaged(cli_result(*argv, "--db", pg_url, cwd=tmp_path), table, column)


def test_a_shared_store_table_of_another_shape_is_one_line(pg_url: str) -> None:
    """A table someone with the role changed (a column dropped): one line, exit status 8."""
    with Store(pg_url) as store:
        rich_run(store)
    Backend("postgresql", pg_url).raw("ALTER TABLE runs DROP COLUMN notes_json")
    line = one_line(cli_result("show", "1", "--db", pg_url), ExitStatus.STORE)
    assert line == (f"iomatrix: database damaged: {pg_url}: column \"notes_json\" does not "
                    "exist"), line


# -- F7: a malformed PostgreSQL URL ------------------------------------------------------------

PASSWORD = "Pw-7f3kQ"
MALFORMED = [
    f"postgresql://u:{PASSWORD}@[::1/db",                       # the issue's
    f"postgresql://u:{PASSWORD}@[::1]:5432:5/db",
    f"postgresql://u:{PASSWORD}@localhost:99999/db",
    f"postgresql://u:{PASSWORD}@localhost:port/db",
    f"postgresql://u:{PASSWORD}@localhost/db?bogus=1",
    f"postgresql://u:{PASSWORD}@localhost/db?sslmode=sometimes",
    f"postgresql://u:{PASSWORD}@localhost/db?port=1&port=abc",
    f"postgresql://u:{PASSWORD}%zz@localhost/db",
    f"postgresql://u:{PASSWORD}/x@localhost/db",
    f"postgresql://u:{PASSWORD}?x@localhost/db",
    f"postgresql://u:{PASSWORD}@local host/db",
    f"postgresql://u@localhost/db?password={PASSWORD}%zz",
    f"postgresql://u@localhost/db?Password={PASSWORD}&bogus",
    f"postgres://u:{PASSWORD}@@[/db?password={PASSWORD}",
]


@pytest.mark.parametrize("url", MALFORMED)
def test_a_malformed_postgresql_url_is_one_line_without_its_password(url: str,
                                                                     tmp_path: Path) -> None:
    """F7: each command that opens a store, and ``db copy`` either way: one line (exit status
    8), no traceback, and never the password, on stdout or stderr."""
    for argv in (["runs", "--db", url], ["show", "1", "--db", url],
                 ["run", "--resume", "1", "--db", url],
                 ["db", "copy", url, str(tmp_path / "c.db")],
                 ["db", "copy", str(tmp_path / "c.db"), url]):
        if argv[:2] == ["db", "copy"] and argv[2] != url:
            with Store(tmp_path / "c.db"):
                pass
        done = cli_result(*argv)
        assert PASSWORD not in done.stdout + done.stderr, (argv, done.stderr)
        line = one_line(done, ExitStatus.STORE)
        assert line.startswith("iomatrix: postgres"), line


# -- fuzz (issue 31 item 7): every store column, every PostgreSQL URL shape ---------------------

FUZZ: dict[str, str | bytes] = {
    "not JSON": "{", "empty": "", "NUL": '"a\\u0000b"', "raw NUL": "a\0b",
    "huge": '"' + "a" * (1 << 20) + '"', "many keys": json.dumps({f"k{i}": "v" for i in range(5000)}),
    "non-UTF-8": b"\xff\xfe{", "ESC": '"a\\u001b[2Jb"', "int": "7", "beyond 64 bits": "9" * 40,
    "float": "1.5", "NaN": "NaN", "Infinity": "-Infinity", "bool": "true", "null": "null",
    "string": '"x"', "list": "[]", "list of strings": '["a", "b"]', "object": "{}",
    "unknown key": '{"zz": 1}', "deep": "[" * 100_000 + "]" * 100_000,
    "deep object": '{"a":' * 50_000 + "1" + "}" * 50_000,
    "key with ESC": '{"a\\u001bb": "x"}', "wrong-typed values": json.dumps(
        {"hostname": 1, "host": [], "checked": "x", "pool": 5, "interval_s": "x", "id": "x"}),
}
"""What a crafted column holds, by kind (text, or bytes SQLite keeps as a blob)."""
READERS: dict[tuple[str, str], list[list[str]]] = {
    **{c: [["show", "1"]] for c in LOADED}, ("runs", "host_json"): [["runs"], ["show", "1"]],
    ("run_nodes", "host_json"): [["runs"], ["show", "1"]],
    ("resources", "within"): [["clean", "--dry-run"]], ("resources", "kind"): [["clean", "--dry-run"]],
    ("trial_history", "trial_json"): [], ("trial_history", "telemetry_json"): [],
    ("trial_plans", "plan_json"): []}
"""The commands that read each column; the columns only a measuring run reads are read through
the store (``Store.trial_history``, ``Store.load_pilot``)."""


@pytest.mark.slow
def test_every_store_column_takes_any_value_or_refuses_it_in_one_line(
        made: Path, tmp_path: Path, fuzzed: Fuzzed) -> None:
    """Each JSON column (and resources' kind and within) given each ``FUZZ`` value in every
    row: each command that reads it prints its result or one line with a documented status,
    the store's readers return or raise iomatrix's error; no traceback."""
    from iomatrix.core.errors import IomatrixError

    assert set(READERS) == {*COLUMNS, ("resources", "within"), ("resources", "kind")}
    cases, failures = 0, []
    for (table, column), argvs in READERS.items():
        for what, value in FUZZ.items():
            db = tmp_path / "f.db"
            shutil.copyfile(made, db)
            conn = sqlite3.connect(db)
            conn.execute("PRAGMA ignore_check_constraints = ON")     # a crafted file has none
            conn.execute(f"UPDATE {table} SET {column} = ?", (value,))
            conn.commit()
            conn.close()
            for argv in argvs or [[]]:
                cases += 1
                try:
                    if argv:
                        done = cli_result(*argv, "--db", str(db))
                        assert done.returncode in DOCUMENTED - {ExitStatus.ERROR}, done
                        assert done.returncode == 0 or len(
                            [s for s in done.stderr.splitlines() if "hint:" not in s]) == 1, done
                        continue
                    with Store(db, readonly=True) as store:
                        store.trial_history(1), store.load_pilot(1)
                except IomatrixError:
                    pass
                except Exception:                          # noqa: BLE001: counted, then failed
                    failures.append(f"{table}.{column} = {what} ({argv}): "
                                    + traceback.format_exc()[-600:])
    fuzz_count(fuzzed, "store columns", Counter(cases=cases), failures)


SECRET = "Pw7fQ3"


def malformed_urls(count: int) -> list[tuple[str, tuple[str, ...]]]:
    """``count`` PostgreSQL URLs drawn (seeded) from malformed parts, each with the pieces of
    the password it carries that must never be printed."""
    rng = random.Random(31)
    users = ["u", "", "u%zz", "a@b", "-u"]
    passwords = [SECRET, f"{SECRET}%zz", "Pw7/fQ3", "Pw7?fQ3", "Pw7@fQ3", "Pw7 fQ3", "Pw7#fQ3",
                 "Pw7:fQ3", "Pw7[fQ3", f"{SECRET}%40"]
    hosts = ["localhost", "[::1", "[::1]:5432:5", "localhost:99999", "localhost:x", "", "h1,",
             "[", "@", "127.0.0.1:0", "/nonexistent"]
    paths = ["/db", "", "/d b", "/%zz", "/db/x"]
    queries = ["", "?bogus=1", "?sslmode=x", "?password={p}", "?password={p}&x", "?host=%zz",
               "?port=abc", "?connect_timeout=x", "?options=-c%20x=1", "?Password={p}", "?&&=="]
    urls = []
    for _ in range(count):
        password = rng.choice(passwords)
        query = rng.choice(queries).format(p=password)
        info = (rng.choice(users) + ":" + password + "@") if rng.random() < 0.8 else ""
        if not info and "{p}" not in rng.choice(queries) and "password" not in query.lower():
            query = f"?password={password}"
        url = f"{rng.choice(['postgresql', 'postgres'])}://{info}{rng.choice(hosts)}" \
              f"{rng.choice(paths)}{query}"
        urls.append((url, tuple(p for p in re.split(r"[/?@ #:\[%]", password) if len(p) >= 3)))
    return urls


def test_any_malformed_postgresql_url_is_one_line_without_its_password(
        tmp_path: Path, fuzzed: Fuzzed) -> None:
    """Malformed PostgreSQL URLs drawn from broken parts (ports, brackets, unescaped / ? @ # in
    the password, unknown and malformed query options): ``runs`` and ``db copy`` print one
    line, exit status 8, and never a piece of the password."""
    cases, failures = 0, []
    for url, pieces in malformed_urls(150):
        for argv in (["runs", "--db", url], ["db", "copy", url, str(tmp_path / "c.db")]):
            cases += 1
            try:
                done = cli_result(*argv)
                said = done.stdout + done.stderr
                assert not [p for p in pieces if p in said], (url, said)
                one_line(done, ExitStatus.STORE)
            except Exception:                              # noqa: BLE001: counted, then failed
                failures.append(f"{argv}: " + traceback.format_exc()[-600:])
    assert cases == 300
    fuzz_count(fuzzed, "PostgreSQL URLs", Counter(cases=cases), failures)
