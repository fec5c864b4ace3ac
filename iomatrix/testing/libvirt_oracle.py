"""The translate oracle: ``iomatrix translate`` of a libvirt domain against the real libvirtd's
``virsh domxml-to-native qemu-argv``, disk by disk (PCI placement aside), for the test
(tests/translate/test_libvirt_oracle.py) and the bench (bench/translate_oracle.py).

Each domain's outcome (:class:`Outcome`): both give the same disk arguments; both refuse it
(translate's reason shown); translate refuses, with its reason, a domain libvirt accepts; the
arguments differ on disks whose notes name the difference (:data:`DIFFERENCE_WORDS`, or the
disk refused, or left out with a note); or the two faults the issue counts: a SILENT difference
and a domain libvirt refuses that translate gave arguments to. The disks are matched by the
names of what they open (:data:`iomatrix.testing.libvirt_domains.TAG`), else by device id; the
iothread objects and controllers are compared as one more part, ``domain``."""

from __future__ import annotations

import collections
import json
import shlex
import subprocess
import tempfile
import time
from collections.abc import Sequence
from enum import Enum
from pathlib import Path
from xml.etree import ElementTree as ET

from iomatrix.core.model import Frozen
from iomatrix.platform import libvirt as lv
from iomatrix.testing.libvirt_domains import TAG, RandomPicker, domain
from iomatrix.translate.vm import Translation, translate

CONTROLLER_DEVICES = ("virtio-scsi-pci", "lsi", "megasas", "pvscsi", "mptsas1068", "ahci")
DISK_DEVICES = ("virtio-blk-pci", "scsi-hd", "scsi-cd", "scsi-block", "scsi-generic", "ide-hd",
                "ide-cd", "floppy", "usb-storage", "nvme-ns", "nvme")
"""The QEMU devices of disks (each closes a disk's arguments: its nodes come before it)."""
DIFFERENCE_WORDS = ("not reproduced", "not modelled", "left out", "ignored", "not rendered")
"""A disk note with one of these names a difference from libvirt's arguments for that disk."""
PCI_NOTE = "PCI addresses are left out"
"""translate's note on what :func:`disk_arguments` takes away from both: it names no
difference."""
ENVIRONMENT = ("Storage pool not found", "Secret not found")
"""libvirt errors that are lookups of this host's objects (a pool, a secret), not refusals of
the domain: translate cannot know them and must name the disk's part it does not render."""
MAX_INDEX = 1000
"""The largest drive-bus target index the oracle sends libvirt (:func:`_guard`)."""
HANG = 20.0
"""Seconds a domain gets alone, once its batch went unanswered."""
BATCH = 200
"""Domains per virsh process (a few ms each, against ~25 ms for a process each)."""


class Outcome(str, Enum):
    IDENTICAL = "identical"
    REFUSED_BOTH = "refused by both"
    TRANSLATE_REFUSES = "refused by translate with a reason"
    NOTED = "differs with a note"
    SILENT = "SILENT DIFFERENCE"
    ACCEPTED = "ACCEPTED BUT LIBVIRT REFUSES"

    @property
    def fault(self) -> bool:
        return self in (Outcome.SILENT, Outcome.ACCEPTED)


class Compared(Frozen):
    outcome: Outcome
    detail: str = ""
    """The reason (a refusal's), or each differing part: libvirt's and translate's arguments."""


def disk_arguments(argv: Sequence[str]) -> list[str]:
    """The iothread objects, disk controllers, ``-blockdev``/``-drive`` and disk devices of a
    QEMU command line, in order, without PCI placement (``bus``/``addr`` on a PCI bus)."""
    out = []
    for option, value in zip(argv, argv[1:]):
        if option == "-object" and '"qom-type":"iothread"' in value or option in ("-blockdev",
                                                                                  "-drive"):
            out += [option, value]
        elif option == "-device" and value.startswith("{"):
            device = json.loads(value)
            if device["driver"] not in DISK_DEVICES + CONTROLLER_DEVICES:
                continue
            if str(device.get("bus", "")).startswith("pci"):
                del device["bus"]
                device.pop("addr", None)
            out += [option, json.dumps(device, separators=(",", ":"))]
    return out


def parts(argv: Sequence[str]) -> dict[str, list[str]]:
    """:func:`disk_arguments` split: ``domain`` (iothreads, controllers) and each disk's nodes
    and device, keyed by the target its sources name, else ``id:<device id>``."""
    out: dict[str, list[str]] = {"domain": []}
    pending: list[str] = []
    for option, value in zip(argv[::2], argv[1::2]):
        device = json.loads(value) if option == "-device" else {}
        if option == "-device" and device.get("driver") in DISK_DEVICES:
            group = pending + [option, value]
            found = TAG.search(" ".join(group))
            key = found[1] if found else f"id:{device.get('id')}"
            out.setdefault(key, []).extend(group)
            pending = []
        elif option in ("-blockdev", "-drive"):
            pending += [option, value]
        else:
            out["domain"] += [option, value]
    if pending:
        out["unclosed"] = pending
    return out


def native(xmls: Sequence[str], uri: str = "qemu:///system", *,
           timeout: float = 120.0) -> list[list[str] | str]:
    """``virsh domxml-to-native qemu-argv`` of each domain: its argv, or libvirt's error text.
    One virsh process per :data:`BATCH` domains; a marker echoed after each command splits
    the output (virsh goes on after a failed command). A batch without an answer in
    ``timeout`` is asked again a domain at a time: one that hangs libvirtd (:data:`HANG`) gets
    that as its error (and leaves a libvirtd worker thread spinning: run it in a root of its
    own, .ci/debian13). A domain that needs this host's objects is not sent (:func:`_lookup`)."""
    for xml in xmls:
        _guard(xml)
    asked = [i for i, xml in enumerate(xmls) if _lookup(xml) is None]
    answers = dict(zip(asked, _native([xmls[i] for i in asked], uri, timeout)))
    return [answers[i] if i in answers else str(_lookup(xml)) for i, xml in enumerate(xmls)]


def _lookup(xml: str) -> str | None:
    """What libvirt would look up on this host for the domain (a storage pool, a secret), as
    the error it gives when there is none, or None. Such domains are not sent: libvirt's answer
    would depend on what this host has, not on the domain."""
    root = ET.fromstring(xml)
    if root.find("./devices/disk[@type='volume']") is not None:
        return f"{ENVIRONMENT[0]}: not asked (a volume disk needs a storage pool of this host)"
    if root.find("./devices/disk/source/encryption") is not None:
        return f"{ENVIRONMENT[1]}: not asked (an encrypted disk needs a secret of this host)"
    return None


def _native(xmls: Sequence[str], uri: str, timeout: float) -> list[list[str] | str]:
    out: list[list[str] | str] = []
    with tempfile.TemporaryDirectory(prefix="iomatrix-oracle-") as tmp:
        for start in range(0, len(xmls), BATCH):
            chunk = xmls[start:start + BATCH]
            commands = []
            for i, xml in enumerate(chunk):
                path = Path(tmp) / f"d{start + i}.xml"
                path.write_text(xml)
                commands.append(f"domxml-to-native qemu-argv {path}; echo @@oracle-{i}@@")
            try:
                out += _split(_virsh(uri, commands, timeout), len(chunk))
            except subprocess.TimeoutExpired:     # one of them hangs libvirtd: find which
                out += [_alone(uri, command) for command in commands]
    return out


def _virsh(uri: str, commands: list[str], timeout: float) -> str:
    return subprocess.run(["virsh", "-c", uri, "-q", "; ".join(commands)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout, check=False).stdout


def _alone(uri: str, command: str) -> list[str] | str:
    try:
        alone = command.rpartition("; echo")[0] + "; echo @@oracle-0@@"
        return _split(_virsh(uri, [alone], HANG), 1)[0]
    except subprocess.TimeoutExpired:
        return f"(no answer within {HANG:.0f} s: libvirtd hangs on this domain)"


def _guard(xml: str) -> None:
    """ValueError for a domain that would hang libvirtd 9.0: a disk on a drive bus (SCSI, SATA,
    IDE, USB, floppy) without an ``<address>`` whose target's index is large: libvirt adds a
    controller for every index up to it (virDomainDefAddDiskControllersForType), one at a time,
    for ever, in a worker thread that a killed virsh does not stop."""
    for disk in ET.fromstring(xml).iterfind("./devices/disk"):
        target = disk.find("target")
        if target is None or target.get("bus", "virtio") == "virtio":
            continue
        if disk.find("address") is None and lv.disk_index(target.get("dev", "")) > MAX_INDEX:
            raise ValueError(f"target {target.get('dev')!r} on bus {target.get('bus')}: "
                             "libvirt 9.0 would add controllers up to its index for ever")


def _split(text: str, count: int) -> list[list[str] | str]:
    out: list[list[str] | str] = []
    rest = text
    for i in range(count):
        part, marker, rest = rest.partition(f"@@oracle-{i}@@")
        if not marker:
            raise RuntimeError(f"virsh's output lacks the marker of domain {i}: {text[-500:]}")
        lines = [line for line in part.strip().splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith("error:")]
        argv = [line for line in lines if not line.startswith("error:")]
        if errors and argv or not (errors or argv):
            raise RuntimeError(f"virsh's output for domain {i} is neither argv nor error: {part}")
        out.append(" ".join(errors).replace("error: ", "", 1) if errors
                   else shlex.split(" ".join(argv)))
    return out


def compare(xml: str, real: list[str] | str, versions: lv.Versions) -> Compared:
    """translate's arguments for ``xml`` against libvirt's (``real``: its argv or error)."""
    try:
        result = translate(xml, libvirt=versions)
    except ValueError as exc:
        if isinstance(real, str):
            return Compared(outcome=Outcome.REFUSED_BOTH, detail=f"translate: {exc}")
        return Compared(outcome=Outcome.TRANSLATE_REFUSES, detail=str(exc))
    refused = [f"{d.name}: {'; '.join(d.notes)}" for d in result.drives if not d.argv]
    if isinstance(real, str) and not any(s in real for s in ENVIRONMENT):
        if refused:
            return Compared(outcome=Outcome.REFUSED_BOTH, detail=" | ".join(refused))
        return Compared(outcome=Outcome.ACCEPTED, detail=f"libvirt: {real}")
    ours = parts(list(result.argv) + [a for d in result.drives for a in d.argv])
    theirs = parts(disk_arguments(real)) if isinstance(real, list) else {}
    notes = _notes(result)
    silent, noted = [], []
    for key in sorted(set(ours) | set(theirs)):
        if ours.get(key, []) == theirs.get(key, []):
            continue
        line = (f"{key}:\n    libvirt:   {' '.join(theirs.get(key, ['(nothing)']))}\n"
                f"    translate: {' '.join(ours.get(key, ['(nothing)']))}")
        named = notes.get(key) or key == "domain" and _controllers_left_out(ours, theirs, notes)
        (noted if named else silent).append(line)
    if isinstance(real, str):          # a host lookup libvirt failed: translate must note it
        return Compared(outcome=Outcome.NOTED if notes.get("*") else Outcome.SILENT,
                        detail=f"libvirt: {real}")
    _pair_unnamed(silent, noted, ours, theirs, notes)
    if silent:
        return Compared(outcome=Outcome.SILENT, detail="\n".join(silent))
    if noted:
        return Compared(outcome=Outcome.NOTED, detail="\n".join(noted))
    return Compared(outcome=Outcome.IDENTICAL)


def _notes(result: Translation) -> dict[str, list[str]]:
    """The notes naming a difference, by part: each disk's own, the domain's that start with a
    disk's target (a disk left out), the rest under ``domain``; ``*``: all of them."""
    out: dict[str, list[str]] = {}
    for drive in result.drives:
        mine = [n for n in drive.notes if not drive.argv or _names(n)]
        if mine:            # by its target, and by its device id where it opens nothing named
            for key in {drive.name} | set(parts(list(drive.argv))) - {"domain"}:
                out[key] = mine
    for note in result.notes:
        if not _names(note):
            continue
        head = note.partition(":")[0]
        out.setdefault(head if TAG.fullmatch(f"ora-{head}") else "domain", []).append(note)
    out["*"] = [n for notes in out.values() for n in notes]
    return out


def _names(note: str) -> bool:
    return any(word in note for word in DIFFERENCE_WORDS) and not note.startswith(PCI_NOTE)


def _controllers_left_out(ours: dict[str, list[str]], theirs: dict[str, list[str]],
                          notes: dict[str, list[str]]) -> bool:
    """libvirt's domain part differs only by controllers no disk translate gives sits on,
    and translate left a disk out with a note (the disk they were for)."""
    mine = list(zip(ours.get("domain", [])[::2], ours.get("domain", [])[1::2]))
    real = list(zip(theirs.get("domain", [])[::2], theirs.get("domain", [])[1::2]))
    if [pair for pair in real if pair in mine] != mine:
        return False
    extra = [json.loads(value) for option, value in real if (option, value) not in mine
             and option == "-device"]
    if len(extra) != len([pair for pair in real if pair not in mine]):
        return False
    given = " ".join(arg for key, part in ours.items() if key != "domain" for arg in part)
    left_out = [k for k in notes if k not in ("domain", "*") and k not in ours]
    return bool(left_out) and all(d.get("driver") in CONTROLLER_DEVICES
                                  and f'"bus":"{d.get("id")}.' not in given for d in extra)


def _pair_unnamed(silent: list[str], noted: list[str], ours: dict[str, list[str]],
                  theirs: dict[str, list[str]], notes: dict[str, list[str]]) -> None:
    """libvirt's disks that open nothing named (an NVMe disk, an empty drive) and that
    translate left out are noted when as many disks translate left out have a note."""
    unnamed = [line for line in silent if line.startswith("id:")
               and line.partition(":\n")[0] in theirs and line.partition(":\n")[0] not in ours]
    left_out = [k for k in notes if k not in ("domain", "*") and k not in ours
                and k not in theirs]
    if unnamed and len(unnamed) <= len(left_out):
        for line in unnamed:
            silent.remove(line)
            noted.append(line)


def bench(count: int, *, seed: int = 36, uri: str = "qemu:///system", examples: int = 3,
          show: str | None = None) -> tuple[str, collections.Counter[Outcome]]:
    """``count`` generated domains (seeded) through both: a report (the versions, the cost, the
    count of each outcome, ``examples`` of each fault and of ``show``) and the counts."""
    from iomatrix.drivers import libvirt as lvd
    versions = lvd.daemon_versions(uri)
    domains = [domain(RandomPicker(seed * 1_000_003 + i), name=f"oracle{i}").xml
               for i in range(count)]
    started = time.monotonic()
    real = native(domains, uri)        # daemon_versions waited for any probe of QEMU
    virsh_s = time.monotonic() - started
    started = time.monotonic()
    results = [compare(xml, out, versions) for xml, out in zip(domains, real)]
    compare_s = time.monotonic() - started
    counts = collections.Counter(r.outcome for r in results)
    lines = [f"{versions.label}: {count} domains (seed {seed}); virsh {virsh_s:.1f} s "
             f"({1000 * virsh_s / max(count, 1):.1f} ms a domain), translate and compare "
             f"{compare_s:.1f} s"]
    lines += [f"  {o.value:40} {counts.get(o, 0):5}" for o in Outcome]
    for outcome in Outcome:
        if outcome.fault or outcome.value == show:
            shown = [(i, r) for i, r in enumerate(results) if r.outcome == outcome]
            lines += [f"\n== {outcome.value}: domain {i} ==\n{domains[i]}\n{r.detail}"
                      for i, r in shown[:examples]]
    return "\n".join(lines), counts
