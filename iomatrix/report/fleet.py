"""The fleet page: N runs (nodes or storages) against the first, as one self-contained HTML page
(``iomatrix report RUN_A RUN_B ...``). The figures are ``analysis.fleet``'s; this module shapes
them for the page (``FleetData``) and draws it (``templates/fleet.html.j2`` and ``fleet.js``),
plotly.js and the data packed as in the run's report (``html.packed``)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from markupsafe import Markup

from iomatrix.analysis.fleet import (Fleet, by_storage, compare_fleet, slowest_first,
                                     stalls_by_node)
from iomatrix.analysis.metrics import METRICS
from iomatrix.core.files import output_directory, write_file_atomically
from iomatrix.core.model import Frozen
from iomatrix.report.html import (_asset, _environment, _script_json, _script_safe, packed,
                                  plotly_js, rounded)
from iomatrix.store.records import StoredRun

TEMPLATE = "fleet.html.j2"


class NodeView(Frozen):
    run: int
    node: str
    storage: str
    suite: str
    created_at: str
    standing: str
    points: int
    better: int
    worse: int
    no_difference: int
    not_judged: int
    change: float | None = None
    low: float | None = None
    high: float | None = None
    p_value: float | None = None
    noise_floor: float | None = None
    verdict: str
    emulated: bool = False
    differences: tuple[str, ...] = ()


class FleetData(Frozen):
    """N runs against the first, ready to draw."""

    metric: str
    metric_name: str
    higher_is_better: bool
    reference: int
    nodes: tuple[NodeView, ...]
    """Slowest first, the reference last."""
    workloads: tuple[str, ...]
    matrix: dict[int, tuple[float | None, ...]]
    """Run → per workload (``workloads``): the geometric mean over configurations of the
    point changes against the reference."""
    storages: dict[str, float | None]
    point_method: str
    node_method: str
    notes: tuple[str, ...] = ()
    iomatrix_version: str


def _matrix(fleet: Fleet, labels: Sequence[str]) -> dict[int, tuple[float | None, ...]]:
    out = {}
    for c in fleet.comparisons:
        logs: dict[str, list[float]] = defaultdict(list)
        for p in c.points:
            if p.change is not None and p.change > -1:
                logs[p.workload_label].append(math.log1p(p.change))
        out[c.run_b] = tuple(math.expm1(sum(v) / len(v)) if (v := logs.get(w)) else None
                             for w in labels)
    return out


def build_fleet_data(runs: Sequence[StoredRun], *, metric: str = "iops") -> FleetData:
    """The fleet page's view model of ``runs`` (the first is the reference)."""
    from iomatrix import __version__

    fleet = compare_fleet(runs, metric=metric)
    by_id = {r.id: r for r in runs}
    labels = tuple(w.label for w in runs[0].workloads)
    nodes = tuple(NodeView(
        run=n.run, node=n.node, storage=n.storage, suite=by_id[n.run].suite.name,
        created_at=by_id[n.run].created_at, standing=n.standing, points=n.points,
        better=n.better, worse=n.worse, no_difference=n.no_difference, not_judged=n.not_judged,
        change=n.change, low=n.low, high=n.high, p_value=n.p_value, noise_floor=n.noise_floor,
        verdict=n.verdict, emulated=by_id[n.run].emulated,
        differences=tuple(f"{d.key}: {d.a or '(not recorded)'} → {d.b or '(not recorded)'}"
                          for d in n.differences))
        for n in slowest_first(fleet))
    notes = tuple(dict.fromkeys([*stalls_by_node(runs), *(note for r in runs
                                                           for note in r.notes)]))
    return FleetData(metric=metric, metric_name=METRICS[metric].name,
                     higher_is_better=fleet.higher_is_better, reference=fleet.reference,
                     nodes=nodes, workloads=labels, matrix=_matrix(fleet, labels),
                     storages=by_storage(fleet), point_method=fleet.point_method,
                     node_method=fleet.node_method, notes=notes, iomatrix_version=__version__)


def render_fleet_html(data: FleetData) -> str:
    """The fleet page as one HTML document (no external resources)."""
    return _environment().get_template(TEMPLATE).render(
        data=data,
        data_json=Markup(packed(_script_json(rounded(data.model_dump(mode="json"))))),
        css=Markup(_asset("report.css")),
        unpack_js=Markup(_script_safe(_asset("unpack.js"))),
        fleet_js=Markup(_script_safe(_asset("fleet.js"))),
        plotly_js=Markup(plotly_js()),
    )


def write_fleet_report(data: FleetData, out_dir: Path) -> Path:
    """Write ``out_dir/index.html`` (creating ``out_dir``) and return its path."""
    path = output_directory(Path(out_dir)) / "index.html"
    write_file_atomically(path, render_fleet_html(data))
    return path
