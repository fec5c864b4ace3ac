"""fio's status stream, read while fio runs, so that a runner can stop fio once it is steady.

With ``--status-interval=1`` and ``--output-format=json`` (or ``json+``) fio appends one complete
JSON object per interval to its ``--output`` file, and the final result when it ends. What fio 3.33
writes (checked with real fio, see tests/telemetry/test_steady.py):

- one object per interval, then the final object: a 6 s ``time_based`` job gives 6 + 1 = 7.
  All objects have the same keys, ``"disk_util"`` included: the final result is the **last
  object in the file once fio has exited**, and nothing inside it marks it as final.
  ``parse_fio_output`` on the whole file returns the *first* object (one second of I/O): use
  :func:`last_result`.
- figures are cumulative: ``total_ios``, ``io_bytes``, ``job_runtime``, ``usr_cpu``/``sys_cpu``
  (percent of that runtime) since the job started.
- ``ramp_time``: the objects during the ramp count the ramp's I/O; when the ramp ends fio zeroes
  its counters, so the next object's ``total_ios`` and ``job_runtime`` start again from zero (and
  the interval at the reset prints nothing: ramp 2 s + runtime 4 s gives 2 + 4 + 1 = 7 objects).
  :func:`intervals` detects the reset; with ``ramp=True`` the intervals before it are marked.
- SIGINT to fio's main process stops its job processes within ~0.1 s; fio then writes the final
  object (the I/O up to the stop) and exits with status **128**, not 0. SIGINT during the ramp
  gives a final object of ramp I/O, so stop only after the ramp.

Integration with a runner: start fio with ``--status-interval=1``, make ``StatusStream(output)``,
call ``poll()`` every ~0.5 s (or use :class:`SteadyWatch`), send SIGINT once steady, wait, then
``last_result(file text)``.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any


from iomatrix.core.errors import FioParseError
from iomatrix.fio.models import FioResult
from iomatrix.fio.parse import decode_json, parse_fio_json
from iomatrix.core.model import Frozen

__all__ = ["StatusReport", "StatusStream", "Interval", "intervals", "interval_iops",
           "last_result", "SIGINT_EXIT"]

SIGINT_EXIT = 128
"""fio's exit status after SIGINT (it still writes its final result)."""

_OBJECT_START = re.compile(r"^\{", re.MULTILINE)
# fio closes each top-level object with "}" alone on a line (nested ones are indented).
_OBJECT_END = re.compile(r"^\}[ \t]*$", re.MULTILINE)
_DECODER = json.JSONDecoder()
# A reset (ramp end) shows as job runtime growing by much less than the wall clock between reports.
_RESET_SLACK_MS = 250


class StatusReport(Frozen):
    """One object of fio's status stream: cumulative figures since the job (or its ramp) began."""

    result: FioResult
    timestamp_ms: int | None
    """fio's wall clock when it wrote the object (``timestamp_ms``; absent in old fio)."""

    @property
    def total_ios(self) -> int:
        return sum(j.read.total_ios + j.write.total_ios for j in self.result.jobs)

    @property
    def io_bytes(self) -> int:
        return sum(j.read.io_bytes + j.write.io_bytes for j in self.result.jobs)

    @property
    def runtime_ms(self) -> int:
        return max(j.job_runtime_ms for j in self.result.jobs)


class StatusStream:
    """Reads the complete JSON objects fio has appended to ``path`` so far; a partial trailing
    object is kept for the next :meth:`poll`. The file need not exist yet."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.reports: list[StatusReport] = []
        self._offset = 0
        self._text = ""
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def poll(self) -> list[StatusReport]:
        """The objects completed since the last call (also appended to ``reports``)."""
        try:
            with open(self.path, "rb") as f:
                f.seek(0, 2)
                if f.tell() < self._offset:   # fio truncated it (a new run): start over
                    self._offset, self._text = 0, ""
                    self._utf8.reset()
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        if not data:
            return []
        self._offset += len(data)
        self._text += self._utf8.decode(data)
        new = []
        consumed = 0
        for obj, prelude, end in _objects(self._text):
            new.append(_report(obj, prelude))
            consumed = end
        self._text = self._text[consumed:]
        self.reports.extend(new)
        return new


class Interval(Frozen):
    """The I/O between two successive status reports."""

    end_ms: int
    """fio's job runtime at the end of the interval (restarts at 0 when the ramp ends)."""
    seconds: float
    ios: int
    io_bytes: int
    ramp: bool
    """Part of ``ramp_time`` (before fio zeroed its counters)."""

    @property
    def iops(self) -> float:
        return self.ios / self.seconds

    @property
    def bw_bytes(self) -> float:
        return self.io_bytes / self.seconds


def intervals(reports: Sequence[StatusReport], *, ramp: bool = False) -> list[Interval]:
    """Per-interval I/O from successive cumulative reports: differences of fio's totals over
    differences of its job runtime. A report where fio zeroed its counters (the end of
    ``ramp_time``) counts from zero; with ``ramp`` (the job has a ramp_time) the intervals before
    that reset are marked ``ramp``. Intervals of no runtime are left out."""
    out = []
    in_ramp = ramp
    prev: StatusReport | None = None
    for report in reports:
        if prev is not None and _was_reset(prev, report):
            prev = None
            in_ramp = False
        base_ms = prev.runtime_ms if prev else 0
        base_ios = prev.total_ios if prev else 0
        base_bytes = prev.io_bytes if prev else 0
        seconds = (report.runtime_ms - base_ms) / 1000.0
        if seconds > 0:
            out.append(Interval(end_ms=report.runtime_ms, seconds=seconds,
                                ios=report.total_ios - base_ios,
                                io_bytes=report.io_bytes - base_bytes, ramp=in_ramp))
        prev = report
    return out


def interval_iops(reports: Sequence[StatusReport], *, ramp: bool = False) -> list[float]:
    """IOPS of each measured (non-ramp) interval, in order."""
    return [i.iops for i in intervals(reports, ramp=ramp) if not i.ramp]


def _was_reset(prev: StatusReport, cur: StatusReport) -> bool:
    if cur.runtime_ms < prev.runtime_ms or cur.total_ios < prev.total_ios:
        return True
    if prev.timestamp_ms is None or cur.timestamp_ms is None:
        return False
    wall = cur.timestamp_ms - prev.timestamp_ms
    return cur.runtime_ms - prev.runtime_ms < wall - _RESET_SLACK_MS


def last_result(text: str) -> FioResult:
    """The final result in the text of a status-stream output file: its last complete JSON
    object (a partial trailing object, from a killed fio, is ignored). FioParseError when there
    is none."""
    last: tuple[dict[str, Any], str] | None = None
    for obj, prelude, _ in _objects(text):
        last = (obj, prelude)
    if last is None:
        raise FioParseError("no complete JSON object in fio's status-stream output")
    return parse_fio_json(last[0], prelude=last[1])


def _objects(text: str) -> Iterator[tuple[dict[str, Any], str, int]]:
    """Each complete top-level object in ``text``: (object, non-blank text before it, end)."""
    pos = 0
    while True:
        start = _OBJECT_START.search(text, pos)
        if start is None:
            return
        decoded = _decode_complete(text, start.start())
        if decoded is None:
            return
        obj, end = decoded
        yield obj, text[pos:start.start()].strip(), end
        pos = end


def _decode_complete(text: str, start: int) -> tuple[dict[str, Any], int] | None:
    """The object that starts at ``start`` and the index after it; None while it is still being
    written."""
    try:
        obj, end = _DECODER.raw_decode(text, start)
    except json.JSONDecodeError:
        # Incomplete, or fio's bare nan/inf (which parse's decoder repairs) in a complete one.
        close = _OBJECT_END.search(text, start)
        if close is None:
            return None
        end = close.end()
        obj = decode_json(text[start:end], 0)
    if not isinstance(obj, dict):
        raise FioParseError(f"fio status stream: expected an object, got {type(obj).__name__}")
    return obj, end


def _report(obj: dict[str, Any], prelude: str) -> StatusReport:
    stamp = obj.get("timestamp_ms")
    return StatusReport(result=parse_fio_json(obj, prelude=prelude),
                        timestamp_ms=stamp if isinstance(stamp, int) else None)
