"""Network storage as a run uses it: the common shape every such kind shares (a Ceph RBD pool,
``iomatrix.targets.rbd``; an iSCSI LUN, ``iomatrix.targets.iscsi``). A Proxmox VE storage id
is resolved into a [target] by ``iomatrix.targets.network``.

The shape, which the runner, the drivers and ``reclaim`` rely on:

- ``NetworkVolume`` (``iomatrix.targets.kind``): one volume on the storage as the programs
  reach it. ``node`` is QEMU's protocol node without ``driver``/``node-name``/``cache``
  (``-blockdev driver=rbd,…`` or ``iscsi``); ``drive_file`` the ``-drive file=`` string of the
  same (Proxmox VE 8's form); ``objects`` the ``--object`` values the node needs (a ``secret``
  read from a file the user named); ``hidden`` what a program's argv gets in place of a
  placeholder the node holds (a CHAP user name: ``reveal``), so stored commands never show it;
  ``fio`` the host-mode job options that replace ``ioengine``/``filename`` (fio's rbd engine;
  empty for a LUN, which host mode reaches as a block device or through a
  qemu-storage-daemon), with ``env`` for fio (``CEPH_CONF``). Credentials stay in the user's
  files: only their paths are in these, never their contents.
- ``Image.network`` carries it (``iomatrix.targets.kind.Image``); ``Image.path`` is then a
  name to show (``rbd:pool/image``), never opened.
- ``NetworkTarget``: the ``OpenTarget`` (``iomatrix.targets.kind``) every network kind builds
  on. It checks the connection in ``check`` (one line, ``TargetUnreachable``, within the kind's
  connect timeout) before anything is created or stored, records every volume it creates (the
  kind's ``Resource``: path the volume's name, within the connection as JSON with file paths
  only) before creating it, and removes them in ``close``; ``reclaim`` removes what a killed
  run left through ``Resource.remove``.
- Each kind is listed in ``iomatrix.targets.registry`` (``KINDS``, ``open_target``)."""

from __future__ import annotations

import json
import pwd
from collections.abc import Iterable
from pathlib import Path

from iomatrix.core.errors import TargetError, UntrustedFile
from iomatrix.core.trust import ANYONE, US, Author, readable_by
from iomatrix.platform.settings import NetworkNode
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.target import Target
from iomatrix.targets.kind import OpenTarget, Recorder


def secret_for(path: Path, key: str, author: Author, endpoint: str) -> None:
    """``UntrustedFile`` unless ``author``, who chose ``endpoint`` (the monitors or portal a
    key of ``path`` would prove itself to), can already read the file of secrets ``path``
    (``core.trust.readable_by``): root's key is never sent where another user chose, unless
    that user holds it anyway. One line naming ``key``, the file and why."""
    if readable_by(path, author):
        return
    if author.uid == ANYONE:
        who = "every user"
    else:
        try:
            who = f"{pwd.getpwuid(author.uid or 0).pw_name} (uid {author.uid})"
        except KeyError:
            who = f"uid {author.uid}"
    raise UntrustedFile(f"{key}: {path} is not readable by {who}, who could have written "
                        f"{author.where or 'the input'} and chose {endpoint}: the key would "
                        "prove itself there", hint="use credentials the input's author may "
                                                   "read, or input only root (or you) can write")


def reveal(argv: list[str], volume: NetworkNode | None) -> list[str]:
    """``argv`` as a program is started with it: each of the volume's ``hidden`` placeholders
    replaced by its value, as a JSON string (``-blockdev {…}``) or a ``key=value`` option
    (commas doubled); ``argv`` itself, the command iomatrix stores, keeps the placeholders."""
    hidden = getattr(volume, "hidden", None)
    if not hidden:
        return list(argv)
    out = []
    for arg in argv:
        for placeholder, value in hidden.items():
            arg = (arg.replace(json.dumps(placeholder), json.dumps(value))
                   .replace(f"={placeholder}", "=" + value.replace(",", ",,")))
        out.append(arg)
    return out


class NetworkTarget(OpenTarget):
    """What network kinds share of ``OpenTarget`` (see the module's docstring); each kind
    subclasses it."""

    kind = ""
    """The [target] key (``rbd``)."""

    def __init__(self, target: Target, *, keep: bool = False, record: Recorder | None = None,
                 scratch: Path | None = None, author: Author = US) -> None:
        self.target = target
        self.author = author
        """Who could have written the suite: a key is sent only where they may (``secret_for``)."""
        self.keep = keep
        self.record = record
        self.scratch = scratch
        """The run's private scratch directory (files the clients read: a ceph.conf)."""
        self.notes: list[str] = []
        self.preconditioned: set[Path] = set()
        self.image_size: int | None = None

    def raw_only(self, configs: Iterable[Configuration], why: str) -> None:
        """``TargetError`` when the matrix asks for a format other than raw (``why``: what
        the volumes are, for the message)."""
        others = sorted({c.format for c in configs if c.format not in (None, "raw")})
        if others:
            raise TargetError(f"[target] {self.kind}: {why}; drop format {', '.join(others)} "
                              "from the matrix")
