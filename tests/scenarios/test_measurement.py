"""Measurement you can trust, for real: steady state stops fio early, CPU accounting agrees with
fio's own, bare-metal efficiency, adaptive repetition, telemetry stored per trial."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from iomatrix.measure.runner import run_suite
from iomatrix.store import Store
from iomatrix.suite import load_suite
from tests.conftest import cli_result, write_suite

pytestmark = pytest.mark.slow


def fio_startup_cpu_s() -> float:
    """CPU seconds fio spends outside a job's runtime on this host, now: a null job of 4 KiB,
    measured as iomatrix measures fio (the child's getrusage). Start-up and teardown (loading
    fio's ~100 shared libraries) cost this whatever the job; a slow or busy host pays more."""
    proc = subprocess.Popen(["fio", "--name=startup", "--ioengine=null", "--size=4k",
                             "--rw=read", "--output=/dev/null"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.returncode == 0
    return usage.ru_utime + usage.ru_stime


def run(tmp_path: Path, body: str):  # type: ignore[no-untyped-def]
    suite = load_suite(write_suite(tmp_path, body, size="64MiB"))
    with Store(tmp_path / "r.db") as store:
        outcome = run_suite(suite, store)
        return outcome, store.load_run(outcome.run_id), store


def test_cpu_accounting_and_telemetry(tmp_path: Path, no_leftovers: None) -> None:
    body = """
[matrix]
aio = "io_uring"
cache = "none"
iothread = false
[workloads]
rw = "randwrite"
iodepth = 16
[method]
mode = "blocklayer"
baseline = true
ramp = 0
runtime = "3s"
"""
    outcome, stored, store = run(tmp_path, body)
    startup = fio_startup_cpu_s()
    assert outcome.trials_failed == 0
    for t in stored.trials:
        cpu = t.cpu
        assert cpu is not None
        # the host fio's CPU from getrusage agrees with fio's own usr+sys (% of its runtime):
        # both count the job process; ticks are 10 ms. getrusage also counts fio's start-up
        # and teardown, which fio's figure leaves out: what a null job costs on this host
        # (about 0.05 s on an idle machine of ours, 0.12 s when other work shares its 2 cores)
        runtime_s = t.samples[0].runtime_ms / 1000
        fio_own = (t.usr_cpu + t.sys_cpu) / 100 * runtime_s
        host_fio = cpu.cpu_s_by_role["fio (host)"]
        assert fio_own - 0.03 <= host_fio <= 1.25 * fio_own + 2 * startup + 0.05, (
            host_fio, fio_own, startup)
        assert cpu.ios == t.samples[0].total_ios and cpu.cpu_us_per_io and cpu.cpu_us_per_io > 0
        assert cpu.voluntary_csw > 0
        assert isinstance(cpu.perf, (str, dict))
        with Store(tmp_path / "r.db") as reopened:
            series = reopened.telemetry(t.id)
        assert series is not None
        assert series.t and series.ctxt_per_s and max(series.ctxt_per_s) > 0
        if t.config_key != "host":
            # the daemon's own threads did work too
            assert cpu.cpu_s_by_role.get("daemon", 0) > 0


def test_bare_metal_efficiency_in_show(tmp_path: Path, no_leftovers: None) -> None:
    body = """
[matrix]
aio = "threads"
cache = "none"
iothread = false
[workloads]
iodepth = 8
[method]
mode = "blocklayer"
baseline = true
ramp = 0
runtime = "500ms"
"""
    run(tmp_path, body)
    shown = cli_result("show", "1", "--db", "r.db", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert "% bare IOPS" in out and "+lat µs" in out
    row = next(line for line in out.splitlines() if line.startswith(" blocklayer"))
    pct = float(next(tok for tok in row.split() if tok.endswith("%") and not tok.startswith("±"))[:-1])
    assert 1 < pct < 200


def test_target_ci_rounds_are_chosen_by_a_pilot_at_the_runs_own_trial_length(
        tmp_path: Path, no_leftovers: None) -> None:
    """target_ci no longer adds rounds until a CI looks narrow (that stop rule called A/A pairs
    different too often: tests/analysis/test_trialplan.py); a pilot at the suite's own trial (500 ms
    here) chooses the rounds, between samples (at least 3) and max_samples, and every point
    gets exactly those."""
    body = """
[workloads]
iodepth = [1, 8]
[method]
mode = "host"
ramp = 0
runtime = "500ms"
samples = 2
target_ci = "5%"
max_samples = 5
seed = 3
"""
    from iomatrix.analysis import trialplan as tp
    from iomatrix.analysis.points import points

    outcome, stored, _ = run(tmp_path, body)
    with Store(tmp_path / "r.db") as store:
        pilot, plan = store.load_pilot(outcome.run_id)
    assert plan is not None and plan.choice is not None
    choice = plan.choice
    assert choice.fixed_runtime and choice.runtime == 0.5 and 3 <= choice.rounds <= 5
    assert len(pilot) == tp.PILOT_ROUNDS * 2 and {t.runtime_s for t in pilot} == {0.5}
    assert outcome.trials_failed == 0
    for p in points(stored):
        assert p.samples == choice.rounds
    assert all(abs(t.samples[0].runtime_ms / 1000 - 0.5) < 0.1 for t in stored.trials)
    note, = [n for n in stored.notes if n.startswith("pilot:")]
    assert "at the run's own trial length (0.5 s)" in note


def test_fixed_rate_compares_cpu_per_io_at_equal_load(tmp_path: Path, no_leftovers: None) -> None:
    """rate_iops puts every configuration under the same load (seed 002's QoS): the IOPS match
    the rate everywhere, so CPU per I/O compares equal work; show prints it and steady state.

    Steady state stops fio early and is stored, in every trial (host and blocklayer, judged
    after a ramp from fio's status stream): paced, which any host gives however busy
    (unpaced, a file's IOPS on a loaded host swung 28 % between seconds and never settled).
    One trial per configuration (samples = 1): what is checked is each trial's."""
    body = """
[matrix]
aio = ["io_uring", "threads"]
cache = "none"
iothread = false
[workloads]
rw = "randread"
iodepth = 4
rate_iops = 400
[method]
mode = "blocklayer"
baseline = true
ramp = "1s"
samples = 1
steady_state = true
min_runtime = "5s"
max_runtime = "30s"
"""
    outcome, stored, _ = run(tmp_path, body)
    assert outcome.trials_failed == 0, [t.reason for t in stored.trials]
    assert len(stored.trials) == 3
    for trial in stored.trials:
        assert trial.status == "ok"
        assert trial.steady is not None and trial.steady.verdict is not None, trial.config_key
        steady = trial.steady.verdict
        # fio was stopped well before max_runtime, once the rule held
        assert steady.reached is True and steady.at_seconds is not None, steady
        assert 5 <= steady.at_seconds < 30, steady
        assert trial.samples[0].runtime_ms < 29_000
        assert steady.range_ratio is not None and steady.range_ratio <= 0.2
        assert steady.excursion_ratio is not None and steady.excursion_ratio <= 0.1
    from iomatrix.analysis.points import points
    found = points(stored)
    assert len(found) == 3                                   # host + two aio modes
    for p in found:
        assert p.iops == pytest.approx(400, rel=0.05)
        assert p.cpu_us_per_io is not None and p.cpu_us_per_io > 0
        assert p.steady_checked == 1 and p.steady_reached == 1
    shown = cli_result("show", "1", "--db", "r.db", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert "CPU µs/IO" in out        # each point's steady column: its one trial checked, reached
    assert len([line for line in out.splitlines() if "@400 IOPS" in line and " 1/1 " in line]) == 3
