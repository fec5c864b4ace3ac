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
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from iomatrix.cli.status import ExitStatus
from iomatrix.core.errors import NotEnoughSpace, TargetError
from iomatrix.platform.proxmox.storage import Storage
from iomatrix.store import Store
from iomatrix.suite.model import Target
from iomatrix.suite.volumes import ZfsTarget, dataset_name, volblocksize_bytes, volblocksize_text
from iomatrix.targets import zfs
from iomatrix.targets.network import resolve_storage
from iomatrix.targets.volumes import owner_tag
from tests.conftest import TCG_GUEST, IOMATRIX, cli_result, fio_runs as _fio_runs
from tests.needs import lacking, needs

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
    assert dataset_name(name) == name


@pytest.mark.parametrize("name", [
    "-rpool", "rpool/-data", "rpool/data@snap", "rpool/data#mark", "rpool//data", "rpool/",
    "/rpool", "rpool/data ", "rpool/da ta", "rpool/../etc", "rpool/.hidden", "1pool/data",
    "mirror/data", "raidz1", "c0t0d0/x", "rpool/da:ta", "rpool/data\n", "rpool;reboot",
    "rpool/$HOME", "", "r" * 201])
def test_dataset_names_iomatrix_refuses(name: str) -> None:
    with pytest.raises(ValueError, match="not a ZFS dataset name iomatrix accepts"):
        dataset_name(name)


@pytest.mark.parametrize(("text", "size"), [("512", 512), ("4k", 4096), ("16k", 16384),
                                             ("16K", 16384), ("128k", 131072), ("1M", 1 << 20),
                                             ("4M", 4 << 20), ("16M", 16 << 20),
                                             (8192, 8192)])
def test_volblocksizes(text: str | int, size: int) -> None:
    assert volblocksize_bytes(text) == size
    assert volblocksize_bytes(volblocksize_text(size)) == size


@pytest.mark.parametrize("text", ["256", "12k", "3M", "32M", "0", "016k", "16kb", "-16k", "16 k",
                                  "1.5k", "", "k", True, 3 << 20])
def test_volblocksizes_refused(text: str | int) -> None:
    with pytest.raises(ValueError, match="volblocksize"):
        volblocksize_bytes(text)


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
    tag = owner_tag("made by iomatrix: record 1")
    tools.create(zfs_standin.dataset, "iomatrix-1-t-raw", size, volblocksize=16384,
                 sparse=False, owner=tag)
    device = tools.device(zfs_standin.dataset, "iomatrix-1-t-raw")
    assert device == zfs.ZVOL_ROOT / zfs_standin.dataset / "iomatrix-1-t-raw"
    assert os.path.realpath(device).startswith("/dev/loop")
    assert tools.listed(zfs_standin.dataset) == {"iomatrix-1-t-raw": tag, "vm-100-disk-0": None}
    assert tools.volblocksize_of(zfs_standin.dataset, "iomatrix-1-t-raw") == 16384
    assert tools.destroy(zfs_standin.dataset, "iomatrix-1-t-raw") == "removed"
    assert tools.destroy(zfs_standin.dataset, "iomatrix-1-t-raw") == "gone"
    assert not device.exists()
    assert zfs_standin.zvols() == [f"{zfs_standin.dataset}/vm-100-disk-0"]


@pytest.mark.slow
def test_facts_and_the_space_check(tmp_path: Path, zfs_standin: ZfsStandin,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """What a run records of the dataset is what zfs and zpool say of it (the stand-in's
    answers), and the space check holds thick zvols to their reservations, sparse ones to their
    sizes, against the available bytes zfs reports. A zvol made whose device never appears is
    destroyed again."""
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
    assert "ARC" not in facts.note(16384, False)                      # primarycache=metadata
    assert "reads can come from the ARC" in tools.facts(zfs_standin.pool).note(16384, False)
    fields = facts.fields(8192, False)
    assert (fields["zfs_compression"], fields["zfs_volblocksize"]) == ("lz4", "8K")
    assert fields["zfs_version"] == facts.version
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
    monkeypatch.setattr(zfs, "ZVOL_ROOT", tmp_path / "no-udev")
    monkeypatch.setattr(zfs, "LINK_TIMEOUT", 0.5)
    backend = zfs.ZfsBackend(zfs_standin.dataset)
    assert backend.check(1, 1 << 20) == [facts.note(16384, False)]
    with pytest.raises(TargetError, match="udev did not link"):
        backend.create("iomatrix-1-t-raw-off", 1 << 20, owner_tag("made by iomatrix"))
    assert ["zfs", "destroy", "--", f"{zfs_standin.dataset}/iomatrix-1-t-raw-off"] in \
        zfs_standin.commands()
    assert zfs_standin.zvols() == []


def test_a_zfspool_storage_id_is_a_zfs_target(tmp_path: Path) -> None:
    """``storage = "local-zfs"``: the zfspool storage's pool, blocksize and sparse, as
    ZFSPoolPlugin makes a VM's zvols there; without a blocksize, the table's 16k."""
    storages = {"local-zfs": Storage(id="local-zfs", type="zfspool", pool="rpool/data"),
                "tank": Storage(id="tank", type="zfspool", pool="tank/vm", blocksize="64k",
                                sparse=True)}
    plain = resolve_storage(Target(storage="local-zfs", size="1GiB"), storages, tmp_path,
                            pve_host=False)
    assert plain.zfs == ZfsTarget(pool="rpool/data") and plain.zfs.volblocksize_bytes == 16384
    assert plain.zfs.storage_kind == "zfspool" and plain.size == 1 << 30
    tank = resolve_storage(Target(storage="tank", size="1GiB"), storages, tmp_path,
                           pve_host=False)
    assert tank.zfs == ZfsTarget(pool="tank/vm", volblocksize="64k", sparse=True)
    bad = {"x": Storage(id="x", type="zfspool", pool="rpool/data", blocksize="3k")}
    with pytest.raises(ValueError, match="volblocksize"):
        resolve_storage(Target(storage="x", size="1GiB"), bad, tmp_path, pve_host=False)


def zfs_suite(directory: Path, pool: str, *, size: str = "16MiB", volblocksize: str = '"8k"',
              mode: str = "guest", runtime: str = "500ms", sparse: bool = False) -> Path:
    """A tiny suite on a zvol of ``pool``: guest mode (TCG) with its host baseline and a
    blocklayer part, so that one run covers the three modes."""
    path = directory / "zfs.toml"
    path.write_text(f"""[suite]
name = "zfs-standin"
[target]
size = "{size}"
zfs = {{ pool = "{pool}", volblocksize = {volblocksize}, sparse = {str(sparse).lower()} }}
[matrix]
controller = "virtio-blk"
iothread = false
cache = "none"
[[part]]
mode = "blocklayer"
aio = "native"
iothread = false
[workloads]
rw = "randread"
bs = "4k"
iodepth = 4
[method]
mode = "{mode}"
baseline = true
ramp = 0
runtime = "{runtime}"
samples = 1
{TCG_GUEST}""")
    return path


@pytest.mark.slow
def test_refusals_are_one_line_before_any_zvol(tmp_path: Path,
                                               zfs_standin: ZfsStandin) -> None:
    """A dataset name or volblocksize iomatrix does not accept ends the run before zfs is
    asked anything (exit 3); a pool too small for the run's thick zvols ends it after zfs get
    and zpool list, before zfs create (exit 5); each in one line, nothing stored."""
    db = tmp_path / "r.db"
    made = len(zfs_standin.commands())           # the fixture's own
    for pool, block, word in (("-rpool/data", '"8k"', "not a ZFS dataset name"),
                              (f"{zfs_standin.pool}/data@snap", '"8k"', "not a ZFS dataset"),
                              (zfs_standin.dataset, '"12k"', "a power of two")):
        done = cli_result("run", str(zfs_suite(tmp_path, pool, volblocksize=block)), "--db",
                          str(db), cwd=tmp_path)
        assert done.returncode == ExitStatus.SUITE_INVALID, done.stdout + done.stderr
        assert word in done.stderr and len(zfs_standin.commands()) == made
    available = zfs.Zfs().facts(zfs_standin.dataset).available
    asked = f"{available // (1 << 20) + 1}MiB"
    before = len(zfs_standin.commands())
    done = cli_result("run", str(zfs_suite(tmp_path, zfs_standin.dataset, size=asked,
                                           mode="host")), "--db", str(db), cwd=tmp_path)
    assert done.returncode == ExitStatus.TARGET, done.stdout + done.stderr
    lines = [line for line in done.stderr.strip().splitlines() if "hint:" not in line]
    assert len(lines) == 1 and "thick zvols reserve their size" in lines[0], done.stderr
    asked_of_zfs = [c[:2] for c in zfs_standin.commands()[before:]]
    assert ["zfs", "get"] in asked_of_zfs and ["zfs", "create"] not in asked_of_zfs
    assert zfs_standin.zvols() == []
    if db.exists():
        with Store(db, readonly=True) as store:
            assert store.list_runs() == []


@pytest.mark.slow
@needs("fio", "qemu")
def test_a_run_in_every_mode_on_a_standin_zvol(tmp_path: Path, zfs_standin: ZfsStandin,
                                               no_leftovers: None) -> None:
    """One run on stand-in zvols, in host, blocklayer and guest (TCG) modes: every trial
    measured on the zvol's block device (QEMU opens it as a host_device), the zvols made with
    the volblocksize asked and gone at the end, and the dataset's compression, sync,
    primarycache, the volblocksize and the ZFS version in the stored run's host record (shown
    by ``iomatrix show``), its notes and the report; ``recommend`` answers for zfspool."""
    db = tmp_path / "r.db"
    done = cli_result("run", str(zfs_suite(tmp_path, zfs_standin.dataset)), "--db", str(db),
                      cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    with Store(db, readonly=True) as store:
        stored = store.load_run(1)
    assert {t.config_key.split("/")[0] for t in stored.trials} == {"host", "blocklayer",
                                                                   "guest"}
    assert all(t.status == "ok" and t.samples[0].iops > 0 for t in stored.trials), [
        t.reason for t in stored.trials]
    device = f'"driver":"host_device","filename":"/dev/zvol/{zfs_standin.dataset}/iomatrix-1-'
    for trial in stored.trials:
        if not trial.config_key.startswith("host"):
            assert device in trial.command, trial.command
        if trial.config_key.startswith("blocklayer"):
            assert trial.applied["file0.driver"] == "host_device", trial.applied
    made = [c for c in zfs_standin.commands() if c[:2] == ["zfs", "create"] and "-V" in c]
    assert made and all(c[c.index("-b") + 1] == "8K" and "-s" not in c for c in made)
    assert all(c[-1].startswith(f"{zfs_standin.dataset}/iomatrix-1-") for c in made)
    assert zfs_standin.zvols() == []
    version = ", ".join(zfs_standin.run("zfs", "version").stdout.split())
    host = stored.host
    assert host["target"] == f"ZFS dataset {zfs_standin.dataset}"
    assert (host["zfs_compression"], host["zfs_sync"], host["zfs_primarycache"],
            host["zfs_volblocksize"], host["zfs_version"]) == ("lz4", "standard", "metadata",
                                                                "8K", version)
    note = next(n for n in stored.notes if n.startswith("zfs: zvols in"))
    assert "volblocksize 8K" in note and "compression=lz4" in note and version in note
    shown = cli_result("show", "1", "--db", str(db), cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert (f"target ZFS dataset {zfs_standin.dataset} (zvols, volblocksize 8K, thick, "
            "compression lz4)") in shown.stdout
    advice = cli_result("recommend", "1", "--for", "proxmox", "--db", str(db), cwd=tmp_path)
    assert advice.returncode == 0 and "(storage type zfspool)" in advice.stdout, advice.stderr
    report = tmp_path / "report"
    assert cli_result("report", "1", "--db", str(db), "--out", str(report),
                      cwd=tmp_path).returncode == 0
    assert version in (report / "index.html").read_text()


@pytest.mark.slow
@needs("fio")
def test_a_killed_run_leaves_zvols_that_clean_alone_removes(tmp_path: Path,
                                                            zfs_standin: ZfsStandin) -> None:
    """kill -9 in the middle of a run leaves its (sparse) zvol, recorded and marked; ``clean``
    removes it and nothing else in the dataset: a Proxmox VE disk and a zvol named like
    iomatrix's that no record made stay."""
    others = [f"{zfs_standin.dataset}/vm-100-disk-0", f"{zfs_standin.dataset}/iomatrix-9-x-raw"]
    for other in others:
        zfs_standin.run("zfs", "create", "-V", "1M", other)
    suite = zfs_suite(tmp_path, zfs_standin.dataset, mode="host", runtime="60s", sparse=True)
    db = tmp_path / "r.db"
    proc = subprocess.Popen([*IOMATRIX, "run", str(suite), "--db", str(db)], cwd=tmp_path,
                            env=dict(zfs_standin.env, TMPDIR=str(tmp_path)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:        # its zvol made and marked, and fio started on it (its job file in the scratch)
        deadline = time.monotonic() + 120
        while len(zfs_standin.zvols()) < 3 or not _fio_runs(tmp_path):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    left = sorted(set(zfs_standin.zvols()) - set(others))
    assert len(left) == 1 and left[0].startswith(f"{zfs_standin.dataset}/iomatrix-1-")
    made = [c for c in zfs_standin.commands() if c[:2] == ["zfs", "create"] and c[-1] == left[0]]
    assert len(made) == 1 and "-s" in made[0]
    dry = cli_result("clean", "--db", str(db), "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0 and left[0] in dry.stdout, dry.stdout + dry.stderr
    assert left[0] in zfs_standin.zvols()
    done = cli_result("clean", "--db", str(db), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(zfs_standin.zvols()) == sorted(others)
