"""host mode: fio on the target itself, the physical baseline. A volume on network storage is
reached as its kind says (``iomatrix.targets.kind.NetworkVolume``): by fio's own client (librbd),
as the block device the host's kernel gives it (an iSCSI LUN the kernel initiator is logged in
to), else through a qemu-storage-daemon (raw, cache=none) exported over NBD, which every trial's
applied settings name (libiscsi: ``iomatrix.targets.iscsi``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path

from iomatrix.drivers.base import Driver, Session
from iomatrix.drivers.blocklayer import BlocklayerDriver
from iomatrix.qemu.affinity import Pinning
from iomatrix.suite.configuration import Configuration
from iomatrix.targets.workspace import Image
from iomatrix.vocab.words import Mode


USERSPACE = {"cache": "none", "format": "raw", "aio": None, "iothread": False}
"""A host-mode configuration as the qemu-storage-daemon that reaches a volume in userspace
holds it (``NetworkVolume.host_daemon``): raw, cache=none, NBD."""


class HostSession(Session):
    def __init__(self, config: Configuration, images: Sequence[Image], engine: str) -> None:
        super().__init__(config, images)
        self.engine = engine
        self.pinning = Pinning.start(config, None if self.image.network else self.image.path)
        """fio's CPUs (``vcpu_affinity``: its cpus_allowed), as asked and as seen."""

    def fio_target(self) -> dict[str, str]:
        if self.image.network is not None:       # fio's own client of the storage (librbd)
            return {**self.image.network.fio, "size": str(self.image.size),
                    **self.pinning.fio_options()}
        return {"ioengine": self.engine, "direct": "1", "filename": str(self.image.path),
                "size": str(self.image.size), **self.pinning.fio_options()}

    def new_trial(self) -> None:
        self.pinning.new_trial()

    def observe(self, fio_pid: int) -> None:
        self.pinning.observe_fio(fio_pid)

    def applied(self) -> dict[str, str]:
        return self.pinning.applied()

    def mismatches(self) -> list[str]:
        return self.pinning.mismatches()

    def fio_env(self) -> dict[str, str]:
        return dict(self.image.network.env) if self.image.network is not None else {}

    def ioping_path(self) -> Path | None:
        return None if self.image.network is not None else self.image.path


class HostDriver(Driver):
    mode = Mode.HOST

    @contextlib.contextmanager
    def session(self, config: Configuration, images: Sequence[Image]) -> Iterator[Session]:
        volume = images[0].network
        device = volume.host_device() if volume is not None else None
        if device is not None:
            yield HostSession(config, [images[0].model_copy(update={"path": device,
                                                                    "network": None})],
                              self.method.engine)
            return
        why = volume.host_daemon() if volume is not None else None
        if volume is None or why is None:
            yield HostSession(config, images, self.method.engine)
            return
        userspace = config.model_copy(update=USERSPACE)
        daemon = BlocklayerDriver(self.method.model_copy(update={"platform": "qemu"}),
                                  self.workdir)
        with daemon.session(userspace, images) as session:
            yield UserspaceSession(session, f"{volume.client}; kernel initiator: {why}")


class UserspaceSession(Session):
    """A host-mode baseline reached through a qemu-storage-daemon (``NetworkVolume.host_daemon``:
    an iSCSI LUN without the kernel initiator): the daemon's session, its path named in what was
    applied."""

    def __init__(self, inner: Session, path: str) -> None:
        super().__init__(inner.config, inner.images)
        self.inner = inner
        self.path = path

    def fio_target(self) -> dict[str, str]:
        return self.inner.fio_target()

    def new_trial(self) -> None:
        self.inner.new_trial()

    def observe(self, fio_pid: int) -> None:
        self.inner.observe(fio_pid)

    def applied(self) -> dict[str, str]:
        return {"host.path": self.path, **self.inner.applied()}

    def mismatches(self) -> list[str]:
        return self.inner.mismatches()

    def command(self) -> str:
        return self.inner.command()

    def pids(self) -> list[int]:
        return self.inner.pids()
