"""A platform's disk read back as iomatrix configuration values (``iomatrix translate``): what
Proxmox VE's drive line or libvirt's ``<disk>`` amounts to, typed, with notes on what the
values cannot say."""

from __future__ import annotations

from iomatrix.core import cpuset
from iomatrix.core.model import Frozen


def cpu_list(text: str) -> str | None:
    """A host CPU list as a platform's file gives one ("0,5,8-11": Proxmox VE's pve-cpuset,
    libvirt's cpuset without its ``^N`` exclusions), canonical as the affinity axes hold it;
    None for another text (untrusted: never passed on as written)."""
    try:
        return cpuset.shown(cpuset.parse(text))
    except ValueError:
        return None


class DiskValues(Frozen):
    """iomatrix configuration values of one disk; None where the platform sets nothing iomatrix
    can name (a controller it has no name for, librbd's aio)."""

    controller: str | None
    aio: str | None
    iothread: bool
    cache: str
    format: str
    discard: str | None = None
    """ignore or unmap as the platform's file sets it; None where it sets nothing (each
    platform's default: QEMU's ignore)."""
    num_queues: int | None = None
    queue_size: int | None = None
    iothreads: int | None = None
    """IOThreads serving the disk's queues, where there are two or more (None: one or none)."""
    vq_mapping: str | None = None
    """Their explicit queue mapping (``"0,2:1,3"``); None: round-robin."""
    vcpu_affinity: str | None = None
    """Host CPUs the VM's vCPUs are pinned to (a CPU list); None: not pinned."""
    iothread_affinity: str | None = None
    """Host CPUs the disk's IOThreads are pinned to."""
    main_affinity: str | None = None
    """Host CPUs QEMU's main loop (and its other threads) is pinned to."""
    notes: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, str | int | bool | None]:
        """The values by configuration field name (the notes apart), in field order."""
        return self.model_dump(exclude={"notes"})
