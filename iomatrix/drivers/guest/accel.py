"""How the guests' CPUs run: KVM only where the appliance really boots under it (a probe, its
success remembered per boot of the host), else TCG with a warning."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

from iomatrix.appliance.build import MIN_MEMORY_MIB, Appliance, kernel_cmdline
from iomatrix.appliance.kernel import default_cache_dir, trusted_cache
from iomatrix.appliance.probe import KvmProbe, probe_accel
from iomatrix.core.errors import EnvironmentProblem, IomatrixError, UnsafeDirectory
from iomatrix.core.files import read_owned, write_file_atomically
from iomatrix.core.proc import read_text
from iomatrix.vocab.words import Accel, Accelerator

KVM_PROBE_TIMEOUT = 6.0  # a kernel reaches /init in about 1 s under KVM


def resolve_accel(accel: str, appliance: Appliance, note: Callable[[str], None]) -> str:
    """"kvm" or "tcg". auto: KVM only when the appliance's kernel really boots under it (a probe
    with a timeout: /dev/kvm existing proves nothing), else TCG with a one-line warning."""
    if accel == Accel.TCG:
        note("guests run under TCG as asked: the CPU is emulated; guest figures measure the emulator")
        return Accelerator.TCG
    probe = _probe(appliance)
    if probe.usable:
        return Accelerator.KVM
    if accel == Accel.KVM:
        raise EnvironmentProblem(f"--accel kvm: KVM is not usable here: {probe.reason}")
    note(f"warning: KVM is not usable ({probe.reason}); guests run under TCG: the CPU is "
         "emulated and guest figures measure the emulator, not this hardware")
    return Accelerator.TCG


def _probe(appliance: Appliance) -> KvmProbe:
    """The KVM probe; a success is remembered for this boot of the host and this appliance, and
    believed only from a file nobody else could have written (a planted "usable" would send the
    guests to a KVM that hangs them)."""
    boot_id = read_text(Path("/proc/sys/kernel/random/boot_id")).strip() or "unknown"
    memo = default_cache_dir() / f"kvm-probe-{boot_id}-{appliance.key[:16]}.json"
    with contextlib.suppress(OSError, ValueError, UnsafeDirectory):
        return KvmProbe.model_validate_json(read_owned(memo))
    # The appliance itself, as guests boot it, must get as far as running its /init
    # (loglevel=7 after the command line's "quiet" lets the kernel say so).
    probe = probe_accel(Accelerator.KVM, appliance.kernel, appliance.initrd, timeout=KVM_PROBE_TIMEOUT,
                        marker="Run /init as init process", memory_mib=MIN_MEMORY_MIB + 128,
                        append=kernel_cmdline("loglevel=7", accel=Accelerator.KVM))
    if probe.usable:   # a failure may be passing (a busy host): it is probed again next run
        with contextlib.suppress(OSError, IomatrixError):
            trusted_cache(memo.parent)
            write_file_atomically(memo, probe.model_dump_json())
    return probe
