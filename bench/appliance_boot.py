#!/usr/bin/env python3
"""Appliance boot time: QEMU start to the READY marker (fio --server listening), under TCG.

Builds the appliance (or finds it cached), boots it --runs times with a minimal QEMU command
(machine pc, -nodefaults, a virtio-net NIC on user networking with a hostfwd to a free port on
127.0.0.1, one small virtio-blk raw disk, -kernel/-initrd/-append, serial to a file) and prints
per boot: wall time to READY, the guest's uptime at READY, and where the time went (QEMU and
firmware until the kernel's clock starts, kernel until /init, then the init's stages from its
``iomatrix.trace=1`` lines). Then the medians, the ratio to the 8 s target, the appliance's size,
and a check that the host's ``fio --client`` runs a 1 s randread job on the disk the guest
reports.

    .venv/bin/python bench/appliance_boot.py [--runs 5] [--cpu max] [--memory 512]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

from iomatrix.appliance.build import Appliance, build_appliance
from iomatrix.appliance.protocol import (GUEST_FIO_PORT, READY_MARKER, TRACE_MARKER, console_error,
                                         kernel_cmdline, parse_disk_lines)
from iomatrix.fio.models import FioResult
from iomatrix.fio.parse import parse_fio_output
from iomatrix.core.proc import managed, read_text, require, run, wait_for
from iomatrix.qemu.escape import qemu_escape
from iomatrix.core.units import format_bytes

TARGET_SECONDS = 8.0
"""Boot-to-ready target under TCG on our machines (on KVM the design target is 1 s)."""
BOOT_TIMEOUT = 60.0
DISK_BYTES = 64 << 20
STAGES = ("kernel", "init", "modules", "disks", "network", "ready")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def qemu_argv(a: Appliance, work: Path, port: int, cpu: str, memory_mib: int) -> list[str]:
    return [
        require("qemu-system-x86_64"), "-accel", "tcg", "-machine", "pc", "-cpu", cpu,
        "-m", str(memory_mib), "-smp", "1",
        "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
        "-chardev", f"file,id=ser0,path={qemu_escape(str(work / 'serial.log'))}",
        "-serial", "chardev:ser0",
        "-netdev", f"user,id=net0,hostfwd=tcp:127.0.0.1:{port}-:{GUEST_FIO_PORT}",
        "-device", "virtio-net-pci,netdev=net0,romfile=",
        "-blockdev", json.dumps({"driver": "raw", "node-name": "disk0", "file": {
            "driver": "file", "filename": str(work / "disk.raw"), "cache": {"direct": True},
            "aio": "threads"}}),
        "-device", "virtio-blk-pci,drive=disk0",
        "-kernel", str(a.kernel), "-initrd", str(a.initrd),
        "-append", kernel_cmdline(port=GUEST_FIO_PORT, disks=1, accel="tcg", trace=True),
    ]


def ready_line(text: str) -> str | None:
    """The READY line once it is complete (the serial log is written a byte at a time)."""
    for line in text.replace("\r", "").split("\n")[:-1]:
        if line.startswith(READY_MARKER):
            return line
    return None


def boot(a: Appliance, work: Path, cpu: str, memory_mib: int, check_fio: bool) -> dict:
    with open(work / "disk.raw", "wb") as f:
        f.truncate(DISK_BYTES)
    serial = work / "serial.log"
    serial.write_bytes(b"")
    port = free_port()
    started = time.monotonic()
    with managed(qemu_argv(a, work, port, cpu, memory_mib), log=work / "qemu.log") as proc:
        wait_for(lambda: ready_line(read_text(serial)) is not None
                 or console_error(read_text(serial)) is not None or proc.poll() is not None,
                 timeout=BOOT_TIMEOUT)
        wall = time.monotonic() - started
        text = read_text(serial)
        line = ready_line(text)
        if line is None:
            sys.exit(f"no {READY_MARKER} after {wall:.1f} s: {console_error(text) or 'timeout'}; "
                     f"serial tail: {text[-500:]!r}; qemu: {read_text(work / 'qemu.log')[-300:]!r}")
        fio = fio_check(port, parse_disk_lines(text)[0].name, work) if check_fio else None
    fields = dict(f.split("=", 1) for f in line.split()[1:] if "=" in f)
    uptime = float(fields["uptime"])
    marks = {"kernel": 0.0}
    for t in text.replace("\r", "").splitlines():
        if t.startswith(TRACE_MARKER):
            _, at, stage = t.split(None, 2)
            if stage in STAGES:
                marks[stage] = float(at)
    marks["ready"] = uptime
    spans = {"qemu+firmware": wall - uptime}
    for prev, stage in zip(STAGES, STAGES[1:]):
        if prev in marks and stage in marks:
            spans[f"{prev}→{stage}"] = marks[stage] - marks[prev]
    return {"wall": wall, "uptime": uptime, "spans": spans, "disks": parse_disk_lines(text),
            "fio": fio}


def fio_check(port: int, disk: str, work: Path) -> FioResult:
    job = work / "check.fio"
    job.write_text(f"[check]\nfilename=/dev/{disk}\nrw=randread\nbs=4k\niodepth=8\n"
                   "ioengine=libaio\ndirect=1\nruntime=1\ntime_based=1\n")
    return parse_fio_output(run([require("fio"), f"--client=127.0.0.1,{port}",
                                 "--output-format=json", str(job)], timeout=60).stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--cpu", default="max", help="QEMU -cpu model (the guest driver's under "
                                                      "TCG is max)")
    parser.add_argument("--memory", type=int, default=512, help="guest memory, MiB")
    args = parser.parse_args()

    a = build_appliance()
    print(f"appliance {a.key}: kernel {a.kernel_release} ({a.kernel_format}) "
          f"{format_bytes(a.kernel_bytes)} + initrd {format_bytes(a.initrd_bytes)} = "
          f"{format_bytes(a.size_bytes)}, {a.fio_version}; "
          + (f"cached (built in {a.build_seconds:.1f} s)" if a.cached
             else f"built in {a.build_seconds:.1f} s"))
    print(f"accelerator: TCG (emulated CPU, -cpu {args.cpu}), machine pc, {args.memory} MiB, "
          "1 vCPU")
    results = []
    for i in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="iomatrix-bench-boot-") as tmp:
            r = boot(a, Path(tmp), args.cpu, args.memory, check_fio=i == args.runs - 1)
        results.append(r)
        spans = "  ".join(f"{k} {v:.2f}" for k, v in r["spans"].items())
        print(f"boot {i + 1}: {r['wall']:.2f} s to READY (guest uptime {r['uptime']:.2f} s)  "
              f"[{spans}]")
    walls = [r["wall"] for r in results]
    median = statistics.median(walls)
    print(f"median QEMU start → READY: {median:.2f} s over {len(results)} boots "
          f"(min {min(walls):.2f}, max {max(walls):.2f}); "
          f"median guest uptime at READY {statistics.median(r['uptime'] for r in results):.2f} s")
    keys = results[0]["spans"].keys()
    print("median breakdown: " + "  ".join(
        f"{k} {statistics.median(r['spans'][k] for r in results if k in r['spans']):.2f} s"
        for k in keys))
    verdict = "meets" if median <= TARGET_SECONDS else "MISSES"
    print(f"median / target: {median:.2f} / {TARGET_SECONDS:.0f} s = {median / TARGET_SECONDS:.2f} "
          f"({verdict} the TCG target)")
    d = results[-1]["disks"][0]
    print(f"guest disk: {d.name} {format_bytes(d.size_bytes)} queues={d.queues} "
          f"scheduler={d.scheduler} rotational={int(d.rotational)} driver={d.driver}")
    read = results[-1]["fio"].jobs[0].read
    print(f"fio --client → guest fio --server ({results[-1]['fio'].fio_version}): 4k randread "
          f"QD8 on /dev/{d.name} for {read.runtime_ms / 1000:.1f} s: {read.iops:,.0f} IOPS "
          "(TCG: measures the emulator)")


if __name__ == "__main__":
    main()
