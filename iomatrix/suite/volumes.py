"""[target] tables of storage where iomatrix makes volumes of its own on this host (each a key
of ``iomatrix.suite.target.TABLES``; what a run does with them: ``iomatrix.targets.volumes``
and a module per kind): an LVM volume group (``lvm``), an LVM-thin pool (``lvmthin``), a
directory on btrfs for a subvolume (``btrfs``), a ZFS dataset (``zfs``). Only what the user
writes, checked: every name here reaches a root program (``lvcreate``, ``zfs create``), so it
is held to the tool's own rules and nothing it could read as an option or syntax."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, ClassVar

from pydantic import (AfterValidator, BeforeValidator, Field, field_validator,
                      model_validator)

from iomatrix.suite.kindtable import KindTable

_LVM_NAME = re.compile(r"^[A-Za-z0-9+_.][A-Za-z0-9+_.-]{0,126}$")
"""A volume group or logical volume name as LVM accepts it (lvm(8) "VALID NAMES"): letters,
digits and ``+ _ . -``, at most 127 characters, never a leading ``-``."""
CHAIN_CAVEAT = ("qcow2 volume chains on LVM are a technology preview in Proxmox VE 9; "
                "Blockbridge reported data-integrity failures with cache=none right after the "
                "first snapshot: results here measure speed, not whether data survives")
"""What evidence on a qcow2 volume chain carries (``LvmTarget.caveat``, the run's notes)."""
MAX_SNAPSHOTS = 16
"""The most snapshots ``[target] lvm`` takes before a run (each one LV and one layer more)."""
_LV_RESERVED = ("_cdata", "_cmeta", "_corig", "_iorig", "_mimage", "_mlog", "_pmspare",
                "_rimage", "_rmeta", "_tdata", "_tmeta", "_vdata", "_vorigin", "_wcorig")
"""Parts LVM keeps for its own hidden volumes: not in a logical volume's name (lvm(8))."""


def _vg_name(value: str) -> str:
    if not _LVM_NAME.match(value) or value in (".", ".."):
        raise ValueError(f"{value[:60]!r} is not an LVM volume group name (letters, digits, "
                         "+ _ . -, at most 127, not beginning with '-')")
    return value


def _lv_name(value: str) -> str:
    _vg_name(value)
    if value.startswith(("snapshot", "pvmove")) or any(r in value for r in _LV_RESERVED):
        raise ValueError(f"{value[:60]!r} is a name LVM keeps for its own volumes")
    return value


VgName = Annotated[str, AfterValidator(_vg_name)]
"""An LVM volume group name (``_vg_name``)."""
LvName = Annotated[str, AfterValidator(_lv_name)]
"""An LVM logical volume name (``_lv_name``): a thin pool's."""


class LvmTarget(KindTable):
    """``[target] lvm = { vg = "pve" }``: a volume group where iomatrix makes a thick logical
    volume of [target] size per image (``iomatrix-<run>-…``), as Proxmox VE's ``lvm`` storage
    puts a VM's disk, and removes it at the end (``iomatrix.targets.lvm``). Raw, and with
    ``volume_chain`` qcow2 too: Proxmox VE 9's snapshots as a volume chain
    (``iomatrix.targets.lvmchain``)."""

    needs_size: ClassVar[bool] = True
    """iomatrix makes volumes there: [target] size says how big."""
    local_volumes: ClassVar[bool] = True

    vg: VgName
    """The volume group the volumes are made in (Proxmox VE's ``vgname``)."""
    volume_chain: bool = False
    """Proxmox VE 9's ``snapshot-as-volume-chain 1`` (a technology preview): an image of
    format qcow2 is a qcow2 written onto its LV, as pve-storage makes one; raw images stay the
    LV itself. Blockbridge reported data-integrity failures with cache=none after the first
    snapshot: results on it say so."""
    snapshots: int = Field(default=0, ge=0, le=MAX_SNAPSHOTS)
    """With ``volume_chain``: this many snapshots taken of each qcow2 image before it is
    measured, so that it sits on a chain of as many backing LVs (each snapshot: the image
    becomes a backing LV and a new LV with a qcow2 over it is the image, as pve-storage's
    volume_snapshot does)."""

    @model_validator(mode="after")
    def _chain(self) -> "LvmTarget":
        if self.snapshots and not self.volume_chain:
            raise ValueError("snapshots needs volume_chain = true (only qcow2 volume chains "
                             "keep snapshots on thick LVM)")
        return self

    def caveat(self, fmt: str | None) -> str | None:
        """A qcow2 image here is a volume chain: Blockbridge's integrity caveat."""
        return CHAIN_CAVEAT if self.volume_chain and fmt == "qcow2" else None

    @property
    def location(self) -> str:
        chain = ""
        if self.volume_chain:
            chain = f" (qcow2 volume chain, {self.snapshots} snapshot(s))"
        return f"LVM volume group {self.vg}{chain}"

    @property
    def storage_kind(self) -> str:
        """Proxmox VE's ``lvm`` storage type."""
        return "lvm"


class LvmThinTarget(KindTable):
    """``[target] lvmthin = { vg = "pve", pool = "data" }``: an LVM-thin pool where iomatrix
    makes a thin volume of [target] size per image (``iomatrix-<run>-…``), as Proxmox VE's
    ``lvmthin`` storage (``local-lvm``) puts a VM's disk, and removes it at the end. The run is
    refused when the pool's data or metadata use would pass a safe bound with its volumes
    written fully (``iomatrix.targets.lvm``)."""

    needs_size: ClassVar[bool] = True
    """iomatrix makes volumes there: [target] size says how big."""
    local_volumes: ClassVar[bool] = True

    vg: VgName
    """The volume group holding the thin pool (Proxmox VE's ``vgname``)."""
    pool: LvName
    """The thin pool's logical volume (Proxmox VE's ``thinpool``: ``data`` for a fresh
    install's ``local-lvm``)."""

    @property
    def location(self) -> str:
        return f"LVM-thin pool {self.vg}/{self.pool}"

    @property
    def storage_kind(self) -> str:
        """Proxmox VE's ``lvmthin`` storage type."""
        return "lvmthin"


_UNSAFE_BTRFS_PATH = re.compile(r"[\x00-\x1f\x7f$\\]")
"""What a btrfs path may not hold: the images made there are named in fio's job files, which
read ``$`` as a variable and ``\\`` as an escape."""


class BtrfsTarget(KindTable):
    """``[target] btrfs = { path = "/mnt/btrfs", nocow = false }``: a directory on a btrfs
    filesystem, where iomatrix makes one subvolume of its own per run (``iomatrix-…``), its
    images in it, and deletes it at the end (``iomatrix.targets.btrfs``), as Proxmox VE's
    ``btrfs`` storage puts each raw disk in a subvolume of its own. The path and every directory
    above it must be root's (or the user's) and writable by nobody else."""

    needs_size: ClassVar[bool] = True
    """iomatrix makes images there: [target] size (or working_set = "exceed-ram") says how big."""
    local_volumes: ClassVar[bool] = True
    """Files on this host's btrfs: QEMU opens them with its file driver, every aio evaluated."""

    path: Path
    """An existing directory on btrfs (a Proxmox VE btrfs storage's ``path``/images)."""
    nocow: bool = False
    """Proxmox VE's ``nocow 1``: the subvolume gets the No_COW attribute (``chattr +C``) before
    the images are made, which they inherit: no copy-on-write and no data checksums, and
    qemu-server then gives cache=none as on other storage."""

    @field_validator("path")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        text = str(value)
        if not value.is_absolute() or text != text.strip() or _UNSAFE_BTRFS_PATH.search(text):
            raise ValueError("write the directory's full path (e.g. \"/mnt/btrfs\"), without "
                             "control characters, '$' or '\\'")
        return value

    @property
    def location(self) -> str:
        return f"btrfs {self.path}" + (" (nocow)" if self.nocow else "")

    @property
    def named(self) -> str:
        return f"[target] btrfs {self.path}"

    @property
    def image_directory(self) -> Path:
        return self.path

    @property
    def storage_kind(self) -> str:
        """Proxmox VE's btrfs storage, "btrfs-nocow" with ``nocow`` (``platform.proxmox``:
        without it qemu-server gives no cache=none)."""
        return "btrfs-nocow" if self.nocow else "btrfs"


_STORAGE_ID = r"^[A-Za-z][A-Za-z0-9\-_.]{0,99}$"
"""A Proxmox VE storage id (pve-storage's ``pve-storage-id`` format): it reaches pvesm's command
line, so nothing it could read as an option."""
_STORAGE_TYPE = r"^[a-z][a-z0-9]{0,39}$"
"""A storage.cfg type (a section header's ``TYPE:``)."""


class PvesmTarget(KindTable):
    """``[target] pvesm = { storage = "local-lvm" }``: a Proxmox VE storage on a Proxmox VE host,
    where iomatrix allocates a volume of [target] size per image through Proxmox's own storage
    layer (``pvesm alloc``, ``pvesm path``, ``pvesm free``: a third-party plugin's storage
    too), owned by a VM id iomatrix reserves (``iomatrix.targets.pvesm``), and frees it at the
    end. ``[target] storage = "ID"`` resolves to it on a Proxmox VE host."""

    needs_size: ClassVar[bool] = True
    """iomatrix makes volumes there: [target] size says how big."""
    local_volumes: ClassVar[bool] = True

    storage: Annotated[str, Field(pattern=_STORAGE_ID)]
    """The storage's id (``local-lvm``)."""
    type: Annotated[str | None, Field(pattern=_STORAGE_TYPE)] = None
    """Its type as storage.cfg says it (``lvmthin``): the rules qemu-server applies to a VM's
    disks there (aio, cache). Filled in when ``storage = "ID"`` resolves; the run checks it
    against ``pvesm status``. None: pvesm's answer, other storage to the rules."""

    @property
    def location(self) -> str:
        return f"Proxmox VE storage {self.storage}"

    @property
    def storage_kind(self) -> str | None:
        """The storage's type as storage.cfg says it."""
        return self.type


_ZFS_COMPONENT = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}"
_ZFS_DATASET = re.compile(rf"[A-Za-z][A-Za-z0-9_.-]{{0,99}}(?:/{_ZFS_COMPONENT}){{0,15}}")
"""A dataset name as iomatrix accepts it: ZFS's own rules (zfs_namecheck.c) narrowed to
nothing a tool or QEMU's option syntax reads (no ``@`` snapshot, ``#`` bookmark, ``%``, ``:``
or blank)."""
_ZPOOL_RESERVED = re.compile(r"mirror|raidz\d?|draid\d?|spare|log|c\d.*")
"""Names zpool keeps for vdev types (and Solaris disk names): never a pool's."""
_VOLBLOCKSIZE = re.compile(r"([1-9][0-9]{0,7})([kKmM]?)")
VOLBLOCKSIZE_MIN = 512
VOLBLOCKSIZE_MAX = 16 << 20
"""The volblocksizes iomatrix gives: what OpenZFS takes (SPA_MINBLOCKSIZE to SPA_MAXBLOCKSIZE,
above 128k with the pool's large_blocks feature) and Proxmox VE's zfspool ``blocksize``
accepts. Blocks past 1M make every small write a read-modify-write of the whole block: a
storage.cfg may still say so, and is measured as it is."""


def dataset_name(value: str) -> str:
    """``value`` as a ZFS dataset name iomatrix hands to zfs (``pool`` or ``pool/a/b``), or
    ValueError: letters, digits, ``_ . -``, components joined by ``/``, the pool's starting with
    a letter and no other's with ``-`` or ``.``, the pool not a name zpool reserves."""
    if not isinstance(value, str) or len(value) > 200 or not _ZFS_DATASET.fullmatch(value):
        raise ValueError(f"{str(value)[:60]!r} is not a ZFS dataset name iomatrix accepts: "
                         "write pool or pool/dataset (letters, digits, _ . -, the pool "
                         "starting with a letter), e.g. \"rpool/data\"")
    if _ZPOOL_RESERVED.fullmatch(value.split("/")[0]):
        raise ValueError(f"{value[:60]!r} is not a ZFS dataset name iomatrix accepts: "
                         f"{value.split('/')[0]!r} is a name zpool reserves")
    return value


def volblocksize_bytes(value: str | int) -> int:
    """The bytes of a volblocksize as a suite writes it (``"16k"``, ``"1M"``, ``"512"``, or a
    number of bytes): a power of two from 512 bytes to 16 MiB, else ValueError."""
    text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    found = _VOLBLOCKSIZE.fullmatch(text) if isinstance(text, str) else None
    if found is None:
        raise ValueError(f"volblocksize {str(value)[:30]!r}: write a power of two with an "
                         "optional k or M, e.g. \"16k\"")
    n = int(found.group(1)) << {"": 0, "k": 10, "m": 20}[found.group(2).lower()]
    if not VOLBLOCKSIZE_MIN <= n <= VOLBLOCKSIZE_MAX or n & (n - 1):
        raise ValueError(f"volblocksize {value!r}: a power of two from 512 to 16M "
                         "(4k, 8k, 16k, 64k, 128k...)")
    return n


def volblocksize_text(n: int) -> str:
    """``16384`` → ``16K``, as zfs prints it and is given it."""
    return f"{n >> 20}M" if n >= 1 << 20 else f"{n >> 10}K" if n >= 1024 else str(n)


def _volblocksize(value: object) -> object:
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if isinstance(value, str):
        volblocksize_bytes(value)
    return value


ZfsDataset = Annotated[str, AfterValidator(dataset_name)]
"""A ZFS dataset name (``dataset_name``)."""
Volblocksize = Annotated[str, BeforeValidator(_volblocksize)]
"""A zvol's volblocksize as written (``"16k"``; a number of bytes is taken too), checked
(``volblocksize_bytes``)."""
DEFAULT_VOLBLOCKSIZE = "16k"
"""Proxmox VE 8's and OpenZFS 2.2's default for a new zvol."""


class ZfsTarget(KindTable):
    """``[target] zfs = { pool = "rpool/data", volblocksize = "16k" }``: a ZFS dataset where
    iomatrix makes a zvol of [target] size per image (``iomatrix-<run>-…``), as Proxmox VE's
    ``zfspool`` storage (``local-zfs``) puts a VM's disk (``zfs create -b VOLBLOCKSIZE -V
    SIZE``, ``-s`` when sparse), measures it as the block device /dev/zvol/POOL/NAME and
    destroys it at the end (``iomatrix.targets.zfs``). The run records the dataset's
    compression, sync and primarycache and the ZFS version. Raw only."""

    needs_size: ClassVar[bool] = True
    """iomatrix makes zvols there: [target] size says how big."""
    local_volumes: ClassVar[bool] = True

    pool: ZfsDataset
    """The dataset the zvols are made in (Proxmox VE's ``pool``: ``rpool/data`` for a fresh
    ZFS install's ``local-zfs``)."""
    volblocksize: Volblocksize = DEFAULT_VOLBLOCKSIZE
    """Each zvol's block size (``zfs create -b``; Proxmox VE's ``blocksize``): a power of two
    from 512 to 16M (OpenZFS's limits; above 128k the pool needs large_blocks). 16k is Proxmox VE 8's and OpenZFS 2.2's default."""
    sparse: bool = False
    """Thin zvols (``zfs create -s``, Proxmox VE's ``sparse 1``): no reservation; the pool's
    available space must still hold them written fully."""

    @property
    def volblocksize_bytes(self) -> int:
        """``volblocksize`` in bytes."""
        return volblocksize_bytes(self.volblocksize)

    @property
    def location(self) -> str:
        return f"ZFS dataset {self.pool}"

    @property
    def storage_kind(self) -> str:
        """Proxmox VE's ``zfspool`` storage type."""
        return "zfspool"
