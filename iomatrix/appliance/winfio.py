"""fio for a Windows guest: ``fio.exe`` cross-built with Debian's mingw-w64 from the same Debian
source and version as this host's fio (the client and server protocol is versioned), built
reproducibly, once, and cached like the guests' Linux fio (:mod:`~iomatrix.appliance.guestfio`,
whose source download, cache checks and failure memo it shares).

How: the source of the installed ``fio`` package, fetched with ``apt-get source`` through a
private sources directory and lists (apt checks it against the signed index;
:func:`~iomatrix.appliance.guestfio.fetch_source`), unpacked with Debian's patches applied (not
iomatrix's server patch: it is written against Linux's poll and this fio serves Windows),
``configure --cc=x86_64-w64-mingw32-gcc-posix`` (fio's configure then targets Windows: static,
with the ``windowsaio`` engine) and ``make fio``, then ``x86_64-w64-mingw32-strip``.

Reproducible: ``SOURCE_DATE_EPOCH`` is the Debian changelog's date (Debian's mingw-w64 linker
writes it as the PE header's time stamp), ``-ffile-prefix-map`` removes the build directory
from the debug and assertion strings, ``TZ=UTC`` and ``LC_ALL=C``: two builds of one key give the
same bytes (``tests/appliance/test_winfio.py`` built it in two directories and compared).

The DLLs it needs: what the PE import table names besides Windows' own system DLLs
(:data:`SYSTEM_DLLS`), copied from the mingw-w64 tree beside it. fio 3.33 links winpthreads and
libgcc statically (its configure forces a static build on Windows), so that list is empty; a
fio that imports a DLL found nowhere is refused.

Cache: ``<cache>/windows-fio/<key>/`` with ``fio.exe``, its DLLs and ``manifest.json`` (source,
the .dsc's SHA-256, the configure flags, the toolchain, ``SOURCE_DATE_EPOCH``, build time, every
file's SHA-256). The key hashes the source package name and version, the flags, the compiler's
and linker's versions and :data:`RECIPE`. A cached build is used only when nobody but root and
this user controls the cache nor its files, and every file still has its recorded SHA-256.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import struct
import time
from collections.abc import Mapping
from pathlib import Path

from iomatrix.appliance.guestfio import (SourcePlan, cached_build, fetch_source, source_plan)
from iomatrix.appliance.kernel import trusted_cache
from iomatrix.core.errors import GuestFioUnavailable, UnsafeDirectory
from iomatrix.core.files import read_owned
from iomatrix.core.model import Frozen
from iomatrix.core.proc import run, which

RECIPE = 1
"""Bump when the build steps change in a way the key cannot see."""
CROSS = "x86_64-w64-mingw32"
CC = f"{CROSS}-gcc-posix"
"""The POSIX-threads flavour of Debian's mingw-w64 gcc: fio is written against pthreads."""
CONFIGURE_FLAGS: tuple[str, ...] = (f"--cc={CC}", "--disable-native")
"""Windows, for any x86-64 CPU (fio's configure adds static and windowsaio itself)."""
BUILD_TOOLS: dict[str, str] = {
    CC: "gcc-mingw-w64-x86-64-posix", f"{CROSS}-strip": "binutils-mingw-w64-x86-64",
    f"{CROSS}-objdump": "binutils-mingw-w64-x86-64", "make": "make",
    "dpkg-source": "dpkg-dev", "dpkg-parsechangelog": "dpkg-dev", "apt-get": "apt",
}
"""Tools the build runs, each with the Debian package that has it."""
BUILD_PACKAGES = "gcc-mingw-w64-x86-64 make dpkg-dev"
"""What ``./setup.sh --dev`` installs for this build."""
SYSTEM_DLLS = frozenset({
    "advapi32.dll", "kernel32.dll", "msvcrt.dll", "ws2_32.dll", "user32.dll", "shell32.dll",
    "ole32.dll", "oleaut32.dll", "ntdll.dll", "bcrypt.dll", "iphlpapi.dll", "psapi.dll",
    "shlwapi.dll", "winmm.dll", "setupapi.dll", "version.dll", "userenv.dll",
})
"""DLLs every Windows has in System32: never shipped."""
BUILD_ESTIMATE = "about 1 minute"
"""A first build on 2 cores: ~55 s (source ~3 s, configure ~6 s, make ~46 s), more when busy."""
PE_AMD64 = 0x8664


class WindowsFio(Frozen):
    """A built (or cached) fio for Windows: ``exe`` and the ``dlls`` beside it in
    ``directory``; ``version`` is the host fio's (``fio-3.33``), ``source`` the Debian source it
    was built from ("fio 3.33-3"), ``sha256`` the fio.exe's."""

    directory: Path
    version: str
    source: str
    source_sha256: str
    toolchain: str
    source_date_epoch: int
    sha256: str
    dlls: tuple[str, ...] = ()
    build_seconds: float
    cached: bool = False

    @property
    def exe(self) -> Path:
        return self.directory / "fio.exe"

    @property
    def files(self) -> tuple[Path, ...]:
        """fio.exe and its DLLs: what the guest needs, all in one folder."""
        return (self.exe, *(self.directory / name for name in self.dlls))


def windows_fio(cache_dir: Path, *, fetch: bool = True, retry: bool = False,
                env: Mapping[str, str] | None = None) -> WindowsFio:
    """fio.exe of the host's fio version, from the cache or built now (``fetch``: the source
    may be downloaded; ``retry``: a remembered failure is tried again). GuestFioUnavailable
    saying why when there is none."""
    plan = _plan(cache_dir, env)
    return cached_build(plan, _load, lambda work, started: _build(plan, work, started, env),
                        fetch=fetch, retry=retry, check_tools=lambda: _check_tools(env))


def windows_key(cache_dir: Path, env: Mapping[str, str] | None = None) -> str:
    """The cache key of the host fio's Windows build (what ``iomatrix doctor`` shows)."""
    return _plan(cache_dir, env).key


def _toolchain(env: Mapping[str, str] | None) -> str:
    """The cross compiler's and linker's versions, one line each joined (in the key)."""
    cc, ld = which(CC, env), which(f"{CROSS}-ld", env)
    if cc is None or ld is None:
        raise GuestFioUnavailable(f"no mingw-w64 cross compiler ({CC}, {CROSS}-ld)",
                                  hint=f"./setup.sh --dev installs it (apt-get install "
                                       f"{BUILD_PACKAGES})")
    gcc = run([cc, "-dumpfullversion"], timeout=30, env=env).stdout.strip()
    binutils = run([ld, "--version"], timeout=30, env=env).stdout.split("\n")[0].strip()
    return f"{CC} {gcc}; {binutils}"


def _plan(cache_dir: Path, env: Mapping[str, str] | None) -> SourcePlan:
    plan = source_plan(cache_dir, env)
    digest = hashlib.sha256()
    for part in (f"iomatrix windows fio {RECIPE}", plan.package, plan.version,
                 " ".join(CONFIGURE_FLAGS), _toolchain(env)):
        digest.update(part.encode() + b"\0")
    key = digest.hexdigest()[:16]
    return plan.model_copy(update={"key": key, "directory": cache_dir / "windows-fio" / key})


def _check_tools(env: Mapping[str, str] | None) -> None:
    missing = {tool: package for tool, package in BUILD_TOOLS.items() if which(tool, env) is None}
    if missing:
        packages = " ".join(sorted(set(missing.values())))
        raise GuestFioUnavailable(f"cannot build fio for Windows: {', '.join(missing)} not "
                                  f"found on PATH", hint=f"apt-get install {packages}")


def _load(plan: SourcePlan) -> WindowsFio | None:
    """The cached build of ``plan``, or None (none, damaged, another version, or another user
    controls it or its files)."""
    with contextlib.suppress(OSError, ValueError, TypeError, KeyError, UnsafeDirectory):
        fields = json.loads(read_owned(plan.directory / "manifest.json"))
        digests = fields.pop("files")
        for name in ("bytes", "configure_flags"):
            fields.pop(name, None)
        found = WindowsFio(**fields, directory=plan.directory, cached=True)
        if found.version != plan.host_version or set(digests) != {p.name for p in found.files}:
            return None
        if all(hashlib.sha256(read_owned(p)).hexdigest() == digests[p.name]
               for p in found.files) and digests["fio.exe"] == found.sha256:
            with contextlib.suppress(OSError):
                os.utime(plan.directory)      # most recently used: the last to be pruned
            return found
    return None


def pe_imports(objdump: str, exe: Path, env: Mapping[str, str] | None = None) -> list[str]:
    """The DLLs ``exe``'s import table names (``objdump -p``), as written."""
    text = run([objdump, "-p", str(exe)], timeout=60, env=env).stdout
    return re.findall(r"^\s*DLL Name: (\S+)$", text, re.M)


def pe_machine(data: bytes) -> int | None:
    """The PE header's machine field (0x8664: x86-64), or None when ``data`` is no PE file."""
    if len(data) < 0x40 or data[:2] != b"MZ":
        return None
    offset = struct.unpack_from("<I", data, 0x3C)[0]
    if data[offset:offset + 4] != b"PE\0\0":
        return None
    return int(struct.unpack_from("<H", data, offset + 4)[0])


def _dll_dirs(cc: str, env: Mapping[str, str] | None) -> list[Path]:
    """Where mingw-w64 keeps the DLLs a cross-built program may import (libgcc's, winpthreads')."""
    libgcc = Path(run([cc, "-print-libgcc-file-name"], timeout=30, env=env).stdout.strip())
    return [libgcc.parent, Path("/usr") / CROSS / "lib", Path("/usr") / CROSS / "bin"]


def _build(plan: SourcePlan, work: Path, started: float,
           env: Mapping[str, str] | None) -> WindowsFio:
    dsc = fetch_source(plan, work, env)
    src = work / "src"
    epoch = int(run(["dpkg-parsechangelog", "-l", str(src / "debian" / "changelog"), "-S",
                     "Timestamp"], timeout=60, env=env).stdout.strip())
    build_env = {**(env if env is not None else os.environ), "LC_ALL": "C", "TZ": "UTC",
                 "SOURCE_DATE_EPOCH": str(epoch)}
    flags = [*CONFIGURE_FLAGS, f"--extra-cflags=-ffile-prefix-map={src}=."]
    configured = run(["./configure", *flags], timeout=600, env=build_env, cwd=src)
    if not re.search(r"^Operating system\s+CYGWIN$", configured.stdout, re.M):
        raise GuestFioUnavailable(f"fio's configure did not target Windows with {CC}")
    run(["make", f"-j{os.cpu_count() or 1}", "fio"], timeout=3600, env=build_env, cwd=src)
    out = work / "out"
    out.mkdir()
    exe = out / "fio.exe"
    run([f"{CROSS}-strip", "-o", str(exe), str(src / "fio.exe")], timeout=60, env=build_env)
    data = exe.read_bytes()
    if pe_machine(data) != PE_AMD64:
        raise GuestFioUnavailable("the fio.exe built is not an x86-64 Windows program")
    if plan.host_version.encode() + b"\0" not in data:
        raise GuestFioUnavailable(f"the fio.exe built does not name itself {plan.host_version}")
    if b"windowsaio\0" not in data:
        raise GuestFioUnavailable("the fio.exe built has no windowsaio engine")
    dlls = []
    for name in pe_imports(f"{CROSS}-objdump", exe, env):
        if name.lower() in SYSTEM_DLLS:
            continue
        found = next((d / name for d in _dll_dirs(CC, env) if (d / name).is_file()), None)
        if found is None:
            raise GuestFioUnavailable(f"fio.exe imports {name}, which mingw-w64 does not have")
        shutil.copyfile(found, out / name)
        dlls.append(name)
    built = WindowsFio(directory=plan.directory, version=plan.host_version,
                       source=f"{plan.package} {plan.version}",
                       source_sha256=hashlib.sha256(dsc.read_bytes()).hexdigest(),
                       toolchain=_toolchain(env), source_date_epoch=epoch,
                       sha256=hashlib.sha256(data).hexdigest(), dlls=tuple(sorted(dlls)),
                       build_seconds=round(time.monotonic() - started, 1))
    files = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in out.iterdir()}
    manifest = {**built.model_dump(mode="json", exclude={"directory", "cached"}),
                "bytes": len(data), "configure_flags": list(CONFIGURE_FLAGS), "files": files}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    for d in ("apt", "download", "src"):
        shutil.rmtree(work / d)
    for entry in out.iterdir():
        entry.chmod(0o644)                 # whatever the umask: writable by no one else
        entry.rename(work / entry.name)
    out.rmdir()
    work.chmod(0o755)
    trusted_cache(work)
    return built
