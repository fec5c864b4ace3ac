#!/usr/bin/env python3
"""The cost of Proxmox VE's extra block layers, natively: blocklayer mode (qemu-storage-daemon
+ fio over NBD) with iomatrix's plain graph (platform qemu: format → protocol) against the
graph qemu-server builds for the same settings (platform proxmox: PVE 8 adds detect-zeroes=on on
the format node; PVE 9 detect-zeroes=on and discard=ignore on every node and a throttle filter
over an empty throttle group). 4k random read and write at QD1 and QD32 (io_uring, cache=none,
raw), on a RAM-backed loop device so the disk's noise does not hide a few per cent.

``[method] platform`` is a method setting, not a matrix axis: each arm is its own run, and the
arms alternate round by round (their order rotated every round), so each round gives every
workload one IOPS value per arm, measured minutes apart at most. Per workload, the ratio
arm/plain of each round is a paired log-ratio; their mean and 95 % CI over the rounds
(``iomatrix.analysis.stats.log_ratio_test``) are printed as a ratio, pve9/pve8 too (the
throttle filter alone, near enough: discard=ignore on the nodes below changes no read or write).

    sudo .venv/bin/python bench/pve_layers.py                # 6 rounds × 3 arms, ~5 min
    sudo .venv/bin/python bench/pve_layers.py --rounds 8 --runtime 5s
    sudo .venv/bin/python bench/pve_layers.py --arms plain,plain2     # A/A: the noise floor
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from adaptive_vs_fixed import ram_loop_device  # noqa: E402  (contextlib_ram's loop device)

from iomatrix.analysis.points import points  # noqa: E402
from iomatrix.analysis.stats import log_ratio_test  # noqa: E402
from iomatrix.measure.runner import run_suite  # noqa: E402
from iomatrix.store import Store  # noqa: E402
from iomatrix.suite import load_suite_text  # noqa: E402

ARMS = {"plain": 'platform = "qemu"', "pve8": 'platform = "proxmox"\npve_version = 8',
        "pve9": 'platform = "proxmox"\npve_version = 9', "plain2": 'platform = "qemu"'}
"""plain2: the plain graph again, an A/A arm: its ratio to plain is the noise floor."""
WORKLOADS = [("randread", 1), ("randread", 32), ("randwrite", 1), ("randwrite", 32)]
RATIOS = [("pve8", "plain"), ("pve9", "plain"), ("pve9", "pve8"), ("plain2", "plain")]


def suite(target: str, method: str, args: argparse.Namespace, seed: int) -> str:
    tables = "".join(f'[[workloads]]\nrw = "{rw}"\nbs = "4k"\niodepth = {qd}\n'
                     for rw, qd in WORKLOADS)
    return f"""
[suite]
name = "pve-layers"
[target]
{target}
[matrix]
aio = ["{args.aio}"]
cache = ["{args.cache}"]
format = ["raw"]
iothread = [false]
{tables}
[method]
mode = "blocklayer"
ramp = "{args.ramp}"
runtime = "{args.runtime}"
samples = 1
precondition = {"true" if seed == 1 else "false"}
seed = {seed}
{method}
"""


def one_run(store: Store, text: str) -> dict[str, float]:
    """workload key → IOPS of one run; every trial must pass (the graph checked over QMP)."""
    outcome = run_suite(load_suite_text(text, source="bench"), store)
    run = store.load_run(outcome.run_id)
    bad = [t for t in run.trials if t.status != "ok"]
    if bad:
        raise SystemExit(f"run {outcome.run_id}: {len(bad)} trial(s) failed: "
                         f"{bad[0].reason}")
    return {p.workload_key: float(p.iops or 0.0) for p in points(run)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--runtime", default="3s")
    parser.add_argument("--ramp", default="1s")
    parser.add_argument("--aio", default="io_uring")
    parser.add_argument("--cache", default="none")
    parser.add_argument("--ram-mib", type=int, default=512)
    parser.add_argument("--arms", default="plain,pve8,pve9",
                        help="comma-separated subset of plain,pve8,pve9,plain2 (plain is "
                             "required; plain2 is plain again, the A/A noise floor)")
    args = parser.parse_args()
    arms = args.arms.split(",")
    if "plain" not in arms or not set(arms) <= set(ARMS) or args.rounds < 2:
        parser.error("--arms must include plain (and only plain, pve8, pve9, plain2); "
                     "--rounds >= 2")
    work = Path(tempfile.mkdtemp(prefix="iomatrix-bench-", dir="/var/tmp"))
    values: dict[str, list[dict[str, float]]] = {arm: [] for arm in arms}
    t0 = time.monotonic()
    try:
        with ram_loop_device(args.ram_mib) as device, Store(work / "r.db") as store:
            target = f'device = "{device}"\nallow_destroy = true'
            for r in range(args.rounds):
                order = arms[r % len(arms):] + arms[:r % len(arms)]
                for arm in order:
                    values[arm].append(one_run(store, suite(target, ARMS[arm], args,
                                                            seed=1 + r * len(arms)
                                                            + arms.index(arm))))
                print(f"round {r + 1}/{args.rounds} ({' → '.join(order)}) done at "
                      f"{time.monotonic() - t0:.0f} s", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report(values, arms, args, time.monotonic() - t0)


def report(values: dict[str, list[dict[str, float]]], arms: list[str],
           args: argparse.Namespace, wall: float) -> None:
    print(f"\nblocklayer (qemu-storage-daemon, NBD), aio={args.aio} cache={args.cache} raw, "
          f"RAM-backed loop device; {args.rounds} rounds × {len(arms)} arms interleaved, "
          f"ramp {args.ramp} + {args.runtime} per trial; {wall:.0f} s")
    print_arms(values, arms, RATIOS, width=12)


def print_arms(values: dict[str, list[dict[str, float]]], arms: list[str],
               ratios: list[tuple[str, str]], *, width: int) -> None:
    """Each arm's mean IOPS per workload, then each ratio of arms (``ratios``: numerator,
    denominator) per workload from the paired per-round log-ratios, with its 95 % CI."""
    keys = list(values[arms[0]][0])
    print("mean IOPS per arm (over rounds):")
    print(f"  {'workload':<34}" + "".join(f"{arm:>{width}}" for arm in arms))
    for key in keys:
        print(f"  {key:<34}" + "".join(
            f"{sum(v[key] for v in values[arm]) / len(values[arm]):>{width}.0f}" for arm in arms))
    print("paired per-round ratio, geometric mean [95 % CI], p (t-test of the log-ratios):")
    for num, den in ratios:
        if num not in arms or den not in arms:
            continue
        print(f"  {num}/{den}")
        for key in keys:
            logs = [math.log(a[key] / b[key]) for a, b in zip(values[num], values[den])]
            test = log_ratio_test(logs)
            ci = test.interval
            print(f"    {key:<32} {math.exp(ci.mean):.3f} [{math.exp(ci.low):.3f}, "
                  f"{math.exp(ci.high):.3f}]  p={test.p_value:.3f}")

if __name__ == "__main__":
    main()
