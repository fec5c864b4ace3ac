"""guest mode through a real libvirtd (``[method] platform = "libvirt"`` with ``libvirt_uri``).

The guests are the appliance VMs of :mod:`iomatrix.drivers.guest`, but libvirt starts them:
iomatrix writes one transient domain per guest (``virsh create``) with

* direct kernel boot of the appliance as its guest kind boots it (``iomatrix.drivers.guest.kinds
  .kind_for``, ``GuestKind.boot``: ``<os><kernel/><initrd/><cmdline/>``), ``<on_reboot>
  destroy`` (QEMU's ``-no-reboot``), no USB controller, no balloon, no graphics;
* the disk under test as a libvirt user writes it for the configuration (its ``<controller>``,
  ``<disk>`` with ``<driver cache= io= [iothread= queues= queue_size=]>`` or several IOThreads'
  ``<driver><iothreads>``, ``<iothreads>``): :func:`iomatrix.platform.libvirt.disk_xml`, the
  XML ``recommend --for libvirt`` prints; the configuration's CPU sets as ``<cputune>``
  (vcpupin, iothreadpin, emulatorpin: :func:`iomatrix.platform.libvirt.cputune_xml`);
* the serial console to a file in the run's scratch directory;
* QEMU as root (``<seclabel type='static' model='dac' relabel='no'>``): the appliance, the
  scratch directory and the images are root's, in 0700 directories libvirt's ``libvirt-qemu``
  user cannot enter, and libvirt must not relabel the images under test;
* ``<qemu:commandline>`` passthrough (the domain is then "tainted: custom-argv") for two things
  libvirt 9.0 cannot express: the fio port forward (libvirt 9.0's ``<interface type='user'>``
  takes a ``<portForward>`` only with the passt backend, which Debian 12 does not install) as
  the same ``-netdev user,hostfwd=`` iomatrix's own guests have, and a second QMP monitor on a
  socket in the scratch directory, which the foreign-I/O sampler reads every 50 ms (a ``virsh``
  process per reading costs tens of milliseconds).

The settings check reads QEMU twice: what :func:`iomatrix.qemu.args.read_guest_settings` reads
on the second monitor (the same keys as for iomatrix's own guests), and ``query-block`` through
libvirt's own monitor (``virsh qemu-monitor-command``), whose cache flags must agree.

``virsh``, not the libvirt Python binding: PyPI's ``libvirt-python`` is a source distribution
only, built against ``libvirt-dev`` with a C compiler; ``virsh`` comes with ``libvirt-clients``,
which ``libvirt-daemon-system`` pulls in anyway.

**Leftovers.** A transient domain lives until destroyed, also after iomatrix is killed. Each is
named ``iomatrix-<run>-p<pid>-b<boot>-vm<i>`` and carries its owner in ``<metadata>``
(:data:`OWNER_NS`: pid, host, boot id, start time, as :mod:`iomatrix.core.owner` names a
process). The session destroys its domains on exit (also on Ctrl-C); the next libvirt run's
``prepare`` and ``iomatrix clean`` destroy those whose owner is dead
(:func:`reclaim_domains`). The guests are libvirtd's children, in its network namespace: they
cannot be given iomatrix's private one, so the fio ports are on the host's loopback (said in a
warning and stored per sample, as for a non-root run of iomatrix's own guests).
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple
from xml.etree import ElementTree as ET

from iomatrix.appliance.build import GUEST_FIO_PORT
from iomatrix.core import cpuset
from iomatrix.core.errors import EnvironmentProblem, ToolFailed, TrialFailed
from iomatrix.core.owner import Identity, liveness, start_ticks, this_process
from iomatrix.core.proc import read_text, require, run, wait_for
from iomatrix.drivers.guest import Guest, GuestDriver, free_port
from iomatrix.drivers.guest.kinds import kind_for
from iomatrix.platform import libvirt as lv
from iomatrix.qemu.args import MACHINE, disk_backend
from iomatrix.platform.qemu import cache_flags
from iomatrix.suite.configuration import Configuration
from iomatrix.vocab.axes import AFFINITY_AXES, vq_groups
from iomatrix.suite.method import Method
from iomatrix.targets.workspace import Image
from iomatrix.vocab.words import Accelerator

DEFAULT_URI = "qemu:///system"
DOMAIN_PREFIX = "iomatrix-"
OWNER_NS = "https://iomatrix.invalid/libvirt/owner/1"
"""XML namespace of the owner element in each domain's ``<metadata>``."""
QEMU_NS = "http://libvirt.org/schemas/domain/qemu/1.0"
VIRSH_TIMEOUT = 30.0
PROBE_TIMEOUT = 300.0
"""For virsh commands that need libvirt's QEMU capabilities (create, version,
domxml-to-native): libvirt may probe QEMU again first, which takes minutes on a loaded host
where /dev/kvm is not root:kvm (see README)."""
LIBVIRT_LOGS = Path("/var/log/libvirt/qemu")
RUN_DIR = Path("/run/libvirt/qemu")
SHARED_REASON = ("the guests are libvirtd's processes, in its network namespace, not in a "
                 "private one of iomatrix's")


def virsh(uri: str, *args: str, timeout: float = VIRSH_TIMEOUT, check: bool = True) -> str:
    """``virsh -c URI -q ARGS``'s output; ToolFailed with virsh's message when it fails."""
    proc = run([require("virsh", hint="install libvirt-clients (./setup.sh)"), "-c", uri, "-q",
                *args], timeout=timeout, check=check)
    return proc.stdout


def daemon_versions(uri: str) -> lv.Versions:
    """The libvirtd at ``uri`` and the QEMU it runs (``virsh version --daemon``: "Running
    against daemon: 11.3.0", "Running hypervisor: QEMU 10.0.2")."""
    # libvirt answers for QEMU from its capabilities cache, which it may have to probe
    # again first (tens of seconds; see README, /dev/kvm)
    text = virsh(uri, "version", "--daemon", timeout=PROBE_TIMEOUT)
    lines = {k.strip(): v for k, _, v in (line.partition(":") for line in text.splitlines())}
    try:
        return lv.Versions(libvirt=lv.parse_version(lines.get("Running against daemon", "")),
                           qemu=lv.parse_version(lines.get("Running hypervisor", "")))
    except ValueError as exc:
        raise EnvironmentProblem(f"`virsh -c {uri} version` names no daemon or QEMU version: "
                                 f"{exc}") from None


def libvirt_problem(uri: str) -> str | None:
    """Why guests cannot run through libvirtd at ``uri`` (None: they can)."""
    if shutil.which("virsh") is None:
        return "virsh is not installed (Debian package libvirt-clients; ./setup.sh installs it)"
    try:
        virsh(uri, "uri", timeout=15)   # answers without libvirt's QEMU capabilities
    except ToolFailed as exc:
        text = " ".join((exc.output or str(exc)).split())
        return (f"libvirtd at {uri} does not answer: {text[-300:]} (start it: `systemctl start "
                "libvirtd`, or `libvirtd -d` where there is no systemd)")
    return None


# --- the domain XML ------------------------------------------------------------------------------

class DomainSpec(NamedTuple):
    name: str
    config: Configuration
    image: Image
    kernel: Path
    initrd: Path
    cmdline: str
    accel: str
    vcpus: int
    memory_bytes: int
    console: Path
    qmp_socket: Path
    host_port: int
    owner: Identity
    run: str


def domain_xml(spec: DomainSpec) -> str:
    """The transient domain of one guest (see the module docstring)."""
    ET.register_namespace("qemu", QEMU_NS)
    ET.register_namespace("iomatrix", OWNER_NS)
    kind = str(spec.config.controller)
    try:
        disk, threads = lv.disk_for(kind, source=str(spec.image.path), block=spec.image.is_device,
                                    aio=spec.config.aio, cache=spec.config.cache,
                                    iothread=bool(spec.config.iothread),
                                    fmt=spec.config.format or "raw",
                                    num_queues=spec.config.num_queues,
                                    queue_size=spec.config.queue_size,
                                    discard=spec.config.discard,
                                    iothreads=spec.config.iothreads,
                                    vq_groups=vq_groups(spec.config.vq_mapping))
        tune = lv.cputune_xml(vcpus=spec.vcpus, iothreads=threads, **_pins(spec))
    except ValueError as exc:
        raise TrialFailed(f"{spec.config.key}: {exc}") from None
    root = ET.Element("domain", {"type": "kvm" if spec.accel == Accelerator.KVM else "qemu"})
    ET.SubElement(root, "name").text = spec.name
    meta = ET.SubElement(root, "metadata")
    o = spec.owner
    ET.SubElement(meta, f"{{{OWNER_NS}}}owner", {
        "pid": str(o.pid), "host": o.host, "boot": o.boot_id, "start": str(o.start_ticks),
        "uid": str(o.uid), "run": spec.run})
    ET.SubElement(root, "memory", {"unit": "b"}).text = str(spec.memory_bytes)
    ET.SubElement(root, "vcpu").text = str(spec.vcpus)
    parts = lv.disk_xml(disk, threads)
    root.extend(element for where, element in parts if where == "<domain>")
    if tune is not None:
        root.append(tune)
    os_el = ET.SubElement(root, "os")
    ET.SubElement(os_el, "type", {"arch": "x86_64", "machine": MACHINE}).text = "hvm"
    ET.SubElement(os_el, "kernel").text = str(spec.kernel)
    ET.SubElement(os_el, "initrd").text = str(spec.initrd)
    ET.SubElement(os_el, "cmdline").text = spec.cmdline
    ET.SubElement(root, "cpu", {"mode": "host-passthrough" if spec.accel == Accelerator.KVM
                                  else "maximum"})
    ET.SubElement(root, "on_poweroff").text = "destroy"
    ET.SubElement(root, "on_reboot").text = "destroy"
    ET.SubElement(root, "on_crash").text = "destroy"
    devices = ET.SubElement(root, "devices")
    ET.SubElement(devices, "emulator").text = require("qemu-system-x86_64")
    devices.extend(element for where, element in parts if where == "<devices>")
    ET.SubElement(devices, "controller", {"type": "usb", "model": "none"})
    serial = ET.SubElement(devices, "serial", {"type": "file"})
    ET.SubElement(serial, "source", {"path": str(spec.console)})
    ET.SubElement(serial, "target", {"port": "0"})
    ET.SubElement(devices, "memballoon", {"model": "none"})
    label = ET.SubElement(root, "seclabel", {"type": "static", "model": "dac", "relabel": "no"})
    ET.SubElement(label, "label").text = "+0:+0"
    cmd = ET.SubElement(root, f"{{{QEMU_NS}}}commandline")
    for arg in ("-netdev", f"user,id=net0,hostfwd=tcp:127.0.0.1:{spec.host_port}-:"
                           f"{GUEST_FIO_PORT}",
                "-device", "virtio-net-pci,netdev=net0,id=nic0,romfile=,bus=pci.0,addr=0x1f",
                "-chardev", f"socket,id=iomqmp,path={str(spec.qmp_socket).replace(',', ',,')},"
                            "server=on,wait=off",
                "-mon", "chardev=iomqmp,mode=control"):
        ET.SubElement(cmd, f"{{{QEMU_NS}}}arg", {"value": arg})
    ET.indent(root, space="  ")
    return ET.tostring(root, encoding="unicode") + "\n"


def _pins(spec: DomainSpec) -> dict[str, str | None]:
    """The configuration's CPU sets as ``<cputune>`` takes them, resolved on this host ("numa":
    the CPUs of the image's block device's NUMA node; ValueError for CPUs it lacks)."""
    device = str(spec.image.path) if spec.image.is_device else None
    out: dict[str, str | None] = {}
    for axis, key in zip(AFFINITY_AXES, ("vcpu", "iothread", "main")):
        level = getattr(spec.config, axis)
        out[key] = cpuset.shown(cpuset.resolve(level, device)[0]) if level else None
    return out


# --- a domain as the guest code sees a process ---------------------------------------------------

class DomainProcess:
    """A running domain's QEMU with the ``poll``/``wait``/``returncode`` the guest code uses;
    its pid from libvirt's pid file. When QEMU has gone, libvirt's log of the domain is copied
    to ``log`` (the guest code quotes its tail)."""

    def __init__(self, uri: str, name: str, log: Path) -> None:
        self.uri, self.name, self.log = uri, name, log
        self.returncode: int | None = None
        pid_file = RUN_DIR / f"{name}.pid"
        wait_for(lambda: read_text(pid_file).strip().isdigit(), timeout=10)
        text = read_text(pid_file).strip()
        self.pid = int(text) if text.isdigit() else 0
        self._ticks = start_ticks(self.pid) if self.pid else None

    def poll(self) -> int | None:
        if self.returncode is None and (self._ticks is None
                                        or start_ticks(self.pid) != self._ticks):
            self.returncode = -1
            with contextlib.suppress(OSError):
                shutil.copyfile(LIBVIRT_LOGS / f"{self.name}.log", self.log)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        wait_for(lambda: self.poll() is not None, timeout=timeout or 30.0, interval=0.05)
        return self.returncode


def destroy(uri: str, name: str) -> None:
    """Destroy a transient domain (it is then gone); libvirt's log of it is removed too."""
    with contextlib.suppress(ToolFailed):
        virsh(uri, "destroy", name)
    with contextlib.suppress(OSError):
        (LIBVIRT_LOGS / f"{name}.log").unlink()


# --- leftovers ------------------------------------------------------------------------------------

class Leftover(NamedTuple):
    name: str
    action: str
    """destroyed, would destroy, or left."""
    detail: str


def owner_of(uri: str, name: str) -> Identity | None:
    """The owner recorded in an iomatrix domain's metadata (None: none recorded)."""
    try:
        text = virsh(uri, "metadata", name, OWNER_NS)
        el = ET.fromstring(text)
        return Identity(pid=int(el.get("pid", "0")), host=el.get("host", ""),
                        boot_id=el.get("boot", ""), start_ticks=int(el.get("start", "0")),
                        uid=int(el.get("uid", "0")))
    except (ToolFailed, ET.ParseError, ValueError):
        return None


def reclaim_domains(uri: str = DEFAULT_URI, *, dry_run: bool = False) -> list[Leftover]:
    """Destroy the iomatrix domains at ``uri`` whose owner is dead; those of live owners (and
    domains without an owner of iomatrix's) are left. Nothing when libvirtd does not answer."""
    if libvirt_problem(uri) is not None:
        return []
    done = []
    names = [n.strip() for n in virsh(uri, "list", "--name").splitlines()]
    for name in names:
        if not name.startswith(DOMAIN_PREFIX):
            continue
        owner = owner_of(uri, name)
        if owner is None:
            if name in leftover_domains(uri):       # not one that went away meanwhile
                done.append(Leftover(name, "left", "no iomatrix owner in its <metadata>"))
            continue
        alive, why = liveness(owner)
        if alive:
            done.append(Leftover(name, "left", f"its iomatrix runs ({why})"))
        elif dry_run:
            done.append(Leftover(name, "would destroy", f"its iomatrix is dead ({why})"))
        else:
            destroy(uri, name)
            done.append(Leftover(name, "destroyed", f"its iomatrix is dead ({why})"))
    return done


def describe(item: Leftover) -> str:
    return f"{item.action} libvirt domain {item.name}: {item.detail}"


# --- the driver ----------------------------------------------------------------------------------

class LibvirtDriver(GuestDriver):
    """:class:`GuestDriver` whose guests libvirtd starts (see the module docstring)."""

    sliced_devices = False    # the domain's <disk> is the whole device
    pins_threads = False      # libvirtd pins them from <cputune>: iomatrix reads them back

    def __init__(self, method: Method, workdir: Path, **kw: Any) -> None:
        super().__init__(method, workdir, **kw)
        self.uri = method.libvirt_uri or DEFAULT_URI
        self.owner = this_process()
        self.run_tag = workdir.name.removeprefix("iomatrix-run-")[:16] or "run"

    @classmethod
    def prepare(cls, method: Method, workdir: Path, *, accel: str,
                note: Callable[[str], None]) -> GuestDriver:
        uri = method.libvirt_uri or DEFAULT_URI
        problem = libvirt_problem(uri)
        if problem is not None:
            raise EnvironmentProblem(f"[method] libvirt_uri = {uri!r}: {problem}")
        for item in reclaim_domains(uri):
            if item.action == "destroyed":
                note(describe(item))
        from iomatrix.appliance.build import build_appliance
        from iomatrix.drivers.guest import resolve_accel, shared_warning
        appliance = build_appliance()
        for line in appliance.notes():
            note(line)
        note(f"warning: {shared_warning(SHARED_REASON)}")
        driver = cls(method, workdir, appliance=appliance,
                     accel=resolve_accel(accel, appliance, note), shared_reason=SHARED_REASON)
        driver.libvirt = daemon_versions(uri)
        note(f"libvirtd at {uri}: {driver.libvirt.label}")
        return driver

    def domain_name(self, index: int) -> str:
        return f"{DOMAIN_PREFIX}{self.run_tag}-p{self.owner.pid}-b{self.boots}-vm{index}"

    def _start(self, stack: contextlib.ExitStack, config: Configuration, image: Image,
               index: int) -> tuple[Guest, object]:
        if config.data_path == "vhost-user-blk":
            raise TrialFailed("iomatrix does not model libvirt's vhost-user-blk disks")
        run_dir = self.workdir / f"b{self.boots}" / f"v{index}"
        run_dir.mkdir(parents=True, exist_ok=True)
        logs = self.workdir / f"boot{self.boots}-vm{index}"
        console = Path(f"{logs}-console.log")
        console.write_text("")
        name = self.domain_name(index)
        kind = kind_for(self.kinds, config)   # the appliance: a suite's [guest] is refused
        boot = kind.boot(stack, run_dir, image, self.run)
        if boot.kernel is None or boot.initrd is None or boot.system or boot.fds:
            raise TrialFailed(f"libvirt boots only a guest given by its kernel and initrd, "
                              f"not {kind.label!r}")
        spec = DomainSpec(
            name=name, config=config, image=image, kernel=boot.kernel, initrd=boot.initrd,
            cmdline=boot.append, accel=self.accelerator, vcpus=self.method.vcpus,
            memory_bytes=self.method.memory, console=console, qmp_socket=run_dir / "qmp",
            host_port=free_port(), owner=self.owner, run=self.run_tag)
        xml_path = Path(f"{logs}-domain.xml")
        xml_path.write_text(domain_xml(spec))
        stack.callback(destroy, self.uri, name)
        try:
            virsh(self.uri, "create", str(xml_path), timeout=PROBE_TIMEOUT)
        except ToolFailed as exc:
            raise TrialFailed(f"libvirt did not start vm{index}: "
                              f"{' '.join((exc.output or str(exc)).split())[-400:]}") from exc
        proc = DomainProcess(self.uri, name, Path(f"{logs}-qemu.log"))
        wait_for(lambda: spec.qmp_socket.exists() or proc.poll() is not None, timeout=10)
        # the command line libvirt gave QEMU, as QEMU holds it
        argv = tuple(a for a in read_text(Path(f"/proc/{proc.pid}/cmdline")).split("\0") if a)
        return Guest(index=index, port=spec.host_port, qmp_socket=spec.qmp_socket,
                     console=console, argv=argv, pid=proc.pid), proc

    def _verify(self, config: Configuration, image: Image, guest: Guest,
                disk: Any) -> tuple[dict[str, str], list[str]]:
        applied, wrong = super()._verify(config, image, guest, disk)
        name = self.domain_name(guest.index)
        try:
            blocks = json.loads(virsh(self.uri, "qemu-monitor-command", name,
                                      '{"execute": "query-block"}'))["return"]
        except (ToolFailed, ValueError, KeyError) as exc:
            raise TrialFailed(f"guest vm{guest.index}: libvirt's monitor did not answer: "
                              f"{exc}") from exc
        entry = disk_backend(blocks)
        backend = None if entry is None else entry["inserted"]
        flags = cache_flags(config)
        seen = {} if backend is None else {
            "libvirt.cache.direct": str(backend["cache"]["direct"]).lower(),
            "libvirt.cache.no-flush": str(backend["cache"]["no-flush"]).lower(),
            "libvirt.write-cache": "on" if backend["cache"]["writeback"] else "off"}
        want = {"libvirt.cache.direct": str(flags.direct).lower(),
                "libvirt.cache.no-flush": str(flags.no_flush).lower(),
                "libvirt.write-cache": "on" if flags.writeback else "off"}
        wrong += [f"{key} (virsh qemu-monitor-command query-block): asked {value}, libvirt's "
                  f"QEMU reports {seen.get(key, 'nothing')}"
                  for key, value in want.items() if seen.get(key) != value]
        return applied | seen | {"libvirt.uri": self.uri, "libvirt.domain": name}, wrong

    def _quit(self, guests: list[Guest], procs: list) -> None:  # type: ignore[type-arg]
        for guest, proc in zip(guests, procs):
            destroy(self.uri, self.domain_name(guest.index))
        for proc in procs:
            with contextlib.suppress(Exception):
                proc.wait(timeout=10)


def leftover_domains(uri: str = DEFAULT_URI) -> list[str]:
    """Names of the iomatrix domains now at ``uri`` (none when libvirtd does not answer)."""
    if libvirt_problem(uri) is not None:
        return []
    return [n.strip() for n in virsh(uri, "list", "--name").splitlines()
            if n.strip().startswith(DOMAIN_PREFIX)]

