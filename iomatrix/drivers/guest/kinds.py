"""Which kinds of guest there are (``iomatrix.drivers.guest.kind``), and the questions the
runner and a cluster's node ask of a suite's kinds. A new kind is one module and one line in
:data:`KINDS`."""

from __future__ import annotations

from collections.abc import Sequence

from iomatrix.core.errors import TrialFailed
from iomatrix.drivers.guest.appliance import ApplianceGuest
from iomatrix.drivers.guest.image import ImageGuest
from iomatrix.drivers.guest.kind import GuestKind
from iomatrix.drivers.guest.windows import WindowsGuest
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.model import Suite

DEFAULT_KIND = ApplianceGuest
"""The kind that boots the configurations that name no guest, and every configuration of a
guest driver given no suite's kinds (a cluster's node)."""
KINDS: tuple[type[GuestKind], ...] = (DEFAULT_KIND, WindowsGuest, ImageGuest)
"""Every guest kind, :data:`DEFAULT_KIND` first; of the others, the first whose ``from_suite``
takes a suite's [guest] table boots it (a more particular kind goes before a general one)."""


def suite_kinds(suite: Suite) -> list[GuestKind]:
    """The kinds of guest ``suite`` may boot: the default, and the first other kind of
    :data:`KINDS` that takes the suite's [guest] table (a suite has one at most)."""
    default, *others = KINDS
    taken = next((kind for cls in others if (kind := cls.from_suite(suite)) is not None), None)
    return [kind for kind in (default.from_suite(suite), taken) if kind is not None]


def check_kinds(suite: Suite) -> None:
    """UntrustedFile unless every file ``suite``'s guests hand QEMU passes the rules for input
    the suite's author wrote (``GuestKind.check``)."""
    for kind in suite_kinds(suite):
        kind.check(suite.author)


def opened_kinds(suite: Suite) -> list[GuestKind]:
    """``suite``'s kinds with what each reads opened once (after :func:`check_kinds`)."""
    kinds = suite_kinds(suite)
    for kind in kinds:
        kind.open()
    return kinds


def cluster_refusal(suite: Suite) -> str | None:
    """Why one of ``suite``'s kinds cannot boot on a cluster's nodes (None: each can)."""
    return next((k.cluster_refusal for k in suite_kinds(suite) if k.cluster_refusal), None)


def kind_for(kinds: Sequence[GuestKind], config: Configuration) -> GuestKind:
    """The kind of ``kinds`` that boots ``config``: the one its ``guest`` names (the first
    where two share a name), the first when it names none or ``kinds`` has no other;
    TrialFailed when no kind has that name."""
    if config.guest is None or len(kinds) == 1:
        return kinds[0]
    found = next((k for k in kinds if k.label == config.guest), None)
    if found is None:
        raise TrialFailed(f"no guest called {config.guest!r} in this run")
    return found
