"""The guest appliance: a kernel plus an initramfs that boots to a listening ``fio --server``.

The initramfs holds a static busybox (Debian's ``busybox-static``, fetched with ``apt-get
download`` into the cache: :mod:`~iomatrix.appliance.busybox`), a static fio of the host's own
version whose server reads the client's RUN at once (built once from the host fio's Debian
source with one patch: :mod:`~iomatrix.appliance.guestfio`; it saves every trial ~1 s), the kernel
modules of the disk controllers and of virtio-net with their dependencies
(:mod:`~iomatrix.appliance.modules`), and ``/init``, a busybox sh script rendered from
``init.sh`` (:func:`init_script`). The init starts ``fio --server``, loads
only the modules whose aliases match a device that is present (PCI, then virtio, then SCSI),
prints one :data:`DISK_MARKER` line per disk, configures the NIC for QEMU user networking and
prints :data:`READY_MARKER` once fio listens. A failure prints a line starting with
:data:`ERROR_MARKER` and powers the guest off, so QEMU exits at once. The markers and the kernel
command line are in :mod:`~iomatrix.appliance.protocol`; the archive is written by
:mod:`~iomatrix.appliance.cpio`.

Where that fio cannot be built, the appliance carries the host's own fio with its shared-library
closure (``ldd``: :mod:`~iomatrix.appliance.libraries`) and dynamic loader instead, ICU's 31 MB
data library (which fio never reads) hollowed to 16 KiB
(:func:`~iomatrix.appliance.libraries.hollow_data_library`), and says so: ``fio_patched`` is
False, ``fio_note`` the reason, and :meth:`Appliance.notes` warns on every run.

Where the boot time goes under TCG (QEMU start to READY; Debian 6.1 kernel, machine pc, -cpu max,
2 busy host cores; traces from printk times, ``initcall_debug`` and ``iomatrix.trace=1``):

* Kernel decompression, 3.3 s: Debian's bzImage is xz-compressed, and xz under an emulated CPU is
  slow. The builder extracts the ELF ``vmlinux`` from the bzImage, and QEMU boots it through its
  PVH entry point (``CONFIG_PVH``, QEMU >= 4.0): no decompression at all (a kernel without a PVH
  note is kept as a bzImage). The vmlinux is stored without the 23 MB of zeros that end it
  (.bss and .brk, stored because ``.init.scratch`` follows them:
  :func:`~iomatrix.appliance.elf.drop_zero_tail`), which QEMU's ELF loader fills in.
* Initramfs unpack, 0.25-0.6 s for the ~60 MB that fio's closure made (on Debian it drags in
  ceph, gluster and ICU data: 84 MB; 54 MB with ICU's data library hollowed); the static fio
  makes the initramfs ~6 MB. Compression only adds guest CPU:
  gzip +1.1 s, zstd -19 +0.9 s, lz4 +0.1 s over an uncompressed cpio, which is what the builder
  writes. Under TCG the kernel's ``rep movsb`` copies run a byte at a time;
  ``clearcpuid=erms,fsrm`` halves the unpack.
* Kernel init, ~1.1 s of which crypto self-tests 0.3 s (``cryptomgr.notests``), the W+X
  page-table check 0.1 s (``rodata=off``), APIC timer calibration 0.1 s and alternatives
  patching 0.25 s (both left alone); ACPI interrupt-link evaluation cost 0.1-0.2 s per PCI
  device at driver load (``acpi=noirq``: the controllers use MSI/MSI-X anyway).
* Init, ~0.7 s: the dynamic fio's start was ~0.5 s of guest CPU (mostly library constructors:
  ceph-common alone 0.12 s; the static fio has none of them), overlapped with module loading;
  the PIIX IDE controller that machine pc always has cost ~0.5 s to probe, so
  ata_piix/ata_generic load only while disks are missing (:data:`LAST_RESORT`). Not worth it:
  mitigations=off, init_on_alloc=0, tsc=reliable, no LSMs, no IPv6 (each within noise).

Medians of 5 boots (same init): bzImage + gzip initramfs + plain command line 8.4 s; PVH 5.8 s;
uncompressed initramfs 3.8 s; this command line 2.3-2.8 s (host load varies), where the guest's
own uptime at READY is 2.0-2.5 s. ``bench/appliance_boot.py`` measures it.

Cache: ``<cache>/appliance/<key>/`` where the key hashes every input (kernel, busybox, fio and
its libraries if any, module files, the rendered init, :data:`BUILDER_VERSION`). A build is
written into a hidden temporary directory and renamed into place, so a half-built appliance never looks valid.
A cached appliance is used only when nobody but root and this user controls the cache
(:func:`~iomatrix.appliance.kernel.trusted_cache`) nor its files, and the kernel and initrd still
have the SHA-256 its manifest recorded when it was built; otherwise it is built again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from iomatrix.appliance.busybox import busybox_text, static_busybox
from iomatrix.appliance.bzimage import extract_vmlinux, kernel_release
from iomatrix.appliance.cpio import CpioWriter
from iomatrix.appliance.elf import drop_zero_tail, has_pvh_entry
from iomatrix.appliance.guestfio import (UNPATCHED, GuestFioUnavailable, guest_fio,
                                         guest_fio_status)
from iomatrix.appliance.kernel import (default_cache_dir, find_kernel, kernel_modules_dir,
                                       kernel_problem, trusted_cache)
from iomatrix.appliance.libraries import hollow_data_library, hollowable, library_closure
from iomatrix.appliance.modules import ModuleSet, module_bytes, resolve_modules
from iomatrix.appliance.protocol import (DISK_MARKER, ERROR_MARKER, GUEST_FIO_PORT, GUEST_IP,
                                         MIN_MEMORY_MIB, READY_MARKER, TRACE_MARKER, GuestDisk,
                                         console_error, kernel_cmdline, parse_disk_lines)
from iomatrix.core.errors import EnvironmentProblem, UnsafeDirectory
from iomatrix.core.files import read_owned
from iomatrix.core.model import Frozen
from iomatrix.core.proc import require, run
from iomatrix.core.units import format_bytes

__all__ = [
    "BUILDER_VERSION", "BUSES", "KEEP_APPLIANCES", "LAST_RESORT", "MODULES", "Appliance",
    "build_appliance", "init_script", "init_template", "input_summary", "render_template",
    # defined elsewhere in the package, importable from here as before the split
    "DISK_MARKER", "ERROR_MARKER", "GUEST_FIO_PORT", "GUEST_IP", "MIN_MEMORY_MIB", "READY_MARKER",
    "TRACE_MARKER", "GuestDisk", "console_error", "kernel_cmdline", "parse_disk_lines",
    "has_pvh_entry", "resolve_modules",
]

BUILDER_VERSION = 4
"""Bump when the appliance layout or the init changes in a way the inputs' hash cannot see
(2: ICU's data library hollowed, the vmlinux's zero tail dropped; 3: the static, patched fio;
4: the manifest holds the SHA-256 of the kernel and initrd)."""

MODULES: tuple[str, ...] = (
    "virtio_pci", "virtio_blk", "virtio_scsi", "sd_mod", "ahci", "ata_piix", "ata_generic",
    "vmw_pvscsi", "sym53c8xx", "megaraid_sas", "nvme", "virtio_net",
)
"""Drivers of every disk controller the matrix can ask for, and of the guest's NIC."""
LAST_RESORT: tuple[str, ...] = ("ata_piix", "ata_generic")
"""Loaded only while fewer disks than ``iomatrix.disks`` have appeared: machine pc always has a
PIIX IDE controller, and probing its (usually empty) channels cost ~0.5 s under TCG."""
BUSES: tuple[str, ...] = ("pci", "virtio", "scsi")
"""The buses whose devices the init matches against module aliases, in this order: a PCI
driver (virtio_pci, a SCSI host) creates the devices of the next bus."""

KEEP_APPLIANCES = 3
"""Appliances kept in the cache (45-100 MB each); older ones are deleted after a build."""


class Appliance(Frozen):
    """A built appliance: boot ``kernel`` with ``initrd`` and :func:`kernel_cmdline`.

    ``kernel`` is an ELF vmlinux booted through its PVH entry (``kernel_format == "pvh"``), or the
    original bzImage (``"bzimage"``) when the kernel has no PVH entry. ``build_seconds`` is the
    time the build took when it was made; ``cached`` says this call found it already built.
    ``fio_patched``: the guest runs the static fio with the patched server
    (:mod:`~iomatrix.appliance.guestfio`); ``fio_note`` says where that fio came from, or why the
    appliance carries the host's unpatched fio instead."""

    kernel: Path
    initrd: Path
    key: str
    kernel_release: str
    fio_version: str
    kernel_bytes: int
    initrd_bytes: int
    build_seconds: float
    cached: bool
    kernel_format: str = "pvh"
    modules: tuple[str, ...] = ()
    fio_patched: bool = False
    fio_note: str = ""

    @property
    def size_bytes(self) -> int:
        """Kernel plus initrd, as stored."""
        return self.kernel_bytes + self.initrd_bytes

    @property
    def fio_text(self) -> str:
        """The guest's fio in a few words: "fio-3.33, static, server patched"."""
        return (f"{self.fio_version}, static, server patched" if self.fio_patched
                else f"{self.fio_version} of the host with its libraries")

    def notes(self) -> list[str]:
        """What a run says about its appliance: that it was built now (and of what), and, every
        time, that guest trials cost more when its fio is the host's unpatched one."""
        lines = []
        if not self.cached:
            lines.append(f"built the guest appliance in {self.build_seconds:.1f} s "
                         f"({format_bytes(self.size_bytes)}: kernel {self.kernel_release}, "
                         f"{self.fio_text})")
        if not self.fio_patched:
            lines.append(f"warning: {UNPATCHED} ({self.fio_note})")
        return lines


def build_appliance(*, cache_dir: Path | None = None, kernel: Path | None = None,
                    force: bool = False, fetch: bool = True) -> Appliance:
    """The appliance for this host's fio and ``kernel`` (default: :func:`find_kernel`), built
    now or found in the cache. ``fetch`` allows ``apt-get download`` of a kernel and busybox and
    ``apt-get source`` of fio; ``force`` rebuilds the appliance (not a cached guest fio) and
    retries a guest fio build that failed."""
    started = time.monotonic()
    cache_dir = cache_dir or default_cache_dir()
    trusted_cache(cache_dir / "appliance", create=False)   # before anything from it is used
    if kernel is None:
        kernel = find_kernel(cache_dir, fetch=fetch, require_modules=True)
    inputs = _gather(Path(kernel), cache_dir, fetch, force)
    final = cache_dir / "appliance" / inputs.key
    if not force:
        found = _load_manifest(final)
        if found is not None:
            with contextlib.suppress(OSError):
                os.utime(final)  # most recently used: the last to be pruned
            return found.model_copy(update={"fio_note": inputs.fio_note})  # today's reason
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=trusted_cache(final.parent)))
    work.chmod(0o755)
    try:
        appliance = _build(inputs, work, final, started)
        if final.exists():  # forced, or a damaged build: out of the way, then replaced
            trash = Path(tempfile.mkdtemp(prefix=".old-", dir=final.parent))
            final.rename(trash / "old")
            shutil.rmtree(trash, ignore_errors=True)
        try:
            work.rename(final)
        except OSError:
            found = _load_manifest(final)  # a concurrent build of the same key won: use it
            if found is None:
                raise
            return found
        _prune(final.parent, final)
        return appliance
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _prune(root: Path, keep: Path) -> None:
    """Delete all but the :data:`KEEP_APPLIANCES` most recently used appliances under ``root``
    (``keep`` among them), and temporary directories of builds abandoned an hour ago."""
    now = time.time()
    others = []
    for entry in root.iterdir():
        with contextlib.suppress(OSError):
            if entry.name.startswith("."):
                if now - entry.stat().st_mtime > 3600:
                    shutil.rmtree(entry, ignore_errors=True)
            elif entry.is_dir() and entry != keep:
                others.append((entry.stat().st_mtime, entry))
    for _, entry in sorted(others, reverse=True)[KEEP_APPLIANCES - 1:]:
        shutil.rmtree(entry, ignore_errors=True)


# --- inputs ------------------------------------------------------------------------------------

@dataclass
class _Inputs:
    kernel: Path
    release: str
    busybox: Path
    fio: Path
    fio_version: str
    fio_patched: bool
    fio_note: str
    interpreter: str
    libraries: dict[str, Path]                    # soname -> host file
    modules: ModuleSet
    init: str
    key: str = ""


def input_summary(*, cache_dir: Path | None = None, fetch: bool = True,
                  env: Mapping[str, str] | None = None) -> str:
    """What a guest run would build its appliance from, checked without building it: fio, the
    kernel with the controllers' modules, busybox (the guests' fio is
    :func:`~iomatrix.appliance.guestfio.guest_fio_status`'s). ``fetch`` lets the kernel and
    busybox be downloaded, as a run does. Raises EnvironmentProblem naming what the build would
    fail on (``iomatrix doctor``)."""
    cache_dir = cache_dir or default_cache_dir()
    fio = Path(require("fio", env))
    kernel = find_kernel(cache_dir, fetch=fetch, require_modules=True, env=env)
    release, modules = _kernel_inputs(kernel)
    builtin = f", {', '.join(modules.builtin)} built in" if modules.builtin else ""
    parts = [f"kernel {release} ({kernel}) with {len(modules.files)} modules{builtin}",
             busybox_text(cache_dir, fetch, env)]
    if not guest_fio_status(cache_dir, env).ok:     # then the host's fio goes in with its libraries
        parts.append(f"the host's fio with {len(library_closure(fio)[1])} libraries")
    return "; ".join(parts)


def _kernel_inputs(kernel: Path) -> tuple[str, ModuleSet]:
    """``kernel``'s release and the modules of :data:`MODULES` from its modules directory."""
    problem = kernel_problem(kernel)
    if problem is not None:
        raise EnvironmentProblem(f"cannot build the appliance: {problem}",
                                 hint="pass --kernel with a bzImage (vmlinuz) file")
    release = kernel_release(kernel)
    modules_dir = kernel_modules_dir(kernel) or Path("/lib/modules") / release
    if not modules_dir.is_dir():
        raise EnvironmentProblem(f"no modules for kernel {kernel} (looked for {modules_dir})",
                                 hint="pass --kernel with a kernel whose lib/modules/<release> "
                                      "is installed, or let iomatrix fetch Debian's")
    return release, resolve_modules(modules_dir, MODULES)


def _gather(kernel: Path, cache_dir: Path, fetch: bool, retry: bool) -> _Inputs:
    release, modules = _kernel_inputs(kernel)
    fio = Path(require("fio"))
    fio_version = run([str(fio), "--version"], timeout=30).stdout.strip()
    try:
        static = guest_fio(cache_dir, fetch=fetch, retry=retry)
        fio, patched, note = static.path, True, f"built from the Debian source {static.source}"
        interpreter, libraries = "", {}
    except GuestFioUnavailable as e:
        patched, note = False, str(e)
        interpreter, libraries = library_closure(fio)
    busybox = static_busybox(cache_dir, fetch)
    inputs = _Inputs(kernel=kernel, release=release, busybox=busybox, fio=fio,
                     fio_version=fio_version, fio_patched=patched, fio_note=note,
                     interpreter=interpreter, libraries=libraries,
                     modules=modules, init=init_script(modules))
    inputs.key = _cache_key(inputs)
    return inputs


def _cache_key(inputs: _Inputs) -> str:
    """16 hex digits of a SHA-256 over :data:`BUILDER_VERSION`, the rendered init and the
    contents of every file that goes into the appliance, each under its label."""
    digest = hashlib.sha256()
    digest.update(f"iomatrix-appliance {BUILDER_VERSION}\n".encode())
    digest.update(inputs.init.encode())
    loader = [("loader", Path(inputs.interpreter))] if inputs.interpreter else []
    for label, path in [("kernel", inputs.kernel), ("busybox", inputs.busybox),
                        ("fio", inputs.fio), *loader,
                        *((f"lib {s}", p) for s, p in sorted(inputs.libraries.items())),
                        *((f"module {n}", p) for n, p in inputs.modules.files)]:
        digest.update(f"\n{label}\n".encode())
        digest.update(_file_digest(path))
    return digest.hexdigest()[:16]


def _file_digest(path: Path) -> bytes:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.digest()


# --- the init ----------------------------------------------------------------------------------

_PLACEHOLDER = re.compile(r"@([A-Z_]+)@")


def init_template() -> str:
    """``init.sh``, the template of the appliance's /init shipped in this package."""
    return resources.files("iomatrix.appliance").joinpath("init.sh").read_text(encoding="utf-8")


def disk_line_function() -> str:
    """``disk-line.sh``: the shell function ``disk_line NAME`` that prints a disk's
    :data:`DISK_MARKER` line, which the appliance's init and a user's guest's script share."""
    text = resources.files("iomatrix.appliance").joinpath("disk-line.sh").read_text(
        encoding="utf-8")
    return render_template(text, {"DISK_MARKER": DISK_MARKER}).rstrip("\n")


def render_template(template: str, values: Mapping[str, str]) -> str:
    """``template`` with every ``@NAME@`` replaced by ``values["NAME"]``, in one pass (a value is
    never scanned for placeholders). Raises ValueError for a placeholder without a value or a
    value without a placeholder."""
    used: set[str] = set()

    def value(match: re.Match[str]) -> str:
        name = match[1]
        if name not in values:
            raise ValueError(f"the init template has @{name}@, which has no value")
        used.add(name)
        return values[name]

    text = _PLACEHOLDER.sub(value, template)
    if unused := sorted(set(values) - used):
        raise ValueError(f"the init template lacks {', '.join(f'@{n}@' for n in unused)}")
    return text


def init_script(modules: ModuleSet) -> str:
    """The appliance's /init: ``init.sh`` with the markers, the default port, the guest's address,
    the buses, :data:`BUILDER_VERSION`, each module's dependencies and the modalias matchers
    substituted (see the module docstring)."""
    # Modalias globs are sh case patterns as they stand (fnmatch: *, ?, [...]); an alias with any
    # other character is left out rather than quoted (no controller driver we load has one).
    safe = re.compile(r"[A-Za-z0-9_:*?\[\]\-.,]+")
    matchers: dict[bool, list[str]] = {False: [], True: []}
    for name, patterns in modules.aliases.items():
        usable = [p for p in patterns if safe.fullmatch(p)]
        if usable:
            matchers[name in LAST_RESORT].append(
                f'    case "$1" in {"|".join(usable)}) load {name} ;; esac')
    deps = [f'deps_{name}="{" ".join(modules.closure(name))}"'
            for name, _ in modules.files if modules.closure(name)]
    return render_template(init_template(), {
        "BUILDER_VERSION": str(BUILDER_VERSION), "READY_MARKER": READY_MARKER,
        "DISK_LINE": disk_line_function(), "ERROR_MARKER": ERROR_MARKER,
        "TRACE_MARKER": TRACE_MARKER,
        "PORT": str(GUEST_FIO_PORT), "GUEST_IP": GUEST_IP, "BUSES": " ".join(BUSES),
        "DEPS": "\n".join(deps),
        "MATCH_FIRST": "\n".join(matchers[False]) or "    :",
        "MATCH_LAST": "\n".join(matchers[True]) or "    :"})


# --- the build ---------------------------------------------------------------------------------

def _write_initramfs(inputs: _Inputs, path: Path) -> None:
    with open(path, "wb") as out:
        cpio = CpioWriter(out)
        for d in ("bin", "dev", "proc", "sys", "tmp", "lib/modules",
                  *(["lib/fio"] if inputs.libraries else [])):
            cpio.directory(d)
        cpio.device("dev/console", 5, 1)
        cpio.device("dev/null", 1, 3)
        cpio.file("bin/busybox", inputs.busybox.read_bytes(), 0o755)
        for applet in run([str(inputs.busybox), "--list"], timeout=30).stdout.split():
            if applet != "busybox":
                cpio.symlink(f"bin/{applet}", "busybox")
        cpio.file("bin/fio", inputs.fio.read_bytes(), 0o755)
        for soname, lib in sorted(inputs.libraries.items()):
            data = lib.read_bytes()
            if hollowable(soname):
                data = hollow_data_library(data) or data
            cpio.file(f"lib/fio/{soname}", data, 0o755)
        if inputs.interpreter:
            cpio.file(inputs.interpreter.lstrip("/"), Path(inputs.interpreter).read_bytes(),
                      0o755)
        for name, module in inputs.modules.files:
            cpio.file(f"lib/modules/{name}.ko", module_bytes(module))
        cpio.file("init", inputs.init.encode(), 0o755)
        cpio.finish()


def _build(inputs: _Inputs, work: Path, final: Path, started: float) -> Appliance:
    bzimage = inputs.kernel.read_bytes()
    vmlinux = extract_vmlinux(bzimage)
    if vmlinux is not None and has_pvh_entry(vmlinux):
        kernel_name, kernel_format, kernel_data = "vmlinux", "pvh", drop_zero_tail(vmlinux)
    else:
        kernel_name, kernel_format, kernel_data = "vmlinuz", "bzimage", bzimage
    (work / kernel_name).write_bytes(kernel_data)
    _write_initramfs(inputs, work / "initrd")
    for name in (kernel_name, "initrd"):
        (work / name).chmod(0o644)                 # whatever the umask: writable by no one else
    appliance = Appliance(
        kernel=final / kernel_name, initrd=final / "initrd", key=inputs.key,
        kernel_release=inputs.release, fio_version=inputs.fio_version,
        kernel_bytes=len(kernel_data), initrd_bytes=(work / "initrd").stat().st_size,
        build_seconds=round(time.monotonic() - started, 2), cached=False,
        kernel_format=kernel_format, modules=tuple(n for n, _ in inputs.modules.files),
        fio_patched=inputs.fio_patched, fio_note=inputs.fio_note)
    manifest = appliance.model_dump(mode="json", exclude={"cached"})
    manifest["source_kernel"] = str(inputs.kernel)
    manifest["sha256"] = {name: hashlib.sha256((work / name).read_bytes()).hexdigest()
                          for name in (kernel_name, "initrd")}
    (work / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    (work / "manifest.json").chmod(0o644)
    return appliance


def _load_manifest(directory: Path) -> Appliance | None:
    """The appliance built in ``directory``, or None when there is none, when another user
    controls it or its files, or when its kernel or initrd is not what was built."""
    with contextlib.suppress(OSError, ValueError, TypeError, KeyError, UnsafeDirectory):
        fields = json.loads(read_owned(directory / "manifest.json"))
        fields.pop("source_kernel", None)
        digests = fields.pop("sha256")
        fields["kernel"] = directory / Path(fields["kernel"]).name
        fields["initrd"] = directory / Path(fields["initrd"]).name
        found = Appliance(**fields, cached=True)
        if all(hashlib.sha256(read_owned(path)).hexdigest() == digests[path.name]
               for path in (found.kernel, found.initrd)):
            return found
    return None
