"""A platform's VM definition → per disk, the iomatrix configuration it amounts to and the QEMU
disk arguments the platform generates (pure; ``iomatrix translate``).

Reads a Proxmox VE VM configuration (``/etc/pve/qemu-server/ID.conf`` or ``qm config ID``) or a
libvirt domain (``virsh dumpxml``). Options that do not change I/O, or that iomatrix does not
reproduce, are named in the notes, never dropped silently.
"""

from __future__ import annotations

from typing import Literal

from iomatrix.core.model import Frozen
from iomatrix.platform import libvirt as lv
from iomatrix.platform import proxmox as pve
from iomatrix.platform.qemu import CACHE_MODES
from iomatrix.platform.values import DiskValues, cpu_list
from iomatrix.suite.expand import invalid_reason
from iomatrix.suite.configuration import Configuration
from iomatrix.vocab.axes import AXIS_VALUES, CONFIG_AXES, CONTROLLERS
from iomatrix.vocab.words import Mode


class DiskTranslation(Frozen):
    name: str
    """``scsi0`` (Proxmox VE) or the target dev, ``vda`` (libvirt)."""
    written: str
    """The disk as the platform's file states it."""
    values: DiskValues | None
    """iomatrix configuration values (controller, aio, iothread, cache, format, discard,
    num_queues, queue_size), each None where the platform sets nothing iomatrix can name; None
    for a drive that is not a disk iomatrix reads (a CD-ROM, the TPM state, one it could not
    place)."""
    config: Configuration | None
    """The guest-mode configuration, when every value is one iomatrix can measure."""
    argv: tuple[str, ...]
    notes: tuple[str, ...] = ()
    storage: str = ""
    """Where the volume lives: a Proxmox VE storage (``lvmthin storage local-lvm``), or a
    libvirt ``file`` or ``block`` source (with its path)."""
    kind: Literal["disk", "cdrom", "efidisk", "tpmstate", "empty"] = "disk"
    """A disk under test, or a drive that is not one: a CD-ROM (read-only media), the EFI
    vars disk (OVMF's flash), the TPM state (opened by swtpm), an empty drive."""

    @property
    def cdrom(self) -> bool:
        """A CD-ROM drive: read-only, shown with its arguments, not a disk to measure."""
        return self.kind == "cdrom"


NOT_A_DISK = {"cdrom": "a CD-ROM (read-only media)", "efidisk": "the EFI vars disk (OVMF's flash)",
              "tpmstate": "the TPM state (swtpm opens it, not QEMU)", "empty": "an empty drive"}
"""What each kind of drive that is not a disk under test is, in words."""


class Translation(Frozen):
    platform: Literal["proxmox", "libvirt"]
    generation: str
    """"PVE 8 (-drive)", "PVE 9 (-blockdev)", "libvirt 11.3.0 with QEMU 10.0.0 (-blockdev, raw
    disks without a format node)"."""
    disks: tuple[DiskTranslation, ...]
    notes: tuple[str, ...] = ()
    pve_version: pve.PveVersion | None = None
    """Proxmox VE: the generation whose command line the disks get."""
    others: tuple[DiskTranslation, ...] = ()
    """The drives that are not disks under test (``kind`` says which), with their arguments."""
    order: tuple[str, ...] = ()
    """Every drive's name in the order the platform adds them, where it matters: a controller
    comes with the first drive on it."""

    @property
    def drives(self) -> tuple[DiskTranslation, ...]:
        """Disks and other drives, in the platform's order."""
        every = {d.name: d for d in (*self.disks, *self.others)}
        return tuple(every[n] for n in self.order) if self.order else tuple(every.values())
    argv: tuple[str, ...] = ()
    """libvirt: the iothread objects and controllers the disks share, given before them."""


def translate(text: str, *, pve_version: pve.PveVersion | None = None,
              storages: dict[str, pve.Storage] | None = None,
              vmid: str | None = None, libvirt: lv.Versions | None = None) -> Translation:
    """``text`` (a PVE configuration, or a libvirt domain when it starts with ``<``, its
    arguments as ``libvirt`` generates them, by default :class:`lv.Versions`' own); ``vmid``:
    the Proxmox VE VM's id (its file's name), for the paths qemu-server derives from it."""
    if text.lstrip().startswith("<"):
        return _libvirt(text, libvirt or lv.Versions())
    return _proxmox(text, pve_version, storages, vmid)


def _config(values: DiskValues, notes: list[str], *,
            librbd: bool = False) -> Configuration | None:
    """The guest configuration the values amount to; ``librbd``: a disk on librbd, which has
    no aio (a [target] rbd pool measures it: ``iomatrix.targets.rbd``)."""
    if values.controller not in CONTROLLERS or (values.aio is None and not librbd):
        return None
    given = {k: v for k, v in values.as_dict().items() if v is not None and k in CONFIG_AXES}
    if any(isinstance(v, str) and v not in AXIS_VALUES.get(k, (v,)) for k, v in given.items()):
        return None          # a level iomatrix does not model: the platform's notes say which
    config = Configuration(mode=Mode.GUEST, preallocation="off", **given)
    reason = invalid_reason(config)
    if reason is not None:
        notes.append(f"refused by QEMU 7.2 or iomatrix, so not measurable as is: {reason}")
        return None
    return config


def _proxmox(text: str, version: pve.PveVersion | None,
             storages: dict[str, pve.Storage] | None, vmid: str | None) -> Translation:
    vm = pve.parse_config(text)
    host: pve.PveVersion = version or pve.DEFAULT_PVE_VERSION
    gen = pve.version_of_machine(vm, host)
    pinned = pve.pinned_version(vm)
    notes = _vm_notes(vm, gen, vmid)
    disks: list[DiskTranslation] = []
    others: list[DiskTranslation] = []
    controllers: set[str] = set()
    drives = sorted(vm.drives, key=lambda d: pve.drive_order(d.key))
    boot = pve.boot_order(vm)
    for drive in drives:
        written = f"{drive.key}: {drive.volume}" + "".join(f",{k}={v}" for k, v in drive.options)
        kind = ("efidisk" if drive.bus == "efidisk" else "tpmstate" if drive.bus == "tpmstate"
                else "cdrom" if drive.is_cdrom else "empty" if drive.volume == "none" else "disk")
        if kind == "tpmstate":
            others.append(_tpmstate(drive, written, vm.template, vmid))
            notes.append(f"{drive.key}: the TPM state, opened by swtpm: not a disk iomatrix "
                         "measures")
            continue
        try:
            volume = None if drive.volume == "none" else pve.resolve_volume(drive, storages)
            if kind == "efidisk":
                out = _efidisk(drive, volume, vm, gen, host, pinned)
                notes.append(f"{drive.key}: the EFI vars disk (OVMF's flash): not a disk "
                             "iomatrix measures")
            else:
                where = pve.controller_of(drive, vm.scsihw)
                out = pve.disk_args(drive, volume, scsihw=vm.scsihw, version=gen, host=host,
                                    template=vm.template, q35=pve.is_q35(vm),
                                    controller=where is None or where[1] not in controllers,
                                    bootindex=boot.get(drive.key))
                controllers |= {where[1]} if where else set()
                if kind == "disk":      # qemu-server's parse_drive refuses a value it lacks
                    assert volume is not None
                    found = pve.configuration_of(drive, vm.scsihw, volume)
        except ValueError as exc:
            translated = DiskTranslation(name=drive.key, written=written, values=None, config=None,
                                         argv=(), notes=(str(exc),), kind=kind)
            (disks if kind == "disk" else others).append(translated)
            continue
        storage = _where(drive, volume)
        if kind != "disk":
            if kind in ("cdrom", "empty"):
                notes.append(f"{drive.key}: " + ("a CD-ROM: read-only media, not a disk iomatrix "
                                                  "measures" if kind == "cdrom" else
                                                  "an empty drive (none)"))
            others.append(DiskTranslation(name=drive.key, written=written, values=None,
                                          config=None, argv=out.argv, notes=out.notes,
                                          storage=storage, kind=kind))
            continue
        assert volume is not None
        values, disk_notes = _pinned(found, vm), [*found.notes, *out.notes]
        if vm.template:
            disk_notes.append(f"{drive.key}: a template's disk: qemu-server opens it read-only "
                              "(for backups); a clone of the template gets these settings")
        if volume.backing and "parent" in vm.ignored:
            disk_notes.append(f"{drive.key}: the VM has snapshots, kept as qcow2 backing files: "
                              "qemu-server adds the chain the storage reports (qemu-img info "
                              "--backing-chain), which the configuration does not hold: left out")
        config = _config(values, disk_notes, librbd=volume.driver == "rbd")
        disks.append(DiskTranslation(name=drive.key, written=written, values=values,
                                     config=config, argv=out.argv, notes=tuple(disk_notes),
                                     storage=storage))
    disks += _args_disks(vm, notes)
    if gen >= 9:
        label = "PVE 9 (-blockdev under a throttle filter)"
    else:
        label = "PVE 8 (-drive" + (", as qemu-server 9 writes it for this machine)"
                                   if host >= 9 else ")")
    return Translation(platform="proxmox", generation=label, disks=tuple(disks),
                       others=tuple(others), order=tuple(d.key for d in drives),
                       notes=tuple(notes), pve_version=gen)


def _pinned(values: DiskValues, vm: pve.VmConfig) -> DiskValues:
    """A Proxmox VE disk's values with the VM's ``affinity``: every thread of the VM on it
    (taskset --all-tasks), so all three CPU sets are it."""
    if not vm.affinity:
        return values
    cpus = cpu_list(vm.affinity)
    if cpus is None:
        return values.model_copy(update={"notes": (*values.notes, f"affinity: {vm.affinity!r} "
                                                   "is not a CPU list iomatrix reads")})
    return values.model_copy(update={"vcpu_affinity": cpus, "iothread_affinity": cpus,
                                     "main_affinity": cpus})


def _args_disks(vm: pve.VmConfig, notes: list[str]) -> list[DiskTranslation]:
    """The disks the VM's ``args:`` attaches with several IOThreads (``iothread-vq-mapping``),
    as iomatrix's ``qm set`` writes them; the rest of ``args:`` is named, not read."""
    if not vm.args:
        return []
    try:
        found, args_notes = pve.parse_args(vm.args)
    except ValueError as exc:
        notes.append(str(exc))
        return []
    notes += [*args_notes, "args: QEMU arguments qemu-server appends as given: only its disks "
              "with iothread-vq-mapping are read" + (f" ({len(found)})" if found else " (none)")]
    out = []
    for disk in found:
        cache = next((name for name, f in CACHE_MODES.items()
                      if (f.direct, f.no_flush, f.writeback)
                      == (disk.cache_direct, disk.cache_no_flush, disk.write_cache)), None)
        disk_notes = [f"args:{disk.name}: attached in args:, not a drive: "
                      + pve.ARGS_WARNING.removeprefix("warning: ")]
        values = _pinned(DiskValues(
            controller=disk.controller, aio=disk.aio, iothread=True, cache=cache or "writeback",
            format=disk.format, num_queues=disk.num_queues, queue_size=disk.queue_size,
            iothreads=disk.iothreads if disk.iothreads > 1 else None,
            vq_mapping=disk.vq_mapping, notes=tuple(disk_notes)), vm)
        out.append(DiskTranslation(name=f"args:{disk.name}", written=f"args: … {disk.name} …",
                                   values=values, config=_config(values, disk_notes), argv=(),
                                   notes=tuple(disk_notes),
                                   storage=f"a path, {disk.path}" if disk.path else ""))
    return out


def _vm_notes(vm: pve.VmConfig, gen: pve.PveVersion, vmid: str | None) -> list[str]:
    """What the VM's own settings do to its disks' command line: a template's, a pinned or
    given machine version's, another architecture's, OVMF's temporary vars disk."""
    notes = [pve.OMITTED]
    pinned = pve.pinned_version(vm)
    if vm.template:
        notes.append("template: qemu-server starts a template only for backups, from its drives, "
                     "scsihw, bios and name: every block node read-only, SATA and IDE drives as "
                     "ide-cd, the newest machine version, -snapshot for the whole VM")
    elif pinned and pve.machine_type(vm) in (None, "pc", "q35"):
        notes.append(f"ostype: {vm.ostype} without a machine version: qemu-server pins a Windows "
                     f"VM to {pinned[0]}.{pinned[1]} → PVE {gen}'s command line")
    elif vm.machine:
        notes.append(f"machine: {vm.machine} → PVE {gen}'s command line")
    if vm.affinity and cpu_list(vm.affinity):
        notes.append(f"affinity: {cpu_list(vm.affinity)}: qemu-server starts QEMU under taskset "
                     "--cpu-list --all-tasks: every thread of the VM (vCPUs, IOThreads, main "
                     "loop) on these CPUs")
    if vm.arch and vm.arch != "x86_64":
        notes.append(f"arch: {vm.arch}: iomatrix models x86_64's devices and firmware")
    if vm.bios == "ovmf" and not any(d.bus == "efidisk" for d in vm.drives):
        notes.append("bios: ovmf without efidisk0: qemu-server gives OVMF a temporary vars disk "
                     f"(/run/qemu-server/efidisk/{vmid or '<vmid>'}-ovmf.fd), not shown")
    return notes


def _efidisk(drive: pve.Drive, volume: pve.Volume | None, vm: pve.VmConfig, gen: pve.PveVersion,
             host: pve.PveVersion, pinned: tuple[int, int, int] | None) -> pve.DiskArgs:
    """The EFI disk's arguments, or why qemu-server attaches none (OVMF.pm)."""
    if vm.bios != "ovmf":
        return pve.DiskArgs(argv=(), notes=(f"{drive.key}: bios is {vm.bios or 'seabios'}, not "
                                            "ovmf: qemu-server does not attach the EFI disk",))
    if vm.cvm in ("snp", "tdx") and not vm.template:
        return pve.DiskArgs(argv=(), notes=(f"{drive.key}: EFI disks are not supported with "
                                            "Confidential Virtual Machines and will be ignored",))
    if volume is None or (drive.volume.startswith("/") and not drive.get("format")):
        raise ValueError(f"{drive.key}: efidisk format must be specified")
    return pve.efidisk_args(drive, volume, version=gen, host=host, q35=pve.is_q35(vm),
                            cvm=None if vm.template else vm.cvm, template=vm.template,
                            machine=pinned)


def _tpmstate(drive: pve.Drive, written: str, template: bool,
              vmid: str | None) -> DiskTranslation:
    notes = [f"{drive.key}: swtpm opens the TPM state, not QEMU: QEMU gets a socket to swtpm"]
    if template:
        notes.append(f"{drive.key}: a template gets no TPM (qemu-server add_tpm_device)")
    elif vmid is None:
        notes.append(f"{drive.key}: the socket's path holds the VM's id: name the file ID.conf")
    return DiskTranslation(name=drive.key, written=written, values=None, config=None,
                           argv=() if template else pve.tpm_args(vmid or "<vmid>"),
                           notes=tuple(notes), kind="tpmstate")


def _where(drive: pve.Drive, volume: pve.Volume | None) -> str:
    if volume is None:
        return "no volume"
    if volume.storage == "path":
        return f"a path, {volume.path}"
    return f"{volume.storage} storage {drive.volume.partition(':')[0]}, {volume.path}"


def _libvirt(text: str, versions: lv.Versions) -> Translation:
    domain = lv.parse_domain(text, versions)
    out = lv.domain_args(domain, versions)
    notes = ["PCI addresses are left out: they place a device, they do not change its I/O",
             *domain.skipped, *out.notes]
    disks = []
    for disk, args in zip(domain.disks, out.disks):
        written = (f"<disk type='{disk.kind}' device='{disk.device}'> {disk.source or '(empty)'} "
                   f"→ <target dev='{disk.dev}' bus='{disk.bus}'> <driver "
                   + " ".join(f"{k}='{v}'" for k, v in disk.driver) + "/>")
        cdrom = disk.device == "cdrom"
        values: DiskValues | None = None
        if cdrom:
            disk_notes = ["a CD-ROM: read-only, not a disk iomatrix measures"]
        else:
            values = lv.configuration_of(disk, domain.cputune)
            disk_notes = list(values.notes)
        disk_notes += args.notes
        config = None if values is None else _config(values, disk_notes)
        disks.append(DiskTranslation(name=disk.dev, written=written, values=values, config=config,
                                     argv=args.argv, notes=tuple(disk_notes),
                                     kind="cdrom" if cdrom else "disk",
                                     storage=f"a {disk.kind} source, {disk.source or '(empty)'}"))
    generation = f"{versions.label} (-blockdev" + ("" if versions.raw_format_node else
                                                   ", raw disks without a format node") + ")"
    return Translation(platform="libvirt", generation=generation,
                       disks=tuple(d for d in disks if not d.cdrom),
                       others=tuple(d for d in disks if d.cdrom), order=tuple(d.name for d in disks),
                       notes=tuple(notes), argv=out.objects + out.controllers)
