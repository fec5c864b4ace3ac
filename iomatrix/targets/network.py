"""Network storage as a run uses it: the common shape every kind shares (a Ceph RBD pool,
``iomatrix.targets.rbd``; an iSCSI LUN, ``iomatrix.targets.iscsi``), and a Proxmox VE storage id
resolved into a [target].

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
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Callable

from iomatrix.core.errors import TargetError, UntrustedFile
from iomatrix.core.trust import ANYONE, US, Author, readable_by
from iomatrix.platform import proxmox as pve
from iomatrix.platform.settings import NetworkNode
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.target import Target
from iomatrix.targets.kind import OpenTarget, Recorder
from iomatrix.suite.target import NETWORK_KINDS


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


def resolve_storage(target: Target, storages: dict[str, pve.Storage], pve_dir: Path, *,
                    mounted: Callable[[Path], bool] | None = None) -> Target:
    """A ``[target] storage = "ID"`` (``"ID:lunN"`` for a LUN) as the [target] it names in
    ``storages`` (a parsed storage.cfg in ``pve_dir``, /etc/pve on Proxmox VE), where Proxmox VE
    itself would put a VM's disks: rbd → ``rbd`` (``rbd_of_storage``); iscsidirect (libiscsi)
    and iscsi (open-iscsi) → ``iscsi``, the storage's portal and target and the LUN named as
    Proxmox VE names its volumes (LUN 0 when none is); dir/nfs/cifs → ``directory``, the
    storage's images directory (``<path>/images`` or its ``content-dirs`` images entry; nfs and
    cifs at /mnt/pve/ID unless path says, as pve-storage's plugins mount them, which
    ``mounted(path)`` checks when given). Any other target is returned as it is. ``ValueError``
    says what cannot be measured."""
    if target.storage is None:
        return target
    ident, _, volume = target.storage.partition(":")
    storage = storages.get(ident)
    if storage is None:
        known = ", ".join(sorted(storages)) or "none"
        raise ValueError(f"storage {ident!r} is not in the storage.cfg given (it defines: {known})")
    rest = target.model_dump(exclude={"storage", "directory", "device", *NETWORK_KINDS},
                             exclude_none=True)
    if storage.type in ("iscsi", "iscsidirect"):
        return Target.model_validate({**rest, "iscsi": _lun_of_storage(storage, volume)})
    if volume:
        raise ValueError(f"storage {ident} ({storage.type}) is not an iSCSI storage: name it "
                         f"without ':{volume}'")
    if storage.type == "rbd":
        return Target.model_validate({**rest, "rbd": rbd_of_storage(storage, pve_dir)})
    if storage.type in ("dir", "nfs", "cifs"):
        path = storage.path or (f"/mnt/pve/{ident}" if storage.type != "dir" else None)
        if path is None:
            raise ValueError(f"storage {ident} (dir) has no path in the storage.cfg given")
        if storage.type != "dir" and mounted is not None and not mounted(Path(path)):
            raise ValueError(f"storage {ident} ({storage.type}): {path} is not mounted "
                             "(Proxmox VE mounts it while the storage is active: pvesm status)")
        images = Path(path) / dict(storage.content_dirs).get("images", "images")
        return Target.model_validate({**rest, "directory": str(images)})
    raise ValueError(f"storage {ident} is of type {storage.type}: iomatrix measures rbd, "
                     "iscsi, iscsidirect, dir, nfs and cifs storages by their id (a device or "
                     "directory of any other: give it as [target] device or directory)")


def _lun_of_storage(storage: pve.Storage, volume: str) -> dict[str, Any]:
    found = re.match(r"^lun(\d{1,5})$", volume) if volume else None
    if volume and found is None:
        raise ValueError(f"storage {storage.id}: name the LUN as Proxmox VE does, "
                         f"{storage.id}:lunN (not {volume!r})")
    if not storage.portal or not storage.target:
        raise ValueError(f"storage {storage.id} ({storage.type}) names no portal or target")
    return {"portal": storage.portal, "target": storage.target,
            "lun": int(found.group(1)) if found else 0}


def rbd_of_storage(storage: pve.Storage, pve_dir: Path) -> dict[str, Any]:
    """A Proxmox VE rbd storage as ``[target] rbd`` keys, as pve-storage's CephConfig.pm
    ceph_connect_option connects: the keyring ``priv/ceph/ID.keyring`` in ``pve_dir`` where it
    exists (else no cephx), the configuration ``priv/ceph/ID.conf`` for an external cluster
    (monhost), ``ceph.conf`` there for one Proxmox VE manages; user ``username`` or admin;
    pool ``rbd`` when none is named."""
    out: dict[str, Any] = {"pool": storage.pool or "rbd", "client": storage.username or "admin",
                           "krbd": storage.krbd}
    if storage.namespace:
        out["namespace"] = storage.namespace
    priv = pve_dir / "priv" / "ceph"
    if storage.monhost:
        out["monitors"] = [m for m in re.split(r"[,;\s]+", storage.monhost.strip()) if m]
        if (priv / f"{storage.id}.conf").exists():
            out["conf"] = str(priv / f"{storage.id}.conf")
    else:
        out["conf"] = str(pve_dir / "ceph.conf")
    if (priv / f"{storage.id}.keyring").exists():
        out["keyring"] = str(priv / f"{storage.id}.keyring")
    return out
