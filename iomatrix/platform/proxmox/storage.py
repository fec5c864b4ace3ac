"""``/etc/pve/storage.cfg`` and a drive's volume on it (pure): pve-storage's parse_volname,
path and qemu_blockdev_options for each storage type, as the volume QEMU opens."""

from __future__ import annotations

import re
from typing import Any, Callable, Literal, NamedTuple

from iomatrix.core.model import Frozen
from iomatrix.platform.proxmox.config import Drive


FILE_STORAGES = ("dir", "nfs", "cifs", "btrfs", "cephfs")
BLOCK_STORAGES = ("lvm", "lvmthin", "zfspool", "iscsi")
STORAGE_TYPES = (*FILE_STORAGES, *BLOCK_STORAGES, "rbd", "zfs", "iscsidirect")
CDROM_PATH = "/dev/cdrom"
"""Drive.pm get_cdrom_path: the first of /dev/cdrom, /dev/cdrom1, /dev/cdrom2 that exists."""
CEPH_PRIV = "/etc/pve/priv/ceph"


class Storage(Frozen):
    """One storage of ``/etc/pve/storage.cfg``, as far as a drive's arguments depend on it."""

    id: str
    type: str
    path: str | None = None
    vgname: str | None = None
    thinpool: str | None = None
    """lvmthin: the thin pool LV in ``vgname`` (LvmThinPlugin.pm; the installer's is "data")."""
    pool: str | None = None
    blocksize: str | None = None
    """zfspool: the zvols' volblocksize (ZFSPoolPlugin.pm ``zfs create -b``); None: ZFS's own
    default (16k since OpenZFS 2.2)."""
    sparse: bool = False
    """zfspool: thin-provisioned zvols (``zfs create -s``)."""
    disable: bool = False
    """``disable 1``: Proxmox VE neither activates nor allocates on it."""
    krbd: bool = False
    nocow: bool = False
    monhost: str | None = None
    """rbd: the monitors of an external cluster; none: a cluster Proxmox VE manages (pveceph)."""
    username: str | None = None
    namespace: str | None = None
    fsid: str | None = None
    """rbd with krbd: the cluster's fsid, in ``/dev/rbd-pve/<fsid>/…``. A host's storage.cfg
    does not hold it (qemu-server asks the monitors, or reads /etc/pve/ceph.conf); the copy
    given to iomatrix may (``fsid <uuid>``, as qemu-server's own tests write it)."""
    portal: str | None = None
    target: str | None = None
    content: tuple[str, ...] | None = None
    """The content types it holds; None when storage.cfg does not say (the type's default)."""
    content_dirs: tuple[tuple[str, str], ...] = ()
    volume_chain: bool = False
    """``snapshot-as-volume-chain 1``: snapshots as qcow2 backing files."""
    shared: bool = False
    """``shared 1``: every node of the cluster sees the storage (a SAN's LVM), and pve-storage
    allocates there under a cluster-wide lock."""
    keyring: bool = True
    """rbd: /etc/pve/priv/ceph/ID.keyring exists (Proxmox VE writes it when the storage is
    added): cephx as ``username``. False: no auth (``auth-client-required`` none)."""
    ceph_conf: bool = True
    """rbd with monhost: /etc/pve/priv/ceph/ID.conf exists (written when the storage is added)."""
    nodes: tuple[str, ...] | None = None
    """``nodes a,b``: the cluster nodes it is available on; None: every node."""

    @property
    def kind(self) -> str:
        """The storage as the aio and cache rules see it: rbd with krbd is "krbd", btrfs without
        nocow "btrfs", with it "btrfs-nocow"."""
        if self.type == "rbd":
            return "krbd" if self.krbd else "rbd"
        if self.type == "btrfs" and self.nocow:
            return "btrfs-nocow"
        return self.type

    def allocation_problem(self) -> str | None:
        """Why Proxmox VE would allocate no VM disk here (disabled; content without
        ``images``); None: it would."""
        if self.disable:
            return f"storage {self.id} is disabled (disable 1): Proxmox VE allocates nothing there"
        if self.content is not None and "images" not in self.content:
            return (f"storage {self.id} does not hold VM disk images (content "
                    f"{','.join(self.content) or 'none'}): Proxmox VE puts no VM disk there")
        return None


DEFAULT_STORAGES = {
    "local": Storage(id="local", type="dir", path="/var/lib/vz"),
    "local-lvm": Storage(id="local-lvm", type="lvmthin", vgname="pve", thinpool="data"),
    "local-zfs": Storage(id="local-zfs", type="zfspool", pool="rpool/data"),
}
"""What a fresh Proxmox VE installation's storage.cfg defines (ext4/xfs: local + local-lvm;
ZFS: local + local-zfs)."""
_CFG_TEXT = ("path", "vgname", "thinpool", "pool", "blocksize", "monhost", "username", "namespace", "fsid", "portal",
             "target")
_CFG_FLAGS = {"krbd": "krbd", "nocow": "nocow", "snapshot-as-volume-chain": "volume_chain",
              "sparse": "sparse", "disable": "disable", "shared": "shared"}


def parse_storage_cfg(text: str) -> dict[str, Storage]:
    """``/etc/pve/storage.cfg`` → storage id → Storage (``TYPE: ID`` headers, indented
    ``key value`` lines)."""
    out: dict[str, Storage] = {}
    current: dict[str, Any] | None = None
    for raw in [*text.splitlines(), ""]:
        line = raw.rstrip()
        header = re.match(r"^([a-z0-9]+):\s*(\S+)\s*$", line)
        if header or not line.strip():
            if current is not None:
                out[current["id"]] = Storage(**current)
                current = None
            if header:
                current = {"type": header.group(1), "id": header.group(2)}
            continue
        if current is None or line.lstrip().startswith("#"):
            continue
        key, _, value = line.strip().partition(" ")
        value = value.strip()
        if key in _CFG_TEXT:
            current[key] = value
        elif key in _CFG_FLAGS:
            current[_CFG_FLAGS[key]] = value not in ("0", "")
        elif key in ("content", "nodes"):
            current[key] = tuple(c.strip() for c in value.split(",") if c.strip())
        elif key == "content-dirs":
            current["content_dirs"] = tuple(tuple(p.split("=", 1)) for p in value.split(",")
                                            if "=" in p)
    return out


class Volume(Frozen):
    """Where a drive's data is, as QEMU opens it."""

    driver: Literal["file", "host_device", "host_cdrom", "rbd", "iscsi"]
    path: str
    """filename; for rbd ``pool/image``; for iscsi ``iscsi://portal/target/lun``."""
    format: str
    storage: str
    """Storage.kind, or "path" for a drive given as an absolute path."""
    volid: str
    """What qemu-server hashes into node names (the volume as written)."""
    node: dict[str, Any] = {}
    """The protocol node's options besides driver, filename and qemu-server's own (rbd: pool,
    image, servers, auth; iscsi: portal, target, lun): pve-storage's qemu_blockdev_options."""
    drive_file: str | None = None
    """``-drive file=`` where it is not ``path`` (``rbd:…``): PVE::Storage::path."""
    volume_chain: bool = False
    """A qcow2 volume on a storage with ``snapshot-as-volume-chain``."""
    backing: bool = False
    """qemu-server gives it the qcow2 backing chain the storage reports (snapshot method
    "mixed": qcow2 on LVM, or on a directory storage keeping snapshots as a volume chain)."""
    chain: tuple[str, ...] = ()
    """The backing chain's volumes (their paths), nearest first, where it is known (an image
    iomatrix made with snapshots: ``[target] lvm`` ``volume_chain``); qemu-server reads it from
    the storage (volume_snapshot_info) and nests each as the ``backing`` of the one above."""
    notes: tuple[str, ...] = ()
    """What was assumed where the storage's definition does not say."""


_ISO = re.compile(r"^iso/([^/]+\.(?:iso|img))$", re.IGNORECASE)


def resolve_volume(drive: Drive, storages: dict[str, Storage] | None = None, *,
                   is_device: bool | None = None) -> Volume:
    """The drive's volume → path, driver and format (pve-storage 9.1's parse_volname, path and
    qemu_blockdev_options for each storage type). ValueError, with qemu-server's words where it
    refuses too, for a volume it cannot open."""
    volid = drive.volume
    if volid == "cdrom":
        return Volume(driver="host_cdrom", path=CDROM_PATH, format="raw", storage="path",
                      volid=volid, notes=(f"{drive.key}: the host's CD-ROM drive: qemu-server "
                                          "takes the first of /dev/cdrom, /dev/cdrom1, "
                                          f"/dev/cdrom2 that exists; {CDROM_PATH} assumed",))
    if volid.startswith("/"):
        device = volid.startswith("/dev/") if is_device is None else is_device
        driver = ("host_cdrom" if drive.is_cdrom else "host_device") if device else "file"
        return Volume(driver=driver, path=volid, format=drive.get("format") or "raw",
                      storage="path", volid=volid)
    store, sep, volname = volid.partition(":")
    if not sep:
        raise ValueError(f"{drive.key}: {volid!r} is neither STORAGE:VOLUME nor an absolute path")
    storage = {**DEFAULT_STORAGES, **(storages or {})}.get(store)
    if storage is None:
        raise ValueError(f"{drive.key}: storage {store!r} is not in storage.cfg (give --storage-cfg "
                         f"or --storage {store}=TYPE)")
    iso = _ISO.match(volname) if storage.type in FILE_STORAGES else None
    vtype = "iso" if iso else "images"
    # qemu-server's own messages (check_volume_storage_type, print_drive_commandline_full)
    if storage.content is not None and vtype not in storage.content:
        raise ValueError(f"storage '{store}' does not support content-type '{vtype}'")
    if iso and drive.get("media") is None:
        raise ValueError(f"{drive.key}: explicit media parameter is required for iso images")
    resolver = _RESOLVERS.get(storage.type)
    if resolver is None:
        raise ValueError(f"{drive.key}: storage type {storage.type!r} ({store}) is not modelled "
                         f"(known: {', '.join(STORAGE_TYPES)})")
    return resolver(_OnStorage(drive, store, storage, volname, []))


class _OnStorage(NamedTuple):
    """A drive's volume on its storage, being resolved; ``notes`` collects what was assumed."""

    drive: Drive
    store: str
    storage: Storage
    volname: str
    notes: list[str]

    def given(self, value: str | None, what: str, assumed: str) -> str:
        """``value``, or ``assumed`` with a note where the storage's definition does not say."""
        if value:
            return value
        self.notes.append(f"{self.drive.key}: storage {self.store} ({self.storage.type}) does not "
                          f"say its {what}: {assumed} assumed (give --storage-cfg with its "
                          "definition)")
        return assumed

    def volume(self, driver: Literal["file", "host_device"], path: str, fmt: str = "raw",
               **more: Any) -> Volume:
        return Volume(driver=driver, path=path, format=fmt, storage=self.storage.kind,
                      volid=self.drive.volume, notes=tuple(self.notes), **more)

    def unparsable(self, kind: str) -> ValueError:
        return ValueError(f"{self.drive.key}: unable to parse {kind} volume name '{self.volname}'")


def _file_volume(at: _OnStorage) -> Volume:
    """A directory-like storage (Plugin.pm, BTRFSPlugin.pm): an image or an ISO."""
    drive, storage = at.drive, at.storage
    iso = _ISO.match(at.volname)
    vtype = "iso" if iso else "images"
    default = "/var/lib/vz" if storage.type == "dir" else f"/mnt/pve/{at.store}"
    base = at.given(storage.path, "path", default)
    subdir = dict(storage.content_dirs).get(vtype, "template/iso" if iso else "images")
    if iso:
        return at.volume("file", f"{base}/{subdir}/{iso.group(1)}")
    vmid, name, fmt = _dir_image(drive.key, at.volname)
    path = f"{base}/{subdir}/{vmid}/{name}"
    if storage.type == "btrfs" and fmt == "raw":   # BTRFSPlugin: a subvolume per raw disk
        path = f"{base}/{subdir}/{vmid}/{name[:-4]}/disk.raw"
    chain = storage.volume_chain and fmt == "qcow2"
    return at.volume("file", path, fmt, volume_chain=chain,
                     backing=chain and storage.type in ("dir", "nfs", "cifs"))


def _lvm_volume(at: _OnStorage) -> Volume:
    """LVMPlugin.pm, LvmThinPlugin.pm: a logical volume (thick LVM: raw, or qcow2 in it)."""
    volname, thick = at.volname, at.storage.type == "lvm"
    if not re.match(r"^(vm|base)-\d+-[a-z0-9\-_.]*[a-z0-9]$", volname, re.IGNORECASE) or (
            thick and volname.startswith("base-")):
        raise at.unparsable("lvm")
    fmt = "qcow2" if thick and volname.endswith(".qcow2") else "raw"
    path = f"/dev/{at.given(at.storage.vgname, 'volume group', at.store)}/{volname}"
    return at.volume("host_device", path, fmt,
                     volume_chain=at.storage.volume_chain and fmt == "qcow2",
                     backing=fmt == "qcow2")


def _zfs_volume(at: _OnStorage) -> Volume:
    """ZFSPoolPlugin.pm (a zvol) and ZFSPlugin.pm (ZFS over iSCSI)."""
    found = re.match(r"^(?:(?:base|basevol)-\d+-\S+/)?((base|basevol|vm|subvol)-\d+-\S+)$",
                     at.volname)
    if found is None:
        raise at.unparsable("zfs")
    if found.group(2) in ("subvol", "basevol"):
        raise ValueError(f"{at.drive.key}: volume '{at.volname}' not usable as VM image")
    pool = at.given(at.storage.pool, "pool", at.store)
    if at.storage.type == "zfspool":
        return at.volume("host_device", f"/dev/zvol/{pool}/{found.group(1)}")
    # ZFS over iSCSI: ZFSPlugin qemu_blockdev_options asks the target for the LUN (ssh)
    portal = at.given(at.storage.portal, "portal", "<portal>")
    target = at.given(at.storage.target, "target", "<target>")
    at.notes.append(f"{at.drive.key}: ZFS over iSCSI: qemu-server asks the target for the LUN of "
                    f"{pool}/{found.group(1)} (over ssh); LUN 0 assumed")
    return _iscsi(portal, target, 0, at.storage.kind, at.drive.volume, at.notes)


def _iscsi_volume(at: _OnStorage) -> Volume:
    """ISCSIPlugin.pm (the kernel's initiator: a /dev/disk/by-id device) and
    ISCSIDirectPlugin.pm (QEMU's own: ``lunN``)."""
    if at.storage.type == "iscsi":
        found = re.match(r"^\d+\.\d+\.\d+\.([^/\s]+)$", at.volname)
        if found is None:
            raise at.unparsable("iscsi")
        return at.volume("host_device", f"/dev/disk/by-id/{found.group(1)}")
    found = re.match(r"^lun(\d+)$", at.volname)
    if found is None:
        raise at.unparsable("iscsi")
    return _iscsi(at.given(at.storage.portal, "portal", "<portal>"),
                  at.given(at.storage.target, "target", "<target>"), found.group(1),
                  at.storage.kind, at.drive.volume, at.notes)


def _dir_image(key: str, volname: str) -> tuple[str, str, str]:
    """Plugin.pm parse_volname for an image: ``VMID/NAME`` or a linked clone's
    ``BASEVMID/BASENAME/VMID/NAME`` → (vmid, name, format)."""
    found = re.match(r"^(?:\d+/\S+/)?(\d+)/([^/\s]+)$", volname)
    if found is None:
        raise ValueError(f"{key}: unable to parse directory volume name '{volname}'")
    fmt = found.group(2).rsplit(".", 1)[-1] if "." in found.group(2) else ""
    if fmt not in ("raw", "qcow2", "vmdk", "subvol"):
        raise ValueError(f"{key}: unable to parse volume filename '{found.group(2)}'")
    if fmt == "subvol":
        raise ValueError(f"{key}: volume '{volname}' - not a QEMU image format 'subvol'")
    return found.group(1), found.group(2), fmt


def _iscsi(portal: str, target: str, lun: int | str, kind: str, volid: str,
           notes: list[str]) -> Volume:
    """An iSCSI LUN opened by QEMU's own initiator (libiscsi)."""
    return Volume(driver="iscsi", path=f"iscsi://{portal}/{target}/{lun}", format="raw",
                  storage=kind, volid=volid, node={"lun": lun, "portal": portal,
                                                   "target": target, "transport": "tcp"},
                  notes=tuple(notes))


def _rbd(at: _OnStorage) -> Volume:
    """RBDPlugin.pm path and qemu_blockdev_options; ceph_connect_option for the monitors,
    configuration file and auth."""
    drive, storage, volname, notes = at.drive, at.storage, at.volname, at.notes
    found = re.match(r"^(?:base-\d+-\S+/)?((?:base)?(?:vm)?-\d+-\S+)$", volname)
    if found is None:
        raise ValueError(f"{drive.key}: unable to parse rbd volume name '{volname}'")
    image = found.group(1)
    if not storage.pool:
        notes.append(f"{drive.key}: storage {storage.id} (rbd) names no pool: Proxmox VE's "
                     "default, rbd")
    pool = storage.pool or "rbd"
    spec = "/".join(p for p in (pool, storage.namespace, image) if p)
    if storage.krbd:
        fsid = storage.fsid or "<fsid>"
        if not storage.fsid:
            notes.append(f"{drive.key}: krbd's device is /dev/rbd-pve/<fsid>/…: qemu-server "
                         "takes the fsid from " + ("the monitors" if storage.monhost else
                                                   "/etc/pve/ceph.conf ([global] fsid)")
                         + "; `ceph fsid` prints it (add `fsid <uuid>` to the storage's section "
                         "of the storage.cfg given)")
        return Volume(driver="host_device", path=f"/dev/rbd-pve/{fsid}/{spec}", format="raw",
                      storage="krbd", volid=drive.volume, notes=tuple(notes))
    keyring = f"{CEPH_PRIV}/{storage.id}.keyring"
    user = storage.username or "admin"
    conf = None
    if storage.monhost is None:
        conf = "/etc/pve/ceph.conf"
        notes.append(f"{drive.key}: storage {storage.id} names no monhost: a cluster Proxmox VE "
                     "manages (pveceph), whose /etc/pve/ceph.conf names the monitors")
    elif storage.ceph_conf:
        conf = f"{CEPH_PRIV}/{storage.id}.conf"
    # ceph_connect_option looks for these files; Proxmox VE writes them when the storage is added
    assumed = [f for f, there in ((keyring, storage.keyring), (conf, conf != "/etc/pve/ceph.conf"))
               if there and f]
    if assumed:
        notes.append(f"{drive.key}: {' and '.join(assumed)} assumed to exist (Proxmox VE writes "
                     "them when the storage is added)" + (f": cephx as {user}" if storage.keyring
                                                           else ""))
    node: dict[str, Any] = {"pool": pool, "image": image}
    if storage.namespace:
        node["namespace"] = storage.namespace
    if conf:
        node["conf"] = conf
    drive_file = f"rbd:{spec}" + (f":conf={conf}" if conf else "")
    if storage.monhost is not None:
        auth = "cephx" if storage.keyring else "none"
        hosts = [_host_and_port(m) for m in re.split(r"[,;\s]+", storage.monhost.strip()) if m]
        node["server"] = [{"host": host, "port": port or "3300"} for host, port in hosts]
        node["auth-client-required"] = [auth]
        listed = ";".join((f"[{h}]" if ":" in h else h) + (f":{p}" if p else "")
                          for h, p in hosts).replace(":", "\\:")
        drive_file += f":mon_host={listed}:auth_supported={auth}"
    if storage.keyring:
        node["user"] = user
        drive_file += f":id={user}:keyring={keyring}"
    return Volume(driver="rbd", path=f"{pool}/{image}", format="raw", storage="rbd",
                  volid=drive.volume, node=node, drive_file=drive_file, notes=tuple(notes))


_RESOLVERS: dict[str, Callable[[_OnStorage], Volume]] = {
    **{kind: _file_volume for kind in FILE_STORAGES}, "lvm": _lvm_volume,
    "lvmthin": _lvm_volume, "zfspool": _zfs_volume, "zfs": _zfs_volume, "iscsi": _iscsi_volume,
    "iscsidirect": _iscsi_volume, "rbd": _rbd}
"""Storage type → how its volumes resolve (every one of STORAGE_TYPES)."""


def _host_and_port(address: str) -> tuple[str, str | None]:
    """PVE::Tools parse_host_and_port: ``host[:port]``, ``[v6][:port]``, or a bare IPv6."""
    bracketed = re.match(r"^\[([^\]]+)\](?::(\d+))?$", address)
    if bracketed:
        return bracketed.group(1), bracketed.group(2)
    if address.count(":") == 1:
        host, _, port = address.partition(":")
        return host, port
    return address, None
