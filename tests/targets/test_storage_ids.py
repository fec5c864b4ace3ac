"""A Proxmox VE storage id (``[target] storage = "ID"``) of every type qemu-server knows, as
``resolve_storage`` resolves it: the keys storage.cfg gives (pve-storage's LVMPlugin.pm,
LvmThinPlugin.pm, ZFSPoolPlugin.pm, BTRFSPlugin.pm) read, and where it is measured."""

from __future__ import annotations

from pathlib import Path

import pytest

from iomatrix.platform import proxmox as pve
from iomatrix.suite.target import Target
from iomatrix.targets import registry
from iomatrix.targets.network import resolve_storage

CFG = """\
lvmthin: local-lvm
\tthinpool data
\tvgname pve
\tcontent rootdir,images

lvmthin: thin2
\tvgname vg2
\tcontent images

lvm: thick
\tvgname vg0
\tcontent images
\tsaferemove 1

lvm: chain
\tvgname vg1
\tsnapshot-as-volume-chain 1

zfspool: local-zfs
\tpool rpool/data
\tsparse 1
\tcontent images,rootdir

zfspool: tank
\tpool tank/vms
\tblocksize 64k
\tdisable 1

btrfs: butter
\tpath /mnt/butter
\tnocow 1
"""


def test_storage_cfg_keys_of_lvm_zfs_btrfs() -> None:
    """thinpool, blocksize, sparse and disable are read; what a storage does not say keeps
    pve-storage's default (no thinpool, ZFS's own blocksize, not sparse, enabled)."""
    got = pve.parse_storage_cfg(CFG)
    assert (got["local-lvm"].vgname, got["local-lvm"].thinpool) == ("pve", "data")
    assert got["thin2"].thinpool is None
    assert got["chain"].volume_chain and not got["thick"].volume_chain
    assert (got["local-zfs"].pool, got["local-zfs"].sparse, got["local-zfs"].blocksize) == (
        "rpool/data", True, None)
    assert (got["tank"].blocksize, got["tank"].sparse, got["tank"].disable) == ("64k", False,
                                                                                 True)
    assert not got["local-zfs"].disable
    assert got["butter"].nocow and got["butter"].kind == "btrfs-nocow"
    assert pve.DEFAULT_STORAGES["local-lvm"].thinpool == "data"


def resolved(storage: str, cfg: str = CFG, *, pve_host: bool = False) -> dict[str, object]:
    """``[target] storage = "ID"`` resolved (size kept) → its kind's table as the suite would
    write it."""
    target = Target(storage=storage, size="16MiB")
    out = resolve_storage(target, pve.parse_storage_cfg(cfg), Path("/etc/pve"),
                          pve_host=pve_host)
    assert out.size == target.size
    return out.model_dump(mode="json", exclude_none=True, exclude_defaults=True,
                          exclude={"size"})


def test_lvm_storages_resolve_as_proxmox_allocates_there() -> None:
    """Elsewhere than a Proxmox VE host: lvmthin → [target] lvmthin (vgname, thinpool; "data"
    where none is named), lvm → [target] lvm (vgname)."""
    assert resolved("local-lvm") == {"lvmthin": {"vg": "pve", "pool": "data"}}
    assert resolved("thin2") == {"lvmthin": {"vg": "vg2", "pool": "data"}}
    assert resolved("thick") == {"lvm": {"vg": "vg0"}}


def test_storages_proxmox_allocates_nothing_on_are_refused() -> None:
    """A disabled storage and one whose content has no images are refused in one line, on a
    Proxmox VE host or not, as Proxmox VE would put no VM disk there."""
    cfg = CFG + "\nlvm: ct\n\tvgname vg9\n\tcontent rootdir\n"
    for host in (False, True):
        with pytest.raises(ValueError, match="storage ct does not hold VM disk images"):
            resolved("ct", cfg, pve_host=host)
        with pytest.raises(ValueError, match="storage tank is disabled"):
            resolved("tank", pve_host=host)


def test_on_a_proxmox_host_block_storages_go_through_pvesm() -> None:
    """On a Proxmox VE host lvm, lvmthin, zfspool and a third-party plugin's type resolve to
    [target] pvesm with the storage's type (qemu-server's rules for it); rbd, iSCSI and
    directory storages keep their own kinds."""
    cfg = CFG + ("\ndir: local\n\tpath /var/lib/vz\n\tcontent images\n"
                 "\nrbd: ceph\n\tmonhost 192.0.2.1\n\tpool vm\n\tcontent images\n"
                 "\nblockbridge: bb\n\tapi_url https://bb.example\n")
    assert resolved("local-lvm", cfg, pve_host=True) == {
        "pvesm": {"storage": "local-lvm", "type": "lvmthin"}}
    assert resolved("thick", cfg, pve_host=True)["pvesm"] == {"storage": "thick", "type": "lvm"}
    assert resolved("local-zfs", cfg, pve_host=True)["pvesm"] == {"storage": "local-zfs",
                                                                  "type": "zfspool"}
    assert resolved("bb", cfg, pve_host=True)["pvesm"] == {"storage": "bb",
                                                           "type": "blockbridge"}
    assert resolved("local", cfg, pve_host=True) == {"directory": "/var/lib/vz/images"}
    assert "rbd" in resolved("ceph", cfg, pve_host=True)
    with pytest.raises(ValueError, match="type blockbridge: iomatrix measures"):
        resolved("bb", cfg)
    assert Target.model_validate({"pvesm": {"storage": "local-lvm", "type": "lvmthin"},
                                  "size": "16MiB"}).network.storage_kind == "lvmthin"


def test_on_a_proxmox_host_a_volume_chain_storage_keeps_its_chain() -> None:
    """A local lvm storage with snapshot-as-volume-chain resolves on a Proxmox VE host to
    [target] lvm with volume_chain (pvesm would allocate raw volumes only: the chain lost); a
    shared one stays with pvesm (its cluster lock), whose volumes refuse qcow2 in one line."""
    assert pve.parse_storage_cfg(CFG)["chain"].shared is False
    assert resolved("chain", pve_host=True) == {"lvm": {"vg": "vg1", "volume_chain": True}}
    shared = CFG.replace("\tsnapshot-as-volume-chain 1\n", "\tsnapshot-as-volume-chain 1\n"
                         "\tshared 1\n")
    assert pve.parse_storage_cfg(shared)["chain"].shared
    assert resolved("chain", shared, pve_host=True) == {"pvesm": {"storage": "chain",
                                                                  "type": "lvm"}}
    assert resolved("chain", shared) == {"lvm": {"vg": "vg1", "volume_chain": True}}
    target = resolve_storage(Target(storage="chain", size="16MiB"),
                             pve.parse_storage_cfg(shared), Path("/etc/pve"), pve_host=True)
    problem = registry.kind_of(target).format_problem(target, "qcow2")     # type: ignore[union-attr]
    assert problem is not None and "drop format qcow2" in problem and "\n" not in problem
    assert registry.kind_of(target).format_problem(target, "raw") is None  # type: ignore[union-attr]
    with pytest.raises(ValueError):
        Target.model_validate({"pvesm": {"storage": "-rf"}, "size": "16MiB"})


@pytest.mark.parametrize("pve_version", [8, 9])
def test_translate_on_lvmthin_and_zfspool_stays_exact(pve_version: int) -> None:
    """``translate`` of a VM on an lvmthin and a zfspool storage: the keys storage.cfg now gives
    (thinpool, blocksize, sparse) change nothing in the drives' arguments, which open the
    volume where pve-storage's path puts it (/dev/VG/NAME, /dev/zvol/POOL/NAME) as a
    host device with qemu-server's default aio there (io_uring; native on thick LVM). The
    qemu-server fixtures on lvm and lvmthin storages are tests/platform/test_cfg2cmd.py's."""
    from iomatrix.translate.vm import translate

    conf = ("scsi0: local-lvm:vm-100-disk-0,discard=on,iothread=1,size=32G\n"
            "scsi1: local-zfs:vm-100-disk-1,cache=writeback,size=16G\n"
            "scsi2: thick:vm-100-disk-2,size=8G\n"
            "scsihw: virtio-scsi-single\n")
    bare = pve.parse_storage_cfg("lvmthin: local-lvm\n\tvgname pve\n\n"
                                 "zfspool: local-zfs\n\tpool rpool/data\n\nlvm: thick\n\tvgname vg0\n")
    full = pve.parse_storage_cfg(CFG)
    plain = translate(conf, pve_version=pve_version, storages=bare, vmid="100").disks
    keyed = translate(conf, pve_version=pve_version, storages=full, vmid="100").disks
    assert [d.argv for d in plain] == [d.argv for d in keyed]
    joined = {d.name: " ".join(d.argv) for d in keyed}
    assert "/dev/pve/vm-100-disk-0" in joined["scsi0"]
    assert "/dev/zvol/rpool/data/vm-100-disk-1" in joined["scsi1"]
    assert "/dev/vg0/vm-100-disk-2" in joined["scsi2"]
    assert pve_version == 8 or all('"driver":"host_device"' in j for j in joined.values())
    assert [d.config.aio for d in keyed if d.config] == ["io_uring", "io_uring", "native"]


def test_a_matrix_without_aio_measures_qemu_servers_aio_on_the_storage() -> None:
    """On thick LVM (through pvesm or [target] lvm) and a CIFS storage's directory a Proxmox VE
    suite that sets no aio measures what qemu-server gives a disk there without aio= (native
    with cache=none, threads with writeback), and says so; one that sets aio, another platform,
    lvmthin and nfs keep the matrix."""
    from iomatrix.suite.expand import expand
    from iomatrix.suite.load import load_suite_text

    def aios(table: str, method: str = 'platform = "proxmox"\n',
             matrix: str = "") -> tuple[set[tuple[str | None, str | None]], tuple[str, ...]]:
        text = (f'[suite]\nname = "t"\n[target]\nsize = "16MiB"\n{table}\n[matrix]\n'
                f'cache = ["none", "writeback"]\n{matrix}[[workloads]]\nrw = "randread"\n'
                f'[method]\nmode = "blocklayer"\nbaseline = false\n{method}')
        done = expand(load_suite_text(text))
        return {(c.cache, c.aio) for c in done.configurations}, done.notes

    thick, notes = aios('pvesm = { storage = "thick", type = "lvm" }')
    assert thick == {("none", "native"), ("writeback", "threads")}
    assert any("as qemu-server gives a disk without aio= on lvm storage" in n for n in notes)
    assert aios('lvm = { vg = "vg0" }')[0] == thick
    assert aios('pvesm = { storage = "local-lvm", type = "lvmthin" }')[0] == {
        ("none", "io_uring"), ("writeback", "io_uring")}
    assert aios('pvesm = { storage = "thick", type = "lvm" }', "")[0] == {
        ("none", "io_uring"), ("writeback", "io_uring")}
    assert aios('pvesm = { storage = "thick", type = "lvm" }',
                matrix='aio = ["threads"]\n')[0] == {("none", "threads"), ("writeback", "threads")}
    smb = 'directory = "/mnt/pve/smb/images"\nfrom_storage = { id = "smb", type = "cifs" }'
    assert aios(smb)[0] == thick
    assert aios(smb.replace("cifs", "nfs"))[0] == {("none", "io_uring"), ("writeback", "io_uring")}


def test_zfspool_and_btrfs_storages_resolve_to_their_kinds() -> None:
    """Elsewhere than a Proxmox VE host: zfspool → [target] zfs (pool, blocksize as
    volblocksize, ZFS's own 16k where none is given, sparse), btrfs → [target] btrfs (its
    images directory, nocow)."""
    zfs = resolved("local-zfs")["zfs"]
    assert zfs["pool"] == "rpool/data" and zfs["sparse"] is True    # type: ignore[index]
    assert zfs.get("volblocksize", "16k") == "16k"                   # type: ignore[union-attr]
    tank = pve.parse_storage_cfg(CFG.replace("\tdisable 1\n", ""))
    out = resolve_storage(Target(storage="tank", size="16MiB"), tank, Path("/etc/pve"),
                          pve_host=False)
    assert out.zfs is not None and (out.zfs.pool, out.zfs.volblocksize) == ("tank/vms", "64k")
    # Proxmox VE's zfspool blocksize goes up to OpenZFS's 16M: a 4M one resolves as written
    big = pve.parse_storage_cfg(CFG.replace("\tdisable 1\n", "").replace("64k", "4M"))
    out = resolve_storage(Target(storage="tank", size="16MiB"), big, Path("/etc/pve"),
                          pve_host=False)
    assert out.zfs is not None and out.zfs.volblocksize_bytes == 4 << 20
    assert resolved("butter") == {"btrfs": {"path": "/mnt/butter/images", "nocow": True}}
