"""Scores (seed 002): min-max normalized figures combined as a Euclidean magnitude, on synthetic
runs in a real store, against values worked out by hand and recomputed here with numpy."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from iomatrix.analysis.scores import scores
from iomatrix.cli.status import ExitStatus
from iomatrix.core.errors import IomatrixError
from iomatrix.store.records import StoredRun
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.workloads import Workload
from iomatrix.testing.synthetic import Figures, Generator, configurations, stored_run
from tests.conftest import cli

MIB = 1 << 20
QD1 = Workload(rw="read", bs=512, iodepth=1)            # seed 002's QD1 latency workload
QD128 = Workload(rw="randread", bs=512, iodepth=128)    # its IOPS and QD128 latency workload
BW = Workload(rw="randread", bs=MIB, iodepth=32)        # its bandwidth workload
# Decoys a wrong pick would land on: bigger blocks at QD128, random reads at QD1.
DECOYS = [Workload(rw="randread", bs=4096, iodepth=128), Workload(rw="randread", bs=512, iodepth=1)]

CONFIGS = configurations("guest", {"controller": ["virtio-scsi-single", "virtio-blk"],
                                   "aio": ["native", "io_uring"], "iothread": [True],
                                   "cache": ["none"], "format": ["raw"]})
A, B, C, D = (c.key for c in CONFIGS)
# Per configuration: IOPS at QD128, bandwidth (MiB/s), QD1 latency (µs), QD128 latency (µs).
TABLE = {A: (100_000, 2000, 50, 1200), B: (80_000, 2100, 45, 1500),
         C: (60_000, 1900, 60, 2000), D: (120_000, 1950, 55, 1000)}
# By hand, 0 = best, 1 = worst:
#   IOPS  (max 120k, min 60k):  A 20/60 = 1/3, B 40/60 = 2/3, C 1, D 0
#   bw    (max 2100, min 1900): A 100/200 = 0.5, B 0, C 1, D 150/200 = 0.75
#   QD1   (min 45, max 60):     A 5/15 = 1/3, B 0, C 1, D 10/15 = 2/3
#   QD128 (min 1000, max 2000): A 0.2, B 0.5, C 1, D 0
# Scores: A √(1/9 + 1/4 + 1/9 + 0.04) = 0.71570, B √(4/9 + 1/4) = 0.83333,
#         C √4 = 2, D √(9/16 + 4/9) = 1.00347: A, B, D, C.
BY_HAND = {A: 0.71570, B: 0.83333, C: 2.0, D: 1.00347}


def _figures(config: Configuration, workload: Workload, index: int) -> Figures:
    if config.mode == "host":
        return Figures(iops=1e6, bw_bytes=5000 * MIB, lat_mean_ns=10_000, p99_ns=20_000)
    iops, bw, qd1, qd128 = TABLE[config.key]
    wobble = (-1.0, 1.0)[index]  # two samples symmetric about the mean: means stay exact
    if workload == QD128:
        return Figures(iops + 100 * wobble, 1.0, qd128 * 1000 + wobble, qd128 * 3000)
    if workload == BW:
        return Figures(1000.0, (bw + wobble) * MIB, 1.0, 1.0)
    if workload == QD1:
        return Figures(1000.0, 1.0, qd1 * 1000 + wobble, qd1 * 2000)
    # Decoys: the opposite order of the real figures.
    return Figures(1e7 - iops, 1e12 - bw * MIB, 1e9 - qd1 * 1000, 1e9)


def _store(tmp_path: Path, configs: list[Configuration], workloads: list[Workload],
           fn: Generator, accelerator: str = "none") -> tuple[StoredRun, Path]:
    db = tmp_path / "s.db"
    return stored_run(db, configs, workloads, fn, samples=2, accelerator=accelerator), db


@pytest.fixture
def seed002(tmp_path: Path) -> tuple[StoredRun, Path]:
    return _store(tmp_path, CONFIGS + [Configuration(mode="host")], [QD1, QD128, BW, *DECOYS],
                  _figures)


def _expected(table: dict[str, tuple[float, ...]], lower: tuple[bool, ...]) -> dict[str, float]:
    """Min-max normalized, oriented 0 = best, Euclidean magnitude: with numpy, column by column."""
    keys = list(table)
    x = np.array([table[k] for k in keys], dtype=float)
    lo, hi = x.min(axis=0), x.max(axis=0)
    span = np.where(hi > lo, hi - lo, 1.0)
    norm = np.where(np.array(lower), (x - lo) / span, (hi - x) / span)
    return dict(zip(keys, np.sqrt((norm ** 2).sum(axis=1)), strict=True))


def test_seed_002_scores_by_hand(seed002: tuple[StoredRun, Path]) -> None:
    run, _ = seed002
    table = scores(run)
    assert [(c.name, c.figure, c.workload) for c in table.components] == [
        ("iops", "iops", QD128.key), ("bw_bytes", "bw_bytes", BW.key),
        ("qd1_lat", "lat_mean_ns", QD1.key), ("qd128_lat", "lat_mean_ns", QD128.key)]
    assert [c.lower_is_better for c in table.components] == [False, False, True, True]
    assert table.notes == ()
    expected = _expected(TABLE, (False, False, True, True))
    assert [r.config_key for r in table.rows] == [A, B, D, C]  # the host is left out
    assert [r.rank for r in table.rows] == [1, 2, 3, 4]
    for row in table.rows:
        assert row.score == pytest.approx(expected[row.config_key])
        assert row.score == pytest.approx(BY_HAND[row.config_key], abs=5e-6)
    a = table.rows[0]
    assert a.values == pytest.approx({"iops": 100_000, "bw_bytes": 2000 * MIB, "qd1_lat": 50_000,
                                      "qd128_lat": 1_200_000})
    assert a.normalized == pytest.approx({"iops": 1 / 3, "bw_bytes": 0.5, "qd1_lat": 1 / 3,
                                          "qd128_lat": 0.2})
    assert "0 is the best configuration and 1 the worst" in table.method
    assert "only within this run" in table.caveat
    assert not table.emulated


def test_host_scored_only_when_asked(seed002: tuple[StoredRun, Path]) -> None:
    table = scores(seed002[0], include_host=True)
    assert table.rows[0].config_key == "host" and table.rows[0].score == 0.0
    assert len(table.rows) == 5


def test_named_metrics_and_explicit_workloads(seed002: tuple[StoredRun, Path]) -> None:
    run, _ = seed002
    table = scores(run, ["iops", "qd1_lat"])
    expected = _expected({k: (v[0], v[2]) for k, v in TABLE.items()}, (False, True))
    assert {r.config_key: r.score for r in table.rows} == pytest.approx(expected)
    # p99 at QD128 (3 × mean latency here) picked by key, and by label.
    for name in (f"lat_p99_ns@{QD128.key}", f"p99@{QD128.label}"):
        table = scores(run, [name])
        (c,) = table.components
        assert (c.figure, c.workload, c.minimum, c.maximum) == ("lat_p99_ns", QD128.key, 3e6, 6e6)
        assert {r.config_key: r.score for r in table.rows} == pytest.approx(
            {A: 0.2, B: 0.5, C: 1.0, D: 0.0})


def test_stand_ins_when_the_seed_workloads_are_missing(tmp_path: Path) -> None:
    # No QD128, no sequential reads, no QD32 at 1 MiB: the highest depth, random reads and the
    # depth closest to 32 (64 beats 8: |log2(64/32)| = 1 < |log2(8/32)| = 2) stand in.
    workloads = [Workload(rw="randread", bs=512, iodepth=qd) for qd in (1, 16, 64)]
    workloads += [Workload(rw="randread", bs=MIB, iodepth=qd) for qd in (8, 64)]
    run, _ = _store(tmp_path, CONFIGS, workloads,
                    lambda c, w, i: Figures(w.iodepth * (1 + CONFIGS.index(c)), 1.0, 1.0, 1.0))
    table = scores(run)
    picked = {c.name: c.workload for c in table.components}
    assert picked == {"iops": "randread/512/qd64/nj1", "bw_bytes": "randread/1m/qd64/nj1",
                      "qd1_lat": "randread/512/qd1/nj1", "qd128_lat": "randread/512/qd64/nj1"}
    notes = "\n".join(table.notes)
    assert "iops: this run has no 512 randread QD128 workload (seed 002's); used 512 randread QD64: " \
           "QD64 (the highest present)" in notes
    assert "qd1_lat: this run has no 512 read QD1 workload (seed 002's); used 512 randread QD1: " \
           "randread for read" in notes
    assert "bw_bytes: this run has no 1m randread QD32 workload (seed 002's); used 1m randread " \
           "QD64: QD64 (the closest present)" in notes
    # Bandwidth and both latencies are 1.0 everywhere: constant, 0 for all, and said so.
    assert "bw_bytes: every configuration has the same bandwidth; its component is 0 for all" in notes
    assert [c.constant for c in table.components] == [False, True, True, True]
    # IOPS at QD64 = 64 · (1 + index): normalized (max − x)/(max − min) = (3 − index)/3.
    assert {r.config_key: r.score for r in table.rows} == pytest.approx(
        {c.key: (3 - i) / 3 for i, c in enumerate(CONFIGS)})


def test_ties_share_a_rank_and_missing_figures_go_last(tmp_path: Path) -> None:
    twins = {A: (100.0, 10.0), B: (100.0, 10.0), C: (50.0, 20.0), D: (75.0, 15.0)}

    def fn(config: Configuration, workload: Workload, index: int) -> Figures | None:
        if config.key == D and workload == QD1:
            return None  # every trial of this point failed
        iops, lat = twins[config.key]
        return Figures(iops, 1.0, lat * 1000, 1.0)

    run, _ = _store(tmp_path, CONFIGS, [QD1, QD128, BW], fn)
    table = scores(run, ["iops", "qd1_lat"])
    assert [(r.config_key, r.rank) for r in table.rows] == [(A, 1), (B, 1), (C, 3), (D, None)]
    d = table.rows[-1]
    assert d.score is None and d.values["qd1_lat"] is None and d.normalized["qd1_lat"] is None
    # D's IOPS still counts in the IOPS range: (100 − 75)/(100 − 50).
    assert d.normalized["iops"] == pytest.approx(0.5)
    assert table.rows[2].score == pytest.approx(math.sqrt(2))
    assert any("1 configuration(s) have no mean latency for 512 read QD1" in n for n in table.notes)


def test_bad_metrics_are_refused(seed002: tuple[StoredRun, Path]) -> None:
    run, _ = seed002
    with pytest.raises(IomatrixError, match="not a score metric"):
        scores(run, ["latency"])
    with pytest.raises(IomatrixError, match="no workload 'randread/2m/qd1/nj1'"):
        scores(run, ["iops@randread/2m/qd1/nj1"])
    with pytest.raises(IomatrixError, match="'speed' is not a figure"):
        scores(run, [f"speed@{QD1.key}"])
    with pytest.raises(IomatrixError, match="named twice"):
        scores(run, ["iops", "iops"])
    with pytest.raises(IomatrixError, match="no metrics"):
        scores(run, [])



def test_scores_command(seed002: tuple[StoredRun, Path]) -> None:
    _, db = seed002
    code, output = cli("scores", "1", "--db", str(db))
    assert code == 0, output
    lines = output.splitlines()
    ranked = [line.split()[:2] for line in lines if line.split()[:1] in (["1"], ["2"], ["3"], ["4"])]
    assert ranked == [["1", "guest"], ["2", "guest"], ["3", "guest"], ["4", "guest"]]
    labels = {c.key: c.label for c in CONFIGS}
    order = [next(i for i, line in enumerate(lines) if labels[k] in line) for k in (A, B, D, C)]
    assert order == sorted(order)
    assert f"{BY_HAND[A]:.3f}" in lines[order[0]] and f"{BY_HAND[D]:.3f}" in lines[order[2]]
    assert "iops: IOPS · 512 randread QD128 (higher is better)" in output
    assert "qd1_lat: mean latency · 512 read QD1 (lower is better)" in output
    assert any(line.startswith("method: Each metric is min-max normalized") for line in lines)
    assert any(line.startswith("caveat: Scores compare configurations only within this run")
               for line in lines)
    assert "host (bare metal)" not in output


def test_scores_command_emulated_and_refusal(tmp_path: Path) -> None:
    _, db = _store(tmp_path, CONFIGS, [QD1, QD128, BW], _figures, accelerator="tcg")
    code, output = cli("scores", "1", "--metrics", "iops,qd1_lat", "--db", str(db))
    assert code == 0 and "EMULATED (TCG)" in output
    code, output = cli("scores", "1", "--metrics", "iops,speed", "--db", str(db))
    assert code == ExitStatus.USAGE
    assert output.splitlines()[0] == "iomatrix: 'speed': not a score metric"
