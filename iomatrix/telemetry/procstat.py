"""Per-thread CPU time and context switches of the processes iomatrix started, from /proc.

A :func:`snapshot` reads, for each given pid and every descendant (fio forks one process per
job), each thread's ``utime``/``stime`` from ``/proc/PID/task/TID/stat`` and its voluntary and
involuntary context switches from ``.../status``. :func:`cpu_delta` subtracts two snapshots and
groups threads by role (:func:`classify`).

Threads that appear between the snapshots count in full (they started after the first one).
A thread that vanishes takes its own figures with it; its CPU time since the first snapshot is
recovered from its process's totals, which the kernel keeps: ``/proc/PID/stat`` ``utime+stime``
include the process's exited threads, ``cutime+cstime`` its reaped children (fio's job
processes, reaped by fio's main process). That time is in :attr:`CpuCost.exited_cpu_s`, with no
role, and without context switches (the kernel does not keep those). The CPU of a process that
vanished together with its parent is lost (:attr:`CpuCost.lost_processes`).

Resolution: /proc counts in clock ticks (USER_HZ, 100 per second here), truncated per thread.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path

from iomatrix.core.model import Frozen

ROLES = ("vcpu", "iothread", "main loop", "worker pool", "daemon", "fio", "other")
_TICK = 1.0 / os.sysconf("SC_CLK_TCK")
MIB = 1 << 20


class _Counters(Frozen):
    """CPU time and context switches (of one thread, or summed over threads)."""

    user_s: float
    sys_s: float
    voluntary: int
    involuntary: int

    @property
    def cpu_s(self) -> float:
        return self.user_s + self.sys_s


class ThreadSample(_Counters):
    """One thread's counters at one moment."""

    pid: int
    tid: int
    start_ticks: int
    """Start time in clock ticks after boot: tells a thread from a later one with the same tid."""
    process: str
    """The process's command name (its main thread's comm, at most 15 characters)."""
    thread: str
    """The thread's name: "CPU 0/KVM", "IO iothread0", "worker", "qemu-system-x86", "fio"."""


class ProcessSample(Frozen):
    """One process's totals at one moment (exited threads and reaped children included)."""

    pid: int
    ppid: int
    start_ticks: int
    comm: str
    cpu_s: float
    """utime + stime of every thread, exited ones included."""
    children_cpu_s: float
    """cutime + cstime: children the process has reaped (and their reaped children)."""


class ThreadTimes(Frozen):
    """A snapshot of some processes, their descendants and all their threads."""

    at: float
    """time.monotonic() when the snapshot began."""
    processes: tuple[ProcessSample, ...]
    threads: tuple[ThreadSample, ...]


class RoleCost(_Counters):
    """CPU time and context switches of the threads of one role between two snapshots."""

    role: str
    threads: int


class CpuCost(Frozen):
    """What the observed processes cost between two snapshots."""

    seconds: float
    """Wall time between the snapshots."""
    roles: tuple[RoleCost, ...]
    """In the order of :data:`ROLES`; only roles that had threads."""
    exited_cpu_s: float
    """CPU time of threads and child processes that ended between the snapshots (their role is
    unknown, their context switches lost)."""
    appeared: int
    vanished: int
    lost_processes: int
    """Processes that vanished with their parent: their CPU time since the first snapshot is
    not counted anywhere."""

    @property
    def cpu_s(self) -> float:
        return sum(r.cpu_s for r in self.roles) + self.exited_cpu_s

    @property
    def voluntary(self) -> int:
        return sum(r.voluntary for r in self.roles)

    @property
    def involuntary(self) -> int:
        return sum(r.involuntary for r in self.roles)

    def role(self, name: str) -> RoleCost | None:
        return next((r for r in self.roles if r.role == name), None)


class PerUnit(Frozen):
    """A :class:`CpuCost` divided by the I/Os or the MiB it served."""

    unit: str
    """"I/O" or "MiB" (2**20 bytes)."""
    units: float
    cpu_s: float
    """CPU seconds per unit, exited threads included."""
    by_role: dict[str, float]
    """CPU seconds per unit of each role."""
    voluntary: float
    involuntary: float


def snapshot(pids: Iterable[int], *, descendants: bool = True,
             proc: Path = Path("/proc")) -> ThreadTimes:
    """Read every thread of ``pids`` (and, by default, of all their descendants). Processes that
    are gone are skipped; a zombie still shows its final totals until it is reaped."""
    at = time.monotonic()
    wanted = process_tree(pids, proc=proc) if descendants else set(pids)
    processes = []
    threads = []
    for pid in sorted(wanted):
        try:
            fields, comm = _stat(proc / str(pid) / "stat")
            ppid, start = int(fields[1]), int(fields[19])
            processes.append(ProcessSample(
                pid=pid, ppid=ppid, start_ticks=start, comm=comm,
                cpu_s=(int(fields[11]) + int(fields[12])) * _TICK,
                children_cpu_s=(int(fields[13]) + int(fields[14])) * _TICK))
            tids = [int(t) for t in os.listdir(proc / str(pid) / "task") if t.isdigit()]
        except (OSError, ValueError, IndexError):
            continue   # exited while we looked
        for tid in sorted(tids):
            sample = _thread(proc / str(pid) / "task" / str(tid), pid, tid, comm)
            if sample is not None:
                threads.append(sample)
    return ThreadTimes(at=at, processes=tuple(processes), threads=tuple(threads))


def classify(process: str, thread: str, *, main: bool) -> str:
    """The role of a thread, from QEMU's thread names (``-name debug-threads=on``; QEMU 7.2's
    qemu-storage-daemon cannot name its threads, so they all read "qemu-storage-da")."""
    if process == "fio":
        return "fio"
    if "/KVM" in thread or "/TCG" in thread or "/HVF" in thread:
        return "vcpu"   # "CPU 0/KVM", "CPU 1/TCG", single-threaded TCG's "ALL CPUs/TCG"
    if thread.startswith("IO "):
        return "iothread"   # "IO <iothread id>", "IO mon_iothread"
    if thread == "worker":
        return "worker pool"
    if process.startswith("qemu-storage-da"):
        return "daemon"
    if main and process.startswith("qemu-system"):
        return "main loop"
    return "other"


def cpu_delta(before: ThreadTimes, after: ThreadTimes, *,
              roles: Mapping[int, str] | None = None) -> CpuCost:
    """What the threads of two snapshots of the same pids cost in between, by role. ``roles``
    maps thread ids to a role where names do not tell it (QMP's ``query-iothreads`` and
    ``query-cpus-fast`` give the thread ids of iothreads and vCPUs)."""
    overrides = roles or {}
    unknown = set(overrides.values()) - set(ROLES)
    if unknown:
        raise ValueError(f"unknown roles {sorted(unknown)}; roles are {', '.join(ROLES)}")
    old = {(t.tid, t.start_ticks): t for t in before.threads}
    new = {(t.tid, t.start_ticks): t for t in after.threads}
    sums: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0, 0, 0])
    counted: dict[int, float] = defaultdict(float)   # per pid: CPU of its counted threads
    for key, t in new.items():
        prev = old.get(key)
        role = overrides.get(t.tid) or classify(t.process, t.thread, main=t.tid == t.pid)
        acc = sums[role]
        acc[0] += 1
        acc[1] += max(0.0, t.user_s - (prev.user_s if prev else 0.0))
        acc[2] += max(0.0, t.sys_s - (prev.sys_s if prev else 0.0))
        acc[3] += t.voluntary - (prev.voluntary if prev else 0)
        acc[4] += t.involuntary - (prev.involuntary if prev else 0)
        counted[t.pid] += t.cpu_s - (prev.cpu_s if prev else 0.0)
    exited, lost = _exited(before, after, counted)
    costs = tuple(RoleCost(role=name, threads=int(sums[name][0]), user_s=sums[name][1],
                           sys_s=sums[name][2], voluntary=int(sums[name][3]),
                           involuntary=int(sums[name][4]))
                  for name in ROLES if name in sums)
    return CpuCost(seconds=after.at - before.at, roles=costs, exited_cpu_s=exited,
                   appeared=len(new.keys() - old.keys()), vanished=len(old.keys() - new.keys()),
                   lost_processes=lost)


def per_io(cost: CpuCost, ios: int) -> PerUnit:
    """``cost`` per I/O (ValueError when ``ios`` is not positive)."""
    return _per(cost, float(ios), "I/O")


def per_mb(cost: CpuCost, nbytes: int) -> PerUnit:
    """``cost`` per MiB moved (ValueError when ``nbytes`` is not positive)."""
    return _per(cost, nbytes / MIB, "MiB")


def _per(cost: CpuCost, units: float, unit: str) -> PerUnit:
    if units <= 0:
        raise ValueError(f"cannot normalize CPU cost per {unit}: {units} {unit}")
    return PerUnit(unit=unit, units=units, cpu_s=cost.cpu_s / units,
                   by_role={r.role: r.cpu_s / units for r in cost.roles},
                   voluntary=cost.voluntary / units, involuntary=cost.involuntary / units)


def _exited(before: ThreadTimes, after: ThreadTimes,
            counted: Mapping[int, float]) -> tuple[float, int]:
    """CPU time of threads and children that ended between the snapshots, recovered from
    process totals; and the number of vanished processes whose parent vanished too."""
    old = {(p.pid, p.start_ticks): p for p in before.processes}
    new = {(p.pid, p.start_ticks): p for p in after.processes}
    gone = [p for key, p in old.items() if key not in new]
    alive = {p.pid for p in after.processes}
    threads_after: dict[int, int] = defaultdict(int)
    for t in after.threads:
        threads_after[t.pid] += 1
    total = 0.0
    for key, p in new.items():
        prev = old.get(key)
        own = p.cpu_s - (prev.cpu_s if prev else 0.0) - counted.get(p.pid, 0.0)
        reaped = p.children_cpu_s - (prev.children_cpu_s if prev else 0.0) - sum(
            g.cpu_s + g.children_cpu_s for g in gone if g.ppid == p.pid)
        # Each thread's figure is truncated to a tick, the process total once: differences
        # within that bound are rounding, not an exited thread.
        bound = (threads_after[p.pid] + 1) * _TICK
        total += (own if own > bound else 0.0) + (reaped if reaped > _TICK else 0.0)
    lost = sum(1 for g in gone if g.ppid not in alive)
    return total, lost


def process_tree(pids: Iterable[int], *, proc: Path = Path("/proc")) -> set[int]:
    """``pids`` and all their living descendants."""
    roots = set(pids)
    children: dict[int, list[int]] = defaultdict(list)
    for entry in os.scandir(proc):
        if not entry.name.isdigit():
            continue
        try:
            fields, _ = _stat(Path(entry.path) / "stat")
        except (OSError, ValueError, IndexError):
            continue
        children[int(fields[1])].append(int(entry.name))
    found: set[int] = set()
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found and child not in roots:
                found.add(child)
                todo.append(child)
    return roots | found


def _thread(task: Path, pid: int, tid: int, process: str) -> ThreadSample | None:
    try:
        fields, name = _stat(task / "stat")
        status = (task / "status").read_text()
    except (OSError, ValueError, IndexError):
        return None
    switches = {"voluntary_ctxt_switches": 0, "nonvoluntary_ctxt_switches": 0}
    for line in status.splitlines():
        key, _, value = line.partition(":")
        if key in switches:
            switches[key] = int(value)
    return ThreadSample(pid=pid, tid=tid, start_ticks=int(fields[19]), process=process,
                        thread=name, user_s=int(fields[11]) * _TICK,
                        sys_s=int(fields[12]) * _TICK,
                        voluntary=switches["voluntary_ctxt_switches"],
                        involuntary=switches["nonvoluntary_ctxt_switches"])


def _stat(path: Path) -> tuple[list[str], str]:
    """The fields after the command name of a /proc stat file (state first), and the name."""
    text = path.read_bytes().decode(errors="replace")
    open_, close = text.index("("), text.rindex(")")
    return text[close + 2:].split(), text[open_ + 1:close]
