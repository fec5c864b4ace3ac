"""Which QEMU runs here, and the behaviours iomatrix relies on that changed between versions.
A running process is asked over QMP (``query-version``, see :func:`from_qmp`); before one runs,
the binary's ``--version`` line is read (:func:`installed`)."""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any

from iomatrix.core.errors import ToolFailed
from iomatrix.core.proc import first_line, run, which

QemuVersion = tuple[int, int, int]

AIO_SET_UP_AT_FIRST_IO: QemuVersion = (9, 0, 0)
"""From QEMU 9.0 on, file-posix sets up Linux AIO and io_uring at the first request it submits
that way, not when it opens the file: see :mod:`iomatrix.qemu.procinspect`."""

DISCARD_NO_UNREF: QemuVersion = (8, 1, 0)
"""qcow2's ``discard-no-unref`` option came in QEMU 8.1; Proxmox VE 9's graph of a qcow2 volume
chain sets it on every qcow2 node (``iomatrix.platform.proxmox.blockdev``): an older QEMU
refuses the graph (``'file.backing.discard-no-unref' is unexpected``)."""

IOTHREAD_VQ_MAPPING: dict[str, QemuVersion] = {
    "virtio-blk": (9, 0, 0), "virtio-scsi": (10, 0, 0), "virtio-scsi-single": (10, 0, 0)}
"""The QEMU whose device first took ``iothread-vq-mapping`` (several IOThreads serving one
disk's queues), by controller: virtio-blk-pci from 9.0, virtio-scsi-pci from 10.0; an older
QEMU refuses the property (``Property 'virtio-blk-pci.iothread-vq-mapping' not found``)."""



def mapping_refusal(controller: str, iothreads: int, found: QemuVersion | None,
                    binary: str = "qemu-system-x86_64") -> str | None:
    """Why QEMU ``found`` cannot give a ``controller`` disk ``iothreads`` IOThreads (its
    ``iothread-vq-mapping`` came later: ``IOTHREAD_VQ_MAPPING``), or None when it can or its
    version is unknown."""
    need = IOTHREAD_VQ_MAPPING.get(controller)
    if found is None or need is None or found >= need:
        return None
    return (f"iothreads = {iothreads} on {controller} needs QEMU {shown(need)} or later (its "
            f"iothread-vq-mapping); {binary} here is {shown(found)}")


_VERSION = re.compile(r"version (\d+)\.(\d+)(?:\.(\d+))?")


def parse(line: str) -> QemuVersion | None:
    """The version in a ``--version`` line ("QEMU emulator version 10.0.13 (Debian ...)")."""
    m = _VERSION.search(line)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)) if m else None


def from_qmp(reply: Mapping[str, Any]) -> QemuVersion | None:
    """The version in a QMP ``query-version`` reply, None when it has none."""
    qemu = reply.get("qemu")
    if not isinstance(qemu, Mapping):
        return None
    try:
        return int(qemu["major"]), int(qemu["minor"]), int(qemu["micro"])
    except (KeyError, TypeError, ValueError):
        return None


@functools.cache
def installed(binary: str = "qemu-storage-daemon") -> QemuVersion | None:
    """The version of ``binary`` on PATH, or None when it is missing or says none."""
    path = which(binary)
    if path is None:
        return None
    try:
        done = run([path, "--version"], timeout=10, check=False)
    except ToolFailed:
        return None
    return parse(first_line(done.stdout or done.stderr))


def shown(version: QemuVersion) -> str:
    """``10.0.13``."""
    return ".".join(map(str, version))
