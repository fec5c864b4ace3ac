"""The appliance as a guest kind: iomatrix's own kernel and initramfs (``iomatrix.appliance``),
booted with ``-kernel``/``-initrd``; its init finds the disk under test and starts fio's
server. It boots every guest-mode configuration that names no other guest."""

from __future__ import annotations

import contextlib
from pathlib import Path

from iomatrix.appliance.build import GUEST_FIO_PORT, kernel_cmdline
from iomatrix.drivers.guest.kind import Boot, GuestKind, GuestRun
from iomatrix.suite.fields import APPLIANCE
from iomatrix.suite.model import Suite
from iomatrix.targets.workspace import Image


class ApplianceGuest(GuestKind):
    """iomatrix's appliance (see the module docstring)."""

    @classmethod
    def from_suite(cls, suite: Suite) -> ApplianceGuest:
        return cls()            # every suite may boot it

    @property
    def label(self) -> str:
        return APPLIANCE

    def boot(self, stack: contextlib.ExitStack, run_dir: Path, image: Image,
             run: GuestRun) -> Boot:
        return Boot(run.appliance.kernel, run.appliance.initrd,
                    kernel_cmdline(port=GUEST_FIO_PORT, disks=1, accel=run.accel))

    def ready_seconds(self, run: GuestRun) -> float:
        return run.method.boot_timeout

    def facts(self, said: dict[str, str], run: GuestRun) -> dict[str, str]:
        return {"guest.kernel": run.appliance.kernel_release, "guest.os": APPLIANCE}
