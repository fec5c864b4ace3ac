"""``iomatrix import``: real fio output of several releases (tests/fixtures/fio/README.md), in the
layouts bench-fio and pbench-fio leave, stored as runs that ``show`` reads."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from iomatrix.fio.parse import parse_fio_output
from iomatrix.core.errors import NothingToImport
from iomatrix.store.ingest import _location, _names, import_results, scan
from iomatrix.fio.samples import DirectionSample
from iomatrix.store.records import StoredRun
from iomatrix.store import Store
from iomatrix.suite.workloads import Workload
from tests.conftest import cli

FIXTURES = Path(__file__).parents[1] / "fixtures" / "fio"
IMPORT_DIRS = sorted(FIXTURES.glob("*/import"), key=lambda p: tuple(map(int, p.parent.name.split("."))))
VERSIONS = [p.parent.name for p in IMPORT_DIRS]
LIBAIO = (("ioengine", "libaio"),)

# What every release's import/ directory holds (the README says how each file was made).
EXPECTED_POINTS = {
    "randread/4k/qd4/nj1/ioengine=libaio": 3,            # randread-4k-qd4.json, run-1/, run-2/
    "randread/4k/qd4/nj2/ioengine=libaio": 2,            # numjobs=2, with and without group_reporting
    "randwrite/4k/qd4/nj1/ioengine=libaio": 1,           # json+
    "randrw/4k/qd4/nj1/ioengine=libaio/rwmixread=70": 1,
    "randread/4k/qd1/nj1/ioengine=psync": 1,             # iodepth=4 asked, fio capped it at 1
    "read/4k/qd2/nj1/ioengine=libaio": 1,                # stonewall.json, first job group
    "write/4k/qd2/nj1/ioengine=libaio": 1,               # stonewall.json, second job group
}


def _import(tmp_path: Path, directory: Path, **kwargs: str) -> StoredRun:
    with Store(tmp_path / "r.db") as store:
        summary = import_results(store, directory, **kwargs)
        return store.load_run(summary.run_id)


def _trials(run: StoredRun, workload_key: str) -> list:  # type: ignore[type-arg]
    return [t for t in run.trials if t.workload_key == workload_key]


def _raw(path: Path) -> dict:  # type: ignore[type-arg]
    text = path.read_text()
    start = re.search(r"^\{", text, re.M)
    assert start is not None
    return json.JSONDecoder().raw_decode(text, start.start())[0]


def test_fixtures_cover_several_fio_releases() -> None:
    assert len(VERSIONS) >= 5, VERSIONS
    assert {"3.1", "3.25", "3.33", "3.41"} <= set(VERSIONS)


@pytest.mark.parametrize("directory", IMPORT_DIRS, ids=VERSIONS)
def test_every_release_imports_as_one_run(tmp_path: Path, directory: Path) -> None:
    version = directory.parent.name
    run = _import(tmp_path, directory)
    assert run.status == "complete" and run.accelerator == "none"
    assert [(c.label, c.mode, c.params) for c in run.configs] == [
        ("host: import", "host", {"source": "import"})]
    counts = {w.key: len(_trials(run, w.key)) for w in run.workloads}
    assert counts == EXPECTED_POINTS
    assert all(t.status == "ok" and t.samples and t.accelerator == "none" for t in run.trials)
    assert run.host["fio"] == f"fio-{version}"
    assert run.host["hostname"] == "unknown (imported)"
    assert run.host["target"] == f"/var/tmp/iomx-ingest/{version}/data.img"
    assert run.notes[0] == f"imported from {directory.resolve()} (9 files)"
    assert "mode host: assumed" in run.notes[-1]
    # no result asked fio for total-latency percentiles: every latency is fio's clat
    assert run.host["latency"] == "clat"
    assert run.notes[2].startswith("latency: fio's completion latency (clat), mean and percentiles")
    # samples of one point are in the order fio wrote them, sample_index counting from 0
    for key in counts:
        trials = _trials(run, key)
        assert [t.sample_index for t in trials] == list(range(len(trials)))
        assert [t.started_at for t in trials] == sorted(t.started_at for t in trials)


@pytest.mark.parametrize("directory", IMPORT_DIRS, ids=VERSIONS)
def test_one_job_keeps_fios_own_figures_and_the_raw_output(tmp_path: Path, directory: Path) -> None:
    with Store(tmp_path / "r.db") as store:
        run = store.load_run(import_results(store, directory).run_id)
        stored = {store.fio_json(t.id): t for t in run.trials}
    for name, key in (("randwrite-4k-qd4.json", "randwrite/4k/qd4/nj1/ioengine=libaio"),
                      ("randrw70-4k-qd4.json", "randrw/4k/qd4/nj1/ioengine=libaio/rwmixread=70")):
        text = (directory / name).read_text()
        trial = stored[text]                 # the whole file, as fio wrote it, is kept
        assert trial.workload_key == key
        job = parse_fio_output(text).jobs[0]
        assert trial.samples == tuple(DirectionSample.from_stats(d, s, latency="clat") for d, s in
                                      (("read", job.read), ("write", job.write)) if s.active)
        assert (trial.usr_cpu, trial.sys_cpu, trial.ctx) == (job.usr_cpu, job.sys_cpu, job.ctx)
        obj = _raw(directory / name)
        elapsed = obj["jobs"][0]["elapsed"]
        assert trial.wall_seconds == elapsed
        assert trial.started_at == _iso(obj["timestamp"] - elapsed)
    assert {s.direction for s in stored[(directory / "randrw70-4k-qd4.json").read_text()].samples} == {
        "read", "write"}


def _iso(epoch: int) -> str:
    from datetime import datetime, timezone
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="seconds")


@pytest.mark.parametrize("directory", IMPORT_DIRS, ids=VERSIONS)
def test_jobs_without_group_reporting_are_summed(tmp_path: Path, directory: Path) -> None:
    run = _import(tmp_path, directory)
    ungrouped, grouped = _trials(run, "randread/4k/qd4/nj2/ioengine=libaio")
    jobs = _raw(directory / "randread-nj2.json")["jobs"]
    assert len(jobs) == 2 and all(j["job options"]["numjobs"] == "2" for j in jobs)
    (s,) = ungrouped.samples
    reads = [j["read"] for j in jobs]
    n = sum(r["total_ios"] for r in reads)
    assert s.total_ios == n and s.io_bytes == sum(r["io_bytes"] for r in reads)
    assert s.iops == pytest.approx(sum(r["iops"] for r in reads))
    assert s.runtime_ms == max(r["runtime"] for r in reads)
    # the run's latency is clat (no lat percentiles): mean and percentiles of the same one
    assert s.lat_mean_ns == pytest.approx(sum(r["clat_ns"]["mean"] * r["total_ios"] for r in reads) / n)
    assert s.lat_min_ns == min(r["clat_ns"]["min"] for r in reads)
    assert s.lat_max_ns == max(r["clat_ns"]["max"] for r in reads)
    lo, hi = sorted(r["clat_ns"]["stddev"] for r in reads)
    assert lo <= s.lat_stdev_ns  # pooled: at least the smaller spread, plus the means' distance
    assert s.p50_ns is None and s.p99_ns is None  # plain json has no histograms to merge
    assert ungrouped.ctx == sum(j["ctx"] for j in jobs)
    # group_reporting: fio summed them itself (one entry), and json+ kept its percentiles
    (g,) = grouped.samples
    assert len(_raw(directory / "randread-nj2-grouped.json")["jobs"]) == 1
    assert g.p50_ns is not None and g.p99_ns is not None and g.p50_ns <= g.p99_ns


@pytest.mark.parametrize("directory", IMPORT_DIRS, ids=VERSIONS)
def test_stonewall_groups_are_two_trials_in_the_order_they_ran(tmp_path: Path, directory: Path) -> None:
    run = _import(tmp_path, directory)
    (read,) = _trials(run, "read/4k/qd2/nj1/ioengine=libaio")
    (write,) = _trials(run, "write/4k/qd2/nj1/ioengine=libaio")
    assert [s.direction for s in read.samples] == ["read"]
    assert [s.direction for s in write.samples] == ["write"]
    assert read.started_at < write.started_at


@pytest.mark.parametrize("directory", IMPORT_DIRS, ids=VERSIONS)
def test_synchronous_engine_is_stored_at_the_depth_fio_ran(tmp_path: Path, directory: Path) -> None:
    found = scan(directory)
    (trial,) = [t for t in found.trials if t.path == "psync-warning.out"]
    assert trial.workload == Workload(rw="randread", bs=4096, iodepth=1,
                                      options=(("ioengine", "psync"),))
    assert found.warnings[0] == ("psync-warning.out: iodepth=4 with the synchronous engine psync: "
                                 "stored as QD1, as fio ran it")
    text = (directory / "psync-warning.out").read_text()
    if tuple(map(int, directory.parent.name.split("."))) >= (3, 33):
        assert text.startswith("note: both iodepth >= 1 and synchronous I/O engine are selected")
    assert trial.raw == text


def test_bench_fio_layout_gives_one_configuration_per_target(tmp_path: Path) -> None:
    directory = FIXTURES / "3.33" / "bench-fio"
    run = _import(tmp_path, directory)
    assert [c.label for c in run.configs] == ["host: file-a.img", "host: file-b.img"]
    points = {(t.config_key, t.workload_key) for t in run.trials}
    assert len(points) == len(run.trials) == 17  # bench-fio overwrites repeats: one sample each
    expected = {f"{rw}/4k/qd{qd}/nj{nj}/ioengine=libaio{mix}"
                for rw, mix in (("randread", ""), ("randrw", "/rwmixread=70"))
                for qd in (1, 4) for nj in (1, 2)}
    for target in ("file-a.img", "file-b.img"):
        keys = {w for c, w in points if c == f"host/source={target}"}
        extra = {"write/1m/qd64/nj1/ioengine=libaio"} if target == "file-a.img" else set()
        assert keys == expected | extra  # file-a.img/1m/run-1/: bench-fio's preconditioning
    found = scan(directory)
    assert found.other_files == len(list(directory.rglob("*.log")))
    assert found.skipped == ()


def test_bench_fio_with_fio_3_1(tmp_path: Path) -> None:
    run = _import(tmp_path, FIXTURES / "3.1" / "bench-fio")
    assert [c.label for c in run.configs] == ["host: disk-c.img"]
    assert sorted(w.label for w in run.workloads) == [
        "4k randread QD1 ×2 jobs", "4k randread QD4 ×2 jobs",
        "64k randread QD1 ×2 jobs", "64k randread QD4 ×2 jobs"]
    assert {t.samples[0].p50_ns is None for t in run.trials} == {True}


def test_pbench_layout_samples_links_failed_attempts_and_archives(tmp_path: Path) -> None:
    directory = tmp_path / "pbench"
    shutil.copytree(FIXTURES / "3.25" / "pbench", directory)
    local = directory / "fio_iomx-local_2026.11.21T22.45.00"
    # what pbench-fio adds around the samples: a link to the sample nearest the mean, a rejected
    # attempt (renamed -failN), archived samples, and its own result.json (not fio's format)
    (local / "1-randread-4KiB" / "reference-result").symlink_to("sample2")
    shutil.copytree(local / "2-randwrite-4KiB", local / "2-randwrite-4KiB-fail1")
    (local / "2-randwrite-4KiB" / "sample4.tar.xz").write_bytes(b"\xfd7zXZ\x00")
    (local / "1-randread-4KiB" / "sample1" / "result.json").write_text('{"throughput": {"iops": 1}}')

    with Store(tmp_path / "r.db") as store:
        summary = import_results(store, directory)
        run = store.load_run(summary.run_id)
    assert [c.label for c in run.configs] == [
        "host: fio_iomx-client_2026.11.21T22.46.00 via a fio client",
        "host: fio_iomx-local_2026.11.21T22.45.00"]
    counts = {(c, w): 0 for c, w in ((t.config_key, t.workload_key) for t in run.trials)}
    for t in run.trials:
        counts[(t.config_key, t.workload_key)] += 1
    assert counts == {
        ("host/source=fio_iomx-client_2026.11.21T22.46.00/clients=1", "randread/4k/qd8/nj1/ioengine=libaio"): 2,
        ("host/source=fio_iomx-local_2026.11.21T22.45.00", "randread/4k/qd8/nj1/ioengine=libaio"): 3,
        ("host/source=fio_iomx-local_2026.11.21T22.45.00", "randwrite/4k/qd8/nj1/ioengine=libaio"): 3,
    }
    reasons = {s.path.split("/", 1)[1]: s.reason for s in summary.skipped}
    assert reasons.pop("1-randread-4KiB/reference-result").startswith("symbolic link: not followed")
    assert reasons.pop("2-randwrite-4KiB/sample4.tar.xz") == "an archive: unpack it to import what it holds"
    assert reasons.pop("1-randread-4KiB/sample1/result.json") == 'JSON without "fio version": not fio output'
    failed = {path: reason for path, reason in reasons.items() if "-fail1/" in path}
    assert len(failed) == len(reasons) == 3  # the rejected attempt's three samples
    assert all(r.startswith("under 2-randwrite-4KiB-fail1: an attempt pbench rejected")
               for r in failed.values())
    assert run.host["hostname"] == "127.0.0.1"  # the fio client's, from the client/server output
    assert run.host["fio"] == "fio-3.25"


def test_client_output_uses_fios_all_clients_aggregate(tmp_path: Path) -> None:
    directory = tmp_path / "clients"
    directory.mkdir()
    path = FIXTURES / "3.41" / "client2-randread.out"
    shutil.copy(path, directory)
    run = _import(tmp_path, directory)
    assert [c.label for c in run.configs] == ["host: clients ×2 fio clients"]
    result = parse_fio_output(path.read_text())
    assert result.aggregate is not None
    (trial,) = run.trials
    assert trial.samples[0].iops == result.aggregate.read.iops
    assert trial.samples[0].p99_ns == result.aggregate.read.clat.percentiles.p99  # type: ignore[union-attr]
    assert trial.samples[0].lat_mean_ns == result.aggregate.read.clat.mean_ns  # type: ignore[union-attr]


def test_a_job_that_failed_is_a_failed_trial(tmp_path: Path) -> None:
    run = _import(tmp_path, FIXTURES / "3.33" / "failed")
    (trial,) = run.trials
    assert trial.status == "failed" and trial.samples == ()
    assert trial.reason == "fio job full ended with error 28"
    assert run.workloads[0].key == "write/4k/qd1/nj1/direct=0/ioengine=psync"  # buffered


def test_empty_directory_is_one_error_and_creates_no_database(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    db = tmp_path / "r.db"
    code, output = cli("import", str(tmp_path / "empty"), "--db", str(db))
    assert code == 2
    assert output.splitlines() == [
        f"iomatrix: {tmp_path / 'empty'}: no fio result to import (0 files looked at)",
        "iomatrix: hint: give the directory that holds fio's --output-format=json (or json+) files"]
    assert not db.exists()


def test_only_other_json_names_what_was_skipped(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "result.json").write_text('{"iops": 1}')
    with pytest.raises(NothingToImport, match=r"1 files looked at; skipped 1, e\.g\. result\.json: "
                                              r'JSON without "fio version": not fio output'):
        scan(tmp_path / "d")


def test_unparsable_fio_output_is_skipped_with_the_parsers_reason(tmp_path: Path) -> None:
    directory = tmp_path / "d"
    directory.mkdir()
    shutil.copy(FIXTURES / "3.33" / "randread.json", directory / "good.json")
    text = (FIXTURES / "3.33" / "randread.json").read_text()
    (directory / "cut.json").write_text(text[: len(text) // 2])
    found = scan(directory)
    assert [t.path for t in found.trials] == ["good.json"]
    (skipped,) = found.skipped
    assert skipped.path == "cut.json" and skipped.reason.startswith("invalid JSON in fio output")


def test_cli_import_then_show(tmp_path: Path) -> None:
    directory = FIXTURES / "3.1" / "bench-fio"
    db = tmp_path / "r.db"
    code, output = cli("import", str(directory), "--db", str(db), "--name", "old-nvme")
    assert code == 0, output
    assert output.splitlines() == [
        f"run 1: imported 4 fio result files from {directory} ({db})",
        "  configurations (1): host: disk-c.img",
        "  workloads (4): 4k randread QD1 ×2 jobs; 4k randread QD4 ×2 jobs; "
        "64k randread QD1 ×2 jobs; 64k randread QD4 ×2 jobs",
        "  trials: 4 ok, 0 failed (fio reported an error)",
        "  note: latency: fio's completion latency (clat), mean and percentiles: fio computes "
        "percentiles of the total latency only with lat_percentiles=1",
        "  note: configuration names leave out the folders that name each file's workload: 4k, 64k",
        f"  not fio output: {len(list(directory.rglob('*.log')))} other files (job files, logs, tool data)",
        "  mode host: assumed (fio ran on the storage directly); import with --mode to say otherwise",
    ]
    code, output = cli("show", "1", "--db", str(db))
    assert code == 0, output
    lines = output.splitlines()
    assert lines[0].startswith("run 1 · suite old-nvme · complete · ")
    assert lines[0].endswith(" · unknown (imported) · target /var/tmp/iomx-ingest/bf/disk-c.img (unknown)")
    rows = [line.split() for line in lines if line.startswith(" host: disk-c.img")]
    assert [row[2:6] for row in rows] == [["4k", "randread", "QD1", "×2"], ["4k", "randread", "QD4", "×2"],
                                          ["64k", "randread", "QD1", "×2"], ["64k", "randread", "QD4", "×2"]]
    assert f"note: imported from {directory} (4 files)" in lines


def test_mode_is_stated_or_refused(tmp_path: Path) -> None:
    run = _import(tmp_path, FIXTURES / "3.33" / "failed", mode="imported")
    assert [(c.label, c.mode) for c in run.configs] == [("failed", "imported")]
    assert run.notes[-1] == "mode imported: as stated when imported"
    code, output = cli("import", str(FIXTURES / "3.33" / "failed"), "--mode", "vm",
                       "--db", str(tmp_path / "x.db"))
    assert code == 2 and "choose host, blocklayer, guest, imported" in output
    assert not (tmp_path / "x.db").exists()


@pytest.mark.parametrize(("parts", "workload", "expected"), [
    # bench-fio: <target>/<bs>/..., <target>/<rw><mix>/<bs>/..., <target>/<bs>/run-N/...
    (("nvme0n1", "4k"), Workload(rw="randread", bs=4096, iodepth=1), ("nvme0n1",)),
    (("nvme0n1", "randrw70", "64k"), Workload(rw="randrw", bs=65536, iodepth=1,
                                                options=(("rwmixread", "70"),)), ("nvme0n1",)),
    (("sdb", "1m", "run-2"), Workload(rw="write", bs=1 << 20, iodepth=64), ("sdb",)),
    # pbench-fio: <run>/<N>-<rw>-<bs>KiB/sample<M>/
    (("fio_ceph_2024.01.02T03.04.05", "3-randwrite-16KiB", "sample5"),
     Workload(rw="randwrite", bs=16384, iodepth=32), ("fio_ceph_2024.01.02T03.04.05",)),
    # hand-made: what names the workload goes, what does not stays
    (("virtio-scsi", "iothread", "randread-qd32-nj4", "3"),
     Workload(rw="randread", bs=4096, iodepth=32, numjobs=4), ("virtio-scsi", "iothread")),
    (("2024", "qd32"), Workload(rw="randread", bs=4096, iodepth=1), ("2024", "qd32")),
    (("4k",), Workload(rw="randread", bs=8192, iodepth=1), ("4k",)),
])
def test_directories_that_name_the_workload_or_a_repeat_are_not_configurations(
        parts: tuple[str, ...], workload: Workload, expected: tuple[str, ...]) -> None:
    assert _location(parts, workload) == expected


def test_configuration_names_leave_out_shared_leading_directories() -> None:
    root = Path("/data/results")
    assert _names([("lab", "ssd"), ("lab", "hdd")], root) == {("lab", "ssd"): "ssd", ("lab", "hdd"): "hdd"}
    assert _names([("lab", "ssd")], root) == {("lab", "ssd"): "lab/ssd"}
    assert _names([()], root) == {(): "results"}
    assert _names([(), ("ssd",)], root) == {(): "results", ("ssd",): "ssd"}
