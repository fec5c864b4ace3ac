"""The built-in suite ``iothreads`` (issue 35): IOThreads per disk 0/1/2/4 × queues × queue
depth on virtio-blk and virtio-scsi-single with a host baseline, at its scales; and on a QEMU
without iothread-vq-mapping the levels it cannot run are skipped with a note naming the QEMU
needed, the rest measured (``measure.prepare``), not the run refused."""

from __future__ import annotations

import pytest

from iomatrix.measure.prepare import prepare
from iomatrix.qemu import version as qemu_version
from iomatrix.suite import expand, load_suite
from iomatrix.suite.plan import estimate


def _count(config) -> int:  # type: ignore[no-untyped-def]
    return 0 if not config.iothread else (config.iothreads or 1)


@pytest.mark.parametrize("scale", [None, "full", "quick"])
def test_the_matrix_at_each_scale(scale: str | None) -> None:
    suite = load_suite("iothreads", scale=scale)
    exp = expand(suite)
    host = [c for c in exp.configurations if c.mode == "host"]
    guests = [c for c in exp.configurations if c.mode == "guest"]
    assert len(host) == 1                                    # the bare-metal baseline
    controllers = {"virtio-blk"} if scale == "quick" else {"virtio-blk", "virtio-scsi-single"}
    threads = {0, 1, 2} if scale == "quick" else {0, 1, 2, 4}
    queues = {1, 2} if scale == "quick" else {1, 4}
    assert {(c.controller, _count(c), c.num_queues) for c in guests} == {
        (k, n, q) for k in controllers for n in threads for q in queues}
    assert len(guests) == len(controllers) * len(threads) * len(queues)
    # iothreads without an IOThread is skipped with iomatrix's reason, never measured
    assert any("needs iothread = true" in s.reason for s in exp.skipped)
    assert not exp.under_tcg                                 # every guest trial under TCG too
    if scale == "quick":
        assert {w.iodepth for w in exp.workloads} == {1, 16}
        assert estimate(exp, suite.method).seconds < 10 * 60


def test_this_qemu_measures_what_it_can() -> None:
    """Prepared on this host: with QEMU 9.0 or later every level is kept; before 9.0 (Debian
    12's 7.2) the 2-IOThread configurations are skipped, each with a note naming QEMU 9.0 and
    this host's version, and the rest of the matrix is measured."""
    found = qemu_version.installed("qemu-system-x86_64")
    if found is None:
        pytest.skip("qemu-system-x86_64 is not installed")
    prepared = prepare(load_suite("iothreads", scale="quick"), accel="tcg", seed=1)
    full = prepared.full
    counts = {_count(c) for c in full.configurations if c.mode == "guest"}
    need = qemu_version.IOTHREAD_VQ_MAPPING["virtio-blk"]
    if found >= need:
        assert counts == {0, 1, 2}
        return
    assert counts == {0, 1}
    dropped = [s for s in full.skipped if s.configuration.iothreads and s.configuration.iothread]
    assert len(dropped) == 2                                  # 1 and 2 queues
    for s in dropped:
        assert f"QEMU {qemu_version.shown(need)}" in s.reason
        assert qemu_version.shown(found) in s.reason
        assert any(s.configuration.key in n for n in full.notes)
    assert prepared.expansion.configurations == full.configurations   # TCG runs them all
