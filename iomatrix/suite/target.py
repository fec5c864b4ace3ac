"""[target] and [[targets]]: where the images live, as a suite names it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from iomatrix.core.model import Frozen
from iomatrix.suite.fields import TARGET_NAME, Size, WorkingSet, as_tuple
from iomatrix.suite.network import NETWORK_KINDS, IscsiTarget, RbdTarget

_UNSAFE_PATH = re.compile(r"[\x00-\x1f\x7f$\\]")
"""What a target path may not hold: fio reads its job file line by line and expands ``$``
(``${VAR}``, ``$ncpus``); ``\\`` is its escape character (iomatrix escapes ``:`` as ``\\:``)."""


TargetFilesystem = Literal["ext4", "xfs", "btrfs"]
"""The filesystems a run can measure side by side on one directory ([target] filesystems)."""

def _target_path(value: Path | None, key: str) -> Path | None:
    """A [target] path as fio and qemu-img will get it: absolute (a relative ``nbd:x`` would
    read as a protocol to qemu-img), with nothing fio reads as syntax."""
    if value is None:
        return None
    text = str(value)
    if _UNSAFE_PATH.search(text):
        raise ValueError("a target path may not hold control characters, '$' or '\\' "
                         "(fio would read them as a line break, a variable or an escape)")
    if text != text.strip():
        raise ValueError("a target path may not begin or end with a blank")
    if key == "device" and not value.is_absolute():
        raise ValueError("write the device's full path, e.g. /dev/sdb")
    if value.is_absolute():
        return value
    try:
        return Path.cwd() / value
    except OSError as exc:
        raise ValueError(f"a relative path needs a current directory ({exc.strerror}); "
                         "write the full path") from None


STORAGE_ID = r"^[A-Za-z][A-Za-z0-9\-_.]*(?::[A-Za-z0-9\-_.]{1,100})?$"
"""A Proxmox VE storage id (pve-storage's ``pve-storage-id`` format); for an iSCSI storage,
with the LUN as Proxmox VE names its volumes (``ID:lunN``, checked by ``resolve_storage``)."""


class Target(Frozen):
    """Where the images live: a directory (files are created there), a whole block device, or
    network storage (``network``: a Ceph RBD pool, or an iSCSI LUN, a whole device), or a Proxmox VE storage named by its id
    (``storage``, resolved into one of those from storage.cfg before the run:
    ``iomatrix.targets.network.resolve_storage``)."""

    directory: Path | None = None
    """A directory on the storage to measure: the run makes a private directory there for its
    images and removes it at the end. It and every directory above it must be root's (or the
    user's) and writable by nobody else."""
    size: Size | None = None
    """The size of each image ("4GiB"); on a device, the region measured (default: all of it).
    Needed for a directory and a Ceph pool."""
    device: Path | None = None
    """A whole block device ("/dev/nvme1n1"), written to and destroyed: needs
    ``allow_destroy = true``, and is refused while it (or a partition of it) is mounted, is swap,
    has holders (LVM, MD, dm-crypt) or cannot be opened exclusively."""
    allow_destroy: bool = False
    """Says that the device or iSCSI LUN may be written to: what is on it is destroyed."""
    rbd: RbdTarget | None = None
    """A Ceph RBD pool (``[target] rbd = { pool = ..., conf = ... }``): iomatrix creates its own
    images there and removes them (``RbdTarget``)."""
    iscsi: IscsiTarget | None = None
    """[target.iscsi]: an iSCSI LUN, written to and destroyed like a device
    (``iomatrix.targets.iscsi``)."""
    storage: str | None = Field(default=None, max_length=100, pattern=STORAGE_ID)
    """A Proxmox VE storage id (``ID:lunN`` for a LUN of an iSCSI storage); ``iomatrix run
    --storage-cfg`` says where its definition is."""
    allow_tmpfs: bool = False
    """The directory is on tmpfs (RAM) on purpose: no warning that figures measure memory."""
    working_set: WorkingSet = "size"
    """For cache modes that use the host page cache (writethrough, writeback, unsafe): "size",
    images of ``size`` (a run notes when they fit in the page cache); "exceed-ram", images of
    twice the host's RAM (at least ``size``) so the page cache cannot hold them
    (``iomatrix.targets.workspace``); "in-ram", a working set that fits in RAM is what is meant
    to be measured (no note; recommend still says so)."""

    @field_validator("directory", "device")
    @classmethod
    def _path(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        return _target_path(value, info.field_name)

    filesystems: tuple[TargetFilesystem, ...] = ()
    """Several targets from one directory, one per filesystem named (each a target of that name,
    ``Suite.named_targets``): the directory itself for the filesystem it is on, a filesystem
    iomatrix makes on a loop device backed by a file in the run's directory for every other
    (``iomatrix.targets.targets``); one whose mkfs or kernel support is missing is skipped, with
    a note."""

    @field_validator("filesystems", mode="before")
    @classmethod
    def _listed(cls, value: Any) -> Any:
        return as_tuple(value)

    @model_validator(mode="after")
    def _one_kind(self) -> "Target":
        given = [k for k in ("directory", "device", *NETWORK_KINDS, "storage")
                 if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give one of directory (with size), device (with allow_destroy = "
                             "true), " + ", ".join(NETWORK_KINDS) + " (a table, with size) or "
                             "storage (a Proxmox VE storage id)"
                             + (f", not {' and '.join(given)}" if given else ""))
        if (self.rbd is not None and self.size is None  # a LUN's size is its own
                and self.working_set != "exceed-ram"):
            raise ValueError(f"a {given[0]} target needs a size for the images iomatrix creates "
                             "there, e.g. size = \"4GiB\"")
        if self.filesystems and self.directory is None:
            raise ValueError("filesystems are made in a directory target (a device is measured "
                             "as it is): give directory, or drop filesystems")
        if len(set(self.filesystems)) != len(self.filesystems):
            raise ValueError("filesystems names a filesystem twice")
        if self.directory is not None and self.size is None and self.working_set != "exceed-ram":
            raise ValueError("a directory target needs a size, e.g. size = \"4GiB\" (or "
                             "working_set = \"exceed-ram\": twice the host's RAM)")
        if self.size is not None and self.size < 1024 * 1024:
            raise ValueError(f"size {self.size} is below the minimum of 1MiB")
        if self.device is not None and not self.allow_destroy:
            raise ValueError(f"device {self.device} is written to and destroyed; "
                             "say so with allow_destroy = true")
        if self.iscsi is not None and not self.allow_destroy:
            raise ValueError(f"iSCSI LUN {self.iscsi.url} is written to and destroyed; "
                             "say so with allow_destroy = true")
        return self

    @property
    def network(self) -> "RbdTarget | IscsiTarget | None":
        """The network storage table given (``NETWORK_KINDS``), or None."""
        return next((getattr(self, k) for k in NETWORK_KINDS if getattr(self, k) is not None),
                    None)

    @property
    def kind(self) -> str:
        """directory, device, storage, or the network kind (rbd, iscsi)."""
        return next(k for k in ("directory", "device", *NETWORK_KINDS, "storage")
                    if getattr(self, k) is not None)



class NamedTarget(Target):
    """One [[targets]] table: a target of its own name in a run that measures several (each
    configuration on each target, each target with its own bare-metal baseline). Keys it does
    not give come from [target] (which then holds only what the targets share: size,
    working_set, allow_tmpfs)."""

    name: str = Field(min_length=1, max_length=40, pattern=TARGET_NAME)
    """What the target is called: letters, digits, ``.``, ``_`` and ``-``; part of every
    configuration's key (``.../target=NAME``) and label (``... on NAME``)."""
    filesystem: TargetFilesystem | None = None
    """The directory's filesystem must be this one: the directory itself when it is on it,
    otherwise a filesystem iomatrix makes on a loop device backed by a file in the run's
    directory there; the run is refused when that cannot be done (mkfs or kernel support
    missing)."""

    @model_validator(mode="after")
    def _single(self) -> "NamedTarget":
        if self.filesystems:
            raise ValueError("filesystems is a [target] key; a [[targets]] table names one "
                             "filesystem (filesystem = \"xfs\")")
        if self.filesystem is not None and self.directory is None:
            raise ValueError("filesystem is made in a directory target: give directory")
        if self.directory is None and self.device is None:
            raise ValueError(f"a {self.kind} target is measured in a run of its own ([target]), "
                             "not as one of several [[targets]]")
        return self
