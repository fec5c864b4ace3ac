"""A platform's VM definition → per disk, the iomatrix configuration it amounts to and the QEMU
disk arguments the platform generates (pure; ``iomatrix translate``).

Reads a Proxmox VE VM configuration (``/etc/pve/qemu-server/ID.conf`` or ``qm config ID``) or a
libvirt domain (``virsh dumpxml``). Options that do not change I/O, or that iomatrix does not
reproduce, are named in the notes, never dropped silently.
"""

from __future__ import annotations

from typing import Any, Literal

from iomatrix.core.model import Frozen
from iomatrix.platform import libvirt as lv
from iomatrix.platform import proxmox as pve
from iomatrix.suite.expand import invalid_reason
from iomatrix.suite.model import CONTROLLERS, Configuration


class DiskTranslation(Frozen):
    name: str
    """``scsi0`` (Proxmox VE) or the target dev, ``vda`` (libvirt)."""
    written: str
    """The disk as the platform's file states it."""
    values: dict[str, Any]
    """iomatrix configuration values (controller, aio, iothread, cache, format, num_queues,
    queue_size); None where the platform sets nothing iomatrix can name."""
    config: Configuration | None
    """The guest-mode configuration, when every value is one iomatrix can measure."""
    argv: tuple[str, ...]
    notes: tuple[str, ...] = ()
    storage: str = ""
    """Where the volume lives: a Proxmox VE storage (``lvmthin storage local-lvm``), or a
    libvirt ``file`` or ``block`` source (with its path)."""
    cdrom: bool = False
    """A CD-ROM drive: read-only, shown with its arguments, not a disk to measure."""


class Translation(Frozen):
    platform: Literal["proxmox", "libvirt"]
    generation: str
    """"PVE 8 (-drive)", "PVE 9 (-blockdev)", "libvirt 11.3.0 with QEMU 10.0.0 (-blockdev, raw
    disks without a format node)"."""
    disks: tuple[DiskTranslation, ...]
    notes: tuple[str, ...] = ()
    pve_version: pve.PveVersion | None = None
    """Proxmox VE: the generation whose command line the disks get."""
    argv: tuple[str, ...] = ()
    """libvirt: the iothread objects and controllers the disks share, given before them."""


def translate(text: str, *, pve_version: pve.PveVersion | None = None,
              storages: dict[str, pve.Storage] | None = None,
              libvirt: lv.Versions | None = None) -> Translation:
    """``text`` (a PVE configuration, or a libvirt domain when it starts with ``<``; its
    arguments as ``libvirt`` generates them, by default :class:`lv.Versions`' own)."""
    if text.lstrip().startswith("<"):
        return _libvirt(text, libvirt or lv.Versions())
    return _proxmox(text, pve_version, storages)


def _config(values: dict[str, Any], notes: list[str]) -> Configuration | None:
    if values.get("controller") not in CONTROLLERS or values.get("aio") is None:
        return None
    config = Configuration(mode="guest", preallocation="off",
                           **{k: v for k, v in values.items() if v is not None})
    reason = invalid_reason(config)
    if reason is not None:
        notes.append(f"refused by QEMU 7.2 or iomatrix, so not measurable as is: {reason}")
        return None
    return config


def _proxmox(text: str, version: pve.PveVersion | None,
             storages: dict[str, pve.Storage] | None) -> Translation:
    vm = pve.parse_config(text)
    gen: pve.PveVersion = version or pve.version_of_machine(vm.machine)
    notes = [pve.OMITTED]
    if vm.machine:
        notes.append(f"machine: {vm.machine} → PVE {gen}'s command line")
    disks = []
    for drive in vm.drives:
        written = f"{drive.key}: {drive.volume}" + "".join(f",{k}={v}" for k, v in drive.options)
        if drive.is_cdrom or drive.volume == "none":
            notes.append(f"{drive.key}: a CD-ROM, not a disk: skipped")
            continue
        try:
            volume = pve.resolve_volume(drive, storages)
        except ValueError as exc:
            disks.append(DiskTranslation(name=drive.key, written=written, values={}, config=None,
                                         argv=(), notes=(str(exc),)))
            continue
        values, disk_notes = pve.configuration_of(drive, vm.scsihw, volume)
        out = pve.disk_args(drive, volume, scsihw=vm.scsihw, version=gen)
        disk_notes += out.notes
        config = _config(values, disk_notes)
        where = (f"a path, {volume.path}" if volume.storage == "path" else
                 f"{volume.storage} storage {drive.volume.partition(':')[0]}, {volume.path}")
        disks.append(DiskTranslation(name=drive.key, written=written, values=values,
                                     config=config, argv=out.argv, notes=tuple(disk_notes),
                                     storage=where))
    label = "PVE 9 (-blockdev under a throttle filter)" if gen >= 9 else "PVE 8 (-drive)"
    return Translation(platform="proxmox", generation=label, disks=tuple(disks),
                       notes=tuple(notes), pve_version=gen)


def _libvirt(text: str, versions: lv.Versions) -> Translation:
    domain = lv.parse_domain(text)
    out = lv.domain_args(domain, versions)
    notes = ["PCI addresses are left out: they place a device, they do not change its I/O",
             *domain.skipped, *out.notes]
    disks = []
    for disk, args in zip(domain.disks, out.disks):
        written = (f"<disk type='{disk.kind}' device='{disk.device}'> {disk.source or '(empty)'} "
                   f"→ <target dev='{disk.dev}' bus='{disk.bus}'> <driver "
                   + " ".join(f"{k}='{v}'" for k, v in disk.driver) + "/>")
        cdrom = disk.device == "cdrom"
        values, disk_notes = ({}, ["a CD-ROM: read-only, not a disk iomatrix measures"]) if cdrom \
            else lv.configuration_of(disk)
        disk_notes += args.notes
        config = None if cdrom else _config(values, disk_notes)
        disks.append(DiskTranslation(name=disk.dev, written=written, values=values, config=config,
                                     argv=args.argv, notes=tuple(disk_notes), cdrom=cdrom,
                                     storage=f"a {disk.kind} source, {disk.source or '(empty)'}"))
    generation = f"{versions.label} (-blockdev" + ("" if versions.raw_format_node else
                                                   ", raw disks without a format node") + ")"
    return Translation(platform="libvirt", generation=generation, disks=tuple(disks),
                       notes=tuple(notes), argv=out.objects + out.controllers)
