"""Stalled trials (``iomatrix.fio.persecond``) at analysis time: the words ``show``, the report and
``findings`` use, and each configuration's count.

A stalled trial is stored ok, with figures; its point leaves it out of its figures, and so out
of every gain, unless the run is loaded with its stalled trials (``--with-stalled``:
``with_stalled``). A configuration that stalls is a finding in itself, whatever its gains: it
is counted per configuration (``by_config``) and listed by ``findings``."""

from __future__ import annotations

from iomatrix.core.model import Frozen
from iomatrix.fio.persecond import STALL_S
from iomatrix.store.records import StoredRun
from iomatrix.vocab.words import TrialStatus

MARK = "[STALL]"
"""How ``show`` marks a point with a stalled trial."""
RULE = (f"{MARK}: a trial went {STALL_S:g} s or more without a completed request while fio "
        "kept I/O queued (fio's IOPS log, or QEMU's device counters in guests). Its figures hide "
        "the stall in their mean: it is left out of its point's figures and of every gain "
        "unless asked (--with-stalled), and its configuration is listed as one that stalls")


def with_stalled(run: StoredRun) -> StoredRun:
    """``run`` whose points keep their stalled trials in their figures."""
    return run.model_copy(update={"with_stalled": True})


class ConfigStalls(Frozen):
    """One configuration's stalled trials."""

    config_key: str
    label: str
    trials: int
    """Its ok trials checked for stalls."""
    stalled: int
    longest_s: float
    """The longest span any of them went without a completion, seconds."""

    @property
    def text(self) -> str:
        return (f"{self.label}: {self.stalled} of {self.trials} checked trials stalled "
                f"(longest {self.longest_s:.1f} s without a completion)")


def by_config(run: StoredRun) -> list[ConfigStalls]:
    """The configurations of ``run`` with a stalled trial, in the run's order."""
    out = []
    for config in run.configs:
        checked = [t for t in run.trials if t.config_key == config.key
                   and t.status == TrialStatus.OK and t.stall is not None and t.stall.checked]
        bad = [t for t in checked if t.stalled]
        if bad:
            out.append(ConfigStalls(config_key=config.key, label=config.label,
                                    trials=len(checked), stalled=len(bad),
                                    longest_s=max(t.stall.longest_s or 0.0 for t in bad
                                                  if t.stall is not None)))
    return out
