"""guest mode: N appliance VMs per configuration, each with its own disk attached as the
configuration says, fio --server inside, driven by the host's fio as client (seed 000's setup).
One boot serves every workload of a configuration. A guest that does not become ready within the
boot timeout, or dies, fails its configuration's trials with the console's last lines; the run
goes on with the next configuration."""

from __future__ import annotations

import contextlib
import shlex
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from iomatrix.appliance.build import (GUEST_FIO_PORT, MIN_MEMORY_MIB, READY_MARKER, Appliance,
                                      GuestDisk,
                                      build_appliance, console_error, kernel_cmdline,
                                      parse_disk_lines)
from iomatrix.appliance.kernel import default_cache_dir
from iomatrix.drivers.base import Driver, Session
from iomatrix.core.errors import EnvironmentProblem, ToolFailed, TrialFailed
from iomatrix.core.proc import log_tail, managed, read_text, require, wait_for
from iomatrix.qemu.args import (GuestSpec, expected_daemon_settings, expected_guest_settings,
                                guest_argv, read_blockstats, read_daemon_settings,
                                read_guest_settings, vhost_daemon_argv, vhost_num_queues)
from iomatrix.appliance.probe import KvmProbe, probe_accel
from iomatrix.qemu.qmp import qmp_execute
from iomatrix.suite.model import Configuration, Method
from iomatrix.target.workspace import Image
from iomatrix.core.units import format_bytes

DAEMON_START_TIMEOUT = 15.0


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
    def __init__(self, config: Configuration, images: Sequence[Image], guests: list[Guest],
                 procs: list, disk: GuestDisk, hosts_file: Path, applied: dict[str, str],
                 wrong: list[str]) -> None:  # type: ignore[type-arg]
        super().__init__(config, images)
        self.guests = guests
        self.procs = procs
        self.disk = disk
        self.hosts_file = hosts_file
        self._applied = applied
        self._wrong = wrong
        self._before: dict[str, int] = {}

    def fio_target(self) -> dict[str, str]:
        return {"ioengine": "libaio", "direct": "1", "filename": f"/dev/{self.disk.name}"}

    def fio_args(self) -> list[str]:
        for guest, proc in zip(self.guests, self.procs):
            if proc.poll() is not None:
                raise TrialFailed(f"guest vm{guest.index} exited (status {proc.returncode}); "
                                  f"console: {log_tail(guest.console, 8)}")
        return [f"--client={self.hosts_file}"]

    def fio_output_format(self) -> str:
        return "json+"

    def client_ports(self) -> list[int]:
        return [g.port for g in self.guests]

    def new_trial(self) -> None:
        self._before = self._blockstats()

    def applied(self) -> dict[str, str]:
        """What QEMU applied, and QEMU's own I/O counters over the last trial (summed over the
        guests): a cross-check of fio's figures from the other side of the device."""
        after = self._blockstats()
        counted = {f"blockstats.{k}": str(after[k] - self._before[k])
                   for k in after if k in self._before}
        return self._applied | counted

    def completed_ios(self) -> int | None:
        """Reads and writes QEMU's devices completed, summed over the guests: fio's client
        prints its status objects only when the job ends, so steady state follows these. None
        when a guest's disk is served elsewhere (vhost-user-blk: its QEMU counts nothing)."""
        stats = self._blockstats()
        if "rd_operations" not in stats:
            return None
        return stats["rd_operations"] + stats["wr_operations"]

    def _blockstats(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for guest, proc in zip(self.guests, self.procs):
            if proc.poll() is not None:
                return {}
            try:
                stats = read_blockstats(guest.qmp_socket)
            except ToolFailed:
                return {}
            for key, value in stats.items():
                total[key] = total.get(key, 0) + value
        return total

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


class GuestDriver(Driver):
    mode = "guest"

    def __init__(self, method: Method, workdir: Path, *, appliance: Appliance, accel: str) -> None:
        super().__init__(method, workdir)
        self.appliance = appliance
        self.accelerator = accel
        self.boots = 0

    @classmethod
    def prepare(cls, method: Method, workdir: Path, *, accel: str,
                note: Callable[[str], None]) -> GuestDriver:
        """The guest driver with its appliance built (or found cached) and its accelerator
        chosen."""
        appliance = build_appliance()
        if not appliance.cached:
            note(f"built the guest appliance in {appliance.build_seconds:.1f} s "
                 f"({format_bytes(appliance.size_bytes)}: kernel {appliance.kernel_release}, "
                 f"{appliance.fio_version})")
        return cls(method, workdir, appliance=appliance,
                   accel=resolve_accel(accel, appliance, note))

    @contextlib.contextmanager
    def session(self, config: Configuration, images: Sequence[Image]) -> Iterator[Session]:
        self.boots += 1
        with contextlib.ExitStack() as stack:
            guests, procs = [], []
            for index, image in enumerate(images):
                guest, proc = self._start(stack, config, image, index)
                guests.append(guest)
                procs.append(proc)
            disk = self._wait_ready(config, guests, procs)
            hosts = self.workdir / f"b{self.boots}" / "hosts.list"
            hosts.write_text("".join(f"ip:127.0.0.1,{g.port}\n" for g in guests))
            applied, wrong = self._verify(config, guests[0], disk)
            stack.callback(self._quit, guests, procs)
            yield GuestSession(config, images, guests, procs, disk, hosts, applied, wrong)

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
            daemon = stack.enter_context(managed(daemon_argv, log=daemon_log, stop_timeout=3))
            daemon_pid = daemon.pid
            if not wait_for(lambda: daemon.poll() is not None or vhost_socket.exists(),
                            timeout=DAEMON_START_TIMEOUT) or daemon.poll() is not None:
                raise TrialFailed(f"qemu-storage-daemon for vm{index} did not start: "
                                  f"{log_tail(daemon_log) or 'no output'}")
        port = free_port()
        spec = GuestSpec(
            config=config, image=image, kernel=self.appliance.kernel,
            initrd=self.appliance.initrd,
            append=kernel_cmdline(port=GUEST_FIO_PORT, disks=1, accel=self.accelerator),
            accel=self.accelerator,
            vcpus=self.method.vcpus, memory_bytes=self.method.memory,
            qmp_socket=run_dir / "qmp", serial_log=console, host_port=port,
            guest_port=GUEST_FIO_PORT, vhost_socket=vhost_socket, name=f"iomatrix-vm{index}")
        argv = guest_argv(spec, qemu=require("qemu-system-x86_64"))
        proc = stack.enter_context(managed(argv, log=Path(f"{logs}-qemu.log"), stop_timeout=5))
        return Guest(index=index, port=port, qmp_socket=spec.qmp_socket, console=console,
                     argv=tuple(argv), pid=proc.pid, daemon_qmp=daemon_qmp,
                     daemon_argv=tuple(daemon_argv), daemon_pid=daemon_pid), proc

    def _wait_ready(self, config: Configuration, guests: list[Guest], procs: list) -> GuestDisk:  # type: ignore[type-arg]
        deadline = time.monotonic() + self.method.boot_timeout
        disks: list[GuestDisk] = []
        for guest, proc in zip(guests, procs):
            def ready() -> bool:
                text = read_text(guest.console)
                return READY_MARKER in text or console_error(text) is not None or proc.poll() is not None
            wait_for(ready, timeout=max(0.0, deadline - time.monotonic()), interval=0.05)
            text = read_text(guest.console)
            if READY_MARKER not in text:
                why = (console_error(text) or (f"QEMU exited (status {proc.returncode}): "
                                               f"{log_tail(Path(str(guest.console).replace('-console', '-qemu')))}"
                                               if proc.poll() is not None else
                                               f"not ready within {self.method.boot_timeout:.0f} s"))
                raise TrialFailed(f"guest vm{guest.index} ({self.accelerator}) did not boot: {why}; "
                                  f"console: {log_tail(guest.console, 6) or 'empty'}")
            found = parse_disk_lines(text)
            if not found:
                raise TrialFailed(f"guest vm{guest.index} sees no disk under test; "
                                  f"console: {log_tail(guest.console, 6)}")
            disks.append(found[0])
        return disks[0]

    def _verify(self, config: Configuration, guest: Guest, disk: GuestDisk) -> tuple[dict[str, str], list[str]]:
        """What QEMU applied (query-block, query-iothreads, qom-get) and the guest sees."""
        try:
            seen = read_guest_settings(guest.qmp_socket)
            want = expected_guest_settings(config, vcpus=self.method.vcpus)
            if guest.daemon_qmp is not None:
                seen |= {f"daemon.{k}": v for k, v in read_daemon_settings(guest.daemon_qmp).items()}
                want |= {f"daemon.{k}": v for k, v in expected_daemon_settings(config).items()}
        except ToolFailed as exc:
            raise TrialFailed(f"guest vm{guest.index}: QMP did not answer: {exc}") from exc
        wrong = [f"{key}: asked {value}, QEMU reports {seen.get(key, 'nothing')}"
                 for key, value in want.items() if seen.get(key) != value]
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
    """The KVM probe; a success is remembered for this boot of the host and this appliance."""
    boot_id = read_text(Path("/proc/sys/kernel/random/boot_id")).strip() or "unknown"
    memo = default_cache_dir() / f"kvm-probe-{boot_id}-{appliance.key[:16]}.json"
    with contextlib.suppress(OSError, ValueError):
        return KvmProbe.model_validate_json(memo.read_text())
    # The appliance itself, as guests boot it, must get as far as running its /init
    # (loglevel=7 after the command line's "quiet" lets the kernel say so).
    probe = probe_accel("kvm", appliance.kernel, appliance.initrd, timeout=KVM_PROBE_TIMEOUT,
                        marker="Run /init as init process", memory_mib=MIN_MEMORY_MIB + 128,
                        append=kernel_cmdline("loglevel=7", accel="kvm"))
    if probe.usable:   # a failure may be passing (a busy host): it is probed again next run
        with contextlib.suppress(OSError):
            memo.parent.mkdir(parents=True, exist_ok=True)
            memo.write_text(probe.model_dump_json())
    return probe
