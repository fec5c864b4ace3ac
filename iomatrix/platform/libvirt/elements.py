"""What a ``<disk>`` element holds beyond its bus and driver (pure; conf/domain_conf.c,
conf/storage_source_conf.c): its backing chain, slice, data store and qcow2 metadata cache; the
node numbers and boot indexes libvirt gives every disk of a domain; and, walked generically,
every attribute and child of ``<disk>``, ``<driver>``, ``<source>``, ``<target>`` and a
``<controller>`` that is not rendered, so a setting iomatrix does not know is named, never
dropped."""

from __future__ import annotations

from xml.etree import ElementTree as ET

from iomatrix.core.model import Frozen


class Image(Frozen):
    """One image of a backing chain or a qcow2 data store: ``<backingStore type=>`` or
    ``<dataStore type=>`` with its ``<format type=>`` and ``<source file=|dev=>``."""

    kind: str
    path: str
    format: str = "raw"


class Slot(Frozen):
    """Any ``<disk>`` of a domain, rendered by iomatrix or not (network, floppy, USB, volume,
    NVMe): libvirt numbers and boots them all."""

    bus: str
    dev: str
    device: str
    """disk, cdrom, floppy or lun."""
    images: int
    """The node numbers it takes: 1, plus one per image of a ``<backingStore>`` chain."""
    boot: int | None = None
    """``<boot order=>``."""
    data_store: bool = False
    """A ``<source><dataStore>``, which libvirt numbers too where it reads it."""


DISK_KNOWN = ({"type", "device"},
              {"driver", "source", "target", "readonly", "serial", "boot", "address",
               "backingStore", "shareable", "wwn", "vendor", "product", "blockio"})
BLOCKIO = ("logical_block_size", "physical_block_size", "discard_granularity")
"""``<blockio>`` attributes rendered (``discard_granularity`` by version:
:attr:`.versions.Versions.discard_granularity`)."""
DRIVER_KNOWN_CHILDREN = {"iothreads", "metadata_cache"}
SOURCE_KNOWN_CHILDREN = {"slices", "dataStore"}
TARGET_KNOWN = {"dev", "bus", "rotation_rate", "removable"}
CONTROLLER_KNOWN = ({"type", "index", "model"}, {"driver", "address"})
CDROM_NAMES = ("/dev/sr", "/dev/scd", "/dev/cdrom", "/dev/dvd", "/dev/cdrw", "/dev/dvdrw")
"""Host paths taken for a CD-ROM drive by their name (:func:`host_cdrom`)."""
_UNITS = {"": 1, "b": 1, "bytes": 1, "k": 1024, "kib": 1024, "kb": 1000, "m": 1 << 20,
          "mib": 1 << 20, "mb": 10 ** 6, "g": 1 << 30, "gib": 1 << 30, "gb": 10 ** 9,
          "t": 1 << 40, "tib": 1 << 40, "tb": 10 ** 12}
"""virScaleInteger's units."""


def unmodelled(element: ET.Element, known: set[str], children: set[str],
               name: str | None = None) -> list[str]:
    """Each attribute of ``element`` not in ``known`` and each child not in ``children``, as
    ``<target tray='open'>`` / ``<disk><iotune>`` (the ``name`` it is shown under)."""
    tag = name or str(element.tag)
    out = [f"<{tag} {k}='{v}'>" for k, v in element.attrib.items() if k not in known]
    return out + [f"<{tag}><{c.tag}>" for c in element if c.tag not in children]


def disk_unmodelled(element: ET.Element, kind: str, driver_attrs: tuple[str, ...]) -> list[str]:
    """What iomatrix does not render of a modelled ``<disk>`` (file or block)."""
    out = unmodelled(element, *DISK_KNOWN, "disk")
    driver = element.find("driver")
    if driver is not None:
        out += unmodelled(driver, set(driver_attrs), DRIVER_KNOWN_CHILDREN)
        cache = driver.find("metadata_cache")
        if cache is not None:
            out += unmodelled(cache, set(), {"max_size"}, "driver><metadata_cache")
    source = element.find("source")
    if source is not None:
        out += unmodelled(source, {"file" if kind == "file" else "dev"}, SOURCE_KNOWN_CHILDREN)
        slices = source.find("slices")
        for piece in slices if slices is not None else ():
            if piece.tag != "slice" or piece.get("type") != "storage":
                out.append(f"<source><slices><{piece.tag} type='{piece.get('type')}'>")
    target = element.find("target")
    if target is not None:
        out += unmodelled(target, TARGET_KNOWN, set())
    blockio = element.find("blockio")
    if blockio is not None:
        out += unmodelled(blockio, set(BLOCKIO), set(), "disk><blockio")
    return out


def device_props(element: ET.Element) -> tuple[tuple[str, str | int | bool], ...]:
    """The device keys of ``<shareable/>`` (``share-rw``), ``<blockio>``, ``<wwn>`` (a number),
    ``<vendor>`` and ``<product>``, in qemuBuildDiskDeviceProps' order (libvirt refuses them
    on a bus that takes none: :mod:`.validate`)."""
    out: list[tuple[str, str | int | bool]] = []
    if element.find("shareable") is not None:
        out.append(("share-rw", True))
    blockio = element.find("blockio")
    for key in BLOCKIO:
        value = blockio.get(key) if blockio is not None else None
        if value is not None:
            out.append((key, scaled(value, None, f"<blockio {key}=>")))
    wwn = element.findtext("wwn")
    if wwn is not None:
        try:
            out.append(("wwn", int(wwn.strip(), 16)))
        except ValueError:
            raise ValueError(f"<wwn>{wwn}</wwn> is not a hexadecimal WWN") from None
    for key in ("vendor", "product"):
        text = element.findtext(key)
        if text is not None:
            out.append((key, text))
    return tuple(out)


def controller_unmodelled(element: ET.Element, driver_attrs: tuple[str, ...]) -> tuple[str, ...]:
    """What iomatrix does not render of a ``<controller>`` (its PCI address aside)."""
    out = unmodelled(element, *CONTROLLER_KNOWN)
    driver = element.find("driver")
    if driver is not None:
        out += unmodelled(driver, set(driver_attrs), {"iothreads"}, "controller><driver")
    return tuple(out)


def scaled(text: str | None, unit: str | None, what: str) -> int:
    """A size and its ``unit=`` in bytes (ValueError for what libvirt refuses)."""
    factor = _UNITS.get((unit or "").lower())
    if text is None or not text.strip().isdigit() or factor is None:
        raise ValueError(f"{what}: {text!r} {unit or ''} is not a size libvirt reads")
    return int(text) * factor


def metadata_cache(element: ET.Element) -> int | None:
    """``<driver><metadata_cache><max_size unit=>``: QEMU's qcow2 ``cache-size`` in bytes."""
    size = element.find("./driver/metadata_cache/max_size")
    if size is None:
        return None
    return scaled(size.text, size.get("unit"), "<metadata_cache><max_size>")


def storage_slice(element: ET.Element) -> tuple[int, int] | None:
    """``<source><slices><slice type='storage' offset= size=>`` as (offset, size)."""
    piece = element.find("./source/slices/slice[@type='storage']")
    if piece is None:
        return None
    return (scaled(piece.get("offset", "0"), None, "<slice offset=>"),
            scaled(piece.get("size"), None, "<slice size=>"))


def _image(element: ET.Element) -> Image | None:
    """A ``<backingStore>``/``<dataStore>`` as an :class:`Image`; None when it is not a local
    file or block device."""
    kind, source = element.get("type", "file"), element.find("source")
    fmt = element.find("format")
    if kind not in ("file", "block") or source is None:
        return None
    return Image(kind=kind, path=source.get("file" if kind == "file" else "dev", ""),
                 format=fmt.get("type", "raw") if fmt is not None else "raw")


def backing_chain(element: ET.Element) -> tuple[int, tuple[Image, ...], list[str], bool]:
    """``<backingStore>`` nested: how many images it holds (each takes a node number), those
    iomatrix renders (local files and block devices), notes on any other, and whether an
    empty ``<backingStore/>`` closes the chain."""
    count, chain, notes = 0, [], []
    store = element.find("backingStore")
    while store is not None and (store.attrib or len(store)):
        count += 1
        image = _image(store)
        if image is None:
            notes.append(f"<backingStore type='{store.get('type', 'file')}'>")
        else:
            chain.append(image)
        store = store.find("backingStore")
    return count, tuple(chain), notes, store is not None


def data_store(element: ET.Element) -> tuple[Image | None, list[str]]:
    """``<source><dataStore>``: a qcow2 image's external data file."""
    store = element.find("./source/dataStore")
    if store is None:
        return None, []
    image = _image(store)
    return image, [] if image is not None else [f"<dataStore type='{store.get('type')}'>"]


def numbers(slots: tuple[Slot, ...], data_store: bool) -> list[int]:
    """The ``libvirt-N-…`` number of each disk's top image: libvirt walks the disks from the
    last to the first, numbering each disk, then its data store (``data_store``: where that
    libvirt reads it), then its backing images."""
    out, counter = [0] * len(slots), 0
    for i in range(len(slots) - 1, -1, -1):
        out[i] = counter + 1
        counter += slots[i].images + (1 if data_store and slots[i].data_store else 0)
    return out


def boot_indexes(slots: list[Slot], boot: tuple[str, ...]) -> list[int | None]:
    """qemuProcessPrepareDeviceBootorder: ``<os><boot dev=>``'s places go to the first disk
    (or LUN), CD-ROM and floppy of the domain, of any type and bus; ``<boot order>`` where
    the devices carry it."""
    if not boot:
        return [s.boot for s in slots]
    places = {dev: i + 1 for i, dev in enumerate(boot)}
    kinds = {"disk": "hd", "lun": "hd", "cdrom": "cdrom", "floppy": "fd"}
    return [places.pop(kinds.get(s.device, ""), None) for s in slots]


def host_cdrom(path: str, fmt: str) -> tuple[bool, str]:
    """Whether libvirt opens a block CD-ROM with QEMU's ``host_cdrom`` (else ``host_device``):
    only a raw one whose path is a CD-ROM drive, which libvirt asks the device where the
    domain starts; iomatrix, reading no device a domain names, goes by the path's name. The
    note says so."""
    named = path.startswith(CDROM_NAMES)
    yes = named and fmt == "raw"
    return yes, (f"libvirt uses host_cdrom only for a raw CD-ROM whose path is a CD-ROM drive "
                 f"on the host that starts it (it asks the device): {path} taken for "
                 + ("one by its name" if named else "none") + (", but the format is not raw"
                                                                if named and not yes else ""))
