"""The trial order: every trial exactly once, repetitions interleaved, reproducible from the seed."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from iomatrix.measure.prepare import prepare
from iomatrix.store import Store
from iomatrix.suite.plan import estimate_seconds, plan, plan_round
from iomatrix.suite import expand, load_suite_text
from tests.conftest import cli, write_suite
from tests.needs import needs

AIOS = ["native", "io_uring", "threads"]
CACHES = ["none", "directsync"]


def expansion(n_aio: int, n_cache: int, depths: int, baseline: bool):  # type: ignore[no-untyped-def]
    text = (f"[suite]\nname='p'\n[target]\ndirectory='/tmp/x'\nsize='1G'\n"
            f"[matrix]\naio={AIOS[:n_aio]}\ncache={CACHES[:n_cache]}\niothread=false\n"
            f"[workloads]\niodepth={[2 ** i for i in range(depths)]}\n"
            f"[method]\nmode='blocklayer'\nbaseline={'true' if baseline else 'false'}\n")
    return expand(load_suite_text(text))


shapes = st.tuples(st.integers(1, 3), st.integers(1, 2), st.integers(1, 4), st.booleans(),
                   st.integers(1, 6), st.integers(0, 2**31 - 1))


@settings(max_examples=60, deadline=None)
@given(shapes)
def test_every_trial_once_and_interleaved(shape) -> None:  # type: ignore[no-untyped-def]
    n_aio, n_cache, depths, baseline, samples, seed = shape
    exp = expansion(n_aio, n_cache, depths, baseline)
    blocks = plan(exp, samples, seed)
    trials = Counter((b.config.key, w.key, b.sample) for b in blocks for w in b.workloads)
    assert set(trials.values()) == {1}
    assert len(trials) == len(exp.configurations) * len(exp.workloads) * samples
    # each round measures every configuration exactly once, rounds in order
    for r in range(samples):
        in_round = [b.config.key for b in blocks if b.round == r]
        assert sorted(in_round) == sorted(c.key for c in exp.configurations)
    assert [b.round for b in blocks] == sorted(b.round for b in blocks)
    # never the same configuration in two sessions back to back
    if len(exp.configurations) > 1:
        assert all(a.config != b.config for a, b in zip(blocks, blocks[1:]))
    # reproducible from the seed
    assert plan(exp, samples, seed) == blocks


def test_seed_changes_the_order() -> None:
    exp = expansion(3, 2, 3, True)
    orders = {tuple(b.config.key for b in plan(exp, 2, seed)) for seed in range(20)}
    assert len(orders) > 10


def test_extra_round_only_for_the_points_asked() -> None:
    exp = expansion(2, 1, 3, False)
    c = exp.configurations[0]
    pairs = [(c.key, exp.workloads[1].key)]
    blocks = plan_round(exp, 5, seed=1, pairs=pairs)
    assert [(b.config.key, [w.key for w in b.workloads], b.sample) for b in blocks] == \
        [(c.key, [exp.workloads[1].key], 5)]


def test_estimate_counts_sessions_and_trials() -> None:
    exp = expansion(1, 1, 2, True)
    suite_method = load_suite_text("[suite]\nname='p'\n[target]\ndirectory='/tmp/x'\nsize='1G'\n"
                                   "[method]\nramp='1s'\nruntime='4s'\n").method
    blocks = plan(exp, 1, 0)
    # host: 2 trials × (5 + 0.3); blocklayer: 0.3 start + 2 × 5.3
    assert estimate_seconds(blocks, suite_method) == 2 * 5.3 + 0.3 + 2 * 5.3


# --- one seed rule: --seed, else [method] seed, else drawn; --plan shows the order a run measures

HOST_SUITE = """
[workloads]
rw = ["randread", "randwrite"]
iodepth = [1, 4]
[method]
mode = "host"
samples = 2
ramp = 0
runtime = "0.5s"
precondition = false
"""


def planned(output: str) -> list[str]:
    """The workloads ``run --plan`` lists, in its order."""
    return [m.group(1) for m in re.finditer(r"^\s+\d+  (.+)$", output, re.M)]


def test_the_seed_rule() -> None:
    text = "[suite]\nname='p'\n[target]\ndirectory='/tmp/x'\nsize='1G'\n"
    suite = load_suite_text(text)
    drawn = prepare(suite)
    assert drawn.drawn and 0 <= drawn.seed < 2**31
    assert prepare(suite, seed=3).seed == 3 and not prepare(suite, seed=3).drawn
    own = load_suite_text(text + "[method]\nseed = 7\n")
    assert prepare(own).seed == 7 and not prepare(own).drawn
    assert prepare(own, seed=3).seed == 3               # --seed overrides [method] seed
    assert prepare(own).blocks == prepare(own).blocks


@pytest.mark.slow
@needs("fio")
def test_a_run_with_the_plans_seed_measures_in_the_plans_order(tmp_path: Path) -> None:
    suite = str(write_suite(tmp_path, HOST_SUITE, size="16MiB"))
    code, shown = cli("run", suite, "--plan")
    assert code == 0
    seed = int(re.search(r"^trial order: seed (\d+), drawn for this plan: `--seed \1` measures "
                         r"in this order", shown, re.M).group(1))    # type: ignore[union-attr]
    code, again = cli("run", suite, "--plan", "--seed", str(seed))
    assert code == 0 and planned(again) == planned(shown) and len(planned(shown)) == 8
    assert f"trial order: seed {seed}\n" in again              # given, not drawn
    db = str(tmp_path / "r.db")
    code, output = cli("run", suite, "--seed", str(seed), "--db", db)
    assert code == 0, output
    with Store(db, readonly=True) as store:
        run = store.load_run(1)
    labels = {w.key: w.label for w in run.workloads}
    assert run.seed == seed
    assert [labels[t.workload_key] for t in sorted(run.trials, key=lambda t: t.id)] == \
        planned(shown)
    # resumed, it keeps its order, whatever a new preparation draws
    resumed = prepare(run.suite.runnable()).resumed(run)
    assert [w.label for b in resumed.blocks for w in b.workloads] == planned(shown)
