"""Several IOThreads per disk (issue 35) on the qemu platform: the arguments (N ``-object
iothread`` and the device in JSON with ``iothread-vq-mapping``), the precheck's one-line refusal
by QEMU version, and QEMU itself, started paused: this host's QEMU before 9.0 refuses the
property in its own words (the version table is QEMU's), a newer one applies what
``expected_guest_settings`` says and QMP reads it back. A guest measured with two IOThreads is
test_two_iothreads_in_a_guest (tests/scenarios), in the Debian 13 pass."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from iomatrix.cli.status import ExitStatus
from iomatrix.core.errors import EnvironmentProblem
from iomatrix.core.proc import managed, read_text, run, wait_for
from iomatrix.drivers.guest import free_port
from iomatrix.measure.precheck import check_iothreads_qemu
from iomatrix.platform import libvirt as lv
from iomatrix.qemu import version as qemu_version
from iomatrix.qemu.args import (GuestSpec, expected_guest_settings, guest_argv,
                                read_guest_settings, read_iothread_ids)
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.expand import Expansion
from iomatrix.targets.workspace import Image
from tests.conftest import cli_result, write_suite
from tests.needs import needs


def _config(controller: str = "virtio-blk", mapping: str | None = None,
            queues: int | None = None, threads: int = 2) -> Configuration:
    return Configuration(mode="guest", controller=controller, aio="io_uring", cache="none",
                         format="raw", iothread=True, iothreads=threads, vq_mapping=mapping,
                         num_queues=queues)


def _spec(tmp_path: Path, config: Configuration) -> GuestSpec:
    image = tmp_path / "disk.raw"
    if not image.exists():
        run(["qemu-img", "create", "-q", "-f", "raw", str(image), "16M"], timeout=30)
    return GuestSpec(config=config, image=Image(path=image, format="raw", preallocation="off",
                                                size=16 << 20),
                     kernel=None, initrd=None, append="", accel="tcg", vcpus=2,
                     memory_bytes=128 << 20, qmp_socket=tmp_path / "q.sock",
                     serial_log=tmp_path / "serial.log", host_port=free_port(), name="t")


def _devices(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == "-device"]


def test_the_hub_device_gets_the_mapping_in_json(tmp_path: Path) -> None:
    argv = guest_argv(_spec(tmp_path, _config(mapping="0,2:1,3", queues=4)))
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "-object"] == [
        "iothread,id=iothread-virtio0-0", "iothread,id=iothread-virtio0-1"]
    disk = json.loads(_devices(argv)[-1])
    assert disk == {"driver": "virtio-blk-pci", "id": "virtio0", "drive": "disk0",
                    "write-cache": "on", "num-queues": 4, "iothread-vq-mapping": [
                        {"iothread": "iothread-virtio0-0", "vqs": [0, 2]},
                        {"iothread": "iothread-virtio0-1", "vqs": [1, 3]}]}
    # virtio-scsi: the controller holds them; its disk is JSON too (QEMU 7.2 makes JSON
    # devices after the others: the disk would find no bus)
    controller, disk_line = _devices(guest_argv(_spec(tmp_path, _config("virtio-scsi-single",
                                                                          threads=3))))[-2:]
    assert json.loads(controller)["iothread-vq-mapping"] == [
        {"iothread": f"iothread-virtioscsi0-{i}"} for i in range(3)]
    assert "iothread" not in json.loads(controller)
    assert json.loads(disk_line) == {"driver": "scsi-hd", "id": "scsi0", "bus": "virtioscsi0.0",
                                     "channel": 0, "scsi-id": 0, "lun": 0, "drive": "disk0",
                                     "write-cache": "on"}
    # one IOThread: the lines every run before the axis had
    one = _devices(guest_argv(_spec(tmp_path, _config(threads=1))))[-1]
    assert one.startswith("virtio-blk-pci,id=virtio0,") and "iothread=iothread-virtio0" in one


def test_expected_settings_name_the_mapping_not_the_threads() -> None:
    want = expected_guest_settings(_config(mapping="1:0", queues=2), vcpus=2)
    assert want["iothreads"] == "2" and want["device.iothread"] == ""
    assert want["device.iothread-vq-mapping"] == "1:0"
    assert expected_guest_settings(_config(), vcpus=2)["device.iothread-vq-mapping"] == \
        "round-robin×2"
    assert "device.iothread-vq-mapping" not in expected_guest_settings(_config(threads=1), vcpus=2)


@pytest.mark.parametrize(("controller", "found", "refused"), [
    ("virtio-blk", (7, 2, 0), True), ("virtio-blk", (9, 0, 0), False),
    ("virtio-scsi", (9, 2, 0), True), ("virtio-scsi-single", (10, 0, 0), False)])
def test_precheck_refuses_an_older_qemu_in_one_line(controller: str, found: tuple[int, int, int],
                                                    refused: bool) -> None:
    expansion = Expansion(configurations=(_config(controller),), workloads=())
    if not refused:
        check_iothreads_qemu(expansion, found)
        return
    with pytest.raises(EnvironmentProblem) as caught:
        check_iothreads_qemu(expansion, found)
    need = qemu_version.IOTHREAD_VQ_MAPPING[controller]
    assert str(caught.value) == (
        f"iothreads = 2 on {controller} needs QEMU {qemu_version.shown(need)} or later (its "
        f"iothread-vq-mapping); qemu-system-x86_64 here is {qemu_version.shown(found)}")


def _installed() -> tuple[int, int, int]:
    found = qemu_version.installed("qemu-system-x86_64")
    assert found is not None, "qemu-system-x86_64 --version says no version"
    return found


LIBVIRT = lv.Versions(libvirt=(11, 3, 0), qemu=(10, 0, 0))


@needs("qemu")
@pytest.mark.slow
def test_qemu_takes_the_mapping_or_refuses_it_by_version(tmp_path: Path,
                                                         no_leftovers: None) -> None:
    """QEMU started paused with each controller's mapping (and libvirt 11.3's arguments for a
    mapped virtio-blk disk): from the version IOTHREAD_VQ_MAPPING names it applies it (QMP:
    query-iothreads, qom-get of the device's iothread-vq-mapping) as expected_guest_settings
    says; below it, it refuses the property."""
    found = _installed()
    cases = [("virtio-blk", None, None, "qemu"), ("virtio-blk", "1:0,2", 3, "qemu"),
             ("virtio-scsi-single", "0:1", 2, "qemu"), ("virtio-blk", "1:0", 2, "libvirt")]
    for n, (controller, mapping, queues, platform) in enumerate(cases):
        config = _config(controller, mapping, queues)
        libvirt = LIBVIRT if platform == "libvirt" else None
        spec = _spec(tmp_path, config).model_copy(update={
            "qmp_socket": tmp_path / f"q{n}.sock", "platform": platform, "libvirt": libvirt})
        log = tmp_path / f"qemu{n}.log"
        with managed(guest_argv(spec) + ["-S"], log=log) as proc:
            assert wait_for(lambda: proc.poll() is not None or spec.qmp_socket.exists(),
                            timeout=15.0)
            if found < qemu_version.IOTHREAD_VQ_MAPPING[controller]:
                assert wait_for(lambda: proc.poll() is not None, timeout=15.0)
                assert "iothread-vq-mapping' not found" in read_text(log), read_text(log)
                continue
            assert proc.poll() is None, read_text(log)
            seen = read_guest_settings(spec.qmp_socket)
            threads = read_iothread_ids(spec.qmp_socket)
        assert seen == expected_guest_settings(config, vcpus=2, platform=platform,  # type: ignore[arg-type]
                                               libvirt=libvirt), (controller, platform)
        names = {"virtio-blk": "iothread-virtio0-", "virtio-scsi-single": "iothread-virtioscsi0-"}
        want = (["iothread1", "iothread2"] if libvirt else
                [f"{names[controller]}0", f"{names[controller]}1"])
        assert sorted(threads) == want
        assert len(set(threads.values())) == 2 and all(t > 0 for t in threads.values())


@needs("qemu")
def test_a_qemu_that_gave_one_iothread_is_told_apart(tmp_path: Path, no_leftovers: None) -> None:
    """What a platform that dropped the mapping gives (one IOThread on the device, as any QEMU
    takes it) read back against what two IOThreads must show: the check names each difference
    (a trial fails with them), in keys that need no QEMU 9.0 to read."""
    spec = _spec(tmp_path, _config(threads=1))
    log = tmp_path / "qemu.log"
    with managed(guest_argv(spec) + ["-S"], log=log) as proc:
        assert wait_for(lambda: proc.poll() is not None or spec.qmp_socket.exists(),
                        timeout=15.0) and proc.poll() is None, read_text(log)
        seen = read_guest_settings(spec.qmp_socket)
    want = expected_guest_settings(_config(), vcpus=2)
    wrong = {key: (value, seen.get(key)) for key, value in want.items() if seen.get(key) != value}
    assert wrong == {"iothreads": ("2", "1"), "device.iothread": ("", "iothread-virtio0"),
                     "device.iothread-vq-mapping": ("round-robin×2", None)}


@needs("qemu", "fio")
@pytest.mark.slow
def test_a_run_on_an_older_qemu_is_refused_in_one_line(tmp_path: Path) -> None:
    found = _installed()
    if found >= qemu_version.IOTHREAD_VQ_MAPPING["virtio-blk"]:
        pytest.skip(f"QEMU {qemu_version.shown(found)} has virtio-blk's iothread-vq-mapping: "
                    "test_qemu_takes_the_mapping_or_refuses_it_by_version applies it")
    path = write_suite(tmp_path, '[matrix]\ncontroller = "virtio-blk"\niothread = true\n'
                                 'iothreads = [2, 4]\n[[workloads]]\nrw = "randread"\n'
                                 '[method]\nmode = "guest"\naccel = "tcg"\n', size="16MiB")
    done = cli_result("run", str(path), "--db", str(tmp_path / "r.db"), cwd=tmp_path)
    assert done.returncode == ExitStatus.ENVIRONMENT, done.stdout + done.stderr
    lines = [line for line in done.stderr.strip().splitlines() if "hint:" not in line]
    assert len(lines) == 1, done.stderr
    assert (f"iothreads = 2 on virtio-blk needs QEMU 9.0.0 or later (its iothread-vq-mapping); "
            f"qemu-system-x86_64 here is {qemu_version.shown(found)}") in lines[0]
    assert not (tmp_path / "target").exists() or not any((tmp_path / "target").iterdir())
