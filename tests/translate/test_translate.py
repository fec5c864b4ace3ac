"""``iomatrix translate``: VM definitions written as Proxmox VE and libvirt write them → per disk
the iomatrix configuration and the platform's QEMU arguments; what is not modelled is named."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from iomatrix.platform import libvirt as lv
from iomatrix.platform import proxmox as pve
from iomatrix.translate.vm import translate
from iomatrix.suite.configuration import Configuration

# As `qm config 100` prints it (and /etc/pve/qemu-server/100.conf holds it): keys sorted,
# drive options sorted, a snapshot section after the current configuration.
PVE_CONF = """\
# web server
agent: 1
boot: order=scsi0;ide2;net0
cores: 4
cpu: x86-64-v2-AES
ide2: local:iso/debian-12.iso,media=cdrom,size=628M
memory: 4096
meta: creation-qemu=9.2.0,ctime=1750000000
name: web
net0: virtio=BC:24:11:5A:10:01,bridge=vmbr0,firewall=1
numa: 0
ostype: l26
sata0: local:100/vm-100-disk-2.qcow2,cache=writethrough,size=8G
scsi0: local-lvm:vm-100-disk-0,aio=io_uring,cache=none,discard=on,iothread=1,size=32G,ssd=1
scsi1: local-lvm:vm-100-disk-1,backup=0,iothread=1,queues=4,size=64G
scsihw: virtio-scsi-single
smbios1: uuid=5a0e6a07-3b5e-4c1e-9e55-6d3c1f0b1d10
sockets: 1
virtio0: local-zfs:vm-100-disk-3,aio=threads,cache=writeback,iothread=1,mbps_wr=200,size=16G
vmgenid: 0b9d1a7e-2f3c-4d5e-8f90-1a2b3c4d5e6f

[before-upgrade]
scsi0: local-lvm:vm-100-disk-0,aio=native,size=32G
scsihw: lsi
"""

LIBVIRT_XML = """\
<domain type='kvm' id='3'>
  <name>db</name>
  <uuid>4dea22b3-1d52-d8f3-2516-782e98ab3fa0</uuid>
  <memory unit='KiB'>4194304</memory>
  <vcpu placement='static'>4</vcpu>
  <iothreads>1</iothreads>
  <os>
    <type arch='x86_64' machine='pc-i440fx-7.2'>hvm</type>
  </os>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2' cache='none' io='native' discard='unmap'/>
      <source file='/var/lib/libvirt/images/db.qcow2'/>
      <target dev='sda' bus='scsi'/>
      <address type='drive' controller='0' bus='0' target='0' unit='0'/>
    </disk>
    <disk type='block' device='disk'>
      <driver name='qemu' type='raw' cache='none' io='io_uring' iothread='1' queues='4'/>
      <source dev='/dev/vg0/db-data'/>
      <target dev='vdb' bus='virtio'/>
      <serial>data01</serial>
    </disk>
    <disk type='file' device='cdrom'>
      <driver name='qemu' type='raw'/>
      <target dev='hdc' bus='ide'/>
      <readonly/>
    </disk>
    <controller type='scsi' index='0' model='virtio-scsi'>
      <driver iothread='1' queues='2'/>
    </controller>
  </devices>
</domain>
"""


def test_pve_config_round_trips_to_qemu_servers_arguments() -> None:
    result = translate(PVE_CONF)
    assert result.platform == "proxmox" and result.generation.startswith("PVE 9")
    by_name = {d.name: d for d in result.disks}
    assert sorted(by_name) == ["sata0", "scsi0", "scsi1", "virtio0"]      # not ide2 (CD-ROM)
    scsi0 = by_name["scsi0"]
    assert scsi0.config == Configuration(mode="guest", controller="virtio-scsi-single",
                                         aio="io_uring", iothread=True, cache="none",
                                         format="raw", preallocation="off", discard="unmap")
    argv = list(scsi0.argv)
    assert argv[:4] == ["-object", "iothread,id=iothread-virtioscsi0", "-object",
                        '{"id":"throttle-drive-scsi0","limits":{},"qom-type":"throttle-group"}']
    assert argv[4:6] == ["-device", "virtio-scsi-pci,id=virtioscsi0,iothread=iothread-virtioscsi0"]
    node = json.loads(argv[7])
    assert node["node-name"] == "drive-scsi0" and node["discard"] == "unmap"
    assert node["detect-zeroes"] == "unmap"
    assert node["file"]["file"] == {
        "aio": "io_uring", "cache": {"direct": True, "no-flush": False},
        "detect-zeroes": "unmap", "discard": "unmap", "driver": "host_device",
        "filename": "/dev/pve/vm-100-disk-0",
        "node-name": pve.node_name("file", "scsi0", "local-lvm:vm-100-disk-0"),
        "read-only": False}
    assert argv[8:] == ["-device", "scsi-hd,bus=virtioscsi0.0,channel=0,scsi-id=0,lun=0,"
                        "drive=drive-scsi0,id=scsi0,device_id=drive-scsi0,rotation_rate=1,"
                        "bootindex=100,write-cache=on"]      # boot: order=scsi0 numbers from 100
    # queues on virtio-scsi-single; no cache given: qemu-server's cache=none
    scsi1 = by_name["scsi1"]
    assert scsi1.config is not None and scsi1.config.num_queues == 4 and scsi1.config.cache == "none"
    assert "virtio-scsi-pci,id=virtioscsi1,iothread=iothread-virtioscsi1,num_queues=4" in scsi1.argv
    # a virtio disk on ZFS with a bandwidth limit: the limit is named, not dropped
    virtio0 = by_name["virtio0"]
    assert virtio0.config is not None and virtio0.config.aio == "threads"
    assert any("mbps_wr=200 is not reproduced" in n for n in virtio0.notes)
    assert '"filename":"/dev/zvol/rpool/data/vm-100-disk-3"' in virtio0.argv[5]
    sata0 = by_name["sata0"]
    assert sata0.argv[-1] == "ide-hd,bus=ahci0.0,drive=drive-sata0,id=sata0,write-cache=off"
    assert sata0.config is not None and sata0.config.format == "qcow2"
    assert any("CD-ROM" in n for n in result.notes)


def test_pve_version_8_and_pinned_machines_use_drive() -> None:
    pinned = translate(PVE_CONF.replace("meta:", "machine: pc-i440fx-8.1\nmeta:"))
    assert pinned.generation.startswith("PVE 8")
    scsi0 = {d.name: d for d in translate(PVE_CONF, pve_version=8).disks}["scsi0"]
    assert list(scsi0.argv) == [
        "-object", "iothread,id=iothread-virtioscsi0",
        "-device", "virtio-scsi-pci,id=virtioscsi0,iothread=iothread-virtioscsi0",
        "-drive", "file=/dev/pve/vm-100-disk-0,if=none,id=drive-scsi0,cache=none,aio=io_uring,"
                  "discard=on,format=raw,detect-zeroes=unmap",
        "-device", "scsi-hd,bus=virtioscsi0.0,channel=0,scsi-id=0,lun=0,drive=drive-scsi0,"
                   "id=scsi0,rotation_rate=1,bootindex=100"]


def test_pve_defaults_and_storage_cfg() -> None:
    conf = "scsi0: fast:vm-101-disk-0,size=10G\nscsi1: slow:vm-101-disk-1,cache=writeback\n"
    storages = pve.parse_storage_cfg("lvm: fast\n\tvgname data\n\nrbd: slow\n\tpool p\n")
    disks = {d.name: d for d in translate(conf, storages=storages).disks}
    fast = disks["scsi0"]
    assert fast.config is not None and fast.config.controller == "lsi"     # no scsihw: lsi
    assert fast.config.aio == "native"            # thick LVM, direct (unset cache = none)
    assert any("qemu-server's default, lsi" in n for n in fast.notes)
    slow = disks["scsi1"]
    # librbd has no aio: measurable all the same, on a Ceph pool (iomatrix.targets.rbd)
    assert slow.values is not None and slow.values.aio is None and slow.config is not None
    assert (slow.config.aio, slow.config.cache) == (None, "writeback")
    assert any("librbd" in n and "no aio" in n for n in slow.notes)
    assert '"aio"' not in slow.argv[-3]
    unknown = translate("scsi0: nowhere:vm-1-disk-0\n").disks[0]
    assert "not in storage.cfg" in unknown.notes[0]


def test_pve_assumed_paths_and_pools_are_said() -> None:
    """``--storage ID=TYPE`` knows a storage's type only: the volume group, pool or path then
    assumed is named in a note; a storage.cfg's values are used, and nothing is assumed."""
    conf = ("scsi0: vg:vm-100-disk-0\nscsi1: tank:vm-100-disk-1\nscsi2: ceph:vm-100-disk-2\n"
            "scsi3: nfs:100/vm-100-disk-3.qcow2\nscsihw: virtio-scsi-single\n")
    guessed = {ident: pve.Storage(id=ident, type=kind) for ident, kind in (
        ("vg", "lvm"), ("tank", "zfspool"), ("ceph", "rbd"), ("nfs", "nfs"))}
    disks = {d.name: d for d in translate(conf, storages=guessed).disks}
    assert '"filename":"/dev/vg/vm-100-disk-0"' in disks["scsi0"].argv[5]
    for name, said in (("scsi0", "does not say its volume group: vg assumed"),
                       ("scsi1", "does not say its pool: tank assumed"),
                       ("scsi2", "names no pool: Proxmox VE's default, rbd"),
                       ("scsi3", "does not say its path: /mnt/pve/nfs assumed")):
        assert any(said in n for n in disks[name].notes), name
    cfg = pve.parse_storage_cfg("lvm: vg\n\tvgname veegee\n")
    given = translate("scsi0: vg:vm-100-disk-0\n", storages=cfg).disks[0]
    assert '"filename":"/dev/veegee/vm-100-disk-0"' in given.argv[-3]
    assert not any("assumed" in n for n in given.notes)


def test_pve_windows_vms_without_a_machine_version_are_pinned() -> None:
    """Machine.pm get_vm_machine: a Windows VM without a machine version runs 5.1 (PVE 9's
    -drive), or from QEMU 9.1 on the version it was created with; a pinned one its own."""
    for lines, generation in (("", 8), ("meta: creation-qemu=9.0.2,ctime=1\n", 8),
                              ("meta: creation-qemu=10.0.2,ctime=1\n", 9),
                              ("machine: pc-q35-10.0+pve1\n", 9), ("machine: q35\n", 8)):
        result = translate(f"ostype: win11\n{lines}scsi0: local-lvm:vm-1-disk-0\n")
        assert result.pve_version == generation, lines
    assert translate("ostype: l26\nscsi0: local-lvm:vm-1-disk-0\n").pve_version == 9


@pytest.mark.slow
def test_cli_shows_every_drive(tmp_path: Path) -> None:
    """An EFI disk, a TPM state and an empty CD-ROM are shown with their arguments (or why
    there are none), never dropped: the drives of a VM with no disk to measure."""
    conf = tmp_path / "105.conf"
    conf.write_text("efidisk0: local-lvm:vm-105-disk-0,efitype=4m,size=4M\nide2: none,media=cdrom\n"
                    "tpmstate0: local-lvm:vm-105-disk-1,size=4M,version=v2.0\n")
    done = subprocess.run([sys.executable, "-m", "iomatrix", "translate", str(conf)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "(no disks)" not in done.stdout
    assert "efidisk0: bios is seabios, not ovmf: qemu-server does not attach" in done.stdout
    assert "-device ide-cd,bus=ide.1,unit=0,id=ide2" in done.stdout
    assert "socket,id=tpmchar,path=/var/run/qemu-server/105.swtpm" in done.stdout
    conf.write_text("bios: ovmf\n" + conf.read_text())
    done = subprocess.run([sys.executable, "-m", "iomatrix", "translate", str(conf)],
                          capture_output=True, text=True, timeout=60)
    assert "-machine pflash0=pflash0,pflash1=drive-efidisk0" in done.stdout
    assert "OVMF_CODE_4M.fd" in done.stdout


def test_libvirt_domain_round_trips_to_libvirts_arguments() -> None:
    """libvirt 9.0 with QEMU 7.2 (Debian 12's): a format node over every storage node; the
    controller once for the domain; the empty CD-ROM takes a node number but opens nothing."""
    result = translate(LIBVIRT_XML, libvirt=lv.Versions(libvirt=(9, 0, 0), qemu=(7, 2, 0)))
    assert result.platform == "libvirt" and result.generation.startswith("libvirt 9.0.0 with")
    by_name = {d.name: d for d in result.drives}
    assert [d.name for d in result.drives] == ["sda", "vdb", "hdc"]      # libvirt's order
    sda, vdb, hdc = by_name["sda"], by_name["vdb"], by_name["hdc"]
    assert sda.config == Configuration(mode="guest", controller="virtio-scsi", aio="native",
                                       iothread=True, cache="none", format="qcow2",
                                       preallocation="off", num_queues=2, discard="unmap")
    assert list(result.argv) == [
        "-object", '{"qom-type":"iothread","id":"iothread1"}',
        "-device", '{"driver":"virtio-scsi-pci","iothread":"iothread1","id":"scsi0",'
                   '"num_queues":2}']
    assert list(sda.argv) == [
        "-blockdev", '{"driver":"file","filename":"/var/lib/libvirt/images/db.qcow2",'
                     '"aio":"native","node-name":"libvirt-3-storage","cache":{"direct":true,'
                     '"no-flush":false},"auto-read-only":true,"discard":"unmap"}',
        "-blockdev", '{"node-name":"libvirt-3-format","read-only":false,"discard":"unmap",'
                     '"cache":{"direct":true,"no-flush":false},"driver":"qcow2",'
                     '"file":"libvirt-3-storage"}',
        "-device", '{"driver":"scsi-hd","bus":"scsi0.0","channel":0,"scsi-id":0,"lun":0,'
                   '"device_id":"drive-scsi0-0-0-0","drive":"libvirt-3-format",'
                   '"id":"scsi0-0-0-0","bootindex":1,"write-cache":"on"}']
    assert vdb.config is not None and vdb.config.controller == "virtio-blk"
    assert vdb.config.num_queues == 4 and vdb.config.iothread
    assert '"driver":"host_device","filename":"/dev/vg0/db-data","aio":"io_uring"' in vdb.argv[1]
    assert vdb.argv[-1].endswith('"id":"virtio-disk1","write-cache":"on","serial":"data01"}')
    assert hdc.cdrom and hdc.config is None and list(hdc.argv) == [
        "-device", '{"driver":"ide-cd","bus":"ide.1","unit":0,"id":"ide0-1-0"}']
    # libvirt 11.3 with QEMU 10.0 (Debian 13's): the raw disk sits on its storage node
    new = {d.name: d for d in translate(LIBVIRT_XML, libvirt=lv.Versions()).disks}
    assert [a for a in new["vdb"].argv if "libvirt-2" in a] == [
        '{"driver":"host_device","filename":"/dev/vg0/db-data","aio":"io_uring",'
        '"node-name":"libvirt-2-storage","read-only":false,"cache":{"direct":true,'
        '"no-flush":false}}',
        '{"driver":"virtio-blk-pci","iothread":"iothread1","num-queues":4,'
        '"drive":"libvirt-2-storage","id":"virtio-disk1","write-cache":"on","serial":"data01"}']
    assert '"auto-read-only":true,"discard":"unmap","cache":' in new["sda"].argv[1]


@pytest.mark.slow
def test_cli_translate(tmp_path: Path) -> None:
    conf = tmp_path / "100.conf"
    conf.write_text(PVE_CONF)
    xml = tmp_path / "db.xml"
    xml.write_text(LIBVIRT_XML)
    for args, wanted in (([conf], "drive-scsi0"),
                         ([xml, "--libvirt-version", "9.0", "--qemu-version", "7.2"],
                          '"drive":"libvirt-3-format"'),
                         ([xml, "--libvirt-version", "11.3", "--qemu-version", "10.0"],
                          '"drive":"libvirt-2-storage"')):
        done = subprocess.run([sys.executable, "-m", "iomatrix", "translate", *map(str, args)],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert wanted in done.stdout and "iomatrix: controller=" in done.stdout
    done = subprocess.run([sys.executable, "-m", "iomatrix", "translate", str(conf),
                           "--pve-version", "7"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2


@pytest.mark.parametrize("folder", ["qemu-server-9.2.6", "qemu-server-8.3.13"])
def test_rbd_fixtures_are_measurable(folder: str) -> None:
    """qemu-server's rbd fixtures: every rbd and krbd disk is a configuration iomatrix can
    measure, librbd without aio, krbd with the aio Proxmox VE really uses (threads for a
    non-direct cache: Drive.pm storage_allows_io_uring_default), and the arguments name the
    monitors from monhost, the auth, and krbd's device from the fsid."""
    from tests.platform.test_cfg2cmd import FIXTURES, STORAGES, VERSIONS
    text = (FIXTURES / folder / "simple-rbd.txt").read_text()
    config = text.split("--- config\n", 1)[1].split("\n---", 1)[0]
    result = translate(config, pve_version=VERSIONS[folder], storages=STORAGES, vmid="8006")
    disks = {d.name: d for d in result.disks}
    assert len(disks) == 8 and all(d.config is not None for d in disks.values())
    for name in ("scsi0", "scsi1", "scsi2", "scsi3"):
        assert disks[name].config.aio is None                       # librbd
        joined = " ".join(disks[name].argv)
        assert "127.0.0.42" in joined and "127.0.0.21" in joined
        assert "auth" in joined and "none" in joined                # no keyring: auth none
    expected = {"scsi4": "io_uring", "scsi5": "threads", "scsi6": "threads", "scsi7": "io_uring"}
    assert {n: disks[n].config.aio for n in expected} == expected
    assert all("/dev/rbd-pve/fc4181a6-56eb-4f68-b452-8ba1f381ca2a/cpool/vm-8006-disk-0"
               in " ".join(disks[n].argv) for n in expected)


def test_proxmox_effective_aio_on_each_storage() -> None:
    """The aio qemu-server really gives a drive without aio= (Drive.pm aio_cmdline_option and
    storage_allows_io_uring_default): io_uring off for krbd with writeback/writethrough, for
    thick LVM and for CIFS (native with a direct cache, threads without); none on librbd."""
    cases = {("other", "none"): "io_uring", ("other", "writeback"): "io_uring",
             ("krbd", "none"): "io_uring", ("krbd", "writeback"): "threads",
             ("krbd", "writethrough"): "threads", ("krbd", "directsync"): "io_uring",
             ("lvm", "none"): "native", ("lvm", "writeback"): "threads",
             ("cifs", "none"): "native", ("cifs", "writethrough"): "threads",
             ("lvmthin", "writeback"): "io_uring", ("rbd", "writeback"): None}
    assert {k: pve.aio_default(*k) for k in cases} == cases


# -- discard as each platform writes it -------------------------------------------------------

@pytest.mark.parametrize("option, level", [("discard=on,", "unmap"), ("discard=ignore,", "ignore"),
                                           ("", None)])
def test_pve_discard_is_read(option: str, level: str | None) -> None:
    """Drive.pm's discard (``ignore|on``): on is unmap, ignore ignore; none: no value (the
    configuration names none, as before the axis), and the arguments are qemu-server's."""
    (disk,) = translate(f"scsi0: local-lvm:vm-100-disk-0,{option}size=8G\n", pve_version=8).disks
    assert disk.values is not None and disk.values.discard == level
    assert disk.config is not None and disk.config.discard == level
    drive = next(a for a in disk.argv if a.startswith("file="))
    assert (",discard=" in drive) == bool(option) and drive.endswith(
        ",detect-zeroes=unmap" if level == "unmap" else ",detect-zeroes=on")


def test_pve_discard_qemu_server_refuses() -> None:
    (disk,) = translate("virtio0: local-lvm:vm-100-disk-0,discard=unmap,size=8G\n").disks
    assert disk.values is None and disk.config is None
    assert disk.notes == ("virtio0: discard=unmap: Proxmox VE takes discard=on or discard=ignore",)


@pytest.mark.parametrize("attribute, level", [(" discard='unmap'", "unmap"),
                                              (" discard='ignore'", "ignore"),
                                              ("", None)])
def test_libvirt_discard_is_read(attribute: str, level: str | None) -> None:
    """virDomainDiskDiscard: none, unmap, ignore; the format node the device sits on carries
    the given one, libvirt's storage node always unmap."""
    xml = LIBVIRT_ONE.format(attribute=attribute)
    (disk,) = translate(xml, libvirt=lv.Versions(libvirt=(11, 3, 0), qemu=(10, 0, 0))).disks
    assert disk.values is not None and disk.values.discard == level
    assert disk.config is not None and disk.config.discard == level
    nodes = [json.loads(disk.argv[i + 1]) for i, a in enumerate(disk.argv) if a == "-blockdev"]
    assert nodes[0]["discard"] == "unmap" and nodes[-1].get("discard") == level


@pytest.mark.parametrize("value", ["on", "default"])
def test_libvirt_discard_libvirt_refuses(value: str) -> None:
    """libvirt's parser takes unmap or ignore (VIR_XML_PROP_NONZERO: not even default)."""
    with pytest.raises(ValueError, match=f"libvirt refuses this domain: XML error: Invalid value "
                       f"for attribute 'discard' in element 'driver': '{value}'"):
        translate(LIBVIRT_ONE.format(attribute=f" discard='{value}'"))


LIBVIRT_ONE = """<domain type='kvm'>
  <name>one</name>
  <devices>
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2' cache='none' io='native'{attribute}/>
      <source file='/var/lib/libvirt/images/one.qcow2'/>
      <target dev='vda' bus='virtio'/>
    </disk>
  </devices>
</domain>
"""


def test_libvirt_every_attribute_is_rendered_or_named() -> None:
    """issue 36: an attribute or child translate does not render, on <disk>, <driver>,
    <source>, <target> or the disk's controller, is named in a note on that disk; one it
    renders (rotation_rate, metadata_cache, cache='default') is not."""
    xml = """<domain type='kvm'><name>x</name><devices>
      <controller type='scsi' index='0' model='virtio-scsi' ports='4'>
        <driver queues='2' ioeventfd='on'/><alias name='ua-ctl'/></controller>
      <disk type='file' device='disk' snapshot='no'>
        <driver name='qemu' type='qcow2' cache='default' discard_no_unref='on'>
          <metadata_cache><max_size unit='MiB'>4</max_size></metadata_cache></driver>
        <source file='/i/a.qcow2' fdgroup='grp' startupPolicy='optional'>
          <encryption format='luks'><secret type='passphrase' uuid='u'/></encryption></source>
        <target dev='sda' bus='scsi' rotation_rate='1' tray='open'/>
        <alias name='ua-disk'/>
      </disk></devices></domain>"""
    (disk,) = translate(xml, libvirt=lv.Versions()).disks
    named = [n.removesuffix(" is not reproduced by iomatrix") for n in disk.notes
             if n.endswith("is not reproduced by iomatrix")]
    assert named == ["sda: <disk snapshot='no'>", "sda: <disk><alias>",
                     "sda: <driver discard_no_unref='on'>",
                     "sda: <source fdgroup='grp'>", "sda: <source startupPolicy='optional'>",
                     "sda: <source><encryption>", "sda: <target tray='open'>",
                     "sda: <controller ports='4'>", "sda: <controller><alias>",
                     "sda: <controller><driver ioeventfd='on'>"]
    format_node = json.loads(disk.argv[3])
    assert format_node["cache-size"] == 4 << 20 and "cache" not in format_node
    assert '"rotation_rate":1' in disk.argv[-1] and "write-cache" not in disk.argv[-1]
    assert disk.values is not None and disk.values.cache == "writeback"   # QEMU's default
