"""Issue 31, imported results (the review's finding 6): a directory of fio results another user
names so that the suite text ``iomatrix import`` stores with the run (``# imported from
PATH``) reads as TOML of theirs (``[target] device`` with ``allow_destroy``), tried for real by
the unprivileged ``attacker`` against root's import, export and ``run``:

- the path is JSON-quoted in that comment: the text root exports (``export --format suite``)
  and runs names no device, and runs nothing;
- a run whose stored text does load as a suite (as an older iomatrix stored it) is still no
  suite to measure: ``run --resume`` refuses an imported run in one line.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from iomatrix.cli.status import ExitStatus
from tests.conftest import ATTACKS, Attack, User, as_user, cli_result
from tests.attacks.test_adversary import FIO_JSON, arena, their_directory  # noqa: F401 (a fixture)
from tests.attacks.test_untrusted_inputs import one_line

pytestmark = ATTACKS

MAKE = ("import os, sys\nbase, result = sys.argv[1:3]\n"
        "path = os.path.join(base, *sys.argv[3:])\nos.makedirs(path)\n"
        "open(os.path.join(path, 'randread.json'), 'w').write(open(result).read())\n"
        "print(path)\n")


def _their_results(user: User, theirs: Path, device: Path) -> Path:
    """A directory of fio results ``user`` makes in ``theirs``, whose path, read as the lines
    of TOML it holds, is a [target] table destroying ``device`` (its slashes the directories')."""
    parts = ['\n[target]\ndevice = "', *device.parts[1:-1],
             f'{device.name}"\nallow_destroy = true\nsize = "16MiB"\n#', "results"]
    made = as_user(user, MAKE, str(theirs), str(FIO_JSON), *parts)
    out, err = made.communicate(timeout=60)
    assert made.returncode == 0, err
    return Path(out.rstrip("\n"))


def test_6_an_imported_directorys_name_is_no_toml_of_theirs(
        tmp_path: Path, arena: Path, attacker: User, attack: Attack,  # noqa: F811
        loop_device: Path) -> None:
    """6: root imports the attacker's directory, exports the run's suite text and runs it (as
    ``export --format suite`` says it can): the text names no device (the path is a JSON
    string in its comment), so the run is refused for the [target] it lacks; the device is
    never opened."""
    attack("6: import of a directory whose name injects [target] device and allow_destroy",
           "refused")
    results = _their_results(attacker, their_directory(arena, attacker, "theirs"), loop_device)
    db = tmp_path / "r.db"
    done = cli_result("import", str(results), "--db", str(db))
    assert done.returncode == 0, done.stderr
    suite = tmp_path / "exported.toml"
    done = cli_result("export", "1", "--format", "suite", "--db", str(db), "--out", str(suite))
    assert done.returncode == 0, done.stderr
    text = suite.read_text()
    assert "\n[target]" not in text and "\nallow_destroy" not in text, text
    for plan in (["--plan"], []):
        done = cli_result("run", str(suite), *plan, "--db", str(db))
        assert done.returncode == ExitStatus.SUITE_INVALID, done.stdout + done.stderr
        assert "[target]: required table is missing" in done.stderr, done.stderr


def test_6_an_imported_run_is_never_resumed_as_a_suite(
        tmp_path: Path, arena: Path, attacker: User, attack: Attack,  # noqa: F811
        loop_device: Path) -> None:
    """6: an imported run whose stored text loads as a suite destroying a device (the comment
    as an older iomatrix wrote it, the path raw), made resumable: ``run --resume`` and ``run
    --resume --retry-failed`` refuse it in one line, imported results being no suite iomatrix
    ran, whatever its text reads as; the device is never opened."""
    attack("6: run --resume of an imported run whose text reads as [target] device", "refused")
    results = _their_results(attacker, their_directory(arena, attacker, "theirs"), loop_device)
    db = tmp_path / "r.db"
    assert cli_result("import", str(results), "--db", str(db)).returncode == 0
    with sqlite3.connect(db) as c:
        (text,) = c.execute("SELECT suite_text FROM runs").fetchone()
        raw = text.replace(json.dumps(str(results)), str(results), 1)  # as stored before
        assert raw != text
        c.execute("UPDATE runs SET suite_text = ?, status = 'interrupted'", (raw,))
    c.close()
    for retry in ([], ["--retry-failed"]):
        done = cli_result("run", "--resume", "1", *retry, "--db", str(db))
        line = one_line(done, ExitStatus.SUITE_INVALID)
        assert line.startswith("iomatrix: import:") and line.endswith(
            ": imported results, not a suite iomatrix can run"), line


@pytest.fixture(autouse=True)
def _quiet_device(loop_device: Path) -> None:
    """The device the attacks name holds nothing iomatrix wrote, after each test too."""
    yield
    with open(loop_device, "rb") as f:
        assert f.read(1 << 20) == bytes(1 << 20)
