"""Findings: a study's conclusions ([[finding]] tables) checked on a stored run. Synthetic runs
built to confirm, contradict and not decide each kind of claim (expectations computed by hand),
the reasons a claim is not measurable here, the [[finding]] schema, the five built-in suites'
claims, the command and the report's Findings section; and one real quick run."""

from __future__ import annotations

import math
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from iomatrix.analysis.findings import (CONFIRMED, CONTRADICTED, EMULATED, NO_DIFFERENCE,
                                        NOT_DECIDED, NOT_MEASURABLE, claims_of, evaluate)
from iomatrix.core.errors import SuiteError
from iomatrix.report.data import build_report_data
from iomatrix.report.html import render_html
from iomatrix.store import Store
from iomatrix.suite.load import builtin_suites, load_suite, load_suite_text, tables_text
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.findings import Finding
from iomatrix.suite.workloads import Workload
from iomatrix.testing.synthetic import Figures, configurations, write_run

from tests.browser import chromium, open_page
from tests.conftest import cli
from tests.needs import needs

W4K1 = Workload(rw="randread", bs=4096, iodepth=1)
W4K32 = Workload(rw="randread", bs=4096, iodepth=32)
W128K1 = Workload(rw="randread", bs=131072, iodepth=1)
WRITE = Workload(rw="randwrite", bs=4096, iodepth=32)
READS = [W4K1, W4K32, W128K1]
JITTER = (-10.0, 0.0, 10.0)
"""Sample offsets: each point's mean is its base figure exactly."""


def claim(**fields: object) -> Finding:
    base: dict[str, object] = {"id": "c", "study": "seed test §1", "claim": "a claim",
                               "published": "a figure"}
    return Finding.model_validate({**base, **fields})


def figures(iops: float) -> Figures:
    return Figures(iops=iops, bw_bytes=iops * 4096, lat_mean_ns=1e9 / iops, p99_ns=2e9 / iops)


def store_run(tmp_path: Path, configs: list[Configuration], workloads: list[Workload],
              base: dict[tuple[str, str], float] | None = None, *, rule=None, samples: int = 3,
              accelerator: str = "none", baseline: float | None = None) -> Store:
    """A run whose point (config, workload) has mean IOPS ``rule(config, workload)``."""
    configs = list(configs)
    if baseline is not None:
        configs.append(Configuration(mode="host"))

    def gen(config: Configuration, workload: Workload, index: int) -> Figures:
        if config.mode == "host":
            value = baseline
        else:
            value = rule(config, workload)
        assert value is not None
        return figures(value + (JITTER[index] if samples == 3 else 0.0))

    tmp_path.mkdir(parents=True, exist_ok=True)
    store = Store(tmp_path / "f.db")
    write_run(store, configs, workloads, gen, samples=samples, accelerator=accelerator)
    return store


def one(store: Store, *claims: Finding):
    run = store.load_run(store.resolve("last"))
    return evaluate(run, claims).results


AIO = configurations("blocklayer", {"aio": ["native", "io_uring"], "cache": ["none"]})


# --- effect ------------------------------------------------------------------------------------

def test_effect_confirmed_with_a_constant_ratio(tmp_path: Path) -> None:
    # every pair: io_uring 1200 IOPS against native 1000 → +20 % in each of 3 pairs (t-test of
    # equal log ratios: p = 0), so the claim is confirmed with the CI collapsed on +20 %
    store = store_run(tmp_path, AIO, READS,
                      rule=lambda c, w: 1200.0 if c.aio == "io_uring" else 1000.0)
    [r] = one(store, claim(kind="effect", axis="aio", level="io_uring", reference="native",
                           expect="better"))
    assert r.verdict == CONFIRMED and r.mode == "blocklayer"
    check = r.decisive
    assert check.relative == pytest.approx(0.2) and check.low == pytest.approx(0.2)
    assert check.adjusted_p == 0.0 and check.components[0].pairs == 3
    # in the metric's own sense: mean latency falls by 1/1.2 − 1 = −16.7 %, which is "better"
    [lat] = one(store, claim(kind="effect", axis="aio", level="io_uring", reference="native",
                             metric="lat_mean_ns", expect="better"))
    assert lat.verdict == CONFIRMED
    assert lat.decisive.relative == pytest.approx(1 / 1.2 - 1, rel=1e-3)
    # the guest check comes first but there are no guests: not measurable, with its reason
    assert r.checks[0].mode == "guest" and r.checks[0].verdict == NOT_MEASURABLE
    assert r.checks[0].reason == "this run has no guest configurations"


def test_effect_contradicted_and_magnitude(tmp_path: Path) -> None:
    store = store_run(tmp_path, AIO, READS,
                      rule=lambda c, w: 1200.0 if c.aio == "io_uring" else 1000.0)
    [worse] = one(store, claim(kind="effect", axis="aio", level="io_uring", reference="native",
                               expect="worse"))
    assert worse.verdict == CONTRADICTED and "goes the other way" in worse.decisive.reason
    # +20 % measured exactly: a claim of "at least 50 %" is contradicted by its CI, one of
    # "at least 10 %" confirmed
    [big] = one(store, claim(kind="effect", axis="aio", level="io_uring", reference="native",
                             expect="better", at_least="50%"))
    assert big.verdict == CONTRADICTED and "as large as 50 %" in big.decisive.reason
    [small] = one(store, claim(kind="effect", axis="aio", level="io_uring", reference="native",
                               expect="better", at_least="10%"))
    assert small.verdict == CONFIRMED


def test_effect_no_significant_difference(tmp_path: Path) -> None:
    # io_uring / native = 1.1, 0.9, 1.0 on the three workloads: geometric mean
    # exp((ln 1.1 + ln 0.9 + 0) / 3) − 1 = −0.33 %, far from significant
    ratio = {W4K1.key: 1.1, W4K32.key: 0.9, W128K1.key: 1.0}
    store = store_run(tmp_path, AIO, READS, rule=lambda c, w: 1000.0 * (
        ratio[w.key] if c.aio == "io_uring" else 1.0))
    [r] = one(store, claim(kind="effect", axis="aio", level="io_uring", reference="native",
                           expect="better"))
    expected = math.expm1((math.log(1.1) + math.log(0.9)) / 3)
    assert r.verdict == NO_DIFFERENCE
    assert r.decisive.relative == pytest.approx(expected, rel=1e-6)
    assert r.decisive.adjusted_p is not None and r.decisive.adjusted_p > 0.5


def test_effect_per_level_and_workload_subset(tmp_path: Path) -> None:
    # iothread +10 % with native, −10 % with io_uring: "for both" goes the other way for one
    configs = configurations("guest", {"controller": ["virtio-scsi-single"],
                                       "aio": ["native", "io_uring"], "iothread": [True, False]})

    def rule(c: Configuration, w: Workload) -> float:
        gain = 1.1 if c.aio == "native" else 0.9
        return 1000.0 * (gain if c.iothread else 1.0)

    store = store_run(tmp_path, configs, READS, rule=rule, accelerator="kvm")
    both = claim(kind="effect", axis="iothread", level=True, reference=False, expect="better",
                 per="aio", workloads={"iodepth": 1})
    [r] = one(store, both)
    assert r.verdict == CONTRADICTED and r.mode == "guest"
    labels = {c.label: c.relative for c in r.decisive.components}
    assert labels == pytest.approx({"aio=native": 0.1, "aio=io_uring": -0.1})
    assert all(c.pairs == 2 for c in r.decisive.components)     # QD1: 4k and 128k
    [native] = one(store, both.model_copy(update={"where": {"aio": ("native",)}, "per": ()}))
    assert native.verdict == CONFIRMED


def test_holm_across_the_runs_claims(tmp_path: Path) -> None:
    # two claims on the same data with one pair of 3 samples each: Welch p of each, then Holm:
    # the smaller × 2, the larger max(itself, that)
    store = store_run(tmp_path, AIO, [W4K1],
                      rule=lambda c, w: 1030.0 if c.aio == "io_uring" else 1000.0)
    a = claim(id="a", kind="effect", axis="aio", level="io_uring", reference="native",
              expect="better")
    b = claim(id="b", kind="effect", axis="aio", level="io_uring", reference="native",
              metric="bw_bytes", expect="better")
    ra, rb = one(store, a, b)
    from scipy import stats
    p = stats.ttest_ind([1020, 1030, 1040], [990, 1000, 1010], equal_var=False).pvalue
    assert ra.decisive.p_value == pytest.approx(p) and ra.decisive.family == 2
    assert ra.decisive.adjusted_p == pytest.approx(min(1.0, 2 * p))
    assert ra.verdict == (CONFIRMED if 2 * p < 0.05 else NO_DIFFERENCE)


# --- ranking ---------------------------------------------------------------------------------

CACHES = {"none": 1000.0, "writeback": 2000.0, "directsync": 300.0, "writethrough": 200.0}


def cache_run(tmp_path: Path, values: dict[str, float] = CACHES) -> Store:
    configs = configurations("blocklayer", {"aio": ["threads"], "cache": list(values),
                                            "format": ["raw", "qcow2"]})
    return store_run(tmp_path, configs, [WRITE], rule=lambda c, w: values[str(c.cache)])


def test_ranking_confirmed_contradicted_undecided(tmp_path: Path) -> None:
    store = cache_run(tmp_path)
    slowest = claim(kind="ranking", axis="cache", worst=["directsync", "writethrough"],
                    workloads={"rw": "randwrite"})
    [r] = one(store, slowest)
    # 2 worst × 2 others = 4 comparisons, each over raw and qcow2 (2 pairs, constant ratios)
    assert r.verdict == CONFIRMED and len(r.decisive.components) == 4
    assert {c.label for c in r.decisive.components} == {
        "none vs directsync", "writeback vs directsync", "none vs writethrough",
        "writeback vs writethrough"}
    [wrong] = one(store, claim(kind="ranking", axis="cache", best=["none"]))
    assert wrong.verdict == CONTRADICTED       # writeback beats none
    assert wrong.decisive.relative == pytest.approx(1.0)    # writeback / none − 1


def test_ranking_not_significant(tmp_path: Path) -> None:
    configs = configurations("blocklayer", {"aio": ["threads"], "cache": ["none", "writeback"],
                                            "format": ["raw", "qcow2"]})
    flip = {("none", "raw"): 1000.0, ("none", "qcow2"): 1000.0,
            ("writeback", "raw"): 1100.0, ("writeback", "qcow2"): 900.0}
    store = store_run(tmp_path, configs, [WRITE], rule=lambda c, w: flip[(c.cache, c.format)])
    [r] = one(store, claim(kind="ranking", axis="cache", best=["writeback"]))
    assert r.verdict == NO_DIFFERENCE


# --- equivalence -----------------------------------------------------------------------------

def ratio_run(tmp_path: Path, ratios: list[float]) -> Store:
    workloads = [Workload(rw="randread", bs=4096 * (i + 1), iodepth=1) for i in range(len(ratios))]
    by = {w.key: r for w, r in zip(workloads, ratios)}
    configs = configurations("guest", {"controller": ["virtio-scsi", "virtio-blk"],
                                       "cache": ["none"]})
    return store_run(tmp_path, configs, workloads, accelerator="kvm", rule=lambda c, w: 1000.0 * (
        by[w.key] if c.controller == "virtio-blk" else 1.0))


SAME = {"kind": "equivalence", "axis": "controller", "level": "virtio-blk",
        "reference": "virtio-scsi", "margin": "5%"}


def test_equivalence_rule(tmp_path: Path) -> None:
    # every ratio 1.01: CI [+1 %, +1 %] within ±5 % → confirmed
    [r] = one(ratio_run(tmp_path / "a", [1.01, 1.01, 1.01]), claim(**SAME))
    assert r.verdict == CONFIRMED and r.decisive.high == pytest.approx(0.01)
    # every ratio 1.2: CI [+20 %, +20 %] wholly outside → contradicted
    [r] = one(ratio_run(tmp_path / "b", [1.2, 1.2, 1.2]), claim(**SAME))
    assert r.verdict == CONTRADICTED
    # 1.0, 1.08, 0.95: the t-interval of the logs over 3 pairs reaches past ±5 % → not decided
    ratios = [1.0, 1.08, 0.95]
    [r] = one(ratio_run(tmp_path / "c", ratios), claim(**SAME))
    logs = [math.log(x) for x in ratios]
    mean = sum(logs) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 2)
    half = 4.302652729911275 * sd / math.sqrt(3)           # t(0.975, 2)
    assert r.verdict == NOT_DECIDED
    assert r.decisive.low == pytest.approx(math.expm1(mean - half), rel=1e-6)
    assert r.decisive.high == pytest.approx(math.expm1(mean + half), rel=1e-6)


# --- baseline --------------------------------------------------------------------------------

def vhost_run(tmp_path: Path, fraction: dict[str, float]) -> Store:
    workloads = [W4K32, Workload(rw="read", bs=1 << 20, iodepth=32)]
    configs = configurations("guest", {"controller": ["virtio-blk"],
                                       "data_path": ["emulated", "vhost-user-blk"], "vms": [1, 2]})
    return store_run(tmp_path, configs, workloads, accelerator="kvm", baseline=1000.0,
                     rule=lambda c, w: 1000.0 * fraction[f"{c.data_path}/{c.vms}/{w.rw}"])


def test_baseline_rule(tmp_path: Path) -> None:
    near = claim(kind="baseline", axis="data_path", level="vhost-user-blk", at_least="90%",
                 per="vms")
    fr = {"emulated/1/randread": 0.3, "emulated/1/read": 0.3, "emulated/2/randread": 0.5,
          "emulated/2/read": 0.5, "vhost-user-blk/1/randread": 0.95, "vhost-user-blk/1/read": 0.95,
          "vhost-user-blk/2/randread": 0.98, "vhost-user-blk/2/read": 0.98}
    [r] = one(vhost_run(tmp_path / "a", fr), near)
    assert r.verdict == CONFIRMED
    assert {c.label: c.relative for c in r.decisive.components} == pytest.approx(
        {"vms=1": -0.05, "vms=2": -0.02})
    assert r.decisive.relative == pytest.approx(-0.05)       # the lowest CI decides
    [r] = one(vhost_run(tmp_path / "b", {**fr, "vhost-user-blk/2/read": 0.5,
                                         "vhost-user-blk/2/randread": 0.5}), near)
    assert r.verdict == CONTRADICTED and "vms=2" in r.decisive.reason
    [r] = one(vhost_run(tmp_path / "c", {**fr, "vhost-user-blk/2/read": 0.8,
                                         "vhost-user-blk/2/randread": 1.0}), near)
    assert r.verdict == NOT_DECIDED
    # no bare-metal baseline in the run
    store = store_run(tmp_path / "d", AIO, READS, rule=lambda c, w: 1000.0)
    [r] = one(store, claim(kind="baseline", axis="aio", level="native", at_least="90%"))
    assert r.verdict == NOT_MEASURABLE
    assert r.checks[1].reason == "this run has no bare-metal baseline (host mode)"


# --- not measurable here -----------------------------------------------------------------------

def test_guests_under_tcg_are_not_measurable_but_the_block_layer_is(tmp_path: Path) -> None:
    guests = configurations("guest", {"controller": ["virtio-scsi-single"],
                                      "aio": ["native", "io_uring"], "iothread": [True, False]})
    store = store_run(tmp_path, guests + AIO, READS, accelerator="tcg",
                      rule=lambda c, w: 1200.0 if c.aio == "io_uring" else 1000.0)
    [iothread, aio] = one(store,
                          claim(id="t", kind="effect", axis="iothread", level="on",
                                reference="off", expect="better", per="aio"),
                          claim(id="a", kind="effect", axis="aio", level="io_uring",
                                reference="native", expect="better"))
    assert iothread.verdict == NOT_MEASURABLE and iothread.mode is None
    assert iothread.checks[0].reason == EMULATED and "not measurable here" in NOT_MEASURABLE
    assert aio.verdict == CONFIRMED and aio.mode == "blocklayer"
    assert aio.checks[0].reason == EMULATED
    assert aio.decisive.family == 1          # only measured checks make up the family


def test_a_missing_level_workload_or_sample(tmp_path: Path) -> None:
    store = store_run(tmp_path, AIO, READS, rule=lambda c, w: 1000.0)
    [level] = one(store, claim(kind="effect", axis="aio", level="threads", reference="native",
                               expect="better"))
    assert level.verdict == NOT_MEASURABLE
    assert level.checks[1].reason == ("aio=threads was not measured in blocklayer mode here (its "
                                      "blocklayer configurations have aio=native, io_uring)")
    [work] = one(store, claim(kind="effect", axis="aio", level="io_uring", reference="native",
                              expect="better", workloads={"rw": "randwrite"}))
    assert work.checks[1].reason == "no workload of this run matches rw=randwrite"
    [where] = one(store, claim(kind="effect", axis="aio", level="io_uring", reference="native",
                               expect="better", where={"cache": "writeback"}))
    assert where.checks[1].reason == "no blocklayer configuration of this run has cache=writeback"
    once = store_run(tmp_path / "once", AIO, READS, samples=1, rule=lambda c, w: 1000.0)
    [single] = one(once, claim(kind="effect", axis="aio", level="io_uring", reference="native",
                               expect="better", workloads={"iodepth": 32}))
    assert single.verdict == NOT_MEASURABLE
    assert single.checks[1].reason.startswith("1 matched pair with one sample per point")


# --- the schema and the built-in claims ---------------------------------------------------------

SUITE = """
[suite]
name = "s"
[target]
directory = "/var/tmp/iomatrix"
size = "1GiB"
"""


@pytest.mark.parametrize("table, message", [
    ('kind = "effect"\naxis = "aio"\nlevel = "io_uring"\nreference = "native"',
     "a effect finding needs expect"),
    ('kind = "effect"\naxis = "aio"\nlevel = "nativ"\nreference = "native"\nexpect = "better"',
     "aio has no level 'nativ'"),
    ('kind = "ranking"\naxis = "cache"', "needs best or worst"),
    ('kind = "equivalence"\naxis = "aio"\nlevel = "io_uring"\nreference = "native"',
     "needs margin"),
    ('kind = "effect"\naxis = "aio"\nlevel = "io_uring"\nreference = "native"\n'
     'expect = "better"\nper = ["aio"]', "cannot be in per or where"),
    ('kind = "baseline"\nat_least = "90%"\nwhere = { speed = "fast" }', "'speed' is not an axis"),
    ('kind = "guess"', "Input should be"),
])
def test_a_bad_finding_is_refused_naming_it(table: str, message: str) -> None:
    text = SUITE + '[[finding]]\nid = "x"\nstudy = "s"\nclaim = "c"\npublished = "p"\n' + table
    with pytest.raises(SuiteError, match=re.escape(message)) as info:
        load_suite_text(text, source="f.toml")
    assert str(info.value).startswith("f.toml: ") and "finding" in str(info.value)


def test_finding_ids_are_unique() -> None:
    one_table = ('[[finding]]\nid = "x"\nstudy = "s"\nclaim = "c"\npublished = "p"\n'
                 'kind = "ranking"\naxis = "cache"\nworst = "directsync"\n')
    with pytest.raises(SuiteError, match="two findings have the id 'x'"):
        load_suite_text(SUITE + one_table + one_table)


STUDIES = {"aio-iothreads": "000", "cache-format": "001", "controllers": "002",
           "vhost-user": "003", "native-threads": "004"}


@pytest.mark.parametrize("name", sorted(STUDIES))
def test_each_study_states_two_to_four_cited_claims(name: str) -> None:
    suite = load_suite(name)
    assert 2 <= len(suite.finding) <= 4
    for f in suite.finding:
        assert f.id.startswith(STUDIES[name] + "-") and f.study.startswith(f"seed {STUDIES[name]} ")
        assert "§" in f.study or "slide" in f.study
        assert re.search(r"\d", f.published) or f.published.startswith('"'), f.id  # figure or quote
    # a run at any scale keeps its claims in the suite text it stores
    quick = load_suite(name, scale="quick")
    assert load_suite_text(quick.source_text).finding == suite.finding
    assert builtin_suites()[name].count("[[finding]]") == len(suite.finding)


def test_claims_about_the_block_layer_are_checked_there_too() -> None:
    by_id = {f.id: f for name in STUDIES for f in load_suite(name).finding}
    assert by_id["000-iothread-qd1"].checked_modes == ("guest",)
    assert by_id["000-io_uring-without-iothread"].checked_modes == ("guest", "blocklayer")
    assert by_id["001-writeback-beats-none"].checked_modes == ("guest", "blocklayer")
    assert by_id["004-native-needs-preallocation"].checked_modes == ("guest", "blocklayer")
    assert by_id["003-vhost-scales-with-vms"].checked_modes == ("guest",)


# --- the command and the report ---------------------------------------------------------------

def with_suite_text(store: Store, text: str) -> int:
    run_id = store.resolve("last")
    with sqlite3.connect(store.path) as db:
        db.execute("UPDATE runs SET suite_text = ? WHERE id = ?", (text, run_id))
    return run_id


FOUND = """
[[finding]]
id = "t-io_uring"
study = "seed test §2"
claim = "io_uring beats native"
published = "+20 %"
kind = "effect"
axis = "aio"
level = "io_uring"
reference = "native"
expect = "better"

[[finding]]
id = "t-threads"
study = "seed test §3"
claim = "threads is slow"
published = "−50 %"
kind = "effect"
axis = "aio"
level = "threads"
reference = "native"
expect = "worse"
"""


@pytest.fixture
def found_db(tmp_path: Path) -> Path:
    store = store_run(tmp_path, AIO, READS,
                      rule=lambda c, w: 1200.0 if c.aio == "io_uring" else 1000.0)
    with_suite_text(store, SUITE + FOUND)
    store.close()
    return tmp_path / "f.db"



def test_findings_command(found_db: Path) -> None:
    code, text = cli("findings", "last", "--db", str(found_db))
    assert code == 0
    assert "findings (from the run's suite)" in text
    assert "t-io_uring · seed test §2" in text and "published: +20 %" in text
    assert "blocklayer: confirmed: IOPS +20.0 % (95 % CI +20.0 … +20.0 %)" in text
    assert "verdict: confirmed (in blocklayer mode)" in text
    assert "aio=threads was not measured in blocklayer mode here" in text
    assert re.search(r"t-threads\s+not measurable here", text)


def test_a_run_without_claims(tmp_path: Path) -> None:
    store = store_run(tmp_path, AIO, READS, rule=lambda c, w: 1000.0)
    run = store.load_run(store.resolve("last"))
    assert claims_of(run) == ((), "the run's suite")
    store.close()
    code, text = cli("findings", "last", "--db", str(tmp_path / "f.db"))
    assert code == 0 and "states no findings" in text
    assert build_report_data(run).findings == ()
    assert 'id="findings"' not in render_html(build_report_data(run))


needs_chromium = needs("chromium")


@pytest.mark.slow
@needs_chromium
def test_report_shows_findings_first(found_db: Path, tmp_path: Path) -> None:
    with Store(found_db, readonly=True) as store:
        data = build_report_data(store.load_run(store.resolve("last")))
    assert [f.verdict for f in data.findings] == [CONFIRMED, NOT_MEASURABLE]
    page_path = tmp_path / "report.html"
    page_path.write_text(render_html(data))
    with chromium() as browser, open_page(page_path, browser=browser, block_network=True) as page:
        assert page.problems == [] and page.external_requests == []
        first = page.evaluate("document.querySelector('main section').id")
        assert first == "findings"
        rows = page.evaluate("""() => [...document.querySelectorAll('[data-testid=finding]')]
            .map((r) => [r.dataset.finding, r.dataset.verdict, r.innerText])""")
        assert [r[:2] for r in rows] == [["t-io_uring", CONFIRMED], ["t-threads", NOT_MEASURABLE]]
        assert "+20.0 % (95 % CI +20.0 … +20.0 %)" in rows[0][2] and "in blocklayer mode" in rows[0][2]
        assert "aio=threads was not measured" in rows[1][2]
        assert page.evaluate("document.querySelector('.toc a').getAttribute('href')") == "#findings"


# --- a real run ---------------------------------------------------------------------------------

@pytest.mark.slow
@needs("qemu", "fio")
def test_a_real_quick_run_of_seed_000(tmp_path: Path) -> None:
    """Seed 000 at its quick scale (the tables a ``--scale quick`` run stores), with shorter
    trials and a smaller image: which claims a run can check depends on its configurations,
    workloads and rounds, not on how long each trial lasts (2.5 min → 1 min here)."""
    text = tables_text(load_suite("aio-iothreads", scale="quick").tables, "aio-iothreads")
    for scaled, short in (('ramp = "500ms"', "ramp = 0"), ('runtime = "2s"', 'runtime = "500ms"'),
                          ('size = "512MiB"', 'size = "64MiB"')):
        assert text.count(scaled) == 1, scaled              # the quick scale as it is today
        text = text.replace(scaled, short)
    suite = tmp_path / "seed-000-quick.toml"
    suite.write_text(text)
    db = tmp_path / "r.db"
    run = subprocess.run([sys.executable, "-m", "iomatrix", "run", str(suite), "--db", str(db),
                          "--target", str(tmp_path / "t")],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode in (0, 6), run.stderr[-2000:]
    with Store(db, readonly=True) as store:
        stored = store.load_run(store.resolve("last"))
    assert "[[finding]]" in stored.suite.text          # the run keeps its claims
    results = {r.finding.id: r for r in evaluate(stored).results}
    assert set(results) == {f.id for f in load_suite("aio-iothreads").finding}
    # the aio claims are measured natively in the block layer whatever the guests ran under
    for fid in ("000-io_uring-without-iothread", "000-native-qd1-latency"):
        block = next(c for c in results[fid].checks if c.mode == "blocklayer")
        assert block.measured and block.low is not None and block.adjusted_p is not None, fid
    guest = results["000-iothread-qd1"].checks[0]
    if stored.emulated:
        assert guest.verdict == NOT_MEASURABLE and guest.reason == EMULATED
    # the 128k claim rests on one pair, measured in three rounds: a paired interval
    sat = next(c for c in results["000-io_uring-saturated-128k"].checks if c.mode == "blocklayer")
    assert sat.measured and sat.low is not None and sat.adjusted_p is not None
    code, text = cli("findings", "last", "--db", str(db))
    assert code == 0 and "000-iothread-qd1" in text and "rules:" in text
