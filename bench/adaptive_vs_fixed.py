#!/usr/bin/env python3
"""Time to a trustworthy answer: a host-mode suite of block sizes × queue depths (seed 000's
shape: 7 × 8 = 56 workloads by default) measured two ways in one run of this script:
  fixed:    every point --fixed-runtime long, --fixed-samples times (the studies' way)
  adaptive: steady state (SNIA rule, min --min-runtime, max --fixed-runtime) and repetition
            until the 95 % CI of each point's mean IOPS is within --target (3 to 10 samples)
Prints the wall time of each, their ratio, and the worst CI each reached.

The fixed arm's time per point does not depend on the storage (samples × (ramp + runtime) plus
iomatrix's per-trial overhead): --fixed-subset N measures it on N workloads drawn at random
(seeded) and projects it to all of them, said so in the output. --ram puts the target on a loop
device backed by RAM (tmpfs), where run-to-run noise is low: on a noisy shared disk neither arm
reaches ±2 % and the comparison measures the disk, not the method.

    .venv/bin/python bench/adaptive_vs_fixed.py                      # the issue's shape: hours
    .venv/bin/python bench/adaptive_vs_fixed.py --ram --fixed-subset 4   # 56 adaptive, ~45 min
"""

from __future__ import annotations

import argparse
import random
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from iomatrix.analysis.points import points
from iomatrix.measure.runner import run_suite
from iomatrix.store import Store
from iomatrix.suite import load_suite_text


def suite(target: str, bs: list[str], depths: list[int], method: str) -> str:
    return f"""
[suite]
name = "bench"
[target]
{target}
[workloads]
rw = "randread"
bs = {bs}
iodepth = {depths}
[method]
mode = "host"
ramp = "1s"
seed = 1
{method}
"""


@contextmanager
def ram_loop_device(size_mib: int) -> Iterator[Path]:
    """A loop device over a file in /dev/shm (tmpfs): storage without a shared disk's noise."""
    backing = Path(tempfile.mkdtemp(prefix="iomatrix-bench-", dir="/dev/shm")) / "backing.img"
    with open(backing, "wb") as f:
        f.truncate(size_mib << 20)
    dev = subprocess.run(["losetup", "--find", "--show", str(backing)], capture_output=True,
                         text=True, check=True).stdout.strip()
    try:
        yield Path(dev)
    finally:
        subprocess.run(["losetup", "-d", dev], check=False)
        shutil.rmtree(backing.parent, ignore_errors=True)


def arm(work: Path, text: str) -> tuple[float, float, int, int]:
    with Store(work / "r.db") as store:
        t0 = time.monotonic()
        try:
            outcome = run_suite(load_suite_text(text, source="bench"), store)
        except KeyboardInterrupt:
            _partial(store, time.monotonic() - t0)
            raise
        wall = time.monotonic() - t0
        found = points(store.load_run(outcome.run_id))
    worst = max((p.iops_ci.relative or 0.0) if p.iops_ci else float("inf") for p in found)
    return wall, worst, outcome.trials_ok, outcome.trials_failed


def _partial(store: Store, wall: float) -> None:
    """What an interrupted arm had reached: its points' CIs and sample counts so far."""
    run = store.load_run(store.resolve("last"))
    found = points(run)
    cis = sorted(p.iops_ci.relative for p in found if p.iops_ci and p.iops_ci.relative is not None)
    done = sum(1 for c in cis if c <= 0.02)
    print(f"interrupted after {wall:.0f} s: {len(run.trials)} trials, {len(found)} points, "
          f"samples per point {min(p.samples for p in found)}-{max(p.samples for p in found)}; "
          f"{done} points within ±2 %; CIs now: median ±{cis[len(cis) // 2]:.2%}, "
          f"worst ±{cis[-1]:.2%}" if cis else f"interrupted after {wall:.0f} s", flush=True)


def _stop(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> None:
    signal.signal(signal.SIGTERM, _stop)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bs", default="512,4k,8k,16k,32k,64k,128k")
    parser.add_argument("--depths", default="1,2,4,8,16,32,64,128")
    parser.add_argument("--fixed-runtime", default="60s")
    parser.add_argument("--fixed-samples", type=int, default=3)
    parser.add_argument("--fixed-subset", type=int, default=0,
                        help="measure the fixed arm on this many workloads and project (0: all)")
    parser.add_argument("--min-runtime", default="5s")
    parser.add_argument("--target", default="2%")
    parser.add_argument("--ram", action="store_true", help="target a RAM-backed loop device")
    args = parser.parse_args()
    bs = args.bs.split(",")
    depths = [int(d) for d in args.depths.split(",")]
    pairs = [(b, d) for b in bs for d in depths]
    n = len(pairs)
    work = Path(tempfile.mkdtemp(prefix="iomatrix-bench-", dir="/var/tmp"))
    with contextlib_ram(args.ram) as device:
        target = (f'device = "{device}"\nallow_destroy = true' if device
                  else f'directory = "{work / "target"}"\nsize = "1GiB"')
        try:
            subset = pairs
            if args.fixed_subset and args.fixed_subset < n:
                subset = random.Random(1).sample(pairs, args.fixed_subset)
            fixed = _arm_subset(work, target, subset, args) if subset is not pairs else arm(
                work, suite(target, bs, depths, f'runtime = "{args.fixed_runtime}"\n'
                                                f'samples = {args.fixed_samples}'))
            print(f"fixed arm: {fixed[0]:.1f} s, worst CI ±{fixed[1]:.2%}, {fixed[2]} trials",
                  flush=True)
            adaptive = arm(work, suite(target, bs, depths,
                                       f'steady_state = true\nmin_runtime = "{args.min_runtime}"\n'
                                       f'max_runtime = "{args.fixed_runtime}"\nsamples = 3\n'
                                       f'target_ci = "{args.target}"\nmax_samples = 10'))
        finally:
            shutil.rmtree(work, ignore_errors=True)
    where = f"RAM-backed loop device {device}" if args.ram else "a file on /var/tmp's disk"
    print(f"{n} workloads ({len(bs)} block sizes × {len(depths)} queue depths), host mode, "
          f"randread on {where}")
    print(f"{'':<10} {'wall s':>8} {'worst 95% CI':>13} {'trials':>7}")
    fixed_wall = fixed[0]
    if subset is not pairs:
        fixed_wall = fixed[0] / len(subset) * n
        print(f"{'fixed':<10} {fixed[0]:>8.1f} {'±' + format(fixed[1], '.2%'):>13} {fixed[2]:>7}"
              f"  measured on {len(subset)} of {n} workloads: "
              + ", ".join(f"{b} QD{d}" for b, d in subset))
        print(f"{'':<10} {fixed_wall:>8.1f} {'':>13} {'':>7}  projected to {n} workloads "
              f"({fixed[0] / len(subset):.1f} s per workload)")
    else:
        print(f"{'fixed':<10} {fixed[0]:>8.1f} {'±' + format(fixed[1], '.2%'):>13} {fixed[2]:>7}")
    print(f"{'adaptive':<10} {adaptive[0]:>8.1f} {'±' + format(adaptive[1], '.2%'):>13} "
          f"{adaptive[2]:>7}" + (f" ({adaptive[3]} failed)" if adaptive[3] else ""))
    print(f"adaptive / fixed wall time: {adaptive[0] / fixed_wall:.3f}; worst CI fixed "
          f"±{fixed[1]:.2%} vs adaptive ±{adaptive[1]:.2%} (target ±{args.target})")


@contextmanager
def contextlib_ram(ram: bool) -> Iterator[Path | None]:
    if not ram:
        yield None
        return
    with ram_loop_device(1536) as device:
        yield device


def _arm_subset(work: Path, target: str, subset: list[tuple[str, int]],
                args: argparse.Namespace) -> tuple[float, float, int, int]:
    """The fixed arm on ``subset``: one suite whose workloads are exactly those (a [[workloads]]
    table each), so that they interleave as in a full run."""
    tables = "".join(f'[[workloads]]\nrw = "randread"\nbs = "{b}"\niodepth = {d}\n'
                     for b, d in subset)
    text = f"""
[suite]
name = "bench"
[target]
{target}
{tables}
[method]
mode = "host"
ramp = "1s"
seed = 1
runtime = "{args.fixed_runtime}"
samples = {args.fixed_samples}
"""
    return arm(work, text)


if __name__ == "__main__":
    main()
