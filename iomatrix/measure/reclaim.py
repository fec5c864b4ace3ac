"""What runs leave on disk: recorded before it is created, removed by whoever comes next.

A measuring process is recorded in the store (``RunProcess``: pid, host, boot, start time, uid,
and the lock file it holds), and so is every directory it creates, before creating it: its
scratch directory under $TMPDIR (sockets, job files, FUSE exports), the run's image directory in
the target, a target directory that did not exist. A process that ends normally removes them and
says so. One that is killed cannot; then ``reclaim`` removes them, from the next
``run --resume``, the next run over the same target, or ``iomatrix clean``, once it is sure that

- the process that created it is dead or has ended (``iomatrix.core.owner.liveness``: a live
  process's pid, start time and lock; a process on another host counts as alive);
- the run did not ask to ``--keep`` it;
- the path still is what iomatrix created: its name (``iomatrix-run-*``, ``iomatrix-*``), in
  the directory it was created in, a directory and not a symlink, owned by the user iomatrix runs
  as, who created it;
- nothing is mounted inside it once the FUSE exports a killed daemon left are detached and the
  filesystems a run made there (on loop devices over files inside it: ``iomatrix.target.
  targets``) are unmounted and their loop devices detached.

A target directory that iomatrix created is only ever removed with ``rmdir``: when empty."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import stat
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

from iomatrix.core.errors import EnvironmentProblem
from iomatrix.core.mounts import MOUNTINFO, force_unmount, mounts
from iomatrix.core.owner import HeldLock, Identity, liveness, this_process
from iomatrix.store.records import ResourceRecord
from iomatrix.store.repo import Store, identity
from iomatrix.target import loops
from iomatrix.target.targets import release_loops
from iomatrix.target.workspace import PREFIX

SCRATCH_PREFIX = "iomatrix-run-"
SCRATCH_MAX = 90
"""Longest scratch path: sockets go up to 18 characters below it, and a UNIX socket path has
at most 107."""
LOCK_NAME = "owner.lock"
KINDS = {"scratch": "scratch", "workspace": "images", "parent": "target directory"}
"""How each kind of resource is named to people."""


class RunProcess:
    """This process as the store records it, with its scratch directory and the lock that says
    it lives. Use ``run_process``."""

    def __init__(self, store: Store, *, keep: bool) -> None:
        self.store = store
        self.keep = keep
        self.me: Identity = this_process()
        self.id: int | None = None
        self.scratch: Path | None = None
        self.run_id: int | None = None
        self._lock: HeldLock | None = None

    def start(self) -> None:
        tmp = Path(tempfile.gettempdir()).resolve()
        path = tmp / f"{SCRATCH_PREFIX}{secrets.token_hex(4)}"
        if len(str(path)) > SCRATCH_MAX:
            raise EnvironmentProblem(f"scratch directory {path} is too long for the UNIX sockets "
                                     f"placed in it (over {SCRATCH_MAX} characters)",
                                     hint="set TMPDIR to a shorter directory, e.g. /tmp")
        self.id = self.store.register_process(self.me, str(path / LOCK_NAME))
        self.store.add_resource(self.id, "scratch", str(path), str(tmp), keep=self.keep)
        try:
            path.mkdir(mode=0o700)
        except OSError as exc:
            raise EnvironmentProblem(f"cannot create the scratch directory {path}: "
                                     f"{exc.strerror}", hint="set TMPDIR to a writable "
                                     "directory") from exc
        self.scratch = path
        self._lock = HeldLock(path / LOCK_NAME)

    def record(self, kind: str, path: Path, within: Path) -> None:
        """``iomatrix.target.workspace.Recorder``: a directory about to be created."""
        assert self.id is not None
        self.store.add_resource(self.id, kind, str(path), str(within), run_id=self.run_id,
                                keep=self.keep)

    def close(self, *, failing: bool) -> None:
        """Remove the scratch directory (unless keep), settle what is gone, end the process's
        record, release the lock. While another error is on its way, its own are not raised.
        A stopping signal (Ctrl-C, SIGTERM, SIGHUP) that arrives meanwhile takes effect once
        this is done, so that it cannot leave half a clean-up behind."""
        with _signals_deferred():
            self._close(failing)

    def _close(self, failing: bool) -> None:
        try:
            if self.scratch is not None and not self.keep:
                _detach_fuse(self.scratch)
                shutil.rmtree(self.scratch, ignore_errors=True)
            if self.id is not None:
                for r in self.store.open_resources(self.id):
                    if not os.path.lexists(r.path):
                        self.store.settle_resource(r.id, "removed")
                    elif r.keep:
                        self.store.settle_resource(r.id, "kept (--keep)")
                self.store.end_process(self.id)
        except Exception:
            if not failing:
                raise
        finally:
            if self._lock is not None:
                self._lock.release()


STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """Hold back stopping signals for the block; those that came are raised again after it,
    to whatever handled them before. Only the main thread can do this (elsewhere, nothing)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: came.append(signum))
                for s in STOPPING if signal.getsignal(s) is not None}  # None: not Python's
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for s in dict.fromkeys(came):
            signal.raise_signal(s)


@contextlib.contextmanager
def run_process(store: Store, *, keep: bool) -> Iterator[RunProcess]:
    """This process recorded, its scratch directory made and its lock held for the block."""
    process = RunProcess(store, keep=keep)
    try:
        process.start()
        yield process
    finally:
        process.close(failing=sys.exc_info()[0] is not None)


class Reclaimed(NamedTuple):
    resource: ResourceRecord
    action: str
    """removed | would remove | gone | kept | left"""
    detail: str
    bytes: int = 0


def reclaim(store: Store, *, me: int | None = None, dry_run: bool = False,
            scope: Callable[[ResourceRecord], bool] | None = None,
            mountinfo: Path = MOUNTINFO) -> list[Reclaimed]:
    """Remove what dead processes left (see the module's docstring), except what process ``me``
    created and what ``scope`` excludes; each resource looked at, with what was done. With
    ``dry_run`` nothing is removed and nothing is written to the store."""
    myself = this_process()
    resources = [r for r in store.open_resources()
                 if r.process.id != me and (scope is None or scope(r))]
    done: list[Reclaimed] = []
    # what is inside a directory before the directory: images and scratch before targets
    for r in sorted(resources, key=lambda r: (r.kind == "parent", -len(r.path))):
        alive, why = liveness(identity(r.process), r.process.lock_path, me=myself)
        if alive and r.process.ended_at is None:
            done.append(Reclaimed(r, "left", f"in use by a live iomatrix since "
                                             f"{r.process.started_at} ({why})"))
            continue
        outcome = _reclaim_one(r, dry_run, mountinfo, others=resources)
        done.append(outcome)
        if not dry_run and outcome.action in ("removed", "gone", "kept"):
            store.settle_resource(r.id, f"{outcome.action} (pid {myself.pid}: {outcome.detail})")
    return done


def stale_parents(store: Store, *, me: int) -> dict[str, int]:
    """The target directories (and parents of them) that processes now dead or ended created
    and did not remove: real path → resource id. A run over such a target takes them on
    (``Workspace.adopt``, ``Store.adopt_resource``) and removes them at its end when empty."""
    myself = this_process()
    return {r.path: r.id for r in store.open_resources()
            if r.kind == "parent" and r.process.id != me and not r.keep
            and (r.process.ended_at is not None
                 or not liveness(identity(r.process), r.process.lock_path, me=myself)[0])}


def _reclaim_one(r: ResourceRecord, dry_run: bool, mountinfo: Path,
                 others: list[ResourceRecord]) -> Reclaimed:
    path = Path(r.path)
    if r.keep:
        return Reclaimed(r, "kept", "the run asked to --keep it")
    problem = _not_ours(r)
    if problem == "gone":
        return Reclaimed(r, "gone", "already removed")
    if problem:
        return Reclaimed(r, "left", problem)
    if r.kind == "parent":
        inside = [o for o in others if o.within == r.path and os.path.lexists(o.path)]
        if inside or any(path.iterdir()):
            return Reclaimed(r, "left", "not empty")
        if dry_run:
            return Reclaimed(r, "would remove", "empty")
        try:
            path.rmdir()
        except OSError as exc:
            return Reclaimed(r, "left", f"cannot remove: {exc.strerror}")
        return Reclaimed(r, "removed", "empty")
    size = _size(path)
    made = loops.backed_in(path)            # filesystems a run made there (target.targets)
    made_devices = {loop.device for loop in made}
    mounted = [m for m in mounts(mountinfo) if m.point.startswith(r.path + "/")
               and m.source not in made_devices]
    foreign = [m.point for m in mounted if not m.fstype.startswith("fuse")]
    if foreign or any(m.point == r.path for m in mounts(mountinfo)):
        return Reclaimed(r, "left", f"something is mounted in it: {', '.join(foreign) or r.path}")
    if dry_run:
        detail = "; ".join(
            ([f"{len(mounted)} FUSE export(s) to detach first"] if mounted else [])
            + ([f"loop device(s) {', '.join(sorted(made_devices))} to detach"] if made else []))
        return Reclaimed(r, "would remove", detail, size)
    _detach_fuse(path, mountinfo)
    released = release_loops(path, mountinfo=mountinfo)
    still = [m.point for m in mounts(mountinfo) if m.point.startswith(r.path + "/")]
    if still:
        return Reclaimed(r, "left", f"cannot detach {', '.join(still)}")
    errors: list[str] = []

    def failed(function: object, name: str, info: object) -> None:
        exc = info[1] if isinstance(info, tuple) else info
        if not isinstance(exc, FileNotFoundError):          # another reclaimer was quicker
            errors.append(f"{name}: {getattr(exc, 'strerror', None) or exc}")

    shutil.rmtree(path, onerror=failed)
    if errors:
        return Reclaimed(r, "left", f"cannot remove: {errors[0]}")
    detail = "; ".join(
        ([f"{len(mounted)} FUSE export(s) detached"] if mounted else [])
        + ([f"loop device(s) {', '.join(lo.device for lo in released)} detached"]
           if released else []))
    return Reclaimed(r, "removed", detail, size)


def _not_ours(r: ResourceRecord) -> str:
    """Why the recorded path must not be removed ("gone" when it is not there); "" when it is
    what iomatrix created."""
    path = Path(r.path)
    prefix = {"scratch": SCRATCH_PREFIX, "workspace": PREFIX}.get(r.kind, "")
    if not path.name.startswith(prefix) or not path.is_absolute() or ".." in path.parts:
        return f"its name is not one iomatrix gives ({prefix}*)"
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        if os.path.isdir(r.within):
            return "gone"
        return f"{r.within} is not there now (unmounted?)"
    except OSError as exc:
        return f"cannot look at it: {exc.strerror}"
    if stat.S_ISLNK(info.st_mode):
        return "it is a symlink now, not the directory iomatrix created"
    if not stat.S_ISDIR(info.st_mode):
        return "it is not a directory now"
    if os.path.realpath(path.parent) != r.within:
        return f"it is no longer inside {r.within}"
    uid = os.geteuid()
    if info.st_uid != uid or info.st_uid != r.process.uid:
        return (f"owned by uid {info.st_uid}; iomatrix runs as uid {uid} and created it as "
                f"uid {r.process.uid}")
    return ""


def _detach_fuse(path: Path, mountinfo: Path = MOUNTINFO) -> None:
    """Detach the FUSE exports below ``path`` (a daemon killed before unmounting leaves them,
    dead: anything that touches them fails), deepest first."""
    inside = str(path).rstrip("/") + "/"
    try:
        found = [m.point for m in mounts(mountinfo)
                 if m.point.startswith(inside) and m.fstype.startswith("fuse")]
    except OSError:
        return
    for point in sorted(found, key=len, reverse=True):
        force_unmount(point)


def _size(path: Path) -> int:
    """Bytes allocated below ``path`` (symlinks and mounts not followed)."""
    total = 0
    with contextlib.suppress(OSError):
        device = os.lstat(path).st_dev
        for root, dirs, files in os.walk(path):
            for name in dirs + files:
                with contextlib.suppress(OSError):
                    info = os.lstat(os.path.join(root, name))
                    if info.st_dev == device:
                        total += info.st_blocks * 512
    return total


def describe(r: Reclaimed) -> str:
    """One line about what was done with a resource, for notes and ``iomatrix clean``."""
    res = r.resource
    run = f"run {res.run_id}" if res.run_id is not None else "no run"
    size = f", {r.bytes / 2**20:.1f} MiB" if r.bytes else ""
    detail = f": {r.detail}" if r.detail else ""
    return (f"{r.action} {KINDS.get(res.kind, res.kind)} {res.path} ({run}, pid "
            f"{res.process.pid}{size}){detail}")


def reclaim_libvirt_domains(uri: str | None = None, *, dry_run: bool = False) -> list[str]:
    """Destroy the libvirt domains (at ``uri``, by default ``qemu:///system``) that runs now dead
    left (``iomatrix.drivers.libvirt``: each names its owner in its <metadata>); one line per
    iomatrix domain looked at. Nothing where virsh or libvirtd is missing."""
    from iomatrix.drivers import libvirt
    return [libvirt.describe(item)
            for item in libvirt.reclaim_domains(uri or libvirt.DEFAULT_URI, dry_run=dry_run)]
