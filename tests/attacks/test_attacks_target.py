"""Issue 31, the destroy flag: a suite another user could have written never makes root overwrite
a device. ``[target] device`` with ``allow_destroy = true`` is the user saying "destroy this";
written by somebody else, it is refused in one line before anything is opened, and the device's
bytes stay as they were. Root's own suite (a file nobody else can write) still may."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import pytest

from iomatrix.cli.status import ExitStatus
from tests.conftest import ATTACKS, Attack, User, cli_result
from tests.attacks.test_untrusted_inputs import one_line

pytestmark = ATTACKS

SUITE = ('[suite]\nname = "wipe"\n[target]\ndevice = "{dev}"\nallow_destroy = true\n'
         '[workloads]\nrw = "randwrite"\nbs = "4k"\niodepth = 1\n'
         '[method]\nmode = "host"\nruntime = "1s"\nramp = "0s"\n')


def _digest(dev: Path) -> str:
    with open(dev, "rb") as f:
        return hashlib.sha256(f.read(8 << 20)).hexdigest()


def _suite(owner: User | None, dev: Path) -> Path:
    """The suite in a directory of its own under /tmp, file and directory owned by ``owner``
    (None: root, mode 0755/0644)."""
    where = Path(tempfile.mkdtemp(prefix="iomx-wipe-", dir="/tmp"))
    where.chmod(0o755)
    path = where / "wipe.toml"
    path.write_text(SUITE.format(dev=dev))
    if owner is not None:
        os.chown(where, owner.uid, owner.gid)
        os.chown(path, owner.uid, owner.gid)
    return path


def test_another_users_suite_may_not_destroy_a_device(attacker: User, attack: Attack,
                                                      loop_device: Path, tmp_path: Path) -> None:
    attack("31. a suite another user wrote names a device with allow_destroy", "refused")
    with open(loop_device, "r+b") as f:
        f.write(b"root's data " * 4096)
    before = _digest(loop_device)
    suite = _suite(attacker, loop_device)
    done = cli_result("run", str(suite), "--db", str(tmp_path / "r.db"))
    line = one_line(done, ExitStatus.SUITE_INVALID)
    assert f"[target] allow_destroy: {loop_device} would be overwritten" in line
    assert str(suite) in line and "another user could have written" in line
    assert _digest(loop_device) == before


@pytest.mark.slow
def test_roots_own_suite_still_may(loop_device: Path, tmp_path: Path) -> None:
    """The rule refuses by author, not by device: root's own suite gets past it (and measures)."""
    suite = _suite(None, loop_device)
    done = cli_result("run", str(suite), "--db", str(tmp_path / "r.db"))
    assert done.returncode == ExitStatus.OK, done.stderr
    assert "allow_destroy" not in done.stderr


def test_a_node_judges_the_suite_as_the_controller_did(loop_device: Path) -> None:
    """A node loads the suite from the controller's request: root's own suite stays root's there
    (it may destroy the device it names), another user's is anyone's (it may not)."""
    from iomatrix.measure.nodeside import NodeRequest, request_suite

    text = ("[suite]\nname = \"wipe\"\n" + SUITE.split("\n", 2)[2]).format(dev=loop_device)
    asked = {"suite_text": text, "suite_source": "/etc/iomatrix/wipe.toml", "node": "n1",
             "run_uuid": "ab12", "seed": 1}
    ours = request_suite(NodeRequest(**asked, trusted=True))
    theirs = request_suite(NodeRequest(**asked))
    assert ours.author.trusted and ours.destroy_refused() is None
    assert not theirs.author.trusted
    assert "another user could have written" in (theirs.destroy_refused() or "")
