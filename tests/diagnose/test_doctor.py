"""`iomatrix doctor` runs real probes: the installed tools must pass, a missing tool must fail with
a hint, and nothing (temp files, mounts, processes) may be left behind. Whether KVM is usable
differs from host to host, and so does the way it fails where it is not (a PVM host: a guest that
hangs, or a QEMU that aborts, ...): the KVM tests take this host's outcome, skip the other one
(unless IOMATRIX_EXPECT_KVM=1 or 0 declares it), and never rely on how KVM failed."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from iomatrix.appliance.kernel import default_cache_dir, find_kernel, host_kernel, kernel_modules_dir
from iomatrix.core.errors import IomatrixError
from iomatrix.diagnose.doctor import (Check, check_appliance, check_fio_engine, check_tool,
                                     failed_required, run_checks)
from tests.conftest import for_kvm, our_processes
from tests.needs import lacking

NAMES = ("qemu-system-x86_64", "qemu-storage-daemon", "qemu-img", "fio", "fio nbd engine",
         "libaio", "io_uring", "FUSE export", "KVM", "guest channel", "guest fio",
         "guest appliance", "QEMU network block drivers", "fio rbd engine", "rbd command",
         "kernel rbd (krbd)", "kernel iSCSI initiator (iscsi_tcp)", "tgtd (iSCSI target)",
         "LVM tools (lvm, lvmthin)", "btrfs tools (btrfs)", "Proxmox VE storage layer (pvesm)",
         "ZFS tools (zfs)")
HOST_DEPENDENT = ("KVM", "guest channel", "guest fio", "QEMU network block drivers",
                  "fio rbd engine", "rbd command", "kernel rbd (krbd)",
                  "kernel iSCSI initiator (iscsi_tcp)", "tgtd (iSCSI target)",
                  "LVM tools (lvm, lvmthin)", "btrfs tools (btrfs)",
                  "Proxmox VE storage layer (pvesm)", "ZFS tools (zfs)")
"""Checks whose outcome depends on the host (KVM; root for the guests' private network; a
compiler and fio's Debian source for the guests' fio; network storage clients, which only rbd
targets need; LVM's, btrfs's and ZFS's tools and Proxmox VE's pvesm, which only their targets need), not required: tests/drivers/test_guest_channel.py covers the channel's,
tests/appliance/test_guestfio.py the guests' fio, tests/scenarios/test_rbd.py the storage clients'."""
KVM_TIMEOUT = 10.0
OTHER_CHECKS = 35.0
"""Seconds the checks other than KVM's may take together: about 1 s on our machines, but a slow
or busy host gets ample time; a probe stuck until its own timeout (30 s for fio) still fails."""


def mounts_under(directory: Path) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [line for line in f if str(directory) in line]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every temp file of the probes (fio, FUSE and the KVM probe's serial log) goes here."""
    path = Path(os.path.realpath(tmp_path_factory.mktemp("doctor")))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tempfile, "tempdir", str(path))
        yield path


@pytest.fixture(scope="module")
def checks(workdir: Path) -> tuple[Check, ...]:
    try:             # found (or downloaded once) before the clock starts: no network in the timing
        kernel = find_kernel(require_modules=True)     # the appliance's kernel too
    except IomatrixError:
        kernel = None    # then KVM is "not probed", with the reason
    start = time.monotonic()
    result = run_checks(kvm_timeout=KVM_TIMEOUT, directory=workdir, kernel=kernel, fetch=False)
    assert time.monotonic() - start < KVM_TIMEOUT + OTHER_CHECKS
    return result


def by_name(checks: tuple[Check, ...]) -> dict[str, Check]:
    return {c.name: c for c in checks}


@pytest.mark.slow
def test_every_check_runs_in_a_fixed_order(checks: tuple[Check, ...]) -> None:
    assert tuple(c.name for c in checks) == NAMES
    assert [c.name for c in checks if not c.required] == list(HOST_DEPENDENT)


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in NAMES if n not in HOST_DEPENDENT])
def test_the_installed_tools_pass(checks: tuple[Check, ...], name: str) -> None:
    check = by_name(checks)[name]
    assert check.ok, check.detail
    assert check.hint is None
    assert check.detail


@pytest.mark.slow
def test_versions_are_parsed(checks: tuple[Check, ...]) -> None:
    found = by_name(checks)
    for name in ("qemu-system-x86_64", "qemu-storage-daemon", "qemu-img"):
        assert re.fullmatch(r"\d+\.\d+\.\d+", found[name].version or ""), found[name]
        assert found[name].version in found[name].detail
    assert re.fullmatch(r"\d+\.\d+(\.\d+)?", found["fio"].version or ""), found["fio"]
    assert found["FUSE export"].detail.startswith("qemu-storage-daemon mounted a FUSE export")
    assert "direct=1" in found["libaio"].detail and "direct=1" in found["io_uring"].detail


@pytest.mark.slow
def test_nothing_required_is_missing_here(checks: tuple[Check, ...]) -> None:
    assert failed_required(checks) == ()


@pytest.mark.slow
def test_the_appliance_check_names_what_a_guest_run_would_miss(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The appliance's kernel is a cached one whose modules lack nvme: the check fails, naming
    the module, where the other checks know nothing of the appliance. With the module there it
    passes and names the kernel, its modules and busybox (Debian 12's bin/busybox, Debian 13's
    usr/bin/busybox)."""
    if host_kernel() is not None and kernel_modules_dir(host_kernel()) is not None:
        pytest.skip("this host's own kernel, with its modules, is the appliance's")
    try:
        real = find_kernel(require_modules=True)
    except IomatrixError as e:
        lacking("kernel", f"no kernel with modules: {e}")
    modules_dir = kernel_modules_dir(real)
    assert modules_dir is not None
    cache = tmp_path / "iomatrix" / "kernel"
    for busybox in default_cache_dir().glob("busybox-static_*"):    # else fetched again
        cache.mkdir(parents=True, exist_ok=True)
        (cache / busybox.name).symlink_to(busybox)
    kernel = cache / "linux-image-test" / "boot" / real.name
    kernel.parent.mkdir(parents=True)
    kernel.symlink_to(real)
    copy = kernel.parents[1] / "lib" / "modules" / modules_dir.name
    for path in modules_dir.rglob("*"):           # the same tree of links, without nvme
        if path.is_file() and not path.name.startswith("nvme."):
            (copy / path.relative_to(modules_dir)).parent.mkdir(parents=True, exist_ok=True)
            (copy / path.relative_to(modules_dir)).symlink_to(path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    check = check_appliance(fetch=False)
    assert not check.ok and check.required
    assert "kernel module nvme is neither built into the kernel nor present" in check.detail
    assert check.hint and "NVMe" in check.hint

    nvme = next(p for p in modules_dir.rglob("nvme.ko*"))
    (copy / nvme.relative_to(modules_dir)).symlink_to(nvme)
    check = check_appliance(fetch=True)
    assert check.ok, check
    assert check.detail.startswith(f"kernel {modules_dir.name} ({kernel}) with ")
    assert re.search(r"; static busybox busybox-static_[^ ]*/(usr/)?bin/busybox", check.detail)


@pytest.mark.slow
def test_unusable_kvm_is_reported_but_not_fatal(checks: tuple[Check, ...]) -> None:
    kvm = by_name(checks)["KVM"]
    for_kvm(kvm.ok, wanted=False, detail=kvm.detail)
    assert kvm.ok is False and kvm.required is False
    assert "kvm" in kvm.detail.lower(), kvm.detail     # the reason, naming what failed
    assert kvm.hint and "TCG" in kvm.hint              # what happens instead
    assert failed_required(checks) == ()               # and nothing else fails because of it


@pytest.mark.slow
def test_kvm_passes_on_a_real_kvm_host(checks: tuple[Check, ...]) -> None:
    kvm = by_name(checks)["KVM"]
    for_kvm(kvm.ok, wanted=True, detail=kvm.detail)
    assert kvm.ok and kvm.required is False and kvm.hint is None
    assert "under KVM in" in kvm.detail, kvm.detail


@pytest.mark.slow
def test_the_probes_leave_nothing_behind(checks: tuple[Check, ...], workdir: Path) -> None:
    assert list(workdir.iterdir()) == []
    assert mounts_under(workdir) == []
    assert our_processes(str(workdir)) == []


def test_every_check_fails_with_a_hint_when_path_is_empty(tmp_path: Path) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    timeout = 60.0
    start = time.monotonic()
    result = run_checks(kvm_timeout=timeout, env={"PATH": str(empty)}, directory=tmp_path)
    assert time.monotonic() - start < timeout / 10     # nothing to run, nothing waited for
    assert tuple(c.name for c in result) == NAMES
    for check in result:
        if check.name.startswith("kernel "):     # the kernel's, whatever PATH holds
            continue
        assert check.ok is False, check
        assert check.hint, check
        assert "not found" in check.detail, check
    hints = {c.name: c.hint for c in result}
    assert hints["qemu-system-x86_64"] == "apt-get install qemu-system-x86"
    assert hints["qemu-storage-daemon"] == "apt-get install qemu-system-common"
    assert hints["qemu-img"] == "apt-get install qemu-utils"
    assert hints["fio"] == "apt-get install fio"
    assert hints["KVM"] == "apt-get install qemu-system-x86"
    assert hints["rbd command"] == "apt-get install ceph-common"
    assert [p.name for p in tmp_path.iterdir()] == ["empty-bin"]


def test_the_lookup_follows_the_given_path(tmp_path: Path) -> None:
    """Only fio is on this PATH: fio is found and runs, qemu-img is not."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fio = shutil.which("fio")
    assert fio, "fio is not installed (./setup.sh installs it)"
    (bin_dir / "fio").symlink_to(fio)
    env = {"PATH": str(bin_dir)}
    assert check_tool("fio", env=env).ok
    missing = check_tool("qemu-img", env=env)
    assert not missing.ok and missing.hint == "apt-get install qemu-utils"


def test_an_unknown_fio_engine_fails_with_fios_reason(tmp_path: Path) -> None:
    check = check_fio_engine("no-such-engine", directory=tmp_path)
    assert check.ok is False
    assert "failed with status" in check.detail
    assert list(tmp_path.iterdir()) == []
    assert our_processes(str(tmp_path)) == []
