"""The user's own Linux image as a guest kind ([guest]: ``iomatrix.appliance.ownimage`` says how
it is checked, opened once, booted through an overlay, and given fio). It boots the
configurations whose ``guest`` is its name. A Windows image is the kind of
:mod:`iomatrix.drivers.guest.windows`, which shares this one's checks and overlay."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

from iomatrix.appliance.guestfio import guest_fio
from iomatrix.appliance.kernel import default_cache_dir
from iomatrix.appliance.ownimage import (BaseImage, ImageFile, check_guest_files,
                                         check_overlay_space, make_overlay, make_seed,
                                         system_argv)
from iomatrix.core.errors import (EnvironmentProblem, GuestFioUnavailable, NotEnoughSpace,
                                  TrialFailed)
from iomatrix.core.trust import Author
from iomatrix.drivers.guest.kind import Boot, GuestKind, GuestRun
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.method import OwnGuest
from iomatrix.suite.model import Suite
from iomatrix.targets.workspace import Image


class ImageGuest(GuestKind):
    """[guest]: the user's Linux image (see the module docstring)."""

    def __init__(self, own: OwnGuest) -> None:
        self.own = own
        if own.kernel is not None:     # the image alone is sent to the nodes
            self.cluster_refusal = ("[guest] kernel and initrd are not sent to the nodes, so "
                                    "far: boot the image through its own bootloader")
        self.image: ImageFile | None = None
        """The image opened once, before the run: each QEMU reads that file by descriptor."""
        self.fio: Path | None = None
        """The static guest fio the seed carries to a Linux image."""

    @classmethod
    def from_suite(cls, suite: Suite) -> ImageGuest | None:
        return None if suite.guest is None else cls(suite.guest)

    @property
    def label(self) -> str:
        return self.own.label

    @property
    def base(self) -> BaseImage:
        """The image as :meth:`open` found it."""
        assert self.image is not None, "ImageGuest.open() comes first"
        return self.image.base

    def check(self, author: Author) -> None:
        check_guest_files(self.own, author)

    def open(self) -> None:
        self.image = ImageFile(self.own.image)

    def prepare(self, run: GuestRun, note: Callable[[str], None],
                configurations: Sequence[Configuration]) -> None:
        """The static fio a Linux image's seed carries, and room for as many overlays at once
        as a session boots. EnvironmentProblem when fio cannot be had, NotEnoughSpace when the
        overlays may not fit."""
        check_overlay_space(self.base, self.own.guests_at_once(configurations, run.method.vms),
                            run.workdir)
        try:
            self.fio = guest_fio(default_cache_dir()).path
        except GuestFioUnavailable as exc:
            raise EnvironmentProblem(
                f"[guest] image: the guest needs the static fio of the host's version, "
                f"which cannot be built here: {exc}") from None
        note(f"guest {self.own.label}: {self.base.path} ({self.base.format}, read only through "
             f"an overlay per boot), ready within {self.own.ready_seconds(run.accel):.0f} s "
             f"under {run.accel.upper()}")

    def before_boot(self, run: GuestRun, guests: int) -> None:
        try:     # checked before the run; what the run has written since counts too
            check_overlay_space(self.base, guests, run.workdir)
        except NotEnoughSpace as exc:
            raise TrialFailed(f"{exc} ({exc.hint})") from exc

    def boot(self, stack: contextlib.ExitStack, run_dir: Path, image: Image,
             run: GuestRun) -> Boot:
        """QEMU reads the image through a descriptor of its own; its overlay and (Linux) seed
        are made in ``run_dir`` and removed with the session, after its QEMU (``stack`` stops
        that first)."""
        assert self.image is not None
        fd = self.image.descriptor()
        stack.callback(os.close, fd)
        own, base = self.own, self.base
        overlay = run_dir / "overlay.qcow2"
        stack.callback(overlay.unlink, missing_ok=True)
        make_overlay(base, overlay)
        assert self.fio is not None
        seed_dir = run_dir / "seed"
        stack.callback(shutil.rmtree, seed_dir, ignore_errors=True)
        seed_dir.mkdir(mode=0o700)
        seed = make_seed(seed_dir, fio=self.fio, disk_size=image.size)
        system = system_argv(base, overlay, seed, bootloader=own.kernel is None, fd=fd)
        return Boot(own.kernel, own.initrd, f"console=ttyS0 {own.append}", tuple(system), (fd,))

    def ready_seconds(self, run: GuestRun) -> float:
        return self.own.ready_seconds(run.accel)
