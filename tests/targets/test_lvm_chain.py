"""Proxmox VE 9's snapshots as a volume chain on thick LVM (``[target] lvm`` ``volume_chain``):
a qcow2 on a logical volume, with ``snapshots`` that many LVs under it as its backing chain.

The graph for a qcow2 on a block device with backing images, for each platform (pure), and
what QEMU reports of it; the LVM runs are on the LVM stand-in (``tests/fixtures/standins/lvm``:
loop devices handed out as logical volumes), since this kernel has no device-mapper."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from iomatrix.cli.status import ExitStatus
from iomatrix.core.errors import TargetError
from iomatrix.core.trust import US
from iomatrix.platform import proxmox as pve
from iomatrix.platform.settings import backing_node
from iomatrix.qemu import version as qemu_version
from iomatrix.qemu.blockdev import daemon_graph, expected_daemon_graph, nodes_by_role
from iomatrix.store.repo import Store
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.model import Target
from iomatrix.targets.lvm import LvmKind
from iomatrix.targets.lvmchain import ChainTarget
from tests.conftest import TCG_GUEST, cli_result, our_processes
from tests.lvm import LvmStandin, lvm_standin as _lvm_standin
from tests.needs import needs


def _config(**kw: Any) -> Configuration:
    values: dict[str, Any] = dict(mode="blocklayer", aio="native", cache="none", format="qcow2",
                                  iothread=False, preallocation="metadata")
    return Configuration(**(values | kw))


def _nodes(blockdevs: tuple[str, ...]) -> list[dict[str, Any]]:
    return [json.loads(node) for node in blockdevs]


# -- the graph (pure) -------------------------------------------------------------------------

def test_qemu_graph_opens_the_chain_as_nodes_of_its_own() -> None:
    """iomatrix's own graph: each backing image a protocol node like the top's and a read-only
    qcow2 node over it, deepest first, the top's format node naming the nearest; the deepest
    opens nothing its header names; a qcow2 on a device is never sliced (no ``size``)."""
    chain = (Path("/dev/vg/snap2"), Path("/dev/vg/snap1"))
    graph = daemon_graph(_config(), Path("/dev/vg/top"), is_device=True, size=1 << 26,
                         backing=chain)
    nodes = _nodes(graph.blockdevs)
    assert [n["node-name"] for n in nodes] == [
        "backing2-file", "backing2", "backing1-file", "backing1", "file0", "disk0"]
    by_name = {n["node-name"]: n for n in nodes}
    assert by_name["disk0"]["backing"] == "backing1" and "size" not in by_name["disk0"]
    assert by_name["backing1"]["backing"] == "backing2" and by_name["backing2"]["backing"] is None
    assert [by_name[backing_node(d)[1]]["filename"] for d in (1, 2)] == [str(p) for p in chain]
    for depth in (1, 2):
        fmt, file = (by_name[name] for name in backing_node(depth))
        assert fmt["driver"] == "qcow2" and fmt["read-only"] and file["read-only"]
        assert file["driver"] == "host_device" and file["aio"] == "native"
        assert file["cache"] == fmt["cache"] == by_name["disk0"]["cache"]
    plain = _nodes(daemon_graph(_config(), Path("/dev/vg/top"), is_device=True).blockdevs)
    assert [n["node-name"] for n in plain] == ["file0", "disk0"] and "backing" not in plain[1]


def test_proxmox_graph_nests_the_chain_as_qemu_server() -> None:
    """PVE 9 (Blockdev.pm generate_backing_chain_blockdev): each snapshot's layers nested as the
    ``backing`` of the one above, node names hashed with the snapshot's name, every qcow2 node
    with ``discard-no-unref`` (bug #6543); PVE 8 and libvirt refuse a chain in one line."""
    chain = (Path("/dev/vg/snap2"), Path("/dev/vg/snap1"))
    graph = daemon_graph(_config(), Path("/dev/vg/top"), is_device=True, platform="proxmox",
                         pve_version=9, backing=chain)
    top, = _nodes(graph.blockdevs)
    fmt = top["file"]
    seen = []
    while fmt is not None:
        assert fmt["driver"] == "qcow2" and fmt["discard-no-unref"] is True
        assert fmt["file"]["driver"] == "host_device" and fmt["file"]["aio"] == "native"
        seen.append((fmt["node-name"], fmt["file"]["node-name"], fmt["file"]["filename"]))
        fmt = fmt.get("backing")
    assert [path for _, _, path in seen] == ["/dev/vg/top", *map(str, chain)]
    names = [name for node in seen for name in node[:2]]
    assert len(set(names)) == len(names)
    for version, platform in ((8, "proxmox"), (None, "libvirt")):
        with pytest.raises(ValueError, match="chain"):
            daemon_graph(_config(), Path("/dev/vg/top"), is_device=True, platform=platform,
                         pve_version=version, backing=chain)


def test_nodes_by_role_reads_a_nested_chain_by_depth() -> None:
    """QEMU lists a nested chain's nodes deepest first (as a PVE 9 daemon holds them): roles
    come from each qcow2 node's backing depth and the file it opens, not from the order."""
    listed = [
        {"node-name": "drive-virtio0", "drv": "throttle", "file": "json:{}",
         "backing_file_depth": 2},
        {"node-name": "fb", "drv": "qcow2", "file": "/dev/loop7", "backing_file_depth": 0},
        {"node-name": "eb", "drv": "host_device", "file": "/dev/loop7", "backing_file_depth": 0},
        {"node-name": "ft", "drv": "qcow2", "file": "/dev/loop8", "backing_file_depth": 1},
        {"node-name": "et", "drv": "host_device", "file": "/dev/loop8", "backing_file_depth": 0}]
    named = {n["node-name"]: n["file"] for n in nodes_by_role(listed)}
    assert named == {"throttle0": "json:{}", "backing1": "/dev/loop7",
                     "backing1-file": "/dev/loop7", "disk0": "/dev/loop8", "file0": "/dev/loop8"}
    want = expected_daemon_graph(_config(), platform="proxmox", pve_version=9, is_device=True,
                                 backing=1)
    assert want["disk0.backing-depth"] == "1" and want["backing1.driver"] == "qcow2"


def test_a_volume_chain_storage_id_and_the_table() -> None:
    """storage.cfg's ``snapshot-as-volume-chain 1`` on an lvm storage is ``volume_chain``;
    snapshots without it are refused; the table is Proxmox VE's lvm type either way."""
    cfg = pve.parse_storage_cfg("lvm: chain\n\tvgname pve\n\tsnapshot-as-volume-chain 1\n\n"
                                "lvm: plain\n\tvgname pve\n")
    tables = [LvmKind().of_storage(cfg[name], "", Path("/etc/pve")) for name in ("chain", "plain")]
    assert tables == [{"lvm": {"vg": "pve", "volume_chain": True}}, {"lvm": {"vg": "pve"}}]
    chain = Target(**tables[0], size="64MiB")
    assert chain.lvm is not None and chain.lvm.volume_chain and chain.lvm.storage_kind == "lvm"
    assert chain.lvm.caveat("qcow2") is not None and "Blockbridge" in chain.lvm.caveat("qcow2")
    assert chain.lvm.caveat("raw") is None and chain.lvm.caveat(None) is None
    plain = Target(**tables[1], size="64MiB")
    assert plain.lvm is not None and plain.lvm.caveat("qcow2") is None
    with pytest.raises(ValidationError, match="snapshots needs volume_chain"):
        Target(lvm={"vg": "pve", "snapshots": 1}, size="64MiB")
    with pytest.raises(ValidationError):
        Target(lvm={"vg": "pve", "volume_chain": True, "snapshots": -1}, size="64MiB")


# -- on the LVM stand-in (loop devices handed out as LVs) -------------------------------------

@pytest.fixture
def standin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LvmStandin]:
    """The LVM stand-in: volume group pve (512 MiB), thin pool pve/data (256 MiB)."""
    yield from _lvm_standin(tmp_path, monkeypatch)


def _suite(tmp_path: Path, *, size: str = "32MiB", mode: str = "blocklayer",
           snapshots: int = 1, runtime: str = "500ms", guest: bool = True,
           baseline: bool = True, platform: str = "qemu") -> Path:
    """A tiny suite on a qcow2 volume chain: ``mode`` and, with ``guest``, a TCG guest; the
    graph ``platform``'s."""
    settings = ('cache = "none"\naio = "native"\nformat = "qcow2"\npreallocation = "metadata"\n'
                'iothread = false\n')
    part = f'[[part]]\nmode = "guest"\ncontroller = "virtio-blk"\n{settings}' if guest else ""
    path = tmp_path / "suite.toml"
    path.write_text(f"""[suite]
name = "lvm-chain-test"
[target]
size = "{size}"
lvm = {{ vg = "pve", volume_chain = true, snapshots = {snapshots} }}
[matrix]
{settings}{part}[[workloads]]
rw = "randwrite"
bs = "4k"
iodepth = 4
[method]
mode = "{mode}"
platform = "{platform}"
baseline = {str(baseline).lower()}
precondition = false
runtime = "{runtime}"
ramp = "0s"
samples = 1
{TCG_GUEST}""")
    return path


def _made(standin: LvmStandin) -> list[str]:
    """The names of the volumes iomatrix asked the stand-in for (lvcreate with a tag)."""
    return [c[c.index("-n") + 1] for c in standin.commands()
            if c[0] == "lvcreate" and "--addtag" in c]


def test_stand_in_space_check_covers_the_chain(tmp_path: Path, standin: LvmStandin) -> None:
    """A volume group with room for each image's own LV but not for its chain of backing LVs
    is refused in one line before any volume is made; so is a preallocation qemu-img cannot
    do on an LV."""
    free = int(standin.run("vgs", "--noheadings", "--units", "b", "--nosuffix", "-o",
                           "vg_free", "pve").stdout.strip())
    size = (free // 2) >> 20
    assert 2 * size << 20 <= free            # the images alone fit; the chain of three not
    path = _suite(tmp_path, size=f"{size}MiB", snapshots=2, guest=False, baseline=False)
    done = cli_result("run", str(path), "--db", str(tmp_path / "r.db"), cwd=tmp_path)
    assert done.returncode == ExitStatus.TARGET, done.stdout + done.stderr
    lines = [line for line in done.stderr.strip().splitlines() if "hint:" not in line]
    assert len(lines) == 1 and "3 volume(s)" in lines[0], done.stderr
    path.write_text(path.read_text().replace('"metadata"', '"full"')
                    .replace(f'"{size}MiB"', '"8MiB"'))
    done = cli_result("run", str(path), "--db", str(tmp_path / "r.db"), cwd=tmp_path)
    assert done.returncode == ExitStatus.TARGET, done.stdout + done.stderr
    assert "preallocation off or metadata, not full" in done.stderr
    assert _made(standin) == [] and standin.ours("pve") == []


def test_stand_in_chain_is_written_as_pve_storage_does(standin: LvmStandin) -> None:
    """``ChainTarget`` on the stand-in: two snapshots make three LVs, the base a qcow2 of
    QEMU's cluster size, each overlay extended_l2 with 128k clusters over the LV below (as
    qemu-img reads them back); ``verify`` covers every LV of the chain; ``close`` removes all."""
    target = Target(lvm={"vg": "pve", "volume_chain": True, "snapshots": 2}, size="16MiB")
    opened = LvmKind().open(target, keep=False, author=US)
    assert isinstance(opened, ChainTarget)
    config = _config(mode="blocklayer")
    opened.check([config])
    image = opened.image(config)
    assert image.format == "qcow2" and image.is_device and len(image.backing) == 2
    info = json.loads(subprocess.run(
        ["qemu-img", "info", "--output=json", "--backing-chain", "-U", str(image.path)],
        capture_output=True, text=True, check=True, timeout=60).stdout)
    assert [i["filename"] for i in info] == [str(p) for p in (image.path, *image.backing)]
    assert [i["cluster-size"] for i in info] == [128 << 10, 128 << 10, 64 << 10]
    assert [i["format-specific"]["data"]["extended-l2"] for i in info] == [True, True, False]
    assert [i.get("backing-filename") for i in info] == [*map(str, image.backing), None]
    assert all(i["virtual-size"] == image.size for i in info)
    opened.verify([image])
    base = image.backing[-1]
    opened._devices[base] += 1                       # as if the base were another device now
    with pytest.raises(TargetError, match="no longer the volume iomatrix made"):
        opened.verify([image])
    assert len(standin.ours("pve")) == 3
    opened.close()
    assert standin.ours("pve") == []


@pytest.mark.slow
@needs("fio", "qemu")
def test_stand_in_chain_in_blocklayer_and_guest(tmp_path: Path, standin: LvmStandin,
                                                no_leftovers: None) -> None:
    """``iomatrix run`` on a qcow2 volume chain with one snapshot: the host baseline on a raw
    LV, blocklayer and a TCG guest on the qcow2 LV over its backing LV, both graphs as QEMU
    reports them carrying the chain (query-named-block-nodes); every LV gone at the end; the
    stored run says what it measured (the target's keys, the caveat)."""
    db = tmp_path / "r.db"
    done = cli_result("run", str(_suite(tmp_path)), "--db", str(db), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 trials ok, 0 failed" in done.stdout, done.stdout
    with Store(db, readonly=True) as store:
        run = store.load_run(1)
    by_mode = {t.config_key.split("/")[0]: t for t in run.trials}
    assert sorted(by_mode) == ["blocklayer", "guest", "host"]
    for mode in ("blocklayer", "guest"):
        applied = by_mode[mode].applied
        assert applied["disk0.driver"] == "qcow2", applied
        assert applied["disk0.backing-depth"] == "1" and applied["backing1.driver"] == "qcow2"
        assert applied["backing1.cache.direct"] == "true", applied
    made = _made(standin)
    qcow2 = sorted(n for n in made if "-qcow2-" in n)
    assert len(made) == 3 and len(qcow2) == 2 and qcow2[1] == qcow2[0] + "-snap1", made
    assert standin.ours("pve") == [] and sorted(standin.volumes("pve")) == ["data"]
    assert sorted(c[-1] for c in standin.commands() if c[0] == "lvremove") == sorted(
        f"pve/{n}" for n in made)
    target = run.suite.suite.target if run.suite.suite else None
    assert target is not None and target.lvm is not None
    assert target.lvm.volume_chain and target.lvm.snapshots == 1
    assert target.network is target.lvm and target.lvm.storage_kind == "lvm"
    assert any("Blockbridge" in note for note in run.notes), run.notes
    assert target.network is not None and target.network.caveat("qcow2") in run.notes


def _daemon_version() -> qemu_version.QemuVersion:
    found = qemu_version.installed("qemu-storage-daemon")
    assert found is not None, "qemu-storage-daemon --version says no version"
    return found


@needs("fio", "qemu")
def test_stand_in_chain_under_proxmox_on_an_old_qemu_is_refused_first(
        tmp_path: Path, standin: LvmStandin) -> None:
    """Proxmox VE 9's graph sets discard-no-unref on the chain's qcow2 nodes, which QEMU has
    from 8.1 on: with an older QEMU (this host's real one) the run is refused in one line,
    with a hint, before any volume is made, not failed trial by trial in QEMU's words."""
    found = _daemon_version()
    if found >= qemu_version.DISCARD_NO_UNREF:
        pytest.skip(f"QEMU {qemu_version.shown(found)} has discard-no-unref: "
                    "test_stand_in_chain_under_proxmox_runs_on_qemu_8_1 runs the chain instead")
    path = _suite(tmp_path, guest=False, baseline=False, platform="proxmox")
    done = cli_result("run", str(path), "--db", str(tmp_path / "r.db"), cwd=tmp_path)
    assert done.returncode == ExitStatus.ENVIRONMENT, done.stdout + done.stderr
    lines = [line for line in done.stderr.strip().splitlines() if "hint:" not in line]
    assert len(lines) == 1 and "discard-no-unref" in lines[0], done.stderr
    assert qemu_version.shown(found) in lines[0] and "8.1" in lines[0]
    assert 'platform = "qemu"' in done.stderr           # the hint
    assert _made(standin) == [] and standin.ours("pve") == []
    # iomatrix's own graph sets no discard-no-unref: test_stand_in_chain_in_blocklayer_and_guest
    # runs the same chain on this QEMU


@needs("fio", "qemu")
@pytest.mark.parametrize("platform,extra", [("libvirt", ""), ("proxmox", "pve_version = 8\n")])
def test_stand_in_chain_under_a_graph_without_one_is_refused_first(
        tmp_path: Path, standin: LvmStandin, platform: str, extra: str) -> None:
    """libvirt's graph and Proxmox VE 8's have no qcow2 backing chain: a suite asking for
    snapshots under them is refused in one line, with a hint, before any volume is made (the
    graph builder would refuse each trial)."""
    path = _suite(tmp_path, guest=False, baseline=False, platform=platform)
    path.write_text(path.read_text().replace(f'platform = "{platform}"\n',
                                             f'platform = "{platform}"\n{extra}'))
    done = cli_result("run", str(path), "--db", str(tmp_path / "r.db"), cwd=tmp_path)
    assert done.returncode == ExitStatus.SUITE_INVALID, done.stdout + done.stderr
    lines = [line for line in done.stderr.strip().splitlines() if "hint:" not in line]
    assert len(lines) == 1 and "has no qcow2 backing chain" in lines[0], done.stderr
    assert _made(standin) == [] and standin.ours("pve") == []


@pytest.mark.slow
@needs("fio", "qemu")
def test_stand_in_chain_under_proxmox_runs_on_qemu_8_1(tmp_path: Path, standin: LvmStandin,
                                                       no_leftovers: None) -> None:
    """Where QEMU has discard-no-unref (8.1+: Debian 13's 10.0, `.ci/debian13`), the chain
    under Proxmox VE 9's graph runs in blocklayer mode: QEMU reports the qcow2 over its backing
    LV; every LV is gone at the end."""
    found = _daemon_version()
    if found < qemu_version.DISCARD_NO_UNREF:
        pytest.skip(f"QEMU {qemu_version.shown(found)} lacks discard-no-unref (8.1+), which "
                    "Proxmox VE 9's graph of a chain sets: such a run is refused first")
    db = tmp_path / "r.db"
    path = _suite(tmp_path, guest=False, baseline=False, platform="proxmox")
    done = cli_result("run", str(path), "--db", str(db), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 trials ok, 0 failed" in done.stdout, done.stdout
    with Store(db, readonly=True) as store:
        trial, = store.load_run(1).trials
    assert trial.applied["disk0.driver"] == "qcow2", trial.applied
    assert trial.applied["disk0.backing-depth"] == "1", trial.applied
    assert trial.applied["backing1.driver"] == "qcow2", trial.applied
    made = _made(standin)
    assert len(made) == 2 and standin.ours("pve") == [], made


@pytest.mark.slow
@needs("fio", "qemu")
def test_stand_in_killed_chain_is_cleaned(tmp_path: Path, standin: LvmStandin,
                                          no_leftovers: None) -> None:
    """kill -9 while fio runs on a chain of two snapshots leaves its three LVs, each recorded
    before it was made; ``iomatrix clean`` removes every one of them and nothing else."""
    standin.run("lvcreate", "-L", "8m", "-n", "vm-100-disk-0.qcow2", "pve")
    db = tmp_path / "r.db"
    path = _suite(tmp_path, snapshots=2, runtime="60s", guest=False, baseline=False)
    proc = subprocess.Popen([sys.executable, "-m", "iomatrix", "run", str(path), "--db",
                             str(db)], cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not any("fio" in p for p in our_processes(str(tmp_path))):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.3)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    deadline = time.monotonic() + 30
    while our_processes(str(tmp_path)):          # fio and the daemon end as the run died
        assert time.monotonic() < deadline, our_processes(str(tmp_path))
        time.sleep(0.2)
    left = standin.ours("pve")
    assert len(left) == 3 and sorted(left) == sorted(_made(standin)), left
    done = cli_result("clean", "--db", str(db), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(standin.volumes("pve")) == ["data", "vm-100-disk-0.qcow2"]
    assert sorted(c[-1] for c in standin.commands() if c[0] == "lvremove") == sorted(
        f"pve/{n}" for n in left)
