"""libvirt: a domain's disks → the QEMU arguments libvirt generates for them (pure).

The ``-blockdev`` era (libvirt 5.10 on), as libvirt's qemu driver builds it (qemu_block.c,
qemu_command.c, qemu_domain.c, qemu_alias.c, conf/domain_conf.c), checked argument by argument
against ``virsh domxml-to-native qemu-argv`` of libvirtd 9.0 (Debian 12, QEMU 7.2) and 11.3
(Debian 13, QEMU 10.0) in tests/test_libvirt.py; PCI placement (``bus``/``addr``) is left out:

* **Disk order.** Each disk joins the disks of its bus, ordered by the index of its target
  name; a disk of a bus not seen yet goes last (virDomainDiskInsert).
* **Node numbers.** libvirt walks the disks from the last to the first and numbers each one,
  CD-ROMs included, an empty drive too (its number names no node: it opens nothing):
  ``libvirt-N-storage`` and, where there is one, ``libvirt-N-format``. A qcow2 image's backing
  chain, which a real start probes, numbers its images too; ``domxml-to-native`` does not.
* **The nodes, by version** (:class:`Versions`). Up to libvirt 10.0 every disk gets a format
  node, also a raw one (qemuBlockStorageSourceNeedsFormatLayer in 10.0.0 skips it only for a
  raw ``<slice>``). From :data:`RAW_LAYER_DROPPED` a raw disk has none when the QEMU has
  ``backing-mask-protocol`` on block-commit/block-stream (QEMU 9.0, :data:`BACKING_MASK_QEMU`):
  the device sits on the storage node, which then carries ``read-only``, discard and
  detect-zeroes itself (libvirt commit 6eaf3614, "Stop using the 'raw' format driver in cases
  when it's not needed"). libvirt 10.0 also reordered the storage node's keys
  (qemuBlockStorageSourceAddBlockdevCommonProps): ``auto-read-only``, ``discard``, then
  ``cache``.
* **Ids.** ``virtio-disk<i>`` from the target name's index; ``<bus><controller>-<bus>-<unit>``
  (and ``-<target>-`` for SCSI but LSI) from the drive address, by default the target name's
  index split as SCSI 7 units a controller, SATA 6, IDE 2 units on 2 buses
  (virDomainDiskDefAssignAddress). A controller a disk names but the XML lacks is added (SCSI:
  lsilogic, QEMU's default on x86); the PIIX IDE of ``pc`` and the SATA of ``q35`` are built in.
* **Devices.** ``bootindex`` from ``<boot order>`` or ``<os><boot dev>`` (default ``hd``): the
  first disk gets the ``hd`` index, the first CD-ROM the ``cdrom`` one
  (qemuProcessPrepareDeviceBootorder); ``write-cache`` where a cache mode is set; ``<serial>``
  (spaces escaped), SCSI's ``device_id`` (the serial, else ``drive-<id>``), ``werror``/``rerror``
  from the error policies. CD-ROMs are ``ide-cd``/``scsi-cd`` and read-only.
"""

from __future__ import annotations

import json
import re
from typing import Any
from xml.etree import ElementTree as ET

from iomatrix.core.model import Frozen
from iomatrix.platform.qemu import defaults as qemu_defaults
from iomatrix.platform.settings import (DiskImage, DiskSettings, GraphShape, Pasted,
                                        PlatformDefault, StorageGraph, disk_kind, image_notes)

Version = tuple[int, int, int]

RAW_LAYER_DROPPED: Version = (10, 1, 0)
"""The first libvirt taken to drop a raw disk's format node. 10.0.0's source keeps it;
11.3.0's drops it (verified against the real daemon). The capability it asks QEMU for,
QEMU_CAPS_BLOCKJOB_BACKING_MASK_PROTOCOL (#455), was added between 10.1.0's #454
(dynamic-memslots) and 10.2.0's #456 (display-reload): a libvirt 10.1 driving QEMU 9.0 or
later is the one pairing this could model wrong."""
BACKING_MASK_QEMU: Version = (9, 0, 0)
"""QEMU's backing-mask-protocol ("since: 9.0" in qapi/block-core.json)."""
PROPS_REORDERED: Version = (10, 0, 0)
"""The storage node's keys in the new order: 10.0.0's source has it, 9.0.0 does not (versions
in between are modelled as 9.0)."""
DEFAULT_LIBVIRT: Version = (11, 3, 0)
"""The libvirt modelled where none is named or installed: Debian 13's."""
DEFAULT_QEMU: Version = (10, 0, 0)
"""The QEMU modelled with it where no QEMU is installed: Debian 13's."""

CACHE_FLAGS = {  # cache= → (direct, no-flush, device write-cache)
    "none": (True, False, "on"), "writeback": (False, False, "on"),
    "writethrough": (False, False, "off"), "directsync": (True, False, "off"),
    "unsafe": (False, True, "on")}
SCSI_MODELS = {"virtio-scsi": "virtio-scsi-pci", "lsilogic": "lsi", "lsisas1068": "mptsas1068",
               "lsisas1078": "megasas", "vmpvscsi": "pvscsi"}
"""``<controller type='scsi' model=…>`` → QEMU device (formatdomain "Controllers")."""
MODEL_CONTROLLER = {"virtio-scsi": "virtio-scsi", "lsilogic": "lsi", "lsisas1078": "megasas",
                    "vmpvscsi": "pvscsi"}
CONTROLLER_MODEL = {"virtio-scsi": "virtio-scsi", "virtio-scsi-single": "virtio-scsi",
                    "lsi": "lsilogic", "megasas": "lsisas1078", "pvscsi": "vmpvscsi"}
BUS_OF = {"virtio-blk": "virtio", "virtio-scsi": "scsi", "virtio-scsi-single": "scsi",
          "lsi": "scsi", "megasas": "scsi", "pvscsi": "scsi", "sata": "sata", "ide": "ide"}
DRIVER_ATTRS = ("name", "type", "cache", "io", "iothread", "queues", "queue_size", "discard",
                "detect_zeroes", "error_policy", "rerror_policy")
"""``<driver>`` attributes modelled here; others are named as not reproduced."""
CONTROLLER_DRIVER_ATTRS = ("iothread", "queues")
MAX_IOTHREADS = 65535
"""The most ``<iothreads>`` iomatrix reads in a domain: it writes an ``-object`` for each."""
UNMODELLED_CHILDREN = ("iotune", "blockio", "wwn", "geometry", "vendor", "product", "shareable",
                       "transient", "encryption", "backingStore", "mirror", "throttlefilters",
                       "slices")
_DISK_NAME = re.compile(r"^(fd|hd|vd|sd|xvd|ubd)([a-z]+)[0-9]*$")
_UNITS = {"scsi": 7, "sata": 6}   # units per controller (SCSI: libvirt's narrow bus)


def parse_version(text: str) -> Version:
    """The first ``X.Y[.Z]`` in ``text`` (``virsh version``, ``qemu-system-x86_64 --version``,
    a suite's ``"11.3"``). ValueError when there is none."""
    found = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    if found is None:
        raise ValueError(f"no version number in {text!r}")
    return int(found[1]), int(found[2]), int(found[3] or 0)


def shown(version: Version) -> str:
    return ".".join(map(str, version))


class Versions(Frozen):
    """The libvirt and the QEMU it drives: together they decide a disk's nodes."""

    libvirt: Version = DEFAULT_LIBVIRT
    qemu: Version = DEFAULT_QEMU

    @property
    def raw_format_node(self) -> bool:
        """Whether a raw disk gets a format node over its storage node."""
        return self.libvirt < RAW_LAYER_DROPPED or self.qemu < BACKING_MASK_QEMU

    @property
    def label(self) -> str:
        return f"libvirt {shown(self.libvirt)} with QEMU {shown(self.qemu)}"


def has_format_node(fmt: str, versions: Versions, *, sliced: bool = False) -> bool:
    """Whether a disk of this format gets a format node (``sliced``: iomatrix's test area on a
    block device, a raw ``<slice>``, whose slice node then plays that part)."""
    return fmt != "raw" or versions.raw_format_node or sliced


def disk_index(dev: str) -> int:
    """virDiskNameToIndex: ``sda`` → 0, ``hdz`` → 25, ``vdaa`` → 26; -1 for another name."""
    found = _DISK_NAME.match(dev)
    if found is None:
        return -1
    index = -1
    for letter in found[2]:
        index = (index + 1) * 26 + ord(letter) - ord("a")
    return index


class Controller(Frozen):
    """One ``<controller>`` a disk sits on (added when the XML names it only by a disk's
    address)."""

    type: str
    """scsi, sata or ide."""
    index: int = 0
    model: str | None = None
    """SCSI: libvirt's model name (lsilogic, virtio-scsi, ...)."""
    driver: tuple[tuple[str, str], ...] = ()


class Disk(Frozen):
    """One ``<disk>`` (a disk or a CD-ROM) and the controller it sits on."""

    kind: str
    """file or block."""
    source: str
    """The image; empty for a CD-ROM drive without a medium."""
    bus: str
    dev: str
    device: str = "disk"
    """disk or cdrom."""
    driver: tuple[tuple[str, str], ...] = ()
    address: tuple[int, int, int, int] = (0, 0, 0, 0)
    """The drive address: controller, bus, target, unit (from the target name by default)."""
    readonly: bool = False
    serial: str | None = None
    boot: int | None = None
    """``<boot order=…>``."""
    controller_model: str | None = None
    controller_driver: tuple[tuple[str, str], ...] = ()
    unmodelled: tuple[str, ...] = ()

    def get(self, name: str) -> str | None:
        return dict(self.driver).get(name)


class Domain(Frozen):
    name: str = ""
    iothreads: int = 0
    disks: tuple[Disk, ...]
    """In libvirt's order."""
    controllers: tuple[Controller, ...] = ()
    """Those the disks sit on that QEMU gets as devices, in libvirt's order (SCSI, IDE, SATA;
    by index)."""
    machine: str = "pc"
    boot: tuple[str, ...] = ("hd",)
    """``<os><boot dev=…>`` in order (none when the devices carry ``<boot order>``)."""
    skipped: tuple[str, ...] = ()


def parse_domain(text: str) -> Domain:
    """``virsh dumpxml`` → its disks and CD-ROMs on virtio, SCSI, SATA and IDE (floppies, LUNs,
    network and other disks are named in ``skipped``). ValueError for text that is not a
    domain."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise ValueError(f"not well-formed XML: {exc}") from None
    if root.tag != "domain":
        raise ValueError(f"not a libvirt domain: root element <{root.tag}>")
    written = {(c.get("type", ""), int(c.get("index", "0"))): c
               for c in root.iterfind("./devices/controller")}
    disks: list[Disk] = []
    skipped: list[str] = []
    for element in root.iterfind("./devices/disk"):
        disk = _disk(element, skipped)
        if disk is not None:
            _insert(disks, disk)
    machine = root.find("./os/type")
    machine_name = (machine.get("machine", "pc") if machine is not None else "pc") or "pc"
    controllers = _controllers(disks, written)
    models = {c.index: c for c in controllers if c.type == "scsi"}
    disks = [d.model_copy(update={"controller_model": models[d.address[0]].model,
                                  "controller_driver": models[d.address[0]].driver})
             if d.bus == "scsi" else d for d in disks]
    boot = tuple(b.get("dev", "") for b in root.iterfind("./os/boot"))
    if not boot and all(d.boot is None for d in disks):
        boot = ("hd",)                       # virDomainDefBootOrderPostParse
    threads = root.find("iothreads")
    iothreads = int(threads.text or "0") if threads is not None else 0
    if not 0 <= iothreads <= MAX_IOTHREADS:
        raise ValueError(f"<iothreads>{iothreads}</iothreads>: iomatrix reads 0 to "
                         f"{MAX_IOTHREADS}")
    return Domain(name=root.findtext("name", ""), disks=tuple(disks), skipped=tuple(skipped),
                  iothreads=iothreads,
                  controllers=tuple(c for c in controllers if not _builtin(c, machine_name)),
                  machine=machine_name, boot=boot)


def _disk(element: ET.Element, skipped: list[str]) -> Disk | None:
    target = element.find("target")
    dev = target.get("dev", "?") if target is not None else "?"
    kind, device = element.get("type", "file"), element.get("device", "disk")
    bus = target.get("bus", "virtio") if target is not None else "?"
    source = element.find("source")
    path = "" if source is None else source.get("file" if kind == "file" else "dev", "")
    why = None
    if kind not in ("file", "block"):
        why = f"<disk type='{kind}'> is not modelled"
    elif device not in ("disk", "cdrom"):
        why = f"<disk device='{device}'> is not modelled"
    elif bus not in ("virtio", "scsi", "sata", "ide"):
        why = f"bus {bus!r} is not modelled"
    elif not path and device == "disk":
        why = "a disk without a source is not modelled"
    address = element.find("address")
    if why is None and (address is None or address.get("type") != "drive") and bus != "virtio" \
            and disk_index(dev) < 0:
        why = "a target name libvirt cannot place without an <address>"
    if why is not None:
        skipped.append(f"{dev}: {why}")
        return None
    driver = element.find("driver")
    attrs = dict(driver.attrib) if driver is not None else {}
    unmodelled = [f"<driver {k}='{v}'>" for k, v in attrs.items() if k not in DRIVER_ATTRS]
    unmodelled += [f"<{child.tag}>" for child in element if child.tag in UNMODELLED_CHILDREN]
    if driver is not None and driver.find("iothreads") is not None:
        unmodelled.append("<driver><iothreads>")
    boot = element.find("boot")
    return Disk(kind=kind, source=path, bus=bus, dev=dev, device=device,
                driver=tuple(attrs.items()), address=_address(bus, dev, address),
                readonly=device == "cdrom" or element.find("readonly") is not None,
                serial=element.findtext("serial"), unmodelled=tuple(unmodelled),
                boot=int(boot.get("order", "0")) if boot is not None else None)


def _address(bus: str, dev: str, element: ET.Element | None) -> tuple[int, int, int, int]:
    if element is not None and element.get("type") == "drive":
        return (int(element.get("controller", "0")), int(element.get("bus", "0")),
                int(element.get("target", "0")), int(element.get("unit", "0")))
    index = disk_index(dev)
    if bus == "ide":
        return index // 4, index % 4 // 2, 0, index % 2
    if bus in _UNITS:
        return index // _UNITS[bus], 0, 0, index % _UNITS[bus]
    return 0, 0, 0, 0


def _insert(disks: list[Disk], disk: Disk) -> None:
    """virDomainDiskInsert: after the last disk of the same bus, before the first of them
    whose target name sorts after it."""
    at = None
    for i in range(len(disks) - 1, -1, -1):
        if disks[i].bus != disk.bus:
            continue
        if disk_index(disks[i].dev) > disk_index(disk.dev):
            at = i
        elif at is None:
            at = i + 1
    disks.insert(len(disks) if at is None else at, disk)


def _controllers(disks: list[Disk],
                 written: dict[tuple[str, int], ET.Element]) -> list[Controller]:
    """The SCSI, IDE and SATA controllers as written, and those the disks name that libvirt
    adds, in the order libvirt gives them to QEMU."""
    wanted = {(d.bus, d.address[0]) for d in disks if d.bus != "virtio"}
    wanted |= {key for key in written if key[0] in ("scsi", "ide", "sata")}
    wanted = sorted(wanted, key=lambda k: (("scsi", "ide", "sata").index(k[0]), k[1]))
    out = []
    for bus, index in wanted:
        element = written.get((bus, index))
        model = driver = None
        if bus == "scsi":
            model = element.get("model") if element is not None else None
            model = model or "lsilogic"
            cdrv = element.find("driver") if element is not None else None
            driver = tuple(sorted(cdrv.attrib.items())) if cdrv is not None else ()
        out.append(Controller(type=bus, index=index, model=model, driver=driver or ()))
    return out


def _builtin(controller: Controller, machine: str) -> bool:
    """The PIIX IDE of pc machines and the SATA of q35: never on the command line."""
    q35 = "q35" in machine
    return controller.index == 0 and controller.type == ("sata" if q35 else "ide")


# -- the arguments ------------------------------------------------------------------------------

class DiskArgs(Frozen):
    argv: tuple[str, ...]
    notes: tuple[str, ...] = ()


class DomainArgs(Frozen):
    """The iothread objects and controllers (once for the domain) and each disk's nodes and
    device, in libvirt's order."""

    objects: tuple[str, ...] = ()
    controllers: tuple[str, ...] = ()
    disks: tuple[DiskArgs, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def argv(self) -> tuple[str, ...]:
        return self.objects + self.controllers + sum((d.argv for d in self.disks), ())


def _json(value: dict[str, Any]) -> str:
    return json.dumps(value, separators=(",", ":"))


def domain_args(domain: Domain, versions: Versions, *, size: int | None = None) -> DomainArgs:
    """The arguments libvirt at ``versions`` generates for the domain's disks. A disk whose
    settings libvirt refuses gets no arguments and the refusal as its note. ``size`` (bytes):
    iomatrix's test area on a block device, a raw ``<slice>`` (iomatrix's own use)."""
    objects: list[str] = []
    for i in range(1, domain.iothreads + 1):
        objects += ["-object", _json({"qom-type": "iothread", "id": f"iothread{i}"})]
    controllers: list[str] = []
    notes: list[str] = []
    for controller in domain.controllers:
        argv, note = _controller_args(controller)
        controllers += argv
        notes += note
    boot = _boot_indexes(domain)
    numbers = {i: len(domain.disks) - i for i in range(len(domain.disks))}
    scsi = {c.index: c for c in domain.controllers if c.type == "scsi"}
    disks = []
    for i, disk in enumerate(domain.disks):
        try:
            disks.append(_disk_args(disk, domain, versions, number=numbers[i],
                                    bootindex=boot[i], scsi=scsi, size=size))
        except ValueError as exc:
            disks.append(DiskArgs(argv=(), notes=(str(exc),)))
    return DomainArgs(objects=tuple(objects), controllers=tuple(controllers), disks=tuple(disks),
                      notes=tuple(notes))


def _controller_args(controller: Controller) -> tuple[list[str], list[str]]:
    ident = f"{controller.type}{controller.index}"
    if controller.type == "sata":
        return ["-device", _json({"driver": "ahci", "id": ident})], []
    if controller.type != "scsi" or controller.model not in SCSI_MODELS:
        return [], [f"{ident}: controller {controller.model or controller.type} is not modelled"]
    props: dict[str, Any] = {"driver": SCSI_MODELS[controller.model]}
    cdrv = dict(controller.driver)
    notes = [f"{ident}: <controller><driver {k}='{v}'> is not reproduced by iomatrix"
             for k, v in cdrv.items() if k not in CONTROLLER_DRIVER_ATTRS]
    if controller.model == "virtio-scsi":
        if cdrv.get("iothread"):
            props["iothread"] = f"iothread{cdrv['iothread']}"
        props["id"] = ident
        if cdrv.get("queues"):
            props["num_queues"] = int(cdrv["queues"])
    else:
        props["id"] = ident
        notes += [f"{ident}: <controller><driver {k}=…> on {controller.model} is not reproduced"
                  for k in cdrv if k in CONTROLLER_DRIVER_ATTRS]
    return ["-device", _json(props)], notes


def _boot_indexes(domain: Domain) -> list[int | None]:
    """qemuProcessPrepareDeviceBootorder: the first disk takes hd's place in <os><boot>, the
    first CD-ROM cdrom's; <boot order> where the devices carry it."""
    if not domain.boot:
        return [d.boot for d in domain.disks]
    places = {dev: i + 1 for i, dev in enumerate(domain.boot)}
    out: list[int | None] = []
    for disk in domain.disks:
        key = "cdrom" if disk.device == "cdrom" else "hd"
        out.append(places.pop(key, None))
    return out


def _disk_args(disk: Disk, domain: Domain, versions: Versions, *, number: int,
               bootindex: int | None, scsi: dict[int, Controller],
               size: int | None) -> DiskArgs:
    notes = [f"{disk.dev}: {what} is not reproduced by iomatrix" for what in disk.unmodelled]
    cache, aio = disk.get("cache"), disk.get("io")
    if aio == "native" and cache not in ("none", "directsync"):
        raise ValueError(f"{disk.dev}: native I/O needs either no disk cache or directsync cache "
                         "mode, QEMU will fallback to aio=threads")
    if cache is not None and cache not in CACHE_FLAGS:
        raise ValueError(f"{disk.dev}: cache mode {cache!r} is not modelled")
    if disk.bus != "virtio" and disk.get("iothread"):
        raise ValueError(f"{disk.dev}: IOThreads only available for virtio pci and virtio ccw disk")
    argv: list[str] = []
    top = None
    if disk.source:
        nodes = _nodes(disk, versions, number, size)
        top = json.loads(nodes[-1])["node-name"]
        for node in nodes:
            argv += ["-blockdev", node]
    argv += ["-device", _json(_device(disk, domain, scsi, drive=top, bootindex=bootindex))]
    return DiskArgs(argv=tuple(argv), notes=tuple(notes))


def _nodes(disk: Disk, versions: Versions, number: int, size: int | None) -> list[str]:
    """The disk's -blockdev values, bottom up."""
    cache = disk.get("cache")
    flags = None if cache is None else {"direct": CACHE_FLAGS[cache][0],
                                        "no-flush": CACHE_FLAGS[cache][1]}
    fmt = disk.get("type") or "raw"
    discard = disk.get("discard")
    zeroes = disk.get("detect_zeroes")
    if zeroes == "unmap" and discard != "unmap":
        zeroes = "on"        # virDomainDiskGetDetectZeroesMode
    storage_name = f"libvirt-{number}-storage"
    driver = {"block": "host_cdrom" if disk.device == "cdrom" else "host_device"}.get(disk.kind,
                                                                                       "file")
    storage: dict[str, Any] = {"driver": driver, "filename": disk.source}
    if disk.get("io"):
        storage["aio"] = disk.get("io")
    storage["node-name"] = storage_name
    effective: dict[str, Any] = {"read-only": disk.readonly}   # the node the device sits on
    if discard:
        effective["discard"] = discard
    if zeroes:
        effective["detect-zeroes"] = zeroes
    if flags is not None:
        effective["cache"] = flags
    below: dict[str, Any] = {"auto-read-only": True, "discard": "unmap"}
    if flags is not None:
        below = ({"cache": flags} | below if versions.libvirt < PROPS_REORDERED
                 else below | {"cache": flags})
    if fmt == "raw" and size is not None and versions.libvirt >= PROPS_REORDERED:
        # raw with a <slice>: the slice node is the disk's top (qemu_block.c 10.0 on)
        sliced = {"driver": "raw", "file": storage_name, "offset": 0, "size": size,
                  "node-name": f"libvirt-{number}-slice-sto"} | effective
        return [_json(storage | below), _json(sliced)]
    if fmt == "raw" and not versions.raw_format_node:
        return [_json(storage | effective)]
    node = {"node-name": f"libvirt-{number}-format"} | effective
    node |= {"driver": fmt, "file": storage_name}
    if size is not None and fmt == "raw":
        node["size"] = size
    return [_json(storage | below), _json(node)]


def _device(disk: Disk, domain: Domain, scsi: dict[int, Controller], *, drive: str | None,
            bootindex: int | None) -> dict[str, Any]:
    """qemuBuildDiskDeviceProps, key by key (PCI placement left out)."""
    controller, bus, target, unit = disk.address
    cd = disk.device == "cdrom"
    props: dict[str, Any]
    device_id = None
    if disk.bus == "virtio":
        ident = f"virtio-disk{disk_index(disk.dev)}"
        props = {"driver": "virtio-blk-pci"}
        if disk.get("iothread"):
            props["iothread"] = f"iothread{disk.get('iothread')}"
        if disk.get("queues"):
            props["num-queues"] = int(disk.get("queues") or 0)
        if disk.get("queue_size"):
            props["queue-size"] = int(disk.get("queue_size") or 0)
    elif disk.bus == "scsi":
        model = scsi[controller].model if controller in scsi else "lsilogic"
        if model not in SCSI_MODELS:
            raise ValueError(f"{disk.dev}: SCSI controller model {model!r} is not modelled")
        props = {"driver": "scsi-cd" if cd else "scsi-hd"}
        if model == "lsilogic":
            ident = f"scsi{controller}-{bus}-{unit}"
            props |= {"bus": f"scsi{controller}.{bus}", "scsi-id": unit}
        else:
            ident = f"scsi{controller}-{bus}-{target}-{unit}"
            props |= {"bus": f"scsi{controller}.0", "channel": bus, "scsi-id": target,
                      "lun": unit}
        device_id = disk.serial if disk.serial is not None else f"drive-{ident}"
    else:
        props = {"driver": "ide-cd" if cd else "ide-hd"}
        if disk.bus == "sata":
            ident = f"sata{controller}-{bus}-{unit}"
            alias = "ide" if "q35" in domain.machine and controller == 0 else f"sata{controller}"
            props["bus"] = f"{alias}.{unit}"
        else:
            ident = f"ide{controller}-{bus}-{unit}"
            props |= {"bus": f"ide.{bus}", "unit": unit}
    if device_id is not None:
        props["device_id"] = device_id
    if drive is not None:
        props["drive"] = drive
    props["id"] = ident
    if bootindex:
        props["bootindex"] = bootindex
    if disk.get("cache"):
        props["write-cache"] = CACHE_FLAGS[str(disk.get("cache"))][2]
    if disk.serial is not None:
        props["serial"] = disk.serial.replace(" ", "\\ ")
    werror, rerror = disk.get("error_policy"), disk.get("rerror_policy")
    if werror == "enospace":          # qemuBuildDiskGetErrorPolicy
        werror = "enospc"
    elif rerror is None:
        rerror = werror
    if werror:
        props["werror"] = werror
    if rerror:
        props["rerror"] = rerror
    return props


def disk_args(disk: Disk, versions: Versions, *, iothreads: int = 0,
              size: int | None = None) -> DiskArgs:
    """The arguments libvirt at ``versions`` generates for a domain of this one disk: iothread
    objects, its controller, nodes and device. ValueError for settings libvirt refuses."""
    domain = one_disk_domain(disk, iothreads)
    out = domain_args(domain, versions, size=size)
    if not out.disks[0].argv:
        raise ValueError(out.disks[0].notes[0])
    return DiskArgs(argv=out.argv, notes=out.notes + out.disks[0].notes)


def one_disk_domain(disk: Disk, iothreads: int = 0) -> Domain:
    """A domain of this disk alone: its controller, no ``<os><boot>`` (so ``hd``)."""
    controllers = []
    if disk.bus == "scsi":
        controllers.append(Controller(type="scsi", model=disk.controller_model or "lsilogic",
                                      driver=disk.controller_driver))
    elif disk.bus == "sata":
        controllers.append(Controller(type="sata"))
    return Domain(disks=(disk,), controllers=tuple(controllers), iothreads=iothreads)


TITLE = "libvirt"
PLACEHOLDER_IMAGE = "/var/lib/libvirt/images/disk"
"""The image path recommend shows without ``--image`` (plus ``.raw``/``.qcow2``)."""
GRAPH_DIFFERENCE = ("libvirt names its nodes libvirt-N-storage (auto-read-only, discard=unmap) and "
                    "libvirt-N-format over it, which libvirt 10.1 and later leave out for raw "
                    "disks on QEMU 9.0 and later, and its own device and iothread ids")
"""How libvirt's block graph differs from iomatrix's own (plain QEMU's)."""
NAMES = {"controller": "<target bus=> / <controller model=>",
         "aio": "<driver io=>", "iothread": "<iothreads> + iothread=",
         "cache": "<driver cache=>", "format": "<driver type=>",
         "preallocation": "preallocation (image creation)",
         "num_queues": "queues=", "queue_size": "queue_size="}
"""Each parameter as libvirt's domain XML names it."""


def defaults(*, storage: str = "other",
             settings: dict[str, str] | None = None) -> dict[str, PlatformDefault]:
    """Every parameter's default when the domain XML sets nothing: QEMU's."""
    return qemu_defaults(where="XML", fmt="type=")


UNEXPRESSIBLE = {("controller", "nvme"): "the reference documents no libvirt mapping for an "
                                         "NVMe disk"}
"""(axis, level) recommend cannot tell libvirt to use, and why."""


def refusal(settings: DiskSettings) -> str | None:
    """Why iomatrix cannot give a guest ``settings`` as libvirt would, or None."""
    kind = disk_kind(settings)
    if kind in ("nvme", "vhost-user-blk"):
        return f"iomatrix does not model libvirt's {kind} disks"
    if settings.queue_size and kind != "virtio-blk":
        return "libvirt has a queue_size only for virtio-blk disks (<driver queue_size=>)"
    return None


def disk_for(controller: str, *, source: str, block: bool, aio: str | None, cache: str | None,
             iothread: bool, fmt: str = "raw", num_queues: int | None = None,
             queue_size: int | None = None) -> tuple[Disk, int]:
    """The ``<disk>`` (and ``<iothreads>`` count) a libvirt user writes for an iomatrix
    configuration (:func:`disk_xml` writes it out)."""
    if controller not in BUS_OF:
        raise ValueError(f"iomatrix does not model libvirt's {controller} disks")
    bus = BUS_OF[controller]
    driver = {"name": "qemu", "type": fmt}
    if cache:
        driver["cache"] = cache
    if aio:
        driver["io"] = aio
    cdrv: dict[str, str] = {}
    if bus == "virtio":
        if iothread:
            driver["iothread"] = "1"
        if num_queues:
            driver["queues"] = str(num_queues)
        if queue_size:
            driver["queue_size"] = str(queue_size)
    elif controller in ("virtio-scsi", "virtio-scsi-single"):
        if iothread:
            cdrv["iothread"] = "1"
        if num_queues:
            cdrv["queues"] = str(num_queues)
    dev = {"virtio": "vda", "scsi": "sda", "sata": "sda", "ide": "hda"}[bus]
    return Disk(kind="block" if block else "file", source=source, bus=bus, dev=dev,
                driver=tuple(driver.items()), controller_model=CONTROLLER_MODEL.get(controller),
                controller_driver=tuple(sorted(cdrv.items()))), 1 if iothread else 0


def disk_xml(disk: Disk, iothreads: int = 0) -> list[tuple[str, ET.Element]]:
    """The XML a libvirt user writes for a disk of :func:`disk_for`, as (where it goes, element):
    ``<iothreads>`` in ``<domain>``, then in ``<devices>`` its ``<controller>`` (SCSI, with the
    ``<driver>`` its disks share; SATA) and the ``<disk>``. recommend prints these; the
    libvirt driver builds its domains from them."""
    out = []
    if iothreads:
        threads = ET.Element("iothreads")
        threads.text = str(iothreads)
        out.append(("<domain>", threads))
    if disk.bus == "scsi":
        controller = ET.Element("controller", {"type": "scsi", "index": "0",
                                               "model": disk.controller_model or "lsilogic"})
        if disk.controller_driver:
            ET.SubElement(controller, "driver", dict(disk.controller_driver))
        out.append(("<devices>", controller))
    elif disk.bus == "sata":
        out.append(("<devices>", ET.Element("controller", {"type": "sata", "index": "0"})))
    element = ET.Element("disk", {"type": disk.kind, "device": disk.device})
    ET.SubElement(element, "driver", dict(disk.driver))
    ET.SubElement(element, "source", {"dev" if disk.kind == "block" else "file": disk.source})
    ET.SubElement(element, "target", {"dev": disk.dev, "bus": disk.bus})
    out.append(("<devices>", element))
    return out


def pasted(settings: DiskSettings, *, image: str | None = None, **_: str) -> Pasted:
    """What a libvirt user pastes for ``settings`` (on ``image``, by default
    :data:`PLACEHOLDER_IMAGE`), as (where it goes, XML text) pairs: the ``<iothreads>`` (in
    ``<domain>``), the ``<controller>`` a SCSI or SATA disk needs and the ``<disk>`` with its
    ``<driver name='qemu' type= cache= io= [iothread= queues= queue_size=]/>`` (in
    ``<devices>``), as :func:`disk_xml` builds them; and notes on what libvirt cannot say. An
    iothread goes on the disk's driver for virtio-blk and on the controller's driver for
    virtio-scsi, whose disks share it; queues likewise."""
    path = image or f"{PLACEHOLDER_IMAGE}.{settings.format or 'raw'}"
    controller = str(settings.controller)
    notes: list[str] = []
    if controller in ("virtio-scsi", "virtio-scsi-single") and settings.queue_size:
        notes.append(f"queue_size={settings.queue_size} left out: the reference documents no "
                     "virtqueue size for libvirt's virtio-scsi controller")
    if controller == "virtio-scsi-single":
        notes.append("libvirt has no virtio-scsi-single model: give each disk its own "
                     "virtio-scsi controller (and its own iothread); for one disk this is it")
    disk, threads = disk_for(controller, source=path, block=path.startswith("/dev/"),
                             aio=settings.aio or "threads", cache=settings.cache or "writeback",
                             iothread=bool(settings.iothread), fmt=settings.format or "raw",
                             num_queues=settings.num_queues, queue_size=settings.queue_size)
    fragments = [(where, _text(element)) for where, element in disk_xml(disk, threads)]
    notes += image_notes(settings, "qemu-img or a storage pool volume")
    text = "\n".join(f"<!-- in {where} -->\n{xml}" for where, xml in fragments)
    return Pasted(text=text, notes=tuple(notes), fragments=tuple(fragments))


def _text(element: ET.Element) -> str:
    ET.indent(element, space="  ")
    # libvirt's own documentation quotes attributes with '; ElementTree writes ".
    return ET.tostring(element, encoding="unicode").replace('"', "'").replace(" />", "/>")


def configuration_of(disk: Disk) -> tuple[dict[str, Any], list[str]]:
    """A libvirt disk as iomatrix configuration values, with notes."""
    notes: list[str] = []
    if disk.bus == "scsi":
        controller = MODEL_CONTROLLER.get(disk.controller_model or "lsilogic")
        if controller is None:
            notes.append(f"{disk.dev}: controller model {disk.controller_model} is not one of "
                         "iomatrix's controllers")
        elif controller == "virtio-scsi":
            notes.append(f"{disk.dev}: libvirt has no virtio-scsi-single: one virtio-scsi "
                         "controller per disk is what iomatrix calls virtio-scsi-single")
    else:
        controller = {"virtio": "virtio-blk", "sata": "sata", "ide": "ide"}.get(disk.bus)
    cache = disk.get("cache")
    if cache is None:
        notes.append(f"{disk.dev}: no cache=: QEMU's default, writeback")
    aio = disk.get("io")
    if aio is None:
        notes.append(f"{disk.dev}: no io=: QEMU's default, threads")
    cdrv = dict(disk.controller_driver)
    iothread = bool(disk.get("iothread")) if disk.bus == "virtio" else bool(cdrv.get("iothread"))
    queues = disk.get("queues") if disk.bus == "virtio" else cdrv.get("queues")
    return {"controller": controller, "aio": aio or "threads", "iothread": iothread,
            "cache": cache or "writeback", "format": disk.get("type") or "raw",
            "num_queues": int(queues) if queues else None,
            "queue_size": int(disk.get("queue_size") or 0) or None}, notes


# -- a disk's settings as libvirt gives them to a guest and a storage daemon -------------------

DAEMON_BUS = "virtio-blk"
"""The bus of the ``<disk>`` a daemon's graph is built from: the nodes do not depend on it."""


def guest_disk_argv(settings: DiskSettings, image: DiskImage,
                    version: Versions | None = None) -> list[str]:
    """The disk's arguments libvirt at ``version`` (by default :class:`Versions`' own)
    generates for the ``<disk>`` a user would write for ``settings``. ValueError for what
    libvirt refuses."""
    _local(image)
    disk, threads = disk_for(disk_kind(settings), source=image.path, block=image.is_device,
                             aio=settings.aio, cache=settings.cache,
                             iothread=bool(settings.iothread), fmt=settings.format or "raw",
                             num_queues=settings.num_queues, queue_size=settings.queue_size)
    return list(disk_args(disk, version or Versions(), iothreads=threads, size=image.size).argv)


def _local(image: DiskImage) -> None:
    if image.network is not None:
        raise ValueError(f"libvirt's graph for a {image.network.protocol} volume is not "
                         "modelled: measure it with platform qemu or proxmox")


def storage_graph(settings: DiskSettings, image: DiskImage,
                  version: Versions | None = None) -> StorageGraph:
    """``libvirt-1-storage`` and, where that libvirt gives the disk one, ``libvirt-1-format``
    over it (:func:`disk_args`), the export on the top one."""
    _local(image)
    disk, _ = disk_for(DAEMON_BUS, source=image.path, block=image.is_device, aio=settings.aio,
                       cache=settings.cache, iothread=False, fmt=settings.format or "raw")
    argv = disk_args(disk, version or Versions(), size=image.size).argv
    nodes = tuple(argv[i + 1] for i, a in enumerate(argv) if a == "-blockdev")
    return StorageGraph(blockdevs=nodes, export_node=json.loads(nodes[-1])["node-name"])


def graph_shape(settings: DiskSettings, version: Versions | None = None, *,
                is_device: bool = False) -> GraphShape:
    """A format node unless libvirt leaves it out (a block device's test area is a raw slice
    node, which plays that part: :func:`has_format_node`); libvirt numbers ``<iothreads>``
    from 1."""
    format_node = has_format_node(settings.format or "raw", version or Versions(),
                                  sliced=is_device)
    zeroes = {"protocol": "off", "format": "off"} if format_node else {"protocol": "off"}
    return GraphShape(format_node=format_node, detect_zeroes=zeroes, iothread="iothread1")
