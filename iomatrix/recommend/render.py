"""A recommended configuration as each platform takes it (pure): what a user pastes is the
platform module's (``PLATFORMS[name].pasted``: a ``qm set`` line for Proxmox VE, domain XML
fragments for libvirt, ``-object``/``-blockdev``/``-device`` arguments for QEMU).

The configuration must be one QEMU 7.2 accepts (:func:`iomatrix.suite.expand.invalid_reason`)
and the platform can express: anything else is refused with InvalidCombination, so nothing QEMU
would reject is ever printed. What a platform cannot express (a Proxmox virtio disk has no
``queues=``; libvirt's virtio-scsi controller no virtqueue size) is left out and said in a note,
never dropped silently.
"""

from __future__ import annotations

from iomatrix.core.errors import InvalidCombination
from iomatrix.platform import PLATFORMS
from iomatrix.platform.proxmox import PLACEHOLDER_VMID, PLACEHOLDER_VOLUME
from iomatrix.platform.settings import Pasted
from iomatrix.recommend.defaults import UNEXPRESSIBLE
from iomatrix.vocab.axes import Platform
from iomatrix.suite.expand import invalid_reason
from iomatrix.suite.configuration import Configuration
from iomatrix.vocab.words import Mode


class Rendered(Pasted):
    """What to paste on ``platform``, its parts for programs, and notes on what was left out."""

    platform: Platform


def render(platform: Platform, config: Configuration, *, vmid: str = PLACEHOLDER_VMID,
           volume: str = PLACEHOLDER_VOLUME, image: str | None = None,
           storage: str = "other") -> Rendered:
    """``config`` for ``platform``; InvalidCombination when QEMU 7.2 or the platform refuses it.
    ``vmid``, ``volume`` and ``storage`` are for Proxmox VE, ``image`` for the others."""
    reason = invalid_reason(config.model_copy(update={"mode": Mode.GUEST}))
    if reason is None:
        reason = UNEXPRESSIBLE[platform].get(("controller", str(config.controller)))
    if reason is None:
        try:
            pasted = PLATFORMS[platform].pasted(config, vmid=vmid, volume=volume, image=image,
                                                storage=storage)
            return Rendered(platform=platform, **pasted.model_dump())
        except ValueError as exc:
            reason = str(exc)
    raise InvalidCombination(f"{config.key}: {reason}")
