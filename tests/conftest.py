"""Shared test helpers: small suite files in a temporary directory, a check that nothing we
started is still running, and what this host's KVM is expected to do.

Nothing here may assume one machine: not root, not a CPU count, not a file system for /tmp, not
KVM working or failing (nor how it fails), not a network."""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import pwd
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.needs import check as check_needs
from tests.needs import lacking, need, needs, required

REPO = Path(__file__).resolve().parents[1]

BOOT_SECONDS = 240
"""What a test gives a guest to boot (``[method] boot_timeout``, a probe's wait): a TCG guest on
this 2-core host under the suite's load once took over the 120 s default. Still below
pytest's 300 s per test, so a guest that really hangs fails as "did not boot", with its
console, before pytest-timeout kills the test."""
BOOT_TIMEOUT = f'boot_timeout = "{BOOT_SECONDS}s"\n'
"""``BOOT_SECONDS`` as a ``[method]`` line."""
TCG_GUEST = 'accel = "tcg"\nvcpus = 1\nmemory = "384MiB"\n' + BOOT_TIMEOUT
"""The ``[method]`` lines of the smallest guest a run on a target kind boots: TCG (whatever the
host's KVM does), one vCPU, 384 MiB, ``BOOT_TIMEOUT``."""


def accepts_direct_io(directory: str | os.PathLike[str]) -> bool:
    """Whether a file in ``directory`` can be written with O_DIRECT (fio's direct=1, QEMU's
    cache=none); tmpfs refused it before Linux 6.6."""
    try:
        fd, path = tempfile.mkstemp(dir=directory, prefix="iomatrix-direct-")
    except OSError:
        return False
    os.close(fd)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_DIRECT)
        try:
            with mmap.mmap(-1, 4096) as block:          # page-aligned, as O_DIRECT wants
                os.write(fd, block)
        finally:
            os.close(fd)
        return True
    except OSError:
        return False
    finally:
        os.unlink(path)


@pytest.hookimpl(tryfirst=True)          # before pytest's tmp_path factory reads basetemp
def pytest_configure(config: pytest.Config) -> None:
    """Tests put their images and fio files in tmp_path and read them with O_DIRECT. Where the
    temporary directory cannot do that (e.g. /tmp on tmpfs under an older kernel), everything
    temporary (ours, pytest's, QEMU's and fio's) goes to /var/tmp instead, as iomatrix itself
    does; nothing changes on hosts where it can.

    With xdist's workers, pytest's base directory (/tmp/pytest-of-root/pytest-N) gains a
    directory per worker (popen-gw0), and a run's scratch directory in a test's tmp_path grows
    past what UNIX socket paths allow (iomatrix refuses it). The controller then gives the
    workers a shorter base of its own, made by mkdtemp (private, unguessable) and removed at the
    end (``pytest_unconfigure``).

    ``IOMATRIX_TEST_REQUIRE`` is read here first, so that an unknown name in it stops the run
    before any test (``tests.needs``)."""
    required()
    config.addinivalue_line("markers", "needs(*capabilities): what the test needs of the machine "
                                       "(tests/needs.py)")
    if not config.option.basetemp and not accepts_direct_io(tempfile.gettempdir()):
        if accepts_direct_io("/var/tmp"):
            os.environ["TMPDIR"] = "/var/tmp"
            tempfile.tempdir = None                  # gettempdir() reads TMPDIR again
    if (not config.option.basetemp and not hasattr(config, "workerinput")
            and config.getoption("numprocesses", None)):
        config.option.basetemp = tempfile.mkdtemp(prefix="pt-")
        config.stash[_SHORT_BASETEMP] = config.option.basetemp


_SHORT_BASETEMP = pytest.StashKey[str]()


@pytest.hookimpl(tryfirst=True)         # before the test's fixtures are set up
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test marked ``needs(...)`` skips where a capability is missing, or fails where
    ``IOMATRIX_TEST_REQUIRE`` names it (``tests.needs``)."""
    check_needs(item)


FIRST = {
    "tests/scenarios/test_cluster_guests.py::test_the_users_own_image_boots_on_two_nodes_each_from_a_copy_of_its_own": 66,
    "tests/scenarios/test_cluster_shared.py::test_a_pool_from_every_node_in_each_mode": 142,
    "tests/scenarios/test_guest.py::test_every_controller_boots_and_measures": 41,
    "tests/scenarios/test_own_guest.py::test_two_guests_of_the_image_boot_the_kernel_given_beside_the_appliance": 70,
    "tests/analysis/test_paired.py::test_a_real_aa_run_is_called_different_at_most_at_the_nominal_rate": 46,
    "tests/scenarios/test_guest.py::test_trials_whose_guest_stops_are_measured_again_in_a_fresh_boot": 56,
    "tests/scenarios/test_guest.py::test_after_a_stop_not_measured_again_the_next_trial_boots_afresh": 39,
    "tests/scenarios/test_cluster_pilot.py::test_nodes_measuring_their_own_share_follow_one_pilot": 28,
    "tests/scenarios/test_own_guest.py::test_a_debian_12_cloud_image_boots_through_grub_beside_the_appliance_and_kill_9_leaves_nothing": 68,
    "tests/analysis/test_findings.py::test_a_real_quick_run_of_seed_000": 46,
    "tests/scenarios/test_cluster_shared.py::test_two_nodes_load_a_lun_each_on_a_region_of_its_own": 35,
    "tests/analysis/test_trialplan.py::test_a_real_blocklayer_run_stores_its_pilot_and_its_choice": 33,
    "tests/attacks/test_attacks_fuzz.py::test_every_suite_key_takes_any_value_or_refuses_it_in_one_line": 25,
    "tests/scenarios/test_cluster.py::test_nodes_lost_mid_run_fail_their_trials_and_the_others_go_on": 26,
    "tests/scenarios/test_run.py::test_run_stores_every_trial_and_cleans_up": 23,
    "tests/scenarios/test_cluster_load.py::test_a_killed_controller_leaves_nothing_on_the_nodes_and_resumes": 25,
    "tests/scenarios/test_cluster_guests.py::test_a_killed_controller_leaves_nothing_on_the_nodes_and_resumes": 20,
}
"""The suite's longest tests with their seconds (a whole run here, 2 workers: its "slowest
durations"), run first and shared out between the workers: xdist's worksteal gives each of N
workers a contiguous 1/N of the tests (worker i the i-th slice) and an idle worker steals from
the end of another's queue, so every long test in one slice would run one after the other on
one worker while the other has nothing left to take. A name here that no longer exists only
stops being moved; a wrong figure only balances less well."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests in ``FIRST`` shared out longest first, each to the worker with the least of
    them so far, at the start of that worker's slice (as ``WorkStealingScheduling`` cuts it:
    the i-th of n takes len // (n - i) of what is left); the others as collected. Without
    workers, ``FIRST`` first."""
    def name(item: pytest.Item) -> str:
        return item.nodeid.partition("[")[0]

    long = sorted((i for i in items if name(i) in FIRST), key=lambda i: -FIRST[name(i)])
    rest = [i for i in items if name(i) not in FIRST]
    workers = getattr(config.option, "numprocesses", None)
    n = workers if isinstance(workers, int) and workers > 1 else 1
    bins: list[list[pytest.Item]] = [[] for _ in range(n)]
    for item in long:
        min(bins, key=lambda b: sum(FIRST[name(i)] for i in b)).append(item)
    ordered: list[pytest.Item] = []
    left = len(items)
    for k, mine in enumerate(bins):
        size = left // (n - k)
        take = max(0, size - len(mine))
        ordered += mine + rest[:take]
        rest = rest[take:]
        left -= size
    items[:] = ordered + rest


_STARTED = pytest.StashKey[float]()
_SCRATCH_MARK = re.compile(r"^made by iomatrix: scratch (\S+)\nfor pid (\d+) started at tick "
                           r"(\d+) of boot (\S+) on ")


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_STARTED] = time.time()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The tests kill runs with SIGKILL on purpose, and delete the database that recorded
    what each had made (where ``iomatrix clean`` would find it), or kill a node's run with its
    node: such a run leaves its scratch directory in the temporary directory (its mark, lock
    and fio's files). Once every test has ended (the controller, or the only process), those
    made during this session by a process that is gone, and holding only plain files, are
    removed; nothing else is touched."""
    if hasattr(session.config, "workerinput"):
        return
    from iomatrix.core.owner import boot_id, start_ticks

    started, boot = session.config.stash.get(_STARTED, time.time()), boot_id()
    for directory in Path(tempfile.gettempdir()).glob("iomatrix-run-*"):
        with contextlib.suppress(OSError):
            mark = directory / ".iomatrix"
            found = _SCRATCH_MARK.match(mark.read_text())
            if (found is None or found[1] != str(directory) or found[4] != boot
                    or mark.lstat().st_mtime < started or directory.is_symlink()
                    or start_ticks(int(found[2])) == int(found[3])
                    or any(not e.is_file(follow_symlinks=False) for e in os.scandir(directory))):
                continue
            shutil.rmtree(directory)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """Removes the base directory ``pytest_configure`` made for xdist's workers."""
    base = config.stash.get(_SHORT_BASETEMP, None)
    if base is not None:
        shutil.rmtree(base, ignore_errors=True)


def declared_kvm() -> bool | None:
    """What IOMATRIX_EXPECT_KVM declares about this host's KVM: "1" it must work, "0" it must
    not; unset (or anything else): not declared, the tests take whatever the probe finds."""
    return {"1": True, "0": False}.get(os.environ.get("IOMATRIX_EXPECT_KVM", "").strip())


def for_kvm(usable: bool, *, wanted: bool, detail: str) -> None:
    """Call at the start of a test written for one KVM outcome, with what a probe found here
    (``usable``, and the probe's reason as ``detail``). A host with the other outcome skips the
    test, unless IOMATRIX_EXPECT_KVM declared this host's outcome: then a disagreeing probe fails.
    KVM's ways of failing differ from host to host (a guest that hangs, a QEMU that aborts, no
    /dev/kvm...): tests may rely on "usable or not, and why", never on which way it failed."""
    declared = declared_kvm()
    if declared is not None:
        assert usable == declared, (
            f"IOMATRIX_EXPECT_KVM={int(declared)}, but KVM is {'' if usable else 'not '}usable "
            f"here: {detail}")
    if usable != wanted:
        pytest.skip(f"for hosts where KVM is {'' if wanted else 'not '}usable; here it is "
                    f"{'' if usable else 'not '}({detail})")


def as_nobody(argv: list[str]) -> list[str]:
    """``argv`` run as the unprivileged user ``nobody`` (``setpriv``: needs root)."""
    import pwd

    user = pwd.getpwnam("nobody")
    return ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups",
            "--", *argv]


SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin")
"""An attacker's interpreter: one every user may run (this test's may be in root's home)."""
ATTACKS = needs("attacker")
"""Marks a test that acts as ``attacker`` (issue 20)."""


class User(NamedTuple):
    name: str
    uid: int
    gid: int


@pytest.fixture(scope="session")
def attacker() -> Iterator[User]:
    """An unprivileged user made for the tests that attack root's runs, with no home and no
    shell; removed afterwards. Needs root (mark the test ``ATTACKS``)."""
    name = f"iomx-adv-{secrets.token_hex(3)}"
    subprocess.run(["useradd", "--system", "--user-group", "--no-create-home",
                    "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", name],
                   check=True, capture_output=True, timeout=60)
    try:
        entry = pwd.getpwnam(name)
        yield User(name, entry.pw_uid, entry.pw_gid)
    finally:
        subprocess.run(["userdel", name], capture_output=True, timeout=60)
        subprocess.run(["groupdel", name], capture_output=True, timeout=60)


ATTACK_OUTCOMES = ("refused", "harmless")
"""How a test of issue 20 expects an attack to end: iomatrix refuses it (in one line, or by
not believing what the user planted), or lets it run and it changes nothing it should not."""


Attack = Callable[..., None]


@pytest.fixture
def attack(record_property: Callable[[str, object], None]) -> Attack:
    """``attack(name, outcome)``, called as a test of issue 20 starts: the attack it tries and
    how it must end (``ATTACK_OUTCOMES``), kept in the JUnit XML that
    ``bench/attacks.py`` reads back to print the table of attacks (the outcome counts only
    where the test passed). ``attack(attempts=...)``, once known: what the attacker's own loop
    tried (its counts, by operation)."""
    def record(name: str | None = None, outcome: str | None = None,
               attempts: dict[str, int] | None = None) -> None:
        if name is not None:
            assert outcome in ATTACK_OUTCOMES
            record_property("attack", name)
            record_property("outcome", outcome)
        if attempts is not None:
            record_property("attempts", json.dumps(attempts, sort_keys=True))
    return record


Fuzzed = Callable[[str, int, int], None]


@pytest.fixture
def fuzzed(record_property: Callable[[str, object], None]) -> Fuzzed:
    """``fuzzed(kind, cases, tracebacks)``, called by a fuzz test of issue 31 (item 7) once it
    has tried its cases (several times for several kinds): how many inputs of ``kind`` ("suite
    keys", "node requests", "store columns", "PostgreSQL URLs") it tried and how many of them
    ended in a traceback, kept in the JUnit XML for ``bench/attacks.py``'s table of fuzz
    counts. The test still fails on a traceback."""
    def record(kind: str, cases: int, tracebacks: int) -> None:
        record_property("fuzz", json.dumps({"input": kind, "cases": cases,
                                            "tracebacks": tracebacks}))
    return record


def as_user(user: User, code: str, *args: str) -> subprocess.Popen[str]:
    """Run ``code`` (Python) as ``user``, with ``args``; it dies with this process."""
    return subprocess.Popen(["setpriv", f"--reuid={user.uid}", f"--regid={user.gid}",
                             "--clear-groups", "--pdeathsig", "KILL", "--", str(SYSTEM_PYTHON),
                             "-c", code, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd="/")


def run_guests(tmp_path: Path, body: str, **kwargs: object):  # type: ignore[no-untyped-def]
    """Run a guest suite (``body`` under a 16 MiB directory target) into ``tmp_path/r.db``:
    (outcome, stored run). A trial measured again because its guests stopped passes, but says
    so as a warning in the test summary: a stop is rare, and must stay in sight."""
    import warnings

    from iomatrix.measure.runner import run_suite
    from iomatrix.store import Store
    from iomatrix.suite import load_suite
    suite = load_suite(write_suite(tmp_path, body, size="16MiB"))
    with Store(tmp_path / "r.db") as store:
        outcome = run_suite(suite, store, **kwargs)  # type: ignore[arg-type]
        stored = store.load_run(outcome.run_id)
    for note in stored.notes:
        if "the guests stopped" in note:
            warnings.warn(note, stacklevel=2)
    return outcome, stored


def write_suite(directory: Path, body: str, *, name: str = "t", size: str = "64MiB",
                target: Path | None = None) -> Path:
    """A suite file with a directory target under ``directory``."""
    path = directory / f"{name}.toml"
    path.write_text(f'[suite]\nname = "{name}"\n[target]\ndirectory = "{target or directory / "target"}"\n'
                    f'size = "{size}"\n' + body)
    return path


def standin(directory: Path, program: str, output: str, status: int = 0) -> Path:
    """A stand-in for a Proxmox VE program (PVE cannot be installed here): a script called
    ``program`` in ``directory`` that prints ``output``, exits with ``status`` and does nothing
    else."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / program
    path.write_text(f"#!/bin/sh\n# stand-in: Proxmox VE cannot be installed here\n"
                    f"echo {shlex.quote(output)}\nexit {status}\n")
    path.chmod(0o755)
    return path


PVEVERSION = {8: "pve-manager/8.4.1/2a5fa54a8503f96d (running kernel: 6.8.12-9-pve)",
              9: "pve-manager/9.0.3/025864202ebb6109 (running kernel: 6.14.8-2-pve)"}
"""``pveversion``'s line on a PVE 8 and a PVE 9 host."""


def pve_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, output: str,
             status: int = 0) -> None:
    """This process on a "PVE host": a stand-in pveversion printing ``output`` first on PATH."""
    folder = tmp_path / "pve-bin"
    standin(folder, "pveversion", output, status)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")


REFERENCE = REPO / "docs" / "qemu-disk-options.md"
"""The project's reference on Proxmox, libvirt and QEMU 7.2 disk settings; tests check iomatrix's
output against its tables."""


def reference_table(section: str, first_column: str) -> dict[str, list[str]]:
    """The table in the reference's ``section`` (e.g. "## 3.") whose header starts with
    ``first_column``: each row's first cell (without backticks) → its other cells."""
    text = REFERENCE.read_text(encoding="utf-8")
    body = text.split(f"\n{section} ", 1)[1].split("\n## ", 1)[0]
    lines = iter(body.splitlines())
    for line in lines:
        if line.startswith(f"| {first_column} |"):
            next(lines)                                        # the |---| line
            rows: dict[str, list[str]] = {}
            for row in lines:
                if not row.startswith("|"):
                    break
                first, *rest = [c.strip() for c in row.strip().strip("|").split(" | ")]
                rows[first.replace("`", "")] = rest
            return rows
    raise AssertionError(f"{REFERENCE.name} {section}: no table starting with {first_column!r}")


WATCHED = ("qemu-system", "qemu-storage", "fio")


def our_processes(marker: str) -> list[str]:
    """Live processes whose command line mentions ``marker`` (a test's temp dir), and QEMU/fio
    children of this process, zombies included (started but not reaped)."""
    me = os.getpid()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        state, ppid = stat[stat.rindex(")") + 1:].split()[:2]
        if (marker in cmdline and state != "Z") or (int(ppid) == me and comm.startswith(WATCHED)):
            found.append(f"{entry.name} {comm}: {cmdline[:200]}")
    return found


def fio_runs(marker: str | os.PathLike[str]) -> bool:
    """Whether a fio whose command line mentions ``marker`` runs (a run's, once its scratch
    directory, where fio's job file is, is under ``marker``: TMPDIR)."""
    return any(p.split(" ", 2)[1] == "fio:" for p in our_processes(str(marker)))


@pytest.fixture
def no_leftovers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """Scratch directories (ours and our subprocesses') go under tmp_path; the test fails if a
    qemu-storage-daemon, QEMU or fio that mentions tmp_path, or a child of pytest, outlives it."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    yield
    left = our_processes(str(tmp_path))
    assert not left, f"processes left running: {left}"


@pytest.fixture
def loop_device(tmp_path: Path):  # type: ignore[no-untyped-def]
    backing = tmp_path / "backing.img"
    with open(backing, "wb") as f:
        f.truncate(64 << 20)
    try:
        dev = subprocess.run(["losetup", "--find", "--show", str(backing)], capture_output=True,
                             text=True, check=True).stdout.strip()
    except (subprocess.CalledProcessError, FileNotFoundError) as exc:
        lacking("loop", f"loop devices unavailable here: {exc}")
    try:
        yield Path(dev)
    finally:
        subprocess.run(["umount", dev], capture_output=True)
        subprocess.run(["losetup", "-d", dev], capture_output=True)


@pytest.fixture(scope="session")
def kernel() -> Path:
    """A standard Linux kernel to boot (the host's, or Debian's fetched once), or skip."""
    from iomatrix.appliance.kernel import find_kernel
    from iomatrix.core.errors import IomatrixError

    try:
        return find_kernel()
    except IomatrixError as e:
        lacking("kernel", f"no kernel to boot: {e}")


@pytest.fixture(scope="session")
def appliance_kernel() -> Path:
    """A kernel an appliance can be built of: its modules are installed (the host's, or
    Debian's fetched once), or skip."""
    from iomatrix.appliance.kernel import find_kernel
    from iomatrix.core.errors import EnvironmentProblem

    try:
        return find_kernel(require_modules=True)
    except EnvironmentProblem as e:
        lacking("kernel", f"no kernel with modules: {e}")


@pytest.fixture(scope="session")
def host_appliance(appliance_kernel: Path) -> Path:
    """The guest appliance built here, in the user's cache, before a test whose guests are
    started where there is no network (cluster nodes in namespaces of their own, which share
    this cache): a node cannot fetch Debian's kernel when the host has none with modules (a
    Debian 13 root). Its directory."""
    from iomatrix.appliance.build import build_appliance

    return build_appliance().kernel.parent


@pytest.fixture(scope="session")
def windows_bundle():  # type: ignore[no-untyped-def]
    """fio.exe of the host's fio version (``iomatrix.appliance.winfio``), cross-built once in
    the user's appliance cache like the appliance (a minute or more on 2 cores the first time),
    or skip where mingw-w64 is missing or the archive serves no source for the host's fio."""
    from iomatrix.appliance.kernel import default_cache_dir
    from iomatrix.appliance.winfio import windows_fio
    from iomatrix.core.errors import FioSourceUnavailable

    need("mingw")
    try:
        return windows_fio(default_cache_dir())
    except FioSourceUnavailable as e:
        lacking("guest-fio", f"fio.exe cannot be built here: {e}")


IOMATRIX = [sys.executable, "-m", "iomatrix"]
"""The command line in a process of its own."""


def cli_result(*args: str, cwd: Path | None = None, check: int | None = None,
               own_process: bool = False, env: dict[str, str] | None = None,
               timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``iomatrix ARGS`` run from ``cwd`` as ``subprocess.run([python, "-m", "iomatrix", *ARGS],
    capture_output=True, text=True)`` would run it: through ``main`` (errors as one line and an
    exit status), stdout and stderr apart, printed as into a pipe (200 columns, no colour); with
    ``check``, the exit status it must end with.

    In this process, which spares each call a new interpreter importing numpy and SciPy (a second
    or more on a busy host), unless ``own_process`` or an ``env`` of its own: a run to signal or
    kill, one owned by its pid, another PATH."""
    if own_process or env is not None:
        done = subprocess.run([*IOMATRIX, *args], cwd=cwd, capture_output=True, text=True,
                              timeout=timeout, env=env)
    else:
        done = _in_this_process(*args, cwd=cwd)
    if check is not None:
        assert done.returncode == check, done.stdout + done.stderr
    return done


def _in_this_process(*args: str, cwd: Path | None) -> subprocess.CompletedProcess[str]:
    import contextlib
    import io

    from iomatrix.cli.app import main
    from iomatrix.cli.common import Environment, Terminal, use_environment

    stdout, stderr = io.StringIO(), io.StringIO()
    env = Environment(stdout=Terminal(file=stdout, width=200, highlight=False, color_system=None),
                      stderr=Terminal(file=stderr, width=200, highlight=False, soft_wrap=True,
                                      color_system=None))
    code = 0
    argv = sys.argv
    sys.argv = ["iomatrix", *args]                      # the program name Typer's usage shows
    with contextlib.ExitStack() as stack:
        stack.callback(setattr, sys, "argv", argv)
        if cwd is not None:
            stack.enter_context(contextlib.chdir(cwd))
        stack.enter_context(use_environment(env))
        stack.enter_context(contextlib.redirect_stdout(stdout))    # Typer's own usage errors
        stack.enter_context(contextlib.redirect_stderr(stderr))
        try:
            main(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return subprocess.CompletedProcess(["iomatrix", *args], code, stdout.getvalue(),
                                       stderr.getvalue())


def cli(*args: str, **how: object) -> tuple[int, str]:
    """``cli_result`` (``how``: its keywords) as a status, and stdout followed by stderr."""
    done = cli_result(*args, **how)  # type: ignore[arg-type]
    return done.returncode, done.stdout + done.stderr


# -- the results store on both backends ------------------------------------------------------

@pytest.fixture(scope="session")
def pg_server():  # type: ignore[no-untyped-def]
    """A PostgreSQL server of the tests' own (``iomatrix.testing.pgserver``) for the session;
    clients (ours and the subprocesses we start) find its password through PGPASSFILE."""
    from iomatrix.testing.pgserver import PgServer

    need("postgresql")

    server = PgServer()
    saved = {k: os.environ.get(k) for k in ("PGPASSFILE", "PGPASSWORD")}
    os.environ.pop("PGPASSWORD", None)
    os.environ.update(server.env())
    try:
        yield server
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        server.stop()


_databases = iter(range(1, 10**9))


@pytest.fixture
def pg_url(pg_server):  # type: ignore[no-untyped-def]
    """The URL of a new, empty database on the session's server, dropped after the test."""
    name = f"t{os.getpid()}_{next(_databases)}"
    url = pg_server.create_database(name)
    yield url
    pg_server.admin(f'DROP DATABASE "{name}" WITH (FORCE)')


class Backend:
    """Where a store test keeps its results: ``location`` for ``Store`` and ``--db``, and
    ``raw`` to read or change the database behind the store's back."""

    def __init__(self, kind: str, location: str) -> None:
        self.kind = kind
        self.location = location

    def raw(self, statement: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
        """One statement on a connection of its own (autocommit); its rows."""
        if self.kind == "sqlite":
            import sqlite3

            conn = sqlite3.connect(self.location, isolation_level=None)
            try:
                return conn.execute(statement, params).fetchall()
            finally:
                conn.close()
        import psycopg

        with psycopg.connect(self.location, autocommit=True) as conn:
            cur = conn.execute(statement.replace("?", "%s"), params)
            return cur.fetchall() if cur.description else []

    def set_version(self, version: int) -> None:
        """Claim schema ``version`` for the database, as a newer iomatrix would."""
        if self.kind == "sqlite":
            self.raw(f"PRAGMA user_version = {version}")
        else:
            self.raw("UPDATE iomatrix_schema SET version = ?", (version,))


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """Each store test once on an SQLite file and once on a PostgreSQL database."""
    if request.param == "sqlite":
        return Backend("sqlite", str(tmp_path / "r.db"))
    return Backend("postgresql", request.getfixturevalue("pg_url"))
