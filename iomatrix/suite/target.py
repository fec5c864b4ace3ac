"""[target] and [[targets]]: where the images live, as a suite names it: a directory, a device,
a Proxmox VE storage id, or storage with a table of its own (a Ceph RBD pool; an iSCSI LUN:
``TABLES``). Only what the user writes, checked; what a run does with each kind is
``iomatrix.targets`` (``iomatrix.targets.registry``).

Credentials are never written in a suite: a target names the files that hold them (a Ceph
keyring, an iSCSI CHAP file), which only iomatrix's connecting code reads; a suite, and so the
stored run, the report and an export, hold only their paths."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, Field, ValidationInfo, field_validator, model_validator

from iomatrix.core.model import Frozen
from iomatrix.suite.fields import TARGET_NAME, Size, WorkingSet, as_tuple
from iomatrix.suite.kindtable import KindTable
from iomatrix.suite.volumes import (BtrfsTarget, LvmTarget, LvmThinTarget, PvesmTarget,
                                    ZfsTarget)

_UNSAFE_PATH = re.compile(r"[\x00-\x1f\x7f$\\]")
"""What a target path may not hold: fio reads its job file line by line and expands ``$``
(``${VAR}``, ``$ncpus``); ``\\`` is its escape character (iomatrix escapes ``:`` as ``\\:``)."""


_NAME = r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$"
"""A Ceph pool, namespace or client name as iomatrix accepts it: it is written into a
configuration file, QEMU options and an rbd command line, so nothing those read as syntax."""
_MONITOR = re.compile(r"^(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9][A-Za-z0-9.-]*)(?::\d{1,5})?$")
"""``host``, ``host:port``, ``[v6]`` or ``[v6]:port``; a port of 0 or above 65535 is refused
by the validator."""
_UNSAFE = re.compile(r"[\x00-\x1f\x7f,;=\\$#\[\]]")
"""What a file path given to Ceph may not hold: ceph.conf reads ``#``/``;`` as comments and
``$`` as a metavariable, QEMU's -drive reads ``,`` and ``:`` ``\\``-escaped."""


def _file(value: Path) -> Path:
    text = str(value)
    if _UNSAFE.search(text) or text != text.strip():
        raise ValueError("a file path given to Ceph may not hold control characters, blanks "
                         "at either end, or any of , ; = \\ $ # [ ]")
    if not value.is_absolute():
        raise ValueError("write the file's full path, e.g. /etc/ceph/ceph.conf")
    return value


CephFile = Annotated[Path, AfterValidator(_file)]
CephName = Annotated[str, Field(min_length=1, max_length=100, pattern=_NAME)]


def _monitor(value: str) -> str:
    found = _MONITOR.match(value)
    port = value.rpartition(":")[2] if found and not value.endswith("]") and ":" in value else None
    if found is None or (port is not None and not 0 < int(port) < 65536):
        raise ValueError(f"monitor {value!r}: write host, host:port or [IPv6]:port "
                         "(e.g. \"192.0.2.10:3300\")")
    return value


Monitor = Annotated[str, AfterValidator(_monitor)]


class RbdTarget(KindTable):
    """``[target] rbd = { pool = "rbd", conf = "/etc/ceph/ceph.conf", client = "admin",
    keyring = "/etc/ceph/ceph.client.admin.keyring" }``: a Ceph pool iomatrix creates its own
    images in (``iomatrix-<run>-…``), reached through librbd. Give ``conf`` (the cluster's
    ceph.conf, which names the monitors) or ``monitors``, or both (the monitors win over the
    file's). iomatrix hands no program this file: it reads only the monitors, the fsid and the
    keyring's path from it, and writes a ceph.conf of its own (``iomatrix.targets.rbd``)."""

    needs_size: ClassVar[bool] = True
    """iomatrix makes images there: [target] size (or working_set = "exceed-ram") says how big."""

    pool: CephName
    """The pool the images are made in."""
    namespace: CephName | None = None
    """An RBD namespace in the pool; absent: none."""
    conf: CephFile | None = None
    """The cluster's ceph.conf: iomatrix reads only the monitors, the fsid and the
    keyring's path from it and hands it to no program (it writes a ceph.conf of its own); or give
    ``monitors``."""
    monitors: tuple[Monitor, ...] = ()
    """The monitors' addresses (``"192.0.2.10:3300"``), instead of ``conf``."""
    client: CephName = "admin"
    """The cephx user without ``client.`` (Proxmox VE's ``username``)."""
    keyring: CephFile | None = None
    """The keyring file of ``client``; None: the one ``conf`` names, else librados' own search
    (/etc/ceph/ceph.client.NAME.keyring, …; no cephx without one). A file of secrets: held to
    rule 1 and mode 0600 (``iomatrix.core.trust.private_file``)."""
    connect_timeout: float = Field(default=20.0, gt=0, le=600)
    """Seconds the monitors get to answer and authenticate (``client_mount_timeout``): a
    wrong address or key fails within it."""
    krbd: bool = False
    """Proxmox VE's ``krbd 1``: guests get the image as the kernel maps it (/dev/rbd*), not
    through librbd. Needs the kernel's rbd module."""

    @field_validator("monitors", mode="before")
    @classmethod
    def _listed(cls, value: Any) -> Any:
        return (value,) if isinstance(value, str) else value

    @model_validator(mode="after")
    def _reachable(self) -> "RbdTarget":
        if self.conf is None and not self.monitors:
            raise ValueError("give conf = \"/etc/ceph/ceph.conf\" or monitors = [\"host:port\", "
                             "...]: iomatrix needs to know where the cluster's monitors are")
        if len(self.monitors) > 16:
            raise ValueError("at most 16 monitors")
        return self

    @property
    def storage_kind(self) -> str:
        """librbd, or the kernel's rbd with ``krbd``."""
        return "krbd" if self.krbd else "rbd"

    @property
    def location(self) -> str:
        return f"rbd pool {self.spec}"

    @property
    def spec(self) -> str:
        """``pool`` or ``pool/namespace``, as the rbd command names where images are."""
        return "/".join(p for p in (self.pool, self.namespace) if p)


DEFAULT_PORT = 3260
_HOST = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252})|\[[0-9A-Fa-f:.]{2,45}\])$")
_IQN = re.compile(r"^(?:iqn\.\d{4}-\d{2}\.[a-z0-9][a-z0-9.-]*(?::[A-Za-z0-9.:_-]{1,200})?"
                  r"|eui\.[0-9A-Fa-f]{16}|naa\.[0-9A-Fa-f]{16,32})$")
"""RFC 3720 §3.2.6.3 names, restricted to what reaches QEMU's option syntax safely (no comma,
no blank, no slash: the name is a component of an ``iscsi://`` URL)."""


class IscsiTarget(KindTable):
    """``[target] iscsi = { portal = "192.0.2.10:3260", target = "iqn.…", lun = 0 }``: one LUN of
    an iSCSI target, written to and destroyed like a device (``allow_destroy``)."""

    destroys: ClassVar[bool] = True
    """Written to and destroyed: needs ``allow_destroy = true``."""
    whole_device: ClassVar[bool] = True

    portal: str = Field(max_length=300)
    """``host:port`` (port 3260 when left out); an IPv6 address in brackets."""
    target: str = Field(max_length=223)
    """The target's name: ``iqn.…``, ``eui.…`` or ``naa.…``."""
    lun: Annotated[int, Field(ge=0, le=16383)] = 0
    """The LUN's number (0 when left out)."""
    chap: Path | None = None
    """A file holding ``user = "…"`` and ``password = "…"`` (TOML), mode 0600: read when a
    session starts, never copied anywhere."""
    connect_timeout: Annotated[float, Field(gt=0, le=300)] = 10.0
    """Seconds to wait for the portal to answer before the run is refused."""

    @field_validator("portal")
    @classmethod
    def _portal(cls, value: str) -> str:
        host, port = split_portal(value)
        if not _HOST.match(host):
            raise ValueError(f"{value!r} is not host:port (e.g. \"192.0.2.10:3260\")")
        if not 0 < port < 65536:
            raise ValueError(f"{value!r}: the port must be between 1 and 65535")
        return f"{host}:{port}"

    @field_validator("target")
    @classmethod
    def _iqn(cls, value: str) -> str:
        if not _IQN.match(value):
            raise ValueError(f"{value[:60]!r} is not an iSCSI name (e.g. "
                             "\"iqn.2003-01.org.example:storage.lun1\")")
        return value

    @field_validator("chap")
    @classmethod
    def _absolute(cls, value: Path | None) -> Path | None:
        if value is not None and (not value.is_absolute() or re.search(r"[\x00-\x1f]", str(value))):
            raise ValueError("write the credentials file's full path, e.g. /root/iscsi-chap.toml")
        return value

    @property
    def url(self) -> str:
        """``iscsi://portal/target/lun``, as QEMU and Proxmox VE write it (no credentials)."""
        return f"iscsi://{self.portal}/{self.target}/{self.lun}"

    @property
    def location(self) -> str:
        return self.url

    @property
    def named(self) -> str:
        """The LUN as a refusal names it."""
        return f"iSCSI LUN {self.url}"


def split_portal(value: str) -> tuple[str, int]:
    """``host:port`` → (host, port); the default port when none is given."""
    host, port = value, DEFAULT_PORT
    found = re.match(r"^(\[[^\]]*\]|[^:]*)(?::(\d{1,5}))?$", value)
    if found:
        host = found.group(1)
        port = int(found.group(2)) if found.group(2) else DEFAULT_PORT
    return host, port


TABLES: dict[str, type[KindTable]] = {"rbd": RbdTarget, "iscsi": IscsiTarget, "lvm": LvmTarget,
                                      "lvmthin": LvmThinTarget,
                                      "btrfs": BtrfsTarget, "pvesm": PvesmTarget,
                                      "zfs": ZfsTarget}
"""[target] key → the table of a kind of storage with keys of its own, each a ``Target`` field
of that name (the kind itself, what a run does with it: ``iomatrix.targets.registry``)."""
NETWORK_KINDS = tuple(TABLES)
"""The [target] keys naming storage with a table of its own (``Target.network``)."""
KIND_KEYS = ("directory", "device", *TABLES, "storage")
"""The [target] keys that say what the target is: exactly one of them is given."""


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


class StorageOrigin(Frozen):
    """The Proxmox VE storage a [target] was resolved from (``[target] storage = "ID"``,
    ``iomatrix run --storage ID``, or the main job's choice on a Proxmox VE host:
    ``iomatrix.measure.pvestorage``). iomatrix writes it into the spec the run stores, so that
    recommend and the report name the storage after it was resolved into a directory or a
    volume; a suite file need not write it."""

    id: str = Field(max_length=100, pattern=STORAGE_ID)
    """The storage id (``local-lvm``)."""
    type: str = Field(max_length=40, pattern=r"^[a-z][a-z0-9]*$")
    """Its type in storage.cfg (``lvmthin``, ``dir``, ``rbd``, …)."""
    volume_chain: bool = False
    """storage.cfg's ``snapshot-as-volume-chain 1``."""
    chosen: str = Field(default="", max_length=2000)
    """Why this storage was measured (the main job's choice), as the run's notes say it."""


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
    lvm: LvmTarget | None = None
    """An LVM volume group (``[target] lvm = { vg = "pve" }``): iomatrix makes thick volumes
    of its own there and removes them (``LvmTarget``)."""
    lvmthin: LvmThinTarget | None = None
    """An LVM-thin pool (``[target] lvmthin = { vg = "pve", pool = "data" }``): iomatrix makes
    thin volumes of its own there and removes them (``LvmThinTarget``)."""
    btrfs: BtrfsTarget | None = None
    """A directory on btrfs (``[target] btrfs = { path = "/mnt/btrfs" }``): iomatrix makes a
    subvolume of its own there for the run's images and deletes it (``BtrfsTarget``)."""
    pvesm: PvesmTarget | None = None
    """A Proxmox VE storage through pvesm on a Proxmox VE host (``[target] pvesm = { storage =
    "local-lvm" }``): iomatrix allocates volumes of its own there and frees them
    (``PvesmTarget``)."""
    zfs: ZfsTarget | None = None
    """A ZFS dataset (``[target] zfs = { pool = "rpool/data" }``): iomatrix makes zvols of its
    own there and destroys them (``ZfsTarget``)."""
    storage: str | None = Field(default=None, max_length=100, pattern=STORAGE_ID)
    """A Proxmox VE storage id (``ID:lunN`` for a LUN of an iSCSI storage); ``iomatrix run
    --storage-cfg`` says where its definition is."""
    from_storage: StorageOrigin | None = None
    """The Proxmox VE storage the target was resolved from (``StorageOrigin``): written by
    iomatrix as it resolves a storage id, kept with the run."""
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
        given = [k for k in KIND_KEYS if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give one of directory (with size), device (with allow_destroy = "
                             "true), " + ", ".join(NETWORK_KINDS) + " (a table, with size) or "
                             "storage (a Proxmox VE storage id)"
                             + (f", not {' and '.join(given)}" if given else ""))
        table = self.network
        if (table is not None and table.needs_size and self.size is None
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
        if table is not None and table.destroys and not self.allow_destroy:
            raise ValueError(f"{table.named} is written to and destroyed; "
                             "say so with allow_destroy = true")
        return self

    @property
    def network(self) -> "KindTable | None":
        """The kind's own table given (``TABLES``), or None for a directory, device or
        storage id."""
        return next((getattr(self, k) for k in TABLES if getattr(self, k) is not None), None)

    @property
    def destroyed(self) -> str | None:
        """What the target writes over, as a refusal names it: the device, or a kind's table
        that destroys (an iSCSI LUN's URL); None when it makes images of its own."""
        table = self.network
        if self.device is not None:
            return str(self.device)
        return table.location if table is not None and table.destroys else None

    @property
    def whole_device(self) -> bool:
        """A whole device is measured: [target] device, or a kind's table that is one (an
        iSCSI LUN)."""
        table = self.network
        return self.device is not None or (table is not None and table.whole_device)

    @property
    def kind(self) -> str:
        """directory, device, storage, or the network kind (rbd, iscsi)."""
        return next(k for k in KIND_KEYS if getattr(self, k) is not None)

    @property
    def described(self) -> str:
        """The storage measured, as recommend and the report name it: the Proxmox VE storage
        it was resolved from (``lvmthin local-lvm``; a directory with its path), else where
        it is (``directory /var/tmp/iomatrix``, its table's ``location``: ``rbd pool rbd``,
        ``LVM-thin pool pve/data``)."""
        origin, table = self.from_storage, self.network
        where = self.directory or self.device
        if origin is not None:
            return f"{origin.type} {origin.id}" + (f" ({where})" if where is not None else "")
        if table is not None:
            return table.location
        fs = f" ({', '.join(self.filesystems)})" if self.filesystems else ""
        return f"{self.kind} {where or self.storage}{fs}"

    @property
    def host_page_cache(self) -> bool:
        """QEMU reaches its images through this host's files or block devices, so a cache mode
        without ``cache.direct`` goes through the host page cache (``[RAM]``); False for network
        storage QEMU reaches with a client of its own (librbd, libiscsi), whose own caches
        (``rbd_cache``) the faster-than-bare-metal rule judges instead."""
        table = self.network
        return table is None or table.local_volumes

    @property
    def storage_kind(self) -> str | None:
        """What Proxmox VE's aio and cache rules see the target as: its table's
        (``KindTable.storage_kind``), else the type of the Proxmox VE storage it was resolved
        from (a dir, nfs or cifs storage's directory); None: other storage."""
        table = self.network
        kind = table.storage_kind if table is not None else None
        return kind or (self.from_storage.type if self.from_storage is not None else None)



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
