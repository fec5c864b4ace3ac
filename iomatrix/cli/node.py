"""``iomatrix node ...``: what a cluster run's controller starts on each node over SSH
(``iomatrix.measure.cluster``). Each reads one JSON request on stdin (never a path or an
argument the node must trust) and answers on stdout: ``check`` the node's preflight facts,
``run`` its share of the run as JSON progress lines, ``export`` the store holding its share,
``forget`` removes that store; ``serve-guests`` boots one configuration's guests for cluster
load (``iomatrix.measure.nodeguests``)."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import typer

from iomatrix.cli.common import open_store
from iomatrix.cli.status import ExitStatus
from iomatrix.core.errors import NodesError
from iomatrix.core.text import quoted

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import IO

    from pydantic import BaseModel

    from iomatrix.drivers.cluster import GuestRequest

M = TypeVar("M", bound="BaseModel")

app = typer.Typer(name="node", no_args_is_help=True,
                  help="What a cluster run starts on each node over SSH (`run --nodes`); "
                       "each reads a JSON request on stdin.")


def _request() -> dict[str, Any]:
    """The controller's request: the first line of stdin, a JSON object."""
    line = _line(sys.stdin.fileno())
    try:
        request = json.loads(line)
    except (ValueError, RecursionError):          # RecursionError: nested too deeply
        request = None
    if not isinstance(request, dict):
        raise NodesError("no request on stdin: `iomatrix node` commands are started by "
                         "`iomatrix run --nodes` over SSH")
    return request


def _validated(model: "type[M]", what: str) -> "M":
    """The controller's request (``_request``) as ``model``; NodesError in one line naming the
    first field that does not fit."""
    from pydantic import ValidationError

    try:
        return model.model_validate(_request())
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "the request"
        raise NodesError(f"not {what}: {where}: {first['msg']}") from None


def _line(fd: int) -> bytes:
    """One line of ``fd``, read unbuffered: what follows it stays unread (``watch_stdin``)."""
    got = bytearray()
    while not got.endswith(b"\n") and len(got) < 64 << 20:
        chunk = os.read(fd, 1)
        if not chunk:
            break
        got += chunk
    return bytes(got)


def _share_path(request: dict[str, Any]) -> Path:
    from iomatrix.cluster.ssh import NODE_NAME
    from iomatrix.measure.nodeside import node_store_path

    run_uuid, node = str(request.get("run_uuid", "")), str(request.get("node", ""))
    # both name a file: a uuid's hex digits and a node name, nothing else
    if not (run_uuid.isalnum() and run_uuid.isascii() and len(run_uuid) <= 64
            and NODE_NAME.fullmatch(node)):
        raise NodesError(f"a share is named by a run uuid and a node name, not "
                         f"{quoted(run_uuid)} and {quoted(node)}")
    return node_store_path(run_uuid, node)


@app.command()
def check() -> None:
    """Print this node's facts for a preflight (versions, KVM, problems with the suite), JSON."""
    from iomatrix.measure.nodeside import CheckRequest, node_facts, request_suite

    request = _validated(CheckRequest, "a check request")
    suite = request_suite(request)
    sys.stdout.write(node_facts(suite).model_dump_json() + "\n")


@app.command("run")
def run_share() -> None:
    """Measure this node's share of a cluster run; progress as JSON lines on stdout. Stops,
    cleaning up as Ctrl-C does, when stdin ends (the controller's session is gone)."""
    from iomatrix.cli.run import _interrupt
    from iomatrix.measure.nodeside import JsonProgress, NodeRequest, request_suite, watch_stdin
    from iomatrix.translate.fromvm import resolve_vm
    from iomatrix.measure.clusterpilot import NodePilot
    from iomatrix.measure.runner import Share, run_suite

    request = _validated(NodeRequest, "a run request")
    suite = resolve_vm(request_suite(request))
    if request.db is not None:
        from iomatrix.store.location import PgUrl, parse_location

        if not isinstance(parse_location(request.db), PgUrl):   # never a path of the node's
            raise NodesError("a shared store is a PostgreSQL URL")
        db, shared = request.db, True
    else:
        path = _share_path(request.model_dump())
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        db, shared = str(path), False
    progress = JsonProgress(sys.stdout)
    share = Share(node=request.node, run_uuid=request.run_uuid, shared=shared)
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _interrupt)
    # the cluster's one pilot: this node's trials to the controller, its plan back on stdin
    pilot = NodePilot(request.plan, progress.emit) if suite.method.plans_rounds else None
    watch_stdin(sys.stdin.fileno(), pilot.line if pilot else None)
    try:
        with open_store(db, must_exist=False) as store:
            outcome = run_suite(suite, store, keep=request.keep, progress=progress,
                                accel=request.accel, seed=request.seed,
                                retry_failed=request.retry_failed, share=share, pilot=pilot)
    except KeyboardInterrupt:
        progress.emit("interrupted")
        raise typer.Exit(ExitStatus.INTERRUPTED) from None
    finally:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)    # the session may end now: no matter
    progress.emit("done", ok=outcome.trials_ok, failed=outcome.trials_failed)
    if outcome.trials_failed:
        raise typer.Exit(ExitStatus.TRIALS_FAILED)


@app.command()
def export() -> None:
    """Write the store holding this node's share of a run (SQLite) to stdout."""
    from iomatrix.measure.nodeside import export_share

    export_share(_share_path(_request()), sys.stdout.buffer)


@app.command()
def forget() -> None:
    """Remove the store holding this node's share of a run (once the controller has it)."""
    from iomatrix.measure.nodeside import forget_share

    forget_share(_share_path(_request()))


@app.command("serve-guests")
def serve_guests() -> None:
    """Boot one configuration's guests for cluster load ([method] concurrent_nodes), their fio
    servers on Unix sockets only; say so in one line, and stop them when stdin ends."""
    from iomatrix.measure.nodeguests import serve_guests as serve

    _serve_session(serve, "a guest request")


@app.command("serve-blocklayer")
def serve_blocklayer() -> None:
    """Start one blocklayer configuration's qemu-storage-daemon and a fio server beside it for
    cluster load ([method] concurrent_nodes, an rbd pool), on Unix sockets only; say so in one
    line, and stop them when stdin ends."""
    from iomatrix.measure.nodeblock import serve_blocklayer as serve

    _serve_session(serve, "a blocklayer request")


def _serve_session(serve: Callable[[GuestRequest, int, IO[str]], None], what: str) -> None:
    """Serve the controller's request (``what``) on stdin until stdin ends (SIGHUP)."""
    from iomatrix.cli.run import _interrupt
    from iomatrix.drivers.cluster import GuestRequest

    request = _validated(GuestRequest, what)
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _interrupt)
    try:
        serve(request, sys.stdin.fileno(), sys.stdout)
    except KeyboardInterrupt:
        raise typer.Exit(ExitStatus.INTERRUPTED) from None
