"""[method] and [guest]: how each configuration is measured, and the user's own image as the
guest."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from iomatrix.core.model import Frozen
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.fields import (CONTROL, TARGET_NAME, CpuSet, Duration, Fraction, GuestMemory,
                                   Printable, PveVersion)
from iomatrix.vocab.axes import Platform
from iomatrix.vocab.words import Accel, Mode


GuestOs = Literal["linux", "windows"]


class OwnGuest(Frozen):
    """[guest]: the user's own disk image as the guest (``iomatrix.appliance.ownimage``). It is
    booted through a throwaway qcow2 overlay in the run's directory (the image is only read);
    a Linux cloud image needs no preparation (a NoCloud seed starts fio in it), a Windows
    image is prepared once (docs: "Measure with your own guest")."""

    image: Path
    """The base image, qcow2 or raw, as an absolute path."""
    name: str | None = Field(default=None, max_length=40, pattern=TARGET_NAME)
    """The guest's name on the ``guest`` axis; default: the image's file name without suffix."""
    os: GuestOs = "linux"
    """linux (a NoCloud seed starts fio in it) or windows (prepared once; fio then runs with
    windowsaio on the disk as the guest names it)."""
    kernel: Path | None = None
    """Boot this kernel (and ``initrd``) with ``-kernel`` instead of the image's bootloader:
    an image that is a bare filesystem (no partition table, no bootloader)."""
    initrd: Path | None = None
    """With ``kernel``: its initrd."""
    append: Printable = Field(default="root=/dev/vda rw", max_length=1000)
    """The kernel command line with ``kernel`` (console=ttyS0 is added)."""
    ready_timeout: Duration = 120.0
    """How long the guest may take to print its ready marker under KVM; under TCG
    :data:`TCG_READY_FACTOR` times as long (a distribution boots its whole userspace)."""

    @field_validator("image", "kernel", "initrd")
    @classmethod
    def _absolute(cls, value: Path | None) -> Path | None:
        if value is None:
            return None
        text = str(value)
        if not value.is_absolute() or ".." in value.parts or CONTROL.search(text) \
                or "\n" in text:
            raise ValueError("give an absolute path without '..' (the image is only read, "
                             "through an overlay in the run's directory)")
        return value

    @model_validator(mode="after")
    def _kernel_pair(self) -> "OwnGuest":
        if self.initrd is not None and self.kernel is None:
            raise ValueError("initrd goes with kernel")
        if self.os == "windows" and self.kernel is not None:
            raise ValueError("kernel is for a Linux image without a bootloader")
        return self

    @property
    def label(self) -> str:
        """Its value on the ``guest`` axis."""
        if self.name is not None:
            return self.name
        stem = re.sub(r"[^A-Za-z0-9._-]", "-", self.image.name.split(".")[0]).strip("-._")
        return (stem or "image")[:40]

    def ready_seconds(self, accel: str) -> float:
        """How long it may take to become ready under ``accel``."""
        return self.ready_timeout * (TCG_READY_FACTOR if accel == Accel.TCG else 1)

    def guests_at_once(self, configs: Iterable[Configuration], vms: int) -> int:
        """The most guests of this image one session of ``configs`` boots (``vms``: [method]
        vms, for a configuration that names none)."""
        return max((c.vms or vms for c in configs if c.guest == self.label), default=1)


TCG_READY_FACTOR = 5
"""A real distribution's boot under TCG, against KVM: Debian 12 with cloud-init became ready in
58-73 s on 2 busy cores (the appliance: 5-6 s; ``bench/own_guest.py``), and took over 160 s of
guest uptime at a load of 13; under KVM the same boot takes seconds."""


class Method(Frozen):
    mode: Mode = Mode.BLOCKLAYER
    """How each configuration is measured: host (fio directly on the target), blocklayer
    (qemu-storage-daemon holds the image, fio drives it from the host) or guest (VMs, fio inside)."""
    ramp: Duration = 2.0
    """fio's ramp time before each trial measures ("2s")."""
    runtime: Duration = 10.0
    """How long each trial measures ("10s"); not used with steady_state."""
    samples: int = Field(default=1, ge=1, le=1000)
    """Fixed repetitions of every point, interleaved across configurations."""
    target_ci: Fraction | None = None
    """The 95 % CI half-width every gain should reach ("2%": ±2 percentage points; with no
    gain, a point's mean IOPS, relative): a pilot at the run's own trial length measures the
    noise first, and the rounds (samples to max_samples) that reach it in the least time are
    chosen, then measured whatever the gains show (``analysis.trialplan``; no stopping when a
    CI first looks narrow, which would call an A/A pair different too often). false: rounds
    fixed by samples (as when absent, for a [scale.NAME] table to switch off what the suite's
    own [method] switched on)."""
    max_samples: int = Field(default=10, ge=1, le=1000)
    """With target_ci or pilot: at most this many rounds (``samples``: at least)."""
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**63)
    """Seed of the trial order's shuffle; a random one is drawn and recorded when absent."""
    steady_state: bool = False
    """Run each trial until its per-second IOPS meet the SNIA PTS rule (last 5 seconds: range
    <= 20 % of their mean, least-squares excursion <= 10 %), between min_runtime and
    max_runtime; runtime is then not used. Host and blocklayer modes."""
    min_runtime: Duration = 5.0
    """With steady_state, no trial stops before this."""
    max_runtime: Duration = 60.0
    """With steady_state, a trial stops at this even if not steady; with pilot, the longest
    trial it may choose."""
    baseline: bool = False
    """Also measure every workload in host mode on the same target (the bare-metal baseline)."""
    on_node_failure: Literal["continue", "stop"] = "continue"
    """A run of several nodes ([nodes]) when one drops mid-run: its unmeasured trials fail with
    the reason and the others go on ("continue"), or every node stops and the run ends
    interrupted ("stop")."""
    engine: Literal["libaio", "io_uring", "psync"] = "libaio"
    """fio's engine for host mode and FUSE exports."""
    precondition: bool = True
    """Write every image fully once before measuring, so reads touch the disk."""
    vms: int = Field(default=1, ge=1, le=64)
    """Guests booted at once per configuration, each with its own image (guest mode)."""
    vcpus: int = Field(default=2, ge=1, le=64)
    """vCPUs of each guest (guest mode)."""
    memory: GuestMemory = 512 * 1024 * 1024
    """Guest memory, with a unit ("512MiB"), whole MiB, at least MIN_GUEST_MEMORY_MIB."""
    accel: Accel = Accel.AUTO
    """auto: KVM when a probe boot shows it works, otherwise TCG (emulated, said everywhere)."""
    boot_timeout: Duration = 120.0
    """How long a guest may take to become ready before its trials fail."""
    platform: Platform = "qemu"
    """Guest and blocklayer mode: build each configuration's disk as this platform would (qemu:
    iomatrix's own two -blockdev nodes; proxmox: qemu-server's graph, detect-zeroes, discard,
    throttle node; libvirt: libvirt's nodes and devices). See docs/proxmox-options.md."""
    pve_version: PveVersion | None = None
    """With platform = "proxmox": 8 (-drive, machine < 10.0) or 9 (-blockdev under a throttle
    filter; the default)."""
    libvirt_uri: str | None = None
    """With platform = "libvirt": run the guests through this libvirtd (``"qemu:///system"``):
    iomatrix writes each guest's domain XML and starts it with ``virsh create``
    (iomatrix.drivers.libvirt). Absent: iomatrix's own QEMU with libvirt's block graph."""
    libvirt_version: str | None = Field(default=None, pattern=r"^[0-9]+\.[0-9]+(\.[0-9]+)?$")
    """With platform = "libvirt" and no libvirt_uri: the libvirt whose block graph the disks get
    ("11.3"), with the QEMU that runs them (libvirt 10.1 and later give a raw disk no format
    node on QEMU 9.0 and later). Absent: the libvirt installed here, else 11.3. Through a
    libvirtd (libvirt_uri) the daemon's own version is used."""
    irq_affinity: CpuSet | None = None
    """The CPUs the target device's interrupts are steered to for the run (its IRQs'
    ``/proc/irq/N/smp_affinity_list``): a CPU set such as "0-1" or "numa" (the device's NUMA
    node's CPUs). Needs root; each IRQ's previous set is put back when the run ends, also on
    Ctrl-C; an IRQ the kernel manages itself (NVMe, multi-queue virtio) keeps its own, noted.
    Absent: nothing is written; the IRQs' sets are reported as found (the run's host record,
    ``target_irqs``)."""
    aa: bool = False
    """A/A calibration: measure the first configuration of the matrix twice (as itself and as
    its twin, key ``.../aa=twin``) in the same rounds; the run then reports how often its own
    method calls the identical pair different, and its noise floor (``analysis.paired``)."""
    pilot: bool = False
    """Choose runtime and rounds from a pilot measured at the start of the run: its noise at
    two trial lengths, its drift between rounds and its fixed cost per trial and session; the
    least wall time to target_ci (±2 pp when absent) on every gain (``analysis.trialplan``),
    with trials of at most max_runtime and at most max_samples rounds. A runtime or samples the
    suite gives is kept and only the other chosen (a runtime: the pilot measures at it alone,
    as for target_ci). The rounds are then fixed: no look at the gains decides when to stop.
    On a cluster's nodes (``[nodes]``) one pilot serves the whole cluster and every node
    follows its one plan."""
    concurrent_nodes: bool = False
    """Cluster load: every node of the run loads the shared target at once, each trial driven
    by one fio client here through each node's SSH session (``iomatrix.drivers.cluster``);
    each node's figures are stored as a per-client share of the cluster's aggregate. The
    target must be the same shared storage, at the same path, here and on every node. Host
    mode, or guest mode: each node boots ``vms`` guests, each on a disk of its own there, and
    every guest of every node gets the job (``iomatrix.drivers.cluster``). On an rbd pool
    each node gets images of its own there (``shared_image``), which its fio (host mode) or
    its guests' QEMU reach through librbd."""
    shared_image: bool = False
    """With concurrent_nodes on an rbd pool: one image that every node loads at once, rather
    than an image of each node's own."""

    @model_validator(mode="after")
    def _pve_version_needs_proxmox(self) -> "Method":
        if self.pve_version is not None and self.platform != "proxmox":
            raise ValueError(f'pve_version is for platform = "proxmox" (platform is '
                             f'"{self.platform}")')
        for key in ("libvirt_uri", "libvirt_version"):
            if getattr(self, key) is not None and self.platform != "libvirt":
                raise ValueError(f'{key} is for platform = "libvirt" (platform is '
                                 f'"{self.platform}")')
        if self.libvirt_uri is not None and self.libvirt_version is not None:
            raise ValueError("libvirt_version models a libvirt; with libvirt_uri the daemon's "
                             "own version is used: drop one")
        return self

    @field_validator("target_ci", mode="before")
    @classmethod
    def _off(cls, value: Any) -> Any:
        return None if value is False else value

    @field_validator("runtime")
    @classmethod
    def _positive(cls, value: float) -> float:
        if value < 0.5:
            raise ValueError("runtime must be at least 500ms")
        return value

    @model_validator(mode="after")
    def _runtimes(self) -> "Method":
        if self.steady_state and not 5 <= self.min_runtime <= self.max_runtime:
            raise ValueError("steady_state needs 5s <= min_runtime <= max_runtime "
                             "(the rule looks at the last 5 one-second intervals)")
        if self.max_samples < self.samples:
            raise ValueError(f"max_samples ({self.max_samples}) is below samples ({self.samples})")
        if self.pilot and self.steady_state:
            raise ValueError("pilot chooses each trial's runtime; steady_state lets each trial "
                             "choose its own: drop one")
        if self.concurrent_nodes and self.on_node_failure == "stop":
            raise ValueError('on_node_failure = "stop" is not built for concurrent_nodes, whose '
                             "trial fails where a node drops and whose next round starts it "
                             "again")
        if self.shared_image and not self.concurrent_nodes:
            raise ValueError("shared_image is for concurrent_nodes: one image that every node "
                             "loads at once")
        if self.concurrent_nodes and self.steady_state:
            raise ValueError("steady_state cannot follow a trial of concurrent_nodes: fio's "
                             "client reports the nodes' I/O only when the trial ends")
        if self.pilot and {"runtime", "samples"} <= self.model_fields_set:
            raise ValueError("pilot chooses runtime and samples, and the suite fixes both: "
                             "drop one of them, or pilot")
        return self

    @property
    def plans_rounds(self) -> bool:
        """A pilot chooses the rounds (pilot, or target_ci)."""
        return self.pilot or self.target_ci is not None

    @property
    def chooses_runtime(self) -> bool:
        """The pilot chooses the trial length too: pilot = true and the suite fixes neither
        runtime nor steady state."""
        return self.pilot and not self.steady_state and "runtime" not in self.model_fields_set

    @property
    def fixed_by_suite(self) -> tuple[float | None, int | None]:
        """(runtime, samples) as the suite fixed them for a pilot to keep; None: not given."""
        fields = self.model_fields_set
        return (self.runtime if "runtime" in fields else None,
                self.samples if "samples" in fields else None)

    @property
    def window(self) -> float:
        """The longest measurement window of a trial (ramp excluded)."""
        return self.max_runtime if self.steady_state else self.runtime
