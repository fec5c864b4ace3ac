"""On a Proxmox VE host a suite that chooses no platform measures Proxmox's graph, at the host's
generation (iomatrix.measure.pvehost), and says so in --plan and the run's notes.

Proxmox VE cannot be installed here: a PVE host is this host with a stand-in ``pveversion``
(a script printing what PVE 8's or 9's prints) first on PATH. The blocklayer run under it is
tests/platform/test_platform_blocklayer.py's, whose layers are read back over QMP."""

from __future__ import annotations

from pathlib import Path

import pytest

from iomatrix.measure.pvehost import detect_pve, on_host
from iomatrix.suite import load_suite
from iomatrix.suite.spec import RunSpec
from tests.conftest import PVEVERSION, cli_result, pve_host, write_suite

BLOCKLAYER = '[matrix]\naio = "io_uring"\ncache = "none"\nformat = "raw"\niothread = false\n'


def _plan(*args: str) -> str:
    out = cli_result("run", *args, "--plan")
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.parametrize("version", sorted(PVEVERSION))
def test_quick_plans_proxmox_on_a_pve_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           version: int) -> None:
    assert "platform: proxmox" not in _plan("quick")            # this host is not PVE
    pve_host(tmp_path, monkeypatch, PVEVERSION[version])
    assert f"\nplatform: proxmox (PVE {version}, from pveversion): " in _plan("quick")
    suite, notes = on_host(load_suite("quick"), detect_pve())
    assert (suite.method.platform, suite.method.pve_version) == ("proxmox", version)
    assert notes[0].startswith(f"platform: proxmox (PVE {version}, from pveversion)")
    # set in the spec the run stores, which loads back to the same method; the text as it was
    assert suite.source_text == load_suite("quick").source_text
    spec = RunSpec.from_json(RunSpec.of(suite).to_json())
    assert spec.suite(text=suite.source_text, source="stored").method == suite.method


def test_a_suite_that_chooses_keeps_its_choice(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    pve_host(tmp_path, monkeypatch, PVEVERSION[8])
    host = detect_pve()
    mine = write_suite(tmp_path, BLOCKLAYER + '[method]\nmode = "blocklayer"\nplatform = "qemu"\n')
    assert "platform: proxmox" not in _plan(str(mine))
    assert on_host(load_suite(mine), host)[0].method.platform == "qemu"
    # proxmox without pve_version: the host's generation
    pve = write_suite(tmp_path, BLOCKLAYER + '[method]\nmode = "blocklayer"\nplatform = "proxmox"\n',
                      name="p")
    assert on_host(load_suite(pve), host)[0].method.pve_version == 8
    # host mode measures no QEMU graph: nothing to say
    host_only = write_suite(tmp_path, '[method]\nmode = "host"\n', name="h")
    assert on_host(load_suite(host_only), host) == (load_suite(host_only), ())


@pytest.mark.parametrize("output, status, said", [
    ("pve-manager/7.4-3/9002ab8a (running kernel: 5.15.102-1-pve)", 0, "pveversion printed"),
    ("\x1b[31mgarbage\x00", 0, "pveversion printed"),
    ("", 0, "pveversion printed ''"),
    ("ipcc_send_rec[1] failed: Connection refused", 2, "pveversion failed (exit 2)"),
])
def test_unreadable_pveversion_leaves_the_suite_plain(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      output: str, status: int,
                                                      said: str) -> None:
    pve_host(tmp_path, monkeypatch, output, status)
    plan = _plan("quick")
    assert "platform: proxmox" not in plan
    assert said in plan
    assert 'not Proxmox VE 8 or 9, the generations iomatrix models; the suite measures platform = "qemu"' in plan
    assert on_host(load_suite("quick"), detect_pve())[0].method.platform == "qemu"


def test_what_proxmox_cannot_build_stays_plain(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The vhost-user suite compares a data path qemu-server does not offer."""
    pve_host(tmp_path, monkeypatch, PVEVERSION[9])
    plan = _plan("vhost-user")
    assert ('this host runs Proxmox VE 9, but the suite measures platform = "qemu" (' in plan
            and "qemu-server does not attach vhost-user-blk disks" in plan)
