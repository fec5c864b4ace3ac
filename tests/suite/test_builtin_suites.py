"""The built-in suites that reproduce the five studies in seeds/, at each of their scales: they
load and expand, ``--scale full`` plans the study's own trials and hours (computed here from the
numbers each seed states), a scale is chosen by name or refused in one line, and the command
line shows the scales and what each plans."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from iomatrix.cli.status import ExitStatus
from iomatrix.core.errors import SuiteError
from iomatrix.suite import builtin_suites, expand, load_suite, load_suite_text
from iomatrix.suite.spec import RunSpec
from iomatrix.suite.plan import duration_text, estimate, estimate_seconds, measured_seconds, plan
from tests.cli.test_cli_inprocess import invoke

STUDIES = {"aio-iothreads": "000", "cache-format": "001", "controllers": "002",
           "vhost-user": "003", "native-threads": "004"}
SCALED = [(name, scale) for name in sorted(builtin_suites())
          for scale in (None, *(s.name for s in load_suite(name).scales))]
HOUR = 3600.0


def full(name: str):  # type: ignore[no-untyped-def]
    suite = load_suite(name, scale="full")
    return suite, expand(suite)


# -- every suite, every scale -------------------------------------------------------------------

def test_the_five_studies_are_built_in_with_quick_and_full_scales() -> None:
    assert set(STUDIES) | {"quick", "iothreads"} == set(builtin_suites())
    for name, seed in STUDIES.items():
        suite = load_suite(name)
        assert [s.name for s in suite.scales] == ["full", "quick"], name
        assert suite.suite.description.startswith(f"Seed {seed} "), name
        assert all(s.description for s in suite.scales), name
        text = builtin_suites()[name]
        assert text.startswith(f"# Reproduces seed {seed}:"), name
        assert "§" in text or "slide " in text, name       # the seed's sections, cited
    assert load_suite("quick").scales == ()


@pytest.mark.parametrize("name, scale", SCALED)
def test_every_builtin_suite_loads_and_expands_at_every_scale(name: str, scale: str | None) -> None:
    suite = load_suite(name, scale=scale)
    assert suite.scale == scale and suite.name == name
    for accel in ("kvm", "tcg"):
        exp = expand(suite).for_accel(accel)
        assert exp.configurations and exp.workloads, accel
        assert all(exp.workloads_for(c) for c in exp.configurations), accel
    assert suite.source_text == builtin_suites()[name]       # the text is never edited
    if scale is None:
        return
    # What a run stores (and --resume loads back): the resolved tables, loading to this suite.
    assert suite.source_path == f"builtin:{name} --scale {scale}"
    again = RunSpec.of(suite).suite(text=suite.source_text, source=suite.source_path)
    skip = {"scales", "source_path"}
    assert again.model_dump(exclude=skip) == suite.model_dump(exclude=skip)
    assert again.scale == scale and again.scales == ()


@pytest.mark.parametrize("name", sorted(STUDIES))
def test_the_default_is_iomatrix_method_on_the_study_matrix(name: str) -> None:
    own, (study, study_exp) = load_suite(name), full(name)
    method = own.method
    assert method.steady_state and method.target_ci == pytest.approx(0.02)
    assert method.samples >= 3 and method.max_samples > method.samples
    own_exp = expand(own)
    assert own_exp.workloads == study_exp.workloads
    guests = {c.key for c in own_exp.configurations if c.mode == "guest"}
    assert {c.key for c in study_exp.configurations if c.mode == "guest"} <= guests
    assert not study.method.steady_state and study.method.target_ci is None


@pytest.mark.parametrize("name", sorted(STUDIES))
def test_quick_fits_in_a_few_minutes_here(name: str) -> None:
    """This host has no usable KVM: guests run under TCG, where quick's guest part runs one
    trial. Short trials, three samples (so each gain has a confidence interval), one VM per
    configuration, a small image."""
    suite = load_suite(name, scale="quick")
    assert suite.method.runtime <= 5 and suite.method.samples == 3
    assert not suite.method.steady_state and suite.method.target_ci is None
    assert suite.target.size is not None and suite.target.size <= 1 << 30
    exp = expand(suite)
    assert {c.mode for c in exp.configurations} >= {"blocklayer", "guest"}
    guests = [c for c in exp.configurations if c.mode == "guest"]
    assert all(rule == "one" for _, rule in exp.under_tcg) and len(exp.under_tcg) == len(guests)
    tcg = exp.for_accel("tcg")
    assert sum(1 for c in tcg.configurations if c.mode == "guest") == 1
    assert estimate(tcg, suite.method).seconds < 4 * 60
    assert estimate(exp, suite.method).seconds < 10 * 60       # under KVM, every guest trial


def test_the_five_quick_scales_together_fit_in_fifteen_minutes_here() -> None:
    total = 0.0
    for name in STUDIES:
        suite = load_suite(name, scale="quick")
        total += estimate(expand(suite).for_accel("tcg"), suite.method).seconds
    assert total < 15 * 60


# -- --scale full: the study's own trials and hours -----------------------------------------------

def test_aio_iothreads_full_is_seed_000s_19_6_hours_per_configuration() -> None:
    suite, exp = full("aio-iothreads")
    block_sizes, queue_depths = 7, 8                  # .5K 4K 8K 16K 32K 64K 128K × QD 1..128
    workloads = block_sizes * queue_depths
    assert workloads == 56 == len(exp.workloads)
    ramp, runtime = 60.0, 20 * 60.0                   # "a 1-minute warmup and a 20-minute measurement"
    per_configuration = workloads * (ramp + runtime)
    assert round(per_configuration / HOUR, 1) == 19.6  # "Each suite takes 19.6 hours"
    configurations = 2 * 2                            # aio native/io_uring × IOThread on/off
    assert len(exp.configurations) == configurations
    assert all(c.mode == "guest" and c.vms == 32 for c in exp.configurations)
    assert (suite.method.vcpus, suite.method.memory) == (4, 4 << 30)
    blocks = plan(exp, suite.method.samples, 0)
    assert len(blocks) == configurations and suite.method.samples == 1
    for block in blocks:
        assert measured_seconds([block], suite.method) == per_configuration
    assert measured_seconds(blocks, suite.method) == configurations * per_configuration
    assert duration_text(measured_seconds(blocks, suite.method)) == "78.4 h"
    overhead = estimate_seconds(blocks, suite.method) - measured_seconds(blocks, suite.method)
    assert 0 < overhead < 0.002 * measured_seconds(blocks, suite.method)   # fio start-up, boots


@pytest.mark.parametrize("name, configurations, workloads, samples, seconds_each, vms", [
    # seed 001: raw/qcow2 × 5 cache modes × VirtIO SCSI/VirtIO, plus the host rows; tests 1-8
    # (4k and 4M × randwrite, randread, write, read) and §9's ioping; "jeder Test nur einmal";
    # 60 s (iomatrix's choice: the study ran each test until its file was done).
    ("cache-format", 2 * 5 * 2 + 1, 4 * 2 + 1, 1, 60.0, {1}),
    # seed 002: virtio-blk, virtio-scsi(-single) with and without an IOThread, pvscsi, sata and
    # ide without, × 3 aio modes; 3 published workloads + CPU per I/O at a fixed rate;
    # "a 10-minute I/O test", "multiple runs" (3).
    ("controllers", (3 * 2 + 3) * 3, 3 + 1, 3, 10 * 60.0, {1}),
    # seed 003: backend baseline + emulated/vhost-user-blk × 1, 2, 4, 8 VMs; sequential read and
    # write, random read, random write; one run of 600 s (the sequential jobs' runtime).
    ("vhost-user", 1 + 2 * 4, 2 + 1 + 1, 1, 600.0, {1, 2, 4, 8}),
    # seed 004: native/threads × (raw: off, falloc, full; qcow2: off, metadata, falloc, full)
    # × 1 and 16 VMs, on ext4, XFS (and btrfs); 5 jobs × 4 block sizes; pbench-fio: 5 samples,
    # 5 s ramp + 30 s.
    ("native-threads", 3 * 2 * (3 + 4) * 2, 5 * 4, 5, 5.0 + 30.0, {1, 16}),
])
def test_full_scale_plans_the_study_s_trials(name: str, configurations: int, workloads: int,
                                             samples: int, seconds_each: float, vms: set[int]) -> None:
    suite, exp = full(name)
    assert len(exp.configurations) == configurations
    assert len(exp.workloads) == workloads
    assert suite.method.samples == samples
    assert suite.method.ramp + suite.method.runtime == seconds_each
    assert {c.vms for c in exp.configurations if c.mode == "guest"} == vms
    blocks = plan(exp, suite.method.samples, 0)
    trials = configurations * workloads * samples
    assert sum(len(b.workloads) for b in blocks) == trials
    # ioping's workload (seed 001 §9) lasts its requests: ten, 1 s apart
    each = sum(w.ioping.seconds if w.ioping else seconds_each for w in exp.workloads)
    assert [w.ioping.seconds for w in exp.workloads if w.ioping] == ([10.0] if name == "cache-format" else [])
    seconds = configurations * samples * each
    assert measured_seconds(blocks, suite.method) == seconds
    est = estimate(exp, suite.method)
    assert (est.trials, est.measured_seconds, est.max_trials) == (trials, seconds, None)


def test_full_scale_figures_in_hours() -> None:
    hours = {name: round(estimate(full(name)[1], full(name)[0].method).measured_seconds / HOUR, 1)
             for name in STUDIES}
    assert hours == {"aio-iothreads": 78.4, "cache-format": 2.9, "controllers": 54.0,
                     "vhost-user": 6.0, "native-threads": 81.7}


def test_full_scale_keeps_the_study_s_baseline_choice() -> None:
    """Host rows in seeds 001 and 003; none in 000, 002 and 004."""
    with_host = {name for name in STUDIES
                 if any(c.mode == "host" for c in full(name)[1].configurations)}
    assert with_host == {"cache-format", "vhost-user"}


def test_native_threads_keeps_each_image_as_its_preallocation_left_it() -> None:
    for scale in (None, "quick", "full"):
        suite = load_suite("native-threads", scale=scale)
        assert not suite.method.precondition and not suite.method.baseline
    assert "--target" in load_suite("native-threads").suite.description


# -- choosing a scale ------------------------------------------------------------------------------

SCALED_FILE = """
[suite]
name = "mine"
[target]
directory = "/tmp/iomatrix-test"
size = "1GiB"
[matrix]
aio = ["native", "io_uring"]
[[workloads]]
bs = ["4k", "64k"]
iodepth = [1, 32]
[method]
mode = "blocklayer"
target_ci = "2%"
samples = 3
[scale.small]
description = "two trials"
[scale.small.target]
size = "64MiB"
[scale.small.matrix]
aio = "io_uring"
[scale.small.method]
target_ci = false
samples = 1
runtime = "1s"
[[scale.small.workloads]]
bs = "4k"
iodepth = [1, 32]
"""


def test_a_users_suite_may_have_scales_too(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(SCALED_FILE)
    own, small = load_suite(path), load_suite(str(path), scale="small")
    assert [s.name for s in own.scales] == ["small"] and own.scale is None
    assert (own.method.samples, own.method.target_ci, own.target.size) == (3, 0.02, 1 << 30)
    assert (small.method.samples, small.method.target_ci, small.target.size) == (1, None, 64 << 20)
    assert small.method.mode == "blocklayer" and small.method.runtime == 1.0   # kept / replaced
    assert small.matrix.aio == ("io_uring",) and small.matrix.cache == own.matrix.cache
    assert [w.key for w in expand(small).workloads] == ["randread/4k/qd1/nj1", "randread/4k/qd32/nj1"]
    assert load_suite(path, scale="default") == own


def test_a_bad_scale_name_is_one_clear_error() -> None:
    with pytest.raises(SuiteError) as info:
        load_suite("aio-iothreads", scale="huge")
    assert str(info.value) == "builtin:aio-iothreads: no scale 'huge': its scales are full, quick"
    assert "iomatrix suites aio-iothreads" in (info.value.hint or "")
    with pytest.raises(SuiteError, match="no scale 'full': it has no"):
        load_suite("quick", scale="full")
    code, captured = invoke("run", "aio-iothreads", "--scale", "huge", "--plan")
    assert code == ExitStatus.SUITE_INVALID == 3
    assert captured.stdout.getvalue() == ""
    lines = captured.stderr.getvalue().splitlines()
    assert lines[0] == "iomatrix: builtin:aio-iothreads: no scale 'huge': its scales are full, quick"
    assert len(lines) == 2 and lines[1].startswith("iomatrix: hint: ")


@pytest.mark.parametrize("scale_tables, expected", [
    ("[scale.small]\nspeed = 3\n", "[scale.small] speed: unknown key"),
    ("[scale.small.method]\nsped = 3\n", "[scale.small] [method]: unknown key 'sped'"),
    ("[scale.small.method]\nramp = 'soon'\n", "[scale.small] [method] ramp = 'soon': not a duration"),
    ("[scale.small.matrix]\naio = 'nativ'\n", "[scale.small] [matrix] aio[0] = 'nativ'"),
    ("[[scale.small.workloads]]\nrw = 'randwrit'\n", "[scale.small] [[workloads]] #1 rw[0] = 'randwrit'"),
    ("[scale.small.method]\nsamples = 20\n", "[scale.small] [method]: max_samples (10) is below samples (20)"),
    ("[scale.default]\n", "[scale.default]: 'default' names the suite's own tables"),
    ("scale = 3\n", "[scale]: write one table per scale"),
    ("[scale.'a b']\n", "[scale.a b]: a scale's name is letters"),
])
def test_scales_are_validated_like_the_rest(scale_tables: str, expected: str) -> None:
    text = SCALED_FILE.split("[scale.small]")[0]
    if scale_tables.startswith("scale ="):
        text = scale_tables + text
    else:
        text += scale_tables
    with pytest.raises(SuiteError) as info:
        load_suite_text(text, source="mine.toml")      # every scale is checked, chosen or not
    assert f"mine.toml: {expected}" in str(info.value)


def test_a_resolved_suite_is_not_scaled_again() -> None:
    with pytest.raises(SuiteError, match=r"\[suite\] scale: iomatrix writes it"):
        load_suite_text(SCALED_FILE.replace('name = "mine"', 'name = "mine"\nscale = "small"'),
                        source="mine.toml")
    with pytest.raises(SuiteError, match="scales: unknown key"):
        load_suite_text("scales = 1\n" + SCALED_FILE, source="mine.toml")


# -- the command line ------------------------------------------------------------------------------

def test_suites_name_prints_the_suite_then_its_scales_as_comments() -> None:
    code, captured = invoke("suites", "aio-iothreads")
    assert code == ExitStatus.OK and captured.stderr.getvalue() == ""
    text = captured.stdout.getvalue()
    assert text.startswith(builtin_suites()["aio-iothreads"])
    tail = text[len(builtin_suites()["aio-iothreads"]):].strip().splitlines()
    assert all(line.startswith("#") for line in tail)
    assert tail[0] == "# scales (iomatrix run aio-iothreads --scale NAME; without --scale: default):"
    shown = {line.split()[1]: line for line in tail[1::2]}
    assert set(shown) == {"default", "quick", "full"}
    assert "224 trials in 4 sessions, about 78.5 h (fio measuring 78.4 h)" in shown["full"]
    assert "up to 3360 trials" in shown["default"] and "guests under TCG: 39 trials" in shown["quick"]
    # What it prints is still a suite file, the same suite.
    again = load_suite_text(text, source="saved.toml")
    assert again.model_dump(exclude={"source_text", "source_path"}) == \
        load_suite("aio-iothreads").model_dump(exclude={"source_text", "source_path"})
    assert tomllib.loads(text)["suite"]["name"] == "aio-iothreads"


def test_suites_lists_the_scales_in_one_line_per_suite() -> None:
    code, captured = invoke("suites")
    lines = captured.out().splitlines()
    assert code == ExitStatus.OK and len(lines) == 1 + len(builtin_suites())
    for name in STUDIES:
        row = next(line for line in lines if line.split()[0] == name)
        assert "Scales: full, quick." in row


@pytest.mark.slow
def test_run_plan_prints_the_estimate_at_each_scale() -> None:
    code, captured = invoke("run", "aio-iothreads", "--plan")
    assert code == ExitStatus.OK and captured.stderr.getvalue() == ""
    out = captured.out()
    assert "1008 trials in 18 sessions" in out                     # the default, listed
    tail = out[out.index("scales (iomatrix run aio-iothreads"):].splitlines()
    rows = {line.split()[0]: line for line in tail[1::2]}
    assert set(rows) == {"default", "quick", "full"}
    assert "1008 trials in 18 sessions, up to" in rows["default"]
    assert "224 trials in 4 sessions, about 78.5 h" in rows["full"]
    assert "84 trials in 21 sessions" in rows["quick"]


def test_run_scale_plan_prints_that_scale_only() -> None:
    code, captured = invoke("run", "aio-iothreads", "--scale", "full", "--plan")
    assert code == ExitStatus.OK
    out = captured.out()
    assert "224 trials in 4 sessions (128 VM boots, 0 daemon starts), about 78.5 h" in out
    assert "scale full: The study's method" in out and "scales (" not in out
    assert out.count("boot 32 VM(s)") == 4


def test_scale_goes_with_a_new_run_not_a_resumed_one(capsys: pytest.CaptureFixture[str]) -> None:
    code, _ = invoke("run", "--resume", "1", "--scale", "full")
    assert code == ExitStatus.USAGE
    assert "a resumed run keeps the scale it was started at" in capsys.readouterr().err
