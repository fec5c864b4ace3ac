"""The trial planner (``analysis.trialplan``) on synthetic noise models: its choice against the
analytic optimum, its estimates against the model that made the pilot, and the A/A
false-difference rate of its fixed stop rule against the stop-when-narrow rule. Synthetic by
nature (the noise model must be known to check the choice); the real pilot runs in
``tests/scenarios/test_run.py``."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from iomatrix.analysis import trialplan as tp
from iomatrix.analysis.stats import log_ratio_test
from iomatrix.measure.runner import run_suite
from iomatrix.store import Store
from iomatrix.store.records import PilotTrial
from iomatrix.suite import load_suite
from tests.conftest import cli, write_suite

Z = float(sps.norm.ppf(0.975))


def noise(within: float, drift: float, fixed: float, *, session: float = 0.0, trials: int = 1,
          sessions: int = 0, pairs: int = 1) -> tp.Noise:
    return tp.Noise(mode="blocklayer", within=within, drift=drift, fixed=fixed, session=session,
                    trials=trials, sessions=sessions, pairs=pairs, paired=True, df=100)


@settings(max_examples=40, deadline=None)
@given(a=st.floats(1e-3, 1e-1), b=st.floats(1e-5, 1e-3), c=st.floats(0.2, 5.0))
def test_the_choice_is_the_classical_optimum_when_rounds_are_many(a: float, b: float,
                                                                  c: float) -> None:
    """Within-trial variance a/T, drift b, fixed cost c: with R continuous and t = z the wall
    time is W(T) = z²(a/T + b)(T + c)/h², least at T* = √(ac/b). A target that needs a few
    hundred rounds makes that nearly exact: the planner's T must cost what T* costs (within
    1 % of W(T*)) and lie within 10 % of T*. Where T* > 9c, drift is under a tenth of the
    variance at T*, W is so flat that the few rounds t(R−1) > z adds at any T move the exact
    optimum by more (a third, for 0.5 % of the wall time): those models are left out."""
    optimum = math.sqrt(a * c / b)
    assume(1.0 <= optimum <= min(300.0, 9 * c))
    target = math.sqrt(Z ** 2 * (a / optimum + b) / 300)

    def wall(t: float) -> float:
        return Z ** 2 * (a / t + b) * (t + c) / target ** 2

    choice = tp.choose([noise(a, b, c)], target, max_rounds=1000)
    assert choice.reached and 150 < choice.rounds < 700
    assert choice.optimum == pytest.approx(optimum)
    assert wall(choice.runtime) <= wall(optimum) * 1.01
    assert choice.runtime == pytest.approx(optimum, rel=0.1)
    assert wall(optimum) <= choice.seconds <= wall(optimum) * 1.02


@pytest.mark.parametrize("a,b,c,session,target", [
    (0.01, 1e-4, 0.8, 0.3, 0.02), (0.05, 4e-4, 2.0, 3.0, 0.02), (0.002, 1e-3, 0.3, 0.0, 0.05),
    (0.02, 0.0, 1.0, 0.5, 0.02)])
def test_the_choice_is_the_least_wall_time_of_every_trial_length_and_round_count(
        a: float, b: float, c: float, session: float, target: float) -> None:
    """Few rounds, t(R−1) as it is: a brute-force search over T (10 ms steps) and R finds
    nothing faster that reaches the target."""
    n = noise(a, b, c, session=session, trials=8, sessions=2, pairs=2)
    choice = tp.choose([n], target, max_rounds=30)
    assert choice.reached
    best = math.inf
    for r in range(tp.MIN_ROUNDS, 31):
        q = float(sps.t.ppf(0.975, r - 1))
        for t in np.arange(0.5, 120.0, 0.01):
            if q * math.sqrt(n.variance(t) / r) <= target:
                best = min(best, r * n.round_seconds(t))
                break                       # longer trials at these rounds only cost more
    assert choice.seconds <= best * (1 + 1e-9)
    assert float(sps.t.ppf(0.975, choice.rounds - 1)) * math.sqrt(
        n.variance(choice.runtime) / choice.rounds) <= target * (1 + 1e-9)


def test_without_drift_rounds_only_buy_a_smaller_t_and_without_fixed_cost_trials_are_short(
        ) -> None:
    """b = 0: W(R) = t(R−1)²·a/h² + R·c, so R is where a smaller t stops paying for another
    trial's fixed cost; c = 0: the shortest trials, as many rounds as that needs."""
    a, c, h = 0.01, 1.0, 0.02
    quiet = tp.choose([noise(a, 0.0, c)], h, max_rounds=30)
    walls = {r: float(sps.t.ppf(0.975, r - 1)) ** 2 * a / h ** 2 + r * c for r in range(3, 31)}
    assert quiet.rounds == min(walls, key=walls.__getitem__) and quiet.optimum is None
    assert quiet.seconds == pytest.approx(walls[quiet.rounds])
    free = tp.choose([noise(a, 1e-5, 0.0)], h, max_rounds=1000)
    assert free.runtime == pytest.approx(tp.MIN_RUNTIME, rel=0.01) and free.rounds > 30


def test_what_the_suite_fixes_is_kept() -> None:
    n = noise(0.01, 1e-4, 1.0)
    kept = tp.choose([n], 0.02, max_rounds=100, runtime=2.0)
    assert kept.runtime == 2.0 and kept.fixed_runtime and kept.reached
    assert float(sps.t.ppf(0.975, kept.rounds - 1)) * math.sqrt(n.variance(2.0) / kept.rounds) \
        <= 0.02 < float(sps.t.ppf(0.975, kept.rounds - 2)) * math.sqrt(
            n.variance(2.0) / (kept.rounds - 1))
    five = tp.choose([n], 0.02, max_rounds=30, rounds=5)
    assert five.rounds == 5 and five.fixed_rounds
    out = tp.choose([noise(0.5, 0.01, 1.0)], 0.02, max_rounds=10)
    assert not out.reached and out.rounds == 10 and "out of reach" in out.text()


def test_the_binding_class_decides() -> None:
    """Two classes: the noisier one sets T and R; the cost is both classes' per round."""
    calm, loud = noise(0.001, 1e-5, 0.5), noise(0.02, 2e-4, 0.5)
    both = tp.choose([calm, loud], 0.02, max_rounds=100)
    alone = tp.choose([loud], 0.02, max_rounds=100)
    assert (both.runtime, both.rounds) == (alone.runtime, alone.rounds)
    assert both.seconds == pytest.approx(alone.seconds + both.rounds * calm.round_seconds(
        both.runtime))


def test_a_baseline_of_one_configuration_binds_only_a_run_without_gains() -> None:
    """The host baseline (one configuration, log IOPS, drift uncancelled) is counted in the
    wall time but does not set T and R while a class has gains; alone, it does."""
    gain = noise(0.01, 1e-5, 0.5)
    host = tp.Noise(mode="host", within=0.01, drift=4e-3, fixed=0.5, session=0.0, trials=1,
                    sessions=0, pairs=1, paired=False, df=4)
    both = tp.choose([gain, host], 0.02, max_rounds=100)
    alone = tp.choose([gain], 0.02, max_rounds=100)
    assert (both.runtime, both.rounds) == (alone.runtime, alone.rounds)
    assert both.seconds == pytest.approx(alone.seconds + both.rounds * host.round_seconds(
        both.runtime))
    only = tp.choose([host], 0.02, max_rounds=100)
    assert only.rounds > alone.rounds


def pilot(rng: np.random.Generator, a: float, b: float, c: float, *, rounds: int,
          workloads: int = 2, gain: float = 0.0,
          lengths: tuple[float, ...] = tp.PILOT_LENGTHS) -> list[PilotTrial]:
    """A pilot as the runner stores it, from the model: per round and configuration a drift
    shared by its block (so the log ratio's drift has variance b), each trial's log IOPS with
    within-trial noise of variance a/2 per second (a for the log ratio of two)."""
    out = []
    for r in range(rounds):
        for ci, config in enumerate(("A", "B")):
            block = rng.normal(0, math.sqrt(b / 2))
            for w in range(workloads):
                for length in lengths:
                    level = 10.0 + (gain if ci else 0.0) + block
                    x = level + rng.normal(0, math.sqrt(a / 2 / length))
                    out.append(PilotTrial(mode="blocklayer", config_key=config,
                                          workload_key=f"w{w}", round=r, runtime_s=length,
                                          iops=math.exp(x), wall_s=length + c))
    return out


@pytest.mark.slow
def test_the_pilot_estimates_recover_the_model() -> None:
    rng = np.random.default_rng(7)
    got = tp.estimate(pilot(rng, 0.004, 1e-3, 0.8, rounds=400), mode="blocklayer",
                      trials_per_round=10, sessions_per_round=2, pairs=3)
    assert got is not None and got.paired
    assert got.within == pytest.approx(0.004, rel=0.15)
    assert got.drift == pytest.approx(1e-3, rel=0.2)
    assert got.fixed == pytest.approx(0.8)
    assert (got.trials, got.sessions, got.pairs) == (10, 2, 3)


def test_one_length_estimates_recover_the_model() -> None:
    """The pilot at the run's own trial (target_ci, or a runtime the suite fixes): workloads ×
    rounds at one length give within (what a round's workloads do not share) and drift."""
    rng = np.random.default_rng(3)
    got = tp.estimate(pilot(rng, 0.004, 1e-3, 0.8, rounds=300, workloads=4, lengths=(2.0,)),
                      mode="blocklayer", trials_per_round=10, sessions_per_round=2, pairs=3)
    assert got is not None and got.df == 3 * 299
    assert got.within == pytest.approx(0.004, rel=0.15)
    assert got.drift == pytest.approx(1e-3, rel=0.2)
    one = tp.estimate(pilot(rng, 0.004, 1e-3, 0.8, rounds=300, workloads=1, lengths=(2.0,)),
                      mode="blocklayer", trials_per_round=10, sessions_per_round=2, pairs=3)
    assert one is not None and one.within == 0.0       # nothing to tell them apart: all drift
    assert one.drift == pytest.approx(0.004 / 2 + 1e-3, rel=0.2)


def nodes_pilot(rng: np.random.Generator, a: float, b: float, c: float, *, nodes: int,
                rounds: int, workloads: int = 2, lengths: tuple[float, ...] = tp.PILOT_LENGTHS
                ) -> tuple[list[PilotTrial], dict[str, str]]:
    """A cluster's pilot as the controller stores it when each node measures its own share:
    every node's own two configurations (``A@n``, ``B@n``), each node at a level of its own
    (nodes differ by up to a factor of e²) and drifting on its own; and the configurations'
    nodes."""
    out: list[PilotTrial] = []
    node_of: dict[str, str] = {}
    for n in range(nodes):
        level = float(rng.uniform(-1.0, 1.0))
        for t in pilot(rng, a, b, c, rounds=rounds, workloads=workloads, lengths=lengths):
            key = f"{t.config_key}@n{n}"
            node_of[key] = f"n{n}"
            out.append(t.model_copy(update={"config_key": key, "iops": t.iops * math.exp(level)}))
    return out, node_of


@pytest.mark.parametrize("lengths,workloads", [(tp.PILOT_LENGTHS, 2), ((2.0,), 4)])
def test_one_estimate_pools_every_nodes_pilot(lengths: tuple[float, ...],
                                              workloads: int) -> None:
    """Three nodes, each pairing its own configurations at its own level, drifting on its
    own: one estimate over all their trials recovers the model (a node's drift is its gain's,
    not shared by the others), with three times the degrees of freedom of one node's pilot;
    the nodes' levels add nothing. Read as one host's pilot (no nodes given), the same trials
    pair only the first node's configurations."""
    rng = np.random.default_rng(11)
    trials, node_of = nodes_pilot(rng, 0.004, 1e-3, 0.8, nodes=3, rounds=100,
                                  workloads=workloads, lengths=lengths)
    kw = dict(mode="blocklayer", trials_per_round=10, sessions_per_round=2, pairs=3)
    got = tp.estimate(trials, nodes=node_of, **kw)
    one = tp.estimate([t for t in trials if node_of[t.config_key] == "n0"], nodes=node_of, **kw)
    host = tp.estimate(trials, **kw)
    assert got is not None and one is not None and host is not None and got.paired
    assert got.df == 3 * one.df and host.df == one.df
    assert got.within == pytest.approx(0.004, rel=0.15)
    assert got.drift == pytest.approx(1e-3, rel=0.25)
    assert got.fixed == pytest.approx(0.8)
    assert (got.trials, got.sessions, got.pairs) == (10, 2, 3)


def test_a_plan_chosen_over_several_nodes_is_one_and_says_so() -> None:
    """``decide`` (the one home of a pilot's plan, a host's or a cluster's): over the nodes'
    trials it chooses one trial length and rounds, within the suite's bounds, and its note
    counts every node's trials; a pilot whose trials all failed chooses nothing and says the
    suite's runtime and rounds are kept."""
    from iomatrix.suite.method import Method

    rng = np.random.default_rng(5)
    trials, node_of = nodes_pilot(rng, 0.004, 1e-4, 0.8, nodes=2, rounds=tp.PILOT_ROUNDS)
    method = Method(mode="blocklayer", pilot=True, max_samples=6, max_runtime=10)
    plan, note = tp.decide(trials, {"blocklayer": (4, 2, 2)}, method, 12.0, tp.PILOT_LENGTHS,
                           nodes=node_of)
    assert plan.choice is not None and len(plan.noise) == 1
    assert tp.MIN_ROUNDS <= plan.choice.rounds <= 6 and plan.choice.runtime <= 10
    assert note.startswith(f"pilot: {len(trials)} trials (12 s") and "chosen: trials of" in note
    failed = [t.model_copy(update={"iops": None}) for t in trials]
    none, said = tp.decide(failed, {"blocklayer": (4, 2, 2)}, method, 12.0, tp.PILOT_LENGTHS,
                           nodes=node_of)
    assert none.choice is None and "too little to choose from" in said


def _aa_rates(runs: int, seed: int, *, lengths: tuple[float, ...] = tp.PILOT_LENGTHS,
              min_rounds: int = tp.MIN_ROUNDS) -> tuple[float, float, float]:
    """(false-difference rate with the pilot's fixed rounds, rate when stopping at the first
    round the CI is within the target, mean rounds of the fixed rule) over ``runs`` synthetic
    A/A runs, each with a fresh pilot; ``lengths`` of one: the pilot at the run's own trial,
    which chooses only the rounds (target_ci)."""
    rng = np.random.default_rng(seed)
    a, b, c, pairs = 0.02, 3e-4, 0.8, 2
    target = 0.02
    fixed_hits = 0
    rounds, sds = [], []
    for _ in range(runs):
        n = tp.estimate(pilot(rng, a, b, c, rounds=tp.PILOT_ROUNDS, lengths=lengths),
                        mode="blocklayer", trials_per_round=4, sessions_per_round=2,
                        pairs=pairs)
        assert n is not None
        choice = tp.choose([n], target, max_rounds=30, min_rounds=min_rounds,
                           runtime=lengths[0] if len(lengths) == 1 else None)
        sd = math.sqrt(a / (pairs * choice.runtime) + b)
        xs = rng.normal(0, sd, choice.rounds)
        fixed_hits += log_ratio_test(list(xs)).p_value < 0.05
        rounds.append(choice.rounds)
        sds.append(sd)
    # the stop-when-narrow rule on the same model, looking after every round from min_rounds
    # (t-interval and t-test, vectorised over the runs: it looks up to 30 times a run)
    ys = rng.normal(0, 1, (runs, 30)) * np.array(sds)[:, None]
    stopped = np.zeros(runs, dtype=bool)
    narrow_hits = 0
    for r in range(min_rounds, 31):
        m, s = ys[:, :r].mean(axis=1), ys[:, :r].std(axis=1, ddof=1)
        now = ~stopped & ((sps.t.ppf(0.975, r - 1) * s / math.sqrt(r) <= target) | (r == 30))
        p = 2 * sps.t.sf(np.abs(m / (s / math.sqrt(r))), r - 1)
        narrow_hits += int((p[now] < 0.05).sum())
        stopped |= now
    return fixed_hits / runs, narrow_hits / runs, float(np.mean(rounds))


@pytest.mark.slow
@pytest.mark.parametrize("lengths,min_rounds", [(tp.PILOT_LENGTHS, tp.MIN_ROUNDS), ((10.0,), 5)],
                         ids=["pilot", "target_ci"])
def test_the_fixed_stop_rule_keeps_the_nominal_false_difference_rate(
        lengths: tuple[float, ...], min_rounds: int) -> None:
    """3000 seeded A/A runs each: with rounds fixed by the pilot the rate is 5 % (within 3.5
    binomial standard errors), whether it chooses trial length and rounds ([method] pilot) or
    only the rounds at the suite's runtime (target_ci, at least ``samples`` rounds); looking
    after every round and stopping when narrow (target_ci's rule before) is not."""
    runs = 3000
    fixed, narrow, mean_rounds = _aa_rates(runs, seed=11, lengths=lengths,
                                           min_rounds=min_rounds)
    se = math.sqrt(0.05 * 0.95 / runs)
    assert abs(fixed - 0.05) <= 3.5 * se, fixed
    assert narrow > 0.05 + 3.5 * se, narrow
    assert min_rounds < mean_rounds < 30


PLAN_SUITE = """
[matrix]
aio = ["threads", "io_uring"]
cache = "none"
iothread = false
[workloads]
iodepth = [1, 8]
[method]
mode = "blocklayer"
ramp = 0
max_samples = 12
"""


@pytest.mark.parametrize("method,says", [
    ('target_ci = "3%"\nruntime = "2s"\nsamples = 4\n',
     ["first 12 trials", "at the run's own trial length (2 s)",
      "then it chooses the number of rounds (4 to 12) with the least wall time",
      "±3 pp", "it keeps the suite's runtime 2 s"]),
    ("pilot = true\nsamples = 4\n",
     ["first 24 trials", "at 1 s and 4 s", "then it chooses the trial length (at most 60 s) with",
      "±2 pp", "it keeps 4 rounds"]),
    ("pilot = true\n", ["then it chooses the trial length (at most 60 s) and rounds (3 to 12)"]),
    ('target_ci = "2%"\nsteady_state = true\nmin_runtime = "5s"\nmax_runtime = "20s"\n',
     ["first 12 trials", "at the run's own steady-state trials (up to 20 s)",
      "then it chooses the number of rounds (3 to 12)", "it keeps its steady-state trials"])])
def test_run_plan_says_what_the_pilot_will_measure_and_choose(tmp_path: Path, method: str,
                                                              says: list[str]) -> None:
    code, shown = cli("run", str(write_suite(tmp_path, PLAN_SUITE + method, size="16MiB")),
                      "--plan")
    assert code == 0, shown
    line, = [x for x in shown.splitlines() if x.startswith("pilot: first ")]
    for text in says:
        assert text in line, (text, line)
    assert "a pilot first, which chooses the rounds (below)" in shown
    assert "no look at the gains decides when to stop" in line


@pytest.mark.slow
def test_a_real_blocklayer_run_stores_its_pilot_and_its_choice(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_leftovers: None) -> None:
    """qemu-storage-daemon and fio for real: the pilot measures both configurations at both
    lengths in its rounds, stores them apart from the run's trials, and the run then measures
    exactly the rounds chosen, at the runtime chosen, saying so in its notes. The pilot's
    lengths are half a real run's (0.5 s and 2 s: the same ratio), and so is the longest trial
    the run may choose (1.5 s), and it has two rounds, not three (the least that shows noise
    across rounds): what is checked is where each is stored and used."""
    monkeypatch.setattr(tp, "PILOT_LENGTHS", tuple(t / 2 for t in tp.PILOT_LENGTHS))
    monkeypatch.setattr(tp, "PILOT_ROUNDS", 2)
    body = """
[matrix]
aio = ["threads", "io_uring"]
cache = "none"
iothread = false
[workloads]
rw = "randread"
iodepth = 4
[method]
mode = "blocklayer"
ramp = 0
pilot = true
target_ci = "10%"
max_samples = 4
max_runtime = "1.5s"
"""
    suite = load_suite(write_suite(tmp_path, body, size="64MiB"))
    with Store(tmp_path / "r.db") as store:
        outcome = run_suite(suite, store)
        run = store.load_run(outcome.run_id)
        trials, plan = store.load_pilot(outcome.run_id)
    assert len(trials) == tp.PILOT_ROUNDS * 2 * len(tp.PILOT_LENGTHS)
    assert {t.runtime_s for t in trials} == set(tp.PILOT_LENGTHS)
    assert {t.round for t in trials} == set(range(tp.PILOT_ROUNDS))
    assert all(t.iops and t.iops > 0 and t.wall_s > t.runtime_s for t in trials)
    assert sum(t.session_s > 0 for t in trials) == tp.PILOT_ROUNDS * 2   # one per block
    assert plan is not None and plan.choice is not None and len(plan.noise) == 1
    choice = plan.choice
    assert tp.MIN_ROUNDS <= choice.rounds <= 4 and tp.MIN_RUNTIME <= choice.runtime <= 1.5
    assert outcome.trials_failed == 0
    assert sorted(t.sample_index for t in run.trials) == sorted(list(range(choice.rounds)) * 2)
    for t in run.trials:    # fio ran the chosen runtime: at least that (it overshoots by
        # what scheduling delays its last check, 0.1 s at load 10), and far short of twice it
        assert choice.runtime - 0.01 <= t.samples[0].runtime_ms / 1000 < 2 * choice.runtime
    note, = [n for n in run.notes if n.startswith("pilot:")]
    assert "chosen: trials of" in note and "blocklayer: within-trial noise" in note
    # resumed without its last round: the stored plan is kept, no second pilot
    last = choice.rounds - 1
    with Store(tmp_path / "r.db") as store:
        with store.conn:
            store.conn.execute("DELETE FROM samples WHERE trial_id IN (SELECT id FROM trials "
                               "WHERE run_id = ? AND sample_index = ?)", (run.id, last))
            store.conn.execute("DELETE FROM trials WHERE run_id = ? AND sample_index = ?",
                               (run.id, last))
        again = run_suite(suite, store, resume=run.id)
        resumed = store.load_run(run.id)
        assert store.load_pilot(run.id) == (trials, plan)
    assert again.trials_ok == 2 and len(resumed.trials) == 2 * choice.rounds
    assert [n for n in resumed.notes if n.startswith("pilot:")] == [note]
