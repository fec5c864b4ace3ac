"""Versions that move a baseline: the one table of upgrades after which the same configuration
measures differently, each row checked in its project's source and cited, and which of them two
runs (or a run and the study a finding transcribes) lie on either side of.

A row names the component, the first version with the change, what changes and where it
applies (a change only some configurations meet is still warned of for the whole comparison:
the warning names where it applies, the reader judges the points). A run's side of a boundary
comes from what it recorded (``runs.host_json``: ``qemu``, ``zfs`` and the target's ``target_fs``;
its [method]'s ``platform`` and ``pve_version``); a run that did not record it, or that the row
does not apply to (a ZFS row on ext4), is on no side and is never warned of.

Rows, and what their source says (each claim as the issue put it was checked there; where the
source said otherwise the row says what the source says):

- QEMU 10.0, file-posix: a write the guest's device wants durable (``BDRV_REQ_FUA``, every write
  of a disk whose write cache is off: cache=writethrough and directsync) is sent as one write
  with ``RWF_DSYNC`` with aio=native and io_uring, where QEMU before sent the write and then a
  separate flush; aio=threads still flushes separately (QEMU commit 984a32f17e, "file-posix:
  Support FUA writes"). QEMU's block layer has asked for FUA on a writethrough disk's writes
  for years; what 10.0 changed is that file-posix no longer emulates it with a flush.
- OpenZFS 2.3.0: Direct I/O, the ``direct`` property (default ``standard``: an O_DIRECT request
  aligned to the recordsize bypasses the ARC; 2.2 and before ignored O_DIRECT and cached every
  request). Files on a dataset only, on Linux (FreeBSD: off by default): "ZVOLs and dedup is not
  currently supported with Direct I/O" (openzfs commit a10e552b99; man zfsprops ``direct``), so a
  zvol's baseline does not move.
- Proxmox VE (qemu-server 9.0): from machine version 10.0 (QEMU's, not a ``+pveN``) a disk is
  attached with -blockdev, under a throttle filter node (its throttle group) over every drive,
  except a passthrough scsi-block disk (qemu-server commits aaf48d8e, "command line: switch to
  blockdev starting with machine version 10.0", and c031d373); a machine pinned below 10.0
  keeps PVE 8's -drive. iomatrix models the two generations as ``[method] pve_version`` 9 and 8.
"""

from __future__ import annotations

from collections.abc import Mapping

from iomatrix.core.model import Frozen
from iomatrix.platform.libvirt.versions import Version, parse_version
from iomatrix.platform.proxmox.config import DEFAULT_PVE_VERSION
from iomatrix.store.records import Part, StoredRun
from iomatrix.suite.findings import VersionComponent

Component = VersionComponent
"""What a row's version is of: ``qemu`` and ``zfs`` as a run's host record has them
(``telemetry.hostinfo``), ``proxmox`` the qemu-server generation whose disk graph the run's
guests got (its [method] ``pve_version``, with platform = "proxmox")."""


class VersionChange(Frozen):
    """One row: from ``boundary`` on, ``component`` behaves differently."""

    component: Component
    boundary: Version
    name: str
    """How the change is named in a warning: "QEMU 10.0: writethrough writes with FUA"."""
    changes: str
    applies: str
    """The configurations it moves."""
    source: str
    """Where the claim was checked: a commit's URL."""


CHANGES: tuple[VersionChange, ...] = (
    VersionChange(
        component="qemu", boundary=(10, 0, 0),
        name="QEMU 10.0: writethrough writes with FUA (RWF_DSYNC) instead of a write and a flush",
        changes="file-posix sends a write the device wants durable as one write with RWF_DSYNC "
                "instead of the write followed by a separate flush",
        applies="cache=writethrough and directsync (write cache off) with aio=native or "
                "io_uring; aio=threads still flushes separately",
        source="https://gitlab.com/qemu-project/qemu/-/commit/984a32f17e8dab0dc3d2328c46cb3e0c0a472a73"),
    VersionChange(
        component="zfs", boundary=(2, 3, 0),
        name="OpenZFS 2.3: Direct I/O (O_DIRECT bypasses the ARC)",
        changes="an O_DIRECT request (cache=none, directsync; fio direct=1) aligned to the "
                "recordsize bypasses the ARC (direct=standard, the default); 2.2 and before "
                "cached it",
        applies="images on a ZFS dataset (a directory target on ZFS), Linux; not zvols",
        source="https://github.com/openzfs/zfs/commit/a10e552b9992673626f7a2ffcc234337f23410c9"),
    VersionChange(
        component="proxmox", boundary=(9, 0, 0),
        name="Proxmox VE 9 (machine version 10.0): -blockdev with a throttle node over every drive",
        changes="qemu-server attaches a disk with -blockdev under a throttle filter node "
                "instead of -drive",
        applies="platform = \"proxmox\": every drive but a passthrough scsi-block disk, on a "
                "machine version 10.0 or later (pinned below: -drive as in PVE 8)",
        source="https://git.proxmox.com/?p=qemu-server.git;a=commit;h=aaf48d8e5a74156c1dd2651a5a954c818878932c"),
)
"""The table: every version change iomatrix knows to move a baseline."""


class Straddle(Frozen):
    """A change two sides lie on either side of, with each side's version as recorded."""

    change: VersionChange
    a: str
    b: str

    def text(self, a: str = "A", b: str = "B") -> str:
        """One line for a warning: the change, the two sides' versions (named ``a`` and ``b``),
        where it applies, the source."""
        c = self.change
        return f"{c.name}: {a} {self.a} · {b} {self.b}; it moves {c.applies} ({c.source})"


Versions = Mapping[str, str]
"""A side's versions by component (``versions_of``, or a finding's ``versions``)."""


def versions_of(host: Mapping[str, str], *, platform: str | None = None,
                pve_version: int | None = None) -> dict[str, str]:
    """A run's versions by component from its host record and method: QEMU always; ZFS only
    when the target is a file on a ZFS dataset (the one place its row applies); the Proxmox
    generation only on platform = "proxmox". What it did not record is absent."""
    found: dict[str, str] = {}
    if host.get("qemu"):
        found["qemu"] = host["qemu"]
    if host.get("target_fs") == "zfs" and host.get("zfs"):
        found["zfs"] = host["zfs"]
    if platform == "proxmox" and pve_version is not None:
        found["proxmox"] = f"{pve_version}.0"
    return found


def run_versions(run: StoredRun) -> dict[str, str]:
    """``versions_of`` a stored run (its method unread when its suite no longer loads)."""
    if run.suite.unloaded(Part.METHOD) is not None:
        return versions_of(run.host)
    method = run.suite.method
    return versions_of(run.host, platform=method.platform,
                       pve_version=method.pve_version or DEFAULT_PVE_VERSION)


def _version(text: str | None) -> Version | None:
    if text is None:
        return None
    try:
        return parse_version(text)
    except ValueError:
        return None     # "not installed", "not loaded", "unknown": on no side


def straddled(a: Versions, b: Versions) -> tuple[Straddle, ...]:
    """The rows of ``CHANGES`` whose boundary lies between side A's version and side B's."""
    out = []
    for change in CHANGES:
        va, vb = _version(a.get(change.component)), _version(b.get(change.component))
        if va is not None and vb is not None and (va >= change.boundary) != (vb >= change.boundary):
            out.append(Straddle(change=change, a=a[change.component], b=b[change.component]))
    return tuple(out)
