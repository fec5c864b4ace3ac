"""``iomatrix appliance``: the guest appliance (a kernel plus an initramfs with fio --server)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from iomatrix.cli.common import out

app = typer.Typer(name="appliance", no_args_is_help=True,
                  help="The guest appliance: a kernel plus a tiny initramfs that starts fio (the "
                       "host's version) as a server. Built on demand and cached; `build` makes "
                       "it now.")


@app.command()
def build(
    kernel: Annotated[Optional[Path], typer.Option("--kernel", help="Boot this kernel image (a bzImage; its lib/modules/<release> must be installed) instead of the host's own or Debian's.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Rebuild even when an appliance with the same inputs is cached, and try again a build of the guest's fio that failed.")] = False,
) -> None:
    """Build the guest appliance (or find it cached) and print where it is and its size."""
    from iomatrix.appliance.build import build_appliance
    from iomatrix.appliance.guestfio import UNPATCHED
    from iomatrix.core.units import format_bytes

    a = build_appliance(kernel=kernel, force=force)
    kernel_kind = "ELF vmlinux, PVH boot" if a.kernel_format == "pvh" else "bzImage"
    out.print(f"appliance: {a.kernel.parent}", markup=False)
    out.print(f"  kernel  {a.kernel.name}  {format_bytes(a.kernel_bytes)}  "
              f"({a.kernel_release}, {kernel_kind})", markup=False)
    out.print(f"  initrd  {a.initrd.name}  {format_bytes(a.initrd_bytes)}  "
              f"(uncompressed cpio: busybox, fio, {len(a.modules)} modules)", markup=False)
    out.print(f"  fio     {a.fio_text} ({a.fio_note})" if a.fio_patched
              else f"  fio     {a.fio_text}: {UNPATCHED} ({a.fio_note})",
              markup=False, soft_wrap=True)
    out.print(f"  size    {format_bytes(a.size_bytes)}", markup=False)
    out.print(f"  cached (built in {a.build_seconds:.1f} s)" if a.cached
              else f"  built in {a.build_seconds:.1f} s", markup=False)


@app.command("windows-seed")
def windows_seed(
    output: Annotated[Path, typer.Argument(help="The ISO to write (a new file).")],
) -> None:
    """Write the seed a Windows image is prepared with once: fio.exe of the host's fio version
    (cross-built with mingw-w64 from its Debian source, cached) and install.ps1, which registers
    the start-up task (docs/how-to/windows-guest.md)."""
    from iomatrix.appliance.kernel import default_cache_dir
    from iomatrix.appliance.winfio import windows_fio
    from iomatrix.appliance.winseed import INSTALL_SCRIPT, make_windows_seed

    if output.exists() or output.is_symlink():
        raise typer.BadParameter(f"{output} exists: give a new file", param_hint="OUTPUT")
    built = windows_fio(default_cache_dir())
    output = output.absolute()
    seed = make_windows_seed(output.parent, fio=built, disk_size=None, name=output.name)
    out.print(f"seed: {seed} (fio.exe {built.version}, from the Debian source {built.source}"
              f"{', cached' if built.cached else f', built in {built.build_seconds:.0f} s'}); "
              f"in Windows, as Administrator: D:\\{INSTALL_SCRIPT} (its drive letter)",
              markup=False, soft_wrap=True)
