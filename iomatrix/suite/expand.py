"""Suite → configurations × workloads (pure). Combinations QEMU refuses are rejected here, before
anything runs, with QEMU's own reason; axes the mode ignores are reported, never dropped silently."""

from __future__ import annotations

import itertools
import math


from iomatrix.core.errors import InvalidCombination, SuiteError
from iomatrix.core.model import Frozen, shown
from iomatrix.platform import proxmox as pve
from iomatrix.platform import refusal
from iomatrix.platform.settings import disk_kind
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.jobfiles import workload_groups
from iomatrix.suite.matrix import REFERENCE_AXES, Matrix
from iomatrix.suite.model import Suite
from iomatrix.suite.workloads import Workload, WorkloadGroup
from iomatrix.vocab.axes import (AXES, BY_NAME, CONFIG_AXES, DIRECT_CACHES, IOTHREAD_CONTROLLERS,
                                 MODE_AXES, vq_groups)
from iomatrix.vocab.words import Accelerator, Mode

MAX_TRIALS = 1_000_000
"""The most trials a suite may ask for (configurations × workloads × samples), counted before any
is made: at a second each they take 11 days (the largest built-in suite asks for a few
thousand); lists of a thousand values in a few lines would otherwise keep --plan busy for hours."""

_QEMU_DEVICE = {"pvscsi": "pvscsi", "lsi": "lsi53c895a", "megasas": "megasas", "sata": "ide-hd",
                "ide": "ide-hd", "nvme": "nvme"}


class Skipped(Frozen):
    """A combination dropped by ``skip_invalid``, with QEMU's reason."""

    configuration: Configuration
    reason: str


class Expansion(Frozen):
    """What a suite expands to."""

    configurations: tuple[Configuration, ...]
    workloads: tuple[Workload, ...]
    skipped: tuple[Skipped, ...] = ()
    notes: tuple[str, ...] = ()
    """Ignored axes and skipped combinations, in words, for the run's record and the report."""
    under_tcg: tuple[tuple[str, str], ...] = ()
    """(configuration key, rule) for configurations of parts that run differently under TCG."""
    only: tuple[tuple[str, str], ...] | None = None
    """The (configuration key, workload key) pairs to measure; None: every combination."""

    def workloads_for(self, config: Configuration) -> tuple[Workload, ...]:
        """The workloads measured on ``config``."""
        if self.only is None:
            return self.workloads
        keys = {w for c, w in self.only if c == config.key}
        return tuple(w for w in self.workloads if w.key in keys)

    @property
    def trials_per_sample(self) -> int:
        return sum(len(self.workloads_for(c)) for c in self.configurations)

    def without_targets(self, dropped: dict[str, str]) -> "Expansion":
        """The expansion without the configurations on the targets ``dropped`` (name → why,
        for the notes): those a host cannot provide (``iomatrix.targets.targets``)."""
        if not dropped:
            return self
        configs = tuple(c for c in self.configurations if c.target not in dropped)
        keys = {c.key for c in configs}
        return self.model_copy(update={
            "configurations": configs,
            "only": None if self.only is None else tuple(p for p in self.only if p[0] in keys),
            "under_tcg": tuple(r for r in self.under_tcg if r[0] in keys),
            "notes": (*self.notes, *(f"target {name} is not measured: {why}"
                                     for name, why in dropped.items()))})

    def without_configurations(self, dropped: dict[str, str]) -> "Expansion":
        """The expansion without the configurations ``dropped`` (key → why), each skipped with
        its reason as ``skip_invalid`` skips a combination QEMU refuses: those this host's
        QEMU cannot run (``measure.prepare``: several IOThreads per disk before 9.0/10.0)."""
        if not dropped:
            return self
        gone = [c for c in self.configurations if c.key in dropped]
        return self.model_copy(update={
            "configurations": tuple(c for c in self.configurations if c.key not in dropped),
            "only": None if self.only is None else tuple(p for p in self.only
                                                         if p[0] not in dropped),
            "under_tcg": tuple(r for r in self.under_tcg if r[0] not in dropped),
            "skipped": (*self.skipped, *(Skipped(configuration=c, reason=dropped[c.key])
                                         for c in gone)),
            "notes": (*self.notes, *(f"skipped {c.key}: {dropped[c.key]}" for c in gone))})

    def on_node(self, node: str) -> "Expansion":
        """The expansion as ``node`` measures it in a cluster run: every configuration keyed
        with its node (``Configuration.node``), so that the nodes' trials are told apart."""
        keys = {c.key: c.model_copy(update={"node": node}).key for c in self.configurations}
        return self.model_copy(update={
            "configurations": tuple(c.model_copy(update={"node": node})
                                    for c in self.configurations),
            "only": None if self.only is None else tuple((keys[c], w) for c, w in self.only),
            "under_tcg": tuple((keys[c], rule) for c, rule in self.under_tcg)})

    def for_accel(self, accel: str) -> "Expansion":
        """The expansion as it runs with guests under ``accel``: under TCG, parts marked
        ``under_tcg = "one"`` keep their first configuration's first workload, "skip" none."""
        rules = dict(self.under_tcg)
        if accel != Accelerator.TCG or not rules:
            return self
        configs, pairs, notes = [], [], list(self.notes)
        kept_one = False
        for config in self.configurations:
            rule = rules.get(config.key, "all")
            if rule == "skip" or (rule == "one" and kept_one):
                continue
            workloads = self.workloads_for(config)
            if rule == "one":
                kept_one, workloads = True, workloads[:1]
                notes.append(f"guests are emulated (TCG): the guest part runs one trial only "
                             f"({config.label} · {workloads[0].label}) to show the chain works; "
                             "its figures measure QEMU's emulator, not this hardware")
            configs.append(config)
            pairs += [(config.key, w.key) for w in workloads]
        return self.model_copy(update={"configurations": tuple(configs), "only": tuple(pairs),
                                       "notes": tuple(notes)})


def invalid_reason(config: Configuration, *, device_target: bool = False,
                   platform: str = "qemu") -> str | None:
    """Why QEMU 7.2 (or iomatrix) would refuse this configuration, or None when it is valid.
    With a ``platform`` other than qemu, a guest configuration that platform cannot produce
    (or would silently change) is refused too, with the platform's reason."""
    if config.mode == Mode.GUEST and platform != "qemu":
        reason = refusal(platform, config)
        if reason:
            return reason
    if config.aio == "native" and config.cache not in DIRECT_CACHES:
        return ("aio=native was specified, but it requires cache.direct=on, which was not specified "
                f"(cache={config.cache}; aio=native needs cache=none or directsync)")
    if config.format == "raw" and config.preallocation == "metadata":
        return "Unsupported preallocation mode: metadata (raw images have no metadata to preallocate)"
    if (config.mode == Mode.GUEST and config.iothread and config.data_path != "vhost-user-blk"
            and config.controller not in IOTHREAD_CONTROLLERS):
        device = _QEMU_DEVICE.get(str(config.controller), str(config.controller))
        return (f"Property '{device}.iothread' not found "
                "(only virtio-blk and virtio-scsi controllers accept an iothread)")
    if config.iothread_affinity is not None and (not config.iothread
                                                 or config.data_path == "vhost-user-blk"):
        return ("iothread_affinity pins QEMU's IOThreads: it needs iothread = true (and QEMU's "
                "own device: a vhost-user-blk daemon's IOThreads are not pinned)")
    if config.mode == Mode.GUEST:
        reason = _queue_reason(config) or iothreads_reason(config)
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
    """QEMU 7.2's limits on queue count and size per controller, as QEMU states them (checked
    against QEMU itself in tests/qemu/test_qemu_args.py)."""
    kind = disk_kind(config)
    device = _QEMU_DEVICE.get(kind, f"{kind}-pci")
    queues, size = config.num_queues, config.queue_size
    if queues:
        if kind not in _QUEUE_PROPERTY and kind != "vhost-user-blk":
            return f"Property '{device}.num-queues' not found ({kind} has one queue)"
        if kind == "virtio-blk" and queues > 1024:
            return "virtio-blk num-queues above 1024: QEMU 7.2 aborts (exit 134) without a message"
        if kind in ("virtio-scsi", "virtio-scsi-single") and queues > 1022:
            return (f"Invalid number of queues (= {queues}), must be a positive integer less "
                    "than 1022.")
        if kind == "nvme" and queues > 65535:
            return "max_ioqpairs must be between 1 and 65535"
    if size:
        if kind not in _SIZE_PROPERTY and kind != "vhost-user-blk":
            return f"Property '{device}.queue-size' not found ({kind} has no virtqueues)"
        if kind == "virtio-blk" and (size <= 2 or size & (size - 1) or size > 1024):
            if size <= 2:
                return f"invalid queue-size property ({size}), must be > 2"
            return f"invalid queue-size property ({size}), must be a power of 2 (max 1024)"
        if kind in ("virtio-scsi", "virtio-scsi-single"):
            if size <= 2:
                return f"invalid virtqueue_size property (= {size}), must be > 2"
            if size > 1024:
                return "virtio-scsi virtqueue_size above 1024: QEMU 7.2 aborts (exit 134)"
        if kind == "vhost-user-blk" and size > 1024:
            return "queue size must not exceed 1024"
    return None


def iothreads_reason(config: Configuration) -> str | None:
    """Why iomatrix (or QEMU's iothread-vq-mapping, by its own rules: every queue once, each
    below num-queues) refuses a configuration's iothreads and vq_mapping, or None. Which QEMU
    has the mapping at all is the precheck's (``iomatrix.measure.precheck``)."""
    threads, mapping = config.iothreads, config.vq_mapping
    if threads is None:
        return ("vq_mapping needs iothreads (2 or more IOThreads to map the queues to)"
                if mapping is not None else None)
    if not config.iothread:
        return f"iothreads = {threads} needs iothread = true (the IOThreads serve the disk's queues)"
    if disk_kind(config) not in IOTHREAD_CONTROLLERS:   # vhost-user-blk: the daemon's queues
        return ("Property 'vhost-user-blk-pci.iothread-vq-mapping' not found (the "
                "qemu-storage-daemon serves vhost-user-blk's queues, with one IOThread)")
    groups = vq_groups(mapping)
    if groups is None:
        return None
    if len(groups) != threads:
        return (f"vq_mapping {mapping} names {len(groups)} IOThread(s) but iothreads = {threads}: "
                "give each thread its queues, threads apart by ':'")
    if not config.num_queues:
        return (f"vq_mapping {mapping} needs num_queues (QEMU requires every queue mapped, and "
                "its default count is the guest's vCPUs)")
    seen: set[int] = set()
    for thread, queues in enumerate(groups):
        for queue in queues:
            if queue >= config.num_queues:
                return (f"vq index {queue} for IOThread {thread} must be less than num_queues "
                        f"{config.num_queues} in iothread-vq-mapping")
            if queue in seen:
                return (f"cannot assign vq {queue} to IOThread {thread} because it is already "
                        "assigned")
            seen.add(queue)
    missing = min(set(range(config.num_queues)) - seen, default=None)
    if missing is not None:
        return f"missing vq {missing} IOThread assignment in iothread-vq-mapping"
    return None


def _normalize(config: Configuration) -> Configuration:
    """One spelling per distinct QEMU setup: defaults as None, no controller under vhost-user-blk."""
    update: dict[str, object] = {a.name: None for a in AXES
                                 if a.unset is not None and getattr(config, a.name) == a.unset}
    if config.data_path == "vhost-user-blk":
        update["controller"] = None
    return config.model_copy(update=update) if update else config


NBD_IOTHREAD_SURVIVES_FROM = (9, 0, 0)
"""QEMU 7.2 aborts an NBD export that has an iothread when a client disconnects (an assertion in
``nbd_blockdev_client_closed``); 10.0 does not (both tried, four fio clients in a row). The NBD
server's client list went to the main loop thread for 9.0 (f816310d0c3): before 9.0 the abort
is possible, from 9.0 on it is not seen."""


def expand(suite: Suite, qemu: tuple[int, int, int] | None = None) -> Expansion:
    """Every configuration × workload the suite asks for, invalid ones rejected or skipped.
    ``qemu``: the version of the QEMU that will run them, where known (notes name what that
    version does, and nothing about another's)."""
    targets: list[tuple[str | None, bool]] = (
        [(t.name, t.device is not None) for t in suite.named_targets]
        or [(None, suite.target.whole_device)])
    notes: list[str] = []
    configs: list[Configuration] = []
    skipped: list[Skipped] = []
    under_tcg: list[tuple[str, str]] = []
    mode = suite.method.mode
    if suite.method.baseline and mode != Mode.HOST:
        configs += [Configuration(mode=Mode.HOST, target=name) for name, _ in targets]
    parts: list[tuple[str, Matrix, str, str]] = [(mode, suite.matrix, "[matrix]", "all")]
    parts += [(p.mode, p, f"[[part]] #{i + 1}", p.under_tcg) for i, p in enumerate(suite.part)]
    groups, jobfile_notes = workload_groups(suite)      # job files' jobs in their tables' place
    _bounded(suite, [(m, matrix) for m, matrix, _, _ in parts], len(targets), groups)
    for part_mode, matrix, where, rule in parts:
        before, skipped_before = len(configs), len(skipped)
        _expand_part(suite, part_mode, matrix, where, targets, configs, skipped, notes, qemu)
        if len(configs) == before and len(skipped) > skipped_before:
            raise InvalidCombination(f"{suite.source_path}: {where}: every combination is invalid")
        under_tcg += [(c.key, rule) for c in configs[before:]
                      if c.mode == Mode.GUEST and rule != "all"]
    _add_reference(suite, configs, targets, notes)
    if suite.method.aa:
        source = next((c for c in configs if c.mode == mode), configs[0] if configs else None)
        if source is not None:
            twin = source.model_copy(update={"aa": True, "yours": None})
            configs.insert(configs.index(source) + 1, twin)
            under_tcg += [(twin.key, rule) for key, rule in under_tcg if key == source.key]
            notes.append(f"A/A calibration: {source.label} is measured twice, as itself and as "
                         f"{twin.key}, in the same rounds")

    workloads: list[Workload] = []
    seen: set[str] = set()
    notes += jobfile_notes
    for group in groups:
        options = tuple(sorted((k, shown(v)) for k, v in group.options.items()))
        for rw, bs, depth, jobs, rate in itertools.product(group.rw, group.bs, group.iodepth,
                                                           group.numjobs, group.rate_iops):
            workload = Workload(rw=rw, bs=bs, iodepth=depth, numjobs=jobs, rate_iops=rate,
                                options=options, ioping=group.ioping)
            if workload.key not in seen:
                seen.add(workload.key)
                workloads.append(workload)
    return Expansion(configurations=tuple(configs), workloads=tuple(workloads),
                     skipped=tuple(skipped), notes=tuple(notes), under_tcg=tuple(under_tcg))


def _bounded(suite: Suite, parts: list[tuple[str, Matrix]], targets: int,
             groups: tuple[WorkloadGroup, ...]) -> None:
    """SuiteError when the suite could ask for more than MAX_TRIALS trials: every combination of
    its axes and workload lists (before duplicates and invalid ones are dropped), per sample."""
    configs = 1 + sum(targets * math.prod(len(getattr(matrix, axis) or (1,))
                                          for axis in MODE_AXES[part_mode])
                      for part_mode, matrix in parts)
    workloads = sum(math.prod(len(values) for values in (g.rw, g.bs, g.iodepth, g.numjobs,
                                                          g.rate_iops)) for g in groups)
    trials = configs * workloads * suite.method.samples
    if trials > MAX_TRIALS:
        raise SuiteError(f"{suite.source_path}: up to {configs:,} configurations × "
                         f"{workloads:,} workloads, samples = {suite.method.samples}: more than "
                         f"the {MAX_TRIALS:,} trials iomatrix runs in one suite (at a second "
                         "each, 11 days); split it, or use fewer values")


def reference_configuration(suite: Suite) -> Configuration | None:
    """The configuration that measures the user's VM disk (``[matrix] reference``) in the
    suite's mode, or None. Blocklayer mode has no guest: its iothread picks the export (FUSE or
    NBD), so the VM's disk is measured with the matrix's first export, like the matrix."""
    ref = suite.matrix.reference
    if ref is None:
        return None
    mode = suite.method.mode
    values: dict[str, object] = {a.name: getattr(ref, a.name) for a in REFERENCE_AXES}
    values |= {"preallocation": "off", "vms": (suite.matrix.vms or (suite.method.vms,))[0]}
    if mode == Mode.BLOCKLAYER:
        values["iothread"] = suite.matrix.iothread[0]
    used = MODE_AXES[mode]
    return _normalize(Configuration(mode=mode, yours=True,
                                    **{a: v for a, v in values.items() if a in used}))


def reference_lines(suite: Suite) -> list[str]:
    """What ``run --plan`` and the run's notes say about the user's VM disk: where it came
    from, the configuration that measures it, and what it sets that is not reproduced."""
    ref, config = suite.matrix.reference, reference_configuration(suite)
    if ref is None or config is None:
        return []
    lines = [f"your VM: {suite.matrix.from_vm} {ref.disk} ({ref.written or ref.settings()}) → "
             f"{ref.settings()}; measured as {config.label} in the same rounds, the reference "
             "recommend answers relative to"]
    if config.mode == Mode.BLOCKLAYER:
        lines.append("your VM: blocklayer mode measures its aio, cache and format without a "
                     "guest (controller, iothread and queues need guest mode); iothread picks "
                     "the export, as for the matrix")
    if ref.format == "qcow2":
        lines.append("your VM: preallocation is not in the VM's file (the storage chose it when "
                     "it created the volume): the image here is created with preallocation=off")
    if ref.storage:
        lines.append(f"your VM: its volume is on {ref.storage}; iomatrix measures an image on "
                     "the suite's [target] instead (the storage is not reproduced)")
    if ref.platform == suite.method.platform:
        version = (f", PVE {suite.method.pve_version or pve.DEFAULT_PVE_VERSION}" if ref.platform == "proxmox" else "")
        lines.append(f"your VM: [method] platform = \"{ref.platform}\"{version}: every "
                     f"configuration gets {ref.platform}'s block graph, as the VM's disk does")
    else:
        lines.append(f"warning: your VM is a {ref.platform} VM but [method] platform = "
                     f"\"{suite.method.platform}\": its disk gets {suite.method.platform}'s block "
                     f"graph, not {ref.platform}'s (leave platform out to follow the VM)")
    lines += [f"your VM: {note}" for note in ref.notes]
    return lines


def _add_reference(suite: Suite, configs: list[Configuration],
                   targets: list[tuple[str | None, bool]], notes: list[str]) -> None:
    """The user's VM disk among the configurations, on each target: the matrix's own
    configuration when it has the same settings (marked as the VM's), else one more
    configuration after the matrix's of its mode."""
    reference = reference_configuration(suite)
    if reference is None:
        return
    for target, device_target in targets:
        config = reference.model_copy(update={"target": target})
        same = next((i for i, c in enumerate(configs) if c.key == config.key), None)
        if same is not None:
            configs[same] = config
            continue
        reason = invalid_reason(config, device_target=device_target,
                                platform=suite.method.platform)
        if reason is not None:
            raise InvalidCombination(f"{suite.source_path}: [matrix] from_vm "
                                     f"{suite.matrix.from_vm}: your VM's disk "
                                     f"({config.identity.settings}) cannot be measured: {reason}")
        last = max((i for i, c in enumerate(configs)
                    if c.mode == config.mode and c.target == target), default=len(configs) - 1)
        configs.insert(last + 1, config)
    notes += reference_lines(suite)


def _storage_aio(suite: Suite, matrix: Matrix, used: tuple[str, ...], where: str,
                 notes: list[str]) -> str | None:
    """The Proxmox VE storage type whose default aio a matrix that sets none measures: where
    the suite measures Proxmox's graph on a storage of a type whose disks qemu-server gives no
    io_uring by default (thick LVM, a CIFS storage's directory: native with a direct cache,
    threads without;
    ``pve.aio_default``), as a VM's disk there gets it; None elsewhere (the axis's own default,
    io_uring, is qemu-server's there too)."""
    table = suite.target.network
    storage = suite.target.storage_kind if table is None or table.local_volumes else None
    if (storage not in pve.NON_IO_URING_STORAGES or suite.method.platform != "proxmox"
            or "aio" not in used or "aio" in matrix.model_fields_set):
        return None
    note = (f"{where} aio: as qemu-server gives a disk without aio= on {storage} storage "
            f"({pve.NON_IO_URING_STORAGES[storage]}): native with cache=none or directsync, "
            "threads otherwise; set aio in the matrix to measure others")
    if note not in notes:
        notes.append(note)
    return storage


def _expand_part(suite: Suite, mode: str, matrix: Matrix, where: str,
                 targets: list[tuple[str | None, bool]], configs: list[Configuration],
                 skipped: list[Skipped], notes: list[str],
                 qemu: tuple[int, int, int] | None) -> None:
    """Append one matrix's valid configurations (not already present) to ``configs``, on each
    of ``targets`` in turn: (name, whether it is a block device); name None for a run of one."""
    used = MODE_AXES[mode]
    for axis in CONFIG_AXES:
        values = getattr(matrix, axis)
        default = Matrix.model_fields[axis].default
        if axis not in used and values != default and values is not None:
            why = BY_NAME[axis].blocklayer if mode == Mode.BLOCKLAYER else ""
            notes.append(f"{where} {axis} is ignored in {mode} mode "
                         f"(values {', '.join(map(shown, values))} not used)"
                         + (f": {why}" if why else ""))
    if mode == Mode.BLOCKLAYER:
        why = ""
        if qemu is not None and qemu < NBD_IOTHREAD_SURVIVES_FROM:
            why = (f" (QEMU before 9.0, as this {'.'.join(map(str, qemu))} is, can abort an NBD "
                   "export with an iothread when a client disconnects: 7.2 does)")
        notes.append(f"{where} iothread in blocklayer mode: on = FUSE export with an iothread, "
                     f"off = NBD export{why}")
    axis_values = [(getattr(matrix, axis) or (None,)) if axis in used else (None,)
                   for axis in CONFIG_AXES]
    if mode == Mode.GUEST:
        axis_values[CONFIG_AXES.index("vms")] = matrix.vms or (suite.method.vms,)
        axis_values[CONFIG_AXES.index("guest")] = (
            matrix.guest or ((suite.guest.label,) if suite.guest is not None else (None,)))
    table = suite.target.network
    if table is not None and not table.local_volumes and "aio" in used:
        # QEMU's rbd driver has no aio option: one configuration, not one per aio value
        axis_values[CONFIG_AXES.index("aio")] = (None,)
        note = (f"{where} aio is not evaluated on {suite.target.kind}: QEMU's {suite.target.kind} "
                "driver has no aio option (librbd completes requests on its own threads)")
        if note not in notes:
            notes.append(note)
    storage = _storage_aio(suite, matrix, used, where, notes)
    seen = {c.key for c in configs}
    for (target, device_target), combo in itertools.product(targets,
                                                            itertools.product(*axis_values)):
        values = dict(zip(CONFIG_AXES, combo))
        if storage is not None:
            values["aio"] = pve.aio_default(storage, values.get("cache"))
        config = _normalize(Configuration(mode=mode, target=target, **values))
        if config.key in seen:
            continue
        seen.add(config.key)
        reason = invalid_reason(config, device_target=device_target,
                                platform=suite.method.platform)
        if reason is None:
            configs.append(config)
        elif matrix.skip_invalid:
            skipped.append(Skipped(configuration=config, reason=reason))
            notes.append(f"skipped {config.key}: {reason}")
        else:
            raise InvalidCombination(
                f"{suite.source_path}: {where} {config.identity.settings}: {reason}",
                hint="remove the value from the matrix, or set skip_invalid = true to drop such "
                     "combinations and list them")


