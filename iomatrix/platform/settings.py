"""What a platform module reads and returns: a disk's settings (``DiskSettings``, declared
with the axes in ``iomatrix.vocab.axes``; ``suite.configuration.Configuration`` is one), its
defaults, images, graphs and the text a user pastes."""

from __future__ import annotations


from iomatrix.core.model import Frozen
from iomatrix.core.wire import BlockdevOptions
from iomatrix.vocab.axes import DiskSettings


class PlatformDefault(Frozen):
    """A platform's default for one parameter: the level it amounts to (as a run spells it), or
    None when the platform has none (the user's XML or command line must name it), and the words
    to show."""

    level: str | None
    shown: str
    note: str = ""


def default(level: str | None, shown: str | None = None, note: str = "") -> PlatformDefault:
    return PlatformDefault(level=level, shown=shown or (level or "none"), note=note)


class NetworkNode(Frozen):
    """A volume on network storage as a disk's graph opens it: the protocol driver (rbd,
    iscsi) and its node's options, the ``-drive file=`` string (PVE 8), the ``--object``
    values it needs, and ``name``, what people are shown (``pool/image``)."""

    protocol: str
    name: str
    node: BlockdevOptions
    drive_file: str
    objects: tuple[str, ...] = ()


class DiskImage(Frozen):
    """The image a disk's graph opens: its path, whether it is a block device, the size a raw
    format node is limited to (a block device's test area; None: the whole image), and, for a
    volume on network storage, how its protocol driver reaches it (``path`` is then a name)."""

    path: str
    is_device: bool = False
    size: int | None = None
    offset: int = 0
    """Where a raw format node's region of the device starts (QEMU raw's ``offset``; 0: the
    start), ``size`` bytes long."""
    network: NetworkNode | None = None
    backing: tuple[str, ...] = ()
    """A qcow2 image's backing chain, nearest first (each a qcow2 on a device or file like
    ``path``: Proxmox VE 9's snapshots as a volume chain on LVM), which the graph opens as
    nodes of its own (``backing_node``), never by the names the images' headers hold."""


def backing_node(depth: int) -> tuple[str, str]:
    """The (format, protocol) node names of the ``depth``-th backing image of a disk's graph
    (1: the top image's backing), as iomatrix names them and reads them back by role."""
    return f"backing{depth}", f"backing{depth}-file"


class StorageGraph(Frozen):
    """One disk's block graph as a qemu-storage-daemon holds it (blocklayer mode):
    ``--object`` and ``--blockdev`` values (JSON) and the node its export sits on."""

    objects: tuple[str, ...] = ()
    blockdevs: tuple[str, ...]
    export_node: str


class GraphShape(Frozen):
    """What QEMU must report of a platform's graph for one disk, beyond the cache flags every
    node carries: whether a format node sits over the protocol node, each node's detect-zeroes
    by role (``protocol``, ``format``, ``throttle``; a role left out is off), whether a throttle
    filter is the top, the guest device's write-cache when not the cache mode's (None), and the
    guest's iothread id when not iomatrix's own (None)."""

    format_node: bool = True
    detect_zeroes: dict[str, str] = {}
    throttle: bool = False
    device_write_cache: str | None = None
    iothread: str | None = None


class Pasted(Frozen):
    """What a user pastes for a disk's settings on a platform (``text``), its parts for
    programs, and notes on what was left out."""

    text: str
    notes: tuple[str, ...] = ()
    fragments: tuple[tuple[str, str], ...] = ()
    """libvirt: (where it goes, one XML element) pairs."""
    argv: tuple[str, ...] = ()
    """QEMU: the disk's arguments, unquoted; Proxmox: the ``qm set`` argv."""


def image_notes(settings: DiskSettings, where: str) -> list[str]:
    """The note that preallocation is chosen when the image is made (``where``), not pasted."""
    prealloc = settings.preallocation or "off"
    if prealloc == "off":
        return []
    return [f"preallocation={prealloc} is chosen when the image is created ({where}), e.g. "
            f"qemu-img create -f {settings.format or 'raw'} -o preallocation={prealloc} IMAGE SIZE"]


def disk_kind(settings: DiskSettings) -> str:
    """The disk's kind: its controller, or vhost-user-blk for that data path."""
    return "vhost-user-blk" if settings.data_path == "vhost-user-blk" else str(settings.controller)
