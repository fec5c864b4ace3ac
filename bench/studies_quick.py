#!/usr/bin/env python3
"""The five built-in studies at ``--scale quick``, for real on this host, and their findings.

For each of aio-iothreads (seed 000), cache-format (001), controllers (002), vhost-user (003) and
native-threads (004): ``iomatrix run SUITE --scale quick`` in a fresh directory under /var/tmp
(``iomatrix-findings-*``, removed afterwards), then the suite's findings checked on the run
(``iomatrix.analysis.findings``). Prints per study the trials (ok / failed), the wall time the
run planned against the one it took, and every claim's verdict with the deciding mode, effect,
95 % CI and Holm-adjusted p.

    .venv/bin/python bench/studies_quick.py [SUITE ...] [--keep]
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STUDIES = {"aio-iothreads": "000", "cache-format": "001", "controllers": "002",
           "vhost-user": "003", "native-threads": "004"}
PLANNED = re.compile(r"(\d+) trials, about (.+?) planned")


def run_study(name: str, keep: bool) -> dict[str, object]:
    from iomatrix.analysis.findings import NOT_MEASURABLE, effect_text, evaluate
    from iomatrix.store import Store

    work = Path(tempfile.mkdtemp(prefix=f"iomatrix-findings-{name}-", dir="/var/tmp"))
    try:
        db = work / "results.db"
        started = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "iomatrix", "run", name, "--scale", "quick", "--db", str(db),
             "--target", str(work / "target")],
            capture_output=True, text=True, timeout=1800)
        wall = time.monotonic() - started
        planned = PLANNED.search(proc.stderr + proc.stdout)
        if not db.exists():
            raise SystemExit(f"{name}: the run stored nothing (exit {proc.returncode}):\n"
                             f"{proc.stderr[-2000:]}")
        with Store(db, readonly=True) as store:
            run = store.load_run(store.resolve("last"))
        ok = sum(1 for t in run.trials if t.status == "ok")
        failed = len(run.trials) - ok
        found = evaluate(run)
        rows = []
        for r in found.results:
            check = r.decisive
            measured = r.verdict != NOT_MEASURABLE
            rows.append((r.finding.id, r.verdict, r.mode or "—",
                         effect_text(r.finding, check) if measured else "—",
                         "—" if check.adjusted_p is None or not measured
                         else f"{check.adjusted_p:.3g}",
                         "" if measured else "; ".join(f"{c.mode}: {c.reason}"
                                                       for c in r.checks)))
        return {"name": name, "exit": proc.returncode, "ok": ok, "failed": failed,
                "planned": f"{planned.group(2)} ({planned.group(1)} trials)" if planned else "?",
                "wall": wall, "accelerator": run.accelerator, "family": found.family,
                "rows": rows}
    finally:
        if keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("suites", nargs="*", help=f"some of {', '.join(STUDIES)} (default: all)")
    parser.add_argument("--keep", action="store_true", help="keep each run's directory")
    args = parser.parse_args()
    unknown = [s for s in args.suites if s not in STUDIES]
    if unknown:
        parser.error(f"not a study suite: {', '.join(unknown)}")
    results = []
    for name in args.suites or list(STUDIES):
        print(f"running {name} --scale quick …", file=sys.stderr, flush=True)
        results.append(run_study(name, args.keep))
    print("study  suite           accel  trials ok/failed  exit  planned              measured wall")
    for r in results:
        print(f"{STUDIES[str(r['name'])]}    {r['name']:<15} {r['accelerator']:<6} "
              f"{r['ok']:>4} / {r['failed']:<9} {r['exit']:>4}  {r['planned']:<20} "
              f"{r['wall']:.0f} s")
    for r in results:
        print(f"\nseed {STUDIES[str(r['name'])]} · {r['name']} · {r['family']} checks in the "
              "Holm family")
        width = max(len(row[0]) for row in r["rows"])  # type: ignore[union-attr]
        for fid, verdict, mode, effect, p, reason in r["rows"]:  # type: ignore[union-attr]
            line = f"  {fid:<{width}}  {verdict:<25}  {mode:<10}  {effect}"
            if p != "—":
                line += f"  adj. p {p}"
            if reason:
                line += f"  ({reason})"
            print(line)


if __name__ == "__main__":
    main()
