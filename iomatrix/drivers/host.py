"""host mode: fio on the target itself, the physical baseline."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path

from iomatrix.drivers.base import Driver, Session
from iomatrix.suite.model import Configuration
from iomatrix.target.workspace import Image


class HostSession(Session):
    def __init__(self, config: Configuration, images: Sequence[Image], engine: str) -> None:
        super().__init__(config, images)
        self.engine = engine

    def fio_target(self) -> dict[str, str]:
        if self.image.network is not None:       # fio's own client of the storage (librbd)
            return {**self.image.network.fio, "size": str(self.image.size)}
        return {"ioengine": self.engine, "direct": "1", "filename": str(self.image.path),
                "size": str(self.image.size)}

    def fio_env(self) -> dict[str, str]:
        return dict(self.image.network.env) if self.image.network is not None else {}

    def ioping_path(self) -> Path | None:
        return None if self.image.network is not None else self.image.path


class HostDriver(Driver):
    mode = "host"

    @contextlib.contextmanager
    def session(self, config: Configuration, images: Sequence[Image]) -> Iterator[Session]:
        yield HostSession(config, images, self.method.engine)
