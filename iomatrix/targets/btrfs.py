"""``[target] btrfs = { path = "/mnt/btrfs", nocow = false }``: a btrfs subvolume, as Proxmox VE's
``btrfs`` storage gives each raw disk one of its own (pve-storage's BTRFSPlugin:
``images/VMID/vm-VMID-disk-N/`` holding ``disk.raw``; ``nocow 1`` sets the No_COW attribute).

A run is a directory target (``iomatrix.targets.workspace.Workspace``) whose private directory
is a subvolume: iomatrix makes one per run, ``iomatrix-<random>``, in ``path``, which must exist
and be on btrfs (refused in one line otherwise) and, with every directory above it, pass the
ownership checks of a [target] directory (``iomatrix.core.dirs``). The subvolume is made
relative to ``path`` held open (``btrfs subvolume create /proc/self/fd/N/NAME``), so that no
other user can swap a directory meanwhile; it is recorded as the run's image directory
(``workspace``) before it is made, then marked, made 0700 and, with ``nocow``, given the No_COW
attribute before any image is made in it (``FS_IOC_SETFLAGS``: the images inherit it). The
images are made in it as in any private directory (``O_EXCL``, ``O_NOFOLLOW``, qemu-img through
``/proc/self/fd``). At the end the subvolume is deleted (``btrfs subvolume delete``, relative to
its parent held open, once it is proved to be the one made), unless ``--keep``.

After ``kill -9`` the record is reclaimed, by ``iomatrix clean`` or the next run over ``path``
(``KindTable.image_directory``), as any image directory (``iomatrix.measure.reclaim``:
its marker, its owner, nothing mounted or open in it), which removes the emptied subvolume with
``rmdir`` (Linux 4.18 and later delete an empty subvolume so)."""

from __future__ import annotations

import fcntl
import os
import stat
import struct
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from iomatrix.core.dirs import walk, write_marker
from iomatrix.core.errors import NotEnoughSpace, TargetError, UnsafeDirectory
from iomatrix.core.mounts import MOUNTINFO, mount_of
from iomatrix.core.proc import require, run, signals_deferred
from iomatrix.core.trust import Author
from iomatrix.platform import proxmox as pve
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.target import KIND_KEYS, Target
from iomatrix.suite.volumes import BtrfsTarget
from iomatrix.targets.kind import HostCheck, OpenTarget, Probe, TargetKind
from iomatrix.targets.workspace import Workspace

SUBVOLUME_INODE = 256
"""BTRFS_FIRST_FREE_OBJECTID: the inode number of every subvolume's root directory."""
FS_IOC_GETFLAGS = 0x80086601
FS_IOC_SETFLAGS = 0x40086602
FS_NOCOW_FL = 0x00800000
"""linux/fs.h: the No_COW attribute (``chattr +C``)."""
HINT = "install it: apt-get install btrfs-progs"


class BtrfsWorkspace(Workspace):
    """The run's images in a subvolume of their own (the module's docstring)."""

    def __init__(self, target: Target, table: BtrfsTarget, *, keep: bool = False,
                 mountinfo: Path = MOUNTINFO) -> None:
        # a directory target over the path: its checks, space and images are the workspace's
        as_directory = Target.model_validate({
            **target.model_dump(exclude=set(KIND_KEYS), exclude_none=True),
            "directory": str(table.path)})
        super().__init__(as_directory, keep=keep)
        self.table = table
        self._mountinfo = mountinfo
        self._made_subvolume: os.stat_result | None = None

    def check(self, configs: Iterable[Configuration]) -> "BtrfsWorkspace":
        """The path exists and is on btrfs, then everything a directory target checks (its
        ownership, writability, free space for the images)."""
        path = self.table.path
        require("btrfs", hint=HINT)
        try:
            walked = walk(path)
        except UnsafeDirectory as exc:
            raise UnsafeDirectory(f"[target] btrfs {path}: {exc}") from exc
        except OSError as exc:
            raise TargetError(f"[target] btrfs {path}: cannot reach it: "
                              f"{exc.strerror or exc}") from exc
        os.close(walked.fd)
        if walked.missing:
            raise TargetError(f"[target] btrfs {path}: {walked.real / walked.missing[0]} does "
                              "not exist (iomatrix makes its subvolume in an existing directory "
                              "on btrfs)")
        mount = mount_of(walked.real, self._mountinfo)
        if mount is None or mount.fstype != "btrfs":
            on = f"{mount.fstype} ({mount.point})" if mount is not None else "no known mount"
            raise TargetError(f"[target] btrfs {path}: not on btrfs but on {on}",
                              hint="name a directory of a mounted btrfs filesystem, or measure "
                                   "it as [target] directory")
        try:
            super().check(configs)
        except TargetError as exc:          # worded for the directory target it checked
            raise type(exc)(str(exc).replace(f"[target] directory {path}",
                                             f"[target] btrfs {path}", 1),
                            hint="lower [target] size, or name a btrfs path with more free "
                                 "space" if isinstance(exc, NotEnoughSpace) else exc.hint
                            ) from None
        if not self.table.nocow:
            self.notes.append(
                f"btrfs {path} without nocow: Proxmox VE gives its disks no cache=none there "
                "(qemu-server passes no cache option, so QEMU's writeback applies)")
        return self

    def _make_private(self, fd: int, level: Path, name: str, marker: str | None) -> int:
        """A subvolume ``name`` made in ``level`` (open as ``fd``), recorded already: made,
        checked to be a subvolume, made 0700, marked and, with ``nocow``, given No_COW before
        anything is made in it; its descriptor."""
        btrfs = require("btrfs", hint=HINT)
        with signals_deferred():            # never left unmarked by a Ctrl-C in between
            done = run([btrfs, "subvolume", "create", f"/proc/self/fd/{fd}/{name}"],
                       timeout=60, check=False, pass_fds=(fd,))
            if done.returncode != 0:
                if os.path.lexists(f"/proc/self/fd/{fd}/{name}"):
                    raise FileExistsError(name)
                why = (done.stderr.strip() or done.stdout.strip()).splitlines()
                raise TargetError(f"[target] btrfs {self.table.path}: cannot create a subvolume: "
                                  f"{why[-1] if why else f'btrfs exited {done.returncode}'}")
            sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                          dir_fd=fd)
            try:
                info = os.fstat(sub)
                if info.st_ino != SUBVOLUME_INODE or info.st_uid != os.geteuid():
                    raise UnsafeDirectory(f"{level / name} is not the subvolume iomatrix made")
                os.fchmod(sub, 0o700)
                if marker is not None:
                    write_marker(sub, marker)
                if self.table.nocow:
                    set_nocow(sub)
            except BaseException:
                os.close(sub)
                raise
        self._made_subvolume = info
        return sub

    def _remove_private(self, directory: Path) -> None:
        """``btrfs subvolume delete`` of the subvolume made, relative to its parent held open,
        once its path is proved to be it; what cannot be deleted so is removed as a directory
        (an empty subvolume goes with ``rmdir``)."""
        made = self._made_subvolume
        try:
            walked = walk(directory.parent)
        except (OSError, TargetError):
            return
        try:
            now = os.lstat(directory.name, dir_fd=walked.fd)
            if (walked.missing or made is None or not stat.S_ISDIR(now.st_mode)
                    or (now.st_dev, now.st_ino) != (made.st_dev, made.st_ino)):
                return
            btrfs = require("btrfs", hint=HINT)
            held = f"/proc/self/fd/{walked.fd}/{directory.name}"
            done = run([btrfs, "subvolume", "delete", held], timeout=120, check=False,
                       pass_fds=(walked.fd,))
            if done.returncode != 0:
                super()._remove_private(Path(f"/proc/self/fd/{walked.fd}") / directory.name)
        except (OSError, TargetError):
            return
        finally:
            os.close(walked.fd)

    def host_fields(self) -> dict[str, str]:
        """The subvolume (or the path, before it is made), its filesystem with nocow, its
        mount and device."""
        where = self.directory or self.table.path
        fields = {"target": f"btrfs subvolume {where}",
                  "target_fs": "btrfs (nocow)" if self.table.nocow else "btrfs"}
        mount = mount_of(self.table.path, self._mountinfo)
        if mount is not None:
            fields.update(target_mount=mount.point, target_device=mount.source)
        return fields


def set_nocow(fd: int) -> None:
    """``chattr +C`` of the directory open as ``fd``: files made in it afterwards inherit
    No_COW."""
    flags = bytearray(8)
    fcntl.ioctl(fd, FS_IOC_GETFLAGS, flags, True)
    value = struct.unpack_from("=i", flags)[0] | FS_NOCOW_FL
    fcntl.ioctl(fd, FS_IOC_SETFLAGS, struct.pack("=i", value) + bytes(4))


def nocow(fd: int) -> bool:
    """Whether the file or directory open as ``fd`` has No_COW (``lsattr`` shows ``C``)."""
    flags = bytearray(8)
    fcntl.ioctl(fd, FS_IOC_GETFLAGS, flags, True)
    return bool(struct.unpack_from("=i", flags)[0] & FS_NOCOW_FL)


class BtrfsKind(TargetKind):
    """``[target] btrfs``: a subvolume per run on this host's btrfs (the module's docstring);
    a Proxmox VE ``btrfs`` storage id resolves into it, its images directory as ``path``."""

    keys = ("btrfs",)
    tools = ("btrfs",)
    cluster_load = False
    storage_types = ("btrfs",)

    def of_storage(self, storage: pve.Storage, volume: str, pve_dir: Path, *,
                   mounted: Callable[[Path], bool] | None = None) -> dict[str, Any]:
        if storage.path is None:
            raise ValueError(f"storage {storage.id} (btrfs) has no path in the storage.cfg given")
        images = Path(storage.path) / dict(storage.content_dirs).get("images", "images")
        return {"btrfs": {"path": str(images), "nocow": storage.nocow}}

    def host_checks(self, probe: Probe) -> list[HostCheck]:
        """btrfs-progs on PATH, and a kernel with btrfs: loaded or built in (/sys/fs/btrfs), or
        a module a mount would load (``modprobe -n``)."""
        tool = probe.which("btrfs")
        kernel = (probe.sysfs / "fs" / "btrfs").is_dir()
        if tool is not None and not kernel and (modprobe := probe.which("modprobe")) is not None:
            kernel = probe.run([modprobe, "-n", "-q", "btrfs"])[0] == 0
        if tool is None:
            detail = "btrfs not found on PATH: btrfs targets cannot be measured"
        elif not kernel:
            detail = ("btrfs-progs is here, but the kernel has no btrfs (no /sys/fs/btrfs, no "
                      "module): no subvolume can be made")
        else:
            version = probe.run([tool, "--version"])[1].strip()
            detail = f"{version or 'btrfs'} and the kernel's btrfs: btrfs targets (subvolumes)"
        return [HostCheck(name="btrfs tools (btrfs)", ok=tool is not None and kernel,
                          detail=detail,
                          hint="apt-get install btrfs-progs" if tool is None else
                          None if kernel else "a kernel with btrfs (CONFIG_BTRFS_FS)")]

    def open(self, target: Target, *, keep: bool, author: Author) -> OpenTarget:
        assert target.btrfs is not None
        return BtrfsWorkspace(target, target.btrfs, keep=keep)
