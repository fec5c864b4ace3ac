"""What a figure is and how it is written, on real fio output (tests/fixtures/fio, and fio run
here for the cases no fixture shows): percentiles of mixed workloads per direction and never
averaged, one fio latency per run named in every heading, significant figures that keep a slow
device's figures, ``compare --match`` for imported folders, and how ``import`` names, counts and
refuses what it reads."""

from __future__ import annotations

import gzip
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from iomatrix.analysis.crossrun import compare_runs
from iomatrix.analysis.metrics import METRICS, RunLatency, figure_text, run_latency
from iomatrix.analysis.points import points
from iomatrix.cli.status import ExitStatus
from iomatrix.core.errors import AnalysisError
from iomatrix.fio.parse import parse_fio_output
from iomatrix.fio.samples import DirectionSample, mixed_percentiles
from iomatrix.report.data import build_report_data
from iomatrix.report.html import metrics_json
from iomatrix.store import Store
from iomatrix.store.ingest import _location, import_results, scan
from iomatrix.store.records import StoredRun, StoredSuite
from iomatrix.suite.workloads import Workload
from tests.conftest import cli

FIXTURES = Path(__file__).parents[1] / "fixtures" / "fio"
PCT = {"p50": "50.000000", "p90": "90.000000", "p99": "99.000000", "p99_9": "99.900000",
       "p99_99": "99.990000"}


def fio(tmp_path: Path, name: str, *options: str) -> Path:
    """fio run for real on a small file under ``tmp_path`` (the options before the first job's
    name are every job's); its JSON output file."""
    out = tmp_path / f"{name}.json"
    subprocess.run(["fio", f"--output={out}", "--output-format=json",
                    f"--filename={tmp_path / 'data.img'}", "--size=8m", "--bs=4k",
                    "--ioengine=libaio", "--direct=1", "--runtime=1", "--time_based",
                    f"--name={name}", *options], check=True, capture_output=True, text=True,
                   timeout=60)
    return out


def folder(tmp_path: Path, name: str, files: dict[str, Path]) -> Path:
    """A directory ``name`` holding copies of ``files`` (relative name → source)."""
    root = tmp_path / name
    for rel, source in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, root / rel)
    return root


def imported(db: Path, *directories: Path) -> list[StoredRun]:
    with Store(db) as store:
        ids = [import_results(store, d).run_id for d in directories]
        return [store.load_run(i) for i in ids]


def raw(path: Path) -> dict:  # type: ignore[type-arg]
    text = path.read_text()
    return json.loads(text[text.index("{"):])


# --- mixed workloads: percentiles per direction, never averaged -------------------------------------


def test_both_directions_histograms_give_fios_own_mixed_percentiles(tmp_path: Path) -> None:
    out = fio(tmp_path, "randrw", "--rw=randrw", "--rwmixread=70", "--iodepth=4",
              "--lat_percentiles=1", "--unified_rw_reporting=both", "--output-format=json+")
    job = parse_fio_output(out.read_text()).jobs[0]
    fios = raw(out)["jobs"][0]["mixed"]   # fio's own percentiles of reads and writes together
    for kind in ("lat", "clat"):
        mine = mixed_percentiles(job.read, job.write, kind)
        assert mine is not None
        assert {k: getattr(mine, k) for k in PCT} == {k: float(fios[f"{kind}_ns"]["percentile"][v])
                                                     for k, v in PCT.items()}
    # without histograms there is no true combined percentile, and none is made up
    plain = parse_fio_output((FIXTURES / "3.33/randrw.json").read_text()).jobs[0]
    assert mixed_percentiles(plain.read, plain.write, "clat") is None


def test_mixed_workloads_are_shown_and_compared_per_direction(tmp_path: Path) -> None:
    a = folder(tmp_path, "a", {"ssd/randrw.json": FIXTURES / "3.33/randrw.json"})
    b = folder(tmp_path, "b", {"nvme/randrw.json": FIXTURES / "3.41/randrw.json"})
    db = tmp_path / "r.db"
    run_a, run_b = imported(db, a, b)
    (point,) = points(run_a)
    job = raw(FIXTURES / "3.33/randrw.json")["jobs"][0]
    p99 = {d: job[d]["clat_ns"]["percentile"]["99.000000"] for d in ("read", "write")}
    assert point.mixed and point.lat_p99_ns is None and point.lat_p50_ns is None
    assert {d: f.lat_p99_ns for d, f in point.directions.items()} == p99
    weighted = ((p99["read"] * job["read"]["total_ios"] + p99["write"] * job["write"]["total_ios"])
                / (job["read"]["total_ios"] + job["write"]["total_ios"]))
    # the mean latency of both directions is their I/O-weighted mean: the mean of all I/Os
    mean = ((job["read"]["clat_ns"]["mean"] * job["read"]["total_ios"]
             + job["write"]["clat_ns"]["mean"] * job["write"]["total_ios"])
            / (job["read"]["total_ios"] + job["write"]["total_ios"]))
    assert point.lat_mean_ns == pytest.approx(mean)

    code, out = cli("show", "1", "--db", str(db))
    assert code == 0, out
    lines = out.splitlines()
    us = lambda ns: figure_text(ns / 1000)  # noqa: E731
    (row,) = [line for line in lines if "4k randrw QD4 " in line and "·" not in line.split("QD4")[1]]
    assert "r/w ↓" in row                       # its percentiles: in the direction rows
    assert us(weighted) not in row.split()
    for d in ("read", "write"):
        (line,) = [line for line in lines if f"4k randrw QD4 · {d}" in line]
        assert line.split()[-1] == us(p99[d])
    assert any(line.startswith("mixed workloads: percentiles per direction") for line in lines)

    # compare --metric p99: each direction compared on its own (one configuration each: paired)
    result = compare_runs(run_a, run_b, metric="lat_p99_ns")
    assert [(p.workload_label, p.direction) for p in result.points] == [
        ("4k randrw QD4 · read", "read"), ("4k randrw QD4 · write", "write")]
    job_b = raw(FIXTURES / "3.41/randrw.json")["jobs"][0]
    assert result.points[0].b.mean == job_b["read"]["clat_ns"]["percentile"]["99.000000"]
    code, out = cli("compare", "1", "2", "--db", str(db), "--metric", "p99")
    assert code == 0, out
    assert "compared: A host: ssd with B host: nvme (each run has only this configuration)" in out
    assert " A clat p99 µs " in out and "4k randrw QD4 · write" in out
    assert "mixed workloads: p99 latency compared per direction (read, write)" in out


# --- one fio latency per run, named in every heading ------------------------------------------------


def test_an_import_is_of_one_latency_named_in_every_heading(tmp_path: Path) -> None:
    lat = folder(tmp_path, "lat", {"r.json": FIXTURES / "3.33/randread-latpct.json"})
    clat = folder(tmp_path, "clat", {"r.json": FIXTURES / "3.33/randread.json"})
    db = tmp_path / "r.db"
    run_lat, run_clat = imported(db, lat, clat)
    for run, path, kind in ((run_lat, "3.33/randread-latpct.json", "lat"),
                            (run_clat, "3.33/randread.json", "clat")):
        read = raw(FIXTURES / path)["jobs"][0]["read"][f"{kind}_ns"]
        (sample,) = run.trials[0].samples
        # the mean and the percentiles of one distribution, never of two
        assert (sample.lat_mean_ns, sample.p99_ns) == (read["mean"], read["percentile"]["99.000000"])
        assert run.host["latency"] == kind and run_latency(run) == RunLatency(mean=kind, percentiles=kind)
        code, out = cli("show", str(run.id), "--db", str(db))
        assert f" {kind} mean µs  {kind} p50 µs  {kind} p99 µs " in out
        data = build_report_data(run)
        assert (data.latency_mean, data.latency_percentiles) == (kind, kind)
        page = {m["key"]: m for m in json.loads(metrics_json(run_latency(run)))}   # the report's
        assert page["lat_p99_ns"]["heading"] == f"{kind} p99 µs" and page["iops"]["heading"] == "IOPS"
        assert page["lat_mean_ns"]["axis"] == f"mean latency (µs, fio {kind})"
    assert "completion latency (fio's clat: without submission)" in build_report_data(run_clat).latency_note
    # comparing the two: the latencies differ, and both the warning and the headings say so
    code, out = cli("compare", "1", "2", "--db", str(db), "--metric", "p99")
    assert code == 0, out
    assert ("warning: p99 latency is not the same latency: A total latency (fio's lat: submission + "
            "completion) · B completion latency (fio's clat: without submission)") in out
    assert " A lat p99 µs " in out and " B clat p99 µs " in out


def test_results_of_different_latencies_make_one_latency_per_run(tmp_path: Path) -> None:
    # fio 3.16 with lat_percentiles=1 wrote percentiles of lat only; without, of clat only
    directory = folder(tmp_path, "d", {"a.json": FIXTURES / "3.16/randread.json",
                                       "b.json": FIXTURES / "3.16/randrw.json",
                                       "c.json": FIXTURES / "3.16/randread-latpct.json"})
    found = scan(directory)
    assert found.latency == "clat"
    assert "1 of 3 results have percentiles of the other latency only: their percentiles are left out" \
        in " ".join(found.notes)
    latpct = next(t for t in found.trials if t.path == "c.json")
    clat = raw(FIXTURES / "3.16/randread-latpct.json")["jobs"][0]["read"]["clat_ns"]
    assert latpct.samples[0].lat_mean_ns == clat["mean"] and latpct.samples[0].p99_ns is None


def test_own_runs_are_of_lat_and_never_take_another_latencys_percentiles(tmp_path: Path) -> None:
    for path, p99 in (("3.33/randread-latpct.json", True), ("3.33/randread.json", False)):
        read = parse_fio_output((FIXTURES / path).read_text()).jobs[0].read
        sample = DirectionSample.from_stats("read", read)   # as the runner makes them
        assert read.lat is not None and sample.lat_mean_ns == read.lat.mean_ns
        assert sample.p99_ns == (read.lat.percentiles.p99 if p99 else None)
    # a run imported before the latency was recorded: lat means beside fio's default clat percentiles
    (run,) = imported(tmp_path / "r.db", folder(tmp_path, "d", {"r.json": FIXTURES / "3.33/randread.json"}))
    legacy = run.model_copy(update={"host": {k: v for k, v in run.host.items() if k != "latency"}})
    assert run_latency(legacy) == RunLatency(mean="lat", percentiles="clat")
    assert [METRICS[k].heading_for(run_latency(legacy)) for k in ("lat_mean_ns", "lat_p99_ns")] == [
        "lat mean µs", "clat p99 µs"]
    own = legacy.model_copy(update={"suite": StoredSuite(
        name=run.suite.name, source="builtin:quick", text=run.suite.text)})
    assert run_latency(own) == RunLatency(mean="lat", percentiles="lat")


# --- significant figures -----------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "text"), [
    (12345.6, "12,346"), (999.96, "1,000"), (123.4, "123"), (12.34, "12.3"), (2.657, "2.66"),
    (9.996, "10.0"), (10 * 1024 / 2**20, "0.00977"), (0.0, "0"), (-3.14159, "-3.14"),
    (None, "—"), (float("nan"), "—"),
])
def test_figures_keep_three_significant_digits(value: float | None, text: str) -> None:
    assert figure_text(value) == text


@pytest.mark.slow
def test_show_keeps_a_slow_devices_figures_and_has_a_mean_latency(tmp_path: Path) -> None:
    out = fio(tmp_path, "slow", "--rw=randread", "--iodepth=1", "--rate_iops=3")
    iops = raw(out)["jobs"][0]["read"]["iops"]
    assert 2 < iops < 4
    directory = folder(tmp_path, "slow-disk", {"slow.json": out})
    code, text = cli("import", str(directory), "--db", str(tmp_path / "r.db"))
    assert code == 0, text
    code, text = cli("show", "1", "--db", str(tmp_path / "r.db"))
    header = next(line for line in text.splitlines() if line.startswith(" configuration"))
    row = next(line for line in text.splitlines() if line.startswith(" host: slow-disk"))
    cells = dict(zip(re.split(r"\s{2,}", header.strip()), re.split(r"\s{2,}", row.strip())))
    assert cells["IOPS"] == figure_text(iops) and re.fullmatch(r"\d\.\d\d", cells["IOPS"])
    assert re.fullmatch(r"0\.0\d{3}", cells["MiB/s"])            # ~12 KiB/s, not 0.0
    mean = raw(out)["jobs"][0]["read"]["clat_ns"]["mean"]
    assert cells["clat mean µs"] == figure_text(mean / 1000)


# --- compare --match ---------------------------------------------------------------------------------


def test_compare_pairs_imported_folders_by_match(tmp_path: Path) -> None:
    a = folder(tmp_path, "lab-a", {"ssd/r.json": FIXTURES / "3.33/randread.json",
                                    "hdd/w.json": FIXTURES / "3.33/import/randwrite-4k-qd4.json"})
    b = folder(tmp_path, "lab-b", {"nvme/r.json": FIXTURES / "3.41/randread.json",
                                    "sata/w.json": FIXTURES / "3.41/import/randwrite-4k-qd4.json"})
    db = tmp_path / "r.db"
    run_a, run_b = imported(db, a, b)
    assert compare_runs(run_a, run_b).points == ()
    code, out = cli("compare", "1", "2", "--db", str(db))
    assert code == 0 and ("no point was measured in both runs: no configuration of A has the name "
                          "of one of B; pair them with --match CONFIG_A=CONFIG_B") in out
    by_workload = compare_runs(run_a, run_b, match=["workload"])
    assert sorted((p.config_label, p.config_label_b, p.workload_label) for p in by_workload.points) == [
        ("host: hdd", "host: sata", "4k randwrite QD4"), ("host: ssd", "host: nvme", "4k randread QD4")]
    code, out = cli("compare", "1", "2", "--db", str(db), "--match", "ssd=nvme",
                    "--match", "host/source=hdd=host: sata")
    assert code == 0, out
    assert re.search(r"host: ssd ↔ host: nvme +4k randread QD4", out) and "host: hdd ↔ host: sata" in out
    only = compare_runs(run_a, run_b, match=["ssd=nvme"])
    assert [p.workload_label for p in only.points] == ["4k randread QD4"]
    assert (only.only_a, only.only_b) == (("host: hdd",), ("host: sata",))
    code, out = cli("compare", "1", "2", "--db", str(db), "--match", "ssd=sdb")
    assert code == ExitStatus.USAGE
    assert "--match 'ssd=sdb' names no configuration of each run" in out
    # one workload in two configurations of a run: --match workload cannot pair it
    c = folder(tmp_path, "lab-c", {"x/r.json": FIXTURES / "3.25/randread.json",
                                   "y/r.json": FIXTURES / "3.28/randread.json"})
    d = folder(tmp_path, "lab-d", {"z/r.json": FIXTURES / "3.16/randread.json"})
    run_c, run_d = imported(tmp_path / "c.db", c, d)
    with pytest.raises(AnalysisError, match=r"measured 4k randread QD4 in 2 configurations \(host: x, host: y\)"):
        compare_runs(run_c, run_d, match=["workload"])


# --- import: names, versions, reasons, counts --------------------------------------------------------


def test_folders_named_like_a_workload_are_never_merged_silently(tmp_path: Path) -> None:
    directory = folder(tmp_path, "results", {"mix/r.json": FIXTURES / "3.33/randrw.json",
                                             "randrw/r.json": FIXTURES / "3.41/randrw.json",
                                             "randrw/run-2/r.json": FIXTURES / "3.28/randrw.json"})
    (run,) = imported(tmp_path / "r.db", directory)
    # "mix" alone names no workload; "randrw" does, but leaving it out would merge it with mix/
    assert sorted(c.label for c in run.configs) == ["host: mix", "host: randrw"]
    counts = {c.label: sum(t.config_key == c.key for t in run.trials) for c in run.configs}
    assert counts == {"host: mix": 1, "host: randrw": 2}     # run-2/ is a repetition: a sample
    assert "folders taken as repetitions (their files are samples of one point): run-2" in run.notes
    mixed = Workload(rw="randrw", bs=4096, iodepth=4, options=(("rwmixread", "70"),))
    assert _location(("mix",), mixed) == ("mix",) and _location(("randrw",), mixed) == ()
    # two folders that differ only by what names the workload: kept apart, and the notes say so
    two = folder(tmp_path, "two", {"ssd/4k/r.json": FIXTURES / "3.33/randread.json",
                                   "ssd/4096/r.json": FIXTURES / "3.41/randread.json"})
    found = scan(two)
    assert sorted({t.location for t in found.trials}) == [("ssd", "4096"), ("ssd", "4k")]
    assert any("ssd/4096 and ssd/4k hold the same workload (4k randread QD4)" in w
               for w in found.warnings)


def test_fio_2_results_import_and_fio_2_1_is_skipped_saying_why(tmp_path: Path) -> None:
    directory = folder(tmp_path, "old", {"a.json": FIXTURES / "2.20/randread-jsonplus.json",
                                         "b.json": FIXTURES / "2.20/randrw-jsonplus.json",
                                         "c.json": FIXTURES / "2.1.10/randread.json"})
    with Store(tmp_path / "r.db") as store:
        summary = import_results(store, directory)
        run = store.load_run(summary.run_id)
    assert summary.files == 2
    assert [(s.path, s.reason) for s in summary.skipped] == [
        ("c.json", "fio-2.1.10 output: fio before 2.3 writes no job options, so the workload "
                   "(rw, bs, iodepth) of its results is unknown")]
    assert sorted(w.label for w in run.workloads) == ["4k randread QD4", "4k randrw QD4"]
    assert run.host["fio"] == "fio-2.20" and run.host["latency"] == "clat"
    for t in run.trials:
        for s in t.samples:
            assert s.io_bytes == s.total_ios * 4096          # fio 2.20 wrote KiB
            assert s.p99_ns is not None and s.lat_mean_ns is not None
    read = raw(FIXTURES / "2.20/randread-jsonplus.json")["jobs"][0]["read"]
    sample = next(t for t in run.trials if t.workload_key.startswith("randread")).samples[0]
    assert sample.lat_mean_ns == pytest.approx(read["clat"]["mean"] * 1000)   # µs → ns


def test_files_that_are_not_fio_output_are_named_for_what_they_are(tmp_path: Path) -> None:
    directory = folder(tmp_path, "d", {"good.json": FIXTURES / "3.33/randread.json"})
    (directory / "empty.json").write_bytes(b"")
    (directory / "blank.json").write_text("\n  \n")
    (directory / "packed.json").write_bytes(gzip.compress((FIXTURES / "3.33/randread.json").read_bytes()))
    (directory / "cut.json").write_text('{"throughput": {"iops": ')
    (directory / "other.json").write_text('{"iops": 1}')
    reasons = {s.path: s.reason for s in scan(directory).skipped}
    assert reasons == {
        "blank.json": "only blank space (4 bytes), no fio output",
        "cut.json": "not valid JSON (line 1 column 25: Expecting value)",
        "empty.json": "empty file (0 bytes)",
        "other.json": 'JSON without "fio version": not fio output',
        "packed.json": reasons["packed.json"],
    }
    assert re.fullmatch(r"binary data \(\d+ bytes\), not (JSON|UTF-8) text", reasons["packed.json"])


@pytest.mark.slow
def test_a_file_whose_every_job_was_skipped_is_not_counted_as_imported(tmp_path: Path) -> None:
    directory = tmp_path / "d"
    directory.mkdir()
    out = fio(tmp_path, "both", "--rw=randread", "--iodepth=2", "--name=writer", "--rw=randwrite")
    shutil.copy(out, directory / "both.json")
    shutil.copy(FIXTURES / "3.33/randread.json", directory / "good.json")
    db = tmp_path / "r.db"
    code, text = cli("import", str(directory), "--db", str(db))
    assert code == 0, text
    lines = text.splitlines()
    assert lines[0].startswith("run 1: imported 1 fio result files from ")
    assert "  skipped (1):" in lines
    assert any(line.startswith("    both.json: its jobs ran different workloads at once") for line in lines)
    with Store(db) as store:
        assert store.load_run(1).notes[0].endswith("(1 files)")


@pytest.mark.slow
def test_jobs_on_different_files_at_once_are_summed_with_a_note(tmp_path: Path) -> None:
    out = fio(tmp_path, "one", "--rw=randread", "--iodepth=2",
              "--name=two", f"--filename={tmp_path / 'other.img'}", "--rw=randread", "--iodepth=2")
    found = scan(folder(tmp_path, "d", {"two-files.json": out}))
    (trial,) = found.trials
    jobs = raw(out)["jobs"]
    assert trial.samples[0].total_ios == sum(j["read"]["total_ios"] for j in jobs)
    assert any(w.startswith("two-files.json: its 2 jobs ran at once on different files or devices (")
               and "stored summed as one trial" in w for w in found.warnings)
