"""What a careless or hostile local user could do to a run or its outputs, reproduced."""

from __future__ import annotations

import io
import os
import stat

import pytest
from rich.console import Console

from iomatrix.cli.progress import TerminalProgress
from iomatrix.core.errors import OutputRefused
from iomatrix.core.files import write_file_atomically
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.workloads import Workload


def test_a_planted_symlink_is_refused_not_written_through(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    out = tmp_path / "report"
    out.mkdir()
    (out / "index.html").symlink_to(victim)
    (out / "index.html.tmp").symlink_to(victim)   # the name the old writer used
    with pytest.raises(OutputRefused, match="index.html: a symbolic link, where iomatrix writes "
                                            "only a regular file"):
        write_file_atomically(out / "index.html", "<!DOCTYPE html>")
    assert victim.read_text() == "precious"
    assert (out / "index.html").is_symlink()
    assert sorted(p.name for p in out.iterdir()) == ["index.html", "index.html.tmp"]
    os.unlink(out / "index.html")                  # a name free again is written
    write_file_atomically(out / "index.html", "<!DOCTYPE html>")
    assert (out / "index.html").read_text() == "<!DOCTYPE html>"
    assert victim.read_text() == "precious"


def test_an_atomic_write_has_the_usual_mode_and_leaves_nothing_on_failure(tmp_path):
    path = tmp_path / "out.csv"
    old = os.umask(0o027)
    try:
        write_file_atomically(path, "a,b\n")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    try:
        write_file_atomically(path, "\ud800")   # cannot be encoded: the write fails midway
    except UnicodeEncodeError:
        pass
    assert path.read_text() == "a,b\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.csv"]


def test_a_failure_reason_with_brackets_is_printed_as_text():
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=200)
    config = Configuration(mode="host")
    workload = Workload(rw="randread", bs=4096, iodepth=1)
    with TerminalProgress(console) as progress:
        progress.start(1, 1.0)
        progress.trial_started(1, config, workload, 0)
        progress.trial_finished(1, False, "fio said [/x] and [bold]not bold[/bold]")
    assert "fio said [/x] and [bold]not bold[/bold]" in buffer.getvalue()
