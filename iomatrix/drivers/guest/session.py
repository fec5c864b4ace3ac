"""A guest-mode session: a configuration's guests booted and ready, fio's client reaching each
guest's fio server through its forwarded port, QEMU's counters of each guest's disk read around
each trial (the foreign-I/O check: ``iomatrix.drivers.guest.iocheck``) and when a trial
outlasts its time."""

from __future__ import annotations

import contextlib
import shlex
import socket
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from iomatrix.appliance.build import GuestDisk
from iomatrix.appliance.protocol import console_tail
from iomatrix.core.errors import ToolFailed, TrialFailed
from iomatrix.core.proc import blocked_threads
from iomatrix.core.units import format_bytes
from iomatrix.drivers.base import Session
from iomatrix.drivers.guest.iocheck import (GUEST_SLACK_BYTES, RampSampler, after_ramp,
                                            bytes_moved, client_result, largest_io, ramp_margin,
                                            unchecked_reason)
from iomatrix.drivers.guest.kind import GuestKind
from iomatrix.fio.models import FioResult
from iomatrix.qemu.affinity import Pinning
from iomatrix.qemu.args import BLOCKSTATS_TIMEOUT, completed_requests, read_blockstats
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.workloads import Workload
from iomatrix.targets.workspace import Image

PRIVATE = "private network namespace"
"""``guest.channel`` of a session whose guests are reachable only from its own namespace."""
SHARED = "host loopback, reachable by every local user"
"""``guest.channel`` when no private namespace could be made (followed by the reason)."""


class Guest(BaseModel):
    """One booted guest."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)
    index: int
    port: int
    qmp_socket: Path
    console: Path
    argv: tuple[str, ...]
    pid: int
    daemon_qmp: Path | None = None
    daemon_argv: tuple[str, ...] = ()
    daemon_pid: int | None = None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class GuestSession(Session):
    """A configuration's guests, booted and ready (see the module docstring)."""

    def __init__(self, config: Configuration, images: Sequence[Image], guests: list[Guest],
                 procs: list, disk: GuestDisk, hosts_file: Path, applied: dict[str, str],
                 wrong: list[str], *, ramp: float = 0.0,
                 kind: GuestKind, channel: str = PRIVATE,
                 pinnings: Sequence[Pinning] = ()) -> None:  # type: ignore[type-arg]
        super().__init__(config, images)
        self.pinnings = list(pinnings)
        """Each guest's QEMU threads pinned as the affinity axes ask (``iomatrix.qemu.affinity``),
        read back from /proc after every trial."""
        self.guests = guests
        self.procs = procs
        self.disk = disk
        self.hosts_file = hosts_file
        self.ramp = ramp
        self.channel = channel
        self.kind = kind
        """What boots in the guests (``iomatrix.drivers.guest.kind``): it aims fio at the disk."""
        self._applied = applied | {"guest.channel": channel}
        self._wrong = wrong
        self._lock = threading.Lock()
        """One QMP conversation at a time per guest: QEMU's monitor takes one client at a time
        and queues one more; the sampler thread and the main thread both read counters."""
        self._base: list[dict[str, int]] = []
        self._sampler: RampSampler | None = None
        self._io_check = ""
        self._overdue: tuple[list[dict[str, int]], list[dict[str, int]]] | None = None
        self._blocked: list[list[str]] = []

    def fio_target(self) -> dict[str, str]:
        return self.kind.fio_target(self.disk)

    def fio_args(self) -> list[str]:
        for guest, proc in zip(self.guests, self.procs):
            if proc.poll() is not None:
                raise TrialFailed(f"guest vm{guest.index} exited (status {proc.returncode}); "
                                  f"console: {console_tail(guest.console)}")
        return [f"--client={self.hosts_file}"]

    def fio_output_format(self) -> str:
        return "json+"

    def overdue(self) -> None:
        """The trial's fio outlasts its time and still runs: each guest's disk counters now
        and a second later, while the guests' fio still has its client (once the client is
        stopped, the guest's fio server ends the job: its disk would go idle either way), and
        which of QEMU's threads waited in the host's kernel over that second."""
        waiting = [blocked_threads(p.pid) for p in self.procs]
        before = self._guest_stats()
        time.sleep(1.0)
        self._overdue = (before, self._guest_stats())
        # QEMU's threads that waited in the host's kernel throughout (the host's storage)
        self._blocked = [sorted(name for tid, name in blocked_threads(p.pid).items()
                                if tid in first)
                         for p, first in zip(self.procs, waiting)]

    def failure(self, reason: str) -> str:
        """A trial whose fio client did not finish in time: what each guest's disk did (QEMU's
        own counters over the trial and over a second past its time, read by
        :meth:`overdue`), so a stalled I/O path or guest is told from a slow one."""
        if "did not finish within" not in reason or self._overdue is None:
            return reason
        before, after = self._overdue
        seen = []
        ops = completed_requests
        for guest, proc, base, first, last, waited in zip(
                self.guests, self.procs, self._base or [{}] * len(self.guests), before, after,
                self._blocked):
            blocked = (f" (QEMU's threads waiting in the host's kernel throughout: "
                       f"{', '.join(waited)})" if waited else "")
            if proc.poll() is not None:
                seen.append(f"guest vm{guest.index} exited (status {proc.returncode}); "
                            f"console: {console_tail(guest.console, 4)}")
                continue
            if not first or not last:
                seen.append(f"guest vm{guest.index}: QEMU did not answer its monitor within "
                            f"{BLOCKSTATS_TIMEOUT:g} s{blocked}" if base else
                            f"guest vm{guest.index}: its disk's counters could not be read")
                continue
            done = f"{ops(first) - ops(base):,} in the trial, " if base else ""
            seen.append(f"guest vm{guest.index}'s disk completed {done}"
                        f"{ops(last) - ops(first):,} in a second past its time")
            if blocked and ops(last) == ops(first):
                seen[-1] += blocked
        return "; ".join([reason, *seen])

    def stalled(self, in_flight: int = 0) -> bool:
        """Every guest alive, its fio still waiting past the trial's time (:meth:`overdue`),
        and its disk idle over that second or nearly (no more requests completed than the
        ``in_flight`` each guest's fio keeps queued: each took a second or more; CI saw a
        stopped NVMe guest complete 4 a second at QD4), or its QEMU not answering its monitor
        (which answered at the trial's start): stopped, not slow."""
        if self._overdue is None:
            return False
        base = self._base or [{}] * len(self.procs)
        return all(proc.poll() is None and (
                       (bool(start) and (not first or not last))
                       or (bool(first) and bool(last)
                           and completed_requests(last) - completed_requests(first) <= in_flight))
                   for proc, start, first, last in zip(self.procs, base, *self._overdue))

    def client_ports(self) -> list[int]:
        return [g.port for g in self.guests]

    def new_trial(self) -> None:
        self.close()
        self._overdue = None
        self._base = self._guest_stats()
        self._io_check = ""
        self._sampler = RampSampler([g.qmp_socket for g in self.guests], self._base, self.ramp,
                                    self._lock).start()

    def close(self) -> None:
        """Stop the sampler of the last trial, if it still runs."""
        sampler, self._sampler = self._sampler, None
        if sampler is not None:
            sampler.finish()

    def check_trial(self, result: FioResult, workload: Workload) -> None:
        """TrialFailed when QEMU saw materially more I/O on a guest's disk than fio counted over
        the trial: another process used the disk (bound derived in the module docstring)."""
        counted = []
        for guest in self.guests:
            job = client_result(result, guest.port, len(self.guests))
            counted.append(None if job is None else job.read.io_bytes + job.write.io_bytes)
        foreign = self.check_io(counted, workload)
        if foreign:
            raise TrialFailed("foreign I/O on the disk under test during the trial (another "
                              "process used the guest's disk): " + "; ".join(foreign))

    def check_io(self, counted: Sequence[int | None], workload: Workload) -> list[str]:
        """The foreign-I/O check of the trial just ended, from the bytes fio counted on each
        guest (None: fio returned no result for it): what each guest's disk moved beyond them,
        one line per guest that failed it (empty: none did); ``applied`` has the verdicts."""
        sampler, self._sampler = self._sampler, None
        if sampler is None:
            return []
        sampler.finish()
        after = self._guest_stats()
        skip = unchecked_reason(workload)
        slack = workload.numjobs * (workload.iodepth + 1) * largest_io(workload) + GUEST_SLACK_BYTES
        verdicts, foreign = [], []
        for i, guest in enumerate(self.guests):
            name = f"vm{guest.index}"
            base, now = self._base[i] if i < len(self._base) else {}, after[i]
            fio = counted[i] if i < len(counted) else None
            reading = after_ramp(sampler.after_ramp[i], workload)
            why = ("QEMU counts nothing (vhost-user-blk: the daemon serves the disk)"
                   if not base or not now else skip
                   or (f"fio returned no result for {name}" if fio is None else None)
                   or (f"QEMU's counters could not be read: {sampler.errors[i]}"
                       if sampler.errors[i] else None)
                   or (f"the trial ended before {ramp_margin(workload):g} s after fio's ramp"
                       if reading is None else None))
            if why is not None:
                verdicts.append(f"{name} not checked: {why}")
                continue
            assert fio is not None and reading is not None
            margin, ramp_bytes = reading
            qemu = bytes_moved(now) - bytes_moved(base)
            allowed = ramp_bytes + slack
            text = (f"QEMU {format_bytes(qemu)}, fio {format_bytes(fio)}, allowed "
                    f"{format_bytes(allowed)} more (ramp + {margin:g} s {format_bytes(ramp_bytes)}, "
                    f"in flight and guest {format_bytes(slack)})")
            if qemu - fio > allowed:
                verdicts.append(f"{name} FOREIGN I/O: {text}")
                foreign.append(f"{name}'s disk moved {format_bytes(qemu)} in QEMU, fio counted "
                               f"{format_bytes(fio)}: {format_bytes(qemu - fio - allowed)} beyond "
                               f"the {format_bytes(allowed)} that fio's ramp and in-flight I/O "
                               "explain")
            else:
                verdicts.append(f"{name} ok: {text}")
        self._io_check = "; ".join(verdicts)
        return foreign

    def applied(self) -> dict[str, str]:
        """What QEMU applied, and QEMU's own I/O counters over the last trial (summed over the
        guests): a cross-check of fio's figures from the other side of the device; the guests'
        channel and the foreign-I/O check's verdict."""
        before = _sum(self._base)
        after = self._blockstats()
        counted = {f"blockstats.{k}": str(after[k] - before[k])
                   for k in after if k in before}
        check = {"io_check": self._io_check} if self._io_check else {}
        pinned = {(k if i == 0 else f"vm{i}.{k}"): v
                  for i, p in enumerate(self.pinnings) for k, v in p.applied().items()}
        return self._applied | counted | check | pinned

    def completed_ios(self) -> int | None:
        """Reads and writes QEMU's devices completed, summed over the guests: fio's client
        prints its status objects only when the job ends, so steady state follows these. None
        when a guest's disk is served elsewhere (vhost-user-blk: its QEMU counts nothing)."""
        stats = self._blockstats()
        if "rd_operations" not in stats:
            return None
        return completed_requests(stats)

    def _blockstats(self) -> dict[str, int]:
        stats = self._guest_stats()
        return {} if any(not s for s in stats) else _sum(stats)

    def _guest_stats(self) -> list[dict[str, int]]:
        """Each guest's counters ({} when its QEMU is gone, does not answer or counts nothing)."""
        out = []
        for guest, proc in zip(self.guests, self.procs):
            stats: dict[str, int] = {}
            if proc.poll() is None:
                with contextlib.suppress(ToolFailed), self._lock:
                    stats = read_blockstats(guest.qmp_socket, timeout=BLOCKSTATS_TIMEOUT)
            out.append(stats)
        return out

    def mismatches(self) -> list[str]:
        return list(self._wrong) + [(w if i == 0 else f"vm{i}: {w}")
                                    for i, p in enumerate(self.pinnings) for w in p.mismatches()]

    def command(self) -> str:
        lines = []
        for g in self.guests:
            if g.daemon_argv:
                lines.append(shlex.join(g.daemon_argv))
            lines.append(shlex.join(g.argv))
        return "\n".join(lines)

    def pids(self) -> list[int]:
        return [p for g in self.guests for p in (g.pid, g.daemon_pid) if p is not None]


def _sum(stats: Sequence[dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for one in stats:
        for key, value in one.items():
            total[key] = total.get(key, 0) + value
    return total
