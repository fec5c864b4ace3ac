"""A libvirt domain's XML read (pure; ``virsh dumpxml``): its disks and CD-ROMs in libvirt's
order, their drive addresses, and the controllers libvirt gives QEMU for them
(conf/domain_conf.c)."""

from __future__ import annotations

from xml.etree import ElementTree as ET

from iomatrix.core.model import Frozen
from iomatrix.platform.libvirt.elements import (Image, Slot, backing_chain,
                                                boot_indexes, controller_unmodelled,
                                                data_store, device_props, disk_unmodelled,
                                                metadata_cache, storage_slice)
from iomatrix.platform.libvirt.validate import disk_index, implicit_address, refusal
from iomatrix.platform.libvirt.versions import Versions


DRIVER_ATTRS = ("name", "type", "cache", "io", "iothread", "queues", "queue_size", "discard",
                "detect_zeroes", "error_policy", "rerror_policy", "copy_on_read")
"""``<driver>`` attributes modelled here; others are named as not reproduced."""
CONTROLLER_DRIVER_ATTRS = ("iothread", "queues")
MAX_CONTROLLER = 255
"""The highest drive controller index iomatrix reads: libvirt gives QEMU every controller up to
the highest a disk names (a target name like ``sdzzzzzz`` names controller 44,000,000)."""
MAX_IOTHREADS = 65535
"""The most ``<iothreads>`` iomatrix reads in a domain: it writes an ``-object`` for each."""
UNMODELLED_CHILDREN = ("iotune", "geometry", "transient", "encryption", "mirror",
                       "throttlefilters")
"""Children of ``<disk>`` iomatrix does not render (examples: every child and attribute not
rendered is named, :func:`.elements.disk_unmodelled`)."""


class Controller(Frozen):
    """One ``<controller>`` a disk sits on (added when the XML names it only by a disk's
    address)."""

    type: str
    """scsi, sata or ide."""
    index: int = 0
    model: str | None = None
    """SCSI: libvirt's model name (lsilogic, virtio-scsi, ...)."""
    driver: tuple[tuple[str, str], ...] = ()
    iothread_map: tuple[tuple[int, tuple[int, ...]], ...] = ()
    """virtio-scsi: ``<driver><iothreads>`` (libvirt 11.2, QEMU 10.0), as a disk's."""
    unmodelled: tuple[str, ...] = ()
    """Its attributes and children iomatrix does not render, as ``<controller ports='4'>``."""


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
    controller_iothread_map: tuple[tuple[int, tuple[int, ...]], ...] = ()
    unmodelled: tuple[str, ...] = ()
    iothread_map: tuple[tuple[int, tuple[int, ...]], ...] = ()
    """``<driver><iothreads>``: each ``<iothread id=>`` with the ``<queue id=>`` it serves
    (none: round-robin), in the XML's order (libvirt 10.0, virtio disks only)."""

    slot: int = 0
    """Its place among every disk of the domain (:attr:`Domain.slots`), which libvirt numbers
    (:func:`.elements.numbers`)."""
    bootindex: int | None = None
    """Its ``bootindex``: :func:`.elements.boot_indexes` over every disk of the domain."""
    backing: tuple[Image, ...] = ()
    """``<backingStore>``: the images under it, top down (local ones; others are named in
    ``unmodelled``)."""
    backing_closed: bool = False
    """An empty ``<backingStore/>`` ends the chain: the last image gets ``backing: null``."""
    data_store: Image | None = None
    """``<source><dataStore>``: a qcow2 image's external data file."""
    slice: tuple[int, int] | None = None
    """``<source><slices><slice type='storage'>``: (offset, size)."""
    metadata_cache: int | None = None
    """``<driver><metadata_cache><max_size>`` in bytes: qcow2's ``cache-size``."""
    rotation_rate: int | None = None
    removable: str | None = None
    """``<target rotation_rate= removable=>``."""
    controller_unmodelled: tuple[str, ...] = ()
    """What iomatrix does not render of the controller the disk sits on."""
    device_props: tuple[tuple[str, str | int | bool], ...] = ()
    """``<shareable>``, ``<blockio>``, ``<wwn>``, ``<vendor>``, ``<product>`` as the device's
    keys (:func:`.elements.device_props`)."""

    def get(self, name: str) -> str | None:
        return dict(self.driver).get(name)

    @property
    def cache(self) -> str | None:
        """``<driver cache=>``; ``default`` (the hypervisor's default) is no cache= at all, but
        for a writable ``<shareable/>`` disk, whose default libvirt makes ``none`` (checked on
        9.0's domxml-to-native)."""
        cache = self.get("cache")
        cache = None if cache == "default" else cache
        if cache is None and dict(self.device_props).get("share-rw") and not self.readonly:
            return "none"
        return cache


class CpuTune(Frozen):
    """``<cputune>``: the host CPU sets libvirt pins a domain's threads to (sched_setaffinity
    and cgroups, not QEMU arguments)."""

    vcpupin: tuple[tuple[int, str], ...] = ()
    """(vCPU, cpuset) of each ``<vcpupin>``."""
    iothreadpin: tuple[tuple[int, str], ...] = ()
    """(IOThread id, cpuset) of each ``<iothreadpin>``."""
    emulatorpin: str | None = None
    """``<emulatorpin cpuset=>``: QEMU's main loop and its other threads."""
    vcpus: int = 1
    """``<vcpu>``: how many vCPUs there are."""
    default: str | None = None
    """``<vcpu cpuset=>``: where every thread goes that no pin names."""


class Domain(Frozen):
    name: str = ""
    iothreads: int = 0
    cputune: CpuTune = CpuTune()
    disks: tuple[Disk, ...]
    """In libvirt's order."""
    controllers: tuple[Controller, ...] = ()
    """Those the disks sit on that QEMU gets as devices, in libvirt's order (SCSI, IDE, SATA;
    by index)."""
    machine: str = "pc"
    boot: tuple[str, ...] = ("hd",)
    """``<os><boot dev=…>`` in order (none when the devices carry ``<boot order>``)."""
    skipped: tuple[str, ...] = ()
    slots: tuple[Slot, ...] = ()
    """Every ``<disk>``, rendered or not, in libvirt's order."""


def parse_domain(text: str, versions: Versions | None = None) -> Domain:
    """``virsh dumpxml`` → its disks and CD-ROMs on virtio, SCSI, SATA and IDE (floppies, LUNs,
    network and other disks are named in ``skipped``). ValueError for text that is not a
    domain, or one libvirt refuses (at ``versions``, also what only that version refuses), with
    libvirt's reason."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise ValueError(f"not well-formed XML: {exc}") from None
    if root.tag != "domain":
        raise ValueError(f"not a libvirt domain: root element <{root.tag}>")
    refused = refusal(root, versions)
    if refused is not None:
        raise ValueError(f"libvirt refuses this domain: {refused}")
    written = {(c.get("type", ""), int(c.get("index", "0"))): c
               for c in root.iterfind("./devices/controller")}
    entries: list[tuple[Slot, Disk | None]] = []
    skipped: list[str] = []
    for element in root.iterfind("./devices/disk"):
        _insert(entries, (_slot(element), _disk(element, skipped)))
    slots = [slot for slot, _ in entries]
    boot = tuple(b.get("dev", "") for b in root.iterfind("./os/boot"))
    if not boot and all(s.boot is None for s in slots):
        boot = ("hd",)                       # virDomainDefBootOrderPostParse
    disks = [d.model_copy(update={"slot": i, "bootindex": index})
             for i, ((_, d), index) in enumerate(zip(entries, boot_indexes(slots, boot)))
             if d is not None]
    machine = root.find("./os/type")
    machine_name = (machine.get("machine", "pc") if machine is not None else "pc") or "pc"
    controllers = _controllers(disks, written)
    models = {c.index: c for c in controllers if c.type == "scsi"}
    disks = [d.model_copy(update={"controller_model": models[d.address[0]].model,
                                  "controller_driver": models[d.address[0]].driver,
                                  "controller_iothread_map": models[d.address[0]].iothread_map,
                                  "controller_unmodelled": models[d.address[0]].unmodelled})
             if d.bus == "scsi" else d for d in disks]
    threads = root.find("iothreads")
    iothreads = int(threads.text or "0") if threads is not None else 0
    if not 0 <= iothreads <= MAX_IOTHREADS:
        raise ValueError(f"<iothreads>{iothreads}</iothreads>: iomatrix reads 0 to "
                         f"{MAX_IOTHREADS}")
    return Domain(name=root.findtext("name", ""), disks=tuple(disks), skipped=tuple(skipped),
                  slots=tuple(slots),
                  iothreads=iothreads, cputune=_cputune(root.find("cputune"), root.find("vcpu")),
                  controllers=tuple(c for c in controllers if not _builtin(c, machine_name)),
                  machine=machine_name, boot=boot)


def _slot(element: ET.Element) -> Slot:
    """Any ``<disk>``, as libvirt numbers and boots it."""
    target = element.find("target")
    boot = element.find("boot")
    return Slot(bus=target.get("bus", "virtio") if target is not None else "?",
                dev=target.get("dev", "?") if target is not None else "?",
                device=element.get("device", "disk"), images=1 + backing_chain(element)[0],
                data_store=element.find("./source/dataStore") is not None,
                boot=int(boot.get("order", "0")) if boot is not None else None)


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
    _, chain, unmodelled, closed = backing_chain(element)
    data, more = data_store(element)
    unmodelled += more + disk_unmodelled(element, kind, DRIVER_ATTRS)
    mapping = _iothread_map(driver.find("iothreads") if driver is not None else None, dev)
    boot = element.find("boot")
    rotation = target.get("rotation_rate") if target is not None else None
    return Disk(kind=kind, source=path, bus=bus, dev=dev, device=device,
                driver=tuple(attrs.items()), address=_address(bus, dev, address),
                readonly=device == "cdrom" or element.find("readonly") is not None,
                serial=element.findtext("serial"), unmodelled=tuple(unmodelled),
                iothread_map=mapping, backing=chain, data_store=data, backing_closed=closed,
                slice=storage_slice(element), metadata_cache=metadata_cache(element),
                rotation_rate=_number(rotation, f"{dev}: <target rotation_rate=>")
                if rotation is not None else None,
                removable=target.get("removable") if target is not None else None,
                device_props=device_props(element),
                boot=int(boot.get("order", "0")) if boot is not None else None)


def _number(text: str | None, what: str, low: int = 0) -> int:
    """A non-negative id of the XML (ValueError otherwise: a domain is untrusted input)."""
    if text is None or not text.strip().isdigit() or int(text) < low or int(text) > MAX_IOTHREADS:
        raise ValueError(f"{what}: {text!r} is not a number iomatrix reads ({low} to "
                         f"{MAX_IOTHREADS})")
    return int(text)


def _iothread_map(element: ET.Element | None,
                  dev: str) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """``<driver><iothreads><iothread id='N'><queue id='Q'/>…`` as (N, (Q, …)) pairs."""
    if element is None:
        return ()
    out = []
    for thread in element.iterfind("iothread"):
        ident = _number(thread.get("id"), f"{dev}: <iothread id=>", 1)
        out.append((ident, tuple(_number(q.get("id"), f"{dev}: <queue id=>")
                                 for q in thread.iterfind("queue"))))
    return tuple(out)


def _cputune(element: ET.Element | None, vcpu: ET.Element | None) -> CpuTune:
    count = _number(vcpu.text, "<vcpu>", 1) if vcpu is not None else 1
    default = vcpu.get("cpuset") if vcpu is not None else None
    if element is None:
        return CpuTune(vcpus=count, default=default)
    vcpus = tuple((_number(e.get("vcpu"), "<vcpupin vcpu=>"), e.get("cpuset", ""))
                  for e in element.iterfind("vcpupin"))
    threads = tuple((_number(e.get("iothread"), "<iothreadpin iothread=>", 1),
                     e.get("cpuset", "")) for e in element.iterfind("iothreadpin"))
    emulator = element.find("emulatorpin")
    return CpuTune(vcpupin=vcpus, iothreadpin=threads, vcpus=count, default=default,
                   emulatorpin=emulator.get("cpuset") if emulator is not None else None)


def _address(bus: str, dev: str, element: ET.Element | None) -> tuple[int, int, int, int]:
    """The drive address, given or libvirt's from the target's index. ValueError for a
    controller beyond :data:`MAX_CONTROLLER` (libvirt adds every controller up to it)."""
    if element is not None and element.get("type") == "drive":
        where = tuple(_number(element.get(k, "0"), f"{dev}: <address {k}=>")
                      for k in ("controller", "bus", "target", "unit"))
        address = (where[0], where[1], where[2], where[3])
    else:
        address = implicit_address(bus, dev)
    if address[0] > MAX_CONTROLLER:
        raise ValueError(f"{dev}: on {bus} controller {address[0]}: iomatrix reads controllers "
                         f"0 to {MAX_CONTROLLER} (libvirt adds every one up to a disk's)")
    return address


def _insert(disks: list[tuple[Slot, Disk | None]], disk: tuple[Slot, Disk | None]) -> None:
    """virDomainDiskInsert: after the last disk of the same bus, before the first of them
    whose target name sorts after it (every disk, rendered or not)."""
    at = None
    for i in range(len(disks) - 1, -1, -1):
        if disks[i][0].bus != disk[0].bus:
            continue
        if disk_index(disks[i][0].dev) > disk_index(disk[0].dev):
            at = i
        elif at is None:
            at = i + 1
    disks.insert(len(disks) if at is None else at, disk)


def _controllers(disks: list[Disk],
                 written: dict[tuple[str, int], ET.Element]) -> list[Controller]:
    """The SCSI, IDE and SATA controllers as written, and those the disks name that libvirt
    adds, every index up to the highest a disk names (virDomainDefAddDiskControllersForType:
    a SATA disk on controller 1 brings sata0 too), in the order libvirt gives them to QEMU."""
    wanted = {(d.bus, i) for d in disks if d.bus in ("scsi", "ide", "sata")
              for i in range(d.address[0] + 1)}
    wanted |= {key for key in written if key[0] in ("scsi", "ide", "sata")}
    wanted = sorted(wanted, key=lambda k: (("scsi", "ide", "sata").index(k[0]), k[1]))
    out = []
    for bus, index in wanted:
        element = written.get((bus, index))
        model = driver = None
        mapping: tuple[tuple[int, tuple[int, ...]], ...] = ()
        if bus == "scsi":
            model = element.get("model") if element is not None else None
            model = model or "lsilogic"
            cdrv = element.find("driver") if element is not None else None
            driver = tuple(sorted(cdrv.attrib.items())) if cdrv is not None else ()
            mapping = _iothread_map(cdrv.find("iothreads") if cdrv is not None else None,
                                    f"scsi{index}")
        out.append(Controller(type=bus, index=index, model=model, driver=driver or (),
                              iothread_map=mapping, unmodelled=() if element is None else
                              controller_unmodelled(element, CONTROLLER_DRIVER_ATTRS)))
    return out


def _builtin(controller: Controller, machine: str) -> bool:
    """The PIIX IDE of pc machines and the SATA of q35: never on the command line."""
    q35 = "q35" in machine
    return controller.index == 0 and controller.type == ("sata" if q35 else "ide")


def one_disk_domain(disk: Disk, iothreads: int = 0) -> Domain:
    """A domain of this disk alone: its controller, no ``<os><boot>`` (so ``hd``)."""
    controllers = []
    if disk.bus == "scsi":
        controllers.append(Controller(type="scsi", model=disk.controller_model or "lsilogic",
                                      driver=disk.controller_driver,
                                      iothread_map=disk.controller_iothread_map))
    elif disk.bus == "sata":
        controllers.append(Controller(type="sata"))
    slot = Slot(bus=disk.bus, dev=disk.dev, device=disk.device, images=1 + len(disk.backing),
                data_store=disk.data_store is not None)
    return Domain(disks=(disk.model_copy(update={"slot": 0, "bootindex": (
        1 if disk.device == "disk" else None)}),), controllers=tuple(controllers),
        iothreads=iothreads, slots=(slot,))
