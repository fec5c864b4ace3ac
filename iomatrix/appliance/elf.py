"""Reading 64-bit little-endian ELF files: program headers, the interpreter (``PT_INTERP``),
sections by name, the Xen PVH entry note of a vmlinux, and cutting the zeros that end one."""

from __future__ import annotations

import struct
from collections.abc import Iterator

from iomatrix.core.errors import EnvironmentProblem

_PT_LOAD, _PT_INTERP, _PT_NOTE = 1, 3, 4
_SHT_NOBITS = 8
_XEN_ELFNOTE_PHYS32_ENTRY = 18


def _elf_check(data: bytes) -> None:
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise EnvironmentProblem("not a 64-bit little-endian ELF file")


def program_headers(data: bytes) -> Iterator[tuple[int, int, int]]:
    """(type, file offset, file size) of each ELF64 program header."""
    _elf_check(data)
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    for i in range(phnum):
        p_type, _flags, offset, _vaddr, _paddr, filesz = struct.unpack_from(
            "<IIQQQQ", data, phoff + i * phentsize)
        yield p_type, offset, filesz


def elf_interpreter(data: bytes) -> str | None:
    """The PT_INTERP path of an ELF executable, or None for a static one."""
    for p_type, offset, size in program_headers(data):
        if p_type == _PT_INTERP:
            return data[offset:offset + size].rstrip(b"\0").decode()
    return None


def elf_sections(data: bytes) -> dict[str, bytes]:
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
        sections[name] = b"" if sh_type == _SHT_NOBITS else data[offset:offset + size]
    return sections


def has_pvh_entry(elf: bytes) -> bool:
    """Whether an ELF vmlinux has the Xen PVH entry note that QEMU's ``-kernel`` boots."""
    for p_type, offset, size in program_headers(elf):
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


def drop_zero_tail(data: bytes, page: int = 4096) -> bytes:
    """``data`` (an ELF64 executable) without the zero bytes that end its last ``PT_LOAD``
    segment, when that segment is the last thing in the file that is loaded: its file size
    shrinks (its memory size stays, and loaders zero-fill the difference) and the section headers
    after it go (no loader reads them). A vmlinux stores its .bss and .brk as 23 MB of zeros
    because a PROGBITS section (``.init.scratch``) follows them; QEMU's ELF loader fills them
    anyway. ``data`` unchanged when nothing is to be gained."""
    _elf_check(data)
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    headers = [list(struct.unpack_from("<IIQQQQQQ", data, phoff + i * phentsize))
               for i in range(phnum)]   # type, flags, offset, vaddr, paddr, filesz, memsz, align
    if not headers:
        return data
    last = max(headers, key=lambda h: h[2] + h[5])
    if last[0] != _PT_LOAD or last[5] == 0:
        return data
    start, end = last[2], last[2] + last[5]
    used = len(data[start:end].rstrip(b"\0"))
    used = min(last[5], (used + page - 1) // page * page)
    if end - (start + used) < page or phoff + phnum * phentsize > start + used:
        return data
    out = bytearray(data[:start + used])
    last[5] = used
    for i, h in enumerate(headers):
        struct.pack_into("<IIQQQQQQ", out, phoff + i * phentsize, *h)
    struct.pack_into("<Q", out, 0x28, 0)          # e_shoff
    struct.pack_into("<HHH", out, 0x3A, 0, 0, 0)  # e_shentsize, e_shnum, e_shstrndx
    return bytes(out)
