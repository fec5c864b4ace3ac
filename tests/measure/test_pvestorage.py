"""On a Proxmox VE host the main job measures where the host's VMs live (iomatrix.measure.
pvestorage), or the storage ``--storage ID`` names; --plan and the run's notes say which and
why, recommend names it, and a storage where no volume can be made is refused in one line.

Proxmox VE cannot be installed here: a "Proxmox VE host" is this host with a stand-in
``pveversion`` (a script printing what PVE 9's prints) first on PATH, with the pvesm STAND-IN
(tests/fixtures/standins, loop devices) where volumes are made, and a Proxmox VE directory
made in the test's tmp directory (storage.cfg, ``local`` → nodes/<node>, ``qemu-server`` →
nodes/<node>/qemu-server, VM configurations), which IOMATRIX_PVE_DIR names in place of
/etc/pve. What never ran: a real /etc/pve (pmxcfs), a real pveversion and a real pvesm."""

from __future__ import annotations

from pathlib import Path

import pytest

from iomatrix.cli.status import ExitStatus
from iomatrix.measure import pvestorage
from iomatrix.measure.pvestorage import PVE_DIR_ENV, chosen, ranked, read_host, why_not
from iomatrix.platform.proxmox import parse_storage_cfg
from iomatrix.suite.target import Target
from iomatrix.targets.network import resolve_storage
from tests.conftest import PVEVERSION, cli, cli_result, pve_host, write_suite
from tests.scenarios.test_pvesm import PveHost as PvesmHost
from tests.scenarios.test_pvesm import pve_host as pvesm  # noqa: F401 (the stand-ins' fixture)

NODE = "pve1"


def storage_cfg(root: Path) -> str:
    """A host's storage.cfg: two dir storages for VM images, one for ISOs only, a disabled
    one, one of another node, a Proxmox Backup Server, and a fresh install's local-lvm."""
    return f"""dir: local
\tpath {root / 'vz'}
\tcontent iso,vztmpl,backup,images

lvmthin: local-lvm
\tthinpool data
\tvgname pve
\tcontent rootdir,images

dir: fast
\tpath {root / 'fast'}
\tcontent images,rootdir

dir: isos
\tpath {root / 'iso'}
\tcontent iso

dir: off
\tpath {root / 'off'}
\tdisable 1

dir: elsewhere
\tpath {root / 'elsewhere'}
\tnodes pve2,pve3

pbs: backup
\tserver 192.0.2.9
\tdatastore main
"""


VMS = {
    # local-lvm 4, fast 3, local 1: the CD-ROM, the cloud-init drive and the unused disk are not
    # VM disks; a drive on a storage storage.cfg does not define is not counted
    100: ("scsihw: virtio-scsi-single\nscsi0: local-lvm:vm-100-disk-0,iothread=1,size=32G\n"
          "scsi1: local-lvm:vm-100-disk-1,size=8G\nide2: local:iso/debian.iso,media=cdrom\n"
          "ide0: local-lvm:vm-100-cloudinit,media=cdrom\nunused0: fast:vm-100-disk-9\n"
          "efidisk0: local:100/vm-100-disk-0.qcow2,size=4M\n"),
    101: "virtio0: local-lvm:vm-101-disk-0,size=8G\nvirtio1: local-lvm:vm-101-disk-1,size=8G\n"
         "sata0: gone:vm-101-disk-2,size=1G\n",
    102: "scsi0: fast:102/vm-102-disk-0.raw,size=8G\nscsi1: fast:102/vm-102-disk-1.qcow2\n"
         "scsi2: fast:102/vm-102-disk-2.raw\n[snap1]\nscsi3: local:102/old.raw\n",
    103: "this is not a VM configuration\n",
}


def pve_dir(root: Path, cfg: str, vms: dict[int, str]) -> Path:
    """A Proxmox VE directory as /etc/pve lays it out, in ``root``."""
    pve = root / "pve"
    configs = pve / "nodes" / NODE / "qemu-server"
    configs.mkdir(parents=True)
    (pve / "local").symlink_to(f"nodes/{NODE}")
    (pve / "qemu-server").symlink_to(f"nodes/{NODE}/qemu-server")
    (pve / "storage.cfg").write_text(cfg)
    for vmid, text in vms.items():
        (configs / f"{vmid}.conf").write_text(text)
    for name in ("vz", "fast", "iso", "off", "elsewhere"):
        (root / name / "images").mkdir(parents=True)
    return pve


@pytest.fixture
def pve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This process on a simulated Proxmox VE 9 host (stand-in pveversion, its directory)."""
    pve_host(tmp_path, monkeypatch, PVEVERSION[9])
    directory = pve_dir(tmp_path, storage_cfg(tmp_path), VMS)
    monkeypatch.setenv(PVE_DIR_ENV, str(directory))
    return directory


def test_the_rule(tmp_path: Path) -> None:
    """Disks counted per storage, what can hold a volume, and the order they are tried in."""
    host = read_host(pve_dir(tmp_path, storage_cfg(tmp_path), VMS))
    assert host.node == NODE
    assert dict(host.disks) == {"local-lvm": 4, "fast": 3, "local": 1}
    storages = host.storages
    assert why_not(storages["isos"], NODE) == "it holds no VM images (content iso)"
    assert why_not(storages["off"], NODE) == "it is disabled (disable 1 in storage.cfg)"
    assert why_not(storages["elsewhere"], NODE) == ("it is not available on this node, pve1 "
                                                    "(nodes pve2,pve3)")
    assert "holds no VM images" in str(why_not(storages["backup"], NODE))
    assert why_not(storages["elsewhere"], "pve2") is None
    assert [s.id for s in ranked(host)] == ["local-lvm", "fast", "local"]
    assert chosen(host, storages["local-lvm"], []).startswith(
        "measuring local-lvm (lvmthin): it holds 4 of this host's 8 VM disks")
    skipped = chosen(host, storages["fast"], [(storages["local-lvm"], "cannot")])
    assert skipped.startswith("measuring fast (dir): it holds 3 of this host's 8 VM disks; "
                              "not local-lvm (lvmthin, 4 disks): cannot")
    # a tie: the first in storage.cfg; no VMs: the first that is not a file storage
    tie = read_host(pve_dir(tmp_path / "tie", storage_cfg(tmp_path),
                            {1: "scsi0: fast:1/a.raw\n", 2: "scsi0: local:2/b.raw\n"}))
    assert [s.id for s in ranked(tie)][:2] == ["local", "fast"]
    assert "(as many as fast: the first in storage.cfg)" in chosen(tie, tie.storages["local"], [])
    empty = read_host(pve_dir(tmp_path / "empty", storage_cfg(tmp_path), {}))
    assert [s.id for s in ranked(empty)] == ["local-lvm", "local", "fast"]
    assert "this host has no VM disks; a fresh Proxmox VE install puts them there" in chosen(
        empty, empty.storages["local-lvm"], [])
    # an id storage.cfg may hold but Proxmox VE would not write is never measured
    odd = parse_storage_cfg("dir: -rf\n\tpath /x\n\ndir: a;b\n\tpath /x\n")
    assert all("not a Proxmox VE storage id" in str(why_not(s, NODE)) for s in odd.values())
    # a plugin's type holds images only where storage.cfg says so
    plugin = parse_storage_cfg("acme: a\n\tpool x\n\nacme: b\n\tcontent images\n")
    assert why_not(plugin["a"], NODE) is not None and why_not(plugin["b"], NODE) is None


def _resolves(pve: Path, ident: str) -> bool:
    """Whether this iomatrix measures the storage ``ident`` of ``pve`` by its id."""
    try:
        resolve_storage(Target(storage=ident, size="1GiB"),
                        parse_storage_cfg((pve / "storage.cfg").read_text()), pve)
    except ValueError:
        return False
    return True


def test_the_main_job_plans_where_the_vms_live(pve: Path, tmp_path: Path) -> None:
    """A built-in suite measures the storage holding most VM disks that iomatrix can measure
    here; the user's own suite and --target keep their directories."""
    plan = cli_result("run", "quick", "--plan", check=ExitStatus.OK).stdout
    if _resolves(pve, "local-lvm"):
        expect = "measuring local-lvm (lvmthin): it holds 4 of this host's 8 VM disks"
        assert "target: lvmthin local-lvm" in plan
    else:       # a resolver without lvmthin: the next one, saying why
        expect = ("measuring fast (dir): it holds 3 of this host's 8 VM disks; not local-lvm "
                  "(lvmthin, 4 disks): storage local-lvm is of type lvmthin")
        assert f"target: dir fast ({tmp_path / 'fast' / 'images'})" in plan
    assert f"\n{expect}" in plan
    mine = write_suite(tmp_path, '[method]\nmode = "host"\n')
    own = cli_result("run", str(mine), "--plan", check=ExitStatus.OK).stdout
    assert f"target: directory {tmp_path / 'target'}\n" in own and "measuring" not in own
    given = cli_result("run", "quick", "--plan", "--target", str(tmp_path),
                       check=ExitStatus.OK).stdout
    assert "measuring" not in given
    # a built-in suite comparing filesystems in its directory keeps it
    fs = cli_result("run", "native-threads", "--plan", "--scale", "quick",
                    check=ExitStatus.OK).stdout
    assert "measuring" not in fs


def test_elsewhere_the_main_job_keeps_its_directory(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """No pveversion: /var/tmp/iomatrix, even with a Proxmox VE directory named; pveversion
    without the directory: the same."""
    monkeypatch.setenv(PVE_DIR_ENV, str(pve_dir(tmp_path, storage_cfg(tmp_path), VMS)))
    plan = cli_result("run", "quick", "--plan", check=ExitStatus.OK).stdout
    assert f"target: directory {pvestorage.BUILTIN_DIRECTORY}\n" in plan
    assert "measuring" not in plan
    pve_host(tmp_path, monkeypatch, PVEVERSION[9])
    monkeypatch.setenv(PVE_DIR_ENV, str(tmp_path / "none"))
    plan = cli_result("run", "quick", "--plan", check=ExitStatus.OK).stdout
    assert f"target: directory {pvestorage.BUILTIN_DIRECTORY}\n" in plan


def test_a_host_with_no_measurable_storage_keeps_the_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pve_host(tmp_path, monkeypatch, PVEVERSION[9])
    cfg = "dir: isos\n\tpath /var/lib/vz\n\tcontent iso\n\npbs: b\n\tserver x\n"
    monkeypatch.setenv(PVE_DIR_ENV, str(pve_dir(tmp_path, cfg, {})))
    done = cli_result("run", "quick", "--plan", check=ExitStatus.OK)
    assert f"target: directory {pvestorage.BUILTIN_DIRECTORY}\n" in done.stdout
    assert ("iomatrix: this Proxmox VE host's storage.cfg has no storage iomatrix can make a "
            "volume on; isos (dir):") not in done.stderr      # never tried: no images there
    assert ("iomatrix: this Proxmox VE host's storage.cfg has no storage iomatrix can make a "
            f"volume on: measuring {pvestorage.BUILTIN_DIRECTORY}") in done.stderr


@pytest.mark.parametrize("storage, said", [
    ("isos", "--storage isos (dir): no volume can be made there: it holds no VM images "
             "(content iso)"),
    ("off", "--storage off (dir): no volume can be made there: it is disabled"),
    ("elsewhere", "--storage elsewhere (dir): no volume can be made there: it is not available "
                  "on this node, pve1"),
    ("backup", "--storage backup (pbs): no volume can be made there: it holds no VM images"),
    ("nope", "--storage nope: no such storage in "),
])
def test_a_storage_where_no_volume_can_be_made_is_refused(pve: Path, storage: str,
                                                          said: str) -> None:
    code, output = cli("run", "quick", "--plan", "--storage", storage)
    assert code != ExitStatus.OK
    assert said in output and len(output.strip().splitlines()) == 1, output


def test_storage_options_that_cannot_be(pve: Path, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    code, output = cli("run", "quick", "--storage", "local", "--target", str(tmp_path))
    assert code != ExitStatus.OK and "--storage" in output and "give one" in output
    device = tmp_path / "d.toml"
    device.write_text('[suite]\nname = "d"\n[target]\ndevice = "/dev/null"\n'
                      'allow_destroy = true\n[method]\nmode = "host"\n')
    code, output = cli("run", str(device), "--plan", "--storage", "local")
    assert code != ExitStatus.OK and "--storage replaces a directory target" in output
    monkeypatch.delenv(PVE_DIR_ENV)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")           # no pveversion: not a PVE host
    code, output = cli("run", "quick", "--plan", "--storage", "local")
    assert code != ExitStatus.OK and "not a Proxmox VE host" in output
    # elsewhere, --storage-cfg says where the storages are
    plan = cli_result("run", "quick", "--plan", "--storage", "fast", "--storage-cfg",
                      str(pve / "storage.cfg"), check=ExitStatus.OK).stdout
    assert "measuring fast (dir): --storage fast; it holds 3 of this host's 8 VM disks" in plan


@pytest.mark.slow
def test_storage_local_measures_the_dir_storage(pve: Path, tmp_path: Path) -> None:
    """--storage local for real, in host mode: fio on the storage's images directory; the run
    stores the storage it came from, its notes say why, and recommend names it."""
    suite = write_suite(tmp_path, '[[workloads]]\nrw = "randread"\nbs = "4k"\niodepth = 1\n'
                        '[method]\nmode = "host"\nramp = "0s"\nruntime = "500ms"\n'
                        'samples = 1\n', size="8MiB")
    db = str(tmp_path / "r.db")
    cli_result("run", str(suite), "--storage", "local", "--db", db, check=ExitStatus.OK)
    images = tmp_path / "vz" / "images"
    assert list(images.iterdir()) == []                  # made there, removed at the end
    out = cli_result("show", "last", "--db", db, check=ExitStatus.OK).stdout
    assert "measuring local (dir): --storage local; it holds 1 of this host's 8 VM disks" in out
    from iomatrix.cli.common import load_run
    run = load_run(db, "last")
    target = run.suite.runnable().target
    assert (target.directory, target.from_storage.id, target.from_storage.type) == (
        images, "local", "dir")
    assert run.host.get("target", "").startswith(str(images))
    said = " ".join(cli_result("recommend", "last", "--db", db, check=ExitStatus.OK).stdout.split())
    assert f"evidence measured on dir local ({images})" in said
    assert "storage type dir" in cli_result("recommend", "last", "--db", db, "--for", "proxmox",
                                            check=ExitStatus.OK).stdout


@pytest.mark.parametrize("formats, caveat", [(("raw", "qcow2"), True), (("raw",), False)])
def test_recommend_names_the_storage_and_the_volume_chain_caveat(
        tmp_path: Path, formats: tuple[str, ...], caveat: bool) -> None:
    """Evidence measured with qcow2 on thick LVM keeping snapshots as volume chains carries the
    integrity caveat (``KindTable.caveat``); raw alone does not need it, nor plain thick LVM."""
    from iomatrix.recommend.decide import recommend
    from iomatrix.suite.volumes import CHAIN_CAVEAT
    from iomatrix.suite.workloads import Workload
    from iomatrix.testing.synthetic import Figures, configurations, stored_run

    configs = configurations("blocklayer", {"aio": ["native", "threads"], "cache": ["none"],
                                            "format": list(formats)})

    def run_on(name: str, target: dict[str, object]):  # type: ignore[no-untyped-def]
        return stored_run(tmp_path / f"{name}.db", configs,
                          [Workload(rw="randread", bs=4096, iodepth=1)],
                          lambda c, w, i: Figures(iops=1000.0 + i, bw_bytes=4096e3,
                                                  lat_mean_ns=1e6, p99_ns=2e6),
                          target={"size": "1GiB", **target})

    chain = recommend(run_on("chain", {"lvm": {"vg": "pve", "volume_chain": True},
                                       "from_storage": {"id": "san", "type": "lvm",
                                                        "volume_chain": True}}),
                      "proxmox", storage="lvm")
    assert chain.measured_on == "lvm san"
    assert chain.warnings.count(CHAIN_CAVEAT) == (1 if caveat else 0)
    plain = recommend(run_on("plain", {"lvm": {"vg": "pve"}}), "proxmox", storage="lvm")
    assert plain.measured_on == "LVM volume group pve" and CHAIN_CAVEAT not in plain.warnings


@pytest.mark.slow
def test_the_main_job_on_local_lvm_through_pvesm(pvesm: PvesmHost, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """With the pvesm STAND-IN (loop devices for local-lvm's volumes): the built-in quick suite
    plans local-lvm through pvesm, qcow2 left out (an LVM-thin volume is raw, as Proxmox VE's
    VM disks there are); a storage pvesm says is inactive is passed over; and --storage
    local-lvm measures a volume pvesm allocated, for real, freed at the end."""
    pve = pve_dir(tmp_path, storage_cfg(tmp_path), VMS)
    monkeypatch.setenv(PVE_DIR_ENV, str(pve))
    plan = cli_result("run", "quick", "--plan", check=ExitStatus.OK).stdout
    assert "target: lvmthin local-lvm\n" in plan
    assert ("measuring local-lvm (lvmthin): it holds 4 of this host's 8 VM disks; format qcow2 "
            "left out (volumes are raw here); --storage ID measures another\n") in plan
    assert "/qcow2" not in plan and "blocklayer io_uring/none/raw" in plan
    monkeypatch.setenv("PVESM_STANDIN_INACTIVE", "local-lvm")
    plan = cli_result("run", "quick", "--plan", check=ExitStatus.OK).stdout
    assert "measuring fast (dir): it holds 3 of this host's 8 VM disks" in plan
    code, output = cli("run", "quick", "--plan", "--storage", "local-lvm")
    assert code != ExitStatus.OK and output.strip() == (
        "iomatrix: --storage local-lvm (lvmthin): no volume can be made there: it is inactive "
        "(pvesm status)")
    monkeypatch.delenv("PVESM_STANDIN_INACTIVE")
    suite = write_suite(tmp_path, '[[workloads]]\nrw = "randwrite"\nbs = "4k"\niodepth = 4\n'
                        '[method]\nmode = "host"\nramp = "0s"\nruntime = "500ms"\n'
                        'samples = 1\n', size="16MiB")
    db = str(tmp_path / "r.db")
    done = cli_result("run", str(suite), "--storage", "local-lvm", "--db", db,
                      check=ExitStatus.OK)
    assert "1 trials ok, 0 failed" in done.stdout
    assert "Proxmox VE storage local-lvm (lvmthin)" in done.stderr      # through pvesm
    from iomatrix.cli.common import load_run
    run = load_run(db, "last")
    assert run.host["target"] == "Proxmox VE storage local-lvm (lvmthin)"
    assert run.suite.runnable().target.described == "lvmthin local-lvm"
    assert pvesm.volumes() == {}
    said = " ".join(cli_result("recommend", "last", "--db", db, "--for", "proxmox",
                               check=ExitStatus.OK).stdout.split())
    assert "(storage type lvmthin)" in said and "evidence measured on lvmthin local-lvm" in said
