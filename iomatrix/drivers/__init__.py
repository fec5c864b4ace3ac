"""Drivers realize a configuration so fio can measure it: ``host`` (fio on the target itself),
``blocklayer`` (qemu-storage-daemon, no guest); guests slot in beside them through ``base``."""

from iomatrix.drivers.base import Driver, Session, driver_for

__all__ = ["Driver", "Session", "driver_for"]
