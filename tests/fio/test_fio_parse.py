"""fio output parsing, against real output of several fio releases (tests/fixtures/fio/README.md)
and against every way the parser must refuse its input. Runs no fio."""

from __future__ import annotations

import copy
import functools
import json
import re
from collections import Counter
from pathlib import Path

import pytest

from iomatrix.core.errors import FioParseError
from iomatrix.fio.models import DirectionStats, FioResult, JobStats, Latency, Percentiles
from iomatrix.fio.parse import parse_fio_json, parse_fio_output

FIXTURES = Path(__file__).parents[1] / "fixtures" / "fio"
BS = 4096  # every fixture job used bs=4k
PCT_ORDER = ("p50", "p90", "p99", "p99_9", "p99_99")


def _version(path: Path) -> tuple[int, ...]:
    return tuple(int(x) for x in path.parent.name.split("."))


# fio 3.x releases: the same set of runs each (fio 2.x, in 2.1.10/ and 2.20/, below)
FILES = sorted(p for p in FIXTURES.glob("*/*") if p.suffix in (".json", ".out")
               and _version(p) >= (3,))
VERSIONS = sorted({p.parent.name for p in FILES}, key=lambda v: tuple(map(int, v.split("."))))


def _kind(path: Path) -> str:
    return path.stem


def _is_client(path: Path) -> bool:
    return path.stem.startswith("client")


def _two_clients(path: Path) -> bool:
    return path.stem.startswith("client2")


def _raw(name: str) -> str:
    return (FIXTURES / name).read_text()


def _obj(name: str) -> dict:
    text = _raw(name)
    start = re.search(r"^\{", text, re.M)
    assert start is not None
    return json.JSONDecoder().raw_decode(text, start.start())[0]


def _expected_source(path: Path) -> str | None:
    """Which latency the percentiles describe, from how fio was run (see the README)."""
    kind = _kind(path)
    if kind == "randread-latpct":
        return "lat"
    if kind == "randread-nopct":
        # clat_percentiles=0 switched lat_percentiles on before fio 3.18; later it means none.
        return "lat" if _version(path) < (3, 18) else None
    return "clat"


def _all_entries(result: FioResult) -> list[JobStats]:
    return list(result.jobs) + ([result.aggregate] if result.aggregate is not None else [])


def _directions(job: JobStats) -> list[tuple[str, DirectionStats]]:
    return [("read", job.read), ("write", job.write)]


@functools.cache
def _parsed(path: Path) -> FioResult:
    return parse_fio_output(path.read_text())


def _params(paths: list[Path]) -> list:  # type: ignore[type-arg]
    return [pytest.param(p, id=f"{p.parent.name}/{p.name}") for p in paths]


ALL = _params(FILES)
LATPCT = _params([p for p in FILES if _kind(p) == "randread-latpct"])
CLIENT = _params([p for p in FILES if _is_client(p)])


@pytest.fixture(params=ALL)
def fixture(request: pytest.FixtureRequest) -> tuple[Path, FioResult]:
    path: Path = request.param
    return path, _parsed(path)


def test_fixtures_cover_several_fio_releases() -> None:
    assert len(VERSIONS) >= 4, VERSIONS
    assert "3.33" in VERSIONS
    for version in VERSIONS:
        names = {p.name for p in FILES if p.parent.name == version}
        assert {"randread.json", "randread-jsonplus.json", "randread-latpct.json", "randrw.json",
                "client1-randread.out", "client2-randread.out"} <= names, (version, names)


def test_version_timestamp_and_names(fixture: tuple[Path, FioResult]) -> None:
    path, result = fixture
    assert result.fio_version == f"fio-{path.parent.name}"
    assert result.timestamp > 1_500_000_000
    expected = "randrw" if _kind(path) == "randrw" else "randread"
    assert [job.name for job in result.jobs] == [expected] * len(result.jobs)
    for job in _all_entries(result):
        assert job.error == 0
        assert job.ctx > 0
        assert job.usr_cpu >= 0 and job.sys_cpu >= 0
        assert 0 < job.usr_cpu + job.sys_cpu <= 100 * len(result.jobs)


def test_active_and_inactive_directions(fixture: tuple[Path, FioResult]) -> None:
    path, result = fixture
    both = _kind(path) == "randrw"
    for job in _all_entries(result):
        assert job.read.active and job.read.iops > 0 and job.read.bw_bytes > 0
        assert job.write.active is both
        if both:
            assert job.write.iops > 0 and job.write.bw_bytes > 0
            # rwmixread=70: reads are about 70 % of the I/Os
            share = job.read.total_ios / (job.read.total_ios + job.write.total_ios)
            assert 0.6 < share < 0.8
        else:
            w = job.write
            assert (w.iops, w.bw_bytes, w.io_bytes, w.total_ios) == (0, 0, 0, 0)
            assert w.lat is None and w.clat is None
            assert w.percentile_source is None and w.bins is None


def test_bandwidth_iops_and_bytes_agree(fixture: tuple[Path, FioResult]) -> None:
    _, result = fixture
    for job in _all_entries(result):
        for name, d in _directions(job):
            if not d.active:
                continue
            assert d.io_bytes == d.total_ios * BS, name
            assert 900 <= d.runtime_ms <= 1100, name  # runtime=1, time_based
            assert d.bw_bytes == pytest.approx(d.io_bytes * 1000 / d.runtime_ms, rel=0.005), name
            assert d.iops == pytest.approx(d.total_ios * 1000 / d.runtime_ms, rel=0.005), name
            assert d.bw_bytes == pytest.approx(d.iops * BS, rel=0.005), name


def test_job_runtime(fixture: tuple[Path, FioResult]) -> None:
    path, result = fixture
    for job in result.jobs:
        assert 900 <= job.job_runtime_ms <= 1100
    if result.aggregate is not None:
        clients = sum(job.job_runtime_ms for job in result.jobs)
        longest = max(job.read.runtime_ms for job in result.jobs)
        # fio >= 3.9 sums the clients' job_runtime; 3.1 has none, so the parser falls back to the
        # longest direction runtime.
        assert result.aggregate.job_runtime_ms == (clients if _version(path) >= (3, 9) else longest)


def test_latency_summaries_are_in_nanoseconds(fixture: tuple[Path, FioResult]) -> None:
    _, result = fixture
    for job in _all_entries(result):
        for name, d in _directions(job):
            if not d.active:
                continue
            assert d.lat is not None and d.clat is not None, name
            for lat in (d.lat, d.clat):
                assert 0 < lat.min_ns <= lat.mean_ns <= lat.max_ns, name
                assert lat.stdev_ns >= 0
                # local direct 4k I/O at QD4 on a VM disk: microseconds to milliseconds
                assert 1_000 < lat.mean_ns < 10_000_000, (name, lat.mean_ns)
            # total latency = submission + completion latency
            assert d.lat.mean_ns >= d.clat.mean_ns
            assert d.lat.min_ns >= d.clat.min_ns


def _ordered(lat: Latency) -> list[float]:
    values = [getattr(lat.percentiles, name) for name in PCT_ORDER]
    assert all(v is not None for v in values), lat.percentiles
    return values  # type: ignore[return-value]


def test_percentiles_source_and_order(fixture: tuple[Path, FioResult]) -> None:
    path, result = fixture
    expected = _expected_source(path)
    for job in result.jobs:
        for name, d in _directions(job):
            if not d.active:
                continue
            assert d.percentile_source == expected, name
            assert d.lat is not None and d.clat is not None
            if expected is None:
                assert d.lat.percentiles == d.clat.percentiles
                assert all(getattr(d.lat.percentiles, p) is None for p in PCT_ORDER)
                continue
            # each distribution carries its own percentiles, never another's
            source = d.lat if expected == "lat" else d.clat
            values = _ordered(source)
            assert values == sorted(values), (name, values)
            # fio's percentiles are histogram bucket values: within a bucket (< 2 %) of the range
            assert values[0] >= source.min_ns * 0.98 and values[-1] <= source.max_ns * 1.02
            if expected == "clat":
                assert all(getattr(d.lat.percentiles, p) is None for p in PCT_ORDER)


@pytest.mark.parametrize("path", LATPCT)
def test_lat_percentiles_run(path: Path) -> None:
    d = _parsed(path).jobs[0].read
    assert d.percentile_source == "lat"
    assert d.lat is not None and d.clat is not None
    if _version(path) >= (3, 18):
        # Both distributions reported; every I/O's total latency >= its completion latency,
        # so each percentile of lat is >= the same percentile of clat.
        lat, clat = _ordered(d.lat), _ordered(d.clat)
        assert all(a >= b for a, b in zip(lat, clat)), (lat, clat)
    else:
        # Older fio computed only one histogram, of the total latency.
        assert all(getattr(d.clat.percentiles, p) is None for p in PCT_ORDER)


def test_bins_exactly_for_json_plus(fixture: tuple[Path, FioResult]) -> None:
    path, result = fixture
    plus = _kind(path) == "randread-jsonplus"
    for job in result.jobs:
        for name, d in _directions(job):
            if not d.active:
                assert d.bins is None
                continue
            if not plus:
                assert d.bins is None, name
                continue
            assert d.bins, name
            bounds = [b for b, _ in d.bins]
            assert bounds == sorted(set(bounds)) and bounds[0] > 0
            assert all(count > 0 for _, count in d.bins)
            total = sum(count for _, count in d.bins)
            assert total == pytest.approx(d.total_ios, rel=0.01)
            # the histogram's mean matches fio's own mean: bounds are ns, like the summaries
            assert d.clat is not None
            mean = sum(b * c for b, c in d.bins) / total
            assert mean == pytest.approx(d.clat.mean_ns, rel=0.05)


def test_client_fields_and_prelude(fixture: tuple[Path, FioResult]) -> None:
    path, result = fixture
    if not _is_client(path):
        assert result.prelude == ""
        assert result.aggregate is None
        assert all(job.hostname is None and job.port is None for job in result.jobs)
        return
    assert result.prelude.strip() or _kind(path) == "client1-optafter"
    assert not result.prelude.lstrip().startswith("{")
    if _kind(path) == "client1-optafter":
        assert result.prelude == "\n"  # --output-format after the job file: no text lines
    else:
        assert "Starting 1 process" in result.prelude
        assert "randread: (g=0)" in result.prelude
    for job in result.jobs:
        assert job.hostname == "127.0.0.1"
        assert isinstance(job.port, int) and 1024 < job.port < 65536
    assert "All clients" not in [job.name for job in result.jobs]


@pytest.mark.parametrize("path", CLIENT)
def test_client_aggregate(path: Path) -> None:
    result = _parsed(path)
    if not _two_clients(path):
        assert len(result.jobs) == 1 and result.aggregate is None
        return
    assert len(result.jobs) == 2
    assert len({job.port for job in result.jobs}) == 2
    agg = result.aggregate
    assert agg is not None and agg.name == "All clients"
    assert agg.hostname is None and agg.port is None
    for attr in ("total_ios", "io_bytes"):
        assert getattr(agg.read, attr) == sum(getattr(job.read, attr) for job in result.jobs)
        assert getattr(agg.write, attr) == 0
    assert agg.read.runtime_ms == max(job.read.runtime_ms for job in result.jobs)
    assert agg.read.iops == pytest.approx(sum(job.read.iops for job in result.jobs), rel=0.02)
    assert agg.ctx == sum(job.ctx for job in result.jobs)
    # fio 3.41 is the first of these to report percentiles for the aggregate
    if _version(path) >= (3, 41):
        assert agg.read.percentile_source == "clat"
        assert agg.read.clat is not None
        values = _ordered(agg.read.clat)
        assert values == sorted(values)
    else:
        assert agg.read.percentile_source is None


# --- fio 2.x ------------------------------------------------------------------------------------------


def test_fio_2_1_json_has_no_timestamp_no_total_ios_and_io_bytes_in_kib() -> None:
    """fio 2.1.10 (built from the tag): no timestamp, no job options, no total_ios, io_bytes in
    KiB, integer iops and bw (KiB/s), latencies in µs, percentiles of clat padded with "0.00"."""
    obj = _obj("2.1.10/randread.json")
    raw = obj["jobs"][0]["read"]
    assert "timestamp" not in obj and "job options" not in obj["jobs"][0]
    assert "total_ios" not in raw and "io_kbytes" not in raw
    result = _parsed(FIXTURES / "2.1.10/randread.json")
    assert result.fio_version == "fio-2.1.10" and result.timestamp is None
    d = result.jobs[0].read
    assert d.io_bytes == raw["io_bytes"] * 1024
    # total I/Os from iops × runtime: within an I/O per second of the bytes fio counted
    assert abs(d.total_ios - d.io_bytes / BS) <= d.runtime_ms / 1000 + 1
    assert d.bw_bytes == raw["bw"] * 1024 and d.iops == raw["iops"]
    assert d.percentile_source == "clat" and d.clat is not None and d.lat is not None
    assert d.clat.mean_ns == pytest.approx(raw["clat"]["mean"] * 1000)
    assert d.clat.percentiles.p99 == raw["clat"]["percentile"]["99.000000"] * 1000
    assert d.lat.percentiles == Percentiles()   # fio 2.x computes no total-latency percentiles
    assert not result.jobs[0].write.active
    both = _parsed(FIXTURES / "2.1.10/randrw.json").jobs[0]
    assert both.read.active and both.write.active
    assert 0.6 < both.read.total_ios / (both.read.total_ios + both.write.total_ios) < 0.8
    # clat_percentiles=0: in fio 2.1 (no lat_percentiles yet) simply none
    nopct = _parsed(FIXTURES / "2.1.10/randread-nopct.json").jobs[0].read
    assert nopct.percentile_source is None


def test_fio_2_20_io_bytes_in_kib_with_job_options_and_microsecond_bins() -> None:
    obj = _obj("2.20/randread-jsonplus.json")
    raw = obj["jobs"][0]["read"]
    assert "io_kbytes" not in raw and obj["jobs"][0]["job options"]["rw"] == "randread"
    result = _parsed(FIXTURES / "2.20/randread-jsonplus.json")
    assert result.timestamp == obj["timestamp"]
    d = result.jobs[0].read
    assert d.io_bytes == raw["io_bytes"] * 1024 == d.total_ios * BS
    assert d.bins is not None and d.clat is not None and d.clat.bins == d.bins
    assert sum(c for _, c in d.bins) == d.total_ios
    assert d.bins[0][0] == 1000 * int(next(iter(raw["clat"]["bins"])))   # µs bounds, now ns
    mixed = _parsed(FIXTURES / "2.20/randrw-jsonplus.json").jobs[0]
    for stats in (mixed.read, mixed.write):
        assert stats.io_bytes == stats.total_ios * BS and stats.bins


def test_fio_older_than_2_1_is_refused_with_its_version() -> None:
    obj = _obj("2.1.10/randread.json")
    obj["fio version"] = "fio-2.0.15"
    assert _error_json(obj) == "fio-2.0.15 output: fio older than 2.1 is not supported"


# --- variations the fixtures do not show ------------------------------------------------------------


def test_junk_after_the_json_is_ignored() -> None:
    text = _raw("3.33/randread.json")
    junk = text + "fio: pid=1234, got signal=15\n{not json at all\n"
    assert parse_fio_output(junk) == parse_fio_output(text)


def test_text_before_the_json_is_kept_as_prelude() -> None:
    text = _raw("3.33/randread.json")
    prelude = "note: both iodepth >= 1 and synchronous I/O engine are selected\n"
    result = parse_fio_output(prelude + text)
    assert result.prelude == prelude
    assert result.jobs == parse_fio_output(text).jobs


def test_bare_nan_from_fio_is_accepted() -> None:
    text = _raw("3.33/randread.json")
    broken, n = re.subn(r'("iops_stddev" : )[0-9.]+', r"\1-nan", text, count=1)
    assert n == 1
    with pytest.raises(json.JSONDecodeError):
        json.loads(broken)
    assert parse_fio_output(broken).jobs[0].read == parse_fio_output(text).jobs[0].read


def test_only_clients_and_aggregate_are_separated_in_client_stats() -> None:
    obj = _obj("3.33/randread.json")
    obj["jobs"][0]["jobname"] = "All clients"  # a local job may carry any name
    result = parse_fio_json(obj)
    assert result.aggregate is None and result.jobs[0].name == "All clients"


def test_old_microsecond_latency_keys() -> None:
    """fio 2.x wrote clat/lat (and their percentiles and bins) in µs, without bw_bytes."""
    obj = _obj("3.33/randread-jsonplus.json")
    new = parse_fio_json(copy.deepcopy(obj)).jobs[0].read
    for d in (obj["jobs"][0]["read"], obj["jobs"][0]["write"]):
        del d["bw_bytes"]
        for kind in ("slat", "clat", "lat"):
            lat = d.pop(f"{kind}_ns")
            lat.pop("N")
            for key in ("min", "max", "mean", "stddev"):
                lat[key] = lat[key] / 1000
            if "percentile" in lat:
                lat["percentile"] = {k: v / 1000 for k, v in lat["percentile"].items()}
            if "bins" in lat:
                merged: Counter[str] = Counter()
                for k, v in lat["bins"].items():
                    merged[str(int(k) // 1000)] += v
                lat["bins"] = dict(merged)
            d[kind] = lat
    del obj["jobs"][0]["job_runtime"]
    old = parse_fio_json(obj).jobs[0].read
    assert old.percentile_source == "clat"
    assert old.lat is not None and new.lat is not None
    assert old.lat.mean_ns == pytest.approx(new.lat.mean_ns)
    assert old.clat is not None and new.clat is not None
    assert old.clat.percentiles.p99 == pytest.approx(new.clat.percentiles.p99)
    assert old.clat.bins == old.bins and old.lat.bins is None
    assert old.bw_bytes == pytest.approx(new.bw_bytes, rel=0.001)  # from KiB/s
    assert old.bins is not None and new.bins is not None
    assert sum(c for _, c in old.bins) == sum(c for _, c in new.bins)
    assert old.bins[0][0] == pytest.approx(new.bins[0][0], abs=1000)  # µs bounds, now in ns
    assert old.bins[-1][0] == pytest.approx(new.bins[-1][0], abs=1000)


def test_lat_bins_follow_lat_percentiles() -> None:
    """fio >= 3.18 with json+ and lat_percentiles=1 writes bins under lat_ns and clat_ns."""
    obj = _obj("3.33/randread-jsonplus.json")
    read = obj["jobs"][0]["read"]
    read["lat_ns"]["percentile"] = {k: v * 2 for k, v in read["clat_ns"]["percentile"].items()}
    read["lat_ns"]["bins"] = {str(int(k) * 2): v for k, v in read["clat_ns"]["bins"].items()}
    d = parse_fio_json(obj).jobs[0].read
    assert d.percentile_source == "lat"
    assert d.bins is not None and d.bins[0][0] == 2 * int(next(iter(read["clat_ns"]["bins"])))
    assert d.lat is not None and d.clat is not None
    assert d.lat.percentiles.p50 == 2 * d.clat.percentiles.p50  # type: ignore[operator]


def test_lat_percentiles_in_global_options_of_old_fio() -> None:
    """Before fio 3.13 total-latency percentiles were written under clat_ns; the option may also
    sit in the top-level "global options"."""
    obj = _obj("3.1/randread-latpct.json")
    obj["global options"] = {"lat_percentiles": "1"}
    obj["jobs"][0]["job options"].pop("lat_percentiles")
    assert parse_fio_json(obj).jobs[0].read.percentile_source == "lat"
    obj["global options"] = {}
    assert parse_fio_json(obj).jobs[0].read.percentile_source == "clat"


# --- errors ------------------------------------------------------------------------------------------


def _error(text: str) -> str:
    with pytest.raises(FioParseError) as info:
        parse_fio_output(text)
    message = str(info.value)
    assert "\n" not in message and len(message) < 300, message
    return message


def _error_json(obj: dict) -> str:
    return _error(json.dumps(obj))


def _job_obj() -> dict:
    return _obj("3.33/randread.json")


@pytest.mark.parametrize("text", ["", "   \n\n"])
def test_error_empty_output(text: str) -> None:
    assert "no output" in _error(text)


def test_error_no_json_object() -> None:
    message = _error("fio: failed to connect to 127.0.0.1:9999\nfio: client: failed to connect\n")
    assert "no JSON object" in message and "failed to connect" in message


def test_error_invalid_json() -> None:
    text = _raw("3.33/randread.json")
    message = _error(text[: len(text) // 2])
    assert "invalid JSON" in message and "line" in message and "near" in message


def test_error_invalid_json_after_prelude() -> None:
    message = _error('<vm> Starting 1 process\n{\n  "fio version" : "fio-3.33",\n  "jobs" : [ ,\n')
    assert "invalid JSON" in message and "line 4" in message


def test_error_not_text() -> None:
    assert "text" in _error(b"{}")  # type: ignore[arg-type]


def test_error_no_jobs_or_client_stats() -> None:
    message = _error_json({"fio version": "fio-3.33", "timestamp": 1, "disk_util": []})
    assert "neither 'jobs' nor 'client_stats'" in message and "disk_util" in message


def test_error_jobs_empty_or_not_a_list() -> None:
    assert "empty" in _error_json({"fio version": "fio-3.33", "timestamp": 1, "jobs": []})
    assert "expected a list" in _error_json({"fio version": "fio-3.33", "timestamp": 1,
                                              "jobs": {"a": 1}})


def test_error_only_aggregate() -> None:
    obj = _obj("3.33/client2-randread.out")
    obj["client_stats"] = obj["client_stats"][-1:]
    assert "only the 'All clients' entry" in _error_json(obj)


def test_error_missing_version_or_timestamp() -> None:
    obj = _job_obj()
    del obj["fio version"]
    assert "'fio version'" in _error_json(obj)
    obj = _job_obj()
    del obj["timestamp"]  # fio before 2.2.8 wrote none
    assert parse_fio_json(obj).timestamp is None


@pytest.mark.parametrize("path, expect", [
    (("read", "iops"), "randread' read: missing 'iops'"),
    (("read", "io_bytes"), "randread' read: missing 'io_bytes'"),
    (("write", "total_ios"), "randread' write: missing 'total_ios'"),
    (("read", "runtime"), "randread' read: missing 'runtime'"),
    (("read",), "randread': missing 'read' section"),
    (("usr_cpu",), "randread': missing 'usr_cpu'"),
    (("ctx",), "randread': missing 'ctx'"),
    (("jobname",), "no 'jobname'"),
])
def test_error_job_missing_required_field(path: tuple[str, ...], expect: str) -> None:
    obj = _job_obj()
    target = obj["jobs"][0]
    for key in path[:-1]:
        target = target[key]
    del target[path[-1]]
    message = _error_json(obj)
    assert expect in message and "job #0" in message, message


def test_error_wrong_types() -> None:
    obj = _job_obj()
    obj["jobs"][0]["read"]["iops"] = "fast"
    assert "'iops' is 'fast', expected a number" in _error_json(obj)
    obj = _job_obj()
    obj["jobs"][0]["read"]["total_ios"] = 1.5
    assert "expected an integer" in _error_json(obj)
    obj = _job_obj()
    obj["jobs"][0]["read"]["clat_ns"] = [1, 2]
    assert "'clat_ns' is list" in _error_json(obj)
    obj = _job_obj()
    obj["jobs"][0] = "randread"
    assert "job #0" in _error_json(obj)


def test_error_bad_bins() -> None:
    obj = _obj("3.33/randread-jsonplus.json")
    obj["jobs"][0]["read"]["clat_ns"]["bins"] = {"12.5us": 3}
    assert "bin bound '12.5us'" in _error_json(obj)


def test_error_unified_mixed_reporting() -> None:
    obj = _job_obj()
    job = obj["jobs"][0]
    job["mixed"] = job.pop("read")
    del job["write"]
    assert "unified_rw_reporting" in _error_json(obj)


def test_parse_fio_json_rejects_non_object() -> None:
    with pytest.raises(FioParseError, match="must be an object"):
        parse_fio_json([])  # type: ignore[arg-type]
