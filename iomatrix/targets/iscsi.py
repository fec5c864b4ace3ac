"""An iSCSI LUN as the storage under test (``[target] iscsi``): a ``NetworkTarget``
(``iomatrix.targets.remote``) whose one volume is the whole LUN, written to and destroyed like a
device (``allow_destroy``); iomatrix creates nothing on it, so nothing is recorded or reclaimed.

Every mode reaches the LUN through QEMU's userspace initiator, libiscsi (Debian's
``qemu-block-extra``; built into Proxmox VE's QEMU), unless the host is logged in to the LUN with
open-iscsi already, in which case host mode measures its block device:

- ``host``: the LUN's block device (``/dev/disk/by-path/ip-PORTAL-iscsi-IQN-lun-N``) where the
  kernel initiator has it; iomatrix does not log in itself, so no session of its own can outlive
  a killed run. Elsewhere (no ``iscsi_tcp``, or not logged in) the baseline is libiscsi through a
  qemu-storage-daemon exporting the raw LUN over NBD to fio with cache=none (Debian's fio has no
  libiscsi engine), and the trial says so (``iomatrix.drivers.host``).
- ``blocklayer``: qemu-storage-daemon with the ``iscsi`` driver and the configuration's cache.
  aio is not evaluated: ``aio=`` belongs to the ``file`` and ``host_device`` drivers, and
  libiscsi does its own non-blocking socket I/O in QEMU's event loop.
- ``guest``: the appliance's disk on libiscsi as QEMU (or Proxmox VE's ``iscsidirect`` storage)
  attaches it.

CHAP: the credentials file (TOML ``user`` and ``password``, mode 0600, held to rule 1 as every
file of secrets is: ``iomatrix.core.trust.private_file``) is read when the run checks the target; the password reaches QEMU as a ``secret`` object
read from a 0600 file in the run's private scratch directory, removed when the run ends, so it
never appears on a command line, in the database, a report or an export. The user name appears on
QEMU's command line only (QEMU takes it only there): the volume's node holds
:data:`CHAP_USER` in its place, which :func:`iomatrix.targets.remote.reveal` fills in when a
program starts, so stored commands show the placeholder.

A session ends with its QEMU: libiscsi logs out when QEMU exits, and the target drops the
connection of a QEMU killed outright when its socket closes."""

from __future__ import annotations

import json
import os
import re
import stat
import tempfile
import tomllib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, ClassVar

from iomatrix.core.errors import TargetError, TargetUnreachable, ToolFailed
from iomatrix.core.proc import require, run
from iomatrix.core.trust import US, Author, private_file
from iomatrix.core.units import format_bytes
from iomatrix.platform import proxmox as pve
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.target import Target
from iomatrix.suite.target import IscsiTarget, split_portal
from iomatrix.targets.kind import HostCheck, Image, NetworkVolume, OpenTarget, Probe, TargetKind
from iomatrix.targets.remote import NetworkTarget, reveal, secret_for
from iomatrix.targets.workspace import memory_total, page_cache_notes, working_set_size

SECRET_ID = "iscsi-chap"
"""The ``secret`` object holding the CHAP password in every QEMU iomatrix starts."""
CHAP_USER = "<chap user>"
"""What a stored command shows in place of the CHAP user name."""
SECRET_FILE = "chap.secret"
"""The password's file in the run's scratch directory (and in a probe's own)."""
SYS_MODULE = Path("/sys/module/iscsi_tcp")
BY_PATH = Path("/dev/disk/by-path")
HOST_CLIENT = "libiscsi through qemu-storage-daemon (raw, cache=none, NBD)"
"""How host mode reaches the LUN without the kernel initiator."""
AIO_NOT_EVALUATED = ("not evaluated: libiscsi does its own non-blocking socket I/O in QEMU's "
                     "event loop; aio= applies to the file and host_device drivers only")


class Chap:
    """CHAP credentials as read from the user's file; never printed (``repr`` hides them)."""

    __slots__ = ("user", "password")

    def __init__(self, user: str, password: str) -> None:
        self.user = user
        self.password = password

    def __repr__(self) -> str:
        return "Chap(<hidden>)"


def read_chap(path: Path, author: Author = US, portal: str = "") -> Chap:
    """The credentials in ``path``; TargetError (naming the file, never its contents) when it
    is missing or not a TOML file with ``user`` and ``password``; ``UntrustedFile`` when
    another user could have chosen or read it (``core.trust.private_file``), or when
    ``author``, who chose the ``portal`` they would log in to, cannot read it already
    (``remote.secret_for``: the portal would get the CHAP response)."""
    private_file(path, "[target] iscsi chap", "QEMU")
    secret_for(path, "[target] iscsi chap", author, f"the portal {portal}")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise TargetError(f"[target] iscsi chap: cannot read {path}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):     # never read a FIFO or device
            raise TargetError(f"[target] iscsi chap: {path} is not a regular file")
        raw = f.read(65536)
    try:
        data = tomllib.loads(raw.decode())
    except (UnicodeDecodeError, tomllib.TOMLDecodeError):
        data = None           # the parser's message can quote the file: say nothing of it
    user = data.get("user") if isinstance(data, dict) else None
    password = data.get("password") if isinstance(data, dict) else None
    if not (isinstance(user, str) and isinstance(password, str) and user and password
            and not re.search(r"[\x00-\x1f]", user + password)):
        raise TargetError(f"[target] iscsi chap: {path} is not a TOML file with user = \"…\" "
                          "and password = \"…\" (one line each)")
    return Chap(user, password)


class IscsiVolume(NetworkVolume):
    """An iSCSI LUN as QEMU and host mode reach it: through the kernel initiator's block device
    where the host is logged in to it, else libiscsi in a qemu-storage-daemon, which has no aio
    mode."""

    aio_not_evaluated: ClassVar[str | None] = AIO_NOT_EVALUATED

    def host_device(self) -> Path | None:
        return kernel_device(self)

    def host_daemon(self) -> str | None:
        return kernel_initiator_problem() or "this host is not logged in to the LUN"


def volume(lun: IscsiTarget, *, chap: Chap | None, secret: Path | None) -> NetworkVolume:
    """How QEMU reaches the LUN: the ``iscsi`` protocol node (with CHAP the user as
    :data:`CHAP_USER` and the password as the secret object read from ``secret``) and the
    ``-drive`` URL qemu-server writes for an iscsidirect volume."""
    node: dict[str, Any] = {"transport": "tcp", "portal": lun.portal, "target": lun.target,
                            "lun": lun.lun}
    objects: tuple[str, ...] = ()
    hidden: dict[str, str] = {}
    if chap is not None and secret is not None:
        node |= {"user": CHAP_USER, "password-secret": SECRET_ID}
        objects = (f"secret,id={SECRET_ID},file={secret}",)
        hidden = {CHAP_USER: chap.user}
    return IscsiVolume(protocol="iscsi", name=lun.url, node=node, drive_file=lun.url,
                       objects=objects, hidden=hidden, fio={}, client=HOST_CLIENT)


def write_secret(chap: Chap, path: Path) -> None:
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(chap.password)


def probe(lun: IscsiTarget, author: Author = US) -> int:
    """Log in to the LUN once (qemu-img, libiscsi) and return its size in bytes;
    ``TargetUnreachable`` with one line saying what is wrong (no answer, no such target or LUN, CHAP refused) within
    ``lun.connect_timeout``. ``author``: who chose the portal (``read_chap``)."""
    qemu_img = require("qemu-img")
    chap = read_chap(lun.chap, author, lun.portal) if lun.chap is not None else None
    with tempfile.TemporaryDirectory(prefix="iomatrix-iscsi-") as private:
        secret = Path(private) / SECRET_FILE
        if chap is not None:
            write_secret(chap, secret)
        vol = volume(lun, chap=chap, secret=secret)
        argv = [qemu_img, "info", "--output=json",
                *(a for o in vol.objects for a in ("--object", o)), "--image-opts",
                ",".join(f"{k}={v}" for k, v in {"driver": "iscsi", **vol.node}.items())]
        try:
            done = run(reveal(argv, vol), timeout=lun.connect_timeout, check=False)
        except ToolFailed as exc:           # the timeout
            raise TargetUnreachable(f"[target] iscsi {lun.portal}: no answer within "
                              f"{lun.connect_timeout:g} s",
                              hint="check the portal's address and that nothing filters "
                                   "the port") from exc
    if done.returncode != 0:
        raise TargetUnreachable(f"[target] iscsi {lun.url}: {explain(done.stderr)}",
                                hint=_HINTS.get(explain(done.stderr)))
    try:
        return int(json.loads(done.stdout)["virtual-size"])
    except (ValueError, KeyError, TypeError) as exc:
        raise TargetError(f"[target] iscsi {lun.url}: qemu-img gave no size") from exc


class IscsiLun(NetworkTarget):
    """A run on one iSCSI LUN (the module's docstring)."""

    kind = "iscsi"

    def __init__(self, target: Target, *, keep: bool = False, record: Any = None,
                 scratch: Path | None = None, proc_root: Path = Path("/proc"),
                 author: Author = US) -> None:
        super().__init__(target, keep=keep, record=record, scratch=scratch, author=author)
        assert target.iscsi is not None
        self.lun: IscsiTarget = target.iscsi
        self._proc = proc_root
        self._chap: Chap | None = None
        self._secret: Path | None = None
        self._volume: NetworkVolume | None = None

    def check(self, configs: Iterable[Configuration]) -> "IscsiLun":
        configs = list(configs)
        self.raw_only(configs, "a LUN is measured raw, as a whole device")
        self._chap = (read_chap(self.lun.chap, self.author, self.lun.portal)
                      if self.lun.chap is not None else None)
        device_size = probe(self.lun, self.author)
        memory = memory_total(self._proc / "meminfo")
        wanted = working_set_size(self.target, memory)
        if wanted is not None and wanted > device_size:
            raise TargetError(
                f"[target] working_set = \"exceed-ram\": the LUN {self.lun.url} "
                f"({format_bytes(device_size)}) is smaller than twice the host's RAM "
                f"({format_bytes(wanted)}), so the page cache could hold what is measured",
                hint="use a larger LUN, or drop working_set to measure as sized")
        if self.target.size is not None and self.target.size > device_size:
            raise TargetError(f"[target] size {format_bytes(self.target.size)} exceeds the LUN "
                              f"{self.lun.url} ({format_bytes(device_size)})")
        self.image_size = wanted or self.target.size or device_size
        self.notes = [f"target: the iSCSI LUN {self.lun.url}, written to and destroyed "
                      f"({format_bytes(self.image_size)} of it measured)",
                      *page_cache_notes(self.target, configs, self.image_size, memory)]
        return self

    def create(self) -> "IscsiLun":
        """Write the CHAP password for QEMU's secret object into the run's scratch directory."""
        assert self.scratch is not None, "the runner gives a network target its scratch"
        if self._chap is not None:
            self._secret = self.scratch / SECRET_FILE
            write_secret(self._chap, self._secret)
        self._volume = volume(self.lun, chap=self._chap, secret=self._secret)
        return self

    def close(self) -> None:
        if self._secret is not None:
            self._secret.unlink(missing_ok=True)

    def host_fields(self) -> dict[str, str]:
        return {"target": self.lun.url, "target_fs": "(iSCSI LUN)"}

    def node_regions(self) -> bool:
        return True

    def images(self, config: Configuration) -> list[Image]:
        """The LUN, once per guest of the configuration (as a device target is)."""
        assert self._volume is not None and self.image_size is not None, "create() first"
        image = Image(path=Path(self.lun.url), format="raw", preallocation="off",
                      size=self.image_size, is_device=True, network=self._volume)
        return [image] * (config.vms or 1)


_HINTS = {
    "the portal does not answer (connection refused or unreachable)":
        "check host:port (iSCSI listens on 3260 by default)",
    "the portal has no target of that name": "list the portal's targets (iscsi-ls, or "
                                             "iscsiadm -m discovery -t st -p PORTAL)",
    "the target has no such LUN": "list the target's LUNs (iscsi-ls -s)",
    "the target refused the login (CHAP user or password wrong, or CHAP required)":
        "check the credentials file ([target] iscsi chap)",
    "QEMU has no iscsi block driver": "apt-get install qemu-block-extra",
}


def explain(stderr: str) -> str:
    """libiscsi's failure, as QEMU reports it, in iomatrix's words (one line)."""
    text = stderr or ""
    if "Unknown driver 'iscsi'" in text or "Unknown protocol 'iscsi'" in text:
        return "QEMU has no iscsi block driver"
    if "Authentication failure" in text or "Authorization failure" in text:
        return "the target refused the login (CHAP user or password wrong, or CHAP required)"
    if "Target not found" in text:
        return "the portal has no target of that name"
    if "LOGICAL_UNIT_NOT_SUPPORTED" in text:
        return "the target has no such LUN"
    if "iscsi_service" in text or "connect" in text.lower() and "refused" in text.lower():
        return "the portal does not answer (connection refused or unreachable)"
    last = next((line for line in reversed(text.splitlines()) if line.strip()), "")
    return last.split(": ", 1)[-1][:200] or "qemu-img failed without a message"


def kernel_device(volume: NetworkVolume, *, by_path: Path = BY_PATH) -> Path | None:
    """The LUN's block device where the host's kernel initiator (open-iscsi) is logged in to it
    (udev's ``by-path`` name), else None."""
    node = volume.node
    host, port = split_portal(node["portal"])
    device = by_path / f"ip-{host.strip('[]')}:{port}-iscsi-{node['target']}-lun-{node['lun']}"
    return device if device.is_block_device() else None


def kernel_initiator_problem(*, module: Path = SYS_MODULE) -> str | None:
    """Why the kernel's iSCSI initiator is not available on this host, None when it is."""
    if module.exists():
        return None
    release = os.uname().release
    found = any((Path("/lib/modules") / release).glob("kernel/drivers/scsi/iscsi_tcp.ko*"))
    if not found:
        return (f"not available on this host: the kernel ({release}) has no iscsi_tcp module "
                "(kernel iSCSI initiator)")
    return "not available on this host: iscsi_tcp is not loaded (modprobe iscsi_tcp)"


def lun_of_storage(storage: pve.Storage, volume: str) -> dict[str, Any]:
    """A Proxmox VE iscsi (open-iscsi) or iscsidirect (libiscsi) storage as ``[target] iscsi``
    keys: its portal and target, the LUN named as Proxmox VE names its volumes (``lunN``; LUN 0
    when none is)."""
    found = re.match(r"^lun(\d{1,5})$", volume) if volume else None
    if volume and found is None:
        raise ValueError(f"storage {storage.id}: name the LUN as Proxmox VE does, "
                         f"{storage.id}:lunN (not {volume!r})")
    if not storage.portal or not storage.target:
        raise ValueError(f"storage {storage.id} ({storage.type}) names no portal or target")
    return {"portal": storage.portal, "target": storage.target,
            "lun": int(found.group(1)) if found else 0}


class IscsiKind(TargetKind):
    """``[target] iscsi``: one LUN (the module's docstring)."""

    keys = ("iscsi",)
    tools = ("qemu-img",)
    storage_types = ("iscsi", "iscsidirect")
    storage_volumes = True

    def of_storage(self, storage: pve.Storage, volume: str, pve_dir: Path, *,
                   mounted: Callable[[Path], bool] | None = None) -> dict[str, Any]:
        return {"iscsi": lun_of_storage(storage, volume)}

    def open(self, target: Target, *, keep: bool, author: Author) -> OpenTarget:
        return IscsiLun(target, keep=keep, author=author)

    def check_author(self, target: Target, author: Author) -> None:
        """The CHAP secret is proved to a portal the author chose only when they can read it."""
        assert target.iscsi is not None
        if target.iscsi.chap is not None:
            read_chap(target.iscsi.chap, author, target.iscsi.portal)

    def host_checks(self, probe: Probe) -> list[HostCheck]:
        """The kernel's initiator (iscsi_tcp) and tgtd (the iSCSI tests' target)."""
        problem = kernel_initiator_problem(module=probe.sysfs / "module" / "iscsi_tcp")
        tgtd = probe.which("tgtd")
        return [HostCheck(name="kernel iSCSI initiator (iscsi_tcp)", ok=problem is None,
                          detail=problem or ("iscsi_tcp is loaded: host mode measures a LUN "
                                             "this host is logged in to as its block device"),
                          hint=None),
                HostCheck(name="tgtd (iSCSI target)", ok=tgtd is not None,
                          detail=(f"{tgtd}: the iSCSI tests serve their LUN with it" if tgtd
                                  else "tgtd not found on PATH: the iSCSI tests are skipped"),
                          hint=None if tgtd else "./setup.sh --dev (installs tgt)")]
