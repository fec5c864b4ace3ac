"""A cluster's one pilot (``measure.clusterpilot``) reads what its nodes send as untrusted: a
node's pilot event keeps only well-formed trials of that node's own configurations, of a class
the pilot measures, and at most ``MAX_TRIALS``; a node reads only a plan from the controller's
line. (The real exchange: tests/scenarios/test_cluster_pilot.py.)"""

from __future__ import annotations

import pytest

from iomatrix.core.errors import NodesError
from iomatrix.measure import clusterpilot as cp
from iomatrix.store.records import PilotTrial
from iomatrix.store.rows import StoredPlan
from iomatrix.suite.method import Method


def _pilot() -> cp.ClusterPilot:
    return cp.ClusterPilot(None, 1, Method(mode="host", target_ci=0.5),  # type: ignore[arg-type]
                           {"host": (2, 1, 2)}, (1.0,), {"host@n1": "n1", "host@n2": "n2"})


def _trial(config: str, **kw: object) -> dict[str, object]:
    return PilotTrial(mode="host", config_key=config, workload_key="w", round=0, runtime_s=1.0,
                      iops=100.0, wall_s=1.5).model_dump(mode="json") | kw


def test_a_node_keeps_only_its_own_well_formed_pilot_trials() -> None:
    pilot = _pilot()
    sent = [_trial("host@n1"), _trial("host@n2"), _trial("host@n3"),
            _trial("host@n1", mode="guest"), _trial("host@n1", iops="many"),
            {"config_key": "host@n1"}, "host@n1", None, 7]
    assert pilot.received("n1", {"event": "pilot", "trials": sent}) == len(sent) - 1
    assert [t.config_key for t in pilot.trials["n1"]] == ["host@n1"]
    assert not pilot.ready(["n1", "n2"]) and pilot.ready(["n1"])
    assert pilot.received("n2", {"event": "pilot", "trials": "all"}) == 0
    assert pilot.trials["n2"] == [] and pilot.ready(["n1", "n2"])
    flood = [_trial("host@n2")] * (cp.MAX_TRIALS + 5)
    assert pilot.received("n2", {"trials": flood}) == 5
    assert len(pilot.trials["n2"]) == cp.MAX_TRIALS


def test_a_node_takes_only_a_plan_from_the_controller() -> None:
    sent: list[dict[str, object]] = []
    node = cp.NodePilot(None, lambda event, **fields: sent.append({"event": event, **fields}))
    plan = StoredPlan(pilot_seconds=3.0, noise=(), choice=None)
    node.line(cp.PlanLine(plan=plan).model_dump_json().encode())
    assert node.plan([PilotTrial.model_validate(_trial("host@n1"))]) == plan
    assert sent[0]["event"] == "pilot" and len(sent[0]["trials"]) == 1  # type: ignore[arg-type]
    node.line(b'{"plan": "/etc/passwd"}')
    with pytest.raises(NodesError, match="the controller sent no plan"):
        node.plan([])
