"""Network storage as a suite names it: the [target] tables of a target that is not a local
directory or device (a Ceph RBD pool; an iSCSI LUN). Only what the user writes, checked;
how iomatrix reaches each one is ``iomatrix.targets.network`` and its module per kind
(``iomatrix.targets.rbd``, ``iomatrix.targets.iscsi``).

Credentials are never written in a suite: a target names the files that hold them (a Ceph
keyring, an iSCSI CHAP file), which only iomatrix's connecting code reads; a suite, and so the
stored run, the report and an export, hold only their paths."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, Field, field_validator, model_validator

from iomatrix.core.model import Frozen

NETWORK_KINDS = ("rbd", "iscsi")
"""The [target] keys naming network storage, one table each (``Target.network``)."""

_NAME = r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$"
"""A Ceph pool, namespace or client name as iomatrix accepts it: it is written into a
configuration file, QEMU options and an rbd command line, so nothing those read as syntax."""
_MONITOR = re.compile(r"^(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9][A-Za-z0-9.-]*)(?::\d{1,5})?$")
"""``host``, ``host:port``, ``[v6]`` or ``[v6]:port``; a port of 0 or above 65535 is refused
by the validator."""
_UNSAFE = re.compile(r"[\x00-\x1f\x7f,;=\\$#\[\]]")
"""What a file path given to Ceph may not hold: ceph.conf reads ``#``/``;`` as comments and
``$`` as a metavariable, QEMU's -drive reads ``,`` and ``:`` ``\\``-escaped."""


def _file(value: Path) -> Path:
    text = str(value)
    if _UNSAFE.search(text) or text != text.strip():
        raise ValueError("a file path given to Ceph may not hold control characters, blanks "
                         "at either end, or any of , ; = \\ $ # [ ]")
    if not value.is_absolute():
        raise ValueError("write the file's full path, e.g. /etc/ceph/ceph.conf")
    return value


CephFile = Annotated[Path, AfterValidator(_file)]
CephName = Annotated[str, Field(min_length=1, max_length=100, pattern=_NAME)]


def _monitor(value: str) -> str:
    found = _MONITOR.match(value)
    port = value.rpartition(":")[2] if found and not value.endswith("]") and ":" in value else None
    if found is None or (port is not None and not 0 < int(port) < 65536):
        raise ValueError(f"monitor {value!r}: write host, host:port or [IPv6]:port "
                         "(e.g. \"192.0.2.10:3300\")")
    return value


Monitor = Annotated[str, AfterValidator(_monitor)]


class RbdTarget(Frozen):
    """``[target] rbd = { pool = "rbd", conf = "/etc/ceph/ceph.conf", client = "admin",
    keyring = "/etc/ceph/ceph.client.admin.keyring" }``: a Ceph pool iomatrix creates its own
    images in (``iomatrix-<run>-…``), reached through librbd. Give ``conf`` (the cluster's
    ceph.conf, which names the monitors) or ``monitors``, or both (the monitors win over the
    file's). iomatrix hands no program this file: it reads only the monitors, the fsid and the
    keyring's path from it, and writes a ceph.conf of its own (``iomatrix.targets.rbd``)."""

    pool: CephName
    """The pool the images are made in."""
    namespace: CephName | None = None
    """An RBD namespace in the pool; absent: none."""
    conf: CephFile | None = None
    """The cluster's ceph.conf: iomatrix reads only the monitors, the fsid and the
    keyring's path from it and hands it to no program (it writes a ceph.conf of its own); or give
    ``monitors``."""
    monitors: tuple[Monitor, ...] = ()
    """The monitors' addresses (``"192.0.2.10:3300"``), instead of ``conf``."""
    client: CephName = "admin"
    """The cephx user without ``client.`` (Proxmox VE's ``username``)."""
    keyring: CephFile | None = None
    """The keyring file of ``client``; None: the one ``conf`` names, else librados' own search
    (/etc/ceph/ceph.client.NAME.keyring, …; no cephx without one). A file of secrets: held to
    rule 1 and mode 0600 (``iomatrix.core.trust.private_file``)."""
    connect_timeout: float = Field(default=20.0, gt=0, le=600)
    """Seconds the monitors get to answer and authenticate (``client_mount_timeout``): a
    wrong address or key fails within it."""
    krbd: bool = False
    """Proxmox VE's ``krbd 1``: guests get the image as the kernel maps it (/dev/rbd*), not
    through librbd. Needs the kernel's rbd module."""

    @field_validator("monitors", mode="before")
    @classmethod
    def _listed(cls, value: Any) -> Any:
        return (value,) if isinstance(value, str) else value

    @model_validator(mode="after")
    def _reachable(self) -> "RbdTarget":
        if self.conf is None and not self.monitors:
            raise ValueError("give conf = \"/etc/ceph/ceph.conf\" or monitors = [\"host:port\", "
                             "...]: iomatrix needs to know where the cluster's monitors are")
        if len(self.monitors) > 16:
            raise ValueError("at most 16 monitors")
        return self

    @property
    def spec(self) -> str:
        """``pool`` or ``pool/namespace``, as the rbd command names where images are."""
        return "/".join(p for p in (self.pool, self.namespace) if p)


DEFAULT_PORT = 3260
_HOST = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252})|\[[0-9A-Fa-f:.]{2,45}\])$")
_IQN = re.compile(r"^(?:iqn\.\d{4}-\d{2}\.[a-z0-9][a-z0-9.-]*(?::[A-Za-z0-9.:_-]{1,200})?"
                  r"|eui\.[0-9A-Fa-f]{16}|naa\.[0-9A-Fa-f]{16,32})$")
"""RFC 3720 §3.2.6.3 names, restricted to what reaches QEMU's option syntax safely (no comma,
no blank, no slash: the name is a component of an ``iscsi://`` URL)."""


class IscsiTarget(Frozen):
    """``[target] iscsi = { portal = "192.0.2.10:3260", target = "iqn.…", lun = 0 }``: one LUN of
    an iSCSI target, written to and destroyed like a device (``allow_destroy``)."""

    portal: str = Field(max_length=300)
    """``host:port`` (port 3260 when left out); an IPv6 address in brackets."""
    target: str = Field(max_length=223)
    """The target's name: ``iqn.…``, ``eui.…`` or ``naa.…``."""
    lun: Annotated[int, Field(ge=0, le=16383)] = 0
    """The LUN's number (0 when left out)."""
    chap: Path | None = None
    """A file holding ``user = "…"`` and ``password = "…"`` (TOML), mode 0600: read when a
    session starts, never copied anywhere."""
    connect_timeout: Annotated[float, Field(gt=0, le=300)] = 10.0
    """Seconds to wait for the portal to answer before the run is refused."""

    @field_validator("portal")
    @classmethod
    def _portal(cls, value: str) -> str:
        host, port = split_portal(value)
        if not _HOST.match(host):
            raise ValueError(f"{value!r} is not host:port (e.g. \"192.0.2.10:3260\")")
        if not 0 < port < 65536:
            raise ValueError(f"{value!r}: the port must be between 1 and 65535")
        return f"{host}:{port}"

    @field_validator("target")
    @classmethod
    def _iqn(cls, value: str) -> str:
        if not _IQN.match(value):
            raise ValueError(f"{value[:60]!r} is not an iSCSI name (e.g. "
                             "\"iqn.2003-01.org.example:storage.lun1\")")
        return value

    @field_validator("chap")
    @classmethod
    def _absolute(cls, value: Path | None) -> Path | None:
        if value is not None and (not value.is_absolute() or re.search(r"[\x00-\x1f]", str(value))):
            raise ValueError("write the credentials file's full path, e.g. /root/iscsi-chap.toml")
        return value

    @property
    def url(self) -> str:
        """``iscsi://portal/target/lun``, as QEMU and Proxmox VE write it (no credentials)."""
        return f"iscsi://{self.portal}/{self.target}/{self.lun}"


def split_portal(value: str) -> tuple[str, int]:
    """``host:port`` → (host, port); the default port when none is given."""
    host, port = value, DEFAULT_PORT
    found = re.match(r"^(\[[^\]]*\]|[^:]*)(?::(\d{1,5}))?$", value)
    if found:
        host = found.group(1)
        port = int(found.group(2)) if found.group(2) else DEFAULT_PORT
    return host, port
