"""External commands: argv lists with timeouts, and processes we start and always stop."""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import errno
import fcntl
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

from iomatrix.core.errors import EnvironmentProblem, ToolFailed

# Debian package that provides each tool, for hints.
PACKAGES = {
    "qemu-system-x86_64": "qemu-system-x86",
    "qemu-storage-daemon": "qemu-system-common",
    "qemu-img": "qemu-utils",
    "fio": "fio",
    "fusermount3": "fuse3",
}


def which(tool: str | os.PathLike[str], env: Mapping[str, str] | None = None) -> str | None:
    """The path of ``tool`` on the PATH of ``env`` (default: this process's), or None.
    A ``tool`` that contains a slash is taken as a path and only checked to be executable."""
    name = os.fspath(tool)
    if os.sep in name:
        return name if os.path.isfile(name) and os.access(name, os.X_OK) else None
    return shutil.which(name, path=(env if env is not None else os.environ).get("PATH", os.defpath))


def require(tool: str, env: Mapping[str, str] | None = None, *, hint: str | None = None) -> str:
    """The absolute path of ``tool`` on PATH, or EnvironmentProblem naming the package
    (or saying ``hint``)."""
    found = which(tool, env)
    if not found:
        package = PACKAGES.get(tool, tool)
        raise EnvironmentProblem(f"{tool} not found on PATH",
                                 hint=hint or f"install it: apt-get install {package}")
    return found


def run(argv: Sequence[str], *, timeout: float, check: bool = True,
        env: Mapping[str, str] | None = None, cwd: Path | None = None,
        pass_fds: Sequence[int] = ()) -> subprocess.CompletedProcess[str]:
    """Run a command to completion with a timeout; ToolFailed carries argv, code and output.
    The command runs in its own process group, which is killed and reaped on timeout or error,
    and gets SIGTERM if iomatrix dies meanwhile (``orphan_guard``). ``pass_fds``: descriptors
    it inherits (as ``/proc/self/fd/N``)."""
    name = Path(argv[0]).name
    # a relative path with a slash ("./configure") names a file in cwd, where it will run
    program = os.path.join(cwd, argv[0]) if cwd is not None and os.sep in os.fspath(argv[0]) \
        else argv[0]
    if which(program, env) is None:
        raise ToolFailed(f"{argv[0]}: not found", argv=argv, returncode=None)
    try:
        proc = subprocess.Popen(orphan_guard(argv), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                errors="replace", cwd=cwd,
                                env=dict(env) if env is not None else None,
                                start_new_session=True, pass_fds=tuple(pass_fds))
    except FileNotFoundError as exc:
        raise ToolFailed(f"{argv[0]}: not found", argv=argv, returncode=None) from exc
    except OSError as exc:
        raise ToolFailed(f"cannot run {argv[0]}: {exc.strerror or exc}", argv=argv,
                         returncode=None) from exc
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        out, err = _kill_group(proc)
        raise ToolFailed(f"{name} did not finish within {timeout:.0f} s", argv=argv,
                         returncode=None, output=(out + err)[-2000:]) from exc
    except BaseException:
        _kill_group(proc)
        raise
    if check and proc.returncode != 0:
        tail = (err or out).strip().splitlines()[-1:] or [""]
        raise ToolFailed(f"{name} failed (exit {proc.returncode}): {tail[0]}",
                         argv=argv, returncode=proc.returncode, output=(out + err)[-4000:])
    return subprocess.CompletedProcess(list(argv), proc.returncode, out, err)


def _kill_group(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """SIGKILL the process group of a command started by :func:`run`; what it printed."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    return proc.communicate()


# Run by the shell setpriv execs, after setpriv has set the parent-death signal: a parent that
# died before that (its pid, passed as $0, is no longer $PPID) would never send it, so the
# program is not started at all. "exec" keeps the pid Popen knows.
_PARENT_CHECK = 'test "$PPID" = "$0" || exit 143; exec "$@"'


def orphan_guard(argv: Sequence[str], *, deathsig: str = "TERM") -> list[str]:
    """``argv`` wrapped so that the process gets SIGTERM (``deathsig``) if iomatrix dies without
    stopping it (kill -9, a crash): util-linux's setpriv sets the parent-death signal, which
    survives exec. The kernel sends it when the thread that started the process ends: with
    iomatrix killed outright, every thread does. Only that process gets it, not the processes
    it started itself (fio's jobs: fio stops them when it gets SIGTERM).
    The kernel sends it only if the parent dies after it is set; a parent killed while setpriv
    was starting is caught by a check of the parent's pid before ``argv`` runs (CI once found
    an fio that outlived a kill -9 that way). Without setpriv, ``argv`` unchanged."""
    setpriv = which("setpriv")
    if not setpriv:
        return list(argv)
    return [setpriv, "--pdeathsig", deathsig, "--", "/bin/sh", "-c", _PARENT_CHECK,
            str(os.getpid()), *argv]


@contextlib.contextmanager
def managed(argv: Sequence[str], *, log: Path, stop_timeout: float = 5.0,
            env: Mapping[str, str] | None = None, pass_fds: Sequence[int] = (),
            deathsig: str = "TERM") -> Iterator[subprocess.Popen[bytes]]:
    """Start a long-running process in its own session, logging to ``log``; on leaving the
    block, SIGTERM it, then SIGKILL after ``stop_timeout``, and always reap it. If iomatrix is
    killed outright, the process gets SIGTERM (``deathsig``) from the kernel (see
    ``orphan_guard``). ``pass_fds``: descriptors it inherits. ToolFailed when it cannot be
    started."""
    with open(log, "ab") as out:
        try:
            proc = subprocess.Popen(orphan_guard(argv, deathsig=deathsig), stdout=out,
                                    stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True,
                                    env=dict(env) if env is not None else None,
                                    pass_fds=tuple(pass_fds))
        except OSError as exc:
            raise ToolFailed(f"cannot start {argv[0]}: {exc.strerror or exc}", argv=argv,
                             returncode=None) from exc
    try:
        yield proc
    finally:
        stop(proc, timeout=stop_timeout)


REAPER_GRACE = 5.0
"""How long a daemon has to end on its parent-death SIGTERM before :func:`reaper` kills it."""


@contextlib.contextmanager
def reaper(daemon: subprocess.Popen[bytes], *, log: Path, unmount: Path | None = None,
           grace: float = REAPER_GRACE) -> Iterator[None]:
    """For the block, a watchdog over ``daemon`` (started by :func:`managed`) in case iomatrix
    is killed outright: it gives the daemon ``grace`` seconds to end on its SIGTERM, then
    SIGKILLs it and lazily unmounts its FUSE export at ``unmount`` (see
    :mod:`iomatrix.core.reaper`, which says why: a FUSE export with I/O in flight can keep
    both the daemon and fio alive). Leaving the block stops the watchdog, which then does
    nothing; enter it inside the daemon's ``managed`` block, so it ends first."""
    from iomatrix.core import reaper as script

    argv = [sys.executable, "-I", script.__file__, str(os.getpid()), str(daemon.pid),
            str(grace), *([os.fspath(unmount)] if unmount is not None else [])]
    with managed(argv, log=log, deathsig=script.ORPHANED.name.removeprefix("SIG")):
        yield


@contextlib.contextmanager
def reaped(pgid: int, argument: str) -> Iterator[None]:
    """For the block, the process started in a session of its own as group ``pgid`` (fio),
    and every process of this user with ``argument`` on its command line (fio's job processes,
    forks of it in sessions of their own), are watched by this iomatrix's reaper
    (``iomatrix.core.reaper --groups``, started with the first such block): killed outright,
    iomatrix leaves none of them behind, not even a job of fio's that fio's SIGTERM could not
    stop. ``argument``: one only that process has (fio's ``--output=`` file in the run's
    private directory). Leave the block once they are gone (after :func:`stop`)."""
    _GROUPS.tell(f"+{pgid} {os.fsencode(argument).hex()}\n")
    try:
        yield
    finally:
        _GROUPS.tell(f"-{pgid}\n")


class _GroupReaper:
    """One ``reaper.py --groups`` per iomatrix process, told the groups to watch through a pipe
    whose write end only iomatrix holds (not inherited: ``os.pipe`` is close-on-exec), so
    the reaper's input ends when iomatrix does, however it ends."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner = 0             # the process that started it (a fork starts its own)
        self._fd = -1
        self._proc: subprocess.Popen[bytes] | None = None

    def tell(self, line: str) -> None:
        with self._lock:
            if self._owner != os.getpid() or self._proc is None or self._proc.poll() is not None:
                self._start()
            if self._fd >= 0:
                with contextlib.suppress(OSError):      # the watchdog is a last resort
                    os.write(self._fd, line.encode())

    def _start(self) -> None:
        from iomatrix.core import reaper as script

        if self._owner == os.getpid() and self._fd >= 0:
            os.close(self._fd)
        self._owner, self._fd = os.getpid(), -1
        read, write = os.pipe()
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-I", script.__file__, "--groups", str(REAPER_GRACE)],
                stdin=read, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True)
        except OSError:
            os.close(write)
            return
        finally:
            os.close(read)
        self._fd = write
        atexit.register(self._end, self._proc, write)

    def _end(self, proc: subprocess.Popen[bytes], fd: int) -> None:
        """At iomatrix's exit: its input ends, every group is gone already; reap it."""
        if os.getpid() == self._owner and fd == self._fd:
            os.close(fd)
            self._fd = -1
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)


_GROUPS = _GroupReaper()


def stop(proc: subprocess.Popen[bytes], *, timeout: float = 5.0) -> None:
    """Terminate a process we started in a session of its own (TERM, then KILL to its whole
    process group) and reap it; then wait until nothing of its group is left (fio's job
    processes, which may still be ending their I/O after fio itself is reaped or killed), so
    that what they used can be removed safely; idempotent. A stopped process (SIGSTOP) is
    continued after its TERM, as a shell's ``kill`` does: else the TERM would wait, and the
    process with it, for the whole ``timeout`` and the KILL."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
            if is_stopped(proc.pid):
                proc.send_signal(signal.SIGCONT)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired as exc:   # stuck in the kernel (a dead FUSE mount?)
                raise ToolFailed(f"{Path(str(proc.args[0])).name} (pid {proc.pid}) did not die "
                                 "on SIGKILL", argv=[str(a) for a in proc.args],
                                 returncode=None) from exc
    _group_gone(proc.pid, timeout=timeout)


def _group_gone(pgid: int, *, timeout: float) -> None:
    """Wait until process group ``pgid`` (a session leader's, now reaped) has no live process
    left: ``timeout`` seconds for its members to end by themselves, SIGKILL to those left, then
    as long again for them to go (a process in the kernel's I/O ends when the I/O does). A
    zombie is gone: its parent may be an init that never reaps it."""
    for phase in range(2):
        deadline = time.monotonic() + timeout
        while group_members(pgid):
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        else:
            return
        if phase == 0:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)


def is_stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped by a signal (SIGSTOP, SIGTSTP: state ``T`` in
    /proc), where it answers nothing (a QEMU's monitor) and takes no signal but SIGKILL until
    continued. False for a process gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2:].startswith("T")


def group_members(pgid: int, proc_root: Path = Path("/proc")) -> list[int]:
    """The live (not zombie) processes of process group ``pgid``, from /proc."""
    found = []
    for entry in proc_root.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()   # state, ppid, pgrp, ...
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            found.append(int(entry.name))
    return found


STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
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


def wait_for(predicate, *, timeout: float, interval: float = 0.02) -> bool:  # type: ignore[no-untyped-def]
    """Poll ``predicate`` until it is true or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def read_text(path: Path) -> str:
    """The text of a file (undecodable bytes replaced), or "" when it cannot be read."""
    try:
        return path.read_bytes().decode("utf-8", errors="replace")
    except OSError:
        return ""


def log_tail(log: Path, lines: int = 5) -> str:
    """The last lines of a log file, for error messages."""
    return " | ".join(read_text(log).strip().splitlines()[-lines:])


def blocked_threads(pid: int) -> dict[int, str]:
    """The threads of process ``pid`` in uninterruptible sleep (state D: waiting in the kernel,
    typically on I/O) now: thread id to "name (kernel function it waits in)"."""
    found = {}
    for task in Path(f"/proc/{pid}/task").glob("*"):
        stat = read_text(task / "stat")
        if ")" not in stat or not task.name.isdigit():
            continue
        name, rest = stat.split("(", 1)[1].rsplit(")", 1)
        if rest.split()[:1] == ["D"]:
            wchan = read_text(task / "wchan").strip()
            found[int(task.name)] = f"{name} ({wchan})" if wchan not in ("", "0") else name
    return found


def first_line(text: str) -> str:
    """The first non-blank line of a command's output, stripped, at most 200 characters."""
    return next(_nonblank(text.splitlines()), "")


def last_line(text: str) -> str:
    """The last non-blank line of a command's output, stripped, at most 200 characters."""
    return next(_nonblank(reversed(text.splitlines())), "")


def _nonblank(lines: Iterable[str]) -> Iterator[str]:
    return (line.strip()[:200] for line in lines if line.strip())


# --- a private network namespace ---------------------------------------------------------------

CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
_NETNS_HINT = ("run iomatrix as root: creating a network namespace needs CAP_SYS_ADMIN "
               "(in a container: --cap-add SYS_ADMIN, and no seccomp profile refusing unshare)")


def network_namespace() -> int:
    """The inode of the calling thread's network namespace (what ``/proc/PID/ns/net`` of a
    process in the same namespace points to)."""
    return os.stat("/proc/thread-self/ns/net").st_ino


@contextlib.contextmanager
def private_network() -> Iterator[int]:
    """Move the calling thread, and every process it starts from now on, into a new network
    namespace whose only interface is a loopback (brought up here); yields its inode. On
    leaving the block the thread returns to its own namespace; the private one ends with the
    last process in it, so processes started inside must be stopped (and are, when they run
    under :func:`managed`: iomatrix killed outright kills them, and so the namespace).

    Only this thread moves (a network namespace is per thread): other threads and sockets
    already open keep theirs; its root and working directory stay (unlike a mount namespace's
    setns, a network namespace's changes nothing else). UNIX sockets named by a path are reachable across namespaces.
    EnvironmentProblem, with the kernel's reason, when a namespace cannot be made (not root:
    it needs CAP_SYS_ADMIN)."""
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise EnvironmentProblem(f"cannot open this thread's network namespace: {exc.strerror}",
                                 hint="mount /proc (Linux 3.17 or later)") from exc
    try:
        if libc.unshare(CLONE_NEWNET) != 0:
            code = ctypes.get_errno()
            why = {errno.EPERM: "not permitted (needs CAP_SYS_ADMIN)",
                   errno.EINVAL: "the kernel has no network namespaces (CONFIG_NET_NS)"}.get(
                       code, os.strerror(code))
            raise EnvironmentProblem(f"cannot create a network namespace: {why}",
                                     hint=_NETNS_HINT)
        try:
            _loopback_up()
            yield network_namespace()
        finally:
            if libc.setns(home, CLONE_NEWNET) != 0:   # as root this cannot fail; never ignore it
                code = ctypes.get_errno()
                raise OSError(code, "cannot return to the original network namespace: "
                                    f"{os.strerror(code)}")
    finally:
        os.close(home)


def private_network_problem() -> str | None:
    """Why :func:`private_network` cannot be used here, or None when it can (tried for real)."""
    try:
        with private_network():
            pass
    except EnvironmentProblem as exc:
        return str(exc)
    return None


def _loopback_up() -> None:
    """Bring up ``lo`` of the calling thread's network namespace (ioctl SIOCSIFFLAGS, as
    ``ip link set lo up`` does; no iproute2 needed)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            request = struct.pack("16sh22x", b"lo", 0)           # struct ifreq: 40 bytes
            flags = struct.unpack_from("16sh", fcntl.ioctl(s, _SIOCGIFFLAGS, request))[1]
            fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sh22x", b"lo", flags | _IFF_UP))
    except OSError as exc:
        raise EnvironmentProblem(f"cannot bring up the loopback interface of a new network "
                                 f"namespace: {exc.strerror or exc}", hint=_NETNS_HINT) from exc
