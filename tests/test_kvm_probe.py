"""The KVM probe boots a real kernel. On our development machines (a PVM host) KVM is NOT usable:
those assertions are machine-specific and skipped when IOMATRIX_EXPECT_KVM=1 (a real KVM host)."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import pytest

from iomatrix.appliance.kernel import (cached_kernels, default_cache_dir, find_kernel, host_kernel,
                                       kernel_modules_dir, kernel_problem)
from iomatrix.core.errors import EnvironmentProblem
from iomatrix.appliance.probe import LATE_BOOT_MARKERS, boot_argv, probe_accel, probe_kvm
from tests.conftest import our_processes

EXPECT_KVM = os.environ.get("IOMATRIX_EXPECT_KVM") == "1"


@pytest.fixture(autouse=True)
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """Probe temp dirs go under tmp_path, so a leftover QEMU is recognisable by its command line;
    after each test nothing that mentions tmp_path (and no QEMU child) may still exist."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    yield tmp_path
    left = our_processes(str(tmp_path))
    assert not left, f"processes left behind: {left}"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("iomatrix-bootprobe-")]


@pytest.mark.slow
@pytest.mark.skipif(EXPECT_KVM, reason="machine-specific: this host is expected to have real KVM")
def test_kvm_is_not_usable_on_this_pvm_host(kernel: Path) -> None:
    timeout = 10.0
    start = time.monotonic()
    probe = probe_kvm(kernel, timeout=timeout)
    elapsed = time.monotonic() - start
    assert elapsed < timeout + 5, elapsed
    assert probe.accel == "kvm"
    assert probe.usable is False
    assert probe.probed is True
    assert "did not finish booting under KVM within 10 s" in probe.reason, probe.reason
    assert probe.hint and "TCG" in probe.hint
    assert timeout <= probe.seconds < timeout + 5


@pytest.mark.slow
@pytest.mark.skipif(not EXPECT_KVM, reason="only on a host with real KVM (IOMATRIX_EXPECT_KVM=1)")
def test_kvm_is_usable_on_a_real_kvm_host(kernel: Path) -> None:
    probe = probe_kvm(kernel, timeout=10.0)
    assert probe.usable, probe.reason
    assert probe.marker in LATE_BOOT_MARKERS


@pytest.mark.slow
def test_the_same_kernel_boots_to_the_late_marker_under_tcg(kernel: Path) -> None:
    """The probe logic is right both ways: what hangs under KVM here boots fine when emulated."""
    probe = probe_accel("tcg", kernel, timeout=60.0)
    assert probe.usable, (probe.reason, probe.serial_tail)
    assert probe.marker == "VFS: Unable to mount root fs"
    assert "under TCG in" in probe.reason and probe.probed
    assert probe.serial_tail  # the end of the console log is kept for the report
    assert probe.seconds < 60


def test_a_missing_qemu_binary_gives_a_reason(kernel: Path, tmp_path: Path) -> None:
    probe = probe_kvm(kernel, qemu=tmp_path / "no-such-qemu", timeout=5)
    assert probe.usable is False and probe.probed is False
    assert "not probed" in probe.reason and "not found" in probe.reason
    assert probe.hint == "apt-get install qemu-system-x86"
    assert probe.seconds < 1


def test_qemu_missing_from_path_gives_a_reason(kernel: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    probe = probe_kvm(kernel, env={"PATH": str(empty)}, timeout=5)
    assert probe.usable is False and probe.probed is False
    assert "qemu-system-x86_64 not found" in probe.reason


def test_a_qemu_that_fails_gives_its_exit_status(kernel: Path) -> None:
    probe = probe_kvm(kernel, qemu="/bin/false", timeout=5)
    assert probe.usable is False
    assert "exited with status 1" in probe.reason


@pytest.mark.parametrize("what", ["missing", "text", "directory"])
def test_a_broken_kernel_path_gives_a_reason(tmp_path: Path, what: str) -> None:
    path = tmp_path / "vmlinuz-broken"
    if what == "text":
        path.write_text("not a kernel\n" * 100)
    elif what == "directory":
        path.mkdir()
    probe = probe_kvm(path, timeout=5)
    assert probe.usable is False and probe.probed is False
    assert probe.reason.startswith("KVM not probed: bad kernel:"), probe.reason
    expected = {"missing": "does not exist", "text": "not an x86 Linux kernel image",
                "directory": "is a directory"}[what]
    assert expected in probe.reason
    assert probe.seconds < 1


def test_no_kernel_at_all_means_not_probed(tmp_path: Path) -> None:
    if host_kernel() is not None:
        pytest.skip("this host's own kernel is readable, so a kernel is always found")
    with pytest.raises(EnvironmentProblem) as info:
        find_kernel(tmp_path / "empty-cache", fetch=False)
    assert info.value.hint
    probe = probe_kvm(cache_dir=tmp_path / "empty-cache", fetch_kernel=False, timeout=5)
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
