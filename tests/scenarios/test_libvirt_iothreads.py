"""Several IOThreads per disk and CPU pinning in libvirt's domain XML: a disk's ``<driver>
<iothreads>`` (round-robin and an explicit queue mapping) and ``<cputune>`` (vcpupin,
iothreadpin, emulatorpin) as iomatrix writes them validate on the installed libvirtd and give
libvirt's own arguments (``virsh domxml-to-native``) from libvirt 10.0 on (11.3 in the Debian 13
pass); libvirt 9.0's schema refuses the mapping, its domxml-to-native drops it without a word,
and iomatrix refuses it in one line. And the XML read back: the same IOThreads, mapping and CPU
sets as configuration values."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from iomatrix.drivers import libvirt as lvd
from iomatrix.platform import libvirt as lv
from iomatrix.platform.libvirt.defaults import NUMA_CPUS, _text
from iomatrix.suite.configuration import Configuration
from iomatrix.store import Store
from iomatrix.targets.workspace import Image
from iomatrix.translate.vm import translate
from iomatrix.cli.status import ExitStatus
from iomatrix.core import cpuset
from iomatrix.core.owner import this_process
from iomatrix.drivers.guest import free_port
from tests.conftest import cli_result, write_suite
from tests.needs import needs
from iomatrix.testing.libvirt_oracle import disk_arguments
from tests.scenarios.test_libvirt import SLOW_LIBVIRT, URI

from xml.etree import ElementTree as ET


def _domain(tmp_path: Path, *, vcpus: int = 2, mapped: bool = True) -> str:
    """Three virtio disks: one IOThread, two round-robin, two with queues mapped (``mapped``;
    else the first alone); pinned."""
    root = ET.Element("domain", {"type": "qemu"})
    ET.SubElement(root, "name").text = "iothreads"
    ET.SubElement(root, "memory", {"unit": "MiB"}).text = "256"
    ET.SubElement(root, "vcpu").text = str(vcpus)
    disks = [
        lv.disk_for("virtio-blk", source=str(tmp_path / "a.raw"), block=False, aio="io_uring",
                    cache="none", iothread=True),
        lv.disk_for("virtio-blk", source=str(tmp_path / "b.raw"), block=False, aio="threads",
                    cache="none", iothread=True, iothreads=2, num_queues=2),
        lv.disk_for("virtio-blk", source=str(tmp_path / "c.raw"), block=False, aio="native",
                    cache="none", iothread=True, iothreads=2, num_queues=4, queue_size=128,
                    vq_groups=((0, 3), (1, 2))),
        lv.disk_for("virtio-scsi-single", source=str(tmp_path / "d.raw"), block=False,
                    aio="io_uring", cache="none", iothread=True, iothreads=2,
                    num_queues=2)][:4 if mapped else 1]
    threads = max(n for _, n in disks)
    ET.SubElement(root, "iothreads").text = str(threads)
    tune = lv.cputune_xml(vcpus=vcpus, iothreads=threads, vcpu="0", iothread="0", main="0")
    assert tune is not None
    root.append(tune)
    os_el = ET.SubElement(root, "os")
    ET.SubElement(os_el, "type", {"arch": "x86_64", "machine": "pc"}).text = "hvm"
    devices = ET.SubElement(root, "devices")
    for i, (disk, _) in enumerate(disks):
        if disk.bus == "virtio":
            disk = disk.model_copy(update={"dev": f"vd{'abc'[i]}"})
        devices.extend(e for where, e in lv.disk_xml(disk) if where == "<devices>")
    return _text(root)


def test_read_back_as_configuration_values(tmp_path: Path) -> None:
    result = translate(_domain(tmp_path), libvirt=lv.Versions())
    values = {d.name: d.values for d in result.disks}
    assert [(v.iothread, v.iothreads, v.vq_mapping, v.num_queues) for v in values.values()
            if v is not None] == [(True, None, None, None), (True, 2, None, 2),
                                  (True, 2, "0,3:1,2", 4), (True, 2, None, 2)]
    assert {(v.vcpu_affinity, v.iothread_affinity, v.main_affinity)
            for v in values.values() if v is not None} == {("0", "0", "0")}
    device = next(a for a in result.disks[2].argv if "iothread-vq-mapping" in a)
    assert '"iothread-vq-mapping":[{"iothread":"iothread1","vqs":[0,3]},' in device
    old = translate(_domain(tmp_path), libvirt=lv.Versions(libvirt=(9, 0, 0), qemu=(7, 2, 0)))
    # libvirt 9.0 reads no <driver><iothreads>: the devices go without a mapping, as its
    # domxml-to-native gives them, and each disk says so
    assert not any("iothread-vq-mapping" in a for d in old.disks for a in d.argv)
    assert [bool(d.argv) for d in old.disks] == [True] * 4
    assert "libvirt 11.2.0 or later needed" in old.disks[3].notes[-1]
    assert old.disks[1].notes[-1] == (
        "vdb: <driver><iothreads> is ignored: libvirt 9.0.0 has no <driver><iothreads> on a disk "
        "(several IOThreads per disk): libvirt 10.0.0 or later needed")


def test_uneven_pins_and_foreign_cpusets_are_named() -> None:
    text = """<domain type='qemu'><name>x</name><vcpu cpuset='2-3'>2</vcpu><iothreads>2</iothreads>
      <cputune><vcpupin vcpu='0' cpuset='1'/><iothreadpin iothread='1' cpuset='0-3,^2'/>
      </cputune><os><type arch='x86_64' machine='pc'>hvm</type></os><devices>
      <disk type='file' device='disk'><driver name='qemu' type='raw' cache='none' io='native'>
      <iothreads><iothread id='1'/><iothread id='2'/></iothreads></driver>
      <source file='/x.raw'/><target dev='vda' bus='virtio'/></disk></devices></domain>"""
    values = translate(text).disks[0].values
    assert values is not None
    assert (values.vcpu_affinity, values.iothread_affinity, values.main_affinity) == (
        None, None, "2-3")       # vCPU 1 and emulator take <vcpu cpuset=>
    assert any("vCPUs are pinned unevenly (1, 2-3" in n for n in values.notes)
    assert any("IOThreads are pinned unevenly" in n for n in values.notes)


@needs("libvirt")
@SLOW_LIBVIRT
@pytest.mark.slow
def test_validated_and_equal_to_domxml_to_native(tmp_path: Path) -> None:
    versions = lvd.daemon_versions(URI)
    xml = tmp_path / "domain.xml"
    xml.write_text(_domain(tmp_path))
    for name in "abcd":
        (tmp_path / f"{name}.raw").write_bytes(b"\0" * 65536)
    valid = subprocess.run(["virt-xml-validate", str(xml), "domain"], capture_output=True,
                           text=True, timeout=60)
    real = shlex.split(lvd.virsh(URI, "domxml-to-native", "qemu-argv", str(xml),
                                 timeout=lvd.PROBE_TIMEOUT))
    result = translate(xml.read_text(), libvirt=versions)
    if versions.mapping_refusal() is None:
        assert valid.returncode == 0, valid.stdout + valid.stderr
        ours = list(result.argv) + [a for disk in result.drives for a in disk.argv]
        assert ours == disk_arguments(real), versions.label
        assert sum("iothread-vq-mapping" in a for a in ours) == 3     # 2 disks, 1 controller
        return
    # libvirt 9.0: its schema refuses <driver><iothreads> (the cputune alone it takes), but
    # without --validate it reads none: domxml-to-native drops the mapping (translate says so)
    assert valid.returncode != 0, valid.stdout
    xml.write_text(_domain(tmp_path, mapped=False))
    alone = subprocess.run(["virt-xml-validate", str(xml), "domain"], capture_output=True,
                           text=True, timeout=60)
    assert alone.returncode == 0, alone.stdout + alone.stderr
    assert not any("iothread-vq-mapping" in a for a in real)
    ours = list(result.argv) + [a for disk in result.drives for a in disk.argv]
    assert ours == disk_arguments(real), versions.label       # the mapping ignored, as there
    assert "is ignored: libvirt 9.0.0 has no" in result.disks[1].notes[-1]


def test_pasted_and_refused() -> None:
    config = Configuration(mode="guest", controller="virtio-blk", aio="io_uring", cache="none",
                           format="raw", preallocation="off", iothread=True, iothreads=2,
                           vq_mapping="0:1", num_queues=2, iothread_affinity="1",
                           main_affinity="numa")
    pasted = lv.pasted(config)
    assert [where for where, _ in pasted.fragments] == ["<domain>", "<domain>", "<devices>"]
    assert "<iothreadpin iothread='2' cpuset='1'/>" in pasted.text
    assert f"<emulatorpin cpuset='{NUMA_CPUS}'/>" in pasted.text
    assert "<queue id='1'/>" in pasted.text and "vcpupin" not in pasted.text
    scsi = lv.pasted(config.model_copy(update={"controller": "virtio-scsi-single"})).text
    assert "<controller type='scsi' index='0' model='virtio-scsi'>" in scsi
    assert "<driver queues='2'>" in scsi and "<iothread id='2'>" in scsi
    assert lv.refusal(config) is None
    assert "no IOThread mapping for sata" in str(lv.refusal(config.model_copy(
        update={"controller": "sata"})))


@needs("libvirt", "fio", "qemu")
@SLOW_LIBVIRT
@pytest.mark.slow
def test_run_on_a_libvirt_without_the_mapping_is_refused_first(tmp_path: Path) -> None:
    """platform = "libvirt" with several IOThreads per disk, on a libvirtd (or its QEMU)
    without them (this host's 9.0 with 7.2): refused in one line before the run, nothing
    stored; where the libvirtd has them (Debian 13) this refusal is not the one given."""
    versions = lvd.daemon_versions(URI)
    path = write_suite(tmp_path, """
[matrix]
controller = "virtio-blk"
aio = "threads"
iothread = true
iothreads = 2
num_queues = 2
cache = "none"

[workloads]
rw = "randread"

[method]
mode = "guest"
runtime = "1s"
ramp = 0
accel = "tcg"
vcpus = 2
platform = "libvirt"
""")
    done = cli_result("run", str(path), "--db", str(tmp_path / "r.db"), cwd=tmp_path)
    refused = versions.mapping_refusal()
    if refused is None:
        pytest.skip(f"{versions.label} has the mapping: test_validated_and_equal_to_domxml_to_"
                    "native checks its XML")
    assert done.returncode == ExitStatus.ENVIRONMENT, done.stdout + done.stderr
    lines = [line for line in done.stderr.strip().splitlines() if "hint:" not in line]
    assert len(lines) == 1 and refused in lines[0], done.stderr
    if (tmp_path / "r.db").exists():
        with Store(tmp_path / "r.db") as store:
            assert store.list_runs() == []


def _allowed(pid: int, tid: int) -> str:
    status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
    return next(line.split(":", 1)[1].strip() for line in status.splitlines()
                if line.startswith("Cpus_allowed_list:"))


@needs("libvirt")
@SLOW_LIBVIRT
@pytest.mark.slow
def test_cputune_pins_the_threads_as_proc_shows(tmp_path: Path) -> None:
    """The domain iomatrix's libvirt driver writes for a configuration's CPU sets, started
    paused by the real libvirtd: each vCPU thread, the IOThread and QEMU's main thread allowed
    on the CPUs asked (/proc's Cpus_allowed_list), none on the others."""
    online = cpuset.online()
    if len(online) < 2:
        pytest.skip("needs two online CPUs to tell the pins apart")
    first, second = sorted(online)[:2]
    config = Configuration(mode="guest", controller="virtio-blk", aio="threads", cache="none",
                           format="raw", preallocation="off", iothread=True,
                           vcpu_affinity=str(first), iothread_affinity=str(second),
                           main_affinity=str(second))
    image = tmp_path / "d.raw"
    image.write_bytes(b"\0" * (1 << 20))
    name = f"iomatrix-t-p{os.getpid()}-b1-vm7"
    text = lvd.domain_xml(lvd.DomainSpec(
        name=name, config=config,
        image=Image(path=image, format="raw", preallocation="off", size=1 << 20),
        kernel=tmp_path / "k", initrd=tmp_path / "i", cmdline="", accel="tcg",
        vcpus=2, memory_bytes=256 << 20, console=tmp_path / "console.log",
        qmp_socket=tmp_path / "qmp", host_port=free_port(), owner=this_process(), run="t"))
    root = ET.fromstring(text)              # started paused: nothing to boot, no kernel needed
    os_el = root.find("os")
    assert os_el is not None
    for tag in ("kernel", "initrd", "cmdline"):
        os_el.remove(os_el.find(tag))  # type: ignore[arg-type]
    xml = tmp_path / "domain.xml"
    xml.write_text(ET.tostring(root, encoding="unicode"))
    try:
        lvd.virsh(URI, "create", str(xml), "--paused", timeout=lvd.PROBE_TIMEOUT)
        pid = int((lvd.RUN_DIR / f"{name}.pid").read_text().strip())
        names = {int(t.name): (t / "comm").read_text().strip()
                 for t in Path(f"/proc/{pid}/task").iterdir()}
        vcpus = [tid for tid, comm in names.items() if comm.startswith("CPU ")]
        threads = [tid for tid, comm in names.items() if comm == "IO iothread1"]
        assert len(vcpus) == 2 and len(threads) == 1, names
        assert {_allowed(pid, t) for t in vcpus} == {str(first)}
        assert _allowed(pid, threads[0]) == str(second)
        assert _allowed(pid, pid) == str(second)        # the main loop: <emulatorpin>
    finally:
        lvd.destroy(URI, name)
    assert name not in lvd.leftover_domains(URI)
