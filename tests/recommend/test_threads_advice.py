"""recommend on IOThreads, queues and affinity: a level only on significant evidence, with its
host CPU per I/O beside the gain (``analysis.cpucost``), and for Proxmox VE what ``qm set`` can
say and what only ``args:`` can (``recommend.threads``). Synthetic runs written to a real store;
the real run is tests/scenarios/test_iothreads_suite.py."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from iomatrix.analysis.cpucost import cpu_per_io
from iomatrix.recommend.decide import recommend
from iomatrix.recommend.threads import PVE_TEXT
from iomatrix.recommend.verdict import verdict
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.workloads import Workload
from iomatrix.testing.synthetic import Figures, configurations, stored_run
from iomatrix.vocab.axes import BY_NAME

WORKLOADS = [Workload(rw="randread", bs=4096, iodepth=qd) for qd in (1, 8, 32)]


def _run(tmp_path: Path, axes: dict[str, list[object]], iops: dict[str, float],
         cpu: dict[str, float], axis: str, *, noise: float = 0.01, accelerator: str = "kvm"):
    """A guest run of ``axes`` whose IOPS and CPU per I/O are scaled per level of ``axis``."""
    configs = configurations("guest", axes)

    def figures(config: Configuration, workload: Workload, index: int) -> Figures:
        rng = random.Random(f"{config.key}|{workload.key}|{index}")
        level = str(getattr(config, axis) or "")
        value = 10000 * (1 + workload.iodepth / 8) * iops.get(level, 1.0) * (1 + rng.gauss(0, noise))
        lat = workload.iodepth / value * 1e9
        return Figures(value, value * 4096, lat, 2 * lat,
                       cpu_us_per_io=20.0 * cpu.get(level, 1.0) * (1 + rng.gauss(0, noise)))
    return stored_run(tmp_path / "r.sqlite", configs, WORKLOADS, figures, samples=4,
                      accelerator=accelerator)


AXES = {"controller": ["virtio-scsi-single"], "aio": ["io_uring"], "iothread": [True],
        "cache": ["none"], "format": ["raw"]}


def test_queues_recommended_on_significant_gain_with_cpu_cost(tmp_path: Path) -> None:
    """4 queues with 1.5× the IOPS of 1 and 1.3× the CPU per I/O: set, the CPU cost beside the
    gain as the run's data give it, and Proxmox VE told how qm set writes queues."""
    run = _run(tmp_path, AXES | {"num_queues": [1, 4]}, {"4": 1.5}, {"4": 1.3}, "num_queues")
    cost = cpu_per_io(run, "num_queues", "4", "1")
    assert cost.pairs == len(WORKLOADS)
    assert cost.relative == pytest.approx(1.3 - 1, abs=0.03)
    assert cost.low is not None and cost.high is not None and cost.low < cost.relative < cost.high
    rec = recommend(run, "proxmox")
    queues = next(d for d in rec.decisions if d.axis == "num_queues")
    assert queues.value == "4" and queues.status in ("change", "choose")
    assert cost.short() in queues.reason
    assert PVE_TEXT["num_queues"] in queues.caveat
    line = next(x for x in verdict(rec, 200) if "num_queues=4" in x)
    assert cost.short() in line
    qemu = next(d for d in recommend(run, "qemu").decisions if d.axis == "num_queues")
    assert "qm set" not in qemu.caveat


def test_queues_kept_without_significant_gain_cpu_still_shown(tmp_path: Path) -> None:
    """Equal IOPS, double the CPU: no recommendation, and the evidence says what 4 queues cost."""
    run = _run(tmp_path, AXES | {"num_queues": [1, 4]}, {}, {"4": 2.0}, "num_queues")
    rec = recommend(run, "qemu")
    queues = next(d for d in rec.decisions if d.axis == "num_queues")
    assert queues.value == "1" and queues.status in ("keep", "choose")
    evidence = next(e for e in queues.evidence if e.level == "4")
    assert evidence.cpu is not None and evidence.cpu.relative is not None
    assert math.isclose(evidence.cpu.relative, 1.0, abs_tol=0.05)
    assert "CPU per I/O" in evidence.text()


def test_synthetic_run_without_cpu_shows_none(tmp_path: Path) -> None:
    """A run that measured no CPU gives no pairs, and the evidence says nothing of CPU."""
    configs = configurations("guest", AXES | {"num_queues": [1, 4]})
    run = stored_run(tmp_path / "n.sqlite", configs, WORKLOADS,
                     lambda c, w, i: Figures(1000.0 + i, 4096e3, 1e6, 2e6), samples=3)
    assert cpu_per_io(run, "num_queues", "4", "1").pairs == 0
    rec = recommend(run, "qemu")
    queues = next(d for d in rec.decisions if d.axis == "num_queues")
    assert all("CPU" not in e.text() for e in queues.evidence)


def _threads_run(tmp_path: Path, accelerator: str = "none"):  # type: ignore[no-untyped-def]
    """iothread off and on, and iothreads 2 and 4, on one virtio-blk disk: 2 and 4 IOThreads
    give 1.5× and 1.7× the IOPS of one, at 1.2× and 1.4× its CPU per I/O."""
    axes = AXES | {"controller": ["virtio-blk"], "iothread": [True]}
    configs = (configurations("guest", axes | {"iothread": [False]})
               + configurations("guest", axes)
               + configurations("guest", axes | {"iothreads": [2, 4]}))
    gain = {0: 0.8, 1: 1.0, 2: 1.5, 4: 1.7}
    cost = {0: 0.9, 1: 1.0, 2: 1.2, 4: 1.4}

    def count(config: Configuration) -> int:
        return 0 if not config.iothread else (config.iothreads or 1)

    def figures(config: Configuration, workload: Workload, index: int) -> Figures:
        rng = random.Random(f"{config.key}|{workload.key}|{index}")
        value = 10000 * (1 + workload.iodepth / 8) * gain[count(config)] * (1 + rng.gauss(0, 0.01))
        lat = workload.iodepth / value * 1e9
        return Figures(value, value * 4096, lat, 2 * lat,
                       cpu_us_per_io=20.0 * cost[count(config)] * (1 + rng.gauss(0, 0.01)))
    return stored_run(tmp_path / "t.sqlite", configs, WORKLOADS, figures, samples=4,
                      accelerator=accelerator)


def test_iothreads_compared_with_one_iothread(tmp_path: Path) -> None:
    """The IOThread count is decided N against one IOThread (the configurations without an
    IOThread stay the iothread parameter's); 4 has the largest significant gain and is set,
    with its CPU per I/O; for Proxmox VE the line says it takes args:."""
    run = _threads_run(tmp_path)
    for platform in ("qemu", "proxmox"):
        rec = recommend(run, platform)
        threads = next(d for d in rec.decisions if d.axis == "iothreads")
        assert threads.levels and set(threads.levels) == {"1", "2", "4"}
        assert {e.level for e in threads.evidence} == {"2", "4"}
        assert all(e.iops.reference == "1" for e in threads.evidence)
        assert threads.value == "4" and threads.status == "change"
        four = next(e for e in threads.evidence if e.level == "4")
        assert four.cpu is not None and four.cpu.pairs == len(WORKLOADS)
        assert four.cpu.relative == pytest.approx(0.4, abs=0.03)
        assert four.cpu.short() in threads.reason
        assert rec.config.iothreads == 4 and rec.config.iothread is True
        iothread = next(d for d in rec.decisions if d.axis == "iothread")
        assert iothread.value == "on"
        assert ("args:" in threads.caveat) == (platform == "proxmox")


def test_levers_measured_under_tcg_are_not_recommended(tmp_path: Path) -> None:
    """The same significant queue gain measured in TCG guests: not evaluated, its evidence (and
    CPU per I/O) still shown, the default kept; the boolean iothread is not such a lever."""
    run = _run(tmp_path, AXES | {"num_queues": [1, 4]}, {"4": 1.5}, {"4": 1.3}, "num_queues",
               accelerator="tcg")
    assert run.emulated
    rec = recommend(run, "proxmox")
    queues = next(d for d in rec.decisions if d.axis == "num_queues")
    assert queues.status == "not evaluated" and queues.value is None    # QEMU's default
    assert "under TCG" in queues.reason and "KVM" in queues.reason
    four = next(e for e in queues.evidence if e.level == "4")
    assert four.iops.better is True and four.cpu is not None and four.cpu.pairs
    assert rec.config.num_queues is None
    assert PVE_TEXT["num_queues"] in queues.caveat


def test_affinity_is_reported_with_what_qm_set_can_say(tmp_path: Path) -> None:
    """CPU affinity is no disk setting: a run that varies it gets a note, and for Proxmox VE
    the note says what qm set --affinity can express."""
    configs = configurations("guest", AXES | {"vcpu_affinity": ["0", "1"]})
    run = stored_run(tmp_path / "a.sqlite", configs, WORKLOADS,
                     lambda c, w, i: Figures(1000.0 + i, 4096e3, 1e6, 2e6), samples=2)
    notes = {p: next(n for n in recommend(run, p).notes if n.startswith("vcpu_affinity"))
             for p in ("qemu", "proxmox")}
    assert PVE_TEXT["vcpu_affinity"] in notes["proxmox"]
    assert "qm set" not in notes["qemu"]


def test_iothreads_measured_under_tcg_keep_one_iothread(tmp_path: Path) -> None:
    """The same run under TCG: the count is not evaluated, and the recommended configuration is
    a valid one on every platform (one IOThread is no iothreads level, whatever iothread is)."""
    run = _threads_run(tmp_path, accelerator="tcg")
    for platform in ("qemu", "proxmox", "libvirt"):
        rec = recommend(run, platform)
        threads = next(d for d in rec.decisions if d.axis == "iothreads")
        assert threads.status == "not evaluated" and threads.value == "1"
        assert rec.config.iothreads is None
        assert {e.level for e in threads.evidence} == {"2", "4"}
