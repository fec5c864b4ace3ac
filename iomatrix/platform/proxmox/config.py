"""A Proxmox VE VM configuration read (pure): its drive lines (Drive.pm parse_drive), the keys
that bear on the disks, the drives' boot order and the machine version that picks the
generation of their arguments (PVE 8 ``-drive`` or PVE 9 ``-blockdev``)."""

from __future__ import annotations

import re
from typing import Any, Literal

from iomatrix.core.model import Frozen


PveVersion = Literal[8, 9]
PVE_VERSIONS: tuple[PveVersion, ...] = (8, 9)
DEFAULT_PVE_VERSION: PveVersion = 9
BUSES = ("virtio", "scsi", "sata", "ide")
SCSIHW = ("lsi", "lsi53c810", "virtio-scsi-pci", "virtio-scsi-single", "megasas", "pvscsi")
SCSIHW_DEFAULT = "lsi"
"""QemuServer.pm ``$confdesc->{scsihw}``: ``default => 'lsi'`` (the GUI offers virtio-scsi-single
for new Linux VMs, but a configuration without ``scsihw:`` gets lsi)."""
DRIVE_KEY = re.compile(r"^(virtio|scsi|sata|ide|efidisk|tpmstate)(\d+)$")
OMITTED = ("PCI addresses (bus=pci.N,addr=…) are left out: they place the device in the VM, "
           "they do not change its I/O")

# Drive options (Drive.pm %drivedesc_base and the per-bus formats) by what iomatrix does with them.
IO_OPTIONS = ("aio", "cache", "discard", "detect_zeroes", "iothread", "ssd", "queues", "format",
              "media")
"""Options that change the block graph or device, and are modelled here."""
THROTTLE_OPTIONS = tuple(f"{kind}{d}{m}" for kind in ("mbps", "iops") for d in ("", "_rd", "_wr")
                         for m in ("", "_max")) + tuple(
    f"{kind}{d}_max_length" for kind in ("bps", "iops") for d in ("", "_rd", "_wr"))
UNMODELLED_OPTIONS = (*THROTTLE_OPTIONS, "ro", "rerror", "werror", "serial", "wwn", "model",
                      "vendor", "product", "scsiblock", "snapshot", "cyls", "heads", "secs",
                      "trans")
"""qemu-server options that reach QEMU but that iomatrix does not reproduce (throttling limits,
error policy, identity strings, passthrough): named when a drive has them."""
NON_QEMU_OPTIONS = ("size", "backup", "replicate", "shared", "import-from", "file")
"""Options that never reach QEMU (bookkeeping of qemu-server and the storage layer)."""


class Drive(Frozen):
    """One drive line of a VM configuration: ``scsi0: local-lvm:vm-100-disk-0,aio=native,…``."""

    key: str
    volume: str
    options: tuple[tuple[str, str], ...] = ()
    """Every ``key=value`` after the volume, as written, in order."""

    @property
    def bus(self) -> str:
        return DRIVE_KEY.match(self.key).group(1)  # type: ignore[union-attr]

    @property
    def index(self) -> int:
        return int(DRIVE_KEY.match(self.key).group(2))  # type: ignore[union-attr]

    def get(self, name: str) -> str | None:
        return next((v for k, v in self.options if k == name), None)

    def flag(self, name: str) -> bool | None:
        """A boolean option as qemu-server reads it (1/on/yes/true), None when absent."""
        value = self.get(name)
        return None if value is None else value.lower() in ("1", "on", "yes", "true")

    @property
    def is_cdrom(self) -> bool:
        """Drive.pm drive_is_cdrom: ``media=cdrom``."""
        return self.get("media") == "cdrom"

    @property
    def is_cloudinit(self) -> bool:
        """Drive.pm drive_is_cloudinit: a ``[vm-N-]cloudinit[.fmt]`` volume."""
        return re.search(r"[:/](?:vm-\d+-)?cloudinit(?:\.(?:raw|qcow2|vmdk|qed|cloop|qcow|cow))?$",
                         self.volume) is not None

    @property
    def unknown(self) -> tuple[str, ...]:
        known = {*IO_OPTIONS, *UNMODELLED_OPTIONS, *NON_QEMU_OPTIONS}
        return tuple(k for k, _ in self.options if k not in known)

    @property
    def unmodelled(self) -> tuple[str, ...]:
        return tuple(k for k, _ in self.options if k in UNMODELLED_OPTIONS)


def parse_drive(key: str, text: str) -> Drive:
    """A drive line's value (Drive.pm parse_drive: the volume first, or ``file=``)."""
    if not DRIVE_KEY.match(key):
        raise ValueError(f"{key!r} is not a drive key (virtioN, scsiN, sataN, ideN, efidisk0, "
                         "tpmstate0)")
    parts = [p for p in text.strip().split(",") if p]
    if not parts:
        raise ValueError(f"{key}: empty drive")
    volume = ""
    options: list[tuple[str, str]] = []
    for i, part in enumerate(parts):
        name, eq, value = part.partition("=")
        if not eq:
            if i != 0:
                raise ValueError(f"{key}: option {part!r} has no value")
            volume = part
        elif name == "file" or (name == "volume" and not volume):
            volume = value
        else:
            options.append((name, value))
    if not volume:
        raise ValueError(f"{key}: no volume")
    return Drive(key=key, volume=volume, options=tuple(options))


class VmConfig(Frozen):
    """The disk-relevant part of a VM configuration."""

    scsihw: str | None
    machine: str | None
    drives: tuple[Drive, ...]
    ignored: tuple[str, ...] = ()
    """Keys of the configuration that do not bear on the disks (named, not dropped silently)."""
    template: bool = False
    bios: str | None = None
    ostype: str | None = None
    meta: str | None = None
    cvm: str | None = None
    """``amd-sev`` type (std, es, snp) or ``tdx``: a confidential VM's firmware."""
    arch: str | None = None
    boot: str | None = None
    """``boot:`` as written (None: not given; "" given empty)."""
    bootdisk: str | None = None
    affinity: str | None = None
    """``affinity:``: the host CPUs every thread of the VM runs on (taskset --all-tasks)."""
    args: str | None = None
    """``args:``: QEMU arguments qemu-server appends as given."""

    @property
    def windows(self) -> bool:
        """Helpers.pm windows_version: a Windows ostype."""
        return bool(self.ostype) and re.match(r"^(win\d+|wxp|w2k[38]?|wvista)$",
                                              self.ostype or "") is not None


def parse_config(text: str) -> VmConfig:
    """A VM configuration as ``/etc/pve/qemu-server/ID.conf`` holds it or ``qm config ID``
    prints it: ``key: value`` lines, ``#`` comments (the description); snapshot sections
    (``[name]``) and what follows them are not the current configuration."""
    values: dict[str, Any] = {"scsihw": None, "machine": None}
    drives: list[Drive] = []
    ignored: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            break
        key, sep, value = line.partition(":")
        if not sep:
            raise ValueError(f"not a configuration line: {raw!r}")
        key, value = key.strip(), value.strip()
        if key in ("scsihw", "machine", "bios", "ostype", "meta", "arch", "boot", "bootdisk",
                   "affinity", "args"):
            values[key] = value
        elif key == "template":
            values["template"] = value in ("1", "on", "yes", "true")
        elif key in ("amd-sev", "intel-tdx"):
            kind = re.search(r"(?:^|,)(?:type=)?(std|es|snp)(?:,|$)", value)
            values["cvm"] = "tdx" if key == "intel-tdx" else kind.group(1) if kind else "std"
        elif DRIVE_KEY.match(key):
            drives.append(parse_drive(key, value))
        else:
            ignored.append(key)
    return VmConfig(drives=tuple(drives), ignored=tuple(ignored), **values)


def boot_order(vm: VmConfig) -> dict[str, int]:
    """Each drive's bootindex (QemuServer.pm device_bootorder). ``boot: order=a;b;…`` numbers
    the devices listed from 100. Without ``boot:``, or with a legacy ``boot: [acdn]{1,4}``
    (bootorder_from_legacy, default ``cdn``), each letter's number is 100 times its place; in
    drive order a CD-ROM (cloud-init's is not) takes the ``d`` number and counts it up, any
    other drive counts the ``c`` number up and only ``bootdisk`` takes it. A ``boot:`` with
    neither gives no drive one. A template is started without ``boot:`` and ``bootdisk:``."""
    boot, bootdisk = (None, None) if vm.template else (vm.boot, vm.bootdisk)
    items = dict(i.split("=", 1) if "=" in i else ("legacy", i)
                 for i in (boot or "").split(",") if i.strip())
    if boot is not None and not items.get("legacy"):
        devices = [d for d in re.split(r"[;\s]+", items.get("order", "")) if d]
        return {dev: 100 + i for i, dev in enumerate(devices)}
    number = {letter: 100 * (i + 1) for i, letter in enumerate(items.get("legacy") or "cdn")}
    out: dict[str, int] = {}
    for drive in sorted(vm.drives, key=lambda d: drive_order(d.key)):
        letter = "d" if drive.is_cdrom and not drive.is_cloudinit else "c"
        if letter not in number:
            continue
        if letter == "d" or drive.key == bootdisk:
            out[drive.key] = number[letter]
        number[letter] += 1
    return out


# -- machine versions -------------------------------------------------------------------------

def machine_type(vm: VmConfig) -> str | None:
    """The ``machine:`` type (``pc-q35-8.1``, ``q35``), None when unset. A template's is
    always unset: qemu-server starts a template (for backups) with a minimal configuration of
    its disks, scsihw, bios and name only (QemuServer.pm config_to_command)."""
    if vm.template or not vm.machine:
        return None
    items = vm.machine.split(",")
    typed = next((i[5:] for i in items if i.startswith("type=")), None)
    return typed or next((i for i in items if "=" not in i), None)


def is_q35(vm: VmConfig) -> bool:
    """Machine.pm machine_type_is_q35."""
    kind = machine_type(vm) or ""
    return kind == "q35" or kind.startswith("pc-q35-")


def pinned_version(vm: VmConfig) -> tuple[int, int, int] | None:
    """The machine version (major, minor, pve) the VM runs with, None for the host's newest
    (Machine.pm get_vm_machine, extract_version): a pinned ``machine:`` (a missing ``+pveN``
    is 0); a Windows VM without one is pinned to 5.1, or to the QEMU version it was created
    with from 9.1 on (``meta: creation-qemu=``)."""
    kind = machine_type(vm)
    if not kind or kind in ("pc", "q35", "virt"):
        if not vm.windows or vm.template:
            return None
        created = re.search(r"creation-qemu=(\d+)\.(\d+)", vm.meta or "")
        if created and (int(created.group(1)), int(created.group(2))) >= (9, 1):
            return int(created.group(1)), int(created.group(2)), 0
        return 5, 1, 0
    found = re.match(r"^(?:pc(?:-i440fx|-q35)?|virt)-(\d+)\.(\d+)(?:\.\d+)?(?:\+pve(\d+))?", kind)
    if found is None:
        return None
    return int(found.group(1)), int(found.group(2)), int(found.group(3) or 0)


def version_of_machine(vm: VmConfig, host: PveVersion = DEFAULT_PVE_VERSION) -> PveVersion:
    """The generation of the VM's disk arguments on a ``host`` of that PVE version
    (QemuServer.pm: ``min_version($machine_version, 10, 0)`` selects -blockdev): PVE 9 gives a
    machine below 10.0 PVE 8's -drive."""
    pinned = pinned_version(vm)
    return 9 if host >= 9 and (pinned is None or pinned[:2] >= (10, 0)) else 8


def version_of_pveversion(line: str) -> PveVersion | None:
    """PVE generation from ``pveversion``'s line, pve-manager's major version (``pve-manager/
    9.0.3/025864202ebb6109 (running kernel: 6.14.8-2-pve)``); None for another generation or
    anything else."""
    found = re.match(r"pve-manager/(\d{1,3})\.\d", line.strip())
    major = int(found.group(1)) if found else None
    return next((v for v in PVE_VERSIONS if v == major), None)


def drive_order(key: str) -> tuple[int, int]:
    """Drive.pm valid_drive_names: the order config_to_command adds drives in (ide, scsi,
    virtio, sata, then efidisk0 and tpmstate0)."""
    found = DRIVE_KEY.match(key)
    if found is None:
        raise ValueError(f"{key!r} is not a drive key")
    return ("ide", "scsi", "virtio", "sata", "efidisk", "tpmstate").index(found.group(1)), int(
        found.group(2))
