#!/usr/bin/env python3
"""Time to a trustworthy answer: a host-mode suite of block sizes × queue depths (seed 000's
shape: 7 × 8 = 56 workloads by default) measured two ways in one run, side by side:
  fixed:    every point --fixed-runtime long, --fixed-samples times (the studies' way)
  adaptive: steady state (SNIA rule, min 5 s, max --fixed-runtime) and repetition until the
            95 % CI of each point's mean IOPS is within --target (at least 3, at most 10 samples)
Prints the wall time of each, their ratio, and the worst CI each reached.

    .venv/bin/python bench/adaptive_vs_fixed.py                      # the issue's shape: hours
    .venv/bin/python bench/adaptive_vs_fixed.py --bs 4k,64k,1m,128k --depths 1,32 --fixed-runtime 10s
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from iomatrix.analysis.points import points
from iomatrix.runner import run_suite
from iomatrix.store import Store
from iomatrix.suite import load_suite_text


def suite(work: Path, bs: list[str], depths: list[int], method: str) -> str:
    return f"""
[suite]
name = "bench"
[target]
directory = "{work / 'target'}"
size = "1GiB"
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


def arm(work: Path, text: str) -> tuple[float, float, int, int]:
    with Store(work / "r.db") as store:
        t0 = time.monotonic()
        outcome = run_suite(load_suite_text(text, source="bench"), store)
        wall = time.monotonic() - t0
        found = points(store.load_run(outcome.run_id))
    worst = max((p.iops_ci.relative or 0.0) if p.iops_ci else float("inf") for p in found)
    return wall, worst, outcome.trials_ok, outcome.trials_failed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bs", default="512,4k,8k,16k,32k,64k,128k")
    parser.add_argument("--depths", default="1,2,4,8,16,32,64,128")
    parser.add_argument("--fixed-runtime", default="60s")
    parser.add_argument("--fixed-samples", type=int, default=3)
    parser.add_argument("--target", default="2%")
    args = parser.parse_args()
    bs = args.bs.split(",")
    depths = [int(d) for d in args.depths.split(",")]
    work = Path(tempfile.mkdtemp(prefix="iomatrix-bench-", dir="/var/tmp"))
    try:
        fixed = arm(work, suite(work, bs, depths,
                                f'runtime = "{args.fixed_runtime}"\nsamples = {args.fixed_samples}'))
        adaptive = arm(work, suite(work, bs, depths,
                                   f'steady_state = true\nmin_runtime = "5s"\n'
                                   f'max_runtime = "{args.fixed_runtime}"\nsamples = 3\n'
                                   f'target_ci = "{args.target}"\nmax_samples = 10'))
        n = len(bs) * len(depths)
        print(f"{n} workloads ({len(bs)} block sizes × {len(depths)} queue depths), host mode")
        print(f"{'':<10} {'wall s':>8} {'worst 95% CI':>13} {'trials':>7}")
        for name, (wall, worst, ok, failed) in (("fixed", fixed), ("adaptive", adaptive)):
            print(f"{name:<10} {wall:>8.1f} {'±' + format(worst, '.2%'):>13} {ok:>7}"
                  + (f" ({failed} failed)" if failed else ""))
        print(f"adaptive / fixed wall time: {adaptive[0] / fixed[0]:.2f}; worst CI fixed "
              f"±{fixed[1]:.2%} vs adaptive ±{adaptive[1]:.2%} (target ±{args.target})")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
