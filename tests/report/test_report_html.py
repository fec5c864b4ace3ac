"""The HTML report of synthetic runs (real SQLite store, made-up figures): a self-contained page
whose every chart really draws in headless Chromium, with each section the issue asks for.
Screenshots go to ``test-artifacts/`` at the repository root (gitignored)."""

from __future__ import annotations

import math
import os
import random
import re
import zlib
from html.parser import HTMLParser
from pathlib import Path

import pytest

from iomatrix.analysis.metrics import METRICS
from iomatrix.report.export import samples_csv
from iomatrix.report.data import CI_OVER, FAILED, STEADY_MISSED, ReportData, build_report_data
from iomatrix.report.html import (packed, rounded, read_data_json, render_html, unpacked,
                                  write_report)
from iomatrix.store.records import CpuRecord, SteadyRecord, StoredRun, StoredSuite
from iomatrix.store import Store
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.workloads import Workload
from iomatrix.telemetry.steady import SteadyState
from iomatrix.testing.synthetic import Figures, configurations, stored_run

from tests.browser import chromium, open_page
from tests.needs import needs

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
BLOCK_SIZES = (4096, 16384, 65536)
DEPTHS = (1, 4, 16)
NOISY = "host"
STORAGE = {"directory": "/var/lib/vz/images", "size": "4GiB",
           "from_storage": {"id": "local", "type": "dir"}}
"""The seed 000 run's [target]: a Proxmox VE dir storage's images directory, as iomatrix
resolves ``--storage local`` (``measure.pvestorage``)."""


# --- synthetic runs -------------------------------------------------------------------------------


def _rng(*parts: object) -> random.Random:
    return random.Random(zlib.crc32("|".join(map(str, parts)).encode()))


def seed000_figures(config: Configuration, workload: Workload, index: int) -> Figures | None:
    """Seed 000's shape: an iothread adds 10 % IOPS, the aio mode changes nothing; the host
    baseline is noisy (its CI is wide) and one of its trials failed."""
    if config.key == NOISY and workload.iodepth == 16 and workload.bs == 4096 and index == 1:
        return None
    spread = 0.12 if config.key == NOISY else 0.01
    iops = 40_000 * workload.iodepth ** 0.5 * (4096 / workload.bs) ** 0.5
    if config.mode == "host":
        iops *= 1.25
    elif config.iothread:
        iops *= 1.10
    iops *= _rng(config.key, workload.key, index).uniform(1 - spread, 1 + spread)
    lat = workload.iodepth / iops * 1e9
    return Figures(iops=iops, bw_bytes=iops * workload.bs, lat_mean_ns=lat, p99_ns=lat * 2.5)


def telemetry(run: StoredRun) -> StoredRun:
    """The run as the runner would have stored it with CPU probes and steady-state checks: CPU
    cost by role, and the SNIA rule missed on the noisy host baseline's QD1 samples, which lost
    their p99 at 64k (fio reported no percentiles) and ran with no accelerator (no guest)."""
    trials = []
    for t in run.trials:
        accelerator = "none" if t.config_key == "host" else t.accelerator
        if t.status != "ok":
            trials.append(t.model_copy(update={"accelerator": accelerator}))
            continue
        sample = t.samples[0]
        if t.config_key == "host" and "64k" in t.workload_key:
            sample = sample.model_copy(update={"p99_ns": None})
        r = _rng("cpu", t.config_key, t.workload_key, t.sample_index)
        ios = sample.total_ios
        roles = {"fio (host)": ios * 2e-6 * r.uniform(0.9, 1.1)}
        if t.config_key != "host":
            roles |= {"vcpu": ios * 6e-6, "main loop": ios * 1e-6,
                      ("iothread" if "iothread=on" in t.config_key else "worker pool"): ios * 3e-6}
        total = sum(roles.values())
        cpu = CpuRecord(window_s=10.0, cpu_s_by_role=roles, exited_cpu_s=0.0, cpu_s=total,
                        voluntary_csw=ios // 2, involuntary_csw=0, ios=ios, bytes=sample.io_bytes,
                        cpu_us_per_io=total / ios * 1e6,
                        cpu_ms_per_mib=total / (sample.io_bytes / 2**20) * 1e3, csw_per_io=0.5,
                        perf="perf unavailable")
        missed = t.config_key == NOISY and "qd1/" in t.workload_key
        steady = SteadyRecord(checked=True, source="fio status stream", verdict=SteadyState(
            reached=not missed, at_seconds=None if missed else 6.0, windows=5, range_ratio=0.1,
            excursion_ratio=0.05, rule="SNIA PTS"))
        trials.append(t.model_copy(update={"samples": (sample,), "cpu": cpu, "steady": steady,
                                           "accelerator": accelerator}))
    return run.model_copy(update={"trials": tuple(trials)})


def make_run(tmp: Path, configs: list[Configuration], workloads: list[Workload], figures,
             **kw) -> StoredRun:
    return stored_run(tmp / "runs.db", configs, workloads, figures, **kw)


def seed000_run(tmp: Path, *, accelerator: str = "tcg") -> StoredRun:
    configs = [Configuration(mode="host"), *configurations("guest", {
        "controller": ["virtio-scsi-single"], "aio": ["native", "io_uring"],
        "iothread": [True, False]})]
    workloads = [Workload(rw="randread", bs=bs, iodepth=qd) for bs in BLOCK_SIZES for qd in DEPTHS]
    return telemetry(make_run(tmp, configs, workloads, seed000_figures, accelerator=accelerator,
                              target=STORAGE))


def scaling_run(tmp: Path) -> StoredRun:
    """aio × 1, 2, 4 VMs: IOPS grow sub-linearly with the guests; each guest's own samples."""
    configs = configurations("guest", {"controller": ["virtio-blk"], "aio": ["native", "io_uring"],
                                       "iothread": [True], "vms": [1, 2, 4]})
    workloads = [Workload(rw="randread", bs=4096, iodepth=qd) for qd in (1, 32)]

    def figures(config: Configuration, workload: Workload, index: int) -> Figures:
        iops = 30_000 * workload.iodepth ** 0.5 * (config.vms or 1) ** 0.8
        iops *= _rng(config.key, workload.key, index).uniform(0.99, 1.01)
        lat = workload.iodepth * (config.vms or 1) / iops * 1e9
        return Figures(iops=iops, bw_bytes=iops * 4096, lat_mean_ns=lat, p99_ns=2 * lat)

    run = make_run(tmp, configs, workloads, figures, accelerator="kvm")
    trials = []
    for t in run.trials:
        vms = int(t.config_key.split("vms=")[1])
        whole = t.samples[0]
        share = [0.9 + 0.2 * k / max(1, vms - 1) for k in range(vms)]
        per_vm = tuple(whole.model_copy(update={"vm": k, "iops": whole.iops * s / sum(share)})
                       for k, s in enumerate(share))
        trials.append(t.model_copy(update={"vm_samples": per_vm}))
    return run.model_copy(update={"trials": tuple(trials)})


# --- the HTML string ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> StoredRun:
    return seed000_run(tmp_path_factory.mktemp("seed000"))


@pytest.fixture(scope="module")
def data(run: StoredRun) -> ReportData:
    return build_report_data(run)


@pytest.fixture(scope="module")
def page_path(data: ReportData, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_report(data, tmp_path_factory.mktemp("report"))


class _Scan(HTMLParser):
    """Collects src/href attributes, script elements and data-testid values."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.links: list[str] = []
        self.scripts: list[tuple[dict, str]] = []
        self.testids: list[str] = []
        self._script: dict | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.links += [v for k, v in attrs if k in ("src", "href") and v]
        if "data-testid" in a:
            self.testids.append(a["data-testid"])
        if tag == "script":
            self._script, self._text = a, []

    def handle_endtag(self, tag):
        if tag == "script" and self._script is not None:
            self.scripts.append((self._script, "".join(self._text)))
            self._script = None

    def handle_data(self, data):
        if self._script is not None:
            self._text.append(data)


def scan(html: str) -> _Scan:
    s = _Scan()
    s.feed(html)
    s.close()
    return s


def script(s: _Scan, element_id: str) -> str:
    (body,) = [b for a, b in s.scripts if a.get("id") == element_id]
    return body


@pytest.mark.slow
def test_page_is_self_contained(data):
    html = render_html(data)
    s = scan(html)
    external = [u for u in s.links if re.match(r"^\s*(https?:)?//", u, re.IGNORECASE)]
    assert external == []
    assert not re.search(r"<(link|img|iframe)\b", html, re.IGNORECASE)
    # plotly.js is in the page (packed), not fetched
    assert all("src" not in attrs for attrs, _ in s.scripts)
    plotly = unpacked(script(s, "plotly-js"))
    assert "Plotly" in plotly and len(plotly) > 1_000_000


@pytest.mark.slow
def test_page_embeds_plotly_and_data_packed(data):
    """plotly.js and the run's JSON are gzip+base85: together well under half their inline size."""
    s = scan(render_html(data))
    for element_id in ("plotly-js", "report-data"):
        ((attrs, body),) = [(a, b) for a, b in s.scripts if a.get("id") == element_id]
        assert attrs["data-encoding"] == "gzip+base85"
        assert len(body) < len(unpacked(body)) / 2


def test_data_json_round_trips(data):
    body = unpacked(script(scan(render_html(data)), "report-data"))
    assert "<" not in body  # nothing can close the element early, packed or not
    expected = ReportData.model_validate(rounded(data.model_dump(mode="json")))
    assert read_data_json(body) == expected.model_copy(update={"samples_csv": ""})
    # six significant digits: no figure moves by more than 5e-6 of itself
    back = read_data_json(body)
    assert all(math.isclose(a.iops, b.iops, rel_tol=5e-6) for a, b in zip(back.points, data.points))


def test_packed_has_no_angle_bracket_and_round_trips():
    """base85 with "." for "<": nothing in a packed element can end it or open a comment."""
    for n in range(40):
        text = _rng("packed", n).randbytes(n * 37).hex()
        blob = packed(text)
        assert "<" not in blob and unpacked(blob) == text


def test_raw_csv_is_embedded_compressed(run, data):
    s = scan(render_html(data))
    ((attrs, body),) = [(a, b) for a, b in s.scripts if a.get("id") == "samples-csv"]
    assert attrs["data-encoding"] == "gzip+base85"
    assert unpacked(body) == samples_csv(run)
    assert len(body) < len(samples_csv(run)) / 2


def test_csv_download_names_its_rows(data):
    """A line break in a failure's reason (quoted) is not a row; every other line is."""
    plain = "a,b\n1,2\n3,4\n"
    quoted = 'a,b\n1,"line\nbreak"\n3,4\n'
    for text in (plain, quoted):
        html = render_html(data.model_copy(update={"samples_csv": text}))
        assert "Download raw samples (CSV, 2 rows)" in html


def test_script_breaking_text_is_escaped(data):
    hostile = "</script><script>alert(1)</script>"
    data = data.model_copy(update={"notes": (hostile,), "suite_name": "<b>x</b>",
                                   "host": {"kernel": hostile}})
    html = render_html(data)
    assert "<script>alert(1)" not in html
    assert "&lt;b&gt;x&lt;/b&gt;" in html  # autoescaped in the page
    assert read_data_json(unpacked(script(scan(html), "report-data"))).notes == (hostile,)


def test_tcg_banner_and_labels(run, data, tmp_path):
    assert "tcg-banner" in scan(render_html(data)).testids
    guests = [c for c in data.configs if c.mode == "guest"]
    assert guests and all(c.label.endswith("[emulated: TCG]") for c in guests)
    kvm = build_report_data(seed000_run(tmp_path, accelerator="kvm"))
    html = render_html(kvm)
    assert "tcg-banner" not in scan(html).testids
    assert "not this hardware" not in html.split("<script")[0]
    assert not any("TCG" in c.label for c in kvm.configs)


def test_view_model(data):
    by_key = {c.key: i for i, c in enumerate(data.configs)}
    noisy = [p for p in data.points if p.config == by_key[NOISY]]
    # flags: the noisy baseline's CI is wide, its QD1 missed steady state, one trial failed
    assert all(CI_OVER in p.flags for p in noisy if p.ci_relative and p.ci_relative > 0.05)
    assert {STEADY_MISSED in p.flags for p in noisy} == {True, False}
    assert sum(FAILED in p.flags for p in data.points) == 1
    quiet = [p for p in data.points if p.config != by_key[NOISY]]
    assert not any(p.flags for p in quiet)
    q = data.quality
    assert (q.trials_failed, q.points_steady_missed, q.points_flagged) == (
        1, len(BLOCK_SIZES), sum(bool(p.flags) for p in data.points))
    assert q.ci_target == 0.05 and "default" in q.ci_target_source
    # CIs on every metric, CPU by role, % of bare metal; host p99 unmeasured stays None
    guest = next(p for p in quiet if data.configs[p.config].mode == "guest")
    assert guest.iops_low < guest.iops < guest.iops_high
    assert guest.lat_p99_low < guest.lat_p99_ns < guest.lat_p99_high
    assert set(guest.cpu_roles) >= {"vcpu", "fio (host)"}
    assert guest.cpu_us_per_io == pytest.approx(sum(guest.cpu_roles.values()), rel=1e-9)
    assert 70 < guest.iops_pct < 100
    host = [p for p in data.points if p.config == by_key["host"]]
    assert {p.lat_p99_ns is None for p in host} == {True, False}
    # gains: per axis pooled and, with two axes, held at each level of the other
    sets = {(s.axis, s.hold, s.metric) for s in data.gains}
    assert ("iothread", (), "iops") in sets and ("aio", ("iothread",), "lat_mean_ns") in sets
    iothread = next(s for s in data.gains if (s.axis, s.hold, s.metric) == ("iothread", (), "iops"))
    assert iothread.reference == "off" and len(iothread.gains) == len(DEPTHS)
    assert all(g.significant and g.relative == pytest.approx(0.10, abs=0.03) for g in iothread.gains)
    aio = next(s for s in data.gains if (s.axis, s.hold, s.metric) == ("aio", (), "iops"))
    assert any("no significant difference" in g.verdict for g in aio.gains)
    # scores and a recommendation for every platform, with text to paste
    assert data.scores is not None and len(data.scores.rows) == 4
    assert [r.rank for r in data.scores.rows][0] == 1
    assert [r.platform for r in data.recommendations] == ["proxmox", "libvirt", "qemu"]
    assert data.recommendations[0].text.startswith("qm set")
    assert any("EMULATED" in w for w in data.recommendations[0].warnings)


def test_write_report(data, tmp_path):
    """The file written is the whole page: one document, its sections, the data and CSV it
    embeds readable back; nothing else is left in the directory, and writing again replaces it."""
    out = write_report(data, tmp_path / "a" / "b")
    assert out == tmp_path / "a" / "b" / "index.html"
    assert [p.name for p in out.parent.iterdir()] == ["index.html"]   # no temporary file left
    assert out.stat().st_mode & 0o777 == 0o666 & ~_umask()
    html = out.read_text(encoding="utf-8")
    assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")
    assert html == render_html(data)
    outline = _Outline()
    outline.feed(html)
    outline.close()
    # one document: html holds head then body; every section is closed before the next opens
    assert outline.events[:4] == ["<html>", "<head>", "</head>", "<body>"]
    assert outline.events[-2:] == ["</body>", "</html>"] and outline.depth == {}
    sections = outline.section_ids
    assert outline.events.count("<section>") == outline.events.count("</section>") == len(sections)
    assert "<section> <section>" not in " ".join(outline.events)
    s = scan(html)
    # the data and the samples it embeds parse back
    expected = ReportData.model_validate(rounded(data.model_dump(mode="json")))
    assert read_data_json(unpacked(script(s, "report-data"))) == expected.model_copy(update={"samples_csv": ""})
    csv_text = unpacked(script(s, "samples-csv"))
    assert csv_text == data.samples_csv
    # every section the data calls for, each listed in the table of contents
    assert set(sections) == {"summary", "notes", "recommendation", "quality", "performance",
                             "gains", "scores", "cpu", "bare-metal", "levers", "points",
                             "failures", "configurations"}
    toc = re.findall(r'<a href="#([^"]+)">', html.split('<nav class="toc"', 1)[1].split("</nav>", 1)[0])
    assert toc == sections
    assert {"run-facts", "recommendation", "quality", "scores", "configs-table"} <= set(s.testids)
    # a second report over the first replaces it, still alone in its directory
    empty = data.model_copy(update={"notes": ()})
    assert write_report(empty, out.parent) == out
    assert [p.name for p in out.parent.iterdir()] == ["index.html"]
    assert out.read_text(encoding="utf-8") == render_html(empty)


class _Outline(HTMLParser):
    """The page's skeleton: start and end tags of html, head, body, main and section in order
    (script contents are not parsed as tags), the section ids, and tags left open."""

    TAGS = ("html", "head", "body", "main", "section")

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.events: list[str] = []
        self.section_ids: list[str] = []
        self.depth: dict[str, int] = {}

    def handle_starttag(self, tag, attrs):
        if tag in self.TAGS:
            self.events.append(f"<{tag}>")
            self.depth[tag] = self.depth.get(tag, 0) + 1
            if tag == "section":
                self.section_ids.append(dict(attrs)["id"])

    def handle_endtag(self, tag):
        if tag in self.TAGS:
            self.events.append(f"</{tag}>")
            self.depth[tag] -= 1
            if not self.depth[tag]:
                del self.depth[tag]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# --- in a real browser ----------------------------------------------------------------------------

needs_chromium = needs("chromium")


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


def chart_state(page) -> dict[str, dict]:
    """Each chart by test id: drawn, its traces (type, name, point count, text) and title."""
    return page.evaluate("""() => Object.fromEntries([...document.querySelectorAll('.chart')].map((c) => [
        c.dataset.testid, {
          drawn: c.dataset.drawn, svg: !!c.querySelector('.main-svg'),
          title: c._fullLayout ? c._fullLayout.title.text : null,
          traces: (c.data || []).map((t) => ({type: t.type, name: t.name, n: t.x.length, mode: t.mode,
                                              text: t.text || null, error: !!(t.error_y && t.error_y.visible),
                                              symbols: (t.marker && Array.isArray(t.marker.symbol)) ? t.marker.symbol : [],
                                              hover: t.hovertext || []})),
        }]))""")


def expected_charts(data: ReportData) -> set[str]:
    ids = set()
    for g in data.groups:
        ids |= {f"chart-{m}-{g.slug}" for m in (*(f.stem for f in METRICS.values()), "cpu",
                                                  "bare_iops", "bare_lat")}
    ids |= {f"chart-gain-{s.axis}" + (f"-by-{'-'.join(s.hold)}" if s.hold else "") for s in data.gains}
    ids |= {f"chart-lever-{lever}-{m}" for c in data.configs for lever in c.levers
            for m in ("iops", "cpu")}
    return ids | {"chart-roles"}


# The seed 000 page (5 MB with Plotly: 3-4 s to load and draw here) is loaded once per test
# below, and each test runs the checks that page serves in turn: the charts as drawn, then the
# gain metric switch; the points table (sorted, filtered), then the CSV download and the
# recommendation tabs, which the table's state does not touch.

@pytest.mark.slow
@needs_chromium
def test_every_chart_draws_and_gains_mark_significance(browser, data, page_path):
    with open_page(page_path, browser=browser, block_network=True) as page:
        _every_chart_draws(page, data)
        _gains_mark_significance(page, data)


def _every_chart_draws(page, data) -> None:
    assert page.problems == [] and page.external_requests == []
    assert page.evaluate("document.documentElement.dataset.charts") == "ready"
    charts = chart_state(page)
    assert set(charts) == expected_charts(data)
    assert all(c["drawn"] == "1" and c["svg"] for c in charts.values()), charts
    # one line per configuration with a value (≤ 12 configurations: coloured one by one)
    for g in data.groups:
        iops = charts[f"chart-iops-{g.slug}"]["traces"]
        assert len(iops) == 5 and all(t["error"] for t in iops)
        p99 = charts[f"chart-lat_p99-{g.slug}"]["traces"]
        assert len(p99) == (4 if g.bs == 65536 else 5)  # the host's 64k p99 was not measured
        assert len(charts[f"chart-bare_iops-{g.slug}"]["traces"]) == 4  # no host line
    # every guest line says it was emulated
    names = {t["name"] for c in charts.values() if c["title"] and "IOPS ·" in c["title"]
             for t in c["traces"]}
    assert {n for n in names if n.startswith("guest")} and all(
        n.endswith("[emulated: TCG]") for n in names if n.startswith("guest"))
    # flagged points are drawn as crosses, and their hover says why
    noisy = next(t for t in charts["chart-iops-randread-4k-j1"]["traces"] if t["name"] == "host (bare metal)")
    assert "x" in noisy["symbols"]
    assert any("steady state not reached in 3 of 3 samples" in h for h in noisy["hover"])
    assert page.page.get_by_test_id("tcg-banner").is_visible()
    assert page.count("[data-testid=score-row]") == 4
    assert page.count("[data-testid=point-row]") == len(data.points)
    page.screenshot(ARTIFACTS / "report-seed000.png")

def _gains_mark_significance(page, data) -> None:
    charts = chart_state(page)
    for s in data.gains:
        if s.metric != "iops":
            continue
        chart = charts["chart-gain-" + s.axis + (f"-by-{'-'.join(s.hold)}" if s.hold else "")]
        assert s.axis in chart["title"] and f"{s.axis}={s.reference}" in chart["title"]
        bars = [(text, hover) for t in chart["traces"] for text, hover in zip(t["text"], t["hover"])]
        assert len(bars) == len(s.gains)
        for (text, hover), gain in zip(bars, s.gains):
            assert (text == "n.s.") is (not gain.significant)
            assert gain.verdict in hover.replace("&lt;", "<").replace("&gt;", ">")
    texts = [t for c in charts.values() if c["title"] and c["title"].startswith("IOPS:")
             for tr in c["traces"] for t in tr["text"]]
    assert "n.s." in texts and "" in texts
    # switching the metric redraws every gain chart
    page.page.get_by_test_id("gain-metric").select_option("lat_mean_ns")
    page.page.wait_for_function("document.documentElement.dataset.charts === 'ready'")
    titles = [c["title"] for k, c in chart_state(page).items() if k.startswith("chart-gain")]
    assert titles and all(t.startswith("Mean latency:") for t in titles)
    assert page.problems == []


@pytest.mark.slow
@needs_chromium
def test_filter_and_colouring(browser, data, page_path):
    with open_page(page_path, browser=browser) as page:
        p = page.page
        p.locator('#toolbar input[data-axis="aio"][value="io_uring"]').uncheck()
        p.wait_for_function("document.documentElement.dataset.charts === 'ready'")
        charts = chart_state(page)
        assert len(charts["chart-iops-randread-4k-j1"]["traces"]) == 3  # host + 2 native
        assert p.get_by_test_id("shown-count").inner_text() == "3 of 5 configurations shown"
        shown = {0, *(i for i, c in enumerate(data.configs) if c.params.get("aio") == "native")}
        assert p.get_by_test_id("points-count").inner_text().startswith(
            f"{sum(pt.config in shown for pt in data.points)} of {len(data.points)}")
        p.get_by_test_id("color-by").select_option("iothread")
        p.wait_for_function("document.documentElement.dataset.charts === 'ready'")
        names = [t["name"] for t in chart_state(page)["chart-iops-randread-4k-j1"]["traces"]]
        assert names == ["iothread=on [emulated: TCG]", "iothread=off [emulated: TCG]", "host (bare metal)"]
        assert page.problems == []


@pytest.mark.slow
@needs_chromium
def test_points_table_csv_download_and_recommendation(browser, data, run, page_path, tmp_path):
    with open_page(page_path, browser=browser, block_network=True) as page:
        _points_table(page, data)
        _csv_download_and_recommendation(page, run, tmp_path)
        _page_unpacks_every_length(page)


def _points_table(page, data) -> None:
    p = page.page
    table = p.get_by_test_id("points-table")
    header = [h.strip(" ▲▼") for h in table.locator("thead th").all_inner_texts()]
    rows = table.locator("tbody tr")
    assert rows.count() == len(data.points)
    cells = [r.locator("td").all_inner_texts() for r in rows.all()]
    col = {name: i for i, name in enumerate(header)}
    host_64k = [r for r in cells if r[col["configuration"]].startswith("host") and r[col["bs"]] == "64k"]
    assert host_64k and all(r[col["lat p99 µs"]] == "—" for r in host_64k)
    assert all(re.fullmatch(r"\d{1,3}(,\d{3})*", r[col["IOPS"]]) for r in cells)
    assert any(r[col["samples"]] == "2 (1 failed)" for r in cells)
    # sort by IOPS, descending on the second click
    table.locator("th", has_text="IOPS").first.click()
    table.locator("th", has_text="IOPS").first.click()
    first = table.locator("tbody tr").first.locator("td").all_inner_texts()
    top = max(pt.iops for pt in data.points)
    assert first[col["IOPS"]] == f"{top:,.0f}"
    # only the flagged points
    p.get_by_test_id("only-flagged").check()
    flagged = sum(bool(pt.flags) for pt in data.points)
    assert p.get_by_test_id("points-table").locator("tbody tr").count() == flagged
    assert all(t for t in p.get_by_test_id("points-table").locator("tbody td.flag").all_inner_texts())
    assert page.problems == []

def _csv_download_and_recommendation(page, run, tmp_path) -> None:
    p = page.page
    with p.expect_download() as info:
        p.get_by_test_id("csv-download").click()
    download = info.value
    assert download.suggested_filename == f"iomatrix-run-{run.id}-samples.csv"
    target = tmp_path / "samples.csv"
    download.save_as(target)
    assert target.read_text() == samples_csv(run)
    # recommendation tabs: one platform at a time, each with text to paste and the storage the
    # evidence comes from
    assert p.get_by_test_id("rec-proxmox").is_visible() and not p.get_by_test_id("rec-libvirt").is_visible()
    assert p.get_by_test_id("rec-storage-proxmox").inner_text() == (
        "Evidence measured on dir local (/var/lib/vz/images).")
    p.get_by_test_id("rec-tab-libvirt").click()
    assert p.get_by_test_id("rec-libvirt").is_visible() and not p.get_by_test_id("rec-proxmox").is_visible()
    assert "<disk" in p.get_by_test_id("paste-libvirt").inner_text()
    assert page.problems == []


def _page_unpacks_every_length(page) -> None:
    """The page's base85 decoder reads back every length of gzip stream (its last group is 1 to
    4 bytes, or none), "<"-bearing digits included."""
    texts = [_rng("unpack", n).randbytes(n).hex() for n in range(40)] + ["<" * 999]
    blobs = [packed(t) for t in texts]
    assert {len(b) % 5 for b in blobs} >= {0, 2, 3, 4} and any("." in b for b in blobs)
    got = page.evaluate("""async (blobs) => Promise.all(blobs.map((blob, i) => {
        const el = document.createElement("script");
        el.type = "application/octet-stream"; el.id = `unpack-test-${i}`; el.textContent = blob;
        document.body.appendChild(el);
        return unpack(el.id);
    }))""", blobs)
    assert got == texts


@pytest.mark.slow
@needs_chromium
def test_scaling_curves(browser, tmp_path):
    run = scaling_run(tmp_path)
    data = build_report_data(run)
    assert sorted({c.family for c in data.configs}) == [
        "guest virtio-blk/io_uring iothread", "guest virtio-blk/native iothread"]
    path = write_report(data, tmp_path / "report")
    with open_page(path, browser=browser, block_network=True) as page:
        assert page.problems == []
        charts = chart_state(page)
        assert all(c["drawn"] == "1" and c["svg"] for c in charts.values())
        iops = charts["chart-scale-iops"]
        assert sorted(t["name"] for t in iops["traces"]) == sorted({c.family for c in data.configs})
        assert all(t["n"] == 3 and t["error"] for t in iops["traces"])
        assert all("per guest:" in h for t in iops["traces"] for h in t["hover"])
        assert charts["chart-scale-lat_p99"]["traces"]
        # the workload selector redraws the curves for another queue depth
        page.page.get_by_test_id("scaling-workload").select_option(index=1)
        page.page.wait_for_function("document.documentElement.dataset.charts === 'ready'")
        assert "QD32" in chart_state(page)["chart-scale-iops"]["title"]
        page.page.locator("#scaling").screenshot(path=str(ARTIFACTS / "report-scaling.png"))
        assert page.problems == []


@pytest.mark.slow
@needs_chromium
def test_charts_far_down_draw_first_when_scrolled_to(browser, tmp_path):
    """Charts are drawn nearest the viewport first: with the page scrolled to its end before the
    first chart is drawn, the charts there come first."""
    configs = [Configuration(mode="host"), *configurations("blocklayer", {"aio": ["native", "threads"]})]
    workloads = [Workload(rw="randread", bs=bs, iodepth=qd) for bs in (512, 4096, 8192, 16384, 65536)
                 for qd in (1, 8)]
    run = make_run(tmp_path, configs, workloads, seed000_figures, samples=2)
    path = write_report(build_report_data(run), tmp_path / "report")
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    try:
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        # DOMContentLoaded comes after the report's script has run and before its first drawing
        page.add_init_script("window.addEventListener('DOMContentLoaded', () => "
                             "[...document.querySelectorAll('.chart')].pop().scrollIntoView())")
        page.goto(path.as_uri())
        page.wait_for_function("document.documentElement.dataset.charts === 'ready'", timeout=60_000)
        order = page.evaluate("[...document.querySelectorAll('.chart')].map((c) => Number(c.dataset.drawOrder))")
        assert errors == []
    finally:
        context.close()
    assert sorted(order) == list(range(len(order))) and len(order) > 20
    # the last chart is among the first screenful drawn (after at most the first chart at the top)
    assert order[-1] <= 8, order
    assert min(order[len(order) // 2 - 2:len(order) // 2 + 2]) > order[-1], order


@pytest.mark.slow
@needs_chromium
def test_empty_run_renders(browser, tmp_path):
    configs = configurations("blocklayer", {"aio": ["native", "threads"]})
    with Store(tmp_path / "r.db") as store:
        run_id = store.create_run(suite=StoredSuite(name="empty", source="test", text=""), host={},
                                  accelerator="none", notes=[], configs=configs,
                                  workloads=[Workload(rw="randread", bs=4096, iodepth=1)])
        run = store.load_run(run_id)
    data = build_report_data(run)
    assert data.points == () and data.scores is None and "no measured" in data.scores_absent
    with open_page(write_report(data, tmp_path / "report"), browser=browser) as page:
        assert page.problems == []
        charts = chart_state(page)
        assert charts and all(c["drawn"] == "1" for c in charts.values())
        assert page.count("[data-testid=point-row]") == 0
        assert "csv-download" not in scan(render_html(data)).testids


@pytest.mark.slow
@needs_chromium
def test_many_configurations_draw_as_lines_by_axis(browser, tmp_path):
    """Past a dozen configurations lines are coloured by an axis (one trace per level, not per
    configuration), and past a few hundred points drawn as lines with the flagged points on top."""
    configs = [Configuration(mode="host"), *configurations("guest", {
        "controller": ["virtio-blk"], "aio": ["native", "io_uring", "threads"],
        "iothread": [True, False], "cache": ["none", "directsync", "writeback", "writethrough", "unsafe"],
        "format": ["raw", "qcow2"]})]
    workloads = [Workload(rw="randread", bs=4096, iodepth=2**k) for k in range(8)]
    run = make_run(tmp_path, configs, workloads, seed000_figures, samples=2)
    data = build_report_data(run)
    assert sum(bool(p.flags) for p in data.points) > 0   # the noisy host baseline
    with open_page(write_report(data, tmp_path / "report"), browser=browser) as page:
        assert page.problems == []
        assert page.page.get_by_test_id("color-by").input_value() == "aio"
        iops = chart_state(page)["chart-iops-randread-4k-j1"]["traces"]
        assert [t["name"] for t in iops] == ["aio=native", "aio=io_uring", "aio=threads",
                                              "host (bare metal)", "✕ flagged point"]
        assert [t["mode"] for t in iops] == ["lines"] * 4 + ["markers"]
        # 20 configurations for each aio mode: 8 depths each, a gap between two configurations
        assert iops[0]["n"] == 20 * 8 + 19
        page.page.locator("#performance .chart").first.screenshot(path=str(ARTIFACTS / "report-many.png"))


@pytest.mark.slow
@needs_chromium
def test_latency_labels_mixed_percentiles_and_significant_figures(browser, tmp_path):
    """Real fio output imported (fio's clat: no lat_percentiles): every latency heading says
    clat; a mixed workload's percentiles are in read and write columns, its own p99 cell empty;
    every figure cell is written as ``metrics.figure_text`` writes it (the page's script mirrors
    it), small ones too."""
    from iomatrix.analysis.metrics import figure_text
    from iomatrix.store.ingest import import_results

    fixtures = Path(__file__).parents[1] / "fixtures" / "fio" / "3.33"
    directory = tmp_path / "results" / "ssd"
    directory.mkdir(parents=True)
    for name in ("randrw.json", "randread.json"):
        (directory / name).write_bytes((fixtures / name).read_bytes())
    with Store(tmp_path / "r.db") as store:
        run = store.load_run(import_results(store, tmp_path / "results").run_id)
    # a slow device's figures: 2.657 IOPS and ~10 KiB/s must not round away
    slow = tuple(t.model_copy(update={"samples": tuple(
        s.model_copy(update={"iops": s.iops / 12_000, "bw_bytes": s.bw_bytes / 12_000})
        for s in t.samples)}) if t.workload_key.startswith("randread") else t for t in run.trials)
    data = build_report_data(run.model_copy(update={"trials": slow}))
    assert (data.latency_mean, data.latency_percentiles) == ("clat", "clat")
    mixed = next(p for p in data.points if p.read_lat_p99_ns is not None)
    assert mixed.lat_p99_ns is None and mixed.write_lat_p99_ns is not None
    with open_page(write_report(data, tmp_path / "report"), browser=browser) as page:
        assert page.problems == []
        p = page.page
        assert "completion latency (fio's clat: without submission)" in p.get_by_test_id("points-hint").inner_text()
        table = p.get_by_test_id("points-table")
        header = [h.strip(" ▲▼") for h in table.locator("thead th").all_inner_texts()]
        assert {"clat mean µs", "clat p50 µs", "clat p99 µs", "read clat p50 µs", "read clat p99 µs",
                "write clat p50 µs", "write clat p99 µs"} <= set(header)
        assert not any(h.startswith("lat ") for h in header)
        col = {name: i for i, name in enumerate(header)}
        rows = {r[col["rw"]]: r for r in (row.locator("td").all_inner_texts()
                                           for row in table.locator("tbody tr").all())}
        by_rw = {data.workloads[v.workload].rw: v for v in data.points}
        mix, read = rows["randrw"], rows["randread"]
        assert mix[col["clat p99 µs"]] == "—" and read[col["read clat p99 µs"]] == "—"
        for field, title in (("read_lat_p99_ns", "read clat p99 µs"),
                             ("write_lat_p50_ns", "write clat p50 µs")):
            assert mix[col[title]] == figure_text(rounded(getattr(by_rw["randrw"], field)) / 1000)
        for rw, row in rows.items():
            v = by_rw[rw]   # the page has the figures to six significant digits (data_json)
            for title, key in (("IOPS", "iops"), ("MiB/s", "bw_bytes"), ("clat mean µs", "lat_mean_ns")):
                assert row[col[title]] == METRICS[key].text(rounded(getattr(v, key))), (rw, title)
        assert re.fullmatch(r"\d\.\d\d", read[col["IOPS"]])           # ~2.9 IOPS, not "3"
        assert re.fullmatch(r"0\.0\d{3}", read[col["MiB/s"]])         # ~11 KiB/s, not "0.0"


def guest_axis_run(tmp: Path) -> StoredRun:
    """``[matrix] guest = ["appliance", "debian12"]`` on two controllers beside the host: the
    user's guest ("debian12", a [guest] image) 40 % below the appliance on both."""
    configs = [Configuration(mode="host"), *configurations("guest", {
        "controller": ["virtio-blk", "virtio-scsi"], "guest": ["appliance", "debian12"]})]
    workloads = [Workload(rw="randread", bs=4096, iodepth=qd) for qd in (1, 16)]

    def figures(config: Configuration, workload: Workload, index: int) -> Figures:
        iops = 20_000 * workload.iodepth ** 0.5 * (0.6 if config.guest == "debian12" else 1.0)
        iops *= _rng(config.key, workload.key, index).uniform(0.99, 1.01)
        lat = workload.iodepth / iops * 1e9
        return Figures(iops=iops, bw_bytes=iops * 4096, lat_mean_ns=lat, p99_ns=2 * lat)

    return telemetry(make_run(tmp, configs, workloads, figures, accelerator="tcg"))


@pytest.mark.slow
@needs_chromium
def test_a_guest_axis_filters_colours_and_gains_by_guest(browser, tmp_path):
    """The appliance and the user's own guest in one run: the page offers the guest axis to
    filter and colour by, and draws its gain (each guest against the appliance)."""
    data = build_report_data(guest_axis_run(tmp_path))
    assert data.axes["guest"] == ("appliance", "debian12")
    assert {c.label for c in data.configs} >= {"guest virtio-blk in appliance [emulated: TCG]",
                                               "guest virtio-scsi in debian12 [emulated: TCG]"}
    gain = next(s for s in data.gains if s.axis == "guest" and s.metric == "iops" and not s.hold)
    assert gain.reference == "appliance" and gain.gains
    assert all(g.level == "debian12" and g.better is False for g in gain.gains)
    with open_page(write_report(data, tmp_path / "report"), browser=browser,
                   block_network=True) as page:
        assert page.problems == []
        charts = chart_state(page)
        assert set(charts) == expected_charts(data)
        assert all(c["drawn"] == "1" and c["svg"] for c in charts.values())
        assert "guest=appliance" in charts["chart-gain-guest"]["title"]
        p = page.page
        p.locator('#toolbar input[data-axis="guest"][value="debian12"]').uncheck()
        p.wait_for_function("document.documentElement.dataset.charts === 'ready'")
        assert p.get_by_test_id("shown-count").inner_text() == "3 of 5 configurations shown"
        p.locator('#toolbar input[data-axis="guest"][value="debian12"]').check()
        p.get_by_test_id("color-by").select_option("guest")
        p.wait_for_function("document.documentElement.dataset.charts === 'ready'")
        names = [t["name"] for t in chart_state(page)["chart-iops-randread-4k-j1"]["traces"]]
        assert names == ["guest=appliance [emulated: TCG]", "guest=debian12 [emulated: TCG]",
                         "host (bare metal)"]
        assert page.problems == []
