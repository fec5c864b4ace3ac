"""libvirt: a domain's ``<disk>`` → the QEMU arguments libvirt generates for it (pure).

The ``-blockdev`` era (libvirt 5.10 on), as libvirt 9.0 (Debian 12's) writes it for QEMU 7.2:
a storage node ``libvirt-N-storage`` (``"auto-read-only":true,"discard":"unmap"``, the aio and
cache) and a format node ``libvirt-N-format`` over it, also for raw (libvirt 10.6 and later drop
the raw layer only with QEMU 9.1's backing-mask support, which QEMU 7.2 lacks); iothreads are
``iothread1`` … ``iothreadN``; ``-object``/``-device`` are JSON. The node and device properties
follow docs/qemu-disk-options.md §2 and published libvirt command lines; key order and PCI
placement (left out) do not change the graph.
"""

from __future__ import annotations

import json
from typing import Any
from xml.etree import ElementTree as ET

from iomatrix.core.model import Frozen

CACHE_FLAGS = {  # cache= → (direct, no-flush, device write-cache)
    "none": (True, False, "on"), "writeback": (False, False, "on"),
    "writethrough": (False, False, "off"), "directsync": (True, False, "off"),
    "unsafe": (False, True, "on")}
SCSI_MODELS = {"virtio-scsi": "virtio-scsi-pci", "lsilogic": "lsi", "megasas": "megasas",
               "vmpvscsi": "pvscsi"}
"""``<controller type='scsi' model=…>`` → QEMU device (formatdomain "Controllers")."""
MODEL_CONTROLLER = {"virtio-scsi": "virtio-scsi", "lsilogic": "lsi", "megasas": "megasas",
                    "vmpvscsi": "pvscsi"}
CONTROLLER_MODEL = {"virtio-scsi": "virtio-scsi", "virtio-scsi-single": "virtio-scsi",
                    "lsi": "lsilogic", "megasas": "megasas", "pvscsi": "vmpvscsi"}
BUS_OF = {"virtio-blk": "virtio", "virtio-scsi": "scsi", "virtio-scsi-single": "scsi",
          "lsi": "scsi", "megasas": "scsi", "pvscsi": "scsi", "sata": "sata", "ide": "ide"}
DRIVER_ATTRS = ("name", "type", "cache", "io", "iothread", "queues", "queue_size", "discard",
                "detect_zeroes")
"""``<driver>`` attributes modelled here; others are named as not reproduced."""


class Disk(Frozen):
    """One ``<disk device='disk'>`` and the controller it sits on."""

    kind: str
    """file or block."""
    source: str
    bus: str
    dev: str
    driver: tuple[tuple[str, str], ...] = ()
    unit: int = 0
    controller_model: str | None = None
    controller_driver: tuple[tuple[str, str], ...] = ()
    unmodelled: tuple[str, ...] = ()

    def get(self, name: str) -> str | None:
        return dict(self.driver).get(name)


class Domain(Frozen):
    name: str
    iothreads: int
    disks: tuple[Disk, ...]
    skipped: tuple[str, ...] = ()


def parse_domain(text: str) -> Domain:
    """``virsh dumpxml`` → its disks (CD-ROMs, floppies and network disks are named in
    ``skipped``). ValueError for text that is not a domain."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise ValueError(f"not well-formed XML: {exc}") from None
    if root.tag != "domain":
        raise ValueError(f"not a libvirt domain: root element <{root.tag}>")
    controllers = {int(c.get("index", "0")): c for c in root.iterfind("./devices/controller")
                   if c.get("type") == "scsi"}
    disks: list[Disk] = []
    skipped: list[str] = []
    for element in root.iterfind("./devices/disk"):
        target = element.find("target")
        dev = target.get("dev", "?") if target is not None else "?"
        kind, device = element.get("type", "file"), element.get("device", "disk")
        source = element.find("source")
        path = None if source is None else source.get("file" if kind == "file" else "dev")
        if device != "disk" or kind not in ("file", "block") or not path or target is None:
            skipped.append(f"{dev}: <disk type='{kind}' device='{device}'> is not modelled")
            continue
        driver = element.find("driver")
        attrs = dict(driver.attrib) if driver is not None else {}
        unmodelled = [f"<driver {k}='{v}'>" for k, v in attrs.items() if k not in DRIVER_ATTRS]
        unmodelled += [f"<{child.tag}>" for child in element
                       if child.tag in ("iotune", "blockio", "serial", "wwn", "geometry")]
        address = element.find("address")
        index = int(address.get("controller", "0")) if address is not None else 0
        unit = int(address.get("unit", "0")) if address is not None else 0
        bus = target.get("bus", "virtio")
        model = controller_driver = None
        if bus == "scsi":
            ctrl = controllers.get(index)
            model = ctrl.get("model", "lsilogic") if ctrl is not None else "lsilogic"
            cdrv = ctrl.find("driver") if ctrl is not None else None
            controller_driver = tuple(sorted(cdrv.attrib.items())) if cdrv is not None else ()
        disks.append(Disk(kind=kind, source=path, bus=bus, dev=dev,
                          driver=tuple(attrs.items()), unit=unit, controller_model=model,
                          controller_driver=controller_driver or (),
                          unmodelled=tuple(unmodelled)))
    threads = root.find("iothreads")
    return Domain(name=root.findtext("name", ""), disks=tuple(disks), skipped=tuple(skipped),
                  iothreads=int(threads.text or "0") if threads is not None else 0)


class DiskArgs(Frozen):
    argv: tuple[str, ...]
    notes: tuple[str, ...] = ()
    iothread: str | None = None


def _json(value: dict[str, Any]) -> str:
    return json.dumps(value, separators=(",", ":"))


def disk_args(disk: Disk, *, iothreads: int = 0, number: int = 1, escape: bool = False,
              size: int | None = None) -> DiskArgs:
    """The arguments libvirt generates for ``disk`` (the ``number``-th blockdev of the domain):
    iothread objects, its controller, storage and format nodes, device."""
    notes: list[str] = []
    objects = []
    for i in range(1, iothreads + 1):
        objects += ["-object", _json({"qom-type": "iothread", "id": f"iothread{i}"})]
    cache = disk.get("cache")
    aio = disk.get("io")
    if aio == "native" and cache not in ("none", "directsync"):
        raise ValueError(f"{disk.dev}: native I/O needs either no disk cache or directsync cache "
                         "mode, QEMU will fallback to aio=threads")
    if cache is not None and cache not in CACHE_FLAGS:
        raise ValueError(f"{disk.dev}: cache mode {cache!r} is not modelled")
    storage_name, format_name = f"libvirt-{number}-storage", f"libvirt-{number}-format"
    path = disk.source.replace(",", ",,") if escape else disk.source
    storage: dict[str, Any] = {"driver": "host_device" if disk.kind == "block" else "file",
                               "filename": path}
    if aio:
        storage["aio"] = aio
    storage["node-name"] = storage_name
    flags = None
    if cache:
        direct, no_flush, _ = CACHE_FLAGS[cache]
        flags = {"direct": direct, "no-flush": no_flush}
        storage["cache"] = flags
    storage |= {"auto-read-only": True, "discard": "unmap"}
    fmt: dict[str, Any] = {"node-name": format_name, "read-only": False}
    if disk.get("discard") == "unmap":
        fmt["discard"] = "unmap"
    zeroes = disk.get("detect_zeroes")
    if zeroes and zeroes != "off":
        # formatdomain: unmap is used only with discard='unmap', otherwise it means on
        fmt["detect-zeroes"] = zeroes if zeroes != "unmap" or disk.get("discard") == "unmap" else "on"
    if flags is not None:
        fmt["cache"] = flags
    fmt |= {"driver": disk.get("type") or "raw", "file": storage_name}
    if size is not None and fmt["driver"] == "raw":
        fmt["size"] = size
    devices: list[str] = []
    iothread = None
    device: dict[str, Any]
    if disk.bus == "virtio":
        device = {"driver": "virtio-blk-pci"}
        if disk.get("iothread"):
            iothread = f"iothread{disk.get('iothread')}"
            device["iothread"] = iothread
        if disk.get("queues"):
            device["num-queues"] = int(disk.get("queues") or 0)
        if disk.get("queue_size"):
            device["queue-size"] = int(disk.get("queue_size") or 0)
        device |= {"drive": format_name, "id": "virtio-disk0"}
    elif disk.bus == "scsi":
        model = disk.controller_model or "lsilogic"
        if model not in SCSI_MODELS:
            raise ValueError(f"{disk.dev}: SCSI controller model {model!r} is not modelled")
        controller: dict[str, Any] = {"driver": SCSI_MODELS[model]}
        cdrv = dict(disk.controller_driver)
        if model == "virtio-scsi":
            if cdrv.get("iothread"):
                iothread = f"iothread{cdrv['iothread']}"
                controller["iothread"] = iothread
            if cdrv.get("queues"):
                controller["num_queues"] = int(cdrv["queues"])
        elif cdrv:
            notes.append(f"{disk.dev}: <controller><driver> on {model} is not reproduced")
        controller["id"] = "scsi0"
        devices += ["-device", _json(controller)]
        device = {"driver": "scsi-hd", "bus": "scsi0.0"}
        if model == "lsilogic":
            device["scsi-id"] = disk.unit
        else:
            device |= {"channel": 0, "scsi-id": 0, "lun": disk.unit}
        device |= {"device_id": f"drive-scsi0-0-0-{disk.unit}", "drive": format_name,
                   "id": f"scsi0-0-0-{disk.unit}"}
    elif disk.bus == "sata":
        devices += ["-device", _json({"driver": "ahci", "id": "sata0"})]
        device = {"driver": "ide-hd", "bus": f"sata0.{disk.unit}", "drive": format_name,
                  "id": f"sata0-0-{disk.unit}"}
    elif disk.bus == "ide":
        device = {"driver": "ide-hd", "bus": "ide.0", "unit": disk.unit, "drive": format_name,
                  "id": f"ide0-0-{disk.unit}"}
    else:
        raise ValueError(f"{disk.dev}: bus {disk.bus!r} is not modelled")
    if disk.bus != "virtio" and disk.get("iothread"):
        raise ValueError(f"{disk.dev}: IOThreads only available for virtio pci and virtio ccw disk")
    if cache:
        device["write-cache"] = CACHE_FLAGS[cache][2]
    devices += ["-blockdev", _json(storage), "-blockdev", _json(fmt), "-device", _json(device)]
    notes += [f"{disk.dev}: {what} is not reproduced by iomatrix" for what in disk.unmodelled]
    return DiskArgs(argv=tuple(objects + devices), notes=tuple(notes), iothread=iothread)


def disk_for(controller: str, *, source: str, block: bool, aio: str | None, cache: str | None,
             iothread: bool, fmt: str = "raw", num_queues: int | None = None,
             queue_size: int | None = None) -> tuple[Disk, int]:
    """The ``<disk>`` (and ``<iothreads>`` count) a libvirt user writes for an iomatrix
    configuration, as :func:`iomatrix.recommend.render.libvirt` renders it."""
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
