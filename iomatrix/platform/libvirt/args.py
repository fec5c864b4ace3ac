"""The QEMU arguments libvirt's qemu driver generates for a domain's disks (pure; qemu_block.c,
qemu_command.c): iothread objects, controllers, each disk's ``-blockdev`` nodes by version and
its ``-device``."""

from __future__ import annotations

import json
from typing import Any

from iomatrix.core.model import Frozen
from iomatrix.platform.libvirt.domain import (CONTROLLER_DRIVER_ATTRS, Controller, Disk, Domain,
                                              disk_index, one_disk_domain)
from iomatrix.platform.libvirt.elements import numbers
from iomatrix.platform.libvirt.nodes import CACHE_FLAGS, image_nodes
from iomatrix.platform.libvirt.versions import Versions


SCSI_MODELS = {"virtio-scsi": "virtio-scsi-pci", "lsilogic": "lsi", "lsisas1068": "mptsas1068",
               "lsisas1078": "megasas", "vmpvscsi": "pvscsi"}
"""``<controller type='scsi' model=…>`` → QEMU device (formatdomain "Controllers")."""


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
        argv, note = _controller_args(controller, versions)
        controllers += argv
        notes += note
    scsi = {c.index: c for c in domain.controllers if c.type == "scsi"}
    disks = []
    number = numbers(domain.slots, versions.data_store)
    for disk in domain.disks:
        try:
            disks.append(_disk_args(disk, domain, versions, number=number[disk.slot], scsi=scsi,
                                    size=size))
        except ValueError as exc:
            disks.append(DiskArgs(argv=(), notes=(str(exc),)))
    return DomainArgs(objects=tuple(objects), controllers=tuple(controllers), disks=tuple(disks),
                      notes=tuple(notes))


def _controller_args(controller: Controller,
                     versions: Versions) -> tuple[list[str], list[str]]:
    ident = f"{controller.type}{controller.index}"
    if controller.iothread_map:
        refused = (versions.mapping_refusal(scsi=True) if controller.model == "virtio-scsi"
                   else f"<driver><iothreads> on a {controller.model} controller")
        if refused is not None and versions.ignores_mapping(scsi=True):
            controller = controller.model_copy(update={"iothread_map": ()})
        elif refused is not None:
            return [], [f"{ident}: {refused}"]
    if controller.type == "sata":
        return ["-device", _json({"driver": "ahci", "id": ident})], []
    if controller.type != "scsi" or controller.model not in SCSI_MODELS:
        return [], [f"{ident}: controller {controller.model or controller.type} is not modelled"]
    props: dict[str, Any] = {"driver": SCSI_MODELS[controller.model]}
    cdrv = dict(controller.driver)
    notes: list[str] = []     # what else it holds: named on each of its disks
    if controller.model == "virtio-scsi":
        if cdrv.get("iothread"):
            props["iothread"] = f"iothread{cdrv['iothread']}"
        props["id"] = ident
        if cdrv.get("queues"):
            props["num_queues"] = int(cdrv["queues"])
        if controller.iothread_map:
            props["iothread-vq-mapping"] = _mapping(controller.iothread_map)
    else:
        props["id"] = ident
        notes += [f"{ident}: <controller><driver {k}=…> on {controller.model} is not reproduced"
                  for k in cdrv if k in CONTROLLER_DRIVER_ATTRS]
    return ["-device", _json(props)], notes


def _mapping(threads: tuple[tuple[int, tuple[int, ...]], ...]) -> list[dict[str, Any]]:
    """``<iothreads>`` as QEMU's ``iothread-vq-mapping`` (libvirt names IOThread N
    ``iothreadN``)."""
    return [{"iothread": f"iothread{ident}"} | ({"vqs": list(queues)} if queues else {})
            for ident, queues in threads]


def _disk_args(disk: Disk, domain: Domain, versions: Versions, *, number: int,
               scsi: dict[int, Controller], size: int | None) -> DiskArgs:
    notes = [f"{disk.dev}: {what} is not reproduced by iomatrix"
             for what in disk.unmodelled + disk.controller_unmodelled]
    if disk.bus == "scsi" and disk.controller_iothread_map:
        refused = versions.mapping_refusal(scsi=True)
        if refused is not None and versions.ignores_mapping(scsi=True):
            notes.append(f"{disk.dev}: its controller's <driver><iothreads> is ignored: "
                         f"{refused}")
        elif refused is not None:
            raise ValueError(f"{disk.dev}: its controller's {refused}")
    cache, aio = disk.cache, disk.get("io")
    if aio == "native" and cache not in ("none", "directsync"):
        raise ValueError(f"{disk.dev}: native I/O needs either no disk cache or directsync cache "
                         "mode, QEMU will fallback to aio=threads")
    if cache is not None and cache not in CACHE_FLAGS:
        raise ValueError(f"{disk.dev}: cache mode {cache!r} is not modelled")
    if disk.bus != "virtio" and (disk.get("iothread") or disk.iothread_map):
        raise ValueError(f"{disk.dev}: IOThreads only available for virtio pci and virtio ccw disk")
    if disk.iothread_map and versions.ignores_mapping():
        notes.append(f"{disk.dev}: <driver><iothreads> is ignored: {versions.mapping_refusal()}")
        disk = disk.model_copy(update={"iothread_map": ()})
    elif disk.iothread_map:
        _check_mapping(disk, domain, versions)
    argv: list[str] = []
    top = None
    if disk.source:
        nodes = image_nodes(disk, versions, number, size, notes)
        top = json.loads(nodes[-1])["node-name"]
        if disk.get("copy_on_read") == "on":      # a copy-on-read filter over the disk's top
            nodes.append(_json({"driver": "copy-on-read", "node-name": f"libvirt-CoR-{disk.dev}",
                                "file": top, "discard": "unmap"}))
            top = f"libvirt-CoR-{disk.dev}"
        for node in nodes:
            argv += ["-blockdev", node]
    argv += ["-device", _json(_device(disk, domain, scsi, drive=top, notes=notes,
                                       versions=versions))]
    return DiskArgs(argv=tuple(argv), notes=tuple(notes))


def _check_mapping(disk: Disk, domain: Domain, versions: Versions) -> None:
    """What libvirt refuses in a disk's ``<driver><iothreads>`` (domain_validate.c): another
    version's lack of it, ``iothread=`` beside it, an IOThread the domain lacks or named twice,
    a queue mapped twice, left unmapped or beyond ``queues=``."""
    refused = versions.mapping_refusal()
    if refused is not None:
        raise ValueError(f"{disk.dev}: {refused}")
    if disk.get("iothread"):
        raise ValueError(f"{disk.dev}: <driver iothread=> and <driver><iothreads> are mutually "
                         "exclusive")
    ids = [ident for ident, _ in disk.iothread_map]
    if len(set(ids)) != len(ids) or max(ids) > domain.iothreads:
        raise ValueError(f"{disk.dev}: <driver><iothreads> names IOThreads {ids}: each once, "
                         f"from the domain's {domain.iothreads}")
    queues = [q for _, qs in disk.iothread_map for q in qs]
    if not queues:
        return
    count = int(disk.get("queues") or 0)
    if not count or sorted(queues) != list(range(count)) or not all(
            qs for _, qs in disk.iothread_map):
        raise ValueError(f"{disk.dev}: an explicit <iothreads> mapping must give each of the "
                         f"disk's queues= ({count or 'unset'}) to exactly one IOThread, and each "
                         "IOThread at least one queue")


def _device(disk: Disk, domain: Domain, scsi: dict[int, Controller], *, drive: str | None,
            notes: list[str], versions: Versions) -> dict[str, Any]:
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
        if disk.iothread_map:
            props["iothread-vq-mapping"] = _mapping(disk.iothread_map)
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
    extra = dict(disk.device_props)
    if device_id is not None:
        props["device_id"] = device_id
    if "share-rw" in extra:
        props["share-rw"] = True
    if drive is not None:
        props["drive"] = drive
    props["id"] = ident
    if disk.bootindex:
        props["bootindex"] = disk.bootindex
    if "discard_granularity" in extra and not versions.discard_granularity:
        notes.append(f"{disk.dev}: <blockio discard_granularity=> is ignored by "
                     f"{versions.label}")
        del extra["discard_granularity"]
    props |= {k: extra[k] for k in ("logical_block_size", "physical_block_size",
                                    "discard_granularity", "wwn") if k in extra}
    if disk.rotation_rate:
        props["rotation_rate"] = disk.rotation_rate
    props |= {k: extra[k] for k in ("vendor", "product") if k in extra}
    if disk.removable is not None:
        if disk.bus == "scsi" and not cd:
            props["removable"] = disk.removable == "on"
        else:
            notes.append(f"{disk.dev}: <target removable='{disk.removable}'> on a "
                         f"{disk.bus} {disk.device} is not reproduced by iomatrix")
    if disk.cache:
        props["write-cache"] = CACHE_FLAGS[disk.cache][2]
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
    for mapped, scsi in ((disk.iothread_map, False), (disk.controller_iothread_map, True)):
        refused = versions.mapping_refusal(scsi=scsi) if mapped else None
        if refused is not None:      # iomatrix's own disk: never measured without its mapping
            raise ValueError(refused)
    domain = one_disk_domain(disk, iothreads)
    out = domain_args(domain, versions, size=size)
    if not out.disks[0].argv:
        raise ValueError(out.disks[0].notes[0])
    return DiskArgs(argv=out.argv, notes=out.notes + out.disks[0].notes)
