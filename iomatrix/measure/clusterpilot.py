"""One pilot for a whole cluster whose nodes each measure their own share (``[method] pilot``
or ``target_ci`` with ``[nodes]``): each node measures its pilot as a host's run does
(``runner``), every node at once; instead of choosing from it, it sends its pilot's trials to
the controller (a ``pilot`` progress event) and waits for the plan (a line on its stdin). The
controller, once every node still running has sent its trials, chooses one plan over all of
them (``analysis.trialplan.decide``: one estimate, each node pairing its own configurations),
stores them as the run's pilot with that plan, notes it, and sends the plan to every node,
which then measures the rounds (and trial length) it says. A resumed run keeps the plan it
stored: the controller gives it to each node at the start, and no pilot is measured again.

What a node sends is untrusted: each trial is read as a ``PilotTrial``, and only trials of the
node's own configurations, of a class the pilot measures, are kept."""

from __future__ import annotations

import contextlib
import queue
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from pydantic import ValidationError

from iomatrix.core.errors import NodesError
from iomatrix.core.model import Frozen
from iomatrix.measure.trialkey import TrialKey
from iomatrix.store.records import PilotTrial
from iomatrix.store.repo import Store
from iomatrix.store.rows import StoredPlan
from iomatrix.suite.expand import Expansion
from iomatrix.suite.method import Method

MAX_TRIALS = 10_000
"""The most pilot trials a node may send (a pilot measures a few dozen a class)."""


class PlanLine(Frozen):
    """What the controller writes on a node's stdin once it has chosen: the cluster's plan."""

    plan: StoredPlan


class NodePilot:
    """A node's side: its pilot's trials to the controller, the cluster's plan back."""

    def __init__(self, given: StoredPlan | None, emit: Callable[..., None]) -> None:
        self.given = given
        """The plan the controller stored already (a resumed run): no pilot is measured."""
        self.emit = emit
        self.lines: queue.Queue[bytes] = queue.Queue()

    def line(self, raw: bytes) -> None:
        """A line the controller wrote on stdin after its request (``watch_stdin``)."""
        self.lines.put(raw)

    def plan(self, trials: Sequence[PilotTrial]) -> StoredPlan:
        """Send this node's pilot ``trials`` and wait for the cluster's plan (Ctrl-C, or the
        end of stdin, stops the wait as it stops the run)."""
        self.emit("pilot", trials=[t.model_dump(mode="json") for t in trials])
        while True:
            try:
                raw = self.lines.get(timeout=1.0)
            except queue.Empty:
                continue
            try:
                return PlanLine.model_validate_json(raw).plan
            except ValidationError as exc:
                raise NodesError(f"the controller sent no plan: {exc.errors()[0]['msg']}") from None


class ClusterPilot:
    """The controller's side: the nodes' pilot trials as they arrive, and the one plan."""

    def __init__(self, store: Store, run_id: int, method: Method,
                 per_mode: Mapping[str, tuple[int, int, int]], lengths: Sequence[float],
                 node_of: Mapping[str, str]) -> None:
        self.store, self.run_id, self.method = store, run_id, method
        self.per_mode, self.lengths, self.node_of = per_mode, tuple(lengths), node_of
        """(per_mode: one node's trials, sessions and pairs a round per class, as
        ``runner.pilot_points`` gives them; node_of: each configuration's node.)"""
        self.trials: dict[str, list[PilotTrial]] = {}
        self.t0 = time.monotonic()
        self.plan: StoredPlan | None = None
        self.note = ""

    @classmethod
    def of(cls, store: Store, run_id: int, method: Method, shares: Mapping[str, Expansion],
           per_mode: Mapping[str, tuple[int, int, int]]) -> ClusterPilot:
        """The controller's side for a run of these nodes' ``shares``; ``per_mode`` is what
        one node's pilot measures (``runner.pilot_points`` of its share: alike on every node)."""
        from iomatrix.analysis.trialplan import pilot_lengths

        return cls(store, run_id, method, per_mode,
                   pilot_lengths(method.chooses_runtime, method.window),
                   {c.key: name for name, share in shares.items() for c in share.configurations})

    def received(self, node: str, event: Mapping[str, Any]) -> int:
        """A node's ``pilot`` event: its trials kept (those of its own configurations, of a
        class the pilot measures; at most ``MAX_TRIALS``); how many were dropped."""
        raw = event.get("trials")
        listed = raw[:MAX_TRIALS] if isinstance(raw, list) else []
        kept: list[PilotTrial] = []
        for item in listed:
            try:
                trial = PilotTrial.model_validate(item)
            except ValidationError:
                continue
            if self.node_of.get(trial.config_key) == node and trial.mode in self.per_mode:
                kept.append(trial)
        self.trials[node] = kept
        return (len(raw) if isinstance(raw, list) else 0) - len(kept)

    def ready(self, waiting: Iterable[str]) -> bool:
        """Whether to choose now: no plan yet, some node's trials in, and every node in
        ``waiting`` (those still running) has sent its own."""
        return self.plan is None and bool(self.trials) and all(
            n in self.trials for n in waiting)

    def choose(self) -> StoredPlan:
        """One plan over every node's trials, stored with them as the run's pilot and noted."""
        from iomatrix.analysis import trialplan as tp   # scipy: loaded only when asked for

        trials = [t for node in sorted(self.trials) for t in self.trials[node]]
        plan, note = tp.decide(trials, self.per_mode, self.method, time.monotonic() - self.t0,
                               self.lengths, nodes=self.node_of)
        self.note = (f"{note} (the pilot ran on every node at once, {', '.join(sorted(self.trials))}"
                     ": this plan is every node's)")
        self.store.record_pilot(self.run_id, trials, plan)
        self.store.add_notes(self.run_id, [self.note])
        self.plan = plan
        return plan

    def line(self) -> bytes:
        """The plan as the line each node reads."""
        assert self.plan is not None
        return (PlanLine(plan=self.plan).model_dump_json() + "\n").encode()


class Session(Protocol):
    """A node's session as the controller follows it (``cluster._Node``)."""

    @property
    def name(self) -> str: ...
    share: Expansion
    planned: list[TrialKey]
    ended: bool
    proc: subprocess.Popen[bytes] | None


def planned_keys(share: Expansion, rounds: int) -> list[TrialKey]:
    """A node's trials in ``rounds`` rounds of its ``share``."""
    return [TrialKey(c.key, w.key, k) for c in share.configurations
            for w in share.workloads_for(c) for k in range(rounds)]


def plan_every_node(pilot: ClusterPilot, sessions: Sequence[Session],
                    say: Callable[[str], None]) -> None:
    """Once every node still running has sent its pilot (``ClusterPilot.ready``): the plan
    chosen, each node's planned trials made its rounds, and the plan sent to each running
    node (one that cannot be written to has ended: its end is accounted for as any)."""
    if not pilot.ready(s.name for s in sessions if not s.ended):
        return
    plan = pilot.choose()
    say(pilot.note)
    if plan.choice is not None:
        for s in sessions:
            s.planned[:] = planned_keys(s.share, plan.choice.rounds)
    for s in sessions:
        if not s.ended and s.proc is not None and s.proc.stdin is not None:
            with contextlib.suppress(OSError, ValueError):
                s.proc.stdin.write(pilot.line())
                s.proc.stdin.flush()
