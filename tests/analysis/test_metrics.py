"""The one definition of each metric: the fields it names exist, points read it from samples as it
says, and it is shown as the CLI and the report show it."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from iomatrix.analysis.metrics import (KEY_CHOICES, METRICS, OPTION_CHOICES, OPTION_HELP,
                                       get_metric, metric_named)
from iomatrix.analysis.points import Point, points
from iomatrix.core.errors import AnalysisError
from iomatrix.fio.samples import DirectionSample
from iomatrix.report.data import PointView
from iomatrix.store import Store
from iomatrix.store.records import StoredSuite, TrialResult
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.workloads import Workload


@pytest.mark.parametrize("key", list(METRICS))
def test_every_field_a_metric_names_exists(key: str) -> None:
    m = METRICS[key]
    assert m.key == key and {m.key, m.samples} <= set(Point.model_fields)
    assert {m.key, f"{m.stem}_low", f"{m.stem}_high"} <= set(PointView.model_fields)
    assert m.sample_field in DirectionSample.model_fields
    assert metric_named(m.option) is m and metric_named(m.key) is m and get_metric(m.key) is m


def _direction(name: str, iops: float, lat_ns: float, p99_ns: float) -> DirectionSample:
    return DirectionSample(direction=name, iops=iops, bw_bytes=iops * 4096,
                           io_bytes=int(iops * 4096 * 10), total_ios=int(iops * 10),
                           runtime_ms=10_000, lat_mean_ns=lat_ns, p99_ns=p99_ns)


def test_points_add_rates_and_weight_latencies_by_ios(tmp_path: Path) -> None:
    config, workload = Configuration(mode="host"), Workload(rw="randrw", bs=4096, iodepth=8)
    trials = [(_direction("read", 300, 1000, 4000), _direction("write", 100, 3000, 8000)),
              (_direction("read", 500, 2000, 6000), _direction("write", 500, 2000, 6000))]
    with Store(tmp_path / "r.db") as store:
        run_id = store.create_run(suite=StoredSuite(name="mixed", source="test", text=""),
                                  host={}, accelerator="none", notes=[], configs=[config],
                                  workloads=[workload])
        for index, samples in enumerate(trials):
            store.record_trial(run_id, TrialResult(
                config_key=config.key, workload_key=workload.key, sample_index=index,
                status="ok", started_at="2026-01-01T00:00:00", samples=samples))
        (point,) = points(store.load_run(run_id))
    # rates add up; latencies are weighted by each direction's I/O count (3:1, then 1:1)
    assert point.values("iops") == (400, 1000) and point.iops == 700
    assert point.values("bw_bytes") == (400 * 4096, 1000 * 4096)
    assert point.values("lat_mean_ns") == (1500, 2000) and point.lat_mean_ns == 1750
    # percentiles are never averaged: a mixed point has them per direction only
    assert point.values("lat_p99_ns") == () and point.lat_p99_ns is None and point.mixed
    assert point.values("lat_p99_ns", "read") == (4000, 6000)
    assert point.values("lat_p99_ns", "write") == (8000, 6000)
    assert point.directions["write"].lat_p99_ns == 7000 and point.directions["read"].iops == 400
    with pytest.raises(AnalysisError, match="'bw': not a metric"):
        point.values("bw")


def test_figures_are_shown_in_their_unit() -> None:
    iops, bw, lat, p99 = METRICS.values()
    assert iops.text(12345.6) == "12,346" and iops.text(12345.6, unit=True) == "12,346 IOPS"
    assert bw.text(1.5 * 2**20, unit=True) == "1.50 MiB/s" and bw.heading == "MiB/s"
    assert lat.text(1234.5) == "1.23" and p99.text(2_000_000, unit=True) == "2,000 µs"
    assert all(m.text(v) == "—" for m in METRICS.values() for v in (None, math.nan, math.inf))
    assert [m.axis for m in METRICS.values()] == [
        "IOPS", "bandwidth (MiB/s)", "mean latency (µs)", "p99 latency (µs)"]
    assert [m.lower_is_better for m in METRICS.values()] == [False, False, True, True]


def test_names_and_choices() -> None:
    assert OPTION_CHOICES == "iops, bw, lat or p99"
    assert KEY_CHOICES == "iops, bw_bytes, lat_mean_ns or lat_p99_ns"
    assert OPTION_HELP == "iops, bw (bandwidth), lat (mean latency) or p99 (p99 latency)."
    assert metric_named("speed") is None
    with pytest.raises(AnalysisError, match="'bw': not a metric") as e:
        get_metric("bw")
    assert e.value.hint == "choose one of iops, bw_bytes, lat_mean_ns, lat_p99_ns"
