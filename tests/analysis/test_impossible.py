"""The rule for impossible figures (``analysis.impossible``) on made-up runs: beyond both 95 %
CIs with samples, beyond the margin without; IOPS, write bandwidth and latency; recommend leaves
such points out. Real runs: tests/scenarios/test_impossible.py."""

from __future__ import annotations

from pathlib import Path

from iomatrix.analysis.impossible import MARGIN, MARK, of_run, without_faster
from iomatrix.recommend.decide import recommend
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.workloads import Workload
from iomatrix.testing.synthetic import Figures, configurations, stored_run
from tests.conftest import cli

READ = Workload(rw="randread", bs=4096, iodepth=4)
WRITE = Workload(rw="randwrite", bs=4096, iodepth=4)
# IOPS by configuration: bare metal 1000; writeback far above it; none below; threads within noise
IOPS = {"host": 1000.0, "writeback": 4000.0, "none": 800.0, "directsync": 1050.0}


def _run(tmp_path: Path, samples: int, noise: float = 0.02):  # type: ignore[no-untyped-def]
    configs = [Configuration(mode="host"), *configurations(
        "blocklayer", {"aio": ["threads"], "cache": ["writeback", "none", "directsync"]})]

    def figures(config: Configuration, workload: Workload, index: int) -> Figures:
        iops = IOPS[config.cache or "host"] * (1 + noise * (index % 2 * 2 - 1))
        if workload is READ and config.cache == "writeback":
            iops = IOPS["host"] * 1.2          # reads: above bare metal, within the margin
        return Figures(iops=iops, bw_bytes=iops * 4096, lat_mean_ns=4e9 / iops,
                       p99_ns=8e9 / iops)

    return stored_run(tmp_path / f"r{samples}.db", configs, [READ, WRITE], figures,
                      samples=samples)


def _flagged(run) -> dict[tuple[str, str], str]:  # type: ignore[no-untyped-def]
    labels = {c.key: c.params.get("cache", "host") for c in run.configs}
    return {(labels[c], w.split("/")[0]): f.text for (c, w), f in of_run(run).items()}


def test_faster_than_bare_metal_beyond_the_intervals_or_the_margin(tmp_path: Path) -> None:
    # reads at 1.2× bare metal: within the margin with one sample, beyond tight intervals
    assert MARGIN > 0.2
    for samples, reads in ((1, []), (3, [("writeback", "randread")])):
        found = _flagged(_run(tmp_path, samples))
        assert sorted(found) == [*reads, ("writeback", "randwrite")], (samples, found)
        text = found[("writeback", "randwrite")]
        assert text == ("IOPS 4.0× bare metal's; write bandwidth 4.0× bare metal's; "
                        "mean latency 0.25× bare metal's"), text
    # wide intervals (noise ±80 %): nothing is beyond them
    (tmp_path / "wide").mkdir()
    assert _flagged(_run(tmp_path / "wide", 3, noise=0.8)) == {}


def test_recommend_leaves_them_out_and_show_marks_them(tmp_path: Path) -> None:
    run = _run(tmp_path, 3)
    kept, note = without_faster(run)
    assert len(kept.trials) == len(run.trials) - 6 and "writeback" in note
    assert note in recommend(run, "qemu").notes
    assert without_faster(kept) == (kept, "")
    status, text = cli("show", str(run.id), "--db", str(tmp_path / "r3.db"))
    marked = [line for line in text.splitlines() if MARK in line and "QD4" in line]
    assert status == 0 and len(marked) == 2 and all("writeback" in line for line in marked), text
