"""Shared test helpers: small suite files in a temporary directory, and a check that nothing we
started is still running."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def write_suite(directory: Path, body: str, *, name: str = "t", size: str = "64MiB",
                target: Path | None = None) -> Path:
    """A suite file with a directory target under ``directory``."""
    path = directory / f"{name}.toml"
    path.write_text(f'[suite]\nname = "{name}"\n[target]\ndirectory = "{target or directory / "target"}"\n'
                    f'size = "{size}"\n' + body)
    return path


def processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes whose arguments contain ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().split(")")[-1].split()[0]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            found.append(f"{entry.name}: {cmdline}")
    return found


@pytest.fixture
def no_leftovers(tmp_path: Path):  # type: ignore[no-untyped-def]
    """Fails the test if a qemu-storage-daemon or fio started under tmp_path outlives it."""
    yield
    left = [p for p in processes_mentioning(str(tmp_path)) + processes_mentioning("iomatrix-run-")
            if "qemu" in p or "fio" in p]
    assert not left, f"processes left running: {left}"
