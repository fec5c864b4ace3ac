"""Paired comparisons (ISSUE 12): gains estimated from ratios within interleaved rounds, checked
against values worked out here with numpy/scipy (never with iomatrix's own statistics); their
coverage under a drift shared by every configuration of a round; A/A calibration."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import numpy as np
import pytest
from scipy import stats as scipy_stats

from iomatrix.analysis.effects import gains, rounds_known
from iomatrix.fio.samples import DirectionSample
from iomatrix.store.records import ConfigRecord, StoredRun, StoredSuite, TrialRecord, WorkloadRecord
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.workloads import Workload
from tests.needs import need

T975 = {2: 4.302652729911275, 3: 3.182446305284263, 4: 2.7764451051977987}


def _config(**axes: object) -> ConfigRecord:
    c = Configuration(mode="blocklayer", cache="none", format="raw", **axes)  # type: ignore[arg-type]
    return ConfigRecord(key=c.key, label=c.label, mode=c.mode, params=c.params())


def _workload(bs: int, qd: int = 1) -> WorkloadRecord:
    w = Workload(rw="randread", bs=bs, iodepth=qd)
    return WorkloadRecord(key=w.key, label=w.label, rw=w.rw, bs=w.bs, iodepth=w.iodepth,
                          numjobs=1, rate_iops=0, options={})


def _sample(iops: float) -> DirectionSample:
    return DirectionSample(direction="read", iops=iops, bw_bytes=iops * 4096,
                           io_bytes=int(iops * 40960), total_ios=max(1, int(iops * 10)),
                           runtime_ms=10_000, lat_mean_ns=1e9 / iops, p50_ns=1e9 / iops,
                           p99_ns=2e9 / iops)


def make_run(configs: list[ConfigRecord], workloads: list[WorkloadRecord], rounds: int,
             iops: Callable[[ConfigRecord, WorkloadRecord, int], float | None], *,
             known: bool = True) -> StoredRun:
    """A StoredRun built in memory: every configuration × workload once per round; ``iops``
    None = a failed trial. ``known``: the host metadata says the sample index is the round."""
    trials = []
    for r in range(rounds):
        for c in configs:
            for w in workloads:
                v = iops(c, w, r)
                trials.append(TrialRecord(
                    id=len(trials) + 1, config_key=c.key, workload_key=w.key, sample_index=r,
                    status="ok" if v is not None else "failed", reason=None,
                    started_at="2026-01-01T00:00:00", wall_seconds=10.0, accelerator="none",
                    usr_cpu=None, sys_cpu=None, ctx=None, applied={}, command="",
                    samples=(_sample(v),) if v is not None else ()))
    host = {"hostname": "synthetic"}
    if known:
        host["trial_order"] = "rounds"
    return StoredRun(id=1, suite=StoredSuite(name="synthetic", source="synthetic", text=""),
                     created_at="2026-01-01T00:00:00", finished_at=None, status="complete",
                     accelerator="none", iomatrix_version="test", host=host, notes=(), seed=0,
                     configs=tuple(configs), workloads=tuple(workloads), trials=tuple(trials))


OFF, ON = _config(aio="native", iothread=False), _config(aio="native", iothread=True)


# --- hand-computed ----------------------------------------------------------------------------

def test_one_pair_paired_by_round_by_hand() -> None:
    # off 1000, 1100, 900 and on 1100, 1200, 1000 in rounds 0, 1, 2: per-round log ratios
    # ln 1.1, ln(12/11), ln(10/9); mean 0.095894, t-interval on 2 df.
    off, on = [1000.0, 1100.0, 900.0], [1100.0, 1200.0, 1000.0]
    run = make_run([OFF, ON], [_workload(4096)], 3,
                   lambda c, w, r: (on if c is ON else off)[r])
    (g,) = gains(run, "iothread", by=())
    logs = [math.log(1.1), math.log(12 / 11), math.log(10 / 9)]
    m = sum(logs) / 3
    sd = math.sqrt(sum((x - m) ** 2 for x in logs) / 2)
    se = sd / math.sqrt(3)
    assert (g.method, g.rounds, g.rounds_excluded, g.interval) == ("rounds", 3, 0, "t")
    assert g.relative == pytest.approx(math.expm1(m))
    assert g.low == pytest.approx(math.expm1(m - T975[2] * se))
    assert g.high == pytest.approx(math.expm1(m + T975[2] * se))
    assert g.p_value == pytest.approx(2 * scipy_stats.t.sf(m / se, 2))
    assert g.significant and g.better is True
    # minimal detectable effect: (t(0.975; 2) + t(0.8; 2)) · sd/√3, as a relative gain
    assert g.mde == pytest.approx(math.expm1((T975[2] + scipy_stats.t.ppf(0.8, 2)) * se))
    assert "paired by round" in g.verdict and "per-round log ratios" in g.verdict
    # the same samples unpaired (Welch/Fieller) cannot tell the two apart
    unpaired = gains(run.model_copy(update={"host": {"hostname": "synthetic"}}), "iothread", by=())
    assert unpaired[0].method == "samples" and not unpaired[0].significant


def test_several_pairs_average_within_each_round() -> None:
    # two workloads; round r's statistic is the mean of the two pairs' log ratios
    w1, w2 = _workload(512), _workload(4096)
    data = {(OFF.key, w1.key): [1000, 1200, 800, 1000], (ON.key, w1.key): [1100, 1300, 900, 1080],
            (OFF.key, w2.key): [500, 600, 400, 520], (ON.key, w2.key): [600, 690, 470, 640]}
    run = make_run([OFF, ON], [w1, w2], 4, lambda c, w, r: float(data[(c.key, w.key)][r]))
    (g,) = gains(run, "iothread", by=())
    d = np.array([(math.log(data[(ON.key, w1.key)][r] / data[(OFF.key, w1.key)][r])
                   + math.log(data[(ON.key, w2.key)][r] / data[(OFF.key, w2.key)][r])) / 2
                  for r in range(4)])
    se = d.std(ddof=1) / 2
    assert (g.method, g.rounds, g.pairs) == ("rounds", 4, 2)
    assert g.relative == pytest.approx(math.expm1(d.mean()))
    assert (g.low, g.high) == pytest.approx((math.expm1(d.mean() - T975[3] * se),
                                             math.expm1(d.mean() + T975[3] * se)))
    assert g.p_value == pytest.approx(scipy_stats.ttest_1samp(d, 0).pvalue)


def test_a_round_missing_a_side_is_left_out_and_one_round_falls_back() -> None:
    off, on = [1000.0, 1100.0, 900.0, 1000.0], [1100.0, None, 1000.0, 1090.0]
    run = make_run([OFF, ON], [_workload(4096)], 4, lambda c, w, r: (on if c is ON else off)[r])
    (g,) = gains(run, "iothread", by=())
    assert (g.method, g.rounds, g.rounds_excluded) == ("rounds", 3, 1)
    assert "1 rounds left out" in g.verdict
    one = make_run([OFF, ON], [_workload(4096)], 2,
                   lambda c, w, r: None if (c is ON and r == 1) or (c is OFF and r == 0) else 1e3)
    (g1,) = gains(one, "iothread", by=())
    assert g1.method == "samples" and g1.rounds is None   # no common round: unpaired


def from_source(source: str) -> StoredSuite:
    return StoredSuite(name="synthetic", source=source, text="")


def test_imported_runs_are_not_paired() -> None:
    run = make_run([OFF, ON], [_workload(4096)], 3, lambda c, w, r: 1000.0 + r, known=False)
    assert not rounds_known(run)
    assert rounds_known(run.model_copy(update={"suite": from_source("builtin:quick"), "host": {}}))
    assert not rounds_known(run.model_copy(update={"suite": from_source("import:/x"), "host": {}}))


def test_skewed_rounds_use_the_bootstrap() -> None:
    # 12 rounds, one far out: |G1| > 1 with n ≥ 8 switches the interval to the bootstrap
    ratios = [1.02, 1.021, 1.019, 1.02, 1.022, 1.018, 1.02, 1.021, 1.019, 1.02, 1.02, 1.2]
    run = make_run([OFF, ON], [_workload(4096)], 12,
                   lambda c, w, r: 1000.0 * (ratios[r] if c is ON else 1.0))
    (g,) = gains(run, "iothread", by=())
    assert (g.method, g.interval) == ("rounds", "bootstrap")
    assert "bootstrap" in g.verdict


# --- under drift --------------------------------------------------------------------------------

def _drifting(rng: random.Random, true_gain: float, rounds: int, noise: float = 0.01,
              drift: float = 0.10) -> StoredRun:
    """Two configurations, one workload; each round multiplies both by the same drift
    (uniform ±``drift``) and each trial by its own lognormal noise (σ = ``noise``)."""
    factors = [1 + rng.uniform(-drift, drift) for _ in range(rounds)]
    noises = {(c.key, r): math.exp(rng.gauss(0, noise)) for c in (OFF, ON) for r in range(rounds)}
    return make_run([OFF, ON], [_workload(4096)], rounds,
                    lambda c, w, r: 1e4 * (1 + true_gain if c is ON else 1) * factors[r]
                    * noises[(c.key, r)])


@pytest.mark.slow
def test_paired_ci_covers_the_true_gain_at_the_nominal_rate_under_drift() -> None:
    rng = random.Random(12)
    true, series = 0.05, 1000
    covered = covered_unpaired = 0
    widths, widths_unpaired = [], []
    for _ in range(series):
        run = _drifting(rng, true, rounds=5)
        (g,) = gains(run, "iothread", by=())
        assert g.method == "rounds" and g.low is not None and g.high is not None
        covered += g.low <= true <= g.high
        widths.append(g.high - g.low)
        (u,) = gains(run.model_copy(update={"host": {}}), "iothread", by=())
        assert u.method == "samples"
        if u.low is not None and u.high is not None:
            covered_unpaired += u.low <= true <= u.high
            widths_unpaired.append(u.high - u.low)
        else:
            widths_unpaired.append(math.inf)
    # binomial tolerance: 3 standard errors of a 95 % rate over 1000 series is ±2.1 points
    tolerance = 3 * math.sqrt(0.95 * 0.05 / series)
    assert abs(covered / series - 0.95) <= tolerance, covered
    # ... and far narrower than the unpaired interval on the same samples
    assert float(np.median(widths)) * 5 < float(np.median(widths_unpaired))


@pytest.mark.slow
def test_an_aa_pair_under_drift_is_significant_at_most_at_the_nominal_rate() -> None:
    rng = random.Random(7)
    series = 1000
    significant = sum(gains(_drifting(rng, 0.0, rounds=4), "iothread", by=())[0].significant
                      for _ in range(series))
    assert significant / series <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / series), significant


# --- A/A ----------------------------------------------------------------------------------------

TWIN = _config(aio="native", iothread=False).model_copy(
    update={"key": OFF.key + "/aa=twin", "label": OFF.label + " (A/A twin)",
            "params": {**OFF.params, "aa": "twin"}})


def test_the_aa_option_adds_a_twin_in_the_same_rounds() -> None:
    from iomatrix.suite import expand, load_suite_text
    from iomatrix.suite.plan import plan

    text = ('[suite]\nname = "aa"\n[target]\ndirectory = "/var/tmp/x"\nsize = "64MiB"\n[matrix]\n'
            'aio = ["native", "io_uring"]\ncache = "none"\n[[workloads]]\nrw = "randread"\n'
            'iodepth = [1, 8]\n[method]\nsamples = 2\naa = true\n')
    e = expand(load_suite_text(text, source="t"))
    keys = [c.key for c in e.configurations]
    assert keys[1] == keys[0] + "/aa=twin" and len(keys) == 3
    assert e.configurations[1].label.endswith("(A/A twin)")
    assert any("A/A calibration" in n for n in e.notes)
    assert all(sum(b.config.aa is True for b in plan(e, 2, 0) if b.round == r) == 1
               for r in (0, 1))
    assert len(expand(load_suite_text(text.replace("aa = true", ""), source="t"))
               .configurations) == 2


@pytest.mark.slow
def test_aa_report_on_identical_synthetic_configurations_is_at_the_nominal_rate() -> None:
    from iomatrix.analysis.paired import aa_report

    rng = random.Random(3)
    workloads = [_workload(bs, qd) for bs in (512, 4096) for qd in (1, 8, 32, 128)]
    tested = raw = holm = 0
    for _ in range(150):
        factors = [1 + rng.uniform(-0.1, 0.1) for _ in range(5)]
        noise = {(c.key, w.key, r): math.exp(rng.gauss(0, 0.01))
                 for c in (OFF, TWIN) for w in workloads for r in range(5)}
        run = make_run([OFF, TWIN, ON], workloads, 5,
                       lambda c, w, r: 1e4 * factors[r] * noise.get((c.key, w.key, r), 1.0))
        aa = aa_report(run)
        assert aa is not None and aa.methods == ("rounds",)
        tested, raw, holm = tested + aa.tested, raw + aa.significant_raw, holm + aa.significant
        # the twin takes part in no real gain
        assert all(g.pairs == 8 for g in gains(run, "iothread", by=()))
    assert tested == 150 * 8
    assert raw / tested <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / tested), raw
    assert holm / 150 <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / 150), holm   # family-wise


# --- a real A/A ----------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_real_aa_run_is_called_different_at_most_at_the_nominal_rate(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Two real A/A runs (4 workloads each, twin and original in every round): the paired
    method calls the twin different at most at about the nominal 5 %. Three rounds: the least
    a pilot chooses (trialplan.MIN_ROUNDS); the rate a t-test promises holds at any number."""
    import shutil

    from iomatrix.analysis.paired import aa_report
    from iomatrix.measure.runner import run_suite
    from iomatrix.store import Store
    from iomatrix.suite import load_suite_text

    need("fio")
    text = (f'[suite]\nname = "aa"\n[target]\ndirectory = "{tmp_path / "t"}"\nsize = "16MiB"\n'
            '[[workloads]]\nrw = "randread"\nbs = "4k"\niodepth = [1, 4, 16, 32]\n'
            '[method]\nmode = "host"\nramp = 0\nruntime = "500ms"\nsamples = 3\naa = true\n')
    tested = raw = 0
    for i in range(2):
        with Store(tmp_path / f"r{i}.db") as store:
            outcome = run_suite(load_suite_text(text.replace('"aa"', f'"aa{i}"'), source="t"),
                                store)
            aa = aa_report(store.load_run(outcome.run_id))
        assert aa is not None and aa.methods == ("rounds",) and aa.tested == 4, aa
        assert aa.significant == 0 or aa.significant_raw <= 1, aa.text()
        tested, raw = tested + aa.tested, raw + aa.significant_raw
    assert raw <= 0.05 * tested + 3 * math.sqrt(tested * 0.05 * 0.95)
