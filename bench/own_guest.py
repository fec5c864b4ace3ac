#!/usr/bin/env python3
"""A real guest (Debian 12 with cloud-init, iomatrix.testing.debianimage) beside the appliance,
through the guest driver as runs use it: per guest and controller, boot-to-ready (session open:
QEMU start, overlay and seed made, marker seen, QMP checks), the cost of one trial beyond fio's
runtime (the fio client's wall time minus ramp + runtime), and 4k randread QD8 IOPS; then the
ratio real guest / appliance per controller. Under TCG here: emulator figures, labelled so.

The Debian image boots through SeaBIOS and its own GRUB, as a cloud image does, or with
``--boot kernel`` from its kernel and initrd given to QEMU.

    .venv/bin/python bench/own_guest.py [--accel tcg] [--runtime 5] [--boot bootloader|kernel]
"""

from __future__ import annotations

import argparse
import contextlib
import re
import tempfile
import time
from pathlib import Path

from iomatrix.appliance.protocol import READY_MARKER
from iomatrix.core.proc import require, run
from iomatrix.core.trust import US
from iomatrix.drivers.guest import GuestDriver
from iomatrix.drivers.guest.image import ImageGuest
from iomatrix.fio.jobfile import job_text
from iomatrix.fio.parse import parse_fio_output
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.fields import APPLIANCE
from iomatrix.suite.method import Method, OwnGuest
from iomatrix.suite.workloads import Workload
from iomatrix.targets.workspace import Image
from iomatrix.testing.debianimage import debian_image

CONTROLLERS = ("virtio-blk", "virtio-scsi")
DISK_BYTES = 64 << 20


def _ready_uptime(console: Path) -> float:
    """The guest kernel's uptime when it printed its ready marker: the host's boot-to-ready less
    this is QEMU's start, the firmware and the bootloader (and the host's wait for the line)."""
    match = re.search(READY_MARKER + r" uptime=([0-9.]+)", console.read_text(errors="replace"))
    return float(match[1]) if match else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--accel", default="tcg", choices=("tcg", "kvm", "auto"))
    parser.add_argument("--runtime", type=float, default=5.0)
    parser.add_argument("--boot", default="bootloader", choices=("bootloader", "kernel"))
    args = parser.parse_args()
    image = debian_image()
    own = OwnGuest(image=image.image, name="debian12")
    if args.boot == "kernel":
        own = own.model_copy(update={"kernel": image.kernel, "initrd": image.initrd,
                                     "append": image.append})
    how = "through SeaBIOS and GRUB" if args.boot == "bootloader" else "from its kernel (-kernel)"
    print(f"Debian 12 image {image.image}, booted {how}")
    ramp = 1.0
    method = Method(mode="guest", ramp=ramp, runtime=args.runtime, accel=args.accel)
    workload = Workload(rw="randread", bs=4096, iodepth=8)
    with tempfile.TemporaryDirectory(prefix="iomatrix-bench-own-", dir="/var/tmp") as tmp:
        work = Path(tmp)
        disk = work / "disk.raw"
        run([require("qemu-img"), "create", "-q", "-f", "raw", "-o", "preallocation=full",
             str(disk), str(DISK_BYTES)], timeout=120)
        driver = GuestDriver.prepare(method, work / "w", accel=args.accel, note=print)
        mine = ImageGuest(own)
        mine.check(US)
        mine.open()
        driver.use_kinds([*driver.kinds, mine], print, [])
        label = "TCG: emulator figures" if driver.accelerator == "tcg" else "KVM"
        rows: dict[tuple[str, str], tuple[float, float, float]] = {}
        for guest in (APPLIANCE, own.label):
            for controller in CONTROLLERS:
                config = Configuration(mode="guest", controller=controller, aio="io_uring",
                                       iothread=False, cache="none", format="raw",
                                       preallocation="off", vms=1, guest=guest)
                started = time.monotonic()
                with driver.session(config, [Image(path=disk, format="raw",
                                                   preallocation="off",
                                                   size=DISK_BYTES)]) as session:
                    ready = time.monotonic() - started
                    uptime = _ready_uptime(session.guests[0].console)   # type: ignore[attr-defined]
                    job = work / "job.fio"
                    job.write_text(job_text(workload, target=session.fio_target(), ramp=ramp,
                                            runtime=args.runtime))
                    t = time.monotonic()
                    out = run([require("fio"), *session.fio_args(), str(job),
                               "--output-format=json"], timeout=300).stdout
                    overhead = time.monotonic() - t - ramp - args.runtime
                    result = parse_fio_output(out)
                    iops = sum(j.read.iops for j in result.jobs)
                rows[(guest, controller)] = (ready, overhead, iops)
                print(f"{guest:10} {controller:12} ready {ready:6.1f} s (guest uptime "
                      f"{uptime:6.1f} s)  trial overhead {overhead:5.2f} s  {iops:8,.0f} IOPS "
                      f"({label})", flush=True)
    print(f"\nboot-to-ready and IOPS ratio, {own.label} / appliance ({label}):")
    for controller in CONTROLLERS:
        a, o = rows[(APPLIANCE, controller)], rows[(own.label, controller)]
        print(f"  {controller:12} ready {o[0]:6.1f} s vs {a[0]:5.1f} s ({o[0] / a[0]:4.1f}×)  "
              f"trial overhead {o[1]:5.2f} s vs {a[1]:5.2f} s  IOPS ratio {o[2] / a[2]:.2f}")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
