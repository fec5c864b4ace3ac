"""Issue 31 F9: what a database, a guest or a suite wrote reaches root's terminal shown, never
obeyed.

A user hands root a results database whose strings (the suite's name, the notes, a failed
trial's reason, a configuration's label, a node's name, reason and host, the host's metadata)
carry a screen clear (``ESC [2J``), an OSC 52 clipboard write, a C1 CSI (``\\x9b``, a CSI on
terminals that take 8-bit controls) and a right-to-left override (U+202E). Root copies it into
a directory of its own (as iomatrix says to) and reads it with ``runs``, ``show``, ``compare``,
``effect``, ``findings`` and ``recommend``, through the real command line in a process of its
own, into a pipe and onto a pseudo-terminal: none of those characters comes out raw, each
comes out as its escape (``cli.common.Terminal``). The progress line of a run does the same with
a failure reason as a guest's console wrote it."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from iomatrix.store import Store
from iomatrix.suite.workloads import Workload
from iomatrix.testing.synthetic import Figures, configurations, write_run
from tests.conftest import ATTACKS, Attack, IOMATRIX, REPO, User, as_user

pytestmark = ATTACKS

HOSTILE = "\x1b[2J\x1b]52;c;aWQ7cm0=\x07\x9b6n\u202e"
"""Clear the screen, set the clipboard (OSC 52, BEL-terminated), ask for the cursor's position
(C1 CSI), reverse what follows (RLO)."""
SHOWN = "\\x1b[2J\\x1b]52;c;aWQ7cm0=\\x07\\x9b6n\\u202e"
"""``HOSTILE`` as a terminal must show it."""
RAW = ("\x1b", "\x07", "\x9b", "\u202e")
SGR = re.compile(r"\x1b\[[0-9;]*m")
"""The colours and weights rich itself writes on a terminal (never a string's own: those are
escaped before)."""

EDIT = r"""
import json, sqlite3, sys
db, bad = sys.argv[1], sys.argv[2]
c = sqlite3.connect(db)
host = {"hostname": "host" + bad, "target": "target" + bad, "target_fs": "fs" + bad}
c.execute("UPDATE runs SET suite_name = ?, notes_json = ?, host_json = ?",
          ("suite" + bad, json.dumps(["note" + bad]), json.dumps(host)))
c.execute("UPDATE runs SET host_json = ? WHERE id = 1", (json.dumps({**host, "kernel": "kernel" + bad}),))
c.execute("UPDATE trials SET reason = ? WHERE status = 'failed'", ("reason" + bad,))
c.execute("UPDATE configurations SET label = 'label' || ? || label", (bad,))
c.execute("UPDATE run_nodes SET name = ?, host_json = ?, status = 'failed', reason = ?",
          ("node" + bad, json.dumps({"hostname": "nodehost" + bad}), "nodereason" + bad))
c.commit()
c.close()
"""
"""The user's edit of the database, with Python's own sqlite3 (the strings through json.dumps:
stored as ``\\u001b``, read back as ESC)."""

FIELDS = ("suite", "host", "target", "fs", "kernel", "reason", "label", "node", "nodehost",
          "nodereason", "note")
"""Each string the user wrote: its name followed by ``HOSTILE``."""

COMMANDS = {("runs",): ("suite", "node", "host"),
            ("show", "1"): ("suite", "host", "target", "fs", "reason", "label", "node",
                            "nodehost", "nodereason", "note"),
            ("compare", "1", "2"): ("suite", "host", "target", "fs", "kernel", "label"),
            ("effect", "1", "--axis", "aio"): ("suite",),
            ("findings", "1"): ("suite",),
            ("recommend", "1", "--for", "qemu"): ("suite",)}
"""Each command, and the strings it shows (through stdout or stderr)."""


@pytest.fixture
def handed_over(tmp_path: Path, attacker: User) -> Iterator[Path]:
    """The user's database, copied into root's ``tmp_path``: two runs of two configurations
    (aio native and io_uring), a failed trial, a node; every string edited by the user."""
    area = Path(tempfile.mkdtemp(prefix="iomatrix-f9-", dir=tempfile.gettempdir()))
    try:
        area.chmod(0o755)
        theirs = area / "bob"
        theirs.mkdir()
        os.chown(theirs, attacker.uid, attacker.gid)
        made = area / "runs.db"                 # made in root's directory, then handed over
        configs = configurations("blocklayer", {"aio": ["native", "io_uring"], "cache": ["none"],
                                                "format": ["raw"]})
        workload = Workload(rw="randread", bs=4096, iodepth=1)

        def figures(config: object, _w: object, index: int) -> Figures | None:
            return None if (config, index) == (configs[0], 0) else Figures(1000, 4e6, 1e6, 2e6)
        with Store(made) as store:
            for _ in range(2):
                write_run(store, configs, [workload], figures, samples=3)
            store.add_nodes(1, [("alpha", {"host": "10.0.0.1"}, {"hostname": "pve1"})])
        db = theirs / "runs.db"
        shutil.move(made, db)
        os.chown(db, attacker.uid, attacker.gid)
        editor = as_user(attacker, EDIT, str(db), HOSTILE)
        assert editor.wait(timeout=60) == 0, editor.communicate()
        copied = tmp_path / "runs.db"
        shutil.copyfile(db, copied)
        yield copied
    finally:
        shutil.rmtree(area, ignore_errors=True)


def piped(*args: str) -> str:
    done = subprocess.run([*IOMATRIX, *args], capture_output=True, text=True, cwd=REPO,
                          timeout=120)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout + done.stderr


def on_terminal(argv: list[str]) -> str:
    """What ``argv`` wrote on a pseudo-terminal of 400 columns (colours on); it must succeed."""
    main, child = pty.openpty()
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "400", "LINES": "50"}
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen(argv, stdin=child, stdout=child, stderr=child, cwd=REPO, env=env)
    os.close(child)
    chunks = []
    try:
        while select.select([main], [], [], 120)[0]:
            try:
                chunk = os.read(main, 65536)
            except OSError:                      # EIO: the child closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(main)
        status = proc.wait(timeout=60)
    assert status == 0, (argv, b"".join(chunks))
    return b"".join(chunks).decode()


def assert_shown(output: str, fields: tuple[str, ...], where: str) -> None:
    bare = SGR.sub("", output).replace("\r\n", "\n")
    raw = [c for c in RAW if c in bare]
    assert not raw, f"{where}: raw {raw!r} in {output!r}"
    missing = [f for f in fields if f + SHOWN not in bare]
    assert not missing, f"{where}: {missing} not shown escaped in {output!r}"


@pytest.mark.slow
def test_stored_strings_reach_the_terminal_escaped(handed_over: Path, attack: Attack) -> None:
    attack("F9 terminal escapes in a database's strings", "harmless")
    for args, fields in COMMANDS.items():
        assert_shown(piped(*args, "--db", str(handed_over)), fields, f"{args} into a pipe")
    for args in (("runs",), ("show", "1"), ("compare", "1", "2")):
        assert_shown(on_terminal([*IOMATRIX, *args, "--db", str(handed_over)]), COMMANDS[args],
                     f"{args} on a terminal")


PROGRESS = r"""
import sys
from iomatrix.cli.common import environment
from iomatrix.cli.progress import ClusterTerminalProgress, TerminalProgress
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.workloads import Workload

err = environment().stderr
reason, node = sys.argv[1], sys.argv[2]
config, workload = Configuration(mode="host"), Workload(rw="randread", bs=4096, iodepth=1)
with TerminalProgress(err) as progress:
    progress.start(2, 10)
    progress.trial_started(1, config, workload, 0)
    progress.trial_finished(1, False, reason)
    progress.note("a note " + reason)
with ClusterTerminalProgress(err) as cluster:
    cluster.start({node: (1, 10.0)})
    cluster.node_started(node, 1, 10.0)
    cluster.trial_started(node, config, workload, 0)
    cluster.trial_finished(node, False, reason)
    cluster.node_ended(node, "failed", reason, ok=0, failed=1, left=0)
"""
"""A run's progress, as the runner drives it, with a guest's failure reason and a node's name
(a run's own would take a guest booted to write them)."""


@pytest.mark.slow
def test_the_progress_line_shows_a_guest_console_reason_escaped(attack: Attack) -> None:
    """A guest console's text in a failure reason (a trial's and a node's) and a node name, on
    the progress bar (a terminal) and on the plain lines (a pipe)."""
    attack("F9 terminal escapes in a guest's console text", "harmless")
    reason = f"guest vm0 exited (status 1); console: console{HOSTILE}"
    argv = [sys.executable, "-c", PROGRESS, reason, f"node{HOSTILE}"]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    assert_shown(done.stderr, ("console", "node"), "progress into a pipe")
    assert done.stderr.count("console" + SHOWN) == 4, done.stderr
    text = on_terminal(argv)
    # rich's own cursor controls of the bar aside (hide, show, erase line, move up)
    text = re.sub(r"\x1b\[\?25[lh]|\x1b\[2K|\x1b\[1A|\r", "", text)
    assert_shown(text, ("console", "node"), "progress on a terminal")


@pytest.mark.slow
def test_rich_markup_in_stored_strings_is_text(handed_over: Path) -> None:
    """Rich's markup in a stored string (a suite name in ``runs``' table, a configuration's label
    in ``show``'s, a note) is text: ``[link=…]`` makes no hyperlink (OSC 8), ``[bold]`` is shown as written."""
    import sqlite3

    markup = "[link=https://evil.example]click[/link] [bold]x[/]"
    with sqlite3.connect(handed_over) as conn:
        conn.execute("UPDATE runs SET suite_name = ?, notes_json = ?",
                     (markup, json.dumps([markup])))
        conn.execute("UPDATE configurations SET label = ? || label", (markup,))
    conn.close()
    for args in (("runs",), ("show", "1")):
        shown = on_terminal([*IOMATRIX, *args, "--db", str(handed_over)])
        assert "\x1b]8;" not in shown, shown
        assert shown.count(markup) == (2 if args == ("runs",) else 5), shown
