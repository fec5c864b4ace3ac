"""The Windows guest's seed: an ISO 9660 CD (label :data:`SEED_LABEL`) that carries fio.exe of
the host's version (:mod:`~iomatrix.appliance.winfio`) with its DLLs, ``iomatrix.ps1``
(``windows-start.ps1``) and ``install.ps1`` (``windows-install.ps1``).

The user runs ``install.ps1`` once in the image, as Administrator, with a seed attached: it
registers the scheduled task ``iomatrix`` (at startup, as SYSTEM) that runs ``iomatrix.ps1`` from
whichever volume carries the label, and opens fio's port in the firewall. Each boot iomatrix
attaches a new seed as a CD: the script finds the disk under test (not the system or boot disk,
of the size the host attached), brings it online, writes the
:data:`~iomatrix.appliance.ownimage.GUEST_MARKER` line (with ``fio --version``: the host checks
it at connect, ``version_mismatch``) and the
:data:`~iomatrix.appliance.protocol.DISK_MARKER` line (``name=PhysicalDriveN``) to COM1, starts
``fio.exe --server`` and, once it listens, the
:data:`~iomatrix.appliance.protocol.READY_MARKER` line; a failure writes an
:data:`~iomatrix.appliance.protocol.ERROR_MARKER` line and shuts Windows down, as the Linux
guests do. So the fio a trial meets is always the seed's, of the host's version: nothing in the
image needs updating when the host's fio changes.

The NIC gets 10.0.2.15 from QEMU's user network by DHCP (its first lease), the address the
host forwards to. Windows mounts ISO 9660 only from a CD drive: the seed is an IDE/AHCI CD
(``ide-cd``), which every machine type has and Windows needs no driver for.
"""

from __future__ import annotations

import shutil
from importlib import resources
from pathlib import Path

from iomatrix.appliance.ownimage import GUEST_MARKER, XORRISO_TIMEOUT
from iomatrix.appliance.protocol import (DISK_MARKER, ERROR_MARKER, GUEST_FIO_PORT, GUEST_IP,
                                         READY_MARKER)
from iomatrix.appliance.winfio import WindowsFio
from iomatrix.core.proc import require, run

SEED_LABEL = "IOMATRIX"
"""The seed's volume label: the scheduled task runs ``iomatrix.ps1`` from the volume that has it."""
START_SCRIPT = "iomatrix.ps1"
INSTALL_SCRIPT = "install.ps1"


def _template(name: str) -> str:
    return resources.files("iomatrix.appliance").joinpath(name).read_text(encoding="utf-8")


def start_script(disk_size: int, port: int = GUEST_FIO_PORT) -> str:
    """``iomatrix.ps1`` for a disk under test of ``disk_size`` bytes and fio on ``port``."""
    from iomatrix.appliance.build import render_template

    return render_template(_template("windows-start.ps1"), {
        "SEED_LABEL": SEED_LABEL, "SIZE": str(int(disk_size)), "PORT": str(int(port)),
        "GUEST_IP": GUEST_IP, "GUEST_MARKER": GUEST_MARKER, "DISK_MARKER": DISK_MARKER,
        "READY_MARKER": READY_MARKER, "ERROR_MARKER": ERROR_MARKER})


def install_script(port: int = GUEST_FIO_PORT) -> str:
    """``install.ps1``: the task and firewall rule, registered once in the image."""
    from iomatrix.appliance.build import render_template

    return render_template(_template("windows-install.ps1"),
                           {"SEED_LABEL": SEED_LABEL, "PORT": str(int(port))})


def _crlf(text: str) -> bytes:
    """Windows' line ends (PowerShell reads either; Notepad, where a user looks, wants these)."""
    return text.replace("\r\n", "\n").replace("\n", "\r\n").encode("utf-8")


def make_windows_seed(directory: Path, *, fio: WindowsFio, disk_size: int | None,
                      port: int = GUEST_FIO_PORT, name: str = "seed.iso") -> Path:
    """The seed ISO ``name`` in ``directory`` (a directory of the run's, 0700): fio.exe, its
    DLLs and both scripts (see the module docstring). ``disk_size`` None: the seed the user
    attaches once to run ``install.ps1`` (``iomatrix appliance windows-seed``), without
    ``iomatrix.ps1``, so a boot with it attached starts nothing."""
    files = directory / f"{name}.d"
    files.mkdir(mode=0o700)
    try:
        for source in fio.files:
            (files / source.name).write_bytes(source.read_bytes())
        if disk_size is not None:
            (files / START_SCRIPT).write_bytes(_crlf(start_script(disk_size, port)))
        (files / INSTALL_SCRIPT).write_bytes(_crlf(install_script(port)))
        seed = directory / name
        run([require("xorriso", hint="install Debian's xorriso (./setup.sh does)"),
             "-as", "mkisofs", "-quiet", "-output", str(seed), "-volid", SEED_LABEL, "-joliet",
             "-rock", str(files)], timeout=XORRISO_TIMEOUT)
    finally:
        shutil.rmtree(files, ignore_errors=True)
    return seed
