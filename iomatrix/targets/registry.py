"""Which kind of storage each [target] key names (``iomatrix.targets.kind``). The runner,
``reclaim`` and ``doctor`` ask here for every kind alike; a new kind is its module (a
``TargetKind`` and its ``OpenTarget``), its table in ``iomatrix.suite.targets`` and one line
below."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from iomatrix.core.trust import Author
from iomatrix.suite.target import Target
from iomatrix.targets.btrfs import BtrfsKind
from iomatrix.targets.iscsi import IscsiKind
from iomatrix.targets.kind import HostCheck, OpenTarget, Probe, Resource, TargetKind
from iomatrix.targets.lvm import LvmKind
from iomatrix.targets.pvesm import PvesmKind
from iomatrix.targets.rbd import RbdKind
from iomatrix.targets.targets import TargetPlan, TargetSet
from iomatrix.targets.workspace import LocalKind
from iomatrix.targets.zfs import ZfsKind

KINDS: dict[str, TargetKind] = {key: kind for kind in (
    LocalKind(),
    RbdKind(),
    IscsiKind(),
    LvmKind(),
    BtrfsKind(),
    PvesmKind(),
    ZfsKind(),
) for key in kind.keys}
"""[target] key → its kind. ``storage`` (a Proxmox VE storage id) is none: it is resolved into
one of these before a run (``iomatrix.targets.network.resolve_storage``)."""

RESOURCES: dict[str, Resource] = {kind.resource.kind: kind.resource
                                  for kind in KINDS.values() if kind.resource is not None}
"""Record kind → what a kind records making on its storage (``iomatrix.measure.reclaim``)."""


def kind_of(target: Target) -> TargetKind | None:
    """The kind ``target`` names; None for a storage id not resolved yet."""
    return KINDS.get(target.kind)


def open_target(target: Target, plans: Sequence[TargetPlan], *, keep: bool,
                author: Author) -> OpenTarget:
    """The run's target opened, nothing checked or made yet: its kind's ``OpenTarget``, or
    for a suite of several targets (``plans``: directories and devices) a ``TargetSet`` of
    those this host provides."""
    if plans:
        return TargetSet(plans, keep=keep)
    kind = kind_of(target)
    assert kind is not None, "a storage id is resolved before the run"
    return kind.open(target, keep=keep, author=author)


def check_author(targets: Iterable[Target], author: Author) -> None:
    """Each target's ``TargetKind.check_author``, in order."""
    for target in targets:
        if (kind := kind_of(target)) is not None:
            kind.check_author(target, author)


def tools(target: Target) -> tuple[str, ...]:
    """The programs a run on ``target`` needs besides fio and QEMU's."""
    kind = kind_of(target)
    return kind.tools if kind is not None else ()


def host_checks(probe: Probe) -> list[HostCheck]:
    """Every kind's lines in ``iomatrix doctor``, in the order of ``KINDS``."""
    return [check for kind in dict.fromkeys(KINDS.values()) for check in kind.host_checks(probe)]
