"""A Windows image as a guest kind ([guest] with ``os = "windows"``): the user's image, checked,
opened once and booted through an overlay as :mod:`iomatrix.drivers.guest.image` does, with a
seed CD of its own each boot (:mod:`iomatrix.appliance.winseed`: fio.exe of the host's version,
cross-built with mingw-w64 by :mod:`iomatrix.appliance.winfio`, and the start-up script a
scheduled task registered once in the image runs). fio there runs ``windowsaio`` on
``\\\\.\\PhysicalDriveN``. Booting Windows needs a Windows image and, in practice, KVM: neither
is within reach where iomatrix is developed, so the boot itself is untested; the bundle, the
script's layout and the server under Wine are tested (``tests/appliance/test_winfio.py``)."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

from iomatrix.appliance.build import GuestDisk
from iomatrix.appliance.kernel import default_cache_dir
from iomatrix.appliance.ownimage import (check_overlay_space, make_overlay, system_argv,
                                         windows_target)
from iomatrix.appliance.winfio import WindowsFio, windows_fio
from iomatrix.appliance.winseed import make_windows_seed
from iomatrix.core.errors import EnvironmentProblem, GuestFioUnavailable
from iomatrix.drivers.guest.image import ImageGuest
from iomatrix.drivers.guest.kind import Boot, GuestRun
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.model import Suite
from iomatrix.targets.workspace import Image


class WindowsGuest(ImageGuest):
    """[guest] os = "windows" (see the module docstring)."""

    cluster_refusal = "[guest] (your own Windows image) is not built for it"
    windows: WindowsFio | None = None
    """fio.exe and its DLLs, which each boot's seed carries."""

    @classmethod
    def from_suite(cls, suite: Suite) -> WindowsGuest | None:
        return cls(suite.guest) if suite.guest is not None and suite.guest.os == "windows" \
            else None

    def prepare(self, run: GuestRun, note: Callable[[str], None],
                configurations: Sequence[Configuration]) -> None:
        """fio.exe of the host's version (built once, cached), and room for the overlays."""
        check_overlay_space(self.base, self.own.guests_at_once(configurations, run.method.vms),
                            run.workdir)
        try:
            self.windows = windows_fio(default_cache_dir())
        except GuestFioUnavailable as exc:
            raise EnvironmentProblem(
                f"[guest] os = \"windows\": the guest needs fio.exe of the host's version, "
                f"which cannot be built here: {exc}", hint=exc.hint) from None
        note(f"guest {self.own.label}: Windows, {self.base.path} ({self.base.format}, read only "
             f"through an overlay per boot), fio.exe {self.windows.version} from the Debian "
             f"source {self.windows.source} on a seed CD, ready within "
             f"{self.own.ready_seconds(run.accel):.0f} s under {run.accel.upper()}")

    def boot(self, stack: contextlib.ExitStack, run_dir: Path, image: Image,
             run: GuestRun) -> Boot:
        """As a Linux image boots, with the Windows seed as a CD instead of the NoCloud disk."""
        assert self.image is not None and self.windows is not None
        fd = self.image.descriptor()
        stack.callback(os.close, fd)
        overlay = run_dir / "overlay.qcow2"
        stack.callback(overlay.unlink, missing_ok=True)
        make_overlay(self.base, overlay)
        seed_dir = run_dir / "seed"
        stack.callback(shutil.rmtree, seed_dir, ignore_errors=True)
        seed_dir.mkdir(mode=0o700)
        seed = make_windows_seed(seed_dir, fio=self.windows, disk_size=image.size)
        system = system_argv(self.base, overlay, seed, bootloader=True, fd=fd, seed_cd=True)
        return Boot(None, None, "", tuple(system), (fd,))

    def fio_target(self, disk: GuestDisk) -> dict[str, str]:
        return windows_target(disk.name)
