"""The guest appliance: a kernel plus an initramfs that boots to a listening ``fio --server``.

The initramfs holds a static busybox (Debian's ``busybox-static``, fetched with ``apt-get
download`` into the cache), the host's own fio with its shared-library closure (``ldd``) and
dynamic loader (so client and server fio versions always match), the kernel modules of the disk
controllers and of virtio-net with their dependencies, and ``/init``, a busybox sh script. The
init starts ``fio --server``, loads only the modules whose aliases match a device that is present
(PCI, then virtio, then SCSI), prints one :data:`DISK_MARKER` line per disk, configures the NIC
for QEMU user networking and prints :data:`READY_MARKER` once fio listens. A failure prints a
line starting with :data:`ERROR_MARKER` and powers the guest off, so QEMU exits at once.

Module dependencies come from each module's ``.modinfo`` section (``depends=``, the field modpost
writes and depmod and modinfo read), so neither depmod nor a ``modules.dep`` is needed (Debian's
kernel package ships none, and kmod is not installed everywhere). Built-in modules
(``modules.builtin``) are skipped; compressed modules are stored decompressed.

Where the boot time goes under TCG (QEMU start to READY; Debian 6.1 kernel, machine pc, -cpu max,
2 busy host cores; traces from printk times, ``initcall_debug`` and ``iomatrix.trace=1``):

* Kernel decompression, 3.3 s: Debian's bzImage is xz-compressed, and xz under an emulated CPU is
  slow. The builder extracts the ELF ``vmlinux`` from the bzImage, and QEMU boots it through its
  PVH entry point (``CONFIG_PVH``, QEMU >= 4.0): no decompression at all (a kernel without a PVH
  note is kept as a bzImage).
* Initramfs unpack, 0.25-0.6 s for ~90 MB (fio's closure on Debian drags in ceph, gluster and
  ICU data: 84 MB). Compression only adds guest CPU: gzip +1.1 s, zstd -19 +0.9 s, lz4 +0.1 s
  over an uncompressed cpio, which is what the builder writes. Under TCG the kernel's
  ``rep movsb`` copies run a byte at a time; ``clearcpuid=erms,fsrm`` halves the unpack.
* Kernel init, ~1.1 s of which crypto self-tests 0.3 s (``cryptomgr.notests``), the W+X
  page-table check 0.1 s (``rodata=off``), APIC timer calibration 0.1 s and alternatives
  patching 0.25 s (both left alone); ACPI interrupt-link evaluation cost 0.1-0.2 s per PCI
  device at driver load (``acpi=noirq``: the controllers use MSI/MSI-X anyway).
* Init, ~0.7 s: fio's start is ~0.5 s of guest CPU (mostly library constructors: ceph-common
  alone 0.12 s), overlapped with module loading; the PIIX IDE controller that machine pc always
  has cost ~0.5 s to probe, so ata_piix/ata_generic load only while disks are missing
  (:data:`LAST_RESORT`). Not worth it: mitigations=off, init_on_alloc=0, tsc=reliable, no LSMs,
  no IPv6 (each within noise).

Medians of 5 boots (same init): bzImage + gzip initramfs + plain command line 8.4 s; PVH 5.8 s;
uncompressed initramfs 3.8 s; this command line 2.3-2.8 s (host load varies), where the guest's
own uptime at READY is 2.0-2.5 s. ``bench/appliance_boot.py`` measures it.

Cache: ``<cache>/appliance/<key>/`` where the key hashes every input (kernel, busybox, fio and its
libraries, module files, the init text, :data:`BUILDER_VERSION`). A build is written into a
hidden temporary directory and renamed into place, so a half-built appliance never looks valid.
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import hashlib
import json
import lzma
import os
import re
import shlex
import shutil
import stat
import struct
import tempfile
import time
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO


from iomatrix.appliance.kernel import (default_cache_dir, find_kernel, kernel_modules_dir,
                                       kernel_problem)
from iomatrix.core.errors import EnvironmentProblem, IomatrixError, ToolFailed
from iomatrix.core.proc import require, run, which
from iomatrix.core.model import Frozen

BUILDER_VERSION = 1
"""Bump when the appliance layout or the init changes in a way the inputs' hash cannot see."""

READY_MARKER = "IOMATRIX-READY"
"""Printed on the serial console once ``fio --server`` listens:
``IOMATRIX-READY uptime=<s> init=<s at /init> port=<guest port> nic=<interface>``."""
DISK_MARKER = "IOMATRIX-DISK"
"""Prefix of one console line per guest disk, followed by ``key=value`` fields (see GuestDisk)."""
ERROR_MARKER = "IOMATRIX-ERROR"
"""Prefix of the console line the init prints when it cannot get fio ready (then it powers off)."""
TRACE_MARKER = "IOMATRIX-TRACE"
"""With ``iomatrix.trace=1``: ``IOMATRIX-TRACE <uptime> <stage>`` as the init reaches each stage."""
GUEST_FIO_PORT = 8765
GUEST_IP = "10.0.2.15"
"""The guest's address on QEMU's user-mode network (10.0.2.0/24, gateway 10.0.2.2)."""
MIN_MEMORY_MIB = 320
"""Guest memory the appliance needs, with a margin (288 MiB booted, 256 MiB did not: the ~90 MB
initramfs is held twice while it is unpacked)."""

MODULES: tuple[str, ...] = (
    "virtio_pci", "virtio_blk", "virtio_scsi", "sd_mod", "ahci", "ata_piix", "ata_generic",
    "vmw_pvscsi", "nvme", "virtio_net",
)
"""Drivers of every disk controller the matrix can ask for, and of the guest's NIC."""
LAST_RESORT: tuple[str, ...] = ("ata_piix", "ata_generic")
"""Loaded only while fewer disks than ``iomatrix.disks`` have appeared: machine pc always has a
PIIX IDE controller, and probing its (usually empty) channels cost ~0.5 s under TCG."""
BUSES: tuple[str, ...] = ("pci", "virtio", "scsi")
"""The buses whose devices the init matches against module aliases, in this order: a PCI
driver (virtio_pci, a SCSI host) creates the devices of the next bus."""

KEEP_APPLIANCES = 3
"""Appliances kept in the cache (~150 MB each); older ones are deleted after a build."""
BUSYBOX_PACKAGE = "busybox-static"
_NO_APT = "install Debian's apt and dpkg (a Debian or Ubuntu host)"


class Appliance(Frozen):
    """A built appliance: boot ``kernel`` with ``initrd`` and :func:`kernel_cmdline`.

    ``kernel`` is an ELF vmlinux booted through its PVH entry (``kernel_format == "pvh"``), or the
    original bzImage (``"bzimage"``) when the kernel has no PVH entry. ``build_seconds`` is the
    time the build took when it was made; ``cached`` says this call found it already built."""


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

    @property
    def size_bytes(self) -> int:
        """Kernel plus initrd, as stored."""
        return self.kernel_bytes + self.initrd_bytes


class GuestDisk(Frozen):
    """The guest's view of one disk, parsed from a :data:`DISK_MARKER` console line."""


    name: str
    size_bytes: int
    queues: int
    scheduler: str
    rotational: bool
    driver: str = ""
    model: str = ""


def kernel_cmdline(extra: str = "", *, port: int | None = None, disks: int | None = None,
                   accel: str = "kvm", trace: bool = False) -> str:
    """The appliance's kernel command line: serial console, fast boot, the init's options
    (``port``: fio's port in the guest; ``disks``: how many disks to wait for before READY;
    ``trace``: print TRACE lines), and for ``accel="tcg"`` what only helps an emulated CPU."""
    parts = [
        "console=ttyS0", "panic=-1", "quiet",
        # ramfs, not tmpfs: tmpfs caps the root at half of RAM, which ~90 MB of initramfs
        # exceeds below ~384 MiB of guest memory (see MIN_MEMORY_MIB).
        "rootfstype=ramfs",
        # SCSI hosts scan their targets before insmod returns: the init then sees every disk.
        "scsi_mod.scan=sync",
        # Boot-time costs measured under TCG (see the module docstring); none changes the I/O
        # path: crypto self-tests, the W+X page-table walk after write-protecting the kernel,
        # and ACPI interrupt-link evaluation per PCI device (virtio, NVMe and AHCI use MSI or
        # MSI-X anyway). pci=noacpi would also skip it, but leaves PIIX IDE's BARs unassigned.
        "cryptomgr.notests", "rodata=off", "acpi=noirq",
    ]
    if accel == "tcg":
        # TCG runs `rep movsb` a byte at a time; without ERMS/FSRM the kernel copies with
        # 8-byte moves, which halves the initramfs unpack. On KVM rep movsb is the fast path.
        parts.append("clearcpuid=erms,fsrm")
    if port is not None:
        parts.append(f"iomatrix.port={port}")
    if disks is not None:
        parts.append(f"iomatrix.disks={disks}")
    if trace:
        parts.append("iomatrix.trace=1")
    if extra:
        parts.append(extra)
    return " ".join(parts)


def parse_disk_lines(console_text: str) -> list[GuestDisk]:
    """Every complete :data:`DISK_MARKER` line of a serial console log, in order."""
    disks = []
    lines = console_text.replace("\r", "").split("\n")[:-1]  # the last one may be unfinished
    for line in lines:
        start = line.find(DISK_MARKER + " ")
        if start < 0:
            continue
        try:
            fields = dict(tok.split("=", 1) for tok in shlex.split(line[start + len(DISK_MARKER):])
                          if "=" in tok)
            disks.append(GuestDisk(
                name=fields["name"], size_bytes=int(fields["size"]),
                queues=int(fields.get("queues") or 0), scheduler=fields.get("scheduler", ""),
                rotational=fields.get("rotational") == "1", driver=fields.get("driver", ""),
                model=fields.get("model", "")))
        except (KeyError, ValueError) as exc:
            raise IomatrixError(f"malformed {DISK_MARKER} line from the guest: {line.strip()!r}"
                                ) from exc
    return disks


def console_error(console_text: str) -> str | None:
    """The message of the first :data:`ERROR_MARKER` line of a console log, or None."""
    for line in console_text.replace("\r", "").splitlines():
        start = line.find(ERROR_MARKER)
        if start >= 0:
            return line[start + len(ERROR_MARKER):].strip()
    return None


def build_appliance(*, cache_dir: Path | None = None, kernel: Path | None = None,
                    force: bool = False, fetch: bool = True) -> Appliance:
    """The appliance for this host's fio and ``kernel`` (default: :func:`find_kernel`), built
    now or found in the cache. ``fetch`` allows ``apt-get download`` of a kernel and busybox."""
    started = time.monotonic()
    cache_dir = cache_dir or default_cache_dir()
    if kernel is None:
        kernel = find_kernel(cache_dir, fetch=fetch, require_modules=True)
    inputs = _gather(Path(kernel), cache_dir, fetch)
    final = cache_dir / "appliance" / inputs.key
    if not force:
        found = _load_manifest(final)
        if found is not None:
            with contextlib.suppress(OSError):
                os.utime(final)  # most recently used: the last to be pruned
            return found
    final.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=final.parent))
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
    interpreter: str
    libraries: dict[str, Path]                    # soname -> host file
    modules: ModuleSet
    init: str
    key: str = ""


def _gather(kernel: Path, cache_dir: Path, fetch: bool) -> _Inputs:
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
    modules = resolve_modules(modules_dir, MODULES)
    fio = Path(require("fio"))
    interpreter, libraries = _library_closure(fio)
    fio_version = run([str(fio), "--version"], timeout=30).stdout.strip()
    busybox = _busybox(cache_dir, fetch)
    init = init_script(modules)
    inputs = _Inputs(kernel=kernel, release=release, busybox=busybox, fio=fio,
                     fio_version=fio_version, interpreter=interpreter, libraries=libraries,
                     modules=modules, init=init)
    digest = hashlib.sha256()
    digest.update(f"iomatrix-appliance {BUILDER_VERSION}\n".encode())
    digest.update(init.encode())
    loader = [("loader", Path(interpreter))] if interpreter else []
    for label, path in [("kernel", kernel), ("busybox", busybox), ("fio", fio), *loader,
                        *((f"lib {s}", p) for s, p in sorted(libraries.items())),
                        *((f"module {n}", p) for n, p in modules.files)]:
        digest.update(f"\n{label}\n".encode())
        digest.update(_file_digest(path))
    inputs.key = digest.hexdigest()[:16]
    return inputs


def _file_digest(path: Path) -> bytes:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.digest()


def kernel_release(kernel: Path) -> str:
    """The release a bzImage announces in its header (``6.1.0-56-amd64``)."""
    with open(kernel, "rb") as f:
        head = f.read(0x10000)
    (offset,) = struct.unpack_from("<H", head, 0x20E)
    if offset:
        raw = head[offset + 0x200: offset + 0x200 + 256].split(b"\0", 1)[0].decode(errors="replace")
        if raw.split():
            return raw.split()[0]
    name = kernel.name
    return name[len("vmlinuz-"):] if name.startswith("vmlinuz-") else name


def _library_closure(binary: Path) -> tuple[str, dict[str, Path]]:
    """The ELF interpreter path of ``binary`` and every shared library it loads (by soname)."""
    interpreter = _elf_interpreter(binary.read_bytes())
    if interpreter is None:
        return "", {}
    out = run([require("ldd", hint="install libc-bin"), str(binary)], timeout=60).stdout
    libraries: dict[str, Path] = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1] == "=>":
            if parts[2] == "not":
                raise EnvironmentProblem(f"{binary} needs {parts[0]}, which is not installed",
                                         hint=f"reinstall the package that provides {binary}")
            libraries[parts[0]] = Path(parts[2])
    return interpreter, libraries


def _busybox(cache_dir: Path, fetch: bool) -> Path:
    """A static busybox from Debian's busybox-static package, unpacked in the cache."""
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
        if not binary.is_file() or _elf_interpreter(binary.read_bytes()) is not None:
            raise EnvironmentProblem(f"{debs[0].name} holds no static bin/busybox")
        target = cache_dir / f"{BUSYBOX_PACKAGE}_{version.replace(':', '_')}"
        try:
            root.rename(target)
        except OSError:
            if not (target / "bin" / "busybox").is_file():
                raise
        return target / "bin" / "busybox"
    finally:
        shutil.rmtree(work, ignore_errors=True)


# --- modules -----------------------------------------------------------------------------------

def _module_name(path: Path) -> str:
    return path.name.split(".ko", 1)[0].replace("-", "_")


@dataclass(frozen=True)
class ModuleSet:
    """Kernel modules to put in the appliance: ``files`` in load order (each after what it
    depends on), each module's direct dependencies, and the modalias patterns of the wanted ones."""

    files: list[tuple[str, Path]]
    depends: dict[str, list[str]]
    aliases: dict[str, list[str]]

    def closure(self, name: str) -> list[str]:
        """``name``'s dependencies, transitively, in load order (``name`` itself excluded)."""
        needed: set[str] = set()
        stack = list(self.depends.get(name, []))
        while stack:
            dep = stack.pop()
            if dep not in needed:
                needed.add(dep)
                stack += self.depends.get(dep, [])
        return [n for n, _ in self.files if n in needed]


def resolve_modules(modules_dir: Path, wanted: Iterable[str]) -> ModuleSet:
    """The modules of ``wanted`` and their dependencies, from each module's ``.modinfo``.
    Built-in modules are left out; a module neither built in nor present raises
    EnvironmentProblem."""
    files = {_module_name(p): p for p in modules_dir.rglob("*.ko*") if ".ko" in p.name}
    builtin_list = modules_dir / "modules.builtin"
    builtin = ({_module_name(Path(line.strip())) for line in builtin_list.read_text().splitlines()
                if line.strip()} if builtin_list.is_file() else set())
    order: list[tuple[str, Path]] = []
    depends: dict[str, list[str]] = {}
    aliases: dict[str, list[str]] = {}

    def visit(name: str, chain: tuple[str, ...]) -> None:
        if name in builtin or name in depends:
            return
        if name in chain:
            raise EnvironmentProblem(f"module dependency cycle: {' -> '.join(chain + (name,))}")
        path = files.get(name)
        if path is None:
            raise EnvironmentProblem(f"kernel module {name} is neither built into the kernel nor "
                                     f"present in {modules_dir}",
                                     hint="use a kernel built with the virtio, SCSI, AHCI and "
                                          "NVMe drivers (Debian's linux-image-amd64 has them)")
        info = modinfo(_module_bytes(path))
        deps = [d.replace("-", "_") for field in info.get("depends", []) for d in field.split(",")
                if d]
        for dep in deps:
            visit(dep, chain + (name,))
        depends[name] = [d for d in deps if d not in builtin]
        aliases[name] = info.get("alias", [])
        order.append((name, path))

    for name in wanted:
        visit(name, ())
    return ModuleSet(files=order, depends=depends,
                     aliases={n: aliases[n] for n in wanted if n in aliases})


def modinfo(module: bytes) -> dict[str, list[str]]:
    """The ``key=value`` fields of a kernel module's ``.modinfo`` section (values per key)."""
    section = _elf_sections(module).get(".modinfo", b"")
    fields: dict[str, list[str]] = {}
    for entry in section.split(b"\0"):
        if b"=" in entry:
            key, value = entry.decode(errors="replace").split("=", 1)
            fields.setdefault(key, []).append(value)
    return fields


def _module_bytes(path: Path) -> bytes:
    """A module file's contents, decompressed (the guest's busybox insmod wants plain ELF)."""
    data = path.read_bytes()
    if path.name.endswith(".xz"):
        return lzma.decompress(data)
    if path.name.endswith(".gz"):
        return gzip.decompress(data)
    if path.name.endswith(".zst"):
        return _decompress_tool("zstd", data)
    return data


def _decompress_tool(tool: str, data: bytes) -> bytes:
    """``data`` decompressed by ``tool -d`` (zstd, lz4): Python's standard library lacks them."""
    binary = require(tool, hint=f"install {tool} (apt-get install {tool})")
    with tempfile.TemporaryDirectory(prefix="iomatrix-unpack-") as tmp:
        src, dst = Path(tmp) / "in", Path(tmp) / "out"
        src.write_bytes(data)
        run([binary, "-d", "-q", "-f", str(src), "-o", str(dst)], timeout=120)
        return dst.read_bytes()


# --- ELF ---------------------------------------------------------------------------------------

_PT_INTERP, _PT_NOTE = 3, 4
_XEN_ELFNOTE_PHYS32_ENTRY = 18


def _elf_check(data: bytes) -> None:
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise EnvironmentProblem("not a 64-bit little-endian ELF file")


def _program_headers(data: bytes) -> Iterator[tuple[int, int, int]]:
    """(type, file offset, file size) of each ELF64 program header."""
    _elf_check(data)
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    for i in range(phnum):
        p_type, _flags, offset, _vaddr, _paddr, filesz = struct.unpack_from(
            "<IIQQQQ", data, phoff + i * phentsize)
        yield p_type, offset, filesz


def _elf_interpreter(data: bytes) -> str | None:
    """The PT_INTERP path of an ELF executable, or None for a static one."""
    for p_type, offset, size in _program_headers(data):
        if p_type == _PT_INTERP:
            return data[offset:offset + size].rstrip(b"\0").decode()
    return None


def _elf_sections(data: bytes) -> dict[str, bytes]:
    """Section name -> contents of an ELF64 relocatable or executable file."""
    _elf_check(data)
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
    _n, _t, _f, _a, str_off, str_size = headers[shstrndx]
    names = data[str_off:str_off + str_size]
    sections = {}
    for name_off, sh_type, _flags, _addr, offset, size in headers:
        name = names[name_off:names.index(b"\0", name_off)].decode()
        sections[name] = b"" if sh_type == 8 else data[offset:offset + size]  # 8: SHT_NOBITS
    return sections


def has_pvh_entry(elf: bytes) -> bool:
    """Whether an ELF vmlinux has the Xen PVH entry note that QEMU's ``-kernel`` boots."""
    for p_type, offset, size in _program_headers(elf):
        if p_type != _PT_NOTE:
            continue
        pos, end = offset, offset + size
        while pos + 12 <= end:
            namesz, descsz, n_type = struct.unpack_from("<III", elf, pos)
            name = elf[pos + 12:pos + 12 + namesz].rstrip(b"\0")
            if name == b"Xen" and n_type == _XEN_ELFNOTE_PHYS32_ENTRY:
                return True
            pos += 12 + (namesz + 3) // 4 * 4 + (descsz + 3) // 4 * 4
    return False


def extract_vmlinux(bzimage: bytes) -> bytes | None:
    """The ELF vmlinux inside a bzImage (boot protocol >= 2.08), or None when its compression is
    one this host cannot undo."""
    setup_sects = bzimage[0x1F1] or 4
    payload_offset, payload_length = struct.unpack_from("<II", bzimage, 0x248)
    start = (setup_sects + 1) * 512 + payload_offset
    payload = bzimage[start:start + payload_length]
    try:
        if payload.startswith(b"\x1f\x8b"):
            out = zlib.decompressobj(wbits=31).decompress(payload)
        elif payload.startswith(b"\xfd7zXZ\x00"):
            out = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(payload)
        elif payload.startswith(b"\x5d\x00"):
            out = lzma.LZMADecompressor(format=lzma.FORMAT_ALONE).decompress(payload)
        elif payload.startswith(b"BZh"):
            out = bz2.BZ2Decompressor().decompress(payload)
        elif payload.startswith(b"\x28\xb5\x2f\xfd") and which("zstd"):
            out = _decompress_tool("zstd", payload[:-4])  # the last 4 bytes are the size
        elif payload.startswith(b"\x02\x21\x4c\x18") and which("lz4"):
            out = _decompress_tool("lz4", payload[:-4])
        else:
            return None
    except (zlib.error, lzma.LZMAError, OSError, ToolFailed):
        return None
    return out if out.startswith(b"\x7fELF") else None


# --- the initramfs -----------------------------------------------------------------------------

def init_script(modules: ModuleSet) -> str:
    """The appliance's /init: a busybox sh script (see the module docstring)."""
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
    return _INIT.format(
        ready=READY_MARKER, disk=DISK_MARKER, error=ERROR_MARKER, trace=TRACE_MARKER,
        port=GUEST_FIO_PORT, ip=GUEST_IP, deps="\n".join(deps), buses=" ".join(BUSES),
        version=BUILDER_VERSION,
        match_first="\n".join(matchers[False]) or "    :",
        match_last="\n".join(matchers[True]) or "    :")


_INIT = r"""#!/bin/sh
# iomatrix appliance init (builder version {version}); generated by iomatrix/appliance/build.py
export PATH=/bin LD_LIBRARY_PATH=/lib/fio
fail() {{ echo "{error} $*"; poweroff -f; sleep 60; }}
mount -t proc proc /proc && mount -t sysfs sys /sys && mount -t devtmpfs dev /dev \
    || fail "cannot mount /proc, /sys or /dev"
read -r started _ < /proc/uptime
port={port}; disks=0; trace=0
read -r cmdline < /proc/cmdline
for arg in $cmdline; do
    case "$arg" in
        iomatrix.port=*) port="${{arg#*=}}" ;;
        iomatrix.disks=*) disks="${{arg#*=}}" ;;
        iomatrix.trace=*) trace="${{arg#*=}}" ;;
    esac
done
stage() {{ [ "$trace" = 1 ] && read -r up _ < /proc/uptime && echo "{trace} $up $*"; }}
stage init
# fio maps its ~80 MB of libraries while the drivers probe.
fio --server=ip:0.0.0.0,"$port" > /dev/console 2>&1 &
fio=$!
# Each module's dependencies in load order (from .modinfo depends=).
{deps}
load() {{
    eval "mods=\"\$deps_$1 $1\""
    for m in $mods; do
        [ -d "/sys/module/$m" ] && continue
        stage "insmod $m"
        insmod "/lib/modules/$m.ko" || fail "insmod $m failed"
    done
}}
match_first() {{
{match_first}
}}
match_last() {{
{match_last}
}}
probe() {{ # $1: match_first or match_last, tried on every device of every bus, in bus order
    for bus in {buses}; do
        for a in /sys/bus/$bus/devices/*/modalias; do
            [ -r "$a" ] && read -r alias < "$a" && $1 "$alias"
        done
    done
}}
blockdevs() {{
    for d in /sys/block/*; do
        case "${{d##*/}}" in ram*|loop*|'*') ;; *) echo "${{d##*/}}" ;; esac
    done
}}
probe match_first
# Legacy IDE (always present on machine pc, mostly empty) only when disks are still missing.
if [ "$disks" -eq 0 ] || [ "$(blockdevs | wc -l)" -lt "$disks" ]; then
    probe match_last
    probe match_first
fi
stage modules
n=0
while [ "$(blockdevs | wc -l)" -lt "$disks" ]; do
    n=$((n + 1)); [ "$n" -gt 600 ] && fail "found $(blockdevs | wc -l) disks, expected $disks"
    usleep 50000
    probe match_first  # a controller that finds its disks late (NVMe, libata) gets sd_mod now
done
for name in $(blockdevs); do
    q=/sys/block/$name/queue
    queues=$(ls -d /sys/block/$name/mq/* 2>/dev/null | wc -l)
    sched=$(sed -n 's/.*\[\(.*\)\].*/\1/p' $q/scheduler); [ -n "$sched" ] || sched=none
    read -r rotational < $q/rotational
    read -r sectors < /sys/block/$name/size
    dev=/sys/block/$name/device; driver=; model=
    for p in $dev $dev/device $dev/device/device; do
        [ -z "$driver" ] && [ -e $p/driver ] && driver=$(basename $(readlink $p/driver))
        [ -z "$model" ] && [ -r $p/model ] && model=$(tr -d '"' < $p/model | sed 's/ *$//')
    done
    echo "{disk} name=$name size=$((sectors * 512)) queues=$queues scheduler=$sched" \
         "rotational=$rotational driver=$driver model=\"$model\""
done
stage disks
nic=
for n in /sys/class/net/*; do
    case "${{n##*/}}" in lo) ;; *) nic=${{n##*/}}; break ;; esac
done
[ -n "$nic" ] || fail "no network interface (is a virtio-net-pci device attached?)"
ip link set lo up && ip addr add {ip}/24 dev "$nic" && ip link set "$nic" up \
    && ip route add default via 10.0.2.2 || fail "cannot configure $nic"
stage network
hexport=$(printf '%04X' "$port")
n=0
until grep -q ":$hexport 00000000:0000 0A" /proc/net/tcp; do
    kill -0 $fio 2>/dev/null || fail "fio --server exited"
    n=$((n + 1)); [ "$n" -gt 1500 ] && fail "fio --server does not listen on port $port"
    usleep 20000
done
read -r up _ < /proc/uptime
echo "{ready} uptime=$up init=$started port=$port nic=$nic"
wait $fio
fail "fio --server exited"
"""


class _Cpio:
    """Writes a newc (SVR4, no CRC) cpio archive, the format the kernel unpacks an initramfs
    from, to a binary file."""

    def __init__(self, out: BinaryIO) -> None:
        self.out = out
        self.ino = 1
        self.names: set[str] = set()

    def _entry(self, name: str, mode: int, data: bytes = b"", rdev: tuple[int, int] = (0, 0),
               nlink: int = 1) -> None:
        encoded = name.encode() + b"\0"
        header = "070701" + "".join(f"{v:08X}" for v in (
            self.ino, mode, 0, 0, nlink, 0, len(data), 0, 0, rdev[0], rdev[1], len(encoded), 0))
        self.ino += 1
        self.names.add(name)
        for chunk in (header.encode(), encoded, b"\0" * (-(110 + len(encoded)) % 4), data,
                      b"\0" * (-len(data) % 4)):
            self.out.write(chunk)

    def directory(self, name: str) -> None:
        parts = name.split("/")
        for i in range(1, len(parts) + 1):
            sub = "/".join(parts[:i])
            if sub not in self.names:
                self._entry(sub, stat.S_IFDIR | 0o755, nlink=2)

    def file(self, name: str, data: bytes, mode: int = 0o644) -> None:
        if "/" in name:
            self.directory(name.rsplit("/", 1)[0])
        self._entry(name, stat.S_IFREG | mode, data)

    def symlink(self, name: str, target: str) -> None:
        self._entry(name, stat.S_IFLNK | 0o777, target.encode())

    def device(self, name: str, major: int, minor: int) -> None:
        self._entry(name, stat.S_IFCHR | 0o600, rdev=(major, minor))

    def finish(self) -> None:
        self._entry("TRAILER!!!", 0)


def _write_initramfs(inputs: _Inputs, path: Path) -> None:
    with open(path, "wb") as out:
        cpio = _Cpio(out)
        for d in ("bin", "dev", "proc", "sys", "tmp", "lib/modules", "lib/fio"):
            cpio.directory(d)
        cpio.device("dev/console", 5, 1)
        cpio.device("dev/null", 1, 3)
        cpio.file("bin/busybox", inputs.busybox.read_bytes(), 0o755)
        for applet in run([str(inputs.busybox), "--list"], timeout=30).stdout.split():
            if applet != "busybox":
                cpio.symlink(f"bin/{applet}", "busybox")
        cpio.file("bin/fio", inputs.fio.read_bytes(), 0o755)
        for soname, lib in sorted(inputs.libraries.items()):
            cpio.file(f"lib/fio/{soname}", lib.read_bytes(), 0o755)
        if inputs.interpreter:
            cpio.file(inputs.interpreter.lstrip("/"), Path(inputs.interpreter).read_bytes(),
                      0o755)
        for name, module in inputs.modules.files:
            cpio.file(f"lib/modules/{name}.ko", _module_bytes(module))
        cpio.file("init", inputs.init.encode(), 0o755)
        cpio.finish()


def _build(inputs: _Inputs, work: Path, final: Path, started: float) -> Appliance:
    bzimage = inputs.kernel.read_bytes()
    vmlinux = extract_vmlinux(bzimage)
    if vmlinux is not None and has_pvh_entry(vmlinux):
        kernel_name, kernel_format, kernel_data = "vmlinux", "pvh", vmlinux
    else:
        kernel_name, kernel_format, kernel_data = "vmlinuz", "bzimage", bzimage
    (work / kernel_name).write_bytes(kernel_data)
    _write_initramfs(inputs, work / "initrd")
    appliance = Appliance(
        kernel=final / kernel_name, initrd=final / "initrd", key=inputs.key,
        kernel_release=inputs.release, fio_version=inputs.fio_version,
        kernel_bytes=len(kernel_data), initrd_bytes=(work / "initrd").stat().st_size,
        build_seconds=round(time.monotonic() - started, 2), cached=False,
        kernel_format=kernel_format, modules=tuple(n for n, _ in inputs.modules.files))
    manifest = appliance.model_dump(mode="json", exclude={"cached"})
    manifest["source_kernel"] = str(inputs.kernel)
    (work / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return appliance


def _load_manifest(directory: Path) -> Appliance | None:
    """The appliance built in ``directory``, or None when there is none (or it is damaged)."""
    with contextlib.suppress(OSError, ValueError, TypeError):
        fields = json.loads((directory / "manifest.json").read_text())
        fields.pop("source_kernel", None)
        fields["kernel"] = directory / Path(fields["kernel"]).name
        fields["initrd"] = directory / Path(fields["initrd"]).name
        found = Appliance(**fields, cached=True)
        if (found.kernel.stat().st_size == found.kernel_bytes
                and found.initrd.stat().st_size == found.initrd_bytes):
            return found
    return None
