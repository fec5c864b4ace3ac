#!/usr/bin/env python3
"""What running a suite on a cluster's nodes costs over running it on one host (issue 23).

Makes 4 nodes on this machine (tests/sshnodes.py: network namespaces with their own sshd; needs
root and openssh-server), then runs one host-mode suite of short trials (TRIALS workloads × 1 s,
one round) as a local run and as cluster runs on 1, 2 and 4 nodes, each into a new SQLite file.
Prints per run its wall time, its trials, and the controller's overhead per trial:
(wall of the cluster run − wall of the local run) / trials per node, i.e. what SSH logins, the
preflight, each node's iomatrix start and the share's fetch add to each trial a node measures.
The nodes share this machine's cores and disk: with 2 or 4 nodes their trials contend, so the
wall time grows with the nodes for that reason too; the 1-node row is the clean overhead.

    .venv/bin/python bench/cluster_overhead.py [--trials 8]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.sshnodes import problem, ssh_cluster  # noqa: E402


def suite_text(target: Path, trials: int, nodes: str) -> str:
    bs = ", ".join(f'"{4 << (i % 6)}k"' for i in range(trials))
    return (f'[suite]\nname = "overhead"\n[target]\ndirectory = "{target}"\nsize = "16MiB"\n'
            f'[workloads]\nrw = ["randread", "randwrite"]\nbs = [{bs}]\niodepth = [1]\n'
            f'[method]\nmode = "host"\nramp = "0s"\nruntime = "1s"\n{nodes}')


def timed(argv: list[str]) -> float:
    t = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=1800, cwd=REPO)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv[-4:])}: exit {done.returncode}: {done.stderr[-2000:]}")
    return time.monotonic() - t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=4, help="workloads per rw (default 4)")
    args = parser.parse_args()
    reason = problem()
    if reason:
        raise SystemExit(f"cannot make nodes here: {reason}")
    iomatrix = str(REPO / ".venv" / "bin" / "iomatrix")
    with tempfile.TemporaryDirectory(prefix="iomatrix-bench-") as tmp:
        work = Path(tmp)
        with ssh_cluster(work / "nodes", 4) as cluster:
            inventory = work / "nodes.toml"
            inventory.write_text(cluster.inventory(
                extra=f'ssh_config = "none"\ncommand = "{iomatrix}"\n'))
            trials = 2 * len({4 << (i % 6) for i in range(args.trials)})
            rows = []
            for count in (0, 1, 2, 4):
                nodes = ("" if not count else
                         f'[nodes]\ninventory = "{inventory}"\n')
                suite = work / f"s{count}.toml"
                suite.write_text(suite_text(work / "target", args.trials, nodes))
                if count:          # the first `count` nodes of the inventory
                    table = inventory.read_text().split("[[node]]")[1:count + 1]
                    sub = work / f"nodes{count}.toml"
                    sub.write_text("".join("[[node]]" + t for t in table))
                    suite.write_text(suite.read_text().replace(str(inventory), str(sub)))
                argv = cluster.controller([sys.executable, "-m", "iomatrix", "run", str(suite),
                                           "--db", str(work / f"r{count}.db")])
                rows.append((count, timed(argv)))
    local = rows[0][1]
    print(f"{trials} trials per node (host mode, 1 s each, no ramp), one round")
    print(f"{'nodes':>5}  {'wall s':>7}  {'overhead s/trial':>16}  {'wall / local':>12}")
    for count, wall in rows:
        overhead = "—" if not count else f"{(wall - local) / trials:.2f}"
        print(f"{count or 'local':>5}  {wall:7.1f}  {overhead:>16}  {wall / local:12.2f}")


if __name__ == "__main__":
    main()
