"""Reading an x86 bzImage: the release its header announces, and the ELF vmlinux inside it."""

from __future__ import annotations

import bz2
import lzma
import struct
import zlib
from pathlib import Path

from iomatrix.appliance.decompress import decompress_tool
from iomatrix.core.errors import ToolFailed
from iomatrix.core.proc import which


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
            out = decompress_tool("zstd", payload[:-4])  # the last 4 bytes are the size
        elif payload.startswith(b"\x02\x21\x4c\x18") and which("lz4"):
            out = decompress_tool("lz4", payload[:-4])
        else:
            return None
    except (zlib.error, lzma.LZMAError, OSError, ToolFailed):
        return None
    return out if out.startswith(b"\x7fELF") else None
