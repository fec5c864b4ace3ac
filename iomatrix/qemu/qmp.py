"""Short QMP conversations over a UNIX socket, with the official qemu.qmp client."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from qemu.qmp import ConnectError, QMPClient, QMPError

from iomatrix.core.errors import ToolFailed
from iomatrix.qemu.escape import qemu_bool

# qemu.qmp logs every failed connection attempt at ERROR; the caller reports failures itself.
logging.getLogger("qemu.qmp").setLevel(logging.CRITICAL)

Command = tuple[str, Mapping[str, Any] | None]
REFUSED_RETRY = 2.0
"""Seconds a refused or missing monitor socket is tried again (see ``_connect``)."""


_state = {"busy": False, "interrupted": False}


def defer_interrupt() -> bool:
    """For a signal handler that stops the run: True when a QMP conversation is under way, and
    the interrupt is then raised as KeyboardInterrupt once it ends (within its timeout). An
    exception raised inside asyncio's event loop can leave the loop's clean-up waiting on the
    socket, and the run would never stop."""
    if _state["busy"]:
        _state["interrupted"] = True
        return True
    return False


def qmp_execute(socket: Path, commands: Sequence[Command], *, timeout: float = 10.0) -> list[Any]:
    """Connect to ``socket``, run ``commands`` in order, disconnect; their return values."""
    _state["busy"] = True
    try:
        return asyncio.run(_execute(socket, commands, timeout))
    finally:
        _state["busy"] = False
        if _state["interrupted"]:
            _state["interrupted"] = False
            raise KeyboardInterrupt


async def _execute(socket: Path, commands: Sequence[Command], timeout: float) -> list[Any]:
    client = QMPClient("iomatrix")
    try:
        await _connect(client, socket, timeout)
        results = []
        for name, args in commands:
            results.append(await asyncio.wait_for(client.execute(name, args), timeout))
        return results
    except (QMPError, OSError, EOFError, asyncio.TimeoutError) as exc:
        raise ToolFailed(f"QMP on {socket}: {type(exc).__name__}: {exc}",
                         argv=[str(socket)], returncode=None) from exc
    finally:
        # After "quit" QEMU closes the socket first: the client then reports EOF on disconnect.
        with contextlib.suppress(QMPError, OSError, EOFError):
            await client.disconnect()


async def _connect(client: QMPClient, socket: Path, timeout: float) -> None:
    """Connect within ``timeout``. A monitor socket exists from QEMU's bind() but accepts only
    after its listen(): a connection refused (or a socket not yet there) is tried again for up
    to :data:`REFUSED_RETRY` seconds, so a caller that waited for the file to appear cannot lose
    that race on a loaded host, while a QEMU that died and left its socket still fails soon."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    retry_until = loop.time() + min(timeout, REFUSED_RETRY)
    while True:
        try:
            await asyncio.wait_for(client.connect(str(socket)), max(deadline - loop.time(), 0.01))
            return
        except ConnectError as exc:
            if (not isinstance(exc.exc, (ConnectionRefusedError, FileNotFoundError))
                    or loop.time() + 0.05 >= retry_until):
                raise
        await asyncio.sleep(0.05)


def flatten_block_nodes(nodes: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """``query-named-block-nodes`` → ``<node>.driver`` / ``<node>.cache.direct`` /
    ``<node>.cache.no-flush`` / ``<node>.cache.writeback`` strings, per node, and
    ``<node>.backing-depth`` where a node has a backing chain."""
    out: dict[str, str] = {}
    for node in nodes:
        name = node.get("node-name")
        if not name or name.startswith("#"):
            continue
        out[f"{name}.driver"] = str(node.get("drv"))
        for key, value in (node.get("cache") or {}).items():
            out[f"{name}.cache.{key}"] = qemu_bool(value)
        if node.get("backing_file_depth"):
            out[f"{name}.backing-depth"] = str(node["backing_file_depth"])
    return out
