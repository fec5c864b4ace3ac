"""The user's VM disk (``[matrix] from_vm``) against the run's other configurations.

A run made from a VM definition measured that VM's disk settings as one more configuration
(or marked the matrix's own configuration with the same settings), in the same shuffled rounds
as the others. Each other configuration of its mode is compared with it here as ``effects``
compares two levels of an axis: on every workload, paired by round (drift common to a round
cancels), the gain the geometric mean over workloads of the per-round ratios, with its 95 %
CI. The configurations are relabelled as levels of one axis (``vm``: ``yours`` and each other
configuration's key), so that the comparisons are one family, Holm-adjusted across the
configurations compared. Which stored configuration is the VM's follows from the suite text
the run stored (its ``[matrix.reference]``), with the rule expansion used
(``suite.expand.reference_configuration``); the VM's file is never read again.
"""

from __future__ import annotations

from iomatrix.analysis.effects import Gain, gains
from iomatrix.analysis.paired import is_twin
from iomatrix.analysis.points import only_configs
from iomatrix.core.model import Frozen
from iomatrix.store.records import ConfigRecord, StoredRun
from iomatrix.suite.expand import reference_configuration
from iomatrix.suite.fields import TARGET_AXIS
from iomatrix.suite.matrix import Reference
from iomatrix.vocab.words import Mode

VM_AXIS = "vm"
YOURS = "yours"
IOPS = "iops"
LATENCY = "lat_mean_ns"


class VmGain(Frozen):
    """One configuration of the run against the VM's: its IOPS and mean-latency gains."""

    key: str
    label: str
    params: dict[str, str]
    differs: dict[str, str]
    """Axis → this configuration's value, where it differs from the VM's."""
    iops: Gain
    latency: Gain


class YourVm(Frozen):
    """The VM's disk in a run: its settings, the configuration that measured it, and every
    other configuration of its mode against it."""

    from_vm: str
    reference: Reference
    config: ConfigRecord
    gains: tuple[VmGain, ...]

    def against(self, params: dict[str, str]) -> VmGain | None:
        """The comparison of the measured configuration with these ``params``, if any."""
        return next((g for g in self.gains if g.params == params), None)

    def uses(self, axes: list[str] | tuple[str, ...]) -> str:
        """The VM's values of ``axes``: ``aio=threads, cache=writeback``."""
        return ", ".join(f"{a}={self.config.params.get(a, '—')}" for a in axes)


_CACHE: dict[int, tuple[StoredRun, YourVm | None]] = {}
_CACHE_SIZE = 64


def your_vm(run: StoredRun) -> YourVm | None:
    """The VM's disk in ``run`` and the comparisons against it; None for a run made without
    ``[matrix] from_vm`` (or whose stored suite no longer loads)."""
    cached = _CACHE.get(id(run))
    if cached is not None and cached[0] is run:
        return cached[1]
    found = _your_vm(run)
    if len(_CACHE) >= _CACHE_SIZE:
        _CACHE.pop(next(iter(_CACHE)))
    _CACHE[id(run)] = (run, found)
    return found


def _your_vm(run: StoredRun) -> YourVm | None:
    suite = run.suite.suite
    if suite is None:
        return None
    wanted = reference_configuration(suite)
    reference = suite.matrix.reference
    # A run over several targets measures the VM's disk on each: the comparison is made on
    # the first (the run's primary target), against the configurations on that target.
    config = next((c for c in run.configs if wanted is not None
                   and _off_target(c.params) == wanted.params()), None)
    if config is None or reference is None or suite.matrix.from_vm is None:
        return None
    on = config.params.get(TARGET_AXIS)
    others = [c for c in run.configs if c.mode == config.mode and c.mode != Mode.HOST
              and c.params.get(TARGET_AXIS) == on and c.key != config.key and not is_twin(c)]
    compared: list[VmGain] = []
    if others:
        sub = only_configs(run, {config.key, *(c.key for c in others)})
        sub = sub.model_copy(update={"configs": tuple(
            c.model_copy(update={"params": {VM_AXIS: YOURS if c.key == config.key else c.key}})
            for c in sub.configs)})
        by_metric = {metric: {g.level: g for g in gains(sub, VM_AXIS, metric=metric,
                                                         reference=YOURS, by=())}
                     for metric in (IOPS, LATENCY)}
        for c in others:
            iops, latency = by_metric[IOPS].get(c.key), by_metric[LATENCY].get(c.key)
            if iops is None or latency is None:
                continue        # no workload measured on both sides
            axes = dict.fromkeys([*config.params, *c.params])
            differs = {a: c.params.get(a, "—") for a in axes
                       if c.params.get(a) != config.params.get(a)}
            compared.append(VmGain(key=c.key, label=c.label, params=c.params,
                                   differs=differs, iops=iops, latency=latency))
    return YourVm(from_vm=suite.matrix.from_vm, reference=reference, config=config,
                  gains=tuple(compared))


def _off_target(params: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in params.items() if k != TARGET_AXIS}
