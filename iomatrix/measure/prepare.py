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
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel

from iomatrix.core import cpuset
from iomatrix.core.errors import SuiteError
from iomatrix.core.mounts import is_mounted
from iomatrix.core.text import printable
from iomatrix.core.trust import Author
from iomatrix.core.model import Frozen
from iomatrix.fio.ioping import IopingTool, find_ioping, tool_note
from iomatrix.translate.fromvm import resolve_vm
from iomatrix.measure import pvestorage
from iomatrix.measure.pvehost import PveHost, on_host
from iomatrix.platform import proxmox as pve
from iomatrix.platform.proxmox import parse_storage_cfg
from iomatrix.appliance.probe import QEMU_BINARY
from iomatrix.qemu import version as qemu_version_of
from iomatrix.qemu.version import installed as qemu_version
from iomatrix.store.location import location_author, parse_location
from iomatrix.store.records import StoredRun
from iomatrix.store.rows import PlanChoice
from iomatrix.suite.expand import Expansion, expand
from iomatrix.suite.load import with_author, with_tables
from iomatrix.suite.model import Suite
from iomatrix.suite.plan import Block, plan
from iomatrix.suite.target import KIND_KEYS, StorageOrigin, Target
from iomatrix.suite.spec import RunSpec
from iomatrix.targets.network import resolve_storage
from iomatrix.telemetry.irq import target_device
from iomatrix.vocab.axes import AFFINITY_AXES
from iomatrix.targets.registry import kind_of
from iomatrix.targets.targets import TargetPlan, plan_targets
from iomatrix.vocab.words import Mode, RunStatus, TrialStatus

MAX_CHOSEN = 2000
"""The note of a storage chosen is kept to this many characters (``StorageOrigin.chosen``)."""


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
    """What the host chose for the suite: the storage measured (``measure.pvestorage``) and
    Proxmox's graph on a PVE host (``measure.pvehost``)."""

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
    origin = suite.target.from_storage
    if origin is not None and origin.chosen:    # which storage, and why (``for_command_line``)
        host_notes = (origin.chosen, *host_notes)
    targets = plan_targets(suite)
    full = expand(suite, qemu=qemu_version()).without_targets({t.name: str(t.problem) for t in targets
                                          if t.problem is not None and not t.required})
    full = full.without_configurations(_beyond_this_qemu(suite, full))
    given = seed if seed is not None else suite.method.seed
    asked = accel or suite.method.accel
    ioping = find_ioping() if any(w.ioping for w in full.workloads) else None
    host_notes = (*host_notes, *numa_notes(suite, full))
    return PreparedRun(suite=suite, targets=targets, full=full, accelerator=asked,
                       expansion=full.for_accel(asked),
                       seed=secrets.randbelow(2**31) if given is None else given,
                       drawn=given is None, ioping=ioping, host_notes=host_notes)


def _beyond_this_qemu(suite: Suite, expansion: Expansion) -> dict[str, str]:
    """Configuration key → why this host's QEMU cannot run it, for a suite that sets
    skip_invalid (in [matrix] or a part): several IOThreads per disk before the controller's
    iothread-vq-mapping (``qemu.version.mapping_refusal``). Such a suite measures the rest, each
    skipped configuration named in the notes; without skip_invalid the precheck refuses the
    run in one line."""
    if not any(m.skip_invalid for m in (suite.matrix, *suite.part)):
        return {}
    wanted = [c for c in expansion.configurations if c.mode == Mode.GUEST and c.iothreads]
    if not wanted:
        return {}
    found = qemu_version(QEMU_BINARY)
    refused = {c.key: qemu_version_of.mapping_refusal(str(c.controller), c.iothreads, found,
                                                      QEMU_BINARY) for c in wanted}
    return {key: f"{why}: not measured here" for key, why in refused.items() if why}


def numa_notes(suite: Suite, expansion: Expansion) -> tuple[str, ...]:
    """What "numa" means on this host for the suite's target, where a CPU set names it
    ([matrix] vcpu_affinity, iothread_affinity, main_affinity; [method] irq_affinity) and the
    target's device has no NUMA node: every online CPU (``core.cpuset.resolve``)."""
    named = suite.method.irq_affinity == cpuset.NUMA or any(
        getattr(c, axis) == cpuset.NUMA for c in expansion.configurations
        for axis in AFFINITY_AXES)
    if not named:
        return ()
    device = target_device(suite.target.directory or suite.target.device)
    _, note = cpuset.resolve(cpuset.NUMA, device)
    return (f"CPU affinity: {note}",) if note else ()


def for_command_line(suite: Suite, *, storage_cfg: tuple[str, Path] | None = None,
                     target: Path | None = None, storage: str | None = None,
                     pve_dir: Path | None = None,
                     note: Callable[[str], None] | None = None) -> Suite:
    """``suite`` as the command line changes it: the VM its [matrix] from_vm names read
    (``resolve_vm``; ``prepare`` then finds it read, ``Matrix.vm_unread``), its [target] storage = "ID" resolved from
    ``storage_cfg`` (Proxmox VE's storage.cfg: its text and its directory, /etc/pve), then
    ``target`` (``--target``) as its one directory target; SuiteError for what cannot be.
    Without ``storage_cfg``, a [target] storage = "ID" is the Proxmox VE host's (``pve_dir``).
    ``storage`` (``--storage ID``) replaces its one directory target by that storage of
    ``storage_cfg`` or of the Proxmox VE host's ``pve_dir``; without it, on a Proxmox VE host
    (``pve_dir``: ``pvestorage.host_dir``, given for a new run without --target) a built-in
    suite's directory is replaced by the storage where the host's VMs live
    (the first of ``pvestorage.ranked`` that resolves), or kept, and
    ``note`` told why."""
    suite = resolve_vm(suite)
    if storage is not None:
        suite = _named_storage(suite, storage, storage_cfg, pve_dir)
    elif storage_cfg is not None and suite.target.storage is not None:
        storages = parse_storage_cfg(storage_cfg[0])
        suite = _on_storage(suite, suite.target, storages, storage_cfg[1])
    elif suite.target.storage is not None and pve_dir is not None:   # the host's storage.cfg
        host = pvestorage.read_host(pve_dir)
        suite = _on_storage(suite, suite.target, host.storages, host.directory)
    elif suite.target.storage is not None:
        raise SuiteError(f"{suite.source_path}: [target] storage = {suite.target.storage!r} "
                         "names a Proxmox VE storage",
                         hint="give --storage-cfg /etc/pve/storage.cfg")
    elif pve_dir is not None and target is None and _builtin_directory(suite):
        suite = _where_vms_live(suite, pve_dir, note or (lambda said: None))
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


def _builtin_directory(suite: Suite) -> bool:
    """``suite`` is a built-in one measuring its own directory (the main job's choice replaces
    it; a built-in suite comparing filesystems there keeps it)."""
    return (suite.source_path.startswith("builtin:") and not suite.targets
            and suite.target.directory == pvestorage.BUILTIN_DIRECTORY
            and not suite.target.filesystems)


def _where_vms_live(suite: Suite, pve_dir: Path, note: Callable[[str], None]) -> Suite:
    """``suite`` on the storage where this Proxmox VE host's VMs live: the first of
    ``pvestorage.ranked`` that resolves; as it is when there is none (``note`` says why)."""
    try:
        host = pvestorage.read_host(pve_dir)
    except SuiteError as exc:
        note(f"{exc}: measuring {pvestorage.BUILTIN_DIRECTORY} (--storage ID names a storage)")
        return suite
    skipped: list[tuple[pve.Storage, str]] = []
    for storage in pvestorage.ranked(host):
        given = suite.target.model_copy(update={"directory": None, "storage": storage.id})
        try:
            resolved = resolve_storage(given, host.storages, pve_dir, mounted=is_mounted)
        except ValueError as exc:
            skipped.append((storage, str(exc)))
            continue
        return _resolved(suite, resolved, storage, pvestorage.chosen(host, storage, skipped),
                         hint="; --storage ID measures another")
    note(pvestorage.none_chosen(host, skipped))
    return suite


def _named_storage(suite: Suite, ident: str, storage_cfg: tuple[str, Path] | None,
                   pve_dir: Path | None) -> Suite:
    """``suite`` on the storage ``--storage ID`` names (``pvestorage.named``)."""
    if suite.target.directory is None or suite.targets:
        raise SuiteError(f"{suite.source_path}: --storage replaces a directory target, but "
                         f"this suite names " + (f"{len(suite.targets)} in [[targets]]"
                                                 if suite.targets else
                                                 f"a {suite.target.kind} target"))
    if storage_cfg is not None:
        host = pvestorage.read_host(storage_cfg[1], storage_cfg[0])
    elif pve_dir is not None:
        host = pvestorage.read_host(pve_dir)
    else:
        raise SuiteError(f"--storage {ident}: this is not a Proxmox VE host (no pveversion on "
                         f"the PATH, or no {pvestorage.PVE_DIR})",
                         hint="give --storage-cfg with a copy of its storage.cfg")
    why = pvestorage.named(host, ident)
    kind = host.storages[ident].type
    if suite.target.filesystems and kind not in pve.FILE_STORAGES:
        raise SuiteError(f"--storage {ident} ({kind}): this suite compares filesystems made in "
                         "a directory ([target] filesystems): name a dir, nfs or cifs storage")
    return _on_storage(suite, suite.target.model_copy(update={"directory": None,
                                                              "storage": ident}),
                       host.storages, host.directory, chosen=why)


def _on_storage(suite: Suite, given: Target, storages: dict[str, pve.Storage], pve_dir: Path,
                *, chosen: str = "") -> Suite:
    """``suite`` with ``given``, its [target] with storage = "ID", as the [target] the
    parsed storage.cfg ``storages`` says (``targets.network.resolve_storage``; ``chosen``
    says why it is measured)."""
    assert given.storage is not None
    try:
        resolved = resolve_storage(given, storages, pve_dir, mounted=is_mounted)
    except ValueError as exc:
        raise SuiteError(f"{suite.source_path}: [target] storage: {exc}") from None
    return _resolved(suite, resolved, storages[given.storage.partition(":")[0]], chosen,
                     given.storage)


def _resolved(suite: Suite, resolved: Target, storage: pve.Storage, chosen: str,
              ident: str | None = None, *, hint: str = "") -> Suite:
    """``suite`` with its [target] replaced by ``resolved``, which remembers ``storage``
    (``StorageOrigin``, as ``ident``: ``ID:lunN`` for a LUN) and ``chosen`` (followed by the
    formats left out, and ``hint``)."""
    formats, held = _formats_held(suite, resolved)
    origin = StorageOrigin(id=ident or storage.id, type=storage.type,
                           volume_chain=storage.volume_chain,
                           chosen=(chosen + held + hint if chosen else "")[:MAX_CHOSEN])
    written = suite.tables.get("target")
    table = {k: v for k, v in (written if isinstance(written, dict) else {}).items()
             if k not in (*KIND_KEYS, "from_storage")}
    for key in set(KIND_KEYS) - {"storage"}:
        value = getattr(resolved, key)
        if isinstance(value, BaseModel):
            table[key] = value.model_dump(mode="json", exclude_defaults=True)
        elif value is not None:
            table[key] = str(value)
    table["from_storage"] = origin.model_dump(mode="json", exclude_defaults=True)
    suite = with_tables(suite, "target", table, replace=True)
    return suite if formats is None else with_tables(suite, "matrix", {"format": formats})


def _formats_held(suite: Suite, resolved: Target) -> tuple[list[str] | None, str]:
    """A built-in suite's [matrix] formats on ``resolved`` without those its kind cannot make
    there (``TargetKind.format_problem``: an LV or a zvol holds raw, as Proxmox VE's VM disks
    there are), and the note's words saying so; (None, "") when it keeps them all, or is the
    user's own (their matrix is theirs: a format the storage cannot hold is refused as the run
    checks its target). SuiteError when none is left, or a [[part]] names one left out."""
    kind = kind_of(resolved)
    if kind is None or not suite.source_path.startswith("builtin:"):
        return None, ""
    dropped = {fmt: why for fmt in suite.matrix.format
               if (why := kind.format_problem(resolved, fmt)) is not None}
    if not dropped:
        return None, ""
    kept = [fmt for fmt in suite.matrix.format if fmt not in dropped]
    parts = [fmt for part in suite.part for fmt in part.format if fmt in dropped]
    if not kept or parts:
        fmt = (parts or list(dropped))[0]
        raise SuiteError(f"{suite.source_path}: {resolved.described}: format {fmt} cannot be "
                         f"measured there: {dropped[fmt]}",
                         hint="--storage names a file storage (dir, nfs, cifs) for it")
    why = next(iter(dropped.values())).split(";")[0]
    return kept, f"; format {', '.join(dropped)} left out ({why})"


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
