"""A run prepared once, before anything is created or started: the user's VM read ([matrix]
from_vm), the targets as this host provides them, the configurations × workloads, the order of
the trials and the notes. ``iomatrix run --plan`` prints a ``PreparedRun``; ``run_suite``
measures one (``under`` the accelerator its guests get, once the driver has found it).

The seed of the trial order has one rule: ``--seed`` (``prepare(seed=)``), else the suite's
[method] seed, else one drawn here; the run stores it, and a resumed run keeps it
(``resumed``). ``--plan`` prints the seed its order comes from, so that ``run --seed N``
measures in the very order the plan showed; a run given no seed draws its own, on purpose: each
run shuffles anew, and what one order does to the figures is not repeated in the next run.

This module is the one place a suite changes on its way to a run: ``for_command_line`` (a
Proxmox VE storage id, ``--target``), and ``prepare`` (the user's VM, the Proxmox VE host);
``PreparedRun.chosen`` applies the pilot's choice. Each change is made in the suite's tables and
validated again as a whole (``suite.load.with_tables``), never in its text; the tables are the
spec the run stores (``PreparedRun.spec``)."""

from __future__ import annotations

import secrets
from pathlib import Path

from pydantic import BaseModel

from iomatrix.core.errors import SuiteError
from iomatrix.core.mounts import is_mounted
from iomatrix.core.text import printable
from iomatrix.core.trust import Author
from iomatrix.core.model import Frozen
from iomatrix.fio.ioping import IopingTool, find_ioping, tool_note
from iomatrix.translate.fromvm import resolve_vm
from iomatrix.measure.pvehost import PveHost, on_host
from iomatrix.platform.proxmox import parse_storage_cfg
from iomatrix.qemu.version import installed as qemu_version
from iomatrix.store.location import location_author, parse_location
from iomatrix.store.records import StoredRun
from iomatrix.store.rows import PlanChoice
from iomatrix.suite.expand import Expansion, expand
from iomatrix.suite.load import with_author, with_tables
from iomatrix.suite.model import Suite
from iomatrix.suite.plan import Block, plan
from iomatrix.suite.target import KIND_KEYS
from iomatrix.suite.spec import RunSpec
from iomatrix.targets.network import resolve_storage
from iomatrix.targets.targets import TargetPlan, plan_targets
from iomatrix.vocab.words import RunStatus, TrialStatus

class PreparedRun(Frozen):
    """A suite as it will be measured, decided before anything runs."""

    suite: Suite
    """The suite, its VM's disk read (``translate.fromvm``)."""
    targets: tuple[TargetPlan, ...]
    """Each target of a run that measures several, as this host provides it (a filesystem it
    cannot make: skipped, or refused when [[targets]] named it); empty for a run of one."""
    full: Expansion
    """The configurations × workloads on the targets this host provides, whatever the guests
    run under."""
    accelerator: str
    """What the guests run under: as asked (auto, kvm or tcg: ``--accel``, else [method]
    accel) until the run knows (``under``): kvm, tcg, or none for a run without guests."""
    expansion: Expansion
    """``full`` as it runs under ``accelerator`` (under TCG, [[part]] under_tcg applies)."""
    seed: int
    """The trial order's seed (the module's rule)."""
    drawn: bool = False
    """The seed was drawn by ``prepare``: none was given."""
    ioping: IopingTool | None = None
    """The ioping that measures host-mode ioping workloads; None: fio's equivalent job does."""
    host_notes: tuple[str, ...] = ()
    """What the host chose for the suite: Proxmox's graph on a PVE host (``measure.pvehost``)."""

    @property
    def blocks(self) -> list[Block]:
        """The rounds' sessions in order (``suite.plan``): ``samples`` rounds, which a pilot
        (pilot, target_ci) replaces with the rounds it chose before they start."""
        return plan(self.expansion, self.suite.method.samples, self.seed)

    @property
    def notes(self) -> list[str]:
        """What the run notes beyond its expansion's notes: which tool measures its ioping
        workloads."""
        modes = {c.mode for c in self.expansion.configurations
                 if any(w.ioping for w in self.expansion.workloads_for(c))}
        return [tool_note(self.ioping, modes)] if modes else []

    @property
    def spec(self) -> RunSpec:
        """What the run stores of its suite, beside the suite's own text."""
        return RunSpec.of(self.suite)

    def chosen(self, choice: PlanChoice) -> "PreparedRun":
        """As the run goes on once its pilot chose ``choice`` (``analysis.trialplan``): its
        rounds, and its trial length unless the suite fixed it, replace the suite's. The spec
        the run stored stays the suite's: the choice is stored apart, as its trial plan, and a
        resumed run applies it again."""
        method = self.suite.method
        update: dict[str, object] = {"samples": choice.rounds, "target_ci": None, "pilot": False,
                                     "max_samples": max(choice.rounds, method.max_samples)}
        if not choice.fixed_runtime:
            update["runtime"] = choice.runtime
        suite = self.suite.model_copy(update={"method": method.model_copy(update=update)})
        return self.model_copy(update={"suite": suite})

    def under(self, accelerator: str) -> "PreparedRun":
        """As it runs once its guests' accelerator is known; the same seed."""
        return self.model_copy(update={"accelerator": accelerator,
                                       "expansion": self.full.for_accel(accelerator)})

    def on_node(self, node: str) -> "PreparedRun":
        """As ``node`` measures its share of a cluster run (``Expansion.on_node``)."""
        return self.model_copy(update={"full": self.full.on_node(node),
                                       "expansion": self.expansion.on_node(node)})

    def resumed(self, stored: StoredRun) -> "PreparedRun":
        """As the stored run it continues goes on (``under`` its accelerator first): with that
        run's seed and notes, and only its configurations and workloads (they are the
        authority); SuiteError if the suite no longer yields them all."""
        configs = {c.key for c in stored.configs}
        workloads = {w.key for w in stored.workloads}
        expansion = self.expansion
        have = {c.key for c in expansion.configurations} | {w.key for w in expansion.workloads}
        missing = sorted((configs | workloads) - have)
        if missing:
            raise SuiteError(f"run {stored.id} cannot be resumed here: its suite no longer yields "
                             f"{', '.join(missing[:3])}" + (" …" if len(missing) > 3 else ""))
        pairs = tuple((c.key, w.key) for c in expansion.configurations if c.key in configs
                      for w in expansion.workloads_for(c) if w.key in workloads)
        expansion = expansion.model_copy(update={
            "configurations": tuple(c for c in expansion.configurations if c.key in configs),
            "only": pairs, "notes": stored.notes})
        return self.model_copy(update={"seed": stored.seed or 0, "drawn": False,
                                       "expansion": expansion})


def prepare(suite: Suite, *, accel: str | None = None, seed: int | None = None,
            pve: PveHost | None = None) -> PreparedRun:
    """``suite`` prepared to run on this host; ``accel`` and ``seed`` override its [method]
    accel and seed; on ``pve`` (a Proxmox VE host) a suite that chooses no platform measures
    Proxmox's graph. Reads the VM file a suite names unless it is read (``Matrix.vm_unread``:
    ``for_command_line`` and a stored run have read it) and asks which targets this host can
    provide; creates nothing."""
    suite, host_notes = on_host(resolve_vm(suite) if suite.matrix.vm_unread else suite, pve)
    targets = plan_targets(suite)
    full = expand(suite, qemu=qemu_version()).without_targets({t.name: str(t.problem) for t in targets
                                          if t.problem is not None and not t.required})
    given = seed if seed is not None else suite.method.seed
    asked = accel or suite.method.accel
    ioping = find_ioping() if any(w.ioping for w in full.workloads) else None
    return PreparedRun(suite=suite, targets=targets, full=full, accelerator=asked,
                       expansion=full.for_accel(asked),
                       seed=secrets.randbelow(2**31) if given is None else given,
                       drawn=given is None, ioping=ioping, host_notes=host_notes)


def for_command_line(suite: Suite, *, storage_cfg: tuple[str, Path] | None = None,
                     target: Path | None = None) -> Suite:
    """``suite`` as the command line changes it: the VM its [matrix] from_vm names read
    (``resolve_vm``; ``prepare`` then finds it read, ``Matrix.vm_unread``), its [target] storage = "ID" resolved from
    ``storage_cfg`` (Proxmox VE's storage.cfg: its text and its directory, /etc/pve), then
    ``target`` (``--target``) as its one directory target; SuiteError for what cannot be."""
    suite = resolve_vm(suite)
    if storage_cfg is not None and suite.target.storage is not None:
        suite = _on_storage(suite, *storage_cfg)
    elif suite.target.storage is not None:
        raise SuiteError(f"{suite.source_path}: [target] storage = {suite.target.storage!r} "
                         "names a Proxmox VE storage",
                         hint="give --storage-cfg /etc/pve/storage.cfg")
    if target is None:
        return suite
    if suite.target.directory is None:
        raise SuiteError(f"{suite.source_path}: --target replaces a directory target, "
                         "but this suite names a device or network storage")
    if suite.targets:
        raise SuiteError(f"{suite.source_path}: --target replaces the directory of one "
                         f"target, but this suite names {len(suite.targets)} in [[targets]]",
                         hint="edit their directories in the suite file")
    # validated like the suite's own [target]: --target is as untrusted as the file
    return with_tables(suite, "target", {"directory": str(target)})


def _on_storage(suite: Suite, text: str, pve_dir: Path) -> Suite:
    """``suite`` with its [target] storage = "ID" as the [target] storage.cfg's ``text``
    says (``targets.network.resolve_storage``)."""
    try:
        resolved = resolve_storage(suite.target, parse_storage_cfg(text), pve_dir,
                                   mounted=is_mounted)
    except ValueError as exc:
        raise SuiteError(f"{suite.source_path}: [target] storage: {exc}") from None
    given = suite.tables.get("target")
    replaced = set(KIND_KEYS)
    table = {k: v for k, v in (given if isinstance(given, dict) else {}).items()
             if k not in replaced}
    for key in replaced - {"storage"}:
        value = getattr(resolved, key)
        if isinstance(value, BaseModel):
            table[key] = value.model_dump(mode="json", exclude_defaults=True)
        elif value is not None:
            table[key] = str(value)
    return with_tables(suite, "target", table, replace=True)


def resumed_author(stored: StoredRun, db: str) -> Author:
    """Who could have written the suite of the run ``stored`` that --resume measures again:
    the weaker of who could have when the run was made and who could have written the results
    database ``db`` since (``StoredSuite.written_by``; a run made before that was recorded, by
    the database's alone)."""
    return stored.suite.written_by(location_author(parse_location(db)), f"the suite of run "
                                   f"{stored.id} ({printable(stored.suite.source)[:200]})")


def resumed_suite(stored: StoredRun, db: str) -> Suite:
    """The suite ``--resume`` measures again: the stored run's spec, loaded once by the store
    (``StoredSuite``), as written by ``resumed_author``; SuiteError when it cannot run."""
    return with_author(stored.suite.runnable(), resumed_author(stored, db))


def nothing_to_resume(stored: StoredRun, *, retry_failed: bool) -> str | None:
    """Why ``--resume`` (``retry_failed``: with --retry-failed) has nothing to do for
    ``stored``, a success; None when it has."""
    failed = sum(1 for t in stored.trials if t.status == TrialStatus.FAILED)
    if stored.status == RunStatus.COMPLETE and not retry_failed:
        return f"run {stored.id} is complete: nothing to do" + (
            f" ({failed} of its trials failed: `iomatrix run --resume {stored.id} "
            "--retry-failed` measures them again)" if failed else "")
    if stored.status == RunStatus.COMPLETE and not failed:
        return (f"run {stored.id} is complete and none of its trials failed: nothing "
                "to retry")
    return None
