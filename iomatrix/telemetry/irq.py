"""The target device's interrupts: which IRQs its controller raises (the MSI/MSI-X vectors of
the nearest device above it in sysfs, ``msi_irqs``; else its legacy ``irq``), the CPUs each may
go to (``/proc/irq/N/smp_affinity_list``) and the one the kernel chose
(``effective_affinity_list``), reported for every run (the host record's ``target_irqs``); and,
only where the suite asks (``[method] irq_affinity``), steered to a CPU set for the run and put
back afterwards (``steered``).

Only integers reach /proc/irq: IRQ numbers read from sysfs, and a CPU set this module writes
itself from a validated set (``iomatrix.core.cpuset``). Each previous set is read before the
first write and written back when the run ends, on an exception and on Ctrl-C alike. The kernel
keeps no undo, so each is recorded in the store before it is changed (``record``: a resource of
kind ``irq-affinity``, ``RESOURCE``): what a run killed outright left steered, ``iomatrix clean``
or the next run puts back (``put_back``) once that run is dead, as it removes its directories.
A record is a database row, untrusted input: its IRQ is digits, its sets CPU lists
(``iomatrix.core.cpuset``) of this host's CPUs, and the file written is this module's own
``/proc/irq/N/smp_affinity_list``, never a path from the row."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from iomatrix.core import cpuset
from iomatrix.core.errors import EnvironmentProblem
from iomatrix.core.owner import boot_id
from iomatrix.targets.kind import Resource
from iomatrix.telemetry.host import device_of

PROC_IRQ = Path("/proc/irq")
KIND = "irq-affinity"
"""The store's record of an IRQ steered (``resources.kind``): its path the IRQ's number, its
``within`` the set it had, the set it was steered to and the boot it was steered in (JSON)."""
Record = Callable[[int, str, str], Callable[[str], None]]
"""Called with (IRQ, previous set, steered set) before the IRQ is steered; returns what settles
the record once the previous set is back (or the IRQ was left as found), with the outcome."""


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


def recorded_within(previous: str, steered_to: str) -> str:
    """A record's ``within``: the sets before and for the run, and this boot."""
    return json.dumps({"previous": previous, "steered": steered_to, "boot": boot_id()})


def _checked(path: Any, within: Any, root: Path) -> tuple[int, str, str, str]:
    """A record's IRQ, its previous and steered sets (canonical) and boot, each checked
    strictly (a database row is untrusted input); ValueError says what is wrong."""
    if not isinstance(path, str) or re.fullmatch(r"[0-9]{1,7}", path) is None:
        raise ValueError(f"{path[:40]!r} is not an IRQ number" if isinstance(path, str)
                         else "no IRQ number")
    value = json.loads(within) if isinstance(within, str) else None
    if not isinstance(value, dict) or set(value) != {"previous", "steered", "boot"} or not all(
            isinstance(v, str) and len(v) <= 200 for v in value.values()):
        raise ValueError("not a record of an IRQ's sets")
    previous, steered_to = cpuset.parse(value["previous"]), cpuset.parse(value["steered"])
    possible = cpuset.parse((root / "devices/system/cpu/possible").read_text())
    if not previous or not previous <= possible or not steered_to <= possible:
        raise ValueError(f"CPU set {value['previous'][:40]!r} or {value['steered'][:40]!r} "
                         f"is not of this host's CPUs ({cpuset.shown(possible)})")
    return int(path), cpuset.shown(previous), cpuset.shown(steered_to), value["boot"]


def put_back(path: str, within: str, marker: str = "", *, dry_run: bool = False,
             author: object = None, root: Path = cpuset.SYS, proc: Path = PROC_IRQ) -> str:
    """``Resource.remove`` of an IRQ a run steered: its previous set written back while the IRQ
    still has the set the run gave it (anyone else's since is left), in the boot it was steered
    in (a reboot reset it); removed, would remove, gone, or ``left: why``."""
    try:
        irq, previous, steered_to, boot = _checked(path, within, root)
    except (ValueError, OSError) as exc:
        return f"left: a record iomatrix did not write ({exc}): nothing written"
    if boot != boot_id():
        return "gone: the host booted since, which reset the IRQ's affinity"
    file = proc / str(irq) / "smp_affinity_list"
    try:
        now = cpuset.shown(cpuset.parse(file.read_text()))
    except (OSError, ValueError):
        return f"gone: IRQ {irq} is no more"
    if now == previous:
        return f"gone: IRQ {irq} has CPU {previous} again"
    if now != steered_to:
        return f"left: IRQ {irq} has CPU {now} now, not the {steered_to} the run set: left as it is"
    if dry_run:
        return f"would remove: CPU {previous} written back to IRQ {irq}"
    try:
        file.write_text(previous + "\n")
    except OSError as exc:
        return f"left: IRQ {irq} refused CPU {previous}: {exc.strerror}"
    return f"removed: CPU {previous} written back to IRQ {irq}"


RESOURCE = Resource(kind=KIND, name="steering of IRQ", remove=put_back,
                    within_keys=frozenset({"previous", "steered", "boot"}), within_max=700)
"""An IRQ a run steered, as ``iomatrix.measure.reclaim`` puts it back (``targets.registry``)."""


@contextlib.contextmanager
def steered(device: str | None, level: str, note: Callable[[str], None],
            root: Path = cpuset.SYS, proc: Path = PROC_IRQ,
            record: Record | None = None) -> Iterator[list[int]]:
    """The target device's IRQs steered to ``level`` (a CPU set or "numa") while the block
    runs, each one's previous set put back afterwards; yields the IRQs steered. What could not
    be steered (no IRQs; an IRQ the kernel manages: EIO) is told through ``note`` and left as
    found (the precheck refused a run that is not root's: ``measure.precheck.check_affinity``);
    a CPU set this host does not have online is EnvironmentProblem before anything is
    written. Each IRQ is recorded through ``record`` before it is steered, and its record
    settled once it is back."""
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
    settle: dict[int, Callable[[str], None]] = {}
    try:
        for irq in irqs:
            path = proc / str(int(irq)) / "smp_affinity_list"
            previous = cpuset.shown(cpuset.parse(path.read_text()))
            if record is not None:
                settle[irq] = record(irq, previous, text)
            try:
                path.write_text(text + "\n")
            except OSError as exc:     # EPERM (as root) or EIO: the kernel manages the IRQ
                if irq in settle:
                    settle.pop(irq)("left as found (the kernel refused the set)")
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
                if irq in settle:
                    settle[irq](f"removed (CPU {previous} written back at the end of the run)")
