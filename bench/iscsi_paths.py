#!/usr/bin/env python3
"""What QEMU's userspace iSCSI initiator (libiscsi) costs against the storage's own limit, side
by side in one run: tgtd (Debian's tgt, ``tests/tgt.py``) serves a RAM-backed loop device as a
LUN on 127.0.0.1, and four arms measure 4k random read and write at QD1 and QD32:

- ``file``: host mode, fio (libaio, direct) on the loop device tgtd serves: the backing store;
- ``libiscsi-none`` / ``libiscsi-wb``: blocklayer, qemu-storage-daemon with the ``iscsi``
  driver, raw, cache=none / cache=writeback, fio over NBD;
- ``guest-tcg``: one appliance guest (virtio-blk, cache=none) on libiscsi; under TCG here, so
  it measures the emulator, not the hardware (labelled so in the output).

Each arm is its own run; the arms alternate round by round (order rotated), so each round
gives every workload one IOPS value per arm. Per workload, the per-round log-ratios of two arms
give a geometric-mean ratio with its 95 % CI (``iomatrix.analysis.stats.log_ratio_test``).
The tgt fixture's start and stop times are printed too.

    sudo .venv/bin/python bench/iscsi_paths.py               # 3 rounds × 4 arms
    sudo .venv/bin/python bench/iscsi_paths.py --rounds 5 --no-guest
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from adaptive_vs_fixed import ram_loop_device  # noqa: E402
from pve_layers import one_run, print_arms  # noqa: E402

from iomatrix.store import Store  # noqa: E402
from tests.tgt import tgtd  # noqa: E402

WORKLOADS = [("randread", 1), ("randread", 32), ("randwrite", 1), ("randwrite", 32)]
RATIOS = [("libiscsi-none", "file"), ("libiscsi-wb", "file"),
          ("libiscsi-wb", "libiscsi-none"), ("guest-tcg", "libiscsi-none")]


def suite(target: str, arm: str, args: argparse.Namespace, seed: int) -> str:
    tables = "".join(f'[[workloads]]\nrw = "{rw}"\nbs = "4k"\niodepth = {qd}\n'
                     for rw, qd in WORKLOADS)
    mode, cache, extra = {
        "file": ("host", "none", ""),
        "libiscsi-none": ("blocklayer", "none", ""),
        "libiscsi-wb": ("blocklayer", "writeback", ""),
        "guest-tcg": ("guest", "none", 'controller = "virtio-blk"\naio = "threads"\n'),
    }[arm]
    return f"""
[suite]
name = "iscsi-{arm}"
[target]
{target}
[matrix]
cache = "{cache}"
iothread = false
{extra}{tables}
[method]
mode = "{mode}"
baseline = false
ramp = "{args.ramp}"
runtime = "{args.runtime}"
samples = 1
precondition = {"true" if seed == 1 else "false"}
seed = {seed}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runtime", default="2s")
    parser.add_argument("--ramp", default="500ms")
    parser.add_argument("--ram-mib", type=int, default=256)
    parser.add_argument("--no-guest", action="store_true")
    args = parser.parse_args()
    arms = ["file", "libiscsi-none", "libiscsi-wb"] + ([] if args.no_guest else ["guest-tcg"])
    if args.rounds < 2:
        parser.error("--rounds >= 2")
    work = Path(tempfile.mkdtemp(prefix="iomatrix-bench-", dir="/var/tmp"))
    values: dict[str, list[dict[str, float]]] = {arm: [] for arm in arms}
    t0 = time.monotonic()
    try:
        with ram_loop_device(args.ram_mib) as device, Store(work / "r.db") as store:
            with tgtd(work, backing=device) as tgt:
                lun = (f'allow_destroy = true\n[target.iscsi]\nportal = "{tgt.portal}"\n'
                       f'target = "{tgt.iqn}"\nlun = {tgt.lun}')
                for r in range(args.rounds):
                    order = arms[r % len(arms):] + arms[:r % len(arms)]
                    for arm in order:
                        target = (f'device = "{device}"\nallow_destroy = true' if arm == "file"
                                  else lun)
                        seed = 1 + r * len(arms) + arms.index(arm)
                        values[arm].append(one_run(store, suite(target, arm, args, seed)))
                    print(f"round {r + 1}/{args.rounds} ({' → '.join(order)}) done at "
                          f"{time.monotonic() - t0:.0f} s", flush=True)
                stopping = time.monotonic()
            stopped = time.monotonic() - stopping
            started = tgt.started_s
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report(values, arms, args, time.monotonic() - t0, started, stopped)


def report(values: dict[str, list[dict[str, float]]], arms: list[str],
           args: argparse.Namespace, wall: float, started: float, stopped: float) -> None:
    print(f"\ntgtd LUN over a {args.ram_mib} MiB RAM-backed loop device on 127.0.0.1; "
          f"{args.rounds} rounds × {len(arms)} arms interleaved, ramp {args.ramp} + "
          f"{args.runtime} per trial; {wall:.0f} s; tgtd started in {started:.2f} s "
          f"(LUN served), stopped in {stopped:.2f} s")
    print("guest-tcg: emulated CPU (TCG), measures the emulator, not the hardware"
          if "guest-tcg" in arms else "no guest arm")
    print_arms(values, arms, RATIOS, width=15)

if __name__ == "__main__":
    main()
