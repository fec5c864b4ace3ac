"""A job file's ``${VAR}`` (issue 38): iomatrix writes each from the suite's [fio_vars] table
before reading the line, so fio never expands one from root's environment; a name outside the
table, a value that would break a line or expand again, and a variable that spells a refused
option are refused, in one line that says it is a safety refusal."""

from __future__ import annotations

from pathlib import Path

import pytest

from iomatrix.cli.status import ExitStatus
from iomatrix.measure.runner import SilentProgress, run_suite
from iomatrix.store import Store
from iomatrix.suite import load_suite
from tests.attacks.test_untrusted_inputs import one_line
from tests.conftest import Attack, cli_result, write_suite
from tests.fio.test_jobfile_workloads import jobfile_suite

SAFETY = "(a safety refusal)"


def plan(tmp_path: Path, jobfile: str, fio_vars: str = "") -> str:
    (tmp_path / "j.fio").write_text(jobfile)
    suite = write_suite(tmp_path, '[[workloads]]\njobfile = "j.fio"\n[method]\nmode = "host"\n'
                        + (f"[fio_vars]\n{fio_vars}" if fio_vars else ""))
    return one_line(cli_result("run", str(suite), "--plan"), ExitStatus.SUITE_INVALID)


def test_a_variable_outside_the_table_is_never_read_from_roots_environment(
        tmp_path: Path, attack: Attack, monkeypatch: pytest.MonkeyPatch) -> None:
    attack("a job file's ${VAR} reads root's environment", "refused")
    monkeypatch.setenv("IOMATRIX_PLANTED", "4k")     # what fio itself would have expanded
    refusal = plan(tmp_path, "[j]\nrw=randread\nbs=${IOMATRIX_PLANTED}\n", 'RW = "read"\n')
    assert "line 3: 'bs=${IOMATRIX_PLANTED}': ${IOMATRIX_PLANTED} is not in the suite's " \
           "[fio_vars] table" in refusal and refusal.endswith(SAFETY)
    assert plan(tmp_path, "[j]\nbs=$mb_memory\n").endswith(SAFETY)


@pytest.mark.parametrize("value", ['"4k\\nexec_prerun=/bin/sh"', '"${HOME}"', '"4k;rw=write"',
                                   '"4k exec_prerun"', '"a=b"', '""'])
def test_a_value_that_would_break_the_line_or_expand_again_is_refused(
        tmp_path: Path, attack: Attack, value: str) -> None:
    attack("a [fio_vars] value that starts a line, an option or another expansion", "refused")
    refusal = plan(tmp_path, "[j]\nbs=${BS}\n", f"BS = {value}\n")
    assert "fio_vars" in refusal and "BS" in refusal


def test_a_variable_that_spells_a_refused_option_is_refused_as_that_option(
        tmp_path: Path, attack: Attack) -> None:
    attack("a [fio_vars] value spelling exec_prerun as an option's name", "refused")
    refusal = plan(tmp_path, "[j]\n${OPT}=/bin/true\n", 'OPT = "exec_prerun"\n')
    assert "exec_prerun=/bin/true: fio option 'exec_prerun' is refused: it runs a command" \
        in refusal and refusal.endswith(SAFETY)


@pytest.mark.slow
def test_log_paths_are_never_followed_and_the_logs_stay_with_the_run(
        tmp_path: Path, attack: Attack, no_leftovers: None) -> None:
    """One real host-mode run of a job file whose log paths lead out ('../'), through a link,
    and to an absolute path: fio writes each log into the trial's own directory under the
    name iomatrix gives it, and the run keeps them; nothing appears where the job file said."""
    attack("a job file's write_*_log path: '../', a symlink, an absolute path", "harmless")
    victim = tmp_path / "victim"
    victim.write_text("untouched\n")
    suite_dir = tmp_path / "suite"
    suite_dir.mkdir()
    (suite_dir / "link").symlink_to(victim)
    outside = tmp_path / "abs"
    job = ("[j]\nrw=randread\nbs=4k\ndirect=1\n"
           "write_lat_log=../escape\nwrite_bw_log=link\n"
           f"write_iops_log={outside}\nlog_avg_msec=10\nlog_offset=1\n")
    suite_file = jobfile_suite(suite_dir, {"j.fio": job},
                               method='ramp = 0\nruntime = "1s"\nprecondition = false\n')
    with Store(tmp_path / "r.db") as store:
        run_suite(load_suite(suite_file), store, progress=SilentProgress())
        run = store.load_run(1)
    trial, = run.trials
    assert trial.status == "ok", trial.reason
    assert sorted(trial.logs) == ["workload_bw.1.log", "workload_clat.1.log", "workload_iops.1.log",
                                  "workload_lat.1.log", "workload_slat.1.log"]
    # fio's log lines: time (ms), value, direction (0: read), block size, offset (log_offset)
    entries = [line.split(", ") for line in trial.logs["workload_lat.1.log"].splitlines()]
    assert entries and all(len(e) >= 5 and e[2] == "0" and int(e[1]) > 0 for e in entries)
    times = [int(e[0]) for e in entries]
    # averaged over iomatrix's window, not the job file's 10 ms (a late window only widens it)
    assert len(times) >= 2 and all(b - a >= 200 for a, b in zip(times, times[1:]))
    assert victim.read_text() == "untouched\n"
    before = set(tmp_path.rglob("*"))
    assert not [p for p in before if "escape" in p.name or p.name.startswith("abs")
                or p.name.startswith("link_")]
    assert any("write_lat_log=../escape, write_bw_log=link" in n and "trial's own directory" in n
               for n in run.notes)
