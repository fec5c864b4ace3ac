"""[matrix] and [[part]]: the disk settings a suite sweeps, and [matrix] from_vm's disk as
plain settings (``Reference``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, StrictBool, model_validator

from iomatrix.core.model import Frozen, shown
from iomatrix.suite.fields import CONTROL, TARGET_NAME, CpuSet, Printable, PveVersion, axis_of
from iomatrix.vocab.axes import (AXES, BY_NAME, VQ_MAPPING_PATTERN, Aio, Cache, Controller,
                                 DataPath, Discard, Format, Preallocation)
from iomatrix.vocab.words import Mode


def _vm_file(value: str | None) -> str | None:
    """A file a suite names beside itself ([matrix] from_vm, storage_cfg): relative, inside the
    suite's directory (where symlinks lead is checked when iomatrix reads it)."""
    if value is None:
        return None
    path = Path(value)
    if CONTROL.search(value) or not value.strip():
        raise ValueError("write a file name beside the suite, e.g. \"100.conf\"")
    if path.is_absolute() or ".." in path.parts:
        raise ValueError("must be a path inside the suite's directory (no absolute path, no "
                         "'..'): copy the file beside the suite")
    return value


VmFile = Annotated[str | None, AfterValidator(_vm_file), Field(max_length=255)]
DISK_NAME = r"^(args:)?[a-z]+[0-9a-z-]*$"
"""A VM's disk: ``scsi0``, ``vda``, or a Proxmox VE ``args:`` disk by its device's id
(``args:iomatrix-virtio0``, ``iomatrix.translate.vm``)."""


class Reference(Frozen):
    """The disk of the user's VM (``[matrix] from_vm`` and ``disk``) as plain settings: what
    iomatrix read from the file (``iomatrix.translate.vm``), written by iomatrix into the
    suite text a run stores (``[matrix.reference]``), so that ``--resume``, ``recommend``,
    ``show`` and the report need the file no more. The run measures it as its reference
    configuration, in the same rounds as the matrix."""

    platform: Literal["proxmox", "libvirt"]
    """Whose definition the VM's is: proxmox (``ID.conf``) or libvirt (domain XML)."""
    pve_version: PveVersion | None = None
    """Proxmox VE: the generation whose command line the VM gets (its machine version)."""
    disk: str = Field(max_length=32, pattern=DISK_NAME)
    """The disk's name in the definition: ``scsi0``, ``virtio0`` (Proxmox VE) or ``vda``
    (libvirt)."""
    written: Printable = ""
    """The disk as the file states it."""
    storage: Printable = ""
    """Where the volume lives on the VM's host (storage type, or file/block)."""
    controller: Controller | None = None
    """The disk's controller (bus)."""
    aio: Aio | None = None
    """None: a disk on librbd, which has no aio."""
    iothread: StrictBool = False
    """Whether the disk has an iothread."""
    cache: Cache
    """The disk's cache mode."""
    format: Format
    """The disk's image format."""
    discard: Discard | None = None
    """The disk's discard mode (ignore or unmap); None: the file sets none (the platform's
    default, QEMU's ignore), measured as a configuration that names none."""
    num_queues: int = Field(default=0, ge=0, le=65535)
    """The disk's queues; 0: QEMU's default."""
    queue_size: int = Field(default=0, ge=0, le=65535)
    """The disk's virtqueue size; 0: QEMU's default."""
    iothreads: int | None = Field(default=None, ge=2, le=64)
    """IOThreads serving the disk's queues, where the file gives it two or more (libvirt's
    ``<driver><iothreads>``, a Proxmox VE ``args:`` disk); None: one or none."""
    vq_mapping: Annotated[str, Field(max_length=200, pattern=VQ_MAPPING_PATTERN)] | None = None
    """Their explicit queue mapping; None: round-robin."""
    vcpu_affinity: CpuSet | None = None
    """The host CPUs the VM's vCPUs are pinned to (``<cputune>``, Proxmox VE's ``affinity``)."""
    iothread_affinity: CpuSet | None = None
    """The host CPUs the disk's IOThreads are pinned to."""
    main_affinity: CpuSet | None = None
    """The host CPUs QEMU's main loop is pinned to."""
    notes: tuple[Printable, ...] = ()
    """What the file sets that iomatrix does not reproduce, or reads as a default."""

    def settings(self) -> str:
        """The disk's I/O settings in words: ``aio=threads, cache=writeback, …``."""
        values = {a.name: getattr(self, a.name) for a in REFERENCE_AXES}
        return ", ".join(f"{k}={shown(v)}" for k, v in values.items()
                         if v is not None and v != BY_NAME[k].unset)


REFERENCE_AXES = tuple(a for a in AXES if a.name in Reference.model_fields)
"""The axes a VM's disk states (``Reference``), in the order a configuration names them."""


class Matrix(Frozen):
    """The disk settings swept; defaults are Proxmox VE's for a new Linux VM."""

    controller: axis_of(Controller) = ("virtio-scsi-single",)
    """The disk controller (bus) the guest sees: virtio-blk, virtio-scsi, virtio-scsi-single,
    pvscsi, lsi, megasas, sata, ide or nvme (guest mode)."""
    aio: axis_of(Aio) = ("io_uring",)
    """How QEMU submits I/O to the host: native (Linux AIO; needs a direct cache, none or
    directsync), io_uring, or threads (a thread pool)."""
    iothread: axis_of(StrictBool) = (True,)
    """A dedicated event-loop thread for the disk, off QEMU's main loop (guest mode; in
    blocklayer mode it picks a FUSE export with an iothread over an NBD export)."""
    iothreads: axis_of(Annotated[int, Field(ge=1, le=64)]) | None = None
    """IOThreads serving each disk's queues, with iothread = true (guest mode): 2 or more spread
    the device's virtqueues over that many IOThreads (QEMU's iothread-vq-mapping: virtio-blk
    from QEMU 9.0, virtio-scsi from 10.0); 1 is the single IOThread iothread = true gives.
    Absent: not set, as before the axis existed (one IOThread, or none)."""
    vq_mapping: axis_of(Annotated[str, Field(max_length=200, pattern=VQ_MAPPING_PATTERN)]) | None = None
    """Which IOThread serves which queue, with iothreads: "round-robin" (QEMU's default: queue i
    to thread i mod iothreads) or each thread's queues, threads apart by ":" ("0,1:2,3": queues 0
    and 1 to the first thread, 2 and 3 to the second; needs num_queues, every queue once).
    Absent: round-robin."""
    cache: axis_of(Cache) = ("none",)
    """QEMU's cache mode: none, directsync, writethrough, writeback or unsafe (writethrough,
    writeback and unsafe go through the host page cache)."""
    format: axis_of(Format) = ("raw",)
    """The image format: raw or qcow2."""
    preallocation: axis_of(Preallocation) = ("off",)
    """How much of each image is allocated when it is created: off, metadata (qcow2), falloc
    or full."""
    discard: axis_of(Discard) | None = None
    """Whether discard (TRIM/UNMAP) requests from the guest reach the image: ignore (QEMU's
    default: dropped) or unmap (passed down: the image file gets holes, thin storage frees
    space). Absent: not set, as before the axis existed (each platform's own default; Proxmox VE
    gives every node discard=ignore). Guest and blocklayer modes."""
    data_path: axis_of(DataPath) = ("emulated",)
    """emulated: QEMU's device model serves the disk; vhost-user-blk: qemu-storage-daemon does."""
    num_queues: axis_of(Annotated[int, Field(ge=0, le=65535)]) = (0,)
    """Virtqueues (virtio-blk, virtio-scsi, vhost-user-blk) or I/O queue pairs (nvme); 0 = QEMU's default."""
    queue_size: axis_of(Annotated[int, Field(ge=0, le=65535)]) = (0,)
    """Entries per virtqueue; 0 = QEMU's default."""
    vms: axis_of(Annotated[int, Field(ge=1, le=64)]) | None = None
    """Guests booted at once per configuration (guest mode); overrides [method] vms."""
    node_count: axis_of(Annotated[int, Field(ge=1, le=64)]) | None = None
    """With [method] concurrent_nodes: how many of the cluster's nodes load the shared target
    at once, each count a configuration of its own measured in the same rounds (interleaved):
    [1, 2, 3] measures the first node alone, the first two, then the first three ([nodes] or
    --nodes order). Host, blocklayer and guest modes. Absent: every node in every trial, as
    before the axis existed."""
    guest: axis_of(Annotated[str, Field(max_length=40, pattern=TARGET_NAME)]) | None = None
    """Which guest measures each configuration (guest mode): "appliance" and/or the [guest]
    image's name. Absent: the [guest] image when there is one, else the appliance (and then
    the configurations' keys name no guest, as before the axis existed)."""
    vcpu_affinity: axis_of(CpuSet) | None = None
    """The host CPUs the workload runs on: a CPU set such as "0-1,3", or "numa" (the CPUs of the
    target device's NUMA node; every online CPU, with a note, where the device has none, such as
    a loop device). Guest mode: each vCPU thread of QEMU is pinned to them after QEMU starts (as
    libvirt's vcpupin does); blocklayer and host modes: fio runs there itself (fio's
    cpus_allowed, with cpus_allowed_policy=shared). Absent: nothing pinned, as before the axis
    existed. Checked against the host's online CPUs before the run."""
    iothread_affinity: axis_of(CpuSet) | None = None
    """The host CPUs QEMU's IOThreads run on, pinned after start as libvirt's iothreadpin does
    (guest mode: the IOThreads QMP lists; blocklayer mode: every qemu-storage-daemon thread but
    its main loop, its IOThreads, RCU and monitor threads, which its QMP does not tell apart):
    a CPU set or "numa", as vcpu_affinity. Needs iothread = true. Absent: not pinned."""
    main_affinity: axis_of(CpuSet) | None = None
    """The host CPUs QEMU's main loop (its main thread: the guest's QEMU, or the daemon in
    blocklayer mode) runs on, as libvirt's emulatorpin does for the main thread: a CPU set or
    "numa", as vcpu_affinity. Absent: not pinned."""
    skip_invalid: bool = False
    """Drop the combinations QEMU refuses (aio=native without a direct cache, raw with
    preallocation=metadata, an iothread on a controller that has none), listing them, instead of
    refusing the suite."""
    from_vm: VmFile = None
    """A VM definition beside the suite (a Proxmox VE ``ID.conf`` or ``qm config`` output, or
    ``virsh dumpxml`` output): its disk's settings are measured in the same rounds as the
    reference configuration (``Reference``), whether or not the matrix holds them."""
    disk: str | None = Field(default=None, max_length=32, pattern=DISK_NAME)
    """Which disk of ``from_vm``: ``scsi0`` (Proxmox VE) or the target dev, ``vda`` (libvirt);
    may be left out when the VM has one disk."""
    storage_cfg: VmFile = None
    """Proxmox VE's ``/etc/pve/storage.cfg`` beside the suite, for storages other than a fresh
    installation's (local, local-lvm, local-zfs)."""
    reference: Reference | None = None
    """``from_vm``'s disk as iomatrix read it; written by iomatrix into a run's stored suite."""

    @model_validator(mode="after")
    def _vm_keys(self) -> "Matrix":
        if self.from_vm is None:
            given = [k for k in ("disk", "storage_cfg", "reference") if getattr(self, k) is not None]
            if given:
                raise ValueError(f"{given[0]} goes with from_vm (the VM definition it reads)")
        return self

    @property
    def vm_unread(self) -> bool:
        """``from_vm`` names a VM whose disk is not yet read into ``reference``
        (``translate.fromvm.resolve_vm`` reads it, once: a suite the command line changed,
        or a stored one, has it read)."""
        return self.from_vm is not None and self.reference is None


class Part(Matrix):
    """An extra part of a suite: its own mode and matrix, the suite's target and workloads."""

    mode: Mode
    """The part's mode: host, blocklayer or guest."""
    under_tcg: Literal["all", "one", "skip"] = "all"
    """When guests run emulated (TCG): every trial, only the first configuration's first
    workload (to show the chain works), or none."""

    @model_validator(mode="after")
    def _no_vm(self) -> "Part":
        if self.from_vm is not None:
            raise ValueError("from_vm belongs in [matrix]: the suite's own mode measures the VM")
        return self
