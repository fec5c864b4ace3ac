"""Shared test helpers: small suite files in a temporary directory, and a check that nothing we
started is still running."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
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


WATCHED = ("qemu-system", "qemu-storage", "fio")


def our_processes(marker: str) -> list[str]:
    """Live processes whose command line mentions ``marker`` (a test's temp dir), and QEMU/fio
    children of this process, zombies included (started but not reaped)."""
    me = os.getpid()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        state, ppid = stat[stat.rindex(")") + 1:].split()[:2]
        if (marker in cmdline and state != "Z") or (int(ppid) == me and comm.startswith(WATCHED)):
            found.append(f"{entry.name} {comm}: {cmdline[:200]}")
    return found


@pytest.fixture
def no_leftovers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """Scratch directories (ours and our subprocesses') go under tmp_path; the test fails if a
    qemu-storage-daemon, QEMU or fio that mentions tmp_path, or a child of pytest, outlives it."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    yield
    left = our_processes(str(tmp_path))
    assert not left, f"processes left running: {left}"


@pytest.fixture
def loop_device(tmp_path: Path):  # type: ignore[no-untyped-def]
    backing = tmp_path / "backing.img"
    with open(backing, "wb") as f:
        f.truncate(64 << 20)
    try:
        dev = subprocess.run(["losetup", "--find", "--show", str(backing)], capture_output=True,
                             text=True, check=True).stdout.strip()
    except (subprocess.CalledProcessError, FileNotFoundError) as exc:
        pytest.skip(f"loop devices unavailable here: {exc}")
    try:
        yield Path(dev)
    finally:
        subprocess.run(["umount", dev], capture_output=True)
        subprocess.run(["losetup", "-d", dev], capture_output=True)


@pytest.fixture(scope="session")
def kernel() -> Path:
    """A standard Linux kernel to boot (the host's, or Debian's fetched once), or skip."""
    from iomatrix.appliance.kernel import find_kernel
    from iomatrix.core.errors import IomatrixError

    try:
        return find_kernel()
    except IomatrixError as e:
        pytest.skip(f"no kernel to boot: {e}")


def cli(*args: str) -> tuple[int, str]:
    """The iomatrix command line run in-process as a user runs it, through ``main`` (which turns
    errors into one line and an exit status): the status, and stdout followed by stderr."""
    import contextlib
    import io

    from iomatrix.cli.app import main

    stdout, stderr = io.StringIO(), io.StringIO()
    argv = sys.argv
    sys.argv = ["iomatrix", *args]
    code = 0
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = argv
    return code, stdout.getvalue() + stderr.getvalue()
