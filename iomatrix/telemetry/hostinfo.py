"""Host metadata stored with every run: what a reader needs to judge where numbers came from."""

from __future__ import annotations

import os
import platform
import re
import socket
from pathlib import Path

from iomatrix import __version__
from iomatrix.core.errors import ToolFailed
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


def host_metadata(target: Path | None, accelerator: str) -> dict[str, str]:
    """Hostname, kernel, CPU, memory, tool versions, accelerator and the target's storage."""
    qemu = _version_line(["qemu-system-x86_64", "--version"])
    qsd = _version_line(["qemu-storage-daemon", "--version"])
    meta = {
        "hostname": socket.gethostname(),
        "kernel": platform.release(),
        "os": _os_release(),
        "cpu": cpu_model(),
        "cores": str(os.cpu_count() or 0),
        "memory_bytes": str(memory_bytes()),
        "qemu": _version(qemu),
        "qemu_storage_daemon": _version(qsd),
        "fio": _version_line(["fio", "--version"]),
        "accelerator": accelerator,
        "iomatrix": __version__,
    }
    if target is not None:
        mount = mount_of(target)
        mnt, fstype, source = mount[:3] if mount else ("", "unknown", "unknown")
        if target.exists() and target.is_block_device():
            meta.update(target=str(target), target_fs="(raw block device)",
                        target_device=str(target), target_model=device_model(str(target)))
        else:
            meta.update(target=str(target), target_fs=fstype, target_mount=mnt,
                        target_device=source, target_model=device_model(source))
    return meta


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
