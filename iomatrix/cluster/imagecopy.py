"""The user's own guest image ([guest] image) carried to a node under cluster load: the controller
sends the image it opened and checked (``send_image``, its data only: a sparse raw image's holes
are not sent) after the guest request on the node session's standard input, and the node writes
it into a new file of that session's own 0700 directory (``receive_image``), which goes with the
session. The node boots its guests on that copy through an overlay each, as a local run boots
the image, so the user's image is only ever read, on the controller.

What the node is sent is untrusted input: it is written only where the node chose (one new file,
``O_EXCL``, never a path the stream names), each extent within the size the request declared, and
the copy is then inspected as a local run inspects the user's image
(``iomatrix.appliance.ownimage.ImageFile``: raw or qcow2, neither a backing file nor an external
data file; QEMU opens it read-only, with no backing). A name in its header is never followed.

The stream: extents, each a 16-byte header (offset, length: big-endian unsigned 64-bit) and
``length`` bytes, then a header whose length is 0 and whose offset is the size."""

from __future__ import annotations

import errno
import os
import shutil
import struct
from pathlib import Path
from typing import BinaryIO

from iomatrix.core.errors import NodesError

HEADER = struct.Struct(">QQ")
CHUNK = 4 << 20
"""The longest extent sent (and accepted)."""
MARGIN = 64 << 20
"""Room the node keeps free beside the copy (its guests' overlays are checked later)."""


def data_extents(fd: int, size: int) -> list[tuple[int, int]]:
    """The (offset, length) of ``fd``'s data up to ``size``, holes left out (a filesystem that
    cannot tell says the whole file is data)."""
    extents: list[tuple[int, int]] = []
    offset = 0
    while offset < size:
        try:
            start = os.lseek(fd, offset, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:          # nothing but a hole after ``offset``
                break
            raise
        if start >= size:
            break
        end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
        extents.append((start, end - start))
        offset = end
    return extents


def send_image(fd: int, size: int, out: BinaryIO) -> None:
    """Write the first ``size`` bytes of the file open as ``fd`` to ``out`` as the stream above
    (OSError when ``out`` is closed: the node's session ended)."""
    for start, length in data_extents(fd, size):
        for offset in range(start, start + length, CHUNK):
            piece = os.pread(fd, min(CHUNK, start + length - offset), offset)
            if not piece:
                raise OSError(f"the image ends at {offset} bytes, not {size}")
            out.write(HEADER.pack(offset, len(piece)))
            out.write(piece)
    out.write(HEADER.pack(size, 0))
    out.flush()


def receive_image(fd: int, path: Path, size: int) -> None:
    """Write the stream read from ``fd`` into the new file ``path`` (made here, 0600, sparse,
    ``size`` bytes); NodesError when there is no room for it, or the stream ends early or names
    bytes beyond ``size``."""
    free = shutil.disk_usage(path.parent).free
    if free < size + MARGIN:
        raise NodesError(f"no room for the guest image here: {size} bytes, {free} free in "
                         f"{path.parent}")
    out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                  0o600)
    try:
        os.ftruncate(out, size)
        while True:
            offset, length = HEADER.unpack(_exactly(fd, HEADER.size))
            if length == 0:
                if offset != size:
                    raise NodesError(f"the guest image ended at {offset} bytes, not {size}")
                return
            if length > CHUNK or offset + length > size:
                raise NodesError(f"the guest image stream names {length} bytes at {offset}, "
                                 f"beyond its {size} bytes")
            data = _exactly(fd, length)
            os.pwrite(out, data, offset)
    finally:
        os.close(out)


def _exactly(fd: int, count: int) -> bytes:
    """``count`` bytes of ``fd``; NodesError when it ends first (the controller is gone)."""
    got = bytearray()
    while len(got) < count:
        chunk = os.read(fd, count - len(got))
        if not chunk:
            raise NodesError("the guest image was cut short (the controller's session ended)")
        got += chunk
    return bytes(got)
