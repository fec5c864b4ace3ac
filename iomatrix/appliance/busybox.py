"""A static busybox for the appliance: Debian's ``busybox-static`` package, fetched with
``apt-get download`` and unpacked into the cache (``<cache>/busybox-static_<version>/``)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from iomatrix.appliance.elf import elf_interpreter
from iomatrix.core.errors import EnvironmentProblem, ToolFailed
from iomatrix.core.proc import require, run

BUSYBOX_PACKAGE = "busybox-static"
_NO_APT = "install Debian's apt and dpkg (a Debian or Ubuntu host)"


def static_busybox(cache_dir: Path, fetch: bool) -> Path:
    """A static busybox from Debian's busybox-static package, unpacked in the cache: the most
    recently unpacked one, else (with ``fetch``) one downloaded now."""
    found = sorted(cache_dir.glob(f"{BUSYBOX_PACKAGE}_*/bin/busybox"),
                   key=lambda p: p.stat().st_mtime, reverse=True)
    if found:
        return found[0]
    if not fetch:
        raise EnvironmentProblem(f"no static busybox in {cache_dir}",
                                 hint=f"allow fetching (`apt-get download {BUSYBOX_PACKAGE}`)")
    cache_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".fetch-", dir=cache_dir))
    try:
        return _fetch(cache_dir, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _fetch(cache_dir: Path, work: Path) -> Path:
    """Download the package into ``work``, unpack it there and rename it into the cache."""
    argv = [require("apt-get", hint=_NO_APT), "download"]
    if os.geteuid() == 0:  # root cannot hand the file to the _apt sandbox user in mkdtemp dirs
        argv += ["-o", "APT::Sandbox::User=root"]
    try:
        run([*argv, BUSYBOX_PACKAGE], timeout=300, cwd=work)
    except ToolFailed as e:
        raise EnvironmentProblem(f"could not download {BUSYBOX_PACKAGE}: {e}",
                                 hint="check network access and `apt-get update`") from e
    debs = sorted(work.glob("*.deb"))
    if len(debs) != 1:
        raise EnvironmentProblem(f"apt-get download {BUSYBOX_PACKAGE} left {len(debs)} files")
    dpkg_deb = require("dpkg-deb", hint=_NO_APT)
    version = run([dpkg_deb, "-f", str(debs[0]), "Version"], timeout=60).stdout.strip()
    root = work / "root"
    run([dpkg_deb, "-x", str(debs[0]), str(root)], timeout=120)
    binary = root / "bin" / "busybox"
    if not binary.is_file() or elf_interpreter(binary.read_bytes()) is not None:
        raise EnvironmentProblem(f"{debs[0].name} holds no static bin/busybox")
    target = cache_dir / f"{BUSYBOX_PACKAGE}_{version.replace(':', '_')}"
    try:
        root.rename(target)
    except OSError:
        if not (target / "bin" / "busybox").is_file():
            raise
    return target / "bin" / "busybox"
