"""An iSCSI LUN as the storage under test (``[target.iscsi]``).

Every mode reaches the LUN through QEMU's userspace initiator, libiscsi (Debian's
``qemu-block-extra``; built into Proxmox VE's QEMU), unless the host is logged in to the LUN with
open-iscsi already, in which case host mode measures its block device:

- ``host``: the LUN's block device (``/dev/disk/by-path/ip-PORTAL-iscsi-IQN-lun-N``) where the
  kernel initiator has it; iomatrix does not log in itself, so no session of its own can outlive
  a killed run. Elsewhere (no ``iscsi_tcp``, or not logged in) the baseline is libiscsi through a
  qemu-storage-daemon exporting the raw LUN over NBD to fio with cache=none (Debian's fio has no
  libiscsi engine), and the trial says so.
- ``blocklayer``: qemu-storage-daemon with the ``iscsi`` driver and the configuration's cache.
  aio is not evaluated: ``aio=`` belongs to the ``file`` and ``host_device`` drivers, and
  libiscsi does its own non-blocking socket I/O in QEMU's event loop.
- ``guest``: the appliance's disk on libiscsi as QEMU (or Proxmox VE's ``iscsidirect`` storage)
  attaches it.

CHAP: the credentials file (TOML ``user`` and ``password``, mode 0600, owned by root or this
user) is read when a QEMU starts; the password reaches QEMU as a ``secret`` object read from a
file in the session's private directory that is removed as soon as QEMU has read it, so it never
appears on a command line, in the database, a report or an export. The user name appears on
QEMU's command line (QEMU takes it only there) and is replaced by ``<chap user>`` in the command
iomatrix stores.

A session ends with its QEMU: libiscsi logs out when QEMU exits, and the target drops the
connection of a QEMU killed outright when its socket closes."""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import tempfile
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from iomatrix.core.errors import TargetError, ToolFailed
from iomatrix.core.proc import require, run
from iomatrix.platform.proxmox import Storage
from iomatrix.suite.iscsi import IscsiLun, split_portal

SECRET_ID = "iscsi-chap"
"""The ``secret`` object holding the CHAP password in every QEMU iomatrix starts."""
CHAP_USER = "<chap user>"
"""What a stored command shows in place of the CHAP user name."""
SYS_MODULE = Path("/sys/module/iscsi_tcp")
BY_PATH = Path("/dev/disk/by-path")


class Chap:
    """CHAP credentials as read from the user's file; never printed (``repr`` hides them)."""

    __slots__ = ("user", "password")

    def __init__(self, user: str, password: str) -> None:
        self.user = user
        self.password = password

    def __repr__(self) -> str:
        return "Chap(<hidden>)"


def read_chap(path: Path) -> Chap:
    """The credentials in ``path``; TargetError (naming the file, never its contents) when it
    is missing, not private or not a TOML file with ``user`` and ``password``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise TargetError(f"[target.iscsi] chap: cannot read {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise TargetError(f"[target.iscsi] chap: {path} is not a regular file")
        if st.st_uid not in (0, os.geteuid()):
            raise TargetError(f"[target.iscsi] chap: {path} belongs to another user (uid "
                              f"{st.st_uid}): its credentials could be swapped",
                              hint=f"chown root {path}")
        if st.st_mode & 0o077:
            raise TargetError(f"[target.iscsi] chap: {path} can be read or written by others "
                              f"(mode {stat.S_IMODE(st.st_mode):04o})", hint=f"chmod 600 {path}")
        with os.fdopen(os.dup(fd), "rb") as f:
            raw = f.read(65536)
    finally:
        os.close(fd)
    try:
        data = tomllib.loads(raw.decode())
    except (UnicodeDecodeError, tomllib.TOMLDecodeError):
        data = None           # the parser's message can quote the file: say nothing of it
    user = data.get("user") if isinstance(data, dict) else None
    password = data.get("password") if isinstance(data, dict) else None
    if not (isinstance(user, str) and isinstance(password, str) and user and password
            and not re.search(r"[\x00-\x1f]", user + password)):
        raise TargetError(f"[target.iscsi] chap: {path} is not a TOML file with user = \"…\" "
                          "and password = \"…\" (one line each)")
    return Chap(user, password)


def protocol_node(lun: IscsiLun) -> dict[str, Any]:
    """QEMU's ``iscsi`` protocol node options for the LUN (with CHAP: the user and the
    password secret, the user a placeholder :meth:`Secret.argv` fills in)."""
    node: dict[str, Any] = {"driver": "iscsi", "transport": "tcp", "portal": lun.portal,
                            "target": lun.target, "lun": lun.lun}
    if lun.chap is not None:
        node |= {"user": CHAP_USER, "password-secret": SECRET_ID}
    return node


class Secret:
    """A LUN's CHAP credentials made ready for one QEMU: :meth:`argv` gives it the ``secret``
    object (a 0600 file in the session's private directory) and the user name."""

    def __init__(self, chap: Chap | None, file: Path) -> None:
        self.chap = chap
        self.file = file

    def argv(self, argv: list[str], option: str = "--object", at: int = 1) -> list[str]:
        """``argv`` as QEMU is to be given it: the secret object at ``at`` (after the program;
        after qemu-img's subcommand: 2), as ``option`` (``--object`` for qemu-img and
        qemu-storage-daemon, ``-object`` for QEMU), and the CHAP user in place of
        :data:`CHAP_USER`; unchanged without CHAP."""
        if self.chap is None:
            return list(argv)
        user = self.chap.user
        filled = [a.replace(json.dumps(CHAP_USER), json.dumps(user))
                  .replace(f"user={CHAP_USER}", f"user={user.replace(',', ',,')}") for a in argv]
        return [*filled[:at], option, f"secret,id={SECRET_ID},file={self.file}", *filled[at:]]

    def forget(self) -> None:
        """Remove the secret's file (QEMU reads it once, when it starts)."""
        self.file.unlink(missing_ok=True)


@contextlib.contextmanager
def chap_secret(lun: IscsiLun | None, directory: Path) -> Iterator[Secret]:
    """The LUN's credentials (none without ``chap``, or for no LUN) as a :class:`Secret` whose
    file is written in ``directory`` (the session's own) and removed on leaving the block."""
    path = directory / "chap.secret"
    if lun is None or lun.chap is None:
        yield Secret(None, path)
        return
    chap = read_chap(lun.chap)
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(chap.password)
    try:
        yield Secret(chap, path)
    finally:
        path.unlink(missing_ok=True)


def probe(lun: IscsiLun) -> int:
    """Log in to the LUN once (qemu-img, libiscsi) and return its size in bytes; TargetError
    with one line saying what is wrong (no answer, no such target or LUN, CHAP refused) within
    ``lun.connect_timeout``."""
    qemu_img = require("qemu-img")
    with tempfile.TemporaryDirectory(prefix="iomatrix-iscsi-") as private, \
            chap_secret(lun, Path(private)) as secret:
        argv = [qemu_img, "info", "--output=json", "--image-opts",
                ",".join(f"{k}={v}" for k, v in protocol_node(lun).items())]
        try:
            done = run(secret.argv(argv, at=2), timeout=lun.connect_timeout, check=False)
        except ToolFailed as exc:           # the timeout
            raise TargetError(f"[target.iscsi] {lun.portal}: no answer within "
                              f"{lun.connect_timeout:g} s",
                              hint="check the portal's address and that nothing filters "
                                   "the port") from exc
    if done.returncode != 0:
        raise TargetError(f"[target.iscsi] {lun.url}: {explain(done.stderr)}",
                          hint=_HINTS.get(explain(done.stderr)))
    try:
        return int(json.loads(done.stdout)["virtual-size"])
    except (ValueError, KeyError, TypeError) as exc:
        raise TargetError(f"[target.iscsi] {lun.url}: qemu-img gave no size") from exc


_HINTS = {
    "the portal does not answer (connection refused or unreachable)":
        "check host:port (iSCSI listens on 3260 by default)",
    "the portal has no target of that name": "list the portal's targets (iscsi-ls, or "
                                             "iscsiadm -m discovery -t st -p PORTAL)",
    "the target has no such LUN": "list the target's LUNs (iscsi-ls -s)",
    "the target refused the login (CHAP user or password wrong, or CHAP required)":
        "check the credentials file ([target.iscsi] chap)",
    "QEMU has no iscsi block driver": "apt-get install qemu-block-extra",
}


def explain(stderr: str) -> str:
    """libiscsi's failure, as QEMU reports it, in iomatrix's words (one line)."""
    text = stderr or ""
    if "Unknown driver 'iscsi'" in text or "Unknown protocol 'iscsi'" in text:
        return "QEMU has no iscsi block driver"
    if "Authentication failure" in text or "Authorization failure" in text:
        return "the target refused the login (CHAP user or password wrong, or CHAP required)"
    if "Target not found" in text:
        return "the portal has no target of that name"
    if "LOGICAL_UNIT_NOT_SUPPORTED" in text:
        return "the target has no such LUN"
    if "iscsi_service" in text or "connect" in text.lower() and "refused" in text.lower():
        return "the portal does not answer (connection refused or unreachable)"
    last = next((line for line in reversed(text.splitlines()) if line.strip()), "")
    return last.split(": ", 1)[-1][:200] or "qemu-img failed without a message"


PVE_STORAGE = "iomatrix-iscsi"
"""The id of the ``iscsidirect`` storage a LUN is given on platform proxmox."""


def pve_storages(lun: IscsiLun) -> dict[str, Storage]:
    """The storage.cfg entry Proxmox VE would have for the LUN: ``iscsidirect`` (libiscsi)."""
    return {PVE_STORAGE: Storage(id=PVE_STORAGE, type="iscsidirect", portal=lun.portal,
                                 target=lun.target)}


def pve_volume(lun: IscsiLun) -> str:
    """The LUN's volume id on that storage (``STORAGE:lunN``)."""
    return f"{PVE_STORAGE}:lun{lun.lun}"


def kernel_device(lun: IscsiLun, *, by_path: Path = BY_PATH) -> Path | None:
    """The LUN's block device where the host's kernel initiator (open-iscsi) is logged in to it
    (udev's ``by-path`` name), else None."""
    host, port = split_portal(lun.portal)
    device = by_path / f"ip-{host.strip('[]')}:{port}-iscsi-{lun.target}-lun-{lun.lun}"
    return device if device.is_block_device() else None


def kernel_initiator_problem(*, module: Path = SYS_MODULE) -> str | None:
    """Why the kernel's iSCSI initiator is not available on this host, None when it is."""
    if module.exists():
        return None
    release = os.uname().release
    found = any((Path("/lib/modules") / release).glob("kernel/drivers/scsi/iscsi_tcp.ko*"))
    if not found:
        return (f"not available on this host: the kernel ({release}) has no iscsi_tcp module "
                "(kernel iSCSI initiator)")
    return "not available on this host: iscsi_tcp is not loaded (modprobe iscsi_tcp)"
