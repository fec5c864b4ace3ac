"""Percentiles from json+ histograms agree with fio's own, so merged client histograms can stand
in for the percentiles fio's "All clients" aggregate lacks."""

from __future__ import annotations

from pathlib import Path

import pytest

from iomatrix.fio.bins import merge_bins, percentiles_from_bins
from iomatrix.fio.parse import parse_fio_output
from iomatrix.fio.samples import samples_of, vm_samples_of

FIXTURES = Path(__file__).parents[1] / "fixtures/fio"
JSONPLUS = sorted(FIXTURES.glob("*/randread-jsonplus.json"))


@pytest.mark.parametrize("path", JSONPLUS, ids=lambda p: p.parent.name)
def test_bins_reproduce_fios_own_percentiles(path: Path) -> None:
    read = parse_fio_output(path.read_text()).jobs[0].read
    assert read.bins and read.clat and read.percentile_source == "clat"
    assert read.clat.bins == read.bins  # the histogram of the distribution fio took percentiles of
    mine = percentiles_from_bins(read.bins)
    fio = read.clat.percentiles
    for name in ("p50", "p90", "p99", "p99_9"):
        assert getattr(mine, name) == pytest.approx(getattr(fio, name), rel=0.02), name


def test_merged_histogram_is_the_sum() -> None:
    a = parse_fio_output(JSONPLUS[0].read_text()).jobs[0].read.bins
    b = parse_fio_output(JSONPLUS[-1].read_text()).jobs[0].read.bins
    assert a and b
    merged = merge_bins([a, b])
    assert sum(c for _, c in merged) == sum(c for _, c in a) + sum(c for _, c in b)
    low, high = percentiles_from_bins(a), percentiles_from_bins(b)
    p50 = percentiles_from_bins(merged).p50
    assert p50 is not None and low.p50 is not None and high.p50 is not None
    assert min(low.p50, high.p50) <= p50 <= max(low.p50, high.p50)
    assert percentiles_from_bins(()).p50 is None


def test_client_results_give_aggregate_and_per_vm_samples() -> None:
    result = parse_fio_output((FIXTURES / "3.33/client2-randread.out").read_text())
    (agg,) = samples_of(result)
    per_vm = vm_samples_of(result, [18331, 18332])
    assert [s.vm for s in per_vm] == [0, 1]
    assert per_vm[0].iops == next(j.read.iops for j in result.jobs if j.port == 18331)
    assert agg.iops == pytest.approx(sum(s.iops for s in per_vm), rel=0.01)
    assert agg.vm is None
    single = parse_fio_output((FIXTURES / "3.33/randread.json").read_text())
    assert vm_samples_of(single, []) == ()
