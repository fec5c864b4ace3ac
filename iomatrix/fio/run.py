"""Running fio: one invocation per trial, JSON to a file, a timeout, parsed at the edge."""

from __future__ import annotations

import errno
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path


from iomatrix.core.errors import FioFailed, FioParseError
from iomatrix.fio.models import FioResult
from iomatrix.fio.status import SIGINT_EXIT, last_result
from iomatrix.fio.parse import parse_fio_output
from iomatrix.core.proc import orphan_guard, reaped, signals_deferred, stop
from iomatrix.core.model import Frozen
from iomatrix.core.units import format_bytes


POLL_INTERVAL = 0.05
"""How often a running fio is checked: its exit, the observation time, the stop condition."""
CLIENT_STOP = 1.0
"""How long fio as a client of servers (``clients``) has to end on its SIGTERM when it is stopped
before it ended (it outlasted its time, iomatrix is interrupted) before it is killed: it does no
I/O of its own, and it would wait for a stopped guest's server to answer that never does (a
server whose client is gone ends its job). fio with its own jobs gets 5 s: they end their I/O."""
LOW_SPACE = 16 * 1024 * 1024
"""Free space below which a failed or unparsable fio run is blamed (also) on a full scratch
directory: fio's JSON, status stream and console go there."""


class FioRun(Frozen):
    """One fio invocation: its parsed result, its raw output, and what it cost."""

    result: FioResult
    raw_json: str
    argv: tuple[str, ...]
    wall_seconds: float
    stopped_early: bool = False
    """fio was stopped (SIGINT) before its runtime ended, as ``stop_when`` asked."""


def _start(argv: Sequence[str], console_path: Path, workdir: Path,
           env: Mapping[str, str] | None) -> subprocess.Popen[bytes]:
    """fio started (its console a file: it can never block on a pipe; its cwd the job's private
    directory, where a relative name it might still open lands), Ctrl-C held back meanwhile: a
    SIGINT between the fork and the caller holding ``proc`` would leave fio running after
    iomatrix ends (its parent-death SIGTERM comes, but only after). A signal that came then is
    raised once fio is held, and fio is stopped."""
    proc: subprocess.Popen[bytes] | None = None
    try:
        with signals_deferred(), open(console_path, "wb") as console:
            proc = subprocess.Popen(orphan_guard(argv), stdout=console, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True,
                                    cwd=console_path.parent,
                                    env={**os.environ, **env} if env else None)
    except OSError as exc:
        raise FioFailed(f"cannot start fio: {exc.strerror or exc}" + _space_cause(workdir),
                        argv=argv, returncode=None) from exc
    except BaseException:
        if proc is not None:
            stop(proc)
        raise
    assert proc is not None
    return proc


def run_fio(job: str, *, workdir: Path, timeout: float, fio: str = "fio",
            extra_args: Sequence[str] = (), during: Callable[[int], None] | None = None,
            during_at: float = 0.0, output_format: str = "json",
            stop_when: Callable[[float], bool] | None = None,
            status_stream: bool = True, env: Mapping[str, str] | None = None,
            clients: Sequence[str] = (), late: Callable[[], None] | None = None,
            client_jobs: Sequence[str] = ()) -> FioRun:
    """Run ``job`` (job-file text) and parse its JSON. ``during(pid)`` is called once,
    ``during_at`` seconds after start, while fio runs (for /proc observation). With
    ``stop_when``, fio writes a status object every second to its output (``output_path``) and
    gets SIGINT as soon as ``stop_when(elapsed)`` is true; fio then stops its jobs and writes a
    final result, which is the one parsed. ``status_stream=False`` keeps fio from writing status
    objects (fio's client gathers them into its one final object, useless while it runs): then
    ``stop_when`` must judge from something else, and the output is fio's one final result.
    ``late()`` is called once when fio outlasts ``timeout``, while it still runs (to look at
    what it is waiting for), before it is stopped. ``env``: variables added to iomatrix's
    environment for fio. ``clients``: fio servers
    (``sock:PATH``, ``ip:HOST,PORT``) that each run the job at once, fio's own multi-client
    (``--client=A job --client=B job``), their results and "All clients" aggregate in one
    output. ``client_jobs``: a job of each client's own, in order (else ``job`` for all)."""
    job_path = workdir / "job.fio"
    out_path = output_path(workdir)
    console_path = workdir / "fio.console"
    paths = [workdir / f"job-{i}.fio" for i in range(len(client_jobs))] or [job_path]
    try:
        job_path.write_text(job)
        for path, text in zip(paths, client_jobs):
            path.write_text(text)
        out_path.unlink(missing_ok=True)
    except OSError as exc:
        raise FioFailed(f"cannot write fio's job file {job_path}: {exc.strerror or exc}"
                        + _space_cause(workdir), argv=(fio, str(job_path)),
                        returncode=None) from exc
    streaming = stop_when is not None and status_stream
    status = ["--status-interval=1"] if streaming else []
    jobs = [a for i, c in enumerate(clients)
            for a in (f"--client={c}", str(paths[i if client_jobs else 0]))] or [str(job_path)]
    argv = (fio, f"--output-format={output_format}", f"--output={out_path}", *status,
            *extra_args, *jobs)
    t0 = time.monotonic()
    proc = _start(argv, console_path, workdir, env)
    grace = CLIENT_STOP if clients else 5
    try:
        with reaped(proc.pid, argv[2]):     # --output=: a job fio's SIGTERM cannot stop goes too
            try:
                interrupted = _wait(proc, t0, argv, timeout=timeout, during=during,
                                    during_at=during_at, stop_when=stop_when, late=late)
            finally:
                stop(proc, timeout=grace)
    except BaseException:
        stop(proc, timeout=grace)           # a Ctrl-C while the reaper was being told
        raise
    wall = time.monotonic() - t0
    text = console_path.read_text(errors="replace") if console_path.exists() else ""
    raw = out_path.read_text(errors="replace") if out_path.exists() else ""
    if proc.returncode != 0 and not (interrupted and proc.returncode == SIGINT_EXIT):
        detail = _first_error(text + raw) or _json_error(raw) or f"exit {proc.returncode}"
        raise FioFailed(f"fio failed: {detail}" + _space_cause(workdir), argv=argv,
                        returncode=proc.returncode, output=(text + raw)[-4000:])
    result = _result(raw, text, streaming=streaming, workdir=workdir, argv=argv,
                     returncode=proc.returncode)
    return FioRun(result=result, raw_json=raw, argv=argv, wall_seconds=wall,
                  stopped_early=interrupted)


def _wait(proc: subprocess.Popen[bytes], t0: float, argv: tuple[str, ...], *, timeout: float,
          during: Callable[[int], None] | None, during_at: float,
          stop_when: Callable[[float], bool] | None, late: Callable[[], None] | None) -> bool:
    """Wait for fio to exit, calling ``during`` once and SIGINT when ``stop_when`` says so
    (True: it was interrupted); FioFailed past ``timeout`` (after ``late()``)."""
    interrupted = False
    pending = during
    while proc.poll() is None:
        elapsed = time.monotonic() - t0
        if pending is not None and elapsed >= during_at:
            pending(proc.pid)
            pending = None
        if stop_when is not None and not interrupted and stop_when(elapsed):
            proc.send_signal(signal.SIGINT)
            interrupted = True
        if elapsed > timeout:
            if late is not None:
                late()
            raise FioFailed(f"fio did not finish within {timeout:.0f} s", argv=argv,
                            returncode=None)
        time.sleep(POLL_INTERVAL)
    return interrupted


def _result(raw: str, text: str, *, streaming: bool, workdir: Path, argv: tuple[str, ...],
            returncode: int | None) -> FioResult:
    """fio's parsed result (the last status object's when it streamed); FioFailed when there
    is none or a job ended with an error."""
    try:
        result = last_result(raw) if streaming else parse_fio_output(raw)
    except FioParseError as exc:
        raise FioFailed(f"fio printed no usable result: {exc}" + _space_cause(workdir),
                        argv=argv, returncode=returncode, output=text[-4000:]) from exc
    for job_stats in result.jobs:
        if job_stats.error:
            raise FioFailed(f"fio job {job_stats.name} ended with error {_errno(job_stats.error)}: "
                            f"{_first_error(text) or 'see fio output'}" + _space_cause(workdir),
                            argv=argv, returncode=returncode, output=text[-4000:])
    return result


def output_path(workdir: Path) -> Path:
    """Where run_fio has fio write its JSON (and, with stop_when, its status objects)."""
    return workdir / "fio.json"


def _first_error(text: str) -> str:
    """fio's first complaint on its console; JSON lines (``"error" : 0,``) are not one."""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith(('"', "{", "}")):
            continue
        if stripped.startswith("fio:") or "error" in stripped.lower() or "err=" in stripped:
            return stripped[:300]
    return ""


_JSON_ERROR = re.compile(r'"error"\s*:\s*([1-9]\d*)')


def _json_error(raw: str) -> str:
    """The first non-zero job error in fio's JSON output, with its meaning."""
    found = _JSON_ERROR.search(raw)
    return f"a job ended with error {_errno(int(found.group(1)))}" if found else ""


def _errno(number: int) -> str:
    """An errno as fio reports it, with its meaning: ``28 (No space left on device)``."""
    try:
        meaning = os.strerror(number) if number in errno.errorcode else ""
    except (ValueError, OverflowError):
        meaning = ""
    return f"{number} ({meaning})" if meaning else str(number)


def _space_cause(workdir: Path) -> str:
    """``; only 12.0 KiB free in /tmp/x ...`` when the filesystem of fio's job file, output and
    console is (nearly) full: the likely cause of a failure or of output that does not parse."""
    try:
        free = shutil.disk_usage(workdir).free
    except OSError:
        return ""
    if free >= LOW_SPACE:
        return ""
    return (f"; only {format_bytes(free)} free in {workdir} (fio's job file, output and console "
            "go there: free space there or point TMPDIR elsewhere)")
