"""blocklayer mode for real: qemu-storage-daemon with each aio and cache mode, NBD and FUSE
exports, fio through them; what QEMU applied is read back and compared."""

from __future__ import annotations

import contextlib
import resource
from collections.abc import Iterator
from pathlib import Path

import pytest

from iomatrix.drivers.blocklayer import BlocklayerDriver, BlocklayerSession
from iomatrix.core.errors import TrialFailed
from iomatrix.fio.jobfile import job_text
from iomatrix.core.proc import wait_for
from iomatrix.fio.run import run_fio
from iomatrix.qemu.procinspect import UNOBSERVABLE, ProcessIO, aio_seen
from iomatrix.qemu.version import AIO_SET_UP_AT_FIRST_IO
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.method import Method
from iomatrix.suite.target import Target
from iomatrix.suite.workloads import Workload
from iomatrix.targets.workspace import Workspace

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
            workload = Workload(rw="randwrite", bs=4096, iodepth=8)
            job = job_text(workload, target=fio_target, ramp=0, runtime=0.5)
            run = run_fio(job, workdir=tmp_path, timeout=30, during=session.observe, during_at=0.5)
            session.check_trial(run.result, workload)      # the runner's look after fio
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


@contextlib.contextmanager
def _daemon(tmp_path: Path, aio: str, *, iothread: bool) -> Iterator[BlocklayerSession]:
    """A daemon holding a fresh 16 MiB raw image, cache=none, with its QEMU version known."""
    config = Configuration(mode="blocklayer", aio=aio, cache="none", format="raw",
                           iothread=iothread, preallocation="off")
    with Workspace(Target(directory=tmp_path / "target", size=16 << 20)) as ws:
        ws.open([config])
        driver = BlocklayerDriver(Method(mode="blocklayer"), tmp_path / "work")
        with driver.session(config, ws.images(config)) as session:
            assert isinstance(session, BlocklayerSession) and session.qemu is not None
            yield session


def _trial(session: BlocklayerSession, rw: str, workdir: Path) -> None:
    """One short fio trial as the runner makes it: a look half-way, a look after fio. It keeps
    off the image's first MiB: qemu-img writes the first block of a raw image (so that QEMU can
    probe its alignment), and only the rest is a hole."""
    session.new_trial()
    workload = Workload(rw=rw, bs=4096, iodepth=4)
    target = session.fio_target() | {"offset": str(1 << 20)}
    if "size" in target:                                  # a FUSE export: the file's own size
        target["size"] = str(int(target["size"]) - (1 << 20))
    job = job_text(workload, target=target, ramp=0, runtime=0.3)
    run = run_fio(job, workdir=workdir, timeout=30, during=session.observe, during_at=0.15)
    session.check_trial(run.result, workload)


@pytest.mark.parametrize("aio", ["native", "io_uring"])
def test_aio_is_judged_from_what_the_daemon_did(tmp_path: Path, no_leftovers: None,
                                                aio: str) -> None:
    """Reads of a never-written region are NBD holes: the file sees no request. QEMU before 9.0
    set up the aio mode when it opened the file, so it shows anyway; from 9.0 on it shows only
    after a request reached the file, and until then the check says "not observable", never
    threads. A write reaches the file, and then every QEMU shows the mode asked."""
    with _daemon(tmp_path, aio, iothread=False) as session:
        assert session.qemu is not None
        _trial(session, "randread", tmp_path)
        holes = session.applied()
        assert session.mismatches() == [], holes
        lazy = session.qemu >= AIO_SET_UP_AT_FIRST_IO
        assert holes["aio"] == (UNOBSERVABLE if lazy else aio), holes["aio.evidence"]
        _trial(session, "randwrite", tmp_path)
        written = session.applied()
        assert session.mismatches() == [], written
        assert written["aio"] == aio, written["aio.evidence"]


def test_a_fallback_to_threads_is_a_mismatch(tmp_path: Path, no_leftovers: None) -> None:
    """A daemon that cannot make its aio ring falls back to threads, and the trial says so.
    Made for real: once the FUSE export is up, the daemon may open no more descriptors, so
    QEMU 9.0 on cannot make the ring's event notifier at the first write; QEMU 7.2 made it when
    it opened the file and keeps native."""
    with _daemon(tmp_path, "native", iothread=True) as session:
        assert session.qemu is not None
        lowest = _lowest_free_fd(session.pid)
        resource.prlimit(session.pid, resource.RLIMIT_NOFILE, (lowest, lowest))
        _trial(session, "randwrite", tmp_path)
        seen = session.applied()
        if session.qemu >= AIO_SET_UP_AT_FIRST_IO:
            assert seen["aio"] == "threads", seen["aio.evidence"]
            assert "falling back to thread pool" in seen["aio.evidence"]
            assert session.mismatches() == [
                f"aio: asked native, the daemon shows threads ({seen['aio.evidence']})"]
        else:
            assert seen["aio"] == "native" and session.mismatches() == []


def _lowest_free_fd(pid: int) -> int:
    """The number the process's next descriptor would get (the kernel gives the lowest free
    one, and refuses any at or above RLIMIT_NOFILE), once its table is settled: the monitor
    connections the session made are closed by the daemon a moment after ours."""
    def table() -> set[int]:
        return {int(fd.name) for fd in Path(f"/proc/{pid}/fd").iterdir()}

    seen: list[set[int]] = []
    assert wait_for(lambda: seen.append(table()) or seen[-3:] == [seen[-1]] * 3, timeout=10)
    return min(set(range(len(seen[-1]) + 1)) - seen[-1])


def _look(rings: int = 0, fds: int = 0) -> ProcessIO:
    return ProcessIO(aio_rings=rings, io_uring_fds=fds, threads=3, thread_names={"qsd": 3})


@pytest.mark.parametrize("asked, look, qemu, log, shown", [
    ("native", _look(rings=1), (7, 2, 22), "", "native"),
    ("io_uring", _look(fds=1), (10, 0, 13), "", "io_uring"),
    ("native", _look(), (7, 2, 22), "", "threads"),          # 7.2 makes the ring at open
    ("native", _look(), (10, 0, 13), "", UNOBSERVABLE),      # 10.0: no request reached the file
    ("io_uring", _look(), None, "", UNOBSERVABLE),           # unknown version: never a guess
    ("native", _look(), (10, 0, 13),
     "qemu-storage-daemon: Unable to use Linux AIO, falling back to thread pool: x\n", "threads"),
    ("threads", _look(), (10, 0, 13), "", "threads"),
    ("threads", _look(rings=1), (10, 0, 13), "", "native"),
])
def test_aio_seen_reads_the_evidence_by_version(asked: str, look: ProcessIO,
                                                qemu: tuple[int, int, int] | None, log: str,
                                                shown: str) -> None:
    assert aio_seen(asked, look, qemu=qemu, log=log).aio == shown


def test_looks_accumulate() -> None:
    """A ring seen by any look of a trial counts: looks are merged, never replaced."""
    merged = _look(rings=1).merged(_look())
    assert (merged.aio_rings, merged.aio) == (1, "native")
    assert _look().merged(_look(fds=2)).io_uring_fds == 2
