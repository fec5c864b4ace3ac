"""A small Debian 12 guest image made from Debian's packages, for the tests and benchmarks of
[guest] image: a real distribution's kernel, udev, systemd and cloud-init, and a disk laid out
as a cloud image's is (a partition table, GRUB in its boot track), with no preparation for
iomatrix beyond what a cloud image has (cloud-init looks for NoCloud only).

``mmdebstrap`` installs bookworm (minbase, ``linux-image-amd64``, ``systemd-sysv``, ``udev``,
``cloud-init``, ``iproute2``, ``grub-pc-bin``) into a directory. The disk is made in a file,
without a loop device (the host's kernel needs no partition support): ``mkfs.ext4 -d`` writes
the tree as the filesystem at 1 MiB into the file, :func:`write_mbr` adds an MBR with that one
partition, and GRUB's BIOS loader goes where ``grub-install`` would put it: ``boot.img`` in the
MBR's code area, ``core.img`` (made by ``grub-mkimage`` in the tree, with the modules it needs
to read the partition) in the sectors before the partition, GRUB's modules and a ``grub.cfg``
in ``/boot/grub``. So the image boots two ways: through the firmware (SeaBIOS, then GRUB,
:data:`PARTUUID` as root), or with the kernel and initrd copied out of ``/boot`` given to QEMU
with :attr:`DebianImage.append`. 164 s on 2 cores at a load of ~4, 385 s at a load of ~13;
1.5 GiB sparse (~750 MB used).

Cache: ``<cache>/debian-image/<key>/`` (the appliance's cache root), the key hashing
:data:`RECIPE`; a build goes to a hidden temporary directory and is renamed into place. Used
only when nobody but root and this user controls the cache and its ``manifest.json`` still
matches the SHA-256 of the kernel and initrd and the image's size (the image itself is hashed
by the tests that need it: 1.5 GiB is too long to hash at every use). ``./setup.sh --dev``
builds it (``python -m iomatrix.testing.debianimage``), so the tests find it cached."""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
import sys
import tempfile
import time
from pathlib import Path

from iomatrix.appliance.kernel import default_cache_dir, trusted_cache
from iomatrix.core.files import read_owned
from iomatrix.core.model import Frozen
from iomatrix.core.proc import require, run

SUITE = "bookworm"
PACKAGES = ("linux-image-amd64", "systemd-sysv", "udev", "cloud-init", "iproute2", "grub-pc-bin")
SECTOR = 512
SIZE = 1536 << 20
PART_START = 2048
"""The partition's first sector (1 MiB, as partitioning tools align it); GRUB's core.img lives
in the sectors before it."""
DISK_ID = 0x696F6D78
PARTUUID = f"{DISK_ID:08x}-01"
"""The root partition as the kernel names it from an MBR (disk signature - partition number):
no initramfs lookup needed, and not tied to the disk's order on the bus."""
GRUB_MODULES = ("biosdisk", "part_msdos", "ext2")
"""What core.img needs to reach /boot/grub; the rest GRUB loads from there."""
RECIPE = f"2 {SUITE} minbase {' '.join(PACKAGES)} {SIZE} mbr@{PART_START} grub-pc nocloud-only"
BUILD_TIMEOUT = 1800.0
EXCLUDES = ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/locale/*")
# GRUB's i386-pc layout (grub-core/boot/i386/pc/boot.S and diskboot.S): where boot.img keeps the
# sector of core.img, and the blocklist at the end of core.img's first sector saying where the
# rest of it is (start sector, sectors, load segment)
_KERNEL_SECTOR = 0x5C
_BOOT_DRIVE = 0x64
_BLOCKLIST = SECTOR - 12
_CORE_SEGMENT = 0x820
_MBR_CODE = 440


class DebianImage(Frozen):
    """A built image: boot it as it is (firmware and GRUB), or ``kernel`` and ``initrd`` with
    ``append``."""

    image: Path
    kernel: Path
    initrd: Path
    build_seconds: float
    cached: bool

    @property
    def append(self) -> str:
        """The kernel command line for booting ``kernel`` directly (console=ttyS0 is added)."""
        return f"root=PARTUUID={PARTUUID} rw"


def _digest(path: Path) -> str:
    return hashlib.sha256(read_owned(path)).hexdigest()


def _load(directory: Path) -> DebianImage | None:
    try:
        manifest = json.loads(read_owned(directory / "manifest.json"))
        found = DebianImage(image=directory / "disk.raw", kernel=directory / "vmlinuz",
                            initrd=directory / "initrd.img",
                            build_seconds=manifest["build_seconds"], cached=True)
        if (_digest(found.kernel) == manifest["kernel"] and _digest(found.initrd)
                == manifest["initrd"] and found.image.stat().st_size == manifest["image_bytes"]):
            return found
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return None


def cached_image(cache_dir: Path | None = None) -> DebianImage | None:
    """The image if the cache holds it, else None (nothing is built)."""
    return _load(_directory(cache_dir))


def _directory(cache_dir: Path | None) -> Path:
    root = trusted_cache((cache_dir or default_cache_dir()) / "debian-image")
    return root / hashlib.sha256(RECIPE.encode()).hexdigest()[:16]


def debian_image(cache_dir: Path | None = None) -> DebianImage:
    """The image, from the cache or built now (see the module docstring)."""
    final = _directory(cache_dir)
    found = _load(final)
    if found is not None:
        return found
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=final.parent))
    try:
        _build(work)
        seconds = round(time.monotonic() - started, 1)
        (work / "manifest.json").write_text(json.dumps({
            "recipe": RECIPE, "build_seconds": seconds,
            "kernel": _digest(work / "vmlinuz"), "initrd": _digest(work / "initrd.img"),
            "image_bytes": (work / "disk.raw").stat().st_size}) + "\n")
        if final.exists():                       # damaged: out of the way
            shutil.rmtree(final)
        work.rename(final)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    built = _load(final)
    if built is None:
        raise RuntimeError(f"the Debian image built in {final} does not match its manifest")
    return built.model_copy(update={"cached": False})


def _build(work: Path) -> None:
    tree = work / "tree"
    run([require("mmdebstrap", hint="install Debian's mmdebstrap (./setup.sh --dev does)"),
         "--variant=minbase", "--include=" + ",".join(PACKAGES),
         *(f"--dpkgopt=path-exclude={p}" for p in EXCLUDES), SUITE, str(tree)],
        timeout=BUILD_TIMEOUT)
    (tree / "etc/cloud/cloud.cfg.d/90-nocloud.cfg").write_text(
        "datasource_list: [ NoCloud, None ]\n")
    (tree / "etc/fstab").write_text(f"PARTUUID={PARTUUID} / ext4 rw 0 1\n")
    kernel = next((tree / "boot").glob("vmlinuz-*"))
    release = kernel.name.removeprefix("vmlinuz-")
    shutil.copyfile(kernel, work / "vmlinuz")
    shutil.copyfile(tree / "boot" / f"initrd.img-{release}", work / "initrd.img")
    grub = tree / "boot/grub"
    shutil.copytree(tree / "usr/lib/grub/i386-pc", grub / "i386-pc")
    (grub / "grub.cfg").write_text(grub_cfg(release))
    run([require("chroot"), str(tree), "grub-mkimage", "-O", "i386-pc",
         "-o", "/boot/grub/i386-pc/core.img", "-p", "(hd0,msdos1)/boot/grub", *GRUB_MODULES],
        timeout=120)
    boot_img = (grub / "i386-pc/boot.img").read_bytes()
    core_img = (grub / "i386-pc/core.img").read_bytes()
    disk = work / "disk.raw"
    with open(disk, "wb") as f:
        f.truncate(SIZE)
    run([require("mkfs.ext4"), "-q", "-F", "-L", "debian12", "-E",
         f"offset={PART_START * SECTOR}", "-d", str(tree), str(disk),
         str((SIZE - PART_START * SECTOR) // 1024) + "k"], timeout=600)
    shutil.rmtree(tree)
    write_mbr(disk, boot_img, core_img)
    for name in ("vmlinuz", "initrd.img", "disk.raw"):
        (work / name).chmod(0o644)


def grub_cfg(release: str) -> str:
    """GRUB's menu: one entry, no wait, the kernel's console on the serial port as Debian's
    cloud images have it."""
    return ("# written by iomatrix.testing.debianimage\n"
            "set timeout=0\nset default=0\n"
            f"menuentry 'Debian GNU/Linux 12, {release}' {{\n"
            f"    linux /boot/vmlinuz-{release} root=PARTUUID={PARTUUID} rw console=ttyS0\n"
            f"    initrd /boot/initrd.img-{release}\n"
            "}\n")


def write_mbr(disk: Path, boot_img: bytes, core_img: bytes) -> None:
    """An MBR with one Linux partition from :data:`PART_START` to the end of ``disk``, GRUB's
    ``boot_img`` in its code area and ``core_img`` in the sectors after it (what ``sfdisk`` and
    ``grub-bios-setup`` would write to a device). ValueError if core.img does not fit."""
    size = disk.stat().st_size
    sectors = -(-len(core_img) // SECTOR)
    if len(boot_img) != SECTOR or not 1 < sectors < PART_START:
        raise ValueError(f"boot.img of {len(boot_img)} bytes, core.img of {sectors} sectors: "
                         f"not GRUB's i386-pc images, or too large for {PART_START - 1} sectors")
    code = bytearray(boot_img[:_MBR_CODE])
    code[_KERNEL_SECTOR:_KERNEL_SECTOR + 8] = struct.pack("<Q", 1)
    code[_BOOT_DRIVE] = 0xFF                      # the drive the BIOS booted from
    core = bytearray(core_img.ljust(sectors * SECTOR, b"\0"))
    core[_BLOCKLIST:SECTOR] = struct.pack("<QHH", 2, sectors - 1, _CORE_SEGMENT)
    # one partition: active, type 0x83, CHS fields saying "use LBA"
    entry = struct.pack("<B3sB3sII", 0x80, b"\xfe\xff\xff", 0x83, b"\xfe\xff\xff",
                        PART_START, size // SECTOR - PART_START)
    mbr = bytes(code) + struct.pack("<IH", DISK_ID, 0) + entry + b"\0" * 48 + b"\x55\xaa"
    with open(disk, "r+b") as f:
        f.write(mbr)
        f.write(core)


def main() -> int:
    """``./setup.sh --dev``: build the image where the tests can use it (they need the guests'
    static fio too: where that cannot be built, say so and build nothing), and fio.exe for the
    Windows tests where mingw-w64 is installed, so the timed test suite finds both cached."""
    from iomatrix.appliance.guestfio import guest_fio
    from iomatrix.appliance.winfio import CC, windows_fio
    from iomatrix.core.errors import IomatrixError
    from iomatrix.core.proc import which

    if which(CC) is not None:     # fio.exe for the Windows tests (tests/appliance/test_winfio)
        try:
            built = windows_fio(default_cache_dir())
            print(f"setup.sh: fio.exe for Windows guests {'cached' if built.cached else 'built'}"
                  f" ({built.build_seconds:.0f} s to build)")
        except IomatrixError as exc:
            print(f"setup.sh: no fio.exe for Windows guests (its tests skip): {exc}")
    try:
        guest_fio(default_cache_dir())
    except IomatrixError as exc:
        print(f"setup.sh: no Debian 12 test guest image (the own-guest tests skip): the guests' "
              f"fio cannot be built here: {exc}")
        return 0
    found = cached_image()
    try:
        image = found or debian_image()
    except (IomatrixError, RuntimeError) as exc:
        print(f"setup.sh: building the Debian 12 test guest image failed: {exc}", file=sys.stderr)
        return 1
    print(f"setup.sh: Debian 12 test guest image {'cached' if found else 'built'}: "
          f"{image.image} ({image.build_seconds:.0f} s to build)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
