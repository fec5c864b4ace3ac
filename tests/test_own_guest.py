"""[guest] image: the user's own image as the guest (iomatrix.appliance.ownimage, the guest
driver's own-image path). The fast tests use real qemu-img and xorriso; the slow ones boot a
real Debian 12 image (iomatrix.testing.debianimage, built once into the cache: ~3 min) under TCG
beside the appliance."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from iomatrix.appliance.ownimage import (GUEST_MARKER, NETWORK_CONFIG, SEED_LABEL, inspect_image,
                                         make_overlay, make_seed, parse_guest_line,
                                         system_argv, user_data, version_mismatch, windows_disk,
                                         windows_target)
from iomatrix.core.errors import EnvironmentProblem, SuiteError
from iomatrix.core.proc import which
from iomatrix.fio.jobfile import _target_lines
from iomatrix.qemu.args import disk_backend
from iomatrix.suite.expand import expand
from iomatrix.suite.load import load_suite_text
from tests.conftest import REPO, our_processes, write_suite

HAVE_XORRISO = which("xorriso") is not None

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
    argv = system_argv(base, overlay, None, bootloader=True)
    nodes = [json.loads(v) for k, v in zip(argv, argv[1:]) if k == "-blockdev"]
    by_name = {n["node-name"]: n for n in nodes}
    assert by_name["guestos-base-file"]["read-only"] and by_name["guestos-base"]["read-only"]
    assert by_name["guestos-root"]["backing"] == "guestos-base"
    assert not by_name["guestos-root-file"].get("read-only")
    assert "bootindex=0" in argv[-1]
    # readings of the disk under test skip the system disk, whatever QEMU lists first
    entries = [{"qdev": "/machine/peripheral/guestos-root/virtio-backend",
                "node-name": "guestos-root", "stats": {}},
               {"qdev": "/machine/peripheral/scsi0", "node-name": "drive-scsi0", "stats": {}}]
    assert disk_backend(entries) is entries[1]


@pytest.mark.skipif(not HAVE_XORRISO, reason="xorriso is not installed (./setup.sh installs it)")
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


# --- a real Debian 12 guest under TCG --------------------------------------------------------

@pytest.fixture(scope="session")
def debian12():  # type: ignore[no-untyped-def]
    if which("mmdebstrap") is None or not HAVE_XORRISO:
        pytest.skip("mmdebstrap and xorriso are needed (./setup.sh --dev installs them)")
    from iomatrix.appliance.guestfio import guest_fio
    from iomatrix.core.errors import FioSourceUnavailable
    from iomatrix.appliance.kernel import default_cache_dir
    from iomatrix.testing.debianimage import debian_image

    try:   # the seed carries the guests' static fio; an archive with no source for this fio
        guest_fio(default_cache_dir())   # (Debian 13's 3.39-1 today) cannot give one
    except FioSourceUnavailable as e:
        pytest.skip(f"the guests' fio cannot be built here: {e}")

    return debian_image()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _own_body(image) -> str:  # type: ignore[no-untyped-def]
    return ("[matrix]\ncontroller = ['virtio-blk', 'virtio-scsi']\niothread = false\n"
            "guest = ['appliance', 'debian12']\n"
            '[workloads]\nrw = ["randread"]\nbs = ["4k"]\niodepth = [8]\n'
            '[method]\nmode = "guest"\nramp = "1s"\nruntime = "3s"\naccel = "tcg"\n'
            f'[guest]\nname = "debian12"\nimage = "{image.image}"\nkernel = "{image.kernel}"\n'
            f'initrd = "{image.initrd}"\n')


@pytest.mark.slow
def test_a_debian_12_guest_measures_beside_the_appliance_and_its_image_is_untouched(
        tmp_path: Path, no_leftovers: None, debian12) -> None:  # type: ignore[no-untyped-def]
    from iomatrix.store import Store

    before = _sha256(debian12.image)
    suite = write_suite(tmp_path, _own_body(debian12))
    done = subprocess.run([sys.executable, "-m", "iomatrix", "run", str(suite), "--db", "r.db",
                           "--seed", "1"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=1800, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert _sha256(debian12.image) == before
    with Store(tmp_path / "r.db") as store:
        trials = store.load_run(1).trials
    assert sorted(t.status for t in trials) == ["ok"] * 4, [t.reason for t in trials]
    seen = {t.config_key: t.applied for t in trials}
    for controller, driver in (("virtio-blk", "virtio_blk"), ("virtio-scsi", "sd")):
        own = seen[f"guest/controller={controller}/aio=io_uring/iothread=off/cache=none/"
                   "format=raw/preallocation=off/vms=1/guest=debian12"]
        appliance = seen[f"guest/controller={controller}/aio=io_uring/iothread=off/"
                         "cache=none/format=raw/preallocation=off/vms=1/guest=appliance"]
        assert own["guest.os"].startswith("Debian GNU/Linux 12") and own["guest.driver"] == driver
        assert appliance["guest.os"] == "appliance" and appliance["guest.driver"] == driver
        assert own["guest.fio"].startswith("fio-")          # the seed's fio, as it says
        assert own["device.type"] == appliance["device.type"]     # the disk, not the system disk
    assert not list(tmp_path.rglob("overlay.qcow2")) and not list(tmp_path.rglob("seed.iso"))


@pytest.mark.slow
def test_kill_9_leaves_no_overlay_seed_or_qemu(tmp_path: Path, no_leftovers: None,
                                              debian12) -> None:  # type: ignore[no-untyped-def]
    body = _own_body(debian12).replace("guest = ['appliance', 'debian12']", "guest = 'debian12'")
    suite = write_suite(tmp_path, body)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "iomatrix", "run", str(suite), "--db", "r.db"],
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=env)
    try:
        deadline = time.monotonic() + 300
        while not (list(tmp_path.rglob("overlay.qcow2")) and list(tmp_path.rglob("seed.iso"))
                   and [p for p in our_processes(str(tmp_path)) if "qemu-system" in p]):
            assert proc.poll() is None, "iomatrix exited before the guest started"
            assert time.monotonic() < deadline, "the guest never started"
            time.sleep(0.2)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + 30
    while [p for p in our_processes(str(tmp_path)) if "qemu" in p]:
        assert time.monotonic() < deadline, our_processes(str(tmp_path))
        time.sleep(0.2)
    clean = subprocess.run([sys.executable, "-m", "iomatrix", "clean", "--db", "r.db"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    assert clean.returncode == 0, clean.stderr
    assert not list(tmp_path.rglob("overlay.qcow2")) and not list(tmp_path.rglob("seed.iso"))
