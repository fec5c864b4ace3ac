"""A Ceph RBD pool as a run's target (``[target] rbd``): images iomatrix creates and removes
itself, reached through librbd by fio's rbd engine (host mode, as Ceph's own cbt measures) and by
QEMU's rbd driver (blocklayer and guest modes).

- **Connection.** The ``rbd`` command (ceph-common) makes, lists and removes images, given the
  monitors, the cephx user and the keyring on its command line; fio and QEMU read a ceph.conf
  iomatrix writes for the run in its private scratch directory (mode 0600): the monitors, the
  keyring's *path* and the timeouts. The key itself is only ever read by librbd, from the file
  the user named: it is in no argument, database row, report or note.
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
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from iomatrix.core.errors import TargetError, TargetUnreachable, ToolFailed
from iomatrix.core.proc import require, run
from iomatrix.core.units import format_bytes
from iomatrix.suite.model import Configuration, Target
from iomatrix.suite.network import RbdTarget
from iomatrix.target.network import NetworkTarget, NetworkVolume
from iomatrix.target.workspace import Image, memory_total, working_set_size

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


def connection(rbd: RbdTarget) -> dict[str, Any]:
    """What reaches the pool, as the store records it with each image: file paths and names,
    never a key."""
    return {k: v for k, v in {
        "pool": rbd.pool, "namespace": rbd.namespace,
        "conf": str(rbd.conf) if rbd.conf else None, "monitors": list(rbd.monitors) or None,
        "client": rbd.client, "keyring": str(rbd.keyring) if rbd.keyring else None,
        "connect_timeout": rbd.connect_timeout}.items() if v is not None}


def rbd_args(rbd: RbdTarget) -> list[str]:
    """The ``rbd`` command's connection options (before the subcommand)."""
    timeout = str(int(max(1, rbd.connect_timeout)))
    argv = ["--conf", str(rbd.conf) if rbd.conf else "/dev/null", "--id", rbd.client,
            "--client_mount_timeout", timeout, "--rados_mon_op_timeout", timeout,
            "--rados_osd_op_timeout", timeout]
    if rbd.monitors:
        argv += ["--mon_host", ",".join(rbd.monitors)]
    if rbd.keyring:
        argv += ["--keyring", str(rbd.keyring)]
    return argv


def _call(rbd: RbdTarget, *args: str,
          timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``rbd`` on the pool, whatever its exit status; ``TargetUnreachable`` when it did
    not finish in time."""
    limit = timeout if timeout is not None else rbd.connect_timeout * 2 + 30
    try:
        return run([require("rbd"), *rbd_args(rbd), *args], timeout=limit, check=False)
    except ToolFailed as exc:          # the command's own timeout
        raise TargetUnreachable(f"rbd pool {rbd.spec}: no answer within {limit:.0f} s "
                                f"({_where(rbd)})") from exc


def _rbd(rbd: RbdTarget, *args: str, timeout: float | None = None) -> str:
    """Run ``rbd`` on the pool; ``TargetUnreachable`` says in one line why it failed."""
    done = _call(rbd, *args, timeout=timeout)
    if done.returncode != 0:
        raise TargetUnreachable(_why(rbd, done.stderr or done.stdout or ""),
                                hint="check [target] rbd: monitors or conf, client, keyring, "
                                     "pool and namespace")
    return done.stdout


def _where(rbd: RbdTarget) -> str:
    mons = ",".join(rbd.monitors) if rbd.monitors else f"the monitors in {rbd.conf}"
    return f"monitors {mons}, client.{rbd.client}"


def _why(rbd: RbdTarget, stderr: str) -> str:
    """The one line a failed ``rbd`` command amounts to."""
    if "handle_auth_bad_method" in stderr or "(13) Permission denied" in stderr \
            or "(1) Operation not permitted" in stderr:
        key = f"the keyring {rbd.keyring}" if rbd.keyring else "its default keyring"
        return f"rbd pool {rbd.spec}: the cluster refused client.{rbd.client}'s key ({key})"
    if "(110) Connection timed out" in stderr or "couldn't connect" in stderr:
        return (f"rbd pool {rbd.spec}: no monitor answered within {rbd.connect_timeout:g} s "
                f"({_where(rbd)})")
    if "error opening pool" in stderr or "(2) No such file or directory" in stderr:
        what = f"namespace {rbd.namespace} in pool {rbd.pool}" if rbd.namespace else \
            f"pool {rbd.pool}"
        return f"rbd: the cluster has no {what} (or client.{rbd.client} may not see it)"
    last = [line for line in stderr.splitlines() if line.strip()]
    return f"rbd pool {rbd.spec}: " + (last[-1].strip()[:300] if last else "rbd failed")


def conf_value(conf: Path, key: str, sections: tuple[str, ...] = ("global",)) -> str:
    """A ceph.conf option (``mon_host`` and ``mon host`` alike) from the last of ``sections``
    that sets it; "" when none does."""
    try:
        text = conf.read_text()
    except OSError as exc:
        raise TargetError(f"[target] rbd conf {conf}: cannot read it ({exc.strerror})") from exc
    section, found = "", {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].split(";", 1)[0].strip()
        if line.startswith("["):
            section = line.strip("[] ").lower()
        elif "=" in line and section in sections:
            name, _, value = line.partition("=")
            if re.sub(r"[\s_]+", "_", name.strip().lower()) == key:
                found[section] = value.strip()
    return next((found[s] for s in reversed(sections) if s in found), "")


def monitors_of_conf(conf: Path) -> list[str]:
    """The monitors a ceph.conf names in [global] (``mon_host``), as pve-storage's
    get_monaddr_list reads them (v1:/v2: vectors reduced to host:port)."""
    out = []
    for item in re.split(r"[\s,]+", conf_value(conf, "mon_host")):
        item = re.sub(r"^\[?v\d:", "", item)
        item = re.sub(r"/\d+\]?$", "", item).rstrip("]")
        if item:
            out.append(item)
    return out


class RbdPool(NetworkTarget):
    """A run's images in a Ceph pool (the module's docstring)."""

    kind = "rbd"

    def __init__(self, target: Target, *, keep: bool = False, record: Any = None,
                 scratch: Path | None = None, proc_root: Path = Path("/proc")) -> None:
        super().__init__(target, keep=keep, record=record, scratch=scratch)
        assert target.rbd is not None
        self.rbd: RbdTarget = target.rbd
        self.run_label = "run"
        """Part of each image's name: the run's id once the runner knows it."""
        self._proc = proc_root
        self._token = secrets.token_hex(3)
        self._images: dict[tuple[str, int], Image] = {}
        self._made: list[str] = []
        self.conf: Path | None = None

    # -- lifecycle -------------------------------------------------------------------------
    def check(self, configs: Iterable[Configuration]) -> "RbdPool":
        configs = list(configs)
        self.raw_only(configs, "images in a pool are raw (as Proxmox VE and OpenStack use "
                               "them)")
        if self.rbd.krbd and any(c.mode == "guest" for c in configs):
            problem = krbd_problem()
            if problem is not None:
                raise TargetError(f"[target] rbd krbd = true: {problem}")
        if self.rbd.namespace and any(c.mode == "host" for c in configs):
            raise TargetError("[target] rbd namespace: fio's rbd engine cannot open an image in "
                              "a namespace (it has no such option), so the host baseline cannot "
                              "run", hint="set [method] baseline = false, or use a pool "
                                          "without a namespace")
        if not self.rbd.monitors and self.rbd.conf is not None \
                and not monitors_of_conf(self.rbd.conf):
            raise TargetError(f"[target] rbd conf {self.rbd.conf} names no monitors (mon_host "
                              "in [global])", hint="give [target] rbd monitors")
        memory = memory_total(self._proc / "meminfo")
        self.image_size = working_set_size(self.target, memory) or self.target.size
        _rbd(self.rbd, "ls", self.rbd.spec)
        self.notes = [f"target: rbd pool {self.rbd.spec} ({_where(self.rbd)}); iomatrix "
                      f"creates raw images of {format_bytes(self.image_size or 0)} named "
                      f"{PREFIX}<run>-… there and removes them at the end"]
        if any(c.mode == "host" for c in configs):
            self.notes.append(f"host (bare metal) on an rbd pool is {HOST_CLIENT} from this "
                              "host, as Ceph's cbt measures a pool: the cluster without QEMU")
        if any(c.cache not in (None, "none", "directsync", "writethrough") for c in configs):
            self.notes.append(CACHE_NOTE)
        return self

    def create(self) -> "RbdPool":
        """Write the run's ceph.conf for fio and QEMU into its scratch directory."""
        assert self.scratch is not None, "the runner gives a network target its scratch"
        monitors = self.rbd.monitors or tuple(monitors_of_conf(self.rbd.conf))  # type: ignore[arg-type]
        timeout = int(max(1, self.rbd.connect_timeout))
        lines = ["[global]", f"mon_host = {','.join(monitors)}",
                 f"client_mount_timeout = {timeout}", f"rados_mon_op_timeout = {timeout}",
                 "rbd_cache = false"]
        keyring = self.rbd.keyring or (self.rbd.conf and conf_value(
            self.rbd.conf, "keyring", ("global", "client", f"client.{self.rbd.client}")))
        if keyring:          # the user's file, by path: the key stays in it
            lines.append(f"keyring = {keyring}")
        self.conf = self.scratch / "ceph.conf"
        fd = os.open(self.conf, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write("\n".join(lines) + "\n")
        return self

    def close(self) -> None:
        """Remove every image this run made (unless keep)."""
        if self.keep:
            return
        for name in list(self._made):
            with contextlib.suppress(TargetError):
                _rbd(self.rbd, "rm", "--no-progress", f"{self.rbd.spec}/{name}")
                self._made.remove(name)

    # -- images ----------------------------------------------------------------------------
    @property
    def size(self) -> int:
        assert self.image_size is not None, "check() first"
        return self.image_size

    def images(self, config: Configuration) -> list[Image]:
        return [self.image(config, index) for index in range(config.vms or 1)]

    def image(self, config: Configuration, index: int = 0) -> Image:
        """The image for guest ``index`` (one image per guest index, shared by every
        configuration), created on first use."""
        key = ("raw", index)
        if key in self._images:
            return self._images[key]
        assert self.conf is not None, "create() first"
        name = f"{PREFIX}{self.run_label}-{self._token}-{index}"
        spec = f"{self.rbd.spec}/{name}"
        marker = ""
        if self.record is not None:
            marker = self.record(KIND, Path(spec), Path(json.dumps(connection(self.rbd),
                                                                    sort_keys=True)))
        _rbd(self.rbd, "create", "--size", f"{-(-self.size // (1 << 20))}M", spec,
             timeout=self.rbd.connect_timeout * 2 + 60)
        self._made.append(name)
        if marker:
            _rbd(self.rbd, "image-meta", "set", spec, OWNER_KEY, _marker_value(marker))
        image = Image(path=Path(f"rbd:{spec}"), format="raw", preallocation="off",
                      size=-(-self.size // (1 << 20)) << 20, network=self.volume(name))
        self._images[key] = image
        return image

    def volume(self, name: str) -> NetworkVolume:
        """How fio and QEMU reach image ``name`` (the run's ceph.conf holds the monitors, the
        keyring's path and the timeouts; QEMU also gets the monitors and auth as Proxmox VE
        gives them: pve-storage's RBDPlugin qemu_blockdev_options)."""
        assert self.conf is not None
        rbd = self.rbd
        node: dict[str, Any] = {"pool": rbd.pool, "image": name}
        if rbd.namespace:
            node["namespace"] = rbd.namespace
        node["conf"] = str(self.conf)
        monitors = rbd.monitors or tuple(monitors_of_conf(rbd.conf))  # type: ignore[arg-type]
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


def remove_recorded(path: str, within: str, marker: str, *, dry_run: bool = False) -> str:
    """Remove the image a killed run recorded (``path``: ``pool[/namespace]/name``;
    ``within``: the connection as recorded) when it is still iomatrix's: its name is the
    recorded one and its ``iomatrix.owner`` metadata is the record's marker, or it has none
    (killed between create and marking). Returns what was done: removed, would remove, gone,
    or left (with why). ``TargetUnreachable`` when the cluster cannot be reached."""
    try:
        rbd = RbdTarget.model_validate(json.loads(within))
    except (ValueError, TypeError) as exc:
        return f"left: the record's connection is not one iomatrix wrote ({exc})"
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


def _image_meta(rbd: RbdTarget, spec: str) -> str | None:
    """The image's ``iomatrix.owner`` metadata, None when it has none."""
    done = _call(rbd, "image-meta", "get", spec, OWNER_KEY)
    if done.returncode == 0:
        return done.stdout.strip()
    if "failed to get metadata" in done.stderr:       # the image has no such key
        return None
    raise TargetUnreachable(_why(rbd, done.stderr))
