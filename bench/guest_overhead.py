#!/usr/bin/env python3
"""Guest-mode overhead: per-trial wall time beyond ramp + runtime once the guest is up (target
<= 1 s), and the CPU used by iomatrix itself while guests run, as % of one core.

Runs a guest suite in this process (one virtio-blk guest, N workloads, so one boot serves them
all) and times every trial through the runner's progress callbacks. The iomatrix CPU is this
process's own user + system time (children — QEMU, fio — excluded) inside trial windows.

    .venv/bin/python bench/guest_overhead.py [--trials 8] [--runtime 2s] [--accel tcg]

Where fio's client/server cost went (fio 3.33 server.c handle_connection, unchanged upstream):
the client sends JOBLINE and the job file, then calibrates its clock (~0.15 s) before it sends RUN;
meanwhile the server's connection process, idle with no job running, waits on its send semaphore
for up to 1000 ms without watching the socket, so it sees RUN only when that wait times out: ~1 s
per trial. No client option or calling pattern avoids it, so the appliance carries a static fio
of the host's version whose idle server waits on the socket instead
(iomatrix/appliance/guestfio.py). The last line compares, on this host without a guest, the
same job run plainly, through the host's (unpatched) fio --server and through the guest's
(patched) one.

Measured on 2 busy cores (TCG, 6 trials): host fio in the guest 1.46 s median per trial; the
patched static fio 0.78 s.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from iomatrix.appliance.build import build_appliance
from iomatrix.appliance.guestfio import guest_fio
from iomatrix.appliance.kernel import default_cache_dir
from iomatrix.measure.runner import run_suite
from iomatrix.store import Store
from iomatrix.suite import load_suite_text
from iomatrix.core.units import parse_duration


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


def fio_client_server_cost(work: Path, runtime: float, server: str = "fio") -> tuple[float, float]:
    """Wall time beyond ``runtime`` of the same 1-job fio run on this host: plain, and through
    fio's own client/server protocol to a local ``server --server`` (no guest): what the protocol
    itself costs with that server."""
    import socket
    import subprocess

    data = work / "cs.dat"
    job = work / "cs.fio"
    job.write_text(f"[j]\nfilename={data}\nsize=16m\nrw=randread\nbs=4k\nioengine=libaio\n"
                   f"iodepth=4\ntime_based=1\nruntime={int(runtime * 1000)}ms\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    process = subprocess.Popen([server, f"--server=ip:127.0.0.1,{port}"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        subprocess.run(["fio", str(job), "--output-format=json"], capture_output=True, check=True)
        plain, client = [], []
        for _ in range(3):
            t = time.monotonic()
            subprocess.run(["fio", str(job), "--output-format=json"], capture_output=True,
                           check=True)
            plain.append(time.monotonic() - t)
            t = time.monotonic()
            subprocess.run(["fio", f"--client=ip:127.0.0.1,{port}", str(job),
                            "--output-format=json"], capture_output=True, check=True)
            client.append(time.monotonic() - t)
        return statistics.median(plain) - runtime, statistics.median(client) - runtime
    finally:
        process.terminate()
        process.wait(timeout=10)


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
    appliance = build_appliance()
    patched = appliance.fio_patched and guest_fio(default_cache_dir(), fetch=False).path
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
        print(f"the guest's fio: {appliance.fio_text} ({appliance.fio_note})")
        runtime = parse_duration(args.runtime)
        plain, client = fio_client_server_cost(work, runtime)
        print(f"same job on this host, no guest: plain fio overhead {plain:.2f} s, through the "
              f"host's fio --server {client:.2f} s (the protocol costs {client - plain:.2f} s)"
              + (f", through the guest's patched fio --server "
                 f"{fio_client_server_cost(work, runtime, str(patched))[1]:.2f} s"
                 if patched else ""))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
