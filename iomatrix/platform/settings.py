"""The disk settings a platform module reads (``DiskSettings``): the fields of an iomatrix
configuration (``suite.model.Configuration`` has them all), named here so that platform needs
no suite type and sits right above core."""

from __future__ import annotations

from typing import Protocol

from iomatrix.core.model import Frozen


class DiskSettings(Protocol):
    """One disk's settings as iomatrix names them; None where a setting is not given."""

    @property
    def controller(self) -> str | None: ...
    @property
    def aio(self) -> str | None: ...
    @property
    def iothread(self) -> bool | None: ...
    @property
    def cache(self) -> str | None: ...
    @property
    def format(self) -> str | None: ...
    @property
    def preallocation(self) -> str | None: ...
    @property
    def data_path(self) -> str | None: ...
    @property
    def num_queues(self) -> int | None: ...
    @property
    def queue_size(self) -> int | None: ...


class PlatformDefault(Frozen):
    """A platform's default for one parameter: the level it amounts to (as a run spells it), or
    None when the platform has none (the user's XML or command line must name it), and the words
    to show."""

    level: str | None
    shown: str
    note: str = ""


def default(level: str | None, shown: str | None = None, note: str = "") -> PlatformDefault:
    return PlatformDefault(level=level, shown=shown or (level or "none"), note=note)
