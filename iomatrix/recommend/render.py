"""A recommended configuration as each platform takes it (pure): a ``qm set`` line for Proxmox
VE, domain XML fragments for libvirt, ``-object``/``-blockdev``/``-device`` arguments for QEMU.

The configuration must be one QEMU 7.2 accepts (:func:`iomatrix.suite.expand.invalid_reason`);
every renderer refuses one it does not with InvalidCombination, so nothing QEMU would reject is
ever printed. What a platform cannot express (a Proxmox virtio disk has no ``queues=``; libvirt's
virtio-scsi controller no virtqueue size) is left out and said in a note, never dropped silently.
"""

from __future__ import annotations

import shlex
from pathlib import Path


from iomatrix.core.errors import InvalidCombination
from iomatrix.platform import PLATFORMS as MODULES
from iomatrix.platform import libvirt as lv
from iomatrix.qemu.args import GuestSpec, guest_argv
from iomatrix.platform import proxmox as pve
from iomatrix.platform.proxmox import PLACEHOLDER_VMID, PLACEHOLDER_VOLUME
from iomatrix.recommend.defaults import UNEXPRESSIBLE, Platform
from iomatrix.suite.expand import invalid_reason
from iomatrix.suite.model import Configuration
from iomatrix.target.workspace import Image
from iomatrix.core.model import Frozen



class Rendered(Frozen):
    """What to paste (``text``), its parts for programs, and notes on what was left out."""

    platform: Platform
    text: str
    notes: tuple[str, ...] = ()
    fragments: tuple[tuple[str, str], ...] = ()
    """libvirt: (where it goes, one XML element) pairs."""
    argv: tuple[str, ...] = ()
    """QEMU: the disk's arguments, unquoted; Proxmox: the ``qm set`` argv."""


def render(platform: Platform, config: Configuration, *, vmid: str = PLACEHOLDER_VMID,
           volume: str = PLACEHOLDER_VOLUME, image: str | None = None,
           storage: str = "other") -> Rendered:
    """``config`` for ``platform``; InvalidCombination when QEMU 7.2 or the platform refuses it."""
    _check(platform, config)
    if platform == "proxmox":
        return proxmox(config, vmid=vmid, volume=volume, storage=storage)
    path = image or f"{MODULES[platform].PLACEHOLDER_IMAGE}.{config.format or 'raw'}"
    if platform == "libvirt":
        return libvirt(config, image=path)
    return qemu(config, image=Path(path))


def _check(platform: Platform, config: Configuration) -> None:
    reason = invalid_reason(config.model_copy(update={"mode": "guest"}))
    if reason is None:
        reason = UNEXPRESSIBLE[platform].get(("controller", str(config.controller)))
    if reason is not None:
        raise InvalidCombination(f"{config.key}: {reason}")


def _image_notes(config: Configuration, where: str) -> list[str]:
    prealloc = config.preallocation or "off"
    if prealloc == "off":
        return []
    return [f"preallocation={prealloc} is chosen when the image is created ({where}), e.g. "
            f"qemu-img create -f {config.format or 'raw'} -o preallocation={prealloc} IMAGE SIZE"]


# -- Proxmox VE (reference §1) ----------------------------------------------------------------

def proxmox(config: Configuration, *, vmid: str = PLACEHOLDER_VMID,
            volume: str = PLACEHOLDER_VOLUME, storage: str = "other") -> Rendered:
    """The ``qm set`` line of :func:`iomatrix.platform.proxmox.qm_set`."""
    _check("proxmox", config)
    argv, notes = pve.qm_set(config, vmid=vmid, volume=volume, storage=storage)
    return Rendered(platform="proxmox", text=" ".join(argv), notes=tuple(notes), argv=tuple(argv))


# -- libvirt (reference §2) -------------------------------------------------------------------

def libvirt(config: Configuration, *, image: str) -> Rendered:
    """The domain XML fragments of :func:`iomatrix.platform.libvirt.pasted_xml`."""
    _check("libvirt", config)
    fragments, notes = lv.pasted_xml(config, image=image)
    notes += _image_notes(config, "qemu-img or a storage pool volume")
    text = "\n".join(f"<!-- in {where} -->\n{xml}" for where, xml in fragments)
    return Rendered(platform="libvirt", text=text, notes=tuple(notes), fragments=tuple(fragments))


# -- QEMU (reference §3, §4) ------------------------------------------------------------------

def qemu(config: Configuration, *, image: Path) -> Rendered:
    """The disk's ``-object iothread``, ``-blockdev`` and ``-device`` arguments, exactly as
    iomatrix starts its own guests (:func:`iomatrix.qemu.args.guest_argv`), to add to a
    ``qemu-system-x86_64`` command line."""
    _check("qemu", config)
    argv = disk_argv(config, image)
    lines = [" ".join(shlex.quote(a) for a in argv[i:i + 2]) for i in range(0, len(argv), 2)]
    notes = _image_notes(config, "qemu-img create")
    if image.is_absolute() and str(image).startswith("/dev/"):
        notes.append('for a block device, write "driver":"host_device" instead of "file"')
    return Rendered(platform="qemu", text=" \\\n".join(lines), notes=tuple(notes),
                    argv=tuple(argv))


def disk_argv(config: Configuration, image: Path) -> list[str]:
    """The disk-under-test part of :func:`guest_argv` for ``config`` on a file ``image``."""
    # guest_argv builds a whole guest; its disk arguments are the ones after the NIC.
    spec = GuestSpec(config=config.model_copy(update={"mode": "guest"}),
                     image=Image(path=image, format=config.format or "raw",
                                 preallocation=config.preallocation or "off", size=1 << 30),
                     kernel=Path("vmlinuz"), initrd=Path("initrd"), append="", accel="tcg",
                     vcpus=1, memory_bytes=1 << 30, qmp_socket=Path("qmp.sock"),
                     serial_log=Path("serial.log"), host_port=1, name="recommend")
    argv = guest_argv(spec)
    nic = next(i for i, a in enumerate(argv) if a.startswith("virtio-net-pci,"))
    return argv[nic + 1:]
