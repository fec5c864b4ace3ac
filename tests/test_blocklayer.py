"""blocklayer mode for real: qemu-storage-daemon with each aio and cache mode, NBD and FUSE
exports, fio through them; what QEMU applied is read back and compared."""

from __future__ import annotations

from pathlib import Path

import pytest

from iomatrix.drivers.blocklayer import BlocklayerDriver
from iomatrix.core.errors import TrialFailed
from iomatrix.fio.jobfile import job_text
from iomatrix.fio.run import run_fio
from iomatrix.suite.model import Configuration, Method, Target, Workload
from iomatrix.target.workspace import Workspace

pytestmark = pytest.mark.slow

CASES = [
    # (aio, cache, format, iothread)
    ("native", "none", "raw", False),
    ("native", "directsync", "qcow2", False),
    ("io_uring", "writeback", "raw", False),
    ("io_uring", "writethrough", "qcow2", False),
    ("threads", "unsafe", "raw", False),
    ("threads", "none", "qcow2", True),
    ("io_uring", "none", "raw", True),
    ("native", "none", "qcow2", True),
]
FLAGS = {  # cache mode → (direct, no-flush) as QEMU must report them on both nodes
    "none": ("true", "false"), "directsync": ("true", "false"), "writeback": ("false", "false"),
    "writethrough": ("false", "false"), "unsafe": ("false", "true"),
}


@pytest.mark.parametrize("aio, cache, fmt, iothread", CASES)
def test_daemon_applies_configuration(tmp_path: Path, no_leftovers: None, aio: str, cache: str,
                                      fmt: str, iothread: bool) -> None:
    config = Configuration(mode="blocklayer", aio=aio, cache=cache, format=fmt, iothread=iothread,
                           preallocation="off")
    method = Method(mode="blocklayer", ramp=0, runtime=0.5)
    target = Target(directory=tmp_path / "target", size=32 << 20)
    with Workspace(target) as ws:
        ws.open([config])
        image = ws.image(config)
        driver = BlocklayerDriver(method, tmp_path / "work")
        with driver.session(config, [image]) as session:
            fio_target = session.fio_target()
            assert fio_target.get("ioengine") == ("libaio" if iothread else "nbd")
            job = job_text(Workload(rw="randwrite", bs=4096, iodepth=8), target=fio_target,
                           ramp=0, runtime=0.5)
            run = run_fio(job, workdir=tmp_path, timeout=30, during=session.observe, during_at=0.5)
            applied = session.applied()
            assert session.mismatches() == []
        assert run.result.jobs[0].write.iops > 0
    direct, no_flush = FLAGS[cache]
    for node in ("file0", "disk0"):
        assert applied[f"{node}.cache.direct"] == direct
        assert applied[f"{node}.cache.no-flush"] == no_flush
    assert applied["disk0.driver"] == fmt
    assert applied["file0.driver"] == "file"
    assert applied["aio"] == aio, applied["aio.evidence"]
    assert applied["export"] == ("fuse+iothread" if iothread else "nbd")
    assert not (tmp_path / "target").exists() or not any((tmp_path / "target").iterdir())


def test_daemon_failure_is_a_trial_failure(tmp_path: Path, no_leftovers: None) -> None:
    """A configuration the daemon refuses fails with the daemon's own message."""
    config = Configuration(mode="blocklayer", aio="native", cache="writeback", format="raw",
                           iothread=False, preallocation="off")  # expand() would have refused it
    target = Target(directory=tmp_path / "target", size=8 << 20)
    with Workspace(target) as ws:
        ws.open([config])
        driver = BlocklayerDriver(Method(), tmp_path / "work")
        with pytest.raises(TrialFailed, match="aio=native was specified, but it requires cache.direct=on"):
            with driver.session(config, ws.images(config)):
                pass


def test_mismatch_is_detected(tmp_path: Path, no_leftovers: None) -> None:
    """If the daemon does not do what was asked (here: aio not observed), it is said."""
    config = Configuration(mode="blocklayer", aio="io_uring", cache="none", format="raw",
                           iothread=False, preallocation="off")
    target = Target(directory=tmp_path / "target", size=8 << 20)
    with Workspace(target) as ws:
        ws.open([config])
        with BlocklayerDriver(Method(), tmp_path / "work").session(config, ws.images(config)) as s:
            assert s.mismatches() == ["aio: not observed while fio ran"]
            s.nodes["file0.cache.direct"] = "false"   # as if QEMU had ignored cache.direct
            assert any("file0.cache.direct: asked true, QEMU reports false" in m
                       for m in s.mismatches())
