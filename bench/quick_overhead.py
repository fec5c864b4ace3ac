#!/usr/bin/env python3
"""Harness overhead and time efficiency of `iomatrix run quick`.

Runs the built-in quick suite as a child process and samples, every 50 ms, the CPU time of the
iomatrix process itself (utime + stime from /proc, children excluded) and whether a fio child is
running. Prints:
  - harness CPU during measurement windows (while fio runs), as % of one core (target <= 1 %);
  - the same over the whole run;
  - time efficiency: sum of measurement windows (runtime of ok trials) / wall time (target >= 0.7).

    .venv/bin/python bench/quick_overhead.py [--target DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def fio_running(pid: int) -> bool:
    for child in Path(f"/proc/{pid}/task").glob("*/children"):
        for c in child.read_text().split():
            try:
                if Path(f"/proc/{c}/comm").read_text().strip() == "fio":
                    return True
            except OSError:
                pass
    return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=Path, default=None)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="iomatrix-bench-"))
    db = work / "quick.db"
    argv = [sys.executable, "-m", "iomatrix", "run", "quick", "--db", str(db)]
    if args.target:
        argv += ["--target", str(args.target)]
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    in_cpu = in_wall = 0.0
    last_cpu, last_t, last_fio = 0.0, time.monotonic(), False
    try:
        while proc.poll() is None:
            time.sleep(0.05)
            try:
                cpu, fio = cpu_seconds(proc.pid), fio_running(proc.pid)
            except (OSError, IndexError):
                break
            now = time.monotonic()
            if fio and last_fio:
                in_cpu += cpu - last_cpu
                in_wall += now - last_t
            last_cpu, last_t, last_fio = cpu, now, fio
        total_cpu = last_cpu
        proc.wait()
        wall = time.monotonic() - t0
        out = subprocess.run([sys.executable, "-m", "iomatrix", "export", "last", "--format",
                              "json", "--db", str(db)], check=True, capture_output=True,
                             text=True).stdout
        run = json.loads(out)
        runtime = _runtime(run["suite_text"])
        ok = [t for t in run["trials"] if t["status"] == "ok"]
        measured = len(ok) * runtime
        print(f"iomatrix run quick: {len(ok)} ok trials, {len(run['trials']) - len(ok)} failed, "
              f"wall {wall:.1f} s")
        print(f"harness CPU while fio runs: {in_cpu:.2f} s over {in_wall:.1f} s = "
              f"{100 * in_cpu / in_wall:.2f} % of one core (target <= 1 %)")
        print(f"harness CPU over the whole run (start-up, analysis, storing): {total_cpu:.2f} s = "
              f"{100 * total_cpu / wall:.2f} % of one core")
        print(f"time efficiency: measured {measured:.1f} s / wall {wall:.1f} s = "
              f"{measured / wall:.2f} (target >= 0.7)")
    finally:
        if proc.poll() is None:
            proc.kill()
        shutil.rmtree(work, ignore_errors=True)


def _runtime(suite_text: str) -> float:
    import tomllib

    from iomatrix.core.units import parse_duration
    return parse_duration(tomllib.loads(suite_text)["method"]["runtime"])


if __name__ == "__main__":
    main()
