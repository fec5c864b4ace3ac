"""An iSCSI LUN as a suite names it (``[target.iscsi]``): where it is, never the secret. The
CHAP credentials stay in the file the user names (``chap``); a suite, and so the stored run,
the report and an export, hold only that file's path."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

from pydantic import Field, field_validator

from iomatrix.core.model import Frozen

DEFAULT_PORT = 3260
_HOST = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252})|\[[0-9A-Fa-f:.]{2,45}\])$")
_IQN = re.compile(r"^(?:iqn\.\d{4}-\d{2}\.[a-z0-9][a-z0-9.-]*(?::[A-Za-z0-9.:_-]{1,200})?"
                  r"|eui\.[0-9A-Fa-f]{16}|naa\.[0-9A-Fa-f]{16,32})$")
"""RFC 3720 §3.2.6.3 names, restricted to what reaches QEMU's option syntax safely (no comma,
no blank, no slash: the name is a component of an ``iscsi://`` URL)."""


class IscsiLun(Frozen):
    """``[target.iscsi]``: one LUN of an iSCSI target, written to and destroyed like a device."""

    portal: str = Field(max_length=300)
    """``host:port`` (port 3260 when left out); an IPv6 address in brackets."""
    target: str = Field(max_length=223)
    """The target's name: ``iqn.…``, ``eui.…`` or ``naa.…``."""
    lun: Annotated[int, Field(ge=0, le=16383)] = 0
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
