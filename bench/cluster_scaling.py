#!/usr/bin/env python3
"""How a shared target scales with the nodes loading it at once (issue 37): aggregate IOPS /
(N × one node) for N = 1, 2, 3 with 95 % CIs, and the controller's overhead per trial.

Makes 3 nodes on this machine (tests/sshnodes.py: network namespaces with their own sshd; needs
root and openssh-server) and runs one host-mode suite with ``[method] concurrent_nodes`` and
``[matrix] node_count = [1, 2, 3]`` (ROUNDS rounds of one 4k random-read workload, the counts
interleaved), then the same workload as a local run of as many trials (no nodes). Prints per N
the aggregate and per-node IOPS and aggregate / (N × one node) from ``analysis.scaling``, where
adding a node stops adding IOPS, and the overhead per trial: (run wall time − fio's measured
windows) / trials, for the cluster run and the local run, and their difference (what driving
the nodes through SSH and fio's client adds).

The target is a directory on this machine (every node sees the same path: the namespaces share
its file system), or with ``--pool`` the single-node Ceph of tests/ceph.py (an rbd target), where
iomatrix's cluster load reaches RBD pools. Either way the nodes, their fio and the controller
share this machine's 2 cores and its disk: THE FIGURES MEASURE THIS MACHINE, NOT CEPH OR A
CLUSTER.

    .venv/bin/python bench/cluster_scaling.py [--rounds 5] [--runtime 2] [--pool]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.cluster_overhead import timed  # noqa: E402
from iomatrix.analysis.scaling import Figure, scaling  # noqa: E402
from iomatrix.store import Store  # noqa: E402
from iomatrix.store.records import StoredRun  # noqa: E402
from tests.sshnodes import SshCluster, problem, ssh_cluster  # noqa: E402

MACHINE = ("these figures measure this 2-core machine (three nodes in network namespaces, their "
           "fio and the controller on the same cores and disk), not Ceph and not a cluster")


def suite_text(target: str, rounds: int, runtime: float, *, cluster: bool) -> str:
    engine = "" if "rbd =" in target else 'engine = "libaio"\n'    # the pool: fio's rbd engine
    method = (f'[method]\nmode = "host"\n{engine}ramp = "0s"\nruntime = "{runtime}s"\n'
              f"seed = 1\n")
    if cluster:
        method += f"samples = {rounds}\nconcurrent_nodes = true\n"
        matrix = "[matrix]\nnode_count = [1, 2, 3]\n"
    else:
        method += f"samples = {3 * rounds}\nmax_samples = {3 * rounds}\n"
        matrix = ""
    return (f'[suite]\nname = "cluster-scaling"\n{target}'
            '[workloads]\nrw = "randread"\nbs = "4k"\niodepth = 8\n' + matrix + method)


@contextlib.contextmanager
def pool_target(work: Path, cluster: SshCluster) -> Iterator[str]:
    """The [target] table of an rbd target on the tests' single-node Ceph, served in the
    controller's namespace where every node reaches it, while it runs."""
    from tests import ceph
    why = ceph.missing()
    if why:
        raise SystemExit(f"no Ceph here: {why}")
    made = ceph.Cluster(work / "ceph", cluster.shared_address(), cluster.controller([]))
    made.dir.mkdir()
    try:
        made.start()
        yield (f'[target]\nsize = "64MiB"\nrbd = {{ pool = "{ceph.POOL}", monitors = '
               f'["{made.monitor}"], client = "{ceph.CLIENT}", keyring = "{made.keyring}", '
               f"connect_timeout = 10 }}\n")
    finally:
        made.stop()


def overhead(stored: StoredRun, wall: float) -> float:
    """(run wall time − fio's measured windows) / trials, seconds."""
    ok = [t for t in stored.trials if t.status == "ok"]
    measured = sum(max(s.runtime_ms for s in t.samples) / 1000 for t in ok if t.samples)
    return (wall - measured) / len(ok)


def ci(f: Figure | None, percent: bool = False) -> str:
    if f is None:
        return "—"
    show = (lambda x: f"{100 * x:.0f}%") if percent else (lambda x: f"{x:,.0f}")
    return show(f.mean) + ("" if f.low is None else f" [{show(f.low)}, {show(f.high)}]")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runtime", type=float, default=2.0, help="seconds a trial (default 2)")
    parser.add_argument("--pool", action="store_true", help="the tests' single-node Ceph pool")
    args = parser.parse_args()
    reason = problem()
    if reason:
        raise SystemExit(f"cannot make nodes here: {reason}")
    iomatrix = str(REPO / ".venv" / "bin" / "iomatrix")
    with tempfile.TemporaryDirectory(prefix="iomatrix-bench-") as tmp, contextlib.ExitStack() as stack:
        work = Path(tmp)
        cluster = stack.enter_context(ssh_cluster(work / "nodes", 3))
        target = (stack.enter_context(pool_target(work, cluster)) if args.pool else
                  f'[target]\ndirectory = "{work / "target"}"\nsize = "64MiB"\n')
        inventory = work / "nodes.toml"
        inventory.write_text(cluster.inventory(extra=f'ssh_config = "none"\ncommand = "{iomatrix}"\n'))
        walls, runs = {}, {}
        for name, on_nodes in (("cluster", True), ("local", False)):
            suite = work / f"{name}.toml"
            suite.write_text(suite_text(target, args.rounds, args.runtime, cluster=on_nodes))
            db = work / f"{name}.db"
            argv = [sys.executable, "-m", "iomatrix", "run", str(suite), "--db", str(db)]
            if on_nodes:
                argv += ["--nodes", str(inventory)]
            walls[name] = timed(cluster.controller(argv))
            with Store(db) as store:
                runs[name] = store.load_run(1)
    where = ("the tests' single-node Ceph pool (memstore), fio's rbd engine" if args.pool
             else "a directory here, libaio")
    print(f"target: {where}; 4k randread QD8, {args.runtime:g} s trials, "
          f"{args.rounds} rounds, node counts 1, 2, 3 interleaved")
    for curve in scaling(runs["cluster"]):
        print(f"{'N':>2}  {'aggregate IOPS [95% CI]':>28}  {'per node':>24}  "
              f"{'aggregate / (N x one node)':>28}")
        for row in curve.rows:
            print(f"{row.nodes:>2}  {ci(row.aggregate_iops):>28}  {ci(row.per_node_iops):>24}  "
                  f"{ci(row.efficiency, percent=True):>28}")
        print(f"scaling: {curve.saturation}")
    cluster_s, local_s = (overhead(runs[n], walls[n]) for n in ("cluster", "local"))
    print(f"overhead per trial (wall − fio's measured window, / trials): cluster load "
          f"{cluster_s:.2f} s, local run {local_s:.2f} s: the controller adds "
          f"{cluster_s - local_s:.2f} s a trial")
    print(f"NOTE: {MACHINE}.")


if __name__ == "__main__":
    main()
