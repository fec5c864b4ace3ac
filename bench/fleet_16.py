#!/usr/bin/env python3
"""A fleet of 16 nodes' quick runs compared in one report: how long, how big, how quick to open.

SYNTHETIC: the runs are made-up figures (``iomatrix.testing.synthetic``) in a real SQLite store,
one per node, each with the built-in quick suite's matrix (host baseline; blocklayer aio × cache ×
format, native+writeback skipped; guest virtio-blk and virtio-scsi-single × iothread) and its
three workloads, with --samples samples (quick itself takes 1; a point needs 2 a side to be
judged), plus an A/A twin of one blocklayer configuration (the noise floor). Nodes differ: most are the reference's equal (±1 % noise), two are slower (−15 %,
−30 %), four sit on another storage (+10 %). Prints the wall and CPU time of loading the 16
runs, ``analysis.fleet.compare_fleet``, ``report.fleet.build_fleet_data`` + write, the page's
size, and opening it in headless Chromium (network blocked) until both charts are drawn.

    .venv/bin/python bench/fleet_16.py [--nodes 16] [--samples 3] [--keep DIR]
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from iomatrix.store import Store  # noqa: E402
from iomatrix.suite.configuration import Configuration  # noqa: E402
from iomatrix.suite.workloads import Workload  # noqa: E402
from iomatrix.testing.synthetic import Figures, configurations, write_run  # noqa: E402

BLOCKLAYER = [c for c in configurations("blocklayer", {
    "aio": ["native", "io_uring", "threads"], "cache": ["none", "writeback"],
    "format": ["raw", "qcow2"], "iothread": [False]}) if not (c.aio == "native" and c.cache == "writeback")]
GUEST = configurations("guest", {"controller": ["virtio-blk", "virtio-scsi-single"],
                                 "iothread": [True, False], "aio": ["io_uring"],
                                 "cache": ["none"], "format": ["raw"]})
# an A/A twin (``[method] aa = true``) gives each run its noise floor
TWIN = Configuration(mode="blocklayer", aio="io_uring", cache="none", format="raw", iothread=False,
                     aa=True)
CONFIGS = [Configuration(mode="host"), *BLOCKLAYER, TWIN, *GUEST]
WORKLOADS = [Workload(rw="randread", bs=4096, iodepth=1), Workload(rw="randread", bs=4096, iodepth=32),
             Workload(rw="randwrite", bs=4096, iodepth=32)]


def node(i: int) -> tuple[str, dict[str, str], float]:
    """Node i's name, host metadata and speed against node 0."""
    speed, target = 1.0, "/var/tmp/iomatrix"
    if i in (5, 11):
        speed = {5: 0.85, 11: 0.7}[i]
    if i >= 12:
        speed, target = 1.1, "/dev/nvme1n1"
    name = f"pve{i + 1:02d}"
    return name, {"hostname": name, "target": target, "target_fs": "ext4", "qemu": "10.0.0",
                  "kernel": "6.8.12-4-pve"}, speed


def figures(name: str, speed: float):  # type: ignore[no-untyped-def]
    def make(config: Configuration, workload: Workload, index: int) -> Figures:
        r = random.Random(zlib.crc32(f"{name}|{config.key}|{workload.key}|{index}".encode()))
        iops = 50_000 * workload.iodepth ** 0.5 * speed * (0.8 if config.mode != "host" else 1.0)
        iops *= r.uniform(0.99, 1.01)
        lat = workload.iodepth / iops * 1e9
        return Figures(iops, iops * workload.bs, lat, 2.5 * lat)
    return make


def timed(label: str, fn, *args, **kw):  # type: ignore[no-untyped-def]
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn(*args, **kw)
    print(f"  {label:<40} {time.perf_counter() - wall:7.2f} s  ({time.process_time() - cpu:.2f} CPU s)",
          flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--keep", type=Path, help="write the database and page here")
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="iomatrix-fleet-"))
    work.mkdir(parents=True, exist_ok=True)
    db = work / "fleet.db"
    db.unlink(missing_ok=True)
    with Store(db) as store:
        ids = []
        for i in range(args.nodes):
            name, host, speed = node(i)
            ids.append(write_run(store, CONFIGS, WORKLOADS, figures(name, speed),
                                 samples=args.samples, host=host, name="quick"))
    print(f"SYNTHETIC fleet: {args.nodes} nodes × quick's matrix ({len(CONFIGS)} configurations ×"
          f" {len(WORKLOADS)} workloads × {args.samples} samples)")

    from iomatrix.analysis.fleet import compare_fleet
    from iomatrix.report.fleet import build_fleet_data, write_fleet_report

    print("timings:")
    with Store(db) as store:
        runs = timed(f"load {len(ids)} runs", lambda: [store.load_run(i) for i in ids])
    fleet = timed("analysis.fleet.compare_fleet", compare_fleet, runs)
    data = timed("build_fleet_data (analysis again)", build_fleet_data, runs)
    path = timed("write_fleet_report", write_fleet_report, data, work / "report")
    print(f"page: {path}  {path.stat().st_size / 2**20:.2f} MiB")
    for n in fleet.nodes:
        print(f"  {n.node} {n.storage}: {n.verdict}")
    try:
        from tests.browser import chromium_available, open_page
    except ImportError:
        chromium_available = None  # type: ignore[assignment]
    if chromium_available is not None and chromium_available():
        t = time.perf_counter()
        with open_page(path, block_network=True, timeout_s=120) as page:
            assert page.problems == [], page.problems
            drawn = page.count('.chart[data-drawn="1"]')
        print(f"open in headless Chromium until both charts are drawn: "
              f"{time.perf_counter() - t:.2f} s (browser start included; {drawn} charts)")
    if args.keep is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
