"""``[matrix] from_vm``: a suite starts from the user's VM (a Proxmox VE config or a libvirt
domain, written as the platforms write them). Its disk becomes the reference configuration,
measured in the same rounds as the matrix; the resolved settings are stored with the run, so
that resume, show, recommend and the report work without the file; what cannot be read or
measured is refused in one line."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from iomatrix.analysis.yourvm import your_vm
from iomatrix.cli.status import ExitStatus
from iomatrix.platform import libvirt as lv
from iomatrix.platform import proxmox as pve
from iomatrix.platform.settings import DiskImage
from iomatrix.translate.fromvm import resolve_vm
from iomatrix.measure.runner import SilentProgress, run_suite
from iomatrix.recommend.decide import recommend
from iomatrix.report.data import build_report_data
from iomatrix.store import Store
from iomatrix.suite import expand, load_suite, load_suite_text
from iomatrix.suite.fields import YOUR_VM
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.spec import RunSpec
from iomatrix.translate.vm import translate
from tests.conftest import write_suite
from tests.cli.test_cli_inprocess import invoke
from tests.translate.test_translate import LIBVIRT_XML, PVE_CONF

MATRIX = """
[matrix]
from_vm = "{file}"
{disk}
aio = ["io_uring", "native"]
cache = "none"
iothread = false
[workloads]
rw = "randread"
iodepth = 4
[method]
mode = "blocklayer"
ramp = 0
runtime = "0.5s"
samples = 3
seed = 11
precondition = false
{method}
"""


def suite_file(tmp_path: Path, file: str = "100.conf", disk: str | None = "virtio0",
               method: str = "") -> Path:
    """A suite in ``tmp_path/suite``, beside the PVE config 100.conf and the domain db.xml."""
    folder = tmp_path / "suite"
    folder.mkdir(exist_ok=True)
    (folder / "100.conf").write_text(PVE_CONF)
    (folder / "db.xml").write_text(LIBVIRT_XML)
    body = MATRIX.format(file=file, disk=f'disk = "{disk}"' if disk else "", method=method)
    return write_suite(folder, body, size="16MiB", target=tmp_path / "target")


def test_pve_disk_becomes_the_reference(tmp_path: Path) -> None:
    suite = resolve_vm(load_suite(suite_file(tmp_path)))
    ref = suite.matrix.reference
    assert ref is not None and (ref.platform, ref.pve_version, ref.disk) == ("proxmox", 9, "virtio0")
    assert (ref.aio, ref.cache, ref.iothread, ref.controller) == ("threads", "writeback", True,
                                                                  "virtio-blk")
    assert any("mbps_wr=200 is not reproduced" in n for n in ref.notes)   # named, not dropped
    assert "zfspool" in ref.storage
    # [method] platform follows the VM's (not set in the suite), and so does pve_version
    assert (suite.method.platform, suite.method.pve_version) == ("proxmox", 9)
    expansion = expand(suite)
    labels = [c.label for c in expansion.configurations]
    assert labels == ["blocklayer io_uring/none/raw", "blocklayer native/none/raw",
                      f"blocklayer threads/writeback/raw {YOUR_VM}"]
    assert any("mbps_wr=200" in n for n in expansion.notes)
    # the spec a run stores alone gives the same suite: the file is not needed again, and the
    # user's text is left as it was
    os.unlink(tmp_path / "suite" / "100.conf")
    assert suite.source_text == (tmp_path / "suite" / "t.toml").read_text()
    spec = RunSpec.from_json(RunSpec.of(suite).to_json())
    again = resolve_vm(spec.suite(text=suite.source_text, source=suite.source_path))
    assert again.matrix.reference == ref and expand(again) == expansion


def test_libvirt_disk_in_the_matrix_is_marked_not_added(tmp_path: Path) -> None:
    # vdb: io_uring, cache=none, raw; the matrix has that configuration already
    suite = resolve_vm(load_suite(suite_file(tmp_path, "db.xml", "vdb",
                                             'platform = "qemu"')))
    assert suite.matrix.reference is not None and suite.matrix.reference.platform == "libvirt"
    expansion = expand(suite)
    assert [c.label for c in expansion.configurations] == [
        f"blocklayer io_uring/none/raw {YOUR_VM}", "blocklayer native/none/raw"]
    # the suite chose another platform than the VM's: said, not silently changed
    assert suite.method.platform == "qemu"
    assert any(n.startswith("warning: your VM is a libvirt VM") for n in expansion.notes)


@pytest.mark.parametrize("file, disk, discard", [("100.conf", "scsi0", "unmap"),
                                                  ("db.xml", "sda", "unmap"),
                                                  ("100.conf", "virtio0", None),
                                                  ("db.xml", "vdb", None)])
def test_the_vms_discard_is_the_references(tmp_path: Path, file: str, disk: str,
                                           discard: str | None) -> None:
    """scsi0 (``discard=on``) and sda (``<driver discard='unmap'/>``) are measured with
    discard=unmap, on the VM's own platform with the arguments the VM gets; a disk that sets
    none is measured as before the axis (no discard in its key or label)."""
    suite = resolve_vm(load_suite(suite_file(tmp_path, file, disk)))
    ref = suite.matrix.reference
    assert ref is not None and ref.discard == discard
    assert (f"discard={discard}" in ref.settings()) == (discard is not None)
    (yours,) = [c for c in expand(suite).configurations if c.yours]
    assert yours.discard == discard and ("discard" in yours.key) == (discard is not None)
    again = RunSpec.from_json(RunSpec.of(suite).to_json()).suite(text=suite.source_text,
                                                                 source=suite.source_path)
    assert again.matrix.reference == ref
    yours = Configuration(mode="guest", controller=ref.controller, aio=ref.aio, cache=ref.cache,
                          format=ref.format, discard=yours.discard)
    if ref.platform == "proxmox":   # PVE 8's -drive: the VM's and the measured one's
        vm_argv = next(d.argv for d in translate(PVE_CONF, pve_version=8).disks if d.name == disk)
        ours = pve.guest_disk_argv(yours, DiskImage(path="/dev/pve/vm-100-disk-0",
                                                    is_device=True), 8)
        for argv in (vm_argv, ours):
            drive = next(a for a in argv if a.startswith("file="))
            assert [p for p in drive.split(",") if p.startswith("discard=")] == (
                ["discard=on"] if discard else [])
            assert drive.endswith(",detect-zeroes=unmap" if discard else ",detect-zeroes=on")
    else:                           # the node the device sits on, libvirt's and ours
        versions = lv.Versions(libvirt=(11, 3, 0), qemu=(10, 0, 0))
        vm_argv = next(d.argv for d in translate(LIBVIRT_XML, libvirt=versions).disks
                       if d.name == disk)
        ours = lv.guest_disk_argv(yours, DiskImage(path="/srv/disk.img"), versions)
        for argv in (vm_argv, ours):
            top = json.loads([argv[i + 1] for i, a in enumerate(argv) if a == "-blockdev"][-1])
            assert top.get("discard") == discard


def _one_line_error(*args: str) -> str:
    code, captured = invoke(*args)
    err = captured.stderr.getvalue()
    assert code == ExitStatus.SUITE_INVALID, err
    assert len([line for line in err.splitlines() if not line.startswith("iomatrix: hint")]) == 1
    return err


def test_refusals_are_one_line(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "vm.conf").write_text(PVE_CONF)
    (tmp_path / "suite").mkdir()
    (tmp_path / "suite" / "link.conf").symlink_to(outside / "vm.conf")
    cases = {
        "no disk 'scsi9' (its disks: sata0, scsi0, scsi1, virtio0)": ("100.conf", "scsi9"),
        "the VM has 4 disks (sata0, scsi0, scsi1, virtio0): name one": ("100.conf", None),
        "inside the suite's directory": ("/etc/pve/qemu-server/100.conf", None),
        "no '..'": ("../outside/vm.conf", None),
        "leads out of the suite's directory": ("link.conf", None),
        "No such file": ("missing.conf", None),
        "not well-formed XML": ("bad.xml", None),
    }
    (tmp_path / "suite" / "bad.xml").write_text("<domain><devices>")
    for wanted, (file, disk) in cases.items():
        path = suite_file(tmp_path, file, disk)
        assert wanted in _one_line_error("run", str(path), "--plan"), wanted
    # a disk on librbd has no aio: not measurable, and the reason is named
    folder = tmp_path / "suite"
    (folder / "rbd.conf").write_text("scsihw: virtio-scsi-single\nscsi0: ceph:vm-1-disk-0\n")
    (folder / "storage.cfg").write_text("rbd: ceph\n\tpool vms\n\tcontent images\n")
    path = write_suite(folder, MATRIX.format(file="rbd.conf", disk='storage_cfg = "storage.cfg"',
                                             method=""), size="16MiB")
    assert "librbd" in _one_line_error("run", str(path), "--plan")
    host = write_suite(folder, MATRIX.format(file="100.conf", disk="", method="")
                       .replace('mode = "blocklayer"', 'mode = "host"'), size="16MiB")
    assert "host mode measures no QEMU settings" in _one_line_error("run", str(host), "--plan")


TEMPLATE_CONF = """\
bios: ovmf
efidisk0: local-lvm:vm-101-disk-1,efitype=4m,pre-enrolled-keys=1,size=4M
ide2: local:iso/debian-12.iso,media=cdrom,size=628M
scsi0: local-lvm:base-101-disk-0,discard=on,iothread=1,size=32G
scsihw: virtio-scsi-single
template: 1
tpmstate0: local-lvm:vm-101-disk-2,size=4M,version=v2.0
"""


def test_drives_that_are_not_disks_are_refused(tmp_path: Path) -> None:
    """A CD-ROM, the EFI vars disk and the TPM state are drives, not disks to measure: naming
    one is refused in one line; left unnamed, the VM's one disk is taken (a template's, said
    so)."""
    folder = tmp_path / "suite"
    folder.mkdir()
    (folder / "101.conf").write_text(TEMPLATE_CONF)
    for disk, wanted in (("ide2", "ide2 is a CD-ROM (read-only media), not a disk to measure "
                                  "(the VM's disks: scsi0)"),
                         ("efidisk0", "efidisk0 is the EFI vars disk (OVMF's flash)"),
                         ("tpmstate0", "tpmstate0 is the TPM state")):
        path = write_suite(folder, MATRIX.format(file="101.conf", disk=f'disk = "{disk}"',
                                                 method=""), size="16MiB")
        assert wanted in _one_line_error("run", str(path), "--plan"), disk
    path = write_suite(folder, MATRIX.format(file="101.conf", disk="", method=""), size="16MiB")
    ref = resolve_vm(load_suite(path)).matrix.reference
    assert ref is not None and (ref.disk, ref.controller, ref.iothread) == (
        "scsi0", "virtio-scsi-single", True)
    assert any("a template's disk" in n for n in ref.notes)


def test_plan_shows_the_reference(tmp_path: Path) -> None:
    code, captured = invoke("run", str(suite_file(tmp_path)), "--plan")
    out = captured.out()
    assert code == 0, captured.stderr.getvalue()
    assert f"threads/writeback/raw {YOUR_VM}" in out
    assert "your VM: 100.conf virtio0 (virtio0: local-zfs:vm-100-disk-3" in out
    assert "your VM: virtio0: mbps_wr=200 is not reproduced by iomatrix" in out


class _StopAfter(SilentProgress):
    """Ctrl-C after ``n`` trials, as a user would press it."""

    def __init__(self, n: int) -> None:
        self.n = n

    def trial_finished(self, n: int, ok: bool, detail: str) -> None:
        if n >= self.n:
            raise KeyboardInterrupt


@pytest.mark.slow
def test_run_resume_show_recommend_without_the_file(tmp_path: Path, no_leftovers: None) -> None:
    db = tmp_path / "r.db"
    suite = load_suite(suite_file(tmp_path))
    with Store(db) as store, pytest.raises(KeyboardInterrupt):
        run_suite(suite, store, progress=_StopAfter(4))
    os.unlink(tmp_path / "suite" / "100.conf")   # resume, show and recommend need it no more
    code, captured = invoke("run", "--resume", "1", "--db", str(db))
    assert code == 0, captured.stderr.getvalue()
    with Store(db, readonly=True) as store:
        run = store.load_run(1)
    assert run.status == "complete" and len(run.trials) == 9
    assert all(t.status == "ok" for t in run.trials)
    # proxmox's block layers, as the VM's disk gets them (the platform followed the file)
    assert all(t.applied["disk0.detect-zeroes"] == "on" for t in run.trials)
    vm = your_vm(run)
    assert vm is not None and vm.config.label.endswith(YOUR_VM)
    assert {g.label for g in vm.gains} == {"blocklayer native/none/raw",
                                           "blocklayer io_uring/none/raw"}
    for g in vm.gains:     # paired by round over the three rounds, with a CI
        assert (g.iops.method, g.iops.rounds) == ("rounds", 3) and g.iops.family == 2
        assert g.iops.low is not None and g.iops.high is not None
        assert g.iops.low <= g.iops.relative <= g.iops.high
    rec = recommend(run, "proxmox")
    assert rec.yours is not None
    assert rec.yours.text.startswith("your VM (100.conf virtio0) uses ")
    if rec.yours.gain is not None:
        assert rec.yours.gain.differs["cache"] == "none" and "95 % CI" in rec.yours.text
    else:
        assert rec.yours.status == "not measured" and rec.config.cache != "none"
    code, captured = invoke("recommend", "1", "--for", "proxmox", "--db", str(db))
    assert code == 0 and "your VM (100.conf virtio0) uses" in captured.out()
    code, captured = invoke("show", "1", "--db", str(db))
    assert code == 0 and f"threads/writeback/raw {YOUR_VM}" in captured.out()
    data = build_report_data(run)
    assert any(c.label.endswith(YOUR_VM) for c in data.configs)
    assert all(r.yours.startswith("your VM (100.conf virtio0)") for r in data.recommendations)


def test_iothreads_mapping_and_pins_become_the_reference(tmp_path: Path) -> None:
    """A libvirt domain whose disk has two IOThreads with its queues mapped and whose threads
    are pinned (<cputune>), and a Proxmox VE VM with affinity: the reference carries them, and
    so does the configuration that measures it."""
    from iomatrix.suite.expand import reference_configuration
    folder = tmp_path / "suite"
    folder.mkdir()
    (folder / "db.xml").write_text("""<domain type='kvm'><name>db</name>
      <vcpu placement='static'>4</vcpu><iothreads>2</iothreads>
      <cputune><vcpupin vcpu='0' cpuset='2'/><vcpupin vcpu='1' cpuset='3'/>
        <vcpupin vcpu='2' cpuset='2-3'/><vcpupin vcpu='3' cpuset='2,3'/>
        <emulatorpin cpuset='0'/>
        <iothreadpin iothread='1' cpuset='1'/><iothreadpin iothread='2' cpuset='1'/></cputune>
      <os><type arch='x86_64' machine='q35'>hvm</type></os><devices>
      <disk type='block' device='disk'>
        <driver name='qemu' type='raw' cache='none' io='native' queues='4'>
          <iothreads><iothread id='1'><queue id='0'/><queue id='2'/></iothread>
            <iothread id='2'><queue id='1'/><queue id='3'/></iothread></iothreads></driver>
        <source dev='/dev/vg/db'/><target dev='vda' bus='virtio'/></disk></devices></domain>""")
    (folder / "100.conf").write_text("affinity: 4-5,7\nscsihw: virtio-scsi-single\n"
                                     "scsi0: local-lvm:vm-100-disk-0,iothread=1,queues=2\n")
    body = MATRIX.format(file="db.xml", disk="", method="").replace(
        'mode = "blocklayer"', 'mode = "guest"')
    suite = resolve_vm(load_suite(write_suite(folder, body, size="16MiB",
                                              target=tmp_path / "target")))
    ref = suite.matrix.reference
    assert ref is not None
    # the vCPUs' pins differ: not one set, named; the IOThreads' and the main loop's are one
    assert (ref.iothreads, ref.vq_mapping, ref.num_queues) == (2, "0,2:1,3", 4)
    assert (ref.vcpu_affinity, ref.iothread_affinity, ref.main_affinity) == (None, "1", "0")
    assert any("vCPUs are pinned unevenly" in n for n in ref.notes)
    config = reference_configuration(suite)
    assert config is not None
    assert (config.iothreads, config.vq_mapping, config.iothread_affinity,
            config.main_affinity) == (2, "0,2:1,3", "1", "0")
    pve_body = MATRIX.format(file="100.conf", disk="", method="")
    pve_suite = resolve_vm(load_suite(write_suite(folder, pve_body, name="p", size="16MiB",
                                                  target=tmp_path / "target")))
    pref = pve_suite.matrix.reference
    assert pref is not None and pref.num_queues == 2
    assert {pref.vcpu_affinity, pref.iothread_affinity, pref.main_affinity} == {"4-5,7"}


def test_an_args_disk_becomes_the_reference(tmp_path: Path) -> None:
    """A Proxmox VE VM whose disk iomatrix's qm set put in args: (several IOThreads): from_vm
    names it args:<device id> and measures it with its IOThreads and queues."""
    settings = Configuration(mode="guest", controller="virtio-blk", aio="native", cache="none",
                             format="raw", preallocation="off", iothread=True, iothreads=2,
                             num_queues=4)
    argv, _ = pve.qm_set(settings, volume="/dev/pve/vm-100-disk-1")
    folder = tmp_path / "suite"
    folder.mkdir()
    (folder / "100.conf").write_text(f"affinity: 1\nargs: {argv[-1]}\n")
    body = MATRIX.format(file="100.conf", disk='disk = "args:iomatrix-virtio0"', method="")
    suite = resolve_vm(load_suite(write_suite(folder, body.replace('mode = "blocklayer"',
                                                                   'mode = "guest"'),
                                              size="16MiB", target=tmp_path / "target")))
    ref = suite.matrix.reference
    assert ref is not None and ref.disk == "args:iomatrix-virtio0"
    assert (ref.controller, ref.iothreads, ref.num_queues, ref.main_affinity) == (
        "virtio-blk", 2, 4, "1")
    assert any("qemu-server does not manage" in n for n in ref.notes)
