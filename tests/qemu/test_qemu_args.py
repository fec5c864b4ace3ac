"""Configuration → QEMU arguments, checked against the real QEMU 7.2: every controller starts
(under TCG, with -S, so no guest runs) and shows over QMP what the configuration asked for; and
every combination that ``invalid_reason`` refuses is refused by QEMU itself with the words that
``invalid_reason`` quotes. All paths contain a comma, so QEMU's escaping is exercised too.

The tests that only build command lines run everywhere; only those that start QEMU (or
qemu-img) are skipped where it is not installed."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from iomatrix.core.errors import InvalidCombination
from iomatrix.core.proc import managed, read_text, run, wait_for, which
from iomatrix.drivers.guest import free_port
from iomatrix.qemu import args
from iomatrix.qemu.args import (GuestSpec, expected_daemon_settings, expected_guest_settings,
                                guest_argv, read_daemon_settings, read_guest_settings,
                                vhost_daemon_argv, vhost_num_queues)
from iomatrix.suite.expand import invalid_reason
from iomatrix.suite.configuration import Configuration
from iomatrix.targets.workspace import Image
from tests.conftest import reference_table
from tests.needs import needs

VCPUS = 2
START_TIMEOUT = 15.0

needs_qemu = needs("qemu")
"""For the tests that start QEMU; the others build command lines only."""


@pytest.fixture
def workdir(tmp_path: Path, no_leftovers: None) -> Path:
    path = tmp_path / "a,b"
    path.mkdir()
    (path / "initrd").write_bytes(b"")
    return path


def _image(workdir: Path, fmt: str = "raw") -> Image:
    path = workdir / f"disk,0.{fmt}"
    run(["qemu-img", "create", "-q", "-f", fmt, str(path), str(32 << 20)], timeout=30)
    return Image(path=path, format=fmt, preallocation="off", size=32 << 20)


def _config(controller: str | None = "virtio-blk", **kw: object) -> Configuration:
    values: dict[str, object] = dict(mode="guest", controller=controller, aio="io_uring",
                                     iothread=False, cache="none", format="raw",
                                     preallocation="off")
    values.update(kw)
    return Configuration(**values)  # type: ignore[arg-type]


def _spec(config: Configuration, workdir: Path, kernel: Path, image: Image | None = None,
          **kw: object) -> GuestSpec:
    return GuestSpec(config=config, image=image or _image(workdir, config.format or "raw"),
                     kernel=kernel, initrd=workdir / "initrd", append="console=ttyS0,115200",
                     accel="tcg", vcpus=VCPUS, memory_bytes=128 << 20,
                     qmp_socket=workdir / "qmp,0.sock", serial_log=workdir / "serial,0.log",
                     host_port=free_port(), name="t,0", **kw)  # type: ignore[arg-type]


@contextlib.contextmanager
def _started(argv: list[str], log: Path, qmp: Path) -> Iterator[None]:
    """Run QEMU (or the daemon) until its QMP socket is up; fail with its output if it exits."""
    qmp.unlink(missing_ok=True)
    with managed(argv, log=log) as proc:
        up = wait_for(lambda: proc.poll() is not None or qmp.exists(), timeout=START_TIMEOUT)
        assert up and proc.poll() is None, f"{argv[0]} did not start: {read_text(log)}"
        yield


def _check_guest(spec: GuestSpec) -> dict[str, str]:
    """Start the guest, read what QEMU applied, and compare with what was asked."""
    with _started(guest_argv(spec) + ["-S"], spec.qmp_socket.with_name("qemu.log"),
                  spec.qmp_socket):
        seen = read_guest_settings(spec.qmp_socket)
    assert seen == expected_guest_settings(spec.config, vcpus=spec.vcpus)
    return seen


CONTROLLERS = [
    # controller, aio, cache, format, iothread
    ("virtio-blk", "io_uring", "none", "raw", True),
    ("virtio-scsi", "native", "directsync", "qcow2", True),
    ("virtio-scsi-single", "io_uring", "none", "raw", True),
    ("pvscsi", "threads", "writeback", "qcow2", False),
    ("sata", "native", "none", "raw", False),
    ("ide", "io_uring", "writethrough", "qcow2", False),
    ("nvme", "threads", "unsafe", "raw", False),
]


@needs_qemu
@pytest.mark.parametrize("controller, aio, cache, fmt, iothread", CONTROLLERS)
def test_every_controller_starts_as_configured(workdir: Path, kernel: Path, controller: str,
                                              aio: str, cache: str, fmt: str,
                                              iothread: bool) -> None:
    config = _config(controller, aio=aio, cache=cache, format=fmt, iothread=iothread)
    seen = _check_guest(_spec(config, workdir, kernel))
    assert seen["disk0.driver"] == fmt
    device = {"virtio-blk": "virtio-blk-pci", "nvme": "nvme", "sata": "ide-hd",
              "ide": "ide-hd"}.get(controller, "scsi-hd")
    assert seen["device.type"] == device


@needs_qemu
@pytest.mark.parametrize("controller", ["virtio-blk", "virtio-scsi-single"])
@pytest.mark.parametrize("iothread", [True, False])
def test_iothread_on_and_off(workdir: Path, kernel: Path, controller: str, iothread: bool) -> None:
    seen = _check_guest(_spec(_config(controller, iothread=iothread), workdir, kernel))
    assert seen["iothreads"] == ("1" if iothread else "0")
    holder = "virtio0" if controller == "virtio-blk" else "virtioscsi0"
    assert seen["device.iothread"] == (f"iothread-{holder}" if iothread else "")


# The reference's section 3 table, written out again so that it is checked, not reused.
CACHE_TABLE = {  # cache → (cache.direct, cache.no-flush, device write-cache)
    "writeback": ("false", "false", "on"),
    "none": ("true", "false", "on"),
    "writethrough": ("false", "false", "off"),
    "directsync": ("true", "false", "off"),
    "unsafe": ("false", "true", "on"),
}


@needs_qemu
@pytest.mark.parametrize("cache", list(CACHE_TABLE))
def test_cache_modes(workdir: Path, kernel: Path, cache: str) -> None:
    config = _config("virtio-scsi-single", aio="threads", cache=cache, format="qcow2")
    seen = _check_guest(_spec(config, workdir, kernel))
    direct, no_flush, write_cache = CACHE_TABLE[cache]
    for node in ("file0", "disk0"):
        assert seen[f"{node}.cache.direct"] == direct
        assert seen[f"{node}.cache.no-flush"] == no_flush
    assert seen["device.write-cache"] == write_cache
    assert seen["backend.write-cache"] == write_cache   # what the block backend really does


@needs_qemu
@pytest.mark.parametrize("controller", ["virtio-blk", "virtio-scsi-single"])
def test_queues(workdir: Path, kernel: Path, controller: str) -> None:
    default = _check_guest(_spec(_config(controller), workdir, kernel))
    assert (default["device.num-queues"], default["device.queue-size"]) == (str(VCPUS), "256")
    config = _config(controller, iothread=True, num_queues=4, queue_size=512)
    spec = _spec(config, workdir, kernel)
    seen = _check_guest(spec)
    assert (seen["device.num-queues"], seen["device.queue-size"]) == ("4", "512")


@needs_qemu
@pytest.mark.parametrize("iothread", [True, False])
def test_vhost_user_blk(workdir: Path, kernel: Path, iothread: bool) -> None:
    config = _config(None, data_path="vhost-user-blk", iothread=iothread, cache="writethrough",
                     queue_size=512)
    vhost_socket, daemon_qmp = workdir / "vub,0.sock", workdir / "qsd,0.sock"
    spec = _spec(config, workdir, kernel, vhost_socket=vhost_socket)
    daemon = vhost_daemon_argv(config, spec.image, socket=vhost_socket, qmp_socket=daemon_qmp,
                               num_queues=vhost_num_queues(config, spec.vcpus))
    with managed(daemon, log=workdir / "qsd.log", stop_timeout=5) as proc:
        up = wait_for(lambda: proc.poll() is not None or vhost_socket.exists(),
                      timeout=START_TIMEOUT)
        assert up and proc.poll() is None, read_text(workdir / "qsd.log")
        assert read_daemon_settings(daemon_qmp) == expected_daemon_settings(config)
        # The guest is stopped before the daemon (QEMU 7.2 hangs on SIGTERM otherwise, with
        # an iothread); the daemon then exits by itself on SIGTERM, without SIGKILL.
        seen = _check_guest(spec)
    assert proc.returncode == 0, read_text(workdir / "qsd.log")
    assert seen["device.type"] == "vhost-user-blk-pci"
    assert seen["device.num-queues"] == str(VCPUS)
    assert seen["device.queue-size"] == "512"
    assert seen["memory.share"] == "true"


@needs_qemu
def test_vhost_user_blk_needs_as_many_queues_from_the_export(workdir: Path, kernel: Path) -> None:
    """The reason both sides get the same num-queues: the device refuses to ask for more."""
    config = _config(None, data_path="vhost-user-blk")
    vhost_socket = workdir / "vub,0.sock"
    spec = _spec(config, workdir, kernel, vhost_socket=vhost_socket)
    daemon = vhost_daemon_argv(config, spec.image, socket=vhost_socket,
                               qmp_socket=workdir / "qsd,0.sock", num_queues=1)
    with managed(daemon, log=workdir / "qsd.log"):
        assert wait_for(vhost_socket.exists, timeout=START_TIMEOUT)
        result = run(guest_argv(spec) + ["-S"], timeout=START_TIMEOUT, check=False)
    assert result.returncode == 1
    assert "The maximum number of queues supported by the backend is 1" in result.stderr


# Combinations invalid_reason refuses in guest mode, with the words QEMU must print.
REFUSED = [
    pytest.param(_config("nvme", iothread=True), "Property 'nvme.iothread' not found",
                 id="nvme-iothread"),
    pytest.param(_config("ide", iothread=True), "Property 'ide-hd.iothread' not found",
                 id="ide-iothread"),
    pytest.param(_config("sata", iothread=True), "Property 'ide-hd.iothread' not found",
                 id="sata-iothread"),
    pytest.param(_config("pvscsi", iothread=True), "Property 'pvscsi.iothread' not found",
                 id="pvscsi-iothread"),
    *[pytest.param(_config("virtio-blk", aio="native", cache=cache),
                   "aio=native was specified, but it requires cache.direct=on, which was not "
                   "specified.", id=f"native-{cache}")
      for cache in ("writeback", "writethrough", "unsafe")],
    pytest.param(_config("virtio-blk", queue_size=100),
                 "invalid queue-size property (100), must be a power of 2 (max 1024)",
                 id="virtio-blk-queue-size-100"),
    pytest.param(_config("virtio-scsi", num_queues=1023),
                 "Invalid number of queues (= 1023), must be a positive integer less than 1022.",
                 id="virtio-scsi-num-queues-1023"),
]


@needs_qemu
@pytest.mark.parametrize("config, qemu_says", REFUSED)
def test_qemu_refuses_what_invalid_reason_refuses(workdir: Path, kernel: Path,
                                                  config: Configuration, qemu_says: str) -> None:
    reason = invalid_reason(config)
    assert reason is not None and qemu_says.rstrip(".") in reason
    spec = _spec(config, workdir, kernel)
    with pytest.raises(InvalidCombination, match="not found|aio=native|queue"):
        guest_argv(spec)
    result = run(args._guest_argv(spec, "qemu-system-x86_64") + ["-S"], timeout=START_TIMEOUT,
                 check=False)
    assert result.returncode == 1
    assert qemu_says in result.stderr


@needs_qemu
def test_too_many_virtio_blk_queues_abort_qemu(workdir: Path, kernel: Path) -> None:
    """invalid_reason's claim for num-queues above 1024: QEMU 7.2 aborts without a message."""
    config = _config("virtio-blk", num_queues=1025)
    assert "aborts" in (invalid_reason(config) or "")
    result = run(args._guest_argv(_spec(config, workdir, kernel), "qemu-system-x86_64") + ["-S"],
                 timeout=START_TIMEOUT, check=False)
    assert result.returncode == -6   # SIGABRT (a shell shows exit 134)


# Limits found by asking QEMU 7.2 itself (some differ from what its messages suggest): QEMU's
# behaviour is asserted, and invalid_reason must say the same.
LIMITS = [
    # config, what QEMU does: "starts", "aborts", or the words of its refusal
    pytest.param(_config("virtio-scsi", num_queues=1022), "starts",
                 id="virtio-scsi-num-queues-1022"),   # its check is > 1022, its text "less than"
    pytest.param(_config("virtio-scsi-single", queue_size=100), "starts",
                 id="virtio-scsi-queue-size-100"),    # any virtqueue_size above 2
    pytest.param(_config("virtio-scsi-single", queue_size=2048), "aborts",
                 id="virtio-scsi-queue-size-2048"),
    pytest.param(_config("virtio-blk", queue_size=2), "invalid queue-size property (2), must be > 2",
                 id="virtio-blk-queue-size-2"),
    pytest.param(_config("virtio-scsi-single", queue_size=2),
                 "invalid virtqueue_size property (= 2), must be > 2", id="virtio-scsi-queue-size-2"),
    pytest.param(_config("nvme", num_queues=65536), "max_ioqpairs must be between 1 and 65535",
                 id="nvme-ioqpairs-65536"),
]


@needs_qemu
@pytest.mark.parametrize("config, qemu_does", LIMITS)
def test_queue_limits_match_qemu(workdir: Path, kernel: Path, config: Configuration,
                                 qemu_does: str) -> None:
    spec = _spec(config, workdir, kernel)
    argv = args._guest_argv(spec, "qemu-system-x86_64") + ["-S"]
    reason = invalid_reason(config)
    if qemu_does == "starts":
        with _started(argv, workdir / "qemu.log", spec.qmp_socket):
            pass
        assert reason is None
        return
    result = run(argv, timeout=START_TIMEOUT, check=False)
    if qemu_does == "aborts":
        assert result.returncode == -6
        assert reason is not None and "aborts" in reason
    else:
        assert result.returncode == 1 and qemu_does in result.stderr
        assert reason is not None and qemu_does in reason


@pytest.mark.parametrize("config, qemu_says", REFUSED)
def test_invalid_reason_quotes_what_qemu_says(config: Configuration, qemu_says: str) -> None:
    """No QEMU needed: the words are the ones QEMU 7.2 prints (as
    test_qemu_refuses_what_invalid_reason_refuses shows where QEMU is installed)."""
    reason = invalid_reason(config)
    assert reason is not None and qemu_says.rstrip(".") in reason


def test_guest_argv_refuses_what_invalid_reason_refuses(tmp_path: Path) -> None:
    """Pure: no file is made and nothing starts."""
    image = Image(path=tmp_path / "disk,0.raw", format="raw", preallocation="off", size=32 << 20)
    kernel = Path("/k/vmlinuz")
    for param in REFUSED:
        config = param.values[0]
        with pytest.raises(InvalidCombination):
            guest_argv(_spec(config, tmp_path, kernel, image=image))
    with pytest.raises(InvalidCombination, match="qcow2"):
        guest_argv(_spec(_config(format="qcow2"), tmp_path, kernel, image=image))
    vhost = _config(None, data_path="vhost-user-blk")
    with pytest.raises(InvalidCombination, match="socket"):
        guest_argv(_spec(vhost, tmp_path, kernel, image=image))
    assert guest_argv(_spec(_config(), tmp_path, kernel, image=image))[0] == "qemu-system-x86_64"
    assert list(tmp_path.iterdir()) == []


def test_the_cache_table_is_the_references() -> None:
    """CACHE_TABLE is docs/qemu-disk-options.md §3 (the guest write cache is the device's
    write-cache property)."""
    on = {"on": "true", "off": "false"}
    table = reference_table("## 3.", "cache=")
    assert {cache: (on[direct], on[no_flush], write_cache)
            for cache, (write_cache, direct, no_flush) in table.items()} == CACHE_TABLE


def test_example_command_line() -> None:
    """The whole command line of Proxmox's default disk, as a reviewer reads it."""
    config = _config("virtio-scsi-single", aio="io_uring", iothread=True, cache="none")
    image = Image(path=Path("/var/tmp/i,m/disk.raw"), format="raw", preallocation="off", size=1 << 30)
    spec = GuestSpec(config=config, image=image, kernel=Path("/k/vmlinuz"), initrd=Path("/k/initrd"),
                     append="console=ttyS0", accel="kvm", vcpus=4, memory_bytes=1 << 30,
                     qmp_socket=Path("/run/q/qmp.sock"), serial_log=Path("/run/q/serial.log"),
                     host_port=10001, name="vm0")
    assert guest_argv(spec) == [
        "qemu-system-x86_64", "-name", "guest=vm0,debug-threads=on", "-machine", "type=pc",
        "-accel", "kvm", "-cpu", "host", "-smp", "4", "-m", "1024M",
        "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
        "-kernel", "/k/vmlinuz", "-initrd", "/k/initrd", "-append", "console=ttyS0",
        "-chardev", "file,id=ser0,path=/run/q/serial.log", "-serial", "chardev:ser0",
        "-chardev", "socket,id=qmp0,path=/run/q/qmp.sock,server=on,wait=off",
        "-mon", "chardev=qmp0,mode=control",
        "-netdev", "user,id=net0,hostfwd=tcp:127.0.0.1:10001-:8765",
        "-device", "virtio-net-pci,netdev=net0,id=nic0,romfile=",
        "-object", "iothread,id=iothread-virtioscsi0",
        "-blockdev", '{"driver":"file","filename":"/var/tmp/i,m/disk.raw","node-name":"file0",'
                     '"aio":"io_uring","cache":{"direct":true,"no-flush":false}}',
        "-blockdev", '{"driver":"raw","file":"file0","node-name":"disk0",'
                     '"cache":{"direct":true,"no-flush":false}}',
        "-device", "virtio-scsi-pci,id=virtioscsi0,iothread=iothread-virtioscsi0",
        "-device", "scsi-hd,id=scsi0,bus=virtioscsi0.0,channel=0,scsi-id=0,lun=0,drive=disk0,"
                   "write-cache=on",
    ]
