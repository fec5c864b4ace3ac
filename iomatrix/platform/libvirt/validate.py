"""What libvirt refuses in a domain's disks, with libvirt's own words (pure): checked on every
``<disk>``, those iomatrix leaves out (network, floppy, USB, volume, NVMe) included, as libvirt's
parser and validators do (conf/domain_conf.c, conf/domain_validate.c, qemu/qemu_validate.c;
checked against ``virsh domxml-to-native`` of libvirt 9.0 and 11.3 by
iomatrix/testing/libvirt_oracle.py)."""

from __future__ import annotations

import re
from xml.etree import ElementTree as ET

from iomatrix.platform.libvirt.versions import Version, Versions

DRIVER_VALUES = {"discard": ("unmap", "ignore"), "detect_zeroes": ("off", "on", "unmap"),
                 "io": ("native", "threads", "io_uring"),
                 "error_policy": ("stop", "report", "ignore", "enospace"),
                 "cache": ("default", "none", "writethrough", "writeback", "directsync", "unsafe")}
"""The values libvirt's parser takes (``default`` is taken for cache= alone)."""
FORMAT_REFUSED = {
    "cow": "'cow' storage format is not supported",
    "dir": "'directory' storage format is not directly supported by QEMU, use 'dir' disk type "
           "instead",
    "iso": "storage format 'iso' is not directly supported by QEMU, use 'raw' instead"}
DRIVE_BUSES = ("scsi", "sata", "ide", "fdc")
VIRTIO_LUN_DROPPED_QEMU: Version = (9, 1, 0)
"""The first QEMU without virtio-blk's ``scsi`` property (SCSI passthrough on virtio-blk)."""
INT_MAX = 2 ** 31 - 1
NEWER_REFUSALS: Version = (10, 0, 0)
"""From where iomatrix takes libvirt to refuse what 9.0 takes and 11.3 refuses (an overlong
target, an empty USB drive): verified at those two, the versions between taken as 11.3."""
_DISK_NAME = re.compile(r"^(fd|hd|vd|sd|xvd|ubd)([a-z]+)([0-9]*)$")
_UNITS = {"scsi": 7, "sata": 6, "fdc": 2}   # units per controller (SCSI: libvirt's narrow bus)


def disk_index(dev: str) -> int:
    """virDiskNameToIndex: ``sda`` → 0, ``hdz`` → 25, ``vdaa`` → 26, in a C int (it wraps);
    -1 for another name."""
    found = _DISK_NAME.match(dev)
    if found is None:
        return -1
    index = -1
    for letter in found[2]:
        index = (index + 1) * 26 + ord(letter) - ord("a")
        index = (index + 2 ** 31) % 2 ** 32 - 2 ** 31   # libvirt's int wraps: a long name's
    return index                                          # index is 1030792150 (its ids say so)


def implicit_address(bus: str, dev: str) -> tuple[int, int, int, int]:
    """The drive address libvirt gives a disk without an ``<address>``: controller, bus,
    target, unit from its target's index (virDomainDiskDefAssignAddress)."""
    index = disk_index(dev)
    if bus == "ide":
        return index // 4, index % 4 // 2, 0, index % 2
    if bus in _UNITS:
        return index // _UNITS[bus], 0, 0, index % _UNITS[bus]
    return 0, 0, 0, 0


def refusal(root: ET.Element, versions: Versions | None = None) -> str | None:
    """libvirt's reason for refusing the domain's disks, or None; ``versions``: also what that
    libvirt and QEMU refuse and others take (:func:`_versioned`)."""
    machine = root.find("./os/type")
    q35 = "q35" in ((machine.get("machine") if machine is not None else None) or "pc")
    disks = root.findall("./devices/disk")
    threads = root.findtext("iothreads") or "0"
    count = int(threads) if threads.strip().isdigit() else 0
    for check in (_targets(disks), _boot_orders(disks), _addresses(disks, q35),
                  _controllers(root, count)):
        if check is not None:
            return check
    for disk in disks:
        for why in (_values(disk), _frontend(disk, versions), _options(disk), _iothread(disk, count),
                    _versioned(disk, versions)):
            if why is not None:
                return why
    return None


def _versioned(disk: ET.Element, versions: Versions | None) -> str | None:
    """A LUN on virtio-blk where QEMU has no virtio-blk ``scsi`` (QEMU 9.1 removed it;
    libvirt 11.3 with QEMU 10.0 refuses the disk); from :data:`NEWER_REFUSALS`, a target whose
    index overflows libvirt's C int (9.0 wraps it, :func:`disk_index`; the overflow is
    undefined in C) and an empty USB drive (9.0 gives it a usb-storage without a drive). From
    there too ``<target removable>`` is taken on SCSI (libvirt 11.3 takes it, 9.0 refuses it:
    :func:`_frontend`)."""
    if versions is None:
        return None
    dev, bus, device = _dev(disk)
    if device == "lun" and bus == "virtio" and versions.qemu >= VIRTIO_LUN_DROPPED_QEMU:
        return ("unsupported configuration: This QEMU doesn't support SCSI emulation with "
                "'virtio-blk' device")
    if versions.libvirt < NEWER_REFUSALS:
        return None
    found = _DISK_NAME.match(dev)
    if found and _unwrapped(found[2]) > INT_MAX:
        return f"unsupported configuration: invalid disk target '{dev}'"
    source = disk.find("source")
    if bus == "usb" and (source is None or not (source.attrib or len(source))):
        return "unsupported configuration: 'usb' disk must not be empty"
    return None


def _unwrapped(letters: str) -> int:
    index = -1
    for letter in letters:
        index = (index + 1) * 26 + ord(letter) - ord("a")
    return index


def _dev(disk: ET.Element) -> tuple[str, str, str]:
    """(target dev, bus, device)."""
    target = disk.find("target")
    dev = target.get("dev", "") if target is not None else ""
    bus = target.get("bus", "") if target is not None else ""
    return dev, bus, disk.get("device", "disk")


def _source(disk: ET.Element) -> str:
    source = disk.find("source")
    if source is None:
        return ""
    return source.get("file") or source.get("dev") or source.get("name") or source.get(
        "volume") or ""


def _targets(disks: list[ET.Element]) -> str | None:
    seen: dict[str, ET.Element] = {}
    for disk in disks:
        dev = _dev(disk)[0]
        if dev in seen:
            return (f"XML error: target '{dev}' duplicated for disk sources "
                    f"'{_source(seen[dev])}' and '{_source(disk)}'")
        seen[dev] = disk
        found = _DISK_NAME.match(dev)
        if found and found[3] and int(found[3]) != 0:
            return (f"unsupported configuration: invalid disk target '{dev}', partitions can't "
                    "appear in disk targets")
    return None


def _boot_orders(disks: list[ET.Element]) -> str | None:
    seen: set[str] = set()
    for disk in disks:
        boot = disk.find("boot")
        order = boot.get("order", "") if boot is not None else None
        if order is None:
            continue
        if order in seen:
            return f"unsupported configuration: boot order '{order}' used for more than one device"
        seen.add(order)
    return None


def _addresses(disks: list[ET.Element], q35: bool) -> str | None:
    """Each disk's address: its type for its bus, one controller only for IDE and floppies,
    IDE not on q35, no drive address twice (virDomainDiskDefAssignAddress)."""
    taken: dict[tuple[str, tuple[int, ...]], str] = {}
    for disk in disks:
        dev, bus, _ = _dev(disk)
        address = disk.find("address")
        kind = address.get("type") if address is not None else None
        if bus in DRIVE_BUSES and kind not in (None, "drive"):
            return (f"unsupported configuration: Invalid address type '{kind}' for the disk "
                    f"'{dev}' with the bus type '{bus}'")
        if bus == "usb" and kind not in (None, "usb"):
            return "internal error: unexpected address type for usb disk"
        if bus == "ide" and q35:
            return ("unsupported configuration: IDE controllers are unsupported for this QEMU "
                    "binary or machine type")
        if bus not in DRIVE_BUSES:
            continue
        if address is not None:
            given = [address.get(k, "0") for k in ("controller", "bus", "target", "unit")]
            if not all(v.isdigit() for v in given):
                continue                  # parse_domain names the number it cannot read
            where = tuple(map(int, given))
        else:
            where = implicit_address(bus, dev)
        if where[0] > 0 and bus in ("ide", "fdc"):
            return f"internal error: Only 1 {'IDE' if bus == 'ide' else 'fdc'} controller is supported"
        key = (bus, where)
        if key in taken:
            return (f"XML error: Found duplicate drive address for disk with target name "
                    f"'{dev}' controller='{where[0]}' bus='{where[1]}' target='{where[2]}' "
                    f"unit='{where[3]}'")
        taken[key] = dev
    return None


def _controllers(root: ET.Element, iothreads: int) -> str | None:
    for controller in root.iterfind("./devices/controller[@type='scsi']"):
        driver = controller.find("driver")
        if driver is None:
            continue
        virtio = controller.get("model") == "virtio-scsi"
        if driver.get("iothread") is not None and not virtio:
            return "XML error: 'iothread' attribute only supported for virtio scsi controllers"
        for key in ("queues", "cmd_per_lun", "max_sectors", "ioeventfd"):
            if driver.get(key) is not None and not virtio:
                return f"unsupported configuration: '{key}' is only supported by virtio-scsi controller"
        thread = driver.get("iothread")
        if thread is not None and thread.isdigit() and not 0 < int(thread) <= iothreads:
            return (f"unsupported configuration: controller iothread '{thread}' not defined in "
                    "iothreadid")
    return None


def _values(disk: ET.Element) -> str | None:
    """The ``<driver>``'s values libvirt's parser refuses, and its formats."""
    driver = disk.find("driver")
    if driver is None:
        return None
    for key, values in DRIVER_VALUES.items():
        value = driver.get(key)
        if value is not None and value not in values:
            return (f"XML error: Invalid value for attribute '{key}' in element 'driver': "
                    f"'{value}'.")
    rerror = driver.get("rerror_policy")
    if rerror is not None and rerror not in ("stop", "report", "ignore"):
        return f"unsupported configuration: Invalid disk read error policy: '{rerror}'"
    refused = FORMAT_REFUSED.get(driver.get("type", ""))
    if refused is not None:
        return f"unsupported configuration: {refused}"
    if driver.get("io") == "native" and driver.get("cache") not in ("none", "directsync"):
        return ("unsupported configuration: io='native' needs either no disk cache or "
                "directsync cache mode")
    return None


def _readonly(disk: ET.Element) -> bool:
    return disk.find("readonly") is not None or disk.get("device") == "cdrom"


def _frontend(disk: ET.Element, versions: Versions | None) -> str | None:
    """What a disk's bus and device do not take: vendor, wwn, rotation rate, removable,
    read-only, a shareable image."""
    dev, bus, device = _dev(disk)
    target = disk.find("target")
    assert target is not None
    lun = device == "lun"
    if disk.find("vendor") is not None or disk.find("product") is not None:
        if bus != "scsi":
            return "unsupported configuration: Only scsi disk supports vendor and product"
        if lun:
            return ("unsupported configuration: Setting vendor or product is not supported for "
                    "lun device")
    if disk.find("wwn") is not None:
        if bus not in ("ide", "scsi"):
            return "unsupported configuration: Only ide and scsi disk support wwn"
        if lun:
            return "unsupported configuration: Setting wwn is not supported for lun device"
    if target.get("rotation_rate") is not None:
        if bus not in ("scsi", "ide", "sata"):
            return "internal error: rotation rate is only valid for SCSI/IDE/SATA bus"
        if device != "disk":
            return "internal error: rotation rate is only valid for disk device"
    newer = versions is not None and versions.libvirt >= NEWER_REFUSALS
    if target.get("removable") is not None and bus not in (("usb", "scsi") if newer else ("usb",)):
        return ("XML error: removable is only valid for usb" + (" or scsi" if newer else "")
                + " disks")
    if device == "disk" and bus in ("ide", "sata") and disk.find("readonly") is not None:
        return f"unsupported configuration: readonly {bus} disks are not supported"
    driver = disk.find("driver")
    fmt = driver.get("type") if driver is not None else None
    if disk.find("shareable") is not None and not _readonly(disk) and fmt not in (None, "raw"):
        return (f"unsupported configuration: shared access for disk '{dev}' requires use of "
                "supported storage format")
    if lun and bus == "scsi" and disk.find("serial") is not None:
        return ("unsupported configuration: scsi-block 'lun' devices do not support the serial "
                "property")
    return None


def _options(disk: ET.Element) -> str | None:
    """copy_on_read where libvirt refuses it."""
    dev, _, device = _dev(disk)
    driver = disk.find("driver")
    if driver is None or driver.get("copy_on_read") != "on":
        return None
    if device == "lun":
        return f"unsupported configuration: copy_on_read is not compatible with 'lun' disk '{dev}'"
    if device in ("cdrom", "floppy"):
        return f"unsupported configuration: copy_on_read is not supported with removable disk '{dev}'"
    if _readonly(disk):
        return f"unsupported configuration: copy_on_read is not compatible with read-only disk '{dev}'"
    return None


def _iothread(disk: ET.Element, iothreads: int) -> str | None:
    driver = disk.find("driver")
    thread = driver.get("iothread") if driver is not None else None
    if thread is not None and thread.isdigit() and not 0 < int(thread) <= iothreads:
        return f"unsupported configuration: Disk iothread '{thread}' not defined in iothreadid"
    return None
