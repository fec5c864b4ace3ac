"""guest mode through a real libvirtd (iomatrix.drivers.libvirt), under TCG here: a suite of two
configurations leaves no domain behind, its disks checked against the node layout of the
daemon's own libvirt version; a domain a kill -9'd iomatrix left is destroyed by `iomatrix
clean`; the domain XML passes virt-xml-validate. And `iomatrix translate` of multi-disk domains
(CD-ROMs, serials, boot orders, virtio-blk + virtio-scsi + SATA, LSI + IDE, q35 + pvscsi) gives
libvirt's own disk arguments (`virsh domxml-to-native qemu-argv`) but for PCI placement, on
whichever libvirt is installed (9.0 on Debian 12, 11.3 on Debian 13)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from iomatrix.appliance.build import build_appliance
from iomatrix.core.owner import this_process
from iomatrix.core.proc import run as run_tool
from iomatrix.drivers import libvirt as lvd
from iomatrix.drivers.guest import free_port
from iomatrix.measure.runner import run_suite
from iomatrix.platform import libvirt as lv
from iomatrix.testing.libvirt_oracle import disk_arguments
from iomatrix.translate.vm import translate
from iomatrix.store import Store
from iomatrix.suite import load_suite
from iomatrix.suite.configuration import Configuration
from iomatrix.targets.workspace import Image
from tests.conftest import BOOT_SECONDS, write_suite
from tests.needs import needs

pytestmark = pytest.mark.slow

URI = lvd.DEFAULT_URI


needs_libvirtd = needs("libvirt")

BODY = """
[matrix]
controller = ["virtio-blk", "virtio-scsi-single"]
aio = "io_uring"
iothread = true
cache = "none"

[workloads]
rw = "randread"
iodepth = 4

[method]
mode = "guest"
ramp = 0
runtime = "{runtime}"
accel = "tcg"
vcpus = 1
memory = "384MiB"
boot_timeout = "{boot}s"
platform = "libvirt"
libvirt_uri = "qemu:///system"
"""


def _ours() -> list[str]:
    me = os.getpid()
    return [n for n in lvd.leftover_domains(URI) if f"-p{me}-" in n]


# Every domain start and domxml-to-native may wait for libvirt to probe QEMU again
# (lvd.PROBE_TIMEOUT): these tests get time for a few such probes on a loaded host.
SLOW_LIBVIRT = pytest.mark.timeout(4 * lvd.PROBE_TIMEOUT)


@needs_libvirtd
@SLOW_LIBVIRT
def test_two_configurations_through_libvirtd(tmp_path: Path, no_leftovers: None,
                                             versions: lv.Versions) -> None:
    suite = load_suite(write_suite(tmp_path, BODY.format(runtime="500ms", boot=BOOT_SECONDS), size="16MiB"))
    with Store(tmp_path / "r.db") as store:
        outcome = run_suite(suite, store)
        stored = store.load_run(outcome.run_id)
    assert outcome.trials_failed == 0, [t.reason for t in stored.trials if t.reason]
    assert len({t.config_key for t in stored.trials}) == 2
    # raw disks: a format node over the storage node up to libvirt 10.0 or QEMU 8.2, none after
    top = "libvirt-1-format" if versions.raw_format_node else "libvirt-1-storage"
    for trial in stored.trials:
        applied = trial.applied
        assert applied["libvirt.uri"] == URI and applied["libvirt.domain"].startswith("iomatrix-")
        assert applied["libvirt.cache.direct"] == "true"        # through libvirt's own monitor
        assert applied["device.iothread"] == "iothread1" and applied["iothreads"] == "1"
        assert f'"drive":"{top}"' in trial.command and "-accel tcg" in trial.command
        assert applied["backend.node"] == ("disk0" if versions.raw_format_node else "file0")
        assert applied["libvirt.version"] == versions.label
        assert trial.samples[0].iops > 0
    assert _ours() == []


@needs_libvirtd
@SLOW_LIBVIRT
def test_kill_9_leaves_a_domain_that_clean_destroys(tmp_path: Path) -> None:
    suite = write_suite(tmp_path, BODY.format(runtime="60s", boot=BOOT_SECONDS), size="16MiB")
    env = os.environ | {"TMPDIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "iomatrix", "run", str(suite), "--db",
                             str(tmp_path / "r.db")], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120 + lvd.PROBE_TIMEOUT
        mine: list[str] = []
        while time.monotonic() < deadline and not mine:
            mine = [n for n in lvd.leftover_domains(URI) if f"-p{proc.pid}-" in n]
            time.sleep(0.5)
        assert mine, "the run started no domain"
        owner = lvd.owner_of(URI, mine[0])
        assert owner is not None and owner.pid == proc.pid
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert mine[0] in lvd.leftover_domains(URI)        # libvirtd keeps it: nobody destroyed it
    out = subprocess.run([sys.executable, "-m", "iomatrix", "clean", "--db",
                          str(tmp_path / "r.db")], env=env, capture_output=True, text=True,
                         timeout=120)
    # Another xdist worker's libvirt run may reclaim a dead owner's domain first, as every run
    # does on starting (LibvirtDriver.prepare): then clean finds nothing; gone it must be.
    assert (f"destroyed libvirt domain {mine[0]}" in out.stdout
            or "libvirt domain" not in out.stdout), out.stdout + out.stderr
    assert not [n for n in lvd.leftover_domains(URI) if f"-p{proc.pid}-" in n]


@needs_libvirtd
@SLOW_LIBVIRT
def test_live_owner_is_left_alone(tmp_path: Path) -> None:
    """A domain whose owner runs (this test) is not destroyed by reclaim."""
    xml = tmp_path / "d.xml"
    xml.write_text(_domain(tmp_path, "virtio-blk", name=f"iomatrix-t-p{os.getpid()}-b1-vm0"))
    try:
        lvd.virsh(URI, "create", str(xml), timeout=lvd.PROBE_TIMEOUT)
        results = {i.name: i.action for i in lvd.reclaim_domains(URI)}
        assert results[f"iomatrix-t-p{os.getpid()}-b1-vm0"] == "left"
    finally:
        lvd.destroy(URI, f"iomatrix-t-p{os.getpid()}-b1-vm0")
    assert _ours() == []


def _domain(tmp_path: Path, controller: str, *, name: str = "iomatrix-x-p1-b1-vm0") -> str:
    image = tmp_path / f"{controller}.raw"
    run_tool(["qemu-img", "create", "-q", "-f", "raw", str(image), "16M"], timeout=30)
    config = Configuration(mode="guest", controller=controller, aio="io_uring", cache="none",
                           format="raw", preallocation="off", iothread=True)
    appliance = build_appliance()
    return lvd.domain_xml(lvd.DomainSpec(
        name=name, config=config,
        image=Image(path=image, format="raw", preallocation="off", size=16 << 20),
        kernel=appliance.kernel, initrd=appliance.initrd, cmdline="console=ttyS0", accel="tcg", vcpus=1,
        memory_bytes=384 << 20, console=tmp_path / "console.log", qmp_socket=tmp_path / "qmp",
        host_port=free_port(), owner=this_process(), run="t"))


@needs("libvirt-clients")
@pytest.mark.parametrize("controller",
                         ["virtio-blk", "virtio-scsi-single", "sata", "lsi", "megasas"])
def test_domain_xml_validates(tmp_path: Path, controller: str) -> None:
    xml = tmp_path / "d.xml"
    xml.write_text(_domain(tmp_path, controller))
    result = subprocess.run(["virt-xml-validate", str(xml), "domain"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


# -- translate against libvirt's own command line ----------------------------------------------

DOMAINS = {
    "virtio-scsi-sata": """<domain type='qemu'>
  <name>multi</name>
  <memory unit='MiB'>256</memory>
  <iothreads>2</iothreads>
  <os><type arch='x86_64' machine='pc'>hvm</type></os>
  <devices>
    <controller type='scsi' index='0' model='virtio-scsi'><driver iothread='2' queues='2'/></controller>
    <controller type='sata' index='0'/>
    <disk type='file' device='disk'>
      <driver name='qemu' type='raw' cache='none' io='native' iothread='1'/>
      <source file='{dir}/a.raw'/>
      <target dev='vda' bus='virtio'/>
      <serial>SERIAL-A</serial>
    </disk>
    <disk type='file' device='cdrom'>
      <driver name='qemu' type='raw'/>
      <source file='{dir}/cd.iso'/>
      <target dev='sdb' bus='sata'/>
      <readonly/>
    </disk>
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2' cache='writeback' io='threads'/>
      <source file='{dir}/b.qcow2'/>
      <target dev='sda' bus='scsi'/>
      <serial>scsi-b</serial>
    </disk>
    <disk type='file' device='disk'>
      <driver name='qemu' type='raw' cache='directsync' io='io_uring' discard='unmap' detect_zeroes='unmap'/>
      <source file='{dir}/c.raw'/>
      <target dev='vdb' bus='virtio'/>
    </disk>
    <disk type='file' device='disk'>
      <driver name='qemu' type='raw' cache='none'/>
      <source file='{dir}/d.raw'/>
      <target dev='sdc' bus='sata'/>
    </disk>
  </devices>
</domain>""",
    "lsi-ide-boot-cdrom": """<domain type='qemu'>
  <name>lsi-ide</name>
  <memory unit='MiB'>256</memory>
  <os><type arch='x86_64' machine='pc'>hvm</type><boot dev='cdrom'/><boot dev='hd'/></os>
  <devices>
    <controller type='scsi' index='0' model='lsilogic'/>
    <disk type='file' device='disk'>
      <driver name='qemu' type='raw' cache='writethrough' error_policy='stop' rerror_policy='report'/>
      <source file='{dir}/sdb.raw'/>
      <target dev='sdb' bus='scsi'/>
    </disk>
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2' cache='unsafe' detect_zeroes='off'/>
      <source file='{dir}/sda.qcow2'/>
      <target dev='sda' bus='scsi'/>
      <serial>with space</serial>
    </disk>
    <disk type='file' device='cdrom'>
      <driver name='qemu' type='raw'/>
      <target dev='hdc' bus='ide'/>
      <readonly/>
    </disk>
    <disk type='block' device='disk'>
      <driver name='qemu' type='raw' cache='none' io='native' error_policy='enospace'/>
      <source dev='/dev/null'/>
      <target dev='hda' bus='ide'/>
    </disk>
    <disk type='file' device='cdrom'>
      <driver name='qemu' type='raw' cache='none'/>
      <source file='{dir}/cd2.iso'/>
      <target dev='sdh' bus='scsi'/>
    </disk>
  </devices>
</domain>""",
    "q35-pvscsi-boot-order": """<domain type='qemu'>
  <name>q35</name>
  <memory unit='MiB'>256</memory>
  <os><type arch='x86_64' machine='q35'>hvm</type></os>
  <iothreads>1</iothreads>
  <devices>
    <controller type='scsi' index='1' model='vmpvscsi'/>
    <controller type='scsi' index='0' model='virtio-scsi'><driver queues='4'/></controller>
    <disk type='file' device='disk'>
      <driver name='qemu' type='raw' cache='none' io='threads' queues='2' queue_size='256' iothread='1'/>
      <source file='{dir}/vdc.raw'/>
      <target dev='vdc' bus='virtio'/>
      <boot order='2'/>
    </disk>
    <disk type='file' device='disk'>
      <driver name='qemu' type='raw' discard='ignore' detect_zeroes='on'/>
      <source file='{dir}/vda.raw'/>
      <target dev='vda' bus='virtio'/>
    </disk>
    <disk type='file' device='cdrom'>
      <driver name='qemu' type='raw'/>
      <source file='{dir}/cd.iso'/>
      <target dev='sdc' bus='sata'/>
      <boot order='1'/>
    </disk>
    <disk type='file' device='disk'>
      <driver name='qemu' type='raw' cache='writeback'/>
      <source file='{dir}/sda.raw'/>
      <target dev='sda' bus='sata'/>
      <serial>sata-a</serial>
    </disk>
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2' cache='directsync' io='native'/>
      <source file='{dir}/pv.qcow2'/>
      <target dev='sdb' bus='scsi'/>
      <address type='drive' controller='1' bus='0' target='0' unit='3'/>
    </disk>
    <disk type='file' device='disk'>
      <driver name='qemu' type='raw'/>
      <source file='{dir}/vs.raw'/>
      <target dev='sdd' bus='scsi'/>
      <address type='drive' controller='0' bus='0' target='2' unit='1'/>
    </disk>
  </devices>
</domain>""",
    # issue 36: libvirt numbers and boots every disk, those translate does not render too (USB,
    # floppy, network); a qcow2's <backingStore> chain takes numbers and nodes
    "every-disk-numbered": """<domain type='qemu'>
  <name>numbers</name>
  <memory unit='MiB'>256</memory>
  <os><type arch='x86_64' machine='pc'>hvm</type></os>
  <devices>
    <disk type='file' device='disk'>
      <driver name='qemu' type='raw'/>
      <source file='{dir}/u.raw'/>
      <target dev='sdz' bus='usb'/>
    </disk>
    <disk type='file' device='disk'>
      <driver name='qemu' type='raw' cache='none'/>
      <source file='{dir}/a.raw'/>
      <target dev='vda' bus='virtio'/>
    </disk>
    <disk type='network' device='disk'>
      <driver name='qemu' type='raw'/>
      <source protocol='nbd' name='x'><host name='example.org' port='10809'/></source>
      <target dev='sdy' bus='usb'/>
    </disk>
    <disk type='file' device='floppy'>
      <driver name='qemu' type='raw'/>
      <source file='{dir}/f.img'/>
      <target dev='fda' bus='fdc'/>
    </disk>
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2' cache='writeback' discard='unmap' detect_zeroes='on'/>
      <source file='{dir}/top.qcow2'/>
      <backingStore type='file'>
        <format type='qcow2'/>
        <source file='{dir}/mid.qcow2'/>
        <backingStore type='block'><format type='raw'/><source dev='/dev/null'/><backingStore/></backingStore>
      </backingStore>
      <target dev='vdc' bus='virtio'/>
    </disk>
    <disk type='file' device='cdrom'>
      <driver name='qemu' type='raw'/>
      <target dev='hdc' bus='ide'/>
      <readonly/>
    </disk>
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2'/>
      <source file='{dir}/closed.qcow2'/>
      <backingStore/>
      <target dev='vdb' bus='virtio'/>
    </disk>
  </devices>
</domain>""",
    # issue 36: settings translate used to drop: a block CD-ROM not named as a CD-ROM drive
    # (host_device), <metadata_cache>, <slices> on raw and qcow2, rotation_rate, cache='default',
    # <dataStore> (ignored by 9.0, data-file from 10.10), <boot dev='hd'> to a disk on any bus
    "settings-rendered": """<domain type='qemu'>
  <name>settings</name>
  <memory unit='MiB'>256</memory>
  <os><type arch='x86_64' machine='q35'>hvm</type><boot dev='hd'/><boot dev='cdrom'/></os>
  <devices>
    <controller type='scsi' index='0' model='virtio-scsi'/>
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2' cache='default'>
        <metadata_cache><max_size unit='KiB'>2048</max_size></metadata_cache>
      </driver>
      <source file='{dir}/m.qcow2'/>
      <target dev='sdc' bus='sata' rotation_rate='7200'/>
    </disk>
    <disk type='block' device='cdrom'>
      <driver name='qemu' type='raw' io='native' cache='none'/>
      <source dev='/dev/null'/>
      <target dev='sdd' bus='sata'/>
      <readonly/>
    </disk>
    <disk type='file' device='disk'>
      <driver name='qemu' type='raw' cache='directsync'/>
      <source file='{dir}/s.raw'>
        <slices><slice type='storage' offset='4096' size='65536'/></slices>
      </source>
      <target dev='sda' bus='scsi' rotation_rate='1'/>
    </disk>
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2' cache='writethrough'/>
      <source file='{dir}/sq.qcow2'>
        <slices><slice type='storage' offset='0' size='1048576'/></slices>
      </source>
      <target dev='vda' bus='virtio'/>
    </disk>
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2'>
        <metadata_cache><max_size unit='MiB'>1</max_size></metadata_cache>
      </driver>
      <source file='{dir}/d.qcow2'>
        <dataStore type='file'><format type='raw'/><source file='{dir}/data.raw'/></dataStore>
      </source>
      <target dev='vdb' bus='virtio'/>
    </disk>
  </devices>
</domain>""",
    # the device's own keys: <shareable/> (share-rw, and cache none where none is given),
    # <blockio> (discard_granularity from libvirt 10), <wwn>, <vendor>, <product>; a
    # copy-on-read filter node (copy_on_read='on')
    "device-keys": """<domain type='qemu'>
  <name>keys</name>
  <memory unit='MiB'>256</memory>
  <os><type arch='x86_64' machine='pc'>hvm</type></os>
  <devices>
    <controller type='scsi' index='0' model='virtio-scsi'/>
    <disk type='file' device='disk'>
      <driver name='qemu' type='raw' cache='none'/>
      <source file='{dir}/a.raw'/>
      <target dev='sda' bus='scsi'/>
      <shareable/>
      <vendor>VEND</vendor>
      <product>PROD X</product>
      <wwn>5000c50015ea71ac</wwn>
      <blockio logical_block_size='512' physical_block_size='4096' discard_granularity='4096'/>
      <serial>S1</serial>
    </disk>
    <disk type='file' device='disk'>
      <driver name='qemu' type='raw'/>
      <source file='{dir}/b.raw'/>
      <target dev='vda' bus='virtio'/>
      <shareable/>
      <blockio logical_block_size='4096' physical_block_size='4096'/>
    </disk>
    <disk type='file' device='disk'>
      <driver name='qemu' type='raw' copy_on_read='on' cache='writeback'/>
      <source file='{dir}/c.raw'/>
      <target dev='hda' bus='ide'/>
      <wwn>5000c50015ea71ad</wwn>
    </disk>
    <disk type='file' device='cdrom'>
      <driver name='qemu' type='raw'/>
      <source file='{dir}/cd.iso'/>
      <target dev='hdc' bus='ide'/>
      <readonly/>
    </disk>
  </devices>
</domain>""",
}
SINCE: dict[str, tuple[int, int, int]] = {}
"""The first libvirt that takes a fixture (an older one refuses it)."""


def _rendered(args: list[str]) -> list[str]:
    """:func:`disk_arguments` but the nodes no disk device there stands on (those of floppy
    and USB disks, which translate does not render): the nodes a device's ``drive`` reaches
    through ``file``, ``backing`` and ``data-file``."""
    pairs = [(o, v) for o, v in zip(args[::2], args[1::2])
             if o != "-device" or json.loads(v)["driver"] not in ("floppy", "usb-storage")]
    nodes = {json.loads(v)["node-name"]: json.loads(v) for o, v in pairs if o == "-blockdev"}
    wanted = [json.loads(v).get("drive") for o, v in pairs if o == "-device"]
    used: set[str] = set()
    while wanted:
        name = wanted.pop()
        if name in nodes and name not in used:
            used.add(name)
            wanted += [nodes[name].get(k) for k in ("file", "backing", "data-file")]
    return [a for o, v in pairs if o != "-blockdev" or json.loads(v)["node-name"] in used
            for a in (o, v)]


@pytest.fixture(scope="module")
def versions() -> lv.Versions:
    return lvd.daemon_versions(URI)


@needs_libvirtd
@SLOW_LIBVIRT
@pytest.mark.parametrize("name", sorted(DOMAINS))
def test_translate_gives_libvirts_own_disk_arguments(tmp_path: Path, name: str,
                                                     versions: lv.Versions) -> None:
    if versions.libvirt < SINCE.get(name, (0, 0, 0)):
        pytest.skip(f"libvirt {lv.shown(versions.libvirt)} refuses {name}: needs "
                    f"{lv.shown(SINCE[name])} (the Debian 13 pass runs it)")
    xml = tmp_path / "domain.xml"
    xml.write_text(DOMAINS[name].format(dir=tmp_path))
    for image in ("top.qcow2", "mid.qcow2", "closed.qcow2", "m.qcow2", "sq.qcow2"):
        run_tool(["qemu-img", "create", "-q", "-f", "qcow2", str(tmp_path / image), "1M"],
                 timeout=30)
    real = shlex.split(lvd.virsh(URI, "domxml-to-native", "qemu-argv", str(xml),
                                 timeout=lvd.PROBE_TIMEOUT))
    result = translate(xml.read_text(), libvirt=versions)
    ours = list(result.argv) + [a for disk in result.drives for a in disk.argv]
    assert ours == _rendered(disk_arguments(real)), versions.label
    assert any(d.cdrom for d in result.drives)
    left_out = [n for d in result.drives for n in d.notes
                if "not reproduced" in n or "ignored" in n and "9.0" not in n]
    assert left_out == [] and result.notes[0] == (
        "PCI addresses are left out: they place a device, they do not change its I/O")
    assert all("is not modelled" in n for n in result.notes[1:]), result.notes
    raw = [a for a in ours if '"driver":"raw"' in a and "-format" in a]
    assert bool(raw) == versions.raw_format_node        # the version decides the layout
