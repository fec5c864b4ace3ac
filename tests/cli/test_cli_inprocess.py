"""The command line run in this process: a test installs an ``Environment`` whose consoles write to
buffers, runs a command through ``main`` (or Typer's CliRunner) and reads exactly what it printed
to stdout and to stderr, with its exit status."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from iomatrix import __version__
from iomatrix.cli.app import app, main
from iomatrix.cli.common import Environment, Terminal, environment, use_environment
from iomatrix.cli.status import ExitStatus
from iomatrix.store import Store
from iomatrix.suite import builtin_suites
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.workloads import Workload
from iomatrix.testing.synthetic import NOTE, Figures, configurations, write_run

QD1 = Workload(rw="randread", bs=4096, iodepth=1)


class Captured:
    """An environment printing into two buffers, 200 columns wide and without colour."""

    def __init__(self) -> None:
        self.stdout, self.stderr = io.StringIO(), io.StringIO()
        self.env = Environment(
            stdout=Terminal(file=self.stdout, width=200, highlight=False, color_system=None),
            stderr=Terminal(file=self.stderr, width=200, highlight=False, soft_wrap=True,
                            color_system=None))

    def out(self) -> str:
        """What was printed on stdout, trailing blanks of table rows removed."""
        return "".join(line.rstrip() + "\n" for line in self.stdout.getvalue().splitlines())


def invoke(*args: str) -> tuple[int, Captured]:
    """Run ``iomatrix ARGS`` through ``main``: its exit status and what it printed."""
    captured = Captured()
    with use_environment(captured.env), pytest.raises(SystemExit) as exit_:
        main(list(args))
    code = exit_.value.code
    return (code if isinstance(code, int) else 0 if code is None else 1), captured


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """A store holding run 1: two emulated guest configurations, one workload, three samples
    each, native at 1990/2000/2010 IOPS and io_uring at 990/1000/1010."""
    configs = configurations("guest", {"controller": ["virtio-blk"], "aio": ["native", "io_uring"],
                                       "iothread": [True], "cache": ["none"], "format": ["raw"]})

    def figures(config: Configuration, workload: Workload, index: int) -> Figures:
        iops = (2000.0 if config.aio == "native" else 1000.0) + 10 * (index - 1)
        return Figures(iops=iops, bw_bytes=4_096_000, lat_mean_ns=1e6, p99_ns=2e6)

    path = tmp_path / "r.db"
    with Store(path) as store:
        write_run(store, configs, [QD1], figures, samples=3, accelerator="tcg")
    return path


def test_suites_lists_the_builtin_suites() -> None:
    code, captured = invoke("suites")
    assert code == ExitStatus.OK
    lines = captured.out().splitlines()
    assert lines[0].split() == ["suite", "mode", "description"]
    assert [line.split()[0] for line in lines[1:]] == list(builtin_suites())
    assert re.search(r"^ quick +blocklayer \+ host baseline +Host baseline", captured.out(), re.M)
    assert captured.stderr.getvalue() == ""


def test_suites_prints_one_suite_as_it_is_stored() -> None:
    code, captured = invoke("suites", "quick")
    assert code == ExitStatus.OK
    assert captured.stdout.getvalue() == builtin_suites()["quick"] + "\n"


def test_show_prints_the_points_of_a_stored_run(db: Path) -> None:
    code, captured = invoke("show", "1", "--db", str(db))
    assert code == ExitStatus.OK, captured.stderr.getvalue()
    text = re.sub(r"complete · \S+ ·", "complete · CREATED ·", captured.out())
    # ±95 % CI by hand: sd 10 over 3 samples, t(0.975, 2) = 4.303: 4.303 · 10 / √3 = 24.8 IOPS.
    assert text == (
        "run 1 · suite synthetic · complete · CREATED · synthetic · target synthetic (none)\n"
        "EMULATED (TCG): guest figures measure QEMU's CPU emulator, not this hardware\n"
        " configuration                                           workload         n   IOPS  ±95% CI  MiB/s  lat mean µs  lat p50 µs  lat p99 µs  CPU µs/IO  steady\n"
        " guest virtio-blk/native/none/raw iothread [emulated]    4k randread QD1  3  2,000    ±1.2%   3.91        1,000       1,000       2,000          —       —\n"
        " guest virtio-blk/io_uring/none/raw iothread [emulated]  4k randread QD1  3  1,000    ±2.5%   3.91        1,000       1,000       2,000          —       —\n"
        "latency columns (µs): total latency (fio's lat: submission + completion)\n"
        f"note: {NOTE}\n")
    assert captured.stderr.getvalue() == ""


def test_export_writes_the_raw_text_to_the_environment(db: Path) -> None:
    code, captured = invoke("export", "1", "--db", str(db))
    assert code == ExitStatus.OK
    rows = captured.stdout.getvalue().splitlines()
    assert rows[0].startswith("run,configuration,mode,")
    assert len(rows) == 1 + 2 * 3
    assert sorted(float(r.split(",")[rows[0].split(",").index("iops")]) for r in rows[1:]) == \
        [990.0, 1000.0, 1010.0, 1990.0, 2000.0, 2010.0]


def test_a_missing_run_is_one_line_and_its_hint_on_stderr(db: Path) -> None:
    code, captured = invoke("show", "9", "--db", str(db))
    assert code == ExitStatus.NOT_FOUND
    assert captured.stdout.getvalue() == ""
    assert captured.stderr.getvalue() == (f"iomatrix: {db}: no run 9\n"
                                          "iomatrix: hint: list the stored runs with `iomatrix runs`\n")


def test_a_missing_database_is_a_store_error(tmp_path: Path) -> None:
    code, captured = invoke("runs", "--db", str(tmp_path / "none.db"))
    assert code == ExitStatus.STORE
    assert captured.stderr.getvalue() == (f"iomatrix: {tmp_path / 'none.db'}: no results database here\n"
                                          "iomatrix: hint: run a suite first, or pass --db\n")
    assert not (tmp_path / "none.db").exists()


def test_a_bad_option_value_is_a_usage_error(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Typer reports bad command lines itself, on the process's stderr, before a command runs.
    code, captured = invoke("export", "1", "--db", str(db), "--format", "xml")
    assert code == ExitStatus.USAGE
    assert captured.stdout.getvalue() == captured.stderr.getvalue() == ""
    assert "'xml': choose csv or json" in capsys.readouterr().err


def test_version() -> None:
    code, captured = invoke("--version")
    assert (code, captured.stdout.getvalue()) == (ExitStatus.OK, f"iomatrix {__version__}\n")


def test_clirunner_reaches_the_environment_too() -> None:
    captured = Captured()
    with use_environment(captured.env):
        result = CliRunner().invoke(app, ["suites"])
    assert result.exit_code == 0
    assert result.stdout == ""
    assert captured.out().split()[:2] == ["suite", "mode"]


def test_the_environment_is_restored_after_the_block() -> None:
    before = environment()
    with use_environment(Captured().env) as env:
        assert environment() is env
    assert environment() is before
