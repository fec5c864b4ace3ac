"""A real iSCSI target for the tests: Debian's tgtd serving one file-backed LUN from a test's
directory, on a free loopback port, with a control port of its own (its socket is
``/var/run/tgtd/socket.N``) so that it does not meet another tgtd; stopped after."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import IO
from pathlib import Path

from iomatrix.drivers.guest import free_port

IQN = "iqn.2026-11.org.iomatrix:test"
LUN = 1
"""tgtd's LUN 0 is its controller; the disk is LUN 1."""
CONTROL = Path("/var/run/tgtd")


@dataclass
class Tgt:
    portal: str
    iqn: str
    lun: int
    backing: Path
    control: int
    started_s: float
    """Seconds from starting tgtd to the LUN being served."""
    pid: int = 0
    """tgtd's process (what a check of processes left behind keeps)."""

    def adm(self, *args: str, check: bool = True) -> str:
        done = subprocess.run(["tgtadm", "-C", str(self.control), "--lld", "iscsi", *args],
                              capture_output=True, text=True, timeout=30)
        if check and done.returncode != 0:
            raise RuntimeError(f"tgtadm {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def connections(self) -> str:
        """tgtd's list of the target's iSCSI connections (empty: no session)."""
        return self.adm("--op", "show", "--mode", "conn", "--tid", "1").strip()

    def require_chap(self, user: str, password: str) -> None:
        self.adm("--op", "new", "--mode", "account", "--user", user, "--password", password)
        self.adm("--op", "bind", "--mode", "account", "--tid", "1", "--user", user)


def tgt_problem() -> str | None:
    """Why no tgtd can be started here; None when it can."""
    if shutil.which("tgtd") is None or shutil.which("tgtadm") is None:
        return "tgt is not installed (./setup.sh --dev installs it)"
    if os.geteuid() != 0:
        return "tgtd needs root"
    if subprocess.run(["qemu-img", "--help"], capture_output=True, text=True,
                      timeout=30).stdout.find("iscsi") < 0:
        return "QEMU has no iscsi driver (./setup.sh installs qemu-block-extra)"
    return None


@contextlib.contextmanager
def tgtd(directory: Path, size: int = 64 << 20, backing: Path | None = None,
         address: str = "127.0.0.1", wrap: Sequence[str] = ()) -> Iterator[Tgt]:
    """tgtd with one LUN backed by ``backing`` (by default a new ``size`` file in
    ``directory``), its portal on ``address`` (``wrap``: what tgtd is started under, in
    another network namespace: ``SshCluster.controller``); stopped on leaving."""
    if backing is None:
        backing = directory / "lun.img"
        with open(backing, "wb") as f:
            f.truncate(size)
    log = open(directory / "tgtd.log", "wb")
    start = time.monotonic()
    proc, port, control = _start(wrap, address, log, directory)
    tgt = Tgt(portal=f"{address}:{port}", iqn=IQN, lun=LUN, backing=backing, control=control,
              started_s=0.0, pid=proc.pid)
    try:
        tgt.adm("--op", "new", "--mode", "target", "--tid", "1", "-T", IQN)
        tgt.adm("--op", "new", "--mode", "logicalunit", "--tid", "1", "--lun", str(LUN),
                "-b", str(backing))
        tgt.adm("--op", "bind", "--mode", "target", "--tid", "1", "-I", "ALL")
        tgt.started_s = time.monotonic() - start
        yield tgt
    finally:
        # tgtd in the foreground ignores SIGTERM and outlives "--op delete --mode system" by
        # 10 s and more; it keeps nothing that needs saving (the LUN's file is the test's)
        proc.kill()
        proc.wait(timeout=10)
        log.close()
        for leftover in (CONTROL / f"socket.{control}", CONTROL / f"socket.{control}.lock"):
            leftover.unlink(missing_ok=True)


def _start(wrap: Sequence[str], address: str, log: IO[bytes],
           directory: Path) -> tuple[subprocess.Popen[bytes], int, int]:
    """tgtd started on a free port and control number, answering tgtadm, and the one listening
    on that port: ``free_port`` only says the port was free a moment before, and a port another
    process took meanwhile (a guest's forwarded fio port) would take the initiator's login and
    never answer it (QEMU's iscsi driver then waits for ever). Tried again on another port."""
    for _ in range(5):
        port = free_port()
        control = next(n for n in iter(lambda: random.randrange(1000, 2000), None)
                       if not (CONTROL / f"socket.{n}").exists())
        proc = subprocess.Popen([*wrap, "tgtd", "-f", "-C", str(control),
                                 "--iscsi", f"portal={address}:{port}"],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while subprocess.run(["tgtadm", "-C", str(control), "--op", "show", "--mode", "sys"],
                             capture_output=True, timeout=10).returncode != 0:
            assert proc.poll() is None, (directory / "tgtd.log").read_text()
            assert time.monotonic() < deadline, "tgtd did not start"
            time.sleep(0.05)
        listening = subprocess.run([*wrap, "ss", "-Hltnp", f"sport = :{port}"],
                                   capture_output=True, text=True, timeout=10).stdout
        if f"pid={proc.pid}," in listening:
            return proc, port, control
        proc.kill()
        proc.wait(timeout=10)
        for leftover in (CONTROL / f"socket.{control}", CONTROL / f"socket.{control}.lock"):
            leftover.unlink(missing_ok=True)
    raise AssertionError(f"tgtd never got a port of its own: {listening!r}")
