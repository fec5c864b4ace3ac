"""Issue 31, Ceph: an unprivileged user's ceph.conf, keyring and database against root's runs and
``clean``, on a real single-node cluster (``tests/ceph.py``, one for the module).

F3  a suite's ``[target] rbd conf`` naming the user's ceph.conf, whose ``log_file`` makes librados
    create a file wherever its author likes: refused in one line (rule 1); a conf that passes
    rule 1 is read for its monitors alone, so its ``log_file`` is never created.
F8  a keyring the user owns, mode 0666: refused in one line; root's own, readable by every user,
    too.
F4  a crafted database whose ``resources`` row (kind ``rbd-image``) names the user's conf or
    keyring: ``clean --dry-run`` never runs rbd with them and says in one line what it left.
4   (the review's) the user's suite naming monitors with root's keyring, or none where root
    keeps librados' default: refused in one line (their monitors would get root's key); with
    monitors from root's own ceph.conf, harmless; a shared store's row pairing monitors with
    root's keyring: ``clean`` leaves it.

Each canary is a path in a directory only root may write to: if it exists, root made it."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from iomatrix.cli.status import ExitStatus
from iomatrix.core.owner import this_process
from iomatrix.store import Store
from iomatrix.store.location import PgUrl
from iomatrix.targets.rbd import KIND
from tests import ceph
from tests.conftest import ATTACKS, Attack, User, as_user, cli_result
from tests.needs import needs
from tests.scenarios.test_rbd import rbd_suite

pytestmark = [pytest.mark.slow, ATTACKS, needs("ceph")]

RULE_1 = "not root: another user could choose what librados reads there"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ceph.Cluster]:
    made = ceph.Cluster(tmp_path_factory.mktemp("ceph"))
    try:
        yield made.start()
    finally:
        made.stop()


@pytest.fixture
def arena() -> Iterator[Path]:
    """A directory of root's (0755) that every user reaches, holding ``sticky`` (1777, as /tmp)
    where the attacker writes, and ``root-only`` (0700) where the canaries would go."""
    area = Path(tempfile.mkdtemp(prefix="iomatrix-ceph-arena-", dir="/tmp"))
    try:
        area.chmod(0o755)
        (area / "sticky").mkdir(mode=0o1777)
        (area / "sticky").chmod(0o1777)
        (area / "root-only").mkdir(mode=0o700)
        yield area
    finally:
        shutil.rmtree(area, ignore_errors=True)


def plant(user: User, path: Path, text: str, mode: int = 0o644) -> Path:
    """``text`` written as ``user`` into the new file ``path`` with ``mode``."""
    proc = as_user(user, "import os, sys\n"
                         "fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)\n"
                         "os.write(fd, sys.argv[2].encode()); os.fchmod(fd, int(sys.argv[3]))",
                   str(path), text, str(mode))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert path.stat().st_uid == user.uid
    return path


def evil_conf(cluster: ceph.Cluster, canary: Path) -> str:
    """A ceph.conf naming the cluster's monitor, with what librados would act on as root."""
    return (f"[global]\nmon host = v2:{cluster.monitor}\nlog_file = {canary}\n"
            f"admin_socket = {canary}.asok\n[client]\nlog file = {canary}\n")


def without(suite: Path, key: str) -> Path:
    """``suite`` without ``key`` in its rbd table."""
    text = suite.read_text()
    start = text.index(f"{key} = ")
    suite.write_text(text[:start] + text[text.index(", ", start) + 2:])
    return suite


def refusal(done: subprocess.CompletedProcess[str]) -> str:
    """The one line of a refusal (its hint aside)."""
    lines = [line for line in done.stderr.splitlines() if not line.startswith("iomatrix: hint:")]
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_f3_a_users_ceph_conf_is_refused(tmp_path: Path, arena: Path, cluster: ceph.Cluster,
                                         attacker: User, attack: Attack,
                                         no_leftovers: None) -> None:
    """F3: ``conf`` names the user's ceph.conf (in a sticky directory, as /tmp) whose
    ``log_file`` is a root-only path: the run is refused in one line before anything starts,
    and librados never creates the file."""
    attack("F3 [target] rbd conf: the user's ceph.conf with log_file (root creates the file)",
           "refused")
    canary = arena / "root-only" / "ld.so.preload"
    conf = plant(attacker, arena / "sticky" / "ceph.conf", evil_conf(cluster, canary))
    suite = without(rbd_suite(tmp_path, cluster, caches='["none"]', conf=f'"{conf}"'),
                    "monitors")
    db = tmp_path / "r.db"
    done = cli_result("run", str(suite), "--db", str(db), cwd=tmp_path)
    assert not canary.exists() and not Path(f"{canary}.asok").exists()
    assert done.returncode == ExitStatus.SUITE_INVALID, done.stdout + done.stderr
    assert refusal(done) == (f"iomatrix: [target] rbd conf: {conf} is owned by {attacker.name} "
                             f"(uid {attacker.uid}), {RULE_1}")
    assert not db.exists() or b"rbd-test" not in db.read_bytes()
    assert [i for i in cluster.images() if i.startswith("iomatrix-")] == []


def test_f3_a_conf_root_may_use_is_read_for_its_monitors_alone(
        tmp_path: Path, arena: Path, cluster: ceph.Cluster, attack: Attack,
        no_leftovers: None) -> None:
    """F3: a ceph.conf that passes rule 1 (root's, in root's directory) but sets ``log_file``
    and ``admin_socket``: the run measures the pool through rbd, fio's rbd engine and QEMU,
    and none of them ever made either file: only its monitors were taken from it."""
    attack("F3 [target] rbd conf: a ceph.conf root may use, with log_file and admin_socket",
           "harmless")
    canary = arena / "root-only" / "ld.so.preload"
    conf = tmp_path / "ceph.conf"
    conf.write_text(evil_conf(cluster, canary))
    suite = without(rbd_suite(tmp_path, cluster, caches='["none"]', conf=f'"{conf}"',
                              runtime="1s"), "monitors")
    done = cli_result("run", str(suite), "--db", str(tmp_path / "r.db"), cwd=tmp_path)
    assert not canary.exists() and not Path(f"{canary}.asok").exists()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 trials ok" in done.stdout and f"the monitors in {conf}" in done.stderr
    assert [i for i in cluster.images() if i.startswith("iomatrix-")] == []


@pytest.mark.parametrize("whose", ["the user's, mode 0666", "root's, mode 0644"])
def test_f8_a_keyring_others_may_write_or_read_is_refused(
        tmp_path: Path, arena: Path, cluster: ceph.Cluster, attacker: User, attack: Attack,
        whose: str, no_leftovers: None) -> None:
    """F8: ``keyring`` names a file the user owns and every user may write (mode 0666): refused
    in one line, as a CHAP file is (``core.trust.private_file``); so is root's own keyring that
    every user may read."""
    attack(f"F8 [target] rbd keyring: {whose}", "refused")
    text = cluster.keyring.read_text()
    if whose.startswith("the user's"):
        keyring = plant(attacker, arena / "sticky" / "client.keyring", text, 0o666)
        why = f"is owned by {attacker.name} (uid {attacker.uid}), {RULE_1}"
    else:
        keyring = tmp_path / "client.keyring"
        keyring.write_text(text)
        keyring.chmod(0o644)
        why = "can be read or written by other users (mode 0644), and it holds a key"
    suite = rbd_suite(tmp_path, cluster, caches='["none"]', keyring=f'"{keyring}"')
    db = tmp_path / "r.db"
    done = cli_result("run", str(suite), "--db", str(db), cwd=tmp_path)
    assert done.returncode == ExitStatus.SUITE_INVALID, done.stdout + done.stderr
    assert refusal(done) == f"iomatrix: [target] rbd keyring: {keyring} {why}"
    assert not db.exists() or b"rbd-test" not in db.read_bytes()


def test_f4_a_crafted_database_never_hands_its_conf_or_keyring_to_rbd(
        tmp_path: Path, arena: Path, cluster: ceph.Cluster, attacker: User,
        attack: Attack) -> None:
    """F4: the user hands root a database of a dead run whose ``rbd-image`` rows name the
    user's ceph.conf (with ``log_file``) and the user's 0666 keyring, beside real iomatrix-named
    images in the pool. Copied into root's directory (as ``clean`` asks of a database another
    user owns), ``clean --dry-run`` leaves both, each in one line, and rbd never read the conf:
    the canary does not exist."""
    attack("F4 resources.within of an rbd-image naming the user's ceph.conf or keyring "
           "(clean --dry-run)", "refused")
    canary = arena / "root-only" / "ld.so.preload"
    conf = plant(attacker, arena / "sticky" / "ceph.conf", evil_conf(cluster, canary))
    keyring = plant(attacker, arena / "sticky" / "client.keyring",
                    cluster.keyring.read_text(), 0o666)
    names = [f"iomatrix-1-f4f4f4-{i}" for i in range(2)]
    for name in names:
        subprocess.run(["rbd", "-c", str(cluster.conf), "-k", str(cluster.admin_keyring),
                        "create", "--size", "4M", f"{ceph.POOL}/{name}"], check=True,
                       timeout=60)
    rows = [{"pool": ceph.POOL, "conf": str(conf), "client": ceph.CLIENT,
             "keyring": str(cluster.keyring), "connect_timeout": 5},
            {"pool": ceph.POOL, "monitors": [cluster.monitor], "client": ceph.CLIENT,
             "keyring": str(keyring), "connect_timeout": 5}]
    crafted = tmp_path / "crafted.db"
    gone = subprocess.Popen(["true"])
    gone.wait()
    with Store(crafted) as store:
        dead = store.register_process(this_process()._replace(pid=gone.pid), "")
        for name, row in zip(names, rows):
            store.add_resource(dead, KIND, f"{ceph.POOL}/{name}", json.dumps(row))
    os.chown(crafted, attacker.uid, attacker.gid)
    copied = tmp_path / "copied.db"
    shutil.copyfile(crafted, copied)
    try:
        done = cli_result("clean", "--db", str(copied), "--dry-run", cwd=tmp_path)
        assert not canary.exists() and not Path(f"{canary}.asok").exists()
        assert done.returncode == 0, done.stdout + done.stderr
        said = " ".join(done.stdout.split())          # one line each, wrapped at 200 columns
        assert said.count("left RBD image") == 2, done.stdout
        for name, what, path in ((names[0], "conf", conf), (names[1], "keyring", keyring)):
            assert (f"left RBD image {ceph.POOL}/{name} (no run, pid {gone.pid}): never handed "
                    f"to rbd: resources.within {what}: {path} is owned by {attacker.name} (uid "
                    f"{attacker.uid}), {RULE_1}") in said, done.stdout
        assert said.endswith("leave 2; nothing removed (--dry-run)"), done.stdout
        assert set(names) <= set(cluster.images())
    finally:
        for name in names:
            subprocess.run(["rbd", "-c", str(cluster.conf), "-k", str(cluster.admin_keyring),
                            "rm", "--no-progress", f"{ceph.POOL}/{name}"], timeout=60,
                           capture_output=True)


def _not_readable(key: str, keyring: Path, who: str, where: str, monitors: str) -> str:
    return (f"iomatrix: {key}: {keyring} is not readable by {who}, who could have written "
            f"{where} and chose the monitors {monitors}: the key would prove itself there")


@contextlib.contextmanager
def default_keyring(cluster: ceph.Cluster) -> Iterator[str]:
    """A cephx client of its own (allowed the test pool), whose keyring root keeps where
    librados looks by default, ``/etc/ceph/ceph.client.NAME.keyring`` (mode 0600); yields
    the client's name. Both removed after."""
    name = f"iomx-default-{secrets.token_hex(3)}"
    path = Path("/etc/ceph") / f"ceph.client.{name}.keyring"
    text = cluster.ceph("auth", "get-or-create", f"client.{name}", "mon", "profile rbd", "osd",
                        f"profile rbd pool={ceph.POOL}")
    Path("/etc/ceph").mkdir(mode=0o755, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, text.encode())
        os.close(fd)
        yield name
    finally:
        path.unlink(missing_ok=True)
        cluster.ceph("auth", "del", f"client.{name}")


@pytest.mark.parametrize("which", ["root's keyring, named", "librados' default keyring"])
def test_f4_their_monitors_never_get_roots_key(
        tmp_path: Path, arena: Path, cluster: ceph.Cluster, attacker: User, attack: Attack,
        which: str, no_leftovers: None) -> None:
    """4: the attacker's suite names monitors (the cluster's, standing for their own) with
    root's 0600 keyring, or with no keyring where root keeps one in librados' default place:
    refused in one line naming the keyring, before anything reaches the monitors (root's key
    would have proved itself to them; librados' default search was never checked at all).
    Root's own suite without a keyring still runs: iomatrix's ceph.conf names the default it
    found (librados never searches)."""
    attack(f"4 [target] rbd monitors of another user's suite, with {which}", "refused")
    with contextlib.ExitStack() as stack:
        if which.startswith("root's"):
            client, keyring = ceph.CLIENT, cluster.keyring
            suite = rbd_suite(tmp_path, cluster, caches='["none"]', runtime="1s")
            key = "[target] rbd keyring"
        else:
            client = stack.enter_context(default_keyring(cluster))
            keyring = Path(f"/etc/ceph/ceph.client.{client}.keyring")
            suite = without(rbd_suite(tmp_path, cluster, caches='["none"]', runtime="1s",
                                      client=f'"{client}"'), "keyring")
            key = f"[target] rbd keyring (none named: librados' default {keyring})"
            done = cli_result("run", str(suite), "--db", str(tmp_path / "own.db"), cwd=tmp_path)
            assert done.returncode == 0 and "2 trials ok" in done.stdout, done.stderr
        theirs = plant(attacker, arena / "sticky" / "rbd.toml", suite.read_text())
        db = tmp_path / "r.db"
        done = cli_result("run", str(theirs), "--db", str(db), cwd=tmp_path)
        assert done.returncode == ExitStatus.SUITE_INVALID, done.stdout + done.stderr
        assert refusal(done) == _not_readable(key, keyring, f"{attacker.name} (uid "
                                              f"{attacker.uid})", f"suite {theirs}",
                                              cluster.monitor)
        assert not db.exists() or b"rbd-test" not in db.read_bytes()
    assert [i for i in cluster.images() if i.startswith("iomatrix-")] == []


def test_f4_monitors_from_a_conf_root_may_use_get_roots_key(
        tmp_path: Path, arena: Path, cluster: ceph.Cluster, attacker: User, attack: Attack,
        no_leftovers: None) -> None:
    """4: the attacker's suite takes its monitors from a ceph.conf only root can write (the
    cluster's), with root's keyring: the key goes only where root's own file says, so the run
    measures the pool."""
    attack("4 [target] rbd conf of root's with root's keyring, in another user's suite",
           "harmless")
    suite = without(rbd_suite(tmp_path, cluster, caches='["none"]', runtime="1s",
                              conf=f'"{cluster.conf}"'), "monitors")
    theirs = plant(attacker, arena / "sticky" / "rbd.toml", suite.read_text())
    done = cli_result("run", str(theirs), "--db", str(tmp_path / "r.db"), cwd=tmp_path)
    assert done.returncode == 0 and "2 trials ok" in done.stdout, done.stdout + done.stderr
    assert [i for i in cluster.images() if i.startswith("iomatrix-")] == []


def test_f4_a_shared_stores_row_never_pairs_its_monitors_with_roots_key(
        tmp_path: Path, cluster: ceph.Cluster, attack: Attack,
        request: pytest.FixtureRequest) -> None:
    """4: a row of the shared PostgreSQL store (which anyone with the role writes) records an
    image of a dead run of this host on monitors it names, with root's keyring: ``clean``
    leaves it in one line and never hands the keyring to rbd (it used to reach the monitors
    with root's key); the image stays."""
    attack("4 resources.within of the shared store pairing its monitors with root's keyring "
           "(clean)", "refused")
    url = request.getfixturevalue("pg_url")
    name = "iomatrix-1-f4f4f5-0"
    subprocess.run(["rbd", "-c", str(cluster.conf), "-k", str(cluster.admin_keyring),
                    "create", "--size", "4M", f"{ceph.POOL}/{name}"], check=True, timeout=60)
    try:
        gone = subprocess.Popen(["true"])
        gone.wait()
        with Store(url) as store:
            dead = store.register_process(this_process()._replace(pid=gone.pid), "")
            store.add_resource(dead, KIND, f"{ceph.POOL}/{name}", json.dumps(
                {"pool": ceph.POOL, "monitors": [cluster.monitor], "client": ceph.CLIENT,
                 "keyring": str(cluster.keyring), "connect_timeout": 5}))
        for dry in (["--dry-run"], []):
            done = cli_result("clean", "--db", url, *dry, cwd=tmp_path)
            assert done.returncode == 0, done.stdout + done.stderr
            said = " ".join(done.stdout.split())
            assert (f"left RBD image {ceph.POOL}/{name} (no run, pid {gone.pid}): never handed "
                    "to rbd: " + _not_readable("resources.within keyring", cluster.keyring,
                                               "every user", "the shared store "
                                               f"{PgUrl(url).shown}", cluster.monitor)
                    .removeprefix("iomatrix: ")) in said, said
        assert name in cluster.images()
    finally:
        subprocess.run(["rbd", "-c", str(cluster.conf), "-k", str(cluster.admin_keyring),
                        "rm", "--no-progress", f"{ceph.POOL}/{name}"], timeout=60,
                       capture_output=True)
