"""Issue 34: ``[target] btrfs``, a subvolume of iomatrix's own per run, on a real btrfs made on a
loop device over a file in the test's directory and mounted there: host, blocklayer and guest
(TCG) modes in one run, the subvolume deleted after; nocow's attribute on it and its images; a
path not on btrfs and too little space refused in one line; kill -9, then `iomatrix clean`
deletes the subvolume and nothing else."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from iomatrix.cli.status import ExitStatus
from iomatrix.core.mounts import mount_of
from iomatrix.platform.proxmox import parse_storage_cfg
from iomatrix.store import Store
from iomatrix.suite import load_suite_text
from iomatrix.suite.target import Target
from iomatrix.targets.btrfs import BtrfsKind, BtrfsWorkspace, nocow
from iomatrix.targets.kind import Probe
from iomatrix.targets.network import resolve_storage
from tests.conftest import TCG_GUEST, cli_result, fio_runs
from tests.needs import lacking


def _scratch_in(tmp_path: Path) -> dict[str, str]:
    """A run's environment with its scratch directory (fio's job file) under ``tmp_path``."""
    return dict(os.environ, TMPDIR=str(tmp_path))


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


@pytest.fixture
def btrfs(tmp_path: Path) -> Iterator[Path]:
    """A 256 MiB btrfs on a loop device over a file in tmp_path, mounted at tmp_path/btrfs;
    unmounted and detached afterwards."""
    if os.geteuid() != 0 or not Path("/dev/loop-control").exists():
        lacking("loop", "loop devices and mounting need root")
    if shutil.which("mkfs.btrfs") is None or shutil.which("btrfs") is None:
        lacking("loop", "btrfs-progs is not installed (setup.sh installs it)")
    image, mnt = tmp_path / "btrfs.img", tmp_path / "btrfs"
    with open(image, "wb") as f:
        f.truncate(256 << 20)
    made = _run("mkfs.btrfs", "-q", str(image))
    assert made.returncode == 0, made.stderr
    attached = _run("losetup", "--find", "--show", str(image))
    if attached.returncode != 0:
        lacking("loop", f"no loop device here: {attached.stderr.strip()}")
    device = attached.stdout.strip()
    mnt.mkdir()
    try:
        mounted = _run("mount", "-t", "btrfs", device, str(mnt))
        assert mounted.returncode == 0, mounted.stderr
        yield mnt
    finally:
        for _ in range(50):                   # a subvolume just deleted can keep it busy
            if _run("umount", str(mnt)).returncode == 0 or not os.path.ismount(mnt):
                break
            time.sleep(0.2)
        _run("losetup", "-d", device)
    deadline = time.monotonic() + 30          # the kernel lets go of it a moment later
    while str(image) in _run("losetup", "-a").stdout and time.monotonic() < deadline:
        time.sleep(0.2)
    assert str(image) not in _run("losetup", "-a").stdout and not os.path.ismount(mnt)


def subvolumes(mnt: Path) -> list[str]:
    listed = _run("btrfs", "subvolume", "list", "-o", str(mnt))
    assert listed.returncode == 0, listed.stderr
    return [line.split(" path ")[-1] for line in listed.stdout.splitlines()]


def btrfs_suite(tmp_path: Path, path: Path, *, size: str = "16MiB", nocow: bool = False,
                body: str = "", name: str = "btrfs-test") -> Path:
    suite = tmp_path / f"{name}.toml"
    suite.write_text(f'[suite]\nname = "{name}"\n[target]\nsize = "{size}"\n'
                     f'btrfs = {{ path = "{path}", nocow = {str(nocow).lower()} }}\n'
                     + (body or HOST.format(runtime="500ms")))
    return suite


HOST = """
[method]
mode = "host"
samples = 1
ramp = 0
runtime = "{runtime}"
[[workloads]]
iodepth = 2
rw = "randwrite"
bs = "4k"
"""


THREE_MODES = """
[matrix]
cache = "none"
iothread = false
controller = "virtio-blk"
[[part]]
mode = "blocklayer"
[[workloads]]
rw = "randread"
bs = "4k"
iodepth = 4
[method]
mode = "guest"
baseline = true
runtime = "500ms"
ramp = 0
samples = 1
""" + TCG_GUEST


@pytest.mark.slow
def test_host_blocklayer_and_guest_on_a_subvolume(tmp_path: Path, btrfs: Path) -> None:
    """One run measures every mode on the subvolume iomatrix made (the run's host record says
    btrfs, recommend's storage type is btrfs), and the subvolume is gone after; what was in the
    path before stays."""
    (btrfs / "theirs").mkdir()
    suite = btrfs_suite(tmp_path, btrfs, body=THREE_MODES)
    db = tmp_path / "r.db"
    done = cli_result("run", str(suite), "--db", str(db), cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    with Store(db, readonly=True) as store:
        stored = store.load_run(1)
    modes = {c.key.split("/")[0] for c in stored.configs}
    assert modes == {"host", "blocklayer", "guest"}, modes
    assert len(stored.trials) == 3 and all(t.status == "ok" for t in stored.trials)
    assert stored.host["target_fs"] == "btrfs" and stored.host["target"].startswith(
        f"btrfs subvolume {btrfs}")
    assert any("without nocow" in n for n in stored.notes), stored.notes
    assert subvolumes(btrfs) == [] and sorted(os.listdir(btrfs)) == ["theirs"]
    advice = cli_result("recommend", "1", "--for", "proxmox", "--db", str(db), cwd=tmp_path)
    assert advice.returncode == 0 and "(storage type btrfs)" in advice.stdout, advice.stdout


@pytest.mark.parametrize("cow", [True, False])
def test_nocow_sets_the_attribute_before_the_images(tmp_path: Path, btrfs: Path,
                                                    cow: bool) -> None:
    """With nocow the subvolume and each image made in it carry No_COW (lsattr's C, read by
    the ioctl too); without, none does. The subvolume is a subvolume (inode 256), mode 0700,
    and closing deletes it."""
    suite = load_suite_text(btrfs_suite(tmp_path, btrfs, nocow=not cow).read_text())
    workspace = BtrfsWorkspace(suite.target, suite.target.btrfs, keep=False)
    configs = [c for c in _configs(suite)]
    with workspace.check(configs).create():
        made = workspace.directory
        assert made is not None and made.parent == btrfs and made.name.startswith("iomatrix-")
        assert subvolumes(btrfs) == [made.name]
        info = os.stat(made)
        assert info.st_ino == 256 and oct(info.st_mode & 0o777) == "0o700"
        image = workspace.image(configs[0])
        attrs = _run("lsattr", "-d", str(made), str(image.path)).stdout.splitlines()
        assert [("C" in line.split()[0]) for line in attrs] == [not cow, not cow], attrs
        fd = os.open(image.path, os.O_RDONLY)
        try:
            assert nocow(fd) is (not cow)
        finally:
            os.close(fd)
    assert subvolumes(btrfs) == [] and os.listdir(btrfs) == []


def _configs(suite):  # type: ignore[no-untyped-def]
    from iomatrix.suite import expand
    return expand(suite).configurations


def test_a_path_not_on_btrfs_is_refused_in_one_line(tmp_path: Path) -> None:
    """A directory on another filesystem: one line (and its hint), nothing made, no run stored."""
    plain = tmp_path / "plain"
    plain.mkdir()
    mount = mount_of(plain)
    if mount is not None and mount.fstype == "btrfs":
        pytest.skip("the test's temporary directory is on btrfs")
    db = tmp_path / "r.db"
    done = cli_result("run", str(btrfs_suite(tmp_path, plain)), "--db", str(db), cwd=tmp_path)
    lines = [line for line in done.stderr.strip().splitlines() if "hint:" not in line]
    assert done.returncode != 0 and len(lines) == 1, done.stderr
    assert lines[0].startswith(f"iomatrix: [target] btrfs {plain}: not on btrfs but on "), lines
    assert os.listdir(plain) == []
    assert not db.exists() or b"btrfs-test" not in db.read_bytes()


def test_a_path_another_user_controls_is_refused_in_one_line(tmp_path: Path) -> None:
    """A directory above ``path`` that every user may write to (another user could swap
    ``path`` for a symlink meanwhile): refused as a [target] directory is, nothing made."""
    shared = tmp_path / "shared"
    (shared / "b").mkdir(parents=True)
    shared.chmod(0o777)
    db = tmp_path / "r.db"
    done = cli_result("run", str(btrfs_suite(tmp_path, shared / "b")), "--db", str(db),
                      cwd=tmp_path)
    lines = [line for line in done.stderr.strip().splitlines() if "hint:" not in line]
    assert done.returncode != 0 and len(lines) == 1, done.stderr
    assert lines[0].startswith(f"iomatrix: [target] btrfs {shared / 'b'}: {shared} is writable "
                               "by every user"), lines
    assert os.listdir(shared / "b") == []


def test_too_little_space_is_refused_in_one_line(tmp_path: Path, btrfs: Path) -> None:
    """Images larger than the filesystem's free space: one line before anything is made."""
    db = tmp_path / "r.db"
    done = cli_result("run", str(btrfs_suite(tmp_path, btrfs, size="1GiB")), "--db", str(db),
                      cwd=tmp_path)
    lines = [line for line in done.stderr.strip().splitlines() if "hint:" not in line]
    assert done.returncode != 0 and len(lines) == 1, done.stderr
    assert lines[0].startswith(f"iomatrix: [target] btrfs {btrfs}: ") and " free, " in lines[0]
    assert subvolumes(btrfs) == [] and os.listdir(btrfs) == []
    assert not db.exists() or b"btrfs-test" not in db.read_bytes()


@pytest.mark.slow
@pytest.mark.parametrize("reclaimer", ["clean", "next run"])
def test_kill_9_leaves_a_subvolume_that_is_reclaimed_and_nothing_else(tmp_path: Path,
                                                                      btrfs: Path,
                                                                      reclaimer: str) -> None:
    """kill -9 while fio runs leaves the subvolume, recorded; `clean --dry-run` names it and
    keeps it; `clean`, or the next run over the same path, deletes it, and a subvolume and a
    directory of someone else stay."""
    assert _run("btrfs", "subvolume", "create", str(btrfs / "someone-elses")).returncode == 0
    (btrfs / "iomatrix-notours").mkdir()
    suite = btrfs_suite(tmp_path, btrfs, body=HOST.format(runtime="60s"))
    db = tmp_path / "r.db"
    with subprocess.Popen([sys.executable, "-m", "iomatrix", "run", str(suite), "--db",
                           str(db)], cwd=tmp_path, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, env=_scratch_in(tmp_path)) as proc:
        for _ in range(600):                 # its image made, and fio started on it
            if (list(btrfs.glob("iomatrix-*/disk-*")) and fio_runs(tmp_path)
                    or proc.poll() is not None):
                break
            time.sleep(0.2)
        running = proc.poll() is None
        proc.send_signal(signal.SIGKILL)
    assert running, "the run ended before it was killed"
    ours = [s for s in subvolumes(btrfs) if s.startswith("iomatrix-")]
    assert len(ours) == 1
    dry = cli_result("clean", "--db", str(db), "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0 and f"{btrfs / ours[0]}" in dry.stdout, dry.stdout + dry.stderr
    assert ours[0] in subvolumes(btrfs)
    if reclaimer == "clean":
        done = cli_result("clean", "--db", str(db), cwd=tmp_path)
    else:
        short = btrfs_suite(tmp_path, btrfs, name="again", body=HOST.format(runtime="500ms"))
        done = cli_result("run", str(short), "--db", str(db), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert subvolumes(btrfs) == ["someone-elses"]
    assert sorted(os.listdir(btrfs)) == ["iomatrix-notours", "someone-elses"]


@pytest.mark.slow
def test_ctrl_c_deletes_the_subvolume(tmp_path: Path, btrfs: Path) -> None:
    """SIGINT while fio runs: the run ends interrupted and its subvolume is gone."""
    suite = btrfs_suite(tmp_path, btrfs, body=HOST.format(runtime="60s"))
    with subprocess.Popen([sys.executable, "-m", "iomatrix", "run", str(suite), "--db",
                           str(tmp_path / "r.db")], cwd=tmp_path, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, env=_scratch_in(tmp_path)) as proc:
        for _ in range(600):
            if (list(btrfs.glob("iomatrix-*/disk-*")) and fio_runs(tmp_path)
                    or proc.poll() is not None):
                break
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == ExitStatus.INTERRUPTED, err
    assert subvolumes(btrfs) == [] and os.listdir(btrfs) == []


def test_a_proxmox_btrfs_storage_resolves_to_its_images_directory(tmp_path: Path) -> None:
    """``storage = "ID"`` of a btrfs storage: a subvolume in its images directory, nocow as
    storage.cfg says, and the storage type recommend sees."""
    cfg = parse_storage_cfg("btrfs: fast\n\tpath /mnt/fast\n\tcontent images\n\tnocow 1\n\n"
                            "btrfs: safe\n\tpath /srv/b\n")
    fast = resolve_storage(Target(storage="fast", size=16 << 20), cfg, tmp_path)
    safe = resolve_storage(Target(storage="safe", size=16 << 20), cfg, tmp_path)
    assert fast.btrfs is not None and safe.btrfs is not None
    assert (fast.btrfs.path, fast.btrfs.nocow) == (Path("/mnt/fast/images"), True)
    assert (safe.btrfs.path, safe.btrfs.nocow) == (Path("/srv/b/images"), False)
    assert (fast.btrfs.storage_kind, safe.btrfs.storage_kind) == ("btrfs-nocow", "btrfs")


@pytest.mark.parametrize("path", ["relative/dir", "/mnt/$HOME", " /mnt/b"])
def test_a_path_fio_or_a_tool_would_misread_is_refused(path: str) -> None:
    with pytest.raises(ValueError, match="full path"):
        Target.model_validate({"btrfs": {"path": path}, "size": "16MiB"})


def test_doctor_says_whether_btrfs_subvolumes_can_be_made(tmp_path: Path) -> None:
    """This host's btrfs-progs and kernel (real ``btrfs --version``, real /sys): the line is
    ok with the version; a kernel without btrfs (a sysfs without fs/btrfs, no module) and a
    missing btrfs are each said with a hint, never required."""
    if shutil.which("btrfs") is None or not Path("/sys/fs/btrfs").is_dir():
        lacking("loop", "btrfs-progs or the kernel's btrfs is missing here")

    def run(argv: list[str]) -> tuple[int | None, str, str]:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        return done.returncode, done.stdout, done.stderr

    kind = BtrfsKind()
    here = kind.host_checks(Probe(which=shutil.which, run=run, sysfs=Path("/sys")))
    assert [c.ok for c in here] == [True] and here[0].hint is None
    assert _run("btrfs", "--version").stdout.split()[-1] in here[0].detail
    no_fs = kind.host_checks(Probe(which=shutil.which, run=lambda argv: (1, "", ""),
                                   sysfs=tmp_path))
    assert not no_fs[0].ok and "no btrfs" in no_fs[0].detail and no_fs[0].hint
    gone = kind.host_checks(Probe(which=lambda t: None, run=run, sysfs=Path("/sys")))
    assert not gone[0].ok and gone[0].hint == "apt-get install btrfs-progs"
