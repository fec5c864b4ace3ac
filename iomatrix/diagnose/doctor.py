"""``iomatrix doctor``: can this host run iomatrix, and what is missing?

Every check is a real probe under a timeout, never a file-existence test: a tool is run and its
version line parsed, an fio engine does real direct I/O, the FUSE export is mounted, read and
unmounted, KVM boots a kernel (:mod:`iomatrix.appliance.probe`). Each probe cleans up what it made (temp
files, mounts, processes) before it returns. Nothing here prints or exits: the CLI renders the
:class:`Check` tuple.

Tools are looked up on the PATH of ``env`` (default: this process's environment), and run with
that environment, so a test can point PATH at an empty directory to see every tool missing.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


from iomatrix.core.dirs import private_tempdir
from iomatrix.core.errors import EnvironmentProblem, IomatrixError, ToolFailed
from iomatrix.core.mounts import force_unmount, fstype, is_mounted
from iomatrix.core.proc import (first_line, managed, private_network, read_text, run, stop,
                                wait_for, which)
from iomatrix.appliance.build import input_summary
from iomatrix.appliance.guestfio import guest_fio_status
from iomatrix.appliance.kernel import default_cache_dir
from iomatrix.appliance.probe import probe_kvm
from iomatrix.qemu.escape import qemu_escape
from iomatrix.core.model import Frozen

TOOL_TIMEOUT = 10.0
FIO_TIMEOUT = 30.0
FUSE_TIMEOUT = 10.0
FIO_PROBE_SIZE = 1024 * 1024


class Check(Frozen):
    """One doctor finding. ``required`` is False for what iomatrix can live without (KVM: guests
    then run under TCG). ``hint`` names the Debian package or the command that fixes a failure."""


    name: str
    ok: bool
    detail: str
    hint: str | None = None
    required: bool = True
    version: str | None = None


@dataclass(frozen=True)
class _Tool:
    package: str
    version_re: str
    label: str


TOOLS: dict[str, _Tool] = {
    "qemu-system-x86_64": _Tool("qemu-system-x86", r"QEMU emulator version (\S+)", "QEMU"),
    "qemu-storage-daemon": _Tool("qemu-system-common", r"qemu-storage-daemon version (\S+)",
                                 "qemu-storage-daemon"),
    "qemu-img": _Tool("qemu-utils", r"qemu-img version (\S+)", "qemu-img"),
    "fio": _Tool("fio", r"^fio-(\S+)", "fio"),
}


def run_checks(kvm_timeout: float = 10.0, *, env: Mapping[str, str] | None = None,
               directory: Path | None = None, kernel: Path | None = None,
               fetch: bool = True, drift: bool = False,
               libvirt: bool = False) -> tuple[Check, ...]:
    """Every check, in a fixed order. ``directory`` is where the fio and FUSE probes make their
    temporary files (default: /var/tmp, which is disk-backed on Debian; O_DIRECT needs that).
    ``kernel`` is the KVM probe's (see :func:`iomatrix.appliance.probe.probe_kvm`); ``fetch``
    lets the KVM probe's kernel and the appliance's kernel and busybox be downloaded, as a run
    would. ``drift``: also estimate the host's drift (``check_drift``, about 30 s), last."""
    checks = [check_tool(tool, env=env) for tool in TOOLS]
    checks.append(check_fio_nbd(env=env))
    checks.append(check_fio_engine("libaio", env=env, directory=directory))
    checks.append(check_fio_engine("io_uring", env=env, directory=directory))
    checks.append(check_fuse(env=env, directory=directory))
    checks.append(check_kvm(kvm_timeout, env=env, kernel=kernel, fetch_kernel=fetch))
    checks.append(check_guest_channel(env=env))
    checks.append(check_guest_fio(env=env))
    checks.append(check_appliance(env=env, fetch=fetch))
    checks += check_storage_clients(env=env)
    if libvirt:
        checks.append(check_libvirt())
    if drift:
        checks.append(check_drift(env=env, directory=directory))
    return tuple(checks)


def check_libvirt(uri: str | None = None) -> Check:
    """Guests through libvirtd (``[method] libvirt_uri``): virsh installed, libvirtd answering;
    the domains that dead iomatrix runs left are destroyed here (and named). Not required."""
    from iomatrix.drivers import libvirt as lvd
    uri = uri or lvd.DEFAULT_URI
    hint = ("apt-get install libvirt-daemon-system; start libvirtd (`systemctl start libvirtd`, "
            "or `libvirtd -d` without systemd)")
    problem = lvd.libvirt_problem(uri)
    if problem is not None:
        return Check(name="libvirt", ok=False, required=False, detail=problem, hint=hint)
    notes = [lvd.describe(item) for item in lvd.reclaim_domains(uri)]
    kvm = Path("/dev/kvm")
    if kvm.exists():
        mode = kvm.stat().st_mode
        if mode & 0o060 == 0:
            notes.append("/dev/kvm is not group-accessible (mode "
                         f"{mode & 0o777:o}): libvirtd's QEMU user cannot use it and "
                         "libvirt 9.0 then probes QEMU again on every domain start (about 50 s "
                         "each); Debian's udev rule makes it root:kvm 0660")
    return Check(name="libvirt", ok=True, required=False, detail="; ".join(
        [f"libvirtd answers at {uri}"] + notes))


NETWORK_DRIVERS = ("rbd", "iscsi", "nfs")
"""QEMU's block drivers for network storage (Debian: qemu-block-extra; built into Proxmox VE's
QEMU): Ceph RBD through librbd, iSCSI through libiscsi, NFS through libnfs."""


def check_storage_clients(*, env: Mapping[str, str] | None = None,
                          sysfs: Path = Path("/sys")) -> list[Check]:
    """Which network storage this host can reach, for [target] rbd and the like: QEMU's block
    drivers (``qemu-img info --image-opts driver=X`` says "Unknown driver" for one it lacks,
    and anything else, here a missing option, for one it has: nothing is contacted), fio's rbd
    engine, the ``rbd`` command, the kernel's rbd module (krbd) and iSCSI initiator
    (iscsi_tcp), and tgtd (the iSCSI tests' target): each kind's ``TargetKind.host_checks``."""
    from iomatrix.targets.kind import Probe
    from iomatrix.targets.registry import host_checks

    out = []
    img = which("qemu-img", env)
    if img is None:
        out.append(Check(name="QEMU network block drivers", ok=False, required=False,
                         detail="qemu-img not found on PATH", hint="apt-get install qemu-utils"))
    else:
        have, lack = [], []
        for driver in NETWORK_DRIVERS:
            rc, o, e = _try_run([img, "info", "--image-opts", f"driver={driver}"],
                                timeout=TOOL_TIMEOUT, env=env)
            (lack if rc is None or rc == 127 or "Unknown driver" in o + e else have).append(driver)
        out.append(Check(name="QEMU network block drivers", ok=not lack, required=False,
                         detail=(f"has {', '.join(have) or 'none'}"
                                 + (f"; lacks {', '.join(lack)}" if lack else "")),
                         hint=None if not lack else "apt-get install qemu-block-extra"))
    probe = Probe(which=lambda tool: which(tool, env),
                  run=lambda argv: _try_run(argv, timeout=TOOL_TIMEOUT, env=env), sysfs=sysfs)
    out += [Check(**c.model_dump(), required=False) for c in host_checks(probe)]
    return out


def failed_required(checks: Sequence[Check]) -> tuple[Check, ...]:
    """The failed checks that iomatrix cannot do without."""
    return tuple(c for c in checks if c.required and not c.ok)


# --- tools ------------------------------------------------------------------------------------

def check_tool(tool: str, *, env: Mapping[str, str] | None = None) -> Check:
    """``tool --version`` runs and prints a version line iomatrix understands."""
    spec = TOOLS[tool]
    hint = f"apt-get install {spec.package}"
    path = which(tool, env)
    if path is None:
        return Check(name=tool, ok=False, detail=f"{tool} not found on PATH", hint=hint)
    rc, out, err = _try_run([path, "--version"], timeout=TOOL_TIMEOUT, env=env)
    text = out + err
    if rc != 0:
        return Check(name=tool, ok=False, hint=hint,
                     detail=f"`{tool} --version` " + _failure(rc, text, TOOL_TIMEOUT))
    m = re.search(spec.version_re, text, re.MULTILINE)
    if m is None:
        return Check(name=tool, ok=False, hint=hint,
                     detail=f"`{tool} --version` printed no version line: {first_line(text)!r}")
    version = m.group(1)
    package = re.search(r"\(([^)]*)\)", text[m.end():].split("\n", 1)[0])
    where = f" ({package.group(1)})" if package else ""
    return Check(name=tool, ok=True, version=version,
                 detail=f"{spec.label} {version}{where} at {path}")


def check_fio_nbd(*, env: Mapping[str, str] | None = None) -> Check:
    """fio lists the nbd engine and can load it (``--enghelp=nbd`` shows its ``uri`` option)."""
    name = "fio nbd engine"
    hint = "install Debian's fio package (built with libnbd): apt-get install fio"
    fio = which("fio", env)
    if fio is None:
        return Check(name=name, ok=False, detail="fio not found on PATH", hint="apt-get install fio")
    rc, out, err = _try_run([fio, "--enghelp"], timeout=TOOL_TIMEOUT, env=env)
    if rc != 0:
        return Check(name=name, ok=False, hint=hint,
                     detail="`fio --enghelp` " + _failure(rc, out + err, TOOL_TIMEOUT))
    engines = {line.strip() for line in out.splitlines()[1:] if line.strip()}
    if "nbd" not in engines:
        return Check(name=name, ok=False, hint=hint,
                     detail=f"fio lists {len(engines)} engines but not nbd")
    rc, out, err = _try_run([fio, "--enghelp=nbd"], timeout=TOOL_TIMEOUT, env=env)
    if rc != 0 or "uri" not in out:
        return Check(name=name, ok=False, hint=hint,
                     detail="fio lists nbd but cannot load it: "
                            + _failure(rc, out + err, TOOL_TIMEOUT))
    return Check(name=name, ok=True, detail="fio lists the nbd engine and loads it (option uri)")


def check_fio_engine(engine: str, *, env: Mapping[str, str] | None = None,
                     directory: Path | None = None) -> Check:
    """A real 1 MiB ``direct=1`` random-write job with ``ioengine=<engine>`` on a temp file."""
    hints = {
        "libaio": "fio needs libaio (apt-get install libaio1) and io_setup allowed (seccomp, "
                  "/proc/sys/fs/aio-max-nr)",
        "io_uring": "io_uring must be allowed: `sysctl kernel.io_uring_disabled=0`, no seccomp "
                    "filter blocking io_uring_setup, Linux >= 5.1",
    }
    hint = hints.get(engine)
    fio = which("fio", env)
    if fio is None:
        return Check(name=engine, ok=False, detail="fio not found on PATH",
                     hint="apt-get install fio")
    with _probe_tempdir("iomatrix-doctor-fio-", directory) as tmp:
        data = Path(tmp) / "probe.dat"
        result = Path(tmp) / "result.json"
        argv = [fio, "--name=iomatrix-doctor", f"--filename={data}", f"--size={FIO_PROBE_SIZE}",
                "--bs=4k", "--rw=randwrite", f"--ioengine={engine}", "--direct=1",
                "--iodepth=8", "--thread", "--eta=never", "--output-format=json",
                f"--output={result}"]
        rc, out, err = _try_run(argv, timeout=FIO_TIMEOUT, env=env, cwd=Path(tmp))
        report = result.read_text(errors="replace") if result.exists() else ""
    if rc != 0:
        if engine == "io_uring" and _io_uring_disabled():
            hint = "io_uring is disabled by sysctl: `sysctl kernel.io_uring_disabled=0`"
        return Check(name=engine, ok=False, hint=hint,
                     detail=f"fio ioengine={engine} direct=1 in {_probe_dir(directory)} "
                            + _failure(rc, err + out + report, FIO_TIMEOUT))
    try:
        job = json.loads(report[report.index("{"):])["jobs"][0]
        error = int(job["error"])
        written = int(job["write"]["io_bytes"])
        iops = float(job["write"]["iops"])
    except (ValueError, KeyError, IndexError, TypeError):
        return Check(name=engine, ok=False, hint=hint,
                     detail=f"fio ioengine={engine} printed no usable JSON result: "
                            f"{first_line(report or out)!r}")
    if error != 0 or written != FIO_PROBE_SIZE:
        return Check(name=engine, ok=False, hint=hint,
                     detail=f"fio ioengine={engine} direct=1 ended with error {error} after "
                            f"{written} of {FIO_PROBE_SIZE} bytes")
    return Check(name=engine, ok=True,
                 detail=f"fio ioengine={engine} direct=1 wrote 1 MiB in 4k random writes "
                        f"({iops:.0f} IOPS) in {_probe_dir(directory)}")


DRIFT_ROUNDS = 6
DRIFT_RUNTIME = 1.5
DRIFT_SIZE = 64 * 1024 * 1024


def _drift_iops(fio: str, data: Path, work: Path, direct: int,
                env: Mapping[str, str] | None) -> float | None:
    result = work / "drift.json"
    argv = [fio, "--name=iomatrix-drift", f"--filename={data}", f"--size={DRIFT_SIZE}",
            "--bs=4k", "--rw=randread", "--ioengine=libaio", f"--direct={direct}", "--iodepth=8",
            "--time_based", f"--runtime={DRIFT_RUNTIME}", "--thread", "--eta=never",
            "--output-format=json", f"--output={result}"]
    rc, _, _ = _try_run(argv, timeout=FIO_TIMEOUT, env=env, cwd=work)
    try:
        report = result.read_text(errors="replace")
        return float(json.loads(report[report.index("{"):])["jobs"][0]["read"]["iops"]) \
            if rc == 0 else None
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None


def _rounds_for(spread: float, target: float = 0.02, most: int = 1000) -> int:
    """Rounds n for a 95 % t-interval of a mean of values with standard deviation ``spread``
    to be within ±``target``: t(0.975; n−1)·spread/√n ≤ target (at least 3)."""
    from scipy import stats as scipy_stats

    for n in range(3, most + 1):
        if scipy_stats.t.ppf(0.975, n - 1) * spread / n ** 0.5 <= target:
            return n
    return most


def check_drift(*, env: Mapping[str, str] | None = None,
                directory: Path | None = None) -> Check:
    """The host's drift, in about 30 s: an A/A in miniature. The same fio job (4k random reads,
    QD8, 1.5 s, on a 64 MiB file in /var/tmp) runs twice per round as two "configurations", for
    6 interleaved rounds. Reported: the round-to-round spread of one of them (coefficient of
    variation: what drifts between samples minutes apart), the spread of the per-round log
    ratio of the two (what a gain paired by round still sees), and the rounds each needs for a
    95 % CI within ±2 %: a point's IOPS (unpaired) against a gain (paired by round)."""
    name = "drift"
    fio = which("fio", env)
    if fio is None:
        return Check(name=name, ok=False, required=False, detail="fio not found on PATH",
                     hint="apt-get install fio")
    import math

    with _probe_tempdir("iomatrix-doctor-drift-", directory) as tmp:
        work = Path(tmp)
        data = work / "drift.dat"
        with open(data, "wb") as f:   # written, so reads touch the storage
            block = os.urandom(1 << 20)
            for _ in range(DRIFT_SIZE >> 20):
                f.write(block)
        direct = 1
        if _drift_iops(fio, data, work, direct, env) is None:   # also warms up
            direct = 0
        a: list[float] = []
        b: list[float] = []
        for _ in range(DRIFT_ROUNDS):
            x, y = _drift_iops(fio, data, work, direct, env), _drift_iops(fio, data, work,
                                                                          direct, env)
            if x is None or y is None or x <= 0 or y <= 0:
                return Check(name=name, ok=False, required=False,
                             detail=f"fio could not run the drift probe in {work.parent}")
            a.append(x)
            b.append(y)
    mean = sum(a) / len(a)
    cv = math.sqrt(sum((x - mean) ** 2 for x in a) / (len(a) - 1)) / mean
    logs = [math.log(y / x) for x, y in zip(a, b)]
    lm = sum(logs) / len(logs)
    ratio_sd = math.sqrt(sum((v - lm) ** 2 for v in logs) / (len(logs) - 1))
    point_rounds, gain_rounds = _rounds_for(cv), _rounds_for(ratio_sd)
    return Check(name=name, ok=True, required=False, detail=(
        f"{DRIFT_ROUNDS} interleaved rounds of one job twice ({'direct' if direct else 'buffered'} "
        f"4k reads, QD8, {DRIFT_RUNTIME:g} s, {_probe_dir(directory)}): one point drifts "
        f"±{cv * 100:.1f} % between rounds (CV; range {min(a):,.0f}…{max(a):,.0f} IOPS), the "
        f"ratio of the two within a round ±{ratio_sd * 100:.1f} %. For a 95 % CI within ±2 %: "
        f"a point's IOPS needs ~{point_rounds} rounds, a gain paired by round ~{gain_rounds}"
        + (" (drift dominates: prefer shorter trials and more rounds, target_ci on gains)"
           if cv > 1.5 * ratio_sd else "")))


def _io_uring_disabled() -> bool:
    return read_text(Path("/proc/sys/kernel/io_uring_disabled")).strip() not in ("", "0")


# --- FUSE ----------------------------------------------------------------------------------------

def check_fuse(*, env: Mapping[str, str] | None = None, directory: Path | None = None) -> Check:
    """qemu-storage-daemon exports a small raw image over FUSE: the mount appears in
    /proc/self/mountinfo, serves the image's bytes, and is gone after the daemon's SIGTERM."""
    name = "FUSE export"
    qsd = which("qemu-storage-daemon", env)
    if qsd is None:
        return Check(name=name, ok=False, detail="qemu-storage-daemon not found on PATH",
                     hint="apt-get install qemu-system-common")
    if not Path("/dev/fuse").exists():
        return Check(name=name, ok=False, detail="/dev/fuse does not exist",
                     hint="modprobe fuse (in a container: pass --device /dev/fuse)")
    fusermount = which("fusermount3", env)
    if fusermount is None:
        return Check(name=name, ok=False, detail="fusermount3 not found on PATH",
                     hint="apt-get install fuse3")
    hint = "apt-get install fuse3; /dev/fuse must be usable (in a container: --device /dev/fuse " \
           "--cap-add SYS_ADMIN)"
    with _probe_tempdir("iomatrix-doctor-fuse-", directory) as tmp:
        work = Path(os.path.realpath(tmp))
        try:
            detail = _fuse_probe(qsd, fusermount, work, env)
        except _ProbeFailed as e:
            return Check(name=name, ok=False, detail=str(e), hint=hint)
    return Check(name=name, ok=True, detail=detail)


class _ProbeFailed(Exception):
    pass


_FUSE_PATTERN = b"iomatrix doctor FUSE probe\n"


def _fuse_probe(qsd: str, fusermount: str, work: Path, env: Mapping[str, str] | None) -> str:
    image = work / "disk.raw"
    with open(image, "wb") as f:
        f.write(_FUSE_PATTERN)
        f.truncate(FIO_PROBE_SIZE)
    mountpoint = work / "export.raw"
    mountpoint.touch()
    log = work / "qsd.log"
    argv = [
        qsd,
        "--blockdev", json.dumps({"driver": "file", "filename": str(image), "node-name": "f0"}),
        "--blockdev", json.dumps({"driver": "raw", "file": "f0", "node-name": "d0"}),
        "--export", f"type=fuse,id=e0,node-name=d0,mountpoint={qemu_escape(str(mountpoint))},"
                    "writable=on",
    ]
    try:
        with managed(argv, log=log, stop_timeout=FUSE_TIMEOUT, env=env) as proc:
            started = time.monotonic()
            wait_for(lambda: proc.poll() is not None or is_mounted(mountpoint),
                     timeout=FUSE_TIMEOUT, interval=0.05)
            kind = fstype(mountpoint)
            if kind is None:
                if proc.poll() is not None:
                    raise _ProbeFailed(f"qemu-storage-daemon exited with status {proc.returncode} "
                                       f"before the FUSE mount appeared: "
                                       f"{first_line(read_text(log)) or 'no message'}")
                raise _ProbeFailed(f"the FUSE mount did not appear in /proc/self/mountinfo within "
                                   f"{FUSE_TIMEOUT:g} s")
            mounted_after = time.monotonic() - started
            head, size = _read_through(mountpoint, proc)
            if size != FIO_PROBE_SIZE or head != _FUSE_PATTERN:
                raise _ProbeFailed(f"the FUSE export is mounted but serves the wrong data "
                                   f"(size {size}, first bytes {head[:16]!r})")
            stop(proc, timeout=FUSE_TIMEOUT)  # here, not on leaving the block: to see how it ends
            if proc.returncode == -signal.SIGKILL:
                raise _ProbeFailed(f"qemu-storage-daemon did not exit within {FUSE_TIMEOUT:g} s "
                                   "of SIGTERM")
            if proc.returncode != 0:
                raise _ProbeFailed(f"qemu-storage-daemon exited with status {proc.returncode} "
                                   f"after SIGTERM: {first_line(read_text(log)) or 'no message'}")
            if is_mounted(mountpoint):
                raise _ProbeFailed("the FUSE export was still mounted after qemu-storage-daemon "
                                   "exited")
    except ToolFailed as e:  # the daemon could not be started
        raise _ProbeFailed(str(e)) from e
    finally:
        force_unmount(mountpoint)  # the daemon was killed: detach the dead mount
    return (f"qemu-storage-daemon mounted a FUSE export ({kind}) in {mounted_after:.2f} s, "
            f"served the image's bytes, and unmounted it on SIGTERM")


def _read_through(mountpoint: Path, proc: subprocess.Popen[bytes]) -> tuple[bytes, int]:
    """Read the export's first bytes; a watchdog kills the daemon if the read hangs (which makes
    the kernel fail the FUSE request instead of blocking forever)."""
    watchdog = threading.Timer(FUSE_TIMEOUT, proc.kill)
    watchdog.start()
    try:
        with open(mountpoint, "rb") as f:
            head = f.read(len(_FUSE_PATTERN))
            size = os.fstat(f.fileno()).st_size
    except OSError as e:
        raise _ProbeFailed(f"the FUSE export is mounted but cannot be read: {e}") from e
    finally:
        watchdog.cancel()
    return head, size


# --- KVM -----------------------------------------------------------------------------------------

def check_kvm(timeout: float = 10.0, *, env: Mapping[str, str] | None = None,
              kernel: Path | None = None, fetch_kernel: bool = True) -> Check:
    """KVM boots a standard kernel (not required: iomatrix falls back to TCG)."""
    probe = probe_kvm(kernel, timeout=timeout, env=env, fetch_kernel=fetch_kernel)
    hint = probe.hint
    if not probe.usable and hint is None:
        hint = ("guests will run under TCG (emulated CPU); for real guest numbers use a host "
                "with hardware virtualization and access to /dev/kvm")
    return Check(name="KVM", ok=probe.usable, detail=probe.reason,
                 hint=None if probe.usable else hint, required=False)


# --- the guests' fio ---------------------------------------------------------------------------

def check_guest_fio(*, env: Mapping[str, str] | None = None) -> Check:
    """The guests' fio: the static build of the host's fio version with the patched server is
    cached, or can be built here (:mod:`iomatrix.appliance.guestfio`). Not required: without it
    the appliance carries the host's fio, and each guest trial costs about 1 s more."""
    status = guest_fio_status(default_cache_dir(), env)
    return Check(name="guest fio", ok=status.ok, detail=status.detail, required=False,
                 hint=None if status.ok else status.hint)


def check_appliance(*, env: Mapping[str, str] | None = None, fetch: bool = True) -> Check:
    """What a guest run builds its appliance from is here or can be fetched: fio, a kernel with
    the controllers' modules (built-in ones from ``modules.builtin``), a static busybox
    (:func:`iomatrix.appliance.build.input_summary`; ``fetch`` as a run would). Required: the
    guest trials of a run (``quick``'s among them) fail without it."""
    try:
        detail = input_summary(fetch=fetch, env=env)
    except (IomatrixError, OSError) as e:
        return Check(name="guest appliance", ok=False, detail=f"guest runs would fail: {e}",
                     hint=getattr(e, "hint", None) or "`iomatrix appliance build` says more")
    return Check(name="guest appliance", ok=True, detail=detail)


# --- the guests' channel -----------------------------------------------------------------------

CHANNEL_TIMEOUT = 10.0


def check_guest_channel(*, env: Mapping[str, str] | None = None) -> Check:
    """QEMU's forward to a guest's fio server is reachable only by iomatrix: QEMU started in a
    private network namespace (as guest sessions start it) forwards a port on 127.0.0.1 there,
    a connection from inside reaches it, and the same port on this host's loopback is closed.
    Not required: without it, runs go on with the guests on the host's loopback, and say so."""
    name = "guest channel"
    qemu = which("qemu-system-x86_64", env)
    if qemu is None:
        return Check(name=name, ok=False, required=False,
                     detail="qemu-system-x86_64 not found on PATH",
                     hint="apt-get install qemu-system-x86")
    from iomatrix.drivers.guest import free_port, shared_warning   # diagnose may import drivers

    with socket.socket() as outside, private_tempdir(
            "iomatrix-doctor-net-") as tmp:      # this socket stays in the host's namespace
        port = free_port()                              # a port nothing listens on out here
        try:
            with private_network():
                detail = _channel_probe(qemu, Path(tmp), outside, port, env)
        except EnvironmentProblem as exc:
            return Check(name=name, ok=False, required=False, detail=shared_warning(str(exc)),
                         hint=exc.hint)
        except _ProbeFailed as exc:
            return Check(name=name, ok=False, required=False, detail=str(exc),
                         hint="see the QEMU message; guests would fail to start the same way")
    return Check(name=name, ok=True, required=False, detail=detail)


def _channel_probe(qemu: str, work: Path, outside: socket.socket, port: int,
                   env: Mapping[str, str] | None) -> str:
    argv = [qemu, "-machine", "none", "-nodefaults", "-no-user-config", "-display", "none",
            "-netdev", f"user,id=n0,hostfwd=tcp:127.0.0.1:{port}-:{port}"]
    log = work / "qemu.log"
    try:
        with managed(argv, log=log, stop_timeout=CHANNEL_TIMEOUT, env=env) as proc:
            def listening() -> bool:
                with socket.socket() as inside, contextlib.suppress(OSError):
                    inside.connect(("127.0.0.1", port))
                    return True
                return proc.poll() is not None
            wait_for(listening, timeout=CHANNEL_TIMEOUT, interval=0.05)
            if proc.poll() is not None or not listening():
                raise _ProbeFailed(f"QEMU with a user-network forward did not listen in a "
                                   f"private network namespace: "
                                   f"{first_line(read_text(log)) or 'no message'}")
            try:
                outside.connect(("127.0.0.1", port))
            except ConnectionRefusedError:
                pass
            else:
                raise _ProbeFailed(f"port {port} on this host's loopback accepted a connection "
                                   "while QEMU forwarded it only in a private network namespace")
    except ToolFailed as exc:
        raise _ProbeFailed(str(exc)) from exc
    return ("each guest session gets a private network namespace: QEMU's forward to the "
            "guest's fio server is reachable there and not on this host's loopback")


# --- helpers -------------------------------------------------------------------------------------

def _probe_dir(directory: Path | None) -> str:
    if directory is not None:
        return str(directory)
    var_tmp = "/var/tmp"
    if os.path.isdir(var_tmp) and os.access(var_tmp, os.W_OK | os.X_OK):
        return var_tmp
    return tempfile.gettempdir()


def _probe_tempdir(prefix: str, directory: Path | None) -> contextlib.AbstractContextManager[Path]:
    """A private directory for a probe in ``_probe_dir``, refused (in one line) where another
    user controls it: as root, fio and QEMU write in it."""
    place = _probe_dir(directory)
    return private_tempdir(prefix, None if place == tempfile.gettempdir() else Path(place))


def _try_run(argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None,
             cwd: Path | None = None) -> tuple[int | None, str, str]:
    """(exit status, stdout, stderr) of :func:`iomatrix.core.proc.run`, for a check that reports
    rather than raises: status None when it timed out, 127 when it could not start."""
    try:
        done = run(argv, timeout=timeout, check=False, env=env, cwd=cwd)
    except ToolFailed as e:
        if isinstance(e.__cause__, subprocess.TimeoutExpired):
            return None, "", e.output
        return 127, "", str(e)
    return done.returncode, done.stdout, done.stderr


def _failure(rc: int | None, text: str, timeout: float) -> str:
    if rc is None:
        return f"did not finish within {timeout:g} s"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    interesting = [line for line in lines if "error" in line.lower() or "fail" in line.lower()]
    message = (interesting or lines or ["no message"])[0][:200]
    return f"failed with status {rc}: {message}"
