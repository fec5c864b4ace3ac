"""The user's own guest ([guest] image): their disk image booted instead of the appliance (the
guest kind :mod:`iomatrix.drivers.guest.image` boots it with what this module makes).

The image is user input, and it is only ever read. The image, kernel and initrd a suite names
are used only if nobody but the invoking user could have chosen them (rule 1,
:func:`iomatrix.core.trust.chosen_by_us`) and the suite's author can read them already
(:func:`check_guest_files`): a guest shows whoever wrote the suite what it reads. The image is
then opened once (:class:`ImageFile`: a regular file, read-only) and everything after reads that
descriptor: ``qemu-img info`` its format (raw or qcow2; a qcow2 with a backing file or an
external data file is refused: QEMU would open whatever path those name, and give it to the
guest), and each QEMU gets it by ``-add-fd`` as ``/dev/fdset/N``, so the path swapped after the
checks changes nothing. Each guest gets an empty qcow2 overlay of the image's
size in its own directory of the run's scratch directory (:func:`make_overlay`), which reclaim
removes after a ``kill -9`` like the rest of it. The overlay names no backing file: QEMU's
command line stacks it on the image's nodes, opened ``read-only`` with ``"backing": null``
(:func:`system_blockdevs`: a backing file the image's header names is never opened), so every
write of the guest lands in the overlay and the image is never opened for writing.

A Linux guest gets a NoCloud seed (:func:`make_seed`: an ISO 9660 volume ``cidata`` made with
``xorriso``) holding ``meta-data``, ``user-data``, a ``network-config`` that keeps cloud-init
from configuring the NIC, the static guest fio (:mod:`~iomatrix.appliance.guestfio`: the
host's version, so client and server speak the same protocol) and ``iomatrix.sh``
(``cloud-guest.sh``). cloud-init's ``bootcmd`` mounts the seed and runs the script: it finds the
disk under test (neither the system disk nor the seed, and of the size the host attached),
prints the :data:`GUEST_MARKER` and :data:`~iomatrix.appliance.protocol.DISK_MARKER` lines,
gives the NIC the address QEMU's user network forwards to, starts ``fio --server`` and prints
:data:`~iomatrix.appliance.protocol.READY_MARKER`. The NIC is on a ``restrict=on`` user network
inside the session's private network namespace: the guest reaches nothing, and only the
host's forward reaches its fio. No SSH, no other network.

A Windows guest (:mod:`iomatrix.drivers.guest.windows`) gets a seed CD of its own
(:mod:`~iomatrix.appliance.winseed`: fio.exe of the host's version and a PowerShell script that a
scheduled task, registered once, runs at boot); the disk under test is then
``\\\\.\\PhysicalDriveN`` (:func:`windows_disk`) and the engine ``windowsaio``.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import stat
from importlib import resources
from pathlib import Path

from iomatrix.appliance.protocol import (ERROR_MARKER, GUEST_FIO_PORT, GUEST_IP,
                                         READY_MARKER, console_line)
from iomatrix.core.errors import EnvironmentProblem, NotEnoughSpace, ToolFailed
from iomatrix.core.model import Frozen
from iomatrix.core.proc import require, run
from iomatrix.core.trust import Author, chosen_by_us, readable_for
from iomatrix.qemu.escape import qemu_escape
from iomatrix.suite.method import OwnGuest
from iomatrix.core.units import format_bytes
from iomatrix.targets.workspace import MARGIN, footprint, nearest_existing

GUEST_MARKER = "IOMATRIX-GUEST"
"""Console line of a user's guest before its disk line: ``kernel=<uname -r> os="<PRETTY_NAME>"
fio=<fio --version>`` (fio= may be missing)."""
SEED_LABEL = "cidata"
"""The volume label cloud-init's NoCloud data source looks for."""
SEED_DIR = "/run/iomatrix-seed"
"""Where the guest mounts the seed (read-only) and runs fio from."""
QEMU_IMG_TIMEOUT = 60.0
XORRISO_TIMEOUT = 120.0
WINDOWS_ENGINE = "windowsaio"
IMAGE_FDSET = 1
"""QEMU's fd set (``-add-fd set=``) that holds the image's descriptor: ``/dev/fdset/1``."""
GUEST_FILES = ("image", "kernel", "initrd")
"""The [guest] keys that name a file QEMU reads and the guest sees."""


class BaseImage(Frozen):
    """The user's image as :class:`ImageFile` found it."""

    path: Path
    """The file opened, every symlink resolved (what the guest reads is the descriptor's)."""
    format: str
    virtual_size: int


def check_guest_files(own: OwnGuest, author: Author) -> None:
    """UntrustedFile, in one line naming the key and the file, unless each of [guest] image,
    kernel and initrd passes rule 1 (nobody but root or the invoking user could have chosen
    it) and ``author``, the suite's, can read it already."""
    for key in GUEST_FILES:
        path = getattr(own, key)
        if path is not None:
            chosen_by_us(path, f"[guest] {key}", "QEMU")
            readable_for(path, f"[guest] {key}", author)


class ImageFile:
    """The user's image opened once, read-only, and inspected through that descriptor
    (``base``); :meth:`descriptor` gives each QEMU its own. EnvironmentProblem naming the image
    when it is not a regular raw or qcow2 file standing alone."""

    def __init__(self, path: Path) -> None:
        try:        # O_PATH first: a FIFO or device is judged before anything opens it
            held = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError as exc:
            raise EnvironmentProblem(f"[guest] image {path}: {exc.strerror or exc}") from None
        try:
            if not stat.S_ISREG(os.fstat(held).st_mode):
                raise EnvironmentProblem(f"[guest] image {path}: not a regular file (a raw or "
                                         "qcow2 image file)")
            self.fd = os.open(f"/proc/self/fd/{held}", os.O_RDONLY | os.O_CLOEXEC)
        finally:
            os.close(held)
        try:
            real = Path(os.readlink(f"/proc/self/fd/{self.fd}"))
            self.base = _inspect(path, real, self.fd)
        except BaseException:
            self.close()
            raise

    def descriptor(self) -> int:
        """A new read-only descriptor of the same file (its own open file, for one QEMU's
        locks); the caller closes it once QEMU has started."""
        return os.open(f"/proc/self/fd/{self.fd}", os.O_RDONLY | os.O_CLOEXEC)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> ImageFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "fd", -1) >= 0:
            self.close()


def open_guest_image(own: OwnGuest, author: Author) -> ImageFile:
    """[guest]'s image, opened and inspected once its files passed :func:`check_guest_files`."""
    check_guest_files(own, author)
    return ImageFile(own.image)


def inspect_image(path: Path) -> BaseImage:
    """``path`` as a guest's base image (:class:`ImageFile`), the file closed again."""
    with ImageFile(path) as image:
        return image.base


def _inspect(path: Path, real: Path, fd: int) -> BaseImage:
    """What ``qemu-img info`` says of the descriptor ``fd`` (the image named ``path``): raw or
    qcow2, with neither a backing file nor an external data file; EnvironmentProblem else."""
    try:
        # -U: another VM may have it open; it is only read here and by the guests. qemu-img
        # info opens no backing or data file (it reads the header's names only).
        out = run([require("qemu-img"), "info", "-U", "--output=json", f"/dev/fd/{fd}"],
                  timeout=QEMU_IMG_TIMEOUT, pass_fds=(fd,)).stdout
        fields = json.loads(out)
    except (ToolFailed, ValueError) as exc:
        raise EnvironmentProblem(f"[guest] image {path}: qemu-img info failed: {exc}") from None
    fmt = fields.get("format")
    convert = f"qemu-img convert -O qcow2 {path} NEW.qcow2"
    if fmt not in ("raw", "qcow2"):
        raise EnvironmentProblem(f"[guest] image {path}: {fmt} image; iomatrix boots raw or "
                                 "qcow2 images", hint=convert)
    if fields.get("backing-filename") or fields.get("full-backing-filename"):
        raise EnvironmentProblem(f"[guest] image {path}: it has a backing file "
                                 f"({fields.get('backing-filename')!r}); give a standalone "
                                 "image", hint=convert)
    data_file = ((fields.get("format-specific") or {}).get("data") or {}).get("data-file")
    if data_file:
        raise EnvironmentProblem(f"[guest] image {path}: its data is in an external data file "
                                 f"({data_file!r}), which QEMU would open as named; give a "
                                 "standalone image", hint=convert)
    return BaseImage(path=real, format=fmt, virtual_size=int(fields["virtual-size"]))


def make_overlay(base: BaseImage, overlay: Path) -> None:
    """An empty qcow2 of ``base``'s size at ``overlay``, naming no backing file (the guest's
    command line gives it ``base`` as its read-only backing node)."""
    run([require("qemu-img"), "create", "-q", "-f", "qcow2", str(overlay),
         str(base.virtual_size)], timeout=QEMU_IMG_TIMEOUT)


def overlay_worst_case(base: BaseImage) -> int:
    """Bytes one guest's overlay can come to: the guest rewriting every block of its system
    disk (qcow2's metadata included). A booted guest writes far less (logs, cloud-init's state);
    nothing else bounds it."""
    return footprint(base.virtual_size, "qcow2")


def check_overlay_space(base: BaseImage, guests: int, directory: Path) -> None:
    """NotEnoughSpace unless the filesystem of ``directory`` (the run's scratch directory, or the
    nearest parent while it is not made yet) has room for ``guests`` overlays at their worst
    case, as the target's check has for images."""
    need = guests * overlay_worst_case(base) + MARGIN
    free = shutil.disk_usage(nearest_existing(directory)).free
    if free < need:
        raise NotEnoughSpace(
            f"[guest] image {base.path}: {guests} overlay(s) in {directory} may grow to "
            f"{format_bytes(overlay_worst_case(base))} each (the image's virtual size, if the "
            f"guest rewrote its whole disk), {format_bytes(need)} in all, and its filesystem "
            f"has {format_bytes(free)} free",
            hint="set TMPDIR to a directory on a larger filesystem, or use fewer vms")


def system_blockdevs(base: BaseImage, overlay: Path) -> list[dict[str, object]]:
    """The system disk's nodes, bottom up: the image (the descriptor in :data:`IMAGE_FDSET`),
    read-only and with no backing node whatever its header names, under the overlay (node
    ``guestos-root``, whose backing is iomatrix's own). Node names start with ``guestos``: QMP
    readings of the disk under test leave them out
    (:func:`iomatrix.qemu.args.read_guest_settings`)."""
    image: dict[str, object] = {"driver": base.format, "file": "guestos-base-file",
                                "node-name": "guestos-base", "read-only": True}
    if base.format == "qcow2":             # raw has no backing option
        image["backing"] = None
    return [
        {"driver": "file", "filename": f"/dev/fdset/{IMAGE_FDSET}",
         "node-name": "guestos-base-file", "read-only": True},
        image,
        {"driver": "file", "filename": str(overlay), "node-name": "guestos-root-file"},
        {"driver": "qcow2", "file": "guestos-root-file", "backing": "guestos-base",
         "node-name": "guestos-root"},
    ]


def system_argv(base: BaseImage, overlay: Path, seed: Path | None, *,
                bootloader: bool, fd: int, seed_cd: bool = False) -> list[str]:
    """QEMU arguments of a user's guest's system disk (virtio-blk, first: ``/dev/vda``) and of
    its seed (a read-only virtio-blk disk; ``seed_cd``: an IDE/AHCI CD, which Windows mounts
    ISO 9660 from). ``bootloader``: the firmware boots the system disk
    (no ``-kernel``). ``fd``: the image's descriptor QEMU inherits
    (:meth:`ImageFile.descriptor`), named with the image's path as the fd set's ``opaque``."""
    argv = ["-add-fd", f"fd={fd},set={IMAGE_FDSET},opaque={qemu_escape(str(base.path))}"]
    for node in system_blockdevs(base, overlay):
        argv += ["-blockdev", json.dumps(node, separators=(",", ":"))]
    argv += ["-device", "virtio-blk-pci,id=guestos-root,drive=guestos-root"
             + (",bootindex=0" if bootloader else "")]
    if seed is not None:
        argv += ["-blockdev", json.dumps({"driver": "file", "filename": str(seed),
                                          "node-name": "guestos-seed-file", "read-only": True},
                                         separators=(",", ":")),
                 "-blockdev", json.dumps({"driver": "raw", "file": "guestos-seed-file",
                                          "node-name": "guestos-seed", "read-only": True},
                                         separators=(",", ":")),
                 "-device", ("ide-cd" if seed_cd else "virtio-blk-pci")
                 + ",id=guestos-seed,drive=guestos-seed"]
    return argv


def _template() -> str:
    return resources.files("iomatrix.appliance").joinpath("cloud-guest.sh").read_text(
        encoding="utf-8")


def guest_script(disk_size: int, port: int = GUEST_FIO_PORT) -> str:
    """``cloud-guest.sh`` for a disk under test of ``disk_size`` bytes and fio on ``port``."""
    from iomatrix.appliance.build import disk_line_function, render_template

    return render_template(_template(), {
        "SEED_DIR": SEED_DIR, "SIZE": str(disk_size), "PORT": str(port),
        "GUEST_IP": GUEST_IP, "READY_MARKER": READY_MARKER, "DISK_LINE": disk_line_function(),
        "ERROR_MARKER": ERROR_MARKER, "GUEST_MARKER": GUEST_MARKER})


def user_data() -> str:
    """cloud-config whose ``bootcmd`` (every boot, before the rest of cloud-init's modules) mounts
    the seed read-only and runs its script."""
    command = (f"mkdir -p {SEED_DIR} && mount -o ro /dev/disk/by-label/{SEED_LABEL} {SEED_DIR} "
               f"|| mount -o ro LABEL={SEED_LABEL} {SEED_DIR}; sh {SEED_DIR}/iomatrix.sh")
    return ("#cloud-config\n"
            "# written by iomatrix: starts the guest's fio server for the host (no users, no SSH)\n"
            f"bootcmd:\n  - [sh, -c, {json.dumps(command)}]\n")


NETWORK_CONFIG = "network:\n  config: disabled\n"
"""The seed's ``network-config``: cloud-init leaves the NIC alone (the script sets it up)."""


def make_seed(directory: Path, *, fio: Path, disk_size: int, port: int = GUEST_FIO_PORT) -> Path:
    """The NoCloud seed ISO in ``directory`` (see the module docstring); its instance-id is new
    each time, so cloud-init treats every boot of the image as a first boot."""
    files = directory / "seed.d"
    files.mkdir(mode=0o700)
    (files / "meta-data").write_text(f"instance-id: iomatrix-{secrets.token_hex(8)}\n"
                                     "local-hostname: iomatrix-guest\n")
    (files / "user-data").write_text(user_data())
    (files / "network-config").write_text(NETWORK_CONFIG)
    (files / "iomatrix.sh").write_text(guest_script(disk_size, port))
    (files / "fio").write_bytes(fio.read_bytes())
    (files / "fio").chmod(0o755)
    seed = directory / "seed.iso"
    run([require("xorriso", hint="install Debian's xorriso (./setup.sh does)"),
         "-as", "mkisofs", "-quiet", "-output", str(seed), "-volid", SEED_LABEL, "-joliet",
         "-rock", str(files)], timeout=XORRISO_TIMEOUT)
    return seed


def parse_guest_line(console_text: str) -> dict[str, str]:
    """``guest.kernel``, ``guest.os`` and (where the guest says it) ``guest.fio`` from the first
    :data:`GUEST_MARKER` line ({} if none)."""
    match = re.search(GUEST_MARKER + r' kernel=(\S+) os="([^"\r\n]*)"(?: fio=(\S+))?',
                      console_text)
    if match is None:
        return {}
    found = {"guest.kernel": console_line(match[1]), "guest.os": console_line(match[2])}
    return found | ({"guest.fio": console_line(match[3])} if match[3] else {})


# --- Windows (the seed: iomatrix.appliance.winseed; the kind: drivers/guest/windows.py) ----

def windows_disk(name: str) -> str:
    """fio's filename for a Windows guest's disk as its startup script names it
    (``PhysicalDrive1``): ``\\\\.\\PhysicalDrive1``, colon-free, which fio takes as it is.
    ValueError for any other name (it came from the guest's console)."""
    if not re.fullmatch(r"PhysicalDrive[0-9]{1,3}", name):
        raise ValueError(f"{name!r} is not a Windows physical drive (PhysicalDriveN)")
    return "\\\\.\\" + name


def windows_target(name: str) -> dict[str, str]:
    """The job options that aim fio in a Windows guest at the disk under test: windowsaio
    (fio's native engine there), unbuffered, fio's threads (Windows has no fork)."""
    return {"ioengine": WINDOWS_ENGINE, "direct": "1", "thread": "1",
            "filename": windows_disk(name)}


_FIO_VERSION = re.compile(r"fio-\d+(?:\.\d+)*\S*")


def version_mismatch(host: str, guest: str) -> str | None:
    """One line naming both versions when the guest's fio (its ``--version`` or the server's
    greeting) is not the host's: fio's client and server must be the same version. None when
    they match."""
    want, have = _FIO_VERSION.search(host), _FIO_VERSION.search(guest)
    if want is not None and have is not None and want[0] == have[0]:
        return None
    theirs = console_line(have[0] if have else guest.strip())      # the guest's words
    return (f"the guest's fio is {theirs or 'unknown'}, the host's "
            f"is {want[0] if want else host.strip() or 'unknown'}: fio's client and server must "
            "be the same version (install the guest's fio of the host's version)")
