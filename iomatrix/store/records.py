"""Stored results as the rest of iomatrix reads them: a run, its configurations, workloads and
trials, each trial with its per-direction samples. Produced by ``iomatrix.store``; read by
analysis, show, export and report. A trial to be stored is a ``TrialResult``."""

from __future__ import annotations

import os
import tomllib
from enum import StrEnum
from typing import Any

from pydantic import (Field, SerializerFunctionWrapHandler, ValidationError, computed_field,
                      model_serializer, model_validator)

from iomatrix.core.errors import IomatrixError, SuiteError
from iomatrix.core.text import printable
from iomatrix.core.trust import ANYONE, Author
from iomatrix.core.wire import TomlTable
from iomatrix.fio.persecond import StallCheck
from iomatrix.fio.samples import DirectionSample
from iomatrix.suite.load import load_suite_text
from iomatrix.suite.configuration import ConfigKey
from iomatrix.suite.findings import Finding
from iomatrix.suite.method import Method
from iomatrix.suite.model import Suite, method_of_vm
from iomatrix.suite.spec import RunSpec
from iomatrix.core.model import Frozen
from iomatrix.fio.depth import DepthRecord
from iomatrix.telemetry.host import HostSeries
from iomatrix.telemetry.pagecache import DeviceShare
from iomatrix.telemetry.probe import CpuRecord
from iomatrix.telemetry.steady import SteadyState
from iomatrix.vocab.words import Accelerator, TrialStatus

__all__ = ["CpuRecord", "DepthRecord"]   # stored with its trial; what measures it defines it


class SteadyRecord(Frozen):
    """What a trial recorded about steady state: the SNIA PTS verdict and what it was judged
    from, or why it was not judged."""

    checked: bool
    source: str | None = None
    """What the rule was applied to: "fio status stream" or "QEMU device counters" (None for
    runs that did not record it)."""
    reason: str | None = None
    """Why steady state was not checked."""
    verdict: SteadyState | None = None

    @property
    def reached(self) -> bool:
        """Checked, and the rule was met."""
        return self.checked and self.verdict is not None and self.verdict.reached


class TrialResult(Frozen):
    """One trial as measured, or failed with its reason: what ``Store.record_trial`` stores."""

    config_key: str
    workload_key: str
    sample_index: int
    status: str
    started_at: str
    reason: str | None = None
    samples: tuple[DirectionSample, ...] = ()
    vm_samples: tuple[DirectionSample, ...] = ()
    wall_seconds: float | None = None
    fio_version: str | None = None
    """The version of what measured the trial, as it names itself: fio's, or ioping's for an
    ioping workload that ioping ran ("ioping 1.3")."""
    usr_cpu: float | None = None
    sys_cpu: float | None = None
    ctx: int | None = None
    fio_json: str | None = None
    """fio's own output, as it wrote it (ioping's, for a trial ioping ran)."""
    accelerator: str = "none"
    applied: dict[str, str] = {}
    command: str = ""
    steady: SteadyRecord | None = None
    cpu: CpuRecord | None = None
    telemetry: HostSeries | None = None
    stall: StallCheck | None = None
    depth: DepthRecord | None = None
    logs: dict[str, str] = {}
    """The latency, bandwidth and IOPS logs the workload asked for, by file name, as fio wrote
    them into the trial's own directory (``iomatrix.fio.logs``)."""


class TrialRecord(Frozen):
    """One trial as stored: ok with samples, or failed with its reason."""

    id: int
    """Its number in the store."""
    config_key: str
    """The configuration measured (a ``configs`` key)."""
    workload_key: str
    """The workload measured (a ``workloads`` key)."""
    sample_index: int
    """Which sample of its point, from 0: the round it was measured in."""
    status: str
    """ok (measured, with samples) or failed (with a reason)."""
    reason: str | None
    """Why it failed; None when ok."""
    started_at: str
    """When it started (UTC, ISO 8601)."""
    wall_seconds: float | None
    """How long it took, ramp and setup of the trial included."""
    accelerator: str
    """kvm or tcg for a guest trial (tcg: the figures measure QEMU's emulator), none for
    the others."""
    usr_cpu: float | None
    """fio's usr_cpu: the user CPU time of its job, in % of its runtime."""
    sys_cpu: float | None
    """fio's sys_cpu: the system CPU time of its job, in % of its runtime."""
    ctx: int | None
    """fio's ctx: the context switches of its job."""
    applied: dict[str, str]
    """What QEMU applied, as read back (QMP, /proc) and what the guest saw: setting →
    value (``iomatrix show RUN --command``)."""
    command: str
    """The command line that realized the configuration (QEMU, qemu-storage-daemon)."""
    steady: SteadyRecord | None = None
    """Whether and when the SNIA steady-state rule was met (None for failed trials and older
    runs)."""
    cpu: CpuRecord | None = None
    """CPU cost of the trial (None for failed trials, imported and older runs)."""
    stall: StallCheck | None = None
    """Whether it stalled: a second or more without a completion while fio kept I/O queued
    (``iomatrix.fio.persecond``); None for failed trials, imported and older runs."""
    depth: DepthRecord | None = None
    """The queue depth fio achieved beside the asked one, flagged when well short of it
    (``iomatrix.fio.depth``; None for failed trials, imported and older runs)."""
    logs: dict[str, str] = {}
    """fio's logs the workload asked for (``write_lat_log``...), by file name, kept with the run
    (``iomatrix.fio.logs``); empty where it asked for none."""
    tool: str | None = None
    """What measured it, as it names itself: "fio-3.33", or "ioping 1.3" for an ioping
    workload in host mode (stored in the trial's fio_version); None for a failed trial."""
    samples: tuple[DirectionSample, ...]
    """One per direction fio measured (read, write); empty for a failed trial."""
    vm_samples: tuple[DirectionSample, ...] = ()
    """Per-guest samples when several guests ran the trial; ``samples`` is then their aggregate."""
    device_share: DeviceShare | None = None
    """For an ok trial of a configuration that uses the host page cache: the share of fio's
    bytes that reached the target's device, derived from the stored host telemetry and samples
    when the run is loaded (``iomatrix.telemetry.pagecache``); None otherwise."""

    @property
    def stalled(self) -> bool:
        """Ok, and it stalled: left out of its point and of gains unless the run is loaded
        ``with_stalled`` (``iomatrix.analysis.stalls``)."""
        return self.status == TrialStatus.OK and self.stall is not None and self.stall.stalled


class ConfigRecord(Frozen):
    key: str
    """The configuration's identity: its mode and settings,
    ``blocklayer/aio=native/cache=none/...``."""
    label: str
    """The configuration for people: ``blocklayer native/none/raw``."""
    mode: str
    """host, blocklayer or guest (or imported)."""
    params: dict[str, str]
    """Each setting the configuration gives (axis → level), as the key names them."""

    @property
    def identity(self) -> ConfigKey:
        """Its key, typed: as stored, ``str(identity) == key``."""
        return ConfigKey(mode=self.mode, params=tuple(self.params.items()))


class WorkloadRecord(Frozen):
    key: str
    """The workload's identity: its fio settings."""
    label: str
    """The workload for people: ``4k randread QD32``."""
    rw: str
    """fio's rw: read, write, randread, randwrite, rw, randrw."""
    bs: int
    """Block size in bytes."""
    iodepth: int
    """Queue depth per job."""
    numjobs: int
    """fio jobs run at once."""
    rate_iops: int
    """IOPS cap per job; 0: unlimited."""
    options: dict[str, str]
    """Further fio options (``[[workloads]] options``, a job file's)."""


class RunSummary(Frozen):
    id: int
    suite_name: str
    created_at: str
    finished_at: str | None
    status: str
    accelerator: str
    trials_ok: int
    trials_failed: int
    hostname: str = ""
    target: str = ""
    """Where it measured: the target's directory or device, or its [[targets]] names."""
    nodes: tuple[str, ...] = ()
    """A cluster run's nodes, in their order (``hostname`` is then the controller's); empty
    for a run of one host."""


IMPORTED = "import:"
"""How the source of an imported run begins (``import:PATH``)."""
EXPORT_FORMAT_VERSION = 1
"""The version of what ``iomatrix export --format json`` writes (its ``format_version`` key):
raised when a key is renamed or removed or changes meaning; a key added leaves it as it is
(docs/reference/results.md)."""


class Part(StrEnum):
    """A part of a stored suite that loads, or does not (``LoadProblem``)."""

    SUITE = "suite"
    """The suite as a whole (what ``--resume`` measures)."""
    METHOD = "method"
    """Its [method] table, read on its own (what ``compare`` compares runs by)."""
    FINDINGS = "findings"
    """Its [[finding]] tables, read on its own (the claims ``findings`` checks)."""


class LoadProblem(Frozen):
    """What of a stored suite did not load, and why (``StoredSuite.problem``): the suite,
    always (else there is no problem); its method and its findings, each where it did not
    load either when read on its own (an imported or synthetic run's text, one an older
    iomatrix stored). Ask it with ``why``."""

    suite: str
    """The error loading the spec (or the text) gave."""
    method: str | None = None
    """Why the [method] table cannot be read; the defaults stand in for it."""
    findings: str | None = None
    """Why the [[finding]] tables cannot be read (the first error); there are then none."""

    def why(self, part: Part) -> str | None:
        """Why ``part`` did not load; None when it did."""
        return {Part.SUITE: self.suite, Part.METHOD: self.method,
                Part.FINDINGS: self.findings}[part]


class StoredSuite(Frozen):
    """The suite a run was made from, as the store keeps it: its name, where it came from, its
    TOML text byte for byte as the user wrote it, and its spec (``iomatrix.suite.spec``: the
    suite as the run measured it, resolved once); and what iomatrix reads from them, loaded
    once, when this is made (by the runner for a new run, by ``Store.load_run`` for a stored
    one), in this one place: the spec into its suite, through every check a suite file gets; a
    run stored before specs (schema 12) has its spec derived from its text, here. Construct one
    from ``name``, ``source``, ``text`` and ``spec``; the other fields are derived (a copy with
    another text must be constructed, not ``model_copy``-ed).

    Imported and synthetic runs store texts that are not runnable suites, and an older iomatrix
    may have stored one this one refuses: each part is then read on its own, empty (or the
    default) where it cannot be, and ``suite`` is None."""

    name: str
    source: str
    """Where it came from: a suite file (``PATH --scale NAME`` at a scale), ``builtin:NAME``,
    ``import:PATH`` for imported results (``IMPORTED``), or ``synthetic``."""
    text: str
    """The suite's TOML as the user wrote it (a run stored before schema 12: as that iomatrix
    kept it, its job files and the VM's disk appended)."""
    spec: RunSpec | None = None
    """The suite as the run measured it (``runs.spec_json``; derived from ``text`` for a run
    stored before it); None where there is none (``problem`` says why)."""
    suite: Suite | None = None
    """The suite ``spec`` loads into (what ``--resume`` measures); None where it does not load
    (``problem`` says why)."""
    problem: LoadProblem | None = None
    """What did not load, and why (``unloaded``): None when ``suite`` loaded, and with it
    every part."""
    description: str = ""
    written_method: TomlTable = {}
    """The [method] table as written: values as in the TOML, no defaults filled in; platform
    and pve_version as a suite made from a VM follows them (``suite.model.method_of_vm``)."""
    method: Method = Method()
    """The [method] table as this iomatrix reads it; the defaults where it cannot be read
    (``unloaded(Part.METHOD)`` says why)."""
    working_set: str = "size"
    """[target] working_set as written ("size" when the text does not say)."""
    findings: tuple[Finding, ...] = ()
    """The [[finding]] tables: the claims the run can check; empty where they cannot be read
    (``unloaded(Part.FINDINGS)`` says why)."""
    author: int | None = Field(default=None, ge=ANYONE)
    """Who could have written the suite when the run was made (schema 11, ``suite_author``):
    the uid of the user who ran it when nobody but root or that user could have, another user's
    uid, or ``ANYONE`` (-1); None for a run made before it was recorded. Read back by
    ``written_by``."""

    @model_validator(mode="before")
    @classmethod
    def _parsed(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not isinstance(data.get("text"), str):
            return data
        spec = data.get("spec")
        if spec is not None and not isinstance(spec, RunSpec):
            raise ValueError("spec: not a run spec")
        return {"name": data.get("name"), "source": data.get("source"), "text": data["text"],
                "author": data.get("author"),
                **_parse(data["text"], str(data.get("source")), spec)}

    @classmethod
    def of(cls, suite: Suite) -> "StoredSuite":
        """What a new run of ``suite`` (as prepared) stores: its text, its spec, and who could
        have written it."""
        return cls(name=suite.name, source=suite.source_path, text=suite.source_text,
                   spec=RunSpec.of(suite), author=author_uid(suite.author))

    @property
    def runs_again(self) -> str:
        """The suite as a file that runs again (``export --format suite``): the text as the
        user wrote it when the spec is what it says, else the spec written as TOML."""
        if self.spec is None or self.suite is None:
            return self.text
        try:
            same = tomllib.loads(self.text) == self.spec.tables
        except (tomllib.TOMLDecodeError, RecursionError, ValueError):
            same = False
        return self.text if same else self.spec.toml(self.source)

    def written_by(self, store: Author, where: str) -> Author:
        """Who could have written the suite, as a resumed run measures it: the weaker
        (``weaker``) of who could have when the run was made (``author``; an imported run's,
        anyone) and who could have written the store since (``store``, its author: the text
        is a row of it). ``where`` names the suite in refusals."""
        if self.imported:
            return Author(ANYONE, where)
        return suite_author(self.author, store, where)

    def unloaded(self, part: Part) -> str | None:
        """Why ``part`` of the suite did not load (``problem``); None when it did."""
        return None if self.problem is None else self.problem.why(part)

    @property
    def imported(self) -> bool:
        """Results ``iomatrix import`` read, not a run iomatrix measured."""
        return self.source.startswith(IMPORTED)

    @property
    def builtin(self) -> str | None:
        """The name of the built-in suite the run was of (at whatever scale); None for others."""
        if not self.source.startswith("builtin:"):
            return None
        return self.source.removeprefix("builtin:").split()[0]

    def runnable(self) -> Suite:
        """The suite, to be measured again (``--resume``); SuiteError when it cannot be: an
        imported run's text is no suite iomatrix ran (whatever it reads as), nor one that
        does not load."""
        if self.imported:
            raise SuiteError(f"{printable(self.source)[:200]}: imported results, not a suite "
                             "iomatrix can run")
        if self.suite is None:
            raise SuiteError(self.unloaded(Part.SUITE) or f"{self.source}: not a suite")
        return self.suite


def author_uid(author: Author) -> int:
    """``author`` as a run stores it (``StoredSuite.author``): a uid, or ``ANYONE``."""
    return os.geteuid() if author.uid is None else author.uid


def suite_author(recorded: object, store: Author, where: str) -> Author:
    """Who could have written a stored run's suite, for the user running iomatrix now: the
    weaker of ``recorded`` (``StoredSuite.author`` as stored: trusted when it is root or this
    user; None, a run made before it was recorded, adds nothing; a value that is no uid is
    anyone's) and ``store``, who could have written the store that holds it."""
    if recorded is None:
        return store
    if isinstance(recorded, int) and not isinstance(recorded, bool) and recorded >= ANYONE:
        return weaker(Author(None if recorded in (0, os.geteuid()) else recorded, where), store)
    return Author(ANYONE, where)


def weaker(first: Author, second: Author) -> Author:
    """Who could have written what both ``first`` and ``second`` had a hand in: one of them
    when the other is trusted, or they are the same user; else anyone."""
    if first.trusted:
        return second
    if second.trusted or first.uid == second.uid:
        return first
    return second if second.uid == ANYONE else Author(ANYONE, first.where)


def _parse(text: str, source: str, spec: RunSpec | None) -> dict[str, Any]:
    """A stored suite's parts (``StoredSuite``): its spec loaded into its suite, once (a run
    stored before specs: its text, and the spec derived from it), every part read from that
    suite; where it does not load, each part read on its own (``_parts``)."""
    try:
        suite = (spec.suite(text=text, source=source) if spec is not None
                 else load_suite_text(text, source=source))
        spec = spec or RunSpec.of(suite)
    except IomatrixError as exc:
        return _parts(text, source, spec, str(exc))
    method = suite.tables.get("method")
    return {"spec": spec, "suite": suite, "description": suite.suite.description,
            "written_method": method_of_vm(dict(method) if isinstance(method, dict) else {},
                                           suite.tables.get("matrix")),
            "method": suite.method, "working_set": suite.target.working_set,
            "findings": suite.finding}


def _parts(text: str, source: str, spec: RunSpec | None, problem: str) -> dict[str, Any]:
    """The parts of a stored suite that does not load (``problem`` says why: an imported or
    synthetic run's text, one an older iomatrix stored), each read on its own from the
    spec's tables or the text's, empty (or the default) where it cannot be."""
    try:
        tables = spec.tables if spec is not None else tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError, ValueError):
        return {"spec": spec, "suite": None,
                "problem": LoadProblem(suite=problem, method=problem)}

    def table(name: str) -> dict[str, Any]:
        value = tables.get(name, {})
        return dict(value) if isinstance(value, dict) else {}

    written = method_of_vm(table("method"), tables.get("matrix"))
    parts: dict[str, Any] = {"spec": spec, "suite": None, "written_method": written,
                             "description": str(table("suite").get("description", "")),
                             "working_set": str(table("target").get("working_set", "size"))}
    method = findings = None
    try:
        parts["method"] = Method.model_validate(written)
    except ValidationError as exc:
        method = f"{source}: [method]: {exc.errors()[0]['msg']}"
    found = tables.get("finding", [])
    try:
        parts["findings"] = tuple(Finding.model_validate(f) for f in found if isinstance(f, dict)
                                  ) if isinstance(found, list) else ()
    except ValidationError as exc:
        findings = exc.errors()[0]["msg"]
    parts["problem"] = LoadProblem(suite=problem, method=method, findings=findings)
    return parts


class NodeRecord(Frozen):
    """A node of a cluster run (schema 10): how SSH reached it, what it is, how its share went."""

    name: str
    """The node's name, as its configurations carry it (``node=NAME``)."""
    node: dict[str, Any]
    """Its ``iomatrix.cluster.ssh.Node`` fields."""
    host: dict[str, str]
    """Its host metadata, as its preflight gave it."""
    status: str
    """pending, running, done, failed (its iomatrix failed) or dropped (SSH lost it)."""
    reason: str | None = None


class StoredRun(Frozen):
    """A whole run as stored."""

    id: int
    """The run's number in this database (``iomatrix runs``)."""
    suite: StoredSuite = Field(exclude=True)
    created_at: str
    """When it started (UTC, ISO 8601)."""
    finished_at: str | None
    """When it ended; None while it runs."""
    status: str
    """running, complete, interrupted (``run --resume`` continues it) or failed."""
    accelerator: str
    """What its guests ran under: kvm, tcg (emulated), or none without guests."""
    iomatrix_version: str
    """The iomatrix that made it."""
    host: dict[str, str]
    """The host it measured on: hostname, kernel, OS, CPU, cores, memory, QEMU, fio, the
    target and its filesystem (a cluster run's: the controller's)."""
    notes: tuple[str, ...]
    """What the run said about itself: skipped combinations, ignored axes, targets made,
    the platform chosen, warnings."""
    seed: int | None = None
    """The seed its trial order was shuffled with (``run --seed``)."""
    configs: tuple[ConfigRecord, ...]
    """Its configurations."""
    workloads: tuple[WorkloadRecord, ...]
    """Its workloads."""
    trials: tuple[TrialRecord, ...]
    """Its trials, ok and failed."""
    nodes: tuple[NodeRecord, ...] = ()
    """The nodes of a cluster run, in the order given; empty for a run of one host."""
    with_stalled: bool = Field(default=False, exclude=True)
    """Whether its points keep their stalled trials in their figures (``--with-stalled``;
    ``iomatrix.analysis.stalls``); not stored."""

    @computed_field  # type: ignore[prop-decorator]
    @property
    def emulated(self) -> bool:
        """Whether any measured figure of the run came from guests under TCG."""
        return any(t.accelerator == Accelerator.TCG and t.samples for t in self.trials)

    @model_serializer(mode="wrap")
    def _exported(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """As ``export --format json`` writes a run: its format version first
        (``EXPORT_FORMAT_VERSION``), then its suite as suite_name, suite_source and suite_text,
        after its id."""
        data = handler(self)
        return {"format_version": EXPORT_FORMAT_VERSION, "id": data.pop("id"),
                "suite_name": self.suite.name,
                "suite_source": self.suite.source, "suite_text": self.suite.text, **data}


class ProcessRecord(Frozen):
    """An iomatrix process that measured (or measures) runs: who it was, precisely enough that
    a later process with the same pid is not taken for it (``iomatrix.core.owner``)."""

    id: int
    pid: int
    host: str
    boot_id: str
    start_ticks: int
    uid: int
    lock_path: str
    """The file it holds an exclusive flock on while it lives."""
    started_at: str
    ended_at: str | None = None
    lock_dev: int | None = None
    lock_ino: int | None = None
    """The lock file's device and inode, recorded once it was made (None before, or by an
    iomatrix older than schema 6): a file in its place with another inode is not its lock."""


class ResourceRecord(Frozen):
    """Something a process created or changed, recorded before it did: a scratch directory
    under $TMPDIR, an image directory in the target, a target directory (and its parents) that
    did not exist, what a target kind makes on its storage (an RBD image, an LVM volume), or an
    IRQ a run steered."""

    id: int
    kind: str
    """One of ``iomatrix.store.rows.KINDS``: scratch, workspace or parent (a directory), or a
    kind of ``rows.RESOURCES`` (``rbd-image``: each says how a killed run's is removed or put
    back)."""
    path: str
    within: str
    """The directory it was created in (resolved): it is removed only while still there; for
    a kind of ``rows.RESOURCES``, the connection it recorded (``rows.within``)."""
    keep: bool
    """Created by a run with --keep: never removed by iomatrix."""
    created_at: str
    run_id: int | None
    run_status: str | None
    process: ProcessRecord


class RetiredTrial(Frozen):
    """A failed trial measured again (``--retry-failed``, or a trial whose guests stopped:
    ``Session.stalled``), kept whole."""

    retired_at: str
    trial: TrialRecord


class PilotTrial(Frozen):
    """One trial of a run's pilot (``analysis.trialplan``), stored apart from its trials: which,
    how long it measured, what it got and what it cost."""

    mode: str
    config_key: str
    workload_key: str
    round: int
    runtime_s: float
    iops: float | None
    """None: the trial failed."""
    wall_s: float
    """Wall time of the whole trial (fio start, ramp, runtime, the runner's checks)."""
    session_s: float = 0.0
    """For a block's last trial: the block's time outside its trials (daemon or guests up and
    down), preconditioning excluded; 0 for the others."""
