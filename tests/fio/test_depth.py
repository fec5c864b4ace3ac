"""The queue depth fio achieved beside the asked one (iomatrix.fio.depth), from a real fio run:
a synchronous engine never queues more than one I/O (flagged short), libaio on an O_DIRECT file
keeps the asked depth (not flagged)."""

from __future__ import annotations

from pathlib import Path

import pytest

from iomatrix.fio.depth import SHORT_RULE, depth_record
from iomatrix.fio.run import run_fio
from tests.conftest import accepts_direct_io
from tests.needs import needs


@needs("fio")
def test_a_synchronous_engine_is_short_of_its_depth_and_a_queueing_one_is_not(
        tmp_path: Path) -> None:
    if not accepts_direct_io(tmp_path):
        pytest.skip(f"{tmp_path}'s filesystem refuses O_DIRECT: libaio would not queue")
    asked = 16
    common = f"rw=randread\nbs=4k\niodepth={asked}\ntime_based=1\nruntime=1\nsize=1m\n"
    job = (f"[sync]\nioengine=psync\nfilename={tmp_path / 'f'}\n{common}"
           f"[queued]\nioengine=libaio\ndirect=1\nfilename={tmp_path / 'q'}\n{common}")
    jobs = {j.name: j for j in run_fio(job, workdir=tmp_path, timeout=60).result.jobs}
    sync, queued = (depth_record([jobs[name]], asked) for name in ("sync", "queued"))
    assert sync.achieved == 1 and sync.short and SHORT_RULE in sync.text
    assert queued.achieved is not None and asked / 2 <= queued.achieved <= asked
    assert not queued.short and "short" not in queued.text
    assert depth_record([], asked).achieved is None          # no levels: unknown, not flagged


@needs("fio")
def test_a_run_stores_the_achieved_depth_beside_the_asked_one_and_says_when_short(
        tmp_path: Path) -> None:
    """A real host-mode run with the psync engine at QD16: its trial is ok, stored with the
    depth fio achieved (1) beside the asked one, flagged short, and its progress line says so."""
    from iomatrix.store import Store
    from tests.conftest import cli, write_suite

    suite = write_suite(tmp_path, '[method]\nmode = "host"\nruntime = "1s"\nramp = "0s"\n'
                        'engine = "psync"\nprecondition = false\n'
                        '[workloads]\nrw = ["randread"]\nbs = ["4KiB"]\niodepth = [16]\n')
    status, output = cli("run", str(suite), cwd=tmp_path)
    assert status == 0, output
    assert "QD asked 16, achieved 1.0 (short: " in output
    with Store(tmp_path / "iomatrix.db") as store:
        (trial,) = store.load_run(1).trials
    assert trial.status == "ok" and trial.depth is not None
    assert (trial.depth.asked, trial.depth.achieved, trial.depth.short) == (16, 1.0, True)
    status, shown = cli("show", "1", cwd=tmp_path)              # marked, with what it achieved
    assert status == 0, shown
    assert "[QD short]: a trial's achieved depth" in shown and "asked 16, achieved 1.0" in shown
    assert sum("[QD short]" in line for line in shown.splitlines()) == 2     # legend and point
