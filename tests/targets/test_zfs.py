"""A ZFS zvol as a target (``iomatrix.targets.zfs``). This kernel has no ZFS module and no
archive here has zfsutils-linux: every test that makes a zvol runs against the STAND-IN of
``zfs`` and ``zpool`` (tests/fixtures/standins/zfs), put first on PATH by the ``zfs_standin``
fixture, which hands out real loop devices as zvols (linked as /dev/zvol/POOL/NAME, as udev
links a real zvol); everything after (QEMU, fio, the graph, reclaim, refusals) is real. Nothing
here has run against real ZFS."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from iomatrix.core.errors import NotEnoughSpace, TargetError
from iomatrix.targets import zfs
from tests.needs import lacking

STANDIN = Path(__file__).resolve().parents[1] / "fixtures" / "standins" / "zfs"


class ZfsStandin(NamedTuple):
    """A stand-in pool of its own (``pool``, with the dataset ``dataset`` in it)."""

    state: Path
    bin: Path
    pool: str
    dataset: str
    env: dict[str, str]

    def run(self, program: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.bin / program), *args], env=self.env, text=True,
                              capture_output=True, check=check, timeout=60)

    def commands(self) -> list[list[str]]:
        """Every call the stand-in got, in order."""
        log = self.state / "commands.log"
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    def zvols(self) -> list[str]:
        """The zvols in the pool, by full name."""
        out = self.run("zfs", "list", "-H", "-o", "name", "-t", "volume", "-r", self.pool).stdout
        return out.split()


def zfs_pool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int) -> Iterator[ZfsStandin]:
    """A stand-in pool of ``size`` bytes (a file vdev) with the dataset POOL/data (compression
    lz4, sync standard, primarycache metadata), the stand-in first on this process's PATH; at
    the end the pool is destroyed and every loop device of the stand-in's files detached."""
    if os.geteuid() != 0:
        lacking("root", "the zfs stand-in attaches loop devices and links them in /dev/zvol")
    if subprocess.run(["losetup", "--find"], capture_output=True).returncode != 0:
        lacking("loop", "no free loop device here (losetup --find)")
    folder = tmp_path / "zfs-bin"
    folder.mkdir()
    for name in ("zfs", "zpool"):
        (folder / name).symlink_to(STANDIN)
    state = tmp_path / "zfs-state"
    state.mkdir()
    env = dict(os.environ, PATH=f"{folder}{os.pathsep}{os.environ['PATH']}",
               ZFS_STANDIN_STATE=str(state))
    pool = f"iomtest{secrets.token_hex(4)}"
    vdev = tmp_path / "vdev.img"
    with open(vdev, "wb") as f:
        f.truncate(size)
    made = ZfsStandin(state, folder, pool, f"{pool}/data", env)
    made.run("zpool", "create", "-O", "compression=lz4", pool, str(vdev))
    made.run("zfs", "create", "-o", "primarycache=metadata", made.dataset)
    monkeypatch.setenv("PATH", env["PATH"])
    monkeypatch.setenv("ZFS_STANDIN_STATE", str(state))
    try:
        yield made
    finally:
        made.run("zpool", "destroy", pool, check=False)
        for backing in (state / "volumes").glob("*.img") if (state / "volumes").is_dir() else ():
            listed = subprocess.run(["losetup", "-j", str(backing)], capture_output=True,
                                    text=True).stdout
            for line in listed.splitlines():
                subprocess.run(["losetup", "-d", line.split(":")[0]], capture_output=True)
        if (zfs.ZVOL_ROOT / pool).exists():
            subprocess.run(["rm", "-rf", "--one-file-system", str(zfs.ZVOL_ROOT / pool)])
        with_pool = subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout
        assert str(state) not in with_pool, f"loop devices left: {with_pool}"


@pytest.fixture
def zfs_standin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ZfsStandin]:
    """A 512 MiB stand-in pool (``zfs_pool``)."""
    yield from zfs_pool(tmp_path, monkeypatch, 512 << 20)


@pytest.mark.parametrize("name", ["rpool", "rpool/data", "tank/vm_disks.1", "a/b-c/d"])
def test_dataset_names_iomatrix_accepts(name: str) -> None:
    assert zfs.dataset_name(name) == name


@pytest.mark.parametrize("name", [
    "-rpool", "rpool/-data", "rpool/data@snap", "rpool/data#mark", "rpool//data", "rpool/",
    "/rpool", "rpool/data ", "rpool/da ta", "rpool/../etc", "rpool/.hidden", "1pool/data",
    "mirror/data", "raidz1", "c0t0d0/x", "rpool/da:ta", "rpool/data\n", "rpool;reboot",
    "rpool/$HOME", "", "r" * 201])
def test_dataset_names_iomatrix_refuses(name: str) -> None:
    with pytest.raises(ValueError, match="not a ZFS dataset name iomatrix accepts"):
        zfs.dataset_name(name)


@pytest.mark.parametrize(("text", "size"), [("512", 512), ("4k", 4096), ("16k", 16384),
                                             ("16K", 16384), ("128k", 131072), ("1M", 1 << 20),
                                             (8192, 8192)])
def test_volblocksizes(text: str | int, size: int) -> None:
    assert zfs.volblocksize_bytes(text) == size
    assert zfs.volblocksize_bytes(zfs.volblocksize_text(size)) == size


@pytest.mark.parametrize("text", ["256", "12k", "2M", "0", "016k", "16kb", "-16k", "16 k",
                                  "1.5k", "", "k", True, 3 << 20])
def test_volblocksizes_refused(text: str | int) -> None:
    with pytest.raises(ValueError, match="volblocksize"):
        zfs.volblocksize_bytes(text)


@pytest.mark.parametrize(("size", "block", "made"), [
    (1, 16384, 1 << 20), (64 << 20, 16384, 64 << 20), ((64 << 20) + 1, 16384, 65 << 20),
    (1 << 20, 4 << 20, 4 << 20)])
def test_volume_sizes_are_whole_mib_and_blocks(size: int, block: int, made: int) -> None:
    assert zfs.volume_size(size, block) == made


@pytest.mark.slow
def test_only_iomatrix_names_reach_destroy(zfs_standin: ZfsStandin) -> None:
    """``destroy`` refuses a zvol iomatrix does not name (a Proxmox VE disk, a path that climbs
    out of the dataset) before zfs is called; one of its own it removes, then says gone."""
    tools = zfs.Zfs()
    zfs_standin.run("zfs", "create", "-V", "1M", f"{zfs_standin.dataset}/vm-100-disk-0")
    before = len(zfs_standin.commands())
    for name in ("vm-100-disk-0", "iomatrix-../../x", "iomatrix-a/b", "-iomatrix-x",
                 "iomatrix-x@snap", "iomatrix-"):
        with pytest.raises(TargetError, match="not the name of a zvol iomatrix makes"):
            tools.destroy(zfs_standin.dataset, name)
    assert len(zfs_standin.commands()) == before
    size = zfs.volume_size(3 << 20, 16384)
    device = tools.create(zfs_standin.dataset, "iomatrix-1-t-raw", size, volblocksize=16384,
                          sparse=False, owner="made by iomatrix:\nrecord 1")
    assert device == zfs.ZVOL_ROOT / zfs_standin.dataset / "iomatrix-1-t-raw"
    assert os.path.realpath(device).startswith("/dev/loop")
    assert tools.ours(zfs_standin.dataset) == ["iomatrix-1-t-raw"]
    assert tools.owner(zfs_standin.dataset, "iomatrix-1-t-raw") == "made by iomatrix: record 1"
    assert tools.volblocksize_of(zfs_standin.dataset, "iomatrix-1-t-raw") == 16384
    assert tools.destroy(zfs_standin.dataset, "iomatrix-1-t-raw") == "removed"
    assert tools.destroy(zfs_standin.dataset, "iomatrix-1-t-raw") == "gone"
    assert not device.exists()
    assert zfs_standin.zvols() == [f"{zfs_standin.dataset}/vm-100-disk-0"]


@pytest.mark.slow
def test_facts_and_the_space_check(zfs_standin: ZfsStandin) -> None:
    """What a run records of the dataset is what zfs and zpool say of it (the stand-in's
    answers), and the space check holds thick zvols to their reservations, sparse ones to their
    sizes, against the available bytes zfs reports."""
    tools = zfs.Zfs()
    facts = tools.facts(zfs_standin.dataset)
    got = dict(line.split("\t") for line in zfs_standin.run(
        "zfs", "get", "-Hp", "-o", "property,value", "available,compression,primarycache",
        zfs_standin.dataset).stdout.splitlines())
    assert facts.available == int(got["available"]) > 0
    assert (facts.compression, facts.primarycache) == (got["compression"], got["primarycache"])
    assert (facts.compression, facts.primarycache) == ("lz4", "metadata")   # set, inherited
    version = zfs_standin.run("zfs", "version").stdout.split()
    assert facts.version == ", ".join(version)
    assert facts.pool.name == zfs_standin.pool and facts.pool.health == "ONLINE"
    fields = facts.fields()
    assert fields["zfs.compression"] == "lz4" and fields["zfs.version"] == facts.version
    fits = facts.available // 2 // (1 << 20) * (1 << 20)
    zfs.check_space(facts, [fits], volblocksize=16384, sparse=False)
    with pytest.raises(NotEnoughSpace) as refused:
        zfs.check_space(facts, [fits, fits, fits], volblocksize=16384, sparse=False)
    assert "\n" not in str(refused.value) and "thick zvols reserve" in str(refused.value)
    with pytest.raises(NotEnoughSpace, match="sparse zvols grow"):
        zfs.check_space(facts, [fits, fits, fits], volblocksize=16384, sparse=True)
    # the stand-in refuses what zfs refuses: a thick zvol larger than what is available
    with pytest.raises(TargetError, match="out of space"):
        tools.create(zfs_standin.dataset, "iomatrix-big", zfs.volume_size(facts.available + 1,
                                                                          16384),
                     volblocksize=16384, sparse=False)
    with pytest.raises(TargetError, match="dataset does not exist"):
        tools.facts(f"{zfs_standin.pool}/nothing")
