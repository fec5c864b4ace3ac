"""Effects (seed 000): gains of one axis against a reference, on synthetic runs in a real store,
checked against values worked out by hand or recomputed here with numpy/scipy from the raw
samples (never with iomatrix's own statistics)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as scipy_stats

from iomatrix.analysis.effects import axes_of, default_reference, gains, overall
from iomatrix.cli.status import ExitStatus
from iomatrix.core.errors import IomatrixError
from iomatrix.store.records import StoredRun
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.workloads import Workload
from iomatrix.testing.synthetic import Figures, Generator, configurations, stored_run
from tests.conftest import cli

FIXED = {"controller": ["virtio-scsi-single"], "cache": ["none"], "format": ["raw"]}


def _figures(iops: float) -> Figures:
    # Latency falls as IOPS rise (Little's law at a fixed queue depth), so latency gains are
    # the reciprocal ratios and must come out negative when IOPS improve.
    return Figures(iops=iops, bw_bytes=iops * 4096, lat_mean_ns=1e9 / iops, p99_ns=2e9 / iops)


def _run(tmp_path: Path, configs: list[Configuration], workloads: list[Workload],
         fn: Generator, samples: int = 3, accelerator: str = "none") -> tuple[StoredRun, Path]:
    db = tmp_path / "r.db"
    return stored_run(db, configs, workloads, fn, samples=samples, accelerator=accelerator), db


# --- a dataset small enough to work out on paper -----------------------------------------------
#
# iothread off/on, two workloads at QD1. Samples are mean ± offsets, so means are exact:
#   512 B: off 1000 (offsets −10, 0, +10), on 1100 (same offsets)      ratio 1.1
#   4 KiB: off  500 (offsets −20, 0, +20), on  600 (same offsets)      ratio 1.2

SMALL_WORKLOADS = [Workload(rw="randread", bs=bs, iodepth=1) for bs in (512, 4096)]
SMALL_MEANS = {(False, 512): 1000.0, (True, 512): 1100.0, (False, 4096): 500.0, (True, 4096): 600.0}
SMALL_OFFSETS = {512: (-10.0, 0.0, 10.0), 4096: (-20.0, 0.0, 20.0)}


def _small(config: Configuration, workload: Workload, index: int) -> Figures:
    return _figures(SMALL_MEANS[(bool(config.iothread), workload.bs)] + SMALL_OFFSETS[workload.bs][index])


@pytest.fixture
def small(tmp_path: Path) -> StoredRun:
    configs = configurations("guest", {**FIXED, "aio": ["native"], "iothread": [False, True]})
    return _run(tmp_path, configs, SMALL_WORKLOADS, _small)[0]


def test_two_pairs_by_hand_is_no_significant_difference(small: StoredRun) -> None:
    # Geometric mean of 1.1 and 1.2: √1.32 − 1 = +14.89 %. Logs 0.09531 and 0.18232: mean 0.13882,
    # sd 0.06153, se 0.04350, t = 3.191 on 1 df (Cauchy: p = 1 − 2·atan(t)/π = 0.193), and the
    # CI is exp(0.13882 ± 12.706 · 0.04350) − 1 = −33.9 % … +99.7 %: not significant.
    (g,) = gains(small, "iothread", by=())
    logs = [math.log(1.1), math.log(1.2)]
    m = (logs[0] + logs[1]) / 2
    se = abs(logs[0] - logs[1]) / math.sqrt(2) / math.sqrt(2)
    t12 = 12.706204736174698  # t(0.975; 1) = tan(0.475 π)
    assert t12 == pytest.approx(math.tan(0.475 * math.pi))
    assert (g.level, g.reference, g.pairs, g.method) == ("on", "off", 2, "pairs")
    assert g.relative == pytest.approx(math.sqrt(1.32) - 1)
    assert g.relative == pytest.approx(0.148913, abs=1e-6)
    assert g.low == pytest.approx(math.exp(m - t12 * se) - 1)
    assert g.high == pytest.approx(math.exp(m + t12 * se) - 1)
    assert g.p_value == pytest.approx(1 - 2 * math.atan(m / se) / math.pi)
    assert g.p_value == pytest.approx(0.1933, abs=1e-4)
    assert g.adjusted_p == pytest.approx(g.p_value)  # a family of one
    assert not g.significant and g.better is None
    assert g.verdict.startswith(
        "no significant difference (+14.9 %, 95 % CI −33.9 … +99.7 % over 2 pairs")
    assert g.held == {} and g.iodepth is None


def test_one_pair_per_workload_is_welch_with_holm(small: StoredRun) -> None:
    found = gains(small, "iothread", by=("workload",))
    assert [(g.workload, g.bs, g.iodepth, g.pairs, g.method) for g in found] == [
        ("randread/512/qd1/nj1", 512, 1, 1, "samples"), ("randread/4k/qd1/nj1", 4096, 1, 1, "samples")]
    # Welch by hand: both sides have the same spread s, so se = s·√(2/3) and df = 4.
    raw = []
    for g, ma, mb, s in ((found[0], 1000, 1100, 10.0), (found[1], 500, 600, 20.0)):
        se = s * math.sqrt(2 / 3)
        p = 2 * scipy_stats.t.sf((mb - ma) / se, 4)
        assert g.relative == pytest.approx(mb / ma - 1)
        assert g.p_value == pytest.approx(p)
        # Fieller's interval for mb/ma with va = vb = s²/3, at the Welch df of the pivot.
        va = vb = s * s / 3
        r = mb / ma
        df = (vb + r * r * va) ** 2 / (vb * vb / 2 + (r * r * va) ** 2 / 2)
        t = scipy_stats.t.ppf(0.975, df)
        a = ma * ma - t * t * va
        root = math.sqrt(t * t * (va * mb * mb + vb * a))
        assert g.low == pytest.approx((ma * mb - root) / a - 1)
        assert g.high == pytest.approx((ma * mb + root) / a - 1)
        raw.append(p)
    # Holm over two: the smaller p doubled; the larger kept unless below that.
    small_p, large_p = sorted(raw)
    expected = {small_p: min(1.0, 2 * small_p), large_p: min(1.0, max(2 * small_p, large_p))}
    for g in found:
        assert g.adjusted_p == pytest.approx(expected[g.p_value])
        assert g.significant == (expected[g.p_value] < 0.05)
        assert g.family == 2 and g.adjustment == "holm"
        assert "Holm-adjusted" in g.verdict
    assert found[0].significant and found[0].better is True
    assert found[0].model_dump()["better"] is True  # what the report's JSON carries
    assert found[0].verdict.startswith("+10.0 % (95 % CI")


def test_latency_gain_is_negative_when_latency_falls(small: StoredRun) -> None:
    (g,) = gains(small, "iothread", metric="lat_mean_ns", by=())
    # Latency is 1e9/IOPS per sample, so each pair's ratio is mean(1/x_on)/mean(1/x_off).
    ratios = []
    for bs in (512, 4096):
        off = [1e9 / (SMALL_MEANS[(False, bs)] + o) for o in SMALL_OFFSETS[bs]]
        on = [1e9 / (SMALL_MEANS[(True, bs)] + o) for o in SMALL_OFFSETS[bs]]
        ratios.append(np.mean(on) / np.mean(off))
    assert g.relative == pytest.approx(math.sqrt(ratios[0] * ratios[1]) - 1)
    assert g.relative < 0


def test_points_measured_once_claim_nothing_alone(tmp_path: Path) -> None:
    configs = configurations("guest", {**FIXED, "aio": ["native"], "iothread": [False, True]})
    run = _run(tmp_path, configs, SMALL_WORKLOADS, _small, samples=1)[0]
    for g in gains(run, "iothread", by=("workload",)):
        assert (g.relative, g.p_value, g.significant, g.better) == (None, None, False, None)
        assert g.verdict.startswith("not enough samples to compare (n=1 vs n=1")
    # Across pairs the spread of the pairs is the noise estimate: first samples are 990 → 1090
    # and 480 → 580.
    (g,) = gains(run, "iothread", by=())
    assert g.relative == pytest.approx(math.sqrt(1090 / 990 * 580 / 480) - 1)
    assert g.method == "pairs" and g.pairs == 2


# --- a seed-000 shaped dataset: aio × iothread, three block sizes × two queue depths ------------

BLOCKS = (512, 4096, 65536)
DEPTHS = (1, 32)
WORKLOADS = [Workload(rw="randread", bs=bs, iodepth=qd) for qd in DEPTHS for bs in BLOCKS]
# iothread gain per (bs, qd): clear at QD1 (+12 … +16 %), none at QD32 (−1 … +1 %).
IOTHREAD = {(512, 1): 1.16, (4096, 1): 1.14, (65536, 1): 1.12,
            (512, 32): 1.01, (4096, 32): 0.99, (65536, 32): 1.00}
IO_URING = {512: 0.97, 4096: 0.985, 65536: 0.99}
BASE = {(bs, qd): 20000.0 * qd ** 0.5 / (1 + bs / 16384) for bs in BLOCKS for qd in DEPTHS}
NOISE = np.random.default_rng(2026).normal(1.0, 0.004, size=(4, len(WORKLOADS), 3))


def _config_index(config: Configuration) -> int:
    return (config.aio == "io_uring") * 2 + bool(config.iothread)


def _matrix(config: Configuration, workload: Workload, index: int) -> Figures:
    if config.mode == "host":  # the bare-metal baseline: far faster, must never be paired
        return _figures(10 * BASE[(workload.bs, workload.iodepth)])
    value = BASE[(workload.bs, workload.iodepth)]
    if config.iothread:
        value *= IOTHREAD[(workload.bs, workload.iodepth)]
    if config.aio == "io_uring":
        value *= IO_URING[workload.bs]
    return _figures(value * NOISE[_config_index(config), WORKLOADS.index(workload), index])


@pytest.fixture
def matrix(tmp_path: Path) -> tuple[StoredRun, Path]:
    configs = configurations("guest", {**FIXED, "aio": ["native", "io_uring"], "iothread": [False, True]})
    return _run(tmp_path, configs + [Configuration(mode="host")], WORKLOADS, _matrix)


def _mean_iops(aio: str, iothread: bool, workload: Workload) -> float:
    config = Configuration(mode="guest", controller="virtio-scsi-single", aio=aio, iothread=iothread,
                           cache="none", format="raw")
    return float(np.mean([_matrix(config, workload, i).iops for i in range(3)]))


def _expected(logs: list[float]) -> tuple[float, float, float, float]:
    """Back-transformed mean, CI and one-sample t-test p of log ratios, by hand with numpy."""
    x = np.array(logs)
    n = x.size
    se = x.std(ddof=1) / math.sqrt(n)
    half = scipy_stats.t.ppf(0.975, n - 1) * se
    p = 2 * scipy_stats.t.sf(abs(x.mean() / se), n - 1)
    return math.expm1(x.mean()), math.expm1(x.mean() - half), math.expm1(x.mean() + half), p


def _holm(ps: list[float]) -> list[float]:
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    out, running = [0.0] * len(ps), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(ps) - rank) * ps[i]))
        out[i] = running
    return out


def test_axes_exclude_host_and_single_levels(matrix: tuple[StoredRun, Path]) -> None:
    run, _ = matrix
    assert axes_of(run) == {"aio": ["native", "io_uring"], "iothread": ["off", "on"]}
    assert default_reference("aio", ["io_uring", "native", "threads"]) == "native"
    assert default_reference("aio", ["io_uring", "threads"]) == "io_uring"
    assert default_reference("iothread", ["on", "off"]) == "off"
    assert default_reference("cache", ["writeback", "none"]) == "writeback"


def test_host_levels_are_not_axis_levels(tmp_path: Path) -> None:
    configs = configurations("guest", {**FIXED, "aio": ["native", "io_uring"]})
    run = _run(tmp_path, configs + [Configuration(mode="host", aio="threads")], SMALL_WORKLOADS,
               lambda c, w, i: _figures(1000.0 + i))[0]
    assert axes_of(run) == {"aio": ["native", "io_uring"]}


def test_iothread_gain_per_queue_depth_per_aio_mode(matrix: tuple[StoredRun, Path]) -> None:
    run, _ = matrix
    found = gains(run, "iothread", hold=("aio",))
    assert [(g.held["aio"], g.iodepth, g.pairs) for g in found] == [
        ("native", 1, 3), ("native", 32, 3), ("io_uring", 1, 3), ("io_uring", 32, 3)]
    expected = []
    for g in found:
        logs = [math.log(_mean_iops(g.held["aio"], True, w) / _mean_iops(g.held["aio"], False, w))
                for w in WORKLOADS if w.iodepth == g.iodepth]
        expected.append(_expected(logs))
    adjusted = _holm([e[3] for e in expected])
    for g, (rel, low, high, p), q in zip(found, expected, adjusted, strict=True):
        assert (g.relative, g.low, g.high, g.p_value) == pytest.approx((rel, low, high, p))
        assert g.adjusted_p == pytest.approx(q)
        assert g.significant == (q < 0.05)
        assert g.family == 4 and g.method == "pairs"
    # QD1: about +14 % and significant; QD32: no effect.
    qd1 = [g for g in found if g.iodepth == 1]
    qd32 = [g for g in found if g.iodepth == 32]
    assert all(0.11 < g.relative < 0.17 and g.significant and g.better for g in qd1)  # type: ignore[operator]
    assert all(not g.significant and g.verdict.startswith("no significant difference") for g in qd32)


def test_aio_gain_with_and_without_iothread(matrix: tuple[StoredRun, Path]) -> None:
    run, _ = matrix
    found = gains(run, "aio", hold=("iothread",), by=())
    assert [(g.level, g.reference, g.held, g.pairs) for g in found] == [
        ("io_uring", "native", {"iothread": "off"}, 6), ("io_uring", "native", {"iothread": "on"}, 6)]
    for g in found:
        on = g.held["iothread"] == "on"
        logs = [math.log(_mean_iops("io_uring", on, w) / _mean_iops("native", on, w)) for w in WORKLOADS]
        rel, low, high, p = _expected(logs)
        assert (g.relative, g.low, g.high, g.p_value) == pytest.approx((rel, low, high, p))


def test_overall_pools_every_pair(matrix: tuple[StoredRun, Path]) -> None:
    run, _ = matrix
    g = overall(run, "iothread", "on")
    logs = [math.log(_mean_iops(aio, True, w) / _mean_iops(aio, False, w))
            for aio in ("native", "io_uring") for w in WORKLOADS]
    rel, low, high, p = _expected(logs)
    assert g.pairs == 12 and g.held == {} and g.iodepth is None
    assert (g.relative, g.low, g.high, g.p_value, g.adjusted_p) == pytest.approx((rel, low, high, p, p))
    # Against the other reference the ratio inverts exactly: logs make gains reciprocal.
    back = overall(run, "iothread", "off", reference="on")
    assert (1 + back.relative) * (1 + g.relative) == pytest.approx(1.0)  # type: ignore[operator]


def test_bad_requests_say_what_exists(matrix: tuple[StoredRun, Path]) -> None:
    run, _ = matrix
    with pytest.raises(IomatrixError, match="'cache' is not an axis") as e:
        gains(run, "cache")
    assert e.value.hint is not None and "aio (native, io_uring)" in e.value.hint
    with pytest.raises(IomatrixError, match="no level 'threads'"):
        gains(run, "aio", reference="threads")
    with pytest.raises(IomatrixError, match="not a metric"):
        gains(run, "aio", metric="bw")
    with pytest.raises(IomatrixError, match="cannot group by"):
        gains(run, "aio", by=("vms",))
    with pytest.raises(IomatrixError, match="cannot also be held"):
        gains(run, "aio", hold=("aio",))
    with pytest.raises(IomatrixError, match="is the reference"):
        overall(run, "aio", "native")


# --- the command --------------------------------------------------------------------------------


def test_effect_lists_axes_without_axis(matrix: tuple[StoredRun, Path]) -> None:
    _, db = matrix
    code, output = cli("effect", "1", "--db", str(db))
    assert code == 0
    assert re.search(r"aio\s+native, io_uring\s+native", output)
    assert re.search(r"iothread\s+off, on\s+off", output)


def test_effect_table(matrix: tuple[StoredRun, Path]) -> None:
    run, db = matrix
    code, output = cli("effect", "1", "--axis", "iothread", "--hold", "aio", "--db", str(db))
    assert code == 0, output
    assert "EMULATED" not in output
    rows = [line.split() for line in output.splitlines() if line.strip().startswith("on ")]
    assert [r[1:4] for r in rows] == [["native", "1", "3"], ["native", "32", "3"],
                                     ["io_uring", "1", "3"], ["io_uring", "32", "3"]]
    for row, g in zip(rows, gains(run, "iothread", hold=("aio",)), strict=True):
        assert row[4] == f"{g.relative * 100:+.1f}%".replace("-", "\u2212")  # type: ignore[operator]
    assert rows[0][-1] == "better"
    assert " ".join(rows[1][-3:]) == "no significant difference"
    assert "adjusted (Holm) across the 4 gains shown" in output


def test_effect_latency_by_workload_emulated(tmp_path: Path) -> None:
    configs = configurations("guest", {**FIXED, "aio": ["native"], "iothread": [False, True]})
    _, db = _run(tmp_path, configs, SMALL_WORKLOADS, _small, accelerator="tcg")
    code, output = cli("effect", "last", "--axis", "iothread", "--metric", "lat", "--by", "workload",
                        "--db", str(db))
    assert code == 0, output
    assert "EMULATED (TCG)" in output
    assert "mean latency · per workload" in output
    assert "512 randread QD1" in output and "negative: lower latency, better" in output


@pytest.mark.parametrize("args, message", [
    (("--axis", "cache"), "iomatrix: run 1: 'cache' is not an axis with two or more levels"),
    (("--axis", "aio", "--metric", "foo"), "iomatrix: --metric 'foo': not a metric"),
    (("--axis", "aio", "--reference", "threads"), "iomatrix: run 1: aio has no level 'threads'"),
    (("--axis", "aio", "--by", "bs"), "iomatrix: --by 'bs': not a grouping"),
])
def test_effect_refuses_with_one_line(matrix: tuple[StoredRun, Path], args: tuple[str, ...],
                                      message: str) -> None:
    _, db = matrix
    code, output = cli("effect", "1", *args, "--db", str(db))
    assert code == ExitStatus.USAGE
    assert output.splitlines()[0] == message
    assert output.splitlines()[1].startswith("iomatrix: hint: ")
