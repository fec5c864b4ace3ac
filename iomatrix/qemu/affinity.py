"""CPU affinity of QEMU's threads (``vcpu_affinity``, ``iothread_affinity``, ``main_affinity``)
and of fio where it runs on the host: pinned and read back.

QEMU has no per-thread affinity option: like libvirt (vcpupin, iothreadpin, emulatorpin), iomatrix
pins each thread after QEMU started, before any workload runs: the vCPU threads as QMP
``query-cpus-fast`` names them (``thread-id``), the IOThreads as ``query-iothreads`` does, and the
main loop, QEMU's main thread (the process's own task id), each with ``os.sched_setaffinity``
(threads QEMU starts later, such as aio=threads' workers, inherit their creator's set). What each
thread is allowed is read back from ``/proc/PID/task/TID/status`` (``Cpus_allowed_list``) with the
CPU it last ran on (field 39 of ``/proc/PID/task/TID/stat``) after every trial: a thread whose
set is not the one asked (another program re-pinned it) fails the trial with the difference.
The CPU it last ran on is recorded, never compared: a thread that slept since it was pinned still
shows where it ran before.

A level is a CPU set, or "numa": the CPUs of the NUMA node of the device holding the
configuration's image (every online CPU, with a note, where the device has none: a loop device,
a virtual disk)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from iomatrix.core import cpuset
from iomatrix.core.errors import ToolFailed, TrialFailed
from iomatrix.qemu.qmp import qmp_execute
from iomatrix.suite.configuration import Configuration
from iomatrix.telemetry.host import device_of

ROLES = {"vcpu": "vcpu_affinity", "iothread": "iothread_affinity", "main": "main_affinity"}
"""Each thread role and the axis that pins it."""
PROC = Path("/proc")
FIO_WAIT = 10.0
"""How long fio's jobs are looked for, and looked at again while they show other CPUs than
asked (``Pinning.observe_fio``)."""


class Thread(BaseModel):
    """One thread of a QEMU process that an axis pins."""

    model_config = ConfigDict(frozen=True)
    role: str
    """vcpu, iothread or main (``ROLES``)."""
    name: str
    """How the applied record names it: ``vcpu0``, ``iothread.iot0``, ``main``."""
    pid: int
    tid: int
    lasting: bool = True
    """Missed when it is gone (False: a daemon thread that may end, such as a pool worker)."""


class Placement(BaseModel):
    """The CPUs asked for each role of a configuration, resolved on this host."""

    model_config = ConfigDict(frozen=True)
    cpus: dict[str, frozenset[int]] = {}
    """Role → its CPUs (only the roles the configuration pins)."""
    notes: tuple[str, ...] = ()
    """What "numa" fell back to, where it did."""

    def applied(self) -> dict[str, str]:
        """The sets asked, as the applied record names them (``affinity.vcpu.asked``)."""
        out = {f"affinity.{role}.asked": cpuset.shown(cpus) for role, cpus in self.cpus.items()}
        if self.notes:
            out["affinity.note"] = "; ".join(self.notes)
        return out


def storage_device(path: Path | None) -> str | None:
    """The block device (its /sys/class/block name) holding ``path``, or ``path`` itself when it
    is one; None where there is none (a network volume, tmpfs)."""
    if path is None:
        return None
    try:
        return device_of(path)
    except OSError:
        return None


def placement(config: Configuration, image_path: Path | None) -> Placement:
    """The CPUs ``config`` asks for each role on this host ("numa" resolved for the
    device holding ``image_path``); TrialFailed (one line) for CPUs this host does not have
    online (the precheck refused those before the run: the host changed since)."""
    cpus: dict[str, frozenset[int]] = {}
    notes: list[str] = []
    for role, axis in ROLES.items():
        level = getattr(config, axis)
        if level is None:
            continue
        try:
            cpus[role], note = cpuset.resolve(level, storage_device(image_path))
        except (ValueError, OSError) as exc:
            raise TrialFailed(f"{ROLES[role]}: {exc}") from exc
        if note and note not in notes:
            notes.append(note)
    return Placement(cpus=cpus, notes=tuple(notes))


def qemu_threads(qmp_socket: Path, pid: int) -> list[Thread]:
    """The threads of a guest's QEMU ``pid`` that the axes pin, as its QMP names them: each
    vCPU, each IOThread, and the main thread. vCPUs sharing one thread (single-threaded TCG) are
    that thread once."""
    try:
        cpus, iothreads = qmp_execute(qmp_socket, [("query-cpus-fast", None),
                                                   ("query-iothreads", None)])
    except ToolFailed as exc:
        raise TrialFailed(f"QEMU's threads could not be listed over QMP: {exc}") from exc
    threads = [Thread(role="main", name="main", pid=pid, tid=pid)]
    seen = {pid}
    for cpu in cpus:
        tid = int(cpu["thread-id"])
        if tid not in seen:
            seen.add(tid)
            threads.append(Thread(role="vcpu", name=f"vcpu{cpu['cpu-index']}", pid=pid, tid=tid))
    for iothread in iothreads:
        threads.append(Thread(role="iothread", name=f"iothread.{iothread['id']}", pid=pid,
                              tid=int(iothread["thread-id"])))
    return threads


def daemon_threads(pid: int, proc: Path = PROC) -> list[Thread]:
    """qemu-storage-daemon's threads other than its main one, which its QMP does not tell apart
    (``query-iothreads`` is the system emulator's; QEMU 10's monitor thread waits in an event
    loop as its IOThreads do): its IOThreads, RCU and monitor threads, all pinned to the
    iothread_affinity CPUs and read back as ``daemon.TID``; threads it starts later (thread-pool
    workers, started by the IOThread serving the export) inherit their creator's set. A thread
    that ends (a pool worker of the start) is not missed."""
    tasks = sorted(int(t.name) for t in (proc / str(pid) / "task").iterdir())
    return [Thread(role="iothread", name=f"daemon.{tid}", pid=pid, tid=tid, lasting=False)
            for tid in tasks if tid != pid]


def pin_threads(threads: Iterable[Thread], where: Placement) -> None:
    """Each thread whose role ``where`` pins, pinned to its CPUs (TrialFailed naming the thread
    where the kernel refuses: a CPU outside this process's cgroup cpuset)."""
    for thread in threads:
        cpus = where.cpus.get(thread.role)
        if cpus is None:
            continue
        try:
            os.sched_setaffinity(thread.tid, cpus)
        except OSError as exc:
            raise TrialFailed(f"{ROLES[thread.role]}: QEMU's {thread.name} (thread "
                              f"{thread.tid}) could not be pinned to CPUs "
                              f"{cpuset.shown(cpus)}: {exc.strerror or exc}") from exc


def read_thread(pid: int, tid: int, proc: Path = PROC) -> tuple[frozenset[int], int | None]:
    """A thread's allowed CPUs (``Cpus_allowed_list`` of /proc/PID/task/TID/status) and the CPU
    it last ran on (field 39 of its stat; None where unreadable). OSError when it is gone."""
    task = proc / str(pid) / "task" / str(tid)
    allowed = next(line.split(":", 1)[1].strip()
                   for line in (task / "status").read_text().splitlines()
                   if line.startswith("Cpus_allowed_list:"))
    ran: int | None = None
    stat = (task / "stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()     # field 3 on (comm may hold spaces)
    if len(fields) > 36 and fields[36].isdigit():
        ran = int(fields[36])
    return cpuset.parse(allowed), ran


def readback(threads: Iterable[Thread], where: Placement,
             proc: Path = PROC) -> tuple[dict[str, str], list[str]]:
    """Each pinned thread's allowed CPUs and the CPU it last ran on, as the applied record has
    them (``affinity.vcpu0``, ``affinity.vcpu0.ran_on``), and where a set differs from the one
    asked, one line each (a role asked with no thread to pin is one too)."""
    applied = where.applied()
    wrong: list[str] = []
    found: set[str] = set()
    for thread in threads:
        cpus = where.cpus.get(thread.role)
        if cpus is None:
            continue
        found.add(thread.role)
        key = f"affinity.{thread.name}"
        try:
            allowed, ran = read_thread(thread.pid, thread.tid, proc)
        except (OSError, StopIteration, ValueError):
            applied[key] = "gone"
            if not thread.lasting:
                continue
            wrong.append(f"{key} (thread {thread.tid}): asked {cpuset.shown(cpus)}, the thread "
                         "is gone")
            continue
        applied[key] = cpuset.shown(allowed)
        if ran is not None:
            applied[f"{key}.ran_on"] = str(ran)
        if allowed != cpus:
            wrong.append(f"{key} (thread {thread.tid}): asked {cpuset.shown(cpus)}, /proc shows "
                         f"Cpus_allowed_list {cpuset.shown(allowed)}")
    for role in sorted(set(where.cpus) - found):
        wrong.append(f"{ROLES[role]}: asked {cpuset.shown(where.cpus[role])}, QEMU has no "
                     f"{role} thread to pin")
    return applied, wrong


def fio_options(where: Placement) -> dict[str, str]:
    """fio's job options that keep fio on the CPUs asked for the workload (``vcpu_affinity``
    outside a guest): ``cpus_allowed`` and ``cpus_allowed_policy=shared`` (every job may use
    every CPU of the set, as a guest's fio may use every vCPU)."""
    cpus = where.cpus.get("vcpu")
    if cpus is None:
        return {}
    return {"cpus_allowed": cpuset.shown(cpus), "cpus_allowed_policy": "shared"}


def _running(pid: int, proc: Path = PROC) -> bool:
    """The process is there and not a zombie (fio that ended, not yet reaped)."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2:][:1] not in ("Z", "X")


def fio_threads(fio_pid: int, proc: Path = PROC) -> list[Thread]:
    """fio's job processes under ``fio_pid`` (a wrapper's or fio's own pid): the processes an
    fio forked (fio forks one per job, which sets its own affinity; fio's main process keeps
    the host's), each thread of them named ``fio.TID``."""
    out: list[Thread] = []
    todo = [(fio_pid, False)]
    while todo:
        pid, job = todo.pop()
        try:
            tasks = sorted(int(t.name) for t in (proc / str(pid) / "task").iterdir())
            is_fio = (proc / str(pid) / "comm").read_text().strip() == "fio"
        except OSError:
            continue
        for tid in tasks:
            try:
                children = (proc / str(pid) / "task" / str(tid) / "children").read_text().split()
            except OSError:
                children = []
            todo += [(int(c), is_fio) for c in children]
            if job:
                out.append(Thread(role="vcpu", name=f"fio.{tid}", pid=pid, tid=tid))
    return out


class Pinning:
    """A session's affinity: what it asked (``Placement``), QEMU's threads it pinned, and fio's
    job processes as last seen, where fio itself runs on the asked CPUs (host and blocklayer
    modes: ``fio`` True, the vcpu role is fio's). Empty, it does and records nothing."""

    def __init__(self, where: Placement, threads: Iterable[Thread] = (), *,
                 fio: bool = False) -> None:
        self.where = where
        self.threads = list(threads)
        self.fio = fio and "vcpu" in where.cpus
        self._fio_seen: tuple[dict[str, str], list[str]] | None = None

    @classmethod
    def start(cls, config: Configuration, image_path: Path | None, *,
              qmp_socket: Path | None = None, pid: int | None = None,
              vcpus: bool = True, pin: bool = True) -> "Pinning":
        """Resolve what ``config`` asks and pin the QEMU ``pid`` (over ``qmp_socket``) as it
        says: vCPUs where QEMU has them (``vcpus``), else the vcpu role is fio's. Without
        ``pin``, only the threads to read back are found: whoever started QEMU pinned them
        (libvirtd, from ``<cputune>``)."""
        where = placement(config, image_path)
        qemu_roles = {r for r in where.cpus if vcpus or r != "vcpu"}
        threads: list[Thread] = []
        if qemu_roles and qmp_socket is not None and pid is not None:
            listed = (qemu_threads(qmp_socket, pid) if vcpus else
                      [Thread(role="main", name="main", pid=pid, tid=pid),
                       *(daemon_threads(pid) if "iothread" in qemu_roles else [])])
            threads = [t for t in listed if t.role in qemu_roles]
            if pin:
                pin_threads(threads, where)
        return cls(where, threads, fio=not vcpus or pid is None)

    def fio_options(self) -> dict[str, str]:
        """fio's options for the trial's job: cpus_allowed where fio runs on the host pinned."""
        return fio_options(self.where) if self.fio else {}

    def new_trial(self) -> None:
        self._fio_seen = None

    def observe_fio(self, fio_pid: int, wait: float = FIO_WAIT) -> None:
        """fio's job processes' allowed CPUs, read while fio runs. fio forks its jobs once it
        has started, and each job sets its own affinity after setting up its engine and
        buffers: on a loaded host a look can come before either, so fio is looked at again
        (0.05 s apart, while it runs, for ``wait`` seconds at most) until its jobs are seen
        with the CPUs asked; a difference that lasts that long stands."""
        if not self.fio:
            return
        only = Placement(cpus={"vcpu": self.where.cpus["vcpu"]})
        deadline = time.monotonic() + wait
        while _running(fio_pid):
            seen = fio_threads(fio_pid)
            if seen:
                applied, wrong = readback(seen, only)
                self._fio_seen = ({k: v for k, v in applied.items()
                                   if k.startswith("affinity.fio")}, wrong)
                if not wrong:
                    return
            if time.monotonic() >= deadline:
                return
            time.sleep(0.05)

    def applied(self) -> dict[str, str]:
        """What was asked and what /proc shows of each pinned thread now (and of fio's)."""
        if not self.where.cpus:
            return {}
        out, _ = self._qemu()
        if self.fio:
            out["affinity.fio"] = "cpus_allowed=" + fio_options(self.where)["cpus_allowed"]
            if self._fio_seen is None:
                out["affinity.fio.seen"] = "fio's job processes not seen while fio ran"
            else:
                out |= self._fio_seen[0]
        return out

    def mismatches(self) -> list[str]:
        """Each pinned thread whose allowed CPUs are not those asked, now (and fio's as seen)."""
        if not self.where.cpus:
            return []
        _, wrong = self._qemu()
        return wrong + (self._fio_seen[1] if self._fio_seen is not None else [])

    def _qemu(self) -> tuple[dict[str, str], list[str]]:
        qemu = Placement(cpus={r: c for r, c in self.where.cpus.items()
                               if not (self.fio and r == "vcpu")}, notes=self.where.notes)
        applied, wrong = readback(self.threads, qemu)
        return self.where.applied() | applied, wrong
