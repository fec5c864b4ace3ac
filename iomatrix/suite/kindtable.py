"""What every [target] table of a kind of storage with keys of its own is (``KindTable``):
the tables themselves are in ``iomatrix.suite.target`` (network storage) and
``iomatrix.suite.volumes`` (volumes iomatrix makes on this host), each a key of
``iomatrix.suite.target.TABLES``."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from iomatrix.core.model import Frozen


class KindTable(Frozen):
    """The table of a [target] key that names a kind of storage with keys of its own (``rbd``,
    ``iscsi``): what ``Target`` checks of every such table alike."""

    needs_size: ClassVar[bool] = False
    """iomatrix makes images of [target] size there (a LUN's size is its own)."""
    destroys: ClassVar[bool] = False
    """What is there is written to and destroyed: ``allow_destroy`` must say so."""
    whole_device: ClassVar[bool] = False
    """Measured as one whole device (as ``[target] device`` is), not as images made there."""
    local_volumes: ClassVar[bool] = False
    """iomatrix makes block devices of this host there (an LV, a zvol:
    ``iomatrix.targets.volumes``): QEMU opens them as host devices, so every aio is evaluated
    as on a device; False: network storage reached by QEMU's own client (librbd, libiscsi),
    which has no aio option."""

    @property
    def location(self) -> str:
        """Where the storage is, as the user would name it."""
        return type(self).__name__

    @property
    def named(self) -> str:
        """The storage as a refusal names it."""
        return self.location

    def caveat(self, fmt: str | None) -> str | None:
        """What evidence measured on images of format ``fmt`` (None: raw) here must carry
        with it (recommend, the report); None: nothing."""
        return None

    @property
    def image_directory(self) -> Path | None:
        """The directory of this host where a run makes its image directory (a btrfs
        subvolume's ``path``): the next run over it reclaims what a killed run left there, as
        for a [target] directory; None: none."""
        return None

    @property
    def storage_kind(self) -> str | None:
        """What Proxmox VE's rules for aio see it as (``platform.proxmox.Storage.kind``:
        ``iomatrix recommend``); None: other storage."""
        return None
