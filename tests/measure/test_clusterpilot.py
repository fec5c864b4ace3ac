"""The controller's side of a cluster's one pilot (``measure.clusterpilot``), its sessions and
store stood in for: it chooses once every node still running has sent its pilot (a node that
ended without one is not waited for), over all the trials sent, replans every node's trials to
the plan's rounds, and writes the plan to the running nodes only. (The real exchange, over SSH:
tests/scenarios/test_cluster_pilot.py.)"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from iomatrix.measure import clusterpilot as cp
from iomatrix.measure.trialkey import TrialKey
from iomatrix.suite.method import Method
from tests.analysis.test_trialplan import nodes_pilot


class _Store:
    def __init__(self) -> None:
        self.pilot: Any = None
        self.notes: list[str] = []

    def record_pilot(self, run_id: int, trials: Any, plan: Any) -> None:
        self.pilot = (run_id, list(trials), plan)

    def add_notes(self, run_id: int, notes: list[str]) -> None:
        self.notes += notes


class _Stdin(io.BytesIO):
    def close(self) -> None:        # kept readable for the test
        pass


@dataclass
class _Proc:
    stdin: _Stdin = field(default_factory=_Stdin)


class _Share:
    """One node's share: configurations A and B, two workloads each."""

    def __init__(self, node: str) -> None:
        self.configurations = [type("C", (), {"key": f"{c}@{node}"})() for c in "AB"]

    def workloads_for(self, config: Any) -> list[Any]:
        return [type("W", (), {"key": f"w{i}"})() for i in range(2)]


@dataclass
class _Session:
    name: str
    share: Any
    planned: list[TrialKey]
    ended: bool = False
    proc: Any = field(default_factory=_Proc)


def test_one_plan_once_every_running_node_sent_its_pilot() -> None:
    trials, node_of = nodes_pilot(np.random.default_rng(2), 0.004, 1e-4, 0.8, nodes=3,
                                  rounds=3)
    store = _Store()
    method = Method(mode="blocklayer", pilot=True, max_samples=6)
    pilot = cp.ClusterPilot(store, 7, method, {"blocklayer": (4, 2, 2)},  # type: ignore[arg-type]
                            (1.0, 4.0), node_of)
    sessions = [_Session(f"n{i}", _Share(f"n{i}"), []) for i in range(3)]
    for s in sessions:
        s.planned[:] = cp.planned_keys(s.share, 1)
    said: list[str] = []

    def send(node: str) -> None:
        mine = [t.model_dump(mode="json") for t in trials if node_of[t.config_key] == node]
        assert pilot.received(node, {"event": "pilot", "trials": mine}) == 0
        cp.plan_every_node(pilot, sessions, said.append)

    send("n0")
    assert pilot.plan is None and store.pilot is None      # n1 and n2 still measuring theirs
    sessions[2].ended = True                              # n2 dropped before sending its pilot
    send("n1")
    assert pilot.plan is not None and pilot.plan.choice is not None
    rounds = pilot.plan.choice.rounds
    run_id, stored, plan = store.pilot
    assert run_id == 7 and plan == pilot.plan
    assert {node_of[t.config_key] for t in stored} == {"n0", "n1"}
    assert len(stored) == 2 * len(trials) // 3
    assert store.notes == said == [pilot.note] and "n0, n1" in pilot.note
    for s in sessions:          # every node's trials are now the plan's rounds
        assert sorted({k.sample_index for k in s.planned}) == list(range(rounds))
        assert len(s.planned) == 2 * 2 * rounds
    line = cp.PlanLine.model_validate_json(sessions[0].proc.stdin.getvalue())
    assert line.plan.model_dump() == plan.model_dump()
    assert sessions[1].proc.stdin.getvalue() == sessions[0].proc.stdin.getvalue()
    assert sessions[2].proc.stdin.getvalue() == b""        # an ended node is sent nothing
    send("n0")                                             # chosen once: a late event changes nothing
    assert store.notes == [pilot.note] and pilot.plan == plan
