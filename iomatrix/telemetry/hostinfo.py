"""Host metadata stored with every run: what a reader needs to judge where numbers came from."""

from __future__ import annotations

import os
import platform
import re
import socket
from pathlib import Path

from iomatrix import __version__
from iomatrix.core.errors import ToolFailed
from iomatrix.core.model import Frozen
from iomatrix.core.mounts import mount_of
from iomatrix.core.proc import first_line, run, which


def _version_line(argv: list[str]) -> str:
    """The first line a tool prints for --version, or why there is none."""
    if which(argv[0]) is None:
        return "not installed"
    try:
        out = run(argv, timeout=10, check=False)
    except ToolFailed:
        return "unknown"
    return first_line(out.stdout or out.stderr) or "unknown"


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def memory_bytes(meminfo: Path = Path("/proc/meminfo")) -> int:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def device_model(source: str, sysfs: Path = Path("/sys")) -> str:
    """The model of the disk behind a /dev path, where sysfs tells it."""
    name = Path(os.path.realpath(source)).name if source.startswith("/dev/") else ""
    if not name:
        return "unknown"
    block = sysfs / "class/block" / name
    if not block.exists():
        return "unknown"
    disk = block.resolve()
    if (disk / "partition").exists():
        disk = disk.parent
    for candidate in (disk / "device/model", disk / "device/name"):
        if candidate.exists():
            text = candidate.read_text().strip()
            if text:
                return text
    rotational = disk / "queue/rotational"
    kind = ("rotational" if rotational.exists() and rotational.read_text().strip() == "1"
            else "non-rotational")
    driver = disk / "device/driver"
    drv = driver.resolve().name if driver.exists() else disk.name.rstrip("0123456789")
    return f"{drv} ({kind})"


class TargetFacts(Frozen):
    """Where the target lies: its filesystem, mount, device and the device's model."""

    path: str
    fs: str
    """The filesystem type; "(raw block device)" for a device; "unknown" when not mounted."""
    mount: str | None
    """The mount point (None for a raw block device)."""
    device: str
    model: str


class HostMetadata(Frozen):
    """Hostname, kernel, CPU, memory, tool versions, accelerator and the target's storage
    (``host_metadata``); a run stores it as text (``stored``)."""

    hostname: str
    kernel: str
    os: str
    cpu: str
    cores: int
    memory_bytes: int
    qemu: str
    qemu_storage_daemon: str
    fio: str
    accelerator: str
    iomatrix: str
    target: TargetFacts | None = None
    machine: str = "unknown"
    """The versioned machine type QEMU resolves the run's machine alias to (``pc`` →
    ``pc-i440fx-7.2``): what a guest's devices behave as."""
    zfs: str = "not loaded"
    """The ZFS kernel module's version (``/sys/module/zfs/version``), whatever the target."""
    ceph: str = "not installed"
    """The Ceph client's version (``rbd --version``): librbd, which fio and QEMU reach RBD by."""

    def stored(self) -> dict[str, str]:
        """As a run stores it (``runs.host_json``): each fact as text, the target's as
        ``target``, ``target_fs``, ``target_mount`` (not of a raw device), ``target_device``
        and ``target_model``; the run adds its own keys to it."""
        meta = {"hostname": self.hostname, "kernel": self.kernel, "os": self.os, "cpu": self.cpu,
                "cores": str(self.cores), "memory_bytes": str(self.memory_bytes),
                "qemu": self.qemu, "qemu_storage_daemon": self.qemu_storage_daemon,
                "fio": self.fio, "accelerator": self.accelerator, "iomatrix": self.iomatrix,
                "machine": self.machine, "zfs": self.zfs, "ceph": self.ceph}
        t = self.target
        if t is not None:
            meta.update(target=t.path, target_fs=t.fs)
            if t.mount is not None:
                meta["target_mount"] = t.mount
            meta.update(target_device=t.device, target_model=t.model)
        return meta


def host_metadata(target: Path | None, accelerator: str, *, machine: str) -> HostMetadata:
    """This host's metadata, with the storage of ``target`` (a directory or a device) and the
    machine type QEMU resolves the alias ``machine`` to (``qemu.args.MACHINE``)."""
    qemu = _version_line(["qemu-system-x86_64", "--version"])
    qsd = _version_line(["qemu-storage-daemon", "--version"])
    facts = None
    if target is not None:
        mount = mount_of(target)
        mnt, fstype, source = mount[:3] if mount else ("", "unknown", "unknown")
        if target.exists() and target.is_block_device():
            facts = TargetFacts(path=str(target), fs="(raw block device)", mount=None,
                                device=str(target), model=device_model(str(target)))
        else:
            facts = TargetFacts(path=str(target), fs=fstype, mount=mnt, device=source,
                                model=device_model(source))
    return HostMetadata(
        hostname=socket.gethostname(), kernel=platform.release(), os=_os_release(),
        cpu=cpu_model(), cores=os.cpu_count() or 0, memory_bytes=memory_bytes(),
        qemu=_version(qemu), qemu_storage_daemon=_version(qsd),
        fio=_version_line(["fio", "--version"]), accelerator=accelerator, iomatrix=__version__,
        target=facts, machine=machine_type("qemu-system-x86_64", machine), zfs=zfs_version(),
        ceph=_ceph_version())


def machine_type(qemu: str, alias: str) -> str:
    """The versioned machine type ``qemu -machine help`` names as ``alias``'s (``pc`` →
    ``pc-i440fx-7.2``); the alias itself when QEMU names none, "not installed" without QEMU."""
    if which(qemu) is None:
        return "not installed"
    try:
        out = run([qemu, "-machine", "help"], timeout=10, check=False).stdout
    except ToolFailed:
        return "unknown"
    found = re.search(rf"^{re.escape(alias)}\s.*\(alias of ([A-Za-z0-9._-]+)\)", out or "",
                      re.MULTILINE)
    return found.group(1) if found else alias


def zfs_version(sysfs: Path = Path("/sys")) -> str:
    """The loaded ZFS module's version, "not loaded" without one."""
    try:
        return (sysfs / "module/zfs/version").read_text().strip() or "unknown"
    except OSError:
        return "not loaded"


def _ceph_version() -> str:
    line = _version_line(["rbd", "--version"])
    found = re.search(r"ceph version (\S+)", line)
    return found.group(1) if found else line


def _version(line: str) -> str:
    m = re.search(r"version (\S+)(?: \(([^)]*)\))?", line)
    if not m:
        return line
    return m.group(1) + (f" ({m.group(2)})" if m.group(2) else "")


def _os_release() -> str:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip('"')
    except OSError:
        pass
    return platform.system()
