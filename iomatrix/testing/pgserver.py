"""A PostgreSQL server of our own, for the tests and the benchmarks: Debian's binaries
(``initdb``, ``pg_ctl``), a cluster in a new private directory, a Unix socket in it and no TCP
at all, password authentication (SCRAM) for one superuser, the password in a ``.pgpass`` file
beside it. ``stop`` stops the server and removes the directory.

The server will not run as root: run by root, it runs as ``postgres`` (Debian's package makes
that user) or else ``nobody``, so its directory is made under ``$TMPDIR`` rather than in a
directory of root's that such a user cannot enter (pytest's own are root's, mode 0700)."""

from __future__ import annotations

import glob
import os
import pwd
import re
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

USER = "iomatrix"
"""The superuser of the test cluster."""


def binaries() -> Path | None:
    """The directory of the newest installed PostgreSQL's server programs, or None."""
    found = glob.glob("/usr/lib/postgresql/*/bin/initdb")
    if found:
        newest = max(found, key=lambda p: int(re.sub(r"\D", "", Path(p).parts[-3]) or 0))
        return Path(newest).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


class PgServer:
    """One running test cluster; ``url(name)`` reaches database ``name`` on it."""

    def __init__(self) -> None:
        bindir = binaries()
        if bindir is None:
            raise FileNotFoundError("no PostgreSQL server programs (initdb) installed")
        self.bindir = bindir
        self.password = secrets.token_hex(12)
        self.account = None
        if os.geteuid() == 0:
            name = "postgres" if _exists("postgres") else "nobody"
            self.account = pwd.getpwnam(name)
        self.dir = Path(tempfile.mkdtemp(prefix="iomatrix-pg-"))
        self.data = self.dir / "data"
        self.socket = self.dir           # the socket's path is short: well under 107 bytes
        self.pgpass = self.dir / "pgpass"
        self.log = self.dir / "server.log"
        self.running = False
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _run(self, *argv: str, timeout: float = 120) -> None:
        user = self.account.pw_uid if self.account else None
        group = self.account.pw_gid if self.account else None
        subprocess.run(argv, check=True, timeout=timeout, capture_output=True, user=user,
                       group=group, extra_groups=[] if user is not None else None,
                       env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8"})

    def _start(self) -> None:
        pwfile = self.dir / "pw"
        pwfile.write_text(self.password + "\n")
        if self.account:
            os.chown(self.dir, self.account.pw_uid, self.account.pw_gid)
            os.chown(pwfile, self.account.pw_uid, self.account.pw_gid)
        self.dir.chmod(0o700)
        self._run(str(self.bindir / "initdb"), "-D", str(self.data), "-U", USER,
                  f"--pwfile={pwfile}", "--auth=scram-sha-256", "-E", "UTF8", "--no-sync")
        pwfile.unlink()
        with open(self.data / "postgresql.conf", "a") as conf:
            # a Unix socket in our own directory, no TCP; fsync off: the tests never crash the
            # server, only its clients
            conf.write(f"\nlisten_addresses = ''\nunix_socket_directories = '{self.socket}'\n"
                       "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n")
        self._run(str(self.bindir / "pg_ctl"), "start", "-w", "-t", "120", "-D", str(self.data),
                  "-l", str(self.log), timeout=180)
        self.running = True
        self.pgpass.write_text(f"*:*:*:{USER}:{self.password}\n")
        self.pgpass.chmod(0o600)

    def env(self) -> dict[str, str]:
        """What a client needs in its environment to be let in: the ``.pgpass`` file."""
        return {"PGPASSFILE": str(self.pgpass)}

    def url(self, dbname: str) -> str:
        """The URL of database ``dbname``: the user, the socket directory; no password."""
        return f"postgresql://{USER}@/{dbname}?host={self.socket}"

    def admin(self, statement: str, params: tuple[Any, ...] = (), *,
              dbname: str = "postgres") -> list[tuple[Any, ...]]:
        """Run one statement as the superuser (autocommit); its rows, if any."""
        import psycopg

        with psycopg.connect(self.url(dbname), autocommit=True, passfile=str(self.pgpass)) as c:
            cur = c.execute(statement, params)
            return cur.fetchall() if cur.description else []

    def create_database(self, name: str) -> str:
        """A new, empty database; its URL."""
        self.admin(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        """Stop the server (fast, else at once) and remove its directory."""
        if self.running:
            for mode in ("fast", "immediate"):
                try:
                    self._run(str(self.bindir / "pg_ctl"), "stop", "-w", "-t", "60", "-m",
                              mode, "-D", str(self.data), timeout=90)
                    break
                except subprocess.SubprocessError:
                    continue
            self.running = False
        shutil.rmtree(self.dir, ignore_errors=True)


def _exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False
