"""What runs leave on disk: recorded before it is created, removed by whoever comes next.

A measuring process is recorded in the store (``RunProcess``: pid, host, boot, start time, uid,
and the lock file it holds), and so is every directory it creates, before creating it: its
scratch directory under $TMPDIR (sockets, job files, FUSE exports), the run's image directory in
the target, a target directory that did not exist. A process that ends normally removes them and
says so. One that is killed cannot; then ``reclaim`` removes them, from the next
``run --resume``, the next run over the same target, or ``iomatrix clean``, once it is sure that

- it was made on this host: what a process of another host (sharing a PostgreSQL store)
  made is that host's to remove, whether its process lives or not;
- the process that created it is dead or has ended (``Store.alive``: a live process's pid,
  start time and lock);
- the run did not ask to ``--keep`` it;
- the path still is what iomatrix created: its name (``iomatrix-run-*``, ``iomatrix-*``), in
  the directory it was created in, reached through directories nobody else controls
  (``iomatrix.core.dirs``), a directory and not a symlink, owned by the user iomatrix runs as,
  who created it;
- it carries iomatrix's marker (``core.dirs.MARKER``: for a scratch or image directory naming
  the record's process and path, for a target directory its path), which only iomatrix's user
  can have written there: a database that merely names a directory (a crafted one, say) cannot
  have it removed, and one naming a live run's directory as a dead process's does not match;
- nothing is mounted inside it once the FUSE exports a killed daemon left are detached and the
  filesystems a run made there (on loop devices over files inside it: ``iomatrix.targets.
  targets``) are unmounted and their loop devices detached; and no process still has a file
  open in it (the killed run's children get SIGTERM when it dies: ``core.proc.orphan_guard``;
  one that outlives it is killed, anything else leaves the directory where it is: ``_let_go``).

A target directory that iomatrix created is only ever removed with ``rmdir``: when it holds
nothing but its marker."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import stat
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

from iomatrix.core.dirs import (MARKER, make_private, parent_marker, read_marker, remove_empty,
                                walk, walk_tmpdir)
from iomatrix.core.errors import EnvironmentProblem, TargetUnreachable, UnsafeDirectory
from iomatrix.core.mounts import MOUNTINFO, force_unmount, mounts
from iomatrix.core.owner import PROC, HeldLock, Identity, this_process
from iomatrix.core.proc import read_text, signals_deferred
from iomatrix.core.trust import US, Author
from iomatrix.store.records import ResourceRecord
from iomatrix.store.repo import Store, identity
from iomatrix.store.rows import RESOURCES
from iomatrix.targets import loops
from iomatrix.targets.targets import release_loops
from iomatrix.targets.workspace import PREFIX

SCRATCH_PREFIX = "iomatrix-run-"
SCRATCH_MAX = 90
"""Longest scratch path: sockets go up to 18 characters below it, and a UNIX socket path has
at most 107."""
LOCK_NAME = "owner.lock"
KINDS = {"scratch": "scratch", "workspace": "images", "parent": "target directory",
         **{kind: resource.name for kind, resource in RESOURCES.items()}}
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
        self._recorded: set[tuple[str, str, str]] = set()
        """What this process recorded (kind, path, within): its own input, as read back."""

    def start(self) -> None:
        walked = walk_tmpdir()
        try:
            tmp = walked.real
            path = tmp / f"{SCRATCH_PREFIX}{secrets.token_hex(4)}"
            if len(str(path)) > SCRATCH_MAX:
                raise EnvironmentProblem(f"scratch directory {path} is too long for the UNIX "
                                         f"sockets placed in it (over {SCRATCH_MAX} characters)",
                                         hint="set TMPDIR to a shorter directory, e.g. /tmp")
            self.id = self.store.register_process(self.me, str(path / LOCK_NAME))
            marker = self.record("scratch", path, tmp)
            try:
                fd, _ = make_private(walked.fd, tmp, path.name, reuse=False, marker=marker)
            except OSError as exc:
                raise EnvironmentProblem(f"cannot create the scratch directory {path}: "
                                         f"{exc.strerror}", hint="set TMPDIR to a writable "
                                         "directory") from exc
        finally:
            os.close(walked.fd)
        os.close(fd)
        self.scratch = path
        self._lock = HeldLock(path / LOCK_NAME)
        self.store.lock_made(self.id, self._lock.info)

    def record(self, kind: str, path: Path, within: Path) -> str:
        """``iomatrix.targets.workspace.Recorder``: a directory about to be created."""
        assert self.id is not None
        self.store.add_resource(self.id, kind, str(path), str(within), run_id=self.run_id,
                                keep=self.keep)
        self._recorded.add((kind, str(path), str(within)))
        return marker_text(self.me, kind, str(path))

    def close(self, *, failing: bool) -> None:
        """Remove the scratch directory (unless keep), settle what is gone, end the process's
        record, release the lock. While another error is on its way, its own are not raised.
        A stopping signal (Ctrl-C, SIGTERM, SIGHUP) that arrives meanwhile takes effect once
        this is done, so that it cannot leave half a clean-up behind."""
        with signals_deferred():
            self._close(failing)

    def _close(self, failing: bool) -> None:
        try:
            if self.scratch is not None and not self.keep:
                _detach_fuse(self.scratch)
                shutil.rmtree(self.scratch, ignore_errors=True)
            if self.id is not None:
                for r in self.store.open_resources():
                    mine = r.process.id == self.id
                    if not mine and (r.kind != "parent" or r.process.ended_at is None):
                        continue
                    # a target directory another run made and ended in is removed by the last
                    # run over it (``Workspace.close``), which settles its record
                    if r.kind in RESOURCES:
                        self._settle_image(r)
                    elif not os.path.lexists(r.path):
                        self.store.settle_resource(r.id, "removed" if mine else
                                                   f"gone (seen at the end of pid {self.me.pid})")
                    elif r.keep and mine:
                        self.store.settle_resource(r.id, "kept (--keep)")
                self.store.end_process(self.id)
        except Exception:
            if not failing:
                raise
        finally:
            if self._lock is not None:
                self._lock.release()


    def _settle_image(self, r: ResourceRecord) -> None:
        """This run's image on its storage (an RBD image: ``Resource``): removed by its
        target's close (or now, if that failed), or kept with --keep; left open while its
        storage cannot be reached."""
        if r.keep:
            self.store.settle_resource(r.id, "kept (--keep)")
            return
        marker = marker_text(self.me, r.kind, r.path)
        # the record as this process made it is its own; else whoever could write the store's
        author = US if (r.kind, r.path, r.within) in self._recorded else self.store.author
        with contextlib.suppress(TargetUnreachable):
            done = RESOURCES[r.kind].remove(r.path, r.within, marker, author=author)
            if done in ("removed", "gone"):
                self.store.settle_resource(r.id, "removed")


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
    ``dry_run`` nothing is removed and nothing is written to the store; what it says it would
    remove is what it removes (a target directory emptied by the removals before it, too)."""
    myself = this_process()
    author = store.author           # of every row: an image's connection is their input
    resources = [r for r in store.open_resources()
                 if r.process.id != me and (scope is None or scope(r))]
    done: list[Reclaimed] = []
    going: set[str] = set()
    """Paths removed, or with dry_run that would be: not there for the directories above."""
    # what is inside a directory before the directory: images and scratch before targets
    for r in sorted(resources, key=lambda r: (r.kind == "parent", -len(r.path))):
        if r.process.host != myself.host:
            done.append(Reclaimed(r, "left", f"made on host {r.process.host}: `iomatrix clean` "
                                             "there removes it"))
            continue
        alive, why = store.alive(r.process)
        if alive and r.process.ended_at is None:
            done.append(Reclaimed(r, "left", f"in use by a live iomatrix since "
                                             f"{r.process.started_at} ({why})"))
            continue
        outcome = _reclaim_one(r, dry_run, mountinfo, others=resources, going=going,
                               author=author)
        done.append(outcome)
        if outcome.action in ("removed", "would remove", "gone"):
            going.add(r.path)
        if not dry_run and outcome.action in ("removed", "gone", "kept"):
            store.settle_resource(r.id, f"{outcome.action} (pid {myself.pid}: {outcome.detail})")
    return done


def marker_text(owner: Identity, kind: str, path: str) -> str:
    """What iomatrix writes in the ``MARKER`` of a directory it made (``kind`` at ``path``) for
    process ``owner``; ``reclaim`` removes the directory only while it still says so. A target
    directory's names no process: any run over it may remove it once it is empty."""
    if kind == "parent":
        return parent_marker(Path(path))
    return (f"made by iomatrix: {kind} {path}\nfor pid {owner.pid} started at tick "
            f"{owner.start_ticks} of boot {owner.boot_id} on {owner.host} as uid {owner.uid}\n")


class _Leave(Exception):
    """The resource is not removed; the message says why."""


def _reclaim_one(r: ResourceRecord, dry_run: bool, mountinfo: Path,
                 others: list[ResourceRecord], going: set[str], author: Author) -> Reclaimed:
    if r.keep:
        return Reclaimed(r, "kept", "the run asked to --keep it")
    if r.kind in RESOURCES:
        return _reclaim_resource(r, dry_run, author)
    try:
        parent_fd = _open_within(r)
    except _Leave as exc:
        detail = str(exc)
        return Reclaimed(r, "gone", "already removed") if detail == "gone" else Reclaimed(
            r, "left", detail)
    try:
        return _reclaim_in(r, parent_fd, dry_run, mountinfo, others, going)
    except _Leave as exc:
        return Reclaimed(r, "left", str(exc))
    finally:
        os.close(parent_fd)


def _reclaim_resource(r: ResourceRecord, dry_run: bool, author: Author) -> Reclaimed:
    """An image a dead run made on its storage (an RBD image in its pool): removed when it is
    still iomatrix's (its kind's ``Resource.remove``: ``iomatrix.targets.rbd.remove_recorded``,
    its record read as ``author``'s, who could have written the store); left, with why, while
    the storage cannot be reached (a later ``clean`` tries again)."""
    marker = marker_text(identity(r.process), r.kind, r.path)
    try:
        done = RESOURCES[r.kind].remove(r.path, r.within, marker, dry_run=dry_run, author=author)
    except TargetUnreachable as exc:
        return Reclaimed(r, "left", str(exc))
    action, _, detail = done.partition(": ")
    return Reclaimed(r, action, detail or {"gone": "already removed"}.get(action, "in its pool"))


def _reclaim_in(r: ResourceRecord, parent_fd: int, dry_run: bool, mountinfo: Path,
                others: list[ResourceRecord], going: set[str]) -> Reclaimed:
    path = Path(r.path)
    name = path.name
    marker = marker_text(identity(r.process), r.kind, r.path)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                     dir_fd=parent_fd)
    except OSError as exc:
        raise _Leave(f"cannot look inside it: {exc.strerror}") from exc
    try:
        entries = [e for e in os.listdir(fd) if str(path / e) not in going and e != MARKER]
        marked = read_marker(fd) == marker
    finally:
        os.close(fd)
    if r.kind == "parent":
        inside = [o for o in others if o.within == r.path and os.path.lexists(o.path)
                  and o.path not in going]
        if inside or entries:
            raise _Leave("not empty")
    if not marked:
        raise _Leave(f"it does not carry iomatrix's marker ({MARKER}) for this record, so it "
                     "may not be what iomatrix made (or iomatrix was stopped as it made it): "
                     "remove it by hand if it is")
    if r.kind == "parent":
        if dry_run:
            return Reclaimed(r, "would remove", "empty")
        why = remove_empty(parent_fd, name, marker)
        if why is not None:
            raise _Leave(why)
        return Reclaimed(r, "removed", "empty")
    size = _size(path)
    made = loops.backed_in(path)            # filesystems a run made there (target.targets)
    made_devices = {loop.device for loop in made}
    mounted = [m for m in mounts(mountinfo) if m.point.startswith(r.path + "/")
               and m.source not in made_devices]
    foreign = [m.point for m in mounted if not m.fstype.startswith("fuse")]
    if foreign or any(m.point == r.path for m in mounts(mountinfo)):
        raise _Leave(f"something is mounted in it: {', '.join(foreign) or r.path}")
    if dry_run:
        detail = "; ".join(
            ([f"{len(mounted)} FUSE export(s) to detach first"] if mounted else [])
            + ([f"loop device(s) {', '.join(sorted(made_devices))} to detach"] if made else []))
        return Reclaimed(r, "would remove", detail, size)
    _detach_fuse(path, mountinfo)
    released = release_loops(path, mountinfo=mountinfo)
    still = [m.point for m in mounts(mountinfo) if m.point.startswith(r.path + "/")]
    if still:
        raise _Leave(f"cannot detach {', '.join(still)}")
    killed, users = _let_go(r, path, others)
    if users:
        raise _Leave(f"files in it are still open: {', '.join(map(_named, users[:3]))}"
                     + (" …" if len(users) > 3 else ""))
    errors: list[str] = []

    def failed(function: object, failed_name: str, info: object) -> None:
        exc = info[1] if isinstance(info, tuple) else info
        if not isinstance(exc, FileNotFoundError):          # another reclaimer was quicker
            errors.append(f"{failed_name}: {getattr(exc, 'strerror', None) or exc}")

    shutil.rmtree(name, dir_fd=parent_fd, onerror=failed)
    if errors:
        raise _Leave(f"cannot remove: {errors[0]}")
    detail = "; ".join(
        ([f"{len(mounted)} FUSE export(s) detached"] if mounted else [])
        + ([f"loop device(s) {', '.join(lo.device for lo in released)} detached"]
           if released else [])
        + ([f"killed {', '.join(killed)}, left running by the dead run"] if killed else []))
    return Reclaimed(r, "removed", detail, size)


def _open_within(r: ResourceRecord) -> int:
    """The directory the resource was made in, held open, once the resource is proved to be
    what iomatrix made there (``_Leave`` says why not; "gone" when it is not there)."""
    path = Path(r.path)
    prefix = {"scratch": SCRATCH_PREFIX, "workspace": PREFIX}.get(r.kind, "")
    if not path.name.startswith(prefix) or not path.is_absolute() or ".." in path.parts:
        raise _Leave(f"its name is not one iomatrix gives ({prefix}*)")
    if str(path.parent) != r.within:
        raise _Leave(f"it is no longer inside {r.within}")
    try:
        walked = walk(path.parent)
    except UnsafeDirectory as exc:
        raise _Leave(f"not removed through a directory another user controls: {exc}") from exc
    except OSError as exc:
        raise _Leave(f"cannot look at it: {exc.strerror}") from exc
    try:
        if walked.missing:
            raise _Leave(f"{r.within} is not there now (unmounted?)")
        if walked.real != path.parent:
            raise _Leave(f"it is no longer inside {r.within}")
        _check_made(r, walked.fd)
    except BaseException:
        os.close(walked.fd)
        raise
    return walked.fd


def _check_made(r: ResourceRecord, parent_fd: int) -> None:
    try:
        info = os.lstat(Path(r.path).name, dir_fd=parent_fd)
    except FileNotFoundError:
        raise _Leave("gone") from None
    except OSError as exc:
        raise _Leave(f"cannot look at it: {exc.strerror}") from exc
    if stat.S_ISLNK(info.st_mode):
        raise _Leave("it is a symlink now, not the directory iomatrix created")
    if not stat.S_ISDIR(info.st_mode):
        raise _Leave("it is not a directory now")
    uid = os.geteuid()
    if info.st_uid != uid or info.st_uid != r.process.uid:
        raise _Leave(f"owned by uid {info.st_uid}; iomatrix runs as uid {uid} and created it as "
                     f"uid {r.process.uid}")


USERS_WAIT = 5.0
"""Seconds to wait for processes of a killed run (fio, qemu-img...) to let go of files in its
directories: each got SIGTERM when the run died (``core.proc.orphan_guard``)."""


def _let_go(r: ResourceRecord, path: Path,
            others: list[ResourceRecord]) -> tuple[list[str], list[int]]:
    """Wait for the processes holding files in ``path`` to end; those the dead run started and
    that outlived its SIGTERM (a qemu-storage-daemon can hang so) are killed, with their process
    groups. Returns (what was killed, described; the pids still holding files there).

    A process is the dead run's when its session leader is one of the run's commands: every
    command a run starts leads a session of its own (``start_new_session``), runs as the run's
    user and names one of the run's directories in its arguments (sockets, job files, images)."""
    theirs = tuple(o.path.rstrip("/") + "/" for o in others if o.process.id == r.process.id)
    # a command the run started just before it died may hold nothing in its images yet, and
    # still make their directory again once it is removed (fio creates a missing directory of
    # its filename): those naming the run's scratch directory (job files, sockets) go first
    scratch = tuple(o.path.rstrip("/") + "/" for o in others
                    if o.process.id == r.process.id and o.kind == "scratch")
    killed = (_kill_started(_pids(), scratch, r.process.uid)
              if scratch and r.kind == "workspace" else [])
    users = _users_after(path, USERS_WAIT)
    if not users:
        return killed, []
    killed += _kill_started(sorted({s for s in map(_session, users) if s is not None}), theirs,
                            r.process.uid)
    return killed, (_users_after(path, USERS_WAIT) if killed else users)


def _kill_started(leaders: Iterable[int], directories: tuple[str, ...], uid: int) -> list[str]:
    """Kill (with their process groups) those of ``leaders`` that ``_started_by`` calls
    commands of the run that made ``directories``; each killed, described."""
    killed = []
    for leader in leaders:
        if _started_by(leader, directories, uid):
            name = _named(leader)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(leader, signal.SIGKILL)
                killed.append(name)
    return killed


def _pids(proc: Path = PROC) -> list[int]:
    """Every process but this one."""
    return [int(e.name) for e in proc.iterdir() if e.name.isdigit() and int(e.name) != os.getpid()]


def _users_after(path: Path, wait: float) -> list[int]:
    """The processes with a file or working directory inside ``path``, once ``wait`` seconds
    have passed or none is left."""
    deadline = time.monotonic() + wait
    while True:
        users = _users(path)
        if not users or time.monotonic() >= deadline:
            return users
        time.sleep(0.1)


def _users(path: Path, proc: Path = Path("/proc")) -> list[int]:
    inside = str(path).rstrip("/") + "/"
    found = []
    for pid in _pids(proc):
        entry = proc / str(pid)
        try:
            links = [os.readlink(entry / "cwd")]
            links += [os.readlink(fd) for fd in (entry / "fd").iterdir()]
        except OSError:
            continue
        if any(link.removesuffix(" (deleted)").startswith(inside) for link in links):
            found.append(pid)
    return found


def _named(pid: int) -> str:
    return f"pid {pid} ({read_text(PROC / str(pid) / 'comm').strip()})"


def _session(pid: int) -> int | None:
    """The session a process is in (field 6 of /proc/PID/stat), or None when it is gone."""
    text = read_text(PROC / str(pid) / "stat")
    fields = text[text.rindex(")") + 2:].split() if ")" in text else []
    return int(fields[3]) if len(fields) > 3 else None


def _started_by(leader: int, directories: tuple[str, ...], uid: int) -> bool:
    """Whether ``leader`` leads its own session, runs as ``uid`` and names one of
    ``directories`` in its arguments: a command of the run that made them."""
    try:
        real_uid = int(next(line.split()[1] for line in
                            (PROC / str(leader) / "status").read_text().splitlines()
                            if line.startswith("Uid:")))
        argv = (PROC / str(leader) / "cmdline").read_bytes().decode(errors="replace")
    except (OSError, StopIteration, ValueError):
        return False
    return (_session(leader) == leader and real_uid == uid
            and any(d in argv for d in directories))


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
