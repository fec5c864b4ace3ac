"""The guest-kind interface: what boots inside a guest-mode VM and reaches fio there.

A kind is one module that subclasses :class:`GuestKind` and is listed once in
:data:`iomatrix.drivers.guest.kinds.KINDS` (as QEMU's block drivers fill a ``BlockDriver`` and
register it). The guest driver and the runner ask a kind, never which kind it is:

* from the suite: whether the suite boots it (:meth:`GuestKind.from_suite`), its value on the
  ``guest`` axis (:attr:`GuestKind.label`), what its files must pass before anything starts
  (:meth:`GuestKind.check`: ``iomatrix.core.trust``'s rules), what it opens once for the whole
  run (:meth:`GuestKind.open`), and why it cannot run on a cluster's nodes, if it cannot;
* once per run, with the driver prepared: what it needs besides (:meth:`GuestKind.prepare`, its
  notes said there);
* per boot: its room checked again (:meth:`GuestKind.before_boot`), how its kernel, initrd and
  system disk reach QEMU (:meth:`GuestKind.boot`: a :class:`Boot`), how long it may take to print
  the ready marker, what it says of itself (:meth:`GuestKind.facts`) and how fio reaches the
  disk under test inside it (:meth:`GuestKind.fio_target`).

Every kind's guest speaks the appliance's console protocol (``iomatrix.appliance.protocol``:
disk lines, then the ready marker) and runs fio's server of the host's version on
``GUEST_FIO_PORT``; the driver does the rest alike for all of them.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from iomatrix.appliance.build import Appliance, GuestDisk
from iomatrix.core.trust import Author
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.method import Method
from iomatrix.suite.model import Suite
from iomatrix.targets.workspace import Image


@dataclass(frozen=True)
class GuestRun:
    """What the guest driver holds for every kind of a run."""

    appliance: Appliance
    """iomatrix's appliance, built or found cached (its fio's version is the host's)."""
    accel: str
    """"kvm" or "tcg"."""
    method: Method
    workdir: Path
    """The run's scratch directory."""


class Boot(NamedTuple):
    """How one guest of a kind boots: QEMU's ``-kernel``, ``-initrd`` and ``-append`` (None,
    None: the firmware boots the system disk), the arguments of its system disk(s), and the
    descriptors QEMU inherits for them."""

    kernel: Path | None
    initrd: Path | None
    append: str
    system: tuple[str, ...] = ()
    fds: tuple[int, ...] = ()


class GuestKind(abc.ABC):
    """One kind of guest (see the module docstring). An instance is the kind as one suite
    asks for it, for one run."""

    cluster_refusal: str | None = None
    """Why a run under cluster load (``[method] concurrent_nodes``) cannot boot this kind on
    the nodes; None: it can."""

    @classmethod
    @abc.abstractmethod
    def from_suite(cls, suite: Suite) -> GuestKind | None:
        """This kind as ``suite`` asks for it, or None when the suite boots none of it."""

    @property
    @abc.abstractmethod
    def label(self) -> str:
        """Its value on the ``guest`` axis."""

    def check(self, author: Author) -> None:
        """UntrustedFile unless every file the kind hands QEMU passes ``iomatrix.core.trust``'s
        rules for input ``author`` wrote; before anything starts."""

    def open(self) -> None:
        """Open what every boot of the run reads (once its files passed :meth:`check`)."""

    def prepare(self, run: GuestRun, note: Callable[[str], None],
                configurations: Sequence[Configuration]) -> None:
        """Make ready, once per run, what this kind's boots need besides the appliance, for
        the run's ``configurations``; say what it did or assumes through ``note``."""

    def before_boot(self, run: GuestRun, guests: int) -> None:
        """TrialFailed when a session of ``guests`` guests of this kind cannot boot now."""

    @abc.abstractmethod
    def boot(self, stack: contextlib.ExitStack, run_dir: Path, image: Image,
             run: GuestRun) -> Boot:
        """How one guest on the disk ``image`` boots; what it makes (in ``run_dir``) or opens
        is undone by ``stack``, after its QEMU stopped."""

    @abc.abstractmethod
    def ready_seconds(self, run: GuestRun) -> float:
        """How long a guest may take to print the ready marker."""

    def facts(self, said: dict[str, str], run: GuestRun) -> dict[str, str]:
        """What is stored of the guest's OS (``guest.kernel``, ``guest.os``), from what its
        console ``said`` (``iomatrix.appliance.ownimage.parse_guest_line``)."""
        return said

    def fio_target(self, disk: GuestDisk) -> dict[str, str]:
        """The job options that aim fio in the guest at the disk under test, as the guest
        named it."""
        return {"ioengine": "libaio", "direct": "1", "filename": f"/dev/{disk.name}"}
