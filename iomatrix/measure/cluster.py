"""A suite measured on every node of a cluster (``[nodes]``, ``iomatrix run --nodes``): the
controller checks each node over SSH, stores one run whose configurations carry the node that
measures them (the ``node`` axis), and starts iomatrix on each node over SSH with the suite's
text on stdin (``iomatrix node run``). Each node measures its share as a local run would, and
its trials reach the run either straight (a PostgreSQL store every node writes into) or through
a store of the node's own that the controller fetches over SSH and copies in when the node ends.

A node's iomatrix lives only as long as its SSH session: the controller holds the session's
stdin open and never writes after the request, so end-of-file on it means the controller (or
the link) is gone, and the node stops as Ctrl-C stops a run (``watch_stdin``). A session that
SSH gives up on (no keepalive answered) is a dropped node: its unmeasured trials fail with the
reason, and the others go on or stop (``[method] on_node_failure``)."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import IO, Any, Protocol

from pydantic import ValidationError

from iomatrix.cluster.ssh import Node, ssh_argv
from iomatrix.core.errors import IomatrixError, NodesError, RunNotFound
from iomatrix.core.proc import last_line, which
from iomatrix.core.text import printable
from iomatrix.measure.clusterpilot import ClusterPilot, plan_every_node, planned_keys
from iomatrix.measure.prepare import prepare
from iomatrix.measure.reclaim import run_process
from iomatrix.measure.nodeside import CheckRequest, NodeFacts, NodeRequest, node_facts
from iomatrix.measure.precheck import check_author
from iomatrix.measure.runner import RunOutcome, pilot_points
from iomatrix.measure.trialkey import TrialKey
from iomatrix.store.records import StoredSuite, TrialResult
from iomatrix.store.repo import Store, now
from iomatrix.store.rows import StoredPlan
from iomatrix.suite.expand import Expansion
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.model import Suite
from iomatrix.suite.workloads import Workload
from iomatrix.suite.spec import RunSpec
from iomatrix.suite.plan import estimate_seconds
from iomatrix.qemu.args import MACHINE
from iomatrix.telemetry.hostinfo import host_metadata
from iomatrix.vocab.words import Accel, Mode, QueueStatus, RunStatus, TrialStatus

PREFLIGHT_TIMEOUT = 120.0
"""Seconds a node's preflight may take (SSH login, iomatrix's start, fio and QEMU versions)."""
STOP_GRACE = 60.0
"""Seconds a node's iomatrix has to stop and clean up once its session's stdin closes."""
COMPARED = ("iomatrix", "fio", "qemu")
"""What must be the same on every node as on the controller: results differ by them."""


# --- the controller's side ---------------------------------------------------------------------

class ClusterProgress(Protocol):
    """What a cluster run tells its caller of its nodes' shares; the CLI draws it."""

    def start(self, shares: Mapping[str, tuple[int, float]]) -> None:
        """Before the nodes start: each node's trials to measure and iomatrix's estimate of
        their seconds."""
    def node_started(self, node: str, trials: int, planned_seconds: float) -> None:
        """A node has prepared its share and measures it now (its own count and estimate)."""
    def trial_started(self, node: str, config: Configuration, workload: Workload,
                      sample: int) -> None: ...
    def trial_finished(self, node: str, ok: bool, detail: str) -> None: ...
    def node_ended(self, node: str, status: str, reason: str | None, *, ok: int, failed: int,
                   left: int) -> None:
        """A node's session ended: done, dropped or failed (``reason``; with [method]
        on_node_failure = "continue" the rest of its trials stored as failed with it), or
        stopped with the run; its share's trials in the run now: ``ok``, ``failed``, and
        ``left`` for --resume."""
    def note(self, text: str) -> None: ...


def resolve_nodes(suite: Suite, given: str | None) -> tuple[Node, ...]:
    """The nodes of a run: ``--nodes`` (``given``) over the suite's [nodes]; () for neither.
    Their files pass rule 1 (``ssh.check_nodes``), and a suite another user could have written
    names only what such input may (``ssh.untrusted``: no user but root or yours)."""
    from iomatrix.cluster import ssh

    base = Path(suite.source_path).parent if suite.source_path and not suite.source_path.startswith(
        "builtin:") else None
    if given is not None:
        return ssh.check_nodes(ssh.resolve(given, base=base))
    spec = suite.nodes
    if spec is None:
        return ()
    defaults = spec.defaults()
    if spec.proxmox:
        return ssh.check_nodes(ssh.read_pve_members())
    if spec.inventory is not None:
        path = Path(os.path.expanduser(spec.inventory))
        return ssh.check_nodes(ssh.load_inventory(
            path if path.is_absolute() or base is None else base / path))
    listed = ssh.parse_inventory({"hosts": list(spec.hosts), **defaults}, "[nodes]", base=base)
    if not suite.author.trusted:        # what only your own configuration names (a user)
        listed = tuple(ssh.untrusted(n, f"[nodes] of {suite.author.where or 'the suite'} "
                                        f"(another user could write it): node {n.label}")
                       for n in listed)
    return ssh.check_nodes(listed)


def resume_nodes(suite: Suite, given: str | None,
                 rows: Sequence[tuple[str, object]]) -> tuple[Node, ...]:
    """The nodes to resume a stored cluster run on, whose ``rows`` are (name, ``Node``'s fields)
    from its store: named afresh by ``--nodes`` (``given``) or the run's suite's [nodes], as a
    new run's are, when those are the run's nodes by name (``given`` must be); else the rows
    themselves, read as untrusted input (``ssh.stored_node``: a store may be another user's)."""
    from iomatrix.cluster import ssh

    names = [name for name, _ in rows]
    if given is not None or suite.nodes is not None:
        try:
            fresh = resolve_nodes(suite, given)
        except NodesError:
            if given is not None:
                raise
            fresh = ()          # the suite's inventory is gone: the run's own rows, then
        if [n.label for n in fresh] == names:
            return fresh
        if given is not None:
            raise NodesError(f"--nodes names {', '.join(n.label for n in fresh)}; the run's "
                             f"nodes are {', '.join(names)}",
                             hint="a resumed run keeps its nodes: name the same ones")
    return ssh.check_nodes([ssh.stored_node(fields, name, f"the run's node {ssh.shown(name)}")
                            for name, fields in rows])


def nodes_store(db: str) -> str | None:
    """The store a cluster run's nodes write their trials into themselves: the run's PostgreSQL
    store when its URL carries no password (each node logs in with credentials of its own: its
    ``~/.pgpass``, a client certificate); None for an SQLite store, or a URL with a password,
    which never leaves the controller: the nodes then keep their shares, and the controller
    copies each in when its node ends."""
    from iomatrix.store.location import PgUrl, parse_location

    location = parse_location(db)
    return db if isinstance(location, PgUrl) and not location.secrets else None


def _session(node: Node, command: Sequence[str], request: str | None, *,
             timeout: float) -> subprocess.CompletedProcess[bytes]:
    """Run ``command`` on ``node`` over SSH with ``request`` on its stdin, to the end."""
    argv = ssh_argv(node, command)
    try:
        return subprocess.run(argv, input=(request or "").encode(), capture_output=True,
                              timeout=timeout, start_new_session=True)
    except subprocess.TimeoutExpired as exc:
        raise NodesError(f"node {node.label}: no answer within {timeout:.0f} s") from exc
    except OSError as exc:
        raise NodesError(f"cannot run ssh: {exc.strerror or exc}",
                         hint="install OpenSSH's client: apt-get install openssh-client") from exc


def _failure(node: Node, done: subprocess.CompletedProcess[bytes], what: str) -> str:
    """One line: why a node's command failed, as SSH or the node's iomatrix said."""
    said = last_line(done.stderr.decode(errors="replace")) or f"exit status {done.returncode}"
    if done.returncode == 255:
        return f"node {node.label} ({node.destination()}): unreachable over SSH: {said}"
    if done.returncode == 127:
        return (f"node {node.label}: {node.command!r} not found on the node (install iomatrix "
                "there, or give the node's command in the inventory)")
    return f"node {node.label}: {what} failed: {said}"


def preflight(suite: Suite, nodes: Sequence[Node], *, accel: str | None = None,
              mine: NodeFacts | None = None) -> dict[str, NodeFacts]:
    """Every node's facts (``node_facts``), asked over SSH at once; NodesError with one line per
    node that cannot be used: unreachable, missing iomatrix, an answer that is no facts, a
    problem with the suite there, or an iomatrix, fio or QEMU version unlike the controller's
    (``mine``: this host's facts), or KVM where the controller has it for a guest suite. What
    the suite's author may not ask (``precheck.check_author``) is refused first, in one line:
    before any node is asked or any target reached."""
    check_author(suite)
    from iomatrix.cluster.ssh import check_nodes

    check_nodes(nodes)              # rule 1, before any ssh starts (however the nodes came)
    mine = mine or node_facts(suite)
    guests = Mode.GUEST in {c.mode for c in prepare(suite).full.configurations}
    request = CheckRequest(suite_text=suite.source_text, suite_spec=RunSpec.of(suite),
                           suite_source=suite.source_path,
                           trusted=suite.author.trusted).model_dump_json()
    results: dict[str, NodeFacts] = {}
    problems: dict[str, list[str]] = {}

    def ask(node: Node) -> None:
        try:
            done = _session(node, [node.command, "node", "check"], request,
                            timeout=PREFLIGHT_TIMEOUT)
        except NodesError as exc:
            problems[node.label] = [str(exc)]
            return
        if done.returncode != 0:
            problems[node.label] = [_failure(node, done, "iomatrix node check")]
            return
        try:
            facts = answered(done.stdout)
        except ValueError as exc:
            problems[node.label] = [f"node {node.label}: its iomatrix node check answered no "
                                    f"preflight facts: {exc}"]
            return
        results[node.label] = facts
        wrong = [f"node {node.label}: {printable(p)}" for p in facts.problems]
        for key in COMPARED:
            theirs, ours = getattr(facts, key), getattr(mine, key)
            if theirs != ours:
                wrong.append(f"node {node.label}: {key} is {printable(theirs) or '(none)'}, "
                             f"the controller's is {ours or '(none)'}")
        if guests and accel != Accel.TCG and facts.kvm != mine.kvm:
            wrong.append(f"node {node.label}: KVM {printable(facts.kvm)}, on the controller "
                         f"{mine.kvm}: its guests would not run as the others'")
        if wrong:
            problems[node.label] = wrong

    threads = [threading.Thread(target=ask, args=(n,), daemon=True) for n in nodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if problems:
        raise NodesError("\n".join(line for n in nodes for line in problems.get(n.label, [])),
                         hint="nothing was run or stored; fix those nodes, or leave them out")
    return results


def answered(stdout: bytes) -> NodeFacts:
    """A node's ``iomatrix node check`` answer (one JSON object) as its facts; ValueError saying
    in one short line why it is none (not JSON, not an object, a key unknown or of the wrong
    type, host metadata the store would not take)."""
    try:
        return NodeFacts.model_validate_json(stdout)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ValueError(printable((f"{where}: " if where else "")
                                   + first["msg"].removeprefix("Value error, "))[:200]) from None


class _Node:
    """One node's session during a cluster run."""

    def __init__(self, node: Node, share: Expansion, planned: list[TrialKey]) -> None:
        self.node = node
        self.planned = planned
        self.configs = {c.key: c for c in share.configurations}
        self.workloads = {w.key: w for w in share.workloads}
        self.proc: subprocess.Popen[bytes] | None = None
        self.stderr: list[str] = []
        self.finished = False
        """The node said its share is done (its "done" event)."""
        self.threads: list[threading.Thread] = []
        self.hung_up = False
        """The controller ended the session's stdin: the node was told to stop."""
        self.shared = False
        """The node writes its trials into the run's store itself (``nodes_store``)."""
        self.share = share
        self.told = 0
        """The trials the node said it measures (its pilot's, then its rounds')."""
        self.ended = False

    @property
    def name(self) -> str:
        return self.node.label


def run_cluster(suite: Suite, nodes: Sequence[Node], store: Store, *, db: str | None,
                progress: ClusterProgress, keep: bool = False, accel: str | None = None,
                seed: int | None = None, resume: int | None = None,
                retry_failed: bool = False,
                facts: Mapping[str, NodeFacts] | None = None) -> RunOutcome:
    """Measure ``suite`` on every node (the module's docstring) as one run of ``store``, or
    continue the cluster run ``resume`` on its nodes; ``db`` is the store's PostgreSQL URL when
    the nodes write into it (``nodes_store``), else None. NodesError before anything is stored when a node cannot
    be used (``preflight``, unless its ``facts`` are given: it ran already)."""
    t0 = time.monotonic()
    names = [n.label for n in nodes]
    check_author(suite)             # before anything is stored, whatever facts were given
    facts = facts if facts is not None else preflight(suite, nodes, accel=accel)
    prepared = prepare(suite, accel=accel, seed=seed)
    configs = tuple(c for name in names for c in prepared.expansion.on_node(name).configurations)
    with run_process(store, keep=keep) as me:
        assert me.id is not None
        if resume is None:
            # each trial records what its node's guests ran under; the run, what was asked
            guests = any(c.mode == Mode.GUEST for c in configs)
            accelerator = prepared.accelerator if guests else "none"
            host = host_metadata(suite.target.directory or suite.target.device,
                                 accelerator=accelerator, machine=MACHINE).stored()
            host["nodes"] = ", ".join(names)
            run_id = store.create_run(
                suite=StoredSuite.of(suite), host=host, accelerator=accelerator,
                notes=[*prepared.expansion.notes, f"nodes: {', '.join(names)}, each measuring "
                       "the suite on its own target (the node axis)"],
                configs=configs, workloads=prepared.expansion.workloads, seed=prepared.seed,
                owner=me.id)
            me.run_id = run_id
            store.add_nodes(run_id, [(n.label, asdict(n), facts[n.label].host) for n in nodes])
            run_seed = prepared.seed
        else:
            run_id = resume
            store.claim_run(run_id, me.id)
            me.run_id = run_id
            store.reopen_run(run_id)
            run_seed = store.load_run(run_id).seed or 0
        run_uuid = store.run_uuid(run_id)
        status = RunStatus.FAILED
        stopped = False
        try:
            # [method] pilot or target_ci: one plan, the run's stored one (resumed), else
            # chosen over every node's pilot (``clusterpilot``), the rounds then replanned
            plan = store.load_pilot(run_id)[1] if suite.method.plans_rounds else None
            if plan is not None and plan.choice is not None:
                prepared = prepared.chosen(plan.choice)     # its rounds, in the estimates
            shares = {name: prepared.expansion.on_node(name) for name in names}
            pilot = (ClusterPilot.of(
                         store, run_id, suite.method, shares,
                         pilot_points(next(iter(shares.values())), run_seed)[1])
                     if suite.method.plans_rounds and plan is None else None)
            rounds = plan.choice.rounds if plan and plan.choice else suite.method.samples
            planned = {name: planned_keys(share, rounds) for name, share in shares.items()}
            estimates = {name: estimate_seconds(prepared.on_node(name).blocks,
                                          prepared.suite.method)
                         for name in names}
            stopped = _drive(suite, nodes, store, run_id, run_uuid, run_seed, shares=shares,
                             planned=planned, estimates=estimates, db=db, keep=keep, accel=accel,
                             retry_failed=retry_failed, progress=progress, plan=plan,
                             pilot=pilot)
            status = RunStatus.INTERRUPTED if stopped else RunStatus.COMPLETE
        except KeyboardInterrupt:
            status = RunStatus.INTERRUPTED
            raise
        finally:
            store.finish_run(run_id, status)
    stored = store.load_run(run_id)
    if stopped:
        raise NodesError("\n".join(f"node {n.name}: {n.status}: {n.reason}" for n in stored.nodes
                                   if n.status in (QueueStatus.DROPPED, QueueStatus.FAILED)),
                         hint=f"[method] on_node_failure = \"stop\": every node was stopped; "
                              f"`iomatrix run --resume {run_id}` continues the run")
    ok = sum(1 for t in stored.trials if t.status == TrialStatus.OK)
    return RunOutcome(run_id=run_id, trials_ok=ok, trials_failed=len(stored.trials) - ok,
                      measured_seconds=0.0, wall_seconds=time.monotonic() - t0,
                      nodes_failed=sum(n.status in (QueueStatus.DROPPED, QueueStatus.FAILED) for n in stored.nodes))


def _drive(suite: Suite, nodes: Sequence[Node], store: Store, run_id: int, run_uuid: str,
           run_seed: int, *, shares: Mapping[str, Expansion],
           planned: Mapping[str, list[TrialKey]], estimates: Mapping[str, float],
           db: str | None, keep: bool, accel: str | None, retry_failed: bool,
           progress: ClusterProgress, plan: StoredPlan | None = None,
           pilot: ClusterPilot | None = None) -> bool:
    """Start every node's share, follow their progress until all ended, and account for each
    (its share copied in, or its missing trials failed with the reason); True when a failed
    node stopped them all (``on_node_failure = "stop"``)."""
    stored = store.load_run(run_id)
    done_nodes = {n.name for n in stored.nodes if n.status == QueueStatus.DONE}
    events: queue.Queue[tuple[_Node, dict[str, Any] | None]] = queue.Queue()
    sessions = [_Node(n, shares[n.label], planned[n.label]) for n in nodes
                if n.label not in done_nodes]
    have = {TrialKey.of(t) for t in stored.trials
            if t.status == TrialStatus.OK or not retry_failed}
    left = {s.name: sum(1 for key in planned[s.name] if key not in have) for s in sessions}
    progress.start({s.name: (left[s.name], estimates[s.name] * left[s.name]
                             / max(len(planned[s.name]), 1)) for s in sessions})
    try:
        for s in sessions:
            request = NodeRequest(suite_text=suite.source_text, suite_spec=RunSpec.of(suite),
                                  suite_source=suite.source_path,
                                  trusted=suite.author.trusted, node=s.name, run_uuid=run_uuid, seed=run_seed, db=db,
                                  accel=accel, keep=keep, retry_failed=retry_failed,
                                  plan=plan)
            _start(s, request, events)
            store.set_node(run_id, s.name, QueueStatus.RUNNING)
        running = len(sessions)
        stopped = False
        while running:
            s, event = events.get()
            if event is not None:
                if pilot is not None and event.get("event") == "pilot":
                    if dropped := pilot.received(s.name, event):
                        progress.note(f"{s.name}: {dropped} pilot trials not its own dropped")
                else:
                    _follow(s, event, progress)
                if pilot is not None:
                    plan_every_node(pilot, sessions, progress.note)
                continue
            running -= 1
            s.ended = True
            if pilot is not None:       # the others' pilots may be all in now
                plan_every_node(pilot, sessions, progress.note)
            # with "stop", a failed node's trials stay unmeasured, for --resume to measure
            failed = _ended(s, store, run_id, progress, planned[s.name]
                            if suite.method.on_node_failure == "continue" else [])
            if failed and suite.method.on_node_failure == "stop" and not stopped:
                stopped = True
                progress.note(f"node {s.name} {failed}: stopping every node "
                              "([method] on_node_failure = \"stop\")")
                for other in sessions:
                    _hang_up(other)
        return stopped
    except BaseException:
        for s in sessions:
            _hang_up(s)
        for s in sessions:
            _reap(s)
        raise


def _start(s: _Node, request: NodeRequest,
           events: "queue.Queue[tuple[_Node, dict[str, Any] | None]]") -> None:
    """Start a node's ``iomatrix node run`` over SSH with ``request`` on its stdin; its
    progress events go to ``events``, then (s, None) once its session has ended."""
    argv = ssh_argv(s.node, [s.node.command, "node", "run"])
    s.shared = request.db is not None
    s.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, start_new_session=True)
    assert s.proc.stdin is not None and s.proc.stdout is not None and s.proc.stderr is not None
    s.proc.stdin.write((request.model_dump_json() + "\n").encode())
    s.proc.stdin.flush()                       # and kept open: its end stops the node

    def read_events(stream: IO[bytes]) -> None:
        for raw in stream:
            try:
                event = json.loads(raw)
            except ValueError:
                continue
            if isinstance(event, dict):
                events.put((s, event))
        s.proc.wait()                          # type: ignore[union-attr]
        for t in s.threads[1:]:
            t.join()
        events.put((s, None))

    def read_errors(stream: IO[bytes]) -> None:
        for raw in stream:
            s.stderr.append(raw.decode(errors="replace").rstrip())
            del s.stderr[:-20]

    s.threads = [threading.Thread(target=read_events, args=(s.proc.stdout,), daemon=True),
                 threading.Thread(target=read_errors, args=(s.proc.stderr,), daemon=True)]
    for t in reversed(s.threads):
        t.start()


def _follow(s: _Node, event: dict[str, Any], progress: ClusterProgress) -> None:
    """A node's progress event (``JsonProgress``), told as the node's (its count grows,
    "more", after its pilot)."""
    kind = event.get("event")
    if kind == "done":
        s.finished = True
        return
    try:                    # the event read here; told below, where no error of it is caught
        if kind in ("start", "more"):       # "more": the rounds after its pilot
            s.told = int(event["trials"]) + (s.told if kind == "more" else 0)
            tell = partial(progress.node_started, s.name, s.told, float(event["seconds"]))
        elif kind == "trial_started":
            tell = partial(progress.trial_started, s.name, s.configs[event["config"]],
                           s.workloads[event["workload"]], int(event["sample"]))
        elif kind == "trial_finished":
            tell = partial(progress.trial_finished, s.name, bool(event["ok"]),
                           str(event.get("detail", "")))
        elif kind == "note":
            tell = partial(progress.note, f"{s.name}: {event.get('text', '')}")
        else:
            return
    except (KeyError, TypeError, ValueError):
        return              # not an event of this run's: nothing to tell
    tell()


def _ended(s: _Node, store: Store, run_id: int, progress: ClusterProgress,
           planned: list[TrialKey]) -> str | None:
    """Account for a node whose session ended; what went wrong with it ("dropped: ...",
    "failed: ..."), or None."""
    assert s.proc is not None
    code = s.proc.returncode
    said = next((line for line in reversed(s.stderr) if line.strip()), "")
    if code in (0, 6) and s.finished:
        try:
            _collect(s, store, run_id)
        except IomatrixError as exc:
            return _fail_rest(s, store, run_id, progress, planned, QueueStatus.FAILED,
                              f"its share could not be copied: {exc}")
        store.set_node(run_id, s.name, QueueStatus.DONE)
        _tell_ended(s, store, run_id, progress, QueueStatus.DONE, None)
        return None
    if code == 130 and s.hung_up:           # stopped by the controller: resumable as it is
        try:
            _collect(s, store, run_id, forget=False)
        except IomatrixError as exc:
            progress.note(f"{s.name}: what it measured stays on the node: {exc}")
        store.set_node(run_id, s.name, QueueStatus.PENDING, "stopped with the run")
        _tell_ended(s, store, run_id, progress, "stopped", None)
        return None
    if code == 255:
        return _fail_rest(s, store, run_id, progress, planned, QueueStatus.DROPPED,
                          f"SSH lost node {s.name}: {said or 'the connection ended'}")
    # it failed, yet what it measured before (its share holds each trial once stored) is kept
    try:
        _collect(s, store, run_id)
    except RunNotFound:
        pass                                # it had measured nothing yet
    except IomatrixError as exc:
        progress.note(f"{s.name}: what it measured could not be copied: {exc}")
    return _fail_rest(s, store, run_id, progress, planned, QueueStatus.FAILED,
                      f"iomatrix on node {s.name} ended with exit status {code}: "
                      f"{said or 'no message'}")


def _collect(s: _Node, store: Store, run_id: int, *, forget: bool = True) -> None:
    """A node's share into the run: nothing to do when the node wrote into the shared store;
    else its store fetched over SSH, copied in (trials only), then removed from the node
    (unless not to ``forget`` it: a stopped share, which the node resumes)."""
    if s.shared:
        return
    node = s.node
    key = json.dumps({"run_uuid": store.run_uuid(run_id), "node": s.name})
    done = _session(node, [node.command, "node", "export"], key + "\n", timeout=600)
    if done.returncode == 7:        # iomatrix's exit status for "no such run": no share here
        raise RunNotFound(_failure(node, done, "iomatrix node export"))
    if done.returncode != 0:
        raise NodesError(_failure(node, done, "iomatrix node export"))
    with tempfile.TemporaryDirectory(prefix="iomatrix-share-") as tmp:
        path = Path(tmp) / "share.db"
        path.write_bytes(done.stdout)
        with Store(path, readonly=True) as share:
            source = share.run_by_uuid(store.run_uuid(run_id))
            if source is None:
                raise NodesError(f"node {s.name}: its share holds no run {store.run_uuid(run_id)}")
            store.copy_run(share, source, share=True)
    if forget:
        _session(node, [node.command, "node", "forget"], key + "\n", timeout=60)


def _fail_rest(s: _Node, store: Store, run_id: int, progress: ClusterProgress,
               planned: list[TrialKey], status: str, reason: str) -> str:
    """The ``planned`` trials of a node that the run lacks, stored as failed with ``reason``;
    the node marked ``status`` with it."""
    have = {TrialKey.of(t) for t in store.load_run(run_id).trials}
    started = now()
    for key in planned:
        if key not in have:
            store.record_trial(run_id, TrialResult(
                config_key=key.config_key, workload_key=key.workload_key,
                sample_index=key.sample_index, status=TrialStatus.FAILED,
                reason=reason, started_at=started))
    store.set_node(run_id, s.name, status, reason)
    _tell_ended(s, store, run_id, progress, status, reason)
    return f"{status}: {reason}"


def _tell_ended(s: _Node, store: Store, run_id: int, progress: ClusterProgress, status: str,
                reason: str | None) -> None:
    """``progress.node_ended``, with the node's trials in the run as they are now."""
    stored = {TrialKey.of(t): t.status for t in store.load_run(run_id).trials}
    statuses = [stored.get(key) for key in s.planned]
    progress.node_ended(s.name, status, reason, ok=statuses.count(TrialStatus.OK),
                        failed=statuses.count(TrialStatus.FAILED), left=statuses.count(None))


def _hang_up(s: _Node) -> None:
    """End a node's session's stdin: its iomatrix stops and cleans up (``watch_stdin``)."""
    if s.proc is not None and s.proc.stdin is not None:
        s.hung_up = True
        with contextlib.suppress(OSError, ValueError):
            s.proc.stdin.close()


def _reap(s: _Node) -> None:
    """Wait for a hung-up session to end (the node cleaning up), then stop SSH if it has not."""
    if s.proc is None:
        return
    try:
        s.proc.wait(timeout=STOP_GRACE)
    except subprocess.TimeoutExpired:
        s.proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            s.proc.wait(timeout=10)
        if s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait()
