"""guest mode: N appliance VMs per configuration, each with its own disk attached as the
configuration says, fio --server inside, driven by the host's fio as client (seed 000's setup).
One boot serves every workload of a configuration. A guest that does not become ready within the
boot timeout, or dies, fails its configuration's trials with the console's last lines; the run
goes on with the next configuration.

**The channel to the guests is private.** QEMU forwards a TCP port on 127.0.0.1 to each guest's
fio server (user networking), and fio's server has no authentication: on the host's own network
any local user could run jobs on the disk under test. So a session first moves iomatrix's thread
into a network namespace of its own (:func:`iomatrix.core.proc.private_network`, loopback only);
its QEMUs and daemons, and the fio client the runner starts from the same thread, inherit it, and
the forwarded ports exist only there. Nobody else can enter it (that needs CAP_SYS_ADMIN), and it
ends with its last process, which the kernel stops if iomatrix is killed (``orphan_guard``).
Sockets (QMP, vhost-user) and logs are in the run's 0700 scratch directory. Where no namespace can
be made (iomatrix not root), or the disks are on network storage (an RBD pool: QEMU must reach
its monitors and OSDs through the host's network), the guests use the host's loopback as before: ``prepare`` says so in
a warning, every sample stores it (``guest.channel``) and ``iomatrix doctor`` explains it; the
check below still catches what a foreign client does.

**Foreign I/O fails the trial** (:meth:`GuestSession.check_trial`): QEMU's byte counters of each
guest's disk (``query-blockstats``) over the trial must not exceed fio's own count for that guest
by more than fio provably leaves uncounted:

* its ramp: fio counts nothing until ``ramp_time`` after its job's start (``td->epoch``, set
  before its first I/O), and resets on the first completion after that. A sampler thread reads
  QEMU's counters every 50 ms until the first I/O shows (at host time ``s``: the epoch was before
  ``s``), then at ``s + ramp × 1.02 + m`` for the margins ``m`` of :data:`MARGINS`; whatever QEMU
  counted up to the first reading whose margin covers :func:`ramp_margin` is allowed: 0.1 s for
  one job (reading and scheduling delays; the 2 % covers the guest's clock, measured within
  0.1 % of the host's under TCG, and exact under KVM's kvmclock), plus 0.25 s per further job:
  the jobs of a group are released together but each opens the device (and sizes its random
  map) before setting its own epoch: up to 0.06 s apart per job measured under TCG (8 jobs on
  1 and 2 vCPUs);
* the I/O that completes as fio resets (one per job) and any still in flight when it stops
  (``iodepth`` per job; fio reaps and counts those, this is a margin): ``numjobs × (iodepth + 1)``
  times the largest block size the workload can issue;
* 1 MiB for the guest kernel itself (it issues none on the disk under test: nothing is mounted,
  fio uses O_DIRECT).

Bytes, not operations: the guest's block layer may split or merge fio's requests, never change
their bytes. Flushes and discards are not compared. What QEMU counted before the trial
(preconditioning, earlier trials) is outside it: each trial starts from a fresh reading.
vhost-user-blk guests are not checked (their QEMU counts nothing; the daemon serves the disk), nor
are trials whose jobs start at staggered times (``startdelay`` with a range) or that end before
the reading after the ramp; ``io_check`` in each sample's applied settings says which.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from iomatrix.appliance.build import (GUEST_FIO_PORT, MIN_MEMORY_MIB, READY_MARKER, Appliance,
                                      GuestDisk,
                                      build_appliance, console_error, kernel_cmdline,
                                      parse_disk_lines)
from iomatrix.appliance.guestfio import guest_fio
from iomatrix.appliance.protocol import console_tail
from iomatrix.appliance.kernel import default_cache_dir, trusted_cache
from iomatrix.appliance.ownimage import (BaseImage, ImageFile, check_overlay_space,
                                         make_overlay, make_seed, parse_guest_line, system_argv,
                                         version_mismatch, windows_target)
from iomatrix.drivers.base import Driver, Session
from iomatrix.drivers.versions import method_versions
from iomatrix.core.errors import (EnvironmentProblem, GuestFioUnavailable, IomatrixError,
                                  NotEnoughSpace, ToolFailed, TrialFailed, UnsafeDirectory)
from iomatrix.core.files import read_owned, write_file_atomically
from iomatrix.core.proc import (blocked_threads, log_tail, managed, private_network,
                                private_network_problem, read_text, require, wait_for)
from iomatrix.fio.models import FioResult, JobStats
from iomatrix.fio.samples import client_job
from iomatrix.qemu.args import (BLOCKSTATS_TIMEOUT, GuestSpec, blockstats_of, completed_requests,
                                expected_daemon_settings,
                                expected_guest_settings, guest_argv, read_blockstats,
                                read_daemon_settings, read_guest_settings, vhost_daemon_argv,
                                vhost_num_queues)
from iomatrix.appliance.probe import KvmProbe, probe_accel
from iomatrix.platform import libvirt as lv
from iomatrix.qemu.qmp import qmp_execute
from iomatrix.suite.model import APPLIANCE, Configuration, Method, OwnGuest, Workload
from iomatrix.targets.network import reveal
from iomatrix.targets.workspace import Image
from iomatrix.core.units import format_bytes, fio_size

DAEMON_START_TIMEOUT = 15.0
PRIVATE = "private network namespace"
"""``guest.channel`` of a session whose guests are reachable only from its own namespace."""
SHARED = "host loopback, reachable by every local user"
"""``guest.channel`` when no private namespace could be made (followed by the reason)."""

POLL_SECONDS = 0.05
"""How often the sampler reads QEMU's counters until a guest's first I/O shows."""
CLOCK_TOLERANCE = 0.02
"""How much longer than ``ramp`` (host time) fio's ramp may last by the guest's clock."""
ONE_JOB_MARGIN = 0.1
SKEW_PER_JOB = 0.25
MARGINS = (0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
"""Seconds after ``first I/O + ramp × (1 + CLOCK_TOLERANCE)`` at which the sampler reads what
fio's ramp may have done (one reading each, while the trial lasts)."""
GUEST_SLACK_BYTES = 1 << 20
"""Allowed for I/O of the guest kernel's own on the disk under test (none is expected)."""
_SIZE_OPTIONS = ("bsrange", "blocksize_range", "bssplit")


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


# --- the foreign-I/O check ---------------------------------------------------------------------

def query_blockstats(qmp_socket: Path, *, timeout: float = 5.0) -> dict[str, int]:
    """:func:`iomatrix.qemu.args.read_blockstats` with a plain blocking socket, for the sampler
    thread: :func:`iomatrix.qemu.qmp.qmp_execute` runs an event loop and defers Ctrl-C to its
    caller, which must be the main thread."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(str(qmp_socket))
        stream = s.makefile("rb")

        def answer() -> object:
            while True:                        # events may come before the answer
                line = stream.readline()
                if not line:
                    raise ConnectionError("QEMU closed the QMP connection")
                message = json.loads(line)
                if "error" in message:
                    raise ConnectionError(f"QMP error: {message['error']}")
                if "return" in message:
                    return message["return"]

        json.loads(stream.readline() or b"null")            # the greeting
        s.sendall(b'{"execute": "qmp_capabilities"}\n')
        answer()
        s.sendall(b'{"execute": "query-blockstats"}\n')
        stats = answer()
    return blockstats_of(stats)


def _bytes(stats: dict[str, int]) -> int:
    return stats["rd_bytes"] + stats["wr_bytes"]


class RampSampler:
    """QEMU's byte counters of each guest's disk, read in a thread from a trial's start: every
    :data:`POLL_SECONDS` until the guest's first I/O shows, then once for each margin of
    :data:`MARGINS` after the ramp (see the module docstring). ``base`` holds each guest's
    counters before the trial (empty: not counted, e.g. vhost-user-blk)."""

    def __init__(self, sockets: Sequence[Path], base: Sequence[dict[str, int]], ramp: float,
                 lock: threading.Lock) -> None:
        self.sockets = list(sockets)
        self.base = list(base)
        self.ramp = ramp
        self.lock = lock
        self.first_io: list[float | None] = [None] * len(self.sockets)
        self.after_ramp: list[dict[float, int]] = [{} for _ in self.sockets]
        """Per guest: margin → bytes QEMU counted from the trial's start to that reading."""
        self.errors: list[str | None] = [None] * len(self.sockets)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="iomatrix-io-check", daemon=True)

    def start(self) -> RampSampler:
        self._thread.start()
        return self

    def finish(self) -> None:
        """Stop reading (a reading under way ends within its timeout)."""
        self._stop.set()
        self._thread.join(timeout=10)

    def _read(self, index: int) -> int | None:
        try:
            with self.lock:
                stats = query_blockstats(self.sockets[index])
            return _bytes(stats) - _bytes(self.base[index])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            self.errors[index] = f"QMP: {exc}"
            return None

    def _run(self) -> None:
        margins = sorted(MARGINS)
        while not self._stop.is_set():
            waits = []
            for i in range(len(self.sockets)):
                if not self.base[i] or self.errors[i] is not None:
                    continue
                if self.first_io[i] is None:
                    moved = self._read(i)
                    if moved:
                        self.first_io[i] = time.monotonic()
                    elif moved is not None:
                        waits.append(POLL_SECONDS)
                        continue
                    else:
                        continue
                first = self.first_io[i]
                assert first is not None
                for margin in margins:
                    if margin in self.after_ramp[i]:
                        continue
                    due = first + self.ramp * (1 + CLOCK_TOLERANCE) + margin
                    if time.monotonic() >= due:
                        value = self._read(i)
                        if value is None:
                            break
                        self.after_ramp[i][margin] = value
                    else:
                        waits.append(due - time.monotonic())
                        break
            if not waits:
                return
            self._stop.wait(max(0.0, min(waits)))


def ramp_margin(workload: Workload) -> float:
    """Seconds after ``first I/O + ramp × (1 + CLOCK_TOLERANCE)`` by which every job of
    ``workload`` has ended its ramp (see the module docstring)."""
    return ONE_JOB_MARGIN + SKEW_PER_JOB * (workload.numjobs - 1)


def after_ramp(readings: dict[float, int], workload: Workload) -> tuple[float, int] | None:
    """The first reading (margin, bytes) taken late enough for ``workload``, or None."""
    needed = ramp_margin(workload)
    return next(((m, readings[m]) for m in sorted(readings) if m >= needed - 1e-9), None)


def largest_io(workload: Workload) -> int:
    """The largest request fio can issue for ``workload``: its bs, or the largest size in a
    bsrange/bssplit option (their percentages are below any block size)."""
    sizes = [workload.bs]
    for key, value in workload.options:
        if key in _SIZE_OPTIONS:
            for token in re.split(r"[,:/\-]", value):
                with contextlib.suppress(ValueError):     # passed to fio as written
                    sizes.append(fio_size(token))
    return max(sizes)


def unchecked_reason(workload: Workload) -> str | None:
    """Why the foreign-I/O check cannot bound fio's ramp for ``workload``, or None."""
    for key, value in workload.options:
        if key == "startdelay" and ("-" in value or ":" in value):
            return ("startdelay with a range starts fio's jobs, and their ramps, at different "
                    "times")
    return None


def client_result(result: FioResult, port: int, guests: int) -> JobStats | None:
    """fio's result for the client of the guest on ``port`` (the only one with one guest)."""
    found = client_job(result, port)
    if found is None and guests == 1 and len(result.jobs) == 1:
        found = result.jobs[0]
    return found


class GuestSession(Session):
    def __init__(self, config: Configuration, images: Sequence[Image], guests: list[Guest],
                 procs: list, disk: GuestDisk, hosts_file: Path, applied: dict[str, str],
                 wrong: list[str], *, ramp: float = 0.0,
                 channel: str = PRIVATE, windows: bool = False) -> None:  # type: ignore[type-arg]
        super().__init__(config, images)
        self.guests = guests
        self.procs = procs
        self.disk = disk
        self.hosts_file = hosts_file
        self.ramp = ramp
        self.channel = channel
        self.windows = windows
        """The guest is the user's Windows image: fio's windowsaio on its PhysicalDrive."""
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
        if self.windows:
            return windows_target(self.disk.name)
        return {"ioengine": "libaio", "direct": "1", "filename": f"/dev/{self.disk.name}"}

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
            qemu = _bytes(now) - _bytes(base)
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
        return self._applied | counted | check

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
        return list(self._wrong)

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


class GuestDriver(Driver):
    mode = "guest"
    sliced_devices = True
    """A block device's test area reaches QEMU as a raw slice node ([target] size)."""

    def __init__(self, method: Method, workdir: Path, *, appliance: Appliance, accel: str,
                 shared_reason: str | None = None) -> None:
        super().__init__(method, workdir)
        self.appliance = appliance
        self.accelerator = accel
        self.boots = 0
        self.shared_reason = shared_reason
        """Why the guests cannot have a private network namespace here; None: they get one."""
        self.libvirt: lv.Versions | None = None
        """With platform libvirt: the libvirt (and its QEMU) whose nodes the disks get."""
        self.own: OwnGuest | None = None
        """[guest]: the user's image, for configurations whose guest is its name."""
        self.own_base: BaseImage | None = None
        self.own_image: ImageFile | None = None
        """The image opened once, before the run: each QEMU reads that file by descriptor."""
        self.own_fio: Path | None = None
        """The static guest fio the seed carries to a Linux image."""

    def use_image(self, own: OwnGuest, image: ImageFile, note: Callable[[str], None], *,
                  guests: int = 1) -> None:
        """Take the user's image for the configurations whose guest is ``own.label``, as
        ``image`` holds it (opened and checked: :func:`iomatrix.appliance.ownimage.
        open_guest_image`), with the static fio a Linux image's seed carries, and room for
        ``guests`` overlays at once (the most a session boots). EnvironmentProblem when fio
        cannot be had, NotEnoughSpace when the overlays may not fit."""
        base = image.base
        check_overlay_space(base, guests, self.workdir)
        if own.os == "linux":
            try:
                self.own_fio = guest_fio(default_cache_dir()).path
            except GuestFioUnavailable as exc:
                raise EnvironmentProblem(
                    f"[guest] image: the guest needs the static fio of the host's version, "
                    f"which cannot be built here: {exc}") from None
        self.own, self.own_base, self.own_image = own, base, image
        note(f"guest {own.label}: {base.path} ({base.format}, read only through an overlay "
             f"per boot), ready within {own.ready_seconds(self.accelerator):.0f} s under "
             f"{self.accelerator.upper()}")

    @classmethod
    def prepare(cls, method: Method, workdir: Path, *, accel: str,
                note: Callable[[str], None]) -> GuestDriver:
        """The guest driver with its appliance built (or found cached), its accelerator chosen
        and its channel to the guests tried: a warning when it cannot be private."""
        appliance = build_appliance()
        for line in appliance.notes():
            note(line)
        shared = private_network_problem()
        if shared is not None:
            note(f"warning: {shared_warning(shared)}")
        driver = cls(method, workdir, appliance=appliance,
                     accel=resolve_accel(accel, appliance, note), shared_reason=shared)
        modelled = method_versions(method, "qemu-system-x86_64")
        if modelled is not None:
            driver.libvirt, source = modelled
            note(f"the disks get the block graph of {driver.libvirt.label} (libvirt: {source})")
        return driver

    @contextlib.contextmanager
    def session(self, config: Configuration, images: Sequence[Image]) -> Iterator[Session]:
        """The guests booted in a private network namespace (see the module docstring), entered
        by this thread first and left last, after every process in it was stopped; the fio
        client started from this thread while the session is open runs there too."""
        self.boots += 1
        with contextlib.ExitStack() as stack:
            channel = PRIVATE
            remote = next((i.network for i in images if i.network is not None), None)
            if remote is not None:
                # a private namespace has loopback only: QEMU could not reach the storage
                channel = (f"{SHARED} (the disks are on {remote.protocol} storage, which QEMU "
                           "reaches through the host's network)")
            elif self.shared_reason is None:
                try:
                    stack.enter_context(private_network())
                except EnvironmentProblem as exc:   # the probe in prepare passed: unexpected
                    raise TrialFailed(f"cannot give the guests a private network namespace: "
                                      f"{exc}") from exc
            else:
                channel = f"{SHARED} ({self.shared_reason})"
            if self._own_os(config) is not None:
                assert self.own_base is not None
                try:     # checked before the run; what the run has written since counts too
                    check_overlay_space(self.own_base, len(images), self.workdir)
                except NotEnoughSpace as exc:
                    raise TrialFailed(f"{exc} ({exc.hint})") from exc
            guests, procs = [], []
            for index, image in enumerate(images):
                guest, proc = self._start(stack, config, image, index)
                guests.append(guest)
                procs.append(proc)
            disk, seen = self._wait_ready(config, guests, procs)
            hosts = self.workdir / f"b{self.boots}" / "hosts.list"
            hosts.write_text("".join(f"ip:127.0.0.1,{g.port}\n" for g in guests))
            applied, wrong = self._verify(config, images[0], guests[0], disk)
            stack.callback(self._quit, guests, procs)
            session = GuestSession(config, images, guests, procs, disk, hosts,
                                   applied | seen, wrong, ramp=self.method.ramp,
                                   channel=channel, windows=self._own_os(config) == "windows")
            stack.callback(session.close)
            yield session

    # -- start and stop ----------------------------------------------------------------------
    def _start(self, stack: contextlib.ExitStack, config: Configuration, image: Image,
               index: int) -> tuple[Guest, object]:
        # short names: UNIX socket paths must stay under 108 bytes
        run_dir = self.workdir / f"b{self.boots}" / f"v{index}"
        run_dir.mkdir(parents=True, exist_ok=True)
        logs = self.workdir / f"boot{self.boots}-vm{index}"
        console = Path(f"{logs}-console.log")
        console.parent.mkdir(parents=True, exist_ok=True)
        console.write_text("")
        vhost_socket = daemon_qmp = None
        daemon_argv: list[str] = []
        daemon_pid = None
        if config.data_path == "vhost-user-blk":
            vhost_socket, daemon_qmp = run_dir / "vub", run_dir / "dqmp"
            daemon_argv = vhost_daemon_argv(
                config, image, socket=vhost_socket, qmp_socket=daemon_qmp,
                num_queues=vhost_num_queues(config, self.method.vcpus),
                qsd=require("qemu-storage-daemon"))
            daemon_log = Path(f"{logs}-daemon.log")
            # QEMU 7.2 hangs stopping a vhost-user-blk export with an iothread while the guest
            # is connected: the guest (entered later, so stopped first) goes before the daemon,
            # and the daemon gets SIGKILL after a short wait.
            daemon = stack.enter_context(managed(reveal(daemon_argv, image.network),
                                                 log=daemon_log, stop_timeout=3))
            daemon_pid = daemon.pid
            if not wait_for(lambda: daemon.poll() is not None or vhost_socket.exists(),
                            timeout=DAEMON_START_TIMEOUT) or daemon.poll() is not None:
                raise TrialFailed(f"qemu-storage-daemon for vm{index} did not start: "
                                  f"{log_tail(daemon_log) or 'no output'}")
        # In the private namespace nothing else listens: fixed ports, no race for a free one
        # (in the host's, shared or for network storage, another process may hold them).
        private = self.shared_reason is None and image.network is None
        port = GUEST_FIO_PORT + index if private else free_port()
        kernel: Path | None = self.appliance.kernel
        initrd: Path | None = self.appliance.initrd
        append = kernel_cmdline(port=GUEST_FIO_PORT, disks=1, accel=self.accelerator)
        system: list[str] = []
        fds: tuple[int, ...] = ()
        if self._own_os(config) is not None:
            assert self.own_image is not None
            fds = (self.own_image.descriptor(),)
            stack.callback(os.close, fds[0])
            kernel, initrd, append, system = self._own_boot(stack, run_dir, image, fds[0])
        spec = GuestSpec(
            config=config, image=image, kernel=kernel, initrd=initrd, append=append,
            system=tuple(system), accel=self.accelerator,
            vcpus=self.method.vcpus, memory_bytes=self.method.memory,
            qmp_socket=run_dir / "qmp", serial_log=console, host_port=port,
            guest_port=GUEST_FIO_PORT, vhost_socket=vhost_socket, name=f"iomatrix-vm{index}",
            platform=self.method.platform, pve_version=self.method.pve_version,
            libvirt=self.libvirt)
        argv = guest_argv(spec, qemu=require("qemu-system-x86_64"))
        proc = stack.enter_context(managed(reveal(argv, image.network),
                                           log=Path(f"{logs}-qemu.log"), stop_timeout=5,
                                           pass_fds=fds))
        return Guest(index=index, port=port, qmp_socket=spec.qmp_socket, console=console,
                     argv=tuple(argv), pid=proc.pid, daemon_qmp=daemon_qmp,
                     daemon_argv=tuple(daemon_argv), daemon_pid=daemon_pid), proc

    def _own_os(self, config: Configuration) -> str | None:
        """The OS of the user's image when ``config`` runs in it, else None (the appliance)."""
        if self.own is None or config.guest in (None, APPLIANCE):
            return None
        if config.guest != self.own.label:
            raise TrialFailed(f"no guest called {config.guest!r} in this run")
        return self.own.os

    def _own_boot(self, stack: contextlib.ExitStack, run_dir: Path, image: Image,
                  fd: int) -> tuple[Path | None, Path | None, str, list[str]]:
        """Kernel, initrd, command line and system-disk arguments of a guest of the user's
        image (read by QEMU through ``fd``): its overlay and (Linux) seed made in ``run_dir``
        and removed with the session, after its QEMU (``stack`` stops that first)."""
        own, base = self.own, self.own_base
        assert own is not None and base is not None
        overlay = run_dir / "overlay.qcow2"
        stack.callback(overlay.unlink, missing_ok=True)
        make_overlay(base, overlay)
        seed = None
        if own.os == "linux":
            assert self.own_fio is not None
            seed_dir = run_dir / "seed"
            stack.callback(shutil.rmtree, seed_dir, ignore_errors=True)
            seed_dir.mkdir(mode=0o700)
            seed = make_seed(seed_dir, fio=self.own_fio, disk_size=image.size)
        append = f"console=ttyS0 {own.append}"
        return (own.kernel, own.initrd, append,
                system_argv(base, overlay, seed, bootloader=own.kernel is None, fd=fd))

    def _ready_timeout(self, config: Configuration) -> float:
        if self._own_os(config) is None:
            return self.method.boot_timeout
        assert self.own is not None
        return self.own.ready_seconds(self.accelerator)

    def _wait_ready(self, config: Configuration, guests: list[Guest],
                    procs: list) -> tuple[GuestDisk, dict[str, str]]:  # type: ignore[type-arg]
        """The first guest's disk under test and what its OS says of itself, once every guest
        is ready."""
        timeout = self._ready_timeout(config)
        deadline = time.monotonic() + timeout
        disks: list[GuestDisk] = []
        for guest, proc in zip(guests, procs):
            def ready() -> bool:
                text = read_text(guest.console)
                return READY_MARKER in text or console_error(text) is not None or proc.poll() is not None
            wait_for(ready, timeout=max(0.0, deadline - time.monotonic()), interval=0.05)
            text = read_text(guest.console)
            if READY_MARKER not in text:
                why = (console_error(text) or (f"QEMU exited (status {proc.returncode}): "
                                               f"{console_tail(Path(str(guest.console).replace('-console', '-qemu')))}"
                                               if proc.poll() is not None else
                                               f"not ready within {timeout:.0f} s"))
                raise TrialFailed(f"guest vm{guest.index} ({self.accelerator}) did not boot: {why}; "
                                  f"console: {console_tail(guest.console) or 'empty'}")
            found = parse_disk_lines(text)
            if not found:
                raise TrialFailed(f"guest vm{guest.index} sees no disk under test; "
                                  f"console: {console_tail(guest.console)}")
            disks.append(found[0])
        seen = parse_guest_line(read_text(guests[0].console))
        if "guest.fio" in seen:
            wrong = version_mismatch(self.appliance.fio_version, seen["guest.fio"])
            if wrong is not None:
                raise TrialFailed(wrong)
        if self._own_os(config) is None:
            seen = {"guest.kernel": self.appliance.kernel_release, "guest.os": APPLIANCE}
        return disks[0], seen

    def _verify(self, config: Configuration, image: Image, guest: Guest,
                disk: GuestDisk) -> tuple[dict[str, str], list[str]]:
        """What QEMU applied (query-block, query-iothreads, qom-get) and the guest sees."""
        try:
            seen = read_guest_settings(guest.qmp_socket)
            want = expected_guest_settings(config, vcpus=self.method.vcpus,
                                           platform=self.method.platform,
                                           pve_version=self.method.pve_version,
                                           libvirt=self.libvirt,
                                           is_device=image.is_device and self.sliced_devices,
                                           network=image.network and image.network.protocol)
            if guest.daemon_qmp is not None:
                seen |= {f"daemon.{k}": v for k, v in read_daemon_settings(guest.daemon_qmp).items()}
                want |= {f"daemon.{k}": v for k, v in expected_daemon_settings(config).items()}
        except ToolFailed as exc:
            raise TrialFailed(f"guest vm{guest.index}: QMP did not answer: {exc}") from exc
        wrong = [f"{key}: asked {value}, QEMU reports {seen.get(key, 'nothing')}"
                 for key, value in want.items() if seen.get(key) != value]
        if self.libvirt is not None:
            seen["libvirt.version"] = self.libvirt.label
        applied = seen | {"accel": self.accelerator, "guest.disk": disk.name,
                          "guest.queues": str(disk.queues), "guest.scheduler": disk.scheduler,
                          "guest.rotational": "1" if disk.rotational else "0",
                          "guest.driver": disk.driver}
        return applied, wrong

    def _quit(self, guests: list[Guest], procs: list) -> None:  # type: ignore[type-arg]
        """Graceful stop: QMP quit to every guest; the context managers then reap (or kill)."""
        for guest, proc in zip(guests, procs):
            if proc.poll() is None:
                with contextlib.suppress(ToolFailed):
                    qmp_execute(guest.qmp_socket, [("quit", None)], timeout=3)
        for proc in procs:
            with contextlib.suppress(Exception):
                proc.wait(timeout=5)


def shared_warning(reason: str) -> str:
    """What a run and ``iomatrix doctor`` say when the guests cannot have a private network."""
    return (f"the guests' fio servers will listen on 127.0.0.1 of this host, where every local "
            f"user can run fio jobs on the disks under test ({reason}); run iomatrix as root to "
            "give each guest session a private network namespace (foreign I/O still fails its "
            "trial)")


KVM_PROBE_TIMEOUT = 6.0  # a kernel reaches /init in about 1 s under KVM


def resolve_accel(accel: str, appliance: Appliance, note: Callable[[str], None]) -> str:
    """"kvm" or "tcg". auto: KVM only when the appliance's kernel really boots under it (a probe
    with a timeout: /dev/kvm existing proves nothing), else TCG with a one-line warning."""
    if accel == "tcg":
        note("guests run under TCG as asked: the CPU is emulated; guest figures measure the emulator")
        return "tcg"
    probe = _probe(appliance)
    if probe.usable:
        return "kvm"
    if accel == "kvm":
        raise EnvironmentProblem(f"--accel kvm: KVM is not usable here: {probe.reason}")
    note(f"warning: KVM is not usable ({probe.reason}); guests run under TCG: the CPU is "
         "emulated and guest figures measure the emulator, not this hardware")
    return "tcg"


def _probe(appliance: Appliance) -> KvmProbe:
    """The KVM probe; a success is remembered for this boot of the host and this appliance, and
    believed only from a file nobody else could have written (a planted "usable" would send the
    guests to a KVM that hangs them)."""
    boot_id = read_text(Path("/proc/sys/kernel/random/boot_id")).strip() or "unknown"
    memo = default_cache_dir() / f"kvm-probe-{boot_id}-{appliance.key[:16]}.json"
    with contextlib.suppress(OSError, ValueError, UnsafeDirectory):
        return KvmProbe.model_validate_json(read_owned(memo))
    # The appliance itself, as guests boot it, must get as far as running its /init
    # (loglevel=7 after the command line's "quiet" lets the kernel say so).
    probe = probe_accel("kvm", appliance.kernel, appliance.initrd, timeout=KVM_PROBE_TIMEOUT,
                        marker="Run /init as init process", memory_mib=MIN_MEMORY_MIB + 128,
                        append=kernel_cmdline("loglevel=7", accel="kvm"))
    if probe.usable:   # a failure may be passing (a busy host): it is probed again next run
        with contextlib.suppress(OSError, IomatrixError):
            trusted_cache(memo.parent)
            write_file_atomically(memo, probe.model_dump_json())
    return probe
