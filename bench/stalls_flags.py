#!/usr/bin/env python3
"""How many of the study suites' trials on this host are stalled, flagged or clean (issue 38).

For each study suite (the built-ins reproducing ../shared/seeds: aio-iothreads, cache-format,
controllers, vhost-user, native-threads): its ``--scale quick`` tables, run in blocklayer mode
(its host baseline kept) with short trials: ``[method]`` mode = "blocklayer", ramp 0, runtime
``--runtime`` (default 1 s), ``--samples`` rounds (default 2), no pilot, steady state or A/A; a
``--size`` image (default 256 MiB) in a fresh directory under /var/tmp (removed afterwards).
Guests are left out: under TCG here they measure the emulator. Or ``--db FILE``: count the
runs stored there instead.

Each ok trial is counted once, first match: stalled (``analysis.stalls``: a second or more
without a completion while fio kept I/O queued), flagged (its point faster than bare metal,
``analysis.impossible`` [>BARE], or served from the host page cache, ``analysis.pagecache``
[RAM]), or clean; stall checks not made are counted with their reason.

    .venv/bin/python bench/stalls_flags.py [SUITE ...] [--runtime 1s] [--samples 2] [--keep]
    .venv/bin/python bench/stalls_flags.py --db results.db [RUN ...]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

STUDIES = ("aio-iothreads", "cache-format", "controllers", "vhost-user", "native-threads")
DROPPED = ("steady_state", "min_runtime", "max_runtime", "target_ci", "max_samples", "aa",
           "pilot", "vms")


def suite_text(name: str, work: Path, args: argparse.Namespace) -> str:
    """The study's quick tables in blocklayer mode with short trials, as TOML."""
    from iomatrix.suite import load_suite
    from iomatrix.suite.load import tables_text

    tables = dict(load_suite(name, scale="quick").tables)
    method = {k: v for k, v in dict(tables.get("method") or {}).items() if k not in DROPPED}
    tables["method"] = method | {"mode": "blocklayer", "ramp": "0s", "runtime": args.runtime,
                                 "samples": args.samples, "baseline": True}
    target = {k: v for k, v in dict(tables.get("target") or {}).items()
              if k not in ("directory", "device", "filesystems", "working_set")}
    tables["target"] = target | {"directory": str(work / "target"), "size": args.size}
    tables.pop("scale", None)
    return tables_text(tables, f"{name} (blocklayer, short)")


def count(run) -> tuple[Counter[str], Counter[str]]:  # type: ignore[no-untyped-def]
    """(stalled / flagged / clean / failed counts, why stalls were not checked) of a run."""
    from iomatrix.analysis.impossible import of_run
    from iomatrix.analysis.points import points
    from iomatrix.analysis.stalls import with_stalled

    kept = with_stalled(run)
    faster = of_run(kept)
    ram = {(p.config_key, p.workload_key) for p in points(kept) if p.from_ram}
    counts: Counter[str] = Counter()
    unchecked: Counter[str] = Counter()
    for t in run.trials:
        key = (t.config_key, t.workload_key)
        if t.status != "ok":
            counts["failed"] += 1
        elif t.stalled:
            counts["stalled"] += 1
        elif key in faster:
            counts["flagged >BARE"] += 1
        elif key in ram:
            counts["flagged RAM"] += 1
        else:
            counts["clean"] += 1
        if t.status == "ok" and (t.stall is None or not t.stall.checked):
            unchecked[t.stall.reason if t.stall and t.stall.reason else "not recorded"] += 1
    return counts, unchecked


def run_study(name: str, args: argparse.Namespace) -> tuple[Counter[str], Counter[str], str]:
    from iomatrix.store import Store

    work = Path(tempfile.mkdtemp(prefix=f"iomatrix-stalls-{name}-", dir="/var/tmp"))
    try:
        suite = work / f"{name}.toml"
        suite.write_text(suite_text(name, work, args))
        db = work / "results.db"
        started = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "iomatrix", "run", str(suite), "--db",
                               str(db)], capture_output=True, text=True, timeout=3600)
        wall = time.monotonic() - started
        if not db.exists():
            return Counter(), Counter(), f"stored nothing (exit {proc.returncode}): " + (
                proc.stderr.strip().splitlines() or ["?"])[-1]
        with Store(db, readonly=True) as store:
            run = store.load_run(store.resolve("last"))
        counts, unchecked = count(run)
        return counts, unchecked, f"{wall:.0f} s, exit {proc.returncode}"
    finally:
        if args.keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


def show(name: str, counts: Counter[str], unchecked: Counter[str], how: str) -> None:
    ok = sum(v for k, v in counts.items() if k != "failed")
    parts = ", ".join(f"{k} {counts[k]}" for k in ("stalled", "flagged >BARE", "flagged RAM",
                                                     "clean", "failed"))
    print(f"{name}: {ok} ok trials: {parts} ({how})")
    for reason, n in unchecked.most_common():
        print(f"    stalls not checked on {n}: {reason}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("suites", nargs="*", help="study suites (default: all), or run numbers "
                                                  "with --db (default: every run)")
    parser.add_argument("--runtime", default="1s")
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--size", default="256MiB")
    parser.add_argument("--db", help="count the runs stored in this database instead")
    parser.add_argument("--keep", action="store_true", help="keep each run's directory")
    args = parser.parse_args()
    total: Counter[str] = Counter()
    if args.db:
        from iomatrix.store import Store

        with Store(args.db, readonly=True) as store:
            refs = args.suites or [str(r.id) for r in store.list_runs()]
            runs = [store.load_run(store.resolve(r)) for r in refs]
        for run in runs:
            counts, unchecked = count(run)
            total += counts
            show(f"run {run.id} ({run.suite.name})", counts, unchecked, "stored")
    else:
        unknown = [s for s in args.suites if s not in STUDIES]
        if unknown:
            parser.error(f"not a study suite: {', '.join(unknown)}")
        for name in args.suites or STUDIES:
            counts, unchecked, how = run_study(name, args)
            total += counts
            show(name, counts, unchecked, how)
    show("all", total, Counter(), "total")


if __name__ == "__main__":
    main()
