"""What the host and the appliance's init agree on: the kernel command line that boots it, the
console markers the init prints, and their parsers.

The init (``init.sh``) reads ``iomatrix.port``, ``iomatrix.disks`` and ``iomatrix.trace`` from
the command line, prints one :data:`DISK_MARKER` line per disk, :data:`READY_MARKER` once
``fio --server`` listens, or an :data:`ERROR_MARKER` line before it powers the guest off."""

from __future__ import annotations

import shlex
from pathlib import Path

from iomatrix.core.errors import IomatrixError
from iomatrix.core.model import Frozen
from iomatrix.core.text import printable
from iomatrix.vocab.words import Accelerator

READY_MARKER = "IOMATRIX-READY"
"""Printed on the serial console once ``fio --server`` listens:
``IOMATRIX-READY uptime=<s> init=<s at /init> port=<guest port> nic=<interface>``."""
DISK_MARKER = "IOMATRIX-DISK"
"""Prefix of one console line per guest disk, followed by ``key=value`` fields (see GuestDisk)."""
ERROR_MARKER = "IOMATRIX-ERROR"
"""Prefix of the console line the init prints when it cannot get fio ready (then it powers off)."""
TRACE_MARKER = "IOMATRIX-TRACE"
"""With ``iomatrix.trace=1``: ``IOMATRIX-TRACE <uptime> <stage>`` as the init reaches each stage."""
GUEST_FIO_PORT = 8765
GUEST_IP = "10.0.2.15"
"""The guest's address on QEMU's user-mode network (10.0.2.0/24, gateway 10.0.2.2)."""
CONSOLE_LINES = 5
"""The most lines of a guest's console a failure reason carries: the console is the guest's
(whatever its image prints), stored with the trial and shown to whoever reads the run."""
CONSOLE_LINE_CHARS = 160
"""A console line longer than this is cut (before its characters are escaped)."""
_CONSOLE_TAIL_BYTES = 64 << 10
MIN_MEMORY_MIB = 320
"""Guest memory the appliance needs, with a margin (288 MiB booted, 256 MiB did not: the ~90 MB
initramfs that carried fio's libraries is held twice while it is unpacked; the static fio's is
~9 MB, but an appliance may still fall back to the libraries)."""


class GuestDisk(Frozen):
    """The guest's view of one disk, parsed from a :data:`DISK_MARKER` console line."""

    name: str
    size_bytes: int
    queues: int
    scheduler: str
    rotational: bool
    driver: str = ""
    model: str = ""


def kernel_cmdline(extra: str = "", *, port: int | None = None, disks: int | None = None,
                   accel: str = Accelerator.KVM, trace: bool = False) -> str:
    """The appliance's kernel command line: serial console, fast boot, the init's options
    (``port``: fio's port in the guest; ``disks``: how many disks to wait for before READY;
    ``trace``: print TRACE lines), and for ``accel="tcg"`` what only helps an emulated CPU."""
    parts = [
        "console=ttyS0", "panic=-1", "quiet",
        # ramfs, not tmpfs: tmpfs caps the root at half of RAM, which ~90 MB of initramfs
        # exceeds below ~384 MiB of guest memory (see MIN_MEMORY_MIB).
        "rootfstype=ramfs",
        # SCSI hosts scan their targets before insmod returns: the init then sees every disk.
        "scsi_mod.scan=sync",
        # Boot-time costs measured under TCG (see iomatrix.appliance.build's docstring); none
        # changes the I/O path: crypto self-tests, the W+X page-table walk after write-protecting
        # the kernel, and ACPI interrupt-link evaluation per PCI device (virtio, NVMe and AHCI
        # use MSI or MSI-X anyway). pci=noacpi would also skip it, but leaves PIIX IDE's BARs
        # unassigned.
        "cryptomgr.notests", "rodata=off", "acpi=noirq",
    ]
    if accel == Accelerator.TCG:
        # TCG runs `rep movsb` a byte at a time; without ERMS/FSRM the kernel copies with
        # 8-byte moves, which halves the initramfs unpack. On KVM rep movsb is the fast path.
        parts.append("clearcpuid=erms,fsrm")
    if port is not None:
        parts.append(f"iomatrix.port={port}")
    if disks is not None:
        parts.append(f"iomatrix.disks={disks}")
    if trace:
        parts.append("iomatrix.trace=1")
    if extra:
        parts.append(extra)
    return " ".join(parts)


def parse_disk_lines(console_text: str) -> list[GuestDisk]:
    """Every complete :data:`DISK_MARKER` line of a serial console log, in order."""
    disks = []
    lines = console_text.replace("\r", "").split("\n")[:-1]  # the last one may be unfinished
    for line in lines:
        start = line.find(DISK_MARKER + " ")
        if start < 0:
            continue
        try:
            fields = dict(tok.split("=", 1) for tok in shlex.split(line[start + len(DISK_MARKER):])
                          if "=" in tok)
            disks.append(GuestDisk(
                name=fields["name"], size_bytes=int(fields["size"]),
                queues=int(fields.get("queues") or 0), scheduler=fields.get("scheduler", ""),
                rotational=fields.get("rotational") == "1", driver=fields.get("driver", ""),
                model=fields.get("model", "")))
        except (KeyError, ValueError) as exc:
            raise IomatrixError(f"malformed {DISK_MARKER} line from the guest: "
                                f"{console_line(line.strip())}") from exc
    return disks


def console_error(console_text: str) -> str | None:
    """The message of the first :data:`ERROR_MARKER` line of a console log, or None."""
    for line in console_text.replace("\r", "").splitlines():
        start = line.find(ERROR_MARKER)
        if start >= 0:
            return console_line(line[start + len(ERROR_MARKER):].strip())
    return None


def console_line(text: str) -> str:
    """A line the guest printed, as iomatrix may repeat it: cut to :data:`CONSOLE_LINE_CHARS`,
    control and bidi characters escaped (``iomatrix.core.text.printable``)."""
    cut = text[:CONSOLE_LINE_CHARS] + ("..." if len(text) > CONSOLE_LINE_CHARS else "")
    return printable(cut)


def console_tail(console: Path, lines: int = CONSOLE_LINES) -> str:
    """The last ``lines`` (at most :data:`CONSOLE_LINES`) lines of a guest's console log, each
    a :func:`console_line`, joined by `` | ``; "" when it cannot be read."""
    try:
        with open(console, "rb") as log:
            log.seek(max(0, log.seek(0, 2) - _CONSOLE_TAIL_BYTES))
            text = log.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    kept = text.replace("\r", "").strip().split("\n")[-max(1, min(lines, CONSOLE_LINES)):]
    return " | ".join(console_line(line) for line in kept)
