"""The LVM STAND-IN as a test uses it (``tests/fixtures/standins/lvm``: this kernel has no
device-mapper, so no real LVM volume can be made here): ``lvm_standin`` puts symlinks named
vgs, lvs, lvcreate, lvremove, lvchange and vgcreate to it first on PATH, with its state in the
test's own temporary directory, and at the end detaches every loop device it handed out and
fails the test if one is still attached. Each volume it makes is a real loop device, so what
follows (device checks, QEMU, fio, reclaim) runs on real block devices."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.needs import lacking

STANDIN = Path(__file__).resolve().parent / "fixtures" / "standins" / "lvm"
PROGRAMS = ("vgs", "lvs", "lvcreate", "lvremove", "lvchange", "vgcreate")


class LvmStandin:
    """The stand-in's state directory and what a test asks of it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.state = root / "state"
        self.bin = root / "bin"

    def run(self, program: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.bin / program), *args], capture_output=True, text=True,
                              timeout=60, check=check)

    def volumes(self, vg: str) -> dict[str, dict[str, object]]:
        """The volume group's logical volumes as the stand-in holds them."""
        path = self.state / "state.json"
        data = json.loads(path.read_text()) if path.exists() else {"vgs": {}}
        return data["vgs"].get(vg, {}).get("lvs", {})

    def ours(self, vg: str) -> list[str]:
        return sorted(n for n in self.volumes(vg) if n.startswith("iomatrix-"))

    def commands(self) -> list[list[str]]:
        log = self.state / "commands.log"
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    def loops(self) -> list[str]:
        """Loop devices attached to a backing file of the stand-in's."""
        out = subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout
        return [line.split(":")[0] for line in out.splitlines() if str(self.state) in line]


def lvm_standin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LvmStandin]:
    """The fixture's body (the test module declares the fixture): a volume group ``pve`` of
    512 MiB with a thin pool ``data`` of 256 MiB."""
    if subprocess.run(["losetup", "--find"], capture_output=True).returncode != 0:
        lacking("loop", "no free loop device here (losetup --find)")
    made = LvmStandin(tmp_path / "lvm")
    made.bin.mkdir(parents=True)
    for program in PROGRAMS:
        (made.bin / program).symlink_to(STANDIN)
    monkeypatch.setenv("LVM_STANDIN_STATE", str(made.state))
    monkeypatch.setenv("PATH", f"{made.bin}:{subprocess.os.environ['PATH']}")
    pv = tmp_path / "pv.img"
    with open(pv, "wb") as f:
        f.truncate(516 << 20)
    made.run("vgcreate", "pve", str(pv))
    made.run("lvcreate", "-L", "256m", "-T", "pve/data")
    try:
        yield made
    finally:
        for device in made.loops():
            subprocess.run(["losetup", "-d", device], capture_output=True)
        assert made.loops() == [], "the stand-in's loop devices could not be detached"
