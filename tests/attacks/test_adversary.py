"""Issue 20: root's runs against an unprivileged local user, tried for real.

The tests make a user of their own (``useradd``, removed afterwards) and run the attacks as
that user (``setpriv``) against real root runs, on a shared area of the system's temporary
directory that both can reach: a root-only "secret" file stands for what the user wants root to
overwrite. Each attack must be refused, or harmless: the secret unchanged, the run complete or
refused in one line.

1. a target directory the user owns (or a directory above it, or a ``/var/tmp/iomatrix`` the
   user made first in a sticky directory), or a ``$TMPDIR`` the user owns: refused before
   anything is made, while the user renames directories and plants symlinks under the images'
   names in a loop (F1);
   the same loop against a run in a sticky directory (as ``/var/tmp``), during the whole run,
   trials and the gaps between them, on the target's own filesystem and on one iomatrix makes;
2. a lock the user plants where a killed run's lock was: the run is not kept alive by it;
4. a database that names the user's choice of directories: ``clean`` removes none of them;
6. a killed run's children (qemu-img) die with it, and ``clean`` frees what they wrote.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from iomatrix.cli.status import ExitStatus
from iomatrix.core.mounts import mount_of
from iomatrix.core.owner import this_process
from iomatrix.core.proc import orphan_guard
from iomatrix.store import Store
from iomatrix.suite import load_suite
from iomatrix.targets.targets import plan_targets
from tests.conftest import ATTACKS, Attack, IOMATRIX, User, as_user, cli_result, write_suite

SHARED = Path(tempfile.gettempdir())
"""Where the shared area goes: the system's temporary directory, which every user reaches."""

pytestmark = ATTACKS

HOST = """
[[workloads]]
rw = ["randwrite", "randread"]
bs = "4k"
iodepth = 4
[method]
mode = "host"
samples = 1
seed = 5
ramp = 0
runtime = "500ms"
"""


@pytest.fixture
def arena(no_leftovers: None) -> Iterator[Path]:
    """A directory both root and the attacker reach (mode 0755, root's), with ``sticky`` in it
    (mode 1777, as /var/tmp) and ``secret``: 1 MiB only root may read or write."""
    area = Path(tempfile.mkdtemp(prefix="iomatrix-arena-", dir=SHARED))
    try:
        area.chmod(0o755)
        (area / "sticky").mkdir()
        (area / "sticky").chmod(0o1777)
        secret = area / "secret"
        secret.write_bytes(secrets.token_bytes(1 << 20))
        secret.chmod(0o600)
        yield area
    finally:
        shutil.rmtree(area, ignore_errors=True)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


SWAPPER = r'''
import json, os, sys, time
target, secret, stop = sys.argv[1:4]
precreate = sys.argv[4] == "precreate"
names = sys.argv[5].split(",")
counts = {}
def attempt(op, fn, *args):
    try:
        fn(*args)
    except OSError:
        counts[op + " refused"] = counts.get(op + " refused", 0) + 1
        return False
    counts[op + " done"] = counts.get(op + " done", 0) + 1
    return True
def plant(directory):
    for name in names:
        attempt("plant symlink", os.symlink, secret, os.path.join(directory, name))
n = 0
while not os.path.exists(stop):
    n += 1
    # F1: the target directory away, one of ours in its place, symlinks under the images' names
    # (mode "inside": only root's directories in it)
    if sys.argv[4] != "inside" and os.path.lexists(target):
        attempt("rename target", os.rename, target, f"{target}.{n}")
    if sys.argv[4] != "inside" and (precreate or os.path.lexists(f"{target}.{n}")):
        if attempt("make target", os.mkdir, target):
            os.chmod(target, 0o777)
    try:
        entries = os.listdir(target)
    except OSError:
        counts["list target refused"] = counts.get("list target refused", 0) + 1
        entries = []
    for entry in entries:
        path = os.path.join(target, entry)
        if entry.startswith("iomatrix-") and "." not in entry:
            if attempt("rename private", os.rename, path, f"{path}.{n}"):
                attempt("make private", os.mkdir, path)
            plant(path)
    if n == 1:
        print("looping", flush=True)
    time.sleep(0.002)
counts["rounds"] = n
print(json.dumps(counts))
'''


IMAGES = ("disk-raw-off.raw", "ext4.img", "xfs.img", "btrfs.img")
"""The names a run's images take: where the attacker plants its symlinks."""


class Swapper:
    """The F1 attacker, in a loop until stopped: its counts of what it tried."""

    def __init__(self, user: User, target: Path, secret: Path, *, precreate: bool,
                 names: tuple[str, ...] = IMAGES, inside: bool = False) -> None:
        """``precreate``: the user makes ``target`` first; ``inside``: the user leaves
        ``target`` alone and swaps only the directories root makes in it."""
        self._stop = secret.parent / f"stop-{secrets.token_hex(4)}"   # in root's directory
        mode = "inside" if inside else "precreate" if precreate else "wait"
        self.proc = as_user(user, SWAPPER, str(target), str(secret), str(self._stop), mode,
                            ",".join(names))

    def looping(self) -> None:
        """Return once the loop has gone round once."""
        assert self.proc.stdout is not None and self.proc.stdout.readline() == "looping\n"

    def stop(self) -> dict[str, int]:
        self._stop.touch()
        out, err = self.proc.communicate(timeout=60)
        assert self.proc.returncode == 0, err
        return json.loads(out.splitlines()[-1])


def run(*args: str, tmpdir: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*IOMATRIX, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "TMPDIR": str(tmpdir)})


def stored_runs(db: Path) -> list[int]:
    if not db.exists():
        return []
    with Store(db, readonly=True) as store:
        return [r.id for r in store.list_runs()]


def their_directory(arena: Path, user: User, name: str) -> Path:
    """A directory ``user`` owns in the arena."""
    path = arena / name
    path.mkdir()
    os.chown(path, user.uid, user.gid)
    return path


def assert_tmpdir_refused(done: subprocess.CompletedProcess[str], theirs: Path,
                          user: User) -> None:
    """``done`` refused, in one line and its hint, a $TMPDIR ``theirs`` that ``user`` owns."""
    assert done.returncode == ExitStatus.ENVIRONMENT, done.stderr
    assert done.stderr.splitlines() == [
        f"iomatrix: TMPDIR {theirs}: {theirs} is owned by {user.name} (uid {user.uid}), not "
        "root: another user could redirect the files iomatrix makes there (sockets, job files, "
        "probes)",
        "iomatrix: hint: set TMPDIR to a directory only root (or you) can write to, e.g. /tmp"]


# -- 1. directories the user controls ------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("where", ["owns the target", "owns a directory above it",
                                   "made it first in a sticky directory"])
def test_a_target_another_user_controls_is_refused_while_they_swap_it(
        tmp_path: Path, arena: Path, attacker: User, where: str, attack: Attack) -> None:
    attack(f"1. target directory: the user {where}, swapping it in a loop", "refused")
    secret = arena / "secret"
    before = digest(secret)
    if where == "owns the target":
        target = arena / "theirs"
        target.mkdir()
        os.chown(target, attacker.uid, attacker.gid)
        shown = target
    elif where == "owns a directory above it":
        home = arena / "home"
        home.mkdir()
        os.chown(home, attacker.uid, attacker.gid)
        target = home / "bench"          # root's own, below the user's: the user may rename it
        target.mkdir()
        shown = home
    else:
        target = arena / "sticky" / "iomatrix"      # as /var/tmp/iomatrix, made by the user
        shown = target
    swapper = Swapper(attacker, target, secret, precreate=True)
    try:
        deadline = time.monotonic() + 30
        while not target.is_dir():                 # the user's loop is at work (or made it)
            assert time.monotonic() < deadline
            time.sleep(0.01)
        suite = write_suite(tmp_path, HOST, size="16MiB", target=target)
        db = tmp_path / "r.db"
        done = run("run", str(suite), "--db", str(db), tmpdir=tmp_path)
    finally:
        counts = swapper.stop()
        attack(attempts=counts)
    assert done.returncode == ExitStatus.TARGET, done.stderr
    lines = done.stderr.splitlines()
    assert lines[0].startswith(f"iomatrix: [target] directory {target}: {shown} is owned by "
                               f"{attacker.name} (uid {attacker.uid}), not root"), lines
    assert lines[1].startswith("iomatrix: hint: use a directory that only root (or you) can "
                               "write to") and len(lines) == 2
    assert stored_runs(db) == []
    assert digest(secret) == before
    assert sum(v for k, v in counts.items() if k != "rounds") > 0   # the loop was at work
    left = [p for p in arena.rglob("iomatrix-*") if p.owner() == "root"]
    assert left == []                                       # root made nothing there


@pytest.mark.slow
def test_a_tmpdir_another_user_owns_is_refused(tmp_path: Path, arena: Path,
                                               attacker: User, attack: Attack) -> None:
    """The scratch directory (sockets, job files) goes under $TMPDIR, as under ``sudo -E``."""
    attack("1. $TMPDIR the user owns (sudo -E)", "refused")
    theirs = their_directory(arena, attacker, "their-tmp")
    suite = write_suite(tmp_path, HOST, size="16MiB")
    db = tmp_path / "r.db"
    done = run("run", str(suite), "--db", str(db), tmpdir=theirs)
    assert_tmpdir_refused(done, theirs, attacker)
    assert stored_runs(db) == [] and list(theirs.iterdir()) == []
    assert not (tmp_path / "target").exists()


@pytest.mark.slow
@pytest.mark.parametrize("made", [False, True], ids=["own filesystem", "made filesystem"])
def test_swapping_directories_during_a_run_in_a_sticky_directory_is_refused(
        tmp_path: Path, arena: Path, attacker: User, made: bool, attack: Attack) -> None:
    """F1 during a real run: the run makes its directory in a sticky directory (as /var/tmp) and
    measures, while the user tries to swap it for one of theirs, in a loop that starts before
    the run and stops after it; also with the images on a filesystem iomatrix makes there
    (mkfs, losetup, mount)."""
    attack("1. F1: swapping directories in a loop during a real run in a sticky directory",
           "harmless")
    secret = arena / "secret"
    before = digest(secret)
    target = arena / "sticky" / "iomatrix"
    body = HOST
    if made:
        own = mount_of(arena)
        other = "ext4" if own is not None and own.fstype == "xfs" else "xfs"
        body = f'filesystems = ["{other}"]\n' + HOST
    suite = write_suite(tmp_path, body, size="16MiB", target=target)
    if made and (problem := plan_targets(load_suite(suite))[0].problem):
        pytest.skip(f"this host cannot make {other} on a loop device: {problem}")
    db = tmp_path / "r.db"
    swapper = Swapper(attacker, target, secret, precreate=False)
    try:
        swapper.looping()
        done = run("run", str(suite), "--db", str(db), tmpdir=tmp_path)
    finally:
        counts = swapper.stop()
        attack(attempts=counts)
    assert done.returncode == 0, done.stderr
    assert "2 trials ok, 0 failed" in done.stdout
    assert digest(secret) == before
    assert counts.get("rename target refused", 0) > 0, counts
    assert not any(k.endswith(" done") for k in counts), counts
    assert not target.exists()                     # made by the run, removed by it


PLANT = r'''
import os, sys
directory, db, secret, absent = sys.argv[1:5]
if db:
    os.symlink(absent, os.path.join(directory, db))
for suffix in ("-wal", "-shm"):
    os.symlink(secret, os.path.join(directory, (db or "r.db") + suffix))
'''


def plant(user: User, directory: Path, db: str, secret: Path, absent: Path) -> None:
    """As ``user``: in ``directory``, ``db`` (unless empty) a symlink to ``absent`` (a name in a
    root-only directory: root would create it), and its ``-wal`` and ``-shm`` to ``secret``."""
    planter = as_user(user, PLANT, str(directory), db, str(secret), str(absent))
    _, err = planter.communicate(timeout=60)
    assert planter.returncode == 0, err


DB_HINT = ("iomatrix: hint: keep the results database in a directory only root (or you) can "
           "write to: copy it there, or run iomatrix as the user who owns it")
DB_WHY = ("another user could swap the database, or the files SQLite writes beside it, while "
          "iomatrix uses it")


@pytest.mark.slow
@pytest.mark.parametrize("given", ["--db", "IOMATRIX_DB", "default"])
def test_a_database_in_a_directory_another_user_owns_is_refused(
        tmp_path: Path, arena: Path, attacker: User, given: str, attack: Attack) -> None:
    """The results database named (``--db``, ``IOMATRIX_DB``, or the default ``iomatrix.db`` of
    the working directory) in the user's directory, where the user put a symlink under its name
    to a root-only place where nothing is yet (root would create a file there) and its
    ``-wal`` and ``-shm`` names to the secret: refused in one line before SQLite opens
    anything."""
    attack(f"1. results database ({given}) in the user's directory, symlinks planted", "refused")
    secret, absent = arena / "secret", arena / "made-by-root"
    before = digest(secret)
    theirs = their_directory(arena, attacker, "theirs")
    plant(attacker, theirs, "iomatrix.db", secret, absent)
    suite = write_suite(tmp_path, HOST, size="16MiB")
    env = {k: v for k, v in os.environ.items() if k != "IOMATRIX_DB"} | {"TMPDIR": str(tmp_path)}
    args: list[str] = []
    shown = theirs / "iomatrix.db"
    if given == "--db":
        args = ["--db", str(shown)]
    elif given == "IOMATRIX_DB":
        env["IOMATRIX_DB"] = str(shown)
    else:
        shown = Path("iomatrix.db")
    done = subprocess.run([*IOMATRIX, "run", str(suite), *args], capture_output=True, text=True,
                          timeout=300, env=env, cwd=theirs)
    assert done.returncode == ExitStatus.STORE, done.stderr
    assert done.stderr.splitlines() == [
        f"iomatrix: {shown}: {theirs} is owned by {attacker.name} (uid {attacker.uid}), not "
        f"root: {DB_WHY}", DB_HINT]
    assert not absent.exists() and digest(secret) == before
    assert not (tmp_path / "target").exists()
    assert sorted(p.name for p in theirs.iterdir()) == ["iomatrix.db", "iomatrix.db-shm",
                                                        "iomatrix.db-wal"]


def test_reading_root_s_database_through_another_users_directory_is_refused(
        tmp_path: Path, arena: Path, attacker: User, attack: Attack) -> None:
    """``runs``, ``export``: the user's directory holds a symlink to root's own database (in a
    directory only root can read) under the name root is given: root would show the user its
    runs, or copy them where the user reads them."""
    attack("1. root's database read through the user's symlink", "refused")
    db = tmp_path / "r.db"
    Store(db).close()
    theirs = their_directory(arena, attacker, "theirs")
    link = as_user(attacker, "import os, sys; os.symlink(sys.argv[1], sys.argv[2])", str(db),
                   str(theirs / "r.db"))
    assert link.wait(timeout=60) == 0
    for args in (["runs"], ["export", "last", "--out", str(theirs / "runs.csv")]):
        done = cli_result(*args, "--db", str(theirs / "r.db"))
        assert done.returncode == ExitStatus.STORE, done.stderr
        assert done.stderr.splitlines()[0] == (
            f"iomatrix: {theirs / 'r.db'}: {theirs} is owned by {attacker.name} (uid "
            f"{attacker.uid}), not root: {DB_WHY}")
    assert sorted(p.name for p in theirs.iterdir()) == ["r.db"]


@pytest.mark.slow
def test_files_another_user_planted_beside_a_database_in_a_sticky_directory_are_refused(
        tmp_path: Path, arena: Path, attacker: User, attack: Attack) -> None:
    """``--db`` in a sticky directory (as ``/tmp/r.db``): root's name is free, but the user
    made ``r.db-wal`` and ``r.db-shm`` there first, symlinks to the secret."""
    attack("1. -wal/-shm planted beside a database in a sticky directory", "refused")
    secret = arena / "secret"
    before = digest(secret)
    sticky = arena / "sticky"
    plant(attacker, sticky, "", secret, arena / "unused")
    suite = write_suite(tmp_path, HOST, size="16MiB")
    done = run("run", str(suite), "--db", str(sticky / "r.db"), tmpdir=tmp_path)
    assert done.returncode == ExitStatus.STORE, done.stderr
    assert done.stderr.splitlines() == [
        f"iomatrix: {sticky / 'r.db-wal'} is owned by {attacker.name} (uid {attacker.uid}), not "
        f"root: {DB_WHY}", DB_HINT]
    assert digest(secret) == before and not (sticky / "r.db").exists()


@pytest.mark.slow
def test_doctor_with_a_tmpdir_another_user_owns_is_refused_while_they_swap_in_it(
        arena: Path, attacker: User, attack: Attack) -> None:
    """``doctor`` boots QEMU for its KVM probe and starts it for the channel check, writing
    their logs in a temporary directory of $TMPDIR: the user owns $TMPDIR (as under ``sudo
    -E``) and swaps every directory root makes there for one of theirs, with symlinks to the
    secret under the logs' names, in a loop."""
    attack("1. doctor with the user's $TMPDIR, swapping in it in a loop", "refused")
    secret = arena / "secret"
    before = digest(secret)
    theirs = their_directory(arena, attacker, "their-tmp")
    swapper = Swapper(attacker, theirs, secret, precreate=False, inside=True,
                      names=("serial.log", "qemu.stderr", "qemu.log"))
    try:
        done = subprocess.run([*IOMATRIX, "doctor", "--no-drift", "--kvm-timeout", "2"],
                              capture_output=True, text=True, timeout=600,
                              env={**os.environ, "TMPDIR": str(theirs)})
    finally:
        counts = swapper.stop()
        attack(attempts=counts)
    assert_tmpdir_refused(done, theirs, attacker)
    assert digest(secret) == before
    assert counts["rounds"] > 0 and list(theirs.iterdir()) == []


PLANTED_MEMO = '{"accel": "kvm", "usable": true, "reason": "planted", "seconds": 1}'


@pytest.mark.parametrize("whose", ["their cache directory", "their file in root's cache"])
def test_a_kvm_probe_result_another_user_wrote_is_not_believed(
        tmp_path: Path, arena: Path, attacker: User, appliance_kernel: Path, whose: str,
        monkeypatch: pytest.MonkeyPatch, attack: Attack) -> None:
    """A run remembers that KVM worked (per boot and appliance) in the cache: the user writes
    that memo, saying "usable", where root reads it (under ``sudo -E``, the user's
    XDG_CACHE_HOME; or a file of theirs left in root's cache). KVM hangs guests here: believing
    it would send every guest trial to a hang. The probe runs instead and finds KVM unusable."""
    from iomatrix.appliance.build import Appliance
    from iomatrix.appliance.kernel import default_cache_dir
    from iomatrix.appliance.probe import KvmProbe
    from iomatrix.drivers.guest import resolve_accel
    attack(f"1. KVM probe memo written by the user ({whose})", "refused")

    home = arena / ("theirs" if whose == "their cache directory" else "root-cache")
    cache = home / "iomatrix" / "kernel"
    cache.mkdir(parents=True)
    monkeypatch.setenv("XDG_CACHE_HOME", str(home))
    assert default_cache_dir() == cache
    appliance = Appliance(kernel=appliance_kernel, initrd=appliance_kernel, key="f" * 64,
                          kernel_release="", fio_version="", kernel_bytes=0, initrd_bytes=0,
                          build_seconds=0, cached=True)
    boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    memo = cache / f"kvm-probe-{boot_id}-{'f' * 16}.json"
    if whose == "their cache directory":
        subprocess.run(["chown", "-R", f"{attacker.uid}:{attacker.gid}", str(home)], check=True,
                       timeout=60)
        writer = as_user(attacker, "import sys; open(sys.argv[1], 'w').write(sys.argv[2])",
                         str(memo), PLANTED_MEMO)
        assert writer.wait(timeout=60) == 0
    else:
        memo.write_text(PLANTED_MEMO)
        os.chown(memo, attacker.uid, attacker.gid)
    assert KvmProbe.model_validate_json(memo.read_text()).usable     # a memo a run would take
    notes: list[str] = []
    assert resolve_accel("auto", appliance, notes.append) == "tcg"
    assert len(notes) == 1 and "KVM is not usable" in notes[0] and "planted" not in notes[0]


# -- 2. a lock planted where a killed run's was ---------------------------------------------------

HOLDER = r'''
import fcntl, os, sys, time
directory = sys.argv[1]
os.mkdir(directory, 0o700)
fd = os.open(os.path.join(directory, "owner.lock"), os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(600)
'''


def trials(db: Path) -> int:
    try:
        with Store(db, readonly=True) as store:
            return len(store.load_run(1).trials)
    except Exception:             # not stored yet
        return 0


@pytest.mark.slow
def test_a_planted_lock_keeps_no_dead_run_alive(tmp_path: Path, arena: Path,
                                                attacker: User, attack: Attack) -> None:
    """The run's scratch directory is in a sticky $TMPDIR (as /tmp); the run is killed, its
    scratch directory removed (as a cleaner of /tmp would), and the user makes one of that name
    and holds a flock on an owner.lock in it."""
    attack("2. lock planted where a killed run's was", "harmless")
    shared_tmp = arena / "sticky"
    suite = write_suite(tmp_path, HOST.replace('"500ms"', '"2s"'), size="16MiB")
    db = tmp_path / "r.db"
    proc = subprocess.Popen([*IOMATRIX, "run", str(suite), "--db", str(db)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(shared_tmp)})
    deadline = time.monotonic() + 120
    while trials(db) < 1:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.02)
    proc.kill()
    proc.communicate(timeout=30)
    [scratch] = shared_tmp.glob("iomatrix-run-*")
    shutil.rmtree(scratch)
    holder = as_user(attacker, HOLDER, str(scratch))
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        listing = cli_result("runs", "--db", str(db))
        assert "stopped (process gone; --resume)" in listing.stdout, listing.stdout
        dry = cli_result("clean", "--db", str(db), "--dry-run")
        assert "in use by a live iomatrix" not in dry.stdout, dry.stdout
        assert f"left scratch {scratch} " in dry.stdout and "owned by uid" in dry.stdout
        resumed = run("run", "--resume", "1", "--db", str(db), tmpdir=shared_tmp)
        assert resumed.returncode == 0, resumed.stderr
        assert "which is gone: this process takes it over" in resumed.stderr
        assert "2 trials ok" in resumed.stdout or "1 trials ok" in resumed.stdout
        assert (scratch / "owner.lock").exists()           # the user's: left alone
    finally:
        holder.kill()
        holder.communicate(timeout=30)
    assert not list((tmp_path / "target").glob("iomatrix-*"))


# -- 3. where --out writes ------------------------------------------------------------------------

FIO_JSON = Path(__file__).parents[1] / "fixtures" / "fio" / "3.33" / "randread.json"


@pytest.mark.parametrize("command", ["export", "report", "run"])
def test_out_through_another_users_directory_is_refused(tmp_path: Path, arena: Path,
                                                        attacker: User, command: str,
                                                        attack: Attack) -> None:
    """Root writes ``--out`` into a folder of the user's directory (``export`` a file in it,
    ``report`` the folder itself, as ``run --report`` does once the run ends); the user has
    made that folder a symlink to a directory of root's, where a file of the name root writes
    is the secret: root would replace it."""
    option = "--report" if command == "run" else "--out"
    attack(f"3. {command} {option} through the user's symlink", "refused")
    db = tmp_path / "r.db"
    assert cli_result("import", str(FIO_JSON), "--db", str(db)).returncode == 0
    roots = arena / "roots"                  # as /var/www/html: root's, with a file iomatrix names
    roots.mkdir()
    name = "out.csv" if command == "export" else "index.html"
    shutil.copyfile(arena / "secret", roots / name)
    before = digest(roots / name)
    theirs = their_directory(arena, attacker, "theirs")
    link = as_user(attacker, "import os, sys; os.symlink(sys.argv[1], sys.argv[2])", str(roots),
                   str(theirs / "folder"))
    assert link.wait(timeout=60) == 0
    out = theirs / "folder" / name if command == "export" else theirs / "folder"
    which = [str(write_suite(tmp_path, HOST, size="16MiB"))] if command == "run" else ["last"]
    done = cli_result(command, *which, "--db", str(db), option, str(out))
    assert done.returncode == ExitStatus.USAGE, done.stderr
    assert done.stderr.splitlines() == [
        f"iomatrix: {out}: {theirs} is owned by {attacker.name} (uid {attacker.uid}), not root: "
        "another user could redirect what iomatrix writes there",
        "iomatrix: hint: write it into a directory only root (or you) can write to, and whose "
        "parents are so too"]
    assert digest(roots / name) == before and sorted(os.listdir(roots)) == [name]
    assert not (tmp_path / "target").exists()              # a run is refused before it starts


# -- 4. a database that names directories ---------------------------------------------------------

def test_a_crafted_database_makes_clean_remove_nothing_it_names(
        tmp_path: Path, arena: Path, attacker: User, attack: Attack) -> None:
    """The user hands root a database of a dead process that names root's directories as what
    it made: a folder of reports with the name iomatrix gives its own, and an empty one. The
    user's file is refused as it is (the user could change it while root reads it); copied into
    root's own directory, as the refusal says, ``clean`` removes nothing it names."""
    attack("4. crafted database naming root's directories", "refused")
    data = arena / "data"
    reports = data / "iomatrix-reports"
    reports.mkdir(parents=True)
    (reports / "index.html").write_text("root's report")
    empty = arena / "empty"                  # as /run/sshd: empty, and needed
    empty.mkdir()
    crafted = arena / "crafted.db"
    gone = subprocess.Popen(["true"])
    gone.wait()
    with Store(crafted) as store:
        dead = store.register_process(this_process()._replace(pid=gone.pid), "")
        store.add_resource(dead, "workspace", str(reports), str(data))
        store.add_resource(dead, "scratch", str(data / "iomatrix-run-reports"), str(data))
        store.add_resource(dead, "parent", str(empty), str(arena))
    (data / "iomatrix-run-reports").mkdir()
    (data / "iomatrix-run-reports" / "keep.txt").write_text("root's")
    os.chown(crafted, attacker.uid, attacker.gid)
    refused = cli_result("clean", "--db", str(crafted))
    assert refused.returncode == ExitStatus.STORE and refused.stderr.splitlines()[0] == (
        f"iomatrix: {crafted} is owned by {attacker.name} (uid {attacker.uid}), not root: {DB_WHY}")
    copied = tmp_path / "crafted.db"
    shutil.copyfile(crafted, copied)
    cleaned = cli_result("clean", "--db", str(copied))
    assert cleaned.returncode == 0, cleaned.stderr
    assert cleaned.stdout.endswith("removed 0 (0.0 MiB), left 3\n"), cleaned.stdout
    assert cleaned.stdout.count("does not carry iomatrix's marker") == 3, cleaned.stdout
    assert (reports / "index.html").read_text() == "root's report"
    assert (data / "iomatrix-run-reports" / "keep.txt").exists() and empty.is_dir()


# -- 6. a killed run's children ---------------------------------------------------------------------

@pytest.mark.slow
def test_a_killed_runs_qemu_img_dies_with_it_and_clean_frees_its_file(
        tmp_path: Path, no_leftovers: None, attack: Attack) -> None:
    """qemu-img preallocating a large image when the run is killed: it gets SIGTERM from the
    kernel (setpriv --pdeathsig), and clean removes what it wrote, with no process left
    writing a deleted file."""
    attack("6. kill -9 of a run during qemu-img (preallocation=full)", "harmless")
    size = 4 << 30
    if shutil.disk_usage(tmp_path).free < size + (1 << 30):
        pytest.skip("needs 5 GiB free under the temporary directory")
    body = HOST.replace('mode = "host"', 'mode = "blocklayer"') + (
        '[matrix]\naio = "threads"\ncache = "none"\nformat = "raw"\npreallocation = "full"\n')
    suite = write_suite(tmp_path, body, size="4GiB")
    db = tmp_path / "r.db"
    proc = subprocess.Popen([*IOMATRIX, "run", str(suite), "--db", str(db)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    child = None
    while child is None:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "qemu-img was not seen running"
        child = next((pid for pid in _children(proc.pid) if _comm(pid) == "qemu-img"), None)
        time.sleep(0.01)
    proc.kill()
    proc.communicate(timeout=30)
    deadline = time.monotonic() + 30
    while _comm(child) == "qemu-img":          # gone (or a zombie's name no more)
        assert time.monotonic() < deadline, "qemu-img outlived the run it belonged to"
        time.sleep(0.05)
    cleaned = cli_result("clean", "--db", str(db))
    assert cleaned.returncode == 0, cleaned.stderr
    assert "removed images" in cleaned.stdout and cleaned.stdout.endswith(", left 0\n")
    assert not list((tmp_path / "target").glob("iomatrix-*"))
    assert _open_inside(tmp_path) == []


def test_every_command_a_run_starts_dies_with_it(tmp_path: Path, attack: Attack) -> None:
    """What ``core.proc.run`` starts (mkfs, losetup, mount, ioping, qemu-img...) gets SIGTERM
    when the process that ran it is killed; a stand-in that takes long, as none of those does
    for sure."""
    attack("6. kill -9 of a process running a command (mkfs, losetup, mount...)", "harmless")
    stand_in = tmp_path / "mkfs.stand-in"
    stand_in.write_text("#!/bin/sh\nexec sleep 600\n")
    stand_in.chmod(0o755)
    code = ("import sys; from iomatrix.core.proc import run; "
            f"run([{str(stand_in)!r}], timeout=900)")
    proc = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.monotonic() + 60
    while not (children := [c for c in _children(proc.pid) if _comm(c) == "sleep"]):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    proc.kill()
    proc.wait(timeout=30)
    deadline = time.monotonic() + 30
    while _comm(children[0]) == "sleep":
        assert time.monotonic() < deadline, "the command outlived the process that ran it"
        time.sleep(0.05)


def test_a_command_whose_run_died_before_the_guard_was_set_never_starts(
        tmp_path: Path, attack: Attack) -> None:
    """The parent-death signal is sent only if the parent dies after setpriv set it: a run
    killed while setpriv was starting (CI found an fio left so) would leave the command running
    unattended. Here setpriv's parent is a process other than the one that built the command,
    as it is when that one died first (its children go to init): the command must not run.
    The same command started by the process that built it does run."""
    attack("6. kill -9 of a run while a command it starts is still starting", "harmless")
    if not shutil.which("setpriv"):
        pytest.skip("needs util-linux's setpriv")
    ran = tmp_path / "ran"
    guarded = orphan_guard(["touch", str(ran)])
    # "; exit $?" keeps the shell from exec'ing the command: setpriv is the shell's child
    orphaned = subprocess.run(["/bin/sh", "-c", '"$@"; exit $?', "sh", *guarded], timeout=60)
    assert orphaned.returncode == 143 and not ran.exists()
    assert subprocess.run(guarded, timeout=60).returncode == 0 and ran.exists()


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2:].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _comm(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return "" if stat[stat.rindex(")") + 2] == "Z" else stat[stat.index("(") + 1:stat.rindex(")")]


def _open_inside(directory: Path) -> list[str]:
    """Files under ``directory`` (deleted ones too) that some process holds open."""
    inside = str(directory) + "/"
    found = []
    for entry in Path("/proc").glob("[0-9]*/fd/*"):
        try:
            link = os.readlink(entry)
        except OSError:
            continue
        if link.startswith(inside):
            found.append(f"{entry}: {link}")
    return found
