"""Is KVM usable here? Judged only by booting a real, standard Linux kernel under it.

``/dev/kvm`` existing, or even KVM_CREATE_VM succeeding, proves nothing: on a PVM host (our
development and CI machines) a standard kernel hangs early in boot under KVM while burning CPU.
So the probe boots a standard kernel with ``-accel kvm`` and a short timeout, and calls KVM usable
only if the kernel reaches a late boot stage:

* without an initrd: the ``VFS: Unable to mount root fs`` panic (the kernel got all the way to
  mounting root; ``panic=-1`` plus ``-no-reboot`` then make QEMU exit by itself);
* with an initrd: ``Run /init as init process``, or the ``marker`` the initrd prints.

The same code boots under ``-accel tcg`` (:func:`probe_accel`), which shows that a failure under
KVM is KVM's and not the kernel's. Every QEMU started here runs in its own process group under a
deadline, and is killed and reaped before the function returns, whatever happens.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path


from iomatrix.appliance.kernel import find_kernel, kernel_problem
from iomatrix.core.dirs import private_tempdir
from iomatrix.core.errors import IomatrixError, ToolFailed
from iomatrix.core.proc import last_line, managed, read_text, wait_for, which
from iomatrix.qemu.escape import qemu_escape
from iomatrix.core.model import Frozen
from iomatrix.vocab.words import Accelerator

QEMU_BINARY = "qemu-system-x86_64"
KVM_DEVICE = Path("/dev/kvm")

LATE_BOOT_MARKERS: tuple[str, ...] = (
    "VFS: Unable to mount root fs",
    "Run /init as init process",
    "No working init found",
)
"""Serial-console lines that only a kernel which booted (nearly) all the way prints."""

_POLL_INTERVAL = 0.05
_TERM_GRACE = 1.0
_ACCEL_NAMES = {Accelerator.KVM: "KVM", Accelerator.TCG: "TCG"}


class AccelProbe(Frozen):
    """The outcome of booting a standard kernel under one QEMU accelerator.

    ``usable`` is True only when the kernel reached the late-boot marker. ``probed`` says whether a
    kernel was actually booted (False: KVM "not probed", e.g. no kernel or no QEMU, see
    ``reason``). ``seconds`` is the wall time of the whole probe."""


    accel: str
    usable: bool
    reason: str
    seconds: float
    probed: bool = False
    kernel: Path | None = None
    marker: str | None = None
    serial_tail: str = ""
    hint: str | None = None


KvmProbe = AccelProbe
"""The result of :func:`probe_kvm` (an :class:`AccelProbe` with ``accel == "kvm"``)."""


def probe_kvm(kernel: Path | None = None, initrd: Path | None = None, timeout: float = 10.0, *,
              marker: str | None = None, qemu: str | os.PathLike[str] | None = None,
              env: Mapping[str, str] | None = None, cache_dir: Path | None = None,
              fetch_kernel: bool = True) -> KvmProbe:
    """Whether KVM can run a standard guest kernel here; never raises for a missing tool or kernel.

    ``kernel`` defaults to :func:`iomatrix.appliance.kernel.find_kernel` (which may download
    Debian's kernel once into ``cache_dir`` unless ``fetch_kernel`` is False; that time is not
    part of ``timeout``). ``qemu`` is the binary (a name looked up on ``env``'s PATH, or a path).
    """
    return probe_accel(Accelerator.KVM, kernel, initrd, timeout, marker=marker, qemu=qemu, env=env,
                       cache_dir=cache_dir, fetch_kernel=fetch_kernel)


def probe_accel(accel: str, kernel: Path | None = None, initrd: Path | None = None,
                timeout: float = 10.0, *, marker: str | None = None,
                qemu: str | os.PathLike[str] | None = None,
                env: Mapping[str, str] | None = None, cache_dir: Path | None = None,
                fetch_kernel: bool = True, memory_mib: int = 256,
                append: str | None = None) -> AccelProbe:
    """Boot a standard kernel under ``-accel <accel>`` ("kvm" or "tcg") and report how far it got."""
    start = time.monotonic()
    name = _ACCEL_NAMES.get(accel, accel)

    def result(usable: bool, reason: str, **kw: object) -> AccelProbe:
        return AccelProbe(accel=accel, usable=usable, reason=reason,
                          seconds=round(time.monotonic() - start, 3), **kw)  # type: ignore[arg-type]

    binary = which(qemu or QEMU_BINARY, env)
    if binary is None:
        return result(False, f"{name} not probed: {qemu or QEMU_BINARY} not found",
                      hint="apt-get install qemu-system-x86")
    if accel == Accelerator.KVM:
        problem = kvm_device_problem()
        if problem is not None:
            return result(False, f"KVM not usable: {problem}",
                          hint="load kvm_intel or kvm_amd and give this user access to /dev/kvm "
                               "(group kvm); without it guests run under TCG")
    if kernel is None:
        try:
            kernel = find_kernel(cache_dir, fetch=fetch_kernel, env=env)
        except IomatrixError as e:
            return result(False, f"{name} not probed: no kernel to boot: {e}", hint=e.hint)
    problem = boot_image_problem(Path(kernel))
    if problem is not None:
        return result(False, f"{name} not probed: bad kernel: {problem}", kernel=kernel,
                      hint="pass the path of a bzImage (vmlinuz) kernel")
    if initrd is not None and not os.access(initrd, os.R_OK):
        return result(False, f"{name} not probed: initrd {initrd} is not readable",
                      kernel=kernel)

    markers = (marker,) if marker else LATE_BOOT_MARKERS
    with private_tempdir("iomatrix-bootprobe-") as tmp:
        serial = Path(tmp) / "serial.log"
        stderr_path = Path(tmp) / "qemu.stderr"
        argv = boot_argv(binary, accel, Path(kernel), serial, initrd=initrd,
                         memory_mib=memory_mib, append=append)
        boot = _boot(argv, serial, stderr_path, markers, timeout, env)
    seen, rc, text, err, boot_seconds = boot
    last = last_line(text)
    common = dict(kernel=kernel, probed=True, serial_tail=_tail(text))
    if seen is not None:
        return result(True, f"a standard kernel ({Path(kernel).name}) reached {seen!r} under "
                            f"{name} in {boot_seconds:.1f} s", marker=seen, **common)
    if rc is None:
        reason = (f"a standard kernel ({Path(kernel).name}) did not finish booting under {name} "
                  f"within {timeout:g} s (serial console: {len(text)} bytes"
                  + (f", last line {last!r}" if last else "") + ")")
        hint = None
        if accel == Accelerator.KVM:
            reason += ("; /dev/kvm opens but cannot run a standard guest kernel (as on a PVM "
                       "host)")
            hint = ("guests will run under TCG: the CPU is emulated and guest numbers measure "
                    "the emulator; use a host with hardware virtualization for real numbers")
        return result(False, reason, hint=hint, **common)
    if rc != 0:
        err_line = last_line(err) or "no message"
        return result(False, f"{Path(binary).name} -accel {accel} exited with status {rc}: "
                             f"{err_line}", hint=_hint_for_error(err, accel), **common)
    return result(False, f"the guest stopped before a late boot stage under {name} (QEMU exited "
                         f"after {boot_seconds:.1f} s"
                         + (f"; last serial line {last!r}" if last else "; no serial output")
                         + ")", **common)


def boot_image_problem(path: Path) -> str | None:
    """Why QEMU's -kernel cannot boot ``path``: a bzImage, or an ELF vmlinux with a PVH entry
    (what the appliance boots, to skip decompressing under TCG), is fine."""
    try:
        with open(path, "rb") as f:
            is_elf = f.read(4) == b"\x7fELF"
    except OSError:
        is_elf = False
    if is_elf:
        from iomatrix.appliance.elf import has_pvh_entry

        return None if has_pvh_entry(path.read_bytes()) else f"{path} is an ELF file without a PVH entry"
    return kernel_problem(path)


def kvm_device_problem(device: Path = KVM_DEVICE) -> str | None:
    """Why ``/dev/kvm`` cannot even be opened, or None. Opening it proves nothing more."""
    try:
        fd = os.open(device, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return f"{device} does not exist (no hardware virtualization, or kvm module not loaded)"
    except PermissionError:
        return f"{device} is not accessible to this user (permission denied)"
    except OSError as e:
        return f"{device} cannot be opened: {e.strerror or e}"
    os.close(fd)
    return None


def boot_argv(binary: str, accel: str, kernel: Path, serial: Path, *,
              initrd: Path | None = None, memory_mib: int = 256,
              append: str | None = None) -> list[str]:
    """The QEMU command line of a probe boot: no devices but a serial port logged to a file."""
    argv = [binary, "-accel", accel]
    if accel == Accelerator.KVM:
        argv += ["-cpu", "host"]
    argv += [
        "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
        "-m", str(memory_mib), "-smp", "1",
        "-chardev", f"file,id=ser0,path={qemu_escape(str(serial))}",
        "-serial", "chardev:ser0",
        "-kernel", str(kernel),
        "-append", append or "console=ttyS0 earlyprintk=ttyS0 panic=-1 loglevel=7",
    ]
    if initrd is not None:
        argv += ["-initrd", str(initrd)]
    return argv


def _boot(argv: Sequence[str], serial: Path, stderr_path: Path, markers: Sequence[str],
          timeout: float, env: Mapping[str, str] | None
          ) -> tuple[str | None, int | None, str, str, float]:
    """Run QEMU until a marker shows on the serial log, QEMU exits, or the deadline passes.
    Returns (marker seen, exit status or None if it was still running, serial text, stderr,
    seconds from start to the marker or to QEMU's exit)."""
    started = time.monotonic()
    try:
        with managed(argv, log=stderr_path, stop_timeout=_TERM_GRACE, env=env) as proc:
            wait_for(lambda: proc.poll() is not None or _seen(serial, markers) is not None,
                     timeout=timeout, interval=_POLL_INTERVAL)
            seen = _seen(serial, markers)  # again: QEMU may have exited right after printing it
            rc = proc.poll()
            elapsed = time.monotonic() - started
    except ToolFailed as e:
        return None, 127, "", str(e), 0.0
    return seen, rc, read_text(serial), read_text(stderr_path), elapsed


def _seen(serial: Path, markers: Sequence[str]) -> str | None:
    text = read_text(serial)
    return next((m for m in markers if m in text), None)


def _tail(text: str, lines: int = 8) -> str:
    return "\n".join(text.replace("\r", "").rstrip().splitlines()[-lines:])


def _hint_for_error(stderr: str, accel: str) -> str | None:
    # Only reached once /dev/kvm has opened: the module is loaded and the user has access, so
    # the hypervisor itself refused (a PVM host, nested virtualization without support).
    if accel == Accelerator.KVM and ("KVM" in stderr or "kvm" in stderr):
        return ("/dev/kvm opens but QEMU cannot run a guest with it; guests will run under TCG: "
                "the CPU is emulated and guest numbers measure the emulator")
    return None
