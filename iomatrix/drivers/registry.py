"""Which driver realizes each mode. The runner asks here for every mode alike; whatever a mode
must do before its first session (guests: build the appliance, choose the accelerator) is its
driver's ``prepare``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from iomatrix.drivers.base import Driver
from iomatrix.drivers.blocklayer import BlocklayerDriver
from iomatrix.drivers.guest import GuestDriver
from iomatrix.drivers.host import HostDriver
from iomatrix.drivers.libvirt import LibvirtDriver
from iomatrix.vocab.words import Mode
from iomatrix.suite.method import Method

DRIVERS: dict[str, type[Driver]] = {d.mode: d for d in (HostDriver, BlocklayerDriver, GuestDriver)}


def driver_for(mode: Mode, method: Method, workdir: Path, *, accel: str,
               note: Callable[[str], None]) -> Driver:
    """The driver of ``mode``, prepared for a run (see ``Driver.prepare``): guests through
    libvirtd (``LibvirtDriver``) when ``[method] platform = "libvirt"`` names a ``libvirt_uri``."""
    driver = DRIVERS[mode]
    if mode == Mode.GUEST and method.platform == "libvirt" and method.libvirt_uri is not None:
        driver = LibvirtDriver
    return driver.prepare(method, workdir, accel=accel, note=note)
