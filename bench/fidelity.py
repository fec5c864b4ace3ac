#!/usr/bin/env python3
"""Fidelity: the same fio workload through `iomatrix run` (host mode) and by plain fio, in
interleaved pairs on the same filesystem. Prints each pair and the median IOPS ratio
(target 0.95-1.05).

    .venv/bin/python bench/fidelity.py [--pairs 5] [--dir /var/tmp] [--runtime 5]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SIZE = "1GiB"


def iomatrix_iops(work: Path, target: Path, runtime: str) -> float:
    suite = work / "fidelity.toml"
    suite.write_text(f"""
[suite]
name = "fidelity"
[target]
directory = "{target}"
size = "{SIZE}"
[workloads]
rw = "randread"
bs = "4k"
iodepth = 32
[method]
mode = "host"
ramp = "1s"
runtime = "{runtime}"
""")
    db = work / "fidelity.db"
    subprocess.run([sys.executable, "-m", "iomatrix", "run", str(suite), "--db", str(db)],
                   check=True, capture_output=True)
    out = subprocess.run([sys.executable, "-m", "iomatrix", "export", "last", "--format", "json",
                          "--db", str(db)], check=True, capture_output=True, text=True).stdout
    trial = json.loads(out)["trials"][-1]
    return float(trial["samples"][0]["iops"])


def plain_fio_iops(target: Path, runtime: str) -> float:
    path = target / "plain-fio.raw"
    common = ["--ioengine=libaio", "--direct=1", f"--filename={path}", f"--size={SIZE}"]
    subprocess.run(["fio", "--name=fill", *common, "--rw=write", "--bs=1m", "--iodepth=16",
                    "--refill_buffers=1", "--end_fsync=1"], check=True, capture_output=True)
    out = subprocess.run(["fio", "--name=plain", *common, "--rw=randread", "--bs=4k",
                          "--iodepth=32", "--time_based=1", "--ramp_time=1s",
                          f"--runtime={runtime}", "--output-format=json"],
                         check=True, capture_output=True, text=True).stdout
    path.unlink()
    return float(json.loads(out)["jobs"][0]["read"]["iops"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--dir", type=Path, default=Path("/var/tmp"))
    parser.add_argument("--runtime", default="5s")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="iomatrix-bench-"))
    target = Path(tempfile.mkdtemp(prefix="iomatrix-fidelity-", dir=args.dir))
    ratios = []
    try:
        print(f"4k randread QD32, libaio direct=1, {SIZE} file on {target}, runtime {args.runtime}")
        print(f"{'pair':>4}  {'iomatrix IOPS':>14}  {'plain fio IOPS':>14}  {'ratio':>6}")
        for i in range(args.pairs):
            # alternate which goes first, so drift lands on both alike
            if i % 2 == 0:
                a = iomatrix_iops(work, target, args.runtime)
                b = plain_fio_iops(target, args.runtime)
            else:
                b = plain_fio_iops(target, args.runtime)
                a = iomatrix_iops(work, target, args.runtime)
            ratios.append(a / b)
            print(f"{i + 1:>4}  {a:>14,.0f}  {b:>14,.0f}  {a / b:>6.3f}")
        median = statistics.median(ratios)
        verdict = "within" if 0.95 <= median <= 1.05 else "OUTSIDE"
        print(f"median ratio iomatrix/plain fio: {median:.3f} ({verdict} 0.95-1.05)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(target, ignore_errors=True)


if __name__ == "__main__":
    main()
