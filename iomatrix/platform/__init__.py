"""What Proxmox VE and libvirt do with a disk's settings (pure): their configuration formats read,
and the QEMU arguments (block graph and devices) they generate for one disk, so that a guest
iomatrix measures can have exactly the platform's graph and a finding transfers.

- ``proxmox``: qemu-server 8 (``-drive``) and 9 (``-blockdev`` under a throttle filter), VM
  configurations (``/etc/pve/qemu-server/ID.conf``, ``qm config``) and ``storage.cfg``.
- ``libvirt``: domain XML (``virsh dumpxml``) and the ``-blockdev`` era nodes and devices.

Every rule cites the qemu-server function it comes from; docs/proxmox-options.md is the table.
"""

from __future__ import annotations

from collections.abc import Callable

from iomatrix.platform import libvirt, proxmox
from iomatrix.platform.settings import DiskSettings

REFUSALS: dict[str, Callable[[DiskSettings], str | None]] = {
    "proxmox": proxmox.refusal, "libvirt": libvirt.refusal}
"""Platform name → what it refuses; plain QEMU (iomatrix's own graph) refuses nothing more."""


def refusal(platform: str, settings: DiskSettings) -> str | None:
    """Why ``platform`` cannot give a guest ``settings``, or None."""
    check = REFUSALS.get(platform)
    return check(settings) if check else None
