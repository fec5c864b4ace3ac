"""bench/behaviour.py, the before/after comparison of issue 32, on a small part of its corpus: two
snapshots of this tree are the same item for item, and a changed or missing output is reported
(exit 1, the item named, a diff)."""

from __future__ import annotations

import datetime as dt
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "behaviour.py"
ONLY = ("suites/list", "plan/quick", "translate/cfg2cmd/qemu-server-9.2.6/simple1@pve9",
        "translate/tests/libvirt-xml@libvirt-11.3-qemu-10.0", "stored/synthetic/run4.findings",
        "stored/synthetic/run1.export-json", "errors/show-missing-run")
"""One item of each kind: the synthetic database is made for the two stored reads (and its
build step is an item too), with its timestamps normalized."""


def behaviour(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.slow
def test_a_tree_against_itself_is_the_same_and_a_change_shows(tmp_path: Path) -> None:
    only = [arg for pattern in ONLY for arg in ("--only", pattern)]
    for name in ("a", "b"):
        done = behaviour("snapshot", str(tmp_path / name), "--quiet", "--python", sys.executable,
                         *only)
        assert done.returncode == 0, done.stderr
    a, b = tmp_path / "a", tmp_path / "b"
    made = sorted(str(p.relative_to(a)) for p in a.rglob("*.txt"))
    assert made == sorted([f"{n}.txt" for n in ONLY] + ["stored/synthetic/build.txt"])
    export = (a / "stored/synthetic/run1.export-json.txt").read_text()
    assert export.startswith("$ iomatrix export 1 --format json --db <WORK>/db/synthetic.db\nexit 0\n")
    assert '"created_at": "<NOW>"' in export and '"started_at": "2026-01-01T00:00:00"' in export
    assert "exit 7" in (a / "errors/show-missing-run.txt").read_text()
    assert "confirmed" in (a / "stored/synthetic/run4.findings.txt").read_text()

    same = behaviour("diff", str(a), str(b))
    assert same.returncode == 0, same.stdout
    assert f"{len(made)} items: {len(made)} same, 0 differ, 0 missing" in same.stdout

    plan = b / "plan/quick.txt"
    plan.write_text(plan.read_text().replace("4k randread QD1", "4k randread QD2", 1))
    (b / "errors/show-missing-run.txt").unlink()
    changed = behaviour("diff", str(a), str(b), "--changes-only")
    assert changed.returncode == 1
    lines = changed.stdout.splitlines()
    assert "differs    plan/quick.txt" in lines and "missing in B errors/show-missing-run.txt" in lines
    assert any(line.startswith("    -") and "QD1" in line for line in lines)
    assert any(line.startswith("    +") and "QD2" in line for line in lines)
    assert f"{len(made)} items: {len(made) - 2} same, 1 differ, 1 missing" in changed.stdout
    assert not any(line.startswith("same") for line in lines)


def test_normalization_keeps_the_fixtures_dates(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = importlib.util.spec_from_file_location("behaviour", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "behaviour", module)     # its dataclasses look it up
    spec.loader.exec_module(module)
    clock = dt.datetime(2026, 11, 29, 3, 0, tzinfo=dt.timezone.utc)
    norm = module.Normalizer(Path("/tmp/iomx-behaviour-abcdefgh"), Path("/work/tree"), clock)
    text = ("run 1 · 2026-11-29T02:59:58+00:00 · day 2026-11-28 · fixture 2026-11-01T10:00:00+00:00 "
            "· trial 2026-01-01T00:00:00 · at 1795921200 · fio 1700000000 · "
            "uuid 4dea22b3-1d52-d8f3-2516-782e98ab3fa0 · /tmp/iomx-behaviour-abcdefgh/db/r.db "
            "· /work/tree/iomatrix/suite")
    assert norm(text) == ("run 1 · <NOW> · day <TODAY> · fixture 2026-11-01T10:00:00+00:00 "
                          "· trial 2026-01-01T00:00:00 · at <EPOCH> · fio 1700000000 · "
                          "uuid <UUID> · <WORK>/db/r.db · <TREE>/iomatrix/suite")
    kept = module.Normalizer(Path("/work/w"), Path("/work/t"), clock,
                             frozenset({"4dea22b3-1d52-d8f3-2516-782e98ab3fa0"}))
    assert kept("uuid 4DEA22B3-1d52-d8f3-2516-782e98ab3fa0, in /tmp (77.0 GiB free; ...)") == \
        "uuid 4DEA22B3-1d52-d8f3-2516-782e98ab3fa0, in /tmp (<SIZE> free; ...)"
    assert module.suite_names(" suite  mode  description\n quick  blocklayer  Host baseline\n"
                              " aio-iothreads   guest   Seed 000\n") == ["quick", "aio-iothreads"]
    assert module.cfg2cmd_config("# c\n--- config\nscsi0: a\n# x\n--- scsi0\n-drive b\n") == "scsi0: a\n"
