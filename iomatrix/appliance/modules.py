"""Kernel modules for the appliance: the wanted ones and their dependency closure, in load order.

Dependencies come from each module's ``.modinfo`` section (``depends=``, the field modpost writes
and depmod and modinfo read), so neither depmod nor a ``modules.dep`` is needed (Debian's kernel
package ships none, and kmod is not installed everywhere). Built-in modules (``modules.builtin``)
are skipped; compressed modules are read decompressed (:func:`module_bytes`)."""

from __future__ import annotations

import gzip
import lzma
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from iomatrix.appliance.decompress import decompress_tool
from iomatrix.appliance.elf import elf_sections
from iomatrix.core.errors import EnvironmentProblem


def module_name(path: Path) -> str:
    """A module's name from its file name (``virtio-blk.ko.xz`` -> ``virtio_blk``)."""
    return path.name.split(".ko", 1)[0].replace("-", "_")


@dataclass(frozen=True)
class ModuleSet:
    """Kernel modules to put in the appliance: ``files`` in load order (each after what it
    depends on), each module's direct dependencies, and the modalias patterns of the wanted ones.
    ``builtin``: the wanted modules and dependencies built into the kernel (``modules.builtin``:
    Debian 13's 6.12 has virtio, virtio_ring and virtio_pci built in, Debian 12's 6.1 none), which
    the kernel binds by itself and the appliance neither carries nor loads."""

    files: list[tuple[str, Path]]
    depends: dict[str, list[str]]
    aliases: dict[str, list[str]]
    builtin: tuple[str, ...] = ()

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


def builtin_modules(modules_dir: Path) -> set[str]:
    """The names listed in ``modules.builtin`` (none when there is no such file)."""
    builtin_list = modules_dir / "modules.builtin"
    if not builtin_list.is_file():
        return set()
    return {module_name(Path(line.strip())) for line in builtin_list.read_text().splitlines()
            if line.strip()}


def resolve_modules(modules_dir: Path, wanted: Iterable[str]) -> ModuleSet:
    """The modules of ``wanted`` and their dependencies, from each module's ``.modinfo``.
    Built-in modules are left out; a module neither built in nor present raises
    EnvironmentProblem."""
    files = {module_name(p): p for p in modules_dir.rglob("*.ko*") if ".ko" in p.name}
    builtin = builtin_modules(modules_dir)
    order: list[tuple[str, Path]] = []
    depends: dict[str, list[str]] = {}
    aliases: dict[str, list[str]] = {}
    found_builtin: set[str] = set()

    def visit(name: str, chain: tuple[str, ...]) -> None:
        if name in builtin:
            found_builtin.add(name)
            return
        if name in depends:
            return
        if name in chain:
            raise EnvironmentProblem(f"module dependency cycle: {' -> '.join(chain + (name,))}")
        path = files.get(name)
        if path is None:
            raise EnvironmentProblem(f"kernel module {name} is neither built into the kernel nor "
                                     f"present in {modules_dir}",
                                     hint="use a kernel built with the virtio, SCSI, AHCI and "
                                          "NVMe drivers (Debian's linux-image-amd64 has them)")
        info = modinfo(module_bytes(path))
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
                     aliases={n: aliases[n] for n in wanted if n in aliases},
                     builtin=tuple(sorted(found_builtin)))


def modinfo(module: bytes) -> dict[str, list[str]]:
    """The ``key=value`` fields of a kernel module's ``.modinfo`` section (values per key)."""
    section = elf_sections(module).get(".modinfo", b"")
    fields: dict[str, list[str]] = {}
    for entry in section.split(b"\0"):
        if b"=" in entry:
            key, value = entry.decode(errors="replace").split("=", 1)
            fields.setdefault(key, []).append(value)
    return fields


def module_bytes(path: Path) -> bytes:
    """A module file's contents, decompressed (the guest's busybox insmod wants plain ELF)."""
    data = path.read_bytes()
    if path.name.endswith(".xz"):
        return lzma.decompress(data)
    if path.name.endswith(".gz"):
        return gzip.decompress(data)
    if path.name.endswith(".zst"):
        return decompress_tool("zstd", data)
    return data
