"""The disk settings a platform module reads (``DiskSettings``): the fields of an iomatrix
configuration (``suite.model.Configuration`` has them all), named here so that platform needs
no suite type and sits right above core."""

from __future__ import annotations

from typing import Protocol


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
