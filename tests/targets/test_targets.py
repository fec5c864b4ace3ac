"""Issue 10: one run over several targets ([[targets]], [target] filesystems), each with its own
bare-metal baseline, a filesystem the directory is not on made on a loop device in a private
mount namespace, and nothing left behind: after the run, and after kill -9 and `iomatrix clean`."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from iomatrix.analysis.efficiency import efficiency
from iomatrix.analysis.points import points
from iomatrix.cli.status import ExitStatus
from iomatrix.core.dirs import MARKER
from iomatrix.core.errors import IomatrixError, SuiteError
from iomatrix.core.mounts import NOT_A_MOUNT, PrivateMounts, mount_of, mounts, root_is_a_mount
from iomatrix.core.owner import this_process
from iomatrix.measure.reclaim import marker_text, reclaim
from iomatrix.measure.runner import run_suite
from iomatrix.report.data import build_report_data
from iomatrix.store import Store
from iomatrix.suite import Workload, expand, load_suite, load_suite_text
from iomatrix.suite.spec import RunSpec
from iomatrix.targets import loops
from iomatrix.targets.targets import plan_targets
from iomatrix.testing.synthetic import write_run
from tests.conftest import IOMATRIX, cli, write_suite
from tests.needs import lacking


SHARED = """
[[workloads]]
rw = "randwrite"
bs = "4k"
iodepth = 4
[method]
mode = "blocklayer"
baseline = true
ramp = 0
runtime = "{runtime}"
samples = 2
seed = 5
"""
MATRIX = """
[matrix]
aio = "threads"
iothread = false
"""


def two_targets(tmp_path: Path, runtime: str = "500ms") -> tuple[Path, str]:
    """A suite over tmp_path/target itself ("own") and a filesystem made there ("made"): one
    this host does not have at tmp_path. Skips where this host cannot make it (not root...)."""
    own = mount_of(tmp_path)
    other = "ext4" if own is not None and own.fstype == "xfs" else "xfs"
    target = tmp_path / "target"
    path = tmp_path / "two.toml"
    path.write_text(f'[suite]\nname = "two"\n[target]\nsize = "16MiB"\n'
                    f'[[targets]]\nname = "own"\ndirectory = "{target}"\n'
                    f'[[targets]]\nname = "made"\ndirectory = "{target}"\nfilesystem = "{other}"\n'
                    + MATRIX + SHARED.format(runtime=runtime))
    problem = plan_targets(load_suite(path))[1].problem
    if problem:
        pytest.skip(f"this host cannot make {other} on a loop device: {problem}")
    return path, other


def ours(tmp_path: Path) -> tuple[list[loops.Loop], list[str], list[Path]]:
    """What runs left under tmp_path: loop devices over files there, mounts this process sees
    there, and entries in the target directory."""
    target = tmp_path / "target"
    return (loops.backed_in(tmp_path),
            [m.point for m in mounts() if m.point.startswith(str(tmp_path) + "/")],
            sorted(target.iterdir()) if target.exists() else [])


# -- the suite -----------------------------------------------------------------------------------

def test_every_configuration_is_measured_on_every_target_each_with_its_baseline(
        tmp_path: Path) -> None:
    suite = load_suite(write_suite(tmp_path, 'filesystems = ["ext4", "xfs"]\n' + MATRIX
                                   + SHARED.format(runtime="1s") + "aa = true\n"))
    assert [t.name for t in suite.named_targets] == ["ext4", "xfs"]
    configs = expand(suite).configurations
    keys = [c.key for c in configs]
    assert keys == [
        "host/target=ext4", "host/target=xfs",
        "blocklayer/target=ext4/aio=threads/iothread=off/cache=none/format=raw/preallocation=off",
        "blocklayer/target=ext4/aio=threads/iothread=off/cache=none/format=raw/preallocation=off"
        "/aa=twin",
        "blocklayer/target=xfs/aio=threads/iothread=off/cache=none/format=raw/preallocation=off"]
    assert [str(c.identity.baseline) for c in configs] == [
        "host/target=ext4", "host/target=xfs", "host/target=ext4", "host/target=ext4",
        "host/target=xfs"]
    assert [c.label for c in expand(suite).configurations][::2] == [
        "host (bare metal) on ext4", "blocklayer threads/none/raw on ext4",
        "blocklayer threads/none/raw on xfs"]
    one = load_suite(write_suite(tmp_path, MATRIX + SHARED.format(runtime="1s"), name="one"))
    assert one.named_targets == () and [c.key for c in expand(one).configurations][0] == "host"
    # a scale may replace the list; the run keeps the suite resolved at its scale
    text = (tmp_path / "two.toml")
    text.write_text(f'[suite]\nname = "s"\n[target]\nsize = "8MiB"\n[[targets]]\nname = "a"\n'
                    f'directory = "{tmp_path}"\n[scale.q]\n[[scale.q.targets]]\nname = "b"\n'
                    f'directory = "{tmp_path}"\nfilesystem = "btrfs"\n[scale.q.target]\n'
                    f'size = "4MiB"\n')
    scaled = load_suite(text, scale="q")
    assert scaled.source_text == text.read_text()         # the user's text, as written
    stored = RunSpec.from_json(RunSpec.of(scaled).to_json())
    again = stored.suite(text=scaled.source_text, source="stored")
    assert [(t.name, t.filesystem, t.size) for t in again.named_targets] == [("b", "btrfs", 4 << 20)]


def test_a_configurations_typed_key_is_its_stored_key(tmp_path: Path) -> None:
    """Nothing reads a key back into parts: the typed key (ConfigKey) writes the stored text,
    and a stored record gives it back from its mode and parameters."""
    suite = load_suite(write_suite(tmp_path, 'filesystems = ["ext4", "xfs"]\n' + MATRIX
                                   + SHARED.format(runtime="1s") + "aa = true\n"))
    configs = expand(suite).configurations
    twin = configs[3]
    assert twin.aa and twin.identity.target == "ext4" and twin.identity.settings == (
        "target=ext4/aio=threads/iothread=off/cache=none/format=raw/preallocation=off/aa=twin")
    workload = Workload(rw="randread", bs=4096, iodepth=1)
    with Store(tmp_path / "r.db") as store:
        run = store.load_run(write_run(store, list(configs), [workload], lambda c, w, i: None,
                                       samples=1))
    assert [str(c.identity) for c in run.configs] == [c.key for c in configs]
    assert [c.identity for c in run.configs] == [c.identity for c in configs]


@pytest.mark.parametrize("tables, expected", [
    ('[target]\nsize = "8MiB"\n[[targets]]\nname = "a"\ndirectory = "/x"\n[[targets]]\n'
     'name = "a"\ndirectory = "/y"\n', "two targets are called 'a'"),
    ('[target]\ndirectory = "/x"\nsize = "8MiB"\n[[targets]]\nname = "a"\ndirectory = "/y"\n',
     "[target] directory: with [[targets]], each target names its own directory or device"),
    ('[[targets]]\nname = "a/b"\ndirectory = "/y"\nsize = "8MiB"\n',
     "[[targets]] #1 name = 'a/b'"),
    ('[[targets]]\nname = "a"\ndirectory = "/y"\nsize = "8MiB"\nfilesystems = ["xfs"]\n',
     "filesystems is a [target] key"),
    ('[target]\ndevice = "/dev/null"\nallow_destroy = true\nfilesystems = ["xfs"]\n',
     "filesystems are made in a directory target"),
    ('[target]\ndirectory = "/y"\nsize = "8MiB"\nfilesystems = ["xfs", "zfs"]\n',
     "[target] filesystems[1] = 'zfs'"),
])
def test_bad_targets_are_one_clear_error(tables: str, expected: str) -> None:
    with pytest.raises(SuiteError) as info:
        load_suite_text('[suite]\nname = "t"\n' + tables, source="t.toml")
    assert expected in str(info.value) and str(info.value).startswith("t.toml: ")


def test_plan_lists_the_targets_and_skips_a_filesystem_it_cannot_make(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    own = mount_of(tmp_path)
    if own is None or own.fstype not in ("ext4", "xfs", "btrfs"):
        pytest.skip(f"for a temporary directory on ext4, xfs or btrfs, not {own}")
    if not root_is_a_mount():
        pytest.skip(NOT_A_MOUNT)
    missing = "xfs" if own.fstype == "btrfs" else "btrfs"
    # a PATH with the tools a run needs but no mkfs: a filesystem this host cannot make
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("losetup", "mount", "umount", "fio", "qemu-img", "qemu-storage-daemon"):
        found = shutil.which(tool, path=os.environ["PATH"] + ":/usr/sbin:/sbin")
        if found is not None:
            (bin_dir / tool).symlink_to(found)
    monkeypatch.setenv("PATH", str(bin_dir))
    path = write_suite(tmp_path, f'filesystems = ["{own.fstype}", "{missing}"]\n' + MATRIX
                       + SHARED.format(runtime="1s"))
    code, output = cli("run", str(path), "--plan")
    assert code == ExitStatus.OK, output
    assert f"target {own.fstype}: {tmp_path / 'target'} ({own.fstype})" in output
    assert (f"target {missing}: skipped: cannot make {missing} here: mkfs.{missing} not found "
            "(apt-get install ") in output
    assert f"on {own.fstype} ·" in output and f"on {missing} ·" not in output
    # a [[targets]] table relies on its filesystem: the run refuses, in one line, storing nothing
    path.write_text(f'[suite]\nname = "t"\n[target]\nsize = "8MiB"\n[[targets]]\nname = "x"\n'
                    f'directory = "{tmp_path}"\nfilesystem = "{missing}"\n' + MATRIX
                    + SHARED.format(runtime="1s"))
    code, output = cli("run", str(path), "--db", str(tmp_path / "r.db"))
    assert code == ExitStatus.TARGET
    with Store(tmp_path / "r.db", readonly=True) as store:
        assert store.list_runs() == []
    assert output.splitlines()[0].startswith(f"iomatrix: [[targets]] x: cannot make {missing} here: ")
    code, output = cli("run", str(path), "--target", str(tmp_path))
    assert code == ExitStatus.SUITE_INVALID and "names 1 in [[targets]]" in output


# -- for real ------------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_run_over_two_targets_measures_each_against_its_own_baseline(
        tmp_path: Path, no_leftovers: None, monkeypatch: pytest.MonkeyPatch) -> None:
    path, other = two_targets(tmp_path)
    monkeypatch.chdir(tmp_path)
    root = os.stat("/")
    with Store(tmp_path / "r.db") as store:
        outcome = run_suite(load_suite(path), store)
        run = store.load_run(outcome.run_id)
    assert (outcome.trials_ok, outcome.trials_failed) == (8, 0)
    # leaving the filesystem's mount namespace gave back the root and working directory
    assert os.getcwd() == str(tmp_path)
    assert (os.stat("/").st_dev, os.stat("/").st_ino) == (root.st_dev, root.st_ino)
    assert ours(tmp_path) == ([], [], [])                 # no loop device, mount or file left
    assert not (tmp_path / "target").exists()             # created by the run, removed by it
    assert any(f"target made: {other} made by iomatrix on a loop device" in n for n in run.notes)
    assert not any("refused direct I/O" in n for n in run.notes)
    found = {p.config_key: p for p in points(run)}
    bare = efficiency(list(found.values()), run.configs)
    for name in ("own", "made"):
        config = f"blocklayer/target={name}/aio=threads/iothread=off/cache=none/format=raw/" \
                 "preallocation=off"
        host = found[f"host/target={name}"]
        pct = bare[(config, run.workloads[0].key)].iops_pct
        assert pct == pytest.approx(100 * found[config].iops / host.iops)   # type: ignore[operator]
    assert found["host/target=own"].iops != found["host/target=made"].iops
    code, shown = cli("show", str(outcome.run_id), "--db", str(tmp_path / "r.db"))
    assert code == ExitStatus.OK and "targets own, made" in shown
    rows = [line for line in shown.splitlines() if "blocklayer threads/none/raw on " in line]
    assert len(rows) == 2 and all("%" in row for row in rows)
    assert build_report_data(run).axes["target"] == ("own", "made")


@pytest.mark.slow
def test_a_run_with_a_made_filesystem_writes_a_relative_db_and_report(
        tmp_path: Path, no_leftovers: None) -> None:
    """``--db`` and ``--report`` relative to where the command was started, as a user types
    them: the report is written after the run left its filesystem's mount namespace."""
    path, _ = two_targets(tmp_path)
    done = subprocess.run([*IOMATRIX, "run", str(path), "--db", "fs.db", "--report", "rep"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == ExitStatus.OK, done.stderr
    assert (tmp_path / "rep" / "index.html").is_file()
    with Store(tmp_path / "fs.db", readonly=True) as store:
        assert [r.status for r in store.list_runs()] == ["complete"]
    assert ours(tmp_path) == ([], [], [])


def test_leaving_private_mounts_restores_root_and_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """setns into a mount namespace moves the thread to that namespace's root, in / (inside a
    chroot: the host's /); leave() puts back the root and directory enter() was called in."""
    monkeypatch.chdir(tmp_path)
    root = os.stat("/")
    namespace = PrivateMounts()
    try:
        namespace.enter()
    except (OSError, IomatrixError) as exc:
        lacking("mount-namespace", f"no private mount namespace here: {exc}")
    try:
        os.chdir("/")
    finally:
        namespace.leave()
    assert os.getcwd() == str(tmp_path)
    assert (os.stat("/").st_dev, os.stat("/").st_ino) == (root.st_dev, root.st_ino)
    assert not namespace.active
    namespace.leave()                                     # twice: nothing


@pytest.mark.slow
def test_a_killed_run_leaves_its_filesystem_to_no_one_and_clean_removes_the_rest(
        tmp_path: Path, no_leftovers: None) -> None:
    path, _ = two_targets(tmp_path, runtime="3s")
    db = tmp_path / "r.db"
    log = tmp_path / "run.log"
    with open(log, "w") as err:
        proc = subprocess.Popen([*IOMATRIX, "run", str(path), "--db", str(db)], cwd=tmp_path,
                                stdout=subprocess.DEVNULL, stderr=err, text=True)
    deadline = time.monotonic() + 60
    while not (loops.backed_in(tmp_path) and "[2/" in log.read_text()):
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)
    made = loops.backed_in(tmp_path)
    assert len(made) == 1 and made[0].direct_io and made[0].autoclear
    assert ours(tmp_path)[1] == []            # mounted, but in the run's own namespace only
    proc.kill()
    proc.wait(timeout=10)
    done = subprocess.run([*IOMATRIX, "clean", "--db", str(db)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "removed images" in done.stdout
    deadline = time.monotonic() + 10         # the kernel detaches it once the run's fio is gone
    while ours(tmp_path) != ([], [], []) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ours(tmp_path) == ([], [], [])


def test_clean_detaches_a_loop_device_a_killed_run_left_unmounted(tmp_path: Path) -> None:
    """Killed between attaching the loop device and mounting it: found by its backing file."""
    if os.geteuid() != 0 or not Path("/dev/loop-control").exists():
        lacking("loop", "loop devices need root here")
    with Store(tmp_path / "r.db") as store:
        owner = this_process()._replace(pid=_dead_pid())
        dead = store.register_process(owner, "")
        store.end_process(dead)
        workspace = tmp_path / "iomatrix-0000dead"
        store.add_resource(dead, "workspace", str(workspace), str(tmp_path))
        workspace.mkdir(mode=0o700)
        (workspace / MARKER).write_text(marker_text(owner, "workspace", str(workspace)))
        file = workspace / "xfs.img"
        with open(file, "wb") as f:
            f.truncate(8 << 20)
        loop = loops.attach(file, os.stat(file))
        try:
            assert loops.backed_in(tmp_path) == [loop]
            done = reclaim(store)
        finally:
            if loops.backed_in(tmp_path):
                loops.detach(loop.device)
    assert [(r.action, r.detail) for r in done] == [
        ("removed", f"loop device(s) {loop.device} detached")]
    assert loops.backed_in(tmp_path) == [] and not workspace.exists()


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid
