"""A run opened for measuring (``measure.runner``): a new run stored with its host record and
notes, or a stored run reopened to resume (its own order, the trials it has, those to measure
again); this process's claim on it and what dead processes left for it reclaimed; and the target
device's IRQs steered for it ([method] irq_affinity)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import NamedTuple

from iomatrix.cluster.ssh import Node
from iomatrix.core.model import Frozen
from iomatrix.measure.prepare import PreparedRun
from iomatrix.measure.reclaim import RESOURCES, RunProcess, describe, reclaim
from iomatrix.measure.trialkey import TrialKey
from iomatrix.qemu.args import MACHINE
from iomatrix.store.records import ResourceRecord, StoredRun, StoredSuite
from iomatrix.store.repo import Store, now
from iomatrix.suite.fields import NODE_AXIS
from iomatrix.suite.model import Suite
from iomatrix.targets.kind import OpenTarget
from iomatrix.telemetry import irq
from iomatrix.telemetry.hostinfo import host_metadata
from iomatrix.vocab.words import TrialStatus


class Share(Frozen):
    """A node's share of a cluster run (``iomatrix.measure.cluster``): its configurations are
    keyed with ``node``; its trials go into the run known by ``run_uuid``: the cluster's own
    when ``shared`` (a PostgreSQL store every node writes into, whose run the controller owns and
    ends), else a run of that uuid in a store of the node's own, copied into the cluster's."""

    node: str
    run_uuid: str
    shared: bool = False


def take_over(store: Store, me: RunProcess, suite: Suite, resume: int | None,
              share: Share | None, note: Callable[[str], None]) -> None:
    """The run resumed claimed by this process (``RunBusy`` while a live one owns it), and what
    dead processes left for it or its target reclaimed (``reclaim_scope``)."""
    assert me.id is not None
    if resume is not None and share is not None and share.shared:
        previous = None                 # the controller owns the cluster's run
    elif resume is not None:
        previous = store.claim_run(resume, me.id)
        me.run_id = resume
        if previous is not None:
            note(f"run {resume} was left by pid {previous.pid} (since "
                 f"{previous.started_at}), which is gone: this process takes it over")
    for done_item in reclaim(store, me=me.id, scope=reclaim_scope(suite, resume)):
        if done_item.action == "removed":
            note(describe(done_item))


class Started(NamedTuple):
    """The run stored (new) or reopened (resumed), as the runner measures it."""

    run_id: int
    prepared: PreparedRun
    done: set[TrialKey]
    """Trials stored already (resume)."""
    retry: set[TrialKey]
    """Failed trials measured again (--retry-failed)."""
    notes: list[str]


def open_run(store: Store, me: RunProcess, prepared: PreparedRun, workspace: OpenTarget, *,
             resume: int | None, retry_failed: bool, share: Share | None,
             nodes: Sequence[Node]) -> Started:
    """A new run stored (its host record, with what the target's kind adds, and its notes), or
    the run ``resume`` reopened (``reopen``)."""
    suite = prepared.suite
    if resume is not None:
        prepared, done, retry, notes = reopen(store, resume, prepared, workspace.notes,
                                              retry_failed, share.node if share else None)
        return Started(resume, prepared, done, retry, notes)
    host = host_record(suite, workspace, prepared.accelerator)
    if suite.method.concurrent_nodes:
        host["nodes"] = ", ".join(n.label for n in nodes)
    notes = [*prepared.host_notes, *prepared.expansion.notes, *workspace.notes, *prepared.notes]
    run_id = store.create_run(suite=StoredSuite.of(suite), host=host,
                              accelerator=prepared.accelerator, notes=notes,
                              configs=prepared.expansion.configurations,
                              workloads=prepared.expansion.workloads,
                              seed=prepared.seed, owner=me.id,
                              run_uuid=share.run_uuid if share else None)
    me.run_id = run_id
    if suite.method.concurrent_nodes:       # --resume finds them there
        store.add_nodes(run_id, [(n.label, asdict(n), {}) for n in nodes])
    return Started(run_id, prepared, set(), set(), notes)


def host_record(suite: Suite, workspace: OpenTarget, accelerator: str) -> dict[str, str]:
    """The host's metadata stored with a new run, the target named as the user gave it."""
    host = host_metadata(suite.target.directory or suite.target.device,
                         accelerator=accelerator, machine=MACHINE).stored()
    host.update(workspace.host_fields())
    host["target_irqs"] = irq.report(irq.target_device(suite.target.directory
                                                       or suite.target.device))
    return host


def steered_irqs(started: Started, store: Store, say: Callable[[str], None],
                 process: int) -> contextlib.AbstractContextManager[list[int]]:
    """``[method] irq_affinity``: the target device's IRQs steered for the run and put back
    after it (``telemetry.irq.steered``), each recorded first as ``process``'s (what a killed
    run left steered, ``reclaim`` puts back), what was done in the run's notes; else nothing."""
    suite = started.prepared.suite
    level = suite.method.irq_affinity
    if level is None:
        return contextlib.nullcontext([])

    def note(text: str) -> None:
        store.add_notes(started.run_id, [text])
        say(text)

    def record(number: int, previous: str, steered_to: str) -> Callable[[str], None]:
        rid = store.add_resource(process, irq.KIND, str(number),
                                 irq.recorded_within(previous, steered_to), run_id=started.run_id)
        return lambda outcome: store.settle_resource(rid, outcome)
    return irq.steered(irq.target_device(suite.target.directory or suite.target.device),
                       level, note, record=record)


def reopen(store: Store, run_id: int, prepared: PreparedRun, target_notes: list[str],
           retry_failed: bool, node: str | None = None) -> tuple[
               PreparedRun, set[TrialKey], set[TrialKey], list[str]]:
    """A stored run reopened to resume: the run prepared in its own order, the trials it has
    (``done``), those to measure again (``retry``: its failed ones with ``retry_failed``) and
    its notes with what this process adds. ``node``: only that node's share of a cluster run."""
    stored = store.load_run(run_id)
    if node is not None:
        stored = stored.model_copy(update={"configs": tuple(
            c for c in stored.configs if c.params.get(NODE_AXIS) == node)})
    prepared = prepared.resumed(stored)
    done = {TrialKey.of(t) for t in stored.trials
            if t.status == TrialStatus.OK or not retry_failed}
    retry = {TrialKey.of(t) for t in stored.trials
             if t.status == TrialStatus.FAILED and retry_failed}
    added = [n for n in [*target_notes, *prepared.notes] if n not in stored.notes]
    if retry:
        added.append(retry_note(stored, retry))
    store.add_notes(run_id, added)
    store.reopen_run(run_id)
    return prepared, done, retry, [*stored.notes, *added]


def late_notes(store: Store, run_id: int, note: Callable[[str], None], notes: list[str],
               now_known: list[str]) -> None:
    """Store and show the notes only making the target could tell (a loop device the kernel
    gave no direct I/O: ``TargetSet.create``)."""
    added = [n for n in now_known if n not in notes]
    if added:
        store.add_notes(run_id, added)
    for text in added:
        note(text)


def retry_note(stored: StoredRun, retry: set[TrialKey]) -> str:
    """The run note that says which failed trials --retry-failed measures again, and why they
    had failed (each failed attempt is kept whole in the run's trial history)."""
    reasons: dict[str, int] = {}
    for t in stored.trials:
        if TrialKey.of(t) in retry:
            reason = (t.reason or "no reason recorded").splitlines()[0][:200]
            reasons[reason] = reasons.get(reason, 0) + 1
    listed = "; ".join(f"{n}× {reason}" for reason, n in list(reasons.items())[:5])
    more = f"; and {len(reasons) - 5} other reasons" if len(reasons) > 5 else ""
    return (f"{now()}: --retry-failed measures {len(retry)} failed trial(s) again; they had "
            f"failed with: {listed}{more} (each failed attempt is kept in the run's trial "
            "history)")


def reclaim_scope(suite: Suite, resume: int | None) -> Callable[[ResourceRecord], bool]:
    """What a run reclaims when it starts: scratch directories, the image directories of the
    run it resumes or of its target directories, and target directories made for it that are
    left empty (``iomatrix clean`` reclaims everything)."""
    targets = {os.path.realpath(d) for t in (suite.target, *suite.named_targets)
               for d in (t.directory, t.network and t.network.image_directory) if d}
    above = {str(p) for t in targets for p in (Path(t), *Path(t).parents)}

    def wanted(r: ResourceRecord) -> bool:
        return (r.kind == "scratch" or r.kind in RESOURCES
                or (r.kind == "parent" and r.path in above)
                or (r.kind == "workspace" and (r.within in targets
                                               or (resume is not None and r.run_id == resume))))
    return wanted
