"""A Ceph RBD pool as a run's target (``[target] rbd``): images iomatrix creates and removes
itself, reached through librbd by fio's rbd engine (host mode, as Ceph's own cbt measures) and by
QEMU's rbd driver (blocklayer and guest modes).

- **Connection.** No program is ever handed a user's ceph.conf (librados honours ``log_file``,
  ``admin_socket``, plugin directories...: whoever wrote the file would choose what root
  writes). iomatrix reads only the monitors, the fsid and the keyring's path from the ``conf``
  a suite names, and only if the file passes rule 1 (``core.trust``); every value checked
  (``locate``), it writes a ceph.conf of its own (mode 0600, in a private directory:
  ``conf_text``) for the ``rbd`` command (ceph-common: makes, lists and removes images), fio
  and QEMU. The keyring is a file of secrets under rule 1 (``core.trust.private_file``): the
  one named, else the first of librados' own defaults that exists, which iomatrix searches
  itself (its ceph.conf always names a keyring, ``/dev/null`` when there is none, so librados
  never searches); and when whoever could have written the suite or the store chose the
  monitors, they must be able to read it already (``remote.secret_for``). The key itself is
  only ever read by librados, from that file: it is in no argument, database row, report or
  note. A store's record of an image (``stored_location``) is checked the same
  way before ``clean`` reaches the pool with it.
- **Checked first.** ``check`` lists the pool within ``connect_timeout`` (``client_mount_timeout``
  and ``rados_mon_op_timeout``): a wrong monitor address, a refused key, a missing pool or
  namespace end the run in one line (``TargetUnreachable``) before anything is stored.
- **Own images only.** Each image is named ``iomatrix-<run>-<token>-<n>``, recorded in the store
  (kind ``rbd-image``, with the connection: paths only) before ``rbd create``, and carries the
  record's marker as image metadata (``iomatrix.owner``). ``close`` removes what this run made;
  ``remove_recorded`` removes what a killed run left, only when the name is the recorded one and
  its marker is the record's (or it has none: killed between create and marking). Nothing else
  in the pool is touched.
- **Cache.** QEMU sets librbd's ``rbd_cache`` from the cache mode (on for writeback and unsafe,
  off for none, directsync, writethrough: block/rbd.c); the run's ceph.conf turns it off for
  fio's rbd engine, so the host baseline has no client cache. librbd's cache is RAM in the
  client, as the page cache is: figures with it can measure memory.
- **aio** is not evaluated: QEMU's rbd driver has no aio option (librbd completes requests on
  its own threads, and Proxmox VE passes none), so every aio value would measure the same.
- **krbd** (``krbd = true``) needs the kernel's rbd module to map images as /dev/rbd*; a host
  without it is refused with the reason (``krbd_problem``)."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import secrets
import stat
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import Field, TypeAdapter

from iomatrix.core.dirs import private_tempdir
from iomatrix.core.errors import IomatrixError, TargetError, TargetUnreachable, ToolFailed
from iomatrix.core.model import Frozen
from iomatrix.core.proc import require, run
from iomatrix.core.trust import US, Author, chosen_by_us, private_file
from iomatrix.core.units import format_bytes
from iomatrix.platform import proxmox as pve
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.target import Target
from iomatrix.suite.target import CephFile, CephName, Monitor, RbdTarget
from iomatrix.targets.kind import (HostCheck, Image, NetworkVolume, OpenTarget, Probe, Recorder,
                                   Resource, TargetKind)
from iomatrix.targets.remote import NetworkTarget, secret_for
from iomatrix.targets.workspace import memory_total, working_set_size
from iomatrix.vocab.words import Mode

KIND = "rbd-image"
"""The store's resource kind of an image iomatrix created."""
PREFIX = "iomatrix-"
OWNER_KEY = "iomatrix.owner"
"""The image metadata key holding the marker of the record that made it."""
CACHE_NOTE = ("librbd's cache (rbd_cache) follows the cache mode as QEMU sets it: on for "
              "writeback and unsafe, off for none, directsync and writethrough; it is the "
              "client's RAM, so figures with it on can measure memory rather than the cluster")
HOST_CLIENT = "fio's rbd engine (librbd, rbd_cache off)"
RBD_MODULES = ("rbd.ko", "rbd.ko.xz", "rbd.ko.zst", "rbd.ko.gz")
MONITOR = TypeAdapter(Monitor)
CEPH_FILE = TypeAdapter(CephFile)


def krbd_problem(*, sysfs: Path = Path("/sys"), modules: Path | None = None) -> str | None:
    """Why this host cannot map RBD images in the kernel (krbd); None when it can (the module
    loaded, /sys/bus/rbd, or present to load)."""
    if (sysfs / "bus" / "rbd").exists():
        return None
    release = platform.release()
    tree = modules or Path("/lib/modules") / release
    if any(tree.rglob("rbd.ko*")) if tree.is_dir() else False:
        return None
    return (f"not available on this host: the kernel ({release}) has no rbd module "
            "(/sys/bus/rbd is missing and /lib/modules has no rbd.ko), so images cannot be "
            "mapped as /dev/rbd*; librbd (krbd = false) works without it")


FSID = r"^[0-9A-Fa-f]{8}-(?:[0-9A-Fa-f]{4}-){3}[0-9A-Fa-f]{12}$"
CONF_MAX = 1 << 20
"""The largest ceph.conf iomatrix reads the monitors from."""
DEFAULT_KEYRINGS = ("/etc/ceph/$cluster.$name.keyring,/etc/ceph/$cluster.keyring,"
                    "/etc/ceph/keyring,/etc/ceph/keyring.bin")
"""librados' own ``keyring`` default (``ceph-conf --show-config-value keyring``): searched by
iomatrix (``locate``), whose ceph.conf then names the one found, or ``NO_KEYRING``."""
NO_KEYRING = "/dev/null"
"""The keyring iomatrix's ceph.conf names when there is none to use: an empty one (the client
offers no key), so librados never searches its defaults itself."""
TIMEOUTS = ("client_mount_timeout", "rados_mon_op_timeout")
"""The ceph.conf options that bound how long a client waits for the monitors."""


class RbdLocation(Frozen):
    """Where a pool is and how iomatrix reaches it, every value checked (``locate``): what the
    ceph.conf iomatrix writes for rbd, fio and QEMU holds (``conf_text``), and what the store
    records with each image (``connection``)."""

    pool: CephName
    namespace: CephName | None = None
    monitors: tuple[Monitor, ...] = Field(min_length=1, max_length=16)
    client: CephName
    keyring: CephFile | None = None
    connect_timeout: float = Field(gt=0, le=600)
    fsid: str | None = Field(default=None, pattern=FSID)
    conf: Path | None = None
    """The user's ceph.conf the monitors were read from (None when they were given): named in
    messages, never handed to a program."""

    @property
    def spec(self) -> str:
        return "/".join(p for p in (self.pool, self.namespace) if p)


class _Read(NamedTuple):
    """What iomatrix takes from a user's ceph.conf (``read_conf``), and nothing else."""

    monitors: tuple[str, ...] = ()
    fsid: str | None = None
    keyring: Path | None = None


def locate(rbd: RbdTarget, *, key: str = "[target] rbd", fsid: str | None = None,
           author: Author = US) -> RbdLocation:
    """How iomatrix reaches ``rbd`` (a suite's [target] rbd, or one a store recorded: ``key``
    names where it came from in refusals). Its ``conf`` is read only if it passes rule 1
    (``core.trust.chosen_by_us``), and only for its monitors, fsid and keyring's path; the
    keyring (the one named, else the first of librados' own search that exists,
    ``DEFAULT_KEYRINGS``: librados never searches) is a file of secrets
    (``core.trust.private_file``). When ``author`` (who wrote the suite or the store) chose the
    monitors (``monitors``, not a conf that passes rule 1), it must be able to read the keyring
    already (``remote.secret_for``): else its own monitors would get the key's proof.
    ``UntrustedFile`` or ``TargetError`` in one line."""
    read = read_conf(rbd.conf, rbd.client, f"{key} conf") if rbd.conf is not None else _Read()
    monitors = rbd.monitors or read.monitors
    if not monitors:
        raise TargetError(f"{key} conf {rbd.conf} names no monitors (mon_host in [global], "
                          "mon_addr in [mon.*])", hint=f"give {key} monitors")
    if rbd.keyring is not None:
        named = f"{key} keyring"
        keyring = private_file(rbd.keyring, named, "librados")
    elif read.keyring is not None:
        named = f"{key} conf {rbd.conf}: keyring"
        keyring = private_file(read.keyring, named, "librados")
    else:
        default = _keyring([DEFAULT_KEYRINGS], rbd.client, f"{key} keyring")
        named = f"{key} keyring (none named: librados' default {default})"
        keyring = None if default is None else private_file(default, named, "librados")
    if keyring is not None and rbd.monitors:
        secret_for(keyring, named, author, f"the monitors {', '.join(rbd.monitors)}")
    try:
        return RbdLocation(pool=rbd.pool, namespace=rbd.namespace, monitors=monitors,
                           client=rbd.client, keyring=keyring, fsid=fsid or read.fsid,
                           connect_timeout=rbd.connect_timeout,
                           conf=None if rbd.monitors else rbd.conf)
    except ValueError as exc:
        raise TargetError(f"{key} conf {rbd.conf}: {_first_error(exc)}") from None


def _first_error(exc: ValueError) -> str:
    errors = getattr(exc, "errors", None)
    if errors is None:
        return str(exc).splitlines()[0]
    first = errors()[0]
    where = ".".join(map(str, first["loc"]))
    return (f"{where}: " if where else "") + first["msg"].removeprefix("Value error, ")


def read_conf(conf: Path, client: str, key: str) -> _Read:
    """The monitors (``mon_host`` in [global], else ``mon_addr`` of each [mon.*]), the fsid and
    the keyring's path (in [global], [client] or [client.NAME]) a user's ceph.conf names, each
    checked; every other option in it is ignored. The file is read only if it passes rule 1."""
    found = _options(_conf_text_of(chosen_by_us(conf, key, "librados"), key), client)
    monitors: dict[str, None] = {}
    for name in ("mon_host", "mon_addr"):
        for value in found.get(name, []):
            for item in re.findall(r"\[v\d+:.*?\](?=[\s,;]|$)|[^\s,;]+", value):
                if item.startswith("[v"):      # one monitor's addresses: its v2 one
                    vector = item[1:-1].split(",")
                    item = next((a for a in vector if a.startswith("v2:")), vector[0])
                monitors[_monitor_of(item, f"{key} {conf}: {name}")] = None
        if monitors:
            break
    fsid = found.get("fsid", [None])[-1]
    if fsid is not None and not re.match(FSID, fsid):
        raise TargetError(f"{key} {conf}: fsid {fsid[:60]!r} is not a UUID")
    return _Read(tuple(monitors), fsid, _keyring(found.get("keyring", []), client,
                                                  f"{key} {conf}: keyring"))


def _conf_text_of(conf: Path, key: str) -> str:
    """The text of the regular file ``conf`` (a FIFO or device is never read), at most
    ``CONF_MAX`` bytes; ``TargetError`` in one line otherwise."""
    try:
        fd = os.open(conf, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise TargetError(f"{key} {conf}: cannot read it ({exc.strerror})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise TargetError(f"{key} {conf}: not a regular file")
    with os.fdopen(fd, "rb") as f:
        try:
            data = f.read(CONF_MAX + 1)
        except OSError as exc:
            raise TargetError(f"{key} {conf}: cannot read it ({exc.strerror})") from None
    if len(data) > CONF_MAX:
        raise TargetError(f"{key} {conf}: over {CONF_MAX >> 20} MiB, not a ceph.conf")
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise TargetError(f"{key} {conf}: not UTF-8 text") from None


def _options(text: str, client: str) -> dict[str, list[str]]:
    """The values of the options iomatrix reads from a ceph.conf, in the order the file sets
    them (a keyring of a more particular section last)."""
    wanted = {"global": ("mon_host", "fsid", "keyring"), "client": ("keyring",),
              f"client.{client}": ("keyring",)}
    rank = {name: i for i, name in enumerate(wanted)}
    section, found = "", []
    for raw in text.splitlines():
        line = re.split(r"[#;]", raw, maxsplit=1)[0].strip()
        if line.startswith("["):
            section = line.strip("[] ")
            continue
        name, equals, value = line.partition("=")
        name = re.sub(r"[\s_-]+", "_", name.strip().lower())
        if equals and (name in wanted.get(section, ()) or
                       section.startswith("mon.") and name == "mon_addr"):
            found.append((rank.get(section, 0), name, value.strip().strip('"')))
    out: dict[str, list[str]] = {}
    for _, name, value in sorted(found, key=lambda f: f[0]):
        out.setdefault(name, []).append(value)
    if "mon_host" in out:
        out["mon_host"] = out["mon_host"][-1:]          # the last one set counts
    return out


def _monitor_of(address: str, where: str) -> str:
    """``host:port`` (``[v6]:port``) of one monitor address of a ceph.conf (``v2:``/``v1:``
    and ``/nonce`` dropped, as pve-storage's get_monaddr_list reads them), checked."""
    plain = re.sub(r"/\d+$", "", re.sub(r"^v\d+:", "", address))
    try:
        return MONITOR.validate_python(plain)
    except ValueError:
        raise TargetError(f"{where} {address[:80]!r} is not a monitor address (host, "
                          "host:port, v2:host:port, [IPv6]:port)") from None


def _keyring(values: list[str], client: str, where: str) -> Path | None:
    """The keyring a ceph.conf names (the last ``keyring`` of the most particular section, a
    list of files of which the first that exists counts, ``$cluster``, ``$name``, ``$id`` and
    ``$type`` filled in as librados does for this client), checked as a path given to Ceph;
    None when it names none that exists."""
    if not values:
        return None
    meta = {"cluster": "ceph", "name": f"client.{client}", "id": client, "type": "client"}
    for item in values[-1].split(","):
        path = re.sub(r"\$\{?(cluster|name|id|type)\}?", lambda m: meta[m.group(1)],
                      item.strip())
        if path and "$" not in path and os.path.lexists(path):
            try:
                return CEPH_FILE.validate_python(path)
            except ValueError as exc:
                raise TargetError(f"{where} {path[:200]!r}: {_first_error(exc)}") from None
    return None


def conf_text(loc: RbdLocation, **more: str) -> str:
    """The ceph.conf iomatrix writes for ``loc`` (its monitors, fsid, keyring's path and
    timeouts, and ``more``): the only one it hands to rbd, fio or QEMU."""
    timeout = str(int(max(1, loc.connect_timeout)))
    options = {"mon_host": ",".join(loc.monitors), "fsid": loc.fsid,
               "keyring": str(loc.keyring) if loc.keyring else NO_KEYRING,
               **dict.fromkeys(TIMEOUTS, timeout), **more}
    return "[global]\n" + "".join(f"{k} = {v}\n" for k, v in options.items() if v is not None)


def write_conf(path: Path, text: str) -> Path:
    """``text`` as a new file ``path`` (mode 0600) in a private directory."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    return path


def connection(loc: RbdLocation) -> dict[str, Any]:
    """What reaches the pool, as the store records it with each image (``stored_location``
    reads it back): checked values and the keyring's path, never a key or a user's conf."""
    return {k: v for k, v in {
        "pool": loc.pool, "namespace": loc.namespace, "monitors": list(loc.monitors),
        "client": loc.client, "keyring": str(loc.keyring) if loc.keyring else None,
        "connect_timeout": loc.connect_timeout, "fsid": loc.fsid}.items() if v is not None}


STORED_MAX = 16384
"""The longest connection a store's row may hold."""


def stored_location(text: str, author: Author = US) -> RbdLocation:
    """The location a store's ``resources`` row of kind ``rbd-image`` records (``within``: the
    JSON ``connection`` wrote, or an older run's with a ``conf``), checked as a suite's
    [target] rbd is (``locate``) written by ``author``, who could have written the store: a
    conf it names is read for its monitors alone, and only if it passes rule 1, and a keyring
    it pairs with monitors must be one ``author`` can read. ``ValueError`` (one line) when the
    text is not such a record; ``UntrustedFile`` or ``TargetError`` when a file it names may
    not be used."""
    try:
        data = json.loads(text) if len(text) <= STORED_MAX else None
        if not isinstance(data, dict):
            raise ValueError("not a JSON object of at most 16 KiB")
        fsid = data.pop("fsid", None)
        if fsid is not None and not (isinstance(fsid, str) and re.match(FSID, fsid)):
            raise ValueError("fsid: not a UUID")
        rbd = RbdTarget.model_validate(data)
    except ValueError as exc:
        raise ValueError(_first_error(exc)) from None
    return locate(rbd, key="resources.within", fsid=fsid, author=author)


def rbd_args(loc: RbdLocation, conf: Path) -> list[str]:
    """The ``rbd`` command's connection options (before the subcommand): iomatrix's own
    ``conf`` (``conf_text``) and the client."""
    return ["--conf", str(conf), "--id", loc.client]


def _call(loc: RbdLocation, *args: str,
          timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``rbd`` on the pool with a ceph.conf of iomatrix's own (in a private directory, no
    other user's file), whatever its exit status; ``TargetUnreachable`` when it did not finish
    in time."""
    limit = timeout if timeout is not None else loc.connect_timeout * 2 + 30
    osd = str(int(max(1, loc.connect_timeout)))
    with private_tempdir("iomatrix-ceph-") as where:
        conf = write_conf(where / "ceph.conf", conf_text(loc, rados_osd_op_timeout=osd))
        try:
            return run([require("rbd"), *rbd_args(loc, conf), *args], timeout=limit,
                       check=False)
        except ToolFailed as exc:          # the command's own timeout
            raise TargetUnreachable(f"rbd pool {loc.spec}: no answer within {limit:.0f} s "
                                    f"({_where(loc)})") from exc


def _rbd(loc: RbdLocation, *args: str, timeout: float | None = None) -> str:
    """Run ``rbd`` on the pool; ``TargetUnreachable`` says in one line why it failed."""
    done = _call(loc, *args, timeout=timeout)
    if done.returncode != 0:
        raise TargetUnreachable(_why(loc, done.stderr or done.stdout or ""),
                                hint="check [target] rbd: monitors or conf, client, keyring, "
                                     "pool and namespace")
    return done.stdout


def _where(loc: RbdLocation) -> str:
    mons = ",".join(loc.monitors)
    return (f"the monitors in {loc.conf} ({mons})" if loc.conf else f"monitors {mons}") + \
        f", client.{loc.client}"


def _why(loc: RbdLocation, stderr: str) -> str:
    """The one line a failed ``rbd`` command amounts to."""
    if "handle_auth_bad_method" in stderr or "(13) Permission denied" in stderr \
            or "(1) Operation not permitted" in stderr:
        key = f"the keyring {loc.keyring}" if loc.keyring else "no keyring"
        return f"rbd pool {loc.spec}: the cluster refused client.{loc.client}'s key ({key})"
    if "(110) Connection timed out" in stderr or "couldn't connect" in stderr:
        return (f"rbd pool {loc.spec}: no monitor answered within {loc.connect_timeout:g} s "
                f"({_where(loc)})")
    if "error opening pool" in stderr or "(2) No such file or directory" in stderr:
        what = f"namespace {loc.namespace} in pool {loc.pool}" if loc.namespace else \
            f"pool {loc.pool}"
        return f"rbd: the cluster has no {what} (or client.{loc.client} may not see it)"
    last = [line for line in stderr.splitlines() if line.strip()]
    return f"rbd pool {loc.spec}: " + (last[-1].strip()[:300] if last else "rbd failed")


class RbdPool(NetworkTarget):
    """A run's images in a Ceph pool (the module's docstring)."""

    kind = "rbd"

    def __init__(self, target: Target, *, keep: bool = False, record: Any = None,
                 scratch: Path | None = None, proc_root: Path = Path("/proc"),
                 author: Author = US) -> None:
        super().__init__(target, keep=keep, record=record, scratch=scratch, author=author)
        assert target.rbd is not None
        self.rbd: RbdTarget = target.rbd
        self.run_label = "run"
        """Part of each image's name: the run's id once the runner knows it."""
        self._proc = proc_root
        self._token = secrets.token_hex(3)
        self._images: dict[tuple[str, int], Image] = {}
        self._made: list[str] = []
        self.location: RbdLocation | None = None
        """How iomatrix reaches the pool, once ``check`` has checked it."""
        self.conf: Path | None = None
        """The ceph.conf iomatrix writes for fio and QEMU (``create``)."""

    # -- lifecycle -------------------------------------------------------------------------
    def check(self, configs: Iterable[Configuration]) -> "RbdPool":
        configs = list(configs)
        self.raw_only(configs, "images in a pool are raw (as Proxmox VE and OpenStack use "
                               "them)")
        if self.rbd.krbd and any(c.mode == Mode.GUEST for c in configs):
            problem = krbd_problem()
            if problem is not None:
                raise TargetError(f"[target] rbd krbd = true: {problem}")
        if self.rbd.namespace and any(c.mode == Mode.HOST for c in configs):
            raise TargetError("[target] rbd namespace: fio's rbd engine cannot open an image in "
                              "a namespace (it has no such option), so the host baseline cannot "
                              "run", hint="set [method] baseline = false, or use a pool "
                                          "without a namespace")
        loc = self.location = locate(self.rbd, author=self.author)
        memory = memory_total(self._proc / "meminfo")
        self.image_size = working_set_size(self.target, memory) or self.target.size
        _rbd(loc, "ls", loc.spec)
        self.notes = [f"target: rbd pool {loc.spec} ({_where(loc)}); iomatrix "
                      f"creates raw images of {format_bytes(self.image_size or 0)} named "
                      f"{PREFIX}<run>-… there and removes them at the end"]
        if any(c.mode == Mode.HOST for c in configs):
            self.notes.append(f"host (bare metal) on an rbd pool is {HOST_CLIENT} from this "
                              "host, as Ceph's cbt measures a pool: the cluster without QEMU")
        if any(c.cache not in (None, "none", "directsync", "writethrough") for c in configs):
            self.notes.append(CACHE_NOTE)
        return self

    def create(self) -> "RbdPool":
        """Write the run's ceph.conf for fio and QEMU into its private scratch directory: the
        keyring by its path (the key stays in it), librbd's cache off for fio's rbd engine."""
        assert self.scratch is not None, "the runner gives a network target its scratch"
        assert self.location is not None, "check() first"
        self.conf = write_conf(self.scratch / "ceph.conf",
                               conf_text(self.location, rbd_cache="false"))
        return self

    def close(self) -> None:
        """Remove every image this run made (unless keep)."""
        if self.keep:
            return
        for name in list(self._made):
            with contextlib.suppress(TargetError):
                assert self.location is not None
                _rbd(self.location, "rm", "--no-progress", f"{self.location.spec}/{name}")
                self._made.remove(name)

    def for_run(self, *, record: Recorder | None, scratch: Path, run_id: int) -> None:
        super().for_run(record=record, scratch=scratch, run_id=run_id)
        self.run_label = str(run_id)

    def host_fields(self) -> dict[str, str]:
        return {"target": f"rbd pool {self.rbd.spec}"}

    def node_client(self) -> str | None:
        """The ceph.conf of this host's fio (the monitors, fsid, keyring's path and timeouts
        ``check`` checked; librbd's cache off), which each node's fio server reads: the keyring
        at the same path on every node, as Proxmox VE keeps it (/etc/pve/priv/ceph)."""
        assert self.location is not None, "check() first"
        return conf_text(self.location, rbd_cache="false")

    # -- images ----------------------------------------------------------------------------
    def image(self, config: Configuration, index: int = 0) -> Image:
        """The image for guest ``index`` (one image per guest index, shared by every
        configuration), created on first use."""
        key = ("raw", index)
        if key in self._images:
            return self._images[key]
        assert self.conf is not None and self.location is not None, "create() first"
        loc = self.location
        name = f"{PREFIX}{self.run_label}-{self._token}-{index}"
        spec = f"{loc.spec}/{name}"
        marker = ""
        if self.record is not None:
            marker = self.record(KIND, Path(spec), Path(json.dumps(connection(loc),
                                                                    sort_keys=True)))
        _rbd(loc, "create", "--size", f"{-(-self.size // (1 << 20))}M", spec,
             timeout=loc.connect_timeout * 2 + 60)
        self._made.append(name)
        if marker:
            _rbd(loc, "image-meta", "set", spec, OWNER_KEY, _marker_value(marker))
        image = Image(path=Path(f"rbd:{spec}"), format="raw", preallocation="off",
                      size=-(-self.size // (1 << 20)) << 20, network=self.volume(name))
        self._images[key] = image
        return image

    def volume(self, name: str) -> NetworkVolume:
        """How fio and QEMU reach image ``name`` (the run's ceph.conf holds the monitors, the
        keyring's path and the timeouts; QEMU also gets the monitors and auth as Proxmox VE
        gives them: pve-storage's RBDPlugin qemu_blockdev_options)."""
        assert self.conf is not None and self.location is not None
        rbd = self.location
        node: dict[str, Any] = {"pool": rbd.pool, "image": name}
        if rbd.namespace:
            node["namespace"] = rbd.namespace
        node["conf"] = str(self.conf)
        monitors = rbd.monitors
        node["server"] = [{"host": h, "port": p or "3300"} for h, p in map(_host_port, monitors)]
        auth = "cephx" if rbd.keyring else None
        if auth:
            node["auth-client-required"] = [auth]
        node["user"] = rbd.client
        spec = "/".join(p for p in (rbd.pool, rbd.namespace, name) if p)
        listed = ";".join((f"[{h}]" if ":" in h else h) + (f":{p}" if p else "")
                          for h, p in map(_host_port, monitors)).replace(":", "\\:")
        drive_file = (f"rbd:{spec}:conf={self.conf}:mon_host={listed}"
                      + (f":auth_supported={auth}" if auth else "") + f":id={rbd.client}")
        return NetworkVolume(
            protocol="rbd", name=spec, node=node, drive_file=drive_file,
            fio={"ioengine": "rbd", "clientname": rbd.client, "pool": rbd.pool,
                 "rbdname": name},
            env={"CEPH_CONF": str(self.conf)}, client=HOST_CLIENT)


def _host_port(address: str) -> tuple[str, str | None]:
    bracketed = re.match(r"^\[([^\]]+)\](?::(\d+))?$", address)
    if bracketed:
        return bracketed.group(1), bracketed.group(2)
    host, _, port = address.partition(":")
    return host, port or None


def _marker_value(marker: str) -> str:
    """The record's marker (which names the record and its process) as one metadata value."""
    return " ".join(marker.split())[:500]


def remove_recorded(path: str, within: str, marker: str, *, dry_run: bool = False,
                    author: Author = US) -> str:
    """Remove the image a killed run recorded (``path``: ``pool[/namespace]/name``;
    ``within``: the connection as recorded, in a store ``author`` could have written:
    ``stored_location``) when it is still iomatrix's: its name is the recorded one and its
    ``iomatrix.owner`` metadata is the record's marker, or it has none (killed between create
    and marking). Returns what was done: removed, would remove, gone, or left (with why).
    ``TargetUnreachable`` when the cluster cannot be reached."""
    try:
        rbd = stored_location(within, author)
    except ValueError as exc:
        return f"left: the record's connection is not one iomatrix writes ({exc})"
    except IomatrixError as exc:          # a file it names fails rule 1, say: never used
        return f"left: never handed to rbd: {exc}"
    name = path.rsplit("/", 1)[-1]
    if not name.startswith(PREFIX) or path.rsplit("/", 1)[0] != rbd.spec:
        return "left: not an image name iomatrix gives"
    if name not in _rbd(rbd, "ls", rbd.spec).split():
        return "gone"
    meta = _image_meta(rbd, path)
    if meta is not None and meta != _marker_value(marker):
        return f"left: its {OWNER_KEY} metadata is not this record's"
    if dry_run:
        return "would remove"
    _rbd(rbd, "rm", "--no-progress", path, timeout=rbd.connect_timeout * 2 + 120)
    return "removed"


def _image_meta(rbd: RbdLocation, spec: str) -> str | None:
    """The image's ``iomatrix.owner`` metadata, None when it has none."""
    done = _call(rbd, "image-meta", "get", spec, OWNER_KEY)
    if done.returncode == 0:
        return done.stdout.strip()
    if "failed to get metadata" in done.stderr:       # the image has no such key
        return None
    raise TargetUnreachable(_why(rbd, done.stderr))


def rbd_of_storage(storage: pve.Storage, pve_dir: Path) -> dict[str, Any]:
    """A Proxmox VE rbd storage as ``[target] rbd`` keys, as pve-storage's CephConfig.pm
    ceph_connect_option connects: the keyring ``priv/ceph/ID.keyring`` in ``pve_dir`` where it
    exists (else no cephx), the configuration ``priv/ceph/ID.conf`` for an external cluster
    (monhost), ``ceph.conf`` there for one Proxmox VE manages; user ``username`` or admin;
    pool ``rbd`` when none is named."""
    out: dict[str, Any] = {"pool": storage.pool or "rbd", "client": storage.username or "admin",
                           "krbd": storage.krbd}
    if storage.namespace:
        out["namespace"] = storage.namespace
    priv = pve_dir / "priv" / "ceph"
    if storage.monhost:
        out["monitors"] = [m for m in re.split(r"[,;\s]+", storage.monhost.strip()) if m]
        if (priv / f"{storage.id}.conf").exists():
            out["conf"] = str(priv / f"{storage.id}.conf")
    else:
        out["conf"] = str(pve_dir / "ceph.conf")
    if (priv / f"{storage.id}.keyring").exists():
        out["keyring"] = str(priv / f"{storage.id}.keyring")
    return out


class RbdKind(TargetKind):
    """``[target] rbd``: a Ceph pool (the module's docstring)."""

    keys = ("rbd",)
    tools = ("rbd",)
    resource = Resource(kind=KIND, name="RBD image", remove=remove_recorded,
                        within_keys=frozenset({*RbdTarget.model_fields, "fsid"}),
                        within_max=STORED_MAX)
    storage_types = ("rbd",)

    def of_storage(self, storage: pve.Storage, volume: str, pve_dir: Path, *,
                   mounted: Callable[[Path], bool] | None = None) -> dict[str, Any]:
        return {"rbd": rbd_of_storage(storage, pve_dir)}

    def open(self, target: Target, *, keep: bool, author: Author) -> OpenTarget:
        return RbdPool(target, keep=keep, author=author)

    def check_author(self, target: Target, author: Author) -> None:
        """A key is sent to monitors the author chose only when they can read it already."""
        assert target.rbd is not None
        locate(target.rbd, author=author)

    def host_checks(self, probe: Probe) -> list[HostCheck]:
        """fio's rbd engine, the ``rbd`` command and the kernel's rbd module (krbd)."""
        out = []
        fio = probe.which("fio")
        if fio is None:
            out.append(HostCheck(name="fio rbd engine", ok=False,
                                 detail="fio not found on PATH", hint="apt-get install fio"))
        else:
            _, o, _ = probe.run([fio, "--enghelp"])
            engines = {line.strip() for line in o.splitlines()[1:] if line.strip()}
            out.append(HostCheck(
                name="fio rbd engine", ok="rbd" in engines,
                detail=("fio lists the rbd engine (librbd): host mode on an rbd target"
                        if "rbd" in engines else "fio has no rbd engine: host mode on "
                        "an rbd target cannot run"),
                hint=None if "rbd" in engines else "install Debian's fio (built with librbd)"))
        rbd = probe.which("rbd")
        out.append(HostCheck(name="rbd command", ok=rbd is not None,
                             detail=(f"{rbd}: makes and removes a run's images in a Ceph pool"
                                     if rbd else "rbd not found on PATH: an rbd target cannot "
                                     "be measured"),
                             hint=None if rbd else "apt-get install ceph-common"))
        problem = krbd_problem(sysfs=probe.sysfs)
        out.append(HostCheck(name="kernel rbd (krbd)", ok=problem is None,
                             detail=problem or ("the kernel can map RBD images (/dev/rbd*): rbd "
                                                "targets with krbd = true"), hint=None))
        return out
