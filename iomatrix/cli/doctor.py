"""``iomatrix doctor``: can this host run iomatrix, and what is missing."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from iomatrix.cli.common import out
from iomatrix.cli.status import ExitStatus


def doctor(kvm_timeout: Annotated[float, typer.Option(help="Seconds to wait for a kernel to boot under KVM.")] = 10.0,
           drift: Annotated[bool, typer.Option(help="Also estimate the host's drift (about 30 s): a few short interleaved fio runs on a small file in /var/tmp, and the rounds a point and a paired gain need.")] = True) -> None:
    """Check this host: QEMU, qemu-storage-daemon, qemu-img, fio, io_uring, libaio, FUSE, KVM,
    the private guest channel, the guests' fio and appliance (kernel, modules, busybox; fetched
    as a run would), network storage clients (QEMU's rbd, iscsi and nfs block drivers, fio's
    rbd engine, the rbd command, the kernel's rbd module), libvirt, drift."""
    from iomatrix.diagnose.doctor import failed_required, run_checks

    if not 0 < kvm_timeout <= 3600:       # nan and inf too
        raise typer.BadParameter(f"{kvm_timeout}: give seconds, more than 0 and at most 3600",
                                 param_hint="--kvm-timeout")
    checks = run_checks(kvm_timeout=kvm_timeout, drift=drift, libvirt=True)
    table = Table("check", "", "detail", box=None)
    for c in checks:
        mark = (Text("ok", "green") if c.ok else
                Text("MISSING", "red") if c.required else Text("no", "yellow"))
        table.add_row(c.name, mark, c.detail + (f"\n  → {c.hint}" if c.hint and not c.ok else ""))
    out.print(table)
    if failed_required(checks):
        raise typer.Exit(ExitStatus.ENVIRONMENT)
