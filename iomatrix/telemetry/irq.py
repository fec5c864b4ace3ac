"""The target device's interrupts: which IRQs its controller raises (the MSI/MSI-X vectors of
the nearest device above it in sysfs, ``msi_irqs``; else its legacy ``irq``), the CPUs each may
go to (``/proc/irq/N/smp_affinity_list``) and the one the kernel chose
(``effective_affinity_list``), reported for every run (the host record's ``target_irqs``); and,
only where the suite asks (``[method] irq_affinity``), steered to a CPU set for the run and put
back afterwards (``steered``).

Only integers reach /proc/irq: IRQ numbers read from sysfs, and a CPU set this module writes
itself from a validated set (``iomatrix.core.cpuset``). Each previous set is read before the
first write and written back when the run ends, on an exception and on Ctrl-C alike (a run
killed outright leaves the sets as steered: the kernel keeps no undo)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

from iomatrix.core import cpuset
from iomatrix.core.errors import EnvironmentProblem
from iomatrix.telemetry.host import device_of

PROC_IRQ = Path("/proc/irq")


def device_irqs(device: str | None, root: Path = cpuset.SYS) -> tuple[list[int], str]:
    """The IRQs of block device ``device``'s controller, and why there are none where there are
    none (a loop device, a device-mapper device over one)."""
    if device is None:
        return [], "the target is on no block device of this host (no IRQs to report)"
    name = Path(device).name
    block = cpuset.disk_dir(name, root)
    if block is None:
        return [], f"{name} is not a block device of this host (no IRQs to report)"
    msi = cpuset.device_attribute(name, "msi_irqs", root)
    if msi is not None:
        irqs = sorted(int(p.name) for p in msi.iterdir() if p.name.isdigit())
        if irqs:
            return irqs, ""
    legacy = cpuset.device_attribute(name, "irq", root)
    if legacy is not None:
        with contextlib.suppress(OSError, ValueError):
            irq = int(legacy.read_text().strip())
            if irq > 0:
                return [irq], ""
    if name.startswith("loop") or not ((block / "device").exists()
                                       or any((block / "slaves").glob("*"))):
        return [], (f"{name} has no IRQs: a {'loop' if name.startswith('loop') else 'virtual'} "
                    "device, served by the kernel itself (no controller interrupts)")
    return [], f"{name}: its controller states no IRQs in sysfs (msi_irqs, irq)"


def target_device(path: Path | None) -> str | None:
    """The block device holding ``path`` (or its nearest existing parent: a target directory
    the run has yet to make), or ``path`` itself when it is one; None where there is none."""
    if path is None:
        return None
    here = Path(path)
    while not here.exists() and here != here.parent:
        here = here.parent
    try:
        return device_of(here)
    except OSError:
        return None


def affinity_of(irq: int, proc: Path = PROC_IRQ) -> tuple[str, str]:
    """IRQ ``irq``'s allowed CPUs and the CPUs the kernel delivers it to now (effective; "" where
    the kernel does not say), as /proc/irq states them."""
    allowed = (proc / str(int(irq)) / "smp_affinity_list").read_text().strip()
    effective = ""
    with contextlib.suppress(OSError):
        effective = (proc / str(int(irq)) / "effective_affinity_list").read_text().strip()
    return allowed, effective


def report(device: str | None, root: Path = cpuset.SYS, proc: Path = PROC_IRQ) -> str:
    """The target device's IRQs and their affinity in a line (the host record's
    ``target_irqs``): ``vda: IRQ 35 → 0-1 (effective 1), IRQ 36 → 0-1 (effective 0)``."""
    irqs, why = device_irqs(device, root)
    if not irqs:
        return why
    parts = []
    for irq in irqs:
        try:
            allowed, effective = affinity_of(irq, proc)
        except OSError:
            parts.append(f"IRQ {irq} → unreadable")
            continue
        parts.append(f"IRQ {irq} → {allowed}" + (f" (effective {effective})" if effective else ""))
    return f"{Path(str(device)).name}: " + ", ".join(parts)


@contextlib.contextmanager
def steered(device: str | None, level: str, note: Callable[[str], None],
            root: Path = cpuset.SYS, proc: Path = PROC_IRQ) -> Iterator[list[int]]:
    """The target device's IRQs steered to ``level`` (a CPU set or "numa") while the block
    runs, each one's previous set put back afterwards; yields the IRQs steered. What could not
    be steered (no IRQs; an IRQ the kernel manages: EIO) is told through ``note`` and left as
    found (the precheck refused a run that is not root's: ``measure.precheck.check_affinity``);
    a CPU set this host does not have online is EnvironmentProblem before anything is
    written."""
    irqs, why = device_irqs(device, root)
    if not irqs:
        note(f"[method] irq_affinity = \"{level}\": {why}; nothing steered")
        yield []
        return
    try:
        cpus, fallback = cpuset.resolve(level, device, root)
    except ValueError as exc:
        raise EnvironmentProblem(f"[method] irq_affinity: {exc}") from exc
    if fallback:
        note(f"[method] irq_affinity: {fallback}")
    text = cpuset.shown(cpus)
    before: dict[int, str] = {}
    try:
        for irq in irqs:
            path = proc / str(int(irq)) / "smp_affinity_list"
            previous = cpuset.shown(cpuset.parse(path.read_text()))
            try:
                path.write_text(text + "\n")
            except OSError as exc:     # EPERM (as root) or EIO: the kernel manages the IRQ
                note(f"[method] irq_affinity: IRQ {irq} keeps {previous} (the kernel refused "
                     f"{text}: {exc.strerror}; a managed IRQ, whose affinity the kernel sets "
                     "itself, as for a multi-queue device's queues)")
                continue
            before[irq] = previous
        if before:
            note(f"[method] irq_affinity = \"{level}\": IRQ {', '.join(map(str, before))} of "
                 f"{Path(str(device)).name} steered to CPU {text} for the run (was "
                 f"{', '.join(f'{i}: {p}' for i, p in before.items())})")
        yield list(before)
    finally:
        for irq, previous in before.items():
            with contextlib.suppress(OSError):
                (proc / str(int(irq)) / "smp_affinity_list").write_text(previous + "\n")
