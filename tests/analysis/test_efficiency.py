"""Bare-metal efficiency beside its significance, on hand-made samples in a real store."""

from __future__ import annotations

from pathlib import Path

import pytest

from iomatrix.analysis.efficiency import efficiency
from iomatrix.analysis.points import points
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.workloads import Workload
from iomatrix.testing.synthetic import Figures, stored_run

HOST = Configuration(mode="host")
SAME = Configuration(mode="blocklayer", aio="threads", cache="none", format="raw")
SLOWER = Configuration(mode="blocklayer", aio="native", cache="none", format="raw")
WORKLOAD = Workload(rw="randread", bs=4096, iodepth=8)
IOPS = {HOST.key: [1000, 1040, 960], SAME.key: [990, 1050, 970], SLOWER.key: [700, 710, 690]}


def _figures(config: Configuration, workload: Workload, index: int) -> Figures:
    iops = IOPS[config.key][index]
    return Figures(iops=iops, bw_bytes=iops * 4096, lat_mean_ns=8e9 / iops, p99_ns=2e10 / iops)


def test_percent_of_bare_metal_says_when_it_is_no_difference(tmp_path: Path) -> None:
    run = stored_run(tmp_path / "r.db", [HOST, SAME, SLOWER], [WORKLOAD], _figures)
    eff = efficiency(points(run), run.configs)
    same, slower = eff[(SAME.key, WORKLOAD.key)], eff[(SLOWER.key, WORKLOAD.key)]
    assert same.iops_pct == pytest.approx(100 * 1003.333 / 1000, rel=1e-4)
    assert slower.iops_pct == pytest.approx(70.0)
    assert slower.added_lat_us == pytest.approx((8e9 / 700 + 8e9 / 710 + 8e9 / 690) / 3 / 1000
                                                - (8e9 / 1000 + 8e9 / 1040 + 8e9 / 960) / 3 / 1000)
    # two comparisons in the family, Holm-adjusted
    assert same.iops_vs_bare.family == 2 and not same.iops_vs_bare.significant
    assert same.iops_text == "100.3% (no significant difference)"
    assert slower.iops_vs_bare.significant and slower.iops_text == "70.0%"
    assert (HOST.key, WORKLOAD.key) not in eff


def test_one_sample_is_not_tested(tmp_path: Path) -> None:
    run = stored_run(tmp_path / "r.db", [HOST, SLOWER], [WORKLOAD], _figures, samples=1)
    (e,) = efficiency(points(run), run.configs).values()
    assert e.iops_text == "70.0% (untested: n<2)"
