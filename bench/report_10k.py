#!/usr/bin/env python3
"""Analysis and HTML report of a 10,000-point run: how long, how big, how quick to open.

Writes a synthetic run (``iomatrix.testing.synthetic``: made-up figures in a real SQLite store) of
host + 180 guest configurations (controller 3 × aio 3 × iothread 2 × cache 5 × format 2) ×
56 workloads (7 block sizes × 8 queue depths) × 3 samples = 10,136 points, 30,408 trials. Every
trial is given CPU cost by role and a steady-state verdict, as the runner records them (the
synthetic writer stores neither, so they are added to the loaded run, outside the timings).
Prints:
  - store.load_run, build_report_data, write_report, and their total; build + write is the
    analysis and report (target <= 3 s), with CPU seconds beside wall seconds (the machine may
    be shared: CPU time is what the code costs, wall time what a user waits);
  - with --against DIR (another checkout, e.g. main's before a change): the same timings of
    both trees on the same database, alternately, --rounds times each, best of each, and the
    ratios;
  - where build_report_data's time goes: each analysis call it makes, timed once on its own;
  - the report's size (target <= 5 MiB), and its parts (plotly.js, the run's JSON, the CSV);
  - opening it in headless Chromium (network blocked): script start, first chart drawn, every
    chart near the viewport drawn, every chart drawn, from navigation start; best of --opens.

    .venv/bin/python bench/report_10k.py [--samples 3] [--opens 2] [--keep DIR]
                                         [--against DIR --rounds 2]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# --tree DIR (the measuring subprocess of --against) imports iomatrix from another checkout
TREE = Path(sys.argv[sys.argv.index("--tree") + 1]).resolve() if "--tree" in sys.argv else REPO
sys.path.insert(0, str(TREE))

from iomatrix.store.records import CpuRecord, SteadyRecord, StoredRun  # noqa: E402
from iomatrix.store import Store  # noqa: E402
from iomatrix.suite.configuration import Configuration  # noqa: E402
from iomatrix.suite.workloads import Workload  # noqa: E402
from iomatrix.telemetry.steady import SteadyState  # noqa: E402
from iomatrix.testing.synthetic import Figures, configurations, write_run  # noqa: E402

AXES = {"controller": ["virtio-scsi-single", "virtio-blk", "nvme"],
        "aio": ["native", "io_uring", "threads"], "iothread": [True, False],
        "cache": ["none", "directsync", "writeback", "writethrough", "unsafe"],
        "format": ["raw", "qcow2"]}
BLOCK_SIZES = (512, 4096, 8192, 16384, 32768, 65536, 131072)
DEPTHS = (1, 2, 4, 8, 16, 32, 64, 128)
TARGET_S = 3.0
TARGET_MIB = 5.0


def _rng(*parts: object) -> random.Random:
    return random.Random(zlib.crc32("|".join(map(str, parts)).encode()))


def figures(config: Configuration, workload: Workload, index: int) -> Figures:
    iops = 60_000 * math.sqrt(workload.iodepth) / (1 + workload.bs / 65536)
    if config.mode != "host":
        iops *= 0.7 * (1.1 if config.iothread else 1.0) * (0.95 if config.format == "qcow2" else 1.0)
    iops *= _rng(config.key, workload.key, index).uniform(0.97, 1.03)
    lat = workload.iodepth / iops * 1e9
    return Figures(iops=iops, bw_bytes=iops * workload.bs, lat_mean_ns=lat, p99_ns=2.5 * lat)


def with_telemetry(run: StoredRun) -> StoredRun:
    """CPU cost by role and a steady-state verdict on every ok trial, as the runner stores them."""
    trials = []
    for t in run.trials:
        ios = sum(s.total_ios for s in t.samples) or 1
        guest = t.config_key != "host"
        roles = {"fio (host)": ios * 2e-6}
        if guest:
            roles |= {"vcpu": ios * 6e-6, "main loop": ios * 1e-6,
                      ("iothread" if "iothread=on" in t.config_key else "worker pool"): ios * 3e-6}
        total = sum(roles.values())
        nbytes = sum(s.io_bytes for s in t.samples) or 1
        cpu = CpuRecord(window_s=10.0, cpu_s_by_role=roles, exited_cpu_s=0.0, cpu_s=total,
                        ios=ios, bytes=nbytes, voluntary_csw=ios // 2, involuntary_csw=0,
                        cpu_us_per_io=total / ios * 1e6,
                        cpu_ms_per_mib=total / (nbytes / 2**20) * 1e3, csw_per_io=0.5,
                        perf="not counted (synthetic)")
        reached = _rng("steady", t.id).random() > 0.02
        steady = SteadyRecord(checked=True, source="fio status stream", verdict=SteadyState(
            reached=reached, at_seconds=6.0 if reached else None, windows=5, range_ratio=0.1,
            excursion_ratio=0.05, rule="SNIA PTS"))
        trials.append(t.model_copy(update={"cpu": cpu, "steady": steady}))
    return run.model_copy(update={"trials": tuple(trials)})


def timed(label: str, fn, *args, **kw):  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    result = fn(*args, **kw)
    elapsed = time.perf_counter() - t0
    print(f"  {label:<44} {elapsed:7.2f} s", flush=True)
    return result, elapsed


def breakdown(run: StoredRun) -> None:
    """Each analysis call build_report_data makes, once, on a copy of the run: points and gains
    are kept per run object, so the run the report was built from would answer from memory."""
    from iomatrix.analysis.effects import axes_of, gains
    from iomatrix.analysis.efficiency import efficiency
    from iomatrix.analysis.points import points
    from iomatrix.analysis.scores import scores
    from iomatrix.report.export import samples_csv
    from iomatrix.recommend.decide import recommend

    fresh = run.model_copy()
    pts, _ = timed("analysis.points.points(run)", points, fresh)
    timed("analysis.efficiency.efficiency(points)", efficiency, pts, fresh.configs)
    axes = axes_of(fresh)
    for axis in axes:
        timed(f"analysis.effects.gains(run, {axis!r})", gains, fresh, axis)
    timed("analysis.scores.scores(run)", scores, fresh)
    timed("recommend.recommend(run, 'proxmox')", recommend, fresh, "proxmox")
    timed("  … then 'libvirt' (gains known)", recommend, fresh, "libvirt")
    timed("export.samples_csv(run)", samples_csv, fresh)


def open_in_chromium(path: Path, opens: int) -> None:
    from tests.browser import chromium, chromium_available, open_page

    if not chromium_available():
        print("open in Chromium: skipped (no /usr/bin/chromium)")
        return
    keys = ("scriptStartMs", "firstChartMs", "viewportChartsMs", "allChartsMs")
    best: dict[str, float] = {}
    with chromium() as browser:
        for _ in range(opens):
            with open_page(path, browser=browser, block_network=True, timeout_s=300,
                           wait_for="() => document.documentElement.dataset.charts === 'ready'") as page:
                assert page.problems == [], page.problems
                got = page.evaluate("(keys) => keys.map((k) => Number(document.documentElement.dataset[k]))",
                                    list(keys))
                got.append(page.evaluate("performance.getEntriesByType('navigation')[0].domContentLoadedEventEnd"))
                charts = page.evaluate("document.querySelectorAll('.chart[data-drawn=\"1\"]').length")
                total = page.evaluate("document.querySelectorAll('.chart').length")
                assert charts == total, f"{charts} of {total} charts drawn"
                for k, v in zip((*keys, "domContentLoaded"), got, strict=True):
                    best[k] = min(best.get(k, math.inf), v)
    print(f"open in headless Chromium (best of {opens}, ms from navigation start, {total} charts):")
    print(f"  HTML parsed (DOMContentLoaded)      {best['domContentLoaded']:8.0f} ms")
    print(f"  report script starts                {best['scriptStartMs']:8.0f} ms")
    print(f"  first chart drawn                   {best['firstChartMs']:8.0f} ms")
    print(f"  every chart near the viewport drawn {best['viewportChartsMs']:8.0f} ms")
    print(f"  every chart drawn                   {best['allChartsMs']:8.0f} ms   (one per task, page usable meanwhile)")


def warm_imports() -> None:
    """Import what build_report_data imports on first use (scipy among them: a second or two,
    once per process), so that its timing is the analysis's."""
    import iomatrix.analysis.effects  # noqa: F401
    import iomatrix.analysis.efficiency  # noqa: F401
    import iomatrix.analysis.findings  # noqa: F401
    import iomatrix.recommend.decide  # noqa: F401
    import iomatrix.report.export  # noqa: F401


def measure(db: Path, run_id: int, out: Path) -> dict[str, float]:
    """Load, build and write the report of ``run_id``: wall and CPU seconds of each, page size."""
    from iomatrix.report.data import build_report_data
    from iomatrix.report.html import write_report

    got: dict[str, float] = {}

    def step(name: str, fn, *args):  # type: ignore[no-untyped-def]
        wall, cpu = time.perf_counter(), time.process_time()
        result = fn(*args)
        got[name], got[name + "_cpu"] = time.perf_counter() - wall, time.process_time() - cpu
        return result

    step("imports", warm_imports)

    with Store(db) as store:
        run = step("load", store.load_run, run_id)
    run = with_telemetry(run)
    data = step("build", build_report_data, run)
    path = step("write", write_report, data, out)
    got["mib"] = path.stat().st_size / 2**20
    return got


def against(other: Path, db: Path, run_id: int, work: Path, rounds: int) -> None:
    """The timings of ``other``'s iomatrix and this one's on ``db``, alternately, best of
    ``rounds`` each, and their ratios."""
    best: dict[str, dict[str, float]] = {"before": {}, "after": {}}
    for r in range(rounds):
        for name, tree in (("before", other), ("after", REPO)):
            out = subprocess.run(
                [sys.executable, __file__, "--measure", str(db), str(run_id),
                 str(work / f"report-{name}"), "--tree", str(tree)],
                capture_output=True, text=True, timeout=1800, check=True).stdout
            got = json.loads(out.splitlines()[-1])
            for k, v in got.items():
                best[name][k] = min(best[name].get(k, math.inf), v)
    b, a = best["before"], best["after"]
    print(f"before ({other}) and after ({REPO}), best of {rounds} each, alternately:")
    print(f"  {'':<22} {'before':>16} {'after':>16} {'before/after':>14}")
    for key, label in (("imports", "imports (scipy, once)"), ("load", "store.load_run"),
                       ("build", "build_report_data"),
                       ("write", "write_report")):
        print(f"  {label:<22} {b[key]:7.2f} s ({b[key + '_cpu']:5.2f} cpu)"
              f" {a[key]:7.2f} s ({a[key + '_cpu']:5.2f} cpu) {b[key] / a[key]:6.1f}× wall"
              f" {b[key + '_cpu'] / a[key + '_cpu']:5.1f}× cpu")
    for label, keys in (("analysis + report", ("build", "write")),):
        bw, aw = sum(b[k] for k in keys), sum(a[k] for k in keys)
        bc, ac = sum(b[k + "_cpu"] for k in keys), sum(a[k + "_cpu"] for k in keys)
        print(f"  {label:<22} {bw:7.2f} s ({bc:5.2f} cpu) {aw:7.2f} s ({ac:5.2f} cpu)"
              f" {bw / aw:6.1f}× wall {bc / ac:5.1f}× cpu")
    print(f"  {'page size':<22} {b['mib']:10.1f} MiB {a['mib']:10.1f} MiB {b['mib'] / a['mib']:6.1f}×")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--opens", type=int, default=2)
    parser.add_argument("--keep", type=Path, help="write the database and report here")
    parser.add_argument("--no-breakdown", action="store_true")
    parser.add_argument("--against", type=Path, help="another checkout to time side by side")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tree", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--measure", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        db, run_id, out = args.measure
        print(json.dumps(measure(Path(db), int(run_id), Path(out))))
        return
    work = args.keep or Path(tempfile.mkdtemp(prefix="iomatrix-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    configs = [Configuration(mode="host"), *configurations("guest", AXES)]
    workloads = [Workload(rw="randread", bs=bs, iodepth=qd) for bs in BLOCK_SIZES for qd in DEPTHS]
    db = work / "report-10k.db"
    db.unlink(missing_ok=True)
    t0 = time.perf_counter()
    with Store(db) as store:
        run_id = write_run(store, configs, workloads, figures, samples=args.samples)
    n = len(configs) * len(workloads)
    print(f"synthetic run: {len(configs)} configurations × {len(workloads)} workloads = {n:,} points"
          f" × {args.samples} samples = {n * args.samples:,} trials (written in"
          f" {time.perf_counter() - t0:.1f} s)")

    from iomatrix.report.data import build_report_data
    from iomatrix.report.html import write_report

    if args.against:
        against(args.against, db, run_id, work, args.rounds)
    print("timings:")
    timed("imports (scipy, once per process)", warm_imports)
    with Store(db) as store:
        run, t_load = timed("store.load_run", store.load_run, run_id)
    run = with_telemetry(run)
    cpu = time.process_time()
    data, t_build = timed("build_report_data", build_report_data, run)
    path, t_write = timed("write_report", write_report, data, work / "report")
    cpu = time.process_time() - cpu
    total = t_build + t_write
    verdict = "ok" if total <= TARGET_S else "OVER TARGET"
    print(f"  {'analysis + report (build + write)':<44} {total:7.2f} s   ({cpu:.2f} CPU s;"
          f" target <= {TARGET_S:g} s: {verdict})")
    print(f"  {'with store.load_run':<44} {total + t_load:7.2f} s")

    html = path.read_text(encoding="utf-8")
    size = len(html.encode())
    parts = {name: len(m.group(1).encode()) for name, pattern in (
        ("data JSON (gzip+base85)", r'<script type="application/octet-stream" id="report-data"[^>]*>(.*?)</script>'),
        ("raw CSV (gzip+base85)", r'<script type="application/octet-stream" id="samples-csv"[^>]*>(.*?)</script>'),
        ("plotly.js (gzip+base85)", r'<script type="application/octet-stream" id="plotly-js"[^>]*>(.*?)</script>'),
    ) if (m := re.search(pattern, html, re.DOTALL))}
    print(f"report: {path}  {size / 2**20:.1f} MiB"
          f" (target <= {TARGET_MIB:g} MiB: {'ok' if size <= TARGET_MIB * 2**20 else 'OVER TARGET'})")
    for name, n_bytes in parts.items():
        print(f"  {name:<24} {n_bytes / 2**20:6.1f} MiB")
    print(f"  {'the rest (page, tables)':<24} {(size - sum(parts.values())) / 2**20:6.1f} MiB")
    print(f"  {len(data.points):,} points, {len(data.gains)} gain sets, "
          f"{len(data.scores.rows) if data.scores else 0} scored configurations")

    open_in_chromium(path, args.opens)
    if not args.no_breakdown:
        print("where build_report_data's time goes (each call timed once, on its own):")
        breakdown(run)
    if args.keep is None:
        shutil.rmtree(work, ignore_errors=True)     # nothing left behind unless --keep


if __name__ == "__main__":
    main()
