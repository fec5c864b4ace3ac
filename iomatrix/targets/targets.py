"""Several targets in one run ([[targets]], or [target] filesystems): each configuration is
measured on each, and each target is prepared as a ``Workspace`` of its own. A target that asks
for a filesystem its directory is not on gets one made by iomatrix on a loop device
(``LoopFilesystem``):

- the backing file is created (exclusively, mode 0600) in the run's private directory on the
  target (mode 0700, recorded before it is made: ``Workspace.create``) after a free-space check
  of everything the run puts on that filesystem, and fully allocated, so that the filesystem's
  writes do not allocate space beneath it while they are measured;
- mkfs runs on that file, never on a device: without discard (which would punch the allocation
  back out of the file), and for ext4 with its inode tables and journal written at once (no
  lazy initialisation writing in the background while trials run);
- the loop device uses direct I/O (``loops.attach``), or its reads and writes would go through
  the host page cache and the figures measure RAM (a note says so when the kernel refuses);
- the filesystem is mounted inside the run's private directory, in a mount namespace of the
  run's own (``core.mounts.PrivateMounts``): no other process sees it and it propagates nowhere;
  ``losetup -d`` right after the mount makes the loop device detach itself once unmounted;
- at the end, and on Ctrl-C: unmounted, detached, deleted. After ``kill -9`` the kernel unmounts
  it with the namespace once the last process in it has ended, the loop device detaches itself,
  and the next run over that target or ``iomatrix clean`` removes the directory with the file,
  detaching a loop device that a kill between attach and mount left (found by its backing file:
  ``iomatrix.measure.reclaim``).

A filesystem that cannot be made here (no mkfs, no kernel support, not root) is skipped with a
note when [target] filesystems lists it, and refuses the run when a [[targets]] table asks for
it: a list says "these, where the host allows", a table names a target the user relies on."""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import time
from collections.abc import Iterable
from pathlib import Path

from iomatrix.core.errors import IomatrixError, NotEnoughSpace, TargetError
from iomatrix.core.model import Frozen
from iomatrix.core.mounts import (MOUNTINFO, NOT_A_MOUNT, PrivateMounts, is_mounted, mount_of,
                                  mounts, root_is_a_mount)
from iomatrix.core.proc import require, run, which
from iomatrix.core.units import format_bytes
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.model import Suite
from iomatrix.suite.target import NamedTarget, Target
from iomatrix.targets import loops
from iomatrix.targets.kind import OpenTarget
from iomatrix.targets.workspace import (MARGIN, Image, Recorder, Workspace, image_specs,
                                       images_footprint, memory_total, nearest_existing,
                                       page_cache_notes, working_set_size)

MKFS: dict[str, tuple[tuple[str, ...], str]] = {
    "ext4": (("mkfs.ext4", "-q", "-F", "-E", "nodiscard,lazy_itable_init=0,lazy_journal_init=0"),
             "e2fsprogs"),
    "xfs": (("mkfs.xfs", "-q", "-f", "-K"), "xfsprogs"),
    "btrfs": (("mkfs.btrfs", "-q", "-f", "-K"), "btrfs-progs"),
}
"""Filesystem → (mkfs command without the file, the Debian package that has it)."""
MIN_SIZE = {"ext4": 64 << 20, "xfs": 300 << 20, "btrfs": 256 << 20}
"""The smallest filesystem each mkfs makes (xfsprogs refuses below 300 MB)."""
RESERVE = 256 << 20
"""Room for a made filesystem's own metadata (journal or log, inode tables, btrfs's duplicated
metadata chunks) beyond the images; plus 1/16 of their size."""
DETACH_WAIT = 10.0
"""Seconds to wait for a loop device to detach itself after its filesystem is unmounted."""
FILESYSTEMS = Path("/proc/filesystems")


class TargetPlan(Frozen):
    """How one target of a run is provided on this host, decided before anything is made."""

    target: NamedTarget
    on: str | None = None
    """The filesystem the target directory is on (None for a device, or when unknown)."""
    make: str | None = None
    """The filesystem iomatrix makes on a loop device for it; None: the directory or device
    itself is measured."""
    problem: str | None = None
    """Why it cannot be measured here; None when it can."""
    required: bool = True
    """A [[targets]] table (a problem refuses the run), not a [target] filesystems entry (a
    problem skips it)."""

    @property
    def name(self) -> str:
        return self.target.name

    def describe(self, size: int | None = None) -> str:
        """One line on where the target's images live, for the plan and the run's notes."""
        t = self.target
        if t.device is not None:
            return f"target {self.name}: the block device {t.device}"
        on = f" ({self.on})" if self.on else ""
        if self.make is None:
            return f"target {self.name}: {t.directory}{on}"
        made = f"a {format_bytes(size)} file" if size else "a file"
        return (f"target {self.name}: {self.make} made by iomatrix on a loop device (direct I/O) "
                f"over {made} in {t.directory}{on}; its figures include the loop device and the "
                f"{self.on or 'filesystem'} beneath it")


def plan_targets(suite: Suite, *, mountinfo: Path = MOUNTINFO,
                 filesystems: Path = FILESYSTEMS) -> tuple[TargetPlan, ...]:
    """Each named target of ``suite`` (``Suite.named_targets``) as this host would provide it."""
    plans = []
    for target in suite.named_targets:
        plan = TargetPlan(target=target, required=bool(suite.targets))
        if target.directory is not None:
            with contextlib.suppress(OSError):
                mount = mount_of(nearest_existing(target.directory), mountinfo)
                plan = plan.model_copy(update={"on": mount.fstype if mount else None})
        if target.filesystem is not None and target.filesystem != plan.on:
            problem = _cannot_make(target.filesystem, filesystems)
            if problem is None and suite.method.libvirt_uri is not None:
                problem = ("libvirtd's guests cannot reach a filesystem iomatrix mounts in its "
                           "own mount namespace (drop libvirt_uri to run the guests with "
                           "libvirt's block graph on iomatrix's QEMU)")
            plan = plan.model_copy(update={"make": target.filesystem, "problem": problem})
        plans.append(plan)
    return tuple(plans)


def _cannot_make(fs: str, filesystems: Path) -> str | None:
    """Why this host cannot make and mount ``fs`` on a loop device; None when it can."""
    if os.geteuid() != 0:
        return f"making {fs} on a loop device needs root"
    command, package = MKFS[fs]
    if which(command[0]) is None:
        return f"{command[0]} not found (apt-get install {package})"
    for tool in ("losetup", "mount", "umount"):
        if which(tool) is None:
            return f"{tool} not found (apt-get install mount)"
    if not Path("/dev/loop-control").exists():
        return "this host has no loop devices (/dev/loop-control is missing)"
    if not root_is_a_mount():
        return NOT_A_MOUNT
    try:
        known = {line.split()[-1] for line in filesystems.read_text().splitlines() if line.split()}
    except OSError:
        known = set()
    modules = Path("/lib/modules") / platform.release() / "kernel/fs" / fs
    if fs not in known and not any(modules.glob(f"{fs}.ko*")):
        return f"the kernel has no {fs} support (not in {filesystems}, no module)"
    return None


def filesystem_size(fs: str, footprint: int) -> int:
    """The size of a filesystem made to hold images occupying ``footprint`` bytes, whole MiB."""
    mib = 1 << 20
    size = max(MIN_SIZE[fs], footprint + footprint // 16 + RESERVE + MARGIN)
    return -(-size // mib) * mib


class LoopFilesystem:
    """A filesystem made on a loop device over a file in ``directory`` (the run's private
    directory on the target, held open as ``dir_fd``), mounted at ``directory / fs``. See the
    module's docstring."""

    def __init__(self, directory: Path, fs: str, size: int, *, dir_fd: int) -> None:
        self.fs = fs
        self.size = size
        self.file = directory / f"{fs}.img"
        self.mountpoint = directory / fs
        self.loop: loops.Loop | None = None
        self._mounted = False
        self._dir_fd = dir_fd

    def create(self) -> "LoopFilesystem":
        """Allocate the file, make the filesystem, attach and mount it (in the caller's mount
        namespace: ``PrivateMounts``)."""
        fd = os.open(self.file.name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                     | os.O_CLOEXEC, 0o600, dir_fd=self._dir_fd)
        try:
            try:
                os.posix_fallocate(fd, 0, self.size)
            except OSError as exc:
                raise TargetError(f"cannot allocate {format_bytes(self.size)} for the {self.fs} "
                                  f"filesystem in {self.file.parent}: {exc.strerror}") from exc
            command, _ = MKFS[self.fs]
            # mkfs writes the file iomatrix just made, through the descriptor it inherits
            run([require(command[0]), *command[1:], f"/proc/self/fd/{fd}"],
                timeout=max(120.0, self.size / 50e6), pass_fds=(fd,))
            made = os.fstat(fd)
        finally:
            os.close(fd)
        self.loop = loops.attach(self.file, made)
        os.mkdir(self.mountpoint.name, 0o700, dir_fd=self._dir_fd)
        run([require("mount"), "-t", self.fs, self.loop.device, str(self.mountpoint)],
            timeout=120)
        self._mounted = True
        loops.detach(self.loop.device)         # mounted: it detaches itself once unmounted
        return self

    def close(self) -> None:
        """Unmount (lazily when still busy) and see the loop device detached."""
        if self._mounted and is_mounted(self.mountpoint):
            done = run([require("umount"), str(self.mountpoint)], timeout=120, check=False)
            if done.returncode != 0:
                run([require("umount"), "-l", str(self.mountpoint)], timeout=60, check=False)
        self._mounted = False
        # always, not only once attach() returned: losetup may have attached the file before
        # attach() raised (its check of the kernel's view failed), and the device is then ours
        release_loops(self.file.parent)
        self.loop = None


def release_loops(directory: str | os.PathLike[str], *,
                  mountinfo: Path = MOUNTINFO) -> list[loops.Loop]:
    """Unmount (lazily) what this process sees mounted from the loop devices over files in
    ``directory``, detach those devices, and wait a while for the ones still in use to detach
    themselves; the devices that were there. A device still held when this returns (a process
    of a killed run still has the filesystem open) detaches itself once that process ends."""
    found = loops.backed_in(directory)
    if not found:
        return []
    devices = {loop.device for loop in found}
    for m in sorted((m for m in mounts(mountinfo) if m.source in devices),
                    key=lambda m: len(m.point), reverse=True):
        run([require("umount"), "-l", m.point], timeout=60, check=False)
    for loop in found:
        loops.detach(loop.device)
    deadline = time.monotonic() + DETACH_WAIT
    while loops.backed_in(directory) and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


class TargetSet(OpenTarget):
    """The targets of a run that measures several, prepared together: what ``Workspace`` is
    for one (the runner uses either), each configuration's images on its own target."""

    def __init__(self, plans: Iterable[TargetPlan], *, keep: bool = False,
                 record: Recorder | None = None, proc_root: Path = Path("/proc")) -> None:
        plans = list(plans)
        refused = [p for p in plans if p.problem is not None and p.required]
        if refused:
            p = refused[0]
            raise TargetError(f"[[targets]] {p.name}: cannot make {p.make} here: {p.problem}",
                              hint="install what is missing, or drop the filesystem key to "
                                   "measure the directory's own filesystem")
        self.plans = [p for p in plans if p.problem is None]
        if not self.plans:
            raise TargetError("no target of this suite can be measured here: "
                              + "; ".join(f"{p.name}: {p.problem}" for p in plans))
        self.skipped = {p.name: str(p.problem) for p in plans if p.problem is not None}
        """Target name → why it is not measured (a [target] filesystems entry this host
        cannot make)."""
        self.keep = keep
        self._proc = proc_root
        self._outer = {p.name: Workspace(p.target, keep=keep, proc_root=proc_root, record=record)
                       for p in self.plans}
        self._inner: dict[str, Workspace] = {}
        self._made: dict[str, LoopFilesystem] = {}
        self._sizes: dict[str, int] = {}
        self._configs: dict[str, list[Configuration]] = {}
        self._namespace = PrivateMounts()
        self.preconditioned: set[Path] = set()
        self.notes: list[str] = []

    @property
    def record(self) -> Recorder | None:
        return next(iter(self._outer.values())).record

    @record.setter
    def record(self, record: Recorder | None) -> None:
        for workspace in self._outer.values():
            workspace.record = record

    # -- lifecycle -------------------------------------------------------------------------
    def check(self, configs: Iterable[Configuration]) -> "TargetSet":
        """Check every target as ``Workspace.check`` does, the sizes of the filesystems to
        make, and the free space of each filesystem against everything the run puts on it."""
        configs = list(configs)
        memory = memory_total(self._proc / "meminfo")
        needs: dict[int, list[tuple[str, int]]] = {}
        notes: list[str] = []
        for plan in self.plans:
            mine = [c for c in configs if c.target == plan.name]
            self._configs[plan.name] = mine
            outer = self._outer[plan.name]
            if plan.make is None:
                outer.check(mine)
                notes += [f"target {plan.name}: {n}" for n in outer.notes]
                notes.append(plan.describe())
                if plan.target.directory is not None:
                    assert outer.image_size is not None
                    need = images_footprint(image_specs(mine), outer.image_size)
                    needs.setdefault(_filesystem_id(plan.target), []).append((plan.name, need))
                continue
            outer.check([])
            size = working_set_size(plan.target, memory) or plan.target.size
            assert size is not None
            notes += [f"target {plan.name}: {n}" for n in
                      (*outer.notes, *page_cache_notes(plan.target, mine, size, memory))]
            made = filesystem_size(plan.make, images_footprint(image_specs(mine), size))
            self._sizes[plan.name] = made
            notes.append(plan.describe(made))
            needs.setdefault(_filesystem_id(plan.target), []).append((plan.name, made))
        for named in needs.values():
            total = sum(n for _, n in named) + MARGIN
            directory = next(p.target.directory for p in self.plans if p.name == named[0][0])
            assert directory is not None
            free = shutil.disk_usage(nearest_existing(directory)).free
            if free < total:
                listed = ", ".join(f"{name} {format_bytes(n)}" for name, n in named)
                raise NotEnoughSpace(
                    f"{directory}: {format_bytes(free)} free, but the targets on its filesystem "
                    f"need {format_bytes(total)} ({listed})",
                    hint="lower [target] size, measure fewer filesystems or formats at once, "
                         "or point the targets at a larger filesystem")
        self.notes = list(dict.fromkeys(notes))
        return self

    def create(self) -> "TargetSet":
        """Create each target's private directory, and make, attach and mount the filesystems
        iomatrix makes (in a mount namespace of the run's own)."""
        for plan in self.plans:
            outer = self._outer[plan.name].create()
            if plan.make is None:
                continue
            assert outer.directory is not None
            try:
                self._namespace.enter()
            except (OSError, IomatrixError) as exc:
                raise TargetError(f"target {plan.name}: cannot mount the {plan.make} filesystem "
                                  f"privately: {exc}") from exc
            made = LoopFilesystem(outer.directory, plan.make, self._sizes[plan.name],
                                  dir_fd=outer.directory_fd)
            self._made[plan.name] = made
            made.create()
            assert made.loop is not None
            if not made.loop.direct_io:
                self.notes.append(
                    f"target {plan.name}: the kernel refused direct I/O on the loop device "
                    f"({made.loop.device}): its reads and writes go through the host page cache, "
                    "so its figures can measure RAM rather than the storage")
            inner_target = Target(directory=made.mountpoint, size=plan.target.size,
                                  working_set=plan.target.working_set, allow_tmpfs=True)
            self._inner[plan.name] = Workspace(inner_target, keep=self.keep,
                                               proc_root=self._proc).open(
                                                   self._configs.get(plan.name, []))
        return self

    def close(self) -> None:
        """Remove everything created (unless keep); unmount and detach the filesystems made
        (whatever keep says: with keep, their files stay, with the images inside)."""
        try:
            for name, outer in self._outer.items():
                with contextlib.suppress(Exception):
                    if name in self._inner:
                        self._inner[name].close()
                if name in self._made:
                    self._made[name].close()
                outer.close()
        finally:
            self._namespace.leave()

    def __enter__(self) -> "TargetSet":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def host_fields(self) -> dict[str, str]:
        return {"targets": ", ".join(p.name for p in self.plans)}

    # -- images ----------------------------------------------------------------------------
    def _workspace(self, config: Configuration) -> Workspace:
        name = str(config.target)
        return self._inner.get(name) or self._outer[name]

    def images(self, config: Configuration) -> list[Image]:
        """One image per guest of the configuration, on its target."""
        return self._workspace(config).images(config)

    def verify(self, images: Iterable[Image]) -> None:
        """``Workspace.verify`` on every target."""
        images = list(images)
        for workspace in [*self._inner.values(), *self._outer.values()]:
            workspace.verify(images)

    def storage_of(self, config: Configuration) -> Path:
        """What holds the configuration's images (a made filesystem: its mount point, whose
        device is the loop device), for the host's disk telemetry."""
        return self._workspace(config).storage_of(config)


def _filesystem_id(target: Target) -> int:
    """The filesystem a target directory (or its nearest existing parent) is on."""
    assert target.directory is not None
    return os.stat(nearest_existing(target.directory)).st_dev


def describe_plans(plans: Iterable[TargetPlan], configs: Iterable[Configuration], *,
               meminfo: Path = Path("/proc/meminfo")) -> list[str]:
    """What ``run --plan`` says about the targets of a run that measures several."""
    configs = list(configs)
    memory = memory_total(meminfo)
    lines = []
    for plan in plans:
        if plan.problem is not None:
            action = "the run will refuse" if plan.required else "skipped"
            lines.append(f"target {plan.name}: {action}: cannot make {plan.make} here: "
                         f"{plan.problem}")
            continue
        size = None
        if plan.make is not None:
            with contextlib.suppress(TargetError):
                image = working_set_size(plan.target, memory) or plan.target.size or 0
                mine = [c for c in configs if c.target == plan.name]
                size = filesystem_size(plan.make, images_footprint(image_specs(mine), image))
        lines.append(plan.describe(size))
    return lines
