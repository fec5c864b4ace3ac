"""Proxmox VE 9's snapshots as a volume chain on thick LVM (``[target] lvm`` with
``volume_chain = true``; storage.cfg ``snapshot-as-volume-chain 1``, a technology preview): an
image of format qcow2 is a qcow2 written onto a logical volume, and with ``snapshots = N`` it
sits on a chain of N backing LVs. Raw images stay the LV itself (``iomatrix.targets.lvm``), so
host mode, whose configurations have no format, measures a raw LV: the baseline.

What pve-storage 9 (``LVMPlugin.pm``, ``Common.pm``) does, and iomatrix does alike:

- **Sizes.** An LV holding a qcow2 is ``qemu-img measure --size <size> -O qcow2``'s
  ``fully-allocated`` (a snapshot's overlay measured with its own options), rounded up to MiB.
- **The image.** ``qemu-img create -f qcow2 -o preallocation=P`` (QEMU's default cluster size);
  pve-storage's default P for qcow2 is ``metadata``, iomatrix's the configuration's
  ``preallocation`` (falloc and full cannot be done on a block device: refused first).
- **A snapshot.** pve-storage renames the image's LV to ``snap_<name>_<snap>.qcow2`` and makes a
  new LV under the image's name with ``qemu-img create -F qcow2 -b <the renamed LV> -f qcow2 -o
  extended_l2=on,cluster_size=128k,preallocation=P``. iomatrix makes the same chain in its
  final places instead of renaming (every LV recorded before it is made, under a name it keeps
  to the end: ``<image's name>-snapK``, ``snap1`` the oldest, the chain's base), the
  overlay's header naming its backing LV's device by absolute path.
- **Opened.** qemu-server opens the chain as nodes of its own, never by the headers' names
  (``iomatrix.platform.proxmox.blockdev``; iomatrix's graph likewise:
  ``iomatrix.platform.qemu``): ``Image.backing``.

The snapshots are taken of an empty image: the backing LVs hold no data, so a read of what the
top has not written goes down the chain and finds none (preconditioning writes the top)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from iomatrix.core.errors import TargetError, ToolFailed
from iomatrix.core.proc import require, run
from iomatrix.core.units import format_bytes
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.target import Target
from iomatrix.suite.volumes import CHAIN_CAVEAT
from iomatrix.targets.kind import Image
from iomatrix.targets.volumes import MIB, Backend, VolumeTarget
from iomatrix.targets.workspace import image_specs

SNAPSHOT_OPTIONS = ("extended_l2=on", "cluster_size=128k")
"""pve-storage's qcow2 options of a snapshot's overlay (Common.pm qemu_img_create_qcow2_backed;
calculate_lvm_size measures with them)."""
PREALLOCATIONS = ("off", "metadata")
"""What qemu-img can preallocate a qcow2 on a block device with (falloc and full would grow
the file under it)."""
TIMEOUT = 600.0


def lv_size(size: int, *, snapshot: bool) -> int:
    """The LV for a qcow2 of ``size`` bytes (a snapshot's overlay: with ``SNAPSHOT_OPTIONS``),
    as pve-storage's calculate_lvm_size sizes it, rounded up to MiB."""
    argv = [require("qemu-img"), "measure", "--output=json", "--size", str(size), "-O", "qcow2"]
    if snapshot:
        argv += ["-o", ",".join(SNAPSHOT_OPTIONS)]
    try:
        need = int(json.loads(run(argv, timeout=60).stdout)["fully-allocated"])
    except (ToolFailed, ValueError, KeyError, TypeError) as exc:
        raise TargetError(f"qemu-img measure gave no size for a qcow2 of {size} bytes: "
                          f"{str(exc).splitlines()[0] if str(exc) else exc!r}") from None
    return -(-need // MIB) * MIB


class ChainTarget(VolumeTarget):
    """A run's LVs in a volume group with ``volume_chain`` (the module's docstring)."""

    def __init__(self, target: Target, backend: Backend, *, snapshots: int,
                 keep: bool = False) -> None:
        super().__init__(target, backend, keep=keep)
        self.snapshots = snapshots

    def check(self, configs: Iterable[Configuration]) -> "ChainTarget":
        """The volumes' checks, and the chain's: a preallocation qemu-img can do on an LV, and
        room for every LV of every chain (each as large as a snapshot's)."""
        configs = list(configs)
        wrong = sorted({c.preallocation or "off" for c in configs if c.format == "qcow2"}
                       - set(PREALLOCATIONS))
        if wrong:
            raise TargetError(f"[target] lvm ({self.backend.where}): a qcow2 on an LV takes "
                              f"preallocation off or metadata, not {', '.join(wrong)} (qemu-img "
                              "cannot preallocate a block device further)")
        super().check(configs)
        specs = image_specs(configs)
        chains = sum(fmt == "qcow2" for fmt, _, _ in specs)
        if not chains:
            self.notes.append("volume_chain: no configuration has format qcow2, so no image is "
                              "a volume chain (raw images are the LV itself)")
            return self
        count = len(specs) - chains + chains * (self.snapshots + 1)
        each = lv_size(self.size, snapshot=True)
        found = self.backend.check(count, each)
        self.notes += [f"volume chain: each qcow2 image is a qcow2 on an LV of "
                       f"{format_bytes(each)} on {self.snapshots} backing LV(s) (pve-storage's "
                       f"snapshots; {count} LV(s) in all, space checked for that many); raw "
                       "images (host mode's baseline) are the LV itself", *found, CHAIN_CAVEAT]
        return self

    def volume_size(self, fmt: str) -> int:
        if fmt != "qcow2":
            return self.size
        return lv_size(self.size, snapshot=self.snapshots > 0)

    def prepare(self, image: Image) -> Image:
        """A qcow2 image: its chain made (base, then each snapshot's overlay), the image's own
        LV the top; a raw one is the LV."""
        if image.format != "qcow2":
            return image
        name = next(n for n, device in self._made.items() if device == image.path)
        chain: list[Path] = []
        for k in range(1, self.snapshots + 1):
            size = lv_size(self.size, snapshot=k > 1)
            chain.insert(0, self._write(self.make(f"{name}-snap{k}", size), image, chain[:1]))
        self._write(image.path, image, chain[:1])
        return image.model_copy(update={"backing": tuple(chain)})

    def _write(self, device: Path, image: Image, backing: list[Path]) -> Path:
        """``qemu-img create`` a qcow2 of the image's size onto ``device`` (over ``backing``'s
        one LV: a snapshot's overlay), through a descriptor of the device iomatrix made."""
        fd = os.open(device, os.O_RDWR | os.O_EXCL | os.O_CLOEXEC)
        try:
            if os.fstat(fd).st_rdev != self._devices.get(device):
                raise TargetError(f"{device} is no longer the volume iomatrix made")
            options = [f"preallocation={image.preallocation}"]
            argv = [require("qemu-img"), "create", "-q", "-f", "qcow2"]
            if backing:
                # -u: the backing LV was just written by this run; not opened again here
                argv += ["-u", "-F", "qcow2", "-b", str(backing[0])]
                options = [*SNAPSHOT_OPTIONS, *options]
            argv += ["-o", ",".join(options), f"/proc/self/fd/{fd}", str(image.size)]
            try:
                run(argv, timeout=TIMEOUT, pass_fds=(fd,))
            except ToolFailed as exc:
                raise TargetError(f"{self.backend.where}: qemu-img create on {device}: "
                                  f"{str(exc).splitlines()[0]}") from None
        finally:
            os.close(fd)
        return device

    def verify(self, images: Iterable[Image]) -> None:
        """Each image's LV and every LV of its chain is still the one made."""
        images = list(images)
        super().verify(images + [image.model_copy(update={"path": lv, "backing": ()})
                                 for image in images for lv in image.backing])
