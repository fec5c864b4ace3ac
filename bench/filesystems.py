#!/usr/bin/env python3
"""What the filesystem under a VM's disk costs, as seed 004 compared layers (ext4, XFS, an LVM
volume; the same fio jobs on the same disk, several samples each): an image on ext4, the same on
a btrfs subvolume (Proxmox VE's btrfs storage: a subvolume per disk; with ``--nocow`` also one
with No_COW, as its ``nocow 1``) and a raw block device, 4k random read and write at QD1 and
QD32, in host mode (fio on the image itself, direct I/O: the layers' native speed).

Only the layer differs: each target sits on a loop device of its own (direct I/O) over a file of
this benchmark's, all files on the same filesystem (``--dir``, /var/tmp by default), each file
written fully first so that no write below the layer allocates space; ext4 and btrfs are made as
``[target] filesystems`` makes them (``iomatrix.targets.targets.MKFS``: no discard, no lazy
initialisation). The btrfs targets are subvolumes this benchmark makes as pve-storage's
BTRFSPlugin makes a raw disk's (``vm-100-disk-0``; ``vm-101-disk-0`` with No_COW), measured as
directories (``[[targets]]`` takes directories and devices; ``[target] btrfs`` makes such a
subvolume for a run of its own). One suite of ``[[targets]]``, one run: the runner interleaves
the targets round by round (``--rounds``, each round every target and workload once, in a
shuffled order), every image preconditioned (written fully once) before it is measured, so each
round gives a paired ratio per workload; printed as geometric means of the per-round ratios with
95 % CIs (``iomatrix.analysis.stats.log_ratio_test``), against ext4 and against the raw device.
The load average before and after is printed: other work on the host widens the intervals.

    sudo .venv/bin/python bench/filesystems.py               # 5 rounds of 4 s + 1 s: ~6 min
    sudo .venv/bin/python bench/filesystems.py --quick       # 3 rounds of 2 s, 128 MiB: ~2 min
    sudo .venv/bin/python bench/filesystems.py --nocow --rounds 8 --size 2GiB
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from iomatrix.analysis.stats import log_ratio_test  # noqa: E402
from iomatrix.core.units import parse_size  # noqa: E402
from iomatrix.measure.runner import run_suite  # noqa: E402
from iomatrix.store import Store  # noqa: E402
from iomatrix.suite import load_suite  # noqa: E402
from iomatrix.targets import loops  # noqa: E402
from iomatrix.targets.btrfs import set_nocow  # noqa: E402
from iomatrix.targets.targets import MKFS  # noqa: E402

def _sh(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=300).stdout


def _backing(path: Path, size: int) -> Path:
    """A file of ``size`` bytes written fully (zeros), so that nothing below the layer
    allocates while it is measured."""
    chunk = bytes(8 << 20)
    with open(path, "wb") as f:
        for _ in range(size // len(chunk)):
            f.write(chunk)
        f.write(bytes(size % len(chunk)))
        f.flush()
        os.fsync(f.fileno())
    return path


@contextlib.contextmanager
def layers(work: Path, size: int, nocow: bool) -> Iterator[dict[str, str]]:
    """The targets, as [[targets]] keys by name: ext4 and btrfs filesystems and a raw device,
    each on a loop device over a file in ``work``; unmounted and detached afterwards."""
    # the image, metadata, btrfs' minimum, and room for copy-on-write: a btrfs image written
    # fully is rewritten into new extents before the old ones are freed (at the transaction's
    # commit), so a filesystem barely larger than it fails random writes with ENOSPC
    fs_size = 2 * size + (512 << 20)
    attached: list[str] = []
    mounted: list[Path] = []
    try:
        targets: dict[str, str] = {}
        for name in ("ext4", "btrfs", "raw"):
            file = _backing(work / f"{name}.img", size if name == "raw" else fs_size)
            loop = loops.attach(file, os.stat(file))
            attached.append(loop.device)
            if not loop.direct_io:
                print(f"note: {loop.device} has no direct I/O: the host page cache is measured")
            if name == "raw":
                targets[name] = f'device = "{loop.device}"\nallow_destroy = true'
                continue
            _sh(*MKFS[name][0], loop.device)
            point = work / f"mnt-{name}"
            point.mkdir()
            _sh("mount", "-t", name, loop.device, str(point))
            mounted.append(point)
            targets[name] = f'directory = "{point}/images"'
        for disk, flagged in (("vm-100-disk-0", False), ("vm-101-disk-0", True))[:1 + nocow]:
            subvolume = work / "mnt-btrfs" / disk        # as BTRFSPlugin makes a raw disk's
            _sh("btrfs", "subvolume", "create", str(subvolume))
            if flagged:
                fd = os.open(subvolume, os.O_RDONLY | os.O_DIRECTORY)
                try:
                    set_nocow(fd)
                finally:
                    os.close(fd)
            targets["btrfs-nocow" if flagged else "btrfs"] = f'directory = "{subvolume}"'
        yield targets
    finally:
        for point in reversed(mounted):
            subprocess.run(["umount", str(point)], capture_output=True, timeout=120)
        for device in attached:
            loops.detach(device)


def suite(targets: dict[str, str], args: argparse.Namespace) -> str:
    tables = "".join(f'[[targets]]\nname = "{name}"\n{keys}\n' for name, keys in targets.items())
    method = (f'mode = "host", precondition = true, ramp = "{args.ramp}", '
              f'runtime = "{args.runtime}", samples = {args.rounds}, seed = 7')
    return (f'workloads = [{{ rw = ["randread", "randwrite"], bs = "4k", iodepth = [1, 32] }}]\n'
            f'method = {{ {method} }}\n[suite]\nname = "filesystems"\n'
            f'[target]\nsize = "{args.size}"\n{tables}')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runtime", default="4s")
    parser.add_argument("--ramp", default="1s")
    parser.add_argument("--size", default="512MiB", help="each image (and the raw device)")
    parser.add_argument("--nocow", action="store_true",
                        help="also a btrfs subvolume with No_COW (Proxmox VE's nocow 1)")
    parser.add_argument("--quick", action="store_true",
                        help="3 rounds of 2 s + 0.5 s on 128 MiB images (about 2 minutes)")
    parser.add_argument("--dir", type=Path, default=Path("/var/tmp"),
                        help="where the loop devices' files go (all on its filesystem)")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.runtime, args.ramp, args.size = 3, "2s", "500ms", "128MiB"
    if args.rounds < 2:
        parser.error("--rounds >= 2")
    if os.geteuid() != 0:
        raise SystemExit("needs root: it makes loop devices and mounts filesystems")
    missing = [t for t in ("losetup", "mkfs.ext4", "mkfs.btrfs", "btrfs") if not shutil.which(t)]
    if missing:
        raise SystemExit(f"not installed: {', '.join(missing)}")
    size = parse_size(args.size)
    load = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="iomatrix-bench-fs-", dir=args.dir))
    t0 = time.monotonic()
    try:
        with layers(work, size, args.nocow) as targets:
            made = time.monotonic() - t0
            print(f"targets made in {made:.0f} s: {', '.join(targets)} (files in {args.dir})",
                  flush=True)
            written = work / "filesystems.toml"      # root's, in root's 0700 directory:
            written.write_text(suite(targets, args))  # trusted to destroy the raw device
            with Store(work / "r.db") as store:
                outcome = run_suite(load_suite(written), store)
                run = store.load_run(outcome.run_id)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    left = [lo.device for lo in loops.backed_in(work)]
    report(run, args, time.monotonic() - t0, load, left)


def _iops(run) -> dict[tuple[str, str], dict[int, float]]:  # type: ignore[no-untyped-def]
    """(target, workload) → round → IOPS."""
    found: dict[tuple[str, str], dict[int, float]] = {}
    labels = {w.key: w.label for w in run.workloads}
    for t in run.trials:
        if t.status == "ok":
            target = t.config_key.rpartition("target=")[2].split("/")[0]
            found.setdefault((target, labels.get(t.workload_key, t.workload_key)), {})[
                t.sample_index] = sum(s.iops for s in t.samples)
    return found


def report(run, args: argparse.Namespace, wall: float,  # type: ignore[no-untyped-def]
           load: tuple[float, float, float], left: list[str]) -> None:
    iops = _iops(run)
    failed = [t for t in run.trials if t.status != "ok"]
    targets = [t for t in ("ext4", "btrfs", "btrfs-nocow", "raw") if any(k == t for k, _ in iops)]
    workloads = sorted(dict.fromkeys(w for _, w in iops),
                       key=lambda w: (w.split()[1], int(w.rpartition("QD")[2] or 0)))
    print(f"\nrun {run.id}: {len(run.trials) - len(failed)} trials ok, {len(failed)} failed; "
          f"{args.rounds} rounds, {args.size} images, ramp {args.ramp} + {args.runtime} per "
          f"trial; {wall:.0f} s in all; loop devices left: {len(left)}")
    print(f"load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; after: "
          + " ".join(f"{v:.2f}" for v in os.getloadavg()))
    for t in failed[:3]:
        print(f"  failed: {t.config_key} {t.workload_key}: {(t.reason or '')[:200]}")
    print("mean IOPS over the rounds:")
    print(f"  {'':<22}" + "".join(f"{t:>14}" for t in targets))
    for w in workloads:
        means = [iops.get((t, w), {}) for t in targets]
        print(f"  {w:<22}" + "".join(f"{sum(m.values()) / len(m):>14.0f}" if m else f"{'-':>14}"
                                     for m in means))
    print("per-round ratio, geometric mean [95 % CI]:")
    for base in ("ext4", "raw"):
        for target in (t for t in targets if t != base and not (base == "raw" and t == "ext4")):
            print(f"  {target}/{base}")
            for w in workloads:
                print(f"    {w:<22} {_ratio(iops.get((target, w), {}), iops.get((base, w), {}))}")


def _ratio(mine: dict[int, float], base: dict[int, float]) -> str:
    logs = [math.log(mine[k] / base[k]) for k in sorted(mine) if k in base and base[k] > 0
            and mine[k] > 0]
    if len(logs) < 2:
        return "(fewer than 2 paired rounds)"
    ci = log_ratio_test(logs).interval
    return f"{math.exp(ci.mean):.3f} [{math.exp(ci.low):.3f}, {math.exp(ci.high):.3f}]"


if __name__ == "__main__":
    main()
