"""libvirt's defaults as recommend compares with them, what iomatrix cannot give a guest as
libvirt would, and the domain XML a user pastes for a disk's settings (pure)."""

from __future__ import annotations

from xml.etree import ElementTree as ET

from iomatrix.core.cpuset import NUMA
from iomatrix.platform.libvirt.domain import Disk
from iomatrix.platform.qemu import defaults as qemu_defaults
from iomatrix.platform.settings import (DiskSettings, Pasted, PlatformDefault, disk_kind,
                                        image_notes)
from iomatrix.vocab.axes import AFFINITY_AXES, vq_groups


MODEL_CONTROLLER = {"virtio-scsi": "virtio-scsi", "lsilogic": "lsi", "lsisas1078": "megasas",
                    "vmpvscsi": "pvscsi"}
CONTROLLER_MODEL = {"virtio-scsi": "virtio-scsi", "virtio-scsi-single": "virtio-scsi",
                    "lsi": "lsilogic", "megasas": "lsisas1078", "pvscsi": "vmpvscsi"}
BUS_OF = {"virtio-blk": "virtio", "virtio-scsi": "scsi", "virtio-scsi-single": "scsi",
          "lsi": "scsi", "megasas": "scsi", "pvscsi": "scsi", "sata": "sata", "ide": "ide"}


NUMA_CPUS = "NUMA-NODE-CPUS"
"""What a pasted ``cpuset`` shows for the level ``numa`` (a placeholder: the disk's node's CPUs
are the host's to read)."""
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
         "num_queues": "queues=", "queue_size": "queue_size=", "discard": "<driver discard=>"}
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
    if settings.iothread and (settings.iothreads or 0) > 1 and kind not in (
            "virtio-blk", "virtio-scsi", "virtio-scsi-single"):
        return (f"libvirt has no IOThread mapping for {kind} (<driver><iothreads> is a virtio "
                "disk's or a virtio-scsi controller's)")
    return None


def disk_for(controller: str, *, source: str, block: bool, aio: str | None, cache: str | None,
             iothread: bool, fmt: str = "raw", num_queues: int | None = None,
             queue_size: int | None = None, discard: str | None = None,
             iothreads: int | None = None,
             vq_groups: tuple[tuple[int, ...], ...] | None = None) -> tuple[Disk, int]:
    """The ``<disk>`` (and ``<iothreads>`` count) a libvirt user writes for an iomatrix
    configuration (:func:`disk_xml` writes it out); ``discard`` is ``<driver discard=>``, whose
    levels are iomatrix's (ignore, unmap). ``iothreads`` (2 or more, with ``iothread``): the
    disk's ``<driver><iothreads>``, IOThreads 1 to N, each with its ``<queue>``s where
    ``vq_groups`` maps them explicitly (virtio-blk only: ValueError on another bus)."""
    if controller not in BUS_OF:
        raise ValueError(f"iomatrix does not model libvirt's {controller} disks")
    bus = BUS_OF[controller]
    several = bool(iothread and iothreads and iothreads > 1)
    scsi = controller in ("virtio-scsi", "virtio-scsi-single")
    if several and bus != "virtio" and not scsi:
        raise ValueError(f"libvirt has no IOThread mapping for {controller} (<driver><iothreads> "
                         "is a virtio disk's or a virtio-scsi controller's)")
    driver = {"name": "qemu", "type": fmt}
    if cache:
        driver["cache"] = cache
    if aio:
        driver["io"] = aio
    if discard:
        driver["discard"] = discard
    cdrv: dict[str, str] = {}
    mapping: tuple[tuple[int, tuple[int, ...]], ...] = ()
    if several:
        assert iothreads is not None
        mapping = tuple((i + 1, tuple(vq_groups[i]) if vq_groups else ())
                        for i in range(iothreads))
    if bus == "virtio":
        if iothread and not several:
            driver["iothread"] = "1"
        if num_queues:
            driver["queues"] = str(num_queues)
        if queue_size:
            driver["queue_size"] = str(queue_size)
    elif scsi:
        if iothread and not several:
            cdrv["iothread"] = "1"
        if num_queues:
            cdrv["queues"] = str(num_queues)
    dev = {"virtio": "vda", "scsi": "sda", "sata": "sda", "ide": "hda"}[bus]
    return Disk(kind="block" if block else "file", source=source, bus=bus, dev=dev,
                driver=tuple(driver.items()), controller_model=CONTROLLER_MODEL.get(controller),
                controller_driver=tuple(sorted(cdrv.items())),
                iothread_map=mapping if bus == "virtio" else (),
                controller_iothread_map=mapping if bus == "scsi" else ()), (
        len(mapping) or (1 if iothread else 0))


def cputune_xml(*, vcpus: int, iothreads: int, vcpu: str | None = None,
                iothread: str | None = None, main: str | None = None) -> ET.Element | None:
    """The ``<cputune>`` (in ``<domain>``) pinning each vCPU to ``vcpu``, each IOThread to
    ``iothread`` and QEMU's main loop (and its other threads) to ``main``: host CPU lists as
    libvirt's cpuset takes them ("0-3,8"); None where nothing is pinned."""
    if not (vcpu or (iothread and iothreads) or main):
        return None
    tune = ET.Element("cputune")
    for index in range(vcpus if vcpu else 0):
        ET.SubElement(tune, "vcpupin", {"vcpu": str(index), "cpuset": str(vcpu)})
    if main:
        ET.SubElement(tune, "emulatorpin", {"cpuset": main})
    for ident in range(1, iothreads + 1 if iothread else 1):
        ET.SubElement(tune, "iothreadpin", {"iothread": str(ident), "cpuset": str(iothread)})
    return tune


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
        if disk.controller_driver or disk.controller_iothread_map:
            cdriver = ET.SubElement(controller, "driver", dict(disk.controller_driver))
            _iothreads_xml(cdriver, disk.controller_iothread_map)
        out.append(("<devices>", controller))
    elif disk.bus == "sata":
        out.append(("<devices>", ET.Element("controller", {"type": "sata", "index": "0"})))
    element = ET.Element("disk", {"type": disk.kind, "device": disk.device})
    _iothreads_xml(ET.SubElement(element, "driver", dict(disk.driver)), disk.iothread_map)
    ET.SubElement(element, "source", {"dev" if disk.kind == "block" else "file": disk.source})
    ET.SubElement(element, "target", {"dev": disk.dev, "bus": disk.bus})
    out.append(("<devices>", element))
    return out


def _iothreads_xml(driver: ET.Element,
                   mapping: tuple[tuple[int, tuple[int, ...]], ...]) -> None:
    """A ``<driver>``'s ``<iothreads>``: each ``<iothread id=>`` with its ``<queue id=>``s."""
    if not mapping:
        return
    threads = ET.SubElement(driver, "iothreads")
    for ident, queues in mapping:
        thread = ET.SubElement(threads, "iothread", {"id": str(ident)})
        for queue in queues:
            ET.SubElement(thread, "queue", {"id": str(queue)})


def pasted(settings: DiskSettings, *, image: str | None = None, **_: str) -> Pasted:
    """What a libvirt user pastes for ``settings`` (on ``image``, by default
    :data:`PLACEHOLDER_IMAGE`), as (where it goes, XML text) pairs: the ``<iothreads>`` (in
    ``<domain>``), the ``<controller>`` a SCSI or SATA disk needs and the ``<disk>`` with its
    ``<driver name='qemu' type= cache= io= [discard= iothread= queues= queue_size=]/>`` (in
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
                             num_queues=settings.num_queues, queue_size=settings.queue_size,
                             discard=settings.discard, iothreads=settings.iothreads,
                             vq_groups=vq_groups(settings.vq_mapping))
    parts = disk_xml(disk, threads)
    pins = {key: getattr(settings, axis, None) for key, axis in
            zip(("vcpu", "iothread", "main"), AFFINITY_AXES)}
    tune = cputune_xml(vcpus=1, iothreads=threads,
                       **{k: NUMA_CPUS if v == NUMA else v for k, v in pins.items()})
    if tune is not None:
        parts.insert(1 if threads else 0, ("<domain>", tune))
        notes.append("<cputune>: libvirt pins the threads (sched_setaffinity, cgroups); "
                     + ("one <vcpupin> per vCPU: write one for each of the VM's"
                        if pins["vcpu"] else "unpinned threads stay where the host puts them"))
    if NUMA in pins.values():
        notes.append(f"{NUMA_CPUS}: the CPU list of the disk's NUMA node "
                     "(/sys/block/DEV/device/numa_node, then "
                     "/sys/devices/system/node/nodeN/cpulist)")
    fragments = [(where, _text(element)) for where, element in parts]
    notes += image_notes(settings, "qemu-img or a storage pool volume")
    text = "\n".join(f"<!-- in {where} -->\n{xml}" for where, xml in fragments)
    return Pasted(text=text, notes=tuple(notes), fragments=tuple(fragments))


def _text(element: ET.Element) -> str:
    ET.indent(element, space="  ")
    # libvirt's own documentation quotes attributes with '; ElementTree writes ".
    return ET.tostring(element, encoding="unicode").replace('"', "'").replace(" />", "/>")
