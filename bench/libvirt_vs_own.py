#!/usr/bin/env python3
"""One guest configuration through a real libvirtd (``[method] platform = "libvirt"`` with
``libvirt_uri``: iomatrix writes the domain XML, ``virsh create`` starts it) against the same
configuration on iomatrix's own QEMU command line with libvirt's block graph (``platform =
"libvirt"`` without ``libvirt_uri``): the same -blockdev nodes and device, so what differs is
who starts QEMU and the rest of libvirt's command line (its machine options, -no-acpi, the
sandbox, the second monitor). Under TCG here, so the IOPS measure the emulator.

The arms alternate round by round (the order rotated every round); each round is one run per
arm (one boot, every workload). Per trial: wall time and IOPS side by side, with the ratio
libvirtd/own; then each arm's whole-run wall time (boot and teardown included) per round.

    sudo .venv/bin/python bench/libvirt_vs_own.py                  # 3 rounds, ~2 min
    sudo .venv/bin/python bench/libvirt_vs_own.py --rounds 5 --runtime 5s --accel kvm
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from iomatrix.drivers.libvirt import DEFAULT_URI, libvirt_problem  # noqa: E402
from iomatrix.measure.runner import run_suite  # noqa: E402
from iomatrix.store import Store  # noqa: E402
from iomatrix.suite import load_suite_text  # noqa: E402

ARMS = {"own": "", "libvirtd": f'libvirt_uri = "{DEFAULT_URI}"'}
WORKLOADS = [("randread", 1), ("randread", 8), ("randwrite", 8)]


def suite(target: Path, arm: str, args: argparse.Namespace, seed: int) -> str:
    tables = "".join(f'[[workloads]]\nrw = "{rw}"\nbs = "4k"\niodepth = {qd}\n'
                     for rw, qd in WORKLOADS)
    return f"""
[suite]
name = "libvirt-vs-own"
[target]
directory = "{target}"
size = "64MiB"
[matrix]
controller = "{args.controller}"
aio = "io_uring"
cache = "none"
iothread = true
{tables}
[method]
mode = "guest"
ramp = "1s"
runtime = "{args.runtime}"
accel = "{args.accel}"
vcpus = 1
memory = "384MiB"
platform = "libvirt"
seed = {seed}
{ARMS[arm]}
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runtime", default="3s")
    parser.add_argument("--accel", default="tcg", choices=("tcg", "kvm", "auto"))
    parser.add_argument("--controller", default="virtio-blk")
    args = parser.parse_args()
    problem = libvirt_problem(DEFAULT_URI)
    if problem is not None:
        print(f"libvirt_vs_own: {problem}", file=sys.stderr)
        return 4
    rows: list[tuple[int, str, dict[str, tuple[float, float]]]] = []
    runs: dict[str, list[float]] = {arm: [] for arm in ARMS}
    with tempfile.TemporaryDirectory(prefix="libvirt-vs-own-") as tmp:
        work = Path(tmp)
        (work / "target").mkdir()
        for rnd in range(args.rounds):
            order = list(ARMS) if rnd % 2 == 0 else list(reversed(ARMS))
            per: dict[str, dict[str, tuple[float, float]]] = {}
            for arm in order:
                loaded = load_suite_text(suite(work / "target", arm, args, 100 + rnd),
                                         source=f"{arm}.toml")
                start = time.monotonic()
                with Store(work / f"{arm}.db") as store:
                    outcome = run_suite(loaded, store)
                    stored = store.load_run(outcome.run_id)
                runs[arm].append(time.monotonic() - start)
                failed = [t.reason for t in stored.trials if t.status != "ok"]
                if failed:
                    print(f"{arm}: failed trials: {failed}", file=sys.stderr)
                    return 1
                per[arm] = {t.workload_key: (t.wall_seconds or math.nan,
                                             sum(s.iops for s in t.samples))
                            for t in stored.trials}
            for workload in per["own"]:
                rows.append((rnd + 1, workload, {arm: per[arm][workload] for arm in ARMS}))
    print(f"{args.controller}, io_uring, cache=none, iothread, raw; accel {args.accel}; "
          f"runtime {args.runtime} + ramp 1s; {args.rounds} rounds\n")
    print(f"{'round':>5}  {'workload':<22} {'wall own':>9} {'wall lv':>9} {'ratio':>6}  "
          f"{'IOPS own':>9} {'IOPS lv':>9} {'ratio':>6}")
    iops_ratios: dict[str, list[float]] = {}
    for rnd, workload, arms in rows:
        (w_own, i_own), (w_lv, i_lv) = arms["own"], arms["libvirtd"]
        iops_ratios.setdefault(workload, []).append(i_lv / i_own)
        print(f"{rnd:>5}  {workload:<22} {w_own:>8.2f}s {w_lv:>8.2f}s {w_lv / w_own:>6.3f}  "
              f"{i_own:>9,.0f} {i_lv:>9,.0f} {i_lv / i_own:>6.3f}")
    print("\nIOPS libvirtd/own, geometric mean over rounds:")
    for workload, ratios in iops_ratios.items():
        print(f"  {workload:<22} {math.exp(statistics.fmean(math.log(r) for r in ratios)):.3f} "
              f"(min {min(ratios):.3f}, max {max(ratios):.3f})")
    print("\nwhole run (boot, precondition, every workload, teardown), s per round:")
    for arm, seconds in runs.items():
        print(f"  {arm:<9} " + "  ".join(f"{s:6.1f}" for s in seconds)
              + f"   mean {statistics.fmean(seconds):.1f}")
    print(f"  ratio libvirtd/own: {statistics.fmean(runs['libvirtd']) / statistics.fmean(runs['own']):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
