#!/usr/bin/env python3
"""Soak: runs killed at random moments, then resumed, lose nothing and leave nothing behind.

N times (default 200): `iomatrix run` of a tiny host-mode suite (2 workloads × 2 samples, 4 MiB
image) on a small target, killed after a random delay with a random signal (SIGKILL, SIGTERM,
SIGINT, SIGHUP), then `iomatrix run --resume RUN` until the run is complete (or, when the kill
came before the run was stored, the run started again). All runs share one database, one target
and one $TMPDIR, so each run must clean up (or reclaim) after the ones before it. At the end it
prints a table and checks:

  - every run complete; samples expected = found, no duplicate trial or sample, none missing;
  - leftovers: no fio/qemu process mentioning the work directory, no mount below it, no scratch
    directory (iomatrix-run-*) in $TMPDIR, no image directory (iomatrix-*) in the target, no
    directory the database still lists as not removed.

Not run in CI (it takes minutes).

    .venv/bin/python bench/soak.py [--runs 200] [--target DIR] [--seed 1] [--keep-work]
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SIGNALS = (signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
SUITE = """[suite]
name = "soak"
[target]
directory = "{target}"
size = "4MiB"
[[workloads]]
rw = ["randread", "randwrite"]
bs = "4k"
iodepth = 4
[method]
mode = "host"
samples = 2
seed = 11
ramp = 0
runtime = "500ms"
"""
TRIALS_PER_RUN = 4          # 1 configuration (host) × 2 workloads × 2 samples
SAMPLES_PER_TRIAL = 1       # randread and randwrite: one direction each
EXIT_TIMEOUT = 60.0
"""A signalled iomatrix that has not exited after this long is hung: a failure."""


def iomatrix(*args: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "iomatrix", *args], env=env, text=True,
                          capture_output=True, timeout=timeout)


def query(db: Path, sql: str, *params: object) -> list[tuple]:  # type: ignore[type-arg]
    if not db.exists():
        return []
    conn = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True, timeout=30)
    try:
        return conn.execute(sql, params).fetchall()
    except sqlite3.OperationalError:          # no tables yet
        return []
    finally:
        conn.close()


def run_ids(db: Path) -> list[int]:
    return [r[0] for r in query(db, "SELECT id FROM runs ORDER BY id")]


def status(db: Path, run_id: int) -> str:
    rows = query(db, "SELECT status FROM runs WHERE id = ?", run_id)
    return rows[0][0] if rows else "missing"


def processes(marker: str) -> list[str]:
    """Live (not zombie) processes other than this one whose command line mentions ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if marker in cmdline and stat.rsplit(")", 1)[1].split()[0] != "Z":
            found.append(f"{entry.name}: {cmdline[:120]}")
    return found


def mounts_below(marker: str) -> list[str]:
    return [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
            if marker in line.split()[4]]


def leftovers(work: Path, tmp: Path, target: Path, before: set[Path], db: Path) -> dict[str, list[str]]:
    return {
        "processes": processes(str(work)) + (processes(str(target)) if target != work / "target" else []),
        "mounts": mounts_below(str(work)),
        "scratch dirs": [str(p) for p in tmp.glob("iomatrix-run-*")],
        "images": [str(p) for p in sorted(target.glob("iomatrix-*")) if p not in before],
        "open records": [f"{k} {p}" for k, p in query(
            db, "SELECT kind, path FROM resources WHERE removed_at IS NULL")],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--target", type=Path, default=None,
                        help="target directory (default: a new directory in the work directory)")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--keep-work", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(2**31)
    rng = random.Random(seed)
    work = Path(tempfile.mkdtemp(prefix="iomatrix-soak-")).resolve()
    tmp = work / "tmp"
    tmp.mkdir()
    target = (args.target or work / "target").resolve()
    target.mkdir(parents=True, exist_ok=True)
    before = set(target.glob("iomatrix-*"))
    suite = work / "soak.toml"
    suite.write_text(SUITE.format(target=target))
    db = work / "soak.db"
    env = {**os.environ, "TMPDIR": str(tmp)}
    env.pop("IOMATRIX_DB", None)

    # calibration: one run, not killed, in a database of its own: how long a run takes
    t0 = time.monotonic()
    first = iomatrix("run", str(suite), "--db", str(work / "calibration.db"), env=env)
    if first.returncode != 0:
        print(f"calibration run failed (exit {first.returncode}):\n{first.stderr}")
        return 1
    span = time.monotonic() - t0
    print(f"soak: {args.runs} runs, seed {seed}, work {work}, target {target}; a run takes "
          f"{span:.1f} s, so kills land uniformly in 0–{span * 1.05:.1f} s", flush=True)

    sent: collections.Counter[str] = collections.Counter()
    outcomes: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    problems: list[str] = []
    resumes = restarts = 0
    started = time.monotonic()
    for i in range(1, args.runs + 1):
        signum = rng.choice(SIGNALS)
        name = signal.Signals(signum).name
        delay = rng.uniform(0, span * 1.05)
        known = set(run_ids(db))
        proc = subprocess.Popen([sys.executable, "-m", "iomatrix", "run", str(suite), "--db",
                                 str(db)], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        time.sleep(delay)
        if proc.poll() is None:
            proc.send_signal(signum)
            sent[name] += 1
            try:
                _, err = proc.communicate(timeout=EXIT_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
                problems.append(f"run {i}: still running {EXIT_TIMEOUT:.0f} s after {name}")
            code = proc.returncode
            outcomes[name][f"exit {code}"] += 1
            if "Traceback" in err and not (signum == signal.SIGINT and code in (1, -2)):
                problems.append(f"run {i} ({name}): traceback: {err.strip().splitlines()[-1]}")
        else:
            _, err = proc.communicate()
            outcomes["(none: finished first)"][f"exit {proc.returncode}"] += 1
        new = sorted(set(run_ids(db)) - known)
        if not new:                                  # killed before its run was stored
            restarts += 1
            again = iomatrix("run", str(suite), "--db", str(db), env=env)
            if again.returncode != 0:
                problems.append(f"run {i}: restart exit {again.returncode}: {again.stderr[-300:]}")
            new = sorted(set(run_ids(db)) - known)
        for run_id in new:
            for _ in range(5):
                if status(db, run_id) == "complete":
                    break
                resumes += 1
                done = iomatrix("run", "--resume", str(run_id), "--db", str(db), env=env)
                if done.returncode != 0:
                    problems.append(f"run {i}: resume of run {run_id}: exit {done.returncode}: "
                                    f"{done.stderr.strip()[-300:]}")
            if status(db, run_id) != "complete":
                problems.append(f"run {i}: run {run_id} is {status(db, run_id)}")
        now = leftovers(work, tmp, target, before, db)
        for kind in ("scratch dirs", "images", "mounts"):
            if now[kind]:
                problems.append(f"run {i}: {kind} left after it completed: {now[kind]}")
        if i % 10 == 0 or i == args.runs:
            print(f"  {i}/{args.runs} runs, {time.monotonic() - started:.0f} s, "
                  f"{len(problems)} problem(s)", flush=True)

    time.sleep(1.0)                                 # fio's parent-death SIGTERM takes a moment
    final = leftovers(work, tmp, target, before, db)
    runs = run_ids(db)
    incomplete = [r for r in runs if status(db, r) != "complete"]
    found = query(db, "SELECT COUNT(*) FROM samples")[0][0]
    failed = query(db, "SELECT COUNT(*) FROM trials WHERE status != 'ok'")[0][0]
    duplicates = query(db, "SELECT COUNT(*) FROM (SELECT run_id, configuration_id, workload_id, "
                           "sample_index FROM trials GROUP BY 1, 2, 3, 4 HAVING COUNT(*) > 1)")[0][0]
    per_run = dict(query(db, "SELECT run_id, COUNT(*) FROM trials GROUP BY run_id"))
    missing = sum(max(0, TRIALS_PER_RUN - per_run.get(r, 0)) for r in runs)
    extra = sum(max(0, per_run.get(r, 0) - TRIALS_PER_RUN) for r in runs)
    bad_samples = query(db, "SELECT COUNT(*) FROM trials t WHERE (SELECT COUNT(*) FROM samples s "
                            "WHERE s.trial_id = t.id) != ?", SAMPLES_PER_TRIAL)[0][0]
    expected = args.runs * TRIALS_PER_RUN * SAMPLES_PER_TRIAL

    names = [signal.Signals(s).name for s in SIGNALS]
    codes = sorted({c for o in outcomes.values() for c in o})
    width = 24
    print()
    print(f"{'':{width}}" + "".join(f"{n:>9}" for n in names) + f"{'none':>9}{'total':>9}")
    print(f"{'signals sent':{width}}" + "".join(f"{sent[n]:>9}" for n in names)
          + f"{'':>9}{sum(sent.values()):>9}")
    for code in codes:
        row = [outcomes[n][code] for n in names] + [outcomes["(none: finished first)"][code]]
        print(f"{'  then ' + code:{width}}" + "".join(f"{v:>9}" for v in row) + f"{sum(row):>9}")
    table = [
        ("runs", args.runs, len(runs)),
        ("runs complete", args.runs, len(runs) - len(incomplete)),
        ("restarted (killed before stored)", None, restarts),
        ("resumes", None, resumes),
        ("samples", expected, found),
        ("duplicate trials", 0, duplicates + extra),
        ("missing trials", 0, missing),
        ("trials not ok", 0, failed),
        ("trials with wrong sample count", 0, bad_samples),
        *((f"leftover {kind}", 0, len(items)) for kind, items in final.items()),
        ("problems", 0, len(problems)),
    ]
    print()
    print(f"{'check':34}{'expected':>10}{'found':>10}")
    for label, want, got in table:
        mark = "" if want is None or want == got else "   <-- FAIL"
        print(f"{label:34}{'' if want is None else want:>10}{got:>10}{mark}")
    print(f"\nwall time {time.monotonic() - started:.0f} s ({args.runs} runs), seed {seed}")
    for problem in problems[:20]:
        print(f"problem: {problem}")
    for kind, items in final.items():
        for item in items[:5]:
            print(f"leftover {kind}: {item}")
    ok = all(want is None or want == got for _, want, got in table)
    if not args.keep_work:
        if ok:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"work directory kept for inspection: {work}")
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
