#!/usr/bin/env python3
"""The ways to reach a Ceph pool, side by side in one run on the tests' single-node cluster
(tests/ceph.py: one monitor, manager and OSD on memstore, on this host): fio's rbd engine (host
mode: librbd from the host, rbd_cache off, as Ceph's cbt measures a pool) against
qemu-storage-daemon's rbd driver with cache=none (rbd_cache off) and cache=writeback (rbd_cache
on), and one appliance guest on librbd (virtio-blk, cache=none; TCG here, so it measures the
emulator, and is labelled so). 4k random read and write at QD1 and QD32.

One suite, one run: the runner interleaves the configurations round by round (``samples``
rounds, each round every configuration once, in a shuffled order), so each round gives a paired
ratio arm/host per workload; the geometric mean and 95 % CI of those ratios over the rounds
(``iomatrix.analysis.stats.log_ratio_test``) are printed. A memstore OSD keeps the data in RAM:
these figures compare the client paths (librbd, QEMU's block layer, NBD, the guest), not disks.

    sudo .venv/bin/python bench/rbd_paths.py                     # 4 rounds, ~4 min on 2 cores
    sudo .venv/bin/python bench/rbd_paths.py --rounds 6 --runtime 5s --no-guest
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from iomatrix.analysis.stats import log_ratio_test  # noqa: E402
from iomatrix.measure.runner import run_suite  # noqa: E402
from iomatrix.store import Store  # noqa: E402
from iomatrix.suite import load_suite_text  # noqa: E402
from tests import ceph  # noqa: E402


def suite(cluster: ceph.Cluster, args: argparse.Namespace) -> str:
    guest = "" if args.no_guest else """
[[part]]
mode = "guest"
controller = ["virtio-blk"]
cache = ["none"]
format = ["raw"]
iothread = [false]
"""
    return f"""
[suite]
name = "rbd-paths"
[target]
size = "{args.size}"
rbd = {{ pool = "{ceph.POOL}", monitors = ["{cluster.monitor}"], client = "{ceph.CLIENT}", keyring = "{cluster.keyring}" }}
[matrix]
cache = ["none", "writeback"]
format = ["raw"]
iothread = [false]
[[workloads]]
rw = ["randread", "randwrite"]
bs = ["4k"]
iodepth = [1, 32]
[method]
mode = "blocklayer"
baseline = true
ramp = "{args.ramp}"
runtime = "{args.runtime}"
samples = {args.rounds}
seed = 7
{guest}"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--runtime", default="3s")
    parser.add_argument("--ramp", default="1s")
    parser.add_argument("--size", default="256MiB")
    parser.add_argument("--no-guest", action="store_true", help="leave the TCG guest out")
    args = parser.parse_args()
    problem = ceph.missing()
    if problem is not None:
        raise SystemExit(f"no test cluster here: {problem}")
    if args.rounds < 2:
        parser.error("--rounds >= 2")
    work = Path(tempfile.mkdtemp(prefix="iomatrix-bench-", dir="/var/tmp"))
    cluster = ceph.Cluster(work / "ceph")
    (work / "ceph").mkdir()
    t0 = time.monotonic()
    try:
        cluster.start()
        print(f"cluster started in {cluster.start_seconds:.1f} s", flush=True)
        with Store(work / "r.db") as store:
            outcome = run_suite(load_suite_text(suite(cluster, args), source="bench"), store)
            run = store.load_run(outcome.run_id)
        left = [i for i in cluster.images() if i.startswith("iomatrix-")]
    finally:
        stopped = cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    report(run, args, time.monotonic() - t0, stopped, left)


def report(run, args: argparse.Namespace, wall: float, stopped: float,  # type: ignore[no-untyped-def]
           left: list[str]) -> None:
    iops: dict[tuple[str, str], dict[int, float]] = {}
    failed = [t for t in run.trials if t.status != "ok"]
    for t in run.trials:
        if t.status != "ok":
            continue
        value = sum(s.iops for s in t.samples)
        iops.setdefault((t.config_key, t.workload_key), {})[t.sample_index] = value
    configs = list(dict.fromkeys(k for k, _ in iops))
    workloads = list(dict.fromkeys(w for _, w in iops))
    host = next(c for c in configs if c.startswith("host"))
    print(f"\nrun {run.id}: {len(run.trials) - len(failed)} trials ok, {len(failed)} failed; "
          f"{args.rounds} rounds, ramp {args.ramp} + {args.runtime} per trial; {wall:.0f} s "
          f"with the cluster; stopped in {stopped:.1f} s; images left in the pool: {len(left)}")
    for t in failed[:3]:
        print(f"  failed: {t.config_key} {t.workload_key}: {(t.reason or '')[:200]}")
    names = {c: ("host: fio rbd engine (librbd)" if c.startswith("host") else
                 f"guest TCG: {c.split('/', 1)[1]}" if c.startswith("guest")
                 else f"blocklayer: {c.split('/', 1)[1]}") for c in configs}
    print("mean IOPS over the rounds:")
    for c in configs:
        print(f"  {names[c]}")
        for w in workloads:
            values = list(iops.get((c, w), {}).values())
            if values:
                print(f"    {w:<40} {sum(values) / len(values):>10.0f}")
    print("per-round ratio to the host baseline, geometric mean [95 % CI]:")
    for c in configs:
        if c == host:
            continue
        print(f"  {names[c]} / host")
        for w in workloads:
            mine, base = iops.get((c, w), {}), iops.get((host, w), {})
            logs = [math.log(mine[k] / base[k]) for k in sorted(mine) if k in base]
            if len(logs) < 2:
                print(f"    {w:<40} (fewer than 2 paired rounds)")
                continue
            ci = log_ratio_test(logs).interval
            print(f"    {w:<40} {math.exp(ci.mean):.3f} [{math.exp(ci.low):.3f}, "
                  f"{math.exp(ci.high):.3f}]")


if __name__ == "__main__":
    main()
