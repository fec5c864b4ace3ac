"""The suite as iomatrix understands it, after validation: frozen models, no loose dicts.
The pydantic schema here (``Suite``, with its tables from ``target``, ``matrix``, ``workloads``,
``method``, ``scale``, ``findings`` and ``nodes`` beside it) is what ``load`` validates a TOML
file against."""

from __future__ import annotations

import os
from typing import Any

from pydantic import Field, JsonValue, field_validator, model_validator

from iomatrix.core.model import Frozen
from iomatrix.core.trust import ANYONE, Author
from iomatrix.core.wire import TomlTable
from iomatrix.suite.fields import APPLIANCE, SCALE_NAME, Printable
from iomatrix.suite.fiooptions import FioVarName, FioVarValue
from iomatrix.suite.findings import Finding
from iomatrix.suite.matrix import Matrix, Part
from iomatrix.suite.method import Method, OwnGuest
from iomatrix.suite.target import NETWORK_KINDS
from iomatrix.suite.nodes import Nodes
from iomatrix.suite.scale import ScaleInfo
from iomatrix.suite.target import NamedTarget, Target
from iomatrix.suite.workloads import WorkloadGroup
from iomatrix.vocab.words import Mode


class SuiteInfo(Frozen):
    name: str = Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    """The suite's name: letters, digits, ``.``, ``_`` and ``-`` (stored with every run;
    ``iomatrix runs --suite`` finds its runs by it)."""
    description: Printable = Field(default="", max_length=10_000)
    """What the suite measures, in a sentence or two (``iomatrix suites`` shows it)."""
    scale: str | None = Field(default=None, max_length=40, pattern=SCALE_NAME)
    """The scale these tables were resolved at: written by iomatrix into the suite text it
    stores for a run started with ``--scale`` (that text has no [scale.NAME] tables left)."""


def method_of_vm(method: TomlTable, matrix: Any) -> TomlTable:
    """A [method] table (raw, as written) as a suite made from a VM runs it: platform follows
    the VM's ([matrix] reference: proxmox for a PVE config, libvirt for a domain) unless the
    table sets it, and pve_version the VM's machine likewise."""
    reference = matrix.get("reference") if isinstance(matrix, dict) else None
    if not isinstance(reference, dict) or reference.get("platform") not in ("proxmox", "libvirt"):
        return method
    method = dict(method)
    method.setdefault("platform", reference["platform"])
    if method["platform"] == "proxmox" and reference.get("pve_version") is not None:
        method.setdefault("pve_version", reference["pve_version"])
    return method
def _twice(values: list[str]) -> str | None:
    """The first value that occurs more than once."""
    return next((v for v in values if values.count(v) > 1), None)



class Suite(Frozen):
    """A validated suite file."""

    suite: SuiteInfo
    target: Target
    matrix: Matrix = Matrix()
    workloads: tuple[WorkloadGroup, ...] = (WorkloadGroup(),)
    method: Method = Method()
    part: tuple[Part, ...] = ()
    """[[part]] tables: more modes measured in the same run (e.g. a few guest configurations
    beside a blocklayer sweep)."""
    finding: tuple[Finding, ...] = ()
    """[[finding]] tables: the study's conclusions as claims a run can check (``Finding``)."""
    targets: tuple[NamedTarget, ...] = ()
    """[[targets]] tables: several targets measured in one run (``named_targets``)."""
    guest: OwnGuest | None = None
    """[guest]: the user's own image as the guest (``OwnGuest``)."""
    nodes: Nodes | None = None
    """[nodes]: the cluster nodes that each run the suite (``Nodes``); None: this host only."""

    @model_validator(mode="before")
    @classmethod
    def _shared_target(cls, data: Any) -> Any:
        """With [[targets]], [target] holds what they share (size, working_set, allow_tmpfs):
        each table takes the keys it does not give from there, and ``target`` becomes the first
        of them (the run's primary target: its host metadata, the target its notes name)."""
        if not isinstance(data, dict) or not data.get("targets"):
            return data
        shared, tables = data.get("target", {}), data["targets"]
        if not isinstance(shared, dict) or not isinstance(tables, list):
            return data                 # pydantic says what is wrong with them
        for key in ("directory", "device", "allow_destroy", "filesystems", *NETWORK_KINDS,
                    "storage"):
            if key in shared:
                raise ValueError(f"[target] {key}: with [[targets]], each target names its own "
                                 "directory or device; [target] holds only what they share "
                                 "(size, working_set, allow_tmpfs)")
        tables = [{**shared, **t} if isinstance(t, dict) else t for t in tables]
        first = tables[0] if isinstance(tables[0], dict) else {}
        primary = {k: v for k, v in first.items() if k in Target.model_fields}
        return {**data, "target": primary, "targets": tables}

    @field_validator("targets")
    @classmethod
    def _unique_names(cls, value: tuple[NamedTarget, ...]) -> tuple[NamedTarget, ...]:
        twice = _twice([t.name for t in value])
        if twice is not None:
            raise ValueError(f"two targets are called {twice!r}")
        if _twice([os.path.realpath(t.device) for t in value if t.device is not None]):
            raise ValueError("two targets name the same device")
        return value

    @property
    def named_targets(self) -> tuple[NamedTarget, ...]:
        """The targets of a run that measures several, each configuration on each: the
        [[targets]] tables, or one per [target] filesystems entry (named after it); empty for
        a run of one target (its configurations then name none)."""
        if self.targets:
            return self.targets
        shared = self.target.model_dump(exclude={"filesystems"})
        return tuple(NamedTarget(**shared, name=fs, filesystem=fs)
                     for fs in self.target.filesystems)

    @model_validator(mode="before")
    @classmethod
    def _platform_of_vm(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not isinstance(data.get("method", {}), dict):
            return data
        return {**data, "method": method_of_vm(data.get("method", {}), data.get("matrix"))}

    @model_validator(mode="after")
    def _vm_needs_qemu(self) -> "Suite":
        if self.matrix.from_vm is not None and self.method.mode == Mode.HOST:
            raise ValueError("[matrix] from_vm: host mode measures no QEMU settings; set [method] "
                             "mode to blocklayer or guest to measure the VM's disk")
        return self

    @model_validator(mode="after")
    def _node_count_needs_cluster_load(self) -> "Suite":
        if not self.method.concurrent_nodes and any(
                m.node_count is not None for m in (self.matrix, *self.part)):
            raise ValueError("[matrix] node_count is how many nodes load the target at once: it "
                             "needs [method] concurrent_nodes = true")
        return self

    @model_validator(mode="after")
    def _guests_named(self) -> "Suite":
        own = None if self.guest is None else self.guest.label
        if own is not None and self.method.libvirt_uri is not None:
            raise ValueError("[guest] image: its guests run under iomatrix's own QEMU; drop "
                             "[method] libvirt_uri (libvirt's block graph is kept without it)")
        for value in self.matrix.guest or ():
            if value not in (APPLIANCE, own):
                raise ValueError(f"[matrix] guest: {value!r} is neither {APPLIANCE!r} nor the "
                                 "[guest] image's name" + (f" ({own!r})" if own else
                                                           " (there is no [guest] table)"))
        return self

    @field_validator("finding")
    @classmethod
    def _unique_ids(cls, value: tuple[Finding, ...]) -> tuple[Finding, ...]:
        twice = _twice([f.id for f in value])
        if twice is not None:
            raise ValueError(f"two findings have the id {twice!r}")
        return value
    scales: tuple[ScaleInfo, ...] = ()
    """The [scale.NAME] tables of the suite file (set by ``load``), whichever scale this is."""
    jobfiles: dict[str, str] = {}
    """The [jobfiles] table: job file name → its text, as the suite carried it or ``load`` read
    it (iomatrix.suite.jobfiles); stored with the run's suite text."""
    fio_vars: dict[FioVarName, FioVarValue] = {}
    """The [fio_vars] table: the values of the ``${NAME}`` a job file names (``SIZE = "4k"``).
    iomatrix writes each into the job file's line itself before reading it, so fio never expands
    a variable from root's environment; a ``${NAME}`` the table lacks is refused. Names: letters,
    digits and _; values: letters, digits and _ . % , : / - (no blanks, '$', '=', ';',
    '#'), 1 to 200 of them."""
    source_text: str = ""
    """The suite's text as its file (or the store) gave it, never edited: what a run stores
    beside its spec (``iomatrix.suite.spec``)."""
    source_path: str = ""
    tables: dict[str, JsonValue] = Field(default={}, exclude=True, repr=False)
    """The tables this suite was validated from (set by ``load``): the file's, a scale applied,
    its job files carried ([jobfiles]) and whatever ``measure.prepare`` resolved; what a run
    stores as its spec (``iomatrix.suite.spec.RunSpec``)."""
    author: Author = Field(default=Author(ANYONE, "a suite of unknown origin"), exclude=True)
    """Who could have written the suite (``iomatrix.core.trust.author_of`` of its file, set by
    ``load``): files it names that reach a guest must be readable by them already. A suite made
    from text counts as anyone's until its loader says whose (``load.with_author``)."""

    def destroy_refused(self) -> str | None:
        """Why this suite may not destroy the device or LUN it names (``allow_destroy``): only
        a suite nobody but root or the invoking user could have written may; None when it may
        or names none."""
        if self.author.trusted:
            return None
        for target in (self.target, *self.targets):
            named = target.destroyed
            if target.allow_destroy and named is not None:
                return (f"[target] allow_destroy: {named} would be overwritten as asked by "
                        f"{self.author.where or 'a suite of unknown origin'}, which another "
                        "user could have written")
        return None

    @property
    def name(self) -> str:
        return self.suite.name

    @property
    def scale(self) -> str | None:
        """The scale this suite was resolved at; None for the suite's own tables."""
        return self.suite.scale
