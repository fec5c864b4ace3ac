"""One drive's command line as qemu-server's config_to_command writes it (pure): PVE 8's
``-drive`` line (print_drive_commandline_full) or PVE 9's ``-blockdev`` (:mod:`.blockdev`),
the controller and the device (DriveDevice.pm print_drivedevice_full), the iothread object, the
EFI disk's flash devices (OVMF.pm) and the TPM's socket."""

from __future__ import annotations

import urllib.parse

from iomatrix.core.model import Frozen, on_off
from iomatrix.platform.proxmox.blockdev import drive_blockdev, throttle_group, to_json
from iomatrix.platform.proxmox.config import (DEFAULT_PVE_VERSION, SCSIHW_DEFAULT, Drive,
                                              PveVersion)
from iomatrix.platform.proxmox.rules import (aio_option, detect_zeroes_option, throttle_limits,
                                             uses_cache_direct)
from iomatrix.platform.proxmox.storage import Volume


def controller_of(drive: Drive, scsihw: str | None) -> tuple[str, str, str] | None:
    """(QEMU type, id, disk bus) of the controller a drive needs, or None (virtio-blk; IDE is the
    machine's own). DriveDevice.pm scsihw_infos: lsi* hold 7 disks per controller, virtio-scsi-single
    one (``virtioscsiN``), the others 256 (``scsihwN``); sata: 6 per ``ahciN``."""
    if drive.bus == "scsi":
        hw = scsihw or SCSIHW_DEFAULT
        if hw.startswith("lsi"):
            per, prefix = 7, "scsihw"
        elif hw == "virtio-scsi-single":
            per, prefix = 1, "virtioscsi"
        else:
            per, prefix = 256, "scsihw"
        ident = f"{prefix}{drive.index // per}"
        return ("virtio-scsi-pci" if hw.startswith("virtio-scsi-single") else hw), ident, f"{ident}.0"
    if drive.bus == "sata":
        ident = f"ahci{drive.index // 6}"
        return "ahci", ident, f"{ident}.{drive.index % 6}"
    return None


class DiskArgs(Frozen):
    """One disk's QEMU arguments as qemu-server generates them, and what was not reproduced."""

    argv: tuple[str, ...]
    notes: tuple[str, ...] = ()
    iothread: str | None = None
    """The iothread object's id, when the disk (or its controller) gets one."""


def disk_args(drive: Drive, volume: Volume | None, *, scsihw: str | None, version: PveVersion,
              size: int | None = None, escape: bool = False, host: PveVersion | None = None,
              template: bool = False, q35: bool = False, controller: bool = True,
              bootindex: int | None = None) -> DiskArgs:
    """The ``-object``/``-device``/``-drive``/``-blockdev`` arguments qemu-server's
    config_to_command emits for ``drive`` (a disk or CD-ROM, in its order: objects,
    controller, drive, device); ``volume`` None for an empty drive (``none``).

    ``version``: the generation (8: ``-drive``, 9: ``-blockdev``); ``host``: the qemu-server
    writing it (PVE 9 writes ``-drive`` for machines below 10.0, in its own order), by default
    ``version``. ``template``: a template's read-only graph; ``q35``: that machine's IDE buses;
    ``controller`` False when an earlier drive on the same controller added it; ``bootindex``
    the device's (:func:`boot_order`). ``size`` limits a raw format node (Blockdev.pm
    generate_format_blockdev's ``size``); ``escape`` doubles commas in a path (qemu-server's
    paths have none)."""
    notes: list[str] = list(volume.notes) if volume else []
    drive_id = drive.key
    storage = volume.storage if volume else "path"
    direct = uses_cache_direct(drive.get("cache"), storage, cdrom=drive.is_cdrom)
    objects: list[str] = []
    iothread = _iothread(drive, scsihw, notes)
    if iothread:
        objects += ["-object", f"iothread,id={iothread}"]
    if version >= 9 and volume is not None:
        objects += ["-object", to_json(throttle_group(drive))]
    where = controller_of(drive, scsihw)
    added = _controller_device(drive, scsihw, where, iothread, notes)   # notes even when not added
    devices = added if controller else []
    if drive.flag("ssd") and drive.bus == "virtio":
        notes.append(f"{drive_id}: ssd=1 has no effect on a virtio drive (no rotation_rate)")
    aio = aio_option(drive.get("aio"), storage, direct)
    if version >= 9:
        if volume is not None and drive.flag("snapshot"):   # Blockdev.pm generate_file_blockdev
            raise ValueError(f"{drive_id}: 'snapshot' option is not yet supported for '-blockdev'")
        if volume is not None:
            devices += ["-blockdev", to_json(drive_blockdev(drive, volume, direct, aio, size,
                                                            read_only=template))]
        if volume is not None and volume.driver == "rbd":
            notes.append(f"{drive_id}: librbd gets no aio (Blockdev.pm generate_file_blockdev "
                         "sets aio only on file, host_device and host_cdrom nodes)")
    else:
        if volume is not None and volume.volume_chain:
            raise ValueError(f"storage for '{drive.volume}' is configured for snapshots as a "
                             "volume chain - this requires QEMU machine version >= 10.0")
        line = _drive_line(drive, volume, direct, aio, size, escape, host or version)
        if template and drive.bus not in ("ide", "sata"):
            line += ",readonly=on"
        devices += ["-drive", line]
        if volume is not None and volume.driver == "rbd":
            notes.append(f"{drive_id}: librbd ignores -drive's aio=")
    scsi_block = bool(drive.flag("scsiblock")) and storage == "path"
    if scsi_block:
        notes.append(f"{drive_id}: scsiblock=1 on {drive.volume}: scsi-block, as qemu-server "
                     "makes it for a SCSI disk (it asks the device; a device that is not SCSI "
                     "gets scsi-hd)")
    devices += ["-device", _device(drive, scsihw, version, where, template=template, q35=q35,
                                   attached=volume is not None, scsi_block=scsi_block,
                                   bootindex=bootindex)]
    for name in drive.unmodelled:
        notes.append(f"{drive_id}: {name}={drive.get(name)} is not reproduced by iomatrix in a "
                     "measurement (the arguments carry it, a measured disk runs without it)")
    for name in drive.unknown:
        notes.append(f"{drive_id}: {name}={drive.get(name)} is not a qemu-server drive option "
                     "iomatrix knows")
    return DiskArgs(argv=tuple(objects + devices), notes=tuple(notes), iothread=iothread)


def _iothread(drive: Drive, scsihw: str | None, notes: list[str]) -> str | None:
    """config_to_command: the iothread's id for a virtio drive, and for a scsi drive only on
    virtio-scsi-single; elsewhere iothread=1 is ignored (noted)."""
    if not drive.flag("iothread"):
        return None
    if drive.bus == "virtio":
        return f"iothread-{drive.key}"
    if drive.bus == "scsi" and scsihw == "virtio-scsi-single":
        return f"iothread-virtioscsi{drive.index}"
    notes.append(f"{drive.key}: iothread=1 is ignored by qemu-server here (only virtio "
                 "disks and scsihw virtio-scsi-single get an iothread)")
    return None


def _controller_device(drive: Drive, scsihw: str | None, where: tuple[str, str, str] | None,
                       iothread: str | None, notes: list[str]) -> list[str]:
    """The ``-device`` of the drive's controller (none for virtio-blk and IDE): AHCI
    multifunction, a SCSI controller with the iothread and, on virtio-scsi-single, the drive's
    ``queues`` (which qemu-server ignores elsewhere: noted)."""
    queues = drive.get("queues")
    single = drive.bus == "scsi" and scsihw == "virtio-scsi-single"
    if queues and not single:
        notes.append(f"{drive.key}: queues={queues} is ignored by qemu-server here (only scsi "
                     "drives on virtio-scsi-single)")
    if where is None:
        return []
    ctype, cid, _ = where
    props = f"{ctype},id={cid}"
    if ctype == "ahci":
        props += ",multifunction=on"
    elif iothread and drive.bus == "scsi":
        props += f",iothread={iothread}"
    if single and queues:
        props += f",num_queues={queues}"
    return ["-device", props]


OVMF_DIR = "/usr/share/pve-edk2-firmware/"
OVMF_VARS_SIZE = {"2m": 128 << 10, "4m": 528 << 10}
"""Sizes of pve-edk2-firmware's vars templates (OVMF_VARS.fd, OVMF_VARS_4M*.fd): a raw EFI
disk's format node is limited to them."""


def ovmf_code(drive: Drive, *, q35: bool, cvm: str | None,
              host: PveVersion = DEFAULT_PVE_VERSION) -> tuple[str, int]:
    """OVMF.pm get_ovmf_files (x86_64): the firmware code image for the EFI disk's type, and
    the size of its vars template. The secure-boot code needs SMM, which only q35 has; AMD
    SEV's code is OVMF_CVM_CODE_4M.fd up to qemu-server 8, OVMF_SEV_CODE_4M.fd from 9."""
    if cvm in ("std", "es"):
        code = "OVMF_SEV_CODE_4M.fd" if host >= 9 else "OVMF_CVM_CODE_4M.fd"
        return f"{OVMF_DIR}/{code}", OVMF_VARS_SIZE["4m"]
    if drive.get("efitype") == "4m":
        code = "OVMF_CODE_4M.secboot.fd" if q35 else "OVMF_CODE_4M.fd"
        return f"{OVMF_DIR}/{code}", OVMF_VARS_SIZE["4m"]
    return f"{OVMF_DIR}/OVMF_CODE.fd", OVMF_VARS_SIZE["2m"]


def efidisk_args(drive: Drive, volume: Volume, *, version: PveVersion,
                 host: PveVersion | None = None, q35: bool = False, cvm: str | None = None,
                 template: bool = False, machine: tuple[int, int, int] | None = None) -> DiskArgs:
    """The firmware's two flash devices qemu-server attaches for ``bios: ovmf`` (OVMF.pm
    print_ovmf_commandline): the read-only code image and the EFI disk, the writable vars.
    PVE 9: ``-blockdev`` nodes (the vars under a throttle filter, cache writeback unless given,
    bug #3329) named in ``-machine pflash0=,pflash1=``; PVE 8: two ``-drive if=pflash``.
    ``machine``: a pinned machine version (below 4.1+pve2 a raw vars drive gets no size)."""
    code, vars_size = ovmf_code(drive, q35=q35, cvm=cvm, host=host or version)
    notes = list(volume.notes)
    size = vars_size if volume.format == "raw" else None
    if version >= 9:
        vars_drive = drive if drive.get("cache") else drive.model_copy(
            update={"options": (*drive.options, ("cache", "writeback"))})
        direct = uses_cache_direct(vars_drive.get("cache"), volume.storage)
        graph = drive_blockdev(vars_drive, volume, direct,
                               aio_option(drive.get("aio"), volume.storage, direct), size,
                               read_only=template)
        code_node = {"driver": "raw", "file": {"driver": "file", "filename": code},
                     "node-name": "pflash0", "read-only": True}
        argv = ["-object", to_json(throttle_group(drive)), "-blockdev", to_json(code_node),
                "-blockdev", to_json(graph), "-machine", "pflash0=pflash0,pflash1=drive-efidisk0"]
    else:
        path = volume.drive_file or volume.path
        line = "if=pflash,unit=1,id=drive-efidisk0"
        if volume.driver == "rbd":
            line += ",cache=writeback"
            path += ":rbd_cache_policy=writeback"
        line += f",format={volume.format},file={path}"
        if size is not None and (machine is None or machine >= (4, 1, 2)):
            line += f",size={size}"
        if template:
            line += ",readonly=on"
        argv = ["-drive", f"if=pflash,unit=0,format=raw,readonly=on,file={code}", "-drive", line]
    return DiskArgs(argv=tuple(argv), notes=tuple(notes))


def tpm_args(vmid: str) -> tuple[str, ...]:
    """QemuServer.pm add_tpm_device: QEMU talks to swtpm over a socket; swtpm, not QEMU, opens
    the tpmstate volume."""
    return ("-chardev", f"socket,id=tpmchar,path=/var/run/qemu-server/{vmid}.swtpm",
            "-tpmdev", "emulator,id=tpmdev,chardev=tpmchar", "-device", "tpm-tis,tpmdev=tpmdev")


def _drive_line(drive: Drive, volume: Volume | None, direct: bool, aio: str, size: int | None,
                escape: bool, host: PveVersion) -> str:
    """print_drive_commandline_full: ``file=,if=none,id=``, the drive's own options, throttling,
    ``format=``, ``cache=none`` when no cache is given but it is direct, ``aio=`` and
    ``detect-zeroes=`` (not for a CD-ROM). qemu-server 8.3 writes a given aio among the drive's
    options (heads secs cyls trans media cache rerror werror aio discard) and adds the default
    only when none is given; 9.x writes ``aio=`` always, after the cache."""
    if volume is None:
        path = ""
    elif volume.drive_file:
        path = volume.drive_file
    else:
        path = volume.path.replace(",", ",,") if escape else volume.path
    own = (("heads", "secs", "cyls", "trans", "media", "cache", "rerror", "werror", "aio",
            "discard") if host < 9 else ("media", "cache", "rerror", "werror", "discard"))
    line = (f"file={path}," if path else "") + f"if=none,id=drive-{drive.key}"
    for name in own:
        if drive.get(name) is not None:
            line += f",{name}={drive.get(name)}"
    if drive.get("snapshot") is not None:
        line += ",snapshot=" + on_off(bool(drive.flag("snapshot")))
    if drive.get("ro") is not None:
        line += ",readonly=" + on_off(bool(drive.flag("ro")))
    line += "".join(f",throttling.{name}={value}" for name, value in throttle_limits(drive))
    if volume is not None:
        line += f",format={volume.format}"
        if size is not None and volume.format == "raw":
            line += f",size={size}"
    if not drive.get("cache") and direct:
        line += ",cache=none"
    if host >= 9 or not drive.get("aio"):
        line += f",aio={aio}"
    return line + ("" if drive.is_cdrom else f",detect-zeroes={detect_zeroes_option(drive)}")


def _device(drive: Drive, scsihw: str | None, version: PveVersion,
            controller: tuple[str, str, str] | None, *, template: bool = False,
            q35: bool = False, attached: bool = True, scsi_block: bool = False,
            bootindex: int | None = None) -> str:
    """DriveDevice.pm print_drivedevice_full, without PCI address. A template's
    SATA and IDE drives are ide-cd on PVE 9 (IDE cannot be read-only; a template is only
    started for backups, which read the block node); q35 has one unit per IDE bus."""
    drive_id = drive.key
    blockdev = version >= 9
    attach = f",drive=drive-{drive_id}" if attached or not blockdev else ""
    write_cache = True
    if drive.bus == "virtio":
        device = f"virtio-blk-pci{attach},id={drive_id}"
        if drive.flag("iothread"):
            device += f",iothread=iothread-{drive_id}"
    elif drive.bus == "scsi":
        assert controller is not None
        kind = ("cd" if drive.is_cdrom or drive.is_cloudinit else "block" if scsi_block
                else "hd")
        hw = scsihw or SCSIHW_DEFAULT
        if hw.startswith("lsi") or hw == "pvscsi":
            per = 7 if hw.startswith("lsi") else 256
            device = f"scsi-{kind},bus={controller[2]},scsi-id={drive.index % per}"
        else:
            device = f"scsi-{kind},bus={controller[2]},channel=0,scsi-id=0,lun={drive.index}"
        device += f"{attach},id={drive_id}"
        if blockdev and kind != "block":
            device += f",device_id=drive-{drive_id}"
        if drive.flag("ssd") and kind != "cd":
            device += ",rotation_rate=1"
        device += f",wwn={drive.get('wwn')}" if drive.get("wwn") else ""
        if kind == "block":
            write_cache = False
        else:
            device += "".join(f",{k}={drive.get(k)}" for k in ("vendor", "product") if drive.get(k))
    else:
        bus, unit = divmod(drive.index, 6 if drive.bus == "sata" else 2)
        if q35 and drive.bus == "ide":
            bus, unit = bus + 2 * (unit % 2), 0
        kind = "cd" if drive.is_cdrom or (template and blockdev) else "hd"
        device = f"ide-{kind}," + (f"bus=ide.{bus},unit={unit}" if drive.bus == "ide"
                                   else f"bus=ahci{bus}.{unit}")
        device += f"{attach},id={drive_id}"
        if kind == "hd":
            device += f",model={_unescaped(drive.get('model'))}" if drive.get("model") else ""
            device += ",rotation_rate=1" if drive.flag("ssd") else ""
        device += f",wwn={drive.get('wwn')}" if drive.get("wwn") else ""
    if bootindex:
        device += f",bootindex={bootindex}"
    if drive.get("serial"):
        device += f",serial={_unescaped(drive.get('serial'))}"
    if blockdev:
        if not drive.is_cdrom and write_cache:
            cache = drive.get("cache")
            device += ",write-cache=" + ("off" if cache in ("writethrough", "directsync") else "on")
        device += "".join(f",{k}={drive.get(k)}" for k in ("rerror", "werror") if drive.get(k))
    return device


def _unescaped(value: str | None) -> str:
    """DriveDevice.pm: serial= and model= are URL-encoded in the configuration; decoded, and a
    comma doubled for QEMU's parser."""
    return urllib.parse.unquote(value or "").replace(",", ",,")
