"""The report's lever charts: IOPS and host CPU per I/O against the number of IOThreads per
disk and against the number of queues, where a run varies them (issue 35), one line per
configuration without that lever; and the label a configuration has without some of its axes
(the VM-scaling chart's families too)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from pydantic import ValidationError

from iomatrix.core.model import Frozen

if TYPE_CHECKING:
    from iomatrix.store.records import ConfigRecord

LEVERS = {"iothreads": "IOThreads per disk", "num_queues": "queues per disk"}
"""The levers charted against their level, where a run varies them. The IOThread count is 0
(iothread off), 1 (iothread on, no ``iothreads``) or ``iothreads``; a configuration's queue count
is its ``num_queues`` (QEMU's default, unset, takes no part)."""
LEVER_AXES = {"iothreads": ("iothread", "iothreads"), "num_queues": ("num_queues",)}
"""The axes a lever's chart takes out of a configuration's line label."""


class LeverView(Frozen):
    """Where a configuration sits on a lever's chart (``LEVERS``): its level as a number and the
    label of its line (the configuration without that lever)."""

    level: int
    family: str


def lever_level(lever: str, params: dict[str, str]) -> int | None:
    """A configuration's level of ``lever`` as a number (``LEVERS``), None where it has none."""
    if lever == "iothreads":
        if "iothread" not in params:
            return None
        return 0 if params["iothread"] == "off" else int(params.get("iothreads") or 1)
    value = params.get(lever)
    return int(value) if value and value.isdigit() else None


def levers_of(configs: Iterable["ConfigRecord"]) -> dict[str, dict[str, LeverView]]:
    """Configuration key → lever → its place on the lever's chart, for the levers that take two
    or more levels among the run's guest and blocklayer configurations."""
    configs = [c for c in configs if c.mode != "host"]
    levels = {lever: {c.key: n for c in configs if (n := lever_level(lever, c.params)) is not None}
              for lever in LEVERS}
    out: dict[str, dict[str, LeverView]] = {}
    for lever, by_key in levels.items():
        if len(set(by_key.values())) < 2:
            continue
        for c in configs:
            if c.key in by_key:
                out.setdefault(c.key, {})[lever] = LeverView(
                    level=by_key[c.key], family=family_label(c.mode, c.params, LEVER_AXES[lever]))
    return out


def family_label(mode: str, params: dict[str, str], without: tuple[str, ...] = ("vms",)) -> str:
    """The label a configuration would have with the axes ``without`` (its VM count) left out."""
    from iomatrix.suite.configuration import Configuration

    rest = {k: v for k, v in params.items() if k not in without}
    try:
        return Configuration.model_validate({"mode": mode, **rest}).label
    except ValidationError:   # an axis an older iomatrix stored: name it by its key
        return "/".join([mode, *(f"{k}={v}" for k, v in rest.items())])
