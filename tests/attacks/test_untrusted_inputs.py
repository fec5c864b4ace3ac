"""Every input a user or another local user can hand iomatrix ends in a result or in one line and
a documented exit status, never a traceback (issue 20, items 3, 5, 7, 8):

- each input the issue found giving a traceback or a two-line refusal, reproduced through the
  command line (``cli_result``: the real entry point, in this process);
- ``--out`` and ``--report`` write only a regular file or a new name, or into a directory;
- a cache another user controls is not used, and a cached file that changed is not booted: as a
  real unprivileged user (made by the test: ``attacker``) against a real appliance build;
- property tests (hypothesis) through the command line over suites, job files, VM files, fio JSON
  and run numbers: deep nesting, huge integers, control characters and line separators,
  bytes that are not UTF-8.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from iomatrix.cli.status import ExitStatus
from tests.conftest import ATTACKS, REPO, Attack, User, as_user, cli_result, write_suite
from tests.needs import lacking
from tests.attacks.test_hardening import suite_texts, toml_string
from tests.translate.test_translate import LIBVIRT_XML, PVE_CONF

FIXTURES = REPO / "tests" / "fixtures" / "fio"
FIO_JSON = FIXTURES / "3.33" / "randread.json"
DOCUMENTED = {int(s) for s in ExitStatus}
NINES = "9" * 5000
SEPARATORS = ("\r", "\u2028", "\u2029", "\x85", "\x0b", "\x0c", "\x1c")
"""Characters at which ``str.splitlines`` (and some terminals) break a line."""


def one_line(done: subprocess.CompletedProcess[str], status: ExitStatus) -> str:
    """The refusal ``done`` printed, checked: ``status``, nothing on stdout, one line (and
    maybe a hint) on stderr, each starting with ``iomatrix: `` and breaking nowhere else."""
    assert done.returncode == status, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stdout + done.stderr
    lines = done.stderr.rstrip("\n").split("\n")
    assert all(line.startswith("iomatrix: ") for line in lines), done.stderr
    assert not any(c in done.stderr for c in SEPARATORS), done.stderr
    problems = [line for line in lines if not line.startswith("iomatrix: hint: ")]
    assert len(problems) == 1, done.stderr
    return problems[0]


def usage_error(done: subprocess.CompletedProcess[str]) -> str:
    """The message of a command-line usage error (Typer's box), checked: exit status 2."""
    assert done.returncode == ExitStatus.USAGE, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stdout + done.stderr
    return " ".join(line.strip("│ ") for line in done.stderr.splitlines())


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """A database holding one run: fio 3.33's randread output, imported."""
    path = tmp_path / "r.db"
    done = cli_result("import", str(FIO_JSON), "--db", str(path))
    assert done.returncode == 0, done.stderr
    return path


# -- the inputs issue 20 found ending in a traceback ---------------------------------------------

def test_translate_of_a_file_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    vm = tmp_path / "100.conf"
    vm.write_bytes(b"scsi0: local-lvm:vm-100-disk-0,cache=\xff\xfe\n")
    done = cli_result("translate", vm.name, cwd=tmp_path)
    assert "Invalid value for FILE: 100.conf: not UTF-8 text (byte 37)" in usage_error(done)
    assert "more than 1 MiB" in usage_error(cli_result("translate", "/dev/zero"))


LIBVIRT_X = ("<domain type='kvm'><name>a</name><devices><disk type='file' device='disk'>"
             "<driver name='qemu' type='raw' cache='x'/><source file='/a.img'/>"
             "<target dev='vda' bus='virtio'/></disk></devices></domain>\n")


def test_a_libvirt_cache_mode_that_is_none_of_libvirts_is_refused_as_libvirt_refuses_it(
        tmp_path: Path) -> None:
    (tmp_path / "vm.xml").write_text(LIBVIRT_X)
    reason = "Invalid value for attribute 'cache' in element 'driver': 'x'"
    assert reason in usage_error(cli_result("translate", str(tmp_path / "vm.xml")))
    suite = write_suite(tmp_path, '[matrix]\nfrom_vm = "vm.xml"\n')
    line = one_line(cli_result("run", str(suite), "--plan"), ExitStatus.SUITE_INVALID)
    assert "from_vm" in line and reason in line, line


@pytest.mark.parametrize("option", ["mbps_wr=" + "9" * 400, "iops_rd=1e400", "mbps=inf"])
def test_a_proxmox_limit_beyond_a_double_is_a_note(tmp_path: Path, option: str) -> None:
    """Found by test_any_vm_file_translates_or_is_refused: OverflowError in int(inf)."""
    (tmp_path / "100.conf").write_text(f"scsi0: local-lvm:vm-100-disk-0,{option},size=1G\n")
    done = cli_result("translate", "100.conf", cwd=tmp_path)
    name, _, value = option.partition("=")
    assert done.returncode == 0 and f"# note: scsi0: {name}={value[:40]}: not a number " \
                                    "qemu-server takes" in done.stdout, done


@pytest.mark.parametrize("count", ["9" * 19, "-1", "65536"])
def test_a_libvirt_iothread_count_beyond_reason_is_refused_at_once(tmp_path: Path,
                                                                   count: str) -> None:
    """Found by sweeping every setting of a domain: <iothreads>10**19 wrote -objects until
    memory ran out."""
    (tmp_path / "vm.xml").write_text(LIBVIRT_X.replace("cache='x'", "cache='none'").replace(
        "<devices>", f"<iothreads>{count}</iothreads><devices>"))
    done = cli_result("translate", "vm.xml", cwd=tmp_path)
    assert f"<iothreads>{int(count)}</iothreads>: iomatrix reads 0 to 65535" in usage_error(done)


def _fio_json(**top: object) -> str:
    data = json.loads(FIO_JSON.read_text())
    data.update(top)
    return json.dumps(data)


@pytest.mark.parametrize("name, text, reason", [
    ("deep.json", "[" * 200_000 + "]" * 200_000, "nested too deeply, or a number too long"),
    ("huge.json", NINES, "nested too deeply, or a number too long"),
    ("deep-fio.json", _fio_json(extra=[]).replace("[]", "[" * 200_000 + "]" * 200_000),
     "JSON nested too deeply: not fio output"),
    ("huge-fio.json", _fio_json(extra=0).replace('"extra": 0', f'"extra": {NINES}'),
     "a number of more than 4300 digits: not fio output"),
    ("big-fio.json", _fio_json(timestamp=10**30), "larger than any count fio keeps"),
])
def test_import_of_hostile_json_skips_the_file_in_one_line(tmp_path: Path, name: str, text: str,
                                                           reason: str) -> None:
    (tmp_path / name).write_text(text)
    line = one_line(cli_result("import", str(tmp_path / name), "--db", str(tmp_path / "r.db")),
                    ExitStatus.USAGE)
    assert f"skipped 1, e.g. {name}: " in line and reason in line, line
    assert not (tmp_path / "r.db").exists()


def test_fio_output_with_disk_util_not_a_list_is_imported(tmp_path: Path) -> None:
    """Found by test_any_fio_output_imports_or_is_skipped_in_one_line: TypeError."""
    (tmp_path / "r.json").write_text(_fio_json(disk_util=5))
    done = cli_result("import", str(tmp_path / "r.json"), "--db", str(tmp_path / "r.db"))
    assert done.returncode == 0 and "trials: 1 ok" in done.stdout, done


def _with_job(**values: object) -> str:
    data = json.loads(FIO_JSON.read_text())
    job = data["jobs"][0]
    for key, value in values.items():
        holder, _, name = key.rpartition(".")
        (job[holder] if holder else job)[name] = value
    return json.dumps(data)


@pytest.mark.parametrize("text, reason", [
    (_with_job(**{"read.iops": float("nan")}), "'iops' is nan: not a rate fio measured"),
    (_with_job(**{"read.bw_bytes": float("inf")}), "'bw_bytes' is inf: not a rate fio measured"),
    (_fio_json(timestamp=2**62), "'timestamp' is 4611686018427387904: not a time fio writes"),
    (_fio_json(timestamp=-1), "'timestamp' is -1: not a time fio writes"),
])
def test_fio_output_that_cannot_be_stored_is_skipped(tmp_path: Path, text: str,
                                                     reason: str) -> None:
    """Found by a sweep of every value of real fio output: SQLite's NOT NULL refused a NaN
    rate (IntegrityError), datetime a time past the year 9999 (OverflowError)."""
    (tmp_path / "r.json").write_text(text)
    line = one_line(cli_result("import", str(tmp_path / "r.json"), "--db",
                               str(tmp_path / "r.db")), ExitStatus.USAGE)
    assert reason in line, line


@pytest.mark.parametrize("elapsed", [10**30, -(2**63), 2**40, "x"])
def test_an_elapsed_time_fio_does_not_write_is_not_used(tmp_path: Path, elapsed: object) -> None:
    (tmp_path / "r.json").write_text(_with_job(elapsed=elapsed))
    assert cli_result("import", str(tmp_path / "r.json"), "--db",
                      str(tmp_path / "r.db")).returncode == 0
    done = cli_result("export", "1", "--format", "json", "--db", str(tmp_path / "r.db"))
    trial = json.loads(done.stdout)["trials"][0]
    assert trial["wall_seconds"] is None and trial["started_at"].startswith("2026-")


def test_job_options_beyond_fios_integers_skip_the_file(tmp_path: Path) -> None:
    data = json.loads(FIO_JSON.read_text())
    data["jobs"][0]["job options"]["iodepth"] = "99999999999999999999"
    (tmp_path / "iodepth.json").write_text(json.dumps(data))
    line = one_line(cli_result("import", str(tmp_path / "iodepth.json"), "--db",
                               str(tmp_path / "r.db")), ExitStatus.USAGE)
    assert "iodepth='99999999999999999999' is not a whole number from 1 to 4294967295" in line


@pytest.mark.parametrize("setting, said", [
    ("runtime = " + "9" * 400, "[method] runtime = 9999"),
    ("target_ci = " + "9" * 400, "[method] target_ci = 9999"),
    ("target_ci = " + "9" * 4000, "[method] target_ci = 9999")])
def test_a_suite_integer_beyond_a_double_is_one_line(tmp_path: Path, setting: str,
                                                     said: str) -> None:
    """Found by test_any_suite_file_is_planned_or_refused_in_lines_of_its_own: OverflowError
    in float() of a duration or a fraction."""
    suite = write_suite(tmp_path, f"[method]\n{setting}\n")
    assert said in one_line(cli_result("run", str(suite), "--plan"), ExitStatus.SUITE_INVALID)


EXTREME_VALUES = ["9" * 19, "9" * 20, "9" * 400, "9" * 4300, "9" * 4301, "-" + "9" * 400,
                  "1e999", "-1e999", "nan", "inf", "-0", "0.5", "1e-999", '"' + "9" * 400 + '"',
                  '"1e999"', '"nan"', '"a\\rb"', '"a\\u2028b"', '"a\\u001b[2Jb"',
                  "[" * 2000 + "]" * 2000, "[" + "9" * 400 + "]"]
"""TOML values that are numbers no setting takes, or hostile text, for every key of a suite."""


@pytest.mark.slow
@pytest.mark.parametrize("table", ["target", "method", "matrix", "workloads"])
def test_every_suite_key_takes_an_extreme_value_or_refuses_it_in_one_line(
        tmp_path: Path, table: str) -> None:
    """Each key of the table (from the model), given each of EXTREME_VALUES in an otherwise
    valid suite: planned, or refused in one line. (The property test above draws such values;
    this tries every key with every one.)"""
    from iomatrix.suite.matrix import Matrix
    from iomatrix.suite.method import Method
    from iomatrix.suite.target import Target
    from iomatrix.suite.workloads import WorkloadGroup

    fields = {"target": Target, "method": Method, "matrix": Matrix,
              "workloads": WorkloadGroup}[table].model_fields
    for key in fields:
        for value in EXTREME_VALUES:
            tables: dict[str, dict[str, str]] = {
                "suite": {"name": '"t"'}, "target": {"directory": '"/srv/bench"',
                                                     "size": '"64MiB"'},
                "method": {"mode": '"host"'}, "matrix": {}, "workloads": {"rw": '"randread"'}}
            tables[table][key] = value
            (tmp_path / "s.toml").write_text("".join(
                f"[{name}]\n" + "".join(f"{k} = {v}\n" for k, v in items.items())
                for name, items in tables.items()))
            done = cli_result("run", str(tmp_path / "s.toml"), "--plan")
            if done.returncode:
                one_line(done, ExitStatus.SUITE_INVALID)


def test_a_suite_of_a_few_lines_cannot_ask_for_years_of_trials(tmp_path: Path) -> None:
    """Found by hand: lists of 1000 iodepths, 1000 block sizes and 100 numjobs (a 10 KB
    suite) kept run --plan busy for hours making 10**8 workloads; it is refused at once."""
    lists = {"iodepth": range(1, 1001), "bs": range(512, 512 * 1001, 512),
             "numjobs": range(1, 101)}
    body = "[workloads]\nrw = \"randread\"\n" + "".join(
        f"{key} = [{', '.join(map(str, values))}]\n" for key, values in lists.items())
    suite = write_suite(tmp_path, body)
    line = one_line(cli_result("run", str(suite), "--plan"), ExitStatus.SUITE_INVALID)
    assert "× 100,000,000 workloads, samples = 1: more than the 1,000,000 trials" in line
    fewer = write_suite(tmp_path, body.replace("numjobs = [", "numjobs = [1]\n#"))
    assert "× 1,000,000 workloads" in cli_result("run", str(fewer), "--plan").stderr
    assert cli_result("run", str(write_suite(tmp_path, '[workloads]\nrw = "randread"\n'
                                             'iodepth = [1, 2, 4]\nbs = [4096, 65536]\n')),
                      "--plan").returncode == 0


def test_a_suite_number_of_5000_digits_is_one_line(tmp_path: Path) -> None:
    suite = write_suite(tmp_path, f"[method]\nsamples = {NINES}\n")
    line = one_line(cli_result("run", str(suite), "--plan"), ExitStatus.SUITE_INVALID)
    assert line == f"iomatrix: {suite}: a number of more than 4300 digits"


@pytest.mark.parametrize("ref", ["99999999999999999999999", "9223372036854775808", "²", "٣",
                                 "0", "-1", NINES])
def test_a_run_number_no_run_has_is_not_found(db: Path, ref: str) -> None:
    for args in (("show", ref), ("compare", ref, "1"), ("compare", "1", ref), ("export", ref),
                 ("report", ref, "--out", str(db.parent / "rep"))):
        done = cli_result(*args, "--db", str(db))
        if ref == "-1":                                   # an option to Typer
            usage_error(done)
            continue
        line = one_line(done, ExitStatus.NOT_FOUND)
        assert ("no run" in line or "give a run number" in line) and len(line) < 200, line


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0", "1e400"])
def test_doctor_refuses_a_timeout_that_is_no_number_of_seconds(value: str) -> None:
    assert "give seconds, more than 0 and at most 3600" in usage_error(
        cli_result("doctor", "--kvm-timeout", value))


@pytest.mark.parametrize("value", ["99999999999999999999", NINES, "-1", "nan"])
def test_translate_refuses_a_proxmox_generation_it_does_not_know(tmp_path: Path,
                                                                 value: str) -> None:
    (tmp_path / "100.conf").write_text("scsi0: local-lvm:vm-100-disk-0,size=1G\n")
    usage_error(cli_result("translate", "100.conf", "--pve-version", value, cwd=tmp_path))


@pytest.mark.parametrize("line", ["rw=randread\rexec_prerun=/bin/sh", "rw=randread\u2028bs=4k",
                                  "rw=randread\u2029bs=4k", "rw=randread\x85bs=4k",
                                  "bs=4k\r rw=read"])
def test_a_job_file_line_that_breaks_is_refused_on_one_line(tmp_path: Path, line: str) -> None:
    (tmp_path / "j.fio").write_bytes(f"[j]\n{line}\n".encode())
    suite = write_suite(tmp_path, '[[workloads]]\njobfile = "j.fio"\n')
    refusal = one_line(cli_result("run", str(suite), "--plan"), ExitStatus.SUITE_INVALID)
    assert refusal.endswith("jobfile = 'j.fio': line 2: a control character or line separator "
                            "(not text fio reads as it looks) (a safety refusal)"), refusal


def test_crlf_job_files_are_still_read(tmp_path: Path) -> None:
    (tmp_path / "j.fio").write_bytes(b"[j]\r\nrw=randread\r\nbs=4k \r\niodepth=2\r\n")
    suite = write_suite(tmp_path, '[[workloads]]\njobfile = "j.fio"\n')
    done = cli_result("run", str(suite), "--plan")
    assert done.returncode == 0 and "4k randread QD2" in done.stdout, done.stderr


def test_an_error_naming_a_control_character_stays_on_its_line(tmp_path: Path) -> None:
    suite = tmp_path / "a\rb\u2028c.toml"
    suite.write_text("[suite\n")
    line = one_line(cli_result("run", str(suite), "--plan"), ExitStatus.SUITE_INVALID)
    assert "a\\rb\\u2028c.toml: TOML syntax error" in line


def test_jobfiles_carried_in_a_suite_have_the_limit_of_a_file(tmp_path: Path) -> None:
    big = "[j]\nrw=read\n" + "# pad\n" * (256 * 1024 // 6)
    body = ('[[workloads]]\njobfile = "j.fio"\n[jobfiles]\n"j.fio" = '
            + json.dumps(big) + "\n")
    line = one_line(cli_result("run", str(write_suite(tmp_path, body)), "--plan"),
                    ExitStatus.SUITE_INVALID)
    assert f"[jobfiles] 'j.fio': {len(big)} bytes; job files may have 256 KiB at most" in line
    small = body.replace(json.dumps(big), json.dumps("[j]\nrw=read\n"))
    assert cli_result("run", str(write_suite(tmp_path, small)), "--plan").returncode == 0


# -- --out and --report ----------------------------------------------------------------------------

def _planted(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / f"planted-{kind}"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "null":
        if os.geteuid() != 0:
            lacking("root", "mknod of a character device needs root")
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    elif kind == "directory":
        path.mkdir()
    elif kind == "symlink":
        (tmp_path / "victim").write_text("precious")
        path.symlink_to(tmp_path / "victim")
    return path


@pytest.mark.parametrize("kind, said", [
    ("fifo", "a FIFO (named pipe)"), ("null", "a character device"),
    ("directory", "a directory"), ("symlink", "a symbolic link")])
def test_out_refuses_what_is_not_a_regular_file_and_leaves_it(db: Path, tmp_path: Path,
                                                              kind: str, said: str,
                                                              attack: Attack) -> None:
    attack(f"3. export --out onto {said}", "refused")
    path = _planted(tmp_path, kind)
    before = os.lstat(path)
    line = one_line(cli_result("export", "1", "--db", str(db), "--out", str(path)),
                    ExitStatus.USAGE)
    assert line == (f"iomatrix: {path}: {said}, where iomatrix writes only a regular file "
                    "(replacing it) or a new name")
    after = os.lstat(path)
    assert (after.st_ino, after.st_mode, after.st_rdev) == (before.st_ino, before.st_mode,
                                                            before.st_rdev)
    if kind == "symlink":
        assert (tmp_path / "victim").read_text() == "precious"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_out_needs_an_existing_directory_and_replaces_a_regular_file(db: Path,
                                                                     tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such" / "out.csv"
    line = one_line(cli_result("export", "1", "--db", str(db), "--out", str(missing)),
                    ExitStatus.USAGE)
    assert line == f"iomatrix: {missing}: no directory {missing.parent} to write it in"
    (tmp_path / "file").write_text("x")
    line = one_line(cli_result("export", "1", "--db", str(db), "--out",
                               str(tmp_path / "file" / "out.csv")), ExitStatus.USAGE)
    assert "no directory" in line and "(Not a directory)" in line
    old = tmp_path / "old.csv"
    old.write_text("old")
    os.link(old, tmp_path / "other-name")                  # a hard link is not written through
    done = cli_result("export", "1", "--db", str(db), "--out", str(old))
    assert done.returncode == 0 and old.read_text().startswith("run,configuration,")
    assert (tmp_path / "other-name").read_text() == "old"


def test_report_out_is_a_directory(db: Path, tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    line = one_line(cli_result("report", "1", "--db", str(db), "--out", str(tmp_path / "afile")),
                    ExitStatus.USAGE)
    assert line == f"iomatrix: {tmp_path / 'afile'}: a regular file, not a directory to write into"
    fifo = _planted(tmp_path, "fifo")
    assert "a FIFO (named pipe), not a directory" in one_line(
        cli_result("report", "1", "--db", str(db), "--out", str(fifo)), ExitStatus.USAGE)
    (tmp_path / "taken" / "index.html").mkdir(parents=True)
    assert "index.html: a directory, where iomatrix writes only" in one_line(
        cli_result("report", "1", "--db", str(db), "--out", str(tmp_path / "taken")),
        ExitStatus.USAGE)
    done = cli_result("report", "1", "--db", str(db), "--out", str(tmp_path / "new" / "dir"))
    assert done.returncode == 0 and (tmp_path / "new" / "dir" / "index.html").is_file()
    assert (tmp_path / "afile").read_text() == "x" and stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_run_report_is_checked_before_the_run(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    suite = write_suite(tmp_path, '[method]\nmode = "host"\nruntime = "1s"\n')
    line = one_line(cli_result("run", str(suite), "--db", str(tmp_path / "r.db"), "--report",
                               str(tmp_path / "afile")), ExitStatus.USAGE)
    assert "not a directory to write into" in line
    assert not (tmp_path / "r.db").exists() and not (tmp_path / "target").exists()


# -- caches: used only if nobody else controls them, booted only as built --------------------------

INIT_LINE = (b"""sched=$(sed -n 's/.*\\[\\(.*\\)\\].*/\\1/p' $q/scheduler); """
             b"""[ -n "$sched" ] || sched=none""")
"""A line of the appliance's /init; the attack replaces it, keeping the initrd's size."""
TAMPER = f"""
import sys
path, line = sys.argv[1], {INIT_LINE!r}
with open(path, "r+b") as f:
    data = f.read()
    assert data.count(line) == 1
    f.seek(data.index(line))
    f.write(b"sched='PWNED!'".ljust(len(line)))
"""


@pytest.fixture(scope="module")
def own_cache() -> Iterator[Path]:
    """A cache of this user's (root's) that other users can reach (0755 from /tmp down), with
    the guests' fio and busybox of the user's cache (built or fetched there once, as any guest
    run would): appliances build here in seconds."""
    from iomatrix.appliance.busybox import static_busybox
    from iomatrix.appliance.guestfio import guest_fio
    from iomatrix.appliance.kernel import default_cache_dir
    from iomatrix.core.errors import EnvironmentProblem, GuestFioUnavailable

    home = Path(tempfile.mkdtemp(prefix="iomatrix-cache-", dir="/tmp"))
    try:
        home.chmod(0o755)
        cache = home / "iomatrix" / "kernel"
        try:
            fio = guest_fio(default_cache_dir()).path.parent
            shutil.copytree(fio, cache / "guest-fio" / fio.name)
        except GuestFioUnavailable:
            pass                     # test_guestfio.py says why; the appliance falls back
        try:
            busybox = static_busybox(default_cache_dir(), fetch=True)
        except EnvironmentProblem as e:
            lacking("busybox", f"no static busybox: {e}")
        package = next(p for p in busybox.parents if p.parent == default_cache_dir())
        shutil.copytree(package, cache / package.name, symlinks=True)
        yield cache
    finally:
        shutil.rmtree(home)


def _build(cache: Path, kernel: Path):  # type: ignore[no-untyped-def]
    from iomatrix.appliance.build import build_appliance

    return build_appliance(cache_dir=cache, kernel=kernel)


def _tamper_as(user: User, initrd: Path) -> None:
    """Run TAMPER on ``initrd`` as ``user``."""
    tamper = as_user(user, TAMPER, str(initrd))
    _, err = tamper.communicate(timeout=60)
    assert tamper.returncode == 0, err


@ATTACKS
@pytest.mark.slow
def test_a_cache_another_user_owns_is_refused_before_anything_boots(
        own_cache: Path, appliance_kernel: Path, tmp_path: Path, attacker: User,
        monkeypatch: pytest.MonkeyPatch, attack: Attack) -> None:
    """As under ``sudo -E``: XDG_CACHE_HOME is the user's, who has put a built appliance there
    with one line of its init changed (same size). Neither ``appliance build`` nor a guest run
    takes it: one line naming the directory the user owns, exit 4, no run stored, no QEMU."""
    from tests.conftest import our_processes
    attack("5. appliance cache the user owns (sudo -E), its initrd changed", "refused")

    built = _build(own_cache, appliance_kernel)
    home = Path(tempfile.mkdtemp(prefix="iomatrix-xdg-", dir="/tmp"))  # reachable by the user
    try:
        cache = home / "iomatrix" / "kernel"
        shutil.copytree(own_cache, cache, symlinks=True)
        subprocess.run(["chown", "-R", f"{attacker.uid}:{attacker.gid}", str(home)], check=True,
                       timeout=60)
        initrd = cache / "appliance" / built.key / "initrd"
        _tamper_as(attacker, initrd)
        assert initrd.stat().st_size == built.initrd_bytes and b"PWNED" in initrd.read_bytes()

        monkeypatch.setenv("XDG_CACHE_HOME", str(home))
        line = one_line(cli_result("appliance", "build"), ExitStatus.ENVIRONMENT)
        assert line == (f"iomatrix: the appliance cache: {home} is owned by {attacker.name} (uid "
                        f"{attacker.uid}), not root: what it holds would be booted and run as "
                        "root")
        suite = write_suite(tmp_path, '[matrix]\ncontroller = "virtio-blk"\naio = "threads"\n'
                            'cache = "none"\nformat = "raw"\n[workloads]\nrw = "randread"\n'
                            'bs = "4k"\niodepth = 1\n[method]\nmode = "guest"\n'
                            'runtime = "1s"\nramp = "0s"\nbaseline = false\n'
                            'precondition = false\n', size="16MiB")
        done = cli_result("run", str(suite), "--db", str(tmp_path / "r.db"), cwd=tmp_path)
        assert one_line(done, ExitStatus.ENVIRONMENT) == line
        assert cli_result("runs", "--db", str(tmp_path / "r.db")).stdout.strip() in (
            "no runs stored", "")
        assert not our_processes(str(home)) and not (tmp_path / "target").exists()
        plan = cli_result("run", str(suite), "--plan")          # says why, builds nothing
        assert plan.returncode == 0 and f"warning: the appliance cache: {home} is owned by " \
                                       f"{attacker.name}" in plan.stdout
    finally:
        shutil.rmtree(home)


@ATTACKS
@pytest.mark.slow
def test_a_cached_file_others_could_change_or_that_changed_is_built_again(
        own_cache: Path, appliance_kernel: Path, tmp_path: Path, attacker: User,
        attack: Attack) -> None:
    """In root's own cache: an initrd left writable by others is not used (even unchanged), nor
    one that the user changed through that mode, nor one whose bytes differ from what was built
    with its size kept (only the hash can tell)."""
    attack("5. initrd in root's cache left writable, changed by the user", "refused")
    built = _build(own_cache, appliance_kernel)
    initrd = built.initrd
    fresh = initrd.read_bytes()

    def rebuilt() -> bytes:
        again = _build(own_cache, appliance_kernel)
        assert not again.cached and again.initrd == initrd
        assert stat.S_IMODE(initrd.stat().st_mode) == 0o644
        return initrd.read_bytes()

    assert _build(own_cache, appliance_kernel).cached
    initrd.chmod(0o666)                                   # unchanged, but anyone could have
    assert rebuilt() == fresh
    initrd.chmod(0o666)
    _tamper_as(attacker, initrd)
    assert b"PWNED" in initrd.read_bytes() and initrd.stat().st_size == len(fresh)
    assert rebuilt() == fresh
    data = bytearray(fresh)                               # root's mode, other bytes, same size
    at = data.index(INIT_LINE)
    data[at:at + len(INIT_LINE)] = b"sched='PWNED!'".ljust(len(INIT_LINE))
    initrd.write_bytes(bytes(data))
    assert stat.S_IMODE(initrd.stat().st_mode) == 0o644
    assert rebuilt() == fresh
    assert _build(own_cache, appliance_kernel).cached


@ATTACKS
def test_a_guest_fio_others_control_or_that_changed_is_not_taken(
        own_cache: Path, tmp_path: Path, attacker: User, attack: Attack) -> None:
    """The built guest fio (copied into a cache of this test's): taken while it is as built;
    not once a byte changed (same size) nor once its directory is the user's, and then the
    plan's status says why."""
    from iomatrix.appliance.guestfio import guest_fio_status
    attack("5. guest fio changed, or its directory the user's", "refused")

    status = guest_fio_status(own_cache)
    if not status.cached:       # the folder may hold only a remembered failure (no source)
        lacking("guest-fio", f"no guest fio was built here: {status.detail}")
    cache = tmp_path / "cache"
    shutil.copytree(own_cache / "guest-fio", cache / "guest-fio")
    assert guest_fio_status(cache).cached
    fio = next((cache / "guest-fio").glob("*/fio"))
    data = bytearray(fio.read_bytes())
    data[len(data) // 2] ^= 0xFF
    fio.write_bytes(bytes(data))
    status = guest_fio_status(cache)
    assert status.ok and not status.cached                # would be built again
    data[len(data) // 2] ^= 0xFF
    fio.write_bytes(bytes(data))
    assert guest_fio_status(cache).cached
    os.chown(cache / "guest-fio", attacker.uid, attacker.gid)
    status = guest_fio_status(cache)
    assert not status.ok and not status.cached
    assert f"{cache / 'guest-fio'} is owned by {attacker.name}" in status.detail


@ATTACKS
def test_a_windows_fio_others_control_or_that_changed_is_not_taken(
        windows_bundle, tmp_path: Path, attacker: User, attack: Attack) -> None:  # type: ignore[no-untyped-def]
    """fio.exe, which every Windows guest's seed carries (copied into a cache of this test's):
    taken while it is as built; not once a byte changed (same size), and refused once its
    directory is the user's."""
    from iomatrix.appliance.winfio import windows_fio
    from iomatrix.core.errors import EnvironmentProblem, GuestFioUnavailable
    attack("5. fio.exe changed, or its directory the user's", "refused")

    cache = tmp_path / "cache"
    shutil.copytree(windows_bundle.directory, cache / "windows-fio" / windows_bundle.directory.name)
    assert windows_fio(cache, fetch=False).cached
    exe = cache / "windows-fio" / windows_bundle.directory.name / "fio.exe"
    data = bytearray(exe.read_bytes())
    data[len(data) // 2] ^= 0xFF
    exe.write_bytes(bytes(data))
    with pytest.raises(GuestFioUnavailable, match="not built yet"):   # would be built again
        windows_fio(cache, fetch=False)
    data[len(data) // 2] ^= 0xFF
    exe.write_bytes(bytes(data))
    assert windows_fio(cache, fetch=False).cached
    os.chown(cache / "windows-fio", attacker.uid, attacker.gid)
    with pytest.raises(EnvironmentProblem, match=f"{cache / 'windows-fio'} is owned by {attacker.name}"):
        windows_fio(cache, fetch=False)


@ATTACKS
def test_a_cache_reached_through_another_users_symlink_is_refused(
        tmp_path: Path, own_cache: Path, attacker: User, attack: Attack) -> None:
    """Root's own directory, named through a symlink the user made in their directory: the
    user can point the link elsewhere at any time, so the cache is not trusted; named
    directly, it is."""
    from iomatrix.appliance.kernel import trusted_cache
    from iomatrix.core.errors import EnvironmentProblem
    attack("5. cache reached through the user's symlink", "refused")

    theirs = Path(tempfile.mkdtemp(prefix="iomatrix-link-", dir="/tmp"))
    try:
        os.chown(theirs, attacker.uid, attacker.gid)
        link = as_user(attacker, "import os, sys; os.symlink(sys.argv[1], sys.argv[2])",
                       str(own_cache), str(theirs / "cache"))
        assert link.wait(timeout=60) == 0
        with pytest.raises(EnvironmentProblem, match=f"{theirs} is owned by {attacker.name}"):
            trusted_cache(theirs / "cache" / "appliance")
        assert trusted_cache(own_cache / "appliance") == own_cache / "appliance"
    finally:
        shutil.rmtree(theirs)


# -- property tests through the command line -------------------------------------------------------
# Each example runs the real command in this process (cli_result) on a file hypothesis wrote: the
# result is a success, or a refusal in one line (one_line), or a usage error (Typer's box), with a
# documented status; never a traceback (cli_result does not catch one: the test fails with it).

FUZZ = settings(deadline=None, database=None, print_blob=True,
               suppress_health_check=list(HealthCheck))
EXTREMES = st.sampled_from([
    "9" * 19, "9" * 20, "9" * 400, "9" * 4300, "9" * 4301, NINES, "-" + NINES, "1e999", "-1e999",
    "nan", "inf", "0x" + "f" * 40, "1_000_000", "-0", "18446744073709551616",
    "9223372036854775808", "0.5", "1e-999"])
NUMBER_TEXTS = st.one_of(EXTREMES, EXTREMES, st.integers(-(2**70), 2**70).map(str))
"""Numbers as text, two in three of them extreme: of 19 to 5000 digits, beyond a double, nan."""
NESTINGS = st.sampled_from([2, 64, 1000, 5000, 200_000])
CONTROLS = st.sampled_from([*SEPARATORS, "\x00", "\x1b[2J", "\x7f", "\t", "\ufeff", "\ud7ff"])
BAD_BYTES = st.sampled_from([b"\xff", b"\xfe\xff", b"\xc3", b"\xed\xa0\x80", b"\xe2\x80",
                             b"\x80", b"\xf4\x90\x80\x80", b"\xc0\xaf"])
"""Byte strings that are not UTF-8: lone bytes, a surrogate, cut and overlong sequences."""


@st.composite
def spoiled(draw: st.DrawFn, text: str) -> bytes:
    """``text`` as UTF-8, left alone or with a control character, a line separator or bytes
    that are not UTF-8 put somewhere in it."""
    data = text.encode("utf-8", "surrogatepass")
    how = draw(st.sampled_from(["none", "none", "char", "bytes"]))
    if how == "none":
        return data
    at = draw(st.integers(0, len(data)))
    while at < len(data) and 0x80 <= data[at] < 0xC0:       # not inside a character
        at += 1
    piece = draw(BAD_BYTES) if how == "bytes" else draw(CONTROLS).encode("utf-8", "surrogatepass")
    return data[:at] + piece + data[at:]


def toml_hostile() -> st.SearchStrategy[str]:
    """TOML values no suite should hold: numbers of any size (half of them), deep arrays and
    inline tables, strings with controls (escaped, and raw: TOML refuses those)."""
    return st.one_of(
        NUMBER_TEXTS, NUMBER_TEXTS, NUMBER_TEXTS, NUMBER_TEXTS, NUMBER_TEXTS,
        NESTINGS.map(lambda n: "[" * n + "]" * n),
        NESTINGS.map(lambda n: "{a=" * n + "1" + "}" * n),
        st.builds(lambda c: toml_string(f"a{c}b"), CONTROLS),
        st.builds(lambda c: f'"a{c}b"', CONTROLS),
        st.builds(lambda n: f'"{n}MiB"', NUMBER_TEXTS))


SUITE_KEYS = {"method": ["samples", "seed", "runtime", "ramp", "vms", "memory", "rounds",
                         "boot_timeout", "mode", "target_ci", "min_runtime", "max_runtime"],
              "matrix": ["num_queues", "queue_size", "vms", "iothread", "cache", "from_vm"],
              "target": ["size", "directory", "working_set"]}


@st.composite
def suite_files(draw: st.DrawFn) -> bytes:
    """A suite (test_hardening's, which are hostile field by field) with a hostile key added to
    one to three of [method], [matrix] and [target]; then maybe spoiled."""
    text = draw(suite_texts())
    for table in draw(st.lists(st.sampled_from(sorted(SUITE_KEYS)), min_size=1, max_size=3,
                               unique=True)):
        line = f"{draw(st.sampled_from(SUITE_KEYS[table]))} = {draw(toml_hostile())}\n"
        head = f"[{table}]\n"
        text = text.replace(head, head + line, 1) if head in text else text + head + line
    return draw(spoiled(text))


def _suite_result(directory: Path) -> subprocess.CompletedProcess[str]:
    done = cli_result("run", str(directory / "s.toml"), "--plan", cwd=directory)
    assert done.returncode in DOCUMENTED, done
    event(f"run --plan: exit {done.returncode}")
    if done.returncode != 0:
        if done.returncode == ExitStatus.USAGE and "Usage:" in done.stderr:
            return usage_error(done)                 # type: ignore[return-value]
        lines = done.stderr.rstrip("\n").split("\n")
        assert all(line.startswith("iomatrix: ") for line in lines), done.stderr
        assert not any(c in done.stderr for c in SEPARATORS), done.stderr
    return done


@pytest.mark.slow
@settings(FUZZ, max_examples=250)
@given(suite_files())
def test_any_suite_file_is_planned_or_refused_in_lines_of_its_own(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "s.toml").write_bytes(data)
        done = _suite_result(Path(tmp))
        assert done.returncode in (0, ExitStatus.SUITE_INVALID), done


JOB_OPTIONS = ["rw", "bs", "iodepth", "numjobs", "rate_iops", "rwmixread", "runtime", "size",
               "bssplit", "ramp_time", "blocksize", "direct", "ioengine", "nrfiles", "offset"]
JOB_LINES = st.one_of(
    st.sampled_from(["[j]", "[global]", "[k]", "rw=randread", "rw=randrw", "bs=4k", "iodepth=8",
                     "numjobs=2", "direct=1", "ioengine=libaio", "stonewall", "time_based",
                     "rate_iops=100", "rwmixread=70", "; rw=write", "# note", "", "  ",
                     "include x.fio", "bs=${BS}", "filename=/etc/passwd"]),
    st.builds(lambda k, v: f"{k}={v}", st.sampled_from(JOB_OPTIONS),
              st.one_of(NUMBER_TEXTS, st.sampled_from(["4k", "1m", "0", "-1", "randread"]))),
    st.builds(lambda k, c, v: f"{k}={c}{v}", st.sampled_from(JOB_OPTIONS), CONTROLS,
              st.sampled_from(["4k", "8", "randread", "exec_prerun=/bin/sh"])),
    NESTINGS.map(lambda n: "[" * n + "]" * n))


@st.composite
def job_files(draw: st.DrawFn) -> bytes:
    lines = ["[j]", *draw(st.lists(JOB_LINES, max_size=12))]
    return draw(spoiled(draw(st.sampled_from(["\n", "\r\n"])).join(lines) + "\n"))


@pytest.mark.slow
@settings(FUZZ, max_examples=250)
@given(job_files())
def test_any_job_file_is_read_or_refused_on_one_line(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "j.fio").write_bytes(data)
        write_suite(Path(tmp), '[[workloads]]\njobfile = "j.fio"\n', name="s")
        done = _suite_result(Path(tmp))
        if done.returncode != 0:
            one_line(done, ExitStatus.SUITE_INVALID)


FIO_OUTPUTS = sorted(p for p in FIXTURES.glob("3.*/*") if p.suffix in (".json", ".out"))
HUGE = "__iomatrix_huge__"
"""Stands for a value json.dumps cannot write (a number of more digits than Python converts, a
deep array); replaced in the text after dumping."""


def _paths(value: object, at: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    """Every place in a decoded JSON document (keys and indexes from the top)."""
    found = [at]
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*at, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _paths(item, (*at, index))
    return found


JSON_VALUES = st.one_of(
    st.sampled_from([10**19, 2**63, -(2**63) - 1, 10**400, float("inf"), float("-inf"),
                     float("nan"), 1e308, -1, 0, 0.5, None, True, "", "x", [], {}, HUGE]),
    st.integers(-(2**70), 2**70), st.text(max_size=8),
    st.builds(lambda c: f"a{c}b", CONTROLS))


@st.composite
def fio_outputs(draw: st.DrawFn) -> bytes:
    """A real fio output file (several releases, local and client/server) with values replaced
    by hostile ones where fio wrote numbers, strings, lists or objects; then maybe spoiled."""
    source = draw(st.sampled_from(FIO_OUTPUTS))
    text = source.read_text()
    start = re.search(r"^\{", text, re.M)
    assert start is not None
    prelude, data = text[:start.start()], json.loads(text[start.start():])
    for _ in range(draw(st.integers(0, 3))):
        *parent, last = draw(st.sampled_from(_paths(data)[1:]))
        holder = data
        for step in parent:
            holder = holder[step]
        holder[last] = draw(JSON_VALUES)
    dumped = json.dumps(data, indent=1)
    if f'"{HUGE}"' in dumped:
        dumped = dumped.replace(f'"{HUGE}"', draw(st.sampled_from(
            [NINES, "-" + NINES, "[" * 200_000 + "]" * 200_000, "1" + "0" * 400 + ".5"])))
    return draw(spoiled(prelude + dumped + "\n"))


@pytest.mark.slow
@settings(FUZZ, max_examples=200)
@given(fio_outputs())
def test_any_fio_output_imports_or_is_skipped_in_one_line(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path, db = Path(tmp) / "result.json", Path(tmp) / "r.db"
        path.write_bytes(data)
        done = cli_result("import", str(path), "--db", str(db))
        event(f"import: exit {done.returncode}")
        if done.returncode != 0:
            assert "skipped 1, e.g. result.json: " in one_line(done, ExitStatus.USAGE)
            assert not db.exists()
            return
        for args in (("show", "1"), ("export", "1", "--format", "json"), ("export", "1"),
                     ("recommend", "1", "--for", "qemu"), ("findings", "1")):
            shown = cli_result(*args, "--db", str(db))
            assert shown.returncode in (0, ExitStatus.USAGE), shown
            if shown.returncode:
                one_line(shown, ExitStatus.USAGE)


PVE_DRIVE_OPTIONS = ["cache", "aio", "iothread", "size", "queues", "discard", "ssd", "mbps_wr",
                     "iops_rd", "format", "media", "backup"]


@st.composite
def vm_files(draw: st.DrawFn) -> tuple[str, bytes]:
    """A Proxmox VE configuration or a libvirt domain (tests/translate/test_translate.py's), with a hostile
    value put in a disk's settings or a whole line, or nested deep; then maybe spoiled."""
    value = draw(st.one_of(NUMBER_TEXTS, st.sampled_from(["x", "", "none", "native", "1"]),
                           st.builds(lambda c: f"a{c}b", CONTROLS)))
    if draw(st.booleans()):
        option = draw(st.sampled_from(PVE_DRIVE_OPTIONS))
        line = draw(st.sampled_from([
            f"scsi0: local-lvm:vm-100-disk-0,{option}={value}",
            f"virtio{value}: local-lvm:vm-100-disk-9,size=1G", f"scsihw: {value}",
            f"machine: {value}", f"cores: {value}", f"{value}: {value}"]))
        text = PVE_CONF.replace("scsi1: ", line + "\nscsi1: ", 1)
        return "100.conf", draw(spoiled(text))
    attribute = draw(st.sampled_from(["cache", "io", "iothread", "queues", "type", "discard",
                                      "queue_size", "name", "detect_zeroes"]))
    text = LIBVIRT_XML.replace("<driver name='qemu' type='qcow2' cache='none' io='native' "
                               "discard='unmap'/>",
                               f"<driver name='qemu' type='qcow2' {attribute}='{value}'/>")
    if draw(st.integers(0, 4)) == 0:
        depth = draw(NESTINGS)
        text = text.replace("<devices>", "<devices>" + "<x>" * depth + "</x>" * depth)
    return "vm.xml", draw(spoiled(text))


@pytest.mark.slow
@settings(FUZZ, max_examples=200)
@given(vm_files())
def test_any_vm_file_translates_or_is_refused(named: tuple[str, bytes]) -> None:
    name, data = named
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / name).write_bytes(data)
        done = cli_result("translate", name, cwd=Path(tmp))
        assert done.returncode in (0, ExitStatus.USAGE), done
        event(f"translate: exit {done.returncode}")
        if done.returncode:
            usage_error(done)
        disk = "scsi0" if name.endswith(".conf") else "sda"       # the one made hostile
        write_suite(Path(tmp), f'[matrix]\nfrom_vm = "{name}"\ndisk = "{disk}"\n', name="s")
        planned = _suite_result(Path(tmp))
        if planned.returncode != 0:
            one_line(planned, ExitStatus.SUITE_INVALID)


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database holding one imported run (FIO_JSON), which each example copies."""
    db = tmp_path_factory.mktemp("imported") / "r.db"
    assert cli_result("import", str(FIO_JSON), "--db", str(db)).returncode == 0
    return db


@pytest.mark.slow
@settings(FUZZ, max_examples=150)
@given(st.one_of(st.text(max_size=30), NUMBER_TEXTS, st.integers(0, 2**80).map(str),
                 st.builds(lambda c: f"1{c}", CONTROLS)))
def test_any_run_number_is_a_run_or_not_found(imported: Path, ref: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "r.db"
        shutil.copyfile(imported, db)
        for args in (("show", ref), ("compare", ref, "1"), ("export", ref), ("findings", ref)):
            done = cli_result(*args, "--db", str(db))
            assert done.returncode in (0, ExitStatus.USAGE, ExitStatus.NOT_FOUND), done
            event(f"{args[0]}: exit {done.returncode}")
            if done.returncode == ExitStatus.NOT_FOUND:
                one_line(done, ExitStatus.NOT_FOUND)
            elif done.returncode == ExitStatus.USAGE:
                usage_error(done)
            else:
                assert ref.strip() in ("1", "last") or ref == "01" or int(ref) == 1, ref
