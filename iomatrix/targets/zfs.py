"""A ZFS zvol as a run's volume (``[target] zfs``), as Proxmox VE's zfspool storage makes its
VM disks (pve-storage's ZFSPoolPlugin): ``zfs create [-s] -b VOLBLOCKSIZE -V SIZE
POOL/NAME``, reached as the block device ``/dev/zvol/POOL/NAME`` (the link udev makes to
/dev/zdN), removed with ``zfs destroy``. This module is the ZFS tool layer: the commands, what
they print and what iomatrix reads from it.

- **Names.** The dataset a suite names (``pool = "rpool/data"``) and the volblocksize reach a
  root program: both are checked strictly (``dataset_name``, ``volblocksize_bytes``) before
  any command runs, and again on a name a store recorded before ``clean`` destroys it. A zvol
  iomatrix makes is named ``iomatrix-…`` (``PREFIX``) and carries the user property
  ``iomatrix:owner`` (``OWNER_PROPERTY``) with the marker of the record that made it;
  ``destroy`` refuses any other name, and a recorded zvol whose property is another record's
  is left where it is. ``zfs destroy`` is never given ``-r``.
- **Space.** A zvol is thick unless ``sparse`` (``-s``): ZFS reserves its size and some room
  for its metadata (``reservation``) when it is made. ``check_space`` compares what the run's
  zvols need with the dataset's ``available`` before anything is made (one line); a sparse
  zvol grows as the run writes it, so its size counts too.
- **What is recorded.** ``facts`` reads the dataset's ``compression``, ``sync`` and
  ``primarycache``, its ``available`` bytes, its pool's line of ``zpool list`` and the ZFS
  version (``zfs version``; else /sys/module/zfs/version): the run's host record and notes.

This host has no ZFS module and Debian has no zfsutils-linux in the archives iomatrix reaches:
the tests run this module against a stand-in of ``zfs`` and ``zpool``
(tests/fixtures/standins/zfs) that hands out loop devices. Nothing here has run against real
ZFS."""

from __future__ import annotations

import os
import re
import stat
import time
from collections.abc import Mapping
from pathlib import Path

from iomatrix.core.errors import NotEnoughSpace, TargetError, ToolFailed
from iomatrix.core.model import Frozen
from iomatrix.core.proc import require, run
from iomatrix.core.units import format_bytes

PREFIX = "iomatrix-"
"""The start of every zvol name iomatrix gives."""
OWNER_PROPERTY = "iomatrix:owner"
"""The ZFS user property holding the marker of the record that made a zvol."""
ZVOL_ROOT = Path("/dev/zvol")
"""Where udev links each zvol's device (/dev/zdN) by its name."""
PROPERTIES = ("available", "compression", "sync", "primarycache", "volblocksize")
"""What ``facts`` reads of the dataset (``zfs get -Hp``)."""
TIMEOUT = 120.0
"""Seconds a zfs or zpool command may take."""
LINK_TIMEOUT = 10.0
"""Seconds to wait for a new zvol's /dev/zvol link (pve-storage waits 10 s outside a task)."""
VOLBLOCKSIZE_MIN = 512
VOLBLOCKSIZE_MAX = 1 << 20
ALIGN = 1 << 20
"""A zvol's size is rounded up to a MiB (as pve-storage does) and to its volblocksize."""
HINT = ("install ZFS (Debian: zfsutils-linux from contrib, with the zfs-dkms module; Proxmox "
        "VE ships it)")
SYS_VERSION = Path("/sys/module/zfs/version")

_COMPONENT = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}"
_DATASET = re.compile(rf"^[A-Za-z][A-Za-z0-9_.-]{{0,99}}(?:/{_COMPONENT}){{0,15}}$")
_RESERVED_POOLS = re.compile(r"^(?:mirror|raidz\d?|draid\d?|spare|log|c\d.*)$")
_ZVOL = re.compile(rf"^{PREFIX}[A-Za-z0-9_.-]{{1,150}}$")
_VOLBLOCKSIZE = re.compile(r"^([1-9][0-9]{0,7})([kKmM]?)$")


def dataset_name(value: str) -> str:
    """``value`` as a ZFS dataset name iomatrix hands to zfs (``pool`` or ``pool/a/b``), or
    ValueError: letters, digits, ``_ . -``, components joined by ``/``, the pool's starting with
    a letter and no other's with ``-`` or ``.``, none a name zpool reserves; nothing ZFS or a
    shell reads as syntax (``@`` snapshots, ``#`` bookmarks, ``%``, blanks, ``:``)."""
    if not isinstance(value, str) or len(value) > 200 or not _DATASET.fullmatch(value):
        raise ValueError(f"{str(value)[:60]!r} is not a ZFS dataset name iomatrix accepts: "
                         "write pool or pool/dataset (letters, digits, _ . -, the pool "
                         "starting with a letter), e.g. \"rpool/data\"")
    parts = value.split("/")
    if _RESERVED_POOLS.match(parts[0]) or any(p in (".", "..") or p.startswith(".")
                                              for p in parts):
        raise ValueError(f"{value[:60]!r} is not a ZFS dataset name iomatrix accepts: "
                         f"{parts[0]!r} is a name zpool reserves, or a component starts with '.'")
    return value


def volblocksize_bytes(value: str | int) -> int:
    """The bytes of a volblocksize as a suite writes it (``"16k"``, ``"1M"``, ``"512"``, or a
    number of bytes): a power of two from 512 bytes to 1 MiB, else ValueError."""
    text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    found = _VOLBLOCKSIZE.fullmatch(text) if isinstance(text, str) else None
    if found is None:
        raise ValueError(f"volblocksize {str(value)[:30]!r}: write a power of two with an "
                         "optional k or M, e.g. \"16k\"")
    n = int(found.group(1)) << {"": 0, "k": 10, "m": 20}[found.group(2).lower()]
    if not VOLBLOCKSIZE_MIN <= n <= VOLBLOCKSIZE_MAX or n & (n - 1):
        raise ValueError(f"volblocksize {value!r}: a power of two from 512 to 1M "
                         "(4k, 8k, 16k, 64k, 128k...)")
    return n


def volblocksize_text(n: int) -> str:
    """``16384`` → ``16K``, as zfs prints it and is given it."""
    return f"{n >> 20}M" if n >= 1 << 20 else f"{n >> 10}K" if n >= 1024 else str(n)


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

    def fields(self) -> dict[str, str]:
        """The run's host record: these keys (``zfs.*``) beside the host's own."""
        return {"zfs.dataset": self.dataset, "zfs.compression": self.compression,
                "zfs.sync": self.sync, "zfs.primarycache": self.primarycache,
                "zfs.version": self.version, "zfs.pool_health": self.pool.health}

    def note(self, volblocksize: int, sparse: bool) -> str:
        """The run's note on the dataset, in one line."""
        return (f"zfs: zvols in {self.dataset} (pool {self.pool.name}, {self.pool.health}), "
                f"volblocksize {volblocksize_text(volblocksize)}, "
                f"{'sparse' if sparse else 'thick (refreservation = size)'}; dataset "
                f"compression={self.compression}, sync={self.sync}, primarycache="
                f"{self.primarycache}; {self.version}")


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

    def ours(self, dataset: str) -> list[str]:
        """The names of the zvols directly in ``dataset`` that iomatrix names (``PREFIX``)."""
        dataset_name(dataset)
        _, out, _ = self._run(self.zfs, "list", "-H", "-o", "name", "-t", "volume", "-d", "1",
                              "--", dataset)
        return [line.rsplit("/", 1)[1] for line in out.splitlines()
                if line.startswith(dataset + "/") and
                _ZVOL.fullmatch(line.rsplit("/", 1)[1] if "/" in line else "")]

    def owner(self, dataset: str, name: str) -> str | None:
        """The zvol's ``iomatrix:owner`` property; None when it has none (``-``), or when
        no such zvol exists (``exists`` tells the two apart)."""
        code, out, _ = self._run(self.zfs, "get", "-H", "-o", "value", "--", OWNER_PROPERTY,
                                 zvol_name(dataset, name), check=False)
        value = out.strip()
        return None if code != 0 or value in ("-", "") else value

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
               owner: str = "") -> Path:
        """``zfs create [-s] -b VOLBLOCKSIZE -V SIZE [-o iomatrix:owner=MARKER] DATASET/NAME``;
        the zvol's block device once udev has linked it (``device``). ``size`` is
        ``volume_size``'s."""
        full = zvol_name(dataset, name)
        volblocksize_bytes(volblocksize)
        assert size > 0 and size % volblocksize == 0, size
        argv = ["create", *(["-s"] if sparse else []), "-b", volblocksize_text(volblocksize),
                "-V", str(size)]
        if owner:
            argv += ["-o", f"{OWNER_PROPERTY}={owner_value(owner)}"]
        code, out, err = self._run(self.zfs, *argv, "--", full, check=False)
        if code != 0:
            raise TargetError(f"zfs create {full}: {_last(err or out)}")
        return self.device(dataset, name)

    def device(self, dataset: str, name: str, *, timeout: float = LINK_TIMEOUT) -> Path:
        """``/dev/zvol/DATASET/NAME`` once it is a block device (udev links it after
        ``zfs create``), else TargetError after ``timeout`` seconds."""
        path = ZVOL_ROOT / zvol_name(dataset, name)
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


def owner_value(marker: str) -> str:
    """A record's marker as one ZFS user property value (one line, printable, at most 500)."""
    return "".join(c if c.isprintable() and c not in "\t" else " " for c in
                   " ".join(marker.split()))[:500]


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
