"""Suite → configurations × workloads (pure). Combinations QEMU refuses are rejected here, before
anything runs, with QEMU's own reason; axes the mode ignores are reported, never dropped silently."""

from __future__ import annotations

import itertools

from pydantic import BaseModel, ConfigDict

from iomatrix.errors import InvalidCombination
from iomatrix.suite.model import (CONFIG_AXES, DIRECT_CACHES, IOTHREAD_CONTROLLERS, Configuration,
                                  Matrix, Suite, Workload)

# Which matrix axes each mode uses. host runs fio on the target itself: no QEMU settings apply.
MODE_AXES: dict[str, tuple[str, ...]] = {
    "host": (),
    "blocklayer": ("aio", "iothread", "cache", "format", "preallocation"),
    "guest": CONFIG_AXES,
}
AXES = CONFIG_AXES

_QEMU_DEVICE = {"pvscsi": "pvscsi", "sata": "ide-hd", "ide": "ide-hd", "nvme": "nvme"}


class Skipped(BaseModel):
    """A combination dropped by ``skip_invalid``, with QEMU's reason."""

    model_config = ConfigDict(frozen=True)
    configuration: Configuration
    reason: str


class Expansion(BaseModel):
    """What a suite expands to."""

    model_config = ConfigDict(frozen=True)
    configurations: tuple[Configuration, ...]
    workloads: tuple[Workload, ...]
    skipped: tuple[Skipped, ...] = ()
    notes: tuple[str, ...] = ()
    """Ignored axes and skipped combinations, in words, for the run's record and the report."""

    @property
    def trials_per_sample(self) -> int:
        return len(self.configurations) * len(self.workloads)


def invalid_reason(config: Configuration, *, device_target: bool = False) -> str | None:
    """Why QEMU 7.2 (or iomatrix) would refuse this configuration, or None when it is valid."""
    if config.aio == "native" and config.cache not in DIRECT_CACHES:
        return ("aio=native was specified, but it requires cache.direct=on, which was not specified "
                f"(cache={config.cache}; aio=native needs cache=none or directsync)")
    if config.format == "raw" and config.preallocation == "metadata":
        return "Unsupported preallocation mode: metadata (raw images have no metadata to preallocate)"
    if (config.mode == "guest" and config.iothread and config.data_path != "vhost-user-blk"
            and config.controller not in IOTHREAD_CONTROLLERS):
        device = _QEMU_DEVICE.get(str(config.controller), str(config.controller))
        return (f"Property '{device}.iothread' not found "
                "(only virtio-blk and virtio-scsi controllers accept an iothread)")
    if config.mode == "guest":
        reason = _queue_reason(config)
        if reason:
            return reason
    if device_target and (config.format not in (None, "raw") or config.preallocation not in (None, "off")
                          or (config.vms or 1) > 1):
        return ("a block-device target holds one raw image: format must be raw, preallocation "
                "off and vms 1 (iomatrix writes qcow2, preallocates and multiplies images only in files)")
    return None


_QUEUE_PROPERTY = {"virtio-blk": "num-queues", "virtio-scsi": "num_queues",
                   "virtio-scsi-single": "num_queues", "nvme": "max_ioqpairs"}
_SIZE_PROPERTY = {"virtio-blk": "queue-size", "virtio-scsi": "virtqueue_size",
                  "virtio-scsi-single": "virtqueue_size"}


def _queue_reason(config: Configuration) -> str | None:
    """QEMU 7.2's limits on queue count and size per controller (vhost-user-blk as virtio-blk)."""
    kind = "virtio-blk" if config.data_path == "vhost-user-blk" else str(config.controller)
    device = _QEMU_DEVICE.get(kind, f"{kind}-pci")
    if config.num_queues:
        if kind not in _QUEUE_PROPERTY:
            return f"Property '{device}.num-queues' not found ({kind} has one queue)"
        if kind == "virtio-blk" and config.num_queues > 1024:
            return "virtio-blk num-queues above 1024: QEMU 7.2 aborts (exit 134) without a message"
        if kind in ("virtio-scsi", "virtio-scsi-single") and config.num_queues >= 1022:
            return (f"Invalid number of queues (= {config.num_queues}), must be a positive "
                    "integer less than 1022.")
    if config.queue_size:
        if kind not in _SIZE_PROPERTY:
            return f"Property '{device}.queue-size' not found ({kind} has no virtqueues)"
        size = config.queue_size
        if size & (size - 1) or size > 1024:
            return f"invalid queue-size property ({size}), must be a power of 2 (max 1024)"
    return None


def _normalize(config: Configuration) -> Configuration:
    """One spelling per distinct QEMU setup: defaults as None, no controller under vhost-user-blk."""
    update: dict[str, object] = {}
    if config.data_path == "emulated":
        update["data_path"] = None
    if config.data_path == "vhost-user-blk":
        update["controller"] = None
    if config.num_queues == 0:
        update["num_queues"] = None
    if config.queue_size == 0:
        update["queue_size"] = None
    return config.model_copy(update=update) if update else config


def expand(suite: Suite) -> Expansion:
    """Every configuration × workload the suite asks for, invalid ones rejected or skipped."""
    mode = suite.method.mode
    device_target = suite.target.device is not None
    notes: list[str] = []
    used = MODE_AXES[mode]
    for axis in AXES:
        values = getattr(suite.matrix, axis)
        default = Matrix.model_fields[axis].default
        if axis not in used and values != default and values is not None:
            notes.append(f"[matrix] {axis} is ignored in {mode} mode "
                         f"(values {', '.join(map(_show, values))} not used)")
    if mode == "blocklayer":
        notes.append("[matrix] iothread in blocklayer mode: on = FUSE export with an iothread, "
                     "off = NBD export (QEMU 7.2 aborts an NBD export with an iothread on disconnect)")

    configs: list[Configuration] = []
    skipped: list[Skipped] = []
    if suite.method.baseline and mode != "host":
        configs.append(Configuration(mode="host"))
    axis_values = [getattr(suite.matrix, axis) if axis in used else (None,) for axis in AXES]
    if mode == "guest":
        axis_values[AXES.index("vms")] = suite.matrix.vms or (suite.method.vms,)
    seen: set[str] = set()
    for combo in itertools.product(*axis_values):
        config = _normalize(Configuration(mode=mode, **dict(zip(AXES, combo))))
        if config.key in seen:
            continue
        seen.add(config.key)
        reason = invalid_reason(config, device_target=device_target)
        if reason is None:
            configs.append(config)
        elif suite.matrix.skip_invalid:
            skipped.append(Skipped(configuration=config, reason=reason))
        else:
            raise InvalidCombination(
                f"{suite.source_path}: [matrix] {config.key.split('/', 1)[1]}: {reason}",
                hint="remove the value from [matrix], or set skip_invalid = true to drop such "
                     "combinations and list them")
    for item in skipped:
        notes.append(f"skipped {item.configuration.key}: {item.reason}")
    if not any(c.mode != "host" for c in configs) and mode != "host":
        raise InvalidCombination(f"{suite.source_path}: [matrix]: every combination is invalid")

    workloads: list[Workload] = []
    seen: set[str] = set()
    for group in suite.workloads:
        options = tuple(sorted((k, _show(v)) for k, v in group.options.items()))
        for rw, bs, depth, jobs, rate in itertools.product(group.rw, group.bs, group.iodepth,
                                                           group.numjobs, group.rate_iops):
            workload = Workload(rw=rw, bs=bs, iodepth=depth, numjobs=jobs, rate_iops=rate,
                                options=options)
            if workload.key not in seen:
                seen.add(workload.key)
                workloads.append(workload)
    return Expansion(configurations=tuple(configs), workloads=tuple(workloads),
                     skipped=tuple(skipped), notes=tuple(notes))


def _show(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
