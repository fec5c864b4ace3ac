"""Proxmox VE and the levers qemu-server 9.2 half has: ``affinity`` (one CPU set for every
thread of the VM), ``iothread`` (one per disk), ``queues`` (virtio-scsi-single), and several
IOThreads per disk only through ``args:``, with the warning that qemu-server does not manage
that disk. The ``qm set`` lines, what they are refused for, the ``args:`` a real QEMU starts
with (the mapping read back over QMP: QEMU 9.0 for virtio-blk, 10.0 for virtio-scsi, so in the
Debian 13 pass), and a VM configuration read back into the same values."""

from __future__ import annotations

import shlex
import subprocess
import time
from pathlib import Path

import pytest

from iomatrix.platform import proxmox as pve
from iomatrix.platform.proxmox.defaults import qm_set, refusal
from iomatrix.suite.configuration import Configuration
from iomatrix.qemu import version as qemu_version
from iomatrix.qemu.qmp import qmp_execute
from iomatrix.translate.vm import translate
from tests.needs import needs

BASE = {"aio": "io_uring", "cache": "none", "format": "raw", "iothread": True}


def _settings(**over: object) -> Configuration:
    """A guest configuration (recommend and a run's refusals pass one: the affinity axes are
    the VM's, not a disk setting, so DiskSettings lacks them)."""
    return Configuration(mode="guest", preallocation="off",
                         **(BASE | {"controller": "virtio-scsi-single"} | over))  # type: ignore[arg-type]


def test_affinity_iothread_and_queues_in_qm_set() -> None:
    argv, notes = qm_set(_settings(num_queues=4, vcpu_affinity="0-1", iothread_affinity="0-1"),
                         vmid="100", volume="local-lvm:vm-100-disk-1")
    assert argv == ["qm", "set", "100", "--affinity", "0-1", "--scsihw", "virtio-scsi-single",
                    "--scsi0", "local-lvm:vm-100-disk-1,aio=io_uring,iothread=1,cache=none,"
                    "queues=4"]
    assert any("main_affinity too" in n for n in notes)          # taskset --all-tasks
    different = _settings(vcpu_affinity="0", iothread_affinity="1")
    why = refusal(different)
    assert why is not None and "pins every thread of the VM to one CPU set" in why
    argv, notes = qm_set(different)
    assert "--affinity" not in argv and any("vcpu_affinity 0, iothread_affinity 1" in n
                                            for n in notes)
    argv, _ = qm_set(_settings(main_affinity="numa"))
    assert argv[3:5] == ["--affinity", pve.args.NUMA_PLACEHOLDER]


@pytest.mark.parametrize("controller", ["virtio-blk", "virtio-scsi-single"])
def test_several_iothreads_go_in_args_with_a_warning(controller: str) -> None:
    settings = _settings(controller=controller, iothreads=2, vq_mapping="0,2:1,3", num_queues=4,
                         vcpu_affinity="0")
    argv, notes = qm_set(settings, vmid="100", volume="/dev/pve/vm-100-disk-1")
    assert argv[:6] == ["qm", "set", "100", "--affinity", "0", "--args"] and len(argv) == 7
    assert pve.ARGS_WARNING in notes and pve.ARGS_WARNING.startswith("warning: qemu-server does "
                                                                     "not manage")
    assert refusal(settings) is not None and "platform = \"qemu\"" in str(refusal(settings))
    # qemu-server splits args: with PVE::Tools::split_args, Text::ParseWords::shellwords
    split = subprocess.run(["perl", "-MText::ParseWords", "-e",
                            'print join("\\0", shellwords($ARGV[0]))', "--", argv[6]],
                           capture_output=True, text=True, timeout=30, check=True).stdout
    assert split.split("\0") == shlex.split(argv[6])
    # two -blockdev nodes and the device (virtio-scsi: the controller and its disk)
    assert sum(a.startswith("{") for a in split.split("\0")) == (4 if "scsi" in controller
                                                                  else 3)
    (disk,), _ = pve.parse_args(argv[6])
    assert (disk.controller, disk.iothreads, disk.vq_mapping, disk.num_queues, disk.aio,
            disk.path) == (controller, 2, "0,2:1,3", 4, "io_uring", "/dev/pve/vm-100-disk-1")
    # the line read back in a VM configuration: the same configuration, pinned
    conf = f"affinity: 0\nargs: {argv[6]}\nmemory: 512\n"
    (found,) = translate(conf).disks
    assert found.config is not None and found.values is not None
    # affinity pins every thread: read back, all three sets are the one qm set wrote
    pinned = settings.model_copy(update={"iothread_affinity": "0", "main_affinity": "0"})
    assert found.config.key == pinned.key
    assert found.values.vcpu_affinity == found.values.main_affinity == "0"
    assert pve.ARGS_WARNING.removeprefix("warning: ") in found.notes[0]


def test_qemu_server_vm_configuration_read_back() -> None:
    """A VM as qemu-server's own tests write one (affinity, scsihw virtio-scsi-single,
    iothread and queues on the drive), and an affinity that is no CPU list."""
    conf = ("affinity: 0,2-3\nboot: order=scsi0\ncores: 4\nmemory: 2048\n"
            "scsihw: virtio-scsi-single\n"
            "scsi0: local-lvm:vm-8006-disk-0,aio=native,cache=none,iothread=1,queues=4,size=8G\n"
            "virtio1: local-lvm:vm-8006-disk-1,iothread=1,size=8G\n")
    result = translate(conf)
    assert any(n.startswith("affinity: 0,2-3: qemu-server starts QEMU under taskset")
               for n in result.notes)
    scsi, virtio = result.disks
    assert scsi.values is not None and virtio.values is not None
    assert (scsi.values.num_queues, scsi.values.iothread, scsi.values.iothread_affinity) == (
        4, True, "0,2-3")
    assert virtio.values.vcpu_affinity == "0,2-3" and virtio.values.iothreads is None
    (odd,) = translate(conf.replace("0,2-3", "all")
                       .replace("virtio1: local-lvm:vm-8006-disk-1,iothread=1,size=8G\n", "")).disks
    assert odd.values is not None and odd.values.vcpu_affinity is None
    assert any("'all' is not a CPU list" in n for n in odd.values.notes)


@needs("qemu")
@pytest.mark.slow
@pytest.mark.parametrize("controller,since", [("virtio-blk", (9, 0, 0)),
                                              ("virtio-scsi-single", (10, 0, 0))])
def test_args_line_starts_qemu_with_the_mapping(tmp_path: Path, controller: str,
                                                since: tuple[int, int, int]) -> None:
    found = qemu_version.installed("qemu-system-x86_64")
    if found is None or found < since:
        pytest.skip(f"{controller}'s iothread-vq-mapping needs QEMU {since[0]}.{since[1]}, this "
                    f"host has {found}: runs in the Debian 13 pass (.ci/debian13)")
    image = tmp_path / "disk.raw"
    image.write_bytes(b"\0" * (1 << 20))
    settings = _settings(controller=controller, iothreads=2, vq_mapping="0,3:1,2", num_queues=4,
                         cache="writeback", aio="threads")
    argv, _ = qm_set(settings, volume=str(image))
    socket = tmp_path / "qmp"
    qemu = subprocess.Popen(["qemu-system-x86_64", "-M", "pc", "-S", "-nodefaults",
                             "-display", "none", "-qmp", f"unix:{socket},server=on,wait=off",
                             *shlex.split(argv[-1])],          # as qemu-server splits args:
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        while not socket.exists() and qemu.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert qemu.poll() is None, qemu.communicate()[0]
        device = "iomatrix-virtio0" if controller == "virtio-blk" else "iomatrix-scsihw0"
        threads, mapping = qmp_execute(socket, [
            ("query-iothreads", None),
            ("qom-get", {"path": f"/machine/peripheral/{device}",
                         "property": "iothread-vq-mapping"})])
        assert sorted(t["id"] for t in threads) == ["iomatrix-iothread0", "iomatrix-iothread1"]
        assert mapping == [{"iothread": "iomatrix-iothread0", "vqs": [0, 3]},
                           {"iothread": "iomatrix-iothread1", "vqs": [1, 2]}]
    finally:
        qemu.kill()
        qemu.wait(timeout=10)
