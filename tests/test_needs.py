"""The capability guards (tests/needs.py) as CI meets them: pytest run in a process of its own
over a small module whose tests need fio (by mark, where PATH has no fio: a real probe finding it
missing) and Ceph (found missing at run time). They skip, saying why; under
``IOMATRIX_TEST_REQUIRE`` naming the capability they fail (the marked one as an error in its
setup, before its fixtures), and a skip that is no missing capability stays a skip."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.needs import CAPABILITIES, REQUIRE, needs

MODULE = '''
import pytest

from tests.needs import lacking, needs


@pytest.fixture
def started():
    raise AssertionError("a fixture of a test that lacks a capability is not set up")


@needs("fio")
def test_marked(started):
    pass


def test_at_run_time():
    lacking("ceph", "no ceph-mon here")


def test_refused():
    pytest.skip("PostgreSQL keeps a column's type")
'''

CONFTEST = "from tests.conftest import pytest_configure, pytest_runtest_setup  # noqa: F401\n"


def run(tmp_path: Path, require: str | None) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_small.py").write_text(MODULE)
    env = {k: v for k, v in os.environ.items() if k not in (REQUIRE, "PYTEST_ADDOPTS")}
    env.update(PATH=str(tmp_path / "no-programs"), PYTHONPATH=str(REPO))
    if require is not None:
        env[REQUIRE] = require
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rsf", "-n", "0",
                           "-p", "no:cacheprovider", "test_small.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_a_missing_capability_skips_saying_why(tmp_path: Path) -> None:
    done = run(tmp_path, None)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 skipped" in done.stdout
    assert "fio not installed" in done.stdout and "no ceph-mon here" in done.stdout


@pytest.mark.slow
def test_a_required_capability_fails_where_missing(tmp_path: Path) -> None:
    done = run(tmp_path, "fio")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 error" in done.stdout and "2 skipped" in done.stdout, done.stdout
    assert f"{REQUIRE} requires fio on this machine, but: fio not installed" in done.stdout
    assert "a fixture of a test that lacks" not in done.stdout
    assert "no ceph-mon here" in done.stdout           # ceph not required: still a skip


@pytest.mark.slow
def test_every_capability_required_leaves_only_the_refusal_a_skip(tmp_path: Path) -> None:
    done = run(tmp_path, " fio, ceph ")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 failed, 1 skipped, 1 error" in done.stdout, done.stdout
    assert f"{REQUIRE} requires ceph on this machine, but: no ceph-mon here" in done.stdout
    assert "PostgreSQL keeps a column's type" in done.stdout


@pytest.mark.slow
def test_an_unknown_capability_stops_the_run(tmp_path: Path) -> None:
    done = run(tmp_path, "fio,cephh")
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
    assert f"{REQUIRE}: unknown capabilities cephh" in done.stderr


def test_a_mark_names_known_capabilities_only() -> None:
    with pytest.raises(KeyError, match="kvm"):
        needs("kvm")                 # KVM has its own switch: IOMATRIX_EXPECT_KVM
    assert needs("fio", "qemu").args == ("fio", "qemu")
    assert "kvm" not in CAPABILITIES
