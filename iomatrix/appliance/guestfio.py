"""The guest's fio: a static build of this host's own fio version from its Debian source package,
with one patch to the server (``fio-server-idle.patch``), built once and cached.

Why a build of its own: the guest runs ``fio --server`` and the host's fio is its client, so both
must be the same version (the protocol is versioned). The host's binary with its shared-library
closure (:mod:`~iomatrix.appliance.libraries`) is that, but it costs every trial about 1 s: in
fio 3.33's server.c (``handle_connection``, unchanged upstream) the connection process, idle with
no job running, waits on its queue of outgoing messages for up to 1000 ms without watching the
socket, so RUN, which the client sends after calibrating its clock (~0.15 s), is read only when
that wait times out. No client option avoids it. The patch makes the idle wait a ``poll`` on the
socket (after sending what is queued: without a job nothing else can queue); with a job running
the server waits as before, so everything else, the protocol version included, is unchanged.
Static, because the appliance then carries one 3 MB file instead of fio's 80 MB closure (ceph,
gluster, ICU), which the guest no longer unpacks nor maps at start.

How: the Debian source of the installed ``fio`` package (``dpkg-query``: source name and version),
downloaded with ``apt-get source`` from the apt source that serves it (``apt-cache madison``,
``apt-get indextargets``). That entry is copied as a ``deb-src`` entry into a private sources
directory, and ``apt-get update``/``source`` run with private lists and caches in the build
directory, so the host's apt configuration is never changed; apt checks the files against the
signed index as usual. ``dpkg-source -x`` applies Debian's own patches, then ours; ``configure
--build-static --disable-native`` with the engines a static guest can use (libaio, io_uring,
psync, sync..., checked with ``--enghelp``; not the ones for ceph, gluster, pmem, nbd, rdma),
``make fio``, ``strip``. The result must be static and print the same ``--version`` as the
host's fio, or it is not used.

Cache: ``<cache>/guest-fio/<key>/`` with ``fio`` and ``manifest.json`` (source, the .dsc's
SHA-256, the patch's, the configure flags, build time, the fio binary's SHA-256), where the key
hashes the source package name and version (a Debian version names exactly one source), the patch,
the flags and :data:`RECIPE`. A cached build is used only when nobody but root and this user
controls the cache (:func:`~iomatrix.appliance.kernel.trusted_cache`) nor its files, and the
binary still has the SHA-256 recorded when it was built. A failed build is remembered in
``<key>.failed`` for :data:`RETRY_AFTER` seconds (``iomatrix appliance build --force`` tries
again at once), so runs don't retry it each time.

When it cannot be built (not a Debian-packaged fio, no source for its version, no compiler, the
patch does not apply), :class:`GuestFioUnavailable` says why and the appliance falls back to the
host's fio with its closure: guest trials then cost ~1 s more (:data:`UNPATCHED`). Where the
archive serves no source for the installed version (:class:`FioSourceUnavailable`; apt's own
line names the file, e.g. ``fio_3.39-1.dsc: 404 Not Found``) that is a fact of the host's
archive, remembered as such, and not a failure of the build.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from importlib import resources
from pathlib import Path
from typing import TypeVar

from iomatrix.appliance.elf import elf_interpreter
from iomatrix.appliance.kernel import trusted_cache
from iomatrix.core.errors import (EnvironmentProblem, FioSourceUnavailable, GuestFioUnavailable,
                                  IomatrixError, ToolFailed, UnsafeDirectory)
from iomatrix.core.files import read_owned
from iomatrix.core.model import Frozen
from iomatrix.core.proc import run, which

RECIPE = 2
"""Bump when the build steps change in a way the key cannot see (2: the manifest holds the
binary's SHA-256)."""
PATCH = "fio-server-idle.patch"
CONFIGURE_FLAGS: tuple[str, ...] = (
    "--build-static", "--disable-native", "--disable-numa", "--disable-rdma", "--disable-rados",
    "--disable-rbd", "--disable-http", "--disable-gfapi", "--disable-pmem", "--disable-libnfs",
    "--disable-xnvme", "--disable-libzbc", "--disable-tcmalloc", "--disable-dfs",
)
"""Static, for any x86-64 CPU (no -march=native: the guest's CPU model is QEMU's), and without
the engines of libraries a static guest has no use for. lex/yacc arithmetic is used when flex
and bison are installed, as in Debian's build."""
REQUIRED_ENGINES: tuple[str, ...] = ("libaio", "io_uring", "psync", "sync")
BUILD_TOOLS: dict[str, str] = {
    "gcc": "gcc", "make": "make", "strip": "binutils", "patch": "patch",
    "dpkg-source": "dpkg-dev", "apt-get": "apt",
}
"""Tools the build runs, each with the Debian package that has it."""
BUILD_PACKAGES = "gcc make libc6-dev dpkg-dev libaio-dev zlib1g-dev flex bison libfl-dev"
"""What ``./setup.sh`` installs for this build (libaio-dev: the libaio engine, linked in)."""
UNPATCHED = "guest trials cost ~1 s more: fio server unpatched"
"""The warning for an appliance that carries the host's fio (see the module docstring)."""
RETRY_AFTER = 24 * 3600
KEEP_BUILDS = 2
BUILD_ESTIMATE = "30-60 s"
"""A first build on 2 cores: 33 s idle (source ~2 s, configure ~7 s, make ~23 s), 47 s busy."""
_NO_APT = "a Debian or Ubuntu host with apt and dpkg"
_Built = TypeVar("_Built")


class GuestFio(Frozen):
    """A built (or cached) static fio for the guest. ``version`` is its ``--version``, equal to
    the host fio's; ``source`` the Debian source it was built from ("fio 3.33-3")."""

    path: Path
    version: str
    source: str
    source_sha256: str
    patch_sha256: str
    build_seconds: float
    cached: bool = False


class GuestFioStatus(Frozen):
    """What :func:`guest_fio` would do now, without building: ``ok`` is False when the appliance
    would carry the unpatched host fio (``detail`` says why, ``hint`` what fixes it)."""

    ok: bool
    detail: str
    hint: str | None = None
    cached: bool = False


class SourcePlan(Frozen):
    host_version: str
    package: str
    version: str
    binary_version: str
    key: str
    directory: Path


def patch_text() -> str:
    """The patch applied to fio's source, shipped in this package."""
    return resources.files("iomatrix.appliance").joinpath(PATCH).read_text(encoding="utf-8")


def upstream_version(debian_version: str) -> str:
    """"1:3.33-3+b1" -> "3.33": without epoch and Debian revision, as fio names itself."""
    version = debian_version.split(":", 1)[-1]
    return version.rsplit("-", 1)[0] if "-" in version else version


def guest_fio(cache_dir: Path, *, fetch: bool = True, retry: bool = False,
              env: Mapping[str, str] | None = None) -> GuestFio:
    """The static, patched fio for the appliance, from the cache or built now (``fetch``: the
    source may be downloaded; ``retry``: a remembered failure is tried again). Raises
    :class:`GuestFioUnavailable` saying why when there is none."""
    plan = source_plan(cache_dir, env)
    return cached_build(plan, _load, lambda work, started: _build(plan, work, started, env),
                        fetch=fetch, retry=retry, check_tools=lambda: _check_tools(env))


def cached_build(plan: SourcePlan, load: Callable[[SourcePlan], _Built | None],
                 build: Callable[[Path, float], _Built], *, fetch: bool, retry: bool,
                 check_tools: Callable[[], None]) -> _Built:
    """``plan``'s build from the cache (``load``), or made now by ``build(work, started)`` in a
    hidden directory of the cache renamed into ``plan.directory`` (shared by every build of
    the host fio's source: this one and :mod:`~iomatrix.appliance.winfio`'s); a failure is
    remembered (see the module docstring)."""
    trusted_cache(plan.directory.parent, create=False)
    found = load(plan)
    if found is not None:
        return found
    failed = _remembered_failure(plan)
    if failed is not None and not retry:
        reason, kind = failed
        raise kind(f"{reason} (remembered; `iomatrix appliance build --force` tries again)")
    if not fetch:
        raise GuestFioUnavailable(f"not built yet for fio {plan.version}, and fetching its "
                                  "source is not allowed")
    check_tools()
    started = time.monotonic()
    trusted_cache(plan.directory.parent)
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=plan.directory.parent))
    try:
        built = build(work, started)
        if plan.directory.exists():
            found = load(plan)         # a concurrent build of the same key won: use it
            if found is not None:
                return found
            trash = Path(tempfile.mkdtemp(prefix=".old-", dir=plan.directory.parent))
            plan.directory.rename(trash / "old")           # damaged: out of the way
            shutil.rmtree(trash, ignore_errors=True)
        try:
            work.rename(plan.directory)
        except OSError:
            found = load(plan)
            if found is None:
                raise
            return found
        _failure_file(plan).unlink(missing_ok=True)
        _prune(plan.directory)
        return built
    except (IomatrixError, OSError) as e:
        reason = str(e) if isinstance(e, GuestFioUnavailable) else f"the build failed: {e}"
        kind = FioSourceUnavailable if isinstance(e, FioSourceUnavailable) else GuestFioUnavailable
        with contextlib.suppress(OSError):
            _failure_file(plan).write_text(json.dumps({
                "reason": reason, "time": time.time(),
                "no_source": kind is FioSourceUnavailable}))
        raise kind(reason) from e
    finally:
        shutil.rmtree(work, ignore_errors=True)


def guest_fio_status(cache_dir: Path, env: Mapping[str, str] | None = None) -> GuestFioStatus:
    """Whether guests will get the static, patched fio, without building it (doctor, plan)."""
    hint = f"./setup.sh installs what the build needs (apt-get install {BUILD_PACKAGES})"
    try:
        plan = source_plan(cache_dir, env)
        trusted_cache(plan.directory.parent, create=False)
        found = _load(plan)
        if found is not None:
            return GuestFioStatus(ok=True, cached=True, detail=(
                f"{found.version}, static, with the server patch: built from the Debian "
                f"source {found.source} (cached)"))
        failed = _remembered_failure(plan)
        if failed is not None:
            return GuestFioStatus(ok=False, detail=f"{UNPATCHED}: {failed[0]}",
                                  hint="`iomatrix appliance build --force` tries again")
        _check_tools(env)
    except GuestFioUnavailable as e:
        return GuestFioStatus(ok=False, detail=f"{UNPATCHED}: {e}", hint=e.hint or hint)
    except EnvironmentProblem as e:        # a cache another user controls: no guest run
        return GuestFioStatus(ok=False, detail=str(e), hint=e.hint)
    return GuestFioStatus(ok=True, detail=(
        f"the first guest run builds {plan.host_version} from the Debian source fio "
        f"{plan.version} with the server patch ({BUILD_ESTIMATE}, once)"))


# --- what to build -----------------------------------------------------------------------------

def source_plan(cache_dir: Path, env: Mapping[str, str] | None) -> SourcePlan:
    fio = which("fio", env)
    if fio is None:
        raise GuestFioUnavailable("fio not found on PATH", hint="apt-get install fio")
    dpkg_query = which("dpkg-query", env)
    if dpkg_query is None:
        raise GuestFioUnavailable(f"dpkg-query not found on PATH: its source needs {_NO_APT}",
                                  hint="apt-get install dpkg")
    host_version = run([fio, "--version"], timeout=30, env=env).stdout.strip()
    query = run([dpkg_query, "-W", "-f", "${db:Status-Abbrev}\t${source:Package}\t"
                 "${source:Version}\t${Version}", "fio"], timeout=30, check=False, env=env)
    fields = query.stdout.split("\t")
    if query.returncode != 0 or len(fields) != 4 or not fields[0].startswith("ii"):
        raise GuestFioUnavailable("no Debian package fio is installed, so there is no source "
                                  f"for {host_version}", hint="apt-get install fio")
    _, package, version, binary_version = fields
    if host_version != f"fio-{upstream_version(version)}":
        raise GuestFioUnavailable(f"the fio on PATH ({fio}) says {host_version}, but the "
                                  f"installed fio package is {binary_version}",
                                  hint="put the fio package's /usr/bin/fio first on PATH")
    digest = hashlib.sha256()
    for part in (f"iomatrix guest fio {RECIPE}", package, version, platform.machine(),
                 patch_text(), " ".join(CONFIGURE_FLAGS)):
        digest.update(part.encode() + b"\0")
    key = digest.hexdigest()[:16]
    return SourcePlan(host_version=host_version, package=package, version=version,
                 binary_version=binary_version, key=key,
                 directory=cache_dir / "guest-fio" / key)


def _load(plan: SourcePlan) -> GuestFio | None:
    """The cached build of ``plan``, or None (none, damaged, another version, or another user
    controls it or its files)."""
    with contextlib.suppress(OSError, ValueError, TypeError, KeyError, UnsafeDirectory):
        fields = json.loads(read_owned(plan.directory / "manifest.json"))
        digest = fields.pop("sha256")
        fields.pop("bytes", None)
        fields.pop("configure_flags", None)
        found = GuestFio(**fields, path=plan.directory / "fio", cached=True)
        if (found.version == plan.host_version
                and hashlib.sha256(read_owned(found.path)).hexdigest() == digest):
            with contextlib.suppress(OSError):
                os.utime(plan.directory)      # most recently used: the last to be pruned
            return found
    return None


def _failure_file(plan: SourcePlan) -> Path:
    return plan.directory.with_name(plan.key + ".failed")


def _remembered_failure(plan: SourcePlan) -> tuple[str, type[GuestFioUnavailable]] | None:
    """The reason a build of ``plan`` failed less than :data:`RETRY_AFTER` ago, and the kind."""
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        memo = json.loads(_failure_file(plan).read_text())
        if time.time() - float(memo["time"]) < RETRY_AFTER:
            return str(memo["reason"]), (FioSourceUnavailable if memo.get("no_source")
                                         else GuestFioUnavailable)
    return None


def _check_tools(env: Mapping[str, str] | None) -> None:
    missing = {tool: package for tool, package in BUILD_TOOLS.items() if which(tool, env) is None}
    if missing:
        packages = " ".join(sorted(set(missing.values())))
        raise GuestFioUnavailable(
            f"cannot build it: {', '.join(missing)} not found on PATH",
            hint=f"./setup.sh installs them (apt-get install {packages}; the build also needs "
                 f"{BUILD_PACKAGES})")


def _prune(keep: Path) -> None:
    """All but the :data:`KEEP_BUILDS` most recently used builds go (``keep`` stays), and
    temporary directories of builds abandoned an hour ago."""
    now, others = time.time(), []
    for entry in keep.parent.iterdir():
        with contextlib.suppress(OSError):
            if entry.name.startswith(".") and now - entry.stat().st_mtime > 3600:
                shutil.rmtree(entry, ignore_errors=True)
            elif entry.is_dir() and not entry.name.startswith(".") and entry != keep:
                others.append((entry.stat().st_mtime, entry))
    for _, entry in sorted(others, reverse=True)[KEEP_BUILDS - 1:]:
        shutil.rmtree(entry, ignore_errors=True)


# --- the source --------------------------------------------------------------------------------

def _apt_entry(plan: SourcePlan, env: Mapping[str, str] | None) -> tuple[str, str]:
    """(file name, text) of a deb-src entry for the apt source that serves the installed fio:
    the host's own entry (URIs, suites, Signed-By...) with its type changed."""
    madison = run(["apt-cache", "madison", "fio"], timeout=60, env=env).stdout
    repos = set()
    for line in madison.splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) == 3 and parts[1] == plan.binary_version and parts[2].endswith(" Packages"):
            uri, dist = parts[2].split()[:2]
            if "/" in dist:
                suite, component = dist.rsplit("/", 1)
                repos.add((uri.rstrip("/"), suite, component))
    targets = run(["apt-get", "indextargets", "--format",
                   "$(SOURCESENTRY)\t$(REPO_URI)\t$(RELEASE)\t$(COMPONENT)",
                   "Created-By: Packages"], timeout=60, env=env).stdout
    for line in targets.splitlines():
        fields = line.split("\t")
        if len(fields) == 4 and (fields[1].rstrip("/"), fields[2], fields[3]) in repos:
            entry, _, number = fields[0].rpartition(":")
            text = _entry_text(Path(entry), int(number))
            if text is not None:
                return ("iomatrix.sources" if entry.endswith(".sources") else "iomatrix.list"), text
    raise FioSourceUnavailable(f"no apt source serves fio {plan.binary_version} any more "
                               "(`apt-cache madison fio`), so its source cannot be fetched",
                               hint="upgrade fio (apt-get install fio), then build again")


def _entry_text(path: Path, number: int) -> str | None:
    """Entry ``number`` of an apt sources file turned into a deb-src entry: a deb822 stanza
    (numbered from 1, comments dropped) with ``Types: deb-src``, or a one-line entry (the line
    number) with ``deb-src`` for ``deb``."""
    with contextlib.suppress(OSError, UnicodeDecodeError):
        text = path.read_text()
        if path.suffix == ".sources":
            stanzas = [s for s in (
                "\n".join(line for line in block.splitlines() if not line.lstrip().startswith("#"))
                for block in re.split(r"\n[ \t]*\n", text)) if s.strip()]
            if 0 < number <= len(stanzas):
                stanza = re.sub(r"(?im)^Types:.*$", "Types: deb-src", stanzas[number - 1])
                return stanza.strip("\n") + "\n"
        else:
            lines = text.splitlines()
            if 0 < number <= len(lines) and lines[number - 1].split()[:1] == ["deb"]:
                return "deb-src" + lines[number - 1].lstrip()[3:] + "\n"
    return None


def fetch_source(plan: SourcePlan, work: Path, env: Mapping[str, str] | None) -> Path:
    """Download and unpack the source (Debian's patches applied) into ``work/src``; returns
    the .dsc file."""
    name, entry = _apt_entry(plan, env)
    apt = work / "apt"
    for d in ("parts", "lists/partial", "cache/archives/partial"):
        (apt / d).mkdir(parents=True)
    (apt / "parts" / name).write_text(entry)
    options = [f"-o{k}={v}" for k, v in (
        ("Dir::Etc::SourceList", "/dev/null"), ("Dir::Etc::SourceParts", apt / "parts"),
        ("Dir::State::Lists", apt / "lists"), ("Dir::Cache", apt / "cache"),
        ("APT::Get::List-Cleanup", "false"))]
    if os.geteuid() == 0:  # root cannot hand the files to the _apt sandbox user in mkdtemp dirs
        options.append("-oAPT::Sandbox::User=root")
    download = work / "download"
    download.mkdir()
    try:
        run(["apt-get", *options, "-q", "update"], timeout=600, env=env, cwd=work)
        run(["apt-get", *options, "-q", "source", "--download-only", "--only-source",
             f"{plan.package}={plan.version}"], timeout=600, env=env, cwd=download)
    except ToolFailed as e:
        # apt's own line for a file the archive does not serve beats its summary ("Failed to
        # fetch some archives."): "E: Failed to fetch URL  404  Not Found [IP: ...]"
        missing = re.search(r"^E: Failed to fetch (\S+)\s+(.*?)\s*(?:\[IP: [^]]*\])?$", e.output,
                            re.M)
        reason = f"{missing[1]}: {' '.join(missing[2].split())}" if missing else str(e)
        raise FioSourceUnavailable(f"no source for {plan.package} {plan.version}: {reason}",
                                   hint="`iomatrix appliance build --force` tries again "
                                        "once the archive serves it") from e
    dscs = list(download.glob("*.dsc"))
    if len(dscs) != 1:
        raise GuestFioUnavailable(f"apt-get source {plan.package}={plan.version} left "
                                  f"{len(dscs)} .dsc files")
    run(["dpkg-source", "--no-copy", "-x", str(dscs[0]), str(work / "src")], timeout=300,
        env=env, cwd=work)
    return dscs[0]


# --- the build ---------------------------------------------------------------------------------

def _build(plan: SourcePlan, work: Path, started: float, env: Mapping[str, str] | None) -> GuestFio:
    dsc = fetch_source(plan, work, env)
    src = work / "src"
    patch = work / PATCH
    patch.write_text(patch_text())
    build_env = {**(env if env is not None else os.environ), "LC_ALL": "C"}   # messages parsed
    try:
        patched = run(["patch", "-p1", "--forward", "--batch", "-i", str(patch)], timeout=60,
                      env=build_env, cwd=src).stdout
    except IomatrixError as e:
        raise GuestFioUnavailable(f"the server patch does not apply to fio {plan.version}: "
                                  f"{e}") from e
    if patched.split("\n")[0] != "patching file server.c" or "fuzz" in patched:
        raise GuestFioUnavailable(f"the server patch applies to fio {plan.version} only "
                                  f"approximately: {' '.join(patched.split())}")
    configured = run(["./configure", *CONFIGURE_FLAGS], timeout=600, env=build_env, cwd=src)
    if not re.search(r"^Linux AIO support\s+yes$", configured.stdout, re.M):
        raise GuestFioUnavailable("fio's configure found no libaio (install libaio-dev)",
                                  hint="apt-get install libaio-dev")
    run(["make", f"-j{os.cpu_count() or 1}", "fio"], timeout=3600, env=build_env, cwd=src)
    binary = work / "fio"
    run(["strip", "-o", str(binary), str(src / "fio")], timeout=60, env=env)
    if elf_interpreter(binary.read_bytes()) is not None:
        raise GuestFioUnavailable("the fio built is not static")
    version = run([str(binary), "--version"], timeout=30).stdout.strip()
    if version != plan.host_version:
        raise GuestFioUnavailable(f"the fio built says {version}, the host's {plan.host_version}")
    engines = set(run([str(binary), "--enghelp"], timeout=30).stdout.split())
    if missing := [e for e in REQUIRED_ENGINES if e not in engines]:
        raise GuestFioUnavailable(f"the fio built lacks the engines {', '.join(missing)}")
    built = GuestFio(path=plan.directory / "fio", version=version,
                     source=f"{plan.package} {plan.version}",
                     source_sha256=hashlib.sha256(dsc.read_bytes()).hexdigest(),
                     patch_sha256=hashlib.sha256(patch.read_bytes()).hexdigest(),
                     build_seconds=round(time.monotonic() - started, 1))
    manifest = {**built.model_dump(mode="json", exclude={"path", "cached"}),
                "bytes": binary.stat().st_size, "configure_flags": list(CONFIGURE_FLAGS),
                "sha256": hashlib.sha256(binary.read_bytes()).hexdigest()}
    for d in ("apt", "download", "src"):
        shutil.rmtree(work / d)
    patch.unlink()
    (work / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    (work / "configure.log").write_text(configured.stdout)
    for name, mode in (("fio", 0o755), ("manifest.json", 0o644), ("configure.log", 0o644)):
        (work / name).chmod(mode)                  # whatever the umask: writable by no one else
    work.chmod(0o755)
    return built
