"""CPU cycles and instructions of given processes, from ``perf stat``, where the host can count
them. :func:`perf_problem` says plainly why not: perf missing (Debian package ``linux-perf``),
refused by ``kernel.perf_event_paranoid``, or no hardware counters (a VM whose hypervisor does
not expose a PMU: perf then reports ``<not supported>`` for cycles).

``perf stat -p PIDS`` counts the threads of PIDS that exist when it attaches and every thread or
process they create afterwards (perf inherits counters); pass the descendants that already exist
(``procstat.process_tree``). Counting ends on SIGINT, after which perf prints its counts.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Sequence
from pathlib import Path


from iomatrix.core.errors import ToolFailed
from iomatrix.core.proc import last_line, orphan_guard, require, run, which
from iomatrix.core.model import Frozen

HARDWARE_EVENTS = ("cycles", "instructions")
INSTALL_HINT = "perf not installed (apt-get install linux-perf)"
_STOP_TIMEOUT = 10.0


class PerfCounts(Frozen):
    """What ``perf stat`` counted over a window."""

    seconds: float
    counts: dict[str, float | None]
    """Per event as asked for; None where perf counted nothing ("<not counted>": the threads
    never ran) or cannot count it ("<not supported>")."""

    @property
    def cycles(self) -> float | None:
        return self.counts.get("cycles")

    @property
    def instructions(self) -> float | None:
        return self.counts.get("instructions")

    def per(self, units: float) -> dict[str, float | None]:
        """Each count divided by ``units`` (I/Os, or MiB moved)."""
        if units <= 0:
            raise ValueError(f"cannot normalize perf counts per {units} units")
        return {event: None if value is None else value / units
                for event, value in self.counts.items()}


def perf_problem(perf: str = "perf") -> str | None:
    """None when ``perf stat`` counts cycles and instructions here; else why not, in one line."""
    path = which(perf)
    if path is None:
        return INSTALL_HINT
    return _probe(path)


@functools.cache
def _probe(path: str) -> str | None:
    try:
        done = run([path, "stat", "-x,", "-e", ",".join(HARDWARE_EVENTS), "--", "true"],
                   timeout=30, check=False)
    except ToolFailed as exc:
        return f"perf cannot run: {exc}"
    text = done.stderr
    if done.returncode != 0:
        return _refusal(text) or f"perf stat failed (exit {done.returncode}): {last_line(text)}"
    counts = _parse(text, HARDWARE_EVENTS)
    if all(counts.get(e) is not None for e in HARDWARE_EVENTS):
        return None
    if "<not supported>" in text:
        where = "in this VM" if _in_vm() else "on this host"
        return (f"perf reports cycles not supported {where} "
                "(no hardware performance counters exposed to the kernel)")
    return _refusal(text) or f"perf counted no cycles: {last_line(text)}"


def count(pids: Iterable[int], seconds: float, *, events: Sequence[str] = HARDWARE_EVENTS,
          perf: str = "perf") -> PerfCounts:
    """Count ``events`` of ``pids`` (and the threads they create) for ``seconds``.
    EnvironmentProblem without perf; ToolFailed when perf cannot attach (a pid is gone)."""
    path = _require(perf)
    argv = [path, "stat", "-x,", "-e", ",".join(events), "-p", _pid_list(pids),
            "--", "sleep", f"{seconds:g}"]
    t0 = time.monotonic()
    done = run(argv, timeout=seconds + 30, check=False)
    elapsed = time.monotonic() - t0
    if done.returncode != 0:
        raise ToolFailed(f"perf stat failed (exit {done.returncode}): {last_line(done.stderr)}",
                         argv=argv, returncode=done.returncode, output=done.stderr[-2000:])
    return PerfCounts(seconds=elapsed, counts=_parse(done.stderr, events))


class PerfStat:
    """``perf stat`` attached to ``pids`` between :meth:`start` and :meth:`stop` (SIGINT);
    as a context manager it always stops (and reaps) perf."""

    def __init__(self, pids: Iterable[int], *, events: Sequence[str] = HARDWARE_EVENTS,
                 perf: str = "perf") -> None:
        self.pids = list(pids)
        self.events = tuple(events)
        self.perf = perf
        self._proc: subprocess.Popen[str] | None = None
        self._t0 = 0.0
        self.argv: list[str] = []

    @property
    def pid(self) -> int | None:
        """perf's process while it counts; None before start, after stop or once it exited."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def start(self) -> PerfStat:
        path = _require(self.perf)
        self.argv = [path, "stat", "-x,", "-e", ",".join(self.events), "-p",
                     _pid_list(self.pids)]
        try:
            self._proc = subprocess.Popen(orphan_guard(self.argv), stdin=subprocess.DEVNULL,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                          text=True, errors="replace", start_new_session=True)
        except OSError as exc:
            raise ToolFailed(f"cannot start perf: {exc.strerror or exc}", argv=self.argv,
                             returncode=None) from exc
        self._t0 = time.monotonic()
        return self

    def stop(self) -> PerfCounts:
        """Stop counting; what perf counted. ToolFailed when perf had failed (it exits at once
        when it cannot attach)."""
        proc = self._proc
        if proc is None:
            raise RuntimeError("PerfStat.stop() before start()")
        self._proc = None
        elapsed = time.monotonic() - self._t0
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=_STOP_TIMEOUT)
        except subprocess.TimeoutExpired as exc:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise ToolFailed(f"perf did not stop within {_STOP_TIMEOUT:.0f} s of SIGINT",
                             argv=self.argv, returncode=None) from exc
        # perf re-raises SIGINT after printing its counts: -SIGINT is its normal end here.
        if proc.returncode not in (0, -signal.SIGINT):
            raise ToolFailed(f"perf stat failed (exit {proc.returncode}): {last_line(err)}",
                             argv=self.argv, returncode=proc.returncode, output=err[-2000:])
        return PerfCounts(seconds=elapsed, counts=_parse(err, self.events))

    def __enter__(self) -> PerfStat:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            with contextlib.suppress(ToolFailed):
                self.stop()


def _parse(text: str, events: Sequence[str]) -> dict[str, float | None]:
    """perf stat's CSV (``-x,``): value,unit,event,run time,percentage,... per line."""
    found: dict[str, float | None] = {}
    for line in text.splitlines():
        fields = line.split(",")
        if len(fields) < 3 or line.startswith("#"):
            continue
        name = fields[2].split(":")[0]   # "cycles:u" when perf restricts itself to user space
        if name not in events:
            continue
        try:
            found[name] = float(fields[0])
        except ValueError:
            found[name] = None            # <not counted>, <not supported>
    return {event: found.get(event) for event in events}


def _refusal(text: str) -> str | None:
    if "perf_event_paranoid" in text or "Permission" in text or "not permitted" in text:
        level = Path("/proc/sys/kernel/perf_event_paranoid")
        value = level.read_text().strip() if level.exists() else "?"
        return (f"perf may not count here: kernel.perf_event_paranoid={value} "
                "(run as root, or lower it with sysctl)")
    if "not found for kernel" in text:   # Debian's wrapper without a perf for this kernel
        return f"perf does not match the running kernel {os.uname().release}: {last_line(text)}"
    return None


def _in_vm() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and " hypervisor" in line for line in f)
    except OSError:
        return False


def _require(perf: str) -> str:
    return require(perf, hint="install it: apt-get install linux-perf")


def _pid_list(pids: Iterable[int]) -> str:
    listed = sorted(set(pids))
    if not listed:
        raise ValueError("perf stat needs at least one pid")
    return ",".join(str(p) for p in listed)
