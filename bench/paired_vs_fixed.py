#!/usr/bin/env python3
"""Time to a trustworthy gain: aio=native against aio=io_uring in QEMU's block layer over seed
000's 56 random-read workloads (7 block sizes 512..128k × QD 1..128), measured two ways:
  paired:  short trials (--paired-runtime) in interleaved rounds; every gain paired by round
           (log ratios within a round, t-interval across rounds); rounds continue (3 to
           --max-rounds) until every gain the run reports (per queue depth) is within ±--target
           percentage points or decided (``analysis.paired.needing_more``)
  planner: [method] pilot = true: a pilot measures the noise at 1 s and 4 s, the drift and the
           fixed costs, then trial length (up to --planner-max-runtime) and rounds (up to
           --max-rounds) are chosen for the least wall time to ±--target; rounds then fixed
  fixed:   every point --fixed-runtime long, --fixed-samples times, gains unpaired (the
           studies' way: Welch/Fieller per workload, t across pairs per queue depth)
--arms picks which run (default all three). --hog runs a CPU hog on one core (a busy loop
pinned to CPU 0, started before the first arm and stopped after the last): the loaded host.
Both arms measure an A/A twin of aio=native ([method] aa = true); printed: wall time, the widest
95 % CI each arm's gains reached (per queue depth, and per workload), and the A/A
false-difference rate of each method (how often the identical pair is called different at
p < 0.05 across workloads).

The fixed arm's time per workload does not depend on the storage: --fixed-subset N measures it
on N workloads (seeded draw) and projects it to all, said so. --workloads N reduces the suite to
N workloads (seeded draw from the 56) for both arms. The target is a RAM-backed loop device
(bench/adaptive_vs_fixed.py's helper; root): aio=native needs O_DIRECT, which tmpfs lacks.

    .venv/bin/python bench/paired_vs_fixed.py                                 # hours
    .venv/bin/python bench/paired_vs_fixed.py --workloads 6 --fixed-subset 1 --fixed-runtime 10s
"""

from __future__ import annotations

import argparse
import contextlib
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from adaptive_vs_fixed import contextlib_ram  # noqa: E402 (the bench's own helper)

from iomatrix.analysis.effects import gains  # noqa: E402
from iomatrix.analysis.paired import aa_report, is_twin  # noqa: E402
from iomatrix.analysis.points import only_configs  # noqa: E402
from iomatrix.measure.runner import run_suite  # noqa: E402
from iomatrix.store import Store  # noqa: E402
from iomatrix.store.records import StoredRun  # noqa: E402
from iomatrix.suite import load_suite_text  # noqa: E402

BLOCK_SIZES = ("512", "4k", "8k", "16k", "32k", "64k", "128k")
DEPTHS = (1, 2, 4, 8, 16, 32, 64, 128)


def suite(target: str, workloads: list[tuple[str, int]], method: str) -> str:
    tables = "".join(f'[[workloads]]\nrw = "randread"\nbs = "{b}"\niodepth = {d}\n'
                     for b, d in workloads)
    return f"""
[suite]
name = "bench-paired"
[target]
{target}
[matrix]
aio = ["native", "io_uring"]
cache = "none"
format = "raw"
iothread = false
{tables}
[method]
mode = "blocklayer"
seed = 1
aa = true
{method}
"""


def widest(run: StoredRun, paired: bool) -> tuple[float, float, str]:
    """The widest 95 % CI half-width of the aio gains per queue depth and per workload, and
    the methods used."""
    real = only_configs(run, {c.key for c in run.configs if not is_twin(c)})
    per_qd = gains(real, "aio", by=("iodepth",), paired=paired)
    per_wl = gains(real, "aio", by=("workload",), paired=paired)

    def half(found: list) -> float:  # type: ignore[type-arg]
        return max(((g.high - g.low) / 2 if g.low is not None and g.high is not None
                    else float("inf")) for g in found)
    methods = "/".join(dict.fromkeys(g.method for g in per_qd + per_wl))
    return half(per_qd), half(per_wl), methods


def arm(work: Path, text: str, paired: bool, name: str) -> dict[str, object]:
    db = work / f"{name}.db"
    with Store(db) as store:
        t0 = time.monotonic()
        outcome = run_suite(load_suite_text(text, source="bench"), store)
        wall = time.monotonic() - t0
        run = store.load_run(outcome.run_id)
        plan = next((n for n in run.notes if n.startswith("pilot:")), "")
    qd, wl, methods = widest(run, paired)
    aa = aa_report(run, paired=paired)
    rounds = max(t.sample_index for t in run.trials) + 1
    return {"wall": wall, "qd": qd, "wl": wl, "methods": methods, "aa": aa,
            "trials": outcome.trials_ok, "failed": outcome.trials_failed, "rounds": rounds,
            "plan": plan}


@contextlib.contextmanager
def cpu_hog(on: bool) -> Iterator[None]:
    """A busy loop pinned to CPU 0 while the arms run (the synthetic load), stopped after."""
    if not on:
        yield
        return
    hog = subprocess.Popen([sys.executable, "-c",
                            "import os\nos.sched_setaffinity(0, {0})\nwhile True: pass"])
    try:
        yield
    finally:
        hog.kill()
        hog.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", type=int, default=56,
                        help="measure this many of the 56 workloads (seeded draw)")
    parser.add_argument("--fixed-subset", type=int, default=0,
                        help="measure the fixed arm on this many workloads and project (0: all)")
    parser.add_argument("--fixed-runtime", default="60s")
    parser.add_argument("--fixed-samples", type=int, default=3)
    parser.add_argument("--paired-runtime", default="2s")
    parser.add_argument("--ramp", default="500ms")
    parser.add_argument("--target", default="2%")
    parser.add_argument("--max-rounds", type=int, default=30)
    parser.add_argument("--planner-max-runtime", default="60s")
    parser.add_argument("--arms", default="paired,planner,fixed")
    parser.add_argument("--hog", action="store_true", help="a CPU hog on one core meanwhile")
    args = parser.parse_args()
    arms = args.arms.split(",")
    every = [(b, d) for b in BLOCK_SIZES for d in DEPTHS]
    chosen = every if args.workloads >= len(every) else sorted(
        random.Random(1).sample(every, args.workloads), key=every.index)
    subset = chosen
    if args.fixed_subset and args.fixed_subset < len(chosen):
        subset = sorted(random.Random(2).sample(chosen, args.fixed_subset), key=chosen.index)
    work = Path(tempfile.mkdtemp(prefix="iomatrix-bench-", dir="/var/tmp"))
    results: dict[str, dict[str, object]] = {}
    try:
        with contextlib_ram(True) as device, cpu_hog(args.hog):
            target = f'device = "{device}"\nallow_destroy = true'
            if "paired" in arms:
                results["paired"] = arm(work, suite(
                    target, chosen, f'ramp = "{args.ramp}"\nruntime = "{args.paired_runtime}"\n'
                    f'samples = 3\ntarget_ci = "{args.target}"\nmax_samples = {args.max_rounds}'),
                    True, "paired")
                print(f"paired arm done: {results['paired']['wall']:.0f} s", flush=True)
            if "planner" in arms:
                results["planner"] = arm(work, suite(
                    target, chosen, f'ramp = "{args.ramp}"\npilot = true\n'
                    f'target_ci = "{args.target}"\nmax_samples = {args.max_rounds}\n'
                    f'max_runtime = "{args.planner_max_runtime}"'), True, "planner")
                print(f"planner arm done: {results['planner']['wall']:.0f} s", flush=True)
            if "fixed" in arms:
                results["fixed"] = arm(work, suite(
                    target, subset, f'ramp = "1s"\nruntime = "{args.fixed_runtime}"\n'
                    f'samples = {args.fixed_samples}'), False, "fixed")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    n = len(chosen)
    print(f"aio=io_uring vs aio=native, blocklayer (NBD export, cache=none, raw), randread on a "
          f"RAM-backed loop device; {n} workloads"
          + ("" if n == len(every) else " of 56 (reduced): "
             + ", ".join(f"{b} QD{d}" for b, d in chosen)))
    print(f"{'':<8} {'wall s':>8} {'rounds':>6} {'widest CI per QD':>17} {'per workload':>13} "
          f"{'A/A called different':>21}  method")

    def aa_text(a: object) -> str:
        r = a["aa"]  # type: ignore[index]
        return "—" if r is None or not r.tested else f"{r.significant_raw}/{r.tested}"

    for name, r in results.items():
        print(f"{name:<8} {r['wall']:>8.1f} {r['rounds']:>6} {'±' + format(r['qd'], '.2%'):>17} "
              f"{'±' + format(r['wl'], '.2%'):>13} {aa_text(r):>21}  {r['methods']}")
    fixed = results.get("fixed")
    fixed_wall = fixed["wall"] if fixed else None
    if fixed is not None and subset is not chosen:
        fixed_wall = fixed["wall"] / len(subset) * n  # type: ignore[operator]
        print(f"fixed arm measured on {len(subset)} of {n} workloads "
              f"({', '.join(f'{b} QD{d}' for b, d in subset)}); PROJECTED to {n}: "
              f"{fixed_wall:.0f} s ({fixed['wall'] / len(subset):.1f} s per workload); its "
              "widest CIs are those of the measured subset")
    print(f"fixed runtime {args.fixed_runtime} × {args.fixed_samples}; paired runtime "
          f"{args.paired_runtime}, target ±{args.target} on every gain, at most "
          f"{args.max_rounds} rounds" + ("; CPU hog on core 0 throughout" if args.hog else ""))
    for name in ("paired", "planner"):
        if name in results and fixed_wall:
            print(f"{name} / fixed wall time: {results[name]['wall'] / fixed_wall:.3f}")
    if "planner" in results:
        print(f"planner: {results['planner']['plan']}")
    for name, r in results.items():
        a = r["aa"]
        if a is not None:
            print(f"{name}: {a.text()}")  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
