"""A node's side of a cluster run (``measure.cluster`` is the controller's): the requests the
controller sends ``iomatrix node check`` and ``iomatrix node run`` on stdin and the suite they
carry, what a node answers in its preflight (``NodeFacts``), its run tied to the controller's
SSH session (``watch_stdin``), its progress as JSON lines, and the store of its share exported
to the controller and then removed."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO, Annotated, Any

from pydantic import Field

from iomatrix import __version__
from iomatrix.core.errors import IomatrixError, RunNotFound
from iomatrix.core.model import Frozen
from iomatrix.store.rows import StoredPlan
from iomatrix.core.proc import first_line, which
from iomatrix.core.trust import ANYONE, Author
from iomatrix.drivers.cluster import GuestRequest
from iomatrix.measure.precheck import check_author, tools_for, workspace_of
from iomatrix.measure.prepare import prepare
from iomatrix.qemu.args import MACHINE
from iomatrix.store.rows import HostMeta
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.load import load_suite_text, with_author
from iomatrix.suite.model import Suite
from iomatrix.suite.spec import RunSpec
from iomatrix.telemetry.hostinfo import host_metadata


class CheckRequest(Frozen):
    """What the controller sends a node's ``iomatrix node check`` on stdin (one JSON line)."""

    suite_text: str
    suite_spec: RunSpec | None = None
    """The suite as the controller prepared it (``iomatrix.suite.spec``), checked here as a
    suite file's tables are; None: ``suite_text`` is loaded as a suite file."""
    suite_source: str = "<controller>"
    trusted: bool = False
    """Whether nobody but root or the controller's user could have written the suite
    (``Suite.author``); a node judges the files it names by that (``request_suite``)."""


class NodeRequest(Frozen):
    """What the controller sends a node's ``iomatrix node run`` on stdin (one JSON line): what
    the node needs, and no secret (``nodes_store``)."""

    suite_text: str
    suite_spec: RunSpec | None = None
    """As ``CheckRequest.suite_spec``."""
    suite_source: str
    trusted: bool = False
    """As ``CheckRequest.trusted``."""
    node: str
    run_uuid: str
    seed: int
    db: str | None = None
    """The shared PostgreSQL store's URL; None: the node keeps its share in a store of its own."""
    accel: str | None = None
    keep: bool = False
    retry_failed: bool = False
    plan: StoredPlan | None = None
    """The run's plan, chosen by the controller from one pilot over every node (a resumed
    run's): the node measures no pilot. None with [method] pilot or target_ci: the node
    measures its pilot, sends its trials and waits for the plan (``clusterpilot``)."""


Said = Annotated[str, Field(max_length=4096)]
"""A line a node's preflight answer holds (a version, a problem)."""


class NodeFacts(Frozen):
    """What a node says in its preflight (``node_facts``), as the controller reads its answer:
    these keys only, each of its type; its host metadata the store's allow-list
    (``store.rows.HostMeta``), since ``add_nodes`` stores it."""

    hostname: Said = ""
    iomatrix: Said = ""
    fio: Said = ""
    qemu: Said = ""
    kvm: Said = ""
    host: HostMeta = {}
    problems: tuple[Said, ...] = Field(default=(), max_length=100)


def request_suite(request: CheckRequest | NodeRequest | GuestRequest) -> Suite:
    """The suite a request carries, as written by its author: us when the controller judged
    that nobody but root or its user could have written it (the request comes over an SSH
    session only they can open), else anyone (a file it names must be readable by every user,
    and it may destroy no device)."""
    suite = request_spec(request).suite(text=request.suite_text, source=request.suite_source)
    where = f"the controller's suite {request.suite_source}"
    return with_author(suite, Author(None, where) if request.trusted else Author(ANYONE, where))


def request_spec(request: CheckRequest | NodeRequest | GuestRequest) -> RunSpec:
    """The spec a controller's request carries; one made from its text where it carries none
    (the text loaded as a suite file is: no file read beside it)."""
    if request.suite_spec is not None:
        return request.suite_spec
    return RunSpec.of(load_suite_text(request.suite_text, source=request.suite_source))


def node_facts(suite: Suite) -> NodeFacts:
    """What a node says in its preflight: host, iomatrix, fio and QEMU versions, KVM, and the
    problems it sees with the suite here (what its author may not ask, before the target is
    reached: ``precheck.check_author``; tools missing, target unusable or too small)."""
    problems: list[str] = []
    try:
        check_author(suite, guest_files=not suite.method.concurrent_nodes)
        prepared = prepare(suite)
        for tool in tools_for(prepared.full):
            if which(tool) is None:
                problems.append(f"{tool} is not installed")
        workspace_of(prepared, keep=False).check(prepared.full.configurations)
    except IomatrixError as exc:
        problems.append(first_line(str(exc)))
    host = host_metadata(suite.target.directory or suite.target.device, accelerator="?",
                         machine=MACHINE)
    return NodeFacts(hostname=socket.gethostname(), iomatrix=__version__, fio=host.fio,
                     qemu=host.qemu,
                     kvm=("usable" if os.access("/dev/kvm", os.R_OK | os.W_OK) else
                          "no /dev/kvm" if not os.path.exists("/dev/kvm") else
                          "/dev/kvm not accessible"),
                     host=host.stored(), problems=tuple(problems))


def node_store_path(run_uuid: str, node: str) -> Path:
    """Where a node keeps its share of a cluster run when no store is shared: under the user's
    state directory (``$XDG_STATE_HOME``, else ``~/.local/state``), by run and node."""
    base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return base / "iomatrix" / "cluster" / f"{run_uuid}-{node}.db"


def watch_stdin(fd: int, lines: Callable[[bytes], None] | None = None) -> None:
    """Raise SIGHUP in this process when file descriptor ``fd`` (stdin) ends: the controller's
    SSH session is gone (no terminal, so no SIGHUP of the kernel's), and the run stops as it
    does on Ctrl-C. What is read meanwhile is ignored, or given line by line to ``lines`` (in
    the watching thread). Read raw: a daemon thread inside a buffered read aborts the
    interpreter's exit."""
    def wait() -> None:
        pending = b""
        with contextlib.suppress(OSError):
            while chunk := os.read(fd, 65536):
                if lines is not None:
                    *whole, pending = (pending + chunk).split(b"\n")
                    for line in whole:
                        lines(line)
        os.kill(os.getpid(), signal.SIGHUP)
    threading.Thread(target=wait, name="stdin-eof", daemon=True).start()


class JsonProgress:
    """``Progress`` as JSON lines on a stream, for the controller to read (one event a line)."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.lock = threading.Lock()

    def emit(self, event: str, **fields: Any) -> None:
        with self.lock, contextlib.suppress(OSError, ValueError):
            self.stream.write(json.dumps({"event": event, **fields}) + "\n")
            self.stream.flush()

    def start(self, trials: int, planned_seconds: float) -> None:
        self.emit("start", trials=trials, seconds=planned_seconds)

    def more(self, trials: int, planned_seconds: float) -> None:
        self.emit("more", trials=trials, seconds=planned_seconds)

    def trial_started(self, n: int, config: Configuration, workload: Any, sample: int) -> None:
        self.emit("trial_started", config=config.key, workload=workload.key, sample=sample)

    def trial_finished(self, n: int, ok: bool, detail: str) -> None:
        self.emit("trial_finished", ok=ok, detail=detail)

    def note(self, text: str) -> None:
        self.emit("note", text=text)


def export_share(path: Path, out: IO[bytes]) -> None:
    """A consistent copy of the node's store at ``path`` (SQLite's backup), written to ``out``;
    RunNotFound when the node has no such share."""
    import sqlite3

    if not path.is_file():
        raise RunNotFound(f"{path}: this node keeps no such share")
    with tempfile.TemporaryDirectory(prefix="iomatrix-share-") as tmp:
        copy = Path(tmp) / "share.db"
        source = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            with sqlite3.connect(copy) as target:
                source.backup(target)
            target.close()
        finally:
            source.close()
        with open(copy, "rb") as f:
            shutil.copyfileobj(f, out)
    out.flush()


def forget_share(path: Path) -> None:
    """Remove the node's store of a share (copied into the cluster's run by now)."""
    for extra in ("", "-wal", "-shm", "-journal"):
        with contextlib.suppress(FileNotFoundError):
            Path(f"{path}{extra}").unlink()
    for directory in (path.parent, path.parent.parent):     # iomatrix's, once empty
        with contextlib.suppress(OSError):
            directory.rmdir()
