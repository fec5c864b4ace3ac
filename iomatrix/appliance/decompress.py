"""Decompressing with an external tool, for the formats Python's standard library lacks."""

from __future__ import annotations

from pathlib import Path

from iomatrix.core.dirs import private_tempdir
from iomatrix.core.proc import require, run


def decompress_tool(tool: str, data: bytes) -> bytes:
    """``data`` decompressed by ``tool -d`` (zstd, lz4): Python's standard library lacks them."""
    binary = require(tool, hint=f"install {tool} (apt-get install {tool})")
    with private_tempdir("iomatrix-unpack-") as tmp:
        src, dst = Path(tmp) / "in", Path(tmp) / "out"
        src.write_bytes(data)
        run([binary, "-d", "-q", "-f", str(src), "-o", str(dst)], timeout=120)
        return dst.read_bytes()
