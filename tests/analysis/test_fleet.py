"""A fleet: synthetic runs of four nodes (real SQLite store, made-up figures) compared with the
first, by ``iomatrix compare A B C ...`` and on the fleet page, drawn in headless Chromium; a
synthetic cluster run's node axis in ``effect`` and its nodes in ``runs``."""

from __future__ import annotations

import random
import re
import zlib
from pathlib import Path

import pytest

from iomatrix.analysis.fleet import compare_fleet
from iomatrix.report.fleet import build_fleet_data, render_fleet_html, write_fleet_report
from iomatrix.report.html import unpacked
from iomatrix.store import Store
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.workloads import Workload
from iomatrix.testing.synthetic import Figures, configurations, write_run
from tests.conftest import cli_result
from tests.needs import need
from tests.cli.test_cli_inprocess import invoke

from tests.browser import open_page

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
CONFIGS = [*configurations("blocklayer", {"aio": ["native", "io_uring"], "cache": ["none"],
                                          "format": ["raw"]}),
           Configuration(mode="blocklayer", aio="native", cache="none", format="raw", aa=True)]
WORKLOADS = [Workload(rw="randread", bs=bs, iodepth=qd) for bs in (4096, 65536) for qd in (1, 32)]
# node → (storage, speed against the reference): alpha is the reference, beta its equal, gamma
# 20 % slower, delta (another storage) 10 % faster
NODES = {"alpha": ("/var/tmp/iomatrix", 1.0), "beta": ("/var/tmp/iomatrix", 1.0),
         "gamma": ("/var/tmp/iomatrix", 0.8), "delta": ("/dev/nvme1n1", 1.1)}


def _figures(node: str, speed: float):
    def make(config: Configuration, workload: Workload, index: int) -> Figures:
        noise = random.Random(zlib.crc32(f"{node}|{config.key}|{workload.key}|{index}".encode()))
        iops = 20_000 * workload.iodepth ** 0.5 * (4096 / workload.bs) ** 0.5 * speed
        iops *= noise.uniform(0.99, 1.01)
        lat = workload.iodepth / iops * 1e9
        return Figures(iops, iops * workload.bs, lat, 2.5 * lat)
    return make


@pytest.fixture(scope="module")
def fleet_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    db = tmp_path_factory.mktemp("fleet") / "fleet.db"
    with Store(db) as store:
        ids = [write_run(store, CONFIGS, WORKLOADS, _figures(node, speed),
                         host={"hostname": node, "target": target, "target_fs": "ext4",
                               "qemu": "10.0.0"})
               for node, (target, speed) in NODES.items()]
    return db, ids


def _runs(db: Path, ids: list[int]):
    with Store(db) as store:
        return [store.load_run(i) for i in ids]


def test_slower_faster_and_equal_nodes(fleet_db):
    db, ids = fleet_db
    fleet = compare_fleet(_runs(db, ids))
    by_node = {n.node: n for n in fleet.nodes}
    assert by_node["alpha"].standing == "reference"
    assert by_node["gamma"].standing == "slower" and by_node["delta"].standing == "faster"
    assert by_node["beta"].standing in ("no significant difference", "within noise")
    assert by_node["gamma"].low < by_node["gamma"].change < by_node["gamma"].high < 0
    assert by_node["gamma"].change == pytest.approx(-0.2, abs=0.02)
    assert by_node["gamma"].worse == by_node["gamma"].points == len(CONFIGS) * len(WORKLOADS)
    assert [d.key for d in by_node["delta"].differences] == ["target"]
    # the A/A twin's noise floor (±1 % noise a sample): above 0, far below gamma's 20 %
    assert 0 < by_node["beta"].noise_floor < 0.05 and "noise floor ±" in by_node["gamma"].verdict
    assert "unpaired" in fleet.point_method and "paired by point" in fleet.node_method


def test_compare_of_several_runs_prints_one_line_per_node_slowest_first(fleet_db):
    db, ids = fleet_db
    proc = cli_result("compare", *map(str, ids), "--db", str(db))
    assert proc.returncode == 0, proc.stderr
    rows = [line.split()[0] for line in proc.stdout.splitlines()
            if line.split() and line.split()[0] in NODES]
    assert rows[:4] == ["gamma", "beta", "delta", "alpha"]
    assert re.search(r"^gamma \(run \d+\): slower: −(19|20)\.\d % IOPS", proc.stdout, re.M)
    assert "by storage (median change of its nodes):" in proc.stdout
    assert "Welch per point" in proc.stdout and "noise floor ±" in proc.stdout
    refused = cli_result("compare", *map(str, ids), "--db", str(db), "--match", "workload")
    assert refused.returncode != 0 and "fleet" in refused.stderr


@pytest.mark.slow
def test_fleet_page_is_self_contained_and_draws(fleet_db, tmp_path):
    db, ids = fleet_db
    proc = cli_result("report", *map(str, ids), "--db", str(db), "--out", str(tmp_path / "fleet"))
    assert proc.returncode == 0, proc.stderr
    page = tmp_path / "fleet" / "index.html"
    html = page.read_text()
    data = build_fleet_data(_runs(db, ids))
    assert html == render_fleet_html(data)
    assert "SYNTHETIC" in html and 'data-standing="slower" data-node="gamma"' in html
    assert "<script src" not in html and "http://" not in html.split("<script")[0]
    assert data.matrix[ids[2]][0] == pytest.approx(-0.2, abs=0.02)
    assert write_fleet_report(data, tmp_path / "again").read_text() == html
    body = html.split('id="fleet-data" data-encoding="gzip+base85">')[1].split("<")[0]
    assert '"node":"gamma"' in unpacked(body)
    need("chromium")
    with open_page(page, block_network=True, timeout_s=60) as p:
        assert p.problems == []
        assert p.evaluate("document.documentElement.dataset.charts") == "ready"
        assert p.count('.chart[data-drawn="1"]') == p.count(".chart") == 2
        p.screenshot(ARTIFACTS / "fleet.png")
        bars = p.evaluate("document.querySelector('.chart[data-kind=\"nodes\"]').data[0].y")
        assert [b.split(" ")[0] for b in bars] == ["gamma", "beta", "delta"]


def _cluster_run(store: Store, names: list[str], **method: object) -> int:
    """A cluster run as ``iomatrix run --nodes`` stores one: host-mode and blocklayer
    configurations carrying node=NAME, and its nodes; with ``concurrent_nodes``, one host-mode
    configuration without a node, every node loading the target in each trial."""
    speed = {n: NODES[n][1] for n in names}
    base = [Configuration(mode="host"), *configurations("blocklayer", {
        "aio": ["native"], "cache": ["none"], "format": ["raw"]})]
    configs = (base[:1] if method else
               [c.model_copy(update={"node": n}) for n in names for c in base])

    def figures(config: Configuration, workload: Workload, index: int) -> Figures:
        return _figures(config.node or "", speed.get(config.node or "", 1.0))(config, workload, index)
    run_id = write_run(store, configs, WORKLOADS, figures, method=method or None,  # type: ignore[arg-type]
                       host={"hostname": "controller", "target": "/var/tmp/iomatrix",
                             "target_fs": "ext4"})
    store.add_nodes(run_id, [(n, {"host": n}, {"hostname": n}) for n in names])
    return run_id


def test_a_cluster_runs_nodes_in_effect_and_runs(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    with Store(db) as store:
        apart = _cluster_run(store, ["alpha", "beta", "gamma"])
        together = _cluster_run(store, ["alpha", "beta"], mode="host", concurrent_nodes=True)
    code, cap = invoke("effect", str(apart), "--db", str(db))
    assert code == 0 and re.search(r"node\s+alpha, beta, gamma\s+alpha", cap.out()), cap.out()
    # the host baseline takes part in the node axis: 2 modes x 4 workloads pair per node
    code, cap = invoke("effect", str(apart), "--axis", "node", "--by", "none", "--db", str(db))
    assert code == 0, cap.stderr.getvalue()
    rows = {line.split()[0]: line.split() for line in cap.out().splitlines()
            if line.split()[:1] in (["beta"], ["gamma"])}
    assert rows["gamma"][1] == "8" and rows["gamma"][-1] == "worse", cap.out()
    assert float(rows["gamma"][2].rstrip("%").replace("\u2212", "-")) == pytest.approx(-20, abs=2)
    assert rows["beta"][1] == "8" and "worse" not in rows["beta"] and "better" not in rows["beta"]
    # every node in each trial: no trial is one node's
    code, cap = invoke("effect", str(together), "--axis", "node", "--db", str(db))
    said = cap.stderr.getvalue()
    assert code != 0 and "loaded its target from every node at once" in said, said
    code, cap = invoke("runs", "--db", str(db))
    listed = {line.split()[0]: line for line in cap.out().splitlines()[1:]}
    assert code == 0 and "3 nodes: alpha, beta, gamma" in listed[str(apart)], cap.out()
    assert "2 nodes: alpha, beta" in listed[str(together)]
