"""``[target] storage = "local-lvm"`` on a simulated Proxmox VE host: through the pvesm kind
(``iomatrix.targets.pvesm``), with STAND-INS for Proxmox VE's ``pvesm`` and ``pvesh``
(tests/fixtures/standins: Proxmox VE cannot be installed here, this kernel has no
device-mapper) that hand out loop devices on backing files in the test's tmp directory, and a
``pveversion`` stand-in; everything after the allocation (fio, qemu-storage-daemon, QEMU, the
aio rules, reclaim, refusals) runs for real on those block devices. Never ran against a real
Proxmox VE host: pvesm's command line and output formats are followed from pve-storage's
source (PVE/CLI/pvesm.pm)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from iomatrix.store.repo import Store
from tests.conftest import TCG_GUEST, PVEVERSION, cli_result, our_processes, standin
from tests.platform.test_platform import LVM_STORAGES

STANDINS = Path(__file__).parents[1] / "fixtures" / "standins"
STORAGE_CFG = LVM_STORAGES + """
lvmthin: idle
\tthinpool data
\tvgname pve2
\tcontent images

zfspool: ctonly
\tpool rpool/ct
\tcontent rootdir
"""


@dataclass
class PveHost:
    """A simulated Proxmox VE host: its storage.cfg and the stand-ins' state."""

    cfg: Path
    state: Path

    def volumes(self) -> dict[str, dict[str, object]]:
        file = self.state / "volumes.json"
        return json.loads(file.read_text()) if file.exists() else {}

    def vms(self) -> list[dict[str, object]]:
        file = self.state / "vms.json"
        return json.loads(file.read_text()) if file.exists() else []


def _loops_of(state: Path) -> list[str]:
    """The loop devices whose backing file is in ``state``."""
    out = subprocess.run(["losetup", "-a", "-n", "-O", "NAME,BACK-FILE"], capture_output=True,
                         text=True).stdout
    return [line.split()[0] for line in out.splitlines()
            if len(line.split()) > 1 and line.split()[1].startswith(str(state))]


@pytest.fixture
def pve_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[PveHost]:
    """This process on a simulated Proxmox VE host: the pvesm and pvesh STAND-INS and a
    pveversion stand-in first on PATH; every loop device the stand-in made detached at the
    end."""
    folder = tmp_path / "pve-bin"
    standin(folder, "pveversion", PVEVERSION[9])
    for program in ("pvesm", "pvesh"):
        (folder / program).symlink_to(STANDINS / program)
    state = tmp_path / "pvesm-state"
    state.mkdir()
    cfg = tmp_path / "pve" / "storage.cfg"
    cfg.parent.mkdir()
    cfg.write_text(STORAGE_CFG)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PVESM_STANDIN_DIR", str(state))
    monkeypatch.setenv("PVESM_STANDIN_CFG", str(cfg))
    monkeypatch.setenv("PVESM_STANDIN_SIZE", str(256 << 20))
    try:
        yield PveHost(cfg=cfg, state=state)
    finally:
        for device in _loops_of(state):
            subprocess.run(["losetup", "-d", device], capture_output=True)
        assert _loops_of(state) == []


def suite(tmp_path: Path, storage: str = "local-lvm", size: str = "16MiB",
          body: str = "") -> Path:
    path = tmp_path / "pvesm.toml"
    path.write_text(f"""[suite]
name = "pvesm-test"
[target]
storage = "{storage}"
size = "{size}"
[matrix]
cache = "none"
iothread = false
controller = "virtio-blk"
[[workloads]]
rw = "randwrite"
bs = "4k"
iodepth = 4
[method]
mode = "host"
baseline = false
runtime = "500ms"
ramp = "0s"
samples = 1
{TCG_GUEST}{body}""")
    return path


def run(tmp_path: Path, host: PveHost, path: Path) -> subprocess.CompletedProcess[str]:
    return cli_result("run", str(path), "--db", str(tmp_path / "r.db"), "--storage-cfg",
                      str(host.cfg), cwd=tmp_path)


@pytest.mark.slow
def test_local_lvm_through_pvesm_in_every_mode(tmp_path: Path, pve_host: PveHost,
                                               no_leftovers: None) -> None:
    """``storage = "local-lvm"`` on a simulated Proxmox VE host (pvesm STAND-IN): host,
    blocklayer and guest (TCG) modes measure volumes ``pvesm alloc`` made under the VM id
    iomatrix reserved (named iomatrix-volumes), opened as qemu-server opens an lvmthin volume
    (host_device, aio io_uring by default), and every volume is freed at the end."""
    path = suite(tmp_path, body='[[part]]\nmode = "blocklayer"\n[[part]]\nmode = "guest"\n')
    done = run(tmp_path, pve_host, path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 trials ok, 0 failed" in done.stdout
    (vm,) = pve_host.vms()
    assert vm["name"] == "iomatrix-volumes" and int(str(vm["vmid"])) >= 999_990_000
    assert "Proxmox VE storage local-lvm (lvmthin)" in done.stderr
    assert f"volumes belong to VM {vm['vmid']}" in done.stderr
    with Store(tmp_path / "r.db", readonly=True) as store:
        stored = store.load_run(1)
    assert stored.host["target"] == "Proxmox VE storage local-lvm (lvmthin)"
    settings = {t.config_key.split("/")[0]: dict(t.applied) for t in stored.trials}
    assert settings["blocklayer"]["file0.driver"] == "host_device"
    assert pve_host.volumes() == {}
    assert _loops_of(pve_host.state) == []


@pytest.mark.slow
def test_kill_9_then_clean_frees_the_volume(tmp_path: Path, pve_host: PveHost) -> None:
    """A run killed with SIGKILL leaves its volume (recorded before ``pvesm alloc``);
    ``iomatrix clean`` frees it through pvesm, and only it: a volume of another VM on the same
    storage stays."""
    subprocess.run(["pvesm", "alloc", "local-lvm", "100", "vm-100-disk-0", "16M"], check=True,
                   capture_output=True)
    path = suite(tmp_path, body="").read_text().replace('runtime = "500ms"', 'runtime = "60s"')
    (tmp_path / "long.toml").write_text(path)
    db = tmp_path / "r.db"
    proc = subprocess.Popen([sys.executable, "-m", "iomatrix", "run", str(tmp_path / "long.toml"),
                             "--db", str(db), "--storage-cfg", str(pve_host.cfg)],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(pve_host.volumes()) < 2:
        time.sleep(0.1)
    mine = [v for v in pve_host.volumes() if "iomatrix-" in v]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdout.close()          # type: ignore[union-attr]
    proc.stderr.close()          # type: ignore[union-attr]
    assert len(mine) == 1, pve_host.volumes()
    gone = time.monotonic() + 30          # its fio gets SIGTERM as iomatrix dies (orphan_guard)
    while our_processes(str(tmp_path)) and time.monotonic() < gone:
        time.sleep(0.1)
    assert mine[0] in pve_host.volumes()
    cleaned = cli_result("clean", "--db", str(db), cwd=tmp_path)
    assert cleaned.returncode == 0, cleaned.stdout + cleaned.stderr
    assert list(pve_host.volumes()) == ["local-lvm:vm-100-disk-0"]


@pytest.mark.parametrize("case", ["inactive", "content", "space", "disabled"])
def test_refusals_are_one_line(tmp_path: Path, pve_host: PveHost, case: str) -> None:
    """An inactive storage, one without ``images`` content and one without room for the run's
    volumes are refused in one line before anything is allocated or reserved."""
    storage, size = {"inactive": ("idle", "16MiB"), "content": ("ctonly", "16MiB"),
                     "space": ("local-lvm", "1GiB"), "disabled": ("thick", "16MiB")}[case]
    if case == "disabled":
        pve_host.cfg.write_text(STORAGE_CFG.replace("\tvgname vg0\n", "\tvgname vg0\n\tdisable 1\n"))
    os.environ["PVESM_STANDIN_INACTIVE"] = "idle"
    try:
        done = run(tmp_path, pve_host, suite(tmp_path, storage, size))
    finally:
        del os.environ["PVESM_STANDIN_INACTIVE"]
    assert done.returncode != 0
    lines = [line for line in done.stderr.strip().splitlines() if "hint:" not in line]
    assert len(lines) == 1, done.stderr
    assert {"inactive": "storage idle (lvmthin) is inactive",
            "content": "storage ctonly does not hold VM disk images",
            "space": "need 1.0 GiB, it has",
            "disabled": "storage thick is disabled"}[case] in lines[0]
    assert pve_host.volumes() == {} and pve_host.vms() == []


def test_the_vm_id_is_reserved_once_and_never_another_vms(pve_host: PveHost) -> None:
    """Two runs that chose the same free id: the first makes the VM iomatrix-volumes, the
    second finds it made and uses it; an id another VM takes meanwhile is refused, and a VM
    named iomatrix-volumes outside iomatrix's range is not taken for its own (pvesh STAND-IN)."""
    from iomatrix.core.errors import TargetError
    from iomatrix.targets.pvesm import VMIDS, PvesmBackend

    (pve_host.state / "vms.json").write_text(json.dumps([
        {"vmid": 100, "name": "iomatrix-volumes", "type": "qemu", "node": "pve"},
        {"vmid": VMIDS.start, "name": "web", "type": "qemu", "node": "pve"}]))
    first, second = PvesmBackend("local-lvm"), PvesmBackend("local-lvm")
    first.check(1, 1 << 20)
    second.check(1, 1 << 20)
    assert first.vmid == second.vmid == VMIDS.start + 1
    first.reserve()
    second.reserve()
    assert [vm["vmid"] for vm in pve_host.vms() if vm["name"] == "iomatrix-volumes"] == [
        100, VMIDS.start + 1]
    late = PvesmBackend("local-lvm")
    late.check(1, 1 << 20)
    assert late.vmid == VMIDS.start + 1 and late.prefix == f"vm-{VMIDS.start + 1}-"
    taken = PvesmBackend("local-lvm", vmid=None)
    taken.vmid = VMIDS.start          # as if chosen before "web" took it
    with pytest.raises(TargetError, match="already exists"):
        taken.reserve()


def test_on_a_proxmox_host_the_storage_id_is_the_hosts(tmp_path: Path, pve_host: PveHost,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Without --storage-cfg a storage id is read from the host's own storage.cfg (its
    Proxmox VE directory: $IOMATRIX_PVE_DIR here, /etc/pve on a host); on thick LVM a matrix
    without aio plans qemu-server's aio there: native with cache=none, threads with
    writeback."""
    path = suite(tmp_path, "thick").read_text().replace('cache = "none"',
                                                         'cache = ["none", "writeback"]')
    (tmp_path / "thick.toml").write_text(path.replace('mode = "host"', 'mode = "blocklayer"'))
    refused = cli_result("run", str(tmp_path / "thick.toml"), "--plan", cwd=tmp_path)
    assert refused.returncode != 0 and "give --storage-cfg" in refused.stderr
    monkeypatch.setenv("IOMATRIX_PVE_DIR", str(pve_host.cfg.parent))
    plan = cli_result("run", str(tmp_path / "thick.toml"), "--plan", cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr
    assert "blocklayer native/none/raw" in plan.stdout
    assert "blocklayer threads/writeback/raw" in plan.stdout
    assert "io_uring" not in plan.stdout
    assert pve_host.volumes() == {} and pve_host.vms() == []


def test_what_pvesm_refuses_ends_the_run_in_one_line(tmp_path: Path, pve_host: PveHost) -> None:
    """A volume pvesm will not allocate (a dir storage wants a file name with its format's
    extension: Plugin.pm alloc_image) ends the run in one line with pvesm's own words, and
    nothing is left allocated (pvesm STAND-IN)."""
    pve_host.cfg.write_text(STORAGE_CFG + "\ndir: local\n\tpath " + str(tmp_path / "vz")
                            + "\n\tcontent images\n")
    text = suite(tmp_path).read_text().replace('storage = "local-lvm"',
                                               'pvesm = { storage = "local", type = "dir" }')
    (tmp_path / "dir.toml").write_text(text)
    done = cli_result("run", str(tmp_path / "dir.toml"), "--db", str(tmp_path / "r.db"),
                      cwd=tmp_path)
    assert done.returncode != 0
    lines = [line for line in done.stderr.strip().splitlines()
             if line.startswith("iomatrix:") and "hint:" not in line]
    assert len(lines) == 1 and "pvesm alloc local" in lines[0], done.stderr
    assert "wrong extension" in lines[0]
    assert pve_host.volumes() == {}
