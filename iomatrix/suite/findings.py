"""[[finding]]: a study's conclusions as claims a run can check (``iomatrix.analysis.findings``)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator

from iomatrix.core.model import Frozen, shown
from iomatrix.suite.fields import (TARGET_AXIS, BlockSize, Fraction, Printable, Rw, as_tuple,
                                   fraction)
from iomatrix.vocab.axes import AXIS_VALUES, BLOCKLAYER_AXES, CLAIMED_AXES, CONFIG_AXES
from iomatrix.vocab.words import Mode

FindingKind = Literal["effect", "ranking", "equivalence", "baseline"]
FindingMetric = Literal["iops", "bw_bytes", "lat_mean_ns", "lat_p99_ns"]
FindingMode = Literal["guest", "blocklayer"]
FINDING_ID = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
VersionComponent = Literal["qemu", "zfs", "proxmox"]
"""What a version that moves a baseline is of (``iomatrix.analysis.baselines``): QEMU, the
ZFS module, the Proxmox VE generation (8, 9)."""
VersionText = Annotated[str, Field(pattern=r"^[0-9]{1,4}(\.[0-9]{1,4}){0,2}$")]

def _levels(value: Any) -> Any:
    """A level or list of levels as a configuration shows it: true → "on", 8 → "8"."""
    if isinstance(value, (list, tuple)):
        return tuple(shown(v) for v in value)
    return shown(value) if isinstance(value, (bool, int, str)) else value


Level = Annotated[str, BeforeValidator(_levels)]
Levels = Annotated[tuple[str, ...], BeforeValidator(lambda v: _levels(as_tuple(v)))]
Percent = Annotated[float, BeforeValidator(fraction), Field(gt=0, le=100)]
"""A percentage that may exceed 100 % ("214%" of bare metal): "90%" or 0.9."""


class FindingWorkloads(Frozen):
    """Which of a run's workloads a claim is about; an absent key takes every value."""

    rw: tuple[Rw, ...] | None = None
    """Only these fio rw values."""
    bs: tuple[BlockSize, ...] | None = None
    """Only these block sizes."""
    iodepth: tuple[Annotated[int, Field(ge=1)], ...] | None = None
    """Only these queue depths."""
    numjobs: tuple[Annotated[int, Field(ge=1)], ...] | None = None
    """Only these job counts."""
    rate_iops: tuple[Annotated[int, Field(ge=0)], ...] | None = None
    """Only these IOPS caps."""

    @field_validator("rw", "bs", "iodepth", "numjobs", "rate_iops", mode="before")
    @classmethod
    def _listed(cls, value: Any) -> Any:
        return None if value is None else as_tuple(value)


class Finding(Frozen):
    """One [[finding]] table: a conclusion of the study a suite transcribes, with the figure it
    published and a form a stored run can check (``iomatrix.analysis.findings``).

    kind effect: ``level`` of ``axis`` against ``reference`` on ``metric`` is ``expect``
    (better or worse, in the metric's own sense: lower latency is better), optionally by
    ``at_least`` (a fraction: "10%"). ranking: the ``best`` levels beat every other level
    (of ``levels``, default all the run has), the ``worst`` are beaten by every other.
    equivalence: ``level`` and ``reference`` within ±``margin``. baseline: the configurations
    with ``axis`` = ``level`` reach ``at_least`` of bare metal ("90%"; may exceed 100 %).
    Every kind: ``where`` keeps only configurations with those values, ``per`` must hold at
    each level of those axes separately, ``workloads`` picks the workloads, ``modes`` the modes
    it is checked in (default: guest, and blocklayer where ``axis`` is one of BLOCKLAYER_AXES)."""

    id: str = Field(min_length=1, max_length=60, pattern=FINDING_ID)
    """The claim's name within the suite: letters, digits, ``.``, ``_`` and ``-``."""
    study: Printable = Field(min_length=1, max_length=200)
    """The citation: seed and section ("seed 000 §FINDINGS")."""
    claim: Printable = Field(min_length=1, max_length=1000)
    """The conclusion, as the study states it."""
    published: Printable = Field(min_length=1, max_length=1000)
    """The figure the study published for it, in its words and numbers."""
    kind: FindingKind
    """The form of the claim: effect, ranking, equivalence or baseline (above)."""
    axis: Literal[(*CLAIMED_AXES, TARGET_AXIS)] | None = None  # type: ignore[valid-type]
    """target: the run's targets by name ([[targets]] name, or a [target] filesystems entry)."""
    level: Level | None = None
    """The level the claim is about (effect, equivalence, baseline)."""
    reference: Level | None = None
    """The level it is compared with (effect, equivalence)."""
    best: Levels = ()
    """ranking: the levels that beat every other."""
    worst: Levels = ()
    """ranking: the levels every other beats."""
    levels: Levels = ()
    """ranking: the levels compared; absent: every level the run has."""
    metric: FindingMetric = "iops"
    """What is compared: iops, bw_bytes, lat_mean_ns or lat_p99_ns."""
    expect: Literal["better", "worse"] | None = None
    """effect: better or worse, in the metric's own sense (lower latency is better)."""
    at_least: Percent | None = None
    """effect: by at least this much ("10%"); baseline: at least this share of bare metal
    ("90%")."""
    margin: Fraction | None = None
    """equivalence: within plus or minus this ("5%")."""
    where: dict[str, Levels] = {}
    """Only the configurations with these values (``{ cache = "none" }``)."""
    per: tuple[str, ...] = ()
    """Axes at each level of which the claim must hold separately."""
    workloads: FindingWorkloads = FindingWorkloads()
    """Which of the run's workloads the claim is about (``FindingWorkloads``); absent: all."""
    modes: tuple[FindingMode, ...] = ()
    """Empty: the default above, guest first (the study's own mode decides where measured)."""
    versions: dict[VersionComponent, VersionText] = {}
    """The versions the study measured with (``{ qemu = "8.2", zfs = "2.2" }``): the check
    warns, naming the change, when the run and the study lie on either side of one that moves
    baselines (``iomatrix.analysis.baselines``)."""

    @field_validator("per", "modes", mode="before")
    @classmethod
    def _listed(cls, value: Any) -> Any:
        return as_tuple(value)

    @model_validator(mode="after")
    def _complete(self) -> "Finding":
        need = {"effect": ("axis", "level", "reference", "expect"),
                "ranking": ("axis",), "equivalence": ("axis", "level", "reference", "margin"),
                "baseline": ("at_least",)}[self.kind]
        for key in need:
            if getattr(self, key) is None:
                raise ValueError(f"a {self.kind} finding needs {key}")
        if self.kind == "ranking" and not (self.best or self.worst):
            raise ValueError("a ranking finding needs best or worst (or both)")
        if self.kind == "baseline" and (self.axis is None) != (self.level is None):
            raise ValueError("a baseline finding names axis and level together (or neither)")
        if self.kind in ("effect", "equivalence") and self.level == self.reference:
            raise ValueError(f"level and reference are both {self.level!r}")
        if set(self.best) & set(self.worst):
            raise ValueError("a level cannot be both best and worst")
        if self.at_least is not None and self.kind not in ("effect", "baseline"):
            raise ValueError(f"at_least is for effect and baseline findings, not {self.kind}")
        if self.at_least is not None and self.kind == "effect" and self.at_least >= 1 \
                and self.metric in ("lat_mean_ns", "lat_p99_ns"):
            raise ValueError("a latency cannot fall by 100 % or more")
        for axis in (*self.per, *self.where):
            if axis not in (*CONFIG_AXES, TARGET_AXIS):
                raise ValueError(f"{axis!r} is not an axis ({', '.join(CONFIG_AXES)}, "
                                 f"{TARGET_AXIS})")
        if self.axis is not None and (self.axis in self.per or self.axis in self.where):
            raise ValueError(f"{self.axis} is the axis compared: it cannot be in per or where")
        named = [(self.axis, v) for v in (self.level, self.reference, *self.best, *self.worst,
                                          *self.levels) if v is not None]
        named += [(a, v) for a, values in self.where.items() for v in values]
        for axis, value in named:
            allowed = AXIS_VALUES.get(axis or "")
            if allowed is not None and value not in allowed:
                raise ValueError(f"{axis} has no level {value!r} ({', '.join(allowed)})")
            if allowed is None and axis not in (None, TARGET_AXIS) and not value.isdigit():
                raise ValueError(f"{axis} levels are numbers, not {value!r}")
        return self

    @property
    def checked_modes(self) -> tuple[str, ...]:
        """The modes the claim is checked in, the one that decides first where measured."""
        if self.modes:
            return self.modes
        return (Mode.GUEST, Mode.BLOCKLAYER) if self.axis in BLOCKLAYER_AXES else (Mode.GUEST,)

