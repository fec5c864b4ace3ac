"""A job file's ``${VAR}`` (issue 38): iomatrix writes each from the suite's [fio_vars] table
before reading the line, so fio never expands one from root's environment; a name outside the
table, a value that would break a line or expand again, and a variable that spells a refused
option are refused, in one line that says it is a safety refusal."""

from __future__ import annotations

from pathlib import Path

import pytest

from iomatrix.cli.status import ExitStatus
from tests.attacks.test_untrusted_inputs import one_line
from tests.conftest import Attack, cli_result, write_suite

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
