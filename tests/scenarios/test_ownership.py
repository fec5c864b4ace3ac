"""Issue 13: who owns a run, and what runs leave on disk.

5. a run being measured has an owner (pid, host, start time, lock): a second --resume refuses
   with one line, a dead owner (or a reused pid) is taken over;
6. --resume RUN --retry-failed measures failed trials again and keeps the failed attempts;
8. what a killed run created is recorded and reclaimed (on --resume, by the next run over the
   target, by `iomatrix clean`), never a live run's, never what iomatrix did not create, FUSE
   exports detached first;
9. target refusals come before a run is stored;
and the target's notes (tmpfs) are shown and stored with the run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from iomatrix.cli.status import ExitStatus
from iomatrix.core.errors import RunBusy, StoreError, TargetError
from iomatrix.core.dirs import MARKER
from iomatrix.core.owner import HeldLock, Identity, LockFile, liveness, start_ticks, this_process
from iomatrix.measure import reclaim as reclaim_module
from iomatrix.measure.reclaim import marker_text, reclaim
from iomatrix.measure.runner import run_suite
from iomatrix.store import Store
from iomatrix.store.records import StoredSuite, TrialResult
from iomatrix.suite import load_suite
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.workloads import Workload
from iomatrix.targets import workspace as workspace_module
from tests.conftest import IOMATRIX, cli_result, our_processes, write_suite
from tests.needs import lacking


HOST = """
[[workloads]]
rw = "randread"
bs = "4k"
iodepth = [1, 4]
[method]
mode = "host"
samples = 2
seed = 3
ramp = 0
runtime = "{runtime}"
precondition = false
"""


def host_suite(tmp_path: Path, runtime: str = "500ms") -> Path:
    return write_suite(tmp_path, HOST.format(runtime=runtime), size="4MiB")



def trials(db: Path, run: int = 1) -> list[tuple[str, str, int, str]]:
    """The run's trials as (configuration, workload, sample, status), read without writing."""
    try:
        with Store(db, readonly=True) as store:
            return [(t.config_key, t.workload_key, t.sample_index, t.status)
                    for t in store.load_run(run).trials]
    except Exception:            # not created yet
        return []


def start_and_wait(args: list[str], cwd: Path, until, timeout: float = 60) -> subprocess.Popen[str]:  # type: ignore[no-untyped-def]
    proc = subprocess.Popen([*IOMATRIX, *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout
    while not until():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return proc


def dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def leftovers(tmp_path: Path) -> list[Path]:
    """Scratch directories under tmp_path ($TMPDIR in these tests) and image directories in
    the target."""
    return sorted([*tmp_path.glob("iomatrix-run-*"), *tmp_path.glob("target/iomatrix-*")])


CONFIG = Configuration(mode="host")
WORKLOAD = Workload(rw="randread", bs=4096, iodepth=1)


def new_run(store: Store, owner: int | None = None) -> int:
    return store.create_run(suite=StoredSuite(name="t", source="t.toml", text=""), host={},
                            accelerator="none", notes=[], configs=[CONFIG],
                            workloads=[WORKLOAD], owner=owner)


# -- 5. the owner of a run -----------------------------------------------------------------------

def test_start_time_is_read_from_proc_stat(tmp_path: Path) -> None:
    fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    assert start_ticks(os.getpid()) == int(fields[19])
    fake = tmp_path / "proc" / "42"
    fake.mkdir(parents=True)
    rest = " ".join(["S"] + ["1"] * 18 + ["777"] + ["0"] * 20)
    (fake / "stat").write_text(f"42 (a) b (c) {rest}\n")       # a name with ") " in it
    assert start_ticks(42, tmp_path / "proc") == 777
    (fake / "stat").write_text(f"42 (x) {rest.replace('S', 'Z', 1)}\n")
    assert start_ticks(42, tmp_path / "proc") is None            # a zombie is dead
    assert start_ticks(43, tmp_path / "proc") is None


def test_liveness_by_pid_start_time_host_and_lock(tmp_path: Path) -> None:
    me = this_process()
    assert liveness(me, me=me)[0]
    gone = me._replace(pid=dead_pid())
    assert liveness(gone, me=me) == (False, f"pid {gone.pid} is gone")
    reused = me._replace(start_ticks=me.start_ticks + 1)          # our pid, another start
    alive, why = liveness(reused, me=me)
    assert not alive and "a newer process has that pid" in why
    if me.boot_id:
        assert liveness(me._replace(boot_id="another boot"), me=me) == (
            False, "the host has rebooted since")
    lock = HeldLock(tmp_path / "owner.lock")
    made = LockFile(str(lock.path), lock.info.st_dev, lock.info.st_ino, me.uid)
    try:
        assert liveness(gone, made, me=me) == (True, "it holds its lock")
        # the same name, held, but not the file the process made: not its lock
        assert not liveness(gone, made._replace(ino=made.ino + 1), me=me)[0]
        assert not liveness(gone, made._replace(uid=made.uid + 1), me=me)[0]
        os.chmod(lock.path, 0o644)
        assert not liveness(gone, made, me=me)[0]
        os.chmod(lock.path, 0o600)
    finally:
        lock.release()
    assert not liveness(gone, made, me=me)[0]
    elsewhere = gone._replace(host="another-host")
    alive, why = liveness(elsewhere, me=me)
    assert alive and "another-host" in why                     # cannot be seen: never touched


def test_a_dead_owner_or_a_reused_pid_is_taken_over(tmp_path: Path) -> None:
    me = this_process()
    with Store(tmp_path / "r.db") as store:
        for owner in (me._replace(pid=dead_pid()), me._replace(start_ticks=me.start_ticks + 1)):
            old = store.register_process(owner, str(tmp_path / "nothing.lock"))
            run_id = new_run(store, owner=old)
            mine = store.register_process(me, "")
            previous = store.claim_run(run_id, mine)
            assert previous is not None and previous.id == old and previous.pid == owner.pid
            assert store.owner(run_id).id == mine       # type: ignore[union-attr]
            store.end_process(mine)
            assert store.owner(run_id) is None


def test_a_live_owner_is_not_taken_over(tmp_path: Path) -> None:
    me = this_process()
    with Store(tmp_path / "r.db") as store:
        live = store.register_process(me, "")                      # alive: this very process
        run_id = new_run(store, owner=live)
        other = store.register_process(me, "")
        with pytest.raises(RunBusy) as info:
            store.claim_run(run_id, other)
        since = store.owner(run_id).started_at                    # type: ignore[union-attr]
        assert str(info.value) == (f"run {run_id} is being measured by pid {me.pid} since "
                                   f"{since}: wait for it to end, or stop it, then resume")
        # dead by its pid, but its lock is held: alive
        lock = HeldLock(tmp_path / "owner.lock")
        unrecorded = store.register_process(me._replace(pid=dead_pid()), str(lock.path))
        assert store.claim_run(new_run(store, owner=unrecorded), other) is not None
        locked = store.register_process(me._replace(pid=dead_pid()), str(lock.path))
        store.lock_made(locked, lock.info)
        run2 = new_run(store, owner=locked)
        with pytest.raises(RunBusy):
            store.claim_run(run2, other)
        lock.release()
        assert store.claim_run(run2, other) is not None
        far = store.register_process(me._replace(host="far-away"), "")
        run3 = new_run(store, owner=far)
        with pytest.raises(RunBusy, match="on host far-away"):
            store.claim_run(run3, other)


@pytest.mark.slow
def test_resume_of_a_run_being_measured_refuses_in_one_line(tmp_path: Path,
                                                            no_leftovers: None) -> None:
    """Before: the second process measured the same trials again and died on the store's
    UNIQUE constraint with a traceback."""
    suite = host_suite(tmp_path, runtime="1s")
    db = tmp_path / "r.db"
    first = start_and_wait(["run", str(suite), "--db", str(db)], tmp_path,
                           lambda: len(trials(db)) >= 1)
    second = cli_result("run", "--resume", "1", "--db", str(db), cwd=tmp_path, own_process=True)
    assert second.returncode == ExitStatus.BUSY, second.stderr
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in second.stderr
    assert lines[0].startswith(f"iomatrix: run 1 is being measured by pid {first.pid} since 20")
    out, err = first.communicate(timeout=60)
    assert first.returncode == 0, err
    stored = trials(db)
    assert len(stored) == len(set(stored)) == 4 and all(t[3] == "ok" for t in stored)
    assert leftovers(tmp_path) == []


# -- 6. --retry-failed ---------------------------------------------------------------------------

def test_record_trial_replacing_a_failed_trial_keeps_it_whole(tmp_path: Path) -> None:
    from iomatrix.fio.samples import DirectionSample

    sample = DirectionSample(direction="read", iops=5.0, bw_bytes=1.0, io_bytes=1, total_ios=1,
                             runtime_ms=1)
    with Store(tmp_path / "r.db") as store:
        run_id = new_run(store)
        key = dict(config_key=CONFIG.key, workload_key=WORKLOAD.key, sample_index=0)
        store.record_trial(run_id, TrialResult(**key, status="failed", reason="QEMU did not",
                                               started_at="t0", samples=(sample,),
                                               fio_json='{"a": 1}'))
        store.record_trial(run_id, TrialResult(**key, status="ok", started_at="t1",
                                               samples=(sample,)), replace_failed=True)
        (trial,) = store.load_run(run_id).trials
        assert trial.status == "ok" and trial.started_at == "t1"
        (old,) = store.trial_history(run_id)
        assert old.trial.status == "failed" and old.trial.reason == "QEMU did not"
        assert old.trial.samples == (sample,) and old.trial.started_at == "t0"
        assert store.conn.execute("SELECT COUNT(*) FROM samples").fetchone()[0] == 1
        with pytest.raises(StoreError, match="stored already"):  # an ok trial is never replaced
            store.record_trial(run_id, TrialResult(**key, status="ok", started_at="t2"),
                               replace_failed=True)


FAILING_FIO = """#!/bin/sh
# fio, except that jobs at iodepth=4 fail (a tool failing for a while)
for last in "$@"; do :; done
if [ -f "$last" ] && grep -q '^iodepth=4$' "$last"; then
    echo "fio: simulated failure" >&2
    exit 1
fi
exec {fio} "$@"
"""


@pytest.mark.slow
def test_retry_failed_measures_failed_trials_again_and_keeps_their_reasons(
        tmp_path: Path, no_leftovers: None) -> None:
    from iomatrix.core.proc import require

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "fio").write_text(FAILING_FIO.format(fio=require("fio")))
    (bin_dir / "fio").chmod(0o755)
    failing = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    suite = host_suite(tmp_path)
    db = tmp_path / "r.db"
    first = cli_result("run", str(suite), "--db", str(db), cwd=tmp_path, env=failing, own_process=True)
    assert first.returncode == ExitStatus.TRIALS_FAILED, first.stderr
    with Store(db, readonly=True) as store:
        before = {(t.config_key, t.workload_key, t.sample_index): t
                  for t in store.load_run(1).trials}
    assert sorted(t.status for t in before.values()) == ["failed", "failed", "ok", "ok"]
    # a complete run: --resume alone has nothing to do, and says how to retry
    again = cli_result("run", "--resume", "1", "--db", str(db), cwd=tmp_path)
    assert again.returncode == 0 and again.stderr == ""
    assert again.stdout == ("run 1 is complete: nothing to do (2 of its trials failed: "
                            "`iomatrix run --resume 1 --retry-failed` measures them again)\n")
    retried = cli_result("run", "--resume", "1", "--retry-failed", "--db", str(db), cwd=tmp_path, own_process=True)
    assert retried.returncode == 0, retried.stderr
    assert "2 trials" in retried.stderr
    with Store(db, readonly=True) as store:
        run = store.load_run(1)
        history = store.trial_history(1)
    after = {(t.config_key, t.workload_key, t.sample_index): t for t in run.trials}
    assert after.keys() == before.keys() and all(t.status == "ok" for t in after.values())
    for key, trial in before.items():
        if trial.status == "ok":
            assert after[key] == trial                 # measured trials are not touched
    assert sorted(h.trial.id for h in history) == sorted(t.id for t in before.values()
                                                         if t.status == "failed")
    assert all("simulated failure" in (h.trial.reason or "") for h in history)
    assert run.status == "complete"
    assert any("--retry-failed measures 2 failed trial(s) again" in n
               and "2× fio failed: fio: simulated failure" in n for n in run.notes)
    nothing = cli_result("run", "--resume", "1", "--retry-failed", "--db", str(db), cwd=tmp_path)
    assert nothing.returncode == 0
    assert "none of its trials failed: nothing to retry" in nothing.stdout
    usage = cli_result("run", str(suite), "--retry-failed", "--db", str(db), cwd=tmp_path)
    assert usage.returncode == ExitStatus.USAGE and "goes with --resume" in usage.stderr
    assert leftovers(tmp_path) == []


# -- 8. what a killed run leaves behind ----------------------------------------------------------

def kill_9_mid_run(tmp_path: Path, suite: Path, db: Path, run: int = 1) -> int:
    """Start a run (it will be run ``run``) and kill -9 it once a trial is stored; its pid."""
    proc = start_and_wait(["run", str(suite), "--db", str(db)], tmp_path,
                          lambda: len(trials(db, run)) >= 1 and len(leftovers(tmp_path)) == 2)
    proc.kill()
    proc.communicate(timeout=10)
    return proc.pid


def runs(db: Path) -> list[int]:
    try:
        with Store(db, readonly=True) as store:
            return [r.id for r in store.list_runs()]
    except Exception:
        return []


def open_resources(db: Path) -> list[tuple[str, str]]:
    with Store(db, readonly=True) as store:
        return [(r.kind, r.path) for r in store.open_resources()]


@pytest.mark.slow
def test_kill_9_leftovers_are_recorded_and_resume_reclaims_them(tmp_path: Path,
                                                                no_leftovers: None) -> None:
    suite = host_suite(tmp_path)
    db = tmp_path / "r.db"
    kill_9_mid_run(tmp_path, suite, db)
    left = leftovers(tmp_path)
    assert [p.name.startswith("iomatrix-run-") for p in left].count(True) == 1 and len(left) == 2
    assert {path for _, path in open_resources(db)} >= {str(p) for p in left}
    # --dry-run: says what it would remove, removes nothing, writes nothing
    before = db.read_bytes(), open_resources(db)
    dry = cli_result("clean", "--db", str(db), "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert all(f"would remove {kind}" in dry.stdout and str(p) in dry.stdout
               for kind, p in zip(["scratch", "images"], left))
    assert "run 1: its process" in dry.stdout and "--resume 1" in dry.stdout
    assert leftovers(tmp_path) == left and (db.read_bytes(), open_resources(db)) == before
    done = cli_result("run", "--resume", "1", "--db", str(db), cwd=tmp_path, own_process=True)
    assert done.returncode == 0, done.stderr
    assert "which is gone: this process takes it over" in done.stderr
    assert leftovers(tmp_path) == [] and open_resources(db) == []
    stored = trials(db)
    assert len(stored) == len(set(stored)) == 4
    assert not (tmp_path / "target").exists()         # created by the run, removed by the resume


@pytest.mark.slow
def test_the_next_run_over_the_target_and_clean_reclaim_leftovers(tmp_path: Path,
                                                                  no_leftovers: None) -> None:
    suite = host_suite(tmp_path)
    db = tmp_path / "r.db"
    (tmp_path / "target").mkdir()
    kill_9_mid_run(tmp_path, suite, db)
    first = leftovers(tmp_path)
    assert len(first) == 2
    nxt = cli_result("run", str(suite), "--db", str(db), cwd=tmp_path, own_process=True)   # a new run, not a resume
    assert nxt.returncode == 0, nxt.stderr
    assert leftovers(tmp_path) == []
    assert all(f"removed {kind} {p}" in nxt.stderr for kind, p in zip(["scratch", "images"], first))
    kill_9_mid_run(tmp_path, suite, db, run=3)
    assert len(leftovers(tmp_path)) == 2
    cleaned = cli_result("clean", "--db", str(db), cwd=tmp_path)
    assert cleaned.returncode == 0, cleaned.stderr
    assert "removed 2" in cleaned.stdout and leftovers(tmp_path) == []
    assert open_resources(db) == []
    again = cli_result("clean", "--db", str(db), cwd=tmp_path)
    assert "nothing to clean" in again.stdout
    missing = cli_result("clean", "--db", str(tmp_path / "none.db"), cwd=tmp_path)
    assert missing.returncode == ExitStatus.STORE and not (tmp_path / "none.db").exists()


@pytest.mark.slow
def test_clean_leaves_what_a_live_run_uses(tmp_path: Path, no_leftovers: None) -> None:
    suite = host_suite(tmp_path, runtime="1s")
    db = tmp_path / "r.db"
    live = start_and_wait(["run", str(suite), "--db", str(db)], tmp_path,
                          lambda: len(trials(db)) >= 1)
    used = leftovers(tmp_path)
    assert len(used) == 2
    live.send_signal(signal.SIGSTOP)        # stopped, it lives: it may not end during the clean
    try:
        cleaned = cli_result("clean", "--db", str(db), cwd=tmp_path)
    finally:
        live.send_signal(signal.SIGCONT)
    assert cleaned.returncode == 0, cleaned.stderr
    assert all(f"left {kind} {path} (run 1, pid {live.pid}): in use by a live iomatrix since "
               in cleaned.stdout for kind, path in zip(["scratch", "images"], used))
    assert all(p.exists() for p in used)
    out, err = live.communicate(timeout=60)
    assert live.returncode == 0, err
    assert len(trials(db)) == 4 and leftovers(tmp_path) == []


def test_reclaim_removes_only_what_is_still_ours(tmp_path: Path) -> None:
    tmp_path = tmp_path.resolve()
    tmp, target = tmp_path / "tmp", tmp_path / "target"
    tmp.mkdir()
    target.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "precious").write_text("not iomatrix's")
    with Store(tmp_path / "r.db") as store:
        owner = this_process()._replace(pid=dead_pid())
        dead = store.register_process(owner, "")
        cases: dict[str, tuple[Path, str, str]] = {}

        def record(name: str, path: Path, kind: str = "workspace", within: Path = target,
                   keep: bool = False, process: int = dead, marker: str | None = "") -> None:
            """Record ``path`` as iomatrix does; a directory there is marked with ``marker``
            ("": the record's own, None: none)."""
            store.add_resource(process, kind, str(path), str(within), keep=keep)
            if path.is_dir() and not path.is_symlink() and marker is not None:
                (path / MARKER).write_text(marker or marker_text(owner, kind, str(path)))
            cases[name] = (path, kind, str(within))

        ok = target / "iomatrix-0001"
        (ok / "sub").mkdir(parents=True)
        (ok / "sub" / "disk-raw-off.raw").write_bytes(b"x" * 8192)
        record("ours", ok)
        scratch = tmp / "iomatrix-run-0001"
        scratch.mkdir()
        record("scratch", scratch, "scratch", tmp)
        link = target / "iomatrix-link"
        link.symlink_to(elsewhere)
        record("symlink", link)
        named = target / "images"
        named.mkdir()
        record("name", named)
        moved = tmp / "iomatrix-0002"                 # recorded in target, found in tmp
        moved.mkdir()
        record("outside", moved, within=target)
        plain = target / "iomatrix-file"
        plain.write_text("a file now")
        record("file", plain)
        kept = target / "iomatrix-kept"
        kept.mkdir()
        record("kept", kept, keep=True)
        record("gone", target / "iomatrix-gone")
        live = target / "iomatrix-live"
        live.mkdir()
        record("live", live, process=store.register_process(this_process(), ""))
        empty_parent = tmp_path / "made"
        empty_parent.mkdir()
        record("empty parent", empty_parent, "parent", tmp_path)
        full_parent = tmp_path / "full"
        full_parent.mkdir()
        (full_parent / "someone's").write_text("x")
        record("full parent", full_parent, "parent", tmp_path)
        # a database that merely names a directory: no marker, or another record's
        for name, marker in (("unmarked", None), ("marked for another", "made by iomatrix: x")):
            folder = target / f"iomatrix-{name.replace(' ', '-')}"
            folder.mkdir()
            (folder / "report.html").write_text("someone's")
            record(name, folder, marker=marker)
        empty = target / "iomatrix-empty"             # killed between mkdir and marker
        empty.mkdir()
        record("empty, unmarked", empty, marker=None)
        other = tmp_path / "other"                    # an empty directory root has, named
        other.mkdir()
        record("parent unmarked", other, "parent", tmp_path, marker=None)
        live_named = target / "iomatrix-live-named"   # a live run's, named as a dead one's
        live_named.mkdir()
        (live_named / MARKER).write_text(marker_text(this_process(), "workspace",
                                                     str(live_named)))
        record("live, named as dead", live_named, marker=None)
        if os.geteuid() == 0:
            foreign = target / "iomatrix-foreign"
            foreign.mkdir()
            os.chown(foreign, 65534, 65534)
            record("foreign", foreign)

        dry = {r.resource.path: r for r in reclaim(store, dry_run=True)}
        assert all(os.path.lexists(p) for name, (p, _, _) in cases.items() if name != "gone")
        assert dry[str(ok)].action == "would remove" and dry[str(ok)].bytes >= 8192
        results = {r.resource.path: r for r in reclaim(store)}

    def outcome(name: str) -> tuple[str, str]:
        r = results[str(cases[name][0])]
        return r.action, r.detail

    assert outcome("ours")[0] == "removed" and not ok.exists()
    assert outcome("scratch")[0] == "removed" and not scratch.exists()
    assert outcome("symlink") == ("left", "it is a symlink now, not the directory iomatrix created")
    assert (elsewhere / "precious").exists() and link.is_symlink()
    assert outcome("name") == ("left", "its name is not one iomatrix gives (iomatrix-*)")
    assert outcome("outside") == ("left", f"it is no longer inside {target}") and moved.exists()
    assert outcome("file") == ("left", "it is not a directory now") and plain.exists()
    assert outcome("kept")[0] == "kept" and kept.exists()
    assert outcome("gone")[0] == "gone"
    assert outcome("live")[0] == "left" and "in use by" in outcome("live")[1] and live.exists()
    assert outcome("empty parent")[0] == "removed" and not empty_parent.exists()
    assert outcome("full parent") == ("left", "not empty") and full_parent.exists()
    unmarked = ("left", "it does not carry iomatrix's marker (.iomatrix) for this record, so "
                        "it may not be what iomatrix made (or iomatrix was stopped as it made "
                        "it): remove it by hand if it is")
    for name in ("unmarked", "marked for another"):
        assert outcome(name) == unmarked and (cases[name][0] / "report.html").exists()
    for name in ("empty, unmarked", "parent unmarked", "live, named as dead"):
        assert outcome(name) == unmarked and cases[name][0].exists()
    if os.geteuid() == 0:
        assert outcome("foreign")[0] == "left" and "owned by uid 65534" in outcome("foreign")[1]
        assert foreign.exists()
    with Store(tmp_path / "r.db", readonly=True) as store:
        still = {r.path for r in store.open_resources()}
    # removed, gone and kept are settled; what was left stays recorded, to be looked at again
    assert str(ok) not in still and str(kept) not in still and str(link) in still


@pytest.mark.slow
def test_a_dead_fuse_export_is_detached_before_its_directory_is_removed(
        tmp_path: Path, no_leftovers: None) -> None:
    from iomatrix.diagnose.doctor import check_fuse

    if not check_fuse().ok:
        lacking("fuse", f"FUSE exports do not work here: {check_fuse().detail}")
    body = """
[matrix]
aio = "threads"
cache = "none"
iothread = true
[workloads]
rw = "randread"
iodepth = 1
[method]
mode = "blocklayer"
ramp = 0
runtime = "3s"
precondition = false
"""
    suite = write_suite(tmp_path, body, size="16MiB")
    db = tmp_path / "r.db"

    def fuse_mounts() -> list[str]:
        return [line for line in Path("/proc/self/mountinfo").read_text().splitlines()
                if str(tmp_path) in line and "fuse" in line]

    proc = start_and_wait(["run", str(suite), "--db", str(db)], tmp_path,
                          lambda: bool(fuse_mounts()))
    # the daemon's reaper (core/reaper.py) would unmount the export once iomatrix is gone:
    # killed with it, as by an OOM killer, nobody unmounts
    daemons = [int(p.split()[0]) for p in our_processes(str(tmp_path))
               if "qemu-storage-daemon" in p or "reaper.py" in p]
    assert len(daemons) == 2, our_processes(str(tmp_path))
    proc.send_signal(signal.SIGSTOP)                   # iomatrix cannot unmount it either
    for pid in daemons:                                # the daemon dies first: nobody unmounts
        os.kill(pid, signal.SIGKILL)
    proc.kill()
    proc.communicate(timeout=10)
    time.sleep(0.5)
    assert fuse_mounts(), "the killed daemon's FUSE export should still be mounted"
    cleaned = cli_result("clean", "--db", str(db), cwd=tmp_path)
    assert cleaned.returncode == 0, cleaned.stderr
    assert "FUSE export(s) detached" in cleaned.stdout
    assert fuse_mounts() == [] and leftovers(tmp_path) == []


# -- 9. refusals before anything is stored -------------------------------------------------------

@pytest.mark.parametrize("problem", ["file", "too small"])
def test_target_refusals_store_no_run(tmp_path: Path, problem: str) -> None:
    if problem == "file":
        (tmp_path / "target").write_text("a file")
        suite = host_suite(tmp_path)
        message = "is not a directory"
    else:
        suite = write_suite(tmp_path, HOST.format(runtime="500ms"), size="64TiB")
        message = "free"
    proc = cli_result("run", str(suite), "--db", "r.db", cwd=tmp_path)   # refused at once
    assert proc.returncode == ExitStatus.TARGET and message in proc.stderr
    assert runs(tmp_path / "r.db") == []
    assert not list(tmp_path.glob("iomatrix-*"))


def test_a_read_only_target_stores_no_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    suite = load_suite(host_suite(tmp_path))
    (tmp_path / "target").mkdir()
    real = workspace_module._writable
    monkeypatch.setattr(workspace_module, "_writable",
                        lambda d: False if d == tmp_path / "target" else real(d))
    with Store(tmp_path / "r.db") as store:
        with pytest.raises(TargetError, match="is not writable"):
            run_suite(suite, store)
        assert store.list_runs() == [] and store.open_resources() == []
    assert list((tmp_path / "target").iterdir()) == []


def test_a_refused_resume_leaves_the_run_as_it_was(tmp_path: Path) -> None:
    with Store(tmp_path / "r.db") as store:
        run_id = new_run(store)
        store.finish_run(run_id, "interrupted")
    (tmp_path / "target").write_text("now a file")
    suite = load_suite(host_suite(tmp_path))
    with Store(tmp_path / "r.db") as store:
        with pytest.raises(TargetError):
            run_suite(suite, store, resume=run_id)
        assert store.load_run(run_id).status == "interrupted"


# -- the target's notes ----------------------------------------------------------------------------

class Notes:
    def __init__(self) -> None:
        self.notes: list[str] = []

    def start(self, trials: int, planned_seconds: float) -> None: ...
    def more(self, trials: int, planned_seconds: float) -> None: ...
    def trial_started(self, *args: object) -> None: ...
    def trial_finished(self, *args: object) -> None: ...

    def note(self, text: str) -> None:
        self.notes.append(text)


@pytest.mark.slow
def test_target_notes_are_shown_and_stored_with_the_run(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        no_leftovers: None) -> None:
    note = "[target] directory is on tmpfs: every figure measures memory"
    monkeypatch.setattr(workspace_module, "target_notes", lambda target, mountinfo: [note])
    progress = Notes()
    with Store(tmp_path / "r.db") as store:
        outcome = run_suite(load_suite(host_suite(tmp_path)), store, progress=progress)
        assert note in store.load_run(outcome.run_id).notes
        assert store.open_resources() == []
    assert note in progress.notes


def test_owner_identity_is_what_proc_says() -> None:
    me = this_process()
    assert isinstance(me, Identity) and me.pid == os.getpid() and me.uid == os.geteuid()
    assert me.start_ticks == start_ticks(os.getpid()) and me.start_ticks > 0
    assert reclaim_module.SCRATCH_PREFIX == "iomatrix-run-"


def test_a_signal_during_the_clean_up_takes_effect_after_it(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A run stopped while it removes its scratch directory would leave half of it behind."""
    import shutil

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    previous = signal.signal(signal.SIGTERM, stop)
    real = shutil.rmtree

    def interrupted_rmtree(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        os.kill(os.getpid(), signal.SIGTERM)
        return real(path, *args, **kwargs)
    try:
        with Store(tmp_path / "r.db") as store:
            with pytest.raises(KeyboardInterrupt):
                with reclaim_module.run_process(store, keep=False) as me:
                    scratch = me.scratch
                    assert scratch is not None and scratch.is_dir()
                    monkeypatch.setattr(reclaim_module.shutil, "rmtree", interrupted_rmtree)
            monkeypatch.setattr(reclaim_module.shutil, "rmtree", real)
            assert not scratch.exists() and store.open_resources() == []
            assert store.conn.execute("SELECT ended_at FROM processes").fetchone()[0]
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert signal.getsignal(signal.SIGTERM) is previous


def test_runs_tells_a_killed_run_from_one_being_measured(tmp_path: Path) -> None:
    me = this_process()
    with Store(tmp_path / "r.db") as store:
        killed = new_run(store, owner=store.register_process(me._replace(pid=dead_pid()), ""))
        live = new_run(store, owner=store.register_process(me, ""))
    listing = cli_result("runs", "--db", "r.db", cwd=tmp_path).stdout
    rows = {line.split()[0]: line for line in listing.splitlines()[1:]}
    assert "stopped (process gone; --resume)" in rows[str(killed)]
    assert "running" in rows[str(live)] and "process gone" not in rows[str(live)]


@pytest.mark.slow
def test_clean_dry_run_counts_what_clean_removes(tmp_path: Path, no_leftovers: None) -> None:
    """A killed run over a target directory it made leaves three: its scratch directory, its
    images and the target directory, which is empty once the images are gone."""
    suite = host_suite(tmp_path)
    db = tmp_path / "r.db"
    kill_9_mid_run(tmp_path, suite, db)
    dry = cli_result("clean", "--db", str(db), "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert f"would remove target directory {tmp_path / 'target'} " in dry.stdout, dry.stdout
    assert dry.stdout.splitlines()[-1].startswith("would remove 3 (")
    assert dry.stdout.splitlines()[-1].endswith("leave 0; nothing removed (--dry-run)")
    cleaned = cli_result("clean", "--db", str(db), cwd=tmp_path)
    assert cleaned.returncode == 0, cleaned.stderr
    assert cleaned.stdout.splitlines()[-1].startswith("removed 3 (")
    assert cleaned.stdout.endswith(", left 0\n") and not (tmp_path / "target").exists()


@pytest.mark.slow
def test_concurrent_runs_over_a_new_target_leave_no_directory(tmp_path: Path,
                                                              no_leftovers: None) -> None:
    """Four runs at once over a target directory none of them finds: one makes it, each makes
    its own directory in it, and whichever ends last removes it, with or without a database in
    common."""
    suite = host_suite(tmp_path)
    procs = [subprocess.Popen([*IOMATRIX, "run", str(suite), "--db", str(tmp_path / db)],
                              cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
             for db in ("shared.db", "shared.db", "own-1.db", "own-2.db")]
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    assert not (tmp_path / "target").exists() and leftovers(tmp_path) == []
    # a run of another database may have removed it after its maker ended: the next look at
    # the shared database settles that record as gone
    with Store(tmp_path / "shared.db", readonly=True) as store:
        assert all(r.kind == "parent" for r in store.open_resources())
    cleaned = cli_result("clean", "--db", str(tmp_path / "shared.db"), cwd=tmp_path)
    assert all(line.startswith("gone target directory") for line in cleaned.stdout.splitlines()
               if ", pid " in line), cleaned.stdout          # one line per resource
    with Store(tmp_path / "shared.db", readonly=True) as store:
        assert store.open_resources() == []


def test_a_command_the_dead_run_was_starting_cannot_make_its_images_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run killed just after starting fio: fio, SIGTERMed as its parent died, may still be
    starting, holding nothing in the images' directory, and then make it again (fio creates a
    missing directory of its filename), after iomatrix clean removed it (seen in a full test
    run under load). Such a command (its own session, the run's user, the run's scratch
    directory in its arguments) is killed before the images go. Stand-in: a Python process that
    makes the directory again two seconds after it starts."""
    monkeypatch.setattr(reclaim_module, "USERS_WAIT", 0.5)
    tmp_path = tmp_path.resolve()
    owner = this_process()._replace(pid=dead_pid())
    scratch, images = tmp_path / "iomatrix-run-dead", tmp_path / "iomatrix-images"
    starting = ("import os, sys, time; print('started', flush=True); time.sleep(2); "
                "os.makedirs(sys.argv[1], exist_ok=True)")
    with Store(tmp_path / "r.db") as store:
        dead = store.register_process(owner, "")
        for kind, directory in (("scratch", scratch), ("workspace", images)):
            directory.mkdir(mode=0o700)
            (directory / MARKER).write_text(marker_text(owner, kind, str(directory)))
            store.add_resource(dead, kind, str(directory), str(tmp_path))
        fio = subprocess.Popen([sys.executable, "-c", starting, str(images / "disk"),
                                str(scratch / "job.fio")], stdout=subprocess.PIPE, text=True,
                               start_new_session=True)
        try:
            assert fio.stdout is not None and fio.stdout.readline() == "started\n"
            done = {Path(r.resource.path).name: r for r in reclaim(store)}
            assert fio.wait(timeout=30) == -signal.SIGKILL
        finally:
            if fio.poll() is None:
                fio.kill()
                fio.wait()
    assert done["iomatrix-images"].action == "removed", done
    assert done["iomatrix-images"].detail.startswith(f"killed pid {fio.pid} ("), done
    assert not images.exists() and not scratch.exists()


def test_reclaim_kills_what_a_dead_run_left_running_and_nothing_else(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A command of a killed run that outlived its parent-death SIGTERM (qemu-storage-daemon was
    seen to, after kill -9): its session is killed before its directory is removed. A process
    that merely has a file open there (someone's shell, an editor) is named, never killed.
    Stand-ins: Python processes that ignore SIGTERM."""
    monkeypatch.setattr(reclaim_module, "USERS_WAIT", 0.5)
    tmp_path = tmp_path.resolve()
    owner = this_process()._replace(pid=dead_pid())
    hold = ("import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "f = open(sys.argv[1], 'rb'); print('held', flush=True); time.sleep(600)")
    held: list[subprocess.Popen[str]] = []
    try:
        with Store(tmp_path / "r.db") as store:
            dead = store.register_process(owner, "")
            directories = {}
            for kind, name in (("scratch", "iomatrix-run-dead"), ("workspace", "iomatrix-daemon"),
                               ("workspace", "iomatrix-shell")):
                directory = tmp_path / name
                directory.mkdir(mode=0o700)
                (directory / MARKER).write_text(marker_text(owner, kind, str(directory)))
                (directory / "disk.raw").write_bytes(b"x" * 4096)
                store.add_resource(dead, kind, str(directory), str(tmp_path))
                directories[name] = directory
            # the run's daemon: its own session, the run's socket in its arguments
            held.append(subprocess.Popen(
                [sys.executable, "-c", hold, str(directories["iomatrix-daemon"] / "disk.raw"),
                 str(directories["iomatrix-run-dead"] / "qmp.sock")],
                stdout=subprocess.PIPE, text=True, start_new_session=True))
            # not the run's: in this test's session, naming nothing of the run's
            held.append(subprocess.Popen(
                [sys.executable, "-c", hold, str(directories["iomatrix-shell"] / "disk.raw")],
                stdout=subprocess.PIPE, text=True))
            for proc in held:
                assert proc.stdout is not None and proc.stdout.readline() == "held\n"
            done = {Path(r.resource.path).name: r for r in reclaim(store)}
        daemon, shell = held
        assert daemon.wait(timeout=30) == -signal.SIGKILL
        assert done["iomatrix-daemon"].action == "removed"
        comm = Path(f"/proc/{shell.pid}/comm").read_text().strip()      # python, python3...
        assert done["iomatrix-daemon"].detail == (f"killed pid {daemon.pid} ({comm}), left "
                                                  "running by the dead run")
        assert done["iomatrix-shell"].action == "left" and shell.poll() is None
        assert done["iomatrix-shell"].detail == (f"files in it are still open: pid {shell.pid} "
                                                 f"({comm})")
        assert directories["iomatrix-shell"].exists() and not directories["iomatrix-daemon"].exists()
        assert done["iomatrix-run-dead"].action == "removed"
    finally:
        for proc in held:
            proc.kill()
            proc.wait(timeout=30)
