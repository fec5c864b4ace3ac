"""A small Debian 12 guest image made from Debian's packages, for the tests and benchmarks of
[guest] image: a real distribution's kernel, udev, systemd and cloud-init, no preparation for
iomatrix beyond what a cloud image has (cloud-init looks for NoCloud only).

``mmdebstrap`` installs bookworm (minbase, ``linux-image-amd64``, ``systemd-sysv``, ``udev``,
``cloud-init``, ``iproute2``) into a directory, ``mkfs.ext4 -d`` turns it into a filesystem
image (no partition table: the guest boots its own kernel and initrd, copied out of ``/boot``,
with ``root=/dev/vda``). 164 s on 2 cores at a load of ~4, 385 s at a load of ~13; 1.5 GiB
sparse (~750 MB used).

Cache: ``<cache>/debian-image/<key>/`` (the appliance's cache root), the key hashing
:data:`RECIPE`; a build goes to a hidden temporary directory and is renamed into place. Used
only when nobody but root and this user controls the cache and its ``manifest.json`` still
matches the SHA-256 of the kernel and initrd and the image's size (the image itself is hashed
by the tests that need it: 1.5 GiB is too long to hash at every use)."""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path

from iomatrix.appliance.kernel import default_cache_dir, trusted_cache
from iomatrix.core.files import read_owned
from iomatrix.core.model import Frozen
from iomatrix.core.proc import require, run

SUITE = "bookworm"
PACKAGES = ("linux-image-amd64", "systemd-sysv", "udev", "cloud-init", "iproute2")
SIZE = "1536M"
RECIPE = f"1 {SUITE} minbase {' '.join(PACKAGES)} {SIZE} nocloud-only"
BUILD_TIMEOUT = 1800.0
EXCLUDES = ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/locale/*")


class DebianImage(Frozen):
    """A built image: boot ``kernel`` and ``initrd`` with ``root=/dev/vda`` on ``image``."""

    image: Path
    kernel: Path
    initrd: Path
    build_seconds: float
    cached: bool


def _digest(path: Path) -> str:
    return hashlib.sha256(read_owned(path)).hexdigest()


def _load(directory: Path) -> DebianImage | None:
    try:
        manifest = json.loads(read_owned(directory / "manifest.json"))
        found = DebianImage(image=directory / "root.ext4", kernel=directory / "vmlinuz",
                            initrd=directory / "initrd.img",
                            build_seconds=manifest["build_seconds"], cached=True)
        if (_digest(found.kernel) == manifest["kernel"] and _digest(found.initrd)
                == manifest["initrd"] and found.image.stat().st_size == manifest["image_bytes"]):
            return found
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return None


def debian_image(cache_dir: Path | None = None) -> DebianImage:
    """The image, from the cache or built now (see the module docstring)."""
    import time

    root = trusted_cache((cache_dir or default_cache_dir()) / "debian-image")
    final = root / hashlib.sha256(RECIPE.encode()).hexdigest()[:16]
    found = _load(final)
    if found is not None:
        return found
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=root))
    try:
        tree = work / "tree"
        run([require("mmdebstrap", hint="install Debian's mmdebstrap (./setup.sh --dev does)"),
             "--variant=minbase", "--include=" + ",".join(PACKAGES),
             *(f"--dpkgopt=path-exclude={p}" for p in EXCLUDES), SUITE, str(tree)],
            timeout=BUILD_TIMEOUT)
        (tree / "etc/cloud/cloud.cfg.d/90-nocloud.cfg").write_text(
            "datasource_list: [ NoCloud, None ]\n")
        (tree / "etc/fstab").write_text("/dev/vda / ext4 rw 0 1\n")
        boot = tree / "boot"
        shutil.copyfile(next(boot.glob("vmlinuz-*")), work / "vmlinuz")
        shutil.copyfile(next(boot.glob("initrd.img-*")), work / "initrd.img")
        run([require("mkfs.ext4"), "-q", "-F", "-L", "debian12", "-d", str(tree),
             str(work / "root.ext4"), SIZE], timeout=600)
        shutil.rmtree(tree)
        for name in ("vmlinuz", "initrd.img", "root.ext4"):
            (work / name).chmod(0o644)
        seconds = round(time.monotonic() - started, 1)
        (work / "manifest.json").write_text(json.dumps({
            "recipe": RECIPE, "build_seconds": seconds,
            "kernel": _digest(work / "vmlinuz"), "initrd": _digest(work / "initrd.img"),
            "image_bytes": (work / "root.ext4").stat().st_size}) + "\n")
        if final.exists():                       # damaged: out of the way
            shutil.rmtree(final)
        work.rename(final)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    built = _load(final)
    if built is None:
        raise RuntimeError(f"the Debian image built in {final} does not match its manifest")
    return built.model_copy(update={"cached": False})
