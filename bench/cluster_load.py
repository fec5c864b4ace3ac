#!/usr/bin/env python3
"""Cluster load (``[method] concurrent_nodes``): the controller's overhead per trial with 1, 2
and 4 nodes, how far apart the nodes start a trial, and what N nodes get from one shared target
against N × what one node gets.

The nodes are those of the tests (``tests/sshnodes.py``: network + UTS namespaces of this
machine, each with its own sshd), so they share this machine's CPUs, disk and file system: the
target file is one file all nodes load (shared storage), and N nodes compete for the same 2
cores. Run as root from the project's root:

    .venv/bin/python bench/cluster_load.py [--rounds 3] [--runtime 1s] [--skew-trials 8]
    .venv/bin/python bench/cluster_load.py --mode guest [--accel tcg]

With ``--mode guest`` every node boots one guest (an appliance VM, ``vms = 1``) per run and
the controller's one fio client drives each node's guest through its forwarded socket; "this
host alone" is one guest booted here, as a local run does. The first-completion skew needs a
host-mode fio server on each node and is measured in host mode only.

1. Overhead: host-mode runs of W randread workloads on 1, 2 and 4 nodes (and on this host alone,
   without nodes), interleaved round by round in one process, each trial timed by the runner's
   progress callbacks; overhead = trial wall time − runtime (median), and its ratio to 1 node's.
2. Skew: fio 3.36 and later give each client's ``job_start`` (stored per trial as
   ``cluster.start_skew``); fio 3.33 gives none in its JSON, so the skew is read from each
   node's iops log (``write_iops_log``, no averaging, ``log_unix_epoch=1``: one line per I/O
   with its completion time in ms since 1970), which fio's client collects as
   ``<name>_iops.1.log.<client>``: the spread of the nodes' first completions. The nodes share
   this machine's clock, so no clock offset is in it.
3. Aggregate: the cluster's aggregate IOPS of each trial on N nodes divided by N × the IOPS of
   one node on the same workload in the same round.

Measured twice on 2 cores at a load of 7-10 (other helpers' TCG guests, fio runs and the full
test suite running), fio 3.33: overhead per trial 1.66 / 1.60 s with 1 node, × 1.04 / 1.06 with
2 and × 1.08 / 1.18 with 4 (this host alone, without fio's client/server: 0.51 / 0.64 s; most
of the difference is fio's server, whose idle connection process sees the client's RUN only
when a 1000 ms wait ends: bench/guest_overhead.py); start skew of 4 nodes from their first
completions: median 84 / 102 ms, max 307 / 153 ms; N nodes on the one shared file ÷ N × one
node: median 0.91 / 0.68 with 2 nodes and 0.79 / 0.54 with 4 (the 2 busy cores and one disk
bound it here, and it moved with the other load). Debian 13 (fio 3.39, 2 rounds): fio's own
job_start gave the nodes' start skew as median 41 ms, max 238 ms over 12 trials.

``--mode guest --accel tcg``, 3 rounds, 183 s, at a load of 5.5-5.8 (two other worktrees'
test suites running), fio 3.33: overhead per trial 0.72 s with 1 node (one guest booted here
without nodes: 0.58 s), × 1.62 with 2 and × 1.42 with 4 (the patched fio server in the guests
has no 1000 ms wait; a trial here also asks each node to read its guests' QEMU counters before
and after); per run outside its trials (store, boots, preconditioning) 9.0 s with 1 node, × 1.35
with 2, × 1.91 with 4 (5.1 s here without nodes); N nodes' guests ÷ N × one node's guest:
median 0.50 with 2, 0.41 with 4 (TCG guests on 2 busy cores: the emulator, not the storage).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

NODES = (1, 2, 4)
DEPTHS = (1, 4, 16)


GUEST_METHOD = """
vcpus = 1
memory = "384MiB"
boot_timeout = "300s"
"""


def suite_text(work: Path, runtime: str, concurrent: bool, mode: str = "host",
               accel: str = "auto") -> str:
    guest = mode == "guest"
    return f"""
[suite]
name = "cluster-load"
[target]
directory = "{work / 'target'}"
size = "{'16MiB' if guest else '64MiB'}"
{'[matrix]' + chr(10) + 'controller = "virtio-blk"' + chr(10) + 'iothread = false' if guest else ''}
[workloads]
rw = "randread"
iodepth = [{", ".join(map(str, DEPTHS))}]
[method]
mode = "{mode}"
ramp = 0
runtime = "{runtime}"
seed = 1
concurrent_nodes = {str(concurrent).lower()}
{f'accel = "{accel}"' + GUEST_METHOD if guest else ''}
"""


class Timer:
    """Each trial's wall time, from the runner's progress callbacks."""

    def __init__(self) -> None:
        self.walls: list[float] = []
        self._t = 0.0

    def start(self, trials: int, planned_seconds: float) -> None: ...
    def more(self, trials: int, planned_seconds: float) -> None: ...
    def note(self, text: str) -> None: ...

    def trial_started(self, n, config, workload, sample) -> None:  # type: ignore[no-untyped-def]
        self._t = time.monotonic()

    def trial_finished(self, n: int, ok: bool, detail: str) -> None:
        self.walls.append(time.monotonic() - self._t)


def inside(args: argparse.Namespace) -> None:
    """The measurement, in the controller's network namespace; prints one JSON line."""
    from iomatrix.cluster.ssh import load_inventory
    from iomatrix.core.units import parse_duration
    from iomatrix.measure.runner import run_suite
    from iomatrix.store import Store
    from iomatrix.suite import load_suite_text

    nodes = load_inventory(Path(args.inventory))
    work = Path(args.work)
    runtime = parse_duration(args.runtime)
    overhead: dict[str, list[float]] = {}
    iops: dict[tuple[int, int, str], float] = {}       # (round, nodes, workload) → aggregate
    skews: list[str] = []
    sessions: dict[str, list[float]] = {}
    """Per run: its wall time less its trials' (making the run, booting, preconditioning)."""
    accelerator = "none"
    rng = random.Random(7)
    with Store(work / "r.db") as store:
        for r in range(args.rounds):
            order: list[int] = [0, *NODES]                 # 0: this host alone, no nodes
            rng.shuffle(order)
            for n in order:
                timer = Timer()
                suite = load_suite_text(suite_text(work, args.runtime, n > 0, args.mode,
                                                   args.accel), source="bench")
                outcome = run_suite(suite, store, progress=timer,  # type: ignore[arg-type]
                                    nodes=nodes[:n])
                if outcome.trials_failed:
                    reasons = {t.reason for t in store.load_run(outcome.run_id).trials if t.reason}
                    raise SystemExit(f"{outcome.trials_failed} trials failed with {n} nodes: "
                                     + " / ".join(sorted(r or "" for r in reasons)))
                key = f"{n} node{'s' if n > 1 else ''}" if n else "0: this host alone"
                overhead.setdefault(key, []).extend(w - runtime for w in timer.walls)
                sessions.setdefault(key, []).append(outcome.wall_seconds - sum(timer.walls))
                stored = store.load_run(outcome.run_id)
                accelerator = stored.accelerator
                for trial in stored.trials:
                    iops[(r, n, trial.workload_key)] = sum(s.iops for s in trial.samples)
                    if n > 1:
                        skews.append(trial.applied.get("cluster.start_skew", ""))
    # the nodes' first completions need a fio server on each node: host mode's
    skew = first_completion_skews(nodes, work, args.skew_trials) if args.mode == "host" else []
    print(json.dumps({"overhead": overhead, "iops": [[*k, v] for k, v in iops.items()],
                      "skew": skew, "stored_skew": [s for s in skews if s],
                      "sessions": sessions, "accelerator": accelerator}))


def first_completion_skews(nodes, work: Path, trials: int) -> list[float]:  # type: ignore[no-untyped-def]
    """For ``trials`` runs of one job on every node at once: the spread (ms) of the nodes'
    first I/O completions, from their iops logs (see the module docstring)."""
    from iomatrix.drivers.cluster import NodeServer
    from iomatrix.fio.run import run_fio

    skew_dir = work / "skew"
    skew_dir.mkdir()
    servers = [NodeServer(node, skew_dir / f"n{i}.sock", skew_dir / f"n{i}.log")
               for i, node in enumerate(nodes)]
    out = []
    try:
        for server in servers:
            server.start()
        for server in servers:
            server.ready(time.monotonic() + 30)
        for t in range(trials):
            job = (f"[global]\nioengine=psync\nfilename={work / 'skew.dat'}\nsize=16M\n"
                   f"rw=randread\nbs=4k\ntime_based=1\nruntime=1\nwrite_iops_log=t{t}\n"
                   "log_avg_msec=0\nlog_unix_epoch=1\n[j]\n")
            # relative socket names: fio names each client's log after it, in its cwd
            run_fio(job, workdir=skew_dir, timeout=60,
                    clients=[f"sock:{s.local.name}" for s in servers])
            firsts = []
            for server in servers:
                log = skew_dir / f"t{t}_iops.1.log.{server.local.name}"
                firsts.append(int(log.read_text().split(",", 1)[0]))
            out.append(float(max(firsts) - min(firsts)))
    finally:
        for server in servers:
            server.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runtime", default="1s")
    parser.add_argument("--skew-trials", type=int, default=8)
    parser.add_argument("--mode", choices=("host", "guest"), default="host",
                        help="guest: each node boots a guest (one here for 0 nodes)")
    parser.add_argument("--accel", default="auto", help="guest mode's accel (auto, kvm, tcg)")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--inventory", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        inside(args)
        return
    from tests.sshnodes import problem, ssh_cluster

    why = problem()
    if why:
        raise SystemExit(f"cannot make nodes here: {why}")
    work = Path(tempfile.mkdtemp(prefix="iomatrix-bench-"))
    try:
        with ssh_cluster(work / "nodes", max(NODES)) as cluster:
            inventory = work / "nodes.toml"
            # guest mode runs iomatrix on each node: this checkout's
            inventory.write_text(cluster.inventory(
                extra=f'command = "{ROOT / ".venv" / "bin" / "iomatrix"}"\n'))
            argv = [sys.executable, __file__, "--inside", "--inventory", str(inventory),
                    "--work", str(work), "--rounds", str(args.rounds), "--runtime",
                    args.runtime, "--skew-trials", str(args.skew_trials), "--mode", args.mode,
                    "--accel", args.accel]
            t0 = time.monotonic()
            done = subprocess.run(cluster.controller(argv), capture_output=True, text=True,
                                  cwd=ROOT, env={**os.environ, "TMPDIR": str(work)},
                                  timeout=3600)
            wall = time.monotonic() - t0
            if done.returncode != 0:
                raise SystemExit(done.stderr[-3000:])
            report(json.loads(done.stdout.splitlines()[-1]), args, wall)
    finally:
        subprocess.run(["rm", "-rf", str(work)], timeout=60)


def report(data: dict, args: argparse.Namespace, wall: float) -> None:  # type: ignore[type-arg]
    guests = (f", one guest per node ({data['accelerator'].upper()}"
              + (": the CPU emulated" if data["accelerator"] == "tcg" else "") + ")"
              if args.mode == "guest" else "")
    print(f"{args.rounds} rounds × {len(DEPTHS)} randread workloads (QD {DEPTHS}) × "
          f"{args.runtime}, {args.mode} mode{guests}, nodes = namespaces of this machine; "
          f"{wall:.0f} s; load average at the end {os.getloadavg()[0]:.1f}")
    overhead = {k: statistics.median(v) for k, v in data["overhead"].items()}
    one = overhead["1 node"]
    print("controller overhead per trial (trial wall − runtime, median):")
    for key, value in sorted(overhead.items()):
        print(f"  {key:20} {value:6.2f} s   × 1 node's: {value / one:.2f}")
    sessions = {k: statistics.median(v) for k, v in data["sessions"].items()}
    print("per run, outside its trials (store, " + ("guests booted and their disks "
          "preconditioned" if args.mode == "guest" else "nodes' servers started") + "; median):")
    for key, value in sorted(sessions.items()):
        print(f"  {key:20} {value:6.1f} s   × 1 node's: {value / sessions['1 node']:.2f}")
    skew = data["skew"]
    if skew:
        print(f"start skew of {max(NODES)} nodes (first I/O completions, {len(skew)} trials): "
              f"median {statistics.median(skew):.0f} ms, max {max(skew):.0f} ms")
    stored = [float(s.split()[0]) for s in data["stored_skew"] if s.endswith(" ms")]
    print(("  " if skew else "start skew of the nodes, ") + "fio's own job_start (stored "
          "cluster.start_skew): " + (
        f"median {statistics.median(stored):.0f} ms, max {max(stored):.0f} ms, "
        f"{len(stored)} trials" if stored else "; ".join(sorted(set(data["stored_skew"])))))
    iops = {(r, n, w): v for r, n, w, v in data["iops"]}
    print("aggregate IOPS of N nodes on one shared target ÷ (N × one node's), per workload:")
    for n in NODES[1:]:
        ratios = [v / (n * iops[(r, 1, w)]) for (r, k, w), v in iops.items()
                  if k == n and (r, 1, w) in iops]
        print(f"  {n} nodes: median {statistics.median(ratios):.2f} (min {min(ratios):.2f}, "
              f"max {max(ratios):.2f}, {len(ratios)} trials)")


if __name__ == "__main__":
    main()
