"""External commands: argv lists with timeouts, and processes we start and always stop."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from iomatrix.errors import EnvironmentProblem, ToolFailed

# Debian package that provides each tool, for hints.
PACKAGES = {
    "qemu-system-x86_64": "qemu-system-x86",
    "qemu-storage-daemon": "qemu-system-common",
    "qemu-img": "qemu-utils",
    "fio": "fio",
    "fusermount3": "fuse3",
}


def require(tool: str, env: Mapping[str, str] | None = None) -> str:
    """The absolute path of ``tool`` on PATH, or EnvironmentProblem naming the package."""
    found = shutil.which(tool, path=(env or os.environ).get("PATH"))
    if not found:
        package = PACKAGES.get(tool, tool)
        raise EnvironmentProblem(f"{tool} not found on PATH",
                                 hint=f"install it: apt-get install {package}")
    return found


def run(argv: Sequence[str], *, timeout: float, check: bool = True,
        env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command to completion with a timeout; ToolFailed carries argv, code and output."""
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                              env=dict(env) if env is not None else None, stdin=subprocess.DEVNULL)
    except FileNotFoundError as exc:
        raise ToolFailed(f"{argv[0]}: not found", argv=argv, returncode=None) from exc
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        raise ToolFailed(f"{Path(argv[0]).name} did not finish within {timeout:.0f} s",
                         argv=argv, returncode=None, output=str(out)[-2000:]) from exc
    if check and proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
        raise ToolFailed(f"{Path(argv[0]).name} failed (exit {proc.returncode}): {tail[0]}",
                         argv=argv, returncode=proc.returncode,
                         output=(proc.stdout + proc.stderr)[-4000:])
    return proc


@contextlib.contextmanager
def managed(argv: Sequence[str], *, log: Path, stop_timeout: float = 5.0,
            env: Mapping[str, str] | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """Start a long-running process in its own session, logging to ``log``; on leaving the
    block, SIGTERM it, then SIGKILL after ``stop_timeout``, and always reap it."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                env=dict(env) if env is not None else None)
    try:
        yield proc
    finally:
        stop(proc, timeout=stop_timeout)


def stop(proc: subprocess.Popen[bytes], *, timeout: float = 5.0) -> None:
    """Terminate a process we started (TERM, then KILL) and reap it; idempotent."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def wait_for(predicate, *, timeout: float, interval: float = 0.02) -> bool:  # type: ignore[no-untyped-def]
    """Poll ``predicate`` until it is true or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def log_tail(log: Path, lines: int = 5) -> str:
    """The last lines of a log file, for error messages."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return ""
    return " | ".join(text.strip().splitlines()[-lines:])
