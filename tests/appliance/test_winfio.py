"""The Windows guest's bundle: fio.exe cross-built with mingw-w64 from the host fio's Debian
source (once per machine, in the user's cache: the session fixture ``windows_bundle``), run
under Debian's Wine: a windowsaio job whose JSON iomatrix parses, and ``fio.exe --server``
driven by the host's fio client through iomatrix's own ``run_fio``; the seed ISO's layout and
start-up script, checked as files (booting Windows is out of reach here: no image, no KVM).
Whether two builds give the same bytes is ``bench/winfio_build.py``'s (a second build costs a
minute)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from iomatrix.appliance.kernel import default_cache_dir
from iomatrix.appliance.ownimage import GUEST_MARKER, parse_guest_line, version_mismatch
from iomatrix.appliance.protocol import (DISK_MARKER, ERROR_MARKER, GUEST_FIO_PORT, GUEST_IP,
                                         READY_MARKER, parse_disk_lines)
from iomatrix.appliance.winfio import PE_AMD64, WindowsFio, pe_machine, windows_fio
from iomatrix.appliance.winseed import (INSTALL_SCRIPT, SEED_LABEL, START_SCRIPT,
                                        make_windows_seed)
from iomatrix.core.proc import managed, require, run, wait_for
from iomatrix.drivers.guest import free_port
from iomatrix.fio.depth import achieved_depth
from iomatrix.fio.parse import parse_fio_output
from iomatrix.fio.run import run_fio
from tests.needs import needs

HOST_FIO = run([require("fio"), "--version"], timeout=30).stdout.strip() if \
    subprocess.run(["sh", "-c", "command -v fio"], capture_output=True).returncode == 0 else ""


@pytest.fixture(scope="module")
def wine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The environment of a Wine prefix of this module's own (made by its first program);
    its wineserver is stopped at the end (``wineserver -k`` of this prefix only)."""
    prefix = tmp_path_factory.mktemp("wineprefix")
    env = {**os.environ, "WINEPREFIX": str(prefix), "WINEDEBUG": "-all",
           "WINEDLLOVERRIDES": "mscoree,mshtml="}       # no Mono or Gecko installer at start
    yield env
    subprocess.run(["wineserver", "-k"], env=env, capture_output=True, timeout=60)


def test_fio_exe_is_the_hosts_version_for_windows_and_cached(
        windows_bundle: WindowsFio) -> None:
    data = windows_bundle.exe.read_bytes()
    assert pe_machine(data) == PE_AMD64
    assert windows_bundle.version == HOST_FIO
    package = run(["dpkg-query", "-W", "-f", "${source:Package} ${source:Version}", "fio"],
                  timeout=30).stdout
    assert windows_bundle.source == package
    manifest = json.loads((windows_bundle.directory / "manifest.json").read_text())
    assert manifest["files"]["fio.exe"] == hashlib.sha256(data).hexdigest() == windows_bundle.sha256
    assert set(manifest["files"]) == {p.name for p in windows_bundle.files}
    # the PE header's time stamp is the Debian changelog's date (SOURCE_DATE_EPOCH), not now
    offset = int.from_bytes(data[0x3C:0x40], "little")
    assert int.from_bytes(data[offset + 8:offset + 12], "little") == \
        windows_bundle.source_date_epoch
    start = time.monotonic()
    again = windows_fio(default_cache_dir())
    assert again.cached and again.sha256 == windows_bundle.sha256
    assert time.monotonic() - start < max(windows_bundle.build_seconds / 10, 0.5)


@pytest.mark.slow
@needs("wine", "fio")
def test_windowsaio_job_and_server_under_wine(windows_bundle: WindowsFio, wine: dict[str, str],
                                              tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """One Wine prefix: fio.exe runs a windowsaio job on a file and prints JSON that iomatrix
    parses, with the depth it achieved; then ``fio.exe --server`` runs a job that the host's
    fio client sends through ``run_fio``."""
    monkeypatch.chdir(tmp_path)          # Wine's Z: maps it: fio's relative file names land here
    job = ("[w]\nioengine=windowsaio\nthread=1\ndirect=1\nfilename=wine-disk.dat\nsize=8m\n"
           "rw=randread\nbs=4k\niodepth=4\ntime_based=1\nruntime=1\n")
    (tmp_path / "job.fio").write_text(job)
    out = run(["wine", str(windows_bundle.exe), "--output-format=json", "job.fio"],
              timeout=300, env=wine).stdout
    result = parse_fio_output(out)
    assert result.fio_version == HOST_FIO
    assert result.jobs[0].read.total_ios > 0 and result.jobs[0].error == 0
    assert json.loads(out[out.index("{"):])["jobs"][0]["job options"]["ioengine"] == "windowsaio"
    depth = achieved_depth(result, 4)
    assert depth.achieved is not None and 1 <= depth.achieved <= 4
    assert sum(share for _, share in result.jobs[0].depth_levels) > 99

    port = free_port()
    with managed(["wine", str(windows_bundle.exe), f"--server=ip:127.0.0.1,{port}"],
                 log=tmp_path / "server.log", env=wine):
        assert wait_for(lambda: f":{port:04X} 00000000:0000 0A" in
                        Path("/proc/net/tcp").read_text(), timeout=120, interval=0.2)
        served = run_fio(job.replace("wine-disk", "served"), workdir=tmp_path, timeout=120,
                         clients=[f"ip:127.0.0.1,{port}"])
    job_stats = served.result.jobs[0]
    assert served.result.fio_version == HOST_FIO
    assert job_stats.read.total_ios > 0 and job_stats.hostname     # the server's own report
    assert (tmp_path / "served.dat").stat().st_size == 8 << 20       # written by fio.exe
    assert achieved_depth(served.result, 4).achieved is not None


def test_windows_seed_layout_and_script(windows_bundle: WindowsFio, tmp_path: Path) -> None:
    size = 3 << 30
    seed = make_windows_seed(tmp_path, fio=windows_bundle, disk_size=size, port=GUEST_FIO_PORT)
    listing = run([require("xorriso"), "-indev", str(seed), "-find", "/", "-type", "f"],
                  timeout=60).stdout
    names = sorted(line.strip().strip("'").lstrip("/") for line in listing.splitlines()
                   if line.strip())
    assert names == sorted(["fio.exe", *windows_bundle.dlls, INSTALL_SCRIPT, START_SCRIPT])
    volid = run([require("xorriso"), "-indev", str(seed), "-pvd_info"], timeout=60).stdout
    assert re.search(rf"^Volume Id\s*:\s*{SEED_LABEL}$", volid, re.M)
    extracted = tmp_path / "x"
    run([require("xorriso"), "-osirrox", "on", "-indev", str(seed), "-extract", "/",
         str(extracted)], timeout=60)
    assert (extracted / "fio.exe").read_bytes() == windows_bundle.exe.read_bytes()
    start = (extracted / START_SCRIPT).read_bytes()
    assert b"\r\n" in start and b"\n" not in start.replace(b"\r\n", b"")   # Windows line ends
    text = start.decode()
    assert "@" not in re.sub(r"@\(|@'|'@", "", text)                      # no placeholder left
    for needed in (GUEST_MARKER, DISK_MARKER, READY_MARKER, ERROR_MARKER, GUEST_IP,
                   f"--server=ip:0.0.0.0,{GUEST_FIO_PORT}", f"[int64]'{size}'", "COM1"):
        assert needed in text, needed
    # the lines it writes are the ones the host parses: render one as PowerShell's -f would
    disk = re.search(r"Say \('(" + DISK_MARKER + r"[^']*)'", text)
    assert disk is not None
    line = disk[1].replace("{0}", "1").replace("{1}", str(size)).replace("{2}", "scsi")
    parsed = parse_disk_lines(line + "\n")
    assert [(d.name, d.size_bytes, d.driver) for d in parsed] == [("PhysicalDrive1", size, "scsi")]
    guest = re.search(r"Say \('(" + GUEST_MARKER + r"[^']*)'", text)
    assert guest is not None
    said = parse_guest_line(guest[1].replace("{0}", "10.0.20348").replace(
        "{1}", "Microsoft Windows Server 2022").replace("{2}", HOST_FIO))
    assert said["guest.fio"] == HOST_FIO and version_mismatch(HOST_FIO, said["guest.fio"]) is None
    install = (extracted / INSTALL_SCRIPT).read_text()
    for needed in ("Register-ScheduledTask", "-AtStartup", "'SYSTEM'", f"-LocalPort {GUEST_FIO_PORT}",
                   f"-FileSystemLabel '{SEED_LABEL}'", START_SCRIPT):
        assert needed in install, needed


def test_the_install_seed_holds_no_start_script(windows_bundle: WindowsFio,
                                               tmp_path: Path) -> None:
    """``iomatrix appliance windows-seed``: fio.exe and install.ps1 only, so the VM it is
    attached to for the install boots without starting anything; an existing file is kept."""
    from tests.conftest import cli

    status, output = cli("appliance", "windows-seed", str(tmp_path / "install.iso"))
    assert status == 0, output
    listing = run([require("xorriso"), "-indev", str(tmp_path / "install.iso"), "-find", "/",
                   "-type", "f"], timeout=60).stdout
    assert sorted(line.strip().strip("'").lstrip("/") for line in listing.splitlines()
                  if line.strip()) == sorted(["fio.exe", *windows_bundle.dlls, INSTALL_SCRIPT])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["install.iso"]    # nothing left over
    status, output = cli("appliance", "windows-seed", str(tmp_path / "install.iso"))
    assert status != 0 and "exists" in output


@pytest.mark.slow       # 2-7 s: `run --plan` and a seed ISO, one check each
@needs("qemu", "xorriso")
def test_the_windows_kind_boots_its_image_with_a_seed_cd_of_the_disks_size(
        windows_bundle: WindowsFio, tmp_path: Path) -> None:
    """The kind a [guest] os = "windows" table gets: the image through an overlay, booted by
    the firmware, and each boot's seed as an IDE/AHCI CD whose script looks for the disk under
    test's size; both removed with the session."""
    import contextlib

    from iomatrix.drivers.guest.kinds import suite_kinds
    from iomatrix.drivers.guest.windows import WindowsGuest
    from iomatrix.suite.load import load_suite_text
    from iomatrix.targets.kind import Image
    from tests.conftest import cli

    image = tmp_path / "win.qcow2"
    run([require("qemu-img"), "create", "-f", "qcow2", str(image), "64M"], timeout=60)
    text = (f'[suite]\nname = "w"\n[target]\ndirectory = "{tmp_path}"\nsize = "64MiB"\n'
            f'[method]\nmode = "guest"\n[guest]\nimage = "{image}"\nos = "windows"\n')
    (tmp_path / "w.toml").write_text(text)
    status, plan = cli("run", "--plan", str(tmp_path / "w.toml"), cwd=tmp_path)
    assert status == 0, plan                        # the plan says fio.exe is there, built
    assert (f"the Windows guest's fio.exe: {HOST_FIO}, cross-built from the Debian source "
            f"{windows_bundle.source} (cached)") in plan
    suite = load_suite_text(text, source="w.toml")
    kind = suite_kinds(suite)[1]
    assert isinstance(kind, WindowsGuest)
    kind.open()
    kind.windows = windows_bundle
    run_dir = tmp_path / "vm0"
    run_dir.mkdir()
    size = 3 << 30
    with contextlib.ExitStack() as stack:
        assert kind.image is not None
        stack.callback(kind.image.close)
        boot = kind.boot(stack, run_dir, Image(path=tmp_path / "disk.raw", format="raw",
                                               preallocation="off", size=size), None)  # type: ignore[arg-type]
        assert (boot.kernel, boot.initrd) == (None, None) and len(boot.fds) == 1
        argv = " ".join(boot.system)
        assert "ide-cd,id=guestos-seed,drive=guestos-seed" in argv
        assert "virtio-blk-pci,id=guestos-root,drive=guestos-root,bootindex=0" in argv
        script = run([require("xorriso"), "-osirrox", "on", "-indev",
                      str(run_dir / "seed" / "seed.iso"), "-extract", f"/{START_SCRIPT}",
                      str(tmp_path / START_SCRIPT)], timeout=60)
        assert script.returncode == 0
        assert f"[int64]'{size}'" in (tmp_path / START_SCRIPT).read_text()
    assert not (run_dir / "seed").exists() and not (run_dir / "overlay.qcow2").exists()
