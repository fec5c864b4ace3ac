"""``[target] lvm`` and ``lvmthin`` (``iomatrix.targets.lvm`` on ``iomatrix.targets.volumes``).

This kernel has no device-mapper: no real LVM volume can be made here. The real lvm2 tools
(installed) run as far as they go: ``vgs`` and ``lvs`` on a host without the volume group, the
one-line refusal that follows. Everything that makes a volume runs against the LVM STAND-IN
(``tests/fixtures/standins/lvm``, put first on PATH by ``lvm_standin``: ``tests/lvm.py``), which
hands out real loop devices, so that what follows it (the device checks, QEMU and fio in host,
blocklayer and guest modes, kill -9 and ``iomatrix clean``) runs on real block devices."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from iomatrix.cli.status import ExitStatus
from iomatrix.core.errors import TargetError
from iomatrix.store.repo import Store
from iomatrix.suite.model import Target
from iomatrix.targets import lvm, volumes
from iomatrix.targets.kind import Probe
from iomatrix.targets.registry import RESOURCES
from tests.conftest import TCG_GUEST, cli_result, our_processes
from tests.lvm import LvmStandin, lvm_standin as _lvm_standin
from tests.needs import needs


@pytest.fixture
def standin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LvmStandin]:
    """The LVM stand-in: volume group pve (512 MiB), thin pool pve/data (256 MiB)."""
    yield from _lvm_standin(tmp_path, monkeypatch)


TABLES = {"lvmthin": 'lvmthin = { vg = "pve", pool = "data" }', "lvm": 'lvm = { vg = "pve" }'}


def suite(tmp_path: Path, table: str, *, size: str = "32MiB", mode: str = "blocklayer",
          runtime: str = "500ms", guest: bool = True) -> Path:
    """A tiny suite on ``table``: host (the baseline), ``mode`` and, with ``guest``, a guest
    (TCG) part, one workload each."""
    part = ('[[part]]\nmode = "guest"\ncontroller = "virtio-blk"\naio = "io_uring"\n'
            if guest else "")
    path = tmp_path / "suite.toml"
    path.write_text(f"""[suite]
name = "lvm-test"
[target]
size = "{size}"
{table}
[matrix]
cache = "none"
aio = ["native", "io_uring"]
format = "raw"
iothread = false
{part}[[workloads]]
rw = "randwrite"
bs = "4k"
iodepth = 4
[method]
mode = "{mode}"
baseline = true
precondition = false
runtime = "{runtime}"
ramp = "0s"
samples = 1
{TCG_GUEST}""")
    return path


# -- names ---------------------------------------------------------------------------------

@pytest.mark.parametrize("vg", ["pve", "vg0", "my_vg.1", "a+b", "x-y"])
def test_lvm_names_iomatrix_accepts(vg: str) -> None:
    table = Target(lvm={"vg": vg}, size="64MiB").network
    assert table is not None and table.location == f"LVM volume group {vg}"
    assert Target(lvmthin={"vg": vg, "pool": vg}, size="64MiB").kind == "lvmthin"


@pytest.mark.parametrize("table", [
    {"lvm": {"vg": "-pve"}}, {"lvm": {"vg": "--help"}}, {"lvm": {"vg": "pve/data"}},
    {"lvm": {"vg": "a b"}}, {"lvm": {"vg": ".."}}, {"lvm": {"vg": ""}}, {"lvm": {"vg": "x" * 128}},
    {"lvm": {"vg": "pve;rm"}}, {"lvmthin": {"vg": "pve", "pool": "-data"}},
    {"lvmthin": {"vg": "pve", "pool": "data_tmeta"}},
    {"lvmthin": {"vg": "pve", "pool": "snapshot1"}}, {"lvmthin": {"vg": "pve"}},
    {"lvm": {"vg": "pve", "pool": "data"}}])
def test_lvm_names_iomatrix_refuses(table: dict[str, dict[str, str]]) -> None:
    with pytest.raises(ValidationError):
        Target(**table, size="64MiB")


def test_a_volume_target_needs_a_size() -> None:
    with pytest.raises(ValidationError, match="needs a size"):
        Target(lvmthin={"vg": "pve", "pool": "data"})


# -- the real lvm2 tools, as far as they go here ---------------------------------------------

@pytest.mark.skipif(shutil.which("vgs") is None, reason="lvm2 is not installed")
@pytest.mark.parametrize("kind", ["lvm", "lvmthin"])
def test_real_lvm_tools_refuse_a_missing_group_in_one_line(tmp_path: Path, kind: str) -> None:
    """The real vgs/lvs (no stand-in): a volume group this host does not have is one line,
    a non-zero exit, and nothing stored."""
    table = TABLES[kind].replace('"pve"', '"iomatrix-test-none"')
    db = tmp_path / "r.db"
    done = cli_result("run", str(suite(tmp_path, table, guest=False)), "--db", str(db),
                      cwd=tmp_path)
    assert done.returncode == ExitStatus.TARGET, done.stdout + done.stderr
    lines = [line for line in done.stderr.strip().splitlines() if "hint:" not in line]
    assert len(lines) == 1, done.stderr
    assert 'Volume group "iomatrix-test-none" not found' in lines[0]
    assert "leaked" not in done.stderr
    assert not db.exists() or b"lvm-test" not in db.read_bytes()


@pytest.mark.skipif(shutil.which("lvcreate") is None, reason="lvm2 is not installed")
def test_real_lvm_tools_accept_iomatrix_command_lines() -> None:
    """The real lvm2 tools parse every command line iomatrix gives them: the report fields
    are fields lvs and vgs know (an unknown one is an error), and lvcreate takes the thick and
    thin command lines and the owner tag, getting as far as this kernel's missing device-mapper
    (a line it does not parse, or a tag it does not accept, is refused before that)."""
    for tool, fields in (("vgs", lvm.VG_FIELDS), ("lvs", lvm.POOL_FIELDS),
                         ("lvs", lvm.LIST_FIELDS), ("lvs", "lv_path")):
        done = lvm._lvm(tool, "--noheadings", "--units", "b", "--nosuffix", "--separator", "|",
                        "-o", fields)
        assert done.returncode == 0, (tool, fields, done.stderr)
    assert lvm._lvm("lvs", "-o", "no_such_field").returncode != 0
    tag = volumes.owner_tag("made by iomatrix: lvm-volume pve/x\nfor pid 1 as uid 0\n")
    for backend in (lvm.LvmBackend("iomatrix-test-none"),
                    lvm.LvmThinBackend("iomatrix-test-none", "data")):
        argv = backend.create_argv("iomatrix-1-abc-raw-off", 64 << 20, tag)
        done = lvm._lvm(*argv)
        assert done.returncode != 0 and "Error during parsing" not in done.stderr, done.stderr
        assert "device-mapper" in done.stderr or "not found" in done.stderr, done.stderr
        with pytest.raises(TargetError, match="device-mapper|not found"):
            backend.create("iomatrix-1-abc-raw-off", 64 << 20, tag)
    refused = lvm._lvm(*lvm.LvmBackend("iomatrix-test-none").create_argv(
        "iomatrix-1-abc-raw-off", 64 << 20, "a tag"))
    assert "Error during parsing" in refused.stderr         # the check above can fail
    gone = lvm._lvm("lvremove", "-f", "iomatrix-test-none/iomatrix-1-abc-raw-off")
    assert gone.returncode == 5 and 'Volume group "iomatrix-test-none" not found' in gone.stderr


def test_doctor_says_whether_lvm_volumes_can_be_made(tmp_path: Path) -> None:
    """Tools on PATH and the kernel's device-mapper: each missing is said, never required."""
    run = lambda argv: (0, "", "")              # noqa: E731
    here = lvm.LvmKind().host_checks(Probe(which=lambda t: f"/sbin/{t}", run=run,
                                           sysfs=tmp_path))
    assert [c.ok for c in here] == [False] and "no device-mapper" in here[0].detail
    (tmp_path / "class" / "misc" / "device-mapper").mkdir(parents=True)
    assert lvm.LvmKind().host_checks(Probe(which=lambda t: f"/sbin/{t}", run=run,
                                           sysfs=tmp_path))[0].ok
    gone = lvm.LvmKind().host_checks(Probe(which=lambda t: None, run=run, sysfs=tmp_path))
    assert not gone[0].ok and gone[0].hint == "apt-get install lvm2"


# -- against the stand-in ------------------------------------------------------------------

def test_stand_in_space_refusals_are_one_line(tmp_path: Path, standin: LvmStandin) -> None:
    """A thin pool whose data use would pass the bound with the run's volumes written fully,
    and a volume group without the free extents, are refused in one line with a non-zero exit
    before any volume is made."""
    standin.run("lvcreate", "-V", "200m", "-T", "pve/data", "-n", "vm-100-disk-0")
    device = standin.volumes("pve")["vm-100-disk-0"]["loop"]
    subprocess.run(["dd", "if=/dev/zero", f"of={device}", "bs=1M", "count=200",
                    "oflag=direct", "status=none"], check=True, timeout=120)
    for kind, size, said in (("lvmthin", "32MiB", "past the 90% iomatrix allows"),
                             ("lvm", "300MiB", "free of")):
        done = cli_result("run", str(suite(tmp_path, TABLES[kind], size=size, guest=False)),
                          "--db", str(tmp_path / "r.db"), cwd=tmp_path)
        assert done.returncode == ExitStatus.TARGET, done.stdout + done.stderr
        lines = [line for line in done.stderr.strip().splitlines() if "hint:" not in line]
        assert len(lines) == 1 and said in lines[0], done.stderr
        assert standin.ours("pve") == []
    # the same thin pool takes a run that fits (the refusal is the bound, not the pool)
    fits = lvm.LvmThinBackend("pve", "data").check(1, 4 << 20)
    assert "data 78.1%" in fits[0]


def test_stand_in_reclaim_removes_only_what_the_record_made(standin: LvmStandin) -> None:
    """``Resource.remove``: a volume is removed only with iomatrix's prefix on the recorded
    group and the record's marker as a tag; anything else is left, with why."""
    remove = RESOURCES[lvm.KIND].remove
    marker = "made by iomatrix: lvm-volume pve/iomatrix-7-abc-raw-off\nfor pid 1\n"
    tag = volumes.owner_tag(marker)
    standin.run("lvcreate", "-L", "8m", "-n", "iomatrix-7-abc-raw-off", "--addtag", tag, "pve")
    standin.run("lvcreate", "-L", "8m", "-n", "iomatrix-7-def-raw-off", "--addtag",
                volumes.owner_tag("another record"), "pve")
    standin.run("lvcreate", "-L", "8m", "-n", "vm-100-disk-0", "--addtag", tag, "pve")
    within = json.dumps({"vg": "pve"})
    assert remove("pve/vm-100-disk-0", within, marker) == "left: not a volume name iomatrix gives"
    assert remove("pve/iomatrix-7-def-raw-off", within, marker).startswith(
        "left: it does not carry this record's marker")
    assert remove("pve/../x", within, marker).startswith("left: not a volume name")
    assert remove("pve/iomatrix-7-abc-raw-off", '{"vg": "-pve"}', marker).startswith(
        "left: the record's connection is not one iomatrix writes")
    assert remove("pve/iomatrix-7-abc-raw-off", '{"vg": "pve", "x": 1}', marker).startswith(
        "left: the record's connection")
    assert remove("pve/iomatrix-7-abc-raw-off", within, marker, dry_run=True) == "would remove"
    assert remove("pve/iomatrix-7-abc-raw-off", within, marker) == "removed"
    assert remove("pve/iomatrix-7-abc-raw-off", within, marker) == "gone"
    assert sorted(standin.volumes("pve")) == ["data", "iomatrix-7-def-raw-off", "vm-100-disk-0"]
    removes = [c for c in standin.commands() if c[0] == "lvremove"]
    assert removes == [["lvremove", "-f", "pve/iomatrix-7-abc-raw-off"]]


def test_stand_in_volume_must_be_a_free_block_device(tmp_path: Path, standin: LvmStandin) -> None:
    """What the tool names as the new volume's device is checked: a device in use (held open
    exclusively, as a mounted one is) is refused, and ``verify`` refuses a path that names
    another device afterwards."""
    from iomatrix.suite.configuration import Configuration

    opened = volumes.VolumeTarget(Target(lvm={"vg": "pve"}, size="8MiB"),
                                  lvm.LvmBackend("pve"))
    config = Configuration(mode="host")
    opened.check([config])
    image = opened.image(config)
    assert image.is_device and image.path.is_block_device()
    opened.verify([image])
    other = Path(standin.volumes("pve")["data"].get("loop", "/dev/null"))
    moved = image.model_copy(update={"path": other})
    opened._devices[other] = opened._devices[image.path] + 1          # a different device
    with pytest.raises(TargetError, match="no longer the volume iomatrix made"):
        opened.verify([moved])
    standin.run("lvcreate", "-L", "8m", "-n", "held", "pve")
    held = standin.volumes("pve")["held"]["loop"]
    fd = os.open(held, os.O_RDONLY | os.O_EXCL)            # as a mount or a holder does
    try:
        opened.backend.create = (                               # type: ignore[method-assign]
            lambda name, size, tag: Path(held))
        with pytest.raises(TargetError, match=f"new volume's device {held}: busy"):
            opened.image(Configuration(mode="host", preallocation="full"))
    finally:
        os.close(fd)
    standin.run("lvcreate", "-L", "4m", "-n", "small", "pve")
    small = standin.volumes("pve")["small"]["loop"]
    opened.backend.create = lambda name, size, tag: Path(small)     # type: ignore[method-assign]
    with pytest.raises(TargetError, match=f"{small} holds 4.0 MiB, not the 8.0 MiB asked"):
        opened.image(Configuration(mode="host", preallocation="falloc"))
    opened.close()
    assert standin.ours("pve") == []
    with pytest.raises(TargetError, match="LVM volumes are raw"):
        opened.check([Configuration(mode="blocklayer", format="qcow2", cache="none")])


@pytest.mark.slow
@needs("fio", "qemu")
@pytest.mark.parametrize("kind", ["lvmthin", "lvm"])
def test_stand_in_run_in_every_mode(tmp_path: Path, standin: LvmStandin, kind: str,
                                    no_leftovers: None) -> None:
    """``iomatrix run`` on the stand-in's volumes: host (the baseline), blocklayer (both aio
    values: a local volume's aio is evaluated) and a TCG guest, on a device QEMU opened as
    host_device; every volume gone at the end, and only iomatrix's names were removed."""
    db = tmp_path / "r.db"
    done = cli_result("run", str(suite(tmp_path, TABLES[kind])), "--db", str(db), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 trials ok, 0 failed" in done.stdout, done.stdout
    assert "aio is not evaluated" not in done.stderr
    with Store(db, readonly=True) as store:
        run = store.load_run(1)
        assert [r.path for r in store.open_resources()] == []     # each volume's record settled
        seen = {t.config_key.split("/")[0]: store.telemetry(t.id) for t in run.trials}
    # the host's disk telemetry follows the volume's own device (the stand-in's loop device)
    (loop,) = {m.group(1) for t in run.trials if (m := re.search(r"/dev/(loop\d+)", t.command))}
    assert {s.target_device if s else None for s in seen.values()} == {loop}, seen
    modes = sorted(t.config_key.split("/")[0] for t in run.trials)
    assert modes == ["blocklayer", "blocklayer", "guest", "host"]
    daemon = [t.applied for t in run.trials if t.config_key.startswith("blocklayer/")]
    assert [a["file0.driver"] for a in daemon] == ["host_device", "host_device"]
    assert sorted(a["aio"] for a in daemon) == ["io_uring", "native"]
    (guest,) = [t.applied for t in run.trials if t.config_key.startswith("guest/")]
    assert guest["accel"] == "tcg" and int(guest["blockstats.wr_bytes"]) > 0
    assert any("/dev/loop" in t.command for t in run.trials)
    where = "LVM-thin pool pve/data" if kind == "lvmthin" else "LVM volume group pve"
    assert any(f"target: {where}" in note for note in run.notes)
    made = [c for c in standin.commands() if c[0] == "lvcreate" and "--addtag" in c]
    assert len(made) == 1 and (("-T" in made[0]) == (kind == "lvmthin"))
    assert standin.ours("pve") == [] and sorted(standin.volumes("pve")) == ["data"]
    removed = [c[-1] for c in standin.commands() if c[0] == "lvremove"]
    assert removed and all(r.startswith("pve/iomatrix-") for r in removed)


def measuring(tmp_path: Path, table: str, db: Path) -> subprocess.Popen[str]:
    """``iomatrix run`` of a long host-mode run on ``table``, once its fio has started."""
    path = suite(tmp_path, table, mode="host", runtime="60s", guest=False)
    proc = subprocess.Popen([sys.executable, "-m", "iomatrix", "run", str(path), "--db",
                             str(db)], cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not any("fio" in p for p in our_processes(str(tmp_path))):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr
            time.sleep(0.3)
    except BaseException:
        proc.kill()
        proc.wait(timeout=30)
        raise
    return proc


@pytest.mark.slow
@needs("fio")
def test_stand_in_ctrl_c_removes_the_volume(tmp_path: Path, standin: LvmStandin,
                                            no_leftovers: None) -> None:
    """SIGINT in the middle of a run on thick LVM: the run is interrupted and its volume
    removed."""
    proc = measuring(tmp_path, TABLES["lvm"], tmp_path / "r.db")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == ExitStatus.INTERRUPTED, err
    assert standin.ours("pve") == [] and sorted(standin.volumes("pve")) == ["data"]
    assert [c[0] for c in standin.commands()].count("lvremove") == 1


@pytest.mark.slow
@needs("fio")
def test_stand_in_killed_run_is_cleaned(tmp_path: Path, standin: LvmStandin,
                                        no_leftovers: None) -> None:
    """kill -9 in the middle of a run leaves its volume, recorded; ``clean`` removes it and
    nothing else in the volume group (a volume iomatrix did not make stays, and so does one
    named like iomatrix's that does not carry the record's marker)."""
    standin.run("lvcreate", "-L", "8m", "-n", "vm-100-disk-0", "pve")
    standin.run("lvcreate", "-V", "8m", "-T", "pve/data", "-n", "iomatrix-0-feed-raw-off")
    db = tmp_path / "r.db"
    proc = measuring(tmp_path, TABLES["lvmthin"], db)
    proc.kill()
    proc.wait(timeout=30)
    deadline = time.monotonic() + 30
    while our_processes(str(tmp_path)):          # fio got SIGTERM as its run died
        assert time.monotonic() < deadline, our_processes(str(tmp_path))
        time.sleep(0.2)
    left = [n for n in standin.ours("pve") if n != "iomatrix-0-feed-raw-off"]
    assert len(left) == 1
    dry = cli_result("clean", "--db", str(db), "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0 and left[0] in dry.stdout, dry.stdout + dry.stderr
    assert left[0] in standin.volumes("pve")
    done = cli_result("clean", "--db", str(db), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(standin.volumes("pve")) == ["data", "iomatrix-0-feed-raw-off", "vm-100-disk-0"]
    assert [c[-1] for c in standin.commands() if c[0] == "lvremove"] == [f"pve/{left[0]}"]
