"""A run's spec (``iomatrix.suite.spec``): the suite resolved once, stored as JSON beside the
user's untouched text (schema 12), and loaded back into the same suite; a run stored before it
gets its spec from its text; a stored spec gains no authority the text's author lacked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from iomatrix.core.errors import SuiteError
from iomatrix.core.trust import ANYONE, Author
from iomatrix.measure.prepare import PreparedRun, for_command_line, prepare, resumed_suite
from iomatrix.store import Store
from iomatrix.store.records import Part, StoredSuite
from iomatrix.store.rows import PlanChoice
from iomatrix.store.schema import SCHEMA_VERSION
from iomatrix.suite import load_suite
from iomatrix.suite.load import load_suite_text, suite_of_tables, tables_text
from iomatrix.suite.spec import RunSpec
from tests.conftest import Backend

SUITE = """\
# my suite: comments, blank lines and odd spacing stay as I wrote them
[suite]
name   = "mine"   # trailing comment

[target]
directory = "{target}"
size = "64M"

[matrix]
aio = ["native", "io_uring"]

[[workloads]]
jobfile = "job.fio"

[method]
mode = "blocklayer"
runtime = 2

[scale.small]
description = "shorter"
[scale.small.method]
runtime = 1
"""
JOB = "[job]\nrw=randread\nbs=4k\niodepth=4\n"


def _suite_file(tmp_path: Path) -> Path:
    (tmp_path / "job.fio").write_text(JOB)
    path = tmp_path / "s.toml"
    path.write_bytes(SUITE.format(target=tmp_path / "t").encode())
    return path


def _store(store: Store, suite: StoredSuite, prepared: PreparedRun) -> int:
    return store.create_run(suite=suite, host={"hostname": "h"}, accelerator="none", notes=[],
                            configs=prepared.full.configurations,
                            workloads=prepared.full.workloads)


def test_the_text_is_stored_byte_for_byte_and_the_spec_loads_back(backend: Backend,
                                                                   tmp_path: Path) -> None:
    """A run at a scale, its job file read and ``--target`` given: the store keeps the file's
    bytes as they are, and loads the spec back into the suite that ran (the job file carried:
    it is not read again)."""
    path = _suite_file(tmp_path)
    suite = for_command_line(load_suite(path, scale="small"), target=tmp_path / "elsewhere")
    prepared = prepare(suite)
    assert prepared.suite.method.runtime == 1 and prepared.suite.target.directory == \
        tmp_path / "elsewhere"
    with Store(backend.location) as store:
        run_id = _store(store, StoredSuite.of(prepared.suite), prepared)
        stored = store.load_run(run_id)
    (text, spec_json), = backend.raw("SELECT suite_text, spec_json FROM runs WHERE id = ?",
                                     (run_id,))
    assert text == path.read_bytes().decode()
    assert RunSpec.from_json(str(spec_json)) == prepared.spec == stored.suite.spec
    (tmp_path / "job.fio").unlink()
    again = stored.suite.runnable()
    skip = {"scales", "author"}
    assert again.model_dump(exclude=skip) == prepared.suite.model_dump(exclude=skip)
    assert again.source_text == text and again.scale == "small"
    assert again.jobfiles == {"job.fio": JOB}
    assert stored.suite.method == prepared.suite.method and stored.suite.problem is None
    # export --format suite: the spec written anew (the text alone would not run so)
    exported = load_suite_text(stored.suite.runs_again, source="exported.toml")
    assert exported.model_dump(exclude={*skip, "source_text", "source_path", "tables"}) == \
        again.model_dump(exclude={*skip, "source_text", "source_path", "tables"})


def test_a_schema_11_database_migrates_and_its_runs_derive_their_spec(
        backend: Backend, tmp_path: Path) -> None:
    """A run stored by schema 11 kept the resolved suite in its text: after the migration to
    12 (spec_json NULL) it loads from that text, once, into the suite it was."""
    Store(backend.location, migrate_to=11).close()
    path = _suite_file(tmp_path)
    suite = load_suite(path, scale="small")
    old_text = tables_text(suite.tables, f"{path} --scale small")   # as 11 stored it
    backend.raw("INSERT INTO runs (suite_name, suite_source, suite_text, created_at, status, "
                "host_json, accelerator, iomatrix_version, uuid) VALUES "
                "('mine', ?, ?, 't', 'interrupted', '{}', 'none', '0', 'u1')",
                (f"{path} --scale small", old_text))
    with Store(backend.location) as store:
        assert store.version == SCHEMA_VERSION >= 12
        stored = store.load_run(1)
    assert backend.raw("SELECT spec_json FROM runs") == [(None,)]
    loaded = stored.suite.runnable()
    assert stored.suite.text == old_text and loaded.scale == "small"
    assert loaded.method == suite.method and loaded.jobfiles == {"job.fio": JOB}
    assert stored.suite.spec == RunSpec.of(load_suite_text(old_text, source="x"))


@pytest.mark.parametrize("key", ["author", "source_text", "tables", "scales", "scale"])
def test_a_stored_spec_cannot_set_what_only_load_sets(key: str, tmp_path: Path) -> None:
    """A spec naming who wrote it (or any key only ``load`` sets, or [scale] tables) is
    refused like a suite file naming it: its suite is None and says why."""
    tables = {"suite": {"name": "t"}, "target": {"directory": str(tmp_path)},
              key: {"uid": None, "where": "root"}}
    with pytest.raises(SuiteError, match=f"{key}: unknown key"):
        suite_of_tables(tables, text="", source="s.toml")
    stored = StoredSuite(name="t", source="s.toml", text="", spec=RunSpec(tables=tables))
    assert stored.suite is None and f"{key}: unknown key" in (stored.unloaded(Part.SUITE) or "")


def test_a_stored_spec_is_anyones_until_its_store_says_whose(tmp_path: Path) -> None:
    """The suite a spec loads into is anyone's; --resume takes the weaker of the run's
    recorded author and the store's (another user's uid: not trusted), never the spec's."""
    suite = for_command_line(load_suite(_suite_file(tmp_path)))
    spec = RunSpec.from_json(RunSpec.of(suite).to_json())
    assert spec.suite(text=suite.source_text, source="s").author.uid == ANYONE
    db = tmp_path / "r.db"
    prepared = prepare(suite)
    other = StoredSuite(name="mine", source="s", text=suite.source_text, spec=spec,
                        author=12345)
    with Store(db) as store:
        stored = store.load_run(_store(store, other, prepared))
    assert stored.suite.author == 12345
    assert resumed_suite(stored, str(db)).author == Author(12345, resumed_suite(
        stored, str(db)).author.where)


def test_a_spec_that_is_not_one_is_refused() -> None:
    for text in ('{"version": 2, "tables": {}}', '{"tables": {}, "evil": 1}', "[]"):
        with pytest.raises(ValueError):
            RunSpec.from_json(text)
    assert json.loads(RunSpec(tables={}).to_json()) == {"tables": {}, "version": 1}


def test_the_pilots_choice_is_applied_by_prepare(tmp_path: Path) -> None:
    """``PreparedRun.chosen``: the rounds and, unless the suite fixed it, the trial length."""
    prepared = prepare(for_command_line(load_suite(_suite_file(tmp_path))))
    choice = PlanChoice(runtime=3.5, rounds=4, seconds=1, half_width=0.01, target=0.02,
                        optimum=None, reached=True)
    method = prepared.chosen(choice).suite.method
    assert (method.samples, method.runtime, method.pilot, method.target_ci) == (4, 3.5, False,
                                                                                None)
    fixed = prepared.chosen(choice.model_copy(update={"fixed_runtime": True})).suite.method
    assert fixed.runtime == prepared.suite.method.runtime == 2


def test_a_copied_run_keeps_its_spec(backend: Backend, tmp_path: Path) -> None:
    """``db copy`` (``Store.copy_run``) carries the spec beside the text, as stored."""
    prepared = prepare(for_command_line(load_suite(_suite_file(tmp_path), scale="small")))
    with Store(tmp_path / "source.db") as source:
        run_id = _store(source, StoredSuite.of(prepared.suite), prepared)
        source.finish_run(run_id, "complete")
        with Store(backend.location) as store:
            copied = store.copy_run(source, run_id)
            again = store.load_run(store.resolve("last"))
    assert copied is not None
    assert again.suite.spec == prepared.spec and again.suite.text == prepared.suite.source_text
    assert again.suite.runnable().method == prepared.suite.method


def test_a_stored_suite_that_does_not_load_says_which_part_did_not() -> None:
    """A text that is no runnable suite (an imported run's) has one problem record: the suite
    always, its [method] or its [[finding]] tables only where each fails on its own."""
    bad_method = StoredSuite(name="t", source="import:x", text='[method]\nrepeats = "x"\n')
    assert bad_method.suite is None and bad_method.unloaded(Part.SUITE)
    assert "[method]" in (bad_method.unloaded(Part.METHOD) or "")
    assert bad_method.unloaded(Part.FINDINGS) is None
    bad_finding = StoredSuite(name="t", source="import:x", text="[[finding]]\nid = 1\n")
    assert bad_finding.unloaded(Part.METHOD) is None and bad_finding.unloaded(Part.FINDINGS)
    assert bad_finding.findings == ()
