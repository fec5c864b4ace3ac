"""Host CPU sets as Linux writes them ("0-3,8"): parsed strictly, shown canonically, and the
host's facts about them (online CPUs, a block device's NUMA node and that node's CPUs).

A suite's CPU set is untrusted text: it is parsed into integers here and only ever reaches the
kernel as a set of integers (``os.sched_setaffinity``) or as text this module wrote back
(``shown``), never as the suite wrote it."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

NUMA = "numa"
"""The level meaning "the CPUs of the target device's NUMA node" (resolved per run)."""
MAX_CPU = 8191
"""The highest CPU number a set may name (the kernel's NR_CPUS limit on x86_64)."""
_ITEM = re.compile(r"^(\d{1,4})(?:-(\d{1,4}))?$")
SYS = Path("/sys")


def parse(text: str) -> frozenset[int]:
    """The CPUs of a list such as ``0-3,8`` (ValueError naming what is wrong)."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("a CPU set is a list such as \"0-3,8\" (or \"numa\")")
    cpus: set[int] = set()
    for item in text.strip().split(","):
        match = _ITEM.match(item.strip())
        if match is None:
            raise ValueError(f"{item.strip()!r} is not a CPU or a range: write a CPU set such as "
                             "\"0-3,8\" (or \"numa\")")
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) is not None else low
        if high < low or high > MAX_CPU:
            raise ValueError(f"{item.strip()!r}: a range goes from a lower CPU to a higher one, "
                             f"at most {MAX_CPU}")
        cpus.update(range(low, high + 1))
    return frozenset(cpus)


def shown(cpus: frozenset[int] | set[int]) -> str:
    """The canonical text of a set: ascending, ranges joined (``{0, 1, 3}`` → ``0-1,3``)."""
    out: list[str] = []
    ordered = sorted(cpus)
    start = prev = None
    for cpu in [*ordered, None]:
        if prev is not None and cpu == prev + 1:
            prev = cpu
            continue
        if start is not None:
            out.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = cpu
    return ",".join(out)


def level(text: str) -> str:
    """A suite's level, validated and canonical: ``numa``, or a CPU set as ``shown`` writes it."""
    if isinstance(text, str) and text.strip().lower() == NUMA:
        return NUMA
    return shown(parse(text))


def online(root: Path = SYS) -> frozenset[int]:
    """The host's online CPUs (/sys/devices/system/cpu/online)."""
    return parse((root / "devices/system/cpu/online").read_text())


def device_node(device: str, root: Path = SYS) -> int | None:
    """The NUMA node of block device ``device`` (a name such as ``sda`` or ``nvme0n1``, or a
    partition's: its disk's node; a device-mapper or md device's: its first component's), as
    the nearest of its device's ancestors states it, or None when none does (a loop device, a
    virtual disk without NUMA, a node of -1)."""
    found = device_attribute(device, "numa_node", root)
    if found is None:
        return None
    with contextlib.suppress(OSError, ValueError):
        value = int(found.read_text().strip())
        return value if value >= 0 else None
    return None


def device_attribute(device: str, name: str, root: Path = SYS) -> Path | None:
    """The sysfs attribute ``name`` (``numa_node``, ``msi_irqs``) of the hardware behind block
    device ``device``: its device's or the nearest ancestor's that has it, for a partition its
    disk's, for a device-mapper or md device its first component's (a few levels deep); None
    where none has it (a loop device has no device at all)."""
    block = disk_dir(device, root)
    for _ in range(4):          # dm over dm over a partition: deep enough
        if block is None:
            return None
        found = nearest(block / "device", name)
        if found is not None:
            return found
        slaves = sorted((block / "slaves").iterdir()) if (block / "slaves").is_dir() else []
        block = disk_dir(slaves[0].name, root) if slaves else None
    return None


def disk_dir(device: str, root: Path = SYS) -> Path | None:
    """/sys/class/block/NAME resolved, a partition's disk for a partition; None when ``device``
    (a name or a /dev path) is not a block device's."""
    name = Path(device).name
    if not re.fullmatch(r"[A-Za-z0-9._:-]+", name):
        return None
    block = root / "class/block" / name
    if not block.exists():
        return None
    block = block.resolve()
    return block.parent if (block / "partition").exists() else block


def nearest(start: Path, name: str) -> Path | None:
    """``name`` in ``start`` (a device directory, resolved) or its nearest ancestor that has it,
    below /sys/devices."""
    try:
        here = start.resolve(strict=True)
    except OSError:
        return None
    while here.name and here.name != "devices":
        if (here / name).exists():
            return here / name
        here = here.parent
    return None


def node_cpus(node: int, root: Path = SYS) -> frozenset[int]:
    """The CPUs of NUMA node ``node`` (/sys/devices/system/node/nodeN/cpulist)."""
    return parse((root / f"devices/system/node/node{int(node)}/cpulist").read_text())


def resolve(text: str, device: str | None, root: Path = SYS) -> tuple[frozenset[int], str]:
    """The CPUs a level means on this host, and a note where "numa" fell back to every online
    CPU (the device has no NUMA node). ValueError (one line) for CPUs the host does not have
    online."""
    cpus_online = online(root)
    if text == NUMA:
        node = device_node(device, root) if device else None
        if node is None:
            what = f"the target device {Path(device).name}" if device else "the target"
            return cpus_online, (f"{what} has no NUMA node (a loop device, or a disk without "
                                 f"NUMA information): \"numa\" means every online CPU, "
                                 f"{shown(cpus_online)}")
        return node_cpus(node, root) & cpus_online, ""
    cpus = parse(text)
    missing = cpus - cpus_online
    if missing:
        raise ValueError(f"CPU set {text}: CPU {shown(missing)} is not an online CPU of this host "
                         f"(online: {shown(cpus_online)})")
    return cpus, ""
