"""Drivers realize a configuration so fio can measure it: ``host`` (fio on the target itself),
``blocklayer`` (qemu-storage-daemon, no guest) and ``guest`` (appliance VMs), each behind the
``base`` boundary; ``registry`` gives the driver of a mode."""

from iomatrix.drivers.base import Driver, Session
from iomatrix.drivers.registry import driver_for

__all__ = ["Driver", "Session", "driver_for"]
