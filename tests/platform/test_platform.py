"""Proxmox VE's and libvirt's block graphs, as iomatrix builds them (iomatrix.platform).

The expectations are what qemu-server generates for each drive line: written from its source
(Drive.pm, DriveDevice.pm, Blockdev.pm, QemuServer.pm config_to_command) and from the shapes of
its test/cfg2cmd fixtures (qemu-server 8.3 for PVE 8's -drive, 9.x for PVE 9's -blockdev),
not copied from them. Every graph is then started on the local QEMU 7.2 (paused, -S), and QMP
must show the nodes, flags and devices asked for."""

from __future__ import annotations

import contextlib
import json
import shlex
import typing
from collections.abc import Iterator
from pathlib import Path

import pytest

from iomatrix.core.errors import InvalidCombination
from iomatrix.core.proc import managed, read_text, run, wait_for
from iomatrix.drivers.guest import free_port
from iomatrix.platform import PLATFORMS
from iomatrix.platform import libvirt as lv
from iomatrix.platform import proxmox as pve
from iomatrix.translate.vm import translate
from iomatrix.qemu.args import (GuestSpec, expected_guest_settings, guest_argv,
                                read_guest_settings)
from iomatrix.qemu.qmp import qmp_execute
from iomatrix.suite.expand import invalid_reason
from iomatrix.suite.configuration import Configuration
from iomatrix.vocab.axes import Platform
from iomatrix.suite.method import Method
from iomatrix.platform.settings import DiskImage
from iomatrix.targets.workspace import Image
from tests.needs import needs

needs_qemu = needs("qemu")
START_TIMEOUT = 15.0

LVM_STORAGES = """\
lvmthin: local-lvm
\tthinpool data
\tvgname pve
\tcontent rootdir,images

lvm: thick
\tvgname vg0
\tcontent images
"""
"""A Proxmox VE host's LVM-thin and LVM storages (test_pvesm's simulated host has them too)."""
STORAGE_CFG = """\
dir: local
\tpath /var/lib/vz
\tcontent iso,vztmpl,backup,images

""" + LVM_STORAGES + """
cifs: smb
\tpath /mnt/pve/smb
\tserver 10.0.0.5
\tshare vms

rbd: ceph
\tpool vmpool
\tcontent images

rbd: ceph-krbd
\tpool vmpool
\tkrbd 1

btrfs: butter
\tpath /mnt/butter

btrfs: butter-nocow
\tpath /mnt/butter2
\tnocow 1

zfspool: tank
\tpool tank/vms
"""
STORAGES = pve.parse_storage_cfg(STORAGE_CFG)


def _args(line: str, scsihw: str | None = None, version: int = 9) -> pve.DiskArgs:
    key, _, value = line.partition(": ")
    drive = pve.parse_drive(key, value)
    return pve.disk_args(drive, pve.resolve_volume(drive, STORAGES), scsihw=scsihw,
                         version=version)  # type: ignore[arg-type]


def _split(argv: tuple[str, ...]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for i in range(0, len(argv), 2):
        out.setdefault(argv[i], []).append(argv[i + 1])
    return out


def _chain(blockdev: str) -> list[dict[str, object]]:
    """A nested -blockdev, top first, each node without its child."""
    node: dict[str, object] | None = json.loads(blockdev)
    out = []
    while isinstance(node, dict):
        out.append({k: v for k, v in node.items() if k != "file"})
        node = node.get("file")  # type: ignore[assignment]
    return out


# (drive line, scsihw, what PVE 9 gives: file driver, aio, direct, no-flush, detect-zeroes,
#  discard, controller device, disk device, iothread object)
CASES = [
    # 1-4: buses, with qemu-server's defaults (io_uring; cache unset = none; detect-zeroes on)
    ("virtio0: local-lvm:vm-100-disk-0,size=32G", None,
     "host_device", "io_uring", True, False, "on", "ignore", None,
     "virtio-blk-pci,drive=drive-virtio0,id=virtio0,write-cache=on", None),
    ("scsi0: local-lvm:vm-100-disk-0,size=32G", None,
     "host_device", "io_uring", True, False, "on", "ignore", "lsi,id=scsihw0",
     "scsi-hd,bus=scsihw0.0,scsi-id=0,drive=drive-scsi0,id=scsi0,device_id=drive-scsi0,"
     "write-cache=on", None),
    ("sata0: local-lvm:vm-100-disk-0,size=32G", None,
     "host_device", "io_uring", True, False, "on", "ignore", "ahci,id=ahci0,multifunction=on",
     "ide-hd,bus=ahci0.0,drive=drive-sata0,id=sata0,write-cache=on", None),
    ("ide0: local-lvm:vm-100-disk-0,size=32G", None,
     "host_device", "io_uring", True, False, "on", "ignore", None,
     "ide-hd,bus=ide.0,unit=0,drive=drive-ide0,id=ide0,write-cache=on", None),
    # 5-9: controllers
    ("scsi0: local-lvm:vm-100-disk-0,iothread=1", "virtio-scsi-single",
     "host_device", "io_uring", True, False, "on", "ignore",
     "virtio-scsi-pci,id=virtioscsi0,iothread=iothread-virtioscsi0",
     "scsi-hd,bus=virtioscsi0.0,channel=0,scsi-id=0,lun=0,drive=drive-scsi0,id=scsi0,"
     "device_id=drive-scsi0,write-cache=on", "iothread-virtioscsi0"),
    ("scsi0: local-lvm:vm-100-disk-0,iothread=1", "virtio-scsi-pci",   # iothread ignored
     "host_device", "io_uring", True, False, "on", "ignore", "virtio-scsi-pci,id=scsihw0",
     "scsi-hd,bus=scsihw0.0,channel=0,scsi-id=0,lun=0,drive=drive-scsi0,id=scsi0,"
     "device_id=drive-scsi0,write-cache=on", None),
    ("scsi0: local-lvm:vm-100-disk-0", "megasas",
     "host_device", "io_uring", True, False, "on", "ignore", "megasas,id=scsihw0",
     "scsi-hd,bus=scsihw0.0,channel=0,scsi-id=0,lun=0,drive=drive-scsi0,id=scsi0,"
     "device_id=drive-scsi0,write-cache=on", None),
    ("scsi0: local-lvm:vm-100-disk-0", "pvscsi",
     "host_device", "io_uring", True, False, "on", "ignore", "pvscsi,id=scsihw0",
     "scsi-hd,bus=scsihw0.0,scsi-id=0,drive=drive-scsi0,id=scsi0,device_id=drive-scsi0,"
     "write-cache=on", None),
    ("scsi9: local-lvm:vm-100-disk-0", "lsi",   # 7 disks per lsi controller
     "host_device", "io_uring", True, False, "on", "ignore", "lsi,id=scsihw1",
     "scsi-hd,bus=scsihw1.0,scsi-id=2,drive=drive-scsi9,id=scsi9,device_id=drive-scsi9,"
     "write-cache=on", None),
    # 10-12: aio
    ("scsi0: local:100/vm-100-disk-0.qcow2,aio=native", "virtio-scsi-single",
     "file", "native", True, False, "on", "ignore", "virtio-scsi-pci,id=virtioscsi0",
     "scsi-hd,bus=virtioscsi0.0,channel=0,scsi-id=0,lun=0,drive=drive-scsi0,id=scsi0,"
     "device_id=drive-scsi0,write-cache=on", None),
    ("virtio0: local:100/vm-100-disk-0.raw,aio=threads,iothread=1", None,
     "file", "threads", True, False, "on", "ignore", None,
     "virtio-blk-pci,drive=drive-virtio0,id=virtio0,iothread=iothread-virtio0,write-cache=on",
     "iothread-virtio0"),
    ("virtio0: thick:vm-100-disk-0", None,     # thick LVM: native (direct), not io_uring
     "host_device", "native", True, False, "on", "ignore", None,
     "virtio-blk-pci,drive=drive-virtio0,id=virtio0,write-cache=on", None),
    # 13-16: cache
    ("virtio0: thick:vm-100-disk-0,cache=writeback", None,   # thick LVM, not direct: threads
     "host_device", "threads", False, False, "on", "ignore", None,
     "virtio-blk-pci,drive=drive-virtio0,id=virtio0,write-cache=on", None),
    ("scsi0: local-lvm:vm-100-disk-0,cache=writethrough", "virtio-scsi-single",
     "host_device", "io_uring", False, False, "on", "ignore", "virtio-scsi-pci,id=virtioscsi0",
     "scsi-hd,bus=virtioscsi0.0,channel=0,scsi-id=0,lun=0,drive=drive-scsi0,id=scsi0,"
     "device_id=drive-scsi0,write-cache=off", None),
    ("sata0: local-lvm:vm-100-disk-0,cache=directsync", None,
     "host_device", "io_uring", True, False, "on", "ignore", "ahci,id=ahci0,multifunction=on",
     "ide-hd,bus=ahci0.0,drive=drive-sata0,id=sata0,write-cache=off", None),
    ("virtio0: local-lvm:vm-100-disk-0,cache=unsafe", None,
     "host_device", "io_uring", False, True, "on", "ignore", None,
     "virtio-blk-pci,drive=drive-virtio0,id=virtio0,write-cache=on", None),
    # 17-19: discard, detect_zeroes, ssd
    ("scsi0: local-lvm:vm-100-disk-0,discard=on,ssd=1", "virtio-scsi-single",
     "host_device", "io_uring", True, False, "unmap", "unmap", "virtio-scsi-pci,id=virtioscsi0",
     "scsi-hd,bus=virtioscsi0.0,channel=0,scsi-id=0,lun=0,drive=drive-scsi0,id=scsi0,"
     "device_id=drive-scsi0,rotation_rate=1,write-cache=on", None),
    ("scsi0: local-lvm:vm-100-disk-0,discard=on,detect_zeroes=0", "virtio-scsi-single",
     "host_device", "io_uring", True, False, "off", "unmap", "virtio-scsi-pci,id=virtioscsi0",
     "scsi-hd,bus=virtioscsi0.0,channel=0,scsi-id=0,lun=0,drive=drive-scsi0,id=scsi0,"
     "device_id=drive-scsi0,write-cache=on", None),
    ("sata0: local-lvm:vm-100-disk-0,discard=ignore,ssd=1", None,
     "host_device", "io_uring", True, False, "on", "ignore", "ahci,id=ahci0,multifunction=on",
     "ide-hd,bus=ahci0.0,drive=drive-sata0,id=sata0,rotation_rate=1,write-cache=on", None),
    # 20: queues (virtio-scsi-single only)
    ("scsi0: local-lvm:vm-100-disk-0,iothread=1,queues=4", "virtio-scsi-single",
     "host_device", "io_uring", True, False, "on", "ignore",
     "virtio-scsi-pci,id=virtioscsi0,iothread=iothread-virtioscsi0,num_queues=4",
     "scsi-hd,bus=virtioscsi0.0,channel=0,scsi-id=0,lun=0,drive=drive-scsi0,id=scsi0,"
     "device_id=drive-scsi0,write-cache=on", "iothread-virtioscsi0"),
    # 21-26: storage types
    ("scsi0: smb:100/vm-100-disk-0.raw", "virtio-scsi-single",     # CIFS: native
     "file", "native", True, False, "on", "ignore", "virtio-scsi-pci,id=virtioscsi0",
     "scsi-hd,bus=virtioscsi0.0,channel=0,scsi-id=0,lun=0,drive=drive-scsi0,id=scsi0,"
     "device_id=drive-scsi0,write-cache=on", None),
    ("scsi0: ceph-krbd:vm-100-disk-0,cache=writeback", "virtio-scsi-single",   # krbd: threads
     "host_device", "threads", False, False, "on", "ignore", "virtio-scsi-pci,id=virtioscsi0",
     "scsi-hd,bus=virtioscsi0.0,channel=0,scsi-id=0,lun=0,drive=drive-scsi0,id=scsi0,"
     "device_id=drive-scsi0,write-cache=on", None),
    ("scsi0: ceph:vm-100-disk-0,aio=native", "virtio-scsi-single",   # librbd: no aio at all
     "rbd", None, True, False, "on", "ignore", "virtio-scsi-pci,id=virtioscsi0",
     "scsi-hd,bus=virtioscsi0.0,channel=0,scsi-id=0,lun=0,drive=drive-scsi0,id=scsi0,"
     "device_id=drive-scsi0,write-cache=on", None),
    ("scsi0: butter:100/vm-100-disk-0.raw", "virtio-scsi-single",   # btrfs: not direct
     "file", "io_uring", False, False, "on", "ignore", "virtio-scsi-pci,id=virtioscsi0",
     "scsi-hd,bus=virtioscsi0.0,channel=0,scsi-id=0,lun=0,drive=drive-scsi0,id=scsi0,"
     "device_id=drive-scsi0,write-cache=on", None),
    ("scsi0: butter-nocow:100/vm-100-disk-0.raw", "virtio-scsi-single",   # nocow: direct
     "file", "io_uring", True, False, "on", "ignore", "virtio-scsi-pci,id=virtioscsi0",
     "scsi-hd,bus=virtioscsi0.0,channel=0,scsi-id=0,lun=0,drive=drive-scsi0,id=scsi0,"
     "device_id=drive-scsi0,write-cache=on", None),
    ("virtio0: tank:vm-100-disk-0,cache=none,aio=native", None,
     "host_device", "native", True, False, "on", "ignore", None,
     "virtio-blk-pci,drive=drive-virtio0,id=virtio0,write-cache=on", None),
]


@pytest.mark.parametrize("line, scsihw, driver, aio, direct, no_flush, zeroes, discard, "
                         "controller, device, iothread", CASES)
def test_pve9_graph_is_qemu_servers(line: str, scsihw: str | None, driver: str, aio: str | None,
                                    direct: bool, no_flush: bool, zeroes: str, discard: str,
                                    controller: str | None, device: str,
                                    iothread: str | None) -> None:
    out = _args(line, scsihw, 9)
    parts = _split(out.argv)
    key = line.split(":")[0]
    objects = parts.get("-object", [])
    assert json.loads(objects[-1]) == {"id": f"throttle-drive-{key}", "limits": {},
                                       "qom-type": "throttle-group"}
    assert objects[:-1] == ([f"iothread,id={iothread}"] if iothread else [])
    devices = parts["-device"]
    assert devices == ([controller] if controller else []) + [device]
    throttle, fmt, file = _chain(parts["-blockdev"][0])
    assert throttle["driver"] == "throttle" and throttle["node-name"] == f"drive-{key}"
    assert throttle["throttle-group"] == f"throttle-drive-{key}" and "cache" not in throttle
    assert fmt["driver"] == "raw" if ".qcow2" not in line else "qcow2"
    assert fmt["node-name"] == "f" + file["node-name"][1:]      # type: ignore[index]
    assert file["driver"] == driver
    assert file.get("aio") == aio
    for node in (fmt, file):
        assert node["cache"] == {"direct": direct, "no-flush": no_flush}
    for node in (throttle, fmt, file):
        assert (node["detect-zeroes"], node["discard"], node["read-only"]) == (zeroes, discard,
                                                                              False)


def test_node_names_are_qemu_servers_hash() -> None:
    """Blockdev.pm get_node_name: e/f + sha256("drive=ID,volid=VOLID")[:30]."""
    assert pve.node_name("file", "scsi0", "local:8006/vm-8006-disk-0.raw") == \
        "e3b2553803d55d43b9986a0aac3e9a7"
    assert pve.node_name("fmt", "scsi0", "local:8006/vm-8006-disk-0.raw") == \
        "f3b2553803d55d43b9986a0aac3e9a7"


PVE8 = [
    ("scsi0: local-lvm:vm-100-disk-0,aio=native,cache=writeback,discard=on,iothread=1", "virtio-scsi-single",
     "file=/dev/pve/vm-100-disk-0,if=none,id=drive-scsi0,cache=writeback,aio=native,discard=on,"
     "format=raw,detect-zeroes=unmap",
     "scsi-hd,bus=virtioscsi0.0,channel=0,scsi-id=0,lun=0,drive=drive-scsi0,id=scsi0"),
    ("virtio0: local:100/vm-100-disk-0.qcow2,iothread=1", None,
     "file=/var/lib/vz/images/100/vm-100-disk-0.qcow2,if=none,id=drive-virtio0,format=qcow2,"
     "cache=none,aio=io_uring,detect-zeroes=on",
     "virtio-blk-pci,drive=drive-virtio0,id=virtio0,iothread=iothread-virtio0"),
    ("scsi0: thick:vm-100-disk-0,discard=on", "lsi",
     "file=/dev/vg0/vm-100-disk-0,if=none,id=drive-scsi0,discard=on,format=raw,cache=none,"
     "aio=native,detect-zeroes=unmap", "scsi-hd,bus=scsihw0.0,scsi-id=0,drive=drive-scsi0,id=scsi0"),
    ("sata0: butter:100/vm-100-disk-0.raw,ssd=1", None,
     "file=/mnt/butter/images/100/vm-100-disk-0/disk.raw,if=none,id=drive-sata0,format=raw,"
     "aio=io_uring,detect-zeroes=on", "ide-hd,bus=ahci0.0,drive=drive-sata0,id=sata0,rotation_rate=1"),
    ("ide0: ceph-krbd:vm-100-disk-0,cache=writethrough", None,
     "file=/dev/rbd-pve/<fsid>/vmpool/vm-100-disk-0,if=none,id=drive-ide0,cache=writethrough,"
     "format=raw,aio=threads,detect-zeroes=on", "ide-hd,bus=ide.0,unit=0,drive=drive-ide0,id=ide0"),
]


@pytest.mark.parametrize("line, scsihw, drive, device", PVE8)
def test_pve8_drive_line_is_qemu_servers(line: str, scsihw: str | None, drive: str,
                                         device: str) -> None:
    parts = _split(_args(line, scsihw, 8).argv)
    assert parts["-drive"] == [drive]
    assert parts["-device"][-1] == device
    assert not any("throttle" in o for o in parts.get("-object", []))


def test_ignored_settings_are_named() -> None:
    notes = " ".join(_args("scsi0: local-lvm:vm-1-disk-0,iothread=1,queues=4,mbps_rd=100,"
                           "foo=bar", "virtio-scsi-pci").notes)
    assert "iothread=1 is ignored" in notes and "queues=4 is ignored" in notes
    assert "mbps_rd=100 is not reproduced" in notes and "foo=bar is not a qemu-server" in notes
    assert "librbd gets no aio" in " ".join(_args("scsi0: ceph:vm-1-disk-0,aio=native",
                                                  "virtio-scsi-single").notes)


def test_rbd_gets_monitors_auth_and_configuration_from_the_storage() -> None:
    """RBDPlugin.pm / CephConfig.pm ceph_connect_option: an external cluster's monitors (port
    3300 unless given) and cephx as the storage's user with its keyring; a pveceph cluster's
    /etc/pve/ceph.conf. What storage.cfg cannot say (the keyring's presence) is noted."""
    storages = pve.parse_storage_cfg("rbd: ext\n\tmonhost 10.0.0.1,[fd00::3]:6789\n\tpool vms\n"
                                     "\tusername pve\n")
    drive = pve.parse_drive("scsi0", "ext:vm-100-disk-0")
    volume = pve.resolve_volume(drive, storages)
    assert volume.node == {"pool": "vms", "image": "vm-100-disk-0",
                           "conf": "/etc/pve/priv/ceph/ext.conf",
                           "server": [{"host": "10.0.0.1", "port": "3300"},
                                      {"host": "fd00::3", "port": "6789"}],
                           "auth-client-required": ["cephx"], "user": "pve"}
    assert any("ext.keyring and /etc/pve/priv/ceph/ext.conf assumed" in n for n in volume.notes)
    drive_line = _split(pve.disk_args(drive, volume, scsihw=None, version=8).argv)["-drive"][0]
    assert drive_line.startswith(
        "file=rbd:vms/vm-100-disk-0:conf=/etc/pve/priv/ceph/ext.conf:mon_host=10.0.0.1;"
        "[fd00\\:\\:3]\\:6789:auth_supported=cephx:id=pve:keyring=/etc/pve/priv/ceph/ext.keyring,")
    managed_here = pve.resolve_volume(pve.parse_drive("scsi0", "ceph:vm-1-disk-0"), STORAGES)
    assert managed_here.node == {"pool": "vmpool", "image": "vm-1-disk-0",
                                 "conf": "/etc/pve/ceph.conf", "user": "admin"}
    krbd = pve.resolve_volume(pve.parse_drive("scsi0", "ceph-krbd:vm-1-disk-0"),
                              {"ceph-krbd": STORAGES["ceph-krbd"].model_copy(
                                  update={"fsid": "fc4181a6-56eb-4f68-b452-8ba1f381ca2a"})})
    assert krbd.path == "/dev/rbd-pve/fc4181a6-56eb-4f68-b452-8ba1f381ca2a/vmpool/vm-1-disk-0"


LIMITED = ("scsi0: local-lvm:vm-100-disk-0,mbps_rd=100,mbps_rd_max=150,iops_wr=500,"
           "serial=db%2C01,wwn=0x5000c500a1b2c3d4,ssd=1,rerror=report,werror=stop")


def test_limits_and_identity_as_qemu_server_writes_them() -> None:
    """Blockdev.pm generate_throttle_group, print_drive_commandline_full's throttling.*, and
    DriveDevice.pm's wwn, serial (URL-decoded, its comma doubled), rerror and werror."""
    parts = _split(_args(LIMITED, "virtio-scsi-pci", 9).argv)
    assert json.loads(parts["-object"][0])["limits"] == {
        "bps-read": 100 << 20, "bps-read-max": 150 << 20, "iops-write": 500}
    assert parts["-device"][-1] == (
        "scsi-hd,bus=scsihw0.0,channel=0,scsi-id=0,lun=0,drive=drive-scsi0,id=scsi0,"
        "device_id=drive-scsi0,rotation_rate=1,wwn=0x5000c500a1b2c3d4,serial=db,,01,"
        "write-cache=on,rerror=report,werror=stop")
    pve8 = _split(_args(LIMITED, "virtio-scsi-pci", 8).argv)
    assert pve8["-drive"] == [
        "file=/dev/pve/vm-100-disk-0,if=none,id=drive-scsi0,rerror=report,werror=stop,"
        f"throttling.bps-read={100 << 20},throttling.bps-read-max={150 << 20},"
        "throttling.iops-write=500,format=raw,cache=none,aio=io_uring,detect-zeroes=on"]
    assert pve8["-device"][-1].endswith(",rotation_rate=1,wwn=0x5000c500a1b2c3d4,serial=db,,01")


# -- on QEMU 7.2 ------------------------------------------------------------------------------

@contextlib.contextmanager
def _paused(argv: list[str], workdir: Path) -> Iterator[Path]:
    qmp = workdir / "qmp.sock"
    qmp.unlink(missing_ok=True)
    full = ["qemu-system-x86_64", "-machine", "pc", "-accel", "tcg", "-nodefaults",
            "-display", "none", "-S", "-chardev", f"socket,id=qmp0,path={qmp},server=on,wait=off",
            "-mon", "chardev=qmp0,mode=control", *argv]
    with managed(full, log=workdir / "qemu.log") as proc:
        up = wait_for(lambda: proc.poll() is not None or qmp.exists(), timeout=START_TIMEOUT)
        assert up and proc.poll() is None, f"QEMU refused {shlex.join(argv)}: " \
                                           f"{read_text(workdir / 'qemu.log')}"
        yield qmp


@pytest.mark.slow
@needs_qemu
@pytest.mark.parametrize("version", [8, 9])
@pytest.mark.parametrize("line, scsihw", [(c[0], c[1]) for c in CASES if " ceph:" not in c[0]])
def test_qemu_starts_with_qemu_servers_graph(tmp_path: Path, no_leftovers: None, line: str,
                                            scsihw: str | None, version: int) -> None:
    """The same drive, with its volume an image of ours (a path drive, as qemu-server takes
    ``scsi0: /path,…``): QEMU 7.2 starts, and the nodes carry the flags qemu-server asked for."""
    key, _, value = line.partition(": ")
    fmt = "qcow2" if ".qcow2" in value else "raw"
    image = tmp_path / f"disk.{fmt}"
    run(["qemu-img", "create", "-q", "-f", fmt, str(image), "32M"], timeout=30)
    options = value.split(",", 1)[1] if "," in value else ""
    drive = pve.parse_drive(key, ",".join(p for p in [str(image), options,
                                                      f"format={fmt}"] if p))
    storage = {"thick": "lvm", "smb": "cifs", "ceph-krbd": "krbd", "butter": "btrfs",
               "butter-nocow": "btrfs-nocow"}.get(value.split(":")[0], "path")
    volume = pve.resolve_volume(drive).model_copy(update={"storage": storage})
    out = pve.disk_args(drive, volume, scsihw=scsihw, version=version)  # type: ignore[arg-type]
    with _paused(list(out.argv), tmp_path) as qmp:
        nodes, blocks = qmp_execute(qmp, [("query-named-block-nodes", None),
                                          ("query-block", None)])
    drivers = sorted(n["drv"] for n in nodes)
    assert drivers == sorted(["file", fmt] + (["throttle"] if version == 9 else []))
    direct = pve.uses_cache_direct(drive.get("cache"), storage)
    by_driver = {n["drv"]: n for n in nodes}
    for name in ("file", fmt):
        assert by_driver[name]["cache"]["direct"] == direct
        assert by_driver[name]["cache"]["no-flush"] == (drive.get("cache") == "unsafe")
    zeroes = pve.detect_zeroes_option(drive)
    assert by_driver["throttle" if version == 9 else fmt]["detect_zeroes"] == zeroes
    backend = next(b for b in blocks if b.get("qdev"))
    writeback = drive.get("cache") not in ("writethrough", "directsync")
    assert backend["inserted"]["cache"]["writeback"] == writeback


@needs_qemu
@pytest.mark.parametrize("version", [8, 9])
def test_qemu_starts_a_template_with_its_cdroms(tmp_path: Path, no_leftovers: None,
                                                version: int) -> None:
    """A template VM's drives as translate gives them, images of ours as their volumes: QEMU
    7.2 starts them. PVE 9: every node read-only, the SATA disk an ide-cd; PVE 8 (qemu-server
    8.3): readonly=on where the bus allows it, SATA stays a writable ide-hd. The CD-ROMs are
    read-only media; the empty one has none."""
    qcow, raw, iso = tmp_path / "base.qcow2", tmp_path / "base.raw", tmp_path / "debian.iso"
    for image in (qcow, raw):
        run(["qemu-img", "create", "-q", "-f", image.suffix[1:], str(image), "32M"], timeout=30)
    iso.write_bytes(bytes(1 << 20))
    conf = (f"ide0: {iso},media=cdrom\nide2: none,media=cdrom\nsata0: {raw},format=raw\n"
            f"scsi0: {qcow},format=qcow2,discard=on\nscsihw: virtio-scsi-pci\ntemplate: 1\n")
    result = translate(conf, pve_version=version)  # type: ignore[arg-type]
    assert [d.name for d in result.drives] == ["ide0", "ide2", "scsi0", "sata0"]
    with _paused([a for d in result.drives for a in d.argv], tmp_path) as qmp:
        blocks = qmp_execute(qmp, [("query-block", None)])[0]
    devices = {b["qdev"].rsplit("/", 1)[-1]: b for b in blocks if b.get("qdev")}
    assert "inserted" not in devices["ide2"] and devices["ide2"]["removable"]
    assert devices["ide0"]["inserted"]["ro"] and devices["ide0"]["removable"]
    assert devices["scsi0"]["inserted"]["ro"]
    assert (devices["sata0"]["inserted"]["ro"], devices["sata0"]["removable"]) == (
        (True, True) if version == 9 else (False, False))


@needs_qemu
@pytest.mark.parametrize("version", [8, 9])
def test_qemu_starts_with_limits_and_identity(tmp_path: Path, no_leftovers: None,
                                              version: int) -> None:
    """The limits and identity strings as qemu-server writes them reach QEMU 7.2's disk."""
    image = tmp_path / "disk.raw"
    run(["qemu-img", "create", "-q", "-f", "raw", str(image), "32M"], timeout=30)
    drive = pve.parse_drive("scsi0", f"{image},{LIMITED.split(',', 1)[1]}")
    out = pve.disk_args(drive, pve.resolve_volume(drive), scsihw="virtio-scsi-pci",
                        version=version)  # type: ignore[arg-type]
    group = {"path": "/objects/throttle-drive-scsi0", "property": "limits"}
    with _paused(list(out.argv), tmp_path) as qmp:
        blocks, *limits = qmp_execute(qmp, [("query-block", None)]
                                      + ([("qom-get", group)] if version == 9 else []))
    inserted = next(b for b in blocks if b.get("qdev", "").endswith("scsi0"))["inserted"]
    if version == 8:    # -drive's own throttling; PVE 9's is the throttle filter's group
        assert (inserted["bps_rd"], inserted["bps_rd_max"], inserted["iops_wr"]) == (
            100 << 20, 150 << 20, 500)
    else:
        assert inserted["drv"] == "throttle"
        assert (limits[0]["bps-read"], limits[0]["bps-read-max"], limits[0]["iops-write"]) == (
            100 << 20, 150 << 20, 500)


GUEST_CONFIGS = [
    # controller, aio, cache, fmt, iothread, queues
    ("virtio-blk", "io_uring", "none", "raw", True, None),
    ("virtio-scsi-single", "native", "none", "qcow2", True, 2),
    ("virtio-scsi", "threads", "writeback", "raw", False, None),
    ("lsi", "io_uring", "writethrough", "raw", False, None),
    ("megasas", "native", "directsync", "raw", False, None),
    ("pvscsi", "threads", "unsafe", "qcow2", False, None),
    ("sata", "io_uring", "none", "raw", False, None),
    ("ide", "threads", "writeback", "raw", False, None),
]


def _guest(tmp_path: Path, kernel: Path, config: Configuration, **kw: object) -> GuestSpec:
    image = tmp_path / f"d,isk.{config.format}"
    run(["qemu-img", "create", "-q", "-f", str(config.format), str(image), "32M"], timeout=30)
    (tmp_path / "initrd").write_bytes(b"")
    return GuestSpec(config=config, image=Image(path=image, format=str(config.format),
                                                preallocation="off", size=32 << 20),
                     kernel=kernel, initrd=tmp_path / "initrd", append="console=ttyS0",
                     accel="tcg", vcpus=2, memory_bytes=128 << 20, qmp_socket=tmp_path / "q.sock",
                     serial_log=tmp_path / "serial.log", host_port=free_port(), name="t", **kw)  # type: ignore[arg-type]


@needs_qemu
@pytest.mark.parametrize("platform, version", [("proxmox", 8), ("proxmox", 9), ("libvirt", 9),
                                               ("libvirt", 11), ("qemu", 9)])
@pytest.mark.parametrize("controller, aio, cache, fmt, iothread, queues", GUEST_CONFIGS)
def test_guest_graph_on_each_platform(tmp_path: Path, kernel: Path, no_leftovers: None,
                                      platform: str, version: int, controller: str, aio: str,
                                      cache: str, fmt: str, iothread: bool,
                                      queues: int | None) -> None:
    """guest_argv with [method] platform: QEMU 7.2 starts it and applies what
    expected_guest_settings says (read back by role: file0, disk0, throttle0)."""
    config = Configuration(mode="guest", controller=controller, aio=aio, cache=cache,
                           format=fmt, preallocation="off", iothread=iothread,
                           num_queues=queues)
    if invalid_reason(config, platform=platform) is not None:
        pytest.skip(invalid_reason(config, platform=platform))
    # libvirt "9": 9.0 with QEMU 7.2, a format node over every disk; "11": 11.3 with QEMU 10.0,
    # a raw disk on its storage node (either graph runs on this host's QEMU)
    libvirt = None
    if platform == "libvirt":
        libvirt = lv.Versions(libvirt=(version, 3 if version == 11 else 0, 0),
                              qemu=(10, 0, 0) if version == 11 else (7, 2, 0))
        version = None    # pve_version
    spec = _guest(tmp_path, kernel, config, platform=platform, pve_version=version,
                  libvirt=libvirt)
    argv = guest_argv(spec)
    if platform == "proxmox":
        assert ("throttle" in " ".join(argv)) == (version == 9)
    if libvirt is not None:
        assert ('"libvirt-1-format"' in " ".join(argv)) == (fmt != "raw"
                                                            or libvirt.raw_format_node)
    log = tmp_path / "qemu.log"
    with managed(argv + ["-S"], log=log) as proc:
        assert wait_for(lambda: proc.poll() is not None or spec.qmp_socket.exists(),
                        timeout=START_TIMEOUT) and proc.poll() is None, read_text(log)
        seen = read_guest_settings(spec.qmp_socket)
    want = expected_guest_settings(config, vcpus=2, platform=platform,  # type: ignore[arg-type]
                                   pve_version=version, libvirt=libvirt)  # type: ignore[arg-type]
    assert seen == want


def test_qemu_platform_argv_is_unchanged_by_the_platform_field(tmp_path: Path) -> None:
    config = Configuration(mode="guest", controller="virtio-scsi-single", aio="io_uring",
                           cache="none", format="raw", preallocation="off", iothread=True)
    image = Image(path=Path("/var/tmp/x.raw"), format="raw", preallocation="off", size=1 << 30)
    common = dict(config=config, image=image, kernel=Path("k"), initrd=Path("i"), append="",
                  accel="tcg", vcpus=1, memory_bytes=1 << 30, qmp_socket=Path("q"),
                  serial_log=Path("s"), host_port=1, name="n")
    assert guest_argv(GuestSpec(**common)) == guest_argv(GuestSpec(**common, platform="qemu"))  # type: ignore[arg-type]


def test_platform_refusals() -> None:
    def config(**kw: object) -> Configuration:
        values: dict[str, object] = dict(mode="guest", controller="virtio-scsi", aio="io_uring",
                                         cache="none", format="raw", iothread=True)
        return Configuration(**(values | kw))  # type: ignore[arg-type]
    assert "qemu-server ignores iothread=1 on virtio-scsi" in str(
        invalid_reason(config(), platform="proxmox"))
    assert invalid_reason(config(), platform="qemu") is None
    assert "NVMe" in str(invalid_reason(config(controller="nvme", iothread=False),
                                        platform="proxmox"))
    assert "queues=" in str(invalid_reason(config(controller="virtio-blk", num_queues=2),
                                           platform="proxmox"))
    assert "lsi53c895a.iothread" in str(invalid_reason(config(controller="lsi")))
    with pytest.raises(ValueError, match="pve_version is for platform"):
        Method(pve_version=8)
    assert Method(platform="proxmox", pve_version=8).pve_version == 8


def test_libvirt_graph() -> None:
    disk, threads = lv.disk_for("virtio-blk", source="/var/lib/libvirt/images/a.qcow2",
                                block=False, aio="native", cache="none", iothread=True,
                                fmt="qcow2", num_queues=4)
    parts = _split(lv.disk_args(disk, lv.Versions(libvirt=(9, 0, 0), qemu=(7, 2, 0)),
                                iothreads=threads).argv)
    assert parts["-object"] == ['{"qom-type":"iothread","id":"iothread1"}']
    assert parts["-blockdev"] == [
        '{"driver":"file","filename":"/var/lib/libvirt/images/a.qcow2","aio":"native",'
        '"node-name":"libvirt-1-storage","cache":{"direct":true,"no-flush":false},'
        '"auto-read-only":true,"discard":"unmap"}',
        '{"node-name":"libvirt-1-format","read-only":false,"cache":{"direct":true,'
        '"no-flush":false},"driver":"qcow2","file":"libvirt-1-storage"}']
    assert parts["-device"] == ['{"driver":"virtio-blk-pci","iothread":"iothread1",'
                                '"num-queues":4,"drive":"libvirt-1-format","id":"virtio-disk0",'
                                '"bootindex":1,"write-cache":"on"}']
    with pytest.raises(ValueError, match="native I/O needs"):
        lv.disk_args(lv.disk_for("sata", source="/x", block=False, aio="native",
                                 cache="writeback", iothread=False)[0], lv.Versions())


@pytest.mark.parametrize("zeroes", ["default", "off", "on"])
def test_libvirt_detect_zeroes_default_passes_none(zeroes: str) -> None:
    """libvirt gives QEMU a disk's detect_zeroes only when it is not the default
    (VIR_DOMAIN_DISK_DETECT_ZEROES_DEFAULT, as for discard), on the node the device sits on."""
    disk, _ = lv.disk_for("virtio-blk", source="/x.raw", block=False, aio="threads",
                          cache="none", iothread=False, fmt="raw")
    disk = disk.model_copy(update={"driver": (*disk.driver, ("detect_zeroes", zeroes))})
    nodes = [json.loads(n) for n in _split(lv.disk_args(
        disk, lv.Versions(libvirt=(9, 0, 0), qemu=(7, 2, 0))).argv)["-blockdev"]]
    assert [n.get("detect-zeroes") for n in nodes] == \
        [None, None if zeroes == "default" else zeroes]


# -- guests that boot -------------------------------------------------------------------------

@pytest.mark.slow
def test_lsi_and_megasas_guests_boot_under_tcg(tmp_path: Path, no_leftovers: None) -> None:
    """The appliance has sym53c8xx and megaraid_sas: both controllers boot and are measured."""
    from iomatrix.measure.runner import run_suite
    from iomatrix.store import Store
    from iomatrix.suite import load_suite
    from tests.conftest import write_suite
    from tests.scenarios.test_guest import METHOD
    body = """
[matrix]
controller = ["lsi", "megasas"]
iothread = false
""" + METHOD.replace('runtime = "1s"', 'runtime = "500ms"')
    body += 'platform = "proxmox"\n'   # the [method] table ends METHOD
    suite = load_suite(write_suite(tmp_path, body, size="16MiB"))
    with Store(tmp_path / "r.db") as store:
        outcome = run_suite(suite, store)
        stored = store.load_run(outcome.run_id)
    assert outcome.trials_failed == 0, [t.reason for t in stored.trials if t.reason]
    for trial in stored.trials:
        assert trial.samples[0].iops > 0 and trial.applied["guest.driver"].startswith("sd")
        assert trial.applied["controller.type"] in ("lsi53c895a", "megasas")
        assert "throttle" in trial.command          # PVE 9's graph, as the guest ran it


def test_invalid_platform_configuration_is_refused_by_guest_argv(tmp_path: Path) -> None:
    config = Configuration(mode="guest", controller="nvme", aio="io_uring", cache="none",
                           format="raw", iothread=False)
    image = Image(path=tmp_path / "x.raw", format="raw", preallocation="off", size=1 << 20)
    spec = GuestSpec(config=config, image=image, kernel=Path("k"), initrd=Path("i"), append="",
                     accel="tcg", vcpus=1, memory_bytes=1 << 30, qmp_socket=Path("q"),
                     serial_log=Path("s"), host_port=1, name="n", platform="proxmox")
    with pytest.raises(InvalidCombination, match="NVMe"):
        guest_argv(spec)


def test_every_platform_a_suite_can_name_is_one_registered_module() -> None:
    """A platform is its module and its registry line (plus the name a suite may give): every
    name has a module with what qemu/ and recommend call, and each module builds a disk."""
    assert set(typing.get_args(Platform)) == set(PLATFORMS)
    config = Configuration(mode="guest", controller="virtio-blk", aio="native", cache="none",
                           iothread=True)
    image = DiskImage(path="/var/tmp/d.raw")
    for name, module in PLATFORMS.items():
        for attr in ("TITLE", "NAMES", "UNEXPRESSIBLE", "defaults", "refusal"):
            assert hasattr(module, attr), (name, attr)
        assert "-blockdev" in module.guest_disk_argv(config, image), name
        graph = module.storage_graph(config, image)
        assert graph.blockdevs and graph.export_node in "".join(graph.blockdevs), name
        assert module.graph_shape(config).detect_zeroes, name
        assert module.pasted(config, image=None, vmid="1", volume="s:v", storage="dir").text, name

