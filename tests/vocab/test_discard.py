"""The ``discard`` axis (issue 32: an axis added through its one home, ``iomatrix.vocab.axes``):
its declaration and what is derived from it, a suite that does not name it (nothing changes),
its renderings on every platform against qemu-server's own expectations, and a real
qemu-storage-daemon holding each platform's graph for both levels, where the level shows: a
discard sent through the export frees the image's blocks under unmap and leaves them under
ignore (QMP does not report a node's discard mode), and Proxmox VE's detect-zeroes follows it."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
import typing
from pathlib import Path
from typing import Any

import pytest

from iomatrix.core.errors import SuiteError
from iomatrix.platform import PLATFORMS
from iomatrix.platform import libvirt as lv
from iomatrix.platform import proxmox as pve
from iomatrix.platform.settings import DiskImage
from iomatrix.qemu.args import storage_daemon_argv
from iomatrix.qemu.qmp import qmp_execute
from iomatrix.qemu.blockdev import daemon_graph
from iomatrix.recommend.decide import recommend
from iomatrix.store import Store
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.expand import expand
from iomatrix.suite.findings import Finding
from iomatrix.suite.load import load_suite_text
from iomatrix.targets.kind import Image
from iomatrix.suite.workloads import Workload
from iomatrix.testing.synthetic import Figures, configurations, write_run
from iomatrix.vocab.axes import AXIS_VALUES, BLOCKLAYER_AXES, CONFIG_AXES, MODE_AXES, PARAMETERS
from iomatrix.translate.vm import translate
from tests.platform.test_cfg2cmd import ALL as CFG2CMD
from tests.platform.test_cfg2cmd import STORAGES, VMID

SUITE = """
[suite]
name = "discard"
[target]
directory = "/srv/bench"
size = "64MiB"
[method]
mode = "{mode}"
[matrix]
aio = "io_uring"
cache = "none"
{matrix}
[[workloads]]
rw = "randwrite"
"""


def axis_suite(mode: str = "blocklayer", matrix: str = "") -> Any:
    """A suite of one configuration of ``mode`` whose [matrix] adds ``matrix`` (the axis a test
    is about; test_affinity's too)."""
    return load_suite_text(SUITE.format(mode=mode, matrix=matrix))


# -- the declaration and what follows from it -------------------------------------------------

def test_declared_once_and_derived() -> None:
    assert "discard" in CONFIG_AXES and "discard" in PARAMETERS
    assert AXIS_VALUES["discard"] == ("ignore", "unmap")
    assert typing.get_args(Configuration.model_fields["discard"].annotation) == (
        typing.Literal["ignore", "unmap"], type(None))
    assert "discard" in MODE_AXES["blocklayer"] and "discard" in MODE_AXES["guest"]
    assert "discard" in BLOCKLAYER_AXES and "discard" not in MODE_AXES["host"]
    config = Configuration(mode="guest", controller="virtio-blk", aio="native", cache="none",
                           format="raw", discard="unmap")
    assert config.key.endswith("/format=raw/discard=unmap")
    assert config.label == "guest virtio-blk/native/none/raw discard=unmap"
    claim = Finding(id="d", study="s", claim="c", published="p", kind="effect", axis="discard",
                    level="unmap", reference="ignore", expect="worse")
    assert claim.checked_modes == ("guest", "blocklayer")
    with pytest.raises(ValueError, match="discard has no level 'on'"):
        Finding(id="d", study="s", claim="c", published="p", kind="effect", axis="discard",
                level="on", reference="ignore", expect="worse")


def test_a_suite_without_it_is_as_before() -> None:
    """No discard in [matrix]: no configuration names it (keys, labels and stored params as
    before the axis), and recommend decides it only for a run that measured it."""
    plain = expand(axis_suite())
    assert all(c.discard is None and "discard" not in c.key for c in plain.configurations)
    both = expand(axis_suite(matrix='discard = ["ignore", "unmap"]'))
    keys = [c.key for c in both.configurations if c.mode == "blocklayer"]
    assert [k.rpartition("/")[2] for k in keys] == ["discard=ignore", "discard=unmap"]


def _run(tmp_path: Path, discard: list[str | None]) -> Any:
    """A stored guest run over ``discard`` (None: a run that does not name it) in which unmap
    measures twice the IOPS."""
    configs = configurations("guest", {"controller": ["virtio-scsi-single"], "aio": ["io_uring"],
                                       "iothread": [True], "cache": ["none"], "format": ["raw"],
                                       "preallocation": ["off"], "discard": discard})

    def figures(config: Configuration, workload: Workload, index: int) -> Figures:
        iops = (2000.0 if config.discard == "unmap" else 1000.0) + index
        return Figures(iops=iops, bw_bytes=iops * 4096, lat_mean_ns=1e9 / iops, p99_ns=2e9 / iops)

    store = Store(tmp_path / "r.db")
    run_id = write_run(store, configs, [Workload(rw="randwrite", bs=4096, iodepth=1)], figures,
                       samples=6)
    return store.load_run(run_id)


def test_recommend_decides_it_only_where_measured(tmp_path: Path) -> None:
    plain = recommend(_run(tmp_path, [None]), "proxmox")
    assert "discard" not in [d.axis for d in plain.decisions]
    assert "discard" not in plain.config.key
    both = recommend(_run(tmp_path, ["ignore", "unmap"]), "proxmox")
    (decided,) = [d for d in both.decisions if d.axis == "discard"]
    assert (decided.name, decided.default.level, decided.value) == (
        "Discard (discard=on)", "ignore", "unmap")
    assert both.config.discard == "unmap"
    assert ",discard=on" in PLATFORMS["proxmox"].pasted(both.config).text


def test_a_level_it_does_not_have_is_refused_in_one_line() -> None:
    with pytest.raises(SuiteError) as caught:
        axis_suite(matrix='discard = "on"')
    assert "discard" in str(caught.value) and "\n" not in str(caught.value).strip()


def test_host_mode_says_it_is_ignored() -> None:
    notes = expand(axis_suite("host", 'discard = ["unmap"]')).notes
    assert any("discard is ignored in host mode" in n for n in notes)


# -- its renderings ---------------------------------------------------------------------------

def _nodes(argv: list[str] | tuple[str, ...]) -> list[dict[str, Any]]:
    return [json.loads(argv[i + 1]) for i, a in enumerate(argv) if a in ("-blockdev",
                                                                          "--blockdev")]


def _flatten(node: dict[str, Any]) -> list[dict[str, Any]]:
    """A nested -blockdev (qemu-server's) as its nodes, top down."""
    out = [node]
    while isinstance(node.get("file"), dict):
        node = node["file"]
        out.append(node)
    return out


@pytest.mark.parametrize("level", ["ignore", "unmap"])
def test_every_platform_renders_it(level: str) -> None:
    config = Configuration(mode="guest", controller="virtio-blk", aio="io_uring", cache="none",
                           format="qcow2", discard=level)
    image = DiskImage(path="/srv/disk.qcow2")
    qemu = _nodes(PLATFORMS["qemu"].guest_disk_argv(config, image))
    assert [n["discard"] for n in qemu] == [level, level]
    pve_option = {"ignore": "ignore", "unmap": "on"}[level]
    zeroes = {"ignore": "on", "unmap": "unmap"}[level]
    pve8 = pve.guest_disk_argv(config, image, 8)
    drive = next(a for a in pve8 if a.startswith("file="))
    assert f",discard={pve_option}," in drive and drive.endswith(f",detect-zeroes={zeroes}")
    (top,) = _nodes(pve.guest_disk_argv(config, image, 9))
    assert {(n["discard"], n["detect-zeroes"]) for n in _flatten(top)} == {(level, zeroes)}
    assert f",discard={pve_option}" in PLATFORMS["proxmox"].pasted(config).text
    assert f"discard='{level}'" in PLATFORMS["libvirt"].pasted(config).text
    for versions in (lv.Versions(libvirt=(9, 0, 0), qemu=(7, 2, 0)),
                     lv.Versions(libvirt=(11, 3, 0), qemu=(10, 0, 0))):
        nodes = _nodes(lv.guest_disk_argv(config, image, versions))
        assert nodes[-1]["discard"] == level          # the node the device sits on decides


def test_unnamed_renders_as_before() -> None:
    config = Configuration(mode="guest", controller="virtio-blk", aio="io_uring", cache="none",
                           format="raw")
    image = DiskImage(path="/srv/disk.raw")
    assert all("discard" not in n for n in _nodes(PLATFORMS["qemu"].guest_disk_argv(config,
                                                                                     image)))
    assert "discard" not in PLATFORMS["libvirt"].pasted(config).text
    assert "discard" not in PLATFORMS["proxmox"].pasted(config).text
    assert "discard" not in next(a for a in pve.guest_disk_argv(config, image, 8)
                                 if a.startswith("file="))


@pytest.mark.parametrize("fixture", [f for f in CFG2CMD if f.name == "simple-lvmthin"],
                         ids=lambda f: f.folder)
def test_proxmox_rendering_is_qemu_servers(fixture: Any) -> None:
    """simple-lvmthin's scsi0 is ``local-lvm:…,discard=on`` on virtio-scsi-pci: the drive
    iomatrix writes for discard = unmap is that line, and it becomes the arguments
    qemu-server's own test expects (PVE 8: -drive …,discard=on,…,detect-zeroes=unmap;
    PVE 9: discard and detect-zeroes unmap on every node)."""
    line = next(v for k, v in (ln.split(": ", 1) for ln in fixture.config.splitlines())
                if k == "scsi0")
    volume = line.split(",")[0]
    drive, scsihw = pve.drive_for("virtio-scsi", volume=volume, aio=None, cache=None,
                                  iothread=False, discard="unmap")
    ours = ",".join([drive.volume, *(f"{k}={v}" for k, v in drive.options)])
    assert (drive.key, scsihw, f"{ours},size=104858K") == ("scsi0", "virtio-scsi-pci", line)
    version = 8 if fixture.folder.endswith("8.3.13") else 9
    result = translate(fixture.config, pve_version=version,  # type: ignore[arg-type]
                       storages=STORAGES, vmid=VMID)
    (read,) = [d for d in result.disks if d.name == "scsi0"]
    assert read.config is not None and read.config.discard == "unmap"
    again, _ = pve.drive_for("virtio-scsi", volume=volume, aio=None, cache=None, iothread=False,
                             discard=read.config.discard)
    assert again == drive
    argv = next(d.argv for d in result.drives if d.name == "scsi0")
    assert [(argv[i], argv[i + 1]) for i in range(0, len(argv), 2)] == fixture.drives["scsi0"]
    assert "detect-zeroes" in " ".join(argv) and "unmap" in " ".join(argv)


def test_translate_reads_it_from_every_cfg2cmd_fixture() -> None:
    """Every disk of qemu-server's fixtures: ``discard=on`` is read as unmap, ``ignore`` as
    ignore, none as none; and where qemu-server's own expected -drive (PVE 8) or -blockdev
    (PVE 9) holds the disk, its discard and detect-zeroes are what that level gives."""
    seen, checked = {"unmap": 0, None: 0}, 0
    for fixture in CFG2CMD:
        if fixture.error is not None:
            continue
        version = 8 if fixture.folder.endswith("8.3.13") else 9
        result = translate(fixture.config, pve_version=version,  # type: ignore[arg-type]
                           storages=STORAGES, vmid=VMID)
        lines = dict(ln.split(": ", 1) for ln in fixture.config.splitlines() if ": " in ln)
        for disk in result.disks:
            if disk.values is None:
                continue
            given = dict(o.split("=", 1) for o in lines[disk.name].split(",")[1:] if "=" in o)
            level = {"on": "unmap", "ignore": "ignore", None: None}[given.get("discard")]
            assert disk.values.discard == level, (fixture.name, disk.name)
            seen[level] = seen.get(level, 0) + 1
            if disk.config is not None:
                assert disk.config.discard == level
            args = fixture.drives.get(disk.name, [])
            drives = [v for f, v in args if f == "-drive"]
            nodes = [v for f, v in args if f == "-blockdev"]
            for drive in drives:                    # PVE 8: the option as the user wrote it
                assert (",discard=on," in drive) == (level == "unmap")
                assert ("detect-zeroes=unmap" in drive) == (level == "unmap")
            for node in nodes:                      # PVE 9: on every node of the disk
                shown = "unmap" if level == "unmap" else "ignore"
                assert f'"discard":"{shown}"' in node and f'"discard":"{_other(shown)}"' not in node
                checked += 1
            checked += len(drives)
    assert seen["unmap"] > 100 and seen[None] > 10 and checked > 100


def _other(level: str) -> str:
    return "ignore" if level == "unmap" else "unmap"


# -- a real qemu-storage-daemon, both levels, every platform's graph --------------------------

GRAPHS: list[tuple[str, Any]] = [
    ("qemu", None), ("proxmox", 8), ("proxmox", 9),
    ("libvirt", lv.Versions(libvirt=(9, 0, 0), qemu=(7, 2, 0))),
    ("libvirt", lv.Versions(libvirt=(11, 3, 0), qemu=(10, 0, 0)))]
SIZE = 4 << 20


def _allocated(path: Path) -> int:
    return os.stat(path).st_blocks * 512


def _wait_for(path: Path, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 20
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            out = proc.stdout.read().decode() if proc.stdout else ""
            raise AssertionError(f"qemu-storage-daemon did not start: {out}")
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.parametrize("platform, version", GRAPHS,
                         ids=["qemu", "pve8", "pve9", "libvirt9", "libvirt11"])
@pytest.mark.parametrize("level", ["ignore", "unmap"])
def test_daemon_passes_discard_down_only_under_unmap(tmp_path: Path, no_leftovers: None,
                                                     platform: str, version: Any,
                                                     level: str) -> None:
    path = tmp_path / "disk.raw"
    path.write_bytes(os.urandom(SIZE))
    os.sync()
    assert _allocated(path) >= SIZE
    config = Configuration(mode="blocklayer", aio="threads", cache="writeback", format="raw",
                           preallocation="off", iothread=False, discard=level)
    image = Image(path=path, format="raw", preallocation="off", size=SIZE)
    kw: dict[str, Any] = {"pve_version": version} if platform == "proxmox" else (
        {"libvirt": version} if platform == "libvirt" else {})
    qmp, nbd = tmp_path / "qmp.sock", tmp_path / "nbd.sock"
    node = daemon_graph(config, path, platform=platform, **kw).export_node  # type: ignore[arg-type]
    argv = storage_daemon_argv(config, image, qmp_socket=qmp,
                               platform=platform, **kw)  # type: ignore[arg-type]
    argv += ["--nbd-server", f"addr.type=unix,addr.path={nbd}",
             "--export", f"type=nbd,id=e0,node-name={node},writable=on"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        _wait_for(nbd, proc)
        (nodes,) = qmp_execute(qmp, [("query-named-block-nodes", None)])
        done = subprocess.run(["qemu-io", "-f", "raw", f"nbd+unix:///{node}?socket={nbd}",
                               "-c", f"discard 0 {SIZE}"], capture_output=True, text=True,
                              timeout=30)
        assert done.returncode == 0, done.stdout + done.stderr
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    if level == "unmap":
        assert _allocated(path) < SIZE // 4, shlex.join(argv)
    else:
        assert _allocated(path) >= SIZE, shlex.join(argv)
    zeroes = {n["detect_zeroes"] for n in nodes}
    if platform == "proxmox":     # qemu-server: detect-zeroes=unmap with discard=on
        assert zeroes - {"off"} == {"unmap" if level == "unmap" else "on"}
    else:
        assert zeroes == {"off"}
