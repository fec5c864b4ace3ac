"""fio's latency, bandwidth and IOPS logs a workload asks for (``write_lat_log``,
``write_bw_log``, ``write_iops_log``: ``suite.fiooptions.LOG_OPTIONS``), kept with the run.

The job file's (or the suite's) value of such an option is never used: it is a path fio, as
root, would create or overwrite. The workload keeps only that it asked (``write_lat_log=1``);
the job fio runs names the log ``PREFIX`` in the trial's own directory, averaged over
``WINDOW_MS`` (per-I/O logs grow without bound: fio's default), and after the trial the files
fio wrote there are read back (regular files only, never through a link, ``MAX_BYTES`` in all)
and stored with the trial (``trials.logs_json``). Only a local fio writes them: fio's client
writes a server's logs under the name the SERVER sends (a guest's fio, a node's), which no
untrusted side may choose on this host; there the option is left out (docs/how-to/fio-job-files.md
says so)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from iomatrix.fio.persecond import WINDOW_MS
from iomatrix.suite.fiooptions import LOG_OPTIONS

PREFIX = "workload"
"""The name fio's logs start with in the trial's directory (``workload_lat.1.log``)."""
LOG_NAME = rf"^{PREFIX}_(?:lat|clat|slat|bw|iops)\.[0-9]{{1,4}}\.log$"
"""The names of the logs fio writes for ``PREFIX`` (one per job: ``per_job_logs``)."""
MAX_BYTES = 16 * 1024 * 1024
"""The most of a trial's logs kept; what lies beyond is cut at a line and said so."""
CUT = "\n# iomatrix: cut here, the trial's logs had more than {} bytes\n"


def asked(options: Iterable[tuple[str, str]]) -> tuple[str, ...]:
    """The log options among a workload's (``write_lat_log``...), as iomatrix names them."""
    return tuple(key for key, value in options if key in LOG_OPTIONS and value != "0")


def job_lines(options: Iterable[tuple[str, str]], directory: Path | None) -> list[str]:
    """The job's lines for the logs it asked for, written into ``directory`` (the trial's own;
    None: fio is remote, no log)."""
    wanted = asked(options)
    if not wanted or directory is None:
        return []
    prefix = directory / PREFIX
    return [*(f"{key}={prefix}" for key in wanted), f"log_avg_msec={WINDOW_MS}"]


def log_files(directory: Path) -> list[Path]:
    return sorted(directory.glob(f"{PREFIX}_*.log"))


def clear(directory: Path) -> None:
    """Remove what an earlier trial left (a failed one's logs are not kept)."""
    for path in log_files(directory):
        path.unlink(missing_ok=True)


def collect(directory: Path) -> dict[str, str]:
    """The logs fio wrote into ``directory``, by file name, removed as they are read; regular
    files only, opened without following a link, ``MAX_BYTES`` in all."""
    kept: dict[str, str] = {}
    room = MAX_BYTES
    for path in log_files(directory):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                continue
            data = f.read(room + 1)
        path.unlink(missing_ok=True)
        text = data[:room].decode("utf-8", errors="replace")
        if len(data) > room:
            text = text[:text.rfind("\n") + 1] + CUT.format(MAX_BYTES)
        kept[path.name] = text
        room = max(0, room - len(data))
    return kept


class TrialLogs:
    """One trial's logs: in ``workdir/logs`` where fio is local (``remote``: none), emptied
    before the trial, collected after it (``collect``) or thrown away after a failure."""

    def __init__(self, workdir: Path, *, remote: bool) -> None:
        self.directory = None if remote else workdir / "logs"

    def start(self) -> None:
        if self.directory is not None:
            self.directory.mkdir(mode=0o700, exist_ok=True)
            clear(self.directory)

    def collect(self) -> dict[str, str]:
        return collect(self.directory) if self.directory is not None else {}

    def discard(self) -> None:
        if self.directory is not None:
            clear(self.directory)
