"""Stalled trials through the commands that read a stored run: ``compare`` counts them per
configuration in each run and says where one run stalls and the other does not; ``findings``,
``compare`` (two runs or a fleet) and ``scores`` leave them out of figures unless ``--with-stalled``; ``export``
writes every trial with its stall columns. Two synthetic runs in a real store."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from iomatrix.analysis.stalls import contrast
from iomatrix.fio.persecond import STALL_S
from iomatrix.report.fleet import build_fleet_data
from iomatrix.store import Store
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.workloads import Workload
from iomatrix.testing.synthetic import Figures, configurations, write_run
from tests.conftest import cli_result

CONFIGS = configurations("blocklayer", {"aio": ["native", "threads"], "cache": ["none"],
                                        "format": ["raw"]})
WORKLOADS = [Workload(rw="randread", bs=4096, iodepth=1)]
HELD_S = STALL_S * 2.5
CLEAN_S = STALL_S / 10


def _figures(stalls_in: str):  # type: ignore[no-untyped-def]
    """The ``stalls_in`` configuration's (aio) first trial stalled, at a tenth of the IOPS of
    the others; every trial judged."""
    def make(config: Configuration, workload: Workload, index: int) -> Figures:
        held = config.aio == stalls_in and index == 0
        iops = (1_000.0 if held else 10_000.0) * (1 + index / 100)
        return Figures(iops, iops * 4096, 1e9 / iops, 2e9 / iops,
                       stall_s=HELD_S if held else CLEAN_S)
    return make


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("stalls") / "r.db"
    with Store(path) as store:
        write_run(store, CONFIGS, WORKLOADS, _figures("native"))
        write_run(store, CONFIGS, WORKLOADS, _figures("threads"))
        write_run(store, CONFIGS, WORKLOADS, _figures("none"), host={"hostname": "clean"})
    return path


def _run(*args: str) -> str:
    done = cli_result(*args, check=0)
    return done.stdout + done.stderr


def test_compare_shows_where_one_run_stalls_and_the_other_not(db: Path) -> None:
    with Store(db) as store:
        a, b = store.load_run(1), store.load_run(2)
    native, threads = (c.key for c in a.configs)
    found = contrast(a, b, [(native, native), (threads, threads)])
    assert [(s.a.label if s.a else None, s.where) for s in found] == [
        ("blocklayer native/none/raw", "A only"), ("blocklayer threads/none/raw", "B only")]
    assert [(s.a.stalled, s.a.trials, s.b.stalled, s.b.trials) for s in found
            if s.a and s.b] == [(1, 3, 0, 3), (0, 3, 1, 3)]
    # a configuration B lacks: its A side beside "not measured"
    (alone,) = contrast(a, b, [(threads, threads)])[:1]
    assert alone.b is None and "B: not measured" in alone.text
    text = _run("compare", "1", "2", "--db", str(db))
    assert (f"stalls: blocklayer native/none/raw: stalls in A only · A: 1 of 3 stalled (longest "
            f"{HELD_S:.1f} s without a completion) · B: 0 of 3 stalled") in text, text
    assert ("stalls: blocklayer threads/none/raw: stalls in B only · A: 0 of 3 stalled · B: 1 of "
            "3 stalled") in text, text
    # the stalled trials are out of the figures (A's native mean is the two clean trials'),
    # in them with --with-stalled
    kept = _run("compare", "1", "2", "--db", str(db), "--with-stalled")
    assert "10,150" in text and "10,150" not in kept, (text, kept)
    # each point with a stalled trial is tagged with the run it stalled in
    rows = {line.split()[1]: line for line in text.splitlines() if line.startswith(" blocklayer")}
    assert "[stalled in A]" in rows["native/none/raw"] and "[stalled in B]" in rows[
        "threads/none/raw"] and "[stalled in B]" not in rows["native/none/raw"], rows
    assert "(here they are in: --with-stalled)" in kept and "here they are in" not in text
    # a fleet: each run's configurations that stalled, by node
    fleet = [line for line in _run("compare", "3", "1", "2", "--db", str(db)).splitlines()
             if line.startswith("stalls: ")]
    assert fleet == [f"stalls: synthetic (run {run}): blocklayer {aio}/none/raw: 1 of 3 checked "
                     f"trials stalled (longest {HELD_S:.1f} s without a completion)"
                     for run, aio in ((1, "native"), (2, "threads"))]
    # the fleet page says the same (its notes), from the same runs
    with Store(db) as store:
        runs = [store.load_run(r) for r in (3, 1, 2)]
    assert list(build_fleet_data(runs).notes[:2]) == fleet


def test_findings_and_scores_take_with_stalled(db: Path) -> None:
    line = (f"stalled: blocklayer native/none/raw: 1 of 3 checked trials stalled (longest "
            f"{HELD_S:.1f} s without a completion)")
    out = _run("findings", "1", "--db", str(db))
    assert f"{line} (out of the figures)" in out, out
    assert f"{line} (in the figures: --with-stalled)" in _run("findings", "1", "--db", str(db),
                                                               "--with-stalled")
    plain = _run("scores", "1", "--db", str(db), "--metrics", "iops")
    kept = _run("scores", "1", "--db", str(db), "--metrics", "iops", "--with-stalled")
    assert "10,150" in plain and "10,150" not in kept, (plain, kept)


def test_recommend_warns_of_each_configuration_that_stalled(db: Path) -> None:
    """Above the verdict (wrapped to the terminal: read as words)."""
    text = " ".join(_run("recommend", "1", "--db", str(db), "--for", "qemu").split())
    assert text.count("stalled: ") == 1, text
    assert ("⚠ stalled: blocklayer native/none/raw: 1 of 3 checked trials stalled (longest "
            f"{HELD_S:.1f} s without a completion); its stalled trials are no evidence here "
            "(--with-stalled keeps them)") in text, text
    kept = " ".join(_run("recommend", "1", "--db", str(db), "--for", "qemu",
                         "--with-stalled").split())
    assert "its stalled trials are in the evidence (--with-stalled)" in kept, kept


def test_export_writes_every_trial_with_its_stall(db: Path) -> None:
    rows = list(csv.DictReader(io.StringIO(_run("export", "1", "--db", str(db)))))
    assert len(rows) == 6                       # the stalled trial too
    held = [r for r in rows if r["stalled"] == "True"]
    assert [(r["aio"], r["sample"], float(r["stalled_s"]), float(r["stall_longest_s"]))
            for r in held] == [("native", "0", HELD_S, HELD_S)]
    assert {(r["stalled"], float(r["stalled_s"]), float(r["stall_longest_s"]))
            for r in rows if r not in held} == {("False", 0.0, CLEAN_S)}
    exported = json.loads(_run("export", "1", "--db", str(db), "--format", "json"))
    stalls = [t["stall"] for t in exported["trials"] if t["stall"]["stalls"]]
    assert stalls == [{"checked": True, "source": "fio's IOPS log", "reason": None,
                       "longest_s": HELD_S, "stalls": 1, "stalled_s": HELD_S}]
