"""An LVM volume group (``[target] lvm``) or LVM-thin pool (``[target] lvmthin``) as a run's
target: a logical volume per image that iomatrix makes with LVM's own tools, as Proxmox VE's
``lvm`` and ``lvmthin`` storages put a VM's disk, and measures as a block device of this host
(what every volume kind shares: ``iomatrix.targets.volumes``).

- **Reports.** ``vgs`` and ``lvs`` with ``--noheadings --units b --nosuffix`` and a separator:
  the volume group's size and free space (thick), the thin pool's size, chunk size and data and
  metadata use (thin). A volume group or pool that is not there is refused in one line.
- **Space first.** Thick: the volume group's free space must hold every volume (rounded up to
  its extents). Thin: a thin pool that fills up stops every VM on it (its writes hang or fail),
  so the run is refused when the pool's data use, with every volume of the run written fully,
  would pass ``DATA_BOUND`` of its size, or its metadata use, with a mapping per chunk of those
  volumes, ``METADATA_BOUND``.
- **Own volumes only.** ``lvcreate --addtag`` gives each volume the record's marker as a tag
  (``volumes.owner_tag``) as it is made; ``lvremove -f VG/NAME`` is only ever run for a name
  that begins ``iomatrix-``.
- **Formats.** A volume is raw (the device itself). qcow2 on a thick LV is Proxmox VE 9's
  "snapshot as volume chain": with ``volume_chain`` (``iomatrix.targets.lvmchain``), else
  refused (``format_problem``).
- **Storage ids.** ``[target] storage = "ID"`` of an lvm or lvmthin storage resolves here off a
  Proxmox VE host; on one it goes through pvesm (``iomatrix.targets.pvesm``), but for a local
  lvm storage with snapshot-as-volume-chain (``pvesm.through_pvesm``). Never aim a table at a
  volume group a cluster shares: only Proxmox VE's cluster lock serialises changes to it.

The names a suite gives (volume group, pool) are checked by ``iomatrix.suite.volumes`` to LVM's
own rules before they reach a tool, and a record's are checked again (``from_connection``)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any, Callable

from iomatrix.core.errors import NotEnoughSpace, TargetError, TargetUnreachable, ToolFailed
from iomatrix.core.proc import require, run
from iomatrix.core.trust import Author
from iomatrix.core.units import format_bytes
from iomatrix.platform import proxmox as pve
from iomatrix.suite.target import Target
from iomatrix.suite.volumes import LvmTarget, LvmThinTarget
from iomatrix.targets.kind import HostCheck, OpenTarget, Probe
from iomatrix.targets.lvmchain import ChainTarget
from iomatrix.targets.volumes import PREFIX, Backend, VolumeKind, resource

KIND = "lvm-volume"
"""The store's resource kind of a logical volume iomatrix created (thick or thin)."""
DATA_BOUND = 0.90
"""The share of a thin pool's data a run may bring it to (its volumes written fully)."""
METADATA_BOUND = 0.80
"""The share of a thin pool's metadata a run may bring it to."""
MAPPING_BYTES = 64
"""Metadata a thin pool spends per mapped chunk, as this module estimates it (thin_metadata_size
gives about 64 bytes a chunk for pools of many volumes)."""
TIMEOUT = 120.0
LVM_ENV = {"LVM_SUPPRESS_FD_WARNINGS": "1"}
"""LVM's tools warn on stderr of every descriptor they inherit; iomatrix's are its own."""
HINT = "check [target] lvm / lvmthin: vgs and lvs list what this host has"
VG_FIELDS = "vg_name,vg_size,vg_free,vg_extent_size"
"""What ``vgs`` reports of a volume group (thick volumes' space check)."""
POOL_FIELDS = "lv_name,lv_attr,lv_size,data_percent,metadata_percent,lv_metadata_size,chunk_size"
"""What ``lvs`` reports of a thin pool (thin volumes' space check)."""
LIST_FIELDS = "lv_name,lv_tags"
"""What ``lvs`` reports of each volume for reclaim."""


def _lvm(*args: str, timeout: float = TIMEOUT) -> subprocess.CompletedProcess[str]:
    """Run one of LVM's tools (found on PATH), whatever its exit status; ``TargetUnreachable``
    when it does not finish in time."""
    tool = require(args[0], hint="install LVM's tools: apt-get install lvm2")
    try:
        return run([tool, *args[1:]], timeout=timeout, check=False,
                   env={**os.environ, **LVM_ENV})
    except ToolFailed as exc:
        raise TargetUnreachable(f"{args[0]}: {exc}") from exc


def _why(done: subprocess.CompletedProcess[str]) -> str:
    """The one line a failed LVM command amounts to: its last message."""
    lines = [line.strip() for line in (done.stderr or done.stdout or "").splitlines()
             if line.strip() and "leaked on" not in line and not line.strip().startswith("Run `")]
    missing = [line for line in lines if "not found" in line]
    return (missing or lines or [f"exit status {done.returncode}"])[-1][:300]


def _report(where: str, *args: str) -> list[list[str]]:
    """The rows of a ``vgs``/``lvs`` report on ``where`` (``args``: the tool, its fields and
    what to report on), as bytes without suffixes; ``TargetError`` naming what is missing."""
    done = _lvm(args[0], "--noheadings", "--units", "b", "--nosuffix", "--separator", "|",
                *args[1:])
    if done.returncode != 0:
        raise TargetError(f"{where}: {_why(done)} ({args[0]})", hint=HINT)
    return [[cell.strip() for cell in line.split("|")] for line in done.stdout.splitlines()
            if line.strip()]


def _number(text: str) -> float:
    """A report's number (an empty cell: 0)."""
    try:
        return float(text) if text else 0.0
    except ValueError:
        raise TargetError(f"LVM reported {text[:40]!r} where a number was expected") from None


class LvmBackend(Backend):
    """Thick volumes in a volume group (``[target] lvm``); ``LvmThinBackend``: thin ones."""

    resource_kind = KIND
    noun = "LVM volume"

    qcow2 = False
    """qcow2 images on its LVs (``volume_chain``: ``iomatrix.targets.lvmchain``)."""

    def __init__(self, vg: str, *, qcow2: bool = False) -> None:
        self.vg = LvmTarget(vg=vg).vg              # checked to LVM's rules, whoever gave it
        self.qcow2 = qcow2

    @property
    def where(self) -> str:
        return f"LVM volume group {self.vg}"

    @property
    def spec(self) -> str:
        return self.vg

    def connection(self) -> dict[str, Any]:
        return {"vg": self.vg}

    def format_problem(self, fmt: str) -> str | None:
        if fmt == "raw" or (fmt == "qcow2" and self.qcow2):
            return None
        if fmt == "qcow2":
            return ("qcow2 on a thick LV is Proxmox VE 9's snapshot-as-volume-chain: set "
                    "volume_chain = true in [target] lvm, or drop format qcow2 from the matrix "
                    "(LVM volumes are raw)")
        return f"LVM volumes are raw; drop format {fmt} from the matrix"

    def _group(self) -> tuple[int, int, int]:
        """The volume group's (size, free, extent size) in bytes."""
        rows = _report(self.where, "vgs", "-o", VG_FIELDS, self.vg)
        row = next((r for r in rows if r and r[0] == self.vg), None)
        if row is None or len(row) < 4:
            raise TargetError(f"{self.where}: vgs does not report it", hint=HINT)
        size, free, extent = (int(_number(v)) for v in row[1:4])
        return size, free, max(extent, 1)

    def check(self, count: int, size: int) -> list[str]:
        total, free, extent = self._group()
        need = count * -(-size // extent) * extent
        if need > free:
            raise NotEnoughSpace(
                f"{self.where}: {format_bytes(free)} free of {format_bytes(total)}, but "
                f"{count} volume(s) of {format_bytes(size)} need {format_bytes(need)}",
                hint="lower [target] size, or measure fewer formats, preallocations or guests "
                     "at once")
        return []

    def create_args(self, name: str, size: int) -> list[str]:
        """``lvcreate``'s arguments for volume ``name`` of ``size`` bytes (a MiB multiple)."""
        return ["-L", f"{size >> 20}m", "-n", name, self.vg]

    def create_argv(self, name: str, size: int, tag: str) -> list[str]:
        """The whole ``lvcreate`` command (without the program's path) for volume ``name``."""
        return ["lvcreate", "--yes", "-aly", "--addtag", tag, *self.create_args(name, size)]

    def create(self, name: str, size: int, tag: str) -> Path:
        assert name.startswith(PREFIX)
        done = _lvm(*self.create_argv(name, size, tag))
        if done.returncode != 0:
            raise TargetError(f"{self.where}: lvcreate {name}: {_why(done)}")
        rows = _report(self.where, "lvs", "-o", "lv_path", f"{self.vg}/{name}")
        if not rows or not rows[0] or not rows[0][0].startswith("/"):
            raise TargetError(f"{self.where}: lvs names no device for the new volume {name}")
        return Path(rows[0][0])

    def remove(self, name: str) -> None:
        if not name.startswith(PREFIX):
            raise TargetError(f"{self.where}: {name} is not a volume iomatrix made")
        done = _lvm("lvremove", "-f", f"{self.vg}/{name}")
        if done.returncode != 0:
            raise TargetError(f"{self.where}: lvremove {name}: {_why(done)}")

    def listed(self) -> dict[str, set[str]]:
        done = _lvm("lvs", "--noheadings", "--separator", "|", "-o", LIST_FIELDS, self.vg)
        if done.returncode != 0:
            raise TargetUnreachable(f"{self.where}: lvs: {_why(done)}")
        out: dict[str, set[str]] = {}
        for line in done.stdout.splitlines():
            name, _, tags = line.strip().partition("|")
            if name:
                out[name] = {t for t in tags.split(",") if t}
        return out


class LvmThinBackend(LvmBackend):
    """Thin volumes in a thin pool (``[target] lvmthin``)."""

    noun = "LVM thin volume"
    format_problem = Backend.format_problem

    def __init__(self, vg: str, pool: str) -> None:
        table = LvmThinTarget(vg=vg, pool=pool)
        self.vg, self.pool = table.vg, table.pool

    @property
    def where(self) -> str:
        return f"LVM-thin pool {self.vg}/{self.pool}"

    def connection(self) -> dict[str, Any]:
        return {"vg": self.vg, "pool": self.pool}

    def check(self, count: int, size: int) -> list[str]:
        rows = _report(self.where, "lvs", "-o", POOL_FIELDS, f"{self.vg}/{self.pool}")
        row = next((r for r in rows if r and r[0] == self.pool), None)
        if row is None or len(row) < 7:
            raise TargetError(f"{self.where}: lvs does not report it", hint=HINT)
        if not row[1].startswith("t"):
            raise TargetError(f"{self.where}: {self.vg}/{self.pool} is not a thin pool "
                              f"(lv_attr {row[1]})", hint=HINT)
        total, data, meta, meta_size, chunk = (_number(v) for v in
                                               (row[2], row[3], row[4], row[5], row[6]))
        need = count * size
        data_after = (data / 100 * total + need) / max(total, 1)
        meta_after = (meta / 100 * meta_size + need / max(chunk, 1) * MAPPING_BYTES) / max(
            meta_size, 1)
        if data_after > DATA_BOUND:
            raise NotEnoughSpace(
                f"{self.where}: data {data:.1f}% used of {format_bytes(int(total))}; {count} "
                f"volume(s) of {format_bytes(size)} written fully would bring it to "
                f"{data_after:.0%}, past the {DATA_BOUND:.0%} iomatrix allows (a full thin "
                "pool stops every VM on it)",
                hint="lower [target] size, or measure fewer formats, preallocations or guests "
                     "at once")
        if meta_after > METADATA_BOUND:
            raise NotEnoughSpace(
                f"{self.where}: metadata {meta:.1f}% used of {format_bytes(int(meta_size))}; "
                f"{count} volume(s) of {format_bytes(size)} would bring it to about "
                f"{meta_after:.0%}, past the {METADATA_BOUND:.0%} iomatrix allows (a pool out "
                "of metadata stops every VM on it)",
                hint="lower [target] size, or extend the pool's metadata (lvextend "
                     "--poolmetadatasize)")
        return [f"{self.where}: data {data:.1f}% and metadata {meta:.1f}% used before the run; "
                f"its volumes written fully bring them to about {data_after:.0%} and "
                f"{meta_after:.0%}"]

    def create_args(self, name: str, size: int) -> list[str]:
        return ["-V", f"{size >> 20}m", "-T", f"{self.vg}/{self.pool}", "-n", name]


def from_connection(data: dict[str, Any]) -> LvmBackend:
    """The backend a store's record of a volume names (``connection``), its names checked to
    LVM's rules; ``ValueError`` for one iomatrix does not write."""
    if set(data) - {"vg", "pool"} or not isinstance(data.get("vg"), str):
        raise ValueError("not an LVM volume group's connection")
    pool = data.get("pool")
    if pool is None:
        return LvmBackend(data["vg"])
    if not isinstance(pool, str):
        raise ValueError("pool: not a name")
    return LvmThinBackend(data["vg"], pool)


class LvmKind(VolumeKind):
    """``[target] lvm`` and ``lvmthin``: LVM volumes (the module's docstring)."""

    keys = ("lvm", "lvmthin")
    tools = ("lvcreate", "lvremove", "lvs", "vgs")
    resource = resource(KIND, "LVM volume", from_connection, ("vg", "pool"))
    storage_types = ("lvm", "lvmthin")

    def of_storage(self, storage: pve.Storage, volume: str, pve_dir: Path, *,
                   mounted: Callable[[Path], bool] | None = None) -> dict[str, Any]:
        """vgname (and thinpool, "data" when none is named) as LVMPlugin.pm and
        LvmThinPlugin.pm make a VM's volumes; snapshot-as-volume-chain: ``volume_chain``."""
        if not storage.vgname:
            raise ValueError(f"storage {storage.id} ({storage.type}) names no vgname")
        if storage.type == "lvmthin":
            return {"lvmthin": {"vg": storage.vgname, "pool": storage.thinpool or "data"}}
        return {"lvm": {"vg": storage.vgname, **({"volume_chain": True}
                                                 if storage.volume_chain else {})}}

    def backend(self, target: Target) -> Backend:
        if target.lvmthin is not None:
            return LvmThinBackend(target.lvmthin.vg, target.lvmthin.pool)
        assert target.lvm is not None
        return LvmBackend(target.lvm.vg, qcow2=target.lvm.volume_chain)

    def open(self, target: Target, *, keep: bool, author: Author) -> OpenTarget:
        """With ``volume_chain``: qcow2 images as Proxmox VE 9's volume chains."""
        if target.lvm is not None and target.lvm.volume_chain:
            return ChainTarget(target, self.backend(target), snapshots=target.lvm.snapshots,
                               keep=keep)
        return super().open(target, keep=keep, author=author)

    def host_checks(self, probe: Probe) -> list[HostCheck]:
        """LVM's tools, and the kernel's device-mapper they make volumes with."""
        missing = [t for t in self.tools if probe.which(t) is None]
        mapper = (probe.sysfs / "class" / "misc" / "device-mapper").exists()
        if missing:
            detail = (f"{', '.join(missing)} not found on PATH: lvm and lvmthin targets cannot "
                      "be measured")
        elif not mapper:
            detail = ("LVM's tools are here, but the kernel has no device-mapper "
                      "(/sys/class/misc/device-mapper): no LVM volume can be made")
        else:
            detail = "lvcreate, lvremove, lvs, vgs and device-mapper: lvm and lvmthin targets"
        return [HostCheck(name="LVM tools (lvm, lvmthin)", ok=not missing and mapper,
                          detail=detail,
                          hint="apt-get install lvm2" if missing else None)]
