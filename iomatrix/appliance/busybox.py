"""A static busybox for the appliance: Debian's ``busybox-static`` package, fetched with
``apt-get download`` and unpacked into the cache (``<cache>/busybox-static_<version>/``). The
binary is taken wherever the package puts it (:data:`BINARY_DIRS`): ``bin/`` in Debian 12,
``usr/bin/`` in Debian 13."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

from iomatrix.appliance.elf import elf_interpreter
from iomatrix.core.errors import EnvironmentProblem, ToolFailed
from iomatrix.core.proc import require, run

BUSYBOX_PACKAGE = "busybox-static"
BINARY_DIRS: tuple[str, ...] = ("bin", "usr/bin", "sbin", "usr/sbin")
"""Where a package may put the binary, relative to its root, in the order looked at."""
_NO_APT = "install Debian's apt and dpkg (a Debian or Ubuntu host)"


def static_busybox(cache_dir: Path, fetch: bool, env: Mapping[str, str] | None = None) -> Path:
    """A static busybox from Debian's busybox-static package, unpacked in the cache: the most
    recently unpacked one, else (with ``fetch``) one downloaded now (apt and dpkg-deb on the
    PATH of ``env``)."""
    found = sorted((binary for entry in cache_dir.glob(f"{BUSYBOX_PACKAGE}_*")
                    if (binary := _binary_in(entry)) is not None),
                   key=lambda p: p.stat().st_mtime, reverse=True)
    if found:
        return found[0]
    if not fetch:
        raise EnvironmentProblem(f"no static busybox in {cache_dir}",
                                 hint=f"allow fetching (`apt-get download {BUSYBOX_PACKAGE}`)")
    cache_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".fetch-", dir=cache_dir))
    try:
        return _fetch(cache_dir, work, env)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def busybox_text(cache_dir: Path, fetch: bool, env: Mapping[str, str] | None = None) -> str:
    """Where the appliance's busybox comes from, in a few words: the cached binary (with
    ``fetch``, fetched now if need be), or else the package version apt would fetch. Raises
    EnvironmentProblem when there is none (``iomatrix doctor``)."""
    try:
        binary = static_busybox(cache_dir, fetch, env)
    except EnvironmentProblem:
        if fetch:
            raise
    else:
        return f"static busybox {binary.relative_to(cache_dir)} in the cache"
    shown = run([require("apt-cache", env, hint=_NO_APT), "show", "--no-all-versions",
                 BUSYBOX_PACKAGE], timeout=60, check=False, env=env)
    version = re.search(r"^Version: (\S+)$", shown.stdout, re.M)
    if shown.returncode != 0 or version is None:
        raise EnvironmentProblem(f"apt knows no package {BUSYBOX_PACKAGE}, and no static busybox "
                                 f"is cached in {cache_dir}",
                                 hint="run `apt-get update` (Debian's main archive has it)")
    return f"{BUSYBOX_PACKAGE} {version[1]}, fetched by the first guest run"


def _binary_in(root: Path) -> Path | None:
    """The static ``busybox`` in the first of :data:`BINARY_DIRS` under ``root`` that has one
    (a regular file, not a link), or None."""
    for directory in BINARY_DIRS:
        binary = root / directory / "busybox"
        if binary.is_file() and not binary.is_symlink() \
                and elf_interpreter(binary.read_bytes()) is None:
            return binary
    return None


def _fetch(cache_dir: Path, work: Path, env: Mapping[str, str] | None) -> Path:
    """Download the package into ``work``, unpack it there and rename it into the cache."""
    argv = [require("apt-get", env, hint=_NO_APT), "download"]
    if os.geteuid() == 0:  # root cannot hand the file to the _apt sandbox user in mkdtemp dirs
        argv += ["-o", "APT::Sandbox::User=root"]
    try:
        run([*argv, BUSYBOX_PACKAGE], timeout=300, cwd=work, env=env)
    except ToolFailed as e:
        raise EnvironmentProblem(f"could not download {BUSYBOX_PACKAGE}: {e}",
                                 hint="check network access and `apt-get update`") from e
    debs = sorted(work.glob("*.deb"))
    if len(debs) != 1:
        raise EnvironmentProblem(f"apt-get download {BUSYBOX_PACKAGE} left {len(debs)} files")
    dpkg_deb = require("dpkg-deb", env, hint=_NO_APT)
    version = run([dpkg_deb, "-f", str(debs[0]), "Version"], timeout=60, env=env).stdout.strip()
    root = work / "root"
    run([dpkg_deb, "-x", str(debs[0]), str(root)], timeout=120, env=env)
    binary = _binary_in(root)
    if binary is None:
        raise EnvironmentProblem(f"{debs[0].name} holds no static busybox in "
                                 f"{', '.join(d + '/' for d in BINARY_DIRS)}")
    target = cache_dir / f"{BUSYBOX_PACKAGE}_{version.replace(':', '_')}"
    try:
        root.rename(target)
    except OSError:       # someone else unpacked the same version meanwhile: use theirs
        if _binary_in(target) is None:
            raise
    return target / binary.relative_to(root)
