"""Impossible figures for real, from the host page cache: a device slower than the page cache
(a loop device over a qemu-storage-daemon FUSE export throttled to 200 IOPS, the loop with
direct I/O), measured bare (host mode, O_DIRECT), through QEMU's block layer with cache=none
(to the device) and with cache=writeback (random writes the page cache absorbs). Only the
writeback point is faster than the run's own bare metal: marked, reported and kept out of
recommend's evidence. The same run holds the device mid-trial under cache=none: that trial is
marked stalled, from fio's own IOPS log (blocklayer mode; guests: test_stalls.py).
(librbd's cache: tests/scenarios/test_rbd.py; the rule on made-up runs:
tests/analysis/test_impossible.py.)"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from iomatrix.analysis.impossible import MARK, Faster, of_run, without_faster
from iomatrix.analysis.pagecache import MARK as RAM
from iomatrix.analysis.stalls import by_config
from iomatrix.core.proc import managed, wait_for
from iomatrix.fio.persecond import FIO_LOG, STALL_S
from iomatrix.qemu.qmp import qmp_execute
from iomatrix.recommend.decide import recommend
from iomatrix.report.data import FASTER_THAN_BARE, FROM_RAM, build_report_data
from iomatrix.store import Store
from iomatrix.store.records import StoredRun
from tests.conftest import cli, cli_result
from tests.needs import lacking

pytestmark = pytest.mark.slow

IOPS = 200
QMP = "qsd.qmp"
SUITE = """[suite]
name = "slow"
[target]
device = "{device}"
allow_destroy = true
[matrix]
aio = "threads"
cache = ["none", "writeback"]
format = "raw"
iothread = false
[[workloads]]
rw = "randwrite"
iodepth = 4
bs = "4k"
[method]
baseline = true
mode = "blocklayer"
ramp = "300ms"
runtime = "2s"
samples = 1
"""

@pytest.fixture
def slow_device(tmp_path: Path) -> Iterator[Path]:
    """A 64 MiB block device that serves ``IOPS`` requests a second (direct I/O throughout):
    throttle group ``tg`` of a qemu-storage-daemon whose QMP socket is ``QMP`` in ``tmp_path``."""
    from iomatrix.diagnose.doctor import check_fuse

    if not check_fuse().ok:
        lacking("fuse", f"FUSE exports do not work here: {check_fuse().detail}")
    image, disk = tmp_path / "slow.img", tmp_path / "slow.disk"
    image.write_bytes(b"")
    subprocess.run(["truncate", "-s", "64M", str(image)], check=True)
    disk.touch()
    argv = ["qemu-storage-daemon", "--object", f"throttle-group,id=tg,x-iops-total={IOPS}",
            "--blockdev", f"file,filename={image},node-name=f,cache.direct=on",
            "--blockdev", "throttle,node-name=t,throttle-group=tg,file=f",
            "--export", f"fuse,id=e,node-name=t,mountpoint={disk},writable=on",
            "--chardev", f"socket,id=m,path={tmp_path / QMP},server=on,wait=off",
            "--monitor", "chardev=m"]
    with managed(argv, log=tmp_path / "qsd.log"):
        assert wait_for(lambda: f" {disk} " in Path("/proc/self/mountinfo").read_text(),
                        timeout=10), (tmp_path / "qsd.log").read_text()
        try:
            loop = subprocess.run(["losetup", "--find", "--show", "--direct-io=on", str(disk)],
                                  capture_output=True, text=True, check=True).stdout.strip()
        except (subprocess.CalledProcessError, FileNotFoundError) as exc:
            lacking("loop", f"loop devices unavailable here: {exc}")
        try:
            yield Path(loop)
        finally:
            subprocess.run(["losetup", "-d", loop], capture_output=True)


def only_writeback_is_faster(db: Path, storage: str = "other") -> tuple[StoredRun, Faster, str]:
    """The run stored in ``db``, whose one point faster than bare metal must be its
    cache=writeback configuration's, checked as show, the report and recommend give it (not
    cache=none's; recommend for Proxmox VE's ``storage``): the run, how it was faster, and
    show's line of it."""
    with Store(db, readonly=True) as store:
        run = store.load_run(1)
    configs = {c.params.get("cache", "host"): c for c in run.configs}
    faster = of_run(run)
    assert [c for c, _ in faster] == [configs["writeback"].key], faster
    status, text = cli("show", "1", "--db", str(db))
    marked = [line for line in text.splitlines() if MARK in line and "QD4" in line]
    assert status == 0 and len(marked) == 1 and configs["writeback"].label in marked[0], text
    views = build_report_data(run).points
    assert sum(FASTER_THAN_BARE in v.flags for v in views) == 1
    _, note = without_faster(run)
    assert configs["writeback"].label in note and configs["none"].label not in note
    assert note in recommend(run, "proxmox", storage=storage).notes
    (why,) = faster.values()
    return run, why, marked[0]


def test_a_point_the_page_cache_served_is_faster_than_bare_metal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_leftovers: None,
        slow_device: Path) -> None:
    from iomatrix.drivers.blocklayer import BlocklayerSession

    observe, paused = BlocklayerSession.observe, []

    def limits(bps: int) -> None:
        qmp_execute(tmp_path / QMP, [("qom-set", {
            "path": "/objects/tg", "property": "limits",
            "value": {"iops-total": IOPS, "bps-total": bps}})])

    def pause(self: BlocklayerSession, fio_pid: int) -> None:
        """cache=none's trial: one 4 KiB request through in 2 s, for 1 s (a request already
        waiting keeps its time: those fio keeps queued wait past the trial's runtime)."""
        observe(self, fio_pid)
        if self.config.cache == "none":
            limits(2048)
            time.sleep(1.0)
            limits(0)
            paused.append(self.config.key)

    monkeypatch.setattr(BlocklayerSession, "observe", pause)
    suite = tmp_path / "slow.toml"
    suite.write_text(SUITE.format(device=slow_device))
    done = cli_result("run", str(suite), "--db", str(tmp_path / "r.db"), cwd=tmp_path)
    assert done.returncode == 0 and paused, done.stdout + done.stderr
    run, why, line = only_writeback_is_faster(tmp_path / "r.db")
    assert why.why[0].startswith("IOPS ") and "write bandwidth" in why.text, why
    assert RAM in line
    views = build_report_data(run).points
    assert [FASTER_THAN_BARE in v.flags for v in views if FROM_RAM in v.flags] == [True]
    # the held trial: stored ok and stalled, from fio's log, no longer than fio's slowest
    # request waited (one was queued throughout); whether this host's load stalled another is
    # not assumed either way
    stalled = {t.config_key: t for t in run.trials if t.stalled}
    assert paused[0] in stalled, [(t.config_key, t.stall) for t in run.trials]
    trial = stalled[paused[0]]
    assert trial.stall is not None and trial.stall.source == FIO_LOG, trial.stall
    longest = (trial.samples[0].lat_max_ns or 0) / 1e9
    assert STALL_S <= (trial.stall.longest_s or 0) <= longest + 0.1, (trial.stall, longest)
    assert all(t.stall is not None and t.stall.checked for t in run.trials)
    # run says which configurations stalled, as show and findings do
    said = [line for line in done.stdout.splitlines() if line.startswith("stalled: ")]
    assert said == [f"stalled: {one.text} (out of its figures unless --with-stalled: iomatrix "
                    f"show 1)" for one in by_config(run)] and said, done.stdout
