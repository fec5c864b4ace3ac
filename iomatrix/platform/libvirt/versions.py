"""The libvirt and the QEMU it drives, as far as they decide a disk's nodes (pure): version
numbers read, the versions modelled by default, and whether a raw disk gets a format node."""

from __future__ import annotations

import re

from iomatrix.core.model import Frozen


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
IOTHREAD_MAPPING: Version = (10, 0, 0)
"""The first libvirt with a disk's ``<driver><iothreads>`` (several IOThreads serving its
virtqueues: formatdomain "Since 10.0.0 (QEMU 9.0, virtio disks only)"); 9.0's schema refuses
the element (verified against the real daemon)."""
MAPPING_QEMU: Version = (9, 0, 0)
"""virtio-blk's ``iothread-vq-mapping`` (QEMU 9.0)."""
SCSI_MAPPING: Version = (11, 2, 0)
"""The first libvirt with a virtio-scsi controller's ``<driver><iothreads>`` (QEMU 10.0's
virtio-scsi ``iothread-vq-mapping``): KubeVirt's VEP 342 names it; 11.3's domxml-to-native
checked in the Debian 13 pass."""
SCSI_MAPPING_QEMU: Version = (10, 0, 0)
ZEROES_CHAIN: Version = (10, 0, 0)
"""The first libvirt taken to give a backing image the disk's ``detect-zeroes``: 9.0's
domxml-to-native gives it the top image only, 11.3's every image (checked); the versions in
between are not, and are modelled as 11.3 from 10.0, when the storage nodes were reworked."""
DISCARD_GRANULARITY: Version = (10, 0, 0)
"""The first libvirt taken to give the device ``<blockio discard_granularity=>``: 9.0 ignores
it, 11.3 gives it (both checked); the versions between are a guess."""
DATA_STORE: Version = (10, 10, 0)
"""The first libvirt that reads a qcow2 image's ``<source><dataStore>`` (formatdomain: "Since
10.10.0"); 9.0 ignores the element (checked on this host), 11.3 gives ``data-file``."""
DEFAULT_LIBVIRT: Version = (11, 3, 0)
"""The libvirt modelled where none is named or installed: Debian 13's."""
DEFAULT_QEMU: Version = (10, 0, 0)
"""The QEMU modelled with it where no QEMU is installed: Debian 13's."""


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

    def mapping_refusal(self, scsi: bool = False) -> str | None:
        """Why this libvirt with this QEMU cannot give a disk (``scsi``: a virtio-scsi
        controller) several IOThreads, or None."""
        libvirt, qemu = (SCSI_MAPPING, SCSI_MAPPING_QEMU) if scsi else (IOTHREAD_MAPPING,
                                                                         MAPPING_QEMU)
        what = "a virtio-scsi controller" if scsi else "a disk"
        if self.libvirt < libvirt:
            return (f"libvirt {shown(self.libvirt)} has no <driver><iothreads> on {what} "
                    f"(several IOThreads per disk): libvirt {shown(libvirt)} or later needed")
        if self.qemu < qemu:
            return (f"QEMU {shown(self.qemu)} has no iothread-vq-mapping on {what} (several "
                    f"IOThreads per disk): QEMU {shown(qemu)} or later needed")
        return None

    def ignores_mapping(self, scsi: bool = False) -> bool:
        """Whether this libvirt reads no ``<driver><iothreads>`` on a disk (``scsi``: a
        virtio-scsi controller) at all: it gives the device no mapping, without a word
        (libvirt 9.0's ``domxml-to-native``, checked on this host)."""
        return self.libvirt < (SCSI_MAPPING if scsi else IOTHREAD_MAPPING)

    @property
    def zeroes_chain(self) -> bool:
        """Whether a disk's ``detect_zeroes`` goes to every image of its backing chain (9.0:
        the top image only; 11.3: every one, both checked; taken from 10.0)."""
        return self.libvirt >= ZEROES_CHAIN

    @property
    def discard_granularity(self) -> bool:
        """Whether this libvirt gives the device ``<blockio discard_granularity=>``."""
        return self.libvirt >= DISCARD_GRANULARITY

    @property
    def data_store(self) -> bool:
        """Whether this libvirt renders ``<source><dataStore>`` (qcow2's ``data-file``)."""
        return self.libvirt >= DATA_STORE

    @property
    def label(self) -> str:
        return f"libvirt {shown(self.libvirt)} with QEMU {shown(self.qemu)}"


def has_format_node(fmt: str, versions: Versions, *, sliced: bool = False) -> bool:
    """Whether a disk of this format gets a format node (``sliced``: iomatrix's test area on a
    block device, a raw ``<slice>``, whose slice node then plays that part)."""
    return fmt != "raw" or versions.raw_format_node or sliced
