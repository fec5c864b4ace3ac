"""Points served from RAM: the rule, the words ``show``, the report and ``recommend`` use, and
whether the run asked for a working set in RAM (``[target] working_set = "in-ram"``).

The share itself (what reached the target's device, per direction and trial) is measured in
``iomatrix.telemetry.pagecache`` and averaged per point in ``iomatrix.analysis.points``."""

from __future__ import annotations

from collections.abc import Iterable

from iomatrix.analysis.points import Point, points
from iomatrix.core.model import Frozen
from iomatrix.store.records import StoredRun
from iomatrix.telemetry.pagecache import RAM_SHARE

MARK = "[RAM]"
"""How ``show`` marks a point served from RAM."""
MARK_UNKNOWN = "[RAM?]"
"""How ``show`` marks a page-cache point whose share could not be measured."""
RULE = (f"{MARK}: the configuration reads and writes through the host page cache (cache "
        "writethrough, writeback or unsafe) and less than "
        f"{RAM_SHARE:.0%} of fio's read bytes, or of its write bytes, reached the target's "
        "device during the trial (/proc/diskstats against fio's own bytes over its measured "
        "window, mean over samples): the figure measures the host's RAM, not the storage. "
        "Writes count only when written during the trial; writeback writes them later")
UNKNOWN = (f"{MARK_UNKNOWN}: the configuration uses the host page cache, but what reached the "
           "storage could not be measured")
ADVICE = ('measure with [target] working_set = "exceed-ram" (images twice the host\'s RAM), or '
          'say [target] working_set = "in-ram" if RAM is what you mean to measure')


class PageCacheSummary(Frozen):
    """A run's (or a set of points') page-cache points, counted."""

    points: int
    """Points of configurations that use the host page cache."""
    from_ram: int
    unknown: int
    reasons: tuple[str, ...] = ()
    """Why the share is unknown, each reason once."""


def summary(found: Iterable[Point]) -> PageCacheSummary:
    cached = [p for p in found if p.device_share is not None and p.samples]
    unknown = [p for p in cached if not p.device_share.known]  # type: ignore[union-attr]
    return PageCacheSummary(
        points=len(cached), from_ram=sum(p.from_ram for p in cached), unknown=len(unknown),
        reasons=tuple(dict.fromkeys(p.device_share.reason or "" for p in unknown  # type: ignore[union-attr]
                                    if p.device_share.reason)))  # type: ignore[union-attr]


class LevelCount(Frozen):
    """One level of an axis: its points, those served from RAM, and their device shares."""

    points: int = 0
    from_ram: int = 0
    shares: tuple[float, ...] = ()


_BY_LEVEL: dict[tuple[int, str, tuple[str, ...], str | None],
                tuple[StoredRun, dict[str, LevelCount]]] = {}
_BY_LEVEL_SIZE = 64


def from_ram_by_level(run: StoredRun, axis: str, levels: Iterable[str],
                      mode: str | None = None) -> dict[str, LevelCount]:
    """Per level of ``axis`` among ``levels`` (every level when empty), in ``mode`` (every
    mode when None): its measured points and how many were served from RAM.

    Kept per run object (held, so that its id is not reused; a stored run is immutable):
    recommend asks the same for every platform, each a pass over every point."""
    key = (id(run), axis, tuple(levels), mode)
    cached = _BY_LEVEL.get(key)
    if cached is not None and cached[0] is run:
        return dict(cached[1])
    found = _by_level(run, axis, set(key[2]), mode)
    if len(_BY_LEVEL) >= _BY_LEVEL_SIZE:
        _BY_LEVEL.pop(next(iter(_BY_LEVEL)))
    _BY_LEVEL[key] = (run, found)
    return dict(found)


def _by_level(run: StoredRun, axis: str, wanted: set[str],
              mode: str | None) -> dict[str, LevelCount]:
    configs = {c.key: c for c in run.configs}
    counts: dict[str, list[int]] = {}
    shares: dict[str, list[float]] = {}
    for p in points(run):
        config = configs.get(p.config_key)
        level = config.params.get(axis) if config is not None else None
        if (level is None or (wanted and level not in wanted) or not p.samples
                or (mode is not None and config.mode != mode)):  # type: ignore[union-attr]
            continue
        count = counts.setdefault(level, [0, 0])
        mine = shares.setdefault(level, [])
        count[0] += 1
        if p.from_ram:
            assert p.device_share is not None
            count[1] += 1
            mine += [v for v in (p.device_share.read, p.device_share.write) if v is not None]
    return {level: LevelCount(points=n, from_ram=ram, shares=tuple(shares[level]))
            for level, (n, ram) in counts.items()}


def share_range(values: Iterable[float]) -> str:
    """Shares as a range of percentages ("1%–4%"), or one ("2%") when they round alike."""
    values = list(values)
    low, high = f"{min(values):.0%}", f"{max(values):.0%}"
    return low if low == high else f"{low}–{high}"


def mark(point: Point) -> str:
    """``MARK``, ``MARK_UNKNOWN`` or ""."""
    if point.from_ram:
        return MARK
    if point.device_share is not None and point.samples and not point.device_share.known:
        return MARK_UNKNOWN
    return ""


def working_set(run: StoredRun) -> str:
    """The run's ``[target] working_set`` ("size" when its suite text does not say)."""
    return run.suite.working_set
