"""ioping, the latency tool of seed 001 §9 ("IOPing Latenztest": ``ioping -c 10 .`` in each
guest and on the host's SSDs), and what makes fio's job in ``jobfile.ioping_job_text`` measure
the same thing.

What ``ioping -c 10 DIR`` does (ioping 1.3 as Debian 12 ships it; read in its ``ioping.c`` and
seen with strace):

- it makes an unnamed file in DIR (``O_TMPFILE``), writes 1 MiB of random data into it in 4 KiB
  ``pwrite`` calls and ``fsync``s it: that 1 MiB is the working set (``-S``; a file or device
  given instead of a directory is read in place, all of it unless ``-S``);
- ``posix_fadvise(POSIX_FADV_RANDOM)`` over the working set: no readahead;
- each request: an offset drawn at random (with replacement) among the working set's 4 KiB
  blocks (``-s``, 4 KiB by default), ``posix_fadvise(POSIX_FADV_DONTNEED)`` on that block, which
  drops it from the page cache, then one ``pread`` of 4 KiB through the page cache (not
  ``O_DIRECT``, which ``-D`` asks for): a cache miss, so one 4 KiB read reaches the device. Only
  the ``pread`` is timed (``CLOCK_MONOTONIC`` before and after);
- one request per interval (``-i``, 1 s), start to start; nothing else in flight: queue depth 1;
- since 1.2 the first request is a warm-up it does not count (``-a``, default 1); the study's
  ioping (0.9 or older: only those print the wall time its "Runtime 9.01 s" is) had none and
  counted all 10;
- it prints ``min/avg/max/mdev`` of the counted requests (mdev: their population standard
  deviation), and "iops", which is 1 / avg, not requests per second of wall time. The study's
  "IOPS in k" and "MiB/s" columns are that iops and 4 KiB × it; its "Runtime 9.01 s" is the
  wall time of 10 requests 1 s apart (1.x prints the sum of the requests' times there).

fio's equivalent (``ioping_job_text``), line by line:

- ``rw=randread``, ``bs`` (4 KiB), ``iodepth=1``, ``numjobs=1``, ``norandommap=1``: one random
  block at a time, drawn with replacement;
- ``size=1MiB``: the working set, the first 1 MiB of the image (ioping's own file would be
  freshly written; the image was preconditioned);
- ``direct=1``: fio cannot drop a block from the page cache before each read, and its buffered
  reads would hit the cache once a block has been read; ``O_DIRECT`` sends the same single 4 KiB
  read to the device and skips only the copy into the page cache (about a microsecond);
- ``ioengine=psync``: ``pread``, as ioping, wherever fio chooses the engine (host, guest, FUSE);
  over NBD (blocklayer) fio's nbd engine is the only way in;
- ``thinktime=INTERVAL``: fio waits one interval after each completion (ioping 0.9 slept after
  each request too; 1.x keeps start to start: the difference is one latency per interval);
- ``number_ios=COUNT``, no ramp, not time based: COUNT requests, every one counted, as the
  study's ioping counted all 10; ``lat`` (submission + completion), which for ``pread`` is the
  time around the call, as ioping times it.

iomatrix runs ioping as ``ioping -q -p 1 -a 0 -c COUNT -i INTERVAL -s BS -S 1m FILE``: each
request's raw statistics on a line of its own (``-p 1``, the format of 1.0 to 1.3: ten numbers,
times in ns), none a warm-up (``-a 0``, from 1.2; before, there was none), on the image itself,
not a new file in its directory. tests/fio/test_ioping.py runs both on the same file and checks that
they agree (``iomatrix.analysis.agreement``), and that a job at queue depth 16 does not.
"""

from __future__ import annotations

import functools
import math
import os
import re
import time
from pathlib import Path

from iomatrix.core.errors import ToolFailed, TrialFailed
from iomatrix.core.model import Frozen
from iomatrix.core.proc import run, which
from iomatrix.fio.samples import DirectionSample
from iomatrix.suite.workloads import IOPING_WORKING_SET, Workload
from iomatrix.vocab.words import Mode

OLDEST = (1, 0)
"""The oldest ioping whose raw statistics (``-p``) are ten numbers with times in ns."""
WARMUP_OPTION = (1, 2)
"""The first ioping with a warm-up request (``-a``), which iomatrix turns off."""
GRACE = 30.0
"""Seconds ioping may take beyond its requests and intervals before it is stopped."""
PERCENTILES = {"p50_ns": 50.0, "p90_ns": 90.0, "p99_ns": 99.0, "p99_9_ns": 99.9,
               "p99_99_ns": 99.99}
_VERSION = re.compile(r"ioping\s+(\d+)\.(\d+)")


class IopingTool(Frozen):
    """An ioping installed on this host, old enough to be read."""

    path: str
    version: str
    """As it names itself: "ioping 1.3"."""
    release: tuple[int, ...]


class IopingRun(Frozen):
    """One ioping invocation: the sample of its requests and what was run."""

    sample: DirectionSample
    output: str
    argv: tuple[str, ...]
    version: str
    wall_seconds: float


@functools.lru_cache(maxsize=4)
def find_ioping(name: str = "ioping") -> IopingTool | None:
    """The ioping on the PATH when it is 1.0 or later (whose output iomatrix reads), or None."""
    path = which(name)
    if path is None:
        return None
    try:
        text = run([path, "-v"], timeout=10).stdout.strip()
    except ToolFailed:
        return None
    m = _VERSION.search(text)
    if m is None or (int(m.group(1)), int(m.group(2))) < OLDEST:
        return None
    return IopingTool(path=path, version=m.group(0), release=(int(m.group(1)), int(m.group(2))))


def ioping_argv(tool: IopingTool, workload: Workload, file: str) -> list[str]:
    """The ioping command line of ``workload`` reading ``file``: one line of raw statistics per
    request, no warm-up, the working set's 1 MiB, each request ``bs``."""
    spec = workload.ioping
    if spec is None:
        raise ValueError(f"workload {workload.key} is not an ioping workload")
    warmup = ["-a", "0"] if tool.release >= WARMUP_OPTION else []
    return [tool.path, "-q", "-p", "1", *warmup, "-c", str(spec.count),
            "-i", spec.interval_text, "-s", str(workload.bs), "-S", str(IOPING_WORKING_SET),
            file]


def run_ioping(tool: IopingTool, workload: Workload, path: Path) -> IopingRun:
    """Run ``workload`` with ioping on ``path`` (a file or block device, read only) and parse
    what it printed. Runs in ``path``'s directory, naming it ``./NAME`` (which ioping cannot
    take for an option); stopped after the requests' time plus GRACE (ToolFailed).

    ioping drops each 4 KiB block from the page cache just before reading it, and that works
    only on a clean page cached alone. So ``path`` is first fsync'd (ioping does that to the
    file it writes: a dirty page survives DONTNEED; a precondition or a write through QEMU's
    cache leaves them) and its cached pages dropped whole: a block inside a larger folio
    (Linux 6.x page caches hold a file written in large requests so) survives a 4 KiB DONTNEED
    and would be read from RAM in 2 µs. ioping's own file, written 4 KiB at a time, has
    neither; fio's O_DIRECT reads need neither."""
    assert workload.ioping is not None
    argv = ioping_argv(tool, workload, f"./{path.name}")     # never read as an option
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    except OSError as exc:
        raise TrialFailed(f"cannot flush {path} before ioping: {exc.strerror or exc}") from exc
    t0 = time.monotonic()
    done = run(argv, timeout=workload.ioping.seconds + GRACE, cwd=path.parent)
    wall = time.monotonic() - t0
    return IopingRun(sample=parse_raw(done.stdout, workload), output=done.stdout,
                     argv=(*argv[:-1], str(path)), version=tool.version, wall_seconds=wall)


def parse_raw(text: str, workload: Workload) -> DirectionSample:
    """The sample of ioping's ``-p 1`` output: one line per request, "valid sum iops speed min
    avg max mdev count load_time" (times in ns), the request's time being ``sum`` where
    ``valid`` is 1. Mean, extremes and percentiles (nearest rank, as fio reads its histogram)
    of every request; the standard deviation with n − 1, as fio's; IOPS and bandwidth over the
    time from the first request to the end of the last (``load_time`` summed), as fio's over its
    runtime. TrialFailed unless every requested request was timed."""
    assert workload.ioping is not None
    times: list[int] = []
    elapsed = 0
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 10 or not all(f.isdigit() for f in fields):
            raise TrialFailed(f"ioping printed {line[:80]!r} (line {number}), not ten numbers "
                              "(its raw statistics, -p)")
        valid, total, count, load = int(fields[0]), int(fields[1]), int(fields[8]), int(fields[9])
        if valid != 1 or count != 1:
            raise TrialFailed(f"ioping line {number}: {valid} of {count} requests timed (a "
                              "request it did not count: too fast, too slow, or a warm-up)")
        times.append(total)
        elapsed += load
    if len(times) != workload.ioping.count:
        raise TrialFailed(f"ioping timed {len(times)} requests, {workload.ioping.count} were asked")
    n = len(times)
    mean = sum(times) / n
    ordered = sorted(times)
    seconds = elapsed / 1e9
    iops = n / seconds if seconds > 0 else 0.0
    return DirectionSample(
        direction="read", iops=iops, bw_bytes=iops * workload.bs, io_bytes=n * workload.bs,
        total_ios=n, runtime_ms=round(elapsed / 1e6),
        lat_mean_ns=mean, lat_stdev_ns=math.sqrt(sum((t - mean) ** 2 for t in times) / (n - 1)),
        lat_min_ns=float(ordered[0]), lat_max_ns=float(ordered[-1]),
        **{name: float(ordered[max(0, math.ceil(p / 100 * n) - 1)])
           for name, p in PERCENTILES.items()})


def tool_note(tool: IopingTool | None, modes: set[str]) -> str:
    """The run note saying which tool measures its ioping workloads in each of ``modes``."""
    fio_modes = sorted(modes - {Mode.HOST} if tool else modes)
    parts = []
    if tool and Mode.HOST in modes:
        parts.append(f"host (bare metal) by {tool.version} ({tool.path})")
    if fio_modes:
        parts.append(f"{', '.join(fio_modes)} by fio's equivalent job (4 KiB random reads of "
                     "the first 1 MiB, direct, psync or nbd, QD1, a think time of one interval, "
                     "every request counted)")
    missing = "" if tool or Mode.HOST not in modes else " (ioping 1.0 or later is not installed)"
    return "ioping workloads (seed 001 §9): measured in " + "; ".join(parts) + missing
