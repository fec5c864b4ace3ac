"""A platform's disk read back as iomatrix configuration values (``iomatrix translate``): what
Proxmox VE's drive line or libvirt's ``<disk>`` amounts to, typed, with notes on what the
values cannot say."""

from __future__ import annotations

from iomatrix.core.model import Frozen


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
    notes: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, str | int | bool | None]:
        """The values by configuration field name (the notes apart), in field order."""
        return self.model_dump(exclude={"notes"})
