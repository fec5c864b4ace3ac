"""blocklayer mode with ``[method] platform = "proxmox"``: qemu-storage-daemon holds the layers a
Proxmox VE disk has for the same settings (PVE 8: detect-zeroes on the format node; PVE 9:
detect-zeroes and discard on every node, a throttle filter over an empty throttle group), the
export on top; with "libvirt", libvirt's storage and format nodes; what the daemon applied is
read back over QMP and compared."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from iomatrix.drivers.blocklayer import BlocklayerDriver, daemon_argv, read_graph
from iomatrix.fio.jobfile import job_text
from iomatrix.fio.run import run_fio
from iomatrix.measure.runner import run_suite
from iomatrix.platform import libvirt as lv
from iomatrix.platform import proxmox as pve
from iomatrix.qemu.blockdev import daemon_graph, expected_daemon_graph
from iomatrix.store import Store
from iomatrix.suite import load_suite
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.method import Method
from iomatrix.suite.target import Target
from iomatrix.suite.workloads import Workload
from iomatrix.targets.workspace import Image, Workspace
from tests.conftest import PVEVERSION, pve_host, write_suite

PLATFORMS: list[tuple[str, int | None]] = [("qemu", None), ("proxmox", 8), ("proxmox", 9),
                                           ("libvirt", None)]


def _method(platform: str, version: int | None, **kw: Any) -> Method:
    return Method(mode="blocklayer", platform=platform, pve_version=version, **kw)


def _config(**kw: Any) -> Configuration:
    values: dict[str, Any] = dict(mode="blocklayer", aio="io_uring", cache="none", format="raw",
                                  iothread=False, preallocation="off")
    return Configuration(**(values | kw))


def _blockdevs(argv: list[str], flag: str) -> list[dict[str, Any]]:
    return [json.loads(argv[i + 1]) for i, a in enumerate(argv) if a == flag]


# -- building (pure) --------------------------------------------------------------------------

def test_daemon_argv_per_platform(tmp_path: Path) -> None:
    image = Image(path=tmp_path / "disk.raw", format="raw", preallocation="off", size=1 << 20)
    config = _config()
    qemu = daemon_argv(config, image, tmp_path, "qsd", _method("qemu", None))
    assert [n["node-name"] for n in _blockdevs(qemu, "--blockdev")] == ["file0", "disk0"]
    assert "--object" not in qemu and "node-name=disk0" in qemu[-1]
    assert all("detect-zeroes" not in n and "discard" not in n for n in _blockdevs(qemu, "--blockdev"))

    pve8 = daemon_argv(config, image, tmp_path, "qsd", _method("proxmox", 8))
    assert "--object" not in pve8
    (fmt,) = _blockdevs(pve8, "--blockdev")
    assert (fmt["driver"], fmt["detect-zeroes"], fmt["discard"]) == ("raw", "on", "ignore")
    assert fmt["file"]["discard"] == "unmap" and "detect-zeroes" not in fmt["file"]
    assert fmt["file"]["aio"] == "io_uring" and fmt["file"]["cache"]["direct"] is True
    assert f"node-name={fmt['node-name']}," in pve8[-1]

    pve9 = daemon_argv(config, image, tmp_path, "qsd", _method("proxmox", 9))
    (group,) = _blockdevs(pve9, "--object")
    assert group == {"id": "throttle-drive-virtio0", "limits": {}, "qom-type": "throttle-group"}
    (top,) = _blockdevs(pve9, "--blockdev")
    assert (top["driver"], top["node-name"], top["throttle-group"]) == (
        "throttle", "drive-virtio0", "throttle-drive-virtio0")
    nodes = [top, top["file"], top["file"]["file"]]
    assert [n["driver"] for n in nodes] == ["throttle", "raw", "file"]
    assert all((n["detect-zeroes"], n["discard"]) == ("on", "ignore") for n in nodes)
    assert "node-name=drive-virtio0," in pve9[-1]
    # the same nodes as guest mode's -blockdev for this disk (one source: platform.proxmox)
    drive, scsihw = pve.drive_for("virtio-blk", volume=str(image.path), aio="io_uring",
                                  cache="none", iothread=False)
    guest = pve.disk_args(drive, pve.resolve_volume(drive), scsihw=scsihw, version=9).argv
    assert json.loads(guest[guest.index("-blockdev") + 1]) == top

    # libvirt 9 with QEMU 7.2: its storage node and a format node over it, also for raw; the
    # same nodes as the guest's disk gets (one source: platform.libvirt)
    old = lv.Versions(libvirt=(9, 0, 0), qemu=(7, 2, 0))
    libvirt = daemon_argv(config, image, tmp_path, "qsd", _method("libvirt", None), old)
    storage, fmt = _blockdevs(libvirt, "--blockdev")
    assert (storage["node-name"], fmt["node-name"], fmt["file"]) == (
        "libvirt-1-storage", "libvirt-1-format", "libvirt-1-storage")
    assert (storage["auto-read-only"], storage["discard"], storage["aio"]) == (True, "unmap",
                                                                             "io_uring")
    assert fmt["driver"] == "raw" and "node-name=libvirt-1-format," in libvirt[-1]
    disk, threads = lv.disk_for("virtio-blk", source=str(image.path), block=False,
                                aio="io_uring", cache="none", iothread=False)
    guest = list(lv.disk_args(disk, old, iothreads=threads).argv)
    assert [json.loads(guest[i + 1]) for i, a in enumerate(guest) if a == "-blockdev"] == [
        storage, fmt]
    # libvirt 11.3 with QEMU 10.0: the export sits on the storage node, which is not
    # auto-read-only and has no discard of its own; a block device's test area is a raw slice
    new = lv.Versions(libvirt=(11, 3, 0), qemu=(10, 0, 0))
    libvirt = daemon_argv(config, image, tmp_path, "qsd", _method("libvirt", None), new)
    (storage,) = _blockdevs(libvirt, "--blockdev")
    assert (storage["node-name"], storage["read-only"]) == ("libvirt-1-storage", False)
    assert "auto-read-only" not in storage and "discard" not in storage
    assert "node-name=libvirt-1-storage," in libvirt[-1]
    device = image.model_copy(update={"is_device": True})
    libvirt = daemon_argv(config, device, tmp_path, "qsd", _method("libvirt", None), new)
    storage, sliced = _blockdevs(libvirt, "--blockdev")
    assert (storage["driver"], storage["auto-read-only"]) == ("host_device", True)
    assert (sliced["driver"], sliced["file"], sliced["size"]) == ("raw", "libvirt-1-storage",
                                                                  1 << 20)
    assert "node-name=libvirt-1-slice-sto," in libvirt[-1]


def test_discard_on_gives_unmap_everywhere() -> None:
    """Drive.pm: discard=on → detect-zeroes=unmap, discard unmap on every node (PVE 9)."""
    drive = pve.parse_drive("virtio0", "/img.raw,discard=on,cache=none")
    volume = pve.resolve_volume(drive, is_device=False)
    top = json.loads(pve.daemon_graph(drive, volume, version=9).blockdev)
    for node in (top, top["file"], top["file"]["file"]):
        assert (node["detect-zeroes"], node["discard"]) == ("unmap", "unmap")
    assert pve.daemon_detect_zeroes(drive, 8) == {"protocol": "off", "format": "unmap"}
    off = pve.parse_drive("virtio0", "/img.raw,detect_zeroes=0")
    assert set(pve.daemon_detect_zeroes(off, 9).values()) == {"off"}


def test_expected_graph_per_platform() -> None:
    config = _config(cache="unsafe", aio="threads")
    qemu = expected_daemon_graph(config)
    assert qemu["file0.detect-zeroes"] == qemu["disk0.detect-zeroes"] == "off"
    assert (qemu["export.node"], qemu["throttle-groups"]) == ("disk0", "0")
    assert "throttle0.driver" not in qemu
    pve8 = expected_daemon_graph(config, platform="proxmox", pve_version=8)
    assert (pve8["file0.detect-zeroes"], pve8["disk0.detect-zeroes"]) == ("off", "on")
    pve9 = expected_daemon_graph(config, platform="proxmox", pve_version=9)
    assert {pve9[f"{n}.detect-zeroes"] for n in ("file0", "disk0", "throttle0")} == {"on"}
    assert (pve9["export.node"], pve9["throttle-groups"], pve9["throttle0.driver"]) == (
        "throttle0", "1", "throttle")
    assert pve9["disk0.cache.no-flush"] == "true" and pve9["throttle0.cache.no-flush"] == "false"
    assert expected_daemon_graph(config, platform="proxmox") == pve9   # 9 by default


# -- the daemon for real ----------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("platform, version", PLATFORMS)
@pytest.mark.parametrize("iothread", [False, True])
def test_daemon_applies_platform_graph(tmp_path: Path, no_leftovers: None, platform: str,
                                       version: int | None, iothread: bool) -> None:
    config = _config(iothread=iothread, format="qcow2" if iothread else "raw")
    method = _method(platform, version, ramp=0, runtime=0.5)
    target = Target(directory=tmp_path / "target", size=32 << 20)
    notes: list[str] = []
    # libvirt: the libvirt installed here with this QEMU (9.0 with 7.2 on Debian 12: a format
    # node over the raw disk; 11.3 with 10.0 on Debian 13: none)
    driver = BlocklayerDriver.prepare(method, tmp_path / "work", accel="tcg", note=notes.append)
    assert isinstance(driver, BlocklayerDriver)
    format_node = platform != "libvirt" or lv.has_format_node(
        str(config.format), driver.libvirt or lv.Versions())
    with Workspace(target) as ws:
        ws.open([config])
        with driver.session(config, ws.images(config)) as s:
            workload = Workload(rw="randwrite", bs=4096, iodepth=8)
            job = job_text(workload, target=s.fio_target(), ramp=0, runtime=0.5)
            run = run_fio(job, workdir=tmp_path, timeout=30, during=s.observe, during_at=0.5)
            # the runner's look after the trial: from QEMU 9.0 the aio ring appears at the first
            # write, which a loaded host can delay past the look while fio runs
            s.check_trial(run.result, workload)
            applied = s.applied()
            assert s.mismatches() == []
        assert run.result.jobs[0].write.iops > 0
    pve9 = version == 9
    zeroes = "on" if platform == "proxmox" else "off"
    assert applied.get("disk0.detect-zeroes") == (zeroes if format_node else None)
    assert applied["file0.detect-zeroes"] == ("on" if pve9 else "off")
    assert applied["throttle-groups"] == ("1" if pve9 else "0")
    assert applied["export.node"] == ("throttle0" if pve9 else "disk0" if format_node
                                      else "file0")
    assert applied.get("throttle0.driver") == ("throttle" if pve9 else None)
    assert applied.get("disk0.driver") == (config.format if format_node else None)
    assert applied["file0.driver"] == "file" and applied["file0.cache.direct"] == "true"
    assert applied.get("disk0.cache.direct") == ("true" if format_node else None)
    assert applied["aio"] == "io_uring"


@pytest.mark.slow
def test_wrong_graph_is_a_mismatch(tmp_path: Path, no_leftovers: None) -> None:
    """A daemon whose graph lacks PVE's layers is caught: the expectation is the platform's."""
    config = _config()
    target = Target(directory=tmp_path / "target", size=8 << 20)
    with Workspace(target) as ws:
        ws.open([config])
        with BlocklayerDriver(_method("proxmox", 9), tmp_path / "work").session(
                config, ws.images(config)) as s:
            s.nodes = {k: v for k, v in s.nodes.items() if not k.startswith("throttle0.")}
            s.nodes["disk0.detect-zeroes"] = "off"
            wrong = s.mismatches()
    assert "throttle0.driver: asked throttle, QEMU reports nothing" in wrong
    assert "disk0.detect-zeroes: asked on, QEMU reports off" in wrong


@pytest.mark.slow
def test_discard_on_daemon_reports_unmap(tmp_path: Path, no_leftovers: None) -> None:
    """A drive with discard=on (not an iomatrix setting, but qemu-server's rule): the daemon
    really gets detect-zeroes=unmap on every node, under the throttle filter."""
    path = tmp_path / "d.raw"
    path.write_bytes(b"")
    os_truncate(path, 8 << 20)
    drive = pve.parse_drive("virtio0", f"{path},discard=on,aio=io_uring,cache=none")
    graph = pve.daemon_graph(drive, pve.resolve_volume(drive, is_device=False), version=9)
    qmp = tmp_path / "qmp.sock"
    proc = subprocess.Popen(["qemu-storage-daemon", "--chardev",
                             f"socket,id=q,path={qmp},server=on,wait=off", "--monitor",
                             "chardev=q", "--object", graph.objects[0],
                             "--blockdev", graph.blockdev],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while not qmp.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        found = read_graph(qmp)
    finally:
        proc.terminate()
        proc.wait(10)
    assert {found[f"{n}.detect-zeroes"] for n in ("file0", "disk0", "throttle0")} == {"unmap"}
    assert found["throttle-groups"] == "1"


def os_truncate(path: Path, size: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(size)


@pytest.mark.slow
@pytest.mark.parametrize("version", [8, 9])
@pytest.mark.parametrize("chosen_by", ["suite", "pveversion"])
def test_blocklayer_trial_with_platform_proxmox(tmp_path: Path, no_leftovers: None,
                                                monkeypatch: pytest.MonkeyPatch, version: int,
                                                chosen_by: str) -> None:
    """Set in the suite, or on a PVE host (a stand-in pveversion: PVE cannot be installed
    here) for a suite that chooses no platform."""
    chosen = f'platform = "proxmox"\npve_version = {version}\n' if chosen_by == "suite" else ""
    if chosen_by == "pveversion":
        pve_host(tmp_path, monkeypatch, PVEVERSION[version])
    body = f"""
[matrix]
aio = ["io_uring"]
cache = ["none"]
format = ["raw"]
iothread = [false]
[workloads]
rw = "randread"
iodepth = 4
[method]
mode = "blocklayer"
{chosen}ramp = "0s"
runtime = "500ms"
precondition = false
"""
    suite = load_suite(write_suite(tmp_path, body, size="32MiB"))
    with Store(tmp_path / "r.db") as store:
        outcome = run_suite(suite, store)
        stored = store.load_run(outcome.run_id)
    assert (outcome.trials_ok, outcome.trials_failed) == (1, 0)
    (trial,) = stored.trials
    assert trial.status == "ok"
    assert trial.applied["disk0.detect-zeroes"] == "on"
    assert trial.applied["throttle-groups"] == ("1" if version == 9 else "0")
    assert ("throttle-group" in trial.command) == (version == 9)
    said = f"platform: proxmox (PVE {version}, from pveversion)"
    assert any(n.startswith(said) for n in stored.notes) == (chosen_by == "pveversion")
    assert stored.suite.written_method["pve_version"] == version      # what --resume reads


def test_graph_export_node_matches_argv(tmp_path: Path) -> None:
    config = _config()
    for platform, version in PLATFORMS:
        graph = daemon_graph(config, tmp_path / "d.raw", platform=platform,  # type: ignore[arg-type]
                             pve_version=version)  # type: ignore[arg-type]
        top = json.loads(graph.blockdevs[-1])
        assert graph.export_node == top["node-name"]
