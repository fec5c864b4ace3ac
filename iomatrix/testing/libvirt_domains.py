"""Generated libvirt domains for the translate oracle (:mod:`iomatrix.testing.libvirt_oracle`):
disks × buses × drivers × sources × attributes, invalid ones included (duplicate targets, two
disks at one address, a PCI address on a drive bus, formats libvirt refuses, a vendor on a virtio
disk, a shareable qcow2, an overlong target, a partition as target), network, floppy, USB,
volume and NVMe disks among them, backing chains, CD-ROMs, boot orders, IOThread mappings.

Every choice goes through a :class:`Picker`: :class:`RandomPicker` (a seeded ``random.Random``,
the bench's) or a hypothesis ``draw`` (the test's), which shrinks toward each list's first
option, the plain one. Each source is named after its disk's target (``DIR/ora-vdb.qcow2``,
``DIR/ora-vdb~1.qcow2`` for its backing image, ``pool/ora-vdb`` over the network) so the comparer
finds a disk's arguments in a command line by what they open (:data:`TAG`)."""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from typing import Protocol, TypeVar
from xml.etree import ElementTree as ET

from iomatrix.core.model import Frozen

T = TypeVar("T")

DIR = "/var/tmp/iomatrix-oracle"
"""Where the generated sources are: nothing opens them (domxml-to-native and translate only
name them)."""
PREFIX = {"virtio": "vd", "scsi": "sd", "sata": "sd", "ide": "hd", "usb": "sd", "fdc": "fd"}
FORMATS = ("raw", "qcow2")
ODD_FORMATS = ("cow", "dir", "iso", "vmdk", "qed", "vpc")
CACHES = (None, "none", "writeback", "writethrough", "directsync", "unsafe", "default")
TAG = re.compile(r"ora-([a-z0-9]+)")
"""A disk's target in the names of what it opens."""
SCSI_MODELS = (None, "virtio-scsi", "lsilogic", "lsisas1068", "lsisas1078", "vmpvscsi")


class Picker(Protocol):
    def one(self, options: Sequence[T]) -> T: ...

    def number(self, low: int, high: int) -> int: ...

    def chance(self, percent: int) -> bool: ...


class RandomPicker:
    """Choices from a seeded ``random.Random`` (reproducible: the bench's)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def one(self, options: Sequence[T]) -> T:
        return options[self.rng.randrange(len(options))]

    def number(self, low: int, high: int) -> int:
        return self.rng.randint(low, high)

    def chance(self, percent: int) -> bool:
        return self.rng.randrange(100) < percent


class Generated(Frozen):
    xml: str
    targets: tuple[str, ...]
    """Each ``<disk>``'s target dev, in the XML's order."""


def domain(pick: Picker, name: str = "oracle") -> Generated:
    """One domain: a machine, IOThreads, SCSI controllers, 1 to 4 disks, a boot order."""
    root = ET.Element("domain", {"type": "qemu"})
    ET.SubElement(root, "name").text = name
    ET.SubElement(root, "memory", {"unit": "MiB"}).text = "256"
    iothreads = pick.one((0, 1, 2))
    if iothreads:
        ET.SubElement(root, "iothreads").text = str(iothreads)
    os = ET.SubElement(root, "os")
    machine = pick.one(("pc", "q35"))
    ET.SubElement(os, "type", {"arch": "x86_64", "machine": machine}).text = "hvm"
    boot = pick.one(("none", "hd", "cdrom-hd", "hd-cdrom", "order", "network-hd"))
    if boot not in ("none", "order"):
        for dev in boot.split("-"):
            ET.SubElement(os, "boot", {"dev": dev})
    devices = ET.SubElement(root, "devices")
    for index in range(pick.one((0, 1, 2))):
        devices.append(_controller(pick, index, iothreads))
    targets = []
    for _ in range(pick.number(1, 4)):
        disk = _disk(pick, iothreads, boot == "order", machine == "q35")
        devices.append(disk)
        targets.append(disk.find("target").get("dev", ""))   # type: ignore[union-attr]
    return Generated(xml=ET.tostring(root, encoding="unicode"), targets=tuple(targets))


def _controller(pick: Picker, index: int, iothreads: int) -> ET.Element:
    model = pick.one(SCSI_MODELS)
    element = ET.Element("controller", {"type": "scsi", "index": str(index)}
                         | ({"model": model} if model else {}))
    attrs: dict[str, str] = {}
    if pick.chance(30 if model == "virtio-scsi" else 1):
        attrs["queues"] = str(pick.number(1, 4))
    if iothreads and pick.chance(40 if model == "virtio-scsi" else 3):
        attrs["iothread"] = str(_odd(pick, range(1, iothreads + 1), (iothreads + 1,)))
    if attrs or (iothreads and model == "virtio-scsi" and pick.chance(20)):
        driver = ET.SubElement(element, "driver", attrs)
        if iothreads and "iothread" not in attrs and pick.chance(50):
            threads = ET.SubElement(driver, "iothreads")
            for ident in range(1, iothreads + 1):
                ET.SubElement(threads, "iothread", {"id": str(ident)})
    return element


def _odd(pick: Picker, usual: Sequence[T], odd: Sequence[T], percent: int = 1) -> T:
    """One of ``usual``, or now and then (``percent``) one of ``odd`` (what libvirt refuses or
    rarely sees)."""
    return pick.one(odd) if pick.chance(percent) else pick.one(usual)


def _target(pick: Picker, bus: str) -> str:
    letters = {"fdc": "ab", "ide": "abcd"}.get(bus, "abcdef")
    base = PREFIX[bus] + _odd(pick, letters, "abcdef")
    odd = pick.number(0, 99)
    if odd == 0:
        return base + "1"                       # a partition as target
    if odd == 1 and bus == "virtio":
        # overlong; on a drive bus a name this long makes libvirt 9.0 add controllers up to
        # its index (one each 7 SCSI units) for ever: see libvirt_oracle.native's guard
        return PREFIX[bus] + "a" * 40
    return base


def _bus(pick: Picker, device: str, q35: bool) -> str:
    bus = _any_bus(pick, device)
    if bus == "ide" and q35 and not pick.chance(10):
        return "sata"                         # q35 has no IDE: now and then tried all the same
    return bus


def _any_bus(pick: Picker, device: str) -> str:
    if device == "floppy":
        return "fdc"
    if device == "lun":
        return pick.one(("scsi", "virtio"))
    if device == "cdrom":
        return pick.one(("sata", "ide", "scsi", "usb"))
    return pick.one(("virtio", "scsi", "sata", "ide", "virtio", "scsi", "usb"))


def _disk(pick: Picker, iothreads: int, orders: bool, q35: bool) -> ET.Element:
    device = pick.one(("disk", "disk", "disk", "cdrom", "floppy", "lun"))
    bus = _bus(pick, device, q35)
    kind = _odd(pick, ("file", "file", "file", "block", "block", "network", "nvme"), ("volume",),
                8)
    if device in ("cdrom", "floppy") and kind not in ("file", "block"):
        kind = "file"
    if device == "lun":
        kind = "block"
    dev = _target(pick, bus)
    fmt = _odd(pick, FORMATS, ODD_FORMATS) if device == "disk" else "raw"
    element = ET.Element("disk", {"type": kind, "device": device})
    element.append(_driver(pick, bus, fmt, iothreads))
    element.append(_source(pick, kind, dev, fmt, device))
    target = ET.SubElement(element, "target", {"dev": dev, "bus": bus})
    if pick.chance(5 if bus in ("scsi", "sata", "ide") and device == "disk" else 1):
        target.set("rotation_rate", pick.one(("1", "7200")))
    if pick.chance(8 if bus == "usb" else 2 if bus == "scsi" else 0):
        target.set("removable", pick.one(("on", "off")))
    if fmt == "qcow2" and kind == "file" and pick.chance(15):
        element.append(_backing(pick, dev, pick.number(1, 2)))
    _extras(pick, element, device, bus, fmt, orders)
    return element


def _driver(pick: Picker, bus: str, fmt: str, iothreads: int) -> ET.Element:
    attrs = {"name": "qemu", "type": fmt}
    for key, options, odd in (("cache", CACHES, CACHES),
                              ("io", ("native", "threads", "io_uring"), ("default",)),
                              ("discard", ("unmap", "ignore"), ("default",)),
                              ("detect_zeroes", ("on", "off", "unmap"), ("default",)),
                              ("error_policy", ("stop", "report", "ignore", "enospace"),
                               ("default",)),
                              ("rerror_policy", ("stop", "report", "ignore"), ("enospace",))):
        value = _odd(pick, options, odd) if pick.chance(30) else None
        if value is not None:
            attrs[key] = value
    if attrs.get("io") == "native" and attrs.get("cache") not in ("none", "directsync"):
        cache = _odd(pick, ("none", "directsync"), (attrs.get("cache"),), 5)
        if cache is not None:
            attrs["cache"] = cache
    if bus == "virtio":
        if iothreads and pick.chance(40):
            attrs["iothread"] = str(pick.number(1, iothreads))
        if pick.chance(20):
            attrs["queues"] = str(pick.number(1, 4))
        if pick.chance(10):
            attrs["queue_size"] = pick.one(("256", "1024"))
    if pick.chance(2):
        attrs["copy_on_read"] = "on"
    driver = ET.Element("driver", attrs)
    if fmt == "qcow2" and pick.chance(15):
        cache = ET.SubElement(driver, "metadata_cache")
        ET.SubElement(cache, "max_size", {"unit": "KiB"}).text = str(pick.one((512, 4096)))
    if bus == "virtio" and iothreads > 1 and "iothread" not in attrs and pick.chance(30):
        threads = ET.SubElement(driver, "iothreads")
        for ident in range(1, iothreads + 1):
            ET.SubElement(threads, "iothread", {"id": str(ident)})
    return driver


def _source(pick: Picker, kind: str, dev: str, fmt: str, device: str) -> ET.Element:
    if kind == "file":
        source = ET.Element("source", {"file": f"{DIR}/ora-{dev}.{fmt}"})
        if device == "cdrom" and pick.chance(15):
            del source.attrib["file"]            # an empty drive
    elif kind == "block":
        source = ET.Element("source", {"dev": f"{DIR}/dev/ora-{dev}"})
    elif kind == "network":
        protocol = pick.one(("nbd", "rbd", "iscsi", "http"))
        name = {"iscsi": f"iqn.2024-01.invalid:ora-{dev}/1", "http": f"/ora-{dev}.{fmt}"}.get(
            protocol, f"pool/ora-{dev}")
        source = ET.Element("source", {"protocol": protocol, "name": name})
        ET.SubElement(source, "host", {"name": "192.0.2.1"})
    elif kind == "volume":
        source = ET.Element("source", {"pool": "iomatrix-oracle", "volume": f"ora-{dev}"})
    else:
        source = ET.Element("source", {"type": "pci", "managed": "yes", "namespace": "1"})
        ET.SubElement(source, "address", {"domain": "0x0000", "bus": "0x01", "slot": "0x00",
                                          "function": "0x0"})
    if kind == "file" and "file" in source.attrib:
        if fmt == "raw" and pick.chance(8):
            slices = ET.SubElement(source, "slices")
            ET.SubElement(slices, "slice", {"type": "storage", "offset": "1048576",
                                            "size": "4194304"})
        if fmt == "qcow2" and pick.chance(8):
            store = ET.SubElement(source, "dataStore", {"type": "file"})
            ET.SubElement(store, "format", {"type": "raw"})
            ET.SubElement(store, "source", {"file": f"{DIR}/ora-{dev}~data.raw"})
        if pick.chance(4):
            encryption = ET.SubElement(source, "encryption", {"format": "luks"})
            ET.SubElement(encryption, "secret", {"type": "passphrase",
                                                 "uuid": "0a81f5b2-8403-7b23-c8d6-21ccc2f80d6f"})
    return source


def _backing(pick: Picker, dev: str, depth: int) -> ET.Element:
    store = ET.Element("backingStore", {"type": "file"})
    fmt = pick.one(("qcow2", "raw"))
    ET.SubElement(store, "format", {"type": fmt})
    ET.SubElement(store, "source", {"file": f"{DIR}/ora-{dev}~{depth}.{fmt}"})
    if depth > 1 and fmt == "qcow2":
        store.append(_backing(pick, dev, depth - 1))
    return store


def _extras(pick: Picker, element: ET.Element, device: str, bus: str, fmt: str,
            orders: bool) -> None:
    """The elements a disk may carry besides driver, source and target."""
    if device == "disk" and pick.chance(8 if bus in ("virtio", "scsi") else 1):
        ET.SubElement(element, "readonly")
    if pick.chance(5):
        ET.SubElement(element, "shareable")
    if pick.chance(15 if device != "lun" else 1):
        ET.SubElement(element, "serial").text = pick.one(("S1", "with space", "x" * 20))
    if pick.chance(8 if bus == "scsi" and device == "disk" else 1):
        ET.SubElement(element, "vendor").text = "ACME"
        ET.SubElement(element, "product").text = "Disk"
    if pick.chance(5 if bus in ("scsi", "ide") and device == "disk" else 1):
        ET.SubElement(element, "wwn").text = "5000c50015ea71ac"
    if pick.chance(5):
        ET.SubElement(element, "blockio", {"logical_block_size": "4096",
                                           "physical_block_size": "4096"})
    if pick.chance(4):
        iotune = ET.SubElement(element, "iotune")
        ET.SubElement(iotune, "total_iops_sec").text = "1000"
    if orders and pick.chance(60):
        ET.SubElement(element, "boot", {"order": str(pick.number(1, 4))})
    where = pick.number(0, 29)
    if where == 0 and bus in ("scsi", "sata", "ide"):
        ET.SubElement(element, "address", {"type": "drive", "controller": str(pick.number(0, 1)),
                                           "bus": "0", "target": "0",
                                           "unit": str(pick.number(0, 1))})
    elif where == 1 or (where == 2 and bus == "virtio"):
        ET.SubElement(element, "address", {"type": "pci", "domain": "0x0000", "bus": "0x00",
                                           "slot": f"0x{pick.number(8, 12):02x}",
                                           "function": "0x0"})
