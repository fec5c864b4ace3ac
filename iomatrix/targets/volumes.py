"""Block volumes iomatrix makes on this host's storage as a run's target: what every such kind
shares (an LVM volume or thin volume, ``iomatrix.targets.lvm``; a ZFS zvol; a volume through
Proxmox VE's own storage layer). A kind is a ``Backend`` (the storage's own tools) and a
``VolumeKind`` naming it; ``VolumeTarget`` does the rest, alike for every kind:

- **Checked first.** ``check`` asks the backend whether the storage is there and can hold every
  volume the run needs (``Backend.check``: one line, ``NotEnoughSpace`` or ``TargetError``),
  before anything is created or stored.
- **Own volumes only.** One volume per image (format, preallocation, guest index), named
  ``iomatrix-<run>-<token>-<format>-<preallocation>[-vmN]`` (a backend may put a prefix of its
  own before it: ``Backend.prefix``), recorded in the store (the kind's ``Resource``: path
  ``<where>/<name>``, within the backend's connection as JSON) BEFORE it is created, and carrying
  the record's marker when the storage can hold one (``owner_tag``: an LVM tag, a ZFS user
  property). ``close`` removes what this run made unless ``--keep``; what a killed run left is
  removed by ``remove_recorded`` (``iomatrix clean``, the next run) only when its name is one
  iomatrix gives, it is the recorded one and it carries the record's marker. Nothing else on the
  storage is touched.
- **A device iomatrix made.** The tool names the volume's block device; it is used only when it
  is a block device that is not mounted, has no holders and can be opened exclusively
  (``workspace.check_device``), and programs open it only while it is still that device
  (``verify``: its device number)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import stat
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, ClassVar

from iomatrix.core.errors import IomatrixError, TargetError, TargetUnreachable
from iomatrix.core.trust import US, Author
from iomatrix.core.units import format_bytes
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.target import Target
from iomatrix.targets.kind import Image, OpenTarget, Recorder, Resource, TargetKind
from iomatrix.targets.workspace import (check_device, image_specs, memory_total,
                                        page_cache_notes, working_set_size)

PREFIX = "iomatrix-"
"""Every volume iomatrix makes is named so (after a backend's own prefix)."""
NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]{0,126}$")
"""A volume name iomatrix gives or accepts from a record: nothing a tool reads as syntax."""
WITHIN_MAX = 4096
"""The longest connection a store's row of a volume may hold."""
MIB = 1 << 20


def owner_tag(marker: str) -> str:
    """What a volume carries to say it is the record's (an LVM tag, a ZFS user property value):
    a digest of the record's marker, in characters every tool accepts."""
    return "iomatrix-owner-" + hashlib.sha256(marker.encode()).hexdigest()[:40]


class Backend:
    """One storage's own tools, for volumes iomatrix makes there (a kind module subclasses it).
    Every method that runs a tool raises ``TargetUnreachable`` (one line) when the storage
    cannot be reached, ``TargetError`` when the tool refuses."""

    resource_kind: ClassVar[str]
    """The store's record kind of a volume (``lvm-volume``)."""
    noun: ClassVar[str] = "volume"
    """What a volume is called to people (``LVM volume``)."""
    marks: ClassVar[bool] = True
    """The storage holds the record's marker with each volume (``create``'s ``tag``): a volume
    without it is never reclaimed."""
    formats: ClassVar[tuple[str, ...]] = ("raw",)
    """The image formats a volume can hold (raw: the device itself)."""
    prefix: str = ""
    """What a volume's name begins with before ``PREFIX`` (``vm-<VMID>-`` through pvesm)."""

    @property
    def where(self) -> str:
        """The storage as messages name it (``LVM-thin pool pve/data``)."""
        raise NotImplementedError

    @property
    def spec(self) -> str:
        """The storage as the record's path begins (``pve``): ``<spec>/<name>``."""
        raise NotImplementedError

    def connection(self) -> dict[str, Any]:
        """What reaches the storage, as the store records it with each volume (names only,
        checked again by the kind's ``from_connection`` before a later run uses it)."""
        raise NotImplementedError

    def check(self, count: int, size: int) -> list[str]:
        """Refuse (``NotEnoughSpace``, one line) when the storage cannot hold ``count`` more
        volumes of ``size`` bytes, written fully, or is not there (``TargetError``); what it
        found worth the run's notes."""
        raise NotImplementedError

    def format_problem(self, fmt: str) -> str | None:
        """Why volumes here cannot hold images of ``fmt`` (None: they can)."""
        if fmt in self.formats:
            return None
        return f"volumes are raw here; drop format {fmt} from the matrix"

    def create(self, name: str, size: int, tag: str) -> Path:
        """Make volume ``name`` of ``size`` bytes carrying ``tag`` (when ``marks``); its block
        device as the tool names it."""
        raise NotImplementedError

    def remove(self, name: str) -> None:
        """Remove volume ``name`` (always one iomatrix made: ``PREFIX`` checked by the caller)."""
        raise NotImplementedError

    def listed(self) -> dict[str, set[str]]:
        """Every volume on the storage → its tags (or the owner property's value)."""
        raise NotImplementedError

    def host_fields(self) -> dict[str, str]:
        """What the run's host record says of the storage."""
        return {"target": self.where}


class VolumeTarget(OpenTarget):
    """A run's volumes on one storage (the module's docstring)."""

    def __init__(self, target: Target, backend: Backend, *, keep: bool = False,
                 record: Recorder | None = None, proc_root: Path = Path("/proc")) -> None:
        self.target = target
        self.backend = backend
        self.keep = keep
        self.record = record
        self.notes: list[str] = []
        self.preconditioned: set[Path] = set()
        self.image_size: int | None = None
        self.run_label = "run"
        """Part of each volume's name: the run's id once the runner knows it."""
        self._proc = proc_root
        self._token = secrets.token_hex(3)
        self._images: dict[tuple[str, str, int], Image] = {}
        self._made: dict[str, Path] = {}
        """Each volume made and not yet removed → its device."""
        self._devices: dict[Path, int] = {}
        """Each volume's device → its device number as made (``verify``)."""

    # -- lifecycle -------------------------------------------------------------------------
    def check(self, configs: Iterable[Configuration]) -> "VolumeTarget":
        configs = list(configs)
        for fmt in sorted({c.format or "raw" for c in configs}):
            problem = self.backend.format_problem(fmt)
            if problem is not None:
                raise TargetError(f"[target] {self.target.kind} ({self.backend.where}): "
                                  f"{problem}")
        memory = memory_total(self._proc / "meminfo")
        wanted = working_set_size(self.target, memory)
        size = wanted if wanted is not None else self.target.size
        assert size is not None, "a volume target has a size (Target checks it)"
        self.image_size = -(-size // MIB) * MIB
        specs = image_specs(configs)
        found = self.backend.check(len(specs), self.image_size)
        self.notes = [f"target: {self.backend.where}; iomatrix creates {len(specs)} "
                      f"{self.backend.noun}(s) of {format_bytes(self.image_size)} named "
                      f"{self.backend.prefix}{PREFIX}<run>-… there and removes them at the end",
                      *found, *page_cache_notes(self.target, configs, self.image_size, memory)]
        return self

    def for_run(self, *, record: Recorder | None, scratch: Path, run_id: int) -> None:
        super().for_run(record=record, scratch=scratch, run_id=run_id)
        self.run_label = str(run_id)

    def close(self) -> None:
        """Remove every volume this run made (unless keep); one that cannot be removed now is
        left to its record (``iomatrix clean``)."""
        if self.keep:
            return
        for name in list(self._made):
            with contextlib.suppress(TargetError):
                self.backend.remove(name)
                del self._made[name]

    def host_fields(self) -> dict[str, str]:
        return self.backend.host_fields()

    def storage_of(self, config: Configuration) -> Path | None:
        """The block device of the configuration's volume (its first guest's), for the host's
        disk telemetry (``/dev/pve/vm-…`` is read as its ``dm-N``; the stand-ins' a loop
        device); None before the volume is made."""
        image = self._images.get((config.format or "raw", config.preallocation or "off", 0))
        return image.path if image is not None else None

    # -- images ----------------------------------------------------------------------------
    def name_of(self, fmt: str, prealloc: str, index: int) -> str:
        """The name of the run's volume for one image."""
        suffix = f"-vm{index}" if index else ""
        return (f"{self.backend.prefix}{PREFIX}{self.run_label}-{self._token}-{fmt}-{prealloc}"
                f"{suffix}")

    def image(self, config: Configuration, index: int = 0) -> Image:
        """The volume for guest ``index`` of images of the configuration's format and
        preallocation, made on first use: recorded, created, its device checked."""
        fmt, prealloc = config.format or "raw", config.preallocation or "off"
        key = (fmt, prealloc, index)
        if key in self._images:
            return self._images[key]
        device = self.make(self.name_of(*key), self.volume_size(fmt))
        image = self.prepare(Image(path=device, format=fmt, preallocation=prealloc,
                                   size=self.size, is_device=True))
        self._images[key] = image
        return image

    def volume_size(self, fmt: str) -> int:
        """The size of the volume an image of ``fmt`` is made on: the image's own (raw)."""
        return self.size

    def make(self, name: str, size: int) -> Path:
        """Volume ``name`` of ``size`` bytes: recorded, created, its device checked."""
        marker = ""
        if self.record is not None:
            within = json.dumps(self.backend.connection(), sort_keys=True)
            marker = self.record(self.backend.resource_kind,
                                 Path(f"{self.backend.spec}/{name}"), Path(within))
        device = self.backend.create(name, size, owner_tag(marker))
        self._made[name] = device
        self._devices[device] = self._check_made(device, size)
        return device

    def prepare(self, image: Image) -> Image:
        """The image on a new volume: the device itself (raw). A kind whose volumes hold
        another format (qcow2 on an LV: a volume chain, ``iomatrix.targets.lvmchain``) writes
        it here (``make`` makes more volumes)."""
        return image

    def _check_made(self, device: Path, wanted: int) -> int:
        """``device`` as the tool named it: a block device of at least ``wanted`` bytes, not
        mounted, without holders, that can be opened exclusively; its device number."""
        try:
            size = check_device(device, proc_root=self._proc)
        except TargetError as exc:
            raise TargetError(f"{self.backend.where}: the new volume's device "
                              f"{str(exc).removeprefix('[target] device ')}") from exc
        if size < wanted:
            raise TargetError(f"{self.backend.where}: the new volume's device {device} holds "
                              f"{format_bytes(size)}, not the {format_bytes(wanted)} asked")
        return os.stat(device).st_rdev

    def verify(self, images: Iterable[Image]) -> None:
        """Each volume's device is still the one made (a program opens it by path)."""
        for image in images:
            made = self._devices.get(image.path)
            if made is None:
                continue
            try:
                now = os.stat(image.path)
            except OSError as exc:
                raise TargetError(f"the volume {image.path} is gone ({exc.strerror})") from exc
            if not stat.S_ISBLK(now.st_mode) or now.st_rdev != made:
                raise TargetError(f"{image.path} is no longer the volume iomatrix made: the "
                                  "run stops rather than write through it")


class VolumeKind(TargetKind):
    """A kind of storage where iomatrix makes volumes (a kind module subclasses it with its
    ``keys``, ``tools``, ``resource`` and ``backend``)."""

    cluster_load = False

    def backend(self, target: Target) -> Backend:
        """The backend of ``target``'s table."""
        raise NotImplementedError

    def format_problem(self, target: Target, fmt: str) -> str | None:
        return self.backend(target).format_problem(fmt)

    def open(self, target: Target, *, keep: bool, author: Author) -> OpenTarget:
        return VolumeTarget(target, self.backend(target), keep=keep)


def resource(kind: str, name: str, from_connection: Callable[[dict[str, Any]], Backend],
             keys: Iterable[str]) -> Resource:
    """The ``Resource`` of a volume kind: its record ``kind``, named ``name`` to people, its
    connection's ``keys``, read back by ``from_connection`` (``ValueError`` for one iomatrix
    does not write)."""

    def remove(path: str, within: str, marker: str, *, dry_run: bool = False,
               author: Author = US) -> str:
        return remove_recorded(from_connection, path, within, marker, dry_run=dry_run)

    return Resource(kind=kind, name=name, remove=remove, within_keys=frozenset(keys),
                    within_max=WITHIN_MAX)


def remove_recorded(from_connection: Callable[[dict[str, Any]], Backend], path: str,
                    within: str, marker: str, *, dry_run: bool = False) -> str:
    """Remove the volume a killed run recorded (``path``: ``<spec>/<name>``; ``within``: the
    connection as recorded, in a store another user could have written) when it is still
    iomatrix's: its name is one iomatrix gives, on the recorded storage, and it carries the
    record's marker (``owner_tag``; a storage that holds none: the name alone, which holds a
    random token). Returns removed, would remove, gone, or ``left: why``;
    ``TargetUnreachable`` when the storage cannot be reached."""
    try:
        data = json.loads(within) if len(within) <= WITHIN_MAX else None
        if not isinstance(data, dict):
            raise ValueError(f"not a JSON object of at most {WITHIN_MAX} characters")
        backend = from_connection(data)
    except (ValueError, IomatrixError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return f"left: the record's connection is not one iomatrix writes ({first})"
    spec, _, name = path.rpartition("/")
    if (spec != backend.spec or not NAME.match(name)
            or not name.startswith(backend.prefix + PREFIX)):
        return "left: not a volume name iomatrix gives"
    listed = backend.listed()
    if name not in listed:
        return "gone"
    if backend.marks and owner_tag(marker) not in listed[name]:
        return "left: it does not carry this record's marker (an iomatrix-owner tag)"
    if dry_run:
        return "would remove"
    try:
        backend.remove(name)
    except TargetUnreachable:
        raise
    except TargetError as exc:
        return f"left: {exc}"
    return "removed"
