"""The parameters a recommendation decides, and each platform's defaults, names and limits as
its module in :mod:`iomatrix.platform` states them (pure).

The platform modules transcribe ``docs/qemu-disk-options.md``. A value that the reference does
not document is not invented: the platform then has no default for that parameter
(``PlatformDefault.level`` None) and the recommendation compares against a measured reference
level instead.
"""

from __future__ import annotations

from typing import cast

from iomatrix.platform import PLATFORMS as MODULES
from iomatrix.platform.settings import PlatformDefault
from iomatrix.vocab.axes import NOT_SETTINGS as AXIS_NOT_SETTINGS
from iomatrix.vocab.axes import Platform
from iomatrix.suite.matrix import Matrix

PLATFORMS = cast(tuple[Platform, ...], tuple(MODULES))
"""Every platform, in the registry's order (the order recommend shows them in)."""
TITLES: dict[Platform, str] = {p: MODULES[p].TITLE for p in PLATFORMS}

NOT_SETTINGS = {
    **AXIS_NOT_SETTINGS,
    "target": "the storage measured, not a disk setting: each recommended level rests on pairs "
              "measured on the same target, pooled over the targets (gains held per target "
              "are in `iomatrix analyze` and the report)",
}
"""Run axes that a recommendation reports but does not turn into a setting, and why."""

NAMES: dict[Platform, dict[str, str]] = {p: MODULES[p].NAMES for p in PLATFORMS}
"""Each parameter as each platform names it."""
UNEXPRESSIBLE: dict[Platform, dict[tuple[str, str], str]] = {
    p: MODULES[p].UNEXPRESSIBLE for p in PLATFORMS}
"""(axis, level) a platform cannot be told to use."""


def defaults(platform: Platform, *, storage: str = "other",
             settings: dict[str, str] | None = None) -> dict[str, PlatformDefault]:
    """Every parameter's default on ``platform``. Defaults that depend on other settings
    (Proxmox's aio on the cache, iothread on the controller) follow ``settings``."""
    result: dict[str, PlatformDefault] = MODULES[platform].defaults(storage=storage,
                                                                    settings=settings)
    return result


FALLBACK = {axis: _fallback for axis, _fallback in (
    ("controller", Matrix.model_fields["controller"].default[0]),
    ("aio", Matrix.model_fields["aio"].default[0]),
    ("cache", Matrix.model_fields["cache"].default[0]),
    ("format", Matrix.model_fields["format"].default[0]),
    ("preallocation", Matrix.model_fields["preallocation"].default[0]),
)}
"""What is rendered for a parameter the platform has no default for and the run did not measure:
iomatrix's own matrix defaults (Proxmox VE's choices for a new Linux VM)."""
