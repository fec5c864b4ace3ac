"""A suite is untrusted input and fio runs as root: no suite may make fio touch a path outside the
run's own directories, and no suite text may end in a traceback (issue 13).

- fio options pass an allow-list, checked here against the installed fio's own option list;
- property tests (hypothesis) over suite TOML text and fio option tables: every input is either
  refused with a SuiteError or yields job files whose every line iomatrix can account for;
- a real reproduction: ``mem = "mmap:FILE"`` truncated a file outside the target as root."""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from iomatrix.appliance.build import MIN_MEMORY_MIB
from iomatrix.cli.status import ExitStatus
from iomatrix.core.errors import FioFailed, IomatrixError, SuiteError, TargetError
from iomatrix.drivers.host import HostSession
from iomatrix.fio import run as fio_run
from iomatrix.fio.jobfile import fill_text, job_text
from iomatrix.suite import expand, load_suite_text
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.fields import MIN_GUEST_MEMORY_MIB
from iomatrix.suite.fiooptions import (FIO_OPTION_SHAPES, LOG_OPTIONS, SET_BY_IOMATRIX,
                                       WORKLOAD_FIO_OPTIONS, fio_option_problem)
from iomatrix.suite.target import Target
from iomatrix.suite.workloads import Workload
from iomatrix.targets.workspace import Image, target_notes
from tests.conftest import cli
from tests.needs import needs

FIO = shutil.which("fio")
needs_fio = needs("fio")

BASE = '[suite]\nname = "t"\n[target]\ndirectory = "/srv/bench"\nsize = "64MiB"\n'
RUN_DIR = Path("/srv/bench")
"""The [target] directory of BASE: the run's images live below it."""
SCRATCH = Path("/tmp/iomatrix-scratch")
"""Stands for the run's scratch directory (FUSE export, NBD socket)."""

# Options that name a file, directory, device, cgroup or sysfs entry, or run a command, in fio
# 3.33 (`fio --cmdhelp=all`, its aliases, and the engines' options): none may be allowed.
PATH_OPTIONS = frozenset({
    "filename", "lockfile", "directory", "filename_format", "unique_filename", "opendir",
    "ioengine", "uri", "write_iolog", "read_iolog", "replay_redirect", "merge_blktrace_file",
    "exec_prerun", "exec_postrun", "ioscheduler", "write_bw_log", "write_lat_log",
    "write_iops_log", "write_hist_log", "per_job_logs", "log_compression",
    "log_store_compressed", "verify_state_save", "verify_state_load", "cgroup",
    "cgroup_nodelete", "cgroup_weight", "uid", "gid", "profile", "wait_for", "description",
    "name", "trigger", "trigger_file", "trigger_cmd", "trigger_timeout", "nrfiles", "nr_files",
    "openfiles", "create_only", "unlink", "unlink_each_loop", "fill_device", "fill_fs",
    "file_append", "allow_mounted_write", "allow_file_create", "pre_read", "verify",
    "hugepage-size", "include", "size", "filesize", "offset", "io_size", "io_limit",
})


# -- the allow-list against fio itself ---------------------------------------------------------

@functools.lru_cache(maxsize=None)
def fio_help(name: str) -> str:
    assert FIO is not None
    return subprocess.run([FIO, f"--cmdhelp={name}"], capture_output=True, text=True,
                          timeout=30).stdout


@functools.lru_cache(maxsize=None)
def fio_option_names() -> frozenset[str]:
    """Every job option the installed fio lists (``--cmdhelp=all``: names, not aliases), with the
    libaio and io_uring engine options."""
    if FIO is None:
        return frozenset(WORKLOAD_FIO_OPTIONS | PATH_OPTIONS | set(SET_BY_IOMATRIX))
    names = {line.split(":")[0].strip() for line in fio_help("all").splitlines() if ":" in line}
    for engine in ("libaio", "io_uring"):
        text = subprocess.run([FIO, f"--enghelp={engine}"], capture_output=True, text=True,
                              timeout=30).stdout
        names |= {line.split(":")[0].strip() for line in text.splitlines() if ":" in line}
    return frozenset(names)


def _choices(shape: str) -> list[str]:
    """The named values of a choice shape: ``(?:a|b)...`` → [a, b]."""
    found = re.match(r"\(\?:([^()]*)\)", shape)
    return [re.sub(r"\\(.)", r"\1", c) for c in found.group(1).split("|")] if found else []


@pytest.mark.slow
@needs_fio
def test_every_allowed_option_and_choice_is_fios_own() -> None:
    known = fio_option_names()
    assert len(known) > 200
    for alias in WORKLOAD_FIO_OPTIONS - known:      # an alias: fio names the option it stands for
        found = re.search(r"^\s*(\S+): .*\n\s+alias: (\S+)", fio_help(alias), re.M)
        assert found and found.group(2) == alias, alias
        # both accepted: one shape; an option a newer fio renamed (fio 3.39 has log_window_value
        # for log_max_value) is accepted under the name every fio knows, with its shape
        if found.group(1) in FIO_OPTION_SHAPES:
            assert FIO_OPTION_SHAPES[alias] == FIO_OPTION_SHAPES[found.group(1)], alias
    for name, (shape, _) in FIO_OPTION_SHAPES.items():
        choices = _choices(shape)
        if choices and name not in ("sync_file_range",):
            text = fio_help(name)
            valid = set(re.findall(r"(?:valid values|^\s+): (\S+)", text, re.M))
            assert set(choices) <= valid, (name, set(choices) - valid)


def test_no_option_that_names_a_path_or_is_set_by_iomatrix_is_allowed() -> None:
    # the log options (issue 38) are allowed as "1" only: the job names the log itself, in the
    # trial's own directory (iomatrix.fio.logs), whatever a suite or job file gave
    assert not (WORKLOAD_FIO_OPTIONS - LOG_OPTIONS) & PATH_OPTIONS
    assert all(FIO_OPTION_SHAPES[key][0] == "1" for key in LOG_OPTIONS)
    assert not WORKLOAD_FIO_OPTIONS & set(SET_BY_IOMATRIX)
    assert not any(name.startswith(("write_", "log_", "exec_", "cgroup", "trigger", "replay_",
                                    "verify", "read_iolog", "merge_blktrace"))
                   for name in WORKLOAD_FIO_OPTIONS - LOG_OPTIONS
                   - {"write_barrier", "write_hint", "log_offset", "log_max_value", "log_prio"})
    workload = Workload(rw="read", bs=4096, iodepth=1, options=(("write_lat_log", "1"),))
    remote = job_text(workload, target={"filename": "/dev/null"}, ramp=0, runtime=1)
    local = job_text(workload, target={"filename": "/dev/null"}, ramp=0, runtime=1,
                     logs=Path("/run/trial/logs"))
    assert "write_lat_log" not in remote
    assert "write_lat_log=/run/trial/logs/workload\n" in local


@pytest.mark.slow
@needs_fio
def test_allowed_values_parse_in_fio(tmp_path: Path) -> None:
    """A value of every shape, written as iomatrix writes it, is one fio 3.33 accepts."""
    examples = {"mem": "mmap", "iomem": "shmhuge", "bssplit": "4k/50:64k/", "rate": "10m,5m",
                "random_distribution": "zoned:60/10:30/20:10/70", "ss": "iops_slope:0.1%",
                "sync_file_range": "wait_before,write:8", "nice": "-5", "prio": "4",
                "prioclass": "2", "rwmixread": "70", "bsrange": "4k-16k", "thinktime": "10ms",
                "latency_percentile": "99.9", "buffer_pattern": "0xdeadbeef", "fsync": "8",
                "steadystate_duration": "10s", "zonemode": "strided"}
    workload = Workload(rw="randrw", bs=4096, iodepth=4,
                        options=tuple(sorted(examples.items())))
    for key, value in examples.items():
        assert fio_option_problem(key, value) is None, key
    text = job_text(workload, target={"ioengine": "psync", "filename": str(tmp_path / "f"),
                                      "size": "1m"}, ramp=0, runtime=1)
    (tmp_path / "j.fio").write_text(text)
    out = subprocess.run([FIO or "fio", "--parse-only", str(tmp_path / "j.fio")],
                         capture_output=True, text=True, timeout=30)
    assert "Bad option" not in out.stderr + out.stdout and "failed parsing" not in out.stderr, out


# -- refusals at load time: one line naming the option ------------------------------------------

def error(extra: str, base: str = BASE) -> str:
    with pytest.raises(SuiteError) as info:
        expand(load_suite_text(base + extra, source="t.toml"))
    message = str(info.value)
    assert "\n" not in message and "Traceback" not in message
    return message


@pytest.mark.parametrize("options, expected", [
    ('{ mem = "mmap:/etc/passwd" }', "fio option 'mem' = 'mmap:/etc/passwd': a ':FILE'"),
    ('{ iomem = "mmaphuge:/hugetlbfs/x" }', "fio option 'iomem' = 'mmaphuge:/hugetlbfs/x'"),
    ('{ ioscheduler = "none" }', "'ioscheduler' is refused: it writes to the device's sysfs"),
    ('{ write_bw_log = "bw" }', "'write_bw_log': value 'bw' is not one iomatrix passes on "
                                "(expected 1: iomatrix writes the log into the trial's own"),
    ('{ log_avg_msec = 1000 }', "'log_avg_msec' is refused"),
    ('{ cgroup = "x" }', "'cgroup' is refused: it moves fio into another cgroup"),
    ('{ exec_prerun = "/bin/sh" }', "'exec_prerun' is refused: it runs a command"),
    ('{ trigger_cmd = "reboot" }', "'trigger_cmd' is refused: it runs a command"),
    ('{ read_iolog = "/x" }', "'read_iolog' is refused"),
    ('{ replay_redirect = "/dev/sda" }', "'replay_redirect' is refused"),
    ('{ merge_blktrace_file = "/x" }', "'merge_blktrace_file' is refused"),
    ('{ filename_format = "/etc/x" }', "'filename_format' is refused"),
    ('{ verify_state_save = 1 }', "'verify_state_save' is refused"),
    ('{ profile = "act" }', "'profile' is refused"),
    ('{ ioengine = "external:/tmp/evil.so" }', "'ioengine' is set by iomatrix; use [method] engine"),
    ('{ filename = "/dev/sda" }', "'filename' is set by iomatrix; use [target]"),
    ('{ directory = "/etc" }', "'directory' is set by iomatrix"),
    ('{ buffered = 1 }', "'buffered' is set by iomatrix; use nothing: iomatrix always measures direct I/O"),
    ('{ some_future_option = 1 }', "'some_future_option' is not one iomatrix lets a workload set"),
    ('{ "hugepage-size" = "2m" }', "'hugepage-size' is not a fio option name"),
    ('{ "rwmixread=1\\nexec_prerun" = 1 }', "is not a fio option name"),
    ('{ rwmixread = "70\\n[evil]\\nexec_prerun=/bin/sh" }', "no line break, '$'"),
    ('{ rwmixread = "${HOME}" }', "no line break, '$'"),
    ('{ rwmixread = "$ncpus" }', "no line break, '$'"),
    ('{ rwmixread = "1=2" }', "no line break, '$', '='"),
    ('{ rwmixread = "[x]" }', "brackets"),
    ('{ rwmixread = "" }', "1 to 200 of them"),
    ('{ rwmixread = "/etc/passwd" }', "does not have the form fio expects (expected a number"),
    ('{ bssplit = "/etc/passwd" }', "does not have the form fio expects"),
    ('{ rwmixread = nan }', "nan is not a number fio reads"),
    ('{ rwmixread = [70] }', "a list is not an option value"),
    ('{ rwmixread = { a = 1 } }', "a dict is not an option value"),
    ('{ end_fsync = "on" }', "expected 0 or 1"),
])
def test_refused_options_name_the_option_and_why(options: str, expected: str) -> None:
    message = error(f"[workloads]\noptions = {options}\n")
    assert message.startswith("t.toml: [workloads] options: ") and expected in message, message


def test_booleans_are_written_as_fio_reads_them() -> None:
    suite = load_suite_text(BASE + "[workloads]\noptions = { end_fsync = true, hipri = false, "
                            "rwmixread = 70, mem = 'mmap' }\n")
    assert expand(suite).workloads[0].options == (("end_fsync", "1"), ("hipri", "0"),
                                                  ("mem", "mmap"), ("rwmixread", "70"))


@pytest.mark.parametrize("target, expected", [
    ('directory = "/srv/a\\nfilename=/etc/passwd"\nsize = "64MiB"', "may not hold control characters, '$'"),
    ('directory = "/srv/${HOME}"\nsize = "64MiB"', "may not hold control characters, '$'"),
    ('directory = "/srv/$ncpus"\nsize = "64MiB"', "'$'"),
    ('directory = "/srv/a\\\\:b"\nsize = "64MiB"', "or '\\'"),
    ('directory = " /srv"\nsize = "64MiB"', "may not begin or end with a blank"),
    ('device = "sdb"\nallow_destroy = true', "write the device's full path"),
    ('device = "/dev/sdb\\r"\nallow_destroy = true', "control characters"),
    ('directory = "/srv"\nsize = "99999999999999999999999PiB"', "above the largest size"),
    ('directory = "/srv"\nsize = "' + "9" * 400 + '"', "too large"),
])
def test_unsafe_target_paths_are_refused(target: str, expected: str) -> None:
    message = error("", base=f'[suite]\nname = "t"\n[target]\n{target}\n')
    assert "[target]" in message and expected in message, message


def test_relative_directory_is_made_absolute_so_qemu_img_sees_no_protocol() -> None:
    suite = load_suite_text('[suite]\nname = "t"\n[target]\ndirectory = "nbd:host"\nsize = "1GiB"\n')
    assert suite.target.directory == Path.cwd() / "nbd:host"


@pytest.mark.parametrize("extra, expected", [
    ("[method]\nruntime = '1" + "9" * 400 + "'\n", "longest duration"),
    ("[method]\nseed = " + "9" * 30 + "\n", "[method] seed"),
    ("[workloads]\nrate_iops = " + "9" * 30 + "\n", "[workloads] rate_iops[0]"),
    ("[matrix]\nnum_queues = " + "9" * 30 + "\n", "[matrix] num_queues[0]"),
    ("a = " + "[" * 5000 + "]" * 5000 + "\n", "nested too deeply"),
])
def test_extreme_values_are_suite_errors(extra: str, expected: str) -> None:
    assert expected in error(extra)


def test_a_description_may_not_drive_the_terminal() -> None:
    message = error("", base='[suite]\nname = "t"\ndescription = "a\\u001b[2Jb"\n'
                    '[target]\ndirectory = "/srv"\nsize = "1GiB"\n')
    assert "[suite] description" in message and "control characters" in message


# -- guest memory (problem 2) -------------------------------------------------------------------

def test_min_guest_memory_matches_the_appliance() -> None:
    assert MIN_GUEST_MEMORY_MIB == MIN_MEMORY_MIB


@pytest.mark.parametrize("memory, expected", [
    ('"512"', "[method] memory = '512': write guest memory with a unit, e.g. memory = \"512MiB\""),
    ("536870912", "[method] memory = 536870912: write guest memory with a unit"),
    ('"96MiB"', "[method] memory = '96MiB': guest memory 96.0 MiB is below the 320 MiB the guest "
                "appliance needs to boot"),
    ('"1000.5MiB"', "whole number of MiB"),
    ('"lots"', "write guest memory with a unit"),
])
def test_guest_memory_needs_a_unit_and_the_minimum(memory: str, expected: str) -> None:
    assert expected in error(f"[method]\nmemory = {memory}\n")


def test_guest_memory_with_a_unit_is_taken() -> None:
    assert load_suite_text(BASE + '[method]\nmemory = "1GiB"\n').method.memory == 1 << 30
    assert load_suite_text(BASE + '[method]\nmemory = "320M"\n').method.memory == 320 << 20


# -- tmpfs targets and full scratch directories (problem 3) -------------------------------------

def _mountinfo(tmp_path: Path, fstype: str) -> Path:
    info = tmp_path / "mountinfo"
    info.write_text(f"22 1 0:21 / / rw - ext4 /dev/sda1 rw\n"
                    f"40 22 0:40 / {tmp_path} rw,nosuid - {fstype} {fstype} rw\n")
    return info


def test_a_tmpfs_target_gets_a_note_unless_asked_for(tmp_path: Path) -> None:
    target = Target(directory=tmp_path / "images", size=1 << 30)
    notes = target_notes(target, mountinfo=_mountinfo(tmp_path, "tmpfs"))
    assert len(notes) == 1 and "on tmpfs" in notes[0] and "measures memory, not storage" in notes[0]
    assert "allow_tmpfs = true" in notes[0]
    asked = target.model_copy(update={"allow_tmpfs": True})
    assert target_notes(asked, mountinfo=_mountinfo(tmp_path, "tmpfs")) == []
    assert target_notes(target, mountinfo=_mountinfo(tmp_path, "xfs")) == []
    assert target_notes(Target(device=Path("/dev/sdz"), allow_destroy=True),
                        mountinfo=_mountinfo(tmp_path, "tmpfs")) == []
    suite = load_suite_text(f'[suite]\nname = "t"\n[target]\ndirectory = "{tmp_path}"\n'
                            'size = "1GiB"\nallow_tmpfs = true\n')
    assert suite.target.allow_tmpfs


@needs_fio
def test_a_full_scratch_directory_is_named_as_the_cause(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    real = shutil.disk_usage
    monkeypatch.setattr(fio_run.shutil, "disk_usage",
                        lambda p: real(p)._replace(free=12 << 10) if Path(p) == tmp_path else real(p))
    job = "[j]\nrw=bogus\n"                          # fio refuses it: exit 1
    with pytest.raises(FioFailed) as info:
        fio_run.run_fio(job, workdir=tmp_path, timeout=30)
    assert f"only 12.0 KiB free in {tmp_path}" in str(info.value) and "TMPDIR" in str(info.value)


def test_fio_failure_reasons_skip_json_and_say_what_errno_means(tmp_path: Path) -> None:
    assert fio_run._first_error('{\n  "error" : 107,\n}\nfio: pid=1, err=28/file:io_u.c') \
        == "fio: pid=1, err=28/file:io_u.c"
    assert fio_run._json_error('  "error" : 0,\n  "error" : 107,') == \
        f"a job ended with error 107 ({os.strerror(107)})"
    assert fio_run._space_cause(tmp_path) == ""      # plenty of room here


def test_writing_the_job_file_into_a_full_directory_is_a_fio_failure(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(self: Path, *args: Any, **kwargs: Any) -> int:
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(FioFailed, match="cannot write fio's job file .*No space left on device"):
        fio_run.run_fio("[j]\n", workdir=tmp_path, timeout=5)


# -- the job file itself: the last gate ---------------------------------------------------------

def test_job_text_refuses_what_the_loader_would_have_refused() -> None:
    target = {"ioengine": "libaio", "direct": "1", "filename": "/srv/bench/disk.raw"}
    bad = Workload(rw="randread", bs=4096, iodepth=1, options=(("mem", "mmap:/etc/passwd"),))
    with pytest.raises(SuiteError, match="'mem'"):
        job_text(bad, target=target, ramp=0, runtime=1)
    ok = Workload(rw="randread", bs=4096, iodepth=1)
    for value in ("/srv/a\n[x]\nexec_prerun=/bin/sh", "/srv/${HOME}/disk", "/srv/a\\b", " /srv/x"):
        with pytest.raises(TargetError):
            job_text(ok, target={**target, "filename": value}, ramp=0, runtime=1)
        with pytest.raises(TargetError):
            fill_text(target={**target, "filename": value}, size=1 << 20)
    with pytest.raises(SuiteError):
        job_text(ok, target=target, ramp=0, runtime=1, name="x]\n[y")


def test_a_colon_in_a_target_path_stays_one_file() -> None:
    ok = Workload(rw="randread", bs=4096, iodepth=1)
    text = job_text(ok, target={"filename": "/dev/disk/by-path/pci-0000:00:1f.2-ata-1"},
                    ramp=0, runtime=1)
    assert "filename=/dev/disk/by-path/pci-0000\\:00\\:1f.2-ata-1\n" in text


# -- property tests ------------------------------------------------------------------------------

FIXED_KEYS = {"time_based", "ramp_time", "runtime", "group_reporting", "lat_percentiles",
              "percentile_list", "randrepeat", "rw", "bs", "iodepth", "numjobs", "rate_iops",
              "size", "refill_buffers", "end_fsync", "direct", "ioengine"}
"""Keys iomatrix itself writes, with values it computes (numbers and fixed words)."""
LOCATION_KEYS = {"filename", "uri"}
"""Keys whose value fio opens: they must lie in the run's own directories."""


def _unescape(value: str) -> str:
    return value.replace("\\:", ":")


def _inside(path: str, roots: list[Path]) -> bool:
    return any(os.path.commonpath([os.path.normpath(path), os.path.normpath(root)])
               == os.path.normpath(root) for root in roots)


def assert_confined(text: str, roots: list[Path], name: str) -> None:
    """Every line of a job file iomatrix wrote is accounted for: two sections, keys iomatrix sets,
    allowed options whose values name no path, and files only under ``roots``."""
    assert text.endswith("\n") and not re.search(r"[\r\x00$]", text), text
    lines = text[:-1].split("\n")
    assert lines[0] == "[global]" and lines.count(f"[{name}]") == 1, text
    assert sum(1 for line in lines if line.startswith("[")) == 2, text
    seen_location = 0
    for line in lines:
        if line.startswith("["):
            continue
        key, sep, value = line.partition("=")
        assert sep and re.fullmatch(r"[a-z][a-z0-9_]*", key), line
        if key in LOCATION_KEYS:
            seen_location += 1
            location = _unescape(value) if key == "filename" else value.split("socket=", 1)[1]
            assert ":" not in value.replace("\\:", "") or key == "uri", line   # one file only
            assert _inside(location, roots), (line, roots)
        elif key in WORKLOAD_FIO_OPTIONS:
            assert fio_option_problem(key, value) is None, line
            assert not value.startswith("/") and ":/" not in value and "=" not in value, line
            if key in ("mem", "iomem"):
                assert ":" not in value, line
        else:
            assert key in FIXED_KEYS and re.fullmatch(r"[A-Za-z0-9_.:%]+", value), line
    assert seen_location == 1, text


def check_accepted(text: str) -> None:
    """Load ``text``; a refusal must be a SuiteError, an accepted suite must give job files
    (for every kind of target a driver writes) confined to the run's directories."""
    try:
        suite = load_suite_text(text, source="fuzz.toml")
        expansion = expand(suite)
    except SuiteError:
        return
    except IomatrixError as exc:         # pragma: no cover - would be a misfiled error
        pytest.fail(f"{type(exc).__name__} is not a SuiteError: {exc}")
    target = suite.target
    root = target.directory if target.directory is not None else target.device
    assert root is not None and root.is_absolute()
    if target.device is not None:
        image = Image(path=target.device, format="raw", preallocation="off",
                      size=target.size or 1 << 30, is_device=True)
        roots = [target.device]
    else:
        assert target.directory is not None
        image = Image(path=target.directory / "iomatrix-abc123" / "disk-raw-off.raw",
                      format="raw", preallocation="off", size=target.size or 1 << 20)
        roots = [target.directory]
    host = HostSession(Configuration(mode="host"), [image], suite.method.engine).fio_target()
    fuse = {"ioengine": suite.method.engine, "direct": "1",
            "filename": str(SCRATCH / "fuse.img"), "size": str(image.size)}
    nbd = {"ioengine": "nbd", "uri": f"nbd+unix:///disk?socket={SCRATCH / 'nbd.sock'}"}
    for mapping, allowed in ((host, roots), (fuse, [SCRATCH]), (nbd, [SCRATCH])):
        assert_confined(fill_text(target=mapping, size=image.size), allowed, "precondition")
        for workload in expansion.workloads:
            text = job_text(workload, target=mapping, ramp=suite.method.ramp,
                            runtime=suite.method.window)
            assert_confined(text, allowed, "iomatrix")


def toml_string(text: str) -> str:
    out = []
    for char in text:
        if char in '"\\':
            out.append("\\" + char)
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return {"nan": "nan", "inf": "inf", "-inf": "-inf"}.get(repr(value), repr(value))
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(map(toml_value, value)) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{toml_string(k)} = {toml_value(v)}" for k, v in value.items()) + " }"
    raise AssertionError(value)


def toml_table(name: str, table: dict[str, Any], array: bool = False) -> str:
    head = f"[[{name}]]" if array else f"[{name}]"
    return head + "\n" + "".join(f"{toml_string(k)} = {toml_value(v)}\n" for k, v in table.items())


HOSTILE = ["", " ", "\n", "\r", "\x00", "\t", "\x1b[2J", "$", "${HOME}", "$ncpus", "$mb_memory",
           "[evil]", "=", "\\", "\\:", ":", "/", "/etc/passwd", "mmap:/etc/passwd", "external:/x.so",
           "a\nfilename=/etc/shadow", "\n[evil]\nexec_prerun=/bin/sh\n", "..", "../../etc", "#",
           ";", "'", '"', "\u2028", "nbd:x", "json:{}", "file:/etc/passwd", "%s", "~root",
           "4k/50:64k/", "zipf:1.2", "1", "0", "70", "-1", "10ms", "4k", "mmap", "malloc",
           "iops_slope:0.1%", "1k-4k", "10m,5m", "0xdead", "wait_before,write:8", "shmhuge"]
hostile_text = st.one_of(
    st.sampled_from(HOSTILE),
    st.lists(st.sampled_from(HOSTILE), min_size=2, max_size=4).map("".join),
    st.text(max_size=12))
option_values = st.one_of(
    hostile_text, st.integers(min_value=-(2**70), max_value=2**70), st.booleans(),
    st.floats(allow_nan=True, allow_infinity=True), st.integers(0, 100),
    st.lists(st.integers(0, 9), max_size=2))


def mostly(good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``good`` three times in four, else ``bad``: enough accepted suites to check their job
    files, enough refused ones to check every refusal is a SuiteError."""
    return st.sampled_from((good, good, good, bad)).flatmap(lambda chosen: chosen)


@functools.lru_cache(maxsize=None)
def option_names() -> list[str]:
    return sorted(fio_option_names() | WORKLOAD_FIO_OPTIONS | PATH_OPTIONS | {"iomem", "trigger"})


allowed_pairs = st.sampled_from(sorted(FIO_OPTION_SHAPES)).flatmap(
    lambda key: st.tuples(st.just(key), st.one_of(
        st.from_regex(re.compile(FIO_OPTION_SHAPES[key][0], re.ASCII), fullmatch=True),
        st.booleans() if FIO_OPTION_SHAPES[key][0] == "[01]" else st.integers(0, 100))))
"""An allowed option with a value drawn from its own shape: what the loader must accept."""
any_pairs = st.tuples(st.one_of(st.deferred(lambda: st.sampled_from(option_names())),
                                hostile_text), option_values)
"""Any option fio knows, or any text, with any value: mostly refused."""
option_tables = st.lists(mostly(allowed_pairs, any_pairs), max_size=4).map(dict)

nice_text = st.text(st.characters(blacklist_categories=("Cc", "Cs"),
                                  blacklist_characters="$\\"), min_size=1, max_size=12)
good_paths = st.one_of(
    st.sampled_from(["/srv/bench", "/var/tmp/iomatrix", "relative/dir", "nbd:host", "/srv/a:b",
                     "/srv/a b", "/srv/../etc", "/", "/srv/[x]=y#;"]),
    st.builds(lambda a, b: (a + b).strip() or "x", st.sampled_from(["/srv/", "./", ""]), nice_text))
bad_paths = st.builds(lambda a, b: a + b, st.sampled_from(["/srv/", "/dev/", "", "./"]),
                      hostile_text)
good_devices = st.sampled_from(["/dev/sdz", "/dev/disk/by-path/pci-0000:00:1f.2-ata-1",
                                "/dev/mapper/a-b"])
good_sizes = st.sampled_from(["64MiB", "1GiB", "4GiB", "1.5G", "1048576", 1 << 30])
bad_sizes = st.one_of(st.sampled_from(["0", "-1", "1e9", "4k"]), hostile_text,
                      st.integers(-5, 2**70))
good_memory = st.sampled_from(["512MiB", "320M", "1G", "0.5GiB", "4096MiB"])
bad_memory = st.one_of(st.sampled_from(["512", "96MiB", "1.5MiB"]), hostile_text,
                       st.integers(-1, 2**40))
good_durations = st.sampled_from(["2s", "500ms", "1h", 3, 0.75])
bad_durations = st.one_of(st.sampled_from(["0", "1e3", "-1s"]), hostile_text,
                          st.floats(allow_nan=True), st.integers(-1, 10**20))


@st.composite
def suite_texts(draw: st.DrawFn) -> str:
    """A suite of which each field is hostile with a chance drawn per suite (never, 1 in 10 or
    1 in 3): a third of the suites are clean, so accepted ones are common."""
    rate = draw(st.sampled_from((0, 10, 3)))

    def pick(good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any]) -> Any:
        return draw(bad if rate and draw(st.integers(1, rate)) == 1 else good)

    target: dict[str, Any]
    if draw(st.booleans()):
        target = {"directory": pick(good_paths, bad_paths), "size": pick(good_sizes, bad_sizes)}
    else:
        target = {"device": pick(good_devices, bad_paths),
                  "allow_destroy": pick(st.just(True), st.booleans())}
    if draw(st.booleans()):
        target["allow_tmpfs"] = pick(st.booleans(), hostile_text)
    info = {"name": pick(st.sampled_from(["t", "aio-cache", "x.1_b"]), hostile_text),
            "description": pick(nice_text, hostile_text)}
    parts = [toml_table("suite", info), toml_table("target", target)]
    for _ in range(draw(st.integers(1, 2))):
        pairs = [pick(allowed_pairs, any_pairs) for _ in range(draw(st.integers(0, 3)))]
        workload: dict[str, Any] = {"options": dict(pairs)}
        if draw(st.booleans()):
            workload["rw"] = pick(st.sampled_from(["randread", "write", "randrw"]), hostile_text)
        if draw(st.booleans()):
            workload["bs"] = pick(st.sampled_from(["4k", "64k", "1m", 4096]), bad_sizes)
        if draw(st.booleans()):
            workload["iodepth"] = pick(st.integers(1, 256),
                                       st.one_of(st.integers(-1, 2**20), hostile_text))
        parts.append(toml_table("workloads", workload, array=True))
    method: dict[str, Any] = {"mode": pick(st.sampled_from(["host", "blocklayer", "guest"]),
                                           st.just("vm"))}
    for key, good, bad in (("memory", good_memory, bad_memory),
                           ("runtime", good_durations, bad_durations),
                           ("ramp", good_durations, bad_durations),
                           ("seed", st.integers(0, 2**31), st.integers(-(2**70), 2**70)),
                           ("engine", st.sampled_from(["libaio", "io_uring", "psync"]),
                            st.just("external:/x"))):
        if draw(st.booleans()):
            method[key] = pick(good, bad)
    parts.append(toml_table("method", method))
    return "".join(parts)


TOML_TOKENS = ["[suite]\n", "[target]\n", "[method]\n", "[[workloads]]\n", "[workloads]\n",
               "name = ", "directory = ", "device = ", "size = ", "memory = ", "options = ",
               "mode = ", "{ ", " }", "[", "]", ", ", "=", '"', "'", "\n", "mem", "mmap:/x",
               "true", "1e999", "nan", "64MiB", "9" * 30, "\\", "$", "#", "a.b", "'''", '"""']


@pytest.mark.slow
@settings(max_examples=300, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.text(max_size=200),
                 st.lists(st.sampled_from(TOML_TOKENS), max_size=30).map("".join),
                 st.builds(lambda a, b: BASE + a + b, st.sampled_from(TOML_TOKENS), st.text(max_size=60))))
def test_any_text_is_a_suite_or_a_suite_error(text: str) -> None:
    check_accepted(text)


@pytest.mark.slow
@settings(max_examples=500, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(suite_texts())
def test_any_suite_is_refused_or_confined_to_its_directories(text: str) -> None:
    check_accepted(text)


@pytest.mark.slow
@settings(max_examples=700, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(option_tables)
def test_any_option_table_is_refused_or_confined(options: dict[str, Any]) -> None:
    check_accepted(BASE + toml_table("workloads", {"options": options}))


# -- the reproduction: mem = "mmap:FILE" cut a file outside the target as root -------------------

@pytest.mark.slow
@needs_fio
def test_mmap_file_outside_the_target_is_refused_and_left_alone(tmp_path: Path) -> None:
    outside = tmp_path / "outside" / "precious.bin"
    outside.parent.mkdir()
    outside.write_bytes(os.urandom(200_000))
    before = hashlib.sha256(outside.read_bytes()).hexdigest()

    # The threat is real: the job file iomatrix wrote before this fix, run by fio, cuts the file.
    decoy = tmp_path / "decoy.bin"
    decoy.write_bytes(b"x" * 200_000)
    bad = Workload(rw="randread", bs=4096, iodepth=1, options=(("mem", f"mmap:{decoy}"),))
    job = tmp_path / "old.fio"
    job.write_text("\n".join(line for line in job_text(
        Workload(rw="randread", bs=4096, iodepth=1), ramp=0, runtime=0.2,
        target={"ioengine": "psync", "filename": str(tmp_path / "disk"), "size": "1m"}
    ).splitlines()) + "\n" + "\n".join(f"{k}={v}" for k, v in bad.options) + "\n")
    subprocess.run([FIO or "fio", "--output-format=json", str(job)], cwd=tmp_path,
                   capture_output=True, timeout=60)
    assert decoy.stat().st_size != 200_000

    # A host-mode run asking for it is refused before anything runs, naming the option.
    suite = tmp_path / "evil.toml"
    suite.write_text(f'[suite]\nname = "evil"\n[target]\ndirectory = "{tmp_path / "target"}"\n'
                     f'size = "8MiB"\n[workloads]\nrw = "randwrite"\nbs = "4k"\n'
                     f'options = {{ mem = "mmap:{outside}" }}\n'
                     '[method]\nmode = "host"\nruntime = "1s"\nramp = "0s"\nprecondition = false\n')
    code, out = cli("run", str(suite), "--db", str(tmp_path / "r.db"))
    assert code == ExitStatus.SUITE_INVALID, out
    assert "[workloads] options: fio option 'mem'" in out and "create or truncate" in out, out
    assert outside.stat().st_size == 200_000
    assert hashlib.sha256(outside.read_bytes()).hexdigest() == before
    assert not (tmp_path / "target").exists()
