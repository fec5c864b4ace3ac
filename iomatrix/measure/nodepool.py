"""A node's disks on shared network storage under cluster load (``iomatrix node serve-guests``,
``serve-blocklayer``): the controller made each image in an rbd pool, or names the suite's
iSCSI LUN; the node reaches it by a ceph.conf (a CHAP secret) of its own, written into the
session's 0700 directory from the suite's ``[target]`` as the node checks it (``rbd.locate``:
the monitors, fsid and keyring's path, the keyring a file of secrets under rule 1 HERE, as the
suite's author may use it; ``iscsi.read_chap`` likewise), never by a path or option of the
request's."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from iomatrix.core.errors import NodesError
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.model import Suite
from iomatrix.targets import iscsi, rbd
from iomatrix.targets.workspace import Image

REGION_ALIGN = 1 << 20
"""What a region of a LUN is aligned to, its start and its size (the controller splits in whole
MiB: ``clusterblock.regions``): a multiple of every logical block size a LUN has (512 B to
4 KiB), so no block is shared by two regions, which QEMU would read-modify-write."""

IMAGE_NAME = re.compile(rf"^{re.escape(rbd.PREFIX)}[0-9a-z]{{1,20}}-[0-9a-f]{{6}}-[0-9]{{1,6}}$")
"""The name the controller's ``RbdPool.image`` gives an image (``iomatrix-<run>-<token>-<n>``)."""


def pool_images(images: Sequence[Image], config: Configuration, suite: Suite,
                directory: Path) -> list[Image]:
    """The controller's images for this node's guests, each checked to be a run's image in the
    suite's pool (by its name alone), and reached through this node's own ceph.conf
    (``directory``/ceph.conf); NodesError naming the first that is not."""
    assert suite.target.rbd is not None
    if len(images) != (config.vms or 1):
        raise NodesError(f"{len(images)} disks for {config.vms or 1} guests")
    location = rbd.locate(suite.target.rbd, author=suite.author)
    pool = rbd.RbdPool(suite.target, author=suite.author)
    pool.location = location
    pool.conf = rbd.write_conf(directory / "ceph.conf",
                               rbd.conf_text(location, rbd_cache="false"))
    out = []
    for image in images:
        where, _, name = (image.network.name if image.network else "").rpartition("/")
        if (image.network is None or image.network.protocol != "rbd" or where != location.spec
                or not IMAGE_NAME.match(name)):
            raise NodesError(f"disk {str(image.path)[:200]}: not an image of a run in the "
                             f"suite's pool {location.spec}")
        out.append(Image(path=Path(f"rbd:{location.spec}/{name}"), format="raw",
                         preallocation="off", size=image.size, network=pool.volume(name)))
    return out


def lun_image(images: Sequence[Image], suite: Suite, directory: Path) -> Image:
    """The suite's iSCSI LUN, which the controller's request names (one image): reached by
    this node's own volume (``iscsi.volume``: the CHAP file read here, under the same rules, its
    password written into ``directory`` for QEMU's secret object); NodesError when the request
    names anything else."""
    lun = suite.target.iscsi
    assert lun is not None
    if len(images) != 1 or images[0].path != Path(lun.url) or not images[0].is_device:
        raise NodesError(f"not the suite's LUN {lun.url}: "
                         + ", ".join(str(i.path)[:200] for i in images))
    chap = iscsi.read_chap(lun.chap, suite.author, lun.portal) if lun.chap else None
    secret = directory / iscsi.SECRET_FILE
    if chap is not None:
        iscsi.write_secret(chap, secret)
    return Image(path=Path(lun.url), format="raw", preallocation="off", size=images[0].size,
                 is_device=True, network=iscsi.volume(lun, chap=chap, secret=secret))


def lun_regions(images: Sequence[Image], config: Configuration, suite: Suite,
                directory: Path) -> list[Image]:
    """This node's guests' disks (one in blocklayer mode), each a region of the suite's iSCSI
    LUN that the controller split (``clusterblock.region_images``), checked here: the LUN
    itself, each region aligned (:data:`REGION_ALIGN`), inside the LUN as this node finds its
    size (``iscsi.probe``), none overlapping another; each reached by this node's own volume
    (``lun_image``) as a raw node limited to its region (QEMU raw's ``offset`` and ``size``,
    platform qemu's graph); NodesError in one line for the first that is not."""
    lun = suite.target.iscsi
    assert lun is not None
    if len(images) != (config.vms or 1):
        raise NodesError(f"{len(images)} disks for {config.vms or 1} guests")
    if suite.method.platform != "qemu":
        raise NodesError(f"a region of a LUN is built on platform qemu's graph only, not "
                         f"{suite.method.platform}'s")
    whole = lun_image(images[:1], suite, directory)
    real = iscsi.probe(lun, suite.author)
    end = 0
    for image in sorted(images, key=lambda i: i.offset):
        lun_image([image], suite, directory)            # the LUN, and nothing else
        where = f"the region {image.offset}+{image.size} of the LUN {lun.url}"
        if image.offset % REGION_ALIGN or image.size % REGION_ALIGN or image.size <= 0:
            raise NodesError(f"{where}: not aligned to {REGION_ALIGN >> 20} MiB")
        if image.offset + image.size > real:
            raise NodesError(f"{where}: beyond the LUN's {real} bytes")
        if image.offset < end:
            raise NodesError(f"{where}: overlaps another disk's region")
        end = image.offset + image.size
    return [whole.model_copy(update={"offset": i.offset, "size": i.size}) for i in images]
