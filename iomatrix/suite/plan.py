"""The order of a run's trials (pure). Repetitions interleave: round r measures every
configuration once, in an order shuffled with the run's recorded seed, so that the drift of a
shared host lands on every configuration alike; the same configuration never runs in two blocks
back to back. Each block is one session (one daemon start, one set of guest boots) measuring
that configuration's workloads, also shuffled."""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence


from iomatrix.suite.expand import Expansion
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.method import Method
from iomatrix.suite.workloads import Workload
from iomatrix.core.model import Frozen
from iomatrix.vocab.words import Mode

TRIAL_OVERHEAD = 0.3
"""Seconds a trial costs beyond ramp + runtime (fio start-up); guests add fio's client/server
protocol and QEMU's statistics (GUEST_TRIAL_OVERHEAD, measured by bench/guest_overhead.py under
TCG with the appliance's patched fio server; about 1 s more where the appliance carries the host's
unpatched fio, which `iomatrix run --plan` and doctor say)."""
SESSION_COST = {Mode.HOST: 0.0, Mode.BLOCKLAYER: 0.3, Mode.GUEST: 3.0}
"""Seconds to bring a configuration up: daemon start, guest boot (TCG here; about 1 s on KVM)."""
GUEST_TRIAL_OVERHEAD = 0.5


class Block(Frozen):
    """One session: a configuration brought up once, measuring some workloads once each."""

    round: int
    config: Configuration
    workloads: tuple[Workload, ...]

    @property
    def sample(self) -> int:
        """The sample index these trials record (the round)."""
        return self.round


def plan_round(expansion: Expansion, round_index: int, seed: int,
               pairs: Iterable[tuple[str, str]] | None = None,
               previous: Configuration | None = None) -> list[Block]:
    """Round ``round_index``: every configuration (or only those of ``pairs``, as (config key,
    workload key)) once, shuffled with ``seed``; never starting with ``previous``."""
    wanted = None if pairs is None else set(pairs)
    rng = random.Random(f"{seed}:{round_index}")
    blocks = []
    for config in expansion.configurations:
        workloads = [w for w in expansion.workloads_for(config)
                     if wanted is None or (config.key, w.key) in wanted]
        if workloads:
            rng.shuffle(workloads)
            blocks.append(Block(round=round_index, config=config, workloads=tuple(workloads)))
    rng.shuffle(blocks)
    if previous is not None and len(blocks) > 1 and blocks[0].config == previous:
        blocks.append(blocks.pop(0))
    return blocks


def plan(expansion: Expansion, samples: int, seed: int) -> list[Block]:
    """The fixed rounds of a run: ``samples`` rounds of every configuration."""
    blocks: list[Block] = []
    for r in range(samples):
        blocks += plan_round(expansion, r, seed, previous=blocks[-1].config if blocks else None)
    return blocks


def trial_seconds(workload: Workload, method: Method) -> float:
    """How long a trial measures: ramp + runtime (max_runtime under steady state), or an ioping
    workload's requests and intervals (it has neither ramp nor runtime)."""
    return workload.ioping.seconds if workload.ioping else method.ramp + method.window


def estimate_seconds(blocks: Sequence[Block], method: Method) -> float:
    """Planned wall time of some blocks (not counting preconditioning)."""
    total = 0.0
    for block in blocks:
        overhead = TRIAL_OVERHEAD + (GUEST_TRIAL_OVERHEAD if block.config.mode == Mode.GUEST else 0)
        total += SESSION_COST[block.config.mode] + sum(
            trial_seconds(w, method) + overhead for w in block.workloads)
    return total


def measured_seconds(blocks: Sequence[Block], method: Method) -> float:
    """The time fio measures in some blocks: ramp + runtime (max_runtime under steady state)
    per trial, nothing else; the figure a study quotes ("each suite takes 19.6 hours")."""
    return sum(trial_seconds(w, method) for block in blocks for w in block.workloads)


class Estimate(Frozen):
    """What a suite's plan amounts to, before anything runs."""

    configurations: int
    trials: int
    """Trials of the fixed rounds ([method] samples of every point)."""
    sessions: int
    vm_boots: int
    daemon_starts: int
    seconds: float
    """Planned wall time of the fixed rounds (estimate_seconds; preconditioning not counted)."""
    measured_seconds: float
    """ramp + runtime of every trial of the fixed rounds (measured_seconds)."""
    max_trials: int | None = None
    """With a pilot choosing the rounds (pilot, target_ci): the trials if it chose
    max_samples; None without one."""
    max_seconds: float | None = None


def estimate(expansion: Expansion, method: Method) -> Estimate:
    """The trials, sessions and time of ``expansion`` measured with ``method``: the fixed
    rounds, and where a pilot chooses the rounds (pilot, target_ci) the bound when it chooses
    max_samples. Whatever the order (seed): each round has every configuration once."""
    blocks = plan(expansion, method.samples, 0)
    most: list[Block] | None = None
    if method.plans_rounds and method.max_samples > method.samples:
        most = plan(expansion, method.max_samples, 0)
    return Estimate(
        configurations=len(expansion.configurations),
        trials=sum(len(b.workloads) for b in blocks), sessions=len(blocks),
        vm_boots=sum(b.config.vms or 1 for b in blocks if b.config.mode == Mode.GUEST),
        daemon_starts=sum(1 for b in blocks if b.config.mode == Mode.BLOCKLAYER),
        seconds=estimate_seconds(blocks, method), measured_seconds=measured_seconds(blocks, method),
        max_trials=None if most is None else sum(len(b.workloads) for b in most),
        max_seconds=None if most is None else estimate_seconds(most, method))


def duration_text(seconds: float) -> str:
    """A planned duration for people: 45 s, 2.5 min, 19.6 h (up to 100 h), 4.2 days."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.1f} min"
    if seconds < 100 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"
