#!/usr/bin/env python3
"""Time to a trustworthy gain: aio=native against aio=io_uring in QEMU's block layer over seed
000's 56 random-read workloads (7 block sizes 512..128k × QD 1..128), measured three ways:
  paired:  target_ci at a fixed short trial (--paired-runtime): a pilot at that trial measures
           the noise of a gain per round, then the rounds (3 to --max-rounds) with the least
           time to ±--target on every gain (per queue depth) are chosen and all measured
  planner: [method] pilot = true: a pilot at 1 s and 4 s measures within-trial noise, drift and
           fixed costs, then trial length (up to --planner-max-runtime) and rounds (up to
           --max-rounds) are chosen for the least wall time to ±--target; rounds then fixed
  fixed:   every point --fixed-runtime long, --fixed-samples times, gains unpaired (the
           studies' way: Welch/Fieller per workload, t across pairs per queue depth)
--arms picks which run (default all three). --hog runs a CPU hog on one core (a busy loop
pinned to CPU 0, started before the first arm and stopped after the last): the loaded host.
Every arm measures an A/A twin of aio=native ([method] aa = true); printed: wall time, the widest
95 % CI each arm's gains reached (per queue depth, and per workload), and the A/A
false-difference rate of each method (how often the identical pair is called different at
p < 0.05 across workloads).

The fixed arm's time per workload does not depend on the storage: --fixed-subset N measures it
on N workloads (seeded draw) and projects it to all, labelled PROJECTED. --workloads N reduces
the suite to N workloads (seeded draw from the 56) for every arm. The target is a RAM-backed
loop device (bench/adaptive_vs_fixed.py's helper; root): aio=native needs O_DIRECT, which tmpfs
lacks.

Bounded: the paired and planner arms can take at most their caps (the pilot, then --max-rounds
rounds at the longest trial); the bench prints each arm's expected time and cap before it
starts (iomatrix's own estimate: ramp + runtime + 0.3 s a trial, 0.3 s a daemon start), what
the pilot chose, and a progress line every --every seconds. --dry-run prints only that.
Ctrl-C or SIGTERM stops it cleanly (every process, the loop device and the work directory go).

    .venv/bin/python bench/paired_vs_fixed.py --dry-run           # the plan and its bounds
    .venv/bin/python bench/paired_vs_fixed.py                     # quiet host: ~2-4 h
    .venv/bin/python bench/paired_vs_fixed.py --hog               # loaded host: up to the caps
    .venv/bin/python bench/paired_vs_fixed.py --workloads 4 --fixed-subset 1 --fixed-runtime 10s

Each arm's CI is also printed on the workloads the fixed arm measured (like for like: the fixed
arm's per-QD gain needs every block size at a depth, which a subset rarely has). An interval
printed "unbounded" has no finite end: a per-QD gain with one pair, or a Fieller ratio whose
reference's own interval reaches zero. --keep DIR keeps each arm's database.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import shutil
import signal
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
from iomatrix.analysis.trialplan import PILOT_ROUNDS, pilot_lengths  # noqa: E402
from iomatrix.measure.runner import pilot_points, run_suite  # noqa: E402
from iomatrix.store import Store  # noqa: E402
from iomatrix.store.records import StoredRun  # noqa: E402
from iomatrix.suite import expand, load_suite_text  # noqa: E402
from iomatrix.suite.configuration import Configuration  # noqa: E402
from iomatrix.suite.workloads import Workload  # noqa: E402
from iomatrix.suite.plan import duration_text, estimate, plan  # noqa: E402

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


def _half(g) -> float:  # type: ignore[no-untyped-def]
    """A gain's 95 % CI half-width; inf where it has none (one pair for a per-QD gain across
    pairs, or an unbounded ratio interval: Fieller's, when the reference's own interval
    reaches zero)."""
    return (g.high - g.low) / 2 if g.low is not None and g.high is not None else float("inf")


def widest(run: StoredRun, paired: bool) -> tuple[float, float, str, dict[str, float]]:
    """The widest 95 % CI half-width of the aio gains per queue depth and per workload, the
    methods used, and each workload's half-width (by its key)."""
    real = only_configs(run, {c.key for c in run.configs if not is_twin(c)})
    per_qd = gains(real, "aio", by=("iodepth",), paired=paired)
    per_wl = gains(real, "aio", by=("workload",), paired=paired)
    methods = "/".join(dict.fromkeys(g.method for g in per_qd + per_wl))
    return (max(map(_half, per_qd)), max(map(_half, per_wl)), methods,
            {str(g.workload): _half(g) for g in per_wl})


def pm(half: float) -> str:
    """±x.xx %, or "unbounded"."""
    return "unbounded" if half == float("inf") else f"±{half:.2%}"


class Printed:
    """Progress for the bench: the pilot's notes as they come, and every ``every`` seconds a
    line with the trials done of those planned so far and the time elapsed."""

    def __init__(self, name: str, every: float) -> None:
        self.name, self.every = name, every
        self.t0 = self.last = time.monotonic()
        self.total = 0

    def start(self, trials: int, planned_seconds: float) -> None:
        self.more(trials, planned_seconds)

    def more(self, trials: int, planned_seconds: float) -> None:
        self.total += trials
        self.say(f"{trials} trials more planned (about {duration_text(planned_seconds)})")

    def trial_started(self, n: int, config: Configuration, workload: Workload,
                      sample: int) -> None:
        pass

    def trial_finished(self, n: int, ok: bool, detail: str) -> None:
        if time.monotonic() - self.last >= self.every:
            self.last = time.monotonic()
            self.say(f"{n}/{self.total} trials")

    def note(self, text: str) -> None:
        if text.startswith("pilot:"):
            self.say(text)

    def say(self, text: str) -> None:
        print(f"[{self.name} {duration_text(time.monotonic() - self.t0)}] {text}", flush=True)


def bounds(text: str) -> tuple[float, float, float]:
    """(pilot, least, cap) seconds of an arm by iomatrix's own estimate: the pilot's trials;
    the pilot and the fewest rounds (3, or the suite's samples) at the shortest trial the plan
    may choose; the pilot and max_samples rounds at the longest."""
    suite = load_suite_text(text, source="bench")
    m = suite.method
    expansion = expand(suite)
    if not m.plans_rounds:
        seconds = estimate(expansion, m).seconds
        return 0.0, seconds, seconds
    pairs, _ = pilot_points(expansion, m.seed or 0)
    lengths = pilot_lengths(m.chooses_runtime, m.window)
    pilot = PILOT_ROUNDS * len(pairs) * sum(t + m.ramp + 0.3 for t in lengths)
    shortest = 0.5 if m.chooses_runtime else m.runtime
    longest = m.max_runtime if m.chooses_runtime else m.runtime

    def at(runtime: float, rounds: int) -> float:
        return estimate(expansion, m.model_copy(update={"runtime": runtime,
                                                         "samples": rounds})).seconds
    return pilot, pilot + at(shortest, max(3, m.samples)), pilot + at(longest, m.max_samples)


def arm(work: Path, text: str, paired: bool, name: str, every: float,
        keep: Path | None = None) -> dict[str, object]:
    pilot, least, cap = bounds(text)
    span = (f"at least {duration_text(least)}, at most {duration_text(cap)}" if cap > least
            else f"about {duration_text(cap)}")
    print(f"[{name}] starts: {'pilot about ' + duration_text(pilot) + ', ' if pilot else ''}"
          f"{span} by iomatrix's estimate (slower under load)", flush=True)
    db = work / f"{name}.db"
    with Store(db) as store:
        t0 = time.monotonic()
        outcome = run_suite(load_suite_text(text, source="bench"), store,
                            progress=Printed(name, every))
        wall = time.monotonic() - t0
        run = store.load_run(outcome.run_id)
        note = next((n for n in run.notes if n.startswith("pilot:")), "")
    if keep is not None:   # the run itself (closed: no WAL beside it), for iomatrix --db
        shutil.copyfile(db, keep / f"{name}.db")
    qd, wl, methods, each = widest(run, paired)
    aa = aa_report(run, paired=paired)
    rounds = max(t.sample_index for t in run.trials) + 1
    chosen = note[note.find("chosen: "):] if "chosen: " in note else ""
    print(f"[{name}] done: {wall:.0f} s, {rounds} rounds, widest CI per QD {pm(qd)}"
          + (f"; {chosen}" if chosen else ""), flush=True)
    return {"wall": wall, "qd": qd, "wl": wl, "each": each, "methods": methods, "aa": aa,
            "trials": outcome.trials_ok, "failed": outcome.trials_failed, "rounds": rounds,
            "plan": note}


def _stop(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


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
    parser.add_argument("--fixed-subset", type=int, default=2,
                        help="measure the fixed arm on this many workloads and project (0: all)")
    parser.add_argument("--fixed-runtime", default="60s")
    parser.add_argument("--fixed-samples", type=int, default=3)
    parser.add_argument("--paired-runtime", default="2s")
    parser.add_argument("--ramp", default="500ms")
    parser.add_argument("--target", default="2%")
    parser.add_argument("--max-rounds", type=int, default=8,
                        help="the most rounds a pilot may choose (bounds the paired and "
                        "planner arms)")
    parser.add_argument("--planner-max-runtime", default="4s",
                        help="the longest trial the planner may choose")
    parser.add_argument("--arms", default="paired,planner,fixed")
    parser.add_argument("--hog", action="store_true", help="a CPU hog on one core meanwhile")
    parser.add_argument("--every", type=float, default=60.0,
                        help="seconds between progress lines")
    parser.add_argument("--keep", type=Path, metavar="DIR",
                        help="keep each arm's results database in DIR (made if missing) for "
                        "iomatrix show/effect --db DIR/ARM.db")
    parser.add_argument("--dry-run", action="store_true",
                        help="print each arm's expected time and cap, measure nothing")
    args = parser.parse_args()
    arms = args.arms.split(",")
    every = [(b, d) for b in BLOCK_SIZES for d in DEPTHS]
    chosen = every if args.workloads >= len(every) else sorted(
        random.Random(1).sample(every, args.workloads), key=every.index)
    subset = chosen
    if args.fixed_subset and args.fixed_subset < len(chosen):
        subset = sorted(random.Random(2).sample(chosen, args.fixed_subset), key=chosen.index)
    methods = {
        "paired": (chosen, f'ramp = "{args.ramp}"\nruntime = "{args.paired_runtime}"\n'
                   f'samples = 3\ntarget_ci = "{args.target}"\nmax_samples = {args.max_rounds}',
                   True),
        "planner": (chosen, f'ramp = "{args.ramp}"\npilot = true\ntarget_ci = "{args.target}"\n'
                    f'max_samples = {args.max_rounds}\n'
                    f'max_runtime = "{args.planner_max_runtime}"', True),
        "fixed": (subset, f'ramp = "1s"\nruntime = "{args.fixed_runtime}"\n'
                  f'samples = {args.fixed_samples}', False)}
    if args.dry_run:
        total = 0.0
        for name in arms:
            workloads, method, _ = methods[name]
            pilot, least, cap = bounds(suite('device = "/dev/loop-bench"\nallow_destroy = true',
                                             workloads, method))
            total += cap
            print(f"{name}: {len(workloads)} workloads; pilot {duration_text(pilot)}; at least "
                  f"{duration_text(least)}, at most {duration_text(cap)} (iomatrix's estimate)")
        print(f"all arms: at most {duration_text(total)} by the estimate (a loaded 2-core "
              "machine took 7 % more than it for 120 trials of 2 s; making and preconditioning "
              "the RAM loop device adds about a minute per arm)")
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)   # ignored when started with &
    signal.signal(signal.SIGTERM, _stop)
    work = Path(tempfile.mkdtemp(prefix="iomatrix-bench-", dir="/var/tmp"))
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, object]] = {}
    try:
        with contextlib_ram(True) as device, cpu_hog(args.hog):
            target = f'device = "{device}"\nallow_destroy = true'
            for name in ("paired", "planner", "fixed"):
                if name in arms:
                    workloads, method, paired = methods[name]
                    results[name] = arm(work, suite(target, workloads, method), paired, name,
                                        args.every, args.keep)
    except KeyboardInterrupt:
        print("stopped: every process, the loop device and the work directory removed; "
              f"arms finished: {', '.join(results) or 'none'}", flush=True)
        raise SystemExit(130)
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
        print(f"{name:<8} {r['wall']:>8.1f} {r['rounds']:>6} {pm(r['qd']):>17} "
              f"{pm(r['wl']):>13} {aa_text(r):>21}  {r['methods']}")
    fixed = results.get("fixed")
    fixed_wall = fixed["wall"] if fixed else None
    if fixed is not None and subset is not chosen:
        fixed_wall = fixed["wall"] / len(subset) * n  # type: ignore[operator]
        print(f"fixed arm measured on {len(subset)} of {n} workloads "
              f"({', '.join(f'{b} QD{d}' for b, d in subset)}); PROJECTED to {n}: "
              f"{fixed_wall:.0f} s ({fixed['wall'] / len(subset):.1f} s per workload); its "
              "widest CIs are those of the measured subset")
    print(f"fixed runtime {args.fixed_runtime} × {args.fixed_samples}; paired runtime "
          f"{args.paired_runtime}; planner trials up to {args.planner_max_runtime}; target "
          f"±{args.target} on every gain, at most {args.max_rounds} rounds"
          + ("; CPU hog on core 0 throughout" if args.hog else ""))
    for name in ("paired", "planner"):
        if name in results and fixed_wall:
            print(f"{name} / fixed wall time: {results[name]['wall'] / fixed_wall:.3f}")
    if fixed is not None:   # like for like: each arm's CI on the workloads the fixed arm measured
        for key, half in fixed["each"].items():  # type: ignore[union-attr]
            others = "  ".join(f"{name} {pm(r['each'].get(key, float('inf')))}"  # type: ignore[union-attr]
                               for name, r in results.items() if name != "fixed")
            print(f"CI of the aio gain on {key}: fixed {pm(half)}  {others}")
    for name in ("paired", "planner"):
        if name in results:
            print(f"{name}: {results[name]['plan']}")
    for name, r in results.items():
        a = r["aa"]
        if a is not None:
            print(f"{name}: {a.text()}")  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
