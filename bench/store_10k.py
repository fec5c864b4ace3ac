#!/usr/bin/env python3
"""The 10,000-point run of ``bench/report_10k.py`` on SQLite and on PostgreSQL, side by side.

Writes the same synthetic run (made-up figures, ``iomatrix.testing.synthetic``; 10,136 points ×
3 samples = 30,408 trials) into an SQLite file, copies it into a PostgreSQL database with
``Store.copy_run`` (what ``iomatrix db copy`` does), and times on each backend: ``Store.load_run``
(best of --repeat), then ``build_report_data`` + ``write_report`` once on the run loaded from it
(the same analysis: only the loading differs). The PostgreSQL server is one of our own
(``iomatrix.testing.pgserver``: a Unix socket on this host, fsync off), removed at the end: the
figures say what the store costs, not what a network to a remote server adds.

    .venv/bin/python bench/store_10k.py [--samples 3] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import report_10k  # noqa: E402
from iomatrix.store import Store  # noqa: E402
from iomatrix.suite.configuration import Configuration  # noqa: E402
from iomatrix.suite.workloads import Workload  # noqa: E402
from iomatrix.testing.pgserver import PgServer  # noqa: E402
from iomatrix.testing.synthetic import configurations, write_run  # noqa: E402


def best(fn, repeat: int):  # type: ignore[no-untyped-def]
    """``fn()``'s result and its shortest wall time of ``repeat`` calls."""
    times, result = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return result, min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="iomatrix-bench-"))
    server = PgServer()
    os.environ.update(server.env())
    try:
        configs = [Configuration(mode="host"), *configurations("guest", report_10k.AXES)]
        workloads = [Workload(rw="randread", bs=bs, iodepth=qd)
                     for bs in report_10k.BLOCK_SIZES for qd in report_10k.DEPTHS]
        db = work / "store-10k.db"
        t0 = time.perf_counter()
        with Store(db) as store:
            run_id = write_run(store, configs, workloads, report_10k.figures,
                               samples=args.samples)
        written = time.perf_counter() - t0
        url = server.create_database("bench")
        t0 = time.perf_counter()
        with Store(db, readonly=True) as source, Store(url) as dest:
            copied = dest.copy_run(source, run_id)
        copy_s = time.perf_counter() - t0
        n = len(configs) * len(workloads)
        print(f"synthetic run: {n:,} points × {args.samples} samples = {n * args.samples:,} "
              f"trials; written to SQLite in {written:.1f} s, copied to PostgreSQL "
              f"{server.bindir.parts[-2]} in {copy_s:.1f} s ({copied.detail})")
        from iomatrix.report.data import build_report_data
        from iomatrix.report.html import write_report

        print(f"{'':<34} {'SQLite':>9} {'PostgreSQL':>11}")
        rows: dict[str, list[float]] = {}
        loaded = []
        for location, key in ((db, copied.source_id), (url, copied.copy_id)):
            with Store(location, readonly=True) as store:
                run, t_load = best(lambda: store.load_run(key), args.repeat)
            loaded.append(run)
            rows.setdefault(f"store.load_run (best of {args.repeat})", []).append(t_load)
            run = report_10k.with_telemetry(run)
            t0 = time.perf_counter()
            data = build_report_data(run)
            write_report(data, work / f"report-{len(loaded)}")
            rows.setdefault("build_report_data + write_report", []).append(
                time.perf_counter() - t0)
        rows["total"] = [sum(col) for col in zip(*rows.values())]
        for name, (lite, pg) in rows.items():
            print(f"{name:<34} {lite:8.2f}s {pg:10.2f}s")
        same = loaded[0].trials == loaded[1].trials and loaded[0].configs == loaded[1].configs
        print(f"the two loaded runs hold the same trials and samples: {same}")
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
