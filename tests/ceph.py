"""A single-node Ceph cluster for the RBD tests, made as Ceph's own vstart.sh makes one: one
monitor, one manager and one OSD on a memory-backed object store (memstore), every file (its
configuration, keyrings, data, logs, sockets) inside one directory, the monitor on a free port of
127.0.0.1, cephx on. ``Cluster.start`` brings it up with a pool; ``stop`` ends its daemons (by
the pids they wrote) and leaves the directory to its owner to remove.

Needs Debian's ceph-mon, ceph-mgr, ceph-osd and ceph-common (``./setup.sh --dev``); ``missing``
says what is not there."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from iomatrix.drivers.guest import free_port

PROGRAMS = ("ceph-mon", "ceph-mgr", "ceph-osd", "ceph", "rbd", "ceph-authtool", "monmaptool")
POOL = "iomatrix-test"
CLIENT = "iomatrix"
"""A cephx user of the tests' own, allowed the pool only (as a Proxmox VE storage's user is)."""


def class_dir() -> Path | None:
    """Where this host's OSD classes (libcls_rbd.so) are. Debian 13's Ceph 18 defaults
    ``osd class dir`` to a relative path (lib/x86_64-linux-gnu/rados-classes), which the OSD
    then cannot find: ``rbd create`` fails with EOPNOTSUPP. So the cluster names it."""
    return next((p.parent for p in sorted(Path("/usr/lib").glob("*/rados-classes/libcls_rbd.so"))),
                None)


def missing() -> str | None:
    """Why no cluster can be made here; None when it can."""
    gone = [p for p in PROGRAMS if shutil.which(p) is None]
    if gone:
        return f"{', '.join(gone)} not found (./setup.sh --dev installs ceph-mon ceph-mgr ceph-osd)"
    if os.geteuid() != 0:
        return "the test cluster runs as root"
    return None


class Cluster:
    """``address``: where its daemons listen (a cluster-load test's controller namespace has
    one its nodes reach: ``SshCluster.shared_address``); ``wrap``: what every command of its
    is run under (``SshCluster.controller``'s nsenter), where it is not this namespace."""

    def __init__(self, directory: Path, address: str = "127.0.0.1",
                 wrap: Sequence[str] = ()) -> None:
        self.address = address
        self.wrap = list(wrap)
        self.dir = directory
        self.conf = directory / "ceph.conf"
        self.admin_keyring = directory / "keyring"
        self.keyring = directory / f"client.{CLIENT}.keyring"
        self.port = 0
        self.fsid = str(uuid.uuid4())
        self.started = 0.0
        self.start_seconds = 0.0

    @property
    def monitor(self) -> str:
        return f"{self.address}:{self.port}"

    def _run(self, *argv: str, timeout: float = 60) -> str:
        done = subprocess.run([*self.wrap, *argv], capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: exit {done.returncode}: "
                               f"{(done.stderr or done.stdout).strip()[-2000:]}")
        return done.stdout

    def ceph(self, *args: str, timeout: float = 60) -> str:
        return self._run("ceph", "-c", str(self.conf), "-k", str(self.admin_keyring), *args,
                         timeout=timeout)

    def start(self) -> "Cluster":
        t0 = time.monotonic()
        d = self.dir
        for sub in ("mon.a", "mgr.x", "osd.0", "run", "log"):
            (d / sub).mkdir(mode=0o700)
        self.port = free_port()
        self.conf.write_text(f"""[global]
fsid = {self.fsid}
mon host = v2:{self.address}:{self.port}
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
keyring = {self.admin_keyring}
run dir = {d}/run
admin socket = {d}/run/$name.asok
pid file = {d}/run/$name.pid
log file = {d}/log/$name.log
mon data = {d}/mon.$id
mgr data = {d}/mgr.$id
osd data = {d}/osd.$id
osd class dir = {class_dir() or "/usr/lib/rados-classes"}
osd objectstore = memstore
memstore device bytes = 3221225472
osd pool default size = 1
osd pool default min size = 1
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
osd crush chooseleaf type = 0
ms bind ipv6 = false
ms bind msgr1 = false
public addr = {self.address}
osd max object name len = 460
osd max object namespace len = 64
mon data avail crit = 1
mon data avail warn = 2
mgr initial modules =
[mgr]
keyring = {d}/mgr.$id/keyring
[osd]
keyring = {d}/osd.$id/keyring
""")
        k = str(self.admin_keyring)
        self._run("ceph-authtool", "--create-keyring", k, "--gen-key", "-n", "mon.",
                  "--cap", "mon", "allow *")
        self._run("ceph-authtool", k, "--gen-key", "-n", "client.admin", "--cap", "mon",
                  "allow *", "--cap", "osd", "allow *", "--cap", "mgr", "allow *")
        monmap = str(d / "monmap")
        self._run("monmaptool", "--create", "--fsid", self.fsid, "--addv", "a",
                  f"[v2:{self.address}:{self.port}]", monmap)
        self._run("ceph-mon", "-c", str(self.conf), "--mkfs", "-i", "a", "--monmap", monmap,
                  "--keyring", k)
        self._run("ceph-mon", "-c", str(self.conf), "-i", "a")
        mgr_key = self.ceph("auth", "get-or-create", "mgr.x", "mon", "allow profile mgr", "osd",
                            "allow *", "mds", "allow *")
        (d / "mgr.x" / "keyring").write_text(mgr_key)
        self._run("ceph-mgr", "-c", str(self.conf), "-i", "x")
        osd_uuid = str(uuid.uuid4())
        osd_id = self.ceph("osd", "new", osd_uuid).strip()
        self._run("ceph-osd", "-c", str(self.conf), "-i", osd_id, "--mkfs", "--mkkey", "--no-mon-config",
                  "--osd-uuid", osd_uuid, timeout=120)
        self.ceph("auth", "add", f"osd.{osd_id}", "osd", "allow *", "mon", "allow profile osd",
                  "mgr", "allow profile osd", "-i", str(d / f"osd.{osd_id}" / "keyring"))
        self._run("ceph-osd", "-c", str(self.conf), "-i", osd_id)
        self.ceph("osd", "pool", "create", POOL, "8")
        self._run("rbd", "-c", str(self.conf), "-k", k, "pool", "init", POOL, timeout=120)
        self.keyring.write_text(self.ceph(
            "auth", "get-or-create", f"client.{CLIENT}", "mon", "profile rbd", "osd",
            f"profile rbd pool={POOL}"))
        self.keyring.chmod(0o600)
        self.start_seconds = time.monotonic() - t0
        return self

    def images(self) -> list[str]:
        """The images in the test pool."""
        out = self._run("rbd", "-c", str(self.conf), "-k", str(self.admin_keyring), "ls", POOL)
        return out.split()

    def stop(self, grace: float = 10) -> float:
        """End the daemons (SIGTERM, SIGKILL after ``grace`` seconds); the seconds it took."""
        t0 = time.monotonic()
        pids = []
        for pidfile in (self.dir / "run").glob("*.pid"):
            try:
                pids.append(int(pidfile.read_text().strip()))
            except (OSError, ValueError):
                continue
        for pid in pids:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.1)
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        return time.monotonic() - t0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:        # a zombie is gone for our purposes (its parent, init, reaps it)
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except OSError:
        return False
