"""Host metadata stored with every run: what a reader needs to judge where numbers came from."""

from __future__ import annotations

import os
import platform
import re
import shutil
import socket
import subprocess
from pathlib import Path

from iomatrix import __version__


def _first_line(argv: list[str]) -> str:
    if shutil.which(argv[0]) is None:
        return "not installed"
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr) else "unknown"


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


def mount_of(path: Path, mountinfo: Path = Path("/proc/self/mountinfo")) -> tuple[str, str, str]:
    """(mount point, filesystem type, source device) of the filesystem holding ``path``."""
    real = os.path.realpath(path)
    best = ("", "unknown", "unknown")
    try:
        lines = mountinfo.read_text().splitlines()
    except OSError:
        return best
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if len(fields) < 5 or len(rfields) < 2:
            continue
        mnt = fields[4].replace("\\040", " ")
        inside = real == mnt or real.startswith(mnt.rstrip("/") + "/")
        if inside and len(mnt) >= len(best[0]):
            best = (mnt, rfields[0], rfields[1])
    return best


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
    qemu = _first_line(["qemu-system-x86_64", "--version"])
    qsd = _first_line(["qemu-storage-daemon", "--version"])
    meta = {
        "hostname": socket.gethostname(),
        "kernel": platform.release(),
        "os": _os_release(),
        "cpu": cpu_model(),
        "cores": str(os.cpu_count() or 0),
        "memory_bytes": str(memory_bytes()),
        "qemu": _version(qemu),
        "qemu_storage_daemon": _version(qsd),
        "fio": _first_line(["fio", "--version"]),
        "accelerator": accelerator,
        "iomatrix": __version__,
    }
    if target is not None:
        mnt, fstype, source = mount_of(target)
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
