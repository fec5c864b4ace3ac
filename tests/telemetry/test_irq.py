"""The target device's IRQ affinity (issue 35): found from sysfs and reported in every run's host
record; steered only where [method] irq_affinity asks, and put back afterwards, also when the
block is interrupted (Ctrl-C); a loop device has none, and says so."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from iomatrix.core import cpuset
from iomatrix.core.owner import this_process
from iomatrix.measure.reclaim import reclaim
from iomatrix.store import Store
from iomatrix.telemetry import irq
from tests.conftest import IOMATRIX, cli_result, fio_runs, our_processes, write_suite


def dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def _steerable(path: Path) -> tuple[str, list[int]]:
    """The device holding ``path`` and its IRQs, or skip (with the reason) where this host
    cannot steer any."""
    device = irq.target_device(path)
    irqs, why = irq.device_irqs(device)
    if os.geteuid() != 0 or not irqs or not cpuset.online() >= {0, 1}:
        pytest.skip(f"needs root, two CPUs and a target device with IRQs ({why or device})")
    return str(device), irqs


def _steering_suite(tmp_path: Path, runtime: str) -> Path:
    """A host-mode run of ``runtime`` with the target device's IRQs steered to CPU 1."""
    return write_suite(tmp_path, f"""
[method]
mode = "host"
ramp = 0
runtime = "{runtime}"
irq_affinity = "1"
[[workloads]]
rw = "randread"
""", size="16MiB")


def test_steered_for_the_block_and_put_back_on_ctrl_c(tmp_path: Path) -> None:
    device, irqs = _steerable(tmp_path)
    before = {i: irq.affinity_of(i)[0] for i in irqs}
    notes: list[str] = []
    inside: dict[int, str] = {}
    with pytest.raises(KeyboardInterrupt):
        with irq.steered(device, "1", notes.append) as steered:
            inside = {i: irq.affinity_of(i)[0] for i in irqs}
            raise KeyboardInterrupt
    assert {i: irq.affinity_of(i)[0] for i in irqs} == before
    assert all(inside[i] == "1" for i in steered)
    kept = [i for i in irqs if i not in steered]
    assert all(inside[i] == before[i] for i in kept)       # a managed IRQ: the kernel's own
    assert len(notes) == len(kept) + (1 if steered else 0)
    for i in kept:
        assert any(f"IRQ {i} keeps {cpuset.shown(cpuset.parse(before[i]))}" in n for n in notes)
    if steered:
        assert f"steered to CPU 1 for the run" in notes[-1]


def test_every_run_reports_them_and_irq_affinity_steers_them(tmp_path: Path) -> None:
    device, irqs = _steerable(tmp_path)
    before = {i: irq.affinity_of(i)[0] for i in irqs}
    suite = _steering_suite(tmp_path, "500ms")
    cli_result("run", str(suite), "--db", str(tmp_path / "r.db"), cwd=tmp_path, check=0)
    with Store(tmp_path / "r.db") as store:
        stored = store.load_run(1)
    assert {i: irq.affinity_of(i)[0] for i in irqs} == before
    record = stored.host["target_irqs"]
    assert record.startswith(f"{Path(device).name}: ")
    assert all(f"IRQ {i} → " in record for i in irqs)
    told = [n for n in stored.notes if "irq_affinity" in n]
    assert told and all(str(i) in " ".join(told) for i in irqs)


def test_a_loop_device_has_none(loop_device: Path) -> None:
    assert irq.device_irqs(str(loop_device)) == ([], f"{loop_device.name} has no IRQs: a loop "
                                                     "device, served by the kernel itself (no "
                                                     "controller interrupts)")
    assert irq.report(str(loop_device)).startswith(f"{loop_device.name} has no IRQs")
    notes: list[str] = []
    with irq.steered(str(loop_device), "0", notes.append) as steered:
        assert steered == []
    assert notes == [f"[method] irq_affinity = \"0\": {loop_device.name} has no IRQs: a loop "
                     "device, served by the kernel itself (no controller interrupts); nothing "
                     "steered"]


def test_found_on_a_sysfs_of_our_own(tmp_path: Path) -> None:
    """MSI-X vectors of the controller above a disk, through a partition; read as /proc says."""
    pci = tmp_path / "devices/pci0000:00/0000:00:04.0"
    (pci / "msi_irqs").mkdir(parents=True)
    for n in ("41", "40"):
        (pci / "msi_irqs" / n).write_text("msix\n")
    disk = pci / "nvme/nvme0/nvme0n1"
    (disk / "nvme0n1p1").mkdir(parents=True)
    (disk / "nvme0n1p1/partition").write_text("1\n")
    (disk / "device").symlink_to(pci / "nvme/nvme0")
    (tmp_path / "class/block").mkdir(parents=True)
    (tmp_path / "class/block/nvme0n1p1").symlink_to(disk / "nvme0n1p1")
    proc = tmp_path / "irq"
    for n, allowed in ((40, "0-3"), (41, "2")):
        (proc / str(n)).mkdir(parents=True)
        (proc / str(n) / "smp_affinity_list").write_text(allowed + "\n")
    assert irq.device_irqs("/dev/nvme0n1p1", tmp_path) == ([40, 41], "")
    assert irq.report("nvme0n1p1", tmp_path, proc) == "nvme0n1p1: IRQ 40 → 0-3, IRQ 41 → 2"


@pytest.mark.slow
def test_a_killed_run_leaves_them_steered_and_clean_puts_them_back(
        tmp_path: Path, no_leftovers: None) -> None:
    """kill -9 while fio measures: the kernel keeps the IRQs steered; the run recorded each one's
    previous set before it changed it, and `iomatrix clean` writes that set back."""
    device, irqs = _steerable(tmp_path)
    before = {i: irq.affinity_of(i)[0] for i in irqs}
    suite = _steering_suite(tmp_path, "60s")
    db = tmp_path / "r.db"
    run = subprocess.Popen([*IOMATRIX, "run", str(suite), "--db", str(db)], cwd=tmp_path,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not fio_runs(tmp_path):
            assert run.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        run.kill()
        run.wait()
        with Store(db) as store:
            steered = {int(r.path): r for r in store.open_resources() if r.kind == irq.KIND}
        assert steered, "no IRQ of the target device was steered: nothing to put back"
        assert {i: irq.affinity_of(i)[0] for i in steered} == {i: "1" for i in steered}
        done = cli_result("clean", "--db", str(db), check=0)
        assert {i: irq.affinity_of(i)[0] for i in irqs} == before
        for i in steered:
            assert (f"removed steering of IRQ {i} (run 1, pid {run.pid}): CPU "
                    f"{cpuset.shown(cpuset.parse(before[i]))} written back to IRQ {i}"
                    in done.stdout)
        with Store(db) as store:
            assert [r for r in store.open_resources() if r.kind == irq.KIND] == []
        deadline = time.monotonic() + 30            # fio, SIGTERMed as its parent died
        while our_processes(str(tmp_path)) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        for i, cpus in before.items():
            with contextlib.suppress(OSError):
                (irq.PROC_IRQ / str(i) / "smp_affinity_list").write_text(cpus + "\n")


def test_a_forged_record_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    """A database row is untrusted input: an IRQ that is not digits, a set of CPUs this host
    does not have, a path where the IRQ goes: each left, with why, and nothing written (each
    names the set the IRQ has now as the set the run steered it to, so that only the checks
    stand in the way)."""
    device, irqs = _steerable(tmp_path)
    before = {i: irq.affinity_of(i)[0] for i in irqs}
    number = irqs[0]
    now = cpuset.shown(cpuset.parse(before[number]))
    other = "1" if now != "1" else "0"
    forged = [(f"{number};x", other), (str(number), "0-9999"), (str(number), "0-4000"),
              (str(irq.PROC_IRQ / str(number) / "smp_affinity_list"), other),
              (f"../{number}", other)]
    with Store(tmp_path / "r.db") as store:
        owner = this_process()._replace(pid=dead_pid())
        dead = store.register_process(owner, "")
        for path, previous in forged:
            store.add_resource(dead, irq.KIND, path, json.dumps(
                {"previous": previous, "steered": now, "boot": owner.boot_id}))
        done = reclaim(store)
        assert sorted((r.resource.path, r.action) for r in done) == sorted(
            (p, "left") for p, _ in forged)
        assert all("a record iomatrix did not write" in r.detail for r in done)
        assert len(store.open_resources()) == len(forged)       # left, for a look
    assert {i: irq.affinity_of(i)[0] for i in irqs} == before
    # the same record, well formed, is the one that is put back
    assert irq.put_back(str(number), json.dumps({"previous": now, "steered": now,
                                                 "boot": owner.boot_id})) == (
        f"gone: IRQ {number} has CPU {now} again")
