"""Stalled trials (``iomatrix.fio.persecond``) at analysis time: the words ``show``, the report and
``findings`` use, and each configuration's count.

A stalled trial is stored ok, with figures; its point leaves it out of its figures, and so out
of every gain, unless the run is loaded with its stalled trials (``--with-stalled``:
``with_stalled``). A configuration that stalls is a finding in itself, whatever its gains: it
is counted per configuration (``by_config``) and listed by ``findings``."""

from __future__ import annotations

from collections.abc import Iterable

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


def counted(run: StoredRun, config_key: str, label: str) -> ConfigStalls:
    """One configuration's ok trials checked for stalls, and those that stalled."""
    checked = [t for t in run.trials if t.config_key == config_key
               and t.status == TrialStatus.OK and t.stall is not None and t.stall.checked]
    bad = [t.stall.longest_s or 0.0 for t in checked if t.stalled and t.stall is not None]
    return ConfigStalls(config_key=config_key, label=label, trials=len(checked),
                        stalled=len(bad), longest_s=max(bad, default=0.0))


def by_config(run: StoredRun) -> list[ConfigStalls]:
    """The configurations of ``run`` with a stalled trial, in the run's order."""
    return [c for c in (counted(run, config.key, config.label) for config in run.configs)
            if c.stalled]


class StallContrast(Frozen):
    """A configuration's stalls in two runs (``compare``): where one stalls and the other not,
    the difference is a finding whatever the figures say (a stalled trial is out of them)."""

    a: ConfigStalls | None
    """Its stalls in run A; None when A has no such configuration."""
    b: ConfigStalls | None

    @property
    def where(self) -> str:
        """Which run stalls: "A only", "B only" or "both"."""
        a, b = (s is not None and s.stalled > 0 for s in (self.a, self.b))
        return "both" if a and b else "A only" if a else "B only"

    @property
    def text(self) -> str:
        def side(name: str, s: ConfigStalls | None) -> str:
            if s is None:
                return f"{name}: not measured"
            if not s.trials:
                return f"{name}: no trial checked"
            if not s.stalled:
                return f"{name}: 0 of {s.trials} stalled"
            return (f"{name}: {s.stalled} of {s.trials} stalled (longest "
                    f"{s.longest_s:.1f} s without a completion)")

        names = [s.label for s in (self.a, self.b) if s is not None]
        label = names[0] if len(set(names)) == 1 else " ↔ ".join(names)
        return (f"{label}: stalls in {self.where} · {side('A', self.a)} · "
                f"{side('B', self.b)}")


def contrast(a: StoredRun, b: StoredRun,
             pairs: Iterable[tuple[str, str]] = ()) -> list[StallContrast]:
    """The configurations that stalled in ``a`` or ``b``, each beside its counterpart in the
    other run (``pairs``: (key in a, key in b), as ``compare`` paired them; a configuration
    not paired has none), in A's order, then B's."""
    labels_a = {c.key: c.label for c in a.configs}
    labels_b = {c.key: c.label for c in b.configs}
    partner = dict(pairs)
    out: list[StallContrast] = []
    for key, label in labels_a.items():
        other = partner.get(key, "")
        one = StallContrast(a=counted(a, key, label),
                            b=counted(b, other, labels_b[other]) if other in labels_b else None)
        if any(s is not None and s.stalled for s in (one.a, one.b)):
            out.append(one)
    paired_b = set(partner.values())
    out += [StallContrast(a=None, b=s) for s in by_config(b) if s.config_key not in paired_b]
    return out
