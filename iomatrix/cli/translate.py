"""``iomatrix translate FILE``: a Proxmox VE VM configuration or a libvirt domain XML → per disk,
the iomatrix configuration and the QEMU disk arguments the platform generates."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Annotated, Optional

import typer

from iomatrix.cli.common import MAX_OPTION_BYTES, option_text, out, read_option


def translate(
    file: Annotated[Path, typer.Argument(help="/etc/pve/qemu-server/ID.conf, `qm config ID` output, or `virsh dumpxml` output ('-' reads stdin).")],
    pve_version: Annotated[Optional[int], typer.Option("--pve-version", help="The Proxmox VE whose qemu-server writes the command line: 9 (-blockdev; -drive for a machine pinned below 10.0) or 8 (-drive); default 9.")] = None,
    storage_cfg: Annotated[Optional[Path], typer.Option("--storage-cfg", help="Proxmox's /etc/pve/storage.cfg, for volume paths and the storage type's defaults.")] = None,
    storage: Annotated[Optional[list[str]], typer.Option("--storage", help="ID=TYPE for a storage not in --storage-cfg (dir lvm lvmthin zfspool rbd cifs nfs btrfs ...; rbd+krbd, btrfs+nocow); the paths and pools it cannot know are assumed, and the notes say which.")] = None,
    libvirt_version: Annotated[Optional[str], typer.Option("--libvirt-version", help="libvirt whose arguments a domain gets (11.3); default: the libvirtd installed here, else 11.3.")] = None,
    qemu_version: Annotated[Optional[str], typer.Option("--qemu-version", help="QEMU that libvirt drives (10.0): raw disks lose their format node from libvirt 10.1 with QEMU 9.0; default: the qemu-system-x86_64 installed here, else 10.0.")] = None,
) -> None:
    """Show, per disk, the iomatrix configuration and the QEMU arguments Proxmox VE or libvirt generates."""
    import sys

    from iomatrix.drivers.versions import model_versions
    from iomatrix.platform import libvirt as lv
    from iomatrix.platform import proxmox as pve
    from iomatrix.translate.vm import NOT_A_DISK, translate as build

    if pve_version not in (None, *pve.PVE_VERSIONS):
        raise typer.BadParameter(f"{pve_version}: choose 8 or 9", param_hint="--pve-version")
    text = (option_text(sys.stdin.buffer.read(MAX_OPTION_BYTES + 1), "-") if str(file) == "-"
            else read_option(file))
    storages = pve.parse_storage_cfg(read_option(storage_cfg)) if storage_cfg else {}
    for item in storage or []:
        ident, sep, kind = item.partition("=")
        base, _, flag = kind.partition("+")
        if not sep or base not in pve.STORAGE_TYPES or flag not in ("", "krbd", "nocow"):
            raise typer.BadParameter(f"{item!r}: write ID=TYPE with TYPE one of "
                                     f"{', '.join(pve.STORAGE_TYPES)} (rbd+krbd, btrfs+nocow)",
                                     param_hint="--storage")
        given = pve.Storage(id=ident, type=base, krbd=flag == "krbd", nocow=flag == "nocow")
        known = storages.setdefault(ident, given)   # --storage-cfg knows more: its paths, pools
        if (known.type, known.krbd, known.nocow) != (given.type, given.krbd, given.nocow):
            raise typer.BadParameter(f"{item!r}: --storage-cfg defines {ident} as {known.type}"
                                     + ("+krbd" if known.krbd else "+nocow" if known.nocow
                                        else ""), param_hint="--storage")
    versions = None
    if text.lstrip().startswith("<"):
        try:
            versions, _ = model_versions(libvirt_version, "qemu-system-x86_64")
            if qemu_version is not None:
                versions = versions.model_copy(update={"qemu": lv.parse_version(qemu_version)})
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--libvirt-version/--qemu-version") from None
    vmid = re.fullmatch(r"(\d+)\.conf", file.name)
    try:
        result = build(text, pve_version=pve_version, storages=storages,  # type: ignore[arg-type]
                       vmid=vmid.group(1) if vmid else None, libvirt=versions)
    except ValueError as exc:
        raise typer.BadParameter(f"{file}: {exc}", param_hint="FILE") from None
    out.print(f"# {file}: {result.generation}", markup=False)
    _print_argv(result.argv, "")
    for disk in result.drives:
        out.print(f"\n{disk.written}", markup=False, soft_wrap=True)
        values = disk.values.as_dict() if disk.values is not None else {}
        shown = " ".join(f"{k}={_shown(v)}" for k, v in values.items() if v is not None)
        out.print(f"  iomatrix: {shown or '-'}" + (
            f"  (not a disk: {NOT_A_DISK[disk.kind]})" if disk.kind in NOT_A_DISK else
            "" if disk.config else "  (not measurable as is; see notes)"),
            markup=False, soft_wrap=True)
        _print_argv(disk.argv, "  ")
        for note in disk.notes:
            out.print(f"  # note: {note}", markup=False, soft_wrap=True)
    if not result.drives:
        out.print("\n(no disks)", markup=False)
    for note in result.notes:
        out.print(f"# note: {note}", markup=False, soft_wrap=True)


def _print_argv(argv: tuple[str, ...], indent: str) -> None:
    for i in range(0, len(argv), 2):
        out.print(indent + " ".join(shlex.quote(a) for a in argv[i:i + 2]), markup=False,
                  soft_wrap=True)


def _shown(value: object) -> str:
    return ("on" if value else "off") if isinstance(value, bool) else str(value)
