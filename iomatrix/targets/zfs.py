"""ZFS zvols as a run's target (``[target] zfs``), as Proxmox VE's zfspool storage makes a
VM's disks (pve-storage's ZFSPoolPlugin): ``zfs create [-s] -b VOLBLOCKSIZE -V SIZE
POOL/NAME``, reached as the block device ``/dev/zvol/POOL/NAME`` (the link udev makes to
/dev/zdN), destroyed with ``zfs destroy``. ``Zfs`` is the tool layer (the commands, what they
print and what iomatrix reads of it); ``ZfsBackend`` is the dataset as a volume kind's backend
(what every volume kind shares: ``iomatrix.targets.volumes``).

- **Names.** The dataset a suite names (``pool = "rpool/data"``) and the volblocksize reach a
  root program: both are checked strictly (``suite.volumes.dataset_name``,
  ``volblocksize_bytes``) before any command runs, and the dataset again when a store's record
  names it (``from_connection``). A zvol iomatrix makes is named ``iomatrix-…`` and carries
  the user property ``iomatrix:owner`` (``OWNER_PROPERTY``) holding the record's tag
  (``volumes.owner_tag``); ``destroy`` is only ever given such a name (never ``-r``), and
  ``clean`` leaves a recorded zvol whose property is not the record's.
- **Space first.** A zvol is thick unless ``sparse`` (``-s``): ZFS reserves its size and room
  for its metadata (``reservation``) when it is made. ``check_space`` compares what the run's
  zvols need with the dataset's ``available`` before anything is made (one line); a sparse
  zvol grows as the run writes it, so its size counts too.
- **What is recorded.** ``facts`` reads the dataset's ``compression``, ``sync`` and
  ``primarycache``, its ``available`` bytes, its pool's line of ``zpool list`` and the ZFS
  version (``zfs version``; else /sys/module/zfs/version): the run's host record (``zfs.*``)
  and notes, with the volblocksize each zvol was made with (read back).

This host has no ZFS module and the archives iomatrix reaches have no zfsutils-linux: the
tests run this module against a stand-in of ``zfs`` and ``zpool``
(tests/fixtures/standins/zfs) that hands out loop devices. Nothing here has run against real
ZFS."""

from __future__ import annotations

import contextlib
import os
import re
import stat
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from iomatrix.core.errors import (EnvironmentProblem, IomatrixError, NotEnoughSpace,
                                  TargetError, TargetUnreachable, ToolFailed)
from iomatrix.core.model import Frozen
from iomatrix.core.proc import require, run
from iomatrix.core.units import format_bytes
from iomatrix.platform import proxmox as pve
from iomatrix.suite.target import Target
from iomatrix.suite.volumes import (DEFAULT_VOLBLOCKSIZE, ZfsTarget, dataset_name,
                                    volblocksize_bytes, volblocksize_text)
from iomatrix.targets.kind import HostCheck, Probe
from iomatrix.targets.volumes import PREFIX, Backend, VolumeKind, resource

KIND = "zfs-zvol"
"""The store's resource kind of a zvol iomatrix created."""
OWNER_PROPERTY = "iomatrix:owner"
"""The ZFS user property holding the tag of the record that made a zvol."""
ZVOL_ROOT = Path("/dev/zvol")
"""Where udev links each zvol's device (/dev/zdN) by its name."""
PROPERTIES = ("available", "compression", "sync", "primarycache", "volblocksize")
"""What ``facts`` reads of the dataset (``zfs get -Hp``)."""
TIMEOUT = 120.0
"""Seconds a zfs or zpool command may take."""
LINK_TIMEOUT = 10.0
"""Seconds to wait for a new zvol's /dev/zvol link (pve-storage waits 10 s outside a task)."""
ALIGN = 1 << 20
"""A zvol's size is rounded up to a MiB (as pve-storage does) and to its volblocksize."""
HINT = ("install ZFS (Debian: zfsutils-linux from contrib, with the zfs-dkms module; Proxmox "
        "VE ships it)")
SYS_VERSION = Path("/sys/module/zfs/version")

_ZVOL = re.compile(rf"{PREFIX}[A-Za-z0-9_.-]{{1,150}}")
_OWNER = re.compile(r"[A-Za-z0-9_.:-]{1,200}")
"""A value of ``iomatrix:owner`` (``volumes.owner_tag``)."""


def volume_size(size: int, volblocksize: int) -> int:
    """The size a zvol of at least ``size`` bytes is made with: a whole number of MiB and of
    volblocksize (zfs refuses a size that is not a multiple of it)."""
    step = max(ALIGN, volblocksize)
    return -(-size // step) * step


def reservation(size: int, volblocksize: int) -> int:
    """Roughly what ZFS reserves for a thick zvol of ``size`` (a multiple of volblocksize): the
    data and the block pointers that map it (128 bytes each, in three copies; ZFS's own estimate,
    zvol_volsize_to_reservation, adds little more on a plain vdev and more on raidz, where
    zfs itself then refuses with "out of space" and the run stops before measuring)."""
    return size + (size // volblocksize) * 128 * 3


def zvol_name(dataset: str, name: str) -> str:
    """``dataset/name`` for a zvol iomatrix made, or TargetError (``destroy`` never reaches
    zfs with any other name)."""
    dataset_name(dataset)
    if not _ZVOL.fullmatch(name) or ".." in name:
        raise TargetError(f"zfs: {name[:80]!r} is not the name of a zvol iomatrix makes "
                          f"({PREFIX}…): left alone")
    return f"{dataset}/{name}"


class PoolLine(Frozen):
    """One line of ``zpool list -Hp -o name,size,alloc,free,health``."""

    name: str
    size: int
    alloc: int
    free: int
    health: str


class ZfsFacts(Frozen):
    """What a run records of the dataset its zvols are made in (``facts``)."""

    dataset: str
    available: int
    compression: str
    sync: str
    primarycache: str
    pool: PoolLine
    version: str

    def fields(self, volblocksize: int, sparse: bool) -> dict[str, str]:
        """The run's host record of the dataset: ``zfs_*`` beside the host's own keys, and
        ``target_fs`` saying it in one phrase (``iomatrix show``'s heading)."""
        return {"target_fs": f"zvols, volblocksize {volblocksize_text(volblocksize)}, "
                             f"{'sparse' if sparse else 'thick'}, compression "
                             f"{self.compression}",
                "zfs_compression": self.compression, "zfs_sync": self.sync,
                "zfs_primarycache": self.primarycache,
                "zfs_volblocksize": volblocksize_text(volblocksize), "zfs_version": self.version}

    def note(self, volblocksize: int, sparse: bool) -> str:
        """The run's note on the dataset, in one line."""
        arc = ("; primarycache=all: reads can come from the ARC (ZFS's cache in RAM) whatever "
               "the cache mode, so a working set that fits in it measures memory"
               if self.primarycache == "all" else "")
        return (f"zfs: zvols in {self.dataset} (pool {self.pool.name}, {self.pool.health}), "
                f"volblocksize {volblocksize_text(volblocksize)}, "
                f"{'sparse' if sparse else 'thick (refreservation = size)'}; dataset "
                f"compression={self.compression}, sync={self.sync}, primarycache="
                f"{self.primarycache}; {self.version}{arc}")


class Zfs:
    """The ``zfs`` and ``zpool`` programs on PATH (``env``'s, else this process's)."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        self.env = env
        self.zfs = require("zfs", env, hint=HINT)
        self.zpool = require("zpool", env, hint=HINT)

    def _run(self, program: str, *args: str, check: bool = True) -> tuple[int, str, str]:
        done = run([program, *args], timeout=TIMEOUT, check=False, env=self.env)
        if check and done.returncode != 0:
            raise ToolFailed(f"{Path(program).name} {args[0]} failed (exit {done.returncode}): "
                             f"{_last(done.stderr or done.stdout)}",
                             argv=[program, *args], returncode=done.returncode,
                             output=(done.stdout + done.stderr)[-4000:])
        return done.returncode, done.stdout, done.stderr

    # -- what is there ---------------------------------------------------------------------
    def get(self, dataset: str, properties: tuple[str, ...]) -> dict[str, str]:
        """``zfs get -Hp -o property,value PROPS DATASET``: property → value (``-`` where it
        does not apply); TargetError in one line when the dataset does not exist."""
        dataset_name(dataset)
        code, out, err = self._run(self.zfs, "get", "-Hp", "-o", "property,value",
                                   "--", ",".join(properties), dataset, check=False)
        if code != 0:
            raise TargetError(f"zfs: {_last(err or out)}",
                              hint="name an existing dataset of an imported pool "
                                   "(zfs list -t filesystem)")
        values: dict[str, str] = {}
        for line in out.splitlines():
            prop, tab, value = line.partition("\t")
            if tab and prop in properties:
                values[prop] = value
        missing = [p for p in properties if p not in values]
        if missing:
            raise TargetError(f"zfs get {dataset}: no value for {', '.join(missing)}")
        return values

    def pools(self) -> list[PoolLine]:
        """``zpool list -Hp -o name,size,alloc,free,health``, one line per imported pool."""
        _, out, _ = self._run(self.zpool, "list", "-Hp", "-o", "name,size,alloc,free,health")
        found = []
        for line in out.splitlines():
            cells = line.split("\t")
            if len(cells) == 5 and all(c.isdigit() for c in cells[1:4]):
                found.append(PoolLine(name=cells[0], size=int(cells[1]), alloc=int(cells[2]),
                                      free=int(cells[3]), health=cells[4]))
        return found

    def version(self) -> str:
        """``zfs version``'s lines joined (``zfs-2.2.7-pve1, zfs-kmod-2.2.7-pve1``); the
        kernel module's /sys/module/zfs/version where the command has no ``version`` (ZFS
        before 0.8); ``unknown`` when neither says."""
        code, out, _ = self._run(self.zfs, "version", check=False)
        lines = [line.strip() for line in out.splitlines() if line.strip()]
        if code == 0 and lines:
            return ", ".join(lines)[:200]
        try:
            return f"zfs-kmod-{SYS_VERSION.read_text().strip()[:100]}"
        except OSError:
            return "unknown"

    def facts(self, dataset: str) -> ZfsFacts:
        """The dataset's properties, its pool's line and the ZFS version; TargetError in one
        line when the dataset is missing, is a zvol itself, or its pool is not imported or
        cannot be written."""
        values = self.get(dataset, PROPERTIES)
        if values["volblocksize"] not in ("-", ""):
            raise TargetError(f"zfs: {dataset} is a zvol, not a dataset zvols can be made in",
                              hint="name its parent dataset (e.g. rpool/data)")
        if not values["available"].isdigit():
            raise TargetError(f"zfs: {dataset} has no available bytes "
                              f"({values['available'][:40]!r})")
        pool = dataset.split("/")[0]
        line = next((p for p in self.pools() if p.name == pool), None)
        if line is None:
            raise TargetError(f"zfs: zpool list does not list the pool {pool}",
                              hint="zpool import it")
        if line.health not in ("ONLINE", "DEGRADED"):
            raise TargetError(f"zfs: pool {pool} is {line.health}: no zvol is made there")
        return ZfsFacts(dataset=dataset, available=int(values["available"]),
                        compression=values["compression"], sync=values["sync"],
                        primarycache=values["primarycache"], pool=line,
                        version=self.version())

    def listed(self, dataset: str) -> dict[str, str | None]:
        """Every zvol directly in ``dataset`` → its ``iomatrix:owner`` property (None: it has
        none): ``zfs list -H -o name,iomatrix:owner -t volume -d 1 DATASET``."""
        dataset_name(dataset)
        _, out, _ = self._run(self.zfs, "list", "-H", "-o", f"name,{OWNER_PROPERTY}", "-t",
                              "volume", "-d", "1", "--", dataset)
        found: dict[str, str | None] = {}
        for line in out.splitlines():
            name, _, owner = line.partition("\t")
            parent, _, leaf = name.rpartition("/")
            if parent == dataset and leaf:
                found[leaf] = None if owner in ("-", "") else owner
        return found

    def exists(self, dataset: str, name: str) -> bool:
        """Whether ``dataset/name`` exists and is a zvol."""
        code, out, _ = self._run(self.zfs, "list", "-H", "-o", "type", "--",
                                 zvol_name(dataset, name), check=False)
        return code == 0 and out.strip() == "volume"

    def volblocksize_of(self, dataset: str, name: str) -> int:
        """The volblocksize ZFS made the zvol with, read back."""
        values = self.get(zvol_name(dataset, name), ("volblocksize",))
        if not values["volblocksize"].isdigit():
            raise TargetError(f"zfs: {dataset}/{name} has no volblocksize: not a zvol")
        return int(values["volblocksize"])

    # -- making and removing ---------------------------------------------------------------
    def create(self, dataset: str, name: str, size: int, *, volblocksize: int, sparse: bool,
               owner: str = "") -> None:
        """``zfs create [-s] -b VOLBLOCKSIZE -V SIZE [-o iomatrix:owner=TAG] DATASET/NAME``
        (its block device: ``device``). ``size`` is ``volume_size``'s; ``owner``: the record's
        tag (``volumes.owner_tag``)."""
        full = zvol_name(dataset, name)
        volblocksize_bytes(volblocksize)
        assert size > 0 and size % volblocksize == 0, size
        argv = ["create", *(["-s"] if sparse else []), "-b", volblocksize_text(volblocksize),
                "-V", str(size)]
        if owner:
            assert _OWNER.fullmatch(owner), owner
            argv += ["-o", f"{OWNER_PROPERTY}={owner}"]
        code, out, err = self._run(self.zfs, *argv, "--", full, check=False)
        if code != 0:
            raise TargetError(f"zfs create {full}: {_last(err or out)}")

    def device(self, dataset: str, name: str) -> Path:
        """``/dev/zvol/DATASET/NAME`` once it is a block device (udev links it after
        ``zfs create``), else TargetError after ``LINK_TIMEOUT`` seconds."""
        path = ZVOL_ROOT / zvol_name(dataset, name)
        timeout = LINK_TIMEOUT
        deadline = time.monotonic() + timeout
        while True:
            try:
                if stat.S_ISBLK(os.stat(path).st_mode):
                    return path
            except OSError:
                pass
            if time.monotonic() >= deadline:
                raise TargetError(f"zfs: no block device {path} {timeout:.0f} s after "
                                  "zfs create (udev did not link the zvol)")
            time.sleep(0.1)

    def destroy(self, dataset: str, name: str) -> str:
        """``zfs destroy DATASET/NAME`` of a zvol iomatrix names (never ``-r``): removed, or
        gone when it no longer exists. A busy zvol is tried again for a few seconds, as
        pve-storage does; ToolFailed when it stays busy or zfs refuses."""
        full = zvol_name(dataset, name)
        for attempt in range(6):
            code, out, err = self._run(self.zfs, "destroy", "--", full, check=False)
            said = err or out
            if code == 0:
                return "removed"
            if "does not exist" in said:
                return "gone"
            if "busy" not in said or attempt == 5:
                raise ToolFailed(f"zfs destroy {full} failed (exit {code}): {_last(said)}",
                                 argv=[self.zfs, "destroy", full], returncode=code,
                                 output=said[-4000:])
            time.sleep(1)
        raise AssertionError("unreachable")


def check_space(facts: ZfsFacts, sizes: list[int], *, volblocksize: int, sparse: bool) -> None:
    """NotEnoughSpace, in one line, unless the dataset's available bytes hold the zvols of
    ``sizes`` (each ``volume_size``'s): their reservations, or for sparse zvols their sizes,
    which the run writes."""
    need = sum(s if sparse else reservation(s, volblocksize) for s in sizes)
    if need > facts.available:
        what = "sparse zvols grow to their size as the run writes them" if sparse else \
            "thick zvols reserve their size when made"
        raise NotEnoughSpace(
            f"zfs: {facts.dataset} has {format_bytes(facts.available)} available, the run's "
            f"{len(sizes)} zvol{'s' if len(sizes) != 1 else ''} need {format_bytes(need)} "
            f"({what})", hint="free space in the pool, or give a smaller [target] size")


def _last(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no message"


class ZfsBackend(Backend):
    """Zvols in a dataset (``[target] zfs``), made with ``Zfs`` (the module's docstring)."""

    resource_kind = KIND
    noun = "ZFS zvol"

    def __init__(self, pool: str, *, volblocksize: str | int = DEFAULT_VOLBLOCKSIZE,
                 sparse: bool = False, env: Mapping[str, str] | None = None) -> None:
        table = ZfsTarget(pool=pool, volblocksize=volblocksize, sparse=sparse)  # checked
        self.dataset = table.pool
        self.volblocksize = table.volblocksize_bytes
        self.sparse = table.sparse
        self._env = env
        self._tools: Zfs | None = None
        self.facts: ZfsFacts | None = None
        """What ``check`` read of the dataset (the run's host record and notes)."""

    @property
    def tools(self) -> Zfs:
        if self._tools is None:
            self._tools = Zfs(self._env)
        return self._tools

    @property
    def where(self) -> str:
        return f"ZFS dataset {self.dataset}"

    @property
    def spec(self) -> str:
        return self.dataset

    def connection(self) -> dict[str, Any]:
        return {"pool": self.dataset}

    def check(self, count: int, size: int) -> list[str]:
        self.facts = self.tools.facts(self.dataset)
        check_space(self.facts, [volume_size(size, self.volblocksize)] * count,
                    volblocksize=self.volblocksize, sparse=self.sparse)
        return [self.facts.note(self.volblocksize, self.sparse)]

    def create(self, name: str, size: int, tag: str) -> Path:
        """``zfs create``, then the zvol's device once udev links it and its volblocksize read
        back; a zvol made but not usable so is destroyed again before the error is raised."""
        self.tools.create(self.dataset, name, volume_size(size, self.volblocksize),
                          volblocksize=self.volblocksize, sparse=self.sparse, owner=tag)
        try:
            made = self.tools.volblocksize_of(self.dataset, name)
            if made != self.volblocksize:
                raise TargetError(f"{self.where}: zfs made {name} with volblocksize "
                                  f"{volblocksize_text(made)}, not the "
                                  f"{volblocksize_text(self.volblocksize)} asked")
            return self.tools.device(self.dataset, name)
        except BaseException:
            with contextlib.suppress(IomatrixError):
                self.tools.destroy(self.dataset, name)
            raise

    def remove(self, name: str) -> None:
        try:
            self.tools.destroy(self.dataset, name)
        except ToolFailed as exc:
            raise TargetError(f"{self.where}: {exc}") from exc

    def listed(self) -> dict[str, set[str]]:
        try:
            found = self.tools.listed(self.dataset)
        except (EnvironmentProblem, ToolFailed) as exc:
            raise TargetUnreachable(f"{self.where}: {exc}") from exc
        return {name: {owner} if owner else set() for name, owner in found.items()}

    def host_fields(self) -> dict[str, str]:
        """The dataset, and what ``check`` read of it (nothing more before)."""
        if self.facts is None:
            return {"target": self.where}
        return {"target": self.where, **self.facts.fields(self.volblocksize, self.sparse)}


def from_connection(data: dict[str, Any]) -> ZfsBackend:
    """The backend a store's record of a zvol names (``connection``), its dataset checked to
    the rules a suite's is; ``ValueError`` for one iomatrix does not write."""
    if set(data) != {"pool"} or not isinstance(data["pool"], str):
        raise ValueError("not a ZFS dataset's connection")
    return ZfsBackend(data["pool"])


def zfs_of_storage(storage: pve.Storage) -> dict[str, Any]:
    """A Proxmox VE zfspool storage as ``[target] zfs`` keys, as ZFSPoolPlugin makes a VM's
    zvols there: its ``pool``, ``blocksize`` (none: ZFS's own default, 16k since OpenZFS 2.2,
    which iomatrix gives explicitly) and ``sparse``."""
    if not storage.pool:
        raise ValueError(f"storage {storage.id} (zfspool) names no pool")
    table: dict[str, Any] = {"pool": storage.pool, "sparse": storage.sparse}
    if storage.blocksize:
        table["volblocksize"] = storage.blocksize
    return {"zfs": table}


class ZfsKind(VolumeKind):
    """``[target] zfs``: ZFS zvols (the module's docstring)."""

    keys = ("zfs",)
    tools = ("zfs", "zpool")
    resource = resource(KIND, "ZFS zvol", from_connection, ("pool",))
    storage_types = ("zfspool",)

    def of_storage(self, storage: pve.Storage, volume: str, pve_dir: Path, *,
                   mounted: Callable[[Path], bool] | None = None) -> dict[str, Any]:
        return zfs_of_storage(storage)

    def backend(self, target: Target) -> Backend:
        assert target.zfs is not None
        return ZfsBackend(target.zfs.pool, volblocksize=target.zfs.volblocksize,
                          sparse=target.zfs.sparse)

    def host_checks(self, probe: Probe) -> list[HostCheck]:
        """zfs and zpool on PATH, and the kernel's zfs module."""
        missing = [t for t in self.tools if probe.which(t) is None]
        module = (probe.sysfs / "module" / "zfs").exists()
        if missing:
            detail = f"{', '.join(missing)} not found on PATH: zfs targets cannot be measured"
        elif not module:
            detail = ("zfs and zpool are here, but the kernel has no zfs module "
                      "(/sys/module/zfs): no zvol can be made")
        else:
            detail = "zfs, zpool and the zfs module: zfs targets (zvols)"
        return [HostCheck(name="ZFS tools (zfs)", ok=not missing and module, detail=detail,
                          hint=HINT if missing or not module else None)]
