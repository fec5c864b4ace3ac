"""Versions that move a baseline (``analysis.baselines``): stored runs either side of a change
get a warning naming it in ``compare`` and ``findings``; runs on one side, or that the change
does not apply to, get none. The versions a real run records are checked in
tests/scenarios/test_run.py."""

from __future__ import annotations

from pathlib import Path

from iomatrix.analysis.baselines import CHANGES, straddled, versions_of
from iomatrix.analysis.crossrun import compare_runs
from iomatrix.analysis.findings import evaluate
from iomatrix.cli.status import ExitStatus
from iomatrix.store import Store
from iomatrix.testing.synthetic import write_run
from tests.analysis.test_compare import CONFIGS, HOST, WORKLOADS, figures
from tests.analysis.test_findings import AIO, FOUND, READS, SUITE, store_run, with_suite_text
from tests.conftest import cli, cli_result

FUA, DIRECT_IO, THROTTLE = CHANGES
BEFORE = {**HOST, "qemu": "9.2.4 (Debian 1:9.2.4+ds-1)"}
AFTER = {**HOST, "qemu": "10.0.3 (Debian 1:10.0.3+ds-1)"}


def stored_pair(db: Path, a_host: dict[str, str], b_host: dict[str, str], *,
                method: dict[str, str | int] | None = None,
                b_method: dict[str, str | int] | None = None) -> None:
    with Store(db) as store:
        write_run(store, CONFIGS, WORKLOADS, figures(), host=a_host, method=method)
        write_run(store, CONFIGS, WORKLOADS, figures(1.1, shift=1), host=b_host,
                  method=b_method if b_method is not None else method)


def test_compare_warns_of_the_fua_change_between_qemu_9_2_and_10_0(tmp_path: Path) -> None:
    stored_pair(tmp_path / "r.db", BEFORE, AFTER)
    proc = cli_result("compare", "1", "2", "--db", "r.db", cwd=tmp_path, check=ExitStatus.OK)
    warned = [line for line in proc.stderr.splitlines() if "straddle" in line]
    assert warned == [f"warning: the runs straddle a version change that moves baselines: "
                      f"{FUA.name}: A {BEFORE['qemu']} · B {AFTER['qemu']}; it moves "
                      f"{FUA.applies} ({FUA.source})"]
    assert "warning: host qemu differs" in proc.stderr        # the plain difference stays
    assert "points: " in proc.stdout                          # and the runs are compared


def test_no_warning_within_one_side_or_where_a_change_does_not_apply(tmp_path: Path) -> None:
    # two QEMU minor versions on one side of 10.0; ZFS 2.2 → 2.3 on ext4 (no row applies)
    minor = {**HOST, "qemu": "10.1.0", "zfs": "2.3.1-1"}
    stored_pair(tmp_path / "r.db", {**AFTER, "zfs": "2.2.7-pve2"}, minor)
    with Store(tmp_path / "r.db") as store:
        a, b = store.load_run(1), store.load_run(2)
    assert compare_runs(a, b).version_changes == ()
    proc = cli_result("compare", "1", "2", "--db", "r.db", cwd=tmp_path, check=ExitStatus.OK)
    assert "straddle" not in proc.stderr


def test_zfs_direct_io_only_for_files_on_a_dataset_and_proxmox_by_generation() -> None:
    on_zfs = {"target_fs": "zfs", "qemu": "9.2.0"}
    before, after = {**on_zfs, "zfs": "2.2.7-pve2"}, {**on_zfs, "zfs": "2.3.0-1"}
    assert [s.change for s in straddled(versions_of(before), versions_of(after))] == [DIRECT_IO]
    # a zvol target records the module's version too, but is a raw device: no Direct I/O row
    zvol = {"target_fs": "(raw block device)", "qemu": "9.2.0"}
    assert straddled(versions_of({**zvol, "zfs": "2.2.7"}), versions_of({**zvol, "zfs": "2.3.0"})) == ()
    assert straddled(versions_of(before), versions_of({**on_zfs, "zfs": "not loaded"})) == ()
    pve8 = versions_of(on_zfs, platform="proxmox", pve_version=8)
    pve9 = versions_of(on_zfs, platform="proxmox", pve_version=9)
    assert [s.change for s in straddled(pve8, pve9)] == [THROTTLE]
    assert straddled(versions_of(on_zfs, platform="qemu", pve_version=8), pve9) == ()


def test_compare_names_the_throttle_node_between_proxmox_generations(tmp_path: Path) -> None:
    stored_pair(tmp_path / "r.db", HOST, HOST, method={"platform": "proxmox", "pve_version": 8},
                b_method={"platform": "proxmox", "pve_version": 9})
    with Store(tmp_path / "r.db") as store:
        result = compare_runs(store.load_run(1), store.load_run(2))
    assert [(s.change, s.a, s.b) for s in result.version_changes] == [(THROTTLE, "8.0", "9.0")]


def test_findings_warn_when_the_study_and_the_run_straddle_a_change(tmp_path: Path) -> None:
    store = store_run(tmp_path, AIO, READS, rule=lambda c, w: 1000.0)
    with_suite_text(store, SUITE + FOUND.replace('expect = "better"\n',
                                                 'expect = "better"\nversions = { qemu = "8.2" }\n'))
    with Store(tmp_path / "f.db") as db:        # the run's QEMU as a real one records it
        db.conn.execute("UPDATE runs SET host_json = ?", ('{"qemu": "10.0.3 (Debian)"}',))
        db.conn.commit()
    run = store.load_run(store.resolve("last"))
    store.close()
    versioned, unversioned = evaluate(run).results
    assert [(s.change, s.a, s.b) for s in versioned.version_changes] == [(FUA, "8.2", "10.0.3 (Debian)")]
    assert unversioned.version_changes == ()
    code, text = cli("findings", "last", "--db", str(tmp_path / "f.db"))
    assert code == 0
    assert text.count("straddle") == 1 and f"{FUA.name}: study 8.2 · run 10.0.3 (Debian)" in text


def test_a_fleet_warns_for_the_node_across_the_change_only(tmp_path: Path) -> None:
    with Store(tmp_path / "r.db") as store:
        for host, speed in ((BEFORE, 1.0), ({**AFTER, "hostname": "beta"}, 1.1),
                            ({**BEFORE, "hostname": "gamma"}, 0.9)):
            write_run(store, CONFIGS, WORKLOADS, figures(speed, shift=1), host=host)
    proc = cli_result("compare", "1", "2", "3", "--db", "r.db", cwd=tmp_path, check=ExitStatus.OK)
    warned = [line for line in proc.stderr.splitlines() if "straddle" in line]
    assert len(warned) == 1 and "(run 2) and the reference straddle" in warned[0]
    assert f"{FUA.name}: reference {BEFORE['qemu']} · " in warned[0]
