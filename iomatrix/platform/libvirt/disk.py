"""An iomatrix disk as a libvirt ``<disk>`` and back (pure): the arguments and block graph
libvirt gives it in a guest and in a qemu-storage-daemon, and what a domain's disk amounts to as
iomatrix values."""

from __future__ import annotations

import json

from iomatrix.platform.libvirt.args import disk_args
from iomatrix.platform.libvirt.defaults import MODEL_CONTROLLER, disk_for
from iomatrix.platform.libvirt.domain import CpuTune, Disk
from iomatrix.platform.libvirt.versions import Versions, has_format_node
from iomatrix.platform.settings import DiskImage, DiskSettings, GraphShape, StorageGraph, disk_kind
from iomatrix.platform.values import DiskValues, cpu_list
from iomatrix.vocab.axes import vq_groups


def configuration_of(disk: Disk, cputune: CpuTune | None = None) -> DiskValues:
    """A libvirt disk as iomatrix configuration values, with notes. ``<driver discard=>``:
    unmap or ignore as given; ``default`` or none is libvirt's default (no discard on the
    disk's top node: QEMU's ignore). ValueError for another value, which libvirt refuses
    (virDomainDiskDiscard). ``<driver><iothreads>`` of two or more IOThreads is ``iothreads``
    (and ``vq_mapping`` where it maps queues); the domain's ``<cputune>`` gives the
    affinities (:func:`affinities`)."""
    notes: list[str] = []
    discard = disk.get("discard")
    if discard not in (None, "default", "unmap", "ignore"):
        raise ValueError(f"{disk.dev}: <driver discard='{discard}'>: libvirt takes unmap, "
                         "ignore or default")
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
    cache = disk.cache
    if cache is None:
        notes.append(f"{disk.dev}: no cache= (or cache='default'): QEMU's default, writeback")
    if disk.get("copy_on_read") == "on":
        notes.append(f"{disk.dev}: copy_on_read='on': libvirt puts a copy-on-read filter over "
                     "the disk, which iomatrix's configuration does not: measured without it")
    aio = disk.get("io")
    if aio is None:
        notes.append(f"{disk.dev}: no io=: QEMU's default, threads")
    cdrv = dict(disk.controller_driver)
    thread = disk.get("iothread") if disk.bus == "virtio" else cdrv.get("iothread")
    threads = disk.iothread_map if disk.bus == "virtio" else disk.controller_iothread_map
    ids = [ident for ident, _ in threads] or ([int(thread)] if thread else [])
    queues = disk.get("queues") if disk.bus == "virtio" else cdrv.get("queues")
    mapping = None
    if len(threads) > 1 and any(q for _, q in threads):
        mapping = ":".join(",".join(map(str, q)) for _, q in threads)
    pins = affinities(cputune or CpuTune(), ids, disk.dev)
    return DiskValues(controller=controller, aio=aio or "threads", iothread=bool(ids),
                      cache=cache or "writeback", format=disk.get("type") or "raw",
                      discard=None if discard == "default" else discard,
                      num_queues=int(queues) if queues else None,
                      queue_size=int(disk.get("queue_size") or 0) or None,
                      iothreads=len(ids) if len(ids) > 1 else None, vq_mapping=mapping,
                      vcpu_affinity=pins[0], iothread_affinity=pins[1], main_affinity=pins[2],
                      notes=tuple(notes + list(pins[3])))


def affinities(tune: CpuTune, iothreads: list[int],
               dev: str) -> tuple[str | None, str | None, str | None, tuple[str, ...]]:
    """The vCPU, IOThread (of the disk's ``iothreads``) and main-loop CPU sets of a
    ``<cputune>`` (``<vcpu cpuset=>`` for a thread no pin names), each the one set all its
    threads share, and notes: a set given differently
    for some threads, for some but not all, or not as a plain CPU list ("0-3,8": libvirt's
    ``^N`` exclusions are not read) is None with a note saying so."""
    notes: list[str] = []

    def one(what: str, sets: list[str | None]) -> str | None:
        given = {s for s in sets if s is not None}
        if not given:
            return None
        if len(given) > 1 or None in sets:
            notes.append(f"{dev}: {what} pinned unevenly ({', '.join(sorted(given))}, or not "
                         "all of them): not one CPU set iomatrix can measure")
            return None
        found = given.pop()
        cpus = cpu_list(found)
        if cpus is None:
            notes.append(f"{dev}: {what} cpuset {found!r} is not a plain CPU list")
        return cpus

    by_vcpu, by_thread = dict(tune.vcpupin), dict(tune.iothreadpin)
    vcpus = one("the vCPUs are", [by_vcpu.get(i, tune.default) for i in range(tune.vcpus)])
    threads = one("its IOThreads are", [by_thread.get(i, tune.default)
                                        for i in iothreads]) if iothreads else None
    main = one("QEMU's main loop (emulatorpin) is", [tune.emulatorpin or tune.default])
    return vcpus, threads, main, tuple(notes)


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
                             num_queues=settings.num_queues, queue_size=settings.queue_size,
                             discard=settings.discard, iothreads=settings.iothreads,
                             vq_groups=vq_groups(settings.vq_mapping))
    return list(disk_args(disk, version or Versions(), iothreads=threads, size=image.size).argv)


def _local(image: DiskImage) -> None:
    if image.network is not None:
        raise ValueError(f"libvirt's graph for a {image.network.protocol} volume is not "
                         "modelled: measure it with platform qemu or proxmox")
    if image.backing:
        raise ValueError("libvirt's graph for a qcow2 backing chain (<backingStore>) is not "
                         "modelled: measure it with platform qemu or proxmox")


def storage_graph(settings: DiskSettings, image: DiskImage,
                  version: Versions | None = None) -> StorageGraph:
    """``libvirt-1-storage`` and, where that libvirt gives the disk one, ``libvirt-1-format``
    over it (:func:`disk_args`), the export on the top one."""
    _local(image)
    disk, _ = disk_for(DAEMON_BUS, source=image.path, block=image.is_device, aio=settings.aio,
                       cache=settings.cache, iothread=False, fmt=settings.format or "raw",
                       discard=settings.discard)
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
