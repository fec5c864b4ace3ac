"""[guest] image: the user's own image as the guest (iomatrix.appliance.ownimage, the guest
driver's own-image path). The fast tests use real qemu-img and xorriso; the slow ones boot a
real Debian 12 image (iomatrix.testing.debianimage, built once into the cache: ~3 min) under TCG
beside the appliance."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from iomatrix.appliance.guestfio import guest_fio_status
from iomatrix.appliance.kernel import default_cache_dir
from iomatrix.appliance.ownimage import (GUEST_MARKER, NETWORK_CONFIG, SEED_LABEL, ImageFile,
                                         check_overlay_space, inspect_image, make_overlay,
                                         overlay_worst_case,
                                         make_seed, parse_guest_line, system_argv, user_data,
                                         version_mismatch, windows_disk, windows_target)
from iomatrix.core.errors import EnvironmentProblem, NotEnoughSpace, SuiteError
from iomatrix.core.units import format_bytes
from iomatrix.fio.jobfile import _target_lines
from iomatrix.qemu.args import disk_backend
from iomatrix.suite.expand import expand
from iomatrix.suite.load import load_suite_text
from iomatrix.store import Store
from tests.conftest import BOOT_TIMEOUT, REPO, cli, cli_result, our_processes, write_suite
from tests.needs import lacking, need, needs


GUEST = """
[guest]
image = "{image}"
"""


def _suite(tmp_path: Path, body: str):  # type: ignore[no-untyped-def]
    text = (f'[suite]\nname = "t"\n[target]\ndirectory = "{tmp_path}"\nsize = "64MiB"\n'
            '[method]\nmode = "guest"\n' + body)
    return load_suite_text(text, source="t.toml")


def test_a_guest_image_adds_the_guest_axis_and_appliance_runs_keep_their_keys(tmp_path: Path) -> None:
    plain = expand(_suite(tmp_path, "[matrix]\ncontroller = 'virtio-blk'\n"))
    assert all(c.guest is None and "guest=" not in c.key for c in plain.configurations)
    own = _suite(tmp_path, "[matrix]\ncontroller = 'virtio-blk'\nguest = ['appliance', 'deb']\n"
                 + GUEST.format(image="/srv/deb.qcow2"))
    assert own.guest is not None and own.guest.label == "deb"
    keys = [c.key for c in expand(own).configurations]
    assert len(keys) == 2 and keys[0].endswith("guest=appliance") and keys[1].endswith("guest=deb")
    only = expand(_suite(tmp_path, GUEST.format(image="/srv/my image.v2.raw")))
    assert [c.guest for c in only.configurations] == ["my-image"]
    assert own.guest.ready_seconds("tcg") > own.guest.ready_seconds("kvm")


@pytest.mark.parametrize(("body", "says"), [
    ("[matrix]\nguest = ['other']\n" + GUEST.format(image="/srv/deb.qcow2"), "neither"),
    ("[matrix]\nguest = ['deb']\n", r"no \[guest\] table"),
    (GUEST.format(image="deb.qcow2"), "absolute path"),
    (GUEST.format(image="/srv/../etc/deb.qcow2"), "absolute path"),
    (GUEST.format(image="/srv/deb.qcow2") + 'initrd = "/srv/initrd"\n', "initrd goes with kernel"),
    ('platform = "libvirt"\nlibvirt_uri = "qemu:///system"\n' + GUEST.format(image="/srv/d.raw"),
     r"drop \[method\] libvirt_uri"),
])
def test_guest_tables_that_cannot_work_are_refused(tmp_path: Path, body: str, says: str) -> None:
    with pytest.raises(SuiteError, match=says):
        _suite(tmp_path, body)


def test_an_image_is_inspected_and_one_with_a_backing_file_refused(tmp_path: Path) -> None:
    base = tmp_path / "base.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(base), "64M"], check=True)
    link = tmp_path / "link.qcow2"
    link.symlink_to(base)
    found = inspect_image(link)
    assert (found.path, found.format, found.virtual_size) == (base, "qcow2", 64 << 20)
    child = tmp_path / "child.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", str(base),
                    str(child)], check=True)
    with pytest.raises(EnvironmentProblem, match="backing file"):
        inspect_image(child)
    with pytest.raises(EnvironmentProblem, match="not a regular file"):
        inspect_image(tmp_path)
    with pytest.raises(EnvironmentProblem, match="No such file"):
        inspect_image(tmp_path / "missing.raw")
    vmdk = tmp_path / "d.vmdk"
    subprocess.run(["qemu-img", "create", "-q", "-f", "vmdk", str(vmdk), "16M"], check=True)
    with pytest.raises(EnvironmentProblem, match="raw or qcow2"):
        inspect_image(vmdk)


def test_the_system_disk_is_an_overlay_over_the_read_only_image(tmp_path: Path) -> None:
    raw = tmp_path / "base.raw"
    raw.write_bytes(b"\x00" * (1 << 20))
    base = inspect_image(raw)
    overlay = tmp_path / "overlay.qcow2"
    make_overlay(base, overlay)
    info = json.loads(subprocess.run(["qemu-img", "info", "--output=json", str(overlay)],
                                     capture_output=True, text=True, check=True).stdout)
    assert info["virtual-size"] == 1 << 20 and "backing-filename" not in info
    argv = system_argv(base, overlay, None, bootloader=True, fd=9)
    assert argv[:2] == ["-add-fd", f"fd=9,set=1,opaque={raw}"]   # QEMU reads what was checked
    nodes = [json.loads(v) for k, v in zip(argv, argv[1:]) if k == "-blockdev"]
    by_name = {n["node-name"]: n for n in nodes}
    assert by_name["guestos-base-file"]["read-only"] and by_name["guestos-base"]["read-only"]
    assert by_name["guestos-base-file"]["filename"] == "/dev/fdset/1"
    assert by_name["guestos-root"]["backing"] == "guestos-base"
    assert not by_name["guestos-root-file"].get("read-only")
    assert "bootindex=0" in argv[-1]
    # readings of the disk under test skip the system disk, whatever QEMU lists first
    entries = [{"qdev": "/machine/peripheral/guestos-root/virtio-backend",
                "node-name": "guestos-root", "stats": {}},
               {"qdev": "/machine/peripheral/scsi0", "node-name": "drive-scsi0", "stats": {}}]
    assert disk_backend(entries) is entries[1]


@pytest.mark.slow
def test_overlays_that_may_outgrow_the_scratch_filesystem_are_refused_before_any_boot(
        tmp_path: Path) -> None:
    """An overlay's worst case is its image's virtual size (the guest rewriting its whole
    disk): the run refuses (exit 5, nothing stored) where its scratch filesystem cannot hold
    that for every guest booted at once, and --plan says the worst case."""
    huge = tmp_path / "huge.qcow2"                 # sparse: a few KiB of metadata
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(huge), "1P"], check=True)
    small = tmp_path / "small.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(small), "1M"], check=True)
    check_overlay_space(inspect_image(small), 4, tmp_path)
    with pytest.raises(NotEnoughSpace, match="4 overlay"):
        check_overlay_space(inspect_image(huge), 4, tmp_path)
    body = ("[matrix]\ncontroller = 'virtio-blk'\nvms = [1, 3]\n"
            '[workloads]\nrw = ["randread"]\nbs = ["4k"]\n'
            '[method]\nmode = "guest"\nruntime = "1s"\naccel = "tcg"\n'
            f'[guest]\nimage = "{huge}"\n')
    suite = str(write_suite(tmp_path, body))
    code, shown = cli("run", suite, "--plan")
    assert code == 0, shown
    each = overlay_worst_case(inspect_image(huge))
    assert each > 1 << 50
    assert (f"worst case (the whole disk rewritten) {format_bytes(each)} per guest, "
            f"{format_bytes(3 * each)} for the 3 guest(s) booted at once") in shown, shown
    if not guest_fio_status(default_cache_dir()).cached:
        return                                    # the run would stop at the guest fio first
    db = tmp_path / "r.db"
    done = cli_result("run", suite, "--db", str(db))
    assert done.returncode == 5, done.stderr
    errors = [line for line in done.stderr.splitlines()
              if line.startswith("iomatrix: ") and not line.startswith("iomatrix: hint:")]
    assert len(errors) == 1 and "3 overlay(s)" in errors[0], done.stderr
    with Store(db) as store:
        assert store.list_runs() == []


@needs("xorriso")
def test_the_seed_is_a_nocloud_iso_carrying_fio_and_the_script(tmp_path: Path) -> None:
    fio = tmp_path / "fio-binary"
    fio.write_bytes(b"\x7fELF not really fio")
    seed = make_seed(tmp_path, fio=fio, disk_size=64 << 20, port=8765)
    listing = subprocess.run(["xorriso", "-indev", str(seed), "-pvd_info", "-lsl", "/"],
                             capture_output=True, text=True, check=True)
    out = listing.stdout + listing.stderr
    assert f"Volume Id    : {SEED_LABEL}" in out
    for name in ("meta-data", "user-data", "network-config", "iomatrix.sh", "fio"):
        assert f"'{name}'" in out
    assert "-rwxr-xr-x" in next(line for line in out.splitlines() if "'fio'" in line)
    extracted = tmp_path / "x"
    subprocess.run(["xorriso", "-osirrox", "on", "-indev", str(seed), "-extract", "/",
                    str(extracted)], capture_output=True, check=True)
    assert (extracted / "fio").read_bytes() == fio.read_bytes()
    assert (extracted / "user-data").read_text() == user_data()
    assert (extracted / "network-config").read_text() == NETWORK_CONFIG
    script = (extracted / "iomatrix.sh").read_text()
    assert "@" not in script.replace("$@", "") and "67108864" in script and "8765" in script
    subprocess.run(["sh", "-n", str(extracted / "iomatrix.sh")], check=True)
    assert user_data().startswith("#cloud-config\nbootcmd:") or "bootcmd:" in user_data()


def test_the_guest_line_is_parsed() -> None:
    text = f'noise\r\n{GUEST_MARKER} kernel=6.1.0-56-amd64 os="Debian GNU/Linux 12 (bookworm)"\r\n'
    assert parse_guest_line(text) == {"guest.kernel": "6.1.0-56-amd64",
                                      "guest.os": "Debian GNU/Linux 12 (bookworm)"}
    assert parse_guest_line("nothing") == {}
    windows = f'{GUEST_MARKER} kernel=10.0.20348 os="Windows Server 2022" fio=fio-3.35\r\n'
    assert parse_guest_line(windows)["guest.fio"] == "fio-3.35"


def test_windows_disks_engine_and_job_lines() -> None:
    """Windows cannot be booted here: its disk naming, engine and job text are tested."""
    assert windows_disk("PhysicalDrive1") == "\\\\.\\PhysicalDrive1"
    for bad in ("PhysicalDrive1\\..\\x", "C:", "PhysicalDrive", "../PhysicalDrive1"):
        with pytest.raises(ValueError):
            windows_disk(bad)
    target = windows_target("PhysicalDrive2")
    assert target["ioengine"] == "windowsaio" and target["thread"] == "1"
    assert _target_lines(target)[-1] == "filename=\\\\.\\PhysicalDrive2"
    with pytest.raises(Exception, match="may not hold"):
        _target_lines({"filename": "\\\\.\\PhysicalDrive2\\x"})


def test_a_guest_fio_of_another_version_is_named_in_one_line() -> None:
    host = subprocess.run(["fio", "--version"], capture_output=True, text=True).stdout.strip()
    assert version_mismatch(host, host) is None
    line = version_mismatch(host, "fio-3.35")
    assert line is not None and "\n" not in line
    assert "fio-3.35" in line and host in line


@pytest.mark.parametrize(("platform", "version"), [("qemu", None), ("proxmox", 8), ("proxmox", 9),
                                                 ("libvirt", 9), ("libvirt", 11)])
def test_the_users_image_beside_each_platforms_disk_starts_in_qemu(
        tmp_path: Path, no_leftovers: None, platform: str, version: int | None) -> None:
    """A user's guest boots its own bootloader (no -kernel) from a read-only base under its
    overlay, with a seed, and the disk under test gets the platform's own graph exactly as an
    appliance guest's does: QEMU starts it, and what it applied to the disk is what the
    platform asks (the system disk's nodes are not read as the disk's)."""
    from iomatrix.core.proc import managed, read_text, wait_for
    from iomatrix.drivers.guest import free_port
    from iomatrix.platform import libvirt as lv
    from iomatrix.qemu.args import (GuestSpec, expected_guest_settings, guest_argv,
                                    read_guest_settings)
    from iomatrix.qemu.qmp import qmp_execute
    from iomatrix.suite.configuration import Configuration
    from iomatrix.targets.workspace import Image

    base = tmp_path / "base.raw"
    base.write_bytes(b"\0" * (1 << 20))
    image = ImageFile(base)
    own, fd = image.base, image.descriptor()
    overlay, seed, disk = tmp_path / "overlay.qcow2", tmp_path / "seed.iso", tmp_path / "d.raw"
    make_overlay(own, overlay)
    seed.write_bytes(b"\0" * (1 << 20))
    disk.write_bytes(b"\0" * (32 << 20))
    libvirt = None
    if platform == "libvirt":
        libvirt = lv.Versions(libvirt=(version, 3 if version == 11 else 0, 0),
                              qemu=(10, 0, 0) if version == 11 else (7, 2, 0))
    config = Configuration(mode="guest", controller="virtio-scsi-single", aio="io_uring",
                           cache="none", format="raw", preallocation="off", iothread=True)
    spec = GuestSpec(config=config, image=Image(path=disk, format="raw", preallocation="off",
                                                size=32 << 20),
                     kernel=None, initrd=None, append="", accel="tcg", vcpus=1,
                     memory_bytes=128 << 20, qmp_socket=tmp_path / "q.sock",
                     serial_log=tmp_path / "serial.log", host_port=free_port(), name="t",
                     platform=platform, pve_version=version if platform == "proxmox" else None,
                     libvirt=libvirt,
                     system=tuple(system_argv(own, overlay, seed, bootloader=True, fd=fd)))
    argv = guest_argv(spec)
    assert "-kernel" not in argv and "restrict=on" in " ".join(argv)
    log = tmp_path / "qemu.log"
    with image, managed(argv + ["-S"], log=log, pass_fds=(fd,)) as proc:
        assert wait_for(lambda: proc.poll() is not None or spec.qmp_socket.exists(),
                        timeout=30) and proc.poll() is None, read_text(log)
        seen = read_guest_settings(spec.qmp_socket)
        nodes = {n["node-name"]: n for n in qmp_execute(spec.qmp_socket,
                                                        [("query-named-block-nodes", None)])[0]}
    os.close(fd)
    assert seen == expected_guest_settings(config, vcpus=1, platform=platform,  # type: ignore[arg-type]
                                           pve_version=spec.pve_version, libvirt=libvirt)
    assert nodes["guestos-base"]["ro"] and nodes["guestos-seed"]["ro"]
    assert not nodes["guestos-root"]["ro"] and nodes["guestos-root"]["backing_file_depth"] == 1


def test_show_effect_and_compare_read_the_guest_axis(tmp_path: Path) -> None:
    """A run with the appliance and the user's guest on two controllers (synthetic figures:
    the user's guest 40 % below): show names each guest, effect --axis guest measures it
    against the appliance, and compare pairs an appliance run with a user's-guest run by
    --match."""
    from iomatrix.suite.configuration import Configuration
    from iomatrix.suite.workloads import Workload
    from iomatrix.testing.synthetic import Figures, configurations, write_run

    def figures(config: Configuration, workload: Workload, index: int) -> Figures:
        iops = 20_000 * (0.6 if config.guest == "debian12" else 1.0) * (1 + 0.01 * index)
        return Figures(iops=iops, bw_bytes=iops * 4096, lat_mean_ns=8e9 / iops, p99_ns=2e6)

    workloads = [Workload(rw="randread", bs=4096, iodepth=8)]
    db = str(tmp_path / "r.db")
    with Store(db) as store:
        for guests in (["appliance", "debian12"], ["appliance"], ["debian12"]):
            write_run(store, configurations("guest", {"controller": ["virtio-blk", "virtio-scsi"],
                                                      "guest": guests}),
                      workloads, figures, accelerator="tcg")
    code, shown = cli("show", "1", "--db", db)
    assert code == 0, shown
    for label in ("guest virtio-blk in appliance", "guest virtio-scsi in debian12"):
        assert label in shown
    code, effect = cli("effect", "1", "--axis", "guest", "--db", db)
    assert code == 0, effect
    assert "each level against guest=appliance" in effect
    assert re.search(r"^ *debian12 .*−40\.0%.* worse *$", effect, re.M), effect
    pairs = [f"guest {c} in appliance=guest {c} in debian12" for c in ("virtio-blk", "virtio-scsi")]
    code, compared = cli("compare", "2", "3", "--db", db, "--match", pairs[0], "--match", pairs[1])
    assert code == 0, compared
    assert "2 points: 0 significantly better in B, 2 significantly worse" in compared


# --- a real Debian 12 guest under TCG --------------------------------------------------------

DEBIAN_BOOTS = pytest.mark.timeout(1500)
"""Each boot of the Debian image under TCG may take its ready timeout (600 s) on a loaded host
(over 160 s of guest uptime at a load of 13); the tests below boot it once or twice in turn."""

@pytest.fixture(scope="session")
def debian12():  # type: ignore[no-untyped-def]
    need("mmdebstrap")
    need("xorriso")
    from iomatrix.appliance.guestfio import guest_fio
    from iomatrix.core.errors import FioSourceUnavailable
    from iomatrix.appliance.kernel import default_cache_dir
    from iomatrix.testing.debianimage import debian_image

    try:   # the seed carries the guests' static fio; an archive with no source for this fio
        guest_fio(default_cache_dir())   # (Debian 13's 3.39-1 today) cannot give one
    except FioSourceUnavailable as e:
        lacking("guest-fio", f"the guests' fio cannot be built here: {e}")

    return debian_image()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _own_body(image, *, kernel: bool, controller: str, iodepth: str,
              vms: int = 1) -> str:  # type: ignore[no-untyped-def]
    boot = (f'kernel = "{image.kernel}"\ninitrd = "{image.initrd}"\nappend = "{image.append}"\n'
            if kernel else "")
    return (f"[matrix]\ncontroller = '{controller}'\niothread = false\n"
            "guest = ['appliance', 'debian12']\n"
            f'[workloads]\nrw = ["randread"]\nbs = ["4k"]\niodepth = {iodepth}\n'
            f'[method]\nmode = "guest"\nramp = "0.5s"\nruntime = "1s"\naccel = "tcg"\nvms = {vms}\n' + BOOT_TIMEOUT +
            f'[guest]\nname = "debian12"\nimage = "{image.image}"\n' + boot)


def _stored(db: Path) -> dict[str, int]:
    """Trials stored so far per configuration key, read while iomatrix writes (WAL)."""
    if not db.exists():
        return {}
    import sqlite3

    with contextlib.closing(sqlite3.connect(db, timeout=10)) as conn:
        try:
            rows = conn.execute("SELECT c.key, COUNT(*) FROM trials t JOIN configurations c "
                                "ON c.id = t.configuration_id GROUP BY c.key").fetchall()
        except sqlite3.OperationalError:          # not migrated yet
            return {}
    return dict(rows)


def _seed_with_debian(body: str, tmp_path: Path, position: int) -> int:
    """A plan seed whose block at ``position`` (0 or -1) is the Debian guest's."""
    from iomatrix.suite.plan import plan

    expansion = expand(load_suite_text(f'[suite]\nname = "t"\n[target]\ndirectory = '
                                       f'"{tmp_path}"\nsize = "64MiB"\n' + body, source="t"))
    return next(seed for seed in range(1, 100)
                if plan(expansion, 1, seed)[position].config.guest == "debian12")


def _beside_the_appliance(trials, controller: str, driver: str, vms: int = 1):  # type: ignore[no-untyped-def]
    """The Debian guest's trial and the appliance's on ``controller``, each ok and seeing the
    disk under test (not its system disk) through ``driver``."""
    assert all(t.status == "ok" for t in trials), [t.reason for t in trials]
    seen = {t.config_key: t for t in trials}
    key = (f"guest/controller={controller}/aio=io_uring/iothread=off/cache=none/format=raw/"
           f"preallocation=off/vms={vms}/guest=")
    own, appliance = seen[key + "debian12"], seen[key + "appliance"]
    assert own.applied["guest.os"].startswith("Debian GNU/Linux 12")
    assert own.applied["guest.driver"] == appliance.applied["guest.driver"] == driver
    assert appliance.applied["guest.os"] == "appliance"
    assert own.applied["guest.fio"].startswith("fio-")          # the seed's fio, as it says
    assert own.applied["device.type"] == appliance.applied["device.type"]
    return own, appliance


@pytest.mark.slow
@DEBIAN_BOOTS
def test_a_debian_12_cloud_image_boots_through_grub_beside_the_appliance_and_kill_9_leaves_nothing(
        tmp_path: Path, no_leftovers: None, debian12) -> None:  # type: ignore[no-untyped-def]
    """One run serves both checks: the image boots through SeaBIOS and its own GRUB (no kernel
    given) on virtio-scsi beside the appliance, and the run is killed with SIGKILL in the
    Debian guest's second trial, once both configurations have stored one; the image's hash
    is unchanged, and clean leaves no overlay or seed."""
    before = _sha256(debian12.image)
    body = _own_body(debian12, kernel=False, controller="virtio-scsi", iodepth="[1, 8]")
    suite = write_suite(tmp_path, body)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "iomatrix", "run", str(suite), "--db", "r.db",
                             "--seed", str(_seed_with_debian(body, tmp_path, -1))],
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env=env)
    try:
        deadline = time.monotonic() + 1400
        while not (len(_stored(tmp_path / "r.db")) == 2 and list(tmp_path.rglob("overlay.qcow2"))
                   and list(tmp_path.rglob("seed.iso"))
                   and [p for p in our_processes(str(tmp_path)) if "qemu-system" in p]):
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:] if proc.stderr else ""
            assert time.monotonic() < deadline, _stored(tmp_path / "r.db")
            time.sleep(0.2)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()
    deadline = time.monotonic() + 30
    while our_processes(str(tmp_path)):                    # QEMU, and fio's client too
        assert time.monotonic() < deadline, our_processes(str(tmp_path))
        time.sleep(0.2)
    assert _sha256(debian12.image) == before
    with Store(tmp_path / "r.db") as store:
        own, appliance = _beside_the_appliance(store.load_run(1).trials, "virtio-scsi", "sd")
    assert "-kernel" not in own.command and "bootindex=0" in own.command
    assert "-kernel" in appliance.command
    clean = subprocess.run([sys.executable, "-m", "iomatrix", "clean", "--db", "r.db"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    assert clean.returncode == 0, clean.stderr
    assert not list(tmp_path.rglob("overlay.qcow2")) and not list(tmp_path.rglob("seed.iso"))


@pytest.mark.slow
@DEBIAN_BOOTS
def test_two_guests_of_the_image_boot_the_kernel_given_beside_the_appliance(
        tmp_path: Path, no_leftovers: None, debian12) -> None:  # type: ignore[no-untyped-def]
    """``kernel``/``initrd``/``append`` boot the image's kernel directly; with vms = 2 each
    guest has its own overlay and seed, and fio measures both, on virtio-blk beside the
    appliance. The Debian guests go first, so they precondition the disks: their udev does
    not probe the disks again in the trial after that write (the foreign-I/O check would
    fail it)."""
    body = _own_body(debian12, kernel=True, controller="virtio-blk", iodepth="[8]", vms=2)
    suite = write_suite(tmp_path, body)
    done = subprocess.run([sys.executable, "-m", "iomatrix", "run", str(suite), "--db", "r.db",
                           "--seed", str(_seed_with_debian(body, tmp_path, 0))],
                          cwd=tmp_path, capture_output=True, text=True, timeout=1400,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    said = done.stdout + done.stderr
    assert "×2 VMs in debian12" in said.split("note: preconditioning")[1].splitlines()[0], said
    with Store(tmp_path / "r.db") as store:
        own, appliance = _beside_the_appliance(store.load_run(1).trials, "virtio-blk",
                                               "virtio_blk", vms=2)
    lines = own.command.splitlines()
    assert len(lines) == 2 and all(f"-kernel {debian12.kernel}" in line for line in lines)
    overlays = {line.split("guestos-root-file")[0].rsplit('"filename":"', 1)[1].split('"')[0]
                for line in lines}
    assert len(overlays) == 2                     # one overlay each
    for trial in (own, appliance):
        assert sorted(v.vm for v in trial.vm_samples) == [0, 1]
        assert all(v.iops > 0 for v in trial.vm_samples)
    assert not list(tmp_path.rglob("overlay.qcow2")) and not list(tmp_path.rglob("seed.iso"))
