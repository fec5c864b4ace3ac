"""Stalls for real: a TCG guest whose disk QEMU holds (QMP throttle) for 3 s in the middle of a
trial; the trial is measured, and marked stalled."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from iomatrix.drivers.guest import GuestSession
from iomatrix.fio.persecond import QEMU_COUNTERS
from iomatrix.qemu.args import disk_backend
from iomatrix.qemu.qmp import qmp_execute
from iomatrix.analysis.findings import evaluate
from iomatrix.analysis.points import points
from iomatrix.analysis.stalls import MARK, by_config, with_stalled
from iomatrix.report.data import build_report_data
from tests.conftest import cli, run_guests
from tests.scenarios.test_guest import METHOD

pytestmark = pytest.mark.slow

PAUSE_S = 3.0
LIMITS = ("bps", "bps_rd", "bps_wr", "iops", "iops_rd", "iops_wr")


def _throttle(session: GuestSession, bps: int) -> None:
    """The guest's disk limited to ``bps`` bytes a second (0: no limit). One byte a second
    holds every request after the first (a 4 KiB request waits an hour) while the guest's fio
    keeps its queue full: a paused I/O path with I/O queued. QMP's ``stop`` would not do: it
    drains the queue and stops the guest's clock, so fio inside sees no gap at all."""
    socket = session.guests[0].qmp_socket
    with session._lock:
        disk = disk_backend(qmp_execute(socket, [("query-block", None)])[0])
        assert disk is not None
        limits = dict.fromkeys(LIMITS, 0) | {"bps": bps}
        qmp_execute(socket, [("block_set_io_throttle", {"id": disk["qdev"], **limits})])


def test_a_guest_whose_disk_pauses_mid_trial_is_marked_stalled(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_leftovers: None) -> None:
    """Two trials of one configuration; in the first, QEMU holds the disk's requests for 3 s
    mid-trial (fio is left running: the trial ends as measured). It is stored ok and stalled,
    from QEMU's counters, its longest span without a completion at least about the pause; the
    second, left alone, is judged too (whether this host's load stalled it is read, not
    assumed)."""
    observe = GuestSession.observe
    paused: list[float] = []

    def pause_once(self: GuestSession, fio_pid: int) -> None:
        observe(self, fio_pid)
        if paused:
            return
        _throttle(self, 1)
        start = time.monotonic()
        time.sleep(PAUSE_S)
        _throttle(self, 0)
        paused.append(time.monotonic() - start)

    monkeypatch.setattr(GuestSession, "observe", pause_once)
    outcome, stored = run_guests(tmp_path, '[matrix]\ncontroller = "virtio-blk"\n' + METHOD.replace(
        'runtime = "1s"', 'runtime = "6s"\nsamples = 2'))
    assert outcome.trials_failed == 0, [t.reason for t in stored.trials]
    first, second = sorted(stored.trials, key=lambda t: t.started_at)
    assert paused and first.stall is not None and second.stall is not None
    assert first.stall.checked and first.stall.source == QEMU_COUNTERS
    assert first.stall.stalled and first.stall.stalls >= 1, first.stall
    # the span seen is a lower bound: the pause less at most a read interval either side (no
    # upper bound: a loaded host may take longer to resume the guest's I/O)
    assert (first.stall.longest_s or 0) >= PAUSE_S - 1.0, first.stall
    # the second trial, left alone, is judged too; whether it stalled is this host's load to
    # say (a starved TCG guest may go a second without a completion), so what follows is
    # checked against what was stored, not assumed
    assert second.stall.checked, second.stall
    stalled = [t for t in (first, second) if t.stall is not None and t.stall.stalled]
    assert not [t for t in threading.enumerate() if t.name == "stall-sampler"]
    # analysis: the stalled trial is left out of its point (and gains) unless asked, its
    # configuration is a finding, show and the report mark it
    (point,) = points(stored)
    assert (point.samples, point.stalled) == (2 - len(stalled), len(stalled))
    if len(stalled) == 1:
        assert point.iops == pytest.approx(second.samples[0].iops)
    (kept,) = points(with_stalled(stored))
    assert (kept.samples, kept.stalled) == (2, len(stalled))
    (config,) = stored.configs
    longest = max(t.stall.longest_s or 0 for t in stalled if t.stall is not None)
    assert [s.text for s in by_config(stored)] == list(evaluate(stored).stalls) == [
        f"{config.label}: {len(stalled)} of 2 checked trials stalled (longest "
        f"{longest:.1f} s without a completion)"]
    status, text = cli("show", "last", "--db", str(tmp_path / "r.db"))
    assert status == 0 and f"{MARK}" in text, text
    assert f"{2 - len(stalled)} ({len(stalled)} stalled)" in text, text
    assert f"stalls: {config.label}: {len(stalled)} of 2" in text, text
    status, text = cli("show", "last", "--db", str(tmp_path / "r.db"), "--with-stalled")
    assert status == 0 and f"2 ({len(stalled)} stalled, in)" in text, text
    quality = build_report_data(stored).quality
    assert list(quality.stalls) == list(evaluate(stored).stalls)

