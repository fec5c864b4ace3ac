"""Page-cache honesty: the share of fio's bytes that reached the target's device, measured on
real blocklayer runs (writeback over a small image already read → near 0; cache=none, O_DIRECT →
near 1) and on made-up telemetry; the plan-time warning and ``working_set``; the [RAM] mark in
``show`` and the report; ``recommend`` never resting a cache mode on RAM without saying so."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from iomatrix.analysis.pagecache import MARK, MARK_UNKNOWN, summary
from iomatrix.analysis.points import points
from iomatrix.core.errors import NotEnoughSpace, SuiteError
from iomatrix.fio.samples import DirectionSample
from iomatrix.measure.runner import run_suite
from iomatrix.recommend.decide import recommend
from iomatrix.report.data import FROM_RAM, build_report_data
from iomatrix.store import Store
from iomatrix.store.records import StoredRun, StoredSuite, TrialResult
from iomatrix.suite import load_suite, load_suite_text
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.fields import uses_page_cache
from iomatrix.suite.target import Target
from iomatrix.suite.workloads import Workload
from iomatrix.targets.workspace import Workspace, page_cache_notes, plan_lines
from iomatrix.telemetry.host import DeviceSeries, HostSeries
from iomatrix.telemetry.pagecache import (NO_TELEMETRY, RAM_SHARE, UNKNOWN_DEVICE, DeviceShare,
                                          device_share)
from iomatrix.testing.synthetic import NOTE, configurations
from tests.conftest import write_suite
from tests.cli.test_cli_inprocess import invoke

GiB = 1 << 30
READ = Workload(rw="randread", bs=4096, iodepth=8)
WRITE = Workload(rw="randwrite", bs=4096, iodepth=8)


# -- the share, from telemetry --------------------------------------------------------------------

def _series(read_bytes_s: list[float], write_bytes_s: list[float] | None = None, *,
            device: str | None = "vda") -> HostSeries:
    n = len(read_bytes_s)
    zeros = (0.0,) * n
    disk = DeviceSeries(util_pct=zeros, queue_depth=zeros, read_iops=zeros, write_iops=zeros,
                        read_bytes_s=tuple(read_bytes_s),
                        write_bytes_s=tuple(write_bytes_s) if write_bytes_s else zeros)
    return HostSeries(interval_s=1.0, t=tuple(float(i + 1) for i in range(n)),
                      devices={"vda": disk}, intr_per_s=zeros, ctxt_per_s=zeros,
                      sampler_cpu_s=0.0, target_device=device)


def _sample(direction: str, bw: float, runtime_s: float = 10.0) -> DirectionSample:
    return DirectionSample(direction=direction, iops=bw / 4096, bw_bytes=bw,
                           io_bytes=int(bw * runtime_s), total_ios=int(bw * runtime_s / 4096),
                           runtime_ms=int(runtime_s * 1000))


def test_share_is_device_rate_over_fios_rate_in_the_measured_window() -> None:
    # ramp 2 s, runtime 10 s, the sampler stopped at 13 s: the last 10 s count but the final
    # interval (fio's exit), so [3,4] … [11,12]; the ramp's and the tail's do not
    rates = [9e9, 9e9] + [50e6] * 10 + [0.0]
    share = device_share(_series(rates), [_sample("read", 100e6)], ramp_s=2.0)
    assert share == DeviceShare(device="vda", read=0.5, write=None)
    assert share.known and not share.from_ram          # exactly half: not below the rule
    low = device_share(_series([0.0] * 12), [_sample("read", 100e6)], ramp_s=2.0)
    assert low.read == 0.0 and low.from_ram and "reads 0% reached vda" == low.text()
    # writes are judged alike: what the kernel wrote during the trial
    mixed = device_share(_series([100e6] * 12, [1e6] * 12),
                         [_sample("read", 100e6), _sample("write", 100e6)], ramp_s=2.0)
    assert (mixed.read, mixed.write, mixed.from_ram) == (1.0, 0.01, True)
    # fio started its I/O 1.6 s after the sampler (a busy host): the window is placed from the
    # end, so the idle start is not counted (from the start it was: 0.7, reads "from RAM")
    late = device_share(_series([0.0, 40e6, 100e6, 100e6, 100e6, 10e6]),
                        [_sample("read", 100e6, runtime_s=3.0)], ramp_s=0.5)
    assert late.read == 1.0, late
    # a trial shorter than a sampling interval: every interval counts
    short = device_share(_series([80e6]), [_sample("read", 100e6, runtime_s=0.5)], ramp_s=0.2)
    assert short.read == 0.8


def test_unknown_shares_say_why() -> None:
    reads = [_sample("read", 100e6)]
    assert device_share(None, reads, ramp_s=2.0).reason == NO_TELEMETRY
    # the probe looked and found no device (tmpfs, overlay, btrfs): "" — no guessing from
    # the host metadata then
    nothing = device_share(_series([0.0] * 12, device=""), reads, ramp_s=2.0, device="vda")
    assert nothing.reason == UNKNOWN_DEVICE and not nothing.known and not nothing.from_ram
    assert nothing.text().startswith("unknown: the target's block device could not be found")
    # a series stored before the probe named the device: the host metadata's is used
    old = device_share(_series([0.0] * 12, device=None), reads, ramp_s=2.0, device="vda")
    assert old.read == 0.0


def test_which_configurations_use_the_page_cache() -> None:
    def uses(**fields: object) -> bool:
        config = Configuration(**fields)  # type: ignore[arg-type]
        return uses_page_cache(config.mode, config.params())
    assert uses(mode="blocklayer", aio="threads", cache="writeback", format="raw")
    assert uses(mode="guest", aio="io_uring", cache="writethrough", format="raw")
    assert uses(mode="blocklayer", aio="threads", cache="unsafe", format="qcow2")
    assert not uses(mode="blocklayer", aio="native", cache="none", format="raw")
    assert not uses(mode="guest", aio="threads", cache="directsync", format="raw")
    assert not uses(mode="host")
    assert not uses_page_cache("imported", {"source": "dir"})   # no cache named: not judged


# -- real runs ------------------------------------------------------------------------------------

REAL = """
[matrix]
aio = "threads"
cache = "{cache}"
format = "raw"
iothread = false
[[workloads]]
rw = "randread"
bs = "4k"
iodepth = 8
[method]
mode = "blocklayer"
ramp = "500ms"
runtime = "3s"
"""


def _real_run(tmp_path: Path, device: Path, cache: str) -> tuple[StoredRun, HostSeries | None]:
    """One randread trial on a loop device of its own: /proc/diskstats then counts this trial's
    I/O alone, not what other processes of a shared host do to the disk meanwhile."""
    suite_file = tmp_path / "s.toml"
    suite_file.write_text('[suite]\nname = "pc"\n[target]\n'
                          f'device = "{device}"\nallow_destroy = true\n'
                          + REAL.format(cache=cache))
    with Store(tmp_path / "r.db") as store:
        outcome = run_suite(load_suite(suite_file), store)
        run = store.load_run(outcome.run_id)
        assert outcome.trials_ok == 1, run.trials
        return run, store.telemetry(run.trials[0].id)


@pytest.mark.slow
def test_writeback_over_an_image_in_ram_reads_from_ram(tmp_path: Path, loop_device: Path,
                                                        no_leftovers: None) -> None:
    # preconditioning wrote the 64 MiB device through the daemon's page cache: reads hit it
    run, series = _real_run(tmp_path, loop_device, "writeback")
    trial = run.trials[0]
    assert series is not None and series.target_device == loop_device.name
    assert trial.device_share is not None and trial.device_share.known
    assert trial.device_share.read is not None and trial.device_share.read < 0.1, trial.device_share
    (point,) = points(run)
    assert point.from_ram and summary([point]).from_ram == 1
    print(f"\nwriteback randread: {trial.device_share.read:.2%} of read bytes reached "
          f"{trial.device_share.device}")
    assert any(n.startswith("page cache: the images (64.0 MiB) are smaller than twice the "
                            "host's RAM") for n in run.notes), run.notes


@pytest.mark.slow
def test_cache_none_reads_reach_the_device(tmp_path: Path, loop_device: Path,
                                           no_leftovers: None) -> None:
    run, series = _real_run(tmp_path, loop_device, "none")
    trial = run.trials[0]
    assert trial.device_share is None            # direct I/O: not judged, never marked
    share = device_share(series, trial.samples, ramp_s=0.5)
    assert share.device == loop_device.name
    assert share.read is not None and 0.8 < share.read < 1.3, share
    print(f"\ncache=none randread: {share.read:.2%} of read bytes reached {share.device}")
    assert not any(n.startswith("page cache") for n in run.notes)


# -- plan time, working_set -----------------------------------------------------------------------

PLAN = """
[matrix]
aio = "threads"
cache = ["none", "writeback"]
format = "raw"
iothread = false
[method]
mode = "blocklayer"
"""


def _meminfo(tmp_path: Path, total: int) -> Path:
    proc = tmp_path / "proc"
    proc.mkdir(parents=True, exist_ok=True)
    (proc / "meminfo").write_text(f"MemTotal:       {total // 1024} kB\nMemFree: 1 kB\n")
    return proc


def test_plan_warns_when_the_image_fits_in_ram(tmp_path: Path) -> None:
    code, cap = invoke("run", str(write_suite(tmp_path, PLAN, size="64MiB")), "--plan")
    assert code == 0
    warning = next(line for line in cap.out().splitlines() if line.startswith("warning: page cache"))
    assert "cache=writeback" in warning and 'working_set = "exceed-ram"' in warning
    # direct caches only: nothing to warn about; in-ram: said on purpose
    direct = write_suite(tmp_path, PLAN.replace('["none", "writeback"]', '"none"'), name="d")
    assert "page cache" not in invoke("run", str(direct), "--plan")[1].out()
    meant = write_suite(tmp_path, PLAN, name="m")
    meant.write_text(meant.read_text().replace('size = "64MiB"',
                                               'size = "64MiB"\nworking_set = "in-ram"'))
    assert load_suite(meant).target.working_set == "in-ram"
    assert "page cache" not in invoke("run", str(meant), "--plan")[1].out()


def _configs(suite):  # type: ignore[no-untyped-def]
    from iomatrix.suite import expand

    return expand(suite).configurations


def test_run_notes_the_page_cache_and_exceed_ram_sizes_past_it(tmp_path: Path) -> None:
    suite = load_suite(write_suite(tmp_path, PLAN, size="64MiB"))
    proc = _meminfo(tmp_path, 8 * GiB)
    workspace = Workspace(suite.target, proc_root=proc).check(_configs(suite))
    assert workspace.size == 64 << 20
    assert [n for n in workspace.notes if n.startswith("page cache")], workspace.notes
    # exceed-ram: twice MemTotal, checked against free space before anything is created
    past = suite.target.model_copy(update={"working_set": "exceed-ram"})
    small = _meminfo(tmp_path / "small", 48 << 20)
    workspace = Workspace(past, proc_root=small).check(_configs(suite))
    assert workspace.size == 96 << 20 and workspace.notes == []
    assert 'exceed-ram": 1 image(s) of 96.0 MiB' in plan_lines(past, _configs(suite),
                                                               meminfo=small / "meminfo")[0]
    huge = _meminfo(tmp_path / "huge", 1 << 60)
    with pytest.raises(NotEnoughSpace, match='working_set = "exceed-ram" needs 1 image'):
        Workspace(past, proc_root=huge).check(_configs(suite))
    assert "the run will refuse: not enough space" in plan_lines(
        past, _configs(suite), meminfo=huge / "meminfo")[0]
    assert not (tmp_path / "target").exists()          # nothing created by a check


def test_working_set_is_validated(tmp_path: Path) -> None:
    base = '[suite]\nname = "t"\n[target]\ndirectory = "/var/tmp/x"\n'
    with pytest.raises(SuiteError, match="working_set"):
        load_suite_text(base + 'size = "1GiB"\nworking_set = "huge"\n', source="t.toml")
    # exceed-ram needs no size: the image is twice the host's RAM
    target = load_suite_text(base + 'working_set = "exceed-ram"\n', source="t.toml").target
    assert target.size is None and target.working_set == "exceed-ram"
    with pytest.raises(SuiteError, match="needs a size"):
        load_suite_text(base, source="t.toml")
    notes = page_cache_notes(Target(directory=Path("/var/tmp/x"), size=GiB),
                             [Configuration(mode="blocklayer", aio="threads", cache="writeback")],
                             GiB, 8 * GiB)
    assert notes and "(1.0 GiB)" in notes[0] and "(8.0 GiB)" in notes[0]


# -- show, report, recommend on made-up runs ------------------------------------------------------

def _write(store: Store, share: dict[str, float | None], *, working_set: str = "size",
           speed: float = 1.6) -> int:
    """Guests, cache none × writeback, three samples; writeback ``speed`` times faster, with
    ``share[cache]`` of fio's bytes reaching the device (None: no telemetry stored)."""
    configs = configurations("guest", {"controller": ["virtio-blk"], "aio": ["threads"],
                                       "iothread": [True], "cache": ["none", "writeback"],
                                       "format": ["raw"]})
    workloads = [READ, WRITE, Workload(rw="randread", bs=4096, iodepth=32)]
    text = (f'[suite]\nname = "synthetic"\n[target]\ndirectory = "/var/tmp/x"\nsize = "64MiB"\n'
            f'working_set = "{working_set}"\n')
    run_id = store.create_run(suite=StoredSuite(name="synthetic", source="synthetic", text=text),
                              host={"hostname": "synthetic", "target_device": "/dev/vda"},
                              accelerator="kvm", notes=[NOTE], configs=configs,
                              workloads=workloads, seed=0)
    for index in range(3):
        for config in configs:
            for workload in workloads:
                rng = random.Random(f"{config.key}{workload.key}{index}")
                iops = 10000 * (speed if config.cache == "writeback" else 1.0) * (1 + rng.gauss(0, .01))
                direction = "write" if workload.rw == "randwrite" else "read"
                sample = _sample(direction, iops * 4096).model_copy(update={
                    "lat_mean_ns": workload.iodepth / iops * 1e9, "p50_ns": 1e5, "p99_ns": 2e5})
                fraction = share.get(str(config.cache))
                series = None
                if fraction is not None:
                    rate = [sample.bw_bytes * fraction] * 12
                    series = (_series(rate) if direction == "read" else _series([0.0] * 12, rate))
                store.record_trial(run_id, TrialResult(
                    config_key=config.key, workload_key=workload.key, sample_index=index,
                    status="ok", started_at="2026-01-01T00:00:00", samples=(sample,),
                    wall_seconds=10.0, accelerator="kvm", telemetry=series))
    store.finish_run(run_id, "complete")
    return run_id


def test_show_marks_points_served_from_ram(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    with Store(db) as store:
        _write(store, {"none": 1.0, "writeback": 0.02})
        _write(store, {"none": 1.0, "writeback": None})
    code, cap = invoke("show", "1", "--db", str(db))
    assert code == 0
    lines = cap.out().splitlines()
    rows = [line for line in lines if line.startswith(" guest")]
    assert rows and all((MARK in r) == ("writeback" in r) for r in rows), rows
    legend = next(line for line in lines if line.startswith(f"{MARK}:"))
    assert f"less than {RAM_SHARE:.0%} of fio's read bytes" in legend
    assert "3 of 3 page-cache points (reads 2% reached the device; writes 2% reached" in legend
    # no telemetry: the mark says unknown, and why
    code, cap = invoke("show", "2", "--db", str(db))
    out = cap.out()
    assert MARK_UNKNOWN in out and f"{MARK}:" not in out
    assert "the trial stored no host disk telemetry" in out


def test_report_counts_points_served_from_ram(tmp_path: Path) -> None:
    with Store(tmp_path / "r.db") as store:
        data = build_report_data(store.load_run(_write(store, {"writeback": 0.02, "none": 1.0})))
    q = data.quality
    assert (q.points_page_cache, q.points_from_ram, q.points_ram_unknown) == (3, 3, 0)
    assert "reached the target's device" in q.ram_rule
    flagged = [p for p in data.points if FROM_RAM in p.flags]
    assert len(flagged) == 3 and all("writeback" in data.configs[p.config].key for p in flagged)


def test_recommend_never_rests_a_cache_mode_on_ram_without_saying_so(tmp_path: Path) -> None:
    with Store(tmp_path / "r.db") as store:
        ram = store.load_run(_write(store, {"writeback": 0.02, "none": 1.0}))
        disk = store.load_run(_write(store, {"writeback": 0.9, "none": 1.0}))
        meant = store.load_run(_write(store, {"writeback": 0.02, "none": 1.0},
                                      working_set="in-ram"))

    def cache(run: StoredRun):  # type: ignore[no-untyped-def]
        return next(d for d in recommend(run, "proxmox").decisions if d.axis == "cache")

    # served from RAM: +60 % measured, but the default is kept, and the row says why
    d = cache(ram)
    assert (d.status, d.value) == ("keep", "none"), d.reason
    assert d.evidence[0].iops.better is True
    assert "writeback measured better but 3 of 3 of its points were served from the host page " \
           "cache" in d.reason
    assert 'working_set = "exceed-ram"' in d.reason
    assert "evidence served from the host page cache" in d.caveat and "3 of 3 points, 2% reached the device" in d.caveat
    # reaching the device: recommended as before, with writeback's own caveat only
    d = cache(disk)
    assert (d.status, d.value) == ("change", "writeback")
    assert "page cache" not in d.caveat.replace("host page cache until", "")
    # the suite said RAM is what it measures: recommended, and the caveat says so
    d = cache(meant)
    assert (d.status, d.value) == ("change", "writeback")
    assert 'as the suite asked ([target] working_set = "in-ram")' in d.caveat


def test_stored_shares_are_derived_not_stored(tmp_path: Path) -> None:
    """The share is computed when a run is loaded, from the telemetry and samples already
    stored: the schema did not change, and a trial's telemetry JSON names the device."""
    with Store(tmp_path / "r.db") as store:
        run = store.load_run(_write(store, {"writeback": 0.3, "none": 1.0}))
        stored = json.loads(store.conn.execute(
            "SELECT telemetry_json FROM trials WHERE id = ?", (run.trials[0].id,)).fetchone()[0])
    assert stored["target_device"] == "vda"
    shares = {t.device_share.read for t in run.trials
              if t.device_share is not None and t.device_share.read is not None}
    assert shares == {0.3}


def test_a_finding_on_cache_modes_says_when_its_points_came_from_ram(tmp_path: Path) -> None:
    from iomatrix.analysis.findings import evaluate
    from iomatrix.suite.findings import Finding

    claim = Finding(id="t-writeback", study="test", claim="writeback beats none",
                    published="+98 %", kind="effect", axis="cache", level="writeback",
                    reference="none", expect="better", modes=("guest",))
    with Store(tmp_path / "r.db") as store:
        ram = store.load_run(_write(store, {"writeback": 0.02, "none": 1.0}))
        disk = store.load_run(_write(store, {"writeback": 0.9, "none": 1.0}))
    check = evaluate(ram, [claim]).results[0].checks[0]
    assert check.measured and "served from the host page cache" in check.reason
    assert "cache=writeback: 3 of 3" in check.reason and "cache=none" not in check.reason
    check = evaluate(disk, [claim]).results[0].checks[0]
    assert check.measured and "page cache" not in check.reason
