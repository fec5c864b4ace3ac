"""``[matrix] from_vm``: the user's VM definition → the suite's reference configuration.

The file (a Proxmox VE ``ID.conf`` or ``qm config`` output, or ``virsh dumpxml`` output) is
read from the suite's own directory and nowhere else: no absolute path, no ``..``, no symlink
leading out of it, a regular file of at most ``MAX_BYTES`` (a suite is untrusted input). It is
translated as ``iomatrix translate`` does (``iomatrix.translate.vm``), one disk is picked,
and its settings become the suite's ``[matrix] reference`` (``iomatrix.suite.load.with_tables``):
part of the spec a run stores, so that ``--resume``, ``recommend``, ``show`` and the report never
read the file again. What cannot be measured is
refused with one line: a disk the VM does not have (its disks are listed), a drive that is not
a disk (a CD-ROM, the EFI vars disk, the TPM state), a volume iomatrix cannot place, a disk
without aio (librbd) or whose bus guest mode cannot build. A template's disk is measured with
its settings (what a clone of it gets), noted as a template's.
"""

from __future__ import annotations

import re

from pydantic import ValidationError

from iomatrix.core import files
from iomatrix.core.errors import SuiteError
from iomatrix.platform import proxmox as pve
from iomatrix.translate.vm import NOT_A_DISK, DiskTranslation, Translation, translate
from iomatrix.suite.load import suite_file, with_tables
from iomatrix.vocab.axes import AFFINITY_AXES, CONTROLLERS, Aio, Cache, Format
from iomatrix.suite.matrix import Reference
from iomatrix.suite.model import Suite
from iomatrix.vocab.words import Mode

MAX_BYTES = 1 << 20
"""The largest VM definition read (a real one is a few KiB)."""
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def resolve_vm(suite: Suite) -> Suite:
    """``suite`` with ``[matrix] from_vm`` read and its disk as ``[matrix] reference``;
    unchanged when it names no VM or its reference is already resolved (a stored suite)."""
    matrix = suite.matrix
    if not matrix.vm_unread:
        return suite
    where = f"{suite.source_path}: [matrix] from_vm = {matrix.from_vm!r}"
    text = _read_vm_file(suite, matrix.from_vm, "from_vm")
    storages = (pve.parse_storage_cfg(_read_vm_file(suite, matrix.storage_cfg, "storage_cfg"))
                if matrix.storage_cfg else None)
    version = suite.method.pve_version if suite.method.platform == "proxmox" else None
    try:
        result = translate(text, pve_version=version, storages=storages)
    except ValueError as exc:
        raise SuiteError(f"{where}: not a Proxmox VE configuration nor a libvirt domain: "
                         f"{exc}") from None
    disk = _pick(result, matrix.disk, where)
    if (disk.config is not None and (disk.values is None or disk.values.aio is None)
            and suite.target.rbd is None):
        raise SuiteError(f"{where}: {disk.name} is on librbd ({disk.storage}), which has no aio "
                         "and is reached over the network: measure it on a Ceph pool",
                         hint="set [target] rbd = { pool = ..., conf = ..., client = ..., "
                              "keyring = ... } (docs/how-to/ceph.md: Measure your Ceph pool)")
    try:
        reference = _reference(result, disk, suite.method.mode, where)
    except ValidationError as exc:
        raise SuiteError(f"{where}: {disk.name}: {exc.errors()[0]['msg']}") from None
    return with_tables(suite, "matrix",
                       {"reference": reference.model_dump(mode="json", exclude_defaults=True)})


def _read_vm_file(suite: Suite, name: str, key: str) -> str:
    """The text of the file ``name`` in the suite's directory (``[matrix] key``), confined to
    that directory; SuiteError, in one line, for anything else."""
    where = f"{suite.source_path}: [matrix] {key} = {name!r}"
    path = suite_file(suite)
    if path is None:
        raise SuiteError(f"{where}: this suite has no directory of its own to read it from "
                         "(write the suite to a file beside the VM's definition)")
    text = files.read_beside(path.absolute().parent, name, where, max_bytes=MAX_BYTES,
                             what="the files a suite names")
    if _CONTROL.search(text):
        raise SuiteError(f"{where}: holds control characters: not a VM definition")
    return text


def _pick(result: Translation, wanted: str | None, where: str) -> DiskTranslation:
    disks = result.disks
    names = ", ".join(sorted((d.name for d in disks), key=_by_number)) or "none"
    if wanted is None:
        if len(disks) == 1:
            return disks[0]
        if not disks:
            skipped = "; ".join(result.notes[1:])     # the first says what is always left out
            raise SuiteError(f"{where}: the VM has no disk iomatrix can measure"
                             + (f" ({skipped})" if skipped else ""))
        raise SuiteError(f"{where}: the VM has {len(disks)} disks ({names}): name one "
                         "with [matrix] disk")
    found = next((d for d in disks if d.name == wanted), None)
    other = next((d for d in result.others if d.name == wanted), None)
    if other is not None:
        raise SuiteError(f"{where}: {wanted} is {NOT_A_DISK[other.kind]}, not a disk to measure "
                         f"(the VM's disks: {names})")
    if found is None:
        raise SuiteError(f"{where}: the VM has no disk {wanted!r} (its disks: {names})")
    return found


def _by_number(name: str) -> tuple[str, int]:
    """``scsi2`` before ``scsi10``."""
    found = re.match(r"^(.*?)(\d*)$", name)
    assert found is not None
    return found.group(1), int(found.group(2) or -1)


def _reference(result: Translation, disk: DiskTranslation, mode: str, where: str) -> Reference:
    """The disk as plain settings, or SuiteError naming what the mode cannot measure."""
    values = disk.values.as_dict() if disk.values is not None else {}
    why = "; ".join(disk.notes)
    unusable = [(key, values.get(key), allowed) for key, allowed in (
        ("aio", Aio.__args__), ("cache", Cache.__args__), ("format", Format.__args__))  # type: ignore[attr-defined]
        if values.get(key) not in allowed
        and not (key == "aio" and values.get(key) is None and disk.config is not None)]
    if mode == Mode.GUEST and values.get("controller") not in CONTROLLERS:
        unusable.append(("controller", values.get("controller"), CONTROLLERS))
    if not values or unusable:
        what = ", ".join(f"{key} {value or 'unknown'}" for key, value, _ in unusable)
        raise SuiteError(f"{where}: {disk.name} cannot be measured here"
                         + (f" ({what})" if values else "") + (f": {why}" if why else ""),
                         hint=None if values else "for a storage of your own, copy "
                         "/etc/pve/storage.cfg beside the suite and set [matrix] storage_cfg = "
                         "\"storage.cfg\"")
    if mode == Mode.GUEST and disk.config is None:
        raise SuiteError(f"{where}: {disk.name} cannot be measured as a guest disk: {why}")
    controller = values.get("controller")
    return Reference(
        platform=result.platform, pve_version=result.pve_version, disk=disk.name,
        written=disk.written, storage=disk.storage,
        controller=controller if controller in CONTROLLERS else None, aio=values.get("aio"),
        iothread=bool(values.get("iothread")), cache=values["cache"], format=values["format"],
        discard=values.get("discard"),
        num_queues=values.get("num_queues") or 0, queue_size=values.get("queue_size") or 0,
        **{k: values.get(k) for k in ("iothreads", "vq_mapping", *AFFINITY_AXES)},
        notes=disk.notes)
