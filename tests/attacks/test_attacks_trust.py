"""Issue 31, the security review's second round: rule 1's own holes (``iomatrix.core.trust``,
``iomatrix.core.dirs``), tried as the unprivileged ``attacker`` against root runs of iomatrix.

- 1: a symlink the user planted in a sticky directory every user may write to (as /tmp, where
  the kernel follows it when fs.protected_symlinks is 0) is never followed: an inventory reached
  through it is anyone's (its command refused), an identity reached through it refused;
- 3: /dev/zero, a FIFO, or a sparse file of 8 GiB as the suite or the inventory: one line at
  once, never a hang nor a MemoryError;
- 5: a root directory whose POSIX ACL lets the user write (its mode then shows 0775 root:root):
  what lies in it is no longer root's own;
- 10: a path through /proc (``/proc/self/root/...``), whose links the kernel follows where
  their text does not say: refused;
- 11: a file whose ACL denies the user what its mode bits allow is not one they can read; a
  suite in a directory a group may write to is anyone's;
- 12: a file the user removes and makes again while root judges who wrote it: never a
  traceback.
"""

from __future__ import annotations

import os
import resource
import stat
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from iomatrix.cli.status import ExitStatus
from iomatrix.core.trust import ANYONE, Author, author_of
from tests.conftest import ATTACKS, REPO, Attack, User, as_user
from tests.attacks.test_adversary import arena, their_directory  # noqa: F401 (a fixture)
from tests.attacks.test_attacks_guest import _refused_before_anything, _their_suite, _unreadable
from tests.attacks.test_attacks_guest import roots, theirs  # noqa: F401 (fixtures)
from tests.attacks.test_attacks_nodes import _suite_text, _write_as
from tests.attacks.test_untrusted_inputs import one_line

pytestmark = ATTACKS

ROOTS_INVENTORY = '[[node]]\nhost = "n1"\ncommand = "/bin/true"\n'
"""Root's own inventory: it may name the nodes' command."""
UNTRUSTED_COMMAND = ("(another user could write it): node n1: command '/bin/true': it is the "
                     "program every node runs; only your own inventory may name it")
SYMLINK = "import os, sys\nos.symlink(sys.argv[1], sys.argv[2])\n"


def _limited() -> None:
    """At most 4 GiB of address space: reading /dev/zero whole fails at once, not the host."""
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


def _iomatrix(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``iomatrix ARGS`` run by root in a process of its own, within 4 GiB and ``timeout``
    seconds (a FIFO waited on fails the test)."""
    return subprocess.run([sys.executable, "-m", "iomatrix", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=REPO, preexec_fn=_limited)


def _symlink_as(user: User, target: Path, link: Path) -> Path:
    done = as_user(user, SYMLINK, str(target), str(link))
    _, err = done.communicate(timeout=60)
    assert done.returncode == 0, err
    return link


def _set_acl(path: Path, uid: int, perm: int) -> None:
    """Give ``path`` the POSIX access ACL ``setfacl -m u:UID:PERM`` would (the mask the union
    of the group class), written as the kernel's ``system.posix_acl_access`` attribute."""
    mode = stat.S_IMODE(os.stat(path).st_mode)
    group = mode >> 3 & 7

    def entry(tag: int, bits: int, who: int = 0xFFFFFFFF) -> bytes:
        return struct.pack("<HHI", tag, bits, who)
    os.setxattr(path, "system.posix_acl_access", struct.pack("<I", 2) + entry(1, mode >> 6 & 7)
                + entry(2, perm, uid) + entry(4, group) + entry(0x10, group | perm)
                + entry(0x20, mode & 7))


def _roots_files(tmp_path: Path) -> tuple[Path, Path]:
    """Root's own inventory naming the nodes' command, and a key: files of root's only."""
    inventory = tmp_path / "nodes.toml"
    inventory.write_text(ROOTS_INVENTORY)
    key = tmp_path / "id_ed25519"
    key.write_text("root's key\n")
    key.chmod(0o600)
    return inventory, key


def _inventory_run(tmp_path: Path, inventory: Path, way: str) -> subprocess.CompletedProcess[str]:
    """``iomatrix run --plan`` of root's suite, its nodes the ``inventory`` given ``way``."""
    suite = tmp_path / "s.toml"
    if way == "--nodes":
        suite.write_text(_suite_text(tmp_path / "t"))
        return _iomatrix("run", str(suite), "--nodes", str(inventory), "--plan")
    suite.write_text(_suite_text(tmp_path / "t", f'inventory = "{inventory}"\n'))
    return _iomatrix("run", str(suite), "--plan")


def _identity_refused(tmp_path: Path, identity: Path) -> str:
    """The line ``iomatrix run --plan`` refuses root's suite in, its node's identity
    ``identity``."""
    suite = tmp_path / "s.toml"
    suite.write_text(_suite_text(tmp_path / "t", f'hosts = ["n1"]\nidentity = "{identity}"\n'))
    return one_line(_iomatrix("run", str(suite), "--plan"), ExitStatus.SUITE_INVALID)


# -- 1. a symlink another user planted in a sticky directory -----------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("way", ["--nodes", "the suite's [nodes] inventory"])
def test_an_inventory_through_a_symlink_another_user_planted_is_anyones(
        arena: Path, tmp_path: Path, attacker: User, attack: Attack, way: str) -> None:
    """The user's symlink in a sticky shared directory leads to root's own inventory (as it
    would for an instant before they point it at their own): what is read through it is not
    root's to trust, so the command it names is refused in one line."""
    attack(f"1: an inventory ({way}) through a symlink another user planted in /tmp", "refused")
    inventory, _ = _roots_files(tmp_path)
    link = _symlink_as(attacker, inventory, arena / "sticky" / "nodes.toml")
    done = _inventory_run(tmp_path, link, way)
    assert one_line(done, ExitStatus.SUITE_INVALID) == (
        f"iomatrix: inventory {link} {UNTRUSTED_COMMAND}")


@pytest.mark.slow
def test_an_identity_through_a_symlink_another_user_planted_is_refused(
        arena: Path, tmp_path: Path, attacker: User, attack: Attack) -> None:
    """Root's suite names a key in /tmp that the user made first, a symlink to root's key:
    refused before ssh starts (the user could point it at their own key once it is judged)."""
    attack("1: [nodes] identity a symlink another user planted in /tmp", "refused")
    _, key = _roots_files(tmp_path)
    sticky = arena / "sticky"
    link = _symlink_as(attacker, key, sticky / "id")
    assert _identity_refused(tmp_path, link) == (
        f"iomatrix: [nodes] identity (node n1): {link} is a symlink that {attacker.name} (uid "
        f"{attacker.uid}) made in {sticky}, which every user may write to: another user could "
        "choose what ssh reads there")


# -- 3. what is no regular file, or too large, as the suite or the inventory --------------------

def _odd_file(kind: str, theirs: Path, attacker: User, name: str) -> Path:
    """/dev/zero, or the user's FIFO or sparse 8 GiB file named ``name`` in ``theirs``."""
    if kind == "/dev/zero":
        return Path("/dev/zero")
    path = theirs / name
    code = ("import os, sys\nos.mkfifo(sys.argv[1])\n" if kind == "a FIFO" else
            "import os, sys\nos.truncate(os.open(sys.argv[1], os.O_CREAT | os.O_WRONLY, 0o644), "
            "8 << 30)\n")
    done = as_user(attacker, code, str(path))
    _, err = done.communicate(timeout=60)
    assert done.returncode == 0, err
    return path


WHY = {"/dev/zero": "a character device, not a regular file",
       "a FIFO": "a FIFO (named pipe), not a regular file"}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["/dev/zero", "a FIFO", "a sparse 8 GiB file"])
def test_a_suite_that_is_no_regular_file_or_too_large_is_one_line(
        arena: Path, attacker: User, attack: Attack, kind: str) -> None:
    attack(f"3: {kind} as the suite", "refused")
    path = _odd_file(kind, their_directory(arena, attacker, "theirs"), attacker, "s.toml")
    done = _iomatrix("run", str(path), "--plan")
    why = WHY.get(kind, f"larger than {16 << 20} bytes")
    assert one_line(done, ExitStatus.SUITE_INVALID) == f"iomatrix: {path}: cannot read: {why}"


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "way"), [
    (kind, way) for kind in ("/dev/zero", "a FIFO", "a sparse 8 GiB file")
    for way in ("--nodes", "the suite's [nodes] inventory")
    if (kind, way) != ("/dev/zero", "--nodes")])      # a host list there: no .toml, no file
def test_an_inventory_that_is_no_regular_file_or_too_large_is_one_line(
        arena: Path, tmp_path: Path, attacker: User, attack: Attack, kind: str,
        way: str) -> None:
    attack(f"3: {kind} as the inventory ({way})", "refused")
    path = _odd_file(kind, their_directory(arena, attacker, "theirs"), attacker, "nodes.toml")
    done = _inventory_run(tmp_path, path, way)
    why = WHY.get(kind, f"larger than {1 << 20} bytes")
    assert one_line(done, ExitStatus.NODES) == f"iomatrix: cannot read the inventory {path}: {why}"


# -- 5. a directory whose ACL lets another user write --------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("key", ["inventory", "identity"])
def test_a_directory_whose_acl_lets_another_user_write_is_not_roots(
        arena: Path, tmp_path: Path, attacker: User, attack: Attack, key: str) -> None:
    """Root's directory (0755) with an ACL entry giving the user rwx shows as 0775 root:root:
    the user puts a symlink to root's own file there. An inventory read there is anyone's (its
    command refused); an identity there is refused, naming the ACL."""
    attack(f"5: {key} in a root directory whose ACL lets another user write", "refused")
    shared = arena / "acl"
    shared.mkdir(mode=0o755)
    _set_acl(shared, attacker.uid, 7)
    assert stat.S_IMODE(os.stat(shared).st_mode) == 0o775
    inventory, own_key = _roots_files(tmp_path)
    if key == "inventory":
        link = _symlink_as(attacker, inventory, shared / "nodes.toml")
        done = _inventory_run(tmp_path, link, "--nodes")
        assert one_line(done, ExitStatus.SUITE_INVALID) == (
            f"iomatrix: inventory {link} {UNTRUSTED_COMMAND}")
        return
    link = _symlink_as(attacker, own_key, shared / "id")
    assert _identity_refused(tmp_path, link) == (
        f"iomatrix: [nodes] identity (node n1): {shared} has an ACL that may let other users "
        "write (mode 0775): another user could choose what ssh reads there")


# -- 10. a path through /proc ---------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("key", ["identity", "known_hosts"])
def test_a_path_through_proc_is_refused(arena: Path, tmp_path: Path, attacker: User,
                                        attack: Attack, key: str) -> None:
    """The user's suite names root's file through /proc/self/root (the kernel follows that
    link to the root of whichever process opens it, not to the text it reads as)."""
    attack(f"10: [nodes] {key} through /proc/self/root", "refused")
    _, own_key = _roots_files(tmp_path)
    path = f"/proc/self/root{own_key}"
    theirs = their_directory(arena, attacker, "theirs")
    suite = _write_as(attacker, theirs / "s.toml",
                      _suite_text(tmp_path / "t", f'hosts = ["n1"]\n{key} = "{path}"\n'))
    done = _iomatrix("run", str(suite), "--plan")
    assert one_line(done, ExitStatus.SUITE_INVALID) == (
        f"iomatrix: [nodes] {key} (node n1): /proc is in procfs, whose links lead where the "
        "kernel says, not where their text does: another user could choose what ssh reads there")


# -- 11. ACLs and groups in the author's reading --------------------------------------------------

@pytest.mark.slow
def test_a_file_whose_acl_denies_the_author_is_not_theirs_to_read(
        roots: Path, theirs: Path, tmp_path: Path, attacker: User, attack: Attack) -> None:
    """Root's kernel is 0644 but its ACL denies the user (``u:attacker:---``): their suite may
    not have the guest read it. --plan warns, the run is refused before anything starts."""
    attack("11: [guest] kernel whose ACL denies the suite's author", "refused")
    kernel = roots / "vmlinuz"
    _set_acl(kernel, attacker.uid, 0)
    guest = {"image": roots / "disk.raw", "kernel": kernel, "initrd": roots / "initrd"}
    suite = _their_suite(theirs, tmp_path, attacker, guest)
    plan = _iomatrix("run", str(suite), "--plan")
    assert plan.returncode == 0 and f"warning: [guest] kernel: {kernel} is not readable" \
        in plan.stdout, (plan.stdout, plan.stderr)
    db = tmp_path / "r.db"
    done = _iomatrix("run", str(suite), "--db", str(db), timeout=300)
    line = _refused_before_anything(done, ExitStatus.SUITE_INVALID, tmp_path, db)
    assert line == _unreadable("kernel", kernel, attacker, suite)


@pytest.mark.slow
def test_a_suite_in_a_directory_a_group_may_write_is_anyones(
        roots: Path, theirs: Path, tmp_path: Path, attacker: User, attack: Attack) -> None:
    """The suite lies in a directory its group may write to (root's, 0775, the user's group):
    anyone in the group could have written it, so a kernel that only the user (by that group)
    may read is refused as not readable by every user."""
    attack("11: a suite in a group-writable directory, naming a file its owner's group reads",
           "refused")
    kernel = roots / "vmlinuz"
    os.chown(kernel, 0, attacker.gid)
    kernel.chmod(0o640)
    shared = roots / "group"
    shared.mkdir()
    os.chown(shared, 0, attacker.gid)
    shared.chmod(0o775)
    guest = {"image": roots / "disk.raw", "kernel": kernel, "initrd": roots / "initrd"}
    suite = _their_suite(theirs, tmp_path, attacker, guest)
    moved = shared / suite.name
    suite.rename(moved)
    plan = _iomatrix("run", str(moved), "--plan")
    assert plan.returncode == 0 and f"warning: [guest] kernel: {kernel} is not readable by " \
        "every user" in plan.stdout, (plan.stdout, plan.stderr)


# -- 12. a file removed while it is judged --------------------------------------------------------

FLICKER = """
import os, sys, time
path, until = sys.argv[1], time.monotonic() + float(sys.argv[2])
while time.monotonic() < until:
    os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))
    os.unlink(path)
"""


@pytest.mark.slow
def test_a_file_removed_while_it_is_judged_is_anyones(
        arena: Path, attacker: User, attack: Attack) -> None:
    """The user makes and removes a file in a sticky directory in a loop while root asks who
    wrote it (as for a database): the answer is the user or anyone, never a traceback."""
    attack("12: a file made and removed in a loop while root judges its author", "harmless")
    path = arena / "sticky" / "r.db"
    flicker = as_user(attacker, FLICKER, str(path), "20")
    answers: set[int | None] = set()
    try:
        time.sleep(0.5)
        for _ in range(5000):
            author = author_of(path)
            assert isinstance(author, Author)
            answers.add(author.uid)
    finally:
        flicker.kill()
        flicker.communicate(timeout=60)
    assert answers <= {attacker.uid, ANYONE}, answers
