"""The HTML report: a self-contained page whose charts really draw in headless Chromium."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from iomatrix.report.data import ConfigView, FailureView, PointView, ReportData
from iomatrix.report.html import chart_groups, render_html, write_report

try:
    from tests.browser import chromium, chromium_available, open_page
except ImportError:  # tests/ run as plain directory (rootdir not on sys.path)
    from browser import chromium, chromium_available, open_page

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
DEPTHS = (1, 4, 16, 64)

CONFIGS = (
    ConfigView(
        key="host/target=dir",
        label="host baseline",
        mode="host",
        params={"target": "directory"},
    ),
    ConfigView(
        key="blocklayer/aio=native/cache=none/format=raw",
        label="native · none · raw",
        mode="blocklayer",
        params={"aio": "native", "cache": "none", "format": "raw"},
        applied={"aio": "native", "file.cache.direct": "true"},
    ),
    ConfigView(
        key="blocklayer/aio=io_uring/cache=writeback/format=qcow2",
        label="io_uring · writeback · qcow2",
        mode="blocklayer",
        params={"aio": "io_uring", "cache": "writeback", "format": "qcow2", "prealloc": "metadata"},
        applied={"aio": "io_uring", "file.cache.direct": "false"},
    ),
)


def _point(config: int, rw: str, bs: int, depth: int, **over) -> PointView:
    """A plausible point: IOPS grow with depth and differ by configuration (drawing only)."""
    iops = (20_000 + 3_000 * config) * depth**0.5 * (4096 / bs) ** 0.5
    lat = depth / iops * 1e9
    fields = dict(
        config_key=CONFIGS[config].key,
        workload_key=f"{rw}/bs={bs}/iodepth={depth}/numjobs=1",
        rw=rw,
        bs=bs,
        iodepth=depth,
        numjobs=1,
        samples=3,
        read_iops=iops if "read" in rw else None,
        write_iops=iops if "write" in rw else None,
        iops=iops,
        bw_bytes=iops * bs,
        lat_mean_ns=lat,
        lat_p50_ns=lat * 0.9,
        lat_p99_ns=lat * 2.5,
        usr_cpu=4.2 + depth / 10,
        sys_cpu=11.5 + depth / 5,
    )
    fields.update(over)
    return PointView(**fields)


def _points() -> tuple[PointView, ...]:
    points = []
    for c in range(len(CONFIGS)):
        for depth in DEPTHS:
            points.append(_point(c, "randread", 4096, depth))
            # the qcow2 configuration lost one randwrite sample at QD64
            extra = {"samples": 2, "failed": 1} if (c, depth) == (2, 64) else {}
            points.append(_point(c, "randwrite", 4096, depth, **extra))
        for depth in (1, 32):  # two depths: linear x axis
            # fio gave no percentiles for the host baseline's sequential reads
            extra = {"lat_p99_ns": None} if c == 0 else {}
            points.append(_point(c, "read", 128 * 1024, depth, **extra))
    return tuple(points)


def make_data(*, emulated: bool = False) -> ReportData:
    return ReportData(
        run_id=7,
        suite_name="aio-cache-smoke",
        suite_description="aio × cache × format on the local SSD <fast> & small",
        created_at="2025-05-01T10:00:00+00:00",
        finished_at="2025-05-01T10:42:13+00:00",
        status="finished",
        accelerator="tcg" if emulated else "none",
        emulated=emulated,
        host={
            "hostname": "pve1",
            "kernel": "6.1.0-18-amd64",
            "cpu": "AMD EPYC 7302P 16-Core Processor",
            "qemu": "7.2.11",
            "fio": "fio-3.33",
            "filesystem": "ext4",
        },
        notes=("skipped aio=native with cache=writeback: aio=native requires cache.direct=on",),
        configs=CONFIGS,
        points=_points(),
        failures=(
            FailureView(
                config_key=CONFIGS[2].key,
                workload_key="randwrite/bs=4096/iodepth=64/numjobs=1",
                sample_index=1,
                reason="fio exited with status 1: io_u error on file /var/tmp/iomatrix/disk.qcow2",
            ),
        ),
        iomatrix_version="0.1.0",
    )


def _expected_traces(data: ReportData) -> dict[str, int]:
    """Chart test id → how many configurations have a value to draw in it."""
    expected = {}
    for g in chart_groups(data.points):
        pts = [
            p
            for p in data.points
            if (p.rw, p.bs, p.numjobs, p.rate_iops) == (g.rw, g.bs, g.numjobs, g.rate_iops)
            and p.samples > 0
        ]
        expected[f"chart-iops-{g.slug}"] = len({p.config_key for p in pts})
        expected[f"chart-p99-{g.slug}"] = len(
            {p.config_key for p in pts if p.lat_p99_ns is not None}
        )
    return expected


class _Scan(HTMLParser):
    """Collects src/href attributes, script elements and the cells of data-testid'd tables."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.links: list[str] = []
        self.scripts: list[tuple[dict, str]] = []
        self.tables: dict[str, list[list[str]]] = {}
        self.testids: list[str] = []
        self._script: dict | None = None
        self._table: str | None = None
        self._cell: list[str] | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.links += [v for k, v in attrs if k in ("src", "href") and v]
        if "data-testid" in a:
            self.testids.append(a["data-testid"])
        if tag == "script":
            self._script, self._text = a, []
        elif tag == "table" and "data-testid" in a:
            self._table = a["data-testid"]
            self.tables[self._table] = []
        elif tag == "tr" and self._table:
            self.tables[self._table].append([])
        elif tag in ("td", "th") and self._table:
            self._cell = []

    def handle_endtag(self, tag):
        if tag == "script" and self._script is not None:
            self.scripts.append((self._script, "".join(self._text)))
            self._script = None
        elif tag == "table":
            self._table = None
        elif tag in ("td", "th") and self._cell is not None and self._table:
            self.tables[self._table][-1].append(" ".join("".join(self._cell).split()))
            self._cell = None

    def handle_data(self, data):
        if self._script is not None:
            self._text.append(data)
        if self._cell is not None:
            self._cell.append(data)


def scan(html: str) -> _Scan:
    s = _Scan()
    s.feed(html)
    s.close()
    return s


# --- the HTML string ------------------------------------------------------------------------------


def test_page_is_self_contained():
    html = render_html(make_data())
    s = scan(html)
    external = [u for u in s.links if re.match(r"^\s*(https?:)?//", u, re.IGNORECASE)]
    assert external == []
    assert not re.search(r"<(link|img|iframe)\b", html, re.IGNORECASE)
    # plotly.js is inline, not fetched
    assert all("src" not in attrs for attrs, _ in s.scripts)
    assert any("Plotly" in body and len(body) > 1_000_000 for _, body in s.scripts)


def test_data_json_round_trips():
    data = make_data()
    s = scan(render_html(data))
    (body,) = [b for a, b in s.scripts if a.get("id") == "report-data"]
    assert ("type", "application/json") in [
        ("type", a["type"]) for a, _ in s.scripts if a.get("id") == "report-data"
    ]
    assert "</" not in body and "<" not in body  # nothing can close the element early
    assert ReportData.model_validate(json.loads(body)) == data


def test_script_breaking_text_is_escaped():
    data = make_data().model_copy(
        update={"notes": ("</script><script>alert(1)</script>",), "suite_name": "<b>x</b>"}
    )
    html = render_html(data)
    assert "<script>alert(1)" not in html
    assert "&lt;b&gt;x&lt;/b&gt;" in html  # autoescaped in the page
    s = scan(html)
    (body,) = [b for a, b in s.scripts if a.get("id") == "report-data"]
    assert ReportData.model_validate(json.loads(body)) == data


@pytest.mark.parametrize("emulated", [False, True])
def test_tcg_banner_only_when_emulated(emulated):
    html = render_html(make_data(emulated=emulated))
    assert scan(html).testids.count("tcg-banner") == (1 if emulated else 0)
    assert ("not this hardware" in html.split("<script")[0]) is emulated


def test_tables_and_missing_values():
    data = make_data()
    s = scan(render_html(data))
    points = s.tables["points-table"]
    header, rows = points[0], points[1:]
    assert len(rows) == len(data.points)
    col = {name: i for i, name in enumerate(header)}
    # the host baseline's 128k read has no p99: shown as a dash, never as 0
    host_reads = [r for r in rows if r[col["configuration"]] == "host baseline" and r[col["rw"]] == "read"]
    assert len(host_reads) == 2
    assert all(r[col["lat p99"]] == "—" for r in host_reads)
    assert all(r[col["lat p50"]] != "—" for r in host_reads)
    # human formatting
    first = rows[0]
    assert first[col["bs"]] == "4k"
    assert re.fullmatch(r"\d{1,3}(,\d{3})+", first[col["IOPS"]])
    assert re.fullmatch(r"[\d,]+\.\d", first[col["lat mean"]])
    assert any(r[col["samples"]] == "2 (1 failed)" for r in rows)
    # failures, configurations, notes
    assert len(s.tables["failures-table"]) == 1 + 1
    assert "io_u error" in s.tables["failures-table"][1][3]
    configs = s.tables["configs-table"]
    assert len(configs) == 1 + len(data.configs)
    assert "file.cache.direct = true" in configs[2][-1]
    assert configs[1][-1] == "—"  # the host baseline applied nothing
    assert "prealloc" in configs[0] and configs[1][configs[0].index("prealloc")] == "—"
    assert "notes" in s.testids


def test_none_is_a_dash_even_with_no_samples():
    data = make_data()
    broken = data.points[0].model_copy(update={"samples": 0, "failed": 3, "iops": 0.0, "bw_bytes": 0.0})
    data = data.model_copy(update={"points": (broken, *data.points[1:])})
    rows = scan(render_html(data)).tables["points-table"]
    (row,) = [r for r in rows[1:] if r[rows[0].index("samples")] == "0 (3 failed)"]
    assert row[rows[0].index("IOPS")] == "—" and row[rows[0].index("MiB/s")] == "—"


def test_write_report(tmp_path):
    out = write_report(make_data(), tmp_path / "a" / "b")
    assert out == tmp_path / "a" / "b" / "index.html"
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")


# --- in a real browser ----------------------------------------------------------------------------

needs_chromium = pytest.mark.skipif(not chromium_available(), reason="no /usr/bin/chromium")


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


@pytest.fixture(scope="module")
def report_path(tmp_path_factory):
    return write_report(make_data(emulated=True), tmp_path_factory.mktemp("report"))


def _trace_counts(page) -> dict[str, int]:
    return page.evaluate(
        """() => Object.fromEntries([...document.querySelectorAll('.chart')].map(
            (c) => [c.dataset.testid, c.querySelectorAll('.scatterlayer .trace').length]))"""
    )


@needs_chromium
def test_charts_draw_in_chromium(browser, report_path):
    data = make_data(emulated=True)
    expected = _expected_traces(data)
    assert len(expected) == 6  # 3 workload groups × (IOPS, p99)
    with open_page(report_path, browser=browser) as page:
        assert page.problems == []
        assert page.evaluate("document.documentElement.dataset.charts") == "ready"
        assert page.count(".chart") == len(expected)
        assert page.count(".chart .main-svg") >= len(expected)
        assert _trace_counts(page) == expected
        # every drawn line has a data point per depth
        assert page.count(".scatterlayer .trace .point") == sum(
            1
            for p in data.points
            if p.samples > 0
            for metric in ("iops", "p99")
            if metric == "iops" or p.lat_p99_ns is not None
        )
        assert page.count("[data-testid=point-row]") == len(data.points)
        assert page.count("[data-testid=failure-row]") == 1
        assert page.page.get_by_test_id("tcg-banner").is_visible()
        # log2 axis when more than 2 depths, linear otherwise
        axis_types = page.evaluate(
            "() => Object.fromEntries([...document.querySelectorAll('.chart')].map("
            "(c) => [c.dataset.testid, c._fullLayout.xaxis.type]))"
        )
        assert axis_types["chart-iops-randread-4k-j1"] == "log"
        assert axis_types["chart-iops-read-128k-j1"] == "linear"
        page.screenshot(ARTIFACTS / "report.png")


@needs_chromium
def test_charts_draw_with_network_blocked(browser, report_path):
    with open_page(report_path, browser=browser, block_network=True) as page:
        assert page.external_requests == []
        assert page.problems == []
        assert _trace_counts(page) == _expected_traces(make_data(emulated=True))


def test_empty_run_renders():
    data = make_data().model_copy(update={"points": (), "failures": (), "notes": (), "host": {}})
    s = scan(render_html(data))
    assert "chart" not in " ".join(s.testids)
    assert len(s.tables["points-table"]) == 1  # header only
    assert "failures-table" not in s.tables and "notes" not in s.testids
