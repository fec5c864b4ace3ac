#!/usr/bin/env python3
"""What issue 31's checks cost a `run quick`: wall time of this checkout against a base commit,
side by side in one run (interleaved rounds, A B B A ...), with their ratio. The base is checked
out as a git worktree in a temporary directory and run with the same interpreter and venv
(``PYTHONPATH``); both write to their own database and target directory.

    .venv/bin/python bench/check_cost.py [--base 8b7063c] [--rounds 3] [--suite quick]

Also times ``run --plan`` (no I/O: the suite's load and checks alone), over more rounds."""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def timed(tree: Path, argv: list[str], work: Path) -> float:
    """Seconds for ``iomatrix argv`` from ``tree``; exits the bench when it fails."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "iomatrix", *argv], cwd=work, env=env,
                          capture_output=True, text=True, timeout=3600)
    took = time.monotonic() - start
    if done.returncode != 0:
        sys.exit(f"{tree.name}: iomatrix {' '.join(argv)} exited {done.returncode}: "
                 f"{(done.stderr or done.stdout).strip().splitlines()[-1:]}")
    return took


def rounds(trees: dict[str, Path], argv: list[str], count: int, work: Path,
           label: str) -> dict[str, list[float]]:
    """``count`` interleaved rounds of ``argv`` in each tree (the order alternates per round)."""
    times: dict[str, list[float]] = {name: [] for name in trees}
    names = list(trees)
    for i in range(count):
        for name in (names if i % 2 == 0 else names[::-1]):
            here = work / f"{label}-{name}-{i}"
            here.mkdir()
            extra = [a.replace("{DIR}", str(here)) for a in argv]
            times[name].append(timed(trees[name], extra, here))
            print(f"  round {i + 1}/{count} {name}: {times[name][-1]:.1f} s", flush=True)
    return times


def show(title: str, times: dict[str, list[float]]) -> None:
    base, now = statistics.median(times["base"]), statistics.median(times["now"])
    print(f"{title}: base {base:.2f} s, now {now:.2f} s (medians of {len(times['now'])}); "
          f"now/base = {now / base:.3f}")
    for name, values in times.items():
        print(f"  {name}: " + ", ".join(f"{v:.2f}" for v in values))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="8b7063c", help="the commit before the checks")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--plan-rounds", type=int, default=10)
    parser.add_argument("--suite", default="quick")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="iomatrix-checkcost-"))
    base = work / "base"
    try:
        subprocess.run(["git", "worktree", "add", "--detach", str(base), args.base], cwd=REPO,
                       check=True, capture_output=True, timeout=120)
        trees = {"base": base, "now": REPO}
        print(f"base {args.base} against this checkout, suite {args.suite}")
        show("run --plan", rounds(trees, ["run", args.suite, "--plan", "--db", "{DIR}/r.db"],
                                  args.plan_rounds, work, "plan"))
        show(f"run {args.suite}", rounds(trees, ["run", args.suite, "--db", "{DIR}/r.db",
                                                 "--target", "{DIR}/target"], args.rounds, work, "run"))
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=REPO,
                       capture_output=True, timeout=120)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
