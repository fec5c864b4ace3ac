"""The report's lever charts (issue 35): IOPS and host CPU per I/O against IOThreads per disk
and against queues, where a run varies them, drawn in real headless Chromium from a synthetic
run (real SQLite store, made-up figures)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from iomatrix.report.data import build_report_data
from iomatrix.report.html import render_html, write_report
from iomatrix.report.levers import lever_level
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.workloads import Workload
from iomatrix.testing.synthetic import Figures, configurations, stored_run
from iomatrix.vocab.axes import BY_NAME

from tests.browser import chromium, open_page
from tests.needs import needs

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
WORKLOADS = [Workload(rw="randread", bs=4096, iodepth=qd) for qd in (1, 32)]
THREADS = [None, 2] if "iothreads" in BY_NAME else [None]


def _threads(config: Configuration) -> int:
    return lever_level("iothreads", config.params()) or 0


def lever_run(tmp: Path):  # type: ignore[no-untyped-def]
    """virtio-blk and virtio-scsi-single × IOThreads 0/1(/2) × 1, 2, 4 queues, with CPU per
    I/O; a host baseline that takes part in neither lever."""
    axes: dict[str, list[object]] = {"controller": ["virtio-blk", "virtio-scsi-single"],
                                     "aio": ["io_uring"], "iothread": [False, True],
                                     "num_queues": [1, 2, 4]}
    configs = [c for c in configurations("guest", axes)]
    if "iothreads" in BY_NAME:
        configs += configurations("guest", axes | {"iothread": [True], "iothreads": [2]})
    configs = [Configuration(mode="host"), *configs]

    def figures(config: Configuration, workload: Workload, index: int) -> Figures:
        rng = random.Random(f"{config.key}|{workload.key}|{index}")
        iops = 5000 * workload.iodepth ** 0.5 * (1 + _threads(config)) ** 0.5
        iops *= (config.num_queues or 1) ** 0.2 * rng.uniform(0.99, 1.01)
        lat = workload.iodepth / iops * 1e9
        return Figures(iops, iops * 4096, lat, 2 * lat,
                       cpu_us_per_io=10 * (1 + 0.3 * _threads(config)) * rng.uniform(0.99, 1.01))
    return stored_run(tmp / "levers.sqlite", configs, WORKLOADS, figures, accelerator="tcg")


def test_levers_in_the_view_model(tmp_path: Path) -> None:
    data = build_report_data(lever_run(tmp_path))
    host = [c for c in data.configs if c.mode == "host"]
    assert host and all(not c.levers for c in host)
    guests = [c for c in data.configs if c.mode == "guest"]
    threads = {c.levers["iothreads"].level for c in guests}
    assert threads == ({0, 1, 2} if len(THREADS) > 1 else {0, 1})
    assert {c.levers["num_queues"].level for c in guests} == {1, 2, 4}
    for c in guests:            # a line's label names neither the lever nor its level
        assert " q=" not in c.levers["num_queues"].family
        assert "iothread" not in c.levers["iothreads"].family
        assert c.levers["iothreads"].family.endswith("[emulated: TCG]")
    # each line of the queues chart: one configuration per queue count
    lines: dict[str, list[int]] = {}
    for c in guests:
        lines.setdefault(c.levers["num_queues"].family, []).append(c.levers["num_queues"].level)
    assert all(sorted(v) == [1, 2, 4] for v in lines.values())
    assert 'data-testid="chart-lever-num_queues-cpu"' in render_html(data)


def test_no_lever_chart_without_a_varied_lever(tmp_path: Path) -> None:
    configs = configurations("guest", {"controller": ["virtio-blk"], "aio": ["native", "io_uring"],
                                       "iothread": [True]})
    run = stored_run(tmp_path / "n.sqlite", configs, WORKLOADS,
                     lambda c, w, i: Figures(1000.0 + i, 4096e3, 1e6, 2e6), samples=2)
    data = build_report_data(run)
    assert all(not c.levers for c in data.configs)
    assert 'id="levers"' not in render_html(data)


@pytest.mark.slow
@needs("chromium")
def test_lever_charts_draw_in_chromium(tmp_path: Path) -> None:
    data = build_report_data(lever_run(tmp_path))
    path = write_report(data, tmp_path / "report")
    with chromium() as browser, open_page(path, browser=browser, block_network=True) as page:
        assert page.problems == []
        charts = page.evaluate("""() => Object.fromEntries([...document.querySelectorAll(
            '.chart[data-kind="scale"][data-axis]')].map((c) => [c.dataset.testid, {drawn: c.dataset.drawn,
            title: c._fullLayout.title.text, xtitle: c._fullLayout.xaxis.title.text,
            traces: (c.data || []).map((t) => ({name: t.name, x: [...t.x], y: [...t.y],
                                                error: !!(t.error_y && t.error_y.visible)}))}]))""")
        assert set(charts) == {f"chart-lever-{lever}-{m}" for lever in ("iothreads", "num_queues")
                               for m in ("iops", "cpu")}
        assert all(c["drawn"] == "1" and c["traces"] for c in charts.values())
        queues = charts["chart-lever-num_queues-iops"]
        assert queues["xtitle"] == "queues (num_queues)" and "QD1" in queues["title"]
        assert all(t["x"] == [1, 2, 4] and t["error"] for t in queues["traces"])
        expected = {c.levers["num_queues"].family for c in data.configs if c.levers}
        assert {t["name"] for t in queues["traces"]} == expected
        threads = charts["chart-lever-iothreads-cpu"]
        levels = [0, 1, 2] if len(THREADS) > 1 else [0, 1]
        assert all(t["x"] == levels for t in threads["traces"])
        # the CPU chart shows the points' own CPU per I/O, in the order of the levels
        first = data.workloads[0].key
        by_config = {data.configs[p.config].key: p.cpu_us_per_io for p in data.points
                     if data.workloads[p.workload].key == first}
        trace = threads["traces"][0]
        want = sorted((c.levers["iothreads"].level, by_config[c.key]) for c in data.configs
                      if c.levers and c.levers["iothreads"].family == trace["name"])
        assert trace["y"] == pytest.approx([v for _, v in want], rel=1e-3)
        # the workload selector redraws the lever charts for the other queue depth
        page.page.get_by_test_id("levers-workload").select_option(index=1)
        page.page.wait_for_function("document.documentElement.dataset.charts === 'ready'")
        title = page.evaluate("""() => document.querySelector(
            '[data-testid="chart-lever-num_queues-iops"]')._fullLayout.title.text""")
        assert "QD32" in title
        ARTIFACTS.mkdir(exist_ok=True)
        page.page.locator("#levers").screenshot(path=str(ARTIFACTS / "report-levers.png"))
        assert page.problems == []
