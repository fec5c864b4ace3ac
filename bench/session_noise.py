#!/usr/bin/env python3
"""Where a blocklayer gain's noise comes from: within one qemu-storage-daemon or between daemons.

For SESSIONS rounds, each configuration (aio=native, aio=io_uring; cache=none, raw, NBD export)
gets a daemon of its own on a RAM-backed loop device, and each workload (default 4k QD1 and 64k
QD16 random reads) runs --repeats trials of --runtime in it, back to back. Printed per
configuration and workload: the spread of log IOPS between trials of one daemon (within), the
spread of the daemons' means, and what the within spread alone would give for those means
(within/√repeats): where the daemons' means spread more, something a daemon keeps for its life
(its threads' placement, the loop device's state) moves IOPS, which a longer trial cannot
average away and only more daemons (rounds) can. Also per round: the log ratio io_uring/native
and its spread across rounds, the drift iomatrix's planner sees. Each daemon's threads' CPUs
(psr, at the end of its trials) are printed beside its figures.

Needs root (a loop device) and nothing else running: this measures the host's noise.

    .venv/bin/python bench/session_noise.py                    # 6 rounds, 3 × 2 s trials
    .venv/bin/python bench/session_noise.py --sessions 10 --runtime 4
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import statistics as st
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from adaptive_vs_fixed import contextlib_ram  # noqa: E402 (the bench's own helper)

AIO = ("native", "io_uring")


@contextlib.contextmanager
def daemon(device: Path, aio: str, work: Path):  # type: ignore[no-untyped-def]
    """A qemu-storage-daemon exporting ``device`` over NBD on a Unix socket in ``work``."""
    sock = work / "nbd.sock"
    sock.unlink(missing_ok=True)
    proc = subprocess.Popen(
        ["qemu-storage-daemon", "--blockdev",
         f"driver=host_device,filename={device},node-name=file0,aio={aio},cache.direct=on",
         "--blockdev", "driver=raw,file=file0,node-name=fmt0",
         "--nbd-server", f"addr.type=unix,addr.path={sock}",
         "--export", "type=nbd,id=exp0,node-name=fmt0,writable=on,name=disk"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not sock.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"qemu-storage-daemon (aio={aio}) did not start")
            time.sleep(0.02)
        yield proc, sock
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def fio(sock: Path, bs: str, depth: int, runtime: float) -> float:
    out = subprocess.run(
        ["fio", "--name=j", "--ioengine=nbd", f"--uri=nbd+unix:///disk?socket={sock}",
         "--rw=randread", f"--bs={bs}", f"--iodepth={depth}", "--time_based",
         f"--runtime={runtime}", "--ramp_time=0.5", "--size=1g", "--output-format=json"],
        capture_output=True, text=True, check=True, timeout=runtime * 10 + 60).stdout
    return float(json.loads(out[out.index("{"):])["jobs"][0]["read"]["iops"])


def cpus(pid: int) -> list[int]:
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/{pid}/task/{task}/stat").read_text().rsplit(")", 1)[1].split()
            found.append(int(stat[36]))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=6, help="rounds (daemons per configuration)")
    parser.add_argument("--repeats", type=int, default=3, help="trials per workload in one daemon")
    parser.add_argument("--runtime", type=float, default=2.0, help="seconds per trial")
    parser.add_argument("--workloads", default="4k:1,64k:16", help="bs:iodepth,...")
    args = parser.parse_args()
    workloads = [(w.split(":")[0], int(w.split(":")[1])) for w in args.workloads.split(",")]
    rows: list[tuple[int, str, str, int, list[float]]] = []
    work = Path(tempfile.mkdtemp(prefix="iomatrix-noise-"))
    try:
        with contextlib_ram(True) as device:
            for s in range(args.sessions):
                for aio in AIO:
                    with daemon(device, aio, work) as (proc, sock):
                        for bs, depth in workloads:
                            got = [fio(sock, bs, depth, args.runtime) for _ in range(args.repeats)]
                            rows.append((s, aio, bs, depth, got))
                            print(f"round {s} aio={aio:<8} {bs:>4} QD{depth:<3} IOPS "
                                  f"{' '.join(f'{v:>8.0f}' for v in got)}  daemon threads on CPUs "
                                  f"{cpus(proc.pid)}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n{args.sessions} rounds; {args.repeats} trials of {args.runtime:g} s per workload "
          "in each daemon; spreads are standard deviations of log IOPS (≈ relative)")
    for bs, depth in workloads:
        for aio in AIO:
            logs = [[math.log(v) for v in r[4]] for r in rows if r[1] == aio and r[2] == bs
                    and r[3] == depth]
            within = math.sqrt(st.mean(st.variance(x) for x in logs))
            between = st.stdev(st.mean(x) for x in logs)
            alone = within / math.sqrt(args.repeats)
            print(f"{bs:>4} QD{depth:<3} aio={aio:<8} within a daemon {within:6.1%}  daemons' "
                  f"means {between:6.1%}  from within alone {alone:6.1%}  ratio {between / alone:.2f}")
        ratios = []
        for s in range(args.sessions):
            mine = {r[1]: st.mean(math.log(v) for v in r[4]) for r in rows
                    if r[0] == s and r[2] == bs and r[3] == depth}
            ratios.append(mine["io_uring"] - mine["native"])
        print(f"{bs:>4} QD{depth:<3} log ratio io_uring/native per round "
              f"{' '.join(f'{x:+.1%}' for x in ratios)}; spread across rounds {st.stdev(ratios):.1%}")


if __name__ == "__main__":
    main()
