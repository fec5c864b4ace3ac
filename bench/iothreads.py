#!/usr/bin/env python3
"""IOThreads per disk side by side (issue 35): 1, 2 and 4 IOThreads serving one virtio-blk
disk's queues (QEMU's iothread-vq-mapping, round-robin), with no IOThread (QEMU's main loop)
beside them, as paired per-round IOPS ratios against one IOThread with 95 % CIs
(``iomatrix.analysis.stats.log_ratio_test``), and the host CPU per I/O of each (every process
iomatrix started, the host fio included: seed 002's efficiency) with its own ratio.

Where it is measured:
  blocklayer  qemu-storage-daemon at native speed, where its export takes several IOThreads:
              iomatrix's blocklayer exports (FUSE with one IOThread, or NBD) take at most one,
              and the iothreads axis is a guest device's, so this mode is said to be
              unavailable and nothing is measured there.
  guest       one guest (the appliance), labelled TCG where KVM is unusable: then the figures
              measure QEMU's CPU emulator, not the storage. 2 and 4 IOThreads need QEMU 9.0 for
              virtio-blk's mapping: on an older QEMU (Debian 12: 7.2) the bench says so and
              measures 0 against 1 IOThread.
One suite, one run: the runner interleaves the configurations round by round (``--rounds``,
each round every configuration and workload once, shuffled), so each round gives a paired ratio
per workload. The load average before and after is printed: other work on the host (six
helpers share this machine's two cores) widens the intervals.

    .venv/bin/python bench/iothreads.py --quick      # 3 rounds of 2 s, QD 16 only: 1-3 min (TCG)
    .venv/bin/python bench/iothreads.py              # 5 rounds of 4 s, QD 1 and 32
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from iomatrix.analysis.stats import log_ratio_test  # noqa: E402
from iomatrix.measure.runner import run_suite  # noqa: E402
from iomatrix.qemu import version as qemu_version  # noqa: E402
from iomatrix.store import Store  # noqa: E402
from iomatrix.suite import load_suite  # noqa: E402

CONTROLLER = "virtio-blk"
BLOCKLAYER = ("blocklayer: not measured: iomatrix's qemu-storage-daemon exports (FUSE with one "
              "IOThread, or NBD) take at most one IOThread, and iothreads is a guest device's "
              "axis; the daemon's multi-IOThread exports (vhost-user-blk) are not modelled")


def counts(found: tuple[int, int, int] | None) -> tuple[list[int], str]:
    """The IOThread counts this QEMU can run (0 and 1 always), and what it cannot, in words."""
    need = qemu_version.IOTHREAD_VQ_MAPPING[CONTROLLER]
    if found is not None and found >= need:
        return [0, 1, 2, 4], ""
    here = "unknown" if found is None else qemu_version.shown(found)
    return [0, 1], (f"2 and 4 IOThreads not measured: {CONTROLLER}'s iothread-vq-mapping needs "
                    f"QEMU {qemu_version.shown(need)} or later; qemu-system-x86_64 here is {here}")


def suite(levels: list[int], args: argparse.Namespace, directory: Path) -> str:
    threads = [n for n in levels if n >= 1]
    return f"""
[suite]
name = "bench-iothreads"
[target]
directory = "{directory}"
size = "{args.size}"
[matrix]
controller = "{CONTROLLER}"
aio = "io_uring"
cache = "none"
format = "raw"
iothread = [false, true]
iothreads = {threads}
num_queues = {args.queues}
skip_invalid = true
[[workloads]]
rw = "randread"
bs = "4k"
iodepth = {args.depths}
[method]
mode = "guest"
vcpus = {args.vcpus}
ramp = "{args.ramp}"
runtime = "{args.runtime}"
steady_state = false
samples = {args.rounds}
seed = 35
"""


def count_of(key: str) -> int:
    """A configuration key's IOThread count: 0 without an iothread, else its iothreads or 1."""
    parts = dict(p.split("=", 1) for p in key.split("/") if "=" in p)
    return 0 if parts.get("iothread") != "on" else int(parts.get("iothreads", "1"))


def figures(run):  # type: ignore[no-untyped-def]
    """(count, workload label) → round → (IOPS, CPU µs per I/O or None)."""
    labels = {w.key: w.label for w in run.workloads}
    found: dict[tuple[int, str], dict[int, tuple[float, float | None]]] = {}
    for t in run.trials:
        if t.status == "ok" and t.config_key.startswith("guest"):
            cpu = t.cpu.cpu_us_per_io if t.cpu is not None else None
            found.setdefault((count_of(t.config_key), labels[t.workload_key]), {})[
                t.sample_index] = (sum(s.iops for s in t.samples), cpu)
    return found


def ratio(mine: dict[int, float | None], base: dict[int, float | None]) -> str:
    """The geometric mean of the per-round ratios with its 95 % CI."""
    logs = [math.log(a / b) for k, a in mine.items() if a and (b := base.get(k))]
    if len(logs) < 2:
        return "(fewer than 2 paired rounds)"
    ci = log_ratio_test(logs).interval
    assert ci.low is not None and ci.high is not None
    return f"{math.exp(ci.mean):.3f} [{math.exp(ci.low):.3f}, {math.exp(ci.high):.3f}]"


def report(run, args: argparse.Namespace, wall: float, load: tuple[float, ...],  # type: ignore[no-untyped-def]
           why: str) -> None:
    got = figures(run)
    failed = [t for t in run.trials if t.status != "ok"]
    accel = {t.accelerator for t in run.trials if t.accelerator != "none"}
    tag = " [emulated: TCG: these figures measure QEMU's CPU emulator]" if "tcg" in accel else ""
    loads = {"before": load, "after": os.getloadavg()}
    lines = [f"\nrun {run.id}: {len(run.trials) - len(failed)} trials ok, {len(failed)} failed; "
             f"{args.rounds} rounds, ramp {args.ramp} + {args.runtime}; {args.vcpus} vCPUs, "
             f"num_queues {args.queues}; {wall:.0f} s in all",
             "load average " + "; ".join(f"{when}: " + " ".join(f"{v:.2f}" for v in values)
                                         for when, values in loads.items()),
             *(f"  failed: {t.config_key}: {(t.reason or '')[:200]}" for t in failed[:3]),
             *(f"  note: {n[:300]}" for n in run.notes if "needs QEMU" in n or "TCG" in n),
             BLOCKLAYER, *([why] if why else [])]
    print("\n".join(lines))
    print(f"guest ({CONTROLLER}){tag}:")
    workloads = sorted({w for _, w in got})
    levels = sorted({n for n, _ in got})
    for w in workloads:
        print(f"  {w}: mean IOPS, CPU µs per I/O; ratio to 1 IOThread per round, geometric mean "
              "[95 % CI]")
        base = got.get((1, w), {})
        for n in levels:
            mine = got.get((n, w), {})
            iops = [v[0] for v in mine.values()]
            cpus = [v[1] for v in mine.values() if v[1] is not None]
            line = (f"    {n} IOThread{'s' if n != 1 else ' '}  {sum(iops) / len(iops):>10.0f} IOPS"
                    f"  {sum(cpus) / len(cpus) if cpus else float('nan'):>8.2f} µs/IO")
            if n != 1 and base:
                line += (f"   IOPS ×{ratio({k: v[0] for k, v in mine.items()}, {k: v[0] for k, v in base.items()})}"
                         f"   CPU/IO ×{ratio({k: v[1] for k, v in mine.items()}, {k: v[1] for k, v in base.items()})}")
            print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag, kind, default in (("--rounds", int, 5), ("--runtime", str, "4s"),
                                ("--ramp", str, "1s"), ("--size", str, "512MiB"),
                                ("--vcpus", int, 4), ("--queues", int, 4)):
        parser.add_argument(flag, type=kind, default=default)
    parser.add_argument("--quick", action="store_true",
                        help="3 rounds of 2 s + 0.5 s, QD 16, 2 vCPUs and 2 queues, 256 MiB")
    parser.add_argument("--dir", type=Path, default=Path("/var/tmp"))
    args = parser.parse_args()
    args.depths = [1, 32]
    if args.quick:
        args.rounds, args.runtime, args.ramp, args.size = 3, "2s", "500ms", "256MiB"
        args.depths, args.vcpus, args.queues = [16], 2, 2
    if args.rounds < 2:
        parser.error("--rounds >= 2")
    levels, why = counts(qemu_version.installed("qemu-system-x86_64"))
    load = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="iomatrix-bench-iothreads-", dir=args.dir))
    t0 = time.monotonic()
    try:
        written = work / "iothreads.toml"
        written.write_text(suite(levels, args, work / "images"))
        with Store(work / "r.db") as store:
            outcome = run_suite(load_suite(written), store)
            run = store.load_run(outcome.run_id)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report(run, args, time.monotonic() - t0, load, why)


if __name__ == "__main__":
    main()
