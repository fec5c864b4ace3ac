"""A Unix socket relayed to a TCP port, for a node's guests under cluster load: each guest's fio
server is forwarded by QEMU to a port of the node session's private network namespace, which
nothing outside it can reach; the relay listens on a Unix socket named by a path (reachable
from every namespace, guarded by its 0700 directory) for the controller's ``ssh -L``, and
connects each client to the port from inside the namespace.

The relay's threads are started by the thread that creates it and so share that thread's
network namespace (a network namespace is per thread, inherited by the threads it starts):
create it from the thread that entered the private namespace."""

from __future__ import annotations

import contextlib
import socket
import threading
from pathlib import Path

CONNECT_TIMEOUT = 10.0
ACCEPT_POLL = 0.2
"""How often the accepting thread looks whether the relay was closed."""


class Relay:
    """``path`` (a Unix socket, made here) relayed to ``host:port``; ``start``, then ``close``."""

    def __init__(self, path: Path, port: int, host: str = "127.0.0.1") -> None:
        self.path = path
        self.port = port
        self.host = host
        self._listener: socket.socket | None = None
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> Relay:
        """Listen on the socket (OSError when it cannot be made: it exists, or its directory
        does not)."""
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(str(self.path))
            listener.listen(8)
            listener.settimeout(ACCEPT_POLL)
        except OSError:
            listener.close()
            raise
        self._listener = listener
        self._spawn(self._accept)
        return self

    def close(self) -> None:
        """Stop listening, end every relayed connection and remove the socket."""
        self._stop.set()
        with self._lock:
            for conn in self._open:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
        for thread in list(self._threads):
            if thread is not threading.current_thread():
                thread.join(timeout=5)
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        self.path.unlink(missing_ok=True)

    def _spawn(self, target, *args) -> None:  # type: ignore[no-untyped-def]
        thread = threading.Thread(target=target, args=args, name="iomatrix-relay", daemon=True)
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            try:
                server = socket.create_connection((self.host, self.port),
                                                  timeout=CONNECT_TIMEOUT)
                server.settimeout(None)
            except OSError:
                client.close()          # the client sees its connection end: no server there
                continue
            with self._lock:
                if self._stop.is_set():
                    client.close()
                    server.close()
                    return
                self._open.update((client, server))
            done = threading.Barrier(2, action=lambda c=client, s=server: self._forget(c, s))
            self._spawn(self._pump, client, server, done)
            self._spawn(self._pump, server, client, done)

    def _pump(self, source: socket.socket, sink: socket.socket,
              done: threading.Barrier) -> None:
        """Copy one direction until its end, then pass the end on (half-close)."""
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)
        with contextlib.suppress(threading.BrokenBarrierError):
            done.wait()

    def _forget(self, client: socket.socket, server: socket.socket) -> None:
        """Both directions ended: close the pair."""
        with self._lock:
            self._open.difference_update((client, server))
        client.close()
        server.close()
