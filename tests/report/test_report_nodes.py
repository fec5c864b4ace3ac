"""The report's scaling with the number of nodes (a cluster-load run with ``[matrix]
node_count``, issue 37): its table, and its chart drawn in real headless Chromium."""

from __future__ import annotations

from pathlib import Path

import pytest

from iomatrix.report.data import build_report_data
from iomatrix.report.html import data_json, read_data_json, render_html, write_report
from tests.analysis.test_scaling import SATURATING, cluster_run
from tests.browser import chromium, open_page
from tests.needs import needs

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


def test_the_view_model_carries_the_curves(tmp_path: Path) -> None:
    data = build_report_data(cluster_run(tmp_path, SATURATING))
    (curve,) = data.node_scaling
    assert [r.nodes for r in curve.rows] == [1, 2, 3] and curve.saturates_at == 2
    (back,) = read_data_json(data_json(data)).node_scaling      # what the page reads
    assert back.saturation == curve.saturation and back.rows[2].node_share.keys() == {
        "pve1", "pve2", "pve3"}
    assert 'id="node-scaling"' in render_html(data)


@pytest.mark.slow
@needs("chromium")
def test_the_scaling_chart_and_table_in_chromium(tmp_path: Path) -> None:
    data = build_report_data(cluster_run(tmp_path, SATURATING))
    (curve,) = data.node_scaling
    path = write_report(data, tmp_path / "report")
    with chromium() as browser, open_page(path, browser=browser, block_network=True) as page:
        assert page.problems == []
        chart = page.page.evaluate("""() => {
            const c = document.querySelector('[data-testid="chart-nodes"]');
            return {drawn: c.dataset.drawn, svg: !!c.querySelector('.main-svg'),
                    title: c._fullLayout.title.text, shapes: c._fullLayout.shapes.map((s) => s.x0),
                    traces: c.data.map((t) => ({name: t.name, x: t.x, y: t.y,
                                                error: !!(t.error_y && t.error_y.visible)}))};
        }""")
        assert chart["drawn"] == "1" and chart["svg"] and curve.family in chart["title"]
        aggregate, per_node, ideal = chart["traces"]
        assert aggregate["x"] == [1, 2, 3] and aggregate["error"] and per_node["error"]
        assert aggregate["y"] == pytest.approx([r.aggregate_iops.mean for r in curve.rows],
                                               rel=1e-3)
        assert ideal["y"] == pytest.approx([n * curve.rows[0].aggregate_iops.mean
                                            for n in (1, 2, 3)], rel=1e-3)
        assert chart["shapes"] == [2]             # where adding a node stops adding IOPS
        table = page.page.get_by_test_id("nodes-table-0")
        assert table.locator("tbody tr").count() == 3
        text = table.inner_text()
        assert curve.saturation in text and "pve3:" in text
        page.page.locator("#node-scaling").screenshot(path=str(ARTIFACTS / "report-nodes.png"))
        assert page.problems == []
