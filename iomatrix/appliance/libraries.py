"""The shared libraries a dynamically linked binary loads, as ``ldd`` resolves them on this host,
and the hollowing of a data-only library fio never reads (:func:`hollow_data_library`)."""

from __future__ import annotations

import struct
from pathlib import Path

from iomatrix.appliance.elf import elf_interpreter
from iomatrix.core.errors import EnvironmentProblem
from iomatrix.core.proc import require, run


def library_closure(binary: Path) -> tuple[str, dict[str, Path]]:
    """The ELF interpreter path of ``binary`` and every shared library it loads (by soname);
    ``("", {})`` for a static binary."""
    interpreter = elf_interpreter(binary.read_bytes())
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


HOLLOW_KEEP = 4096
"""Bytes kept (zeroed) of a hollowed data segment: one page, so the symbol still has storage."""
_PT_LOAD, _PF_X, _PF_W = 1, 1, 2


def hollowable(soname: str) -> bool:
    """ICU's data library (``libicudata.so.NN``): one exported object, ``icudtNN_dat``, the
    largest file of fio's closure on Debian (31 MB of 84 MB), pulled in through libxml2 for
    gluster and never read by fio (ICU opens its data only when an ICU service is called)."""
    return soname.startswith("libicudata.so")


def hollow_data_library(data: bytes) -> bytes | None:
    """``data`` (an ELF64 shared object) with its largest read-only, non-executable ``PT_LOAD``
    segment cut to :data:`HOLLOW_KEEP` zero bytes, the segments after it moved down in the file
    (their addresses are unchanged, so relocations and the dynamic section stay valid) and the
    section headers dropped (the loader reads none). Whatever read the cut data would find a
    zeroed header (ICU: invalid data, an error, not a crash) and then unmapped memory. None when
    the layout is not the expected one (then the library is copied as it is)."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return None
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    headers = [list(struct.unpack_from("<IIQQQQQQ", data, phoff + i * phentsize))
               for i in range(phnum)]   # type, flags, offset, vaddr, paddr, filesz, memsz, align
    loads = [h for h in headers if h[0] == _PT_LOAD]
    if not loads:
        return None
    big = max(loads, key=lambda h: h[5])
    after = [h for h in loads if h[2] > big[2]]
    if (big[1] & (_PF_X | _PF_W) or big[5] < 16 * HOLLOW_KEEP or big[5] != big[6]
            or big[2] + big[5] > len(data) or phoff + phnum * phentsize > big[2]
            or any(h[2] < big[2] + big[5] and h[2] + h[5] > big[2] and h is not big
                   and h[5] for h in headers)):
        return None  # another segment (dynamic, note, relro) overlaps the data: leave it
    start = big[2] + HOLLOW_KEEP
    rest = min((h[2] for h in after), default=len(data))
    if rest < big[2] + big[5]:
        return None
    align = max([h[7] for h in after] + [1])
    shift = (rest - start) // align * align   # keeps offset == vaddr (mod align)
    if shift <= 0:
        return None
    end = max((h[2] + h[5] for h in after), default=rest)
    if any(h[5] and h[2] >= rest and h[2] + h[5] > end for h in headers):
        return None  # a segment past the last load (kept data we would cut): leave it
    out = bytearray(data[:big[2]]) + bytes(HOLLOW_KEEP)
    out += bytes(rest - shift - len(out)) + data[rest:end]
    big[5] = big[6] = HOLLOW_KEEP
    for h in headers:
        if h is not big and h[2] >= rest and h[5]:
            h[2] -= shift
    for i, h in enumerate(headers):
        struct.pack_into("<IIQQQQQQ", out, phoff + i * phentsize, *h)
    struct.pack_into("<Q", out, 0x28, 0)          # e_shoff
    struct.pack_into("<HHH", out, 0x3a, 0, 0, 0)  # e_shentsize, e_shnum, e_shstrndx
    return bytes(out)
