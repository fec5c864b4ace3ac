"""Target safety and preparation: free space, images, block devices (real loop devices)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from iomatrix.core.errors import NotEnoughSpace, TargetError, UnsafeDirectory
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.target import Target
from iomatrix.targets.workspace import Workspace, check_device
from tests.needs import needs

RAW = Configuration(mode="blocklayer", aio="threads", cache="none", format="raw",
                    preallocation="off", iothread=False)


@pytest.fixture(scope="module")
def counts_allocation(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bool]:
    """Whether the file system under tmp_path counts the blocks of fallocate() ("falloc") and of
    written zeros ("full"). ext4 and XFS do; ZFS with compression stores zeros as holes, and some
    file systems cannot fallocate: there an image's allocation has no lower bound to check."""
    directory = tmp_path_factory.mktemp("alloc")
    found = {}
    for how in ("falloc", "full"):
        path = directory / how
        with open(path, "wb") as f:
            try:
                if how == "falloc":
                    os.posix_fallocate(f.fileno(), 0, 1 << 20)
                else:
                    f.write(bytes(1 << 20))
                f.flush()
                os.fsync(f.fileno())
            except OSError:
                pass
        found[how] = path.stat().st_blocks * 512 >= 1 << 20
        path.unlink()
    return found


@pytest.mark.parametrize("fmt, prealloc, allocated_min, allocated_max", [
    ("raw", "off", 0, 64 << 10),
    ("raw", "falloc", 8 << 20, 9 << 20),
    ("raw", "full", 8 << 20, 9 << 20),
    ("qcow2", "off", 0, 1 << 20),
    ("qcow2", "metadata", 0, 1 << 20),
    ("qcow2", "full", 8 << 20, 10 << 20),
])
def test_images_are_created_with_format_and_preallocation(tmp_path: Path, fmt: str, prealloc: str,
                                                          allocated_min: int, allocated_max: int,
                                                          counts_allocation: dict[str, bool]) -> None:
    if not counts_allocation.get(prealloc, True):
        allocated_min = 0         # this file system does not show that allocation (see above)
    config = RAW.model_copy(update={"format": fmt, "preallocation": prealloc})
    with Workspace(Target(directory=tmp_path, size=8 << 20)) as ws:
        ws.open([config])
        image = ws.image(config)
        assert ws.image(config) is image           # one image per (format, preallocation)
        info = subprocess.run(["qemu-img", "info", "--output=json", str(image.path)],
                              capture_output=True, text=True, check=True).stdout
        assert f'"format": "{fmt}"' in info and '"virtual-size": 8388608' in info
        allocated = image.path.stat().st_blocks * 512
        assert allocated_min <= allocated <= allocated_max, allocated
        workdir = image.path.parent
    assert not workdir.exists()


def test_keep_leaves_images(tmp_path: Path) -> None:
    with Workspace(Target(directory=tmp_path, size=4 << 20), keep=True) as ws:
        ws.open([RAW])
        path = ws.image(RAW).path
    assert path.exists()


def test_free_space_is_checked_before_anything_is_created(tmp_path: Path) -> None:
    free = shutil.disk_usage(tmp_path).free
    with pytest.raises(NotEnoughSpace, match="free,"):
        Workspace(Target(directory=tmp_path / "t", size=free + (1 << 30))).open([RAW])
    assert not (tmp_path / "t").exists()


def test_directory_that_is_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(TargetError, match="not a directory"):
        Workspace(Target(directory=tmp_path / "f", size=4 << 20)).open([RAW])


def test_not_a_block_device(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(TargetError, match="not a block device"):
        check_device(tmp_path / "f")
    with pytest.raises(TargetError, match="No such file"):
        check_device(tmp_path / "missing")


def test_free_block_device_is_accepted(loop_device: Path) -> None:
    assert check_device(loop_device) == 64 << 20


def test_mounted_block_device_is_refused(loop_device: Path, tmp_path: Path) -> None:
    subprocess.run(["mkfs.ext4", "-q", str(loop_device)], check=True)
    (tmp_path / "mnt").mkdir()
    subprocess.run(["mount", str(loop_device), str(tmp_path / "mnt")], check=True)
    with pytest.raises(TargetError, match=f"mounted at {tmp_path / 'mnt'}"):
        check_device(loop_device)


def test_block_device_held_open_exclusively_is_refused(loop_device: Path) -> None:
    fd = os.open(loop_device, os.O_RDONLY | os.O_EXCL)
    try:
        with pytest.raises(TargetError, match="busy"):
            check_device(loop_device)
    finally:
        os.close(fd)


def test_block_device_with_holders_is_refused(loop_device: Path, tmp_path: Path) -> None:
    """FAKE sysfs: device-mapper cannot run on these machines, so a holder (as LVM would add) is
    simulated by a copy of the device's sysfs entry with a holders/dm-0 entry."""
    st = os.stat(loop_device)
    ident = f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
    fake = tmp_path / "fakesys"
    block = fake / "devices/virtual/block" / loop_device.name
    (block / "holders/dm-0").mkdir(parents=True)
    (fake / "dev/block").mkdir(parents=True)
    (fake / "dev/block" / ident).symlink_to(block)
    with pytest.raises(TargetError, match="in use by dm-0"):
        check_device(loop_device, sysfs=fake)


def test_device_target_workspace_uses_the_device(loop_device: Path) -> None:
    target = Target(device=loop_device, allow_destroy=True, size=32 << 20)
    with Workspace(target) as ws:
        ws.open([RAW])
        image = ws.image(RAW)
    assert image.is_device and image.path == loop_device and image.size == 32 << 20
    with pytest.raises(TargetError, match="exceeds the device"):
        Workspace(Target(device=loop_device, allow_destroy=True, size=1 << 30)).open([RAW])


# -- directories nobody else controls (issue 20) -------------------------------------------------

needs_root = needs("root")
"""Giving a directory to another user needs root."""
OTHER = 65534
"""Another user (nobody): what it owns, root must not write through."""


def walked(path: Path) -> tuple[Path, tuple[str, ...]]:
    from iomatrix.core.dirs import walk

    found = walk(path)
    os.close(found.fd)
    return found.real, found.missing


@needs_root
@pytest.mark.parametrize("setup, message", [
    (lambda d: os.chown(d, OTHER, OTHER), "is owned by nobody (uid 65534), not root"),
    (lambda d: (os.chown(d, 0, OTHER), os.chmod(d, 0o775)), "is writable by group "),
    (lambda d: os.chmod(d, 0o777), "is writable by every user, mode 0777"),
    (lambda d: (os.chown(d, OTHER, OTHER), os.chmod(d, 0o1777)), "is owned by nobody (uid 65534)"),
])
def test_a_directory_another_user_controls_is_refused_on_the_way(tmp_path: Path, setup,  # type: ignore[no-untyped-def]
                                                                 message: str) -> None:
    above = tmp_path / "above"
    above.mkdir()
    setup(above)
    target = Target(directory=above / "bench" / "target", size=8 << 20)
    with pytest.raises(UnsafeDirectory) as info:
        Workspace(target).check([RAW])
    assert str(info.value).startswith(f"[target] directory {target.directory}: {above} {message}")
    if "group" in message:
        assert str(info.value).endswith("(gid 65534), mode 0775")
    assert "only root (or you) can write to" in str(info.value.hint)
    assert list(above.iterdir()) == []                        # nothing was made


@needs_root
def test_a_sticky_directory_is_used_only_through_what_root_owns(tmp_path: Path) -> None:
    from iomatrix.core.dirs import make_private, walk

    shared = tmp_path / "shared"                               # as /var/tmp
    shared.mkdir()
    os.chmod(shared, 0o1777)
    assert walked(shared / "iomatrix" / "x") == (shared, ("iomatrix", "x"))
    # a directory root made there earlier is used again; one another user made first is not
    with Workspace(Target(directory=shared / "iomatrix", size=8 << 20)) as ws:
        ws.open([RAW])
        assert ws.directory is not None and ws.directory.parent == shared / "iomatrix"
        assert (shared / "iomatrix").stat().st_mode & 0o777 == 0o700
    assert not (shared / "iomatrix").exists()                  # made by it, removed by it
    (shared / "iomatrix").mkdir(mode=0o700)
    Workspace(Target(directory=shared / "iomatrix", size=8 << 20)).check([RAW])
    os.chown(shared / "iomatrix", OTHER, OTHER)
    with pytest.raises(UnsafeDirectory, match="iomatrix is owned by nobody"):
        Workspace(Target(directory=shared / "iomatrix", size=8 << 20)).check([RAW])
    # a symlink another user put in a sticky directory is not followed
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, shared / "link")
    os.lchown(shared / "link", OTHER, OTHER)
    with pytest.raises(UnsafeDirectory, match="link is a symlink that nobody .uid 65534. made"):
        walked(shared / "link" / "x")
    os.lchown(shared / "link", 0, 0)
    assert walked(shared / "link" / "x") == (elsewhere, ("x",))
    # made exclusively: never one that another user made first
    fd = walk(shared).fd
    try:
        with pytest.raises(UnsafeDirectory, match="owned by nobody"):
            make_private(fd, shared, "iomatrix", reuse=True)
        with pytest.raises(FileExistsError):
            make_private(fd, shared, "iomatrix", reuse=False)
        os.symlink(elsewhere, shared / "planted")
        with pytest.raises(UnsafeDirectory, match="not a directory"):
            make_private(fd, shared, "planted", reuse=True)
    finally:
        os.close(fd)


def test_symlinks_on_the_way_are_followed_where_only_root_writes(tmp_path: Path) -> None:
    real = tmp_path / "real"
    (real / "deeper").mkdir(parents=True)
    (tmp_path / "abs").symlink_to(real)
    (real / "rel").symlink_to("deeper")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    assert walked(tmp_path / "abs" / "rel" / "new") == (real / "deeper", ("new",))
    assert walked(tmp_path / "abs" / ".." / "abs") == (real, ())
    with pytest.raises(UnsafeDirectory, match="too many symlinks"):
        walked(tmp_path / "loop" / "x")


def test_an_image_replaced_under_its_name_stops_the_run(tmp_path: Path) -> None:
    with Workspace(Target(directory=tmp_path, size=8 << 20)) as ws:
        ws.open([RAW])
        image = ws.image(RAW)
        assert image.path.stat().st_mode & 0o777 == 0o600
        ws.verify([image])
        secret = tmp_path / "secret"
        secret.write_text("root's")
        image.path.rename(tmp_path / "moved")
        image.path.symlink_to(secret)
        with pytest.raises(TargetError, match="is no longer the image iomatrix made"):
            ws.verify([image])
        image.path.unlink()
        with pytest.raises(TargetError, match="is gone"):
            ws.verify([image])


def test_two_runs_ending_at_once_over_a_shared_target_both_end_cleanly(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs sharing a target directory (cluster nodes over shared storage) end at the same time:
    each removes its own directory, then both find the target holding only iomatrix's marker and
    try to remove it. The one that loses the race is told why not; it does not fail (a node's
    run ended with FileNotFoundError: '.iomatrix' at its clean-up, its trials lost)."""
    from iomatrix.core import dirs
    from iomatrix.targets import workspace
    target = tmp_path / "shared" / "target"
    first = Workspace(Target(directory=target, size=4 << 20)).create()
    second = Workspace(Target(directory=target, size=4 << 20)).create()
    first.close()
    assert target.exists()                     # the second run's directory is still in it
    assert second.directory is not None
    shutil.rmtree(second.directory)            # the second run removed its own, as close() does
    real = dirs.read_marker
    raced: list[str | None] = []

    def the_other_run_first(fd: int) -> str | None:
        text = real(fd)
        os.unlink(dirs.MARKER, dir_fd=fd)      # the other run read it too, and unlinks it first
        raced.append(text)
        return text
    monkeypatch.setattr(dirs, "read_marker", the_other_run_first)
    workspace._remove_up(target)               # raised FileNotFoundError
    assert raced == [dirs.parent_marker(target)] and target.exists()
    monkeypatch.setattr(dirs, "read_marker", real)
    parent_fd = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert dirs.remove_empty(parent_fd, target.name, dirs.parent_marker(target)) == (
            "it does not carry iomatrix's marker (.iomatrix) for it")   # the other run's now
    finally:
        os.close(parent_fd)
    second.close()
