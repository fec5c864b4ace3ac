"""The guest appliance: built once per module into a private cache, booted under TCG with a real
QEMU, and driven by the host's real fio as a client of the guest's fio --server."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from iomatrix.appliance import build
from iomatrix.appliance.build import (MODULES, Appliance, build_appliance, init_script,
                                      init_template, render_template)
from iomatrix.appliance.elf import drop_zero_tail, has_pvh_entry
from iomatrix.appliance.guestfio import GuestFioUnavailable, guest_fio
from iomatrix.appliance.kernel import default_cache_dir, kernel_modules_dir
from iomatrix.appliance.libraries import hollow_data_library, hollowable, library_closure
from iomatrix.appliance.modules import builtin_modules, resolve_modules
from iomatrix.appliance.protocol import (DISK_MARKER, GUEST_FIO_PORT, MIN_MEMORY_MIB,
                                         READY_MARKER, console_error, kernel_cmdline,
                                         parse_disk_lines)
from iomatrix.core.errors import (EnvironmentProblem, FioSourceUnavailable, IomatrixError,
                                  ToolFailed)
from iomatrix.fio.parse import parse_fio_output
from iomatrix.core.proc import managed, read_text, require, run, stop, wait_for
from iomatrix.drivers.guest import free_port
from iomatrix.measure.runner import STOP_RETRIES
from iomatrix.qemu.args import completed_requests, read_blockstats
from iomatrix.qemu.escape import qemu_escape
from iomatrix.suite.method import Method
from tests.conftest import BOOT_SECONDS
from tests.needs import lacking

DISK_BYTES = 48 << 20
DEFAULT_BOOT = Method().boot_timeout
"""The deadline a run gives a guest to become ready by default."""


@pytest.fixture(scope="module")
def kernel(appliance_kernel: Path) -> Path:
    return appliance_kernel


@pytest.fixture(scope="module")
def xdg_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A private XDG_CACHE_HOME: iomatrix's cache directory is <it>/iomatrix/kernel."""
    return tmp_path_factory.mktemp("xdg-cache")


@pytest.fixture(scope="module")
def cache(xdg_cache: Path) -> Path:
    """The private cache, with the guests' fio of the user's cache (built there once, if need
    be, as any guest run would) so that it is not built again from source here."""
    cache = xdg_cache / "iomatrix" / "kernel"
    try:
        built = guest_fio(default_cache_dir()).path.parent
    except GuestFioUnavailable:
        return cache                     # test_guestfio.py says why; the appliance falls back
    shutil.copytree(built, cache / "guest-fio" / built.name)
    return cache


@pytest.fixture(scope="module")
def appliance(kernel: Path, cache: Path) -> Appliance:
    return build_appliance(cache_dir=cache, kernel=kernel)


@pytest.mark.slow
def test_build_is_cached_and_force_rebuilds(appliance: Appliance, kernel: Path,
                                            cache: Path) -> None:
    assert not appliance.cached and appliance.build_seconds > 0
    assert appliance.kernel.parent == cache / "appliance" / appliance.key
    assert appliance.kernel.stat().st_size == appliance.kernel_bytes
    assert appliance.initrd.stat().st_size == appliance.initrd_bytes
    assert appliance.fio_version == run([require("fio"), "--version"], timeout=30).stdout.strip()
    # what the kernel has built in (Debian 13: virtio_pci) is bound by it, not carried
    modules_dir = kernel_modules_dir(kernel)
    assert modules_dir is not None
    builtin = builtin_modules(modules_dir)
    wanted = {"virtio_blk", "virtio_net", "virtio_pci", "sd_mod", "nvme"}
    assert wanted - builtin <= set(appliance.modules) and not builtin & set(appliance.modules)

    built = (appliance.kernel.stat().st_mtime_ns, appliance.initrd.stat().st_mtime_ns)
    start = time.monotonic()
    again = build_appliance(cache_dir=cache, kernel=kernel)
    assert time.monotonic() - start < appliance.build_seconds      # cheaper than what it saves
    assert again.cached and again.key == appliance.key and again.kernel == appliance.kernel
    assert (again.kernel.stat().st_mtime_ns, again.initrd.stat().st_mtime_ns) == built

    forced = build_appliance(cache_dir=cache, kernel=kernel, force=True)
    assert not forced.cached and forced.key == appliance.key
    assert forced.initrd.stat().st_size == appliance.initrd_bytes
    assert not [p for p in (cache / "appliance").iterdir() if p.name.startswith(".")]

    forced.initrd.unlink()  # a damaged entry is not taken as built
    rebuilt = build_appliance(cache_dir=cache, kernel=kernel)
    assert not rebuilt.cached and rebuilt.initrd.is_file()


@pytest.mark.slow
def test_appliance_carries_no_zeros_and_no_libraries(appliance: Appliance) -> None:
    """The vmlinux keeps its segments' memory sizes and its PVH note without the zeros that end
    it; the initrd carries the static fio and none of the host fio's libraries (the fallback's
    closure, ICU's data library hollowed, is tested in test_guestfio.py)."""
    vmlinux = appliance.kernel.read_bytes()
    if appliance.kernel_format == "pvh":
        assert has_pvh_entry(vmlinux) and not vmlinux.endswith(bytes(4096))
    try:
        guest_fio(default_cache_dir())
    except FioSourceUnavailable as e:       # the fallback's closure: test_guestfio.py
        assert not appliance.fio_patched and str(e).split(" (remembered")[0] in appliance.fio_note
        lacking("guest-fio", f"the appliance carries the host's fio here: {e}")
    assert appliance.fio_patched, appliance.fio_note
    initrd = appliance.initrd.read_bytes()
    assert b"lib/fio/" not in initrd
    assert guest_fio(default_cache_dir()).path.read_bytes() in initrd
    closure = library_closure(Path(require("fio")))[1]
    # before: the initrd held the whole closure and more (87 MiB for an 80 MiB closure)
    assert appliance.initrd_bytes < sum(p.stat().st_size for p in closure.values())


def test_loader_takes_the_hollowed_icu_data(tmp_path: Path) -> None:
    """The host's own loader runs the host's fio with the hollowed ICU data library among its
    libraries: the data object is never read at load time."""
    fio = Path(require("fio"))
    interpreter, closure = library_closure(fio)
    icu = [s for s in closure if hollowable(s)]
    if not interpreter or not icu:
        pytest.skip("fio is static or its closure has no ICU data library here")
    data = closure[icu[0]].read_bytes()
    hollow = hollow_data_library(data)
    assert hollow is not None and len(hollow) < 64 << 10 < len(data)
    assert hollow_data_library(b"not an ELF file") is None
    for soname, path in closure.items():
        os.symlink(path, tmp_path / soname) if soname != icu[0] else None
    (tmp_path / icu[0]).write_bytes(hollow)
    out = run([interpreter, "--library-path", str(tmp_path), str(fio), "--version"],
              timeout=30).stdout.strip()
    assert out == run([str(fio), "--version"], timeout=30).stdout.strip()


def test_zero_tail_is_dropped_and_memory_size_kept() -> None:
    """A synthetic ELF64 with one PT_LOAD whose last 3 pages are zeros: the file loses them, the
    segment keeps its memory size, and a file with nothing to drop comes back unchanged."""
    import struct
    page = 4096
    header = bytearray(0x40 + 0x38)
    header[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<Q", header, 0x20, 0x40)            # e_phoff
    struct.pack_into("<HH", header, 0x36, 0x38, 1)         # e_phentsize, e_phnum
    struct.pack_into("<IIQQQQQQ", header, 0x40, 1, 5, page, 0, 0, 4 * page, 4 * page, page)
    body = bytes(header).ljust(page, b"\0") + b"\1" * 100 + bytes(4 * page - 100)
    trimmed = drop_zero_tail(body)
    assert len(trimmed) == 2 * page
    assert struct.unpack_from("<QQ", trimmed, 0x40 + 0x20) == (page, 4 * page)
    assert drop_zero_tail(trimmed) == trimmed


@pytest.mark.slow
def test_init_template_changes_change_the_key(appliance: Appliance, kernel: Path, cache: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    template = init_template()
    monkeypatch.setattr(build, "init_template", lambda: template + "# changed by a test\n")
    changed = build_appliance(cache_dir=cache, kernel=kernel)
    try:
        assert not changed.cached and changed.key != appliance.key
        tail = b'\nfail "fio --server exited"\n# changed by a test\n'
        assert tail in changed.initrd.read_bytes()
    finally:
        shutil.rmtree(changed.kernel.parent)


def test_init_is_valid_sh_with_every_placeholder_filled(kernel: Path, tmp_path: Path) -> None:
    template = init_template()
    assert template.startswith("#!/bin/sh\n") and "@READY_MARKER@" in template
    modules_dir = kernel_modules_dir(kernel)
    if modules_dir is None:
        pytest.skip(f"{kernel} has no modules directory")
    modules = resolve_modules(modules_dir, MODULES)
    init = init_script(modules)
    assert "@" not in init and f'echo "{READY_MARKER} uptime=' in init
    # virtio-blk's match on the virtio bus; virtio-pci's on PCI unless built in (Debian 13)
    assert "virtio:d00000002v" in init
    assert ('case "$1" in pci:v00001AF4' in init) == ("virtio_pci" not in modules.builtin)
    deps = [f'deps_{n}="{" ".join(modules.closure(n))}"' for n, _ in modules.files
            if modules.closure(n)]
    assert deps and all(line in init for line in deps)
    for name, text in (("init.sh", template), ("init", init)):
        (tmp_path / name).write_text(text)
        out = subprocess.run(["sh", "-n", str(tmp_path / name)], capture_output=True, text=True)
        assert out.returncode == 0, (name, out.stderr)


def test_template_placeholders_are_filled_exactly() -> None:
    assert render_template("a=@A@ b=@B@ $@ @A@", {"A": "@B@", "B": "2"}) == "a=@B@ b=2 $@ @B@"
    with pytest.raises(ValueError, match="has @C@, which has no value"):
        render_template("@A@ @C@", {"A": "1"})
    with pytest.raises(ValueError, match="lacks @B@"):
        render_template("@A@", {"A": "1", "B": "2"})


def test_build_still_offers_the_names_other_layers_import() -> None:
    for name in ("GUEST_FIO_PORT", "MIN_MEMORY_MIB", "READY_MARKER", "TRACE_MARKER",
                 "DISK_MARKER", "Appliance", "GuestDisk", "build_appliance", "console_error",
                 "kernel_cmdline", "parse_disk_lines", "has_pvh_entry", "resolve_modules"):
        assert name in build.__all__ and hasattr(build, name), name


@pytest.mark.slow
def test_cli_build_reports_the_cached_appliance(appliance: Appliance, kernel: Path,
                                                xdg_cache: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "iomatrix", "appliance", "build",
                          "--kernel", str(kernel)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "XDG_CACHE_HOME": str(xdg_cache)})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == f"appliance: {appliance.kernel.parent}"
    assert lines[-2].startswith("  size    ") and "MiB" in lines[-2]
    assert lines[-1].startswith("  cached (built in ")


@pytest.mark.slow
def test_cli_build_with_a_missing_kernel_says_so(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "iomatrix", "appliance", "build",
                          "--kernel", str(tmp_path / "vmlinuz-none")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and out.stdout == ""
    assert out.stderr.splitlines() == [
        f"iomatrix: cannot build the appliance: {tmp_path / 'vmlinuz-none'} does not exist",
        "iomatrix: hint: pass --kernel with a bzImage (vmlinuz) file"]


@pytest.mark.slow
def test_bad_inputs_fail_clearly(kernel: Path, cache: Path, tmp_path: Path,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    garbage = tmp_path / "vmlinuz-garbage"
    garbage.write_bytes(b"\0" * 4096)
    with pytest.raises(EnvironmentProblem, match="not an x86 Linux kernel image"):
        build_appliance(cache_dir=cache, kernel=garbage, fetch=False)

    lonely = tmp_path / "boot" / "vmlinuz-9.9.9-lonely"  # a kernel without its modules
    lonely.parent.mkdir()
    shutil.copy(kernel, lonely)
    with pytest.raises(EnvironmentProblem, match="no modules for kernel"):
        build_appliance(cache_dir=cache, kernel=lonely, fetch=False)

    monkeypatch.setenv("PATH", str(tmp_path))  # no fio to put in the appliance
    with pytest.raises(EnvironmentProblem, match="fio not found on PATH") as e:
        build_appliance(cache_dir=cache, kernel=kernel, fetch=False)
    assert e.value.hint == "install it: apt-get install fio"


def test_modules_load_after_their_dependencies(kernel: Path) -> None:
    modules_dir = kernel_modules_dir(kernel)
    if modules_dir is None:
        pytest.skip(f"{kernel} has no modules directory")
    found = resolve_modules(modules_dir, MODULES)
    order = [name for name, _ in found.files]
    assert len(order) == len(set(order))
    for name in order:
        for dep in found.depends[name]:
            assert order.index(dep) < order.index(name), (dep, name)
    # built-in modules (Debian 13's 6.12: virtio, virtio_ring, virtio_pci; Debian 12's 6.1: none)
    # are neither carried nor anyone's dependency; the others are
    builtin = builtin_modules(modules_dir)
    assert not builtin & set(order) and set(MODULES) & builtin <= set(found.builtin) <= builtin
    assert set(MODULES) <= set(order) | builtin
    assert found.closure("virtio_blk") == [m for m in ("virtio_ring", "virtio") if m not in builtin]
    if "virtio_pci" not in builtin:
        assert any(p.startswith("pci:v00001AF4") for p in found.aliases["virtio_pci"])
    with pytest.raises(EnvironmentProblem, match="no_such_driver is neither built into"):
        resolve_modules(modules_dir, ["no_such_driver"])


def test_disk_lines_parse_and_unfinished_lines_wait() -> None:
    text = (f"[    1.0] booting\r\n{DISK_MARKER} name=sda size=1073741824 queues=2 "
            f'scheduler=none rotational=0 driver=sd model="QEMU HARDDISK"\n'
            f"{DISK_MARKER} name=vdb size=5")
    (disk,) = parse_disk_lines(text)
    assert (disk.name, disk.size_bytes, disk.queues, disk.scheduler, disk.rotational,
            disk.driver, disk.model) == ("sda", 1 << 30, 2, "none", False, "sd", "QEMU HARDDISK")
    with pytest.raises(IomatrixError, match="malformed IOMATRIX-DISK line"):
        parse_disk_lines(f"{DISK_MARKER} name=vda queues=1\n")
    assert console_error("x\nIOMATRIX-ERROR insmod nvme failed\n") == "insmod nvme failed"
    assert console_error("IOMATRIX-READY uptime=1.0\n") is None


def test_cmdline_tunes_for_the_accelerator() -> None:
    kvm = kernel_cmdline(port=9000, disks=2).split()
    assert kvm[0] == "console=ttyS0" and "iomatrix.port=9000" in kvm and "iomatrix.disks=2" in kvm
    assert not any(p.startswith("clearcpuid") for p in kvm)
    assert "clearcpuid=erms,fsrm" in kernel_cmdline(accel="tcg").split()
    assert kernel_cmdline("quiet=1").endswith(" quiet=1")


VIRTIO_BLK = ["-device", "virtio-blk-pci,drive=d0"]


@contextlib.contextmanager
def _booted(appliance: Appliance, work: Path, *, devices: list[str] = VIRTIO_BLK, disks: int = 1,
            nic: bool = True) -> Iterator[tuple[str, int, float | None]]:
    """Boot the appliance under TCG with ``disks`` raw disks (drives d0, d1, ... for
    ``devices``); yields (serial text once READY showed or QEMU exited; the host port of
    fio --server; the CPU seconds QEMU used to that point, None when it exited: what the boot
    cost, which a loaded host does not inflate as it does the wall time)."""
    serial = work / "serial.log"
    port = free_port()
    argv = [require("qemu-system-x86_64"), "-accel", "tcg", "-machine", "pc", "-cpu", "max",
            "-m", str(MIN_MEMORY_MIB), "-nodefaults", "-no-user-config", "-display", "none",
            "-no-reboot",
            "-chardev", f"file,id=ser0,path={qemu_escape(str(serial))}", "-serial", "chardev:ser0",
            "-kernel", str(appliance.kernel), "-initrd", str(appliance.initrd),
            "-append", kernel_cmdline(port=GUEST_FIO_PORT, disks=disks, accel="tcg"),
            "-qmp", f"unix:{work / 'qmp'},server=on,wait=off"]
    for i in range(disks):
        disk = work / f"disk{i}.raw"
        with open(disk, "wb") as f:
            f.truncate(DISK_BYTES)
        argv += ["-drive", f"file={qemu_escape(str(disk))},format=raw,if=none,id=d{i},"
                           "cache=none,aio=threads"]
    argv += devices
    if nic:
        argv += ["-netdev", f"user,id=n0,hostfwd=tcp:127.0.0.1:{port}-:{GUEST_FIO_PORT}",
                 "-device", "virtio-net-pci,netdev=n0,romfile="]
    with managed(argv, log=work / "qemu.log") as proc:
        wait_for(lambda: READY_MARKER in read_text(serial) or proc.poll() is not None,
                 timeout=BOOT_SECONDS, interval=0.05)
        yield read_text(serial), port, _cpu_seconds(proc.pid) if proc.poll() is None else None


def _cpu_seconds(pid: int) -> float:
    """User and system CPU time of process ``pid`` (all its threads) so far."""
    fields = read_text(Path(f"/proc/{pid}/stat")).rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _serve(work: Path, port: int, job: Path) -> tuple[str | None, bool]:
    """fio's client runs ``job`` on the guest booted in ``work``: (its output, False), or when
    it outlasts 60 s, (None, whether the guest's disk then sat idle for a second while the
    client still waited, or QEMU no longer answered its monitor: the guest stopped, as the
    runner's ``GuestSession.stalled`` tells)."""
    with open(work / "fio.out", "w+b") as out:
        proc = subprocess.Popen([require("fio"), f"--client=127.0.0.1,{port}",
                                 "--output-format=json", str(job)],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            def ops() -> int:
                return completed_requests(read_blockstats(work / "qmp"))
            try:
                first = ops()
                time.sleep(1.0)
                return None, ops() == first
            except (ToolFailed, OSError, ValueError):   # the monitor did not answer in time
                return None, True
            finally:
                stop(proc)
        out.seek(0)
        text = out.read().decode(errors="replace")
    assert proc.returncode == 0, text[-2000:]
    return text, False


@pytest.mark.slow
def test_boots_to_ready_and_serves_fio(appliance: Appliance, tmp_path: Path,
                                       no_leftovers: None) -> None:
    """The appliance boots to READY under TCG, names its disk, and its fio server runs both
    engines a run uses. A guest that stops (its fio never finishes, its disk idle or its QEMU
    silent) is booted afresh, as a run does (up to runner.STOP_RETRIES times), with a warning
    that keeps the stop in sight."""
    job = tmp_path / "job.fio"
    # both engines a run uses, with the trimmed library closure (ICU's data hollowed)
    job.write_text("[global]\nfilename=/dev/vda\nrw=randread\nbs=4k\niodepth=4\n"
                   "direct=1\nruntime=1\ntime_based=1\n"
                   "[randread]\nioengine=libaio\n[uring]\nstonewall\nioengine=io_uring\n")
    attempts = STOP_RETRIES + 1
    for attempt in range(1, attempts + 1):
        work = tmp_path / f"boot{attempt}"
        work.mkdir()
        with _booted(appliance, work) as (text, port, seconds):
            assert READY_MARKER in text, (console_error(text), text[-1500:])
            (disk,) = parse_disk_lines(text)
            assert disk.name == "vda" and disk.size_bytes == DISK_BYTES and disk.queues >= 1
            assert disk.driver == "virtio_blk" and disk.rotational is True
            out, stopped = _serve(work, port, job)
        if out is None and stopped and attempt < attempts:
            warnings.warn(f"the guest stopped (attempt {attempt} of {attempts}): fio did not "
                          "finish within 60 s and the guest's disk sat idle or its QEMU did not "
                          "answer; booted again", stacklevel=1)
            continue
        assert out is not None, ("fio did not finish within 60 s; " + (
            f"the guest stopped in each of {attempts} boots" if stopped
            else "the guest's disk was busy a second past that"))
        break
    result = parse_fio_output(out)
    assert [j.name for j in result.jobs] == ["randread", "uring"]
    assert all(j.read.iops > 0 and j.error == 0 for j in result.jobs)
    assert json.loads(out[out.index("{"):])["client_stats"][0]["jobname"] == "randread"
    # emulating the boot costs at most half the default deadline a run gives a guest: CPU
    # time, which load does not stretch as it stretches the wall time (READY above says the
    # boot met the test's own, larger, deadline)
    assert seconds is not None and seconds < DEFAULT_BOOT / 2, \
        f"boot to READY took {seconds} CPU seconds under TCG"


@pytest.mark.slow
def test_guest_without_a_nic_reports_the_error_and_powers_off(appliance: Appliance,
                                                              tmp_path: Path,
                                                              no_leftovers: None) -> None:
    with _booted(appliance, tmp_path, nic=False) as (text, _, seconds):
        assert READY_MARKER not in text
        assert console_error(text) == "no network interface (is a virtio-net-pci device attached?)"
        assert seconds is None  # the guest powered off: QEMU exited by itself


@pytest.mark.slow
def test_ide_and_nvme_disks_are_found(appliance: Appliance, tmp_path: Path,
                                      no_leftovers: None) -> None:
    """IDE is probed last (machine pc's PIIX controller is usually empty), and only because a
    disk is still missing; NVMe finds its namespace asynchronously."""
    devices = ["-device", "ide-hd,bus=ide.0,unit=0,drive=d0",
               "-device", "nvme,drive=d1,serial=IOMATRIX0"]
    with _booted(appliance, tmp_path, devices=devices, disks=2) as (text, _, _):
        assert READY_MARKER in text, (console_error(text), text[-1500:])
        disks = {d.name: d for d in parse_disk_lines(text)}
    assert set(disks) == {"sda", "nvme0n1"}
    assert (disks["sda"].driver, disks["sda"].model) == ("sd", "QEMU HARDDISK")
    assert (disks["nvme0n1"].driver, disks["nvme0n1"].rotational) == ("nvme", False)
    assert all(d.size_bytes == DISK_BYTES and d.queues >= 1 for d in disks.values())
