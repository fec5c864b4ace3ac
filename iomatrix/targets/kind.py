"""What a kind of storage under test is to the rest of iomatrix: the one interface every kind
implements (a directory or device: ``iomatrix.targets.local``; a Ceph RBD pool:
``iomatrix.targets.rbd``; an iSCSI LUN: ``iomatrix.targets.iscsi``), each listed once in
``iomatrix.targets.registry``. The runner, ``reclaim`` and ``doctor`` ask the registry for a
kind and use only what is here; none of them knows a kind by its type.

A kind has two faces:

- ``TargetKind``: the kind itself, one instance per module: its [target] key (its table, the
  pydantic model of its keys, is registered low, in ``iomatrix.suite.targets``, so that a suite
  is validated without importing this package), the programs a run on it needs (``tools``),
  what the suite's author may not have this host do with it (``check_author``: a key sent to an
  endpoint they chose, say), whether cluster load can reach it, what it records making on the
  storage besides directories and how a later run removes that (``resource``: ``Resource``),
  its lines in ``iomatrix doctor`` (``host_checks``), the Proxmox VE storage types an id of
  which names it (``storage_types``, ``of_storage``), and how it is opened for a run (``open``).
- ``OpenTarget``: the kind opened for one run: ``check`` (everything, before anything is
  written, created or stored), ``create``, ``images``, ``verify`` (before and after a program
  opens an image by path), ``close``, ``storage_of`` (for the host's disk telemetry), ``notes``,
  ``host_fields`` (what it adds to the run's host record) and ``for_run`` (what the runner hands
  it once the run exists: the recorder, the private scratch directory, the run's id)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal, NamedTuple

from pydantic import Field

from iomatrix.core.model import Frozen
from iomatrix.core.trust import Author
from iomatrix.platform import proxmox as pve
from iomatrix.platform.settings import NetworkNode
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.target import Target

Recorder = Callable[[str, Path, Path], str]
"""Called with (kind, path, where it is made) just before a run makes something on the storage
(``iomatrix.measure.reclaim``): a directory's kind is "parent" or "workspace", its ``where`` the
directory it is created in; a kind's own resource (``Resource.kind``) has its connection there.
Returns the marker that says the thing is this record's (``core.dirs.MARKER``)."""


class NetworkVolume(NetworkNode):
    """One volume on network storage as QEMU and fio reach it (``iomatrix.targets.remote``):
    the node a disk's graph opens, and how host mode's fio reaches it."""

    protocol: Literal["rbd", "iscsi"]
    hidden: dict[str, str] = Field(default={}, repr=False)
    """Placeholder in ``node`` → the value programs get (``reveal``), never stored or shown."""
    fio: dict[str, str]
    env: dict[str, str] = {}
    client: str
    """How host mode reaches it, for its label: ``fio's rbd engine (librbd)``."""
    aio_not_evaluated: ClassVar[str | None] = None
    """What blocklayer mode records as the aio QEMU applied where its protocol driver has no
    aio mode (libiscsi), the daemon then not looked at for one; None: looked at as for a file
    (an RBD volume: ``aio`` mismatches are never counted on network storage)."""

    def host_device(self) -> Path | None:
        """The block device this host's kernel gives the volume (an iSCSI LUN the kernel
        initiator is logged in to), which host mode measures as a device; None: none."""
        return None

    def host_daemon(self) -> str | None:
        """Why host mode reaches the volume through a qemu-storage-daemon (fio has no client of
        its own for it: libiscsi), asked when ``host_device`` gives none; None: fio's own
        client reaches it (``fio``, ``env``: librbd)."""
        return None


class Image(Frozen):
    """One disk image (or the block device itself, or a volume on network storage) that
    configurations run on."""

    path: Path
    """The file or device; for a network volume a name to show (``rbd:pool/image``), never
    opened."""
    format: str
    preallocation: str
    size: int
    is_device: bool = False
    offset: int = Field(default=0, ge=0)
    """Where the disk starts on a device: a region of it (``size`` bytes from here), which a raw
    format node limits QEMU to (a node's region of a shared iSCSI LUN under cluster load)."""
    network: NetworkVolume | None = None
    """How QEMU and fio reach a volume on network storage (``iomatrix.targets.remote``)."""
    backing: tuple[Path, ...] = ()
    """A qcow2 image's backing chain, nearest first, each a device or file the kind made
    (Proxmox VE 9's snapshots as a volume chain: ``[target] lvm`` ``volume_chain``); the graph
    opens each as nodes of its own (``iomatrix.platform.settings.DiskImage.backing``)."""


class HostCheck(Frozen):
    """One ``iomatrix doctor`` line a kind adds about this host (``iomatrix.measure.doctor.Check``
    has the same fields): what the kind needs here, never required."""

    name: str
    ok: bool
    detail: str
    hint: str | None = None


class Probe(NamedTuple):
    """What ``doctor`` gives a kind to look at the host with."""

    which: Callable[[str], str | None]
    """A program's path on doctor's PATH, or None."""
    run: Callable[[Sequence[str]], tuple[int | None, str, str]]
    """(exit status or None when it could not run, stdout, stderr), within doctor's timeout."""
    sysfs: Path


class Resource(NamedTuple):
    """What a kind records making on its storage besides directories (an RBD image), and how a
    later run or ``iomatrix clean`` removes what a killed run left."""

    kind: str
    """The record's kind (``rbd-image``)."""
    name: str
    """How it is named to people (``RBD image``)."""
    remove: Callable[..., str]
    """``remove(path, within, marker, *, dry_run=False, author=US)``: removed, would remove,
    gone, or ``left: why``; ``TargetUnreachable`` when the storage cannot be reached."""
    within_keys: frozenset[str]
    """A record's ``within`` is the connection as a JSON object of these keys (file paths only,
    never a secret), which a store holds and ``iomatrix.store.rows.within`` checks."""
    within_max: int
    """The longest ``within`` a store's row may hold."""


class OpenTarget:
    """A kind opened for one run (the module's docstring). The defaults are those of storage
    reached by name, not by a path another user could swap."""

    notes: list[str]
    """What ``check`` (and ``create``) found worth the run's notes."""
    preconditioned: set[Path]
    """Images written fully once already (``[method] precondition``)."""
    record: Recorder | None
    scratch: Path | None = None
    """The run's private scratch directory (files the clients read: a ceph.conf)."""
    image_size: int | None = None
    """The size of every image, once ``check`` has chosen it."""

    def check(self, configs: Iterable[Configuration]) -> "OpenTarget":
        raise NotImplementedError

    @property
    def size(self) -> int:
        """The size of every image (``check`` first)."""
        assert self.image_size is not None, "check() first"
        return self.image_size

    def create(self) -> "OpenTarget":
        return self

    def close(self) -> None:
        raise NotImplementedError

    def images(self, config: Configuration) -> list[Image]:
        """One image per guest of the configuration (one for host and blocklayer modes)."""
        return [self.image(config, index) for index in range(config.vms or 1)]

    def image(self, config: Configuration, index: int = 0) -> Image:
        """The image of the configuration's guest ``index``, made on first use (a kind whose
        ``images`` are its own need not say)."""
        raise NotImplementedError

    def verify(self, images: Iterable[Image]) -> None:
        """Nothing to check: volumes reached by name."""

    def node_client(self) -> str | None:
        """Under cluster load (``[method] concurrent_nodes``), the ceph.conf every node's fio
        reads the pool by (each node then gets images of its own there); None: the nodes
        reach the target by its path."""
        return None

    def node_regions(self) -> bool:
        """Under cluster load, whether the nodes share ONE volume that each loads a region of,
        through a qemu-storage-daemon of its own (an iSCSI LUN: libiscsi)."""
        return False

    def storage_of(self, config: Configuration) -> Path | None:
        """No local device holds the storage: no host disk telemetry."""
        return None

    def host_fields(self) -> dict[str, str]:
        """What the run's host record says about the target, over what the host's metadata
        says of its path (``iomatrix.telemetry.hostinfo``)."""
        return {}

    def for_run(self, *, record: Recorder | None, scratch: Path, run_id: int) -> None:
        """The run exists: what it makes is recorded through ``record``, its private files go
        to ``scratch``, and ``run_id`` names it."""
        self.record = record
        self.scratch = scratch

    def __enter__(self) -> "OpenTarget":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TargetKind:
    """One kind of storage under test (the module's docstring); a module per kind defines one."""

    keys: ClassVar[tuple[str, ...]]
    """The [target] keys that name this kind (``rbd``; ``directory`` and ``device``)."""
    tools: ClassVar[tuple[str, ...]] = ()
    """The programs a run on it needs besides fio and QEMU's."""
    cluster_load: ClassVar[bool] = True
    """``[method] concurrent_nodes`` can load it from every node."""
    resource: ClassVar[Resource | None] = None
    storage_types: ClassVar[tuple[str, ...]] = ()
    """The Proxmox VE storage types (storage.cfg) a ``[target] storage = "ID"`` of this kind
    resolves into (``iomatrix.targets.network.resolve_storage``)."""
    storage_volumes: ClassVar[bool] = False
    """``"ID:volume"`` names one volume of such a storage (an iSCSI LUN: ``ID:lunN``)."""

    def of_storage(self, storage: pve.Storage, volume: str, pve_dir: Path, *,
                   mounted: Callable[[Path], bool] | None = None) -> dict[str, Any]:
        """The [target] keys of ``storage`` (``volume``: what follows ``ID:``, or "") as
        Proxmox VE itself would put a VM's disks there; ``ValueError`` says what cannot be
        measured."""
        raise NotImplementedError

    def format_problem(self, target: Target, fmt: str) -> str | None:
        """Why images of format ``fmt`` cannot be made on ``target`` (a volume holds raw: an
        LV, a zvol); None when they can."""
        return None

    def open(self, target: Target, *, keep: bool, author: Author) -> OpenTarget:
        raise NotImplementedError

    def check_author(self, target: Target, author: Author) -> None:
        """``UntrustedFile`` for what ``author``, who could have written the suite, may not have
        this host do with ``target`` (before anything starts or logs in anywhere)."""

    def host_checks(self, probe: Probe) -> list[HostCheck]:
        """This kind's lines in ``iomatrix doctor``."""
        return []
