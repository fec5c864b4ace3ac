"""Issue 31, SSH nodes (F1, F2, F4's run_nodes, F10's [nodes] and ``node run``): what another
local user writes (a suite, an inventory, a database) never chooses what root's ssh reads or
runs, nor where root logs in, tried for real as an unprivileged user (``attacker``) against root
runs of iomatrix reaching real sshd nodes (tests/sshnodes.py; a node stands for the attacker's
own sshd where the attack needs one).

- F1: an ssh_config whose ProxyCommand would make a file as root (in a suite, an inventory the
  user wrote, or named by root's own inventory): refused in one line, the file never made;
- F2: the user's known_hosts (their sshd's host key) or identity: refused before ssh starts,
  nothing reaches the sshd; ``command`` from a suite or the user's inventory: refused, the
  program never runs; a PostgreSQL URL's password never reaches a node;
- F4: a database whose run_nodes row names an ssh_config, a command, an identity or a
  known_hosts: ``run --resume`` refused in one line; a row that is no node's fields likewise;
- F10: a control character or a huge value in any [nodes] field, in a suite or an inventory:
  ``--plan`` and ``run`` refuse it alike in one line; ``iomatrix node ...`` fed ``{}`` or bytes
  that are no JSON request ends in one line and a non-zero exit status.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from iomatrix.cli.status import ExitStatus
from tests.conftest import ATTACKS, REPO, Attack, User, as_user, cli_result
from tests.sshnodes import SshCluster, ssh_nodes  # noqa: F401 (a fixture)
from tests.attacks.test_adversary import arena, their_directory  # noqa: F401 (a fixture)
# (each test asks for ``arena`` before ``ssh_nodes``: its check that nothing is left runs
# once the nodes have stopped)
from tests.attacks.test_untrusted_inputs import one_line

pytestmark = ATTACKS

IOMATRIX = str(REPO / ".venv" / "bin" / "iomatrix")
HOST = ('[workloads]\nrw = ["randread"]\nbs = ["4k"]\niodepth = [1]\n[method]\nmode = "host"\n'
        'ramp = "0s"\nruntime = "1s"\n')
WRITE = ("import os, sys\npath, text, mode = sys.argv[1:4]\n"
         "with open(path, 'w') as f:\n    f.write(text)\nos.chmod(path, int(mode, 8))\n")


def _write_as(user: User, path: Path, text: str, mode: int = 0o644) -> Path:
    """``text`` written to ``path`` by ``user`` (the file theirs, ``mode``)."""
    done = as_user(user, WRITE, str(path), text, f"{mode:o}")
    _, err = done.communicate(timeout=60)
    assert done.returncode == 0, err
    return path


def _suite_text(target: Path, nodes: str = "") -> str:
    return (f'[suite]\nname = "c"\n[target]\ndirectory = "{target}"\nsize = "16MiB"\n{HOST}'
            + (f"[nodes]\n{nodes}" if nodes else ""))


def _node_keys(cluster: SshCluster, **given: str) -> str:
    """TOML keys reaching the cluster's first node as root with root's own key and known_hosts
    (the other user knows their paths), as ``given`` overrides them."""
    node = cluster.nodes[0]
    keys = {"user": "root", "identity": str(cluster.identity),
            "known_hosts": str(cluster.known_hosts), **given}
    return f"port = {node.port}\n" + "".join(f'{k} = "{v}"\n' for k, v in keys.items())


def _iomatrix(cluster: SshCluster, *args: str) -> subprocess.CompletedProcess[str]:
    """``iomatrix ARGS`` run by root where the controller is (it reaches the nodes)."""
    return subprocess.run(cluster.controller([sys.executable, "-m", "iomatrix", *args]),
                          capture_output=True, text=True, timeout=600, cwd=REPO)


def _logins(cluster: SshCluster) -> int:
    """How many SSH logins the cluster's first node's sshd let in so far."""
    log = cluster.directory / cluster.nodes[0].name / "sshd.log"
    return log.read_text(errors="replace").count("Accepted publickey")


def _evil(user: User, theirs: Path, made: Path) -> dict[str, Path]:
    """What the user plants: an ssh_config whose ProxyCommand writes ``made`` as whoever runs
    ssh, a program that does the same wherever it runs, and a copy of the node's known_hosts
    and key (standing for their own sshd's host key, and the key it lets in)."""
    return {"ssh_config": _write_as(user, theirs / "evil.conf",
                                    f"Host *\n  ProxyCommand /bin/sh -c 'id -u > {made}; "
                                    "exec cat'\n"),
            "command": _write_as(user, theirs / "evil.sh", f"#!/bin/sh\nid -u > {made}\n",
                                 0o755)}


@pytest.mark.slow
@pytest.mark.parametrize("key", ["ssh_config", "command"])
@pytest.mark.parametrize("way", ["suite", "suite's inventory", "--nodes inventory"])
def test_what_only_root_s_configuration_names_is_refused_from_another_user(
        arena: Path, ssh_nodes, tmp_path: Path, attacker: User, attack: Attack,  # noqa: F811
        key: str, way: str) -> None:
    """F1 (ssh_config: its ProxyCommand runs as root in the preflight) and F2 (command: the
    program root runs on every node), written by the user in a suite, in an inventory the suite
    names, or in an inventory given with --nodes: refused in one line, for --plan and run; the
    file the ProxyCommand or program would make never made, nothing logs in to the node."""
    attack(f"{'F1' if key == 'ssh_config' else 'F2'}: [nodes] {key} in a {way} another user "
           "wrote", "refused")
    cluster: SshCluster = ssh_nodes(1)
    theirs, made = their_directory(arena, attacker, "theirs"), arena / "made-by-root"
    evil = _evil(attacker, theirs, made)[key]
    host = f'hosts = ["{cluster.nodes[0].address}"]\n'
    keys = _node_keys(cluster, **{key: str(evil)})
    args: list[str] = []
    if way == "suite":
        suite = _write_as(attacker, theirs / "s.toml", _suite_text(tmp_path / "t", host + keys))
        expect = f"[nodes] {key} = '{evil}': a suite never names"
    else:
        inventory = _write_as(attacker, theirs / "nodes.toml", keys + host)
        expect = (f"inventory {inventory} (another user could write it): node "
                  f"{cluster.nodes[0].address}: {key} '{evil}': ")
        if way == "suite's inventory":
            suite = _write_as(attacker, theirs / "s.toml",
                              _suite_text(tmp_path / "t", 'inventory = "nodes.toml"\n'))
        else:
            suite = tmp_path / "s.toml"
            suite.write_text(_suite_text(tmp_path / "t"))
            args = ["--nodes", str(inventory)]
    for plan in (["--plan"], []):
        done = _iomatrix(cluster, "run", str(suite), *args, *plan, "--db", str(tmp_path / "r.db"))
        assert expect in one_line(done, ExitStatus.SUITE_INVALID)
    assert not made.exists() and _logins(cluster) == 0
    assert not (tmp_path / "r.db").exists()


@pytest.mark.slow
@pytest.mark.parametrize("key", ["known_hosts", "identity", "ssh_config"])
def test_files_another_user_chose_for_ssh_are_refused(
        arena: Path, ssh_nodes, tmp_path: Path, attacker: User, attack: Attack,  # noqa: F811
        key: str) -> None:
    """F2: a suite naming the user's known_hosts (holding their own sshd's host key: root would
    log in there and send its request) or their identity; F1: root's own inventory naming the
    user's ssh_config. Each file passes rule 1 or is refused in one line naming the key, before
    ssh starts: nothing logs in, the ProxyCommand never runs."""
    attack(f"{'F1' if key == 'ssh_config' else 'F2'}: [nodes] {key} naming another user's "
           "file", "refused")
    cluster: SshCluster = ssh_nodes(1)
    theirs, made = their_directory(arena, attacker, "theirs"), arena / "made-by-root"
    files = {**_evil(attacker, theirs, made),
             "known_hosts": _write_as(attacker, theirs / "known_hosts",
                                      cluster.known_hosts.read_text()),
             "identity": _write_as(attacker, theirs / "id", cluster.identity.read_text(), 0o600)}
    host = f'hosts = ["{cluster.nodes[0].address}"]\n'
    if key == "ssh_config":         # root's own inventory, naming the user's file
        inventory = tmp_path / "nodes.toml"
        inventory.write_text(_node_keys(cluster, ssh_config=str(files[key])) + host)
        suite = tmp_path / "s.toml"
        suite.write_text(_suite_text(tmp_path / "t", f'inventory = "{inventory}"\n'))
    else:
        suite = _write_as(attacker, theirs / "s.toml", _suite_text(
            tmp_path / "t", host + _node_keys(cluster, **{key: str(files[key])})))
    for plan in (["--plan"], []):
        done = _iomatrix(cluster, "run", str(suite), *plan, "--db", str(tmp_path / "r.db"))
        line = one_line(done, ExitStatus.SUITE_INVALID)
        assert line == (f"iomatrix: [nodes] {key} (node {cluster.nodes[0].address}): {theirs} is "
                        f"owned by {attacker.name} (uid {attacker.uid}), not root: another user "
                        "could choose what ssh reads there"), line
    assert not made.exists() and _logins(cluster) == 0


def _cluster_run(cluster: SshCluster, tmp_path: Path) -> tuple[Path, Path]:
    """A complete cluster run of one node into ``tmp_path/made.db``, its nodes given by root's
    own inventory on the command line (ssh_config "none", iomatrix's path as the command), and
    that inventory."""
    inventory = tmp_path / "nodes.toml"
    inventory.write_text(cluster.inventory(extra=f'ssh_config = "none"\ncommand = "{IOMATRIX}"\n'))
    suite = tmp_path / "s.toml"
    suite.write_text(_suite_text(tmp_path / "t"))
    db = tmp_path / "made.db"
    done = _iomatrix(cluster, "run", str(suite), "--nodes", str(inventory), "--db", str(db))
    assert done.returncode == 0, done.stderr
    return db, inventory


def _crafted(user: User, db: Path, theirs: Path, into: Path, node_json: str) -> Path:
    """``db`` handed to ``user``, who makes its run interrupted (to be resumed) and its node's
    row ``node_json``; then handed back to root, who copies it to ``into``."""
    given = theirs / "given.db"
    shutil.copy(db, given)
    shutil.chown(given, user.uid, user.gid)
    edit = as_user(user, "import sqlite3, sys\nc = sqlite3.connect(sys.argv[1])\n"
                         "c.execute(\"UPDATE runs SET status = 'interrupted'\")\n"
                         "c.execute('UPDATE run_nodes SET node_json = ?', (sys.argv[2],))\n"
                         "c.commit()\n", str(given), node_json)
    _, err = edit.communicate(timeout=60)
    assert edit.returncode == 0, err
    shutil.copy(given, into)
    return into


@pytest.mark.slow
def test_a_database_row_naming_ssh_s_files_or_the_command_is_refused_on_resume(
        arena: Path, ssh_nodes, tmp_path: Path, attacker: User, attack: Attack,  # noqa: F811
        ) -> None:
    """F4: a database the user crafted (a run to resume, its node's row naming their
    ssh_config, program, identity or known_hosts: one database each, all made from one real
    cluster run), copied by root into its own directory and resumed: refused in one line
    before ssh starts, for --plan and run; nothing logs in, the ProxyCommand and the program
    never run."""
    attack("F4: run_nodes.node_json naming ssh_config, command, identity or known_hosts "
           "(run --resume)", "refused")
    cluster: SshCluster = ssh_nodes(1)
    made_db, _ = _cluster_run(cluster, tmp_path)
    logins = _logins(cluster)
    theirs, made = their_directory(arena, attacker, "theirs"), arena / "made-by-root"
    files = {**_evil(attacker, theirs, made),
             "known_hosts": _write_as(attacker, theirs / "known_hosts",
                                      cluster.known_hosts.read_text()),
             "identity": _write_as(attacker, theirs / "id", cluster.identity.read_text(), 0o600)}
    node = cluster.nodes[0]
    for key in ("ssh_config", "command", "identity", "known_hosts"):
        fields = {"host": node.address, "name": node.name, "user": "root", "port": node.port,
                  "identity": str(cluster.identity), "known_hosts": str(cluster.known_hosts),
                  "ssh_config": None, "command": "iomatrix", key: str(files[key])}
        db = _crafted(attacker, made_db, theirs, tmp_path / f"r-{key}.db", json.dumps(fields))
        for plan in (["--plan"], []):
            done = _iomatrix(cluster, "run", "--resume", "1", *plan, "--db", str(db))
            line = one_line(done, ExitStatus.SUITE_INVALID)
            where = f"the run's node '{node.name}'"
            assert line.startswith(f"iomatrix: {where}: {key} '{files[key]}': " if key in (
                "ssh_config", "command") else f"iomatrix: [nodes] {key} (node {node.name}): "
                f"{theirs} is owned by {attacker.name}"), line
    assert not made.exists() and _logins(cluster) == logins


@pytest.mark.slow
def test_a_database_row_that_is_no_node_is_one_line_on_resume(
        arena: Path, ssh_nodes, tmp_path: Path, attacker: User, attack: Attack,  # noqa: F811
        ) -> None:
    """F4/F10: a run_nodes row that is not a node's fields (not JSON, not a table, a wrong
    type, an unknown key, an option for a host, a NUL; one database each, all made from one
    real cluster run): one line, no traceback, nothing logs in."""
    attack("F10: run_nodes.node_json that is no node's fields (run --resume)", "refused")
    cluster: SshCluster = ssh_nodes(1)
    made_db, _ = _cluster_run(cluster, tmp_path)
    logins = _logins(cluster)
    theirs = their_directory(arena, attacker, "theirs")
    for n, node_json in enumerate(['{"host": ', '["node1"]', '{"host": 7}',
                                   '{"host": "a", "pasword": 1}',
                                   '{"host": "-oProxyCommand=x", "name": "node1"}',
                                   '{"host": "a\\u0000b", "name": "node1"}',
                                   '{"host": "a", "name": "node1", "alive_interval": "1 -oX=y"}']):
        db = _crafted(attacker, made_db, theirs, tmp_path / f"r{n}.db", node_json)
        done = _iomatrix(cluster, "run", "--resume", "1", "--db", str(db))
        line = one_line(done, ExitStatus(done.returncode))
        assert done.returncode in (ExitStatus.NODES, ExitStatus.STORE), (node_json, line)
        assert "node" in line, (node_json, line)
    assert _logins(cluster) == logins


@pytest.mark.slow
def test_a_run_given_its_nodes_on_the_command_line_resumes_with_them(
        ssh_nodes, tmp_path: Path) -> None:  # noqa: F811
    """A run whose nodes root gave with --nodes (its inventory naming iomatrix's path): its
    stored row's command is not taken on trust when resumed, said in one line with what to do;
    --nodes naming the same nodes again resumes it, and other nodes are refused."""
    cluster: SshCluster = ssh_nodes(1)
    made_db, inventory = _cluster_run(cluster, tmp_path)
    db = tmp_path / "r.db"
    shutil.copy(made_db, db)
    with sqlite3.connect(db) as c:      # as a run killed with the controller leaves it
        c.execute("UPDATE runs SET status = 'interrupted'")
    c.close()
    done = _iomatrix(cluster, "run", "--resume", "1", "--db", str(db))
    assert one_line(done, ExitStatus.SUITE_INVALID).startswith(
        f"iomatrix: the run's node 'node1': command '{IOMATRIX}': it is the program every node "
        "runs; only your own inventory may name it")
    assert "iomatrix: hint: give it in an inventory only root (or you) can write: --nodes FILE" \
        in done.stderr
    other = tmp_path / "other.toml"
    other.write_text(inventory.read_text().replace('name = "node1"', 'name = "other"'))
    done = _iomatrix(cluster, "run", "--resume", "1", "--nodes", str(other), "--db", str(db))
    assert one_line(done, ExitStatus.NODES) == ("iomatrix: --nodes names other; the run's nodes "
                                                "are node1")
    done = _iomatrix(cluster, "run", "--resume", "1", "--nodes", str(inventory), "--db", str(db))
    assert done.returncode == 0, done.stderr


HEARING = """#!{python}
import os, subprocess, sys, threading
# iomatrix on the node, with the request (its stdin's first line) kept in a file: the rest of
# stdin is handed on as it comes, and its end too (it stops the node's iomatrix)
line = b""
while not line.endswith(b"\\n") and (byte := os.read(0, 1)):
    line += byte
with open("{heard}", "ab") as f:
    f.write(line)
proc = subprocess.Popen(["{iomatrix}", *sys.argv[1:]], stdin=subprocess.PIPE)
proc.stdin.write(line)
proc.stdin.flush()
def pump():
    try:
        while chunk := os.read(0, 65536):
            proc.stdin.write(chunk)
            proc.stdin.flush()
        proc.stdin.close()
    except OSError:
        pass
threading.Thread(target=pump, daemon=True).start()
os._exit(proc.wait())
"""


@pytest.mark.slow
def test_a_postgresql_password_never_reaches_a_node(
        ssh_nodes, tmp_path: Path, attack: Attack, request: pytest.FixtureRequest) -> None:  # noqa: F811
    """F2: the request a node gets carries no secret it does not need: with --db a PostgreSQL
    URL holding a password, every byte each node's iomatrix reads on stdin (kept by its
    command, a wrapper that root's inventory names) lacks the password; the nodes keep their
    shares and the controller copies them in."""
    attack("F2: the PostgreSQL password in the request a node gets", "harmless")
    from iomatrix.testing.pgserver import USER

    cluster: SshCluster = ssh_nodes(2)
    password = request.getfixturevalue("pg_server").password
    url = request.getfixturevalue("pg_url").replace(f"postgresql://{USER}@",
                                                    f"postgresql://{USER}:{password}@", 1)
    heard = tmp_path / "heard"
    wrapper = tmp_path / "hearing-iomatrix"
    wrapper.write_text(HEARING.format(python=sys.executable, heard=heard, iomatrix=IOMATRIX))
    wrapper.chmod(0o755)
    inventory = tmp_path / "nodes.toml"
    inventory.write_text(cluster.inventory(extra=f'ssh_config = "none"\ncommand = "{wrapper}"\n'))
    suite = tmp_path / "s.toml"
    suite.write_text(_suite_text(tmp_path / "t"))
    done = _iomatrix(cluster, "run", str(suite), "--nodes", str(inventory), "--db", url)
    assert done.returncode == 0, done.stderr
    said = heard.read_text()
    assert '"suite_text"' in said and '"run_uuid"' in said         # the requests were heard
    assert password not in said
    from iomatrix.store import Store
    with Store(url) as s:
        assert [t.status for t in s.load_run(1).trials] == ["ok", "ok"]


NODE_FIELDS = {"hosts": 'hosts = ["{v}"]', "inventory": 'inventory = "{v}"',
               "user": 'hosts = ["n1"]\nuser = "{v}"', "identity": 'hosts = ["n1"]\nidentity = "{v}"',
               "known_hosts": 'hosts = ["n1"]\nknown_hosts = "{v}"',
               "ssh_config": 'hosts = ["n1"]\nssh_config = "{v}"',
               "command": 'hosts = ["n1"]\ncommand = "{v}"'}
BAD = {"NUL": "/a\\u0000b", "ESC": "/a\\u001b[31mb", "huge": "/" + "a" * 5000}


@pytest.mark.parametrize("field", sorted(NODE_FIELDS))
@pytest.mark.parametrize("bad", sorted(BAD))
def test_a_control_character_or_a_huge_value_in_nodes_is_one_line(
        tmp_path: Path, attack: Attack, field: str, bad: str) -> None:
    """F10: a NUL (which ends an argv word: ssh was never started, Python raised), an escape or
    a huge value in any [nodes] field of a suite: --plan and run refuse it alike, in one line
    naming the key."""
    attack("F10: a control character or a huge value in a [nodes] field", "refused")
    suite = tmp_path / "s.toml"
    suite.write_text(_suite_text(tmp_path / "t", NODE_FIELDS[field].format(v=BAD[bad]) + "\n"))
    for plan in (["--plan"], []):
        done = cli_result("run", str(suite), *plan, "--db", str(tmp_path / "r.db"))
        assert f"[nodes] {field} = " in one_line(done, ExitStatus.SUITE_INVALID)
    assert not (tmp_path / "r.db").exists()


@pytest.mark.parametrize("field", ["host", "name", "user", "identity", "known_hosts",
                                   "ssh_config", "command"])
@pytest.mark.parametrize("bad", sorted(BAD))
def test_a_control_character_or_a_huge_value_in_an_inventory_is_one_line(
        tmp_path: Path, attack: Attack, field: str, bad: str) -> None:
    """F10: the same in an inventory (root's own) given with --nodes: one line naming the
    field, for --plan and run."""
    attack("F10: a control character or a huge value in an inventory's field", "refused")
    inventory = tmp_path / "nodes.toml"
    table = {"host": "n1", field: BAD[bad]}
    inventory.write_text("[[node]]\n" + "".join(f'{k} = "{v}"\n' for k, v in table.items()))
    suite = tmp_path / "s.toml"
    suite.write_text(_suite_text(tmp_path / "t"))
    for plan in (["--plan"], []):
        done = cli_result("run", str(suite), "--nodes", str(inventory), *plan,
                          "--db", str(tmp_path / "r.db"))
        line = one_line(done, ExitStatus.NODES)
        assert f"{field} holds a control character" in line or "longer than 4096" in line, line
    assert not (tmp_path / "r.db").exists()


@pytest.mark.slow
@pytest.mark.parametrize("command", ["run", "check", "export", "forget", "serve-guests"])
@pytest.mark.parametrize("given", [b"{}\n", b"not json\n", b"\xff\xfe\n", b"[]\n", b"",
                                   b'{"suite_text": 5, "node": []}\n',
                                   b'{"run_uuid": "a\\u0000b", "node": "n1"}\n'])
def test_a_node_command_fed_what_is_no_request_is_one_line(
        tmp_path: Path, attack: Attack, command: str, given: bytes) -> None:
    """F10: ``iomatrix node COMMAND`` (what the controller starts over SSH) fed ``{}``, bytes
    that are no JSON, or a request of the wrong shape: one line, a non-zero exit status, no
    traceback."""
    attack("F10: iomatrix node ... fed a malformed request", "refused")
    done = subprocess.run([sys.executable, "-m", "iomatrix", "node", command], input=given,
                          capture_output=True, timeout=120, cwd=tmp_path,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
                               "XDG_STATE_HOME": str(tmp_path / "state")})
    text = subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(),
                                       done.stderr.decode(errors="replace"))
    assert done.returncode != 0
    one_line(text, ExitStatus(done.returncode))
    assert not (tmp_path / "state").exists()
