"""guest mode: N VMs per configuration (the appliance, or a guest of another kind:
``iomatrix.drivers.guest.kind``), each with its own disk attached as the configuration says,
fio --server inside, driven by the host's fio as client (seed 000's setup). One boot serves
every workload of a configuration. A guest that does not become ready within its kind's
timeout, or dies, fails its configuration's trials with the console's last lines; the run goes
on with the next configuration.

**The channel to the guests is private.** QEMU forwards a TCP port on 127.0.0.1 to each guest's
fio server (user networking), and fio's server has no authentication: on the host's own network
any local user could run jobs on the disk under test. So a session first moves iomatrix's thread
into a network namespace of its own (:func:`iomatrix.core.proc.private_network`, loopback only);
its QEMUs and daemons, and the fio client the runner starts from the same thread, inherit it, and
the forwarded ports exist only there. Nobody else can enter it (that needs CAP_SYS_ADMIN), and it
ends with its last process, which the kernel stops if iomatrix is killed (``orphan_guard``).
Sockets (QMP, vhost-user) and logs are in the run's 0700 scratch directory. Where no namespace can
be made (iomatrix not root), or the disks are on network storage (an RBD pool: QEMU must reach
its monitors and OSDs through the host's network), the guests use the host's loopback as
before: ``prepare`` says so in a warning, every sample stores it (``guest.channel``) and
``iomatrix doctor`` explains it; the foreign-I/O check (``iomatrix.drivers.guest.iocheck``)
still catches what a foreign client does.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from iomatrix.appliance.build import (GUEST_FIO_PORT, READY_MARKER, Appliance, GuestDisk,
                                      build_appliance, console_error, parse_disk_lines)
from iomatrix.appliance.ownimage import parse_guest_line, version_mismatch
from iomatrix.appliance.protocol import console_tail
from iomatrix.core.errors import EnvironmentProblem, ToolFailed, TrialFailed
from iomatrix.core.proc import (is_stopped, log_tail, managed, private_network,
                                private_network_problem, read_text, require, wait_for)
from iomatrix.drivers.base import Driver, Session
from iomatrix.drivers.guest.accel import resolve_accel
from iomatrix.drivers.guest.kind import GuestKind, GuestRun
from iomatrix.drivers.guest.kinds import DEFAULT_KIND, kind_for
from iomatrix.drivers.guest.session import PRIVATE, SHARED, Guest, GuestSession, free_port
from iomatrix.drivers.versions import method_versions
from iomatrix.platform import libvirt as lv
from iomatrix.qemu.affinity import Pinning
from iomatrix.qemu.args import (GuestSpec, expected_daemon_settings, expected_guest_settings,
                                guest_argv, read_daemon_settings, read_guest_settings,
                                read_iothread_ids, vhost_daemon_argv, vhost_num_queues)
from iomatrix.qemu.qmp import qmp_execute
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.method import Method
from iomatrix.targets.remote import reveal
from iomatrix.targets.workspace import Image
from iomatrix.vocab.words import Mode

DAEMON_START_TIMEOUT = 15.0


class GuestDriver(Driver):
    mode = Mode.GUEST
    sliced_devices = True
    """A block device's test area reaches QEMU as a raw slice node ([target] size)."""
    pins_threads = True
    """iomatrix pins QEMU's threads as the affinity axes ask (``iomatrix.qemu.affinity``);
    False where the platform pins them itself (libvirtd, from ``<cputune>``): only read back."""

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
        self.kinds: list[GuestKind] = [DEFAULT_KIND()]
        """What boots in the guests (``iomatrix.drivers.guest.kinds.kind_for``): the appliance
        until :meth:`use_kinds` gives the suite's."""

    @property
    def run(self) -> GuestRun:
        """What every kind's boots may use of this driver."""
        return GuestRun(appliance=self.appliance, accel=self.accelerator, method=self.method,
                        workdir=self.workdir)

    def use_kinds(self, kinds: Sequence[GuestKind], note: Callable[[str], None],
                  configurations: Sequence[Configuration]) -> None:
        """Boot ``kinds`` (a suite's, :func:`iomatrix.drivers.guest.kinds.opened_kinds`, in
        that order) from now on, each prepared for the run's ``configurations``
        (``GuestKind.prepare``: EnvironmentProblem, NotEnoughSpace)."""
        for kind in kinds:
            kind.prepare(self.run, note, configurations)
        self.kinds = list(kinds)

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
            kind = kind_for(self.kinds, config)
            kind.before_boot(self.run, len(images))
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
            pinnings = [Pinning.start(config, None if image.network else image.path,
                                      qmp_socket=guest.qmp_socket, pid=guest.pid,
                                      pin=self.pins_threads)
                        for guest, image in zip(guests, images)]    # before any workload
            session = GuestSession(config, images, guests, procs, disk, hosts,
                                   applied | seen, wrong, ramp=self.method.ramp, kind=kind,
                                   channel=channel, pinnings=pinnings)
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
        boot = kind_for(self.kinds, config).boot(stack, run_dir, image, self.run)
        spec = GuestSpec(
            config=config, image=image, kernel=boot.kernel, initrd=boot.initrd,
            append=boot.append, system=boot.system, accel=self.accelerator,
            vcpus=self.method.vcpus, memory_bytes=self.method.memory,
            qmp_socket=run_dir / "qmp", serial_log=console, host_port=port,
            guest_port=GUEST_FIO_PORT, vhost_socket=vhost_socket, name=f"iomatrix-vm{index}",
            platform=self.method.platform, pve_version=self.method.pve_version,
            libvirt=self.libvirt)
        argv = guest_argv(spec, qemu=require("qemu-system-x86_64"))
        proc = stack.enter_context(managed(reveal(argv, image.network),
                                           log=Path(f"{logs}-qemu.log"), stop_timeout=5,
                                           pass_fds=boot.fds))
        return Guest(index=index, port=port, qmp_socket=spec.qmp_socket, console=console,
                     argv=tuple(argv), pid=proc.pid, daemon_qmp=daemon_qmp,
                     daemon_argv=tuple(daemon_argv), daemon_pid=daemon_pid), proc

    def _wait_ready(self, config: Configuration, guests: list[Guest],
                    procs: list) -> tuple[GuestDisk, dict[str, str]]:  # type: ignore[type-arg]
        """The first guest's disk under test and what its OS says of itself, once every guest
        is ready."""
        kind = kind_for(self.kinds, config)
        timeout = kind.ready_seconds(self.run)
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
        return disks[0], kind.facts(seen, self.run)

    def _verify(self, config: Configuration, image: Image, guest: Guest,
                disk: GuestDisk) -> tuple[dict[str, str], list[str]]:
        """What QEMU applied (query-block, query-iothreads, qom-get) and the guest sees."""
        try:
            seen = read_guest_settings(guest.qmp_socket)
            threads = read_iothread_ids(guest.qmp_socket)
            want = expected_guest_settings(config, vcpus=self.method.vcpus,
                                           platform=self.method.platform,
                                           pve_version=self.method.pve_version,
                                           libvirt=self.libvirt,
                                           is_device=image.is_device and self.sliced_devices,
                                           network=image.network and image.network.protocol,
                                           backing=len(image.backing))
            if guest.daemon_qmp is not None:
                seen |= {f"daemon.{k}": v for k, v in read_daemon_settings(guest.daemon_qmp).items()}
                want |= {f"daemon.{k}": v for k, v in expected_daemon_settings(config).items()}
        except ToolFailed as exc:
            raise TrialFailed(f"guest vm{guest.index}: QMP did not answer: {exc}") from exc
        wrong = [f"{key}: asked {value}, QEMU reports {seen.get(key, 'nothing')}"
                 for key, value in want.items() if seen.get(key) != value]
        if self.libvirt is not None:
            seen["libvirt.version"] = self.libvirt.label
        if threads:
            seen["iothreads.thread-ids"] = ",".join(f"{k}={v}" for k, v in threads.items())
        applied = seen | {"accel": self.accelerator, "guest.disk": disk.name,
                          "guest.queues": str(disk.queues), "guest.scheduler": disk.scheduler,
                          "guest.rotational": "1" if disk.rotational else "0",
                          "guest.driver": disk.driver}
        return applied, wrong

    def _quit(self, guests: list[Guest], procs: list) -> None:  # type: ignore[type-arg]
        """Graceful stop: QMP quit to every guest; the context managers then reap (or kill).
        A QEMU stopped whole (SIGSTOP) answers no monitor: it is left to them (``proc.stop``
        continues it after its SIGTERM) rather than waited for."""
        quitting = [(guest, proc) for guest, proc in zip(guests, procs)
                    if proc.poll() is None and not is_stopped(proc.pid)]
        for guest, _ in quitting:
            with contextlib.suppress(ToolFailed):
                qmp_execute(guest.qmp_socket, [("quit", None)], timeout=3)
        for _, proc in quitting:
            with contextlib.suppress(Exception):
                proc.wait(timeout=5)


def shared_warning(reason: str) -> str:
    """What a run and ``iomatrix doctor`` say when the guests cannot have a private network."""
    return (f"the guests' fio servers will listen on 127.0.0.1 of this host, where every local "
            f"user can run fio jobs on the disks under test ({reason}); run iomatrix as root to "
            "give each guest session a private network namespace (foreign I/O still fails its "
            "trial)")
