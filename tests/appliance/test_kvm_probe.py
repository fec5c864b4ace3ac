"""The KVM probe boots a real kernel. Whether KVM is usable differs from host to host: on our PVM
development hosts /dev/kvm exists but KVM is not usable, and how it fails differs from one such
host to the next (a guest that hangs early in boot, a QEMU that aborts, ...). So this host's
outcome is probed once; the tests for the other outcome skip (or fail, when IOMATRIX_EXPECT_KVM=1
or 0 declares what this host must do). No test relies on the way KVM fails."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import pytest

from iomatrix.appliance.kernel import (cached_kernels, default_cache_dir, find_kernel, host_kernel,
                                       kernel_modules_dir, kernel_problem)
from iomatrix.core.errors import EnvironmentProblem
from iomatrix.appliance import probe as probe_module
from iomatrix.appliance.probe import (LATE_BOOT_MARKERS, AccelProbe, boot_argv, kvm_device_problem,
                                      probe_accel, probe_kvm)
from tests.conftest import for_kvm, our_processes

KVM_TIMEOUT = 10.0


def _leftovers(directory: Path) -> None:
    left = our_processes(str(directory))
    assert not left, f"processes left behind: {left}"
    assert not [p for p in directory.iterdir() if p.name.startswith("iomatrix-bootprobe-")]


@pytest.fixture(autouse=True)
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """Probe temp dirs go under tmp_path, so a leftover QEMU is recognisable by its command line;
    after each test nothing that mentions tmp_path (and no QEMU child) may still exist."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    yield tmp_path
    _leftovers(tmp_path)


@pytest.fixture(scope="module")
def kvm(kernel: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[AccelProbe, float]:
    """This host's KVM, probed once with the usual timeout: (the probe, wall seconds it took)."""
    directory = Path(os.path.realpath(tmp_path_factory.mktemp("kvm")))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tempfile, "tempdir", str(directory))
        start = time.monotonic()
        probe = probe_kvm(kernel, timeout=KVM_TIMEOUT)
        elapsed = time.monotonic() - start
    _leftovers(directory)
    return probe, elapsed


@pytest.mark.slow
def test_the_kvm_probe_keeps_its_deadline_either_way(kvm: tuple[AccelProbe, float],
                                                     kernel: Path) -> None:
    """Usable or not, the probe answers within its timeout (plus the time to stop QEMU), says
    why, and a kernel booted is the one it was given."""
    probe, elapsed = kvm
    assert probe.accel == "kvm" and probe.reason
    assert probe.seconds <= elapsed + 0.001, (probe.seconds, elapsed)   # seconds: rounded to ms
    assert elapsed < 2 * KVM_TIMEOUT, (elapsed, probe.reason)
    assert probe.usable == (probe.marker is not None)
    if probe.probed:
        assert probe.kernel == kernel


@pytest.mark.slow
def test_unusable_kvm_is_reported_with_a_reason(kvm: tuple[AccelProbe, float]) -> None:
    probe, _ = kvm
    for_kvm(probe.usable, wanted=False, detail=probe.reason)
    assert probe.usable is False and probe.marker is None
    assert "kvm" in probe.reason.lower(), probe.reason      # it names the accelerator that failed
    # /dev/kvm opens here (a PVM host): then a kernel was really booted under it, and failed
    assert probe.probed == (kvm_device_problem() is None), probe.reason


@pytest.mark.slow
def test_kvm_is_usable_on_a_real_kvm_host(kvm: tuple[AccelProbe, float]) -> None:
    probe, _ = kvm
    for_kvm(probe.usable, wanted=True, detail=probe.reason)
    assert probe.probed and probe.marker in LATE_BOOT_MARKERS
    assert "under KVM in" in probe.reason and probe.hint is None


@pytest.mark.slow
def test_the_same_kernel_boots_to_the_late_marker_under_tcg(kernel: Path) -> None:
    """The probe logic is right both ways: the kernel that KVM cannot run on a host where KVM is
    unusable boots fine when emulated, so such a failure is KVM's, not the kernel's."""
    timeout = 120.0                        # emulated boots are slow; a slow host gets time
    probe = probe_accel("tcg", kernel, timeout=timeout)
    assert probe.usable, (probe.reason, probe.serial_tail)
    assert probe.marker == "VFS: Unable to mount root fs"
    assert "under TCG in" in probe.reason and probe.probed
    assert probe.serial_tail  # the end of the console log is kept for the report
    assert probe.seconds < timeout


NO_WAIT = 60.0
"""The timeout of probes that must answer without booting anything: they answer in a small
fraction of it (a probe that waited for it would take a minute)."""


@pytest.fixture
def kvm_opens(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a host where /dev/kvm opens (whether or not KVM then works): the probe goes on to
    its own checks of QEMU and the kernel, whatever this host's /dev/kvm is like."""
    monkeypatch.setattr(probe_module, "kvm_device_problem", lambda device=None: None)


def test_a_missing_qemu_binary_gives_a_reason(tmp_path: Path) -> None:
    probe = probe_kvm(tmp_path / "vmlinuz", qemu=tmp_path / "no-such-qemu", timeout=NO_WAIT)
    assert probe.usable is False and probe.probed is False
    assert "not probed" in probe.reason and "not found" in probe.reason
    assert probe.hint == "apt-get install qemu-system-x86"
    assert probe.seconds < NO_WAIT / 10


def test_qemu_missing_from_path_gives_a_reason(tmp_path: Path) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    probe = probe_kvm(tmp_path / "vmlinuz", env={"PATH": str(empty)}, timeout=NO_WAIT)
    assert probe.usable is False and probe.probed is False
    assert "qemu-system-x86_64 not found" in probe.reason


def test_a_qemu_that_fails_gives_its_exit_status(kernel: Path, kvm_opens: None) -> None:
    probe = probe_kvm(kernel, qemu="/bin/false", timeout=NO_WAIT)
    assert probe.usable is False
    assert "exited with status 1" in probe.reason
    assert probe.seconds < NO_WAIT / 10


def test_a_kvm_device_that_does_not_open_is_said_before_any_boot(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert "does not exist" in (kvm_device_problem(tmp_path / "no-kvm") or "")
    monkeypatch.setattr(probe_module, "kvm_device_problem", lambda device=None: "it is gone")
    probe = probe_kvm(tmp_path / "vmlinuz", timeout=NO_WAIT)
    assert probe.usable is False and probe.probed is False
    assert probe.reason == "KVM not usable: it is gone" and probe.hint and "TCG" in probe.hint
    assert probe.seconds < NO_WAIT / 10


@pytest.mark.parametrize("what", ["missing", "text", "directory"])
def test_a_broken_kernel_path_gives_a_reason(tmp_path: Path, what: str, kvm_opens: None) -> None:
    path = tmp_path / "vmlinuz-broken"
    if what == "text":
        path.write_text("not a kernel\n" * 100)
    elif what == "directory":
        path.mkdir()
    probe = probe_kvm(path, timeout=NO_WAIT)
    assert probe.usable is False and probe.probed is False
    assert probe.reason.startswith("KVM not probed: bad kernel:"), probe.reason
    expected = {"missing": "does not exist", "text": "not an x86 Linux kernel image",
                "directory": "is a directory"}[what]
    assert expected in probe.reason
    assert probe.seconds < NO_WAIT / 10


def test_no_kernel_at_all_means_not_probed(tmp_path: Path, kvm_opens: None) -> None:
    if host_kernel() is not None:
        pytest.skip("this host's own kernel is readable, so a kernel is always found")
    with pytest.raises(EnvironmentProblem) as info:
        find_kernel(tmp_path / "empty-cache", fetch=False)
    assert info.value.hint
    probe = probe_kvm(cache_dir=tmp_path / "empty-cache", fetch_kernel=False, timeout=NO_WAIT)
    assert probe.usable is False and probe.probed is False
    assert probe.reason.startswith("KVM not probed: no kernel to boot"), probe.reason


def test_the_kernel_found_is_bootable_and_has_its_modules(kernel: Path) -> None:
    assert kernel_problem(kernel) is None
    assert kernel.stat().st_size > 1_000_000
    if kernel != host_kernel():
        assert kernel in cached_kernels()
        modules = kernel_modules_dir(kernel)
        assert modules is not None and (modules / "kernel").is_dir()


def test_the_cache_honours_xdg_cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "iomatrix" / "kernel"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/path")  # the XDG spec says: ignore it
    assert default_cache_dir() == Path.home() / ".cache" / "iomatrix" / "kernel"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_cache_dir() == Path.home() / ".cache" / "iomatrix" / "kernel"


def test_boot_argv_is_a_bare_machine_with_a_logged_serial_port(tmp_path: Path) -> None:
    argv = boot_argv("qemu-system-x86_64", "kvm", Path("/k/vmlinuz"), tmp_path / "a,b.log",
                     initrd=Path("/k/initrd"))
    assert argv[:5] == ["qemu-system-x86_64", "-accel", "kvm", "-cpu", "host"]
    for flag in ("-nodefaults", "-no-user-config", "-no-reboot"):
        assert flag in argv
    assert argv[argv.index("-display") + 1] == "none"
    assert argv[argv.index("-m") + 1] == "256"
    assert f"path={tmp_path}/a,,b.log" in argv[argv.index("-chardev") + 1]
    append = argv[argv.index("-append") + 1]
    assert "console=ttyS0" in append and "panic=-1" in append
    assert argv[argv.index("-initrd") + 1] == "/k/initrd"
    assert "-cpu" not in boot_argv("q", "tcg", Path("/k"), tmp_path / "s")
