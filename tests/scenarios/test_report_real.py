"""The report of a real run: host baseline and two blocklayer configurations measured by fio, with
CPU probes, twice each; every section it feeds draws in Chromium. Screenshot:
``test-artifacts/report-real-run.png``."""

from __future__ import annotations

from pathlib import Path

import pytest

from iomatrix.report.data import build_report_data
from iomatrix.report.html import write_report
from iomatrix.measure.runner import run_suite
from iomatrix.recommend.decide import recommend
from iomatrix.store import Store
from iomatrix.suite import load_suite
from tests.browser import open_page
from tests.conftest import REPO, write_suite
from tests.needs import needs

pytestmark = [pytest.mark.slow, needs("chromium")]

SUITE = """
[matrix]
aio = ["threads", "io_uring"]
cache = "none"
format = "raw"
iothread = false
[[workloads]]
rw = "randread"
bs = "4k"
iodepth = [1, 8]
[method]
mode = "blocklayer"
baseline = true
samples = 2
ramp = "100ms"
runtime = "500ms"
"""


def test_report_of_a_real_run(tmp_path: Path, no_leftovers: None) -> None:
    suite = load_suite(write_suite(tmp_path, SUITE, size="16MiB"))
    with Store(tmp_path / "r.db") as store:
        outcome = run_suite(suite, store)
        run = store.load_run(outcome.run_id)
    assert outcome.trials_failed == 0
    data = build_report_data(run)
    assert data.method == {"mode": "blocklayer", "baseline": "on", "samples": "2", "ramp": "100ms",
                           "runtime": "500ms"}
    assert data.host["fio"].startswith("fio-3") and not data.emulated
    guests = [p for p in data.points if data.configs[p.config].mode == "blocklayer"]
    assert len(guests) == 4 and all(p.iops_low is not None and p.iops_pct for p in guests)
    assert all(p.cpu_us_per_io and "fio (host)" in p.cpu_roles for p in data.points)
    assert [s.axis for s in data.gains if s.metric == "iops"] == ["aio"]
    proxmox = data.recommendations[0]
    aio = next(d for d in proxmox.decisions if d.name.startswith("Async IO"))
    assert aio.mode == "blocklayer" and aio.evidence
    # the CPU per I/O beside each gain comes from the trials' real probes, over the same pairs
    decided = next(d for d in recommend(run, "qemu").decisions if d.axis == "aio")
    for e in decided.evidence:
        assert e.cpu is not None and e.cpu.pairs == len(run.workloads), e
        assert e.cpu.level_us and e.cpu.reference_us and e.cpu.short() in e.text()
    path = write_report(data, tmp_path / "report")
    with open_page(path, block_network=True) as page:
        assert page.problems == [] and page.external_requests == []
        drawn = page.evaluate("[...document.querySelectorAll('.chart')].map((c) => [c.dataset.testid,"
                              " c.dataset.drawn, !!c.querySelector('.main-svg')])")
        assert {d[0] for d in drawn} >= {"chart-iops-randread-4k-j1", "chart-cpu-randread-4k-j1",
                                          "chart-roles", "chart-bare_iops-randread-4k-j1",
                                          "chart-gain-aio"}
        assert all(d[1] == "1" and d[2] for d in drawn), drawn
        traces = page.evaluate("document.querySelector('[data-testid=chart-iops-randread-4k-j1]')"
                               ".data.map((t) => [t.name, t.x.length, !!t.error_y])")
        assert sorted(traces) == sorted([c.label, 2, True] for c in data.configs)
        assert page.count("[data-testid=point-row]") == len(data.points) == 6
        page.screenshot(REPO / "test-artifacts/report-real-run.png")
