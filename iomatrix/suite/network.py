"""Network storage as a suite names it: the [target] tables of a target that is not a local
directory or device (a Ceph RBD pool; an iSCSI LUN beside it). Only what the user writes, checked;
how iomatrix reaches each one is ``iomatrix.target.network`` and its module per kind
(``iomatrix.target.rbd``).

Credentials are never written in a suite: a target names the files that hold them (a Ceph
keyring), which only the programs that connect read."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, Field, field_validator, model_validator

from iomatrix.core.model import Frozen

NETWORK_KINDS = ("rbd",)
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


def _monitor(value: str) -> str:
    found = _MONITOR.match(value)
    port = value.rpartition(":")[2] if found and not value.endswith("]") and ":" in value else None
    if found is None or (port is not None and not 0 < int(port) < 65536):
        raise ValueError(f"monitor {value!r}: write host, host:port or [IPv6]:port "
                         "(e.g. \"192.0.2.10:3300\")")
    return value


class RbdTarget(Frozen):
    """``[target] rbd = { pool = "rbd", conf = "/etc/ceph/ceph.conf", client = "admin",
    keyring = "/etc/ceph/ceph.client.admin.keyring" }``: a Ceph pool iomatrix creates its own
    images in (``iomatrix-<run>-…``), reached through librbd. Give ``conf`` (the cluster's
    ceph.conf, which names the monitors) or ``monitors`` (then iomatrix writes a ceph.conf of
    its own for the run), or both (the monitors win over the file's)."""

    pool: str = Field(min_length=1, max_length=100, pattern=_NAME)
    namespace: str | None = Field(default=None, min_length=1, max_length=100, pattern=_NAME)
    conf: CephFile | None = None
    monitors: tuple[Annotated[str, AfterValidator(_monitor)], ...] = ()
    client: str = Field(default="admin", min_length=1, max_length=100, pattern=_NAME)
    """The cephx user without ``client.`` (Proxmox VE's ``username``)."""
    keyring: CephFile | None = None
    """The keyring file of ``client``; None: the one ``conf`` names, or no cephx at all with
    ``monitors`` alone (``auth_client_required = none``)."""
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
