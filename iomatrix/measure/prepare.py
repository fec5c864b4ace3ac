"""A run prepared once, before anything is created or started: the user's VM read ([matrix]
from_vm), the targets as this host provides them, the configurations × workloads, the order of
the trials and the notes. ``iomatrix run --plan`` prints a ``PreparedRun``; ``run_suite``
measures one (``under`` the accelerator its guests get, once the driver has found it).

The seed of the trial order has one rule: ``--seed`` (``prepare(seed=)``), else the suite's
[method] seed, else one drawn here; the run stores it, and a resumed run keeps it
(``resumed``). ``--plan`` prints the seed its order comes from, so that ``run --seed N``
measures in the very order the plan showed; a run given no seed draws its own, on purpose: each
run shuffles anew, and what one order does to the figures is not repeated in the next run."""

from __future__ import annotations

import secrets

from iomatrix.core.errors import SuiteError
from iomatrix.core.model import Frozen
from iomatrix.fio.ioping import IopingTool, find_ioping, tool_note
from iomatrix.translate.fromvm import resolve_vm
from iomatrix.measure.pvehost import PveHost, on_host
from iomatrix.qemu.version import installed as qemu_version
from iomatrix.store.records import StoredRun
from iomatrix.suite.expand import Expansion, expand
from iomatrix.suite.model import Suite
from iomatrix.suite.plan import Block, plan
from iomatrix.targets.targets import TargetPlan, plan_targets

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
    Proxmox's graph. Reads the VM file a suite names and asks which targets this host can
    provide; creates nothing."""
    suite, host_notes = on_host(resolve_vm(suite), pve)
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
