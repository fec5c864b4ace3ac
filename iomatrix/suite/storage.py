"""A Proxmox VE storage id as a run's target (``iomatrix run --storage-cfg FILE --storage ID``):
the storage's definition in ``/etc/pve/storage.cfg`` names where the images go, as Proxmox VE
itself would put them.

- ``dir``, ``nfs``, ``cifs``: the directory of the storage's VM images, ``<path>/images`` (or
  its ``content-dirs`` images entry); nfs and cifs default to ``/mnt/pve/<id>`` as pve-storage's
  plugins do, and must be mounted there (Proxmox VE mounts them while the storage is active).
- ``iscsidirect`` (libiscsi in QEMU) and ``iscsi`` (the kernel's open-iscsi): the storage's
  portal and target, the LUN named as Proxmox VE names its volumes (``ID:lunN``, LUN 0 when
  none is given), as ``[target.iscsi]`` (``iomatrix.target.iscsi``: host mode uses the kernel's
  block device where the host is logged in, the other modes libiscsi)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from iomatrix.platform.proxmox import Storage, parse_storage_cfg

STORAGE_TYPES = ("dir", "nfs", "cifs", "iscsi", "iscsidirect")
"""The storage types a run can measure by id here (rbd: see the Ceph target)."""


def target_keys(cfg_text: str, spec: str, *, mounted: Any = None) -> dict[str, Any]:
    """The [target] keys that put a run on storage ``spec`` (``ID`` or ``ID:lunN``) of the
    storage.cfg text; ValueError with one line when the id or type cannot be measured.
    ``mounted(path) -> bool`` checks a network directory is mounted (None: not checked)."""
    ident, _, volume = spec.partition(":")
    storages = parse_storage_cfg(cfg_text)
    storage = storages.get(ident)
    if storage is None:
        known = ", ".join(sorted(storages)) or "none"
        raise ValueError(f"storage {ident!r} is not in the storage.cfg given (it defines: {known})")
    if storage.type not in STORAGE_TYPES:
        raise ValueError(f"storage {ident} is of type {storage.type}: iomatrix measures "
                         f"{', '.join(STORAGE_TYPES)} storages by id")
    if storage.type in ("iscsi", "iscsidirect"):
        return {"iscsi": _lun(storage, volume)}
    if volume:
        raise ValueError(f"storage {ident} ({storage.type}) is a directory: name it without "
                         f"':{volume}'")
    return {"directory": str(_images(storage, mounted))}


def _lun(storage: Storage, volume: str) -> dict[str, Any]:
    found = re.match(r"^lun(\d{1,5})$", volume) if volume else None
    if volume and found is None:
        raise ValueError(f"storage {storage.id}: name the LUN as Proxmox VE does, "
                         f"{storage.id}:lunN (not {volume!r})")
    if not storage.portal or not storage.target:
        raise ValueError(f"storage {storage.id} ({storage.type}) names no portal or target")
    return {"portal": storage.portal, "target": storage.target,
            "lun": int(found.group(1)) if found else 0}


def _images(storage: Storage, mounted: Any) -> Path:
    path = storage.path or (f"/mnt/pve/{storage.id}" if storage.type != "dir" else None)
    if path is None:
        raise ValueError(f"storage {storage.id} (dir) names no path")
    if storage.type != "dir" and mounted is not None and not mounted(Path(path)):
        raise ValueError(f"storage {storage.id} ({storage.type}): {path} is not mounted "
                         "(Proxmox VE mounts it while the storage is active: pvesm status)")
    return Path(path) / dict(storage.content_dirs).get("images", "images")
