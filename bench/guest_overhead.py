#!/usr/bin/env python3
"""Guest-mode overhead: per-trial wall time beyond ramp + runtime once the guest is up (target
<= 1 s), and the CPU used by iomatrix itself while guests run, as % of one core.

Runs a guest suite in this process (one virtio-blk guest, N workloads, so one boot serves them
all) and times every trial through the runner's progress callbacks. The iomatrix CPU is this
process's own user + system time (children — QEMU, fio — excluded) inside trial windows.

    .venv/bin/python bench/guest_overhead.py [--trials 8] [--runtime 2s] [--accel tcg]
"""

from __future__ import annotations

import argparse
import resource
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from iomatrix.runner import run_suite
from iomatrix.store import Store
from iomatrix.suite import load_suite_text
from iomatrix.units import parse_duration


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Timer:
    def __init__(self) -> None:
        self.windows: list[tuple[float, float, float, float]] = []
        self._start = (0.0, 0.0)

    def start(self, trials: int, planned_seconds: float) -> None: ...
    def note(self, text: str) -> None: ...

    def trial_started(self, n, config, workload, sample) -> None:  # type: ignore[no-untyped-def]
        self._start = (time.monotonic(), cpu())

    def trial_finished(self, n: int, ok: bool, detail: str) -> None:
        t0, c0 = self._start
        self.windows.append((t0, time.monotonic(), c0, cpu()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--runtime", default="2s")
    parser.add_argument("--accel", default="tcg")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="iomatrix-bench-"))
    depths = ", ".join(str(2 ** i) for i in range(args.trials))
    suite = load_suite_text(f"""
[suite]
name = "guest-overhead"
[target]
directory = "{work / 'target'}"
size = "256MiB"
[matrix]
controller = "virtio-blk"
iothread = true
[workloads]
rw = "randread"
iodepth = [{depths}]
[method]
mode = "guest"
ramp = "500ms"
runtime = "{args.runtime}"
accel = "{args.accel}"
""", source="bench")
    timer = Timer()
    try:
        with Store(work / "r.db") as store:
            t0 = time.monotonic()
            outcome = run_suite(suite, store, progress=timer)  # type: ignore[arg-type]
            wall = time.monotonic() - t0
            accel = store.load_run(outcome.run_id).accelerator
        window = suite.method.ramp + parse_duration(args.runtime)
        overheads = [(end - start) - window for start, end, _, _ in timer.windows]
        busy = sum(c1 - c0 for _, _, c0, c1 in timer.windows)
        span = sum(end - start for start, end, _, _ in timer.windows)
        print(f"{outcome.trials_ok} trials ok, {outcome.trials_failed} failed, one boot, "
              f"accelerator {accel}{' (EMULATED)' if accel == 'tcg' else ''}, wall {wall:.1f} s")
        print("per-trial overhead beyond ramp + runtime (s): "
              + ", ".join(f"{o:.2f}" for o in overheads))
        med = statistics.median(overheads)
        print(f"median per-trial overhead: {med:.2f} s = {med / 1.0:.2f} × the 1 s target; "
              f"{med / window:.2f} × the trial window of {window:.1f} s")
        print(f"iomatrix CPU while guests run: {busy:.2f} s over {span:.1f} s = "
              f"{100 * busy / span:.2f} % of one core")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
