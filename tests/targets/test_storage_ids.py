"""A Proxmox VE storage id (``[target] storage = "ID"``) of every type qemu-server knows, as
``resolve_storage`` resolves it: the keys storage.cfg gives (pve-storage's LVMPlugin.pm,
LvmThinPlugin.pm, ZFSPoolPlugin.pm, BTRFSPlugin.pm) read, and where it is measured."""

from __future__ import annotations

from iomatrix.platform import proxmox as pve

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
