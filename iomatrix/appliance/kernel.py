"""Where the guest kernel comes from.

In order of preference:

1. the host's own kernel, ``/boot/vmlinuz-$(uname -r)``, when it is readable (as on Proxmox VE);
2. a Debian kernel fetched earlier into the cache (``$XDG_CACHE_HOME/iomatrix/kernel``, default
   ``~/.cache/iomatrix/kernel``);
3. Debian's ``linux-image-amd64``, fetched now: the metapackage is resolved to the real image
   package (``apt-cache depends``), that package is fetched with ``apt-get download`` and unpacked
   with ``dpkg-deb -x`` into ``<cache>/<package>_<version>/`` (``boot/vmlinuz-*`` and
   ``lib/modules/*``: the appliance takes its modules from there).

A kernel is accepted only if its file carries the x86 boot protocol header (``HdrS``), so a
truncated download or a wrong path is caught here and not by QEMU.

The cache is used only while nobody but root and this user can change it (:func:`trusted_cache`):
what it holds is booted, and its fio and busybox run, as this user; under ``sudo -E`` root would
otherwise build from, and boot, whatever the user who owns XDG_CACHE_HOME put there.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

from iomatrix.core.dirs import walk
from iomatrix.core.errors import EnvironmentProblem, ToolFailed, UnsafeDirectory
from iomatrix.core.proc import require, run

METAPACKAGE = "linux-image-amd64"
FETCH_TIMEOUT = 900.0
"""Seconds allowed for ``apt-get download`` of a kernel package (about 70 MB)."""

_BZIMAGE_MAGIC_OFFSET = 0x202
_BZIMAGE_MAGIC = b"HdrS"
_DEPENDS = re.compile(r"^\s*\|?Depends:\s*(linux-image-\S+)\s*$", re.MULTILINE)
_NO_APT = "install Debian's apt and dpkg (a Debian or Ubuntu host), or pass a kernel explicitly"


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/iomatrix/kernel``, or ``~/.cache/iomatrix/kernel`` (the XDG rule: a
    relative or empty XDG_CACHE_HOME is ignored)."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    root = Path(base) if base and os.path.isabs(base) else Path.home() / ".cache"
    return root / "iomatrix" / "kernel"


def trusted_cache(directory: Path, *, create: bool = True) -> Path:
    """``directory`` (the cache or a folder in it) once every directory from ``/`` to it is
    root's or this user's and writable by nobody else (:func:`iomatrix.core.dirs.walk`), made
    (0755) where missing unless ``create`` is false. EnvironmentProblem naming the directory
    another user controls otherwise."""
    try:
        walked = walk(directory)
        os.close(walked.fd)
        if create and walked.missing:
            for depth in range(1, len(walked.missing) + 1):
                walked.real.joinpath(*walked.missing[:depth]).mkdir(0o755, exist_ok=True)
            os.close(walk(directory).fd)       # and what another user may have put there first
    except UnsafeDirectory as exc:
        raise EnvironmentProblem(
            f"the appliance cache: {exc}: what it holds would be booted and run as "
            f"{'root' if os.geteuid() == 0 else 'this user'}",
            hint="run sudo without -E (the user's XDG_CACHE_HOME and HOME stay with -E), or set "
                 "XDG_CACHE_HOME to a directory only you can write to") from None
    return directory


def kernel_problem(path: Path) -> str | None:
    """Why ``path`` is not a bootable x86 Linux kernel image, or None when it is one."""
    try:
        with open(path, "rb") as f:
            f.seek(_BZIMAGE_MAGIC_OFFSET)
            magic = f.read(len(_BZIMAGE_MAGIC))
    except FileNotFoundError:
        return f"{path} does not exist"
    except IsADirectoryError:
        return f"{path} is a directory, not a kernel image"
    except PermissionError:
        return f"{path} is not readable (permission denied)"
    except OSError as e:
        return f"{path} cannot be read: {e.strerror or e}"
    if magic != _BZIMAGE_MAGIC:
        return f"{path} is not an x86 Linux kernel image (no boot protocol header)"
    return None


def host_kernel() -> Path | None:
    """The running kernel's image when it is present and readable, else None."""
    path = Path("/boot") / f"vmlinuz-{os.uname().release}"
    return path if kernel_problem(path) is None else None


def kernel_modules_dir(kernel: Path) -> Path | None:
    """The ``lib/modules/<release>`` directory that belongs to ``kernel`` (a host kernel's
    ``/lib/modules/<release>``, or the one unpacked beside a cached kernel), or None when the
    modules are not there. A Debian package ships no ``modules.dep`` (its postinst runs depmod),
    so ``modules.order`` is what marks the directory; run ``depmod -b`` before resolving."""
    name = kernel.name
    if not name.startswith("vmlinuz-"):
        return None
    release = name[len("vmlinuz-"):]
    root = kernel.parent.parent  # <root>/boot/vmlinuz-<release>
    for base in (root / "lib" / "modules", root / "usr" / "lib" / "modules"):
        candidate = base / release
        if (candidate / "modules.order").is_file() or (candidate / "modules.dep").is_file():
            return candidate
    return None


def cached_kernels(cache_dir: Path | None = None) -> list[Path]:
    """Valid kernels unpacked in the cache, most recently fetched first."""
    cache_dir = trusted_cache(cache_dir or default_cache_dir(), create=False)
    if not cache_dir.is_dir():
        return []
    found: list[tuple[float, Path]] = []
    for entry in cache_dir.iterdir():
        if entry.name.startswith(".") or not entry.is_dir():
            continue
        for image in (entry / "boot").glob("vmlinuz-*"):
            if kernel_problem(image) is None:
                found.append((entry.stat().st_mtime, image))
    return [image for _, image in sorted(found, key=lambda t: t[0], reverse=True)]


def resolve_image_package(metapackage: str = METAPACKAGE, *,
                          env: Mapping[str, str] | None = None) -> str:
    """The real kernel image package the metapackage depends on (``linux-image-6.1.0-NN-amd64``)."""
    try:
        result = run([require("apt-cache", env, hint=_NO_APT), "depends", "--important",
                      metapackage], timeout=60, env=env)
    except ToolFailed as e:
        raise EnvironmentProblem(f"apt does not know {metapackage}: {e}",
                                 hint="run `apt-get update`, or pass a kernel explicitly") from e
    for dep in _DEPENDS.findall(result.stdout):
        if not dep.startswith("<"):
            return dep
    raise EnvironmentProblem(f"{metapackage} depends on no linux-image package "
                             f"(apt-cache said: {result.stdout.strip()[:200]!r})",
                             hint="run `apt-get update`, or pass a kernel explicitly")


def fetch_kernel(cache_dir: Path | None = None, *, metapackage: str = METAPACKAGE,
                 env: Mapping[str, str] | None = None,
                 timeout: float = FETCH_TIMEOUT) -> Path:
    """Download Debian's kernel image package and unpack it into the cache; returns the vmlinuz.

    Unpacks into a hidden directory first and renames it into place, so a concurrent or
    interrupted fetch never leaves a half-unpacked kernel that looks valid."""
    cache_dir = trusted_cache(cache_dir or default_cache_dir())
    package = resolve_image_package(metapackage, env=env)
    work = Path(tempfile.mkdtemp(prefix=".fetch-", dir=cache_dir))
    try:
        argv = [require("apt-get", env, hint=_NO_APT), "download"]
        if os.geteuid() == 0:  # root cannot hand the file to the _apt sandbox user in mkdtemp dirs
            argv += ["-o", "APT::Sandbox::User=root"]
        try:
            run([*argv, package], timeout=timeout, cwd=work, env=env)
        except ToolFailed as e:
            raise EnvironmentProblem(f"could not download {package}: {e}",
                                     hint="check network access and `apt-get update`, "
                                          "or pass a kernel explicitly") from e
        debs = sorted(work.glob("*.deb"))
        if len(debs) != 1:
            raise EnvironmentProblem(f"apt-get download {package} left {len(debs)} .deb files")
        deb = debs[0]
        dpkg_deb = require("dpkg-deb", env, hint=_NO_APT)
        fields = run([dpkg_deb, "-f", str(deb), "Package", "Version"], timeout=60,
                     env=env).stdout
        info = dict(line.split(": ", 1) for line in fields.splitlines() if ": " in line)
        version = info.get("Version", "unknown").replace(":", "_")
        root = work / "root"
        run([dpkg_deb, "-x", str(deb), str(root)], timeout=600, env=env)
        deb.unlink()
        images = [p for p in (root / "boot").glob("vmlinuz-*") if kernel_problem(p) is None]
        if not images:
            raise EnvironmentProblem(f"{deb.name} holds no usable boot/vmlinuz-*")
        target = cache_dir / f"{info.get('Package', package)}_{version}"
        try:
            root.rename(target)
        except OSError:
            if not target.is_dir():  # someone else unpacked the same version meanwhile: use theirs
                raise
        final = target / "boot" / images[0].name
        if kernel_problem(final) is not None:
            raise EnvironmentProblem(f"{target} holds no usable kernel",
                                     hint=f"delete {target} and try again")
        return final
    finally:
        shutil.rmtree(work, ignore_errors=True)


def find_kernel(cache_dir: Path | None = None, fetch: bool = True, *,
                require_modules: bool = False, env: Mapping[str, str] | None = None) -> Path:
    """A bootable x86-64 Linux kernel image (see the module docstring for the order).

    ``require_modules`` skips a host kernel whose ``/lib/modules/<release>`` is missing (the
    appliance needs modules; the KVM probe does not). ``env`` is the environment (PATH) for apt.
    Raises EnvironmentProblem when no kernel can be had."""
    host = host_kernel()
    if host is not None and (not require_modules or kernel_modules_dir(host) is not None):
        return host
    for image in cached_kernels(cache_dir):
        if not require_modules or kernel_modules_dir(image) is not None:
            return image
    if not fetch:
        raise EnvironmentProblem(
            f"no kernel: /boot/vmlinuz-{os.uname().release} is not readable and none is cached in "
            f"{cache_dir or default_cache_dir()}",
            hint=f"allow fetching (`apt-get download {METAPACKAGE}`), or pass a kernel explicitly")
    try:
        return fetch_kernel(cache_dir, env=env)
    except ToolFailed as e:
        raise EnvironmentProblem(f"could not fetch a kernel: {e}",
                                 hint="pass a kernel explicitly") from e
