"""Issue 31, a cluster run of another user's suite (the review's findings 2, 4, 7, 8 and 9),
tried for real as an unprivileged user (``attacker``) against root runs of iomatrix reaching
real sshd nodes (tests/sshnodes.py):

- 2: a suite another user wrote may destroy no device and name no [guest] file they cannot read
  on a cluster either: refused on the controller in one line before any node is asked (no SSH
  login) and before a run is stored; and the run it makes stays theirs when root resumes it
  (every request a node gets says ``"trusted": false``, then as at first);
- 4: their [target] iscsi portal (their own listener) with root's CHAP file: refused before
  anything logs in to the portal (the controller's own preflight probed it, with root's CHAP);
- 7: a node whose preflight answer is no facts (``[]``, host metadata the store refuses): one
  line naming the node, no traceback, nothing stored;
- 8: an ``sslpassword`` in the PostgreSQL URL never reaches a node;
- 9: ssh lends a node nothing of root's (agent, LocalCommand) whatever root's ssh_config says,
  and a suite never chooses the account root's key logs in to.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from iomatrix.cli.status import ExitStatus
from tests.conftest import ATTACKS, SYSTEM_PYTHON, Attack, User
from tests.sshnodes import SshCluster, ssh_nodes  # noqa: F401 (a fixture)
from tests.attacks.test_adversary import arena, their_directory  # noqa: F401 (a fixture)
from tests.attacks.test_attacks_nodes import (HEARING, HOST, IOMATRIX, _iomatrix, _logins, _node_keys,
                                      _suite_text, _write_as)
from tests.attacks.test_untrusted_inputs import one_line

pytestmark = [pytest.mark.slow, ATTACKS]


def _inventory(cluster: SshCluster, tmp_path: Path, command: str = IOMATRIX,
               extra: str = 'ssh_config = "none"\n') -> Path:
    """Root's own inventory of the cluster's nodes (in root's directory), running ``command``."""
    inventory = tmp_path / "nodes.toml"
    inventory.write_text(cluster.inventory(extra=f'{extra}command = "{command}"\n'))
    return inventory


def _hearing(tmp_path: Path) -> tuple[Path, Path]:
    """Root's wrapper of the node's iomatrix that keeps each request it gets, and that file."""
    heard = tmp_path / "heard"
    wrapper = tmp_path / "hearing-iomatrix"
    wrapper.write_text(HEARING.format(python=sys.executable, heard=heard, iomatrix=IOMATRIX))
    wrapper.chmod(0o755)
    return wrapper, heard


@pytest.mark.parametrize("asks", ["allow_destroy of a device", "a root-only [guest] image"])
def test_f2_a_cluster_run_refuses_what_the_suites_author_may_not_ask_before_any_login(
        arena: Path, ssh_nodes, tmp_path: Path, attacker: User, attack: Attack,  # noqa: F811
        loop_device: Path, asks: str) -> None:
    """2: the attacker's suite asks a cluster run to destroy a device, or to boot a guest from
    a root-only image (root's ``secret``): the controller refuses it in one line, as a run of
    this host does, before any node is asked (no SSH login) and before a run is stored; the
    nodes used to be the only ones to refuse, after the controller's own preflight."""
    attack(f"2: a cluster run of another user's suite asking {asks}", "refused")
    cluster: SshCluster = ssh_nodes(1)
    theirs = their_directory(arena, attacker, "theirs")
    if asks.startswith("allow_destroy"):
        target = f'device = "{loop_device}"\nallow_destroy = true\nsize = "16MiB"\n'
        body, expect = HOST, (f"iomatrix: [target] allow_destroy: {loop_device} would be "
                              "overwritten as asked by suite ")
    else:
        for name in ("vmlinuz", "initrd"):
            _write_as(attacker, theirs / name, "x" * 4096)
        target = f'directory = "{tmp_path / "t"}"\nsize = "16MiB"\n'
        body = (HOST.replace('mode = "host"', 'mode = "guest"\naccel = "tcg"\nbaseline = false')
                + f'[guest]\nimage = "{arena / "secret"}"\nkernel = "{theirs / "vmlinuz"}"\n'
                  f'initrd = "{theirs / "initrd"}"\n')
        expect = f"iomatrix: [guest] image: {arena / 'secret'} is not readable by {attacker.name}"
    suite = _write_as(attacker, theirs / "s.toml",
                      f'[suite]\nname = "c"\n[target]\n{target}{body}')
    db = tmp_path / "r.db"
    done = _iomatrix(cluster, "run", str(suite), "--nodes", str(_inventory(cluster, tmp_path)),
                     "--db", str(db))
    assert one_line(done, ExitStatus.SUITE_INVALID).startswith(expect), done.stderr
    assert _logins(cluster) == 0 and not db.exists()


def test_f2_a_resumed_cluster_run_of_another_users_suite_stays_theirs(
        arena: Path, ssh_nodes, tmp_path: Path, attacker: User, attack: Attack) -> None:  # noqa: F811
    """2: root runs the attacker's suite on a node (harmless: a directory of root's); the run
    is then interrupted, and root resumes it. The run remembers whose suite it was: every
    request the node gets says the suite is not trusted, on resume as at first (it used to be
    judged by the store's author alone, root's own database: trusted, so the node would have
    let it destroy a device or read a root-only guest image)."""
    attack("2: run --resume of a cluster run of another user's suite (judged as root's?)",
           "refused")
    cluster: SshCluster = ssh_nodes(1)
    theirs = their_directory(arena, attacker, "theirs")
    suite = _write_as(attacker, theirs / "s.toml", _suite_text(tmp_path / "t"))
    wrapper, heard = _hearing(tmp_path)
    inventory = _inventory(cluster, tmp_path, str(wrapper))
    db = tmp_path / "r.db"
    done = _iomatrix(cluster, "run", str(suite), "--nodes", str(inventory), "--db", str(db))
    assert done.returncode == 0, done.stderr
    with sqlite3.connect(db) as c:      # as a run whose node was lost leaves it
        for statement in ("DELETE FROM samples", "DELETE FROM trials",
                          "UPDATE runs SET status = 'interrupted'",
                          "UPDATE run_nodes SET status = 'pending'"):
            c.execute(statement)
    c.close()
    first = _requests(heard)
    heard.unlink()
    done = _iomatrix(cluster, "run", "--resume", "1", "--nodes", str(inventory), "--db", str(db))
    assert done.returncode == 0, done.stderr
    for requests in (first, _requests(heard)):
        assert {"run_uuid" in r for r in requests} == {True, False}, requests   # check and run
        assert [r["trusted"] for r in requests] == [False] * len(requests), requests


def _requests(heard: Path) -> list[dict[str, object]]:
    """The check and run requests the nodes heard (a check's has no line break after it;
    export and forget carry no suite)."""
    text, found, at = heard.read_text(), [], 0
    decoder = json.JSONDecoder()
    while at < len(text.rstrip()):
        request, at = decoder.raw_decode(text, at)
        if "suite_text" in request:
            found.append(request)
        while at < len(text) and text[at].isspace():
            at += 1
    return found


LISTENER = """
import socket, sys
port, log, ready = sys.argv[1:4]
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", int(port)))
server.listen(8)
open(ready, "w").close()
while True:
    conn, _ = server.accept()
    with open(log, "a") as f:
        f.write("a login\\n")
    conn.close()
"""


@contextlib.contextmanager
def _their_portal(cluster: SshCluster, user: User, theirs: Path, port: int) -> Iterator[Path]:
    """A TCP listener of ``user``'s on 127.0.0.1:``port`` where the controller runs (its
    network namespace): the user's own iSCSI "portal"; yields the file where it notes each
    connection."""
    log, ready = theirs / "portal.log", theirs / "portal.ready"
    proc = subprocess.Popen(cluster.controller(
        ["setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--clear-groups",
         "--pdeathsig", "KILL", "--", str(SYSTEM_PYTHON), "-c", LISTENER, str(port), str(log),
         str(ready)]), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr
            time.sleep(0.05)
        yield log
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_f4_their_portal_never_gets_roots_chap_login(
        arena: Path, ssh_nodes, tmp_path: Path, attacker: User, attack: Attack) -> None:  # noqa: F811
    """4: the attacker's suite names their own portal (a listener of theirs where the
    controller runs) with root's 0600 CHAP file, for a cluster run: refused in one line before
    anything connects to the portal (the controller's own preflight used to probe the LUN
    there, logging in with root's CHAP), before any node is asked."""
    attack("4: [target] iscsi portal of another user's, with root's CHAP file (cluster run)",
           "refused")
    cluster: SshCluster = ssh_nodes(1)
    theirs = their_directory(arena, attacker, "theirs")
    chap = tmp_path / "chap.toml"
    chap.write_text('user = "root-chap"\npassword = "root-secret-xyzzy"\n')
    chap.chmod(0o600)
    suite = _write_as(attacker, theirs / "s.toml", (
        '[suite]\nname = "c"\n[target]\nallow_destroy = true\nsize = "16MiB"\n'
        '[target.iscsi]\nportal = "127.0.0.1:3260"\ntarget = "iqn.2026-11.org.iomatrix:t"\n'
        f'lun = 1\nconnect_timeout = 5\nchap = "{chap}"\n{HOST}'))
    with _their_portal(cluster, attacker, theirs, 3260) as logins:
        done = _iomatrix(cluster, "run", str(suite), "--nodes",
                         str(_inventory(cluster, tmp_path)), "--db", str(tmp_path / "r.db"))
        line = one_line(done, ExitStatus.SUITE_INVALID)
    assert line.startswith("iomatrix: [target] allow_destroy: iscsi://127.0.0.1:3260/"), line
    assert not logins.exists() and _logins(cluster) == 0
    assert "root-secret" not in done.stdout + done.stderr


ANSWERS = {"[]": "Input should be an object",
           '{"host": {"x": "y"}}': "host: unknown key 'x'",
           '{"problems": "no list", "hostname": "n"}': "problems: Input should be a valid array",
           "not json": "Invalid JSON: expected ident at line 1 column 2"}


@pytest.mark.parametrize("answer", sorted(ANSWERS))
def test_f7_a_node_whose_preflight_answer_is_no_facts_is_one_line(
        ssh_nodes, tmp_path: Path, attack: Attack, answer: str) -> None:  # noqa: F811
    """7: a node answers its preflight with JSON that is no facts (a list, host metadata the
    store would refuse, a problem list of the wrong type): one line naming the node and why,
    exit status NODES, no traceback, nothing stored (it used to be an AttributeError traceback
    in the preflight's thread, or metadata stored that every later ``iomatrix runs`` refused)."""
    attack("7: a node's preflight answer that is no facts", "refused")
    cluster: SshCluster = ssh_nodes(1)
    liar = tmp_path / "liar"
    liar.write_text(f"#!/bin/sh\ncat >/dev/null\nprintf '%s\\n' '{answer}'\n")
    liar.chmod(0o755)
    suite = tmp_path / "s.toml"
    suite.write_text(_suite_text(tmp_path / "t"))
    db = tmp_path / "r.db"
    done = _iomatrix(cluster, "run", str(suite), "--nodes",
                     str(_inventory(cluster, tmp_path, str(liar))), "--db", str(db))
    assert one_line(done, ExitStatus.NODES) == (
        f"iomatrix: node node1: its iomatrix node check answered no preflight facts: "
        f"{ANSWERS[answer]}")
    assert not db.exists()


def test_f8_an_sslpassword_never_reaches_a_node(
        ssh_nodes, tmp_path: Path, attack: Attack, request: pytest.FixtureRequest) -> None:  # noqa: F811
    """8: ``sslpassword=`` (the passphrase of a client key) in the PostgreSQL URL is a
    password too: no request a node gets carries it (the nodes keep their shares, which the
    controller copies in); it used to go to every node with the whole URL."""
    attack("8: the PostgreSQL URL's sslpassword in the request a node gets", "harmless")
    cluster: SshCluster = ssh_nodes(1)
    url = request.getfixturevalue("pg_url")
    url += ("&" if "?" in url else "?") + "sslpassword=ssl-phrase-xyzzy"
    wrapper, heard = _hearing(tmp_path)
    suite = tmp_path / "s.toml"
    suite.write_text(_suite_text(tmp_path / "t"))
    done = _iomatrix(cluster, "run", str(suite), "--nodes",
                     str(_inventory(cluster, tmp_path, str(wrapper))), "--db", url)
    assert done.returncode == 0, done.stderr
    said = heard.read_text()
    assert '"run_uuid"' in said and "ssl-phrase" not in said
    assert "ssl-phrase" not in done.stdout + done.stderr


TELLING = """#!{python}
import json, os, sys
with open("{told}", "a") as f:
    f.write(json.dumps({{"agent": os.environ.get("SSH_AUTH_SOCK")}}) + "\\n")
os.execv("{iomatrix}", ["{iomatrix}", *sys.argv[1:]])
"""


def test_f9_ssh_lends_a_node_nothing_whatever_roots_ssh_config_says(
        arena: Path, ssh_nodes, tmp_path: Path, attacker: User, attack: Attack) -> None:  # noqa: F811
    """9: root's ssh_config forwards its agent and runs a LocalCommand for every host, and root
    runs the attacker's suite on a node (which an attacker's suite may choose): the node's
    session has no agent socket, and the LocalCommand never runs (ssh is told ForwardAgent=no,
    PermitLocalCommand=no, ClearAllForwardings=yes on its command line, which wins)."""
    attack("9: root's ssh_config lending the agent or running a LocalCommand for a node",
           "harmless")
    cluster: SshCluster = ssh_nodes(1)
    canary = arena / "local-command-ran"
    config = tmp_path / "ssh_config"
    config.write_text(f"Host *\n  ForwardAgent yes\n  PermitLocalCommand yes\n"
                      f"  LocalCommand /bin/sh -c 'id -u > {canary}'\n")
    told = tmp_path / "told"
    teller = tmp_path / "telling-iomatrix"
    teller.write_text(TELLING.format(python=sys.executable, told=told, iomatrix=IOMATRIX))
    teller.chmod(0o755)
    inventory = _inventory(cluster, tmp_path, str(teller), extra=f'ssh_config = "{config}"\n')
    theirs = their_directory(arena, attacker, "theirs")
    suite = _write_as(attacker, theirs / "s.toml", _suite_text(tmp_path / "t"))
    agent_sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(agent_sock)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not agent_sock.exists():
            assert agent.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        done = subprocess.run(cluster.controller(
            [sys.executable, "-m", "iomatrix", "run", str(suite), "--nodes", str(inventory),
             "--db", str(tmp_path / "r.db")]), capture_output=True, text=True, timeout=600,
            env={**os.environ, "SSH_AUTH_SOCK": str(agent_sock)})
    finally:
        agent.kill()
        agent.wait(timeout=30)
    assert done.returncode == 0, done.stderr
    sessions = [json.loads(line) for line in told.read_text().splitlines()]
    assert len(sessions) >= 2 and all(s["agent"] is None for s in sessions), sessions
    assert not canary.exists()


def test_f9_a_suite_never_chooses_the_account_roots_key_logs_in_to(
        arena: Path, ssh_nodes, tmp_path: Path, attacker: User, attack: Attack) -> None:  # noqa: F811
    """9: the attacker's suite has root's key log in to the node as the attacker (whose own
    account there lets that key in: the node's sshd takes it for every user): refused in one
    line before ssh starts; nothing logs in (root's key used to open the attacker's account,
    whose shell would have answered in iomatrix's place)."""
    attack("9: [nodes] user naming another user's account in their suite", "refused")
    cluster: SshCluster = ssh_nodes(1)
    theirs = their_directory(arena, attacker, "theirs")
    node = cluster.nodes[0]
    nodes = f'hosts = ["{node.address}"]\n' + _node_keys(cluster, user=attacker.name)
    suite = _write_as(attacker, theirs / "s.toml", _suite_text(tmp_path / "t", nodes))
    for plan in (["--plan"], []):
        done = _iomatrix(cluster, "run", str(suite), *plan, "--db", str(tmp_path / "r.db"))
        assert one_line(done, ExitStatus.SUITE_INVALID) == (
            f"iomatrix: [nodes] of suite {suite} (another user could write it): node "
            f"{node.address}: user '{attacker.name}': your key would log in to that account, "
            "whose owner's shell would answer in iomatrix's place; only your own inventory may "
            "name it")
    assert _logins(cluster) == 0 and not (tmp_path / "r.db").exists()
