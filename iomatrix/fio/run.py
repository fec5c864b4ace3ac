"""Running fio: one invocation per trial, JSON to a file, a timeout, parsed at the edge."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from iomatrix.errors import FioFailed, FioParseError
from iomatrix.fio.models import FioResult
from iomatrix.fio.parse import parse_fio_output
from iomatrix.proc import orphan_guard, stop


class FioRun(BaseModel):
    """One fio invocation: its parsed result, its raw output, and what it cost."""

    model_config = ConfigDict(frozen=True)
    result: FioResult
    raw_json: str
    argv: tuple[str, ...]
    wall_seconds: float


def run_fio(job: str, *, workdir: Path, timeout: float, fio: str = "fio",
            extra_args: Sequence[str] = (), during: Callable[[int], None] | None = None,
            during_at: float = 0.0, output_format: str = "json") -> FioRun:
    """Run ``job`` (job-file text) and parse its JSON. ``during(pid)`` is called once,
    ``during_at`` seconds after start, while fio runs (for /proc observation)."""
    job_path = workdir / "job.fio"
    out_path = workdir / "fio.json"
    job_path.write_text(job)
    out_path.unlink(missing_ok=True)
    argv = (fio, f"--output-format={output_format}", f"--output={out_path}", *extra_args,
            str(job_path))
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(orphan_guard(argv), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    except OSError as exc:
        raise FioFailed(f"cannot start fio: {exc.strerror or exc}", argv=argv,
                        returncode=None) from exc
    try:
        if during is not None:
            try:
                proc.wait(timeout=during_at)
            except subprocess.TimeoutExpired:
                during(proc.pid)
        try:
            console, _ = proc.communicate(timeout=max(1.0, timeout - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired as exc:
            raise FioFailed(f"fio did not finish within {timeout:.0f} s", argv=argv,
                            returncode=None) from exc
    finally:
        stop(proc, timeout=5)
    wall = time.monotonic() - t0
    text = console.decode(errors="replace")
    raw = out_path.read_text(errors="replace") if out_path.exists() else ""
    if proc.returncode != 0:
        detail = _first_error(text + raw) or f"exit {proc.returncode}"
        raise FioFailed(f"fio failed: {detail}", argv=argv, returncode=proc.returncode,
                        output=(text + raw)[-4000:])
    try:
        result = parse_fio_output(raw)
    except FioParseError as exc:
        raise FioFailed(f"fio printed no usable result: {exc}", argv=argv,
                        returncode=proc.returncode, output=text[-4000:]) from exc
    for job_stats in result.jobs:
        if job_stats.error:
            raise FioFailed(f"fio job {job_stats.name} ended with error {job_stats.error}: "
                            f"{_first_error(text) or 'see fio output'}", argv=argv,
                            returncode=proc.returncode, output=text[-4000:])
    return FioRun(result=result, raw_json=raw, argv=argv, wall_seconds=wall)


def _first_error(text: str) -> str:
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("fio:") or "error" in stripped.lower() or "err=" in stripped:
            return stripped[:300]
    return ""
