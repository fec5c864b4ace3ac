"""iSCSI LUN targets against a real target (Debian's tgtd, ``tests/tgt.py``): host, blocklayer
and guest trials over libiscsi, what QEMU opened read back over QMP, one line and exit 10 for a
missing LUN, a wrong portal or wrong CHAP (exit 10) with nothing stored, CHAP never stored or printed, and
no iSCSI session left by a killed run."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from iomatrix.cli.status import ExitStatus
from iomatrix.measure.runner import run_suite
from iomatrix.store import Store
from iomatrix.suite import load_suite
from tests.conftest import BOOT_TIMEOUT, IOMATRIX, cli_result, our_processes
from tests.needs import needs
from tests.tgt import Tgt, tgtd

pytestmark = [pytest.mark.slow, needs("tgt")]
PASSWORD = "s3cret-Pa55word-xyzzy"
USER = "chapuser-qwerty"


@pytest.fixture
def tgt(tmp_path: Path) -> Iterator[Tgt]:
    with tgtd(tmp_path) as server:
        yield server


def suite(tmp_path: Path, tgt: Tgt, body: str, *, lun: int | None = None, portal: str | None = None,
          chap: Path | None = None) -> Path:
    path = tmp_path / "iscsi.toml"
    path.write_text(f"""
[suite]
name = "iscsi"
[target]
allow_destroy = true
size = "16MiB"
[target.iscsi]
portal = "{portal or tgt.portal}"
target = "{tgt.iqn}"
lun = {tgt.lun if lun is None else lun}
connect_timeout = 20
{f'chap = "{chap}"' if chap else ''}
""" + body)
    return path


BLOCKLAYER = """
[matrix]
cache = ["none", "writeback"]
iothread = false
[workloads]
rw = ["randwrite"]
bs = "4k"
iodepth = 4
[method]
mode = "blocklayer"
baseline = true
ramp = 0
runtime = "500ms"
"""


def chap_file(tmp_path: Path) -> Path:
    path = tmp_path / "chap.toml"
    path.write_text(f'user = "{USER}"\npassword = "{PASSWORD}"\n')
    path.chmod(0o600)
    return path


def test_host_and_blocklayer_on_the_lun(tmp_path: Path, tgt: Tgt, no_leftovers: None) -> None:
    with Store(tmp_path / "r.db") as store:
        outcome = run_suite(load_suite(suite(tmp_path, tgt, BLOCKLAYER)), store)
        run = store.load_run(outcome.run_id)
    assert outcome.trials_failed == 0 and outcome.trials_ok == 3, [t.reason for t in run.trials]
    assert run.host["target"] == f"iscsi://{tgt.portal}/{tgt.iqn}/{tgt.lun}"
    by_cache = {t.config_key: t.applied for t in run.trials}
    host = by_cache.pop("host")
    assert host["file0.driver"] == "iscsi" and host["file0.cache.direct"] == "true"
    assert "libiscsi through qemu-storage-daemon" in host["host.path"]
    assert "not available on this host" in host["host.path"]
    for key, applied in by_cache.items():
        assert applied["file0.driver"] == "iscsi", key       # read back over QMP
        direct = "true" if "none" in key else "false"
        assert applied["file0.cache.direct"] == direct and applied["disk0.cache.direct"] == direct
        assert applied["aio"].startswith("not evaluated")
    assert tgt.connections() == ""                       # every session logged out
    assert tgt.backing.read_bytes().strip(b"\0")         # the LUN was written


@pytest.mark.parametrize("what", ["lun", "portal", "chap"])
def test_bad_lun_portal_or_chap_is_one_line_and_nothing_stored(tmp_path: Path, tgt: Tgt,
                                                              what: str) -> None:
    creds = chap_file(tmp_path)
    if what == "chap":
        tgt.require_chap(USER, "another-password")
    path = suite(tmp_path, tgt, BLOCKLAYER, lun=7 if what == "lun" else None,
                 portal="127.0.0.1:1" if what == "portal" else None,
                 chap=creds if what == "chap" else None)
    started = time.monotonic()
    done = cli_result("run", str(path), "--db", "r.db", cwd=tmp_path)
    assert done.returncode == ExitStatus.UNREACHABLE, done.stderr
    assert time.monotonic() - started < 60
    lines = [line for line in done.stderr.splitlines() if line.strip() and
             "hint:" not in line]
    assert len(lines) == 1, done.stderr
    expected = {"lun": "no such LUN", "portal": "does not answer", "chap": "refused the login"}
    assert expected[what] in lines[0]
    assert PASSWORD not in done.stderr + done.stdout
    if (tmp_path / "r.db").exists():
        with Store(tmp_path / "r.db") as store:
            assert store.list_runs() == []


def test_chap_never_stored_or_printed(tmp_path: Path, tgt: Tgt, no_leftovers: None) -> None:
    tgt.require_chap(USER, PASSWORD)
    path = suite(tmp_path, tgt, BLOCKLAYER.replace('["none", "writeback"]', '"none"'),
                 chap=chap_file(tmp_path))
    done = cli_result("run", str(path), "--db", "r.db", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    exported = cli_result("export", "1", "--db", "r.db", "--format", "json", cwd=tmp_path)
    report = cli_result("report", "1", "--db", "r.db", "--out", "rep", cwd=tmp_path)
    shown = cli_result("show", "1", "--db", "r.db", cwd=tmp_path)
    texts = [done.stdout, done.stderr, exported.stdout, shown.stdout,
             (tmp_path / "r.db").read_bytes().decode(errors="replace")]
    texts += [p.read_text(errors="replace") for p in (tmp_path / "rep").rglob("*") if p.is_file()]
    assert not [t for t in texts if PASSWORD in t or USER in t]
    with Store(tmp_path / "r.db") as store:
        run = store.load_run(1)
    assert all("<chap user>" in t.command for t in run.trials), run.trials[0].command
    assert not list(tmp_path.rglob("chap.secret"))


def test_a_chap_file_others_can_read_is_refused(tmp_path: Path, tgt: Tgt) -> None:
    creds = chap_file(tmp_path)
    creds.chmod(0o644)
    done = cli_result("run", str(suite(tmp_path, tgt, BLOCKLAYER, chap=creds)), "--db", "r.db",
                      cwd=tmp_path)
    assert done.returncode == ExitStatus.SUITE_INVALID      # rule 1: core.trust.private_file
    assert "chmod 600" in done.stderr and PASSWORD not in done.stderr


def test_a_lun_needs_allow_destroy(tmp_path: Path, tgt: Tgt) -> None:
    path = suite(tmp_path, tgt, BLOCKLAYER)
    path.write_text(path.read_text().replace("allow_destroy = true\n", ""))
    done = cli_result("run", str(path), "--plan", cwd=tmp_path)
    assert done.returncode == ExitStatus.SUITE_INVALID
    assert "is written to and destroyed; say so with allow_destroy = true" in done.stderr


def test_kill_9_leaves_no_iscsi_session(tmp_path: Path, tgt: Tgt, no_leftovers: None) -> None:
    """kill -9 while the daemon holds the LUN: its session ends and nothing the run started
    lives on (a trial's 60 s fio would outlive the 30 s allowed here if it were orphaned)."""
    path = suite(tmp_path, tgt, BLOCKLAYER.replace('"500ms"', '"60s"'))
    proc = subprocess.Popen([*IOMATRIX, "run", str(path), "--db", "r.db"], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 90
    while not ([p for p in our_processes(str(tmp_path)) if "qemu-storage-daemon" in p]
               and tgt.connections()):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    proc.kill()
    proc.wait(timeout=10)
    deadline = time.monotonic() + 30
    while tgt.connections() or our_processes(str(tmp_path)):
        assert time.monotonic() < deadline, (tgt.connections(), our_processes(str(tmp_path)))
        time.sleep(0.1)


@pytest.mark.parametrize("platform", [
    pytest.param('platform = "qemu"', id="qemu"),
    pytest.param('platform = "proxmox"\npve_version = 8', id="pve8-drive"),
    pytest.param('platform = "proxmox"\npve_version = 9', id="pve9-blockdev")])
def test_guest_on_the_lun(tmp_path: Path, tgt: Tgt, platform: str, no_leftovers: None) -> None:
    body = f"""
[matrix]
controller = "virtio-blk"
cache = "writeback"
aio = "threads"
iothread = false
[workloads]
rw = "randread"
bs = "4k"
iodepth = 1
[method]
mode = "guest"
baseline = false
precondition = false
ramp = 0
runtime = "1s"
{BOOT_TIMEOUT}{platform}
"""
    with Store(tmp_path / "r.db") as store:
        outcome = run_suite(load_suite(suite(tmp_path, tgt, body)), store)
        run = store.load_run(outcome.run_id)
    assert outcome.trials_failed == 0 and outcome.trials_ok == 1, [t.reason for t in run.trials]
    applied = run.trials[0].applied
    assert applied["file0.driver"] == "iscsi"
    assert applied["file0.cache.direct"] == "false"      # cache=writeback, as asked
    command = run.trials[0].command
    assert ("file=iscsi://" in command) == ("pve_version = 8" in platform)
    assert tgt.connections() == ""


def test_the_guest_disk_as_proxmox_attaches_it(tmp_path: Path, tgt: Tgt) -> None:
    """No guest booted: the -drive (PVE 8) and -blockdev (PVE 9) forms for an iscsidirect LUN."""
    from iomatrix.qemu.args import platform_disk_argv
    from iomatrix.suite.configuration import Configuration
    from iomatrix.targets.iscsi import volume
    from iomatrix.targets.workspace import Image
    lun = load_suite(suite(tmp_path, tgt, BLOCKLAYER)).target.iscsi
    assert lun is not None
    image = Image(path=Path(lun.url), format="raw", preallocation="off", size=16 << 20,
                  is_device=True, network=volume(lun, chap=None, secret=None))
    config = Configuration(mode="guest", controller="virtio-blk", cache="none", aio="io_uring",
                           iothread=False)
    pve8 = " ".join(platform_disk_argv(config, image, platform="proxmox", pve_version=8))
    assert f"file=iscsi://{tgt.portal}/{tgt.iqn}/{tgt.lun}," in pve8
    pve9 = platform_disk_argv(config, image, platform="proxmox", pve_version=9)
    node = json.loads(pve9[pve9.index("-blockdev") + 1])
    protocol = node["file"]["file"]
    assert {k: protocol[k] for k in ("driver", "portal", "target", "lun")} == {
        "driver": "iscsi", "portal": tgt.portal, "target": tgt.iqn, "lun": tgt.lun}


STORAGE_CFG = """
dir: local
	path /var/lib/vz
	content iso,vztmpl,backup,images

nfs: shared
	export /srv/vms
	server 192.0.2.20
	content images

cifs: smb
	path /srv/smb-mounted
	server 192.0.2.21
	share vms
	content-dirs images=vmdisks

iscsidirect: lun-direct
	portal {portal}
	target {iqn}

iscsi: lun-kernel
	portal 192.0.2.30
	target iqn.2003-01.org.example:kernel

pbs: vg
	datastore backups
	server 192.0.2.40
"""


def resolved(cfg: str, ident: str, mounted: object = None) -> dict[str, object]:
    """The [target] keys ``storage = ident`` resolves to (those the storage sets)."""
    from iomatrix.platform.proxmox import parse_storage_cfg
    from iomatrix.suite.target import Target
    from iomatrix.targets.network import resolve_storage
    target = Target(storage=ident, allow_destroy=True, size=16 << 20)
    out = resolve_storage(target, parse_storage_cfg(cfg), Path("/etc/pve"), mounted=mounted)
    return out.model_dump(include={"directory", "iscsi"}, exclude_none=True,
                          exclude={"iscsi": {"chap", "connect_timeout"}}, mode="json")


def test_storage_ids_name_targets_as_proxmox_does() -> None:
    cfg = STORAGE_CFG.format(portal="127.0.0.1:3260", iqn="iqn.2026-11.org.iomatrix:test")
    assert resolved(cfg, "local") == {"directory": "/var/lib/vz/images"}
    assert resolved(cfg, "smb") == {"directory": "/srv/smb-mounted/vmdisks"}
    assert resolved(cfg, "shared", mounted=lambda p: True) == {
        "directory": "/mnt/pve/shared/images"}
    with pytest.raises(ValueError, match="/mnt/pve/shared is not mounted"):
        resolved(cfg, "shared", mounted=lambda p: False)
    assert resolved(cfg, "lun-direct:lun3") == {"iscsi": {
        "portal": "127.0.0.1:3260", "target": "iqn.2026-11.org.iomatrix:test", "lun": 3}}
    assert resolved(cfg, "lun-kernel")["iscsi"]["lun"] == 0   # type: ignore[index]
    with pytest.raises(ValueError, match="type pbs"):
        resolved(cfg, "vg")
    with pytest.raises(ValueError, match="not in the storage.cfg"):
        resolved(cfg, "nope")
    with pytest.raises(ValueError, match="lunN"):
        resolved(cfg, "lun-direct:lun")
    with pytest.raises(ValueError, match="without ':lun0'"):
        resolved(cfg, "local:lun0")


def test_run_on_an_iscsidirect_storage_id(tmp_path: Path, tgt: Tgt, no_leftovers: None) -> None:
    cfg = tmp_path / "storage.cfg"
    cfg.write_text(STORAGE_CFG.format(portal=tgt.portal, iqn=tgt.iqn))
    path = suite(tmp_path, tgt, BLOCKLAYER.replace('["none", "writeback"]', '"none"'))
    text = path.read_text()
    table = text[text.index("[target.iscsi]"):text.index("[matrix]")]
    path.write_text(text.replace(table, f'storage = "lun-direct:lun{tgt.lun}"\n'))
    done = cli_result("run", str(path), "--db", "r.db", "--storage-cfg", str(cfg), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    with Store(tmp_path / "r.db") as store:
        run = store.load_run(1)
    assert run.host["target"] == f"iscsi://{tgt.portal}/{tgt.iqn}/{tgt.lun}"
    path.write_text(path.read_text().replace(f'"lun-direct:lun{tgt.lun}"', '"vg"'))
    bad = cli_result("run", str(path), "--db", "r.db", "--storage-cfg", str(cfg), cwd=tmp_path)
    assert bad.returncode == ExitStatus.SUITE_INVALID and "type pbs" in bad.stderr


def test_the_howto_suite_plans_against_a_real_lun(tmp_path: Path, tgt: Tgt) -> None:
    """The "Measure an iSCSI LUN" how-to's suite, pointed at the test's LUN, as pasted."""
    section = (Path(__file__).parents[2] / "docs/how-to/iscsi.md").read_text()
    text = section[section.index("```toml\n") + 8:section.index("```\n", section.index("```toml"))]
    text = (text.replace("192.0.2.10:3260", tgt.portal)
            .replace("iqn.2003-01.org.example:storage", tgt.iqn).replace('"4GiB"', '"16MiB"'))
    (tmp_path / "lun.toml").write_text(text)
    done = cli_result("run", str(tmp_path / "lun.toml"), "--plan", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "blocklayer" in done.stdout
