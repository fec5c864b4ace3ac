"""The storage under test: safety checks, free space, image creation with qemu-img, clean-up.

iomatrix writes to what it measures. A block device is used only when the suite names it with
``allow_destroy = true`` and it is not mounted, not swap, has no holders (LVM, MD, dm-crypt) and
can be opened exclusively. A directory gets a private subdirectory that is removed at the end
unless the user asks to keep it.

A target directory is used only when nobody but root (or iomatrix's user) controls it or a
directory above it (``iomatrix.core.dirs``): another user could otherwise swap a directory
during the run and have root write an image's data through a symlink. Missing directories are
made 0700; the private directory is made exclusively and held open, and each image is created in
it relative to that descriptor (``O_EXCL``, ``O_NOFOLLOW``), qemu-img writing it through the
descriptor. The programs that open an image by its path later (fio, QEMU, ioping) are checked
before and after (``verify``): the path must still name the file iomatrix made.

Everything is checked (``check``) before anything is created (``create``), so that a refusal
leaves nothing behind, not even a stored run. ``create`` names each directory to its ``record``
callback before making it: a process killed at any moment leaves nothing unrecorded, and what
was recorded can be removed later (``iomatrix.measure.reclaim``)."""

from __future__ import annotations

import errno
import os
import secrets
import shutil
import stat
from collections.abc import Callable, Iterable
from typing import Any
from pathlib import Path

from iomatrix.core.dirs import (Walked, make_private, parent_marker, remove_empty, same_file,
                                walk)
from iomatrix.core.errors import NotEnoughSpace, TargetError, UnsafeDirectory
from iomatrix.core.mounts import MOUNTINFO, mount_of, mounts
from iomatrix.core.proc import require, run
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.fields import uses_page_cache
from iomatrix.suite.target import Target
from iomatrix.core.trust import Author
from iomatrix.platform import proxmox as pve
from iomatrix.targets.kind import Image, OpenTarget, Recorder, TargetKind
from iomatrix.core.units import format_bytes

SYSFS = Path("/sys")
QCOW2_OVERHEAD = 1.01  # L1/L2 tables and refcounts stay well under 1 % at 64 KiB clusters
MARGIN = 64 * 1024 * 1024
RAM_FILESYSTEMS = ("tmpfs", "ramfs")
"""Filesystems held in memory: a target there measures RAM, not storage."""
PREFIX = "iomatrix-"
"""The name of every image directory iomatrix creates in a target directory begins so."""

def image_spec(config: Configuration) -> tuple[str, str]:
    """Which image a configuration needs: (format, preallocation); host mode uses raw."""
    return (config.format or "raw", config.preallocation or "off")


def image_specs(configs: Iterable[Configuration]) -> set[tuple[str, str, int]]:
    """Every image the configurations need: one per (format, preallocation) and guest index."""
    return {(*image_spec(c), i) for c in configs for i in range(c.vms or 1)}


class Workspace(OpenTarget):
    """The target prepared for one run: creates images on demand, removes them on exit."""

    def __init__(self, target: Target, *, keep: bool = False, proc_root: Path = Path("/proc"),
                 sysfs: Path = SYSFS, record: Recorder | None = None) -> None:
        self.target = target
        self.keep = keep
        self._proc = proc_root
        self._sysfs = sysfs
        self._images: dict[tuple[str, str], Image] = {}
        self.preconditioned: set[Path] = set()
        self.directory: Path | None = None
        """The run's private directory once created (its real path)."""
        self._fd: int | None = None
        """The private directory, held open: images are created relative to it."""
        self._made: dict[Path, os.stat_result] = {}
        """Each image created, as it was made (``verify``)."""
        self.device_size: int | None = None
        self.notes: list[str] = []
        """Warnings found by ``check`` (see target_notes), for the run's notes."""
        self.record = record
        self.image_size: int | None = None
        """Each image's size once ``check`` has sized it: [target] size, or with
        ``working_set = "exceed-ram"`` twice the host's RAM (``working_set_size``)."""

    # -- lifecycle -------------------------------------------------------------------------
    def open(self, configs: Iterable[Configuration]) -> "Workspace":
        """``check``, then ``create``."""
        return self.check(configs).create()

    def check(self, configs: Iterable[Configuration]) -> "Workspace":
        """Check safety, writability and free space for every image the configurations need;
        create nothing."""
        configs = list(configs)
        specs = sorted(image_specs(configs))
        wanted = working_set_size(self.target, memory_total(self._proc / "meminfo"))
        if self.target.device is not None:
            self.device_size = check_device(self.target.device, proc_root=self._proc,
                                            sysfs=self._sysfs)
            if wanted is not None and wanted > self.device_size:
                raise TargetError(
                    f"[target] working_set = \"exceed-ram\": the device {self.target.device} "
                    f"({format_bytes(self.device_size)}) is smaller than twice the host's RAM "
                    f"({format_bytes(wanted)}), so the page cache could hold what is measured",
                    hint="use a larger device, or drop working_set to measure as sized")
            if self.target.size is not None and self.target.size > self.device_size:
                raise TargetError(f"[target] size {format_bytes(self.target.size)} exceeds the "
                                  f"device {self.target.device} ({format_bytes(self.device_size)})")
            self.image_size = wanted if wanted is not None else (self.target.size
                                                                 or self.device_size)
            self.notes = page_cache_notes(self.target, configs, self.image_size,
                                          memory_total(self._proc / "meminfo"))
            return self
        assert self.target.directory is not None
        self.image_size = wanted if wanted is not None else self.target.size
        assert self.image_size is not None
        self.notes = [*target_notes(self.target, mountinfo=self._proc / "self/mountinfo"),
                      *page_cache_notes(self.target, configs, self.image_size,
                                        memory_total(self._proc / "meminfo"))]
        parent = self.target.directory
        walked = _walk(parent)
        os.close(walked.fd)
        existing = walked.real
        if not _writable(existing):
            raise TargetError(f"[target] directory {parent}: {existing} is not writable "
                              "(read-only, or not ours)")
        need = images_footprint(specs, self.image_size) + MARGIN
        free = shutil.disk_usage(existing).free
        if free < need:
            if wanted is not None:
                raise NotEnoughSpace(
                    f"[target] directory {parent}: {format_bytes(free)} free, but working_set = "
                    f"\"exceed-ram\" needs {len(specs)} image(s) of twice the host's RAM "
                    f"({format_bytes(self.image_size)} each), {format_bytes(need)} in all",
                    hint="point --target at a larger filesystem, measure fewer formats and "
                         "preallocations at once, or drop working_set to measure as sized")
            raise NotEnoughSpace(
                f"[target] directory {parent}: {format_bytes(free)} free, "
                f"{len(specs)} image(s) of {format_bytes(self.target.size or 0)} need {format_bytes(need)}",
                hint="lower [target] size, or point --target at a larger filesystem")
        return self

    def create(self) -> "Workspace":
        """Create the target directory if need be (mode 0700), and the run's private directory
        in it (nothing on a device). Each is named to ``record`` before it is made."""
        if self.target.device is not None:
            return self
        assert self.target.directory is not None
        for _ in range(3):
            try:
                self._fd = self._create(self.target.directory)
                return self
            except _Vanished:       # another run removed the (empty) target directory meanwhile
                continue
        raise TargetError(f"[target] directory {self.target.directory}: removed again and again "
                          "as this run made its directory in it")

    def _create(self, parent: Path) -> int:
        walked = _walk(parent)
        fd, level = walked.fd, walked.real
        try:
            for name in walked.missing:
                level = level / name
                self._record("parent", level)
                try:
                    inner, _ = make_private(fd, level.parent, name, reuse=True,
                                            marker=parent_marker(level))
                except UnsafeDirectory as exc:      # another user made it first
                    raise UnsafeDirectory(f"[target] directory {parent}: {exc}") from exc
                except FileNotFoundError as exc:
                    raise _Vanished() from exc
                except OSError as exc:
                    raise TargetError(f"[target] directory {parent}: cannot create {level}: "
                                      f"{exc.strerror}") from exc
                os.close(fd)
                fd = inner
            return self._private(fd, level, parent)
        finally:
            os.close(fd)

    @property
    def directory_fd(self) -> int:
        """The private directory, held open (``O_PATH``): create files in it relative to it."""
        assert self._fd is not None, "Workspace.create() first"
        return self._fd

    def _private(self, fd: int, level: Path, parent: Path) -> int:
        """Make the run's private directory in ``level`` (open as ``fd``), marked as the
        recorder says; its descriptor."""
        for _ in range(100):
            directory = level / f"{PREFIX}{secrets.token_hex(4)}"
            marker = self._record("workspace", directory)
            try:
                private = self._make_private(fd, level, directory.name, marker)
            except FileExistsError:
                continue
            except FileNotFoundError as exc:
                raise _Vanished() from exc
            except OSError as exc:
                raise TargetError(f"[target] directory {parent}: not writable: "
                                  f"{exc.strerror}") from exc
            self.directory = directory
            return private
        raise TargetError(f"[target] directory {parent}: cannot create a private directory")

    def _make_private(self, fd: int, level: Path, name: str, marker: str | None) -> int:
        """Make the run's private directory ``name`` in ``level`` (open as ``fd``), marked,
        exclusively (``FileExistsError`` when the name is taken); its descriptor. A kind whose
        private directory is something else (a btrfs subvolume: ``iomatrix.targets.btrfs``)
        makes it here."""
        return make_private(fd, level, name, reuse=False, marker=marker)[0]

    def _remove_private(self, directory: Path) -> None:
        """Remove the run's private directory and what it holds (``close``)."""
        shutil.rmtree(directory, ignore_errors=True)

    def _record(self, kind: str, path: Path) -> str | None:
        if self.record is None:
            return None
        real = Path(os.path.realpath(path))
        return self.record(kind, real, real.parent)

    def close(self) -> None:
        """Remove everything created, unless keep was asked for."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self.keep:
            return
        if self.directory is not None:
            self._remove_private(self.directory)
            self.directory = None
        if self.target.directory is not None:
            _remove_up(Path(os.path.realpath(self.target.directory)))

    def storage_of(self, config: Configuration) -> Path:
        """What holds the configuration's images: the device, or the target directory (or its
        nearest existing parent), for the host's disk telemetry."""
        return self.target.device or nearest_existing(self.target.directory)  # type: ignore[arg-type]

    def __enter__(self) -> "Workspace":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- images ----------------------------------------------------------------------------
    @property
    def size(self) -> int:
        if self.image_size is not None:
            return self.image_size
        if self.target.size is not None:
            return self.target.size
        assert self.device_size is not None
        return self.device_size

    def image(self, config: Configuration, index: int = 0) -> Image:
        """The image for a configuration (guest ``index``), created with qemu-img on first use."""
        spec = (*image_spec(config), index)
        if spec in self._images:
            return self._images[spec]
        if self.target.device is not None:
            image = Image(path=self.target.device, format="raw", preallocation="off",
                          size=self.size, is_device=True)
        else:
            assert self.directory is not None and self._fd is not None, "Workspace.open() first"
            fmt, prealloc, _ = spec
            suffix = f"-vm{index}" if index else ""
            name = f"disk-{fmt}-{prealloc}{suffix}.{'qcow2' if fmt == 'qcow2' else 'raw'}"
            fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600, dir_fd=self._fd)
            try:
                # qemu-img writes the file iomatrix just made, through the descriptor it inherits
                run([require("qemu-img"), "create", "-q", "-f", fmt, "-o",
                     f"preallocation={prealloc}", f"/proc/self/fd/{fd}", str(self.size)],
                    timeout=max(60.0, self.size / 50e6), pass_fds=(fd,))
                path = self.directory / name
                self._made[path] = os.fstat(fd)
            finally:
                os.close(fd)
            image = Image(path=path, format=fmt, preallocation=prealloc, size=self.size)
        self._images[spec] = image
        return image

    def verify(self, images: Iterable[Image]) -> None:
        """Check that each image's path still names the file iomatrix made (programs open it by
        path): a ``TargetError`` when something else is there now."""
        for image in images:
            made = self._made.get(image.path)
            if made is None:
                continue
            try:
                now = os.lstat(image.path)
            except OSError as exc:
                raise TargetError(f"the image {image.path} is gone ({exc.strerror}): something "
                                  "else changed the run's private directory") from exc
            if not stat.S_ISREG(now.st_mode) or not same_file(now, made):
                raise TargetError(f"{image.path} is no longer the image iomatrix made (replaced "
                                  "or moved): the run stops rather than write through it",
                                  hint="make sure nobody but root can write to the target "
                                       "directory or the directories above it")


class _Vanished(Exception):
    """The directory held open was removed (an empty target directory, by another run)."""


def target_notes(target: Target, *, mountinfo: Path = MOUNTINFO) -> list[str]:
    """Warnings about the target for the run's notes (shown and stored with the run): a
    directory on tmpfs or ramfs measures memory, unless the suite says so with
    ``allow_tmpfs = true``."""
    if target.directory is None or target.allow_tmpfs:
        return []
    try:
        mount = mount_of(nearest_existing(target.directory), mountinfo)
    except OSError:
        return []
    if mount is None or mount.fstype not in RAM_FILESYSTEMS:
        return []
    return [f"[target] directory {target.directory} is on {mount.fstype} ({mount.point}): the "
            "images live in RAM, so every figure measures memory, not storage; point [target] "
            "(or --target) at the storage to measure, or set [target] allow_tmpfs = true if "
            "RAM is what you mean to measure"]


def memory_total(meminfo: Path = Path("/proc/meminfo")) -> int:
    """The host's RAM (MemTotal) in bytes; 0 when /proc/meminfo cannot be read."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


RAM_FACTOR = 2
"""An image past the page cache: at least this many times the host's RAM."""


def working_set_size(target: Target, memory: int) -> int | None:
    """With ``working_set = "exceed-ram"``: each image's size, twice the host's RAM (or [target]
    size when larger), rounded up to a MiB; None otherwise. An error when RAM is unknown."""
    if target.working_set != "exceed-ram":
        return None
    if memory <= 0:
        raise TargetError("[target] working_set = \"exceed-ram\": the host's RAM is unknown "
                          "(/proc/meminfo has no MemTotal), so the images cannot be sized past it")
    mib = 1 << 20
    return max(target.size or 0, -(-RAM_FACTOR * memory // mib) * mib)


def page_cache_notes(target: Target, configs: Iterable[Configuration], image_size: int,
                     memory: int) -> list[str]:
    """The warning, for ``run --plan`` and the run's notes, that configurations reading through
    the host page cache would measure RAM: their images are smaller than twice the host's RAM
    and the suite did not say so on purpose (``working_set = "in-ram"``)."""
    if target.working_set != "size" or memory <= 0 or image_size >= RAM_FACTOR * memory:
        return []
    cached = sorted({str(c.cache) for c in configs if uses_page_cache(c.mode, c.params())})
    if not cached:
        return []
    return [f"page cache: the images ({format_bytes(image_size)}) are smaller than twice the "
            f"host's RAM ({format_bytes(memory)}), so with cache={'/'.join(cached)} reads can be "
            "served from RAM and writes absorbed by it; such figures measure memory, not "
            "storage (show marks them [RAM]). Set [target] working_set = \"exceed-ram\" to size "
            "the images past RAM, or working_set = \"in-ram\" if RAM is what you mean to measure"]


def plan_lines(target: Target, configs: Iterable[Configuration], *,
               meminfo: Path = Path("/proc/meminfo")) -> list[str]:
    """What ``run --plan`` says about the working set: the page-cache warning, or how large
    ``working_set = "exceed-ram"`` makes the images and whether the target can hold them."""
    configs = list(configs)
    memory = memory_total(meminfo)
    try:
        wanted = working_set_size(target, memory)
    except TargetError as exc:
        return [f"refused: {exc}"]
    if wanted is None:
        size = target.size
        if size is None:
            return []        # a whole device: its size is known only when the run checks it
        return page_cache_notes(target, configs, size, memory)
    specs = sorted(image_specs(configs))
    need = images_footprint(specs, wanted)
    line = (f"working_set = \"exceed-ram\": {len(specs)} image(s) of {format_bytes(wanted)} "
            f"(twice this host's RAM, {format_bytes(memory)}), each written fully once "
            f"(preconditioning) before it is measured")
    if target.directory is not None:
        free = shutil.disk_usage(nearest_existing(target.directory)).free
        line += f"; {format_bytes(need)} needed, {format_bytes(free)} free"
        if free < need + MARGIN:
            line += " — the run will refuse: not enough space"
    return [line]


def _walk(directory: Path) -> Walked:
    """``core.dirs.walk`` of a target directory, its refusals worded for the target."""
    try:
        return walk(directory)
    except UnsafeDirectory as exc:
        raise UnsafeDirectory(f"[target] directory {directory}: {exc}") from exc
    except NotADirectoryError as exc:
        raise TargetError(f"[target] directory {directory}: {exc.filename} is not a "
                          "directory") from exc
    except OSError as exc:
        raise TargetError(f"[target] directory {directory}: cannot reach it: "
                          f"{exc.strerror}") from exc


def _writable(directory: Path) -> bool:
    """Whether this process may create files in ``directory`` (a read-only filesystem says no,
    even to root)."""
    return os.access(directory, os.W_OK | os.X_OK)


def nearest_existing(path: Path) -> Path:
    """``path`` itself, or its closest ancestor that exists (a target not created yet)."""
    while not path.exists():
        path = path.parent
    return path


def footprint(size: int, fmt: str) -> int:
    """Bytes an image of ``size`` occupies once preconditioned (written fully)."""
    return int(size * QCOW2_OVERHEAD) if fmt == "qcow2" else size


def images_footprint(specs: Iterable[tuple[str, str, int]], size: int) -> int:
    """Bytes the images of ``specs`` (``image_specs``), each of ``size``, occupy once
    preconditioned."""
    return sum(footprint(size, fmt) for fmt, _, _ in specs)


def _remove_up(path: Path) -> None:
    """Remove ``path`` and its parents in turn while each holds nothing but the marker iomatrix
    wrote when it made it (``core.dirs.remove_empty``), whichever run made it: the last run over
    a target directory that several made removes it."""
    current = path
    while current != current.parent:
        try:
            walked = walk(current.parent)
        except (OSError, TargetError):
            return
        try:
            if walked.missing or remove_empty(walked.fd, current.name,
                                              parent_marker(current)) is not None:
                return
        finally:
            os.close(walked.fd)
        current = current.parent


def check_device(device: Path, *, proc_root: Path = Path("/proc"), sysfs: Path = SYSFS) -> int:
    """Refuse a block device that is not safe to destroy; return its size in bytes."""
    try:
        st = os.stat(device)
    except OSError as exc:
        raise TargetError(f"[target] device {device}: {exc.strerror}") from exc
    if not stat.S_ISBLK(st.st_mode):
        raise TargetError(f"[target] device {device}: not a block device")
    major, minor = os.major(st.st_rdev), os.minor(st.st_rdev)
    block = _sysfs_block(major, minor, sysfs)
    names = {f"{major}:{minor}"}
    if block is not None:
        for part in block.iterdir():
            dev_file = part / "dev"
            if (part / "partition").exists() and dev_file.exists():
                names.add(dev_file.read_text().strip())
                holders = list((part / "holders").iterdir()) if (part / "holders").exists() else []
                if holders:
                    raise TargetError(f"[target] device {device}: partition {part.name} is held by "
                                      f"{', '.join(h.name for h in holders)} (LVM, MD or dm-crypt)")
        holders = list((block / "holders").iterdir()) if (block / "holders").exists() else []
        if holders:
            raise TargetError(f"[target] device {device}: in use by "
                              f"{', '.join(h.name for h in holders)} (LVM, MD or dm-crypt)")
    for mount in mounts(proc_root / "self/mountinfo"):
        if mount.device in names:
            raise TargetError(f"[target] device {device}: mounted at {mount.point}",
                              hint="unmount it first; iomatrix never writes to a mounted device")
    swaps = (proc_root / "swaps").read_text().splitlines()[1:] if (proc_root / "swaps").exists() else []
    real = os.path.realpath(device)
    for line in swaps:
        if line.split() and os.path.realpath(line.split()[0]) == real:
            raise TargetError(f"[target] device {device}: in use as swap")
    try:
        fd = os.open(device, os.O_RDONLY | os.O_EXCL)
    except OSError as exc:
        if exc.errno == errno.EBUSY:
            raise TargetError(f"[target] device {device}: busy (cannot be opened exclusively; "
                              "another process or the kernel holds it)") from exc
        raise TargetError(f"[target] device {device}: cannot open: {exc.strerror}") from exc
    try:
        return os.lseek(fd, 0, os.SEEK_END)
    finally:
        os.close(fd)


def _sysfs_block(major: int, minor: int, sysfs: Path) -> Path | None:
    link = sysfs / "dev/block" / f"{major}:{minor}"
    return link.resolve() if link.exists() else None


def directory_of_storage(storage: pve.Storage, mounted: Callable[[Path], bool] | None) -> Path:
    """A Proxmox VE dir, nfs or cifs storage's images directory: ``<path>/images`` or its
    ``content-dirs`` images entry; nfs and cifs at /mnt/pve/ID unless path says, as
    pve-storage's plugins mount them, which ``mounted(path)`` checks when given."""
    ident = storage.id
    path = storage.path or (f"/mnt/pve/{ident}" if storage.type != "dir" else None)
    if path is None:
        raise ValueError(f"storage {ident} (dir) has no path in the storage.cfg given")
    if storage.type != "dir" and mounted is not None and not mounted(Path(path)):
        raise ValueError(f"storage {ident} ({storage.type}): {path} is not mounted "
                         "(Proxmox VE mounts it while the storage is active: pvesm status)")
    return Path(path) / dict(storage.content_dirs).get("images", "images")


class LocalKind(TargetKind):
    """``[target] directory`` or ``device``: storage this host holds (the module's docstring);
    what a killed run left there is the directories ``iomatrix.measure.reclaim`` removes."""

    keys = ("directory", "device")
    storage_types = ("dir", "nfs", "cifs")

    def of_storage(self, storage: pve.Storage, volume: str, pve_dir: Path, *,
                   mounted: Callable[[Path], bool] | None = None) -> dict[str, Any]:
        return {"directory": str(directory_of_storage(storage, mounted))}

    def open(self, target: Target, *, keep: bool, author: Author) -> OpenTarget:
        return Workspace(target, keep=keep)
