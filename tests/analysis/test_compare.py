"""Comparing two runs: synthetic runs with known differences in a real store, through the library
and the command line, and two real host-mode runs compared end to end."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from iomatrix.analysis.crossrun import compare_runs, method_differences
from iomatrix.cli.status import ExitStatus
from iomatrix.core.errors import AnalysisError
from iomatrix.store.records import StoredRun, StoredSuite
from iomatrix.store import Store
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.workloads import Workload
from iomatrix.testing.synthetic import Figures, configurations, write_run
from tests.conftest import cli_result, write_suite

CONFIGS = configurations("blocklayer", {"aio": ["native", "threads"], "cache": ["none"],
                                        "format": ["raw"]})
WORKLOADS = [Workload(rw="randread", bs=4096, iodepth=1), Workload(rw="randread", bs=4096, iodepth=32)]
HOST = {"hostname": "alpha", "kernel": "6.1.0-18-amd64", "qemu": "7.2.9", "fio": "fio-3.33",
        "target": "/var/tmp/iomatrix", "target_fs": "ext4"}
LOW_NOISE = (0.99, 1.0, 1.01)
HIGH_NOISE = (0.9, 1.0, 1.1)


def figures(native_speedup: float = 1.0, *, shift: int = 0,
            noise: tuple[float, ...] = LOW_NOISE) -> Callable[[Configuration, Workload, int], Figures]:
    """aio=native: low noise, scaled by ``native_speedup``; aio=threads: ±10 % noise, no change
    (``shift`` reorders the noise so the two runs' samples are not identical)."""
    def make(config: Configuration, workload: Workload, index: int) -> Figures:
        if config.aio == "native":
            iops = 10_000 * workload.iodepth ** 0.5 * noise[index % len(noise)] * native_speedup
        else:
            iops = 10_000 * workload.iodepth ** 0.5 * HIGH_NOISE[(index + shift) % 3]
        lat = 1e9 * workload.iodepth / iops
        return Figures(iops, iops * 4096, lat, 2 * lat)
    return make


def two_runs(db: Path, b_figures: Callable[[Configuration, Workload, int], Figures], *,
             b_host: Mapping[str, str] = HOST, b_workloads: list[Workload] = WORKLOADS,
             b_configs: list[Configuration] = CONFIGS, samples: int = 3,
             b_accelerator: str = "none") -> tuple[StoredRun, StoredRun]:
    with Store(db) as store:
        a = write_run(store, CONFIGS, WORKLOADS, figures(), samples=samples, host=HOST)
        b = write_run(store, b_configs, b_workloads, b_figures, samples=samples, host=b_host,
                      accelerator=b_accelerator)
        return store.load_run(a), store.load_run(b)



def test_faster_with_low_noise_is_significant_equal_with_noise_is_not(tmp_path: Path) -> None:
    a, b = two_runs(tmp_path / "r.db", figures(1.10, shift=1))
    result = compare_runs(a, b)
    by_config = {(p.config_label, p.workload_label): p for p in result.points}
    assert len(result.points) == 4
    for workload in ("4k randread QD1", "4k randread QD32"):
        fast = by_config[("blocklayer native/none/raw", workload)]
        assert fast.change == pytest.approx(0.10)
        assert fast.comparison.low < 0.10 < fast.comparison.high
        assert fast.outcome == "better" and fast.verdict == "significantly better"
        assert fast.comparison.adjustment == "holm" and fast.comparison.family == 4
        assert fast.comparison.adjusted_p >= fast.comparison.p_value
        same = by_config[("blocklayer threads/none/raw", workload)]
        assert same.change == pytest.approx(0.0, abs=1e-12)
        assert same.outcome == "no difference" and same.verdict == "no significant difference"
        assert same.a.n == same.b.n == 3 and same.a.ci.relative > 0.2
    s = result.summary
    assert (s.better, s.worse, s.no_difference, s.not_judged, s.family) == (2, 0, 2, 0, 4)
    assert result.host_differences == () and result.only_a == result.only_b == ()


def test_latency_lower_is_better_and_slower_is_worse(tmp_path: Path) -> None:
    a, b = two_runs(tmp_path / "r.db", figures(0.8, shift=1))
    iops = compare_runs(a, b, metric="iops")
    p99 = compare_runs(a, b, metric="lat_p99_ns")
    native = [p for p in iops.points if "native" in p.config_label]
    assert {p.outcome for p in native} == {"worse"} and iops.summary.worse == 2
    # 0.8× the IOPS at a fixed queue depth is 1/0.8 = 1.25× the latency: worse again
    native = [p for p in p99.points if "native" in p.config_label]
    assert {p.outcome for p in native} == {"worse"}
    assert all(p.change == pytest.approx(0.25) for p in native)
    assert not p99.higher_is_better
    with pytest.raises(ValueError, match="not a metric"):
        compare_runs(a, b, metric="throughput")


def test_different_workloads_are_refused_with_the_differences_named(tmp_path: Path) -> None:
    other = [WORKLOADS[0], Workload(rw="randwrite", bs=65536, iodepth=8)]
    a, b = two_runs(tmp_path / "r.db", figures(), b_workloads=other)
    with pytest.raises(AnalysisError) as refused:
        compare_runs(a, b)
    assert str(refused.value) == ("runs 1 and 2 measured different workloads: "
                                  "only run 1 has 4k randread QD32; only run 2 has 64k randwrite QD8")
    proc = cli_result("compare", "1", "2", "--db", "r.db", cwd=tmp_path, check=ExitStatus.USAGE)
    assert proc.stdout == ""
    assert proc.stderr.splitlines()[0] == f"iomatrix: {refused.value}"
    assert "Traceback" not in proc.stderr


def test_host_differences_warn_on_stderr_and_still_compare(tmp_path: Path) -> None:
    upgraded = {**HOST, "kernel": "6.1.0-21-amd64", "qemu": "8.2.2"}
    two_runs(tmp_path / "r.db", figures(1.1, shift=1), b_host=upgraded)
    proc = cli_result("compare", "1", "2", "--db", "r.db", cwd=tmp_path, check=0)
    assert proc.stderr.splitlines() == [
        "warning: host kernel differs: A 6.1.0-18-amd64 · B 6.1.0-21-amd64",
        "warning: host qemu differs: A 7.2.9 · B 8.2.2",
    ]
    assert "2 significantly better in B, 0 significantly worse, 2 no significant difference" in proc.stdout


def test_cli_whole_output(tmp_path: Path) -> None:
    two_runs(tmp_path / "r.db", figures(1.1, shift=1))
    proc = cli_result("compare", "1", "last", "--db", "r.db", cwd=tmp_path, check=0)
    assert proc.stderr == ""
    text = re.sub(r"\d{4}-\d\d-\d\dT[\d:.+]+", "TIME", proc.stdout)
    lines = [line.rstrip() for line in text.splitlines()]
    assert lines == [
        "A: run 1 (r.db) · suite synthetic · complete · TIME · alpha · target /var/tmp/iomatrix (ext4)",
        "B: run 2 (r.db) · suite synthetic · complete · TIME · alpha · target /var/tmp/iomatrix (ext4)",
        " configuration                workload                 A IOPS         B IOPS  change  95% CI of change  adj. p  verdict",
        " blocklayer native/none/raw   4k randread QD1    10,000 ±2.5%   11,000 ±2.5%  +10.0%    +7.5% … +12.5%   0.001  significantly better",
        " blocklayer native/none/raw   4k randread QD32   56,569 ±2.5%   62,225 ±2.5%  +10.0%    +7.5% … +12.5%   0.001  significantly better",
        " blocklayer threads/none/raw  4k randread QD1   10,000 ±24.8%  10,000 ±24.8%   +0.0%   -20.5% … +25.8%   1.000  no significant difference",
        " blocklayer threads/none/raw  4k randread QD32  56,569 ±24.8%  56,569 ±24.8%   +0.0%   -20.5% … +25.8%   1.000  no significant difference",
        "4 points: 2 significantly better in B, 0 significantly worse, 2 no significant difference "
        "(higher IOPS is better; p Holm-adjusted across 4 comparisons)",
        "p-values treat each run's samples as independent draws of one quantity; what a whole run "
        "shares (file layout, cache state, background load) is not in them: repeat a run to see "
        "how far two runs of the same setup differ",
    ]


def test_single_samples_show_the_change_but_no_verdict(tmp_path: Path) -> None:
    a, b = two_runs(tmp_path / "r.db", figures(1.2), samples=1)
    result = compare_runs(a, b)
    native = next(p for p in result.points if "native" in p.config_label)
    assert native.change == pytest.approx(0.2)
    assert native.outcome == "not judged" and native.comparison.p_value is None
    assert native.verdict == "significance cannot be judged (n=1 vs n=1; needs at least 2 each)"
    assert result.summary.not_judged == 4 and result.summary.family == 0
    out = cli_result("compare", "1", "2", "--db", "r.db", "--metric", "bw", cwd=tmp_path, check=0).stdout
    row = next(line for line in out.splitlines() if "native/none/raw   4k randread QD1 " in line)
    assert re.search(r"38\.7 \(n=1\) +46\.4 \(n=1\)", row)
    assert "+20.0%" in row and "significance cannot be judged" in row
    assert "4 not judged (fewer than 2 samples a side)" in out


def test_unmatched_configurations_are_listed(tmp_path: Path) -> None:
    more = CONFIGS[:1] + configurations("blocklayer", {"aio": ["io_uring"], "cache": ["none"],
                                                       "format": ["raw"]})
    a, b = two_runs(tmp_path / "r.db", figures(), b_configs=more)
    result = compare_runs(a, b)
    assert result.only_a == ("blocklayer threads/none/raw",)
    assert result.only_b == ("blocklayer io_uring/none/raw",)
    assert {p.config_label for p in result.points} == {"blocklayer native/none/raw"}
    # a point one run never measured (an interrupted run) is listed, not compared
    partial = b.model_copy(update={"trials": tuple(t for t in b.trials
                                                   if not t.workload_key.startswith("randread/4k/qd32"))})
    result = compare_runs(a, partial)
    assert [(u.config_label, u.workload_label, u.measured_in) for u in result.unpaired] == [
        ("blocklayer native/none/raw", "4k randread QD32", "a")]
    out = cli_result("compare", "1", "2", "--db", "r.db", cwd=tmp_path, check=0).stdout
    assert "only in A (run 1), not compared: blocklayer threads/none/raw" in out
    assert "only in B (run 2), not compared: blocklayer io_uring/none/raw" in out


def with_text(run: StoredRun, text: str) -> StoredRun:
    return run.model_copy(update={"suite": StoredSuite(name=run.suite.name, source=run.suite.source,
                                                       text=text)})


def test_method_differences_are_named(tmp_path: Path) -> None:
    a, b = two_runs(tmp_path / "r.db", figures())
    a = with_text(a, '[method]\nruntime = "1s"\nramp = "200ms"\n')
    b = with_text(b, '[method]\nruntime = "20m"\nramp = "200ms"\n'
                     'engine = "io_uring"\nsamples = 5\n')
    assert [(d.key, d.a, d.b) for d in method_differences(a, b)] == [
        ("runtime", "1s", "1200s"), ("engine", "libaio", "io_uring")]
    assert method_differences(a, with_text(a, "not toml [")) == ()


def test_emulated_runs_are_said_prominently_and_mixing_is_warned(tmp_path: Path) -> None:
    guests = configurations("guest", {"controller": ["virtio-blk"], "aio": ["io_uring"],
                                      "cache": ["none"], "format": ["raw"], "iothread": [True]})
    with Store(tmp_path / "r.db") as store:
        write_run(store, guests, WORKLOADS, figures(), host=HOST, accelerator="kvm")
        write_run(store, guests, WORKLOADS, figures(0.1), host=HOST, accelerator="tcg")
        a, b = store.load_run(1), store.load_run(2)
    result = compare_runs(a, b)
    assert (result.emulated_a, result.emulated_b, result.mixed_emulation) == (False, True, True)
    assert all(not p.a.emulated and p.b.emulated for p in result.points)
    proc = cli_result("compare", "1", "2", "--db", "r.db", cwd=tmp_path, check=0)
    assert ("EMULATED (TCG): run B's guest figures measure QEMU's CPU emulator, not the hardware"
            in proc.stdout)
    assert "run A's" not in proc.stdout
    assert "[emulated in B]" in proc.stdout
    assert proc.stderr.startswith("warning: this comparison mixes emulated (TCG) and native figures")


def test_run_b_from_another_database(tmp_path: Path) -> None:
    with Store(tmp_path / "a.db") as store:
        write_run(store, CONFIGS, WORKLOADS, figures(), host=HOST)
        write_run(store, CONFIGS, WORKLOADS, figures(), host=HOST)
    with Store(tmp_path / "b.db") as store:
        write_run(store, CONFIGS, WORKLOADS, figures(1.1, shift=1), host={**HOST, "hostname": "beta"})
    proc = cli_result("compare", "2", "last", "--db", "a.db", "--db-b", "b.db", cwd=tmp_path, check=0)
    assert proc.stdout.splitlines()[1].startswith("B: run 1 (b.db) · suite synthetic")
    assert proc.stderr == "warning: host hostname differs: A alpha · B beta\n"
    assert "2 significantly better in B" in proc.stdout
    proc = cli_result("compare", "1", "2", "--db", "a.db", "--db-b", "b.db", cwd=tmp_path,
               check=ExitStatus.NOT_FOUND)
    assert "b.db: no run 2" in proc.stderr
    proc = cli_result("compare", "1", "1", "--db", "a.db", "--metric", "speed", cwd=tmp_path,
               check=ExitStatus.USAGE)
    assert "choose iops, bw, lat or p99" in proc.stderr


HOST_SUITE = """
[workloads]
rw = "randread"
iodepth = [1, 8]
[method]
mode = "host"
ramp = 0
runtime = "500ms"
samples = 2
"""


@pytest.mark.slow
def test_two_real_host_runs_compared_end_to_end(tmp_path: Path, no_leftovers: None) -> None:
    suite = write_suite(tmp_path, HOST_SUITE, size="16MiB")
    cli_result("run", str(suite), "--db", "a.db", cwd=tmp_path, timeout=300, own_process=True, check=0)
    cli_result("run", str(suite), "--db", "b.db", cwd=tmp_path, timeout=300, own_process=True, check=0)
    proc = cli_result("compare", "last", "last", "--db", "a.db", "--db-b", "b.db", cwd=tmp_path, check=0)
    assert proc.stderr == ""   # same host, same target: nothing differs but the figures
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("A: run 1 (a.db) · suite t · complete")
    assert lines[1].startswith("B: run 1 (b.db) · suite t · complete")
    rows = [line for line in lines if line.startswith(" host (bare metal)")]
    assert len(rows) == 2 and "4k randread QD1 " in rows[0] and "4k randread QD8 " in rows[1]
    for row in rows:
        # two samples a side: Fieller's interval may be unbounded if A's two differ by > ~15 %
        assert re.search(r"[+-]\d+\.\d% +([+-]\d+\.\d% … [+-]\d+\.\d%|unbounded)", row), row
        assert row.rstrip().endswith(("no significant difference", "significantly better",
                                      "significantly worse"))
    assert re.search(r"^2 points: .*p Holm-adjusted across 2 comparisons\)$", proc.stdout, re.M)
