"""What Proxmox VE and libvirt do with a disk's settings (pure): their configuration formats read,
and the QEMU arguments (block graph and devices) they generate for one disk, so that a guest
iomatrix measures can have exactly the platform's graph and a finding transfers.

- ``proxmox``: qemu-server 8 (``-drive``) and 9 (``-blockdev`` under a throttle filter), VM
  configurations (``/etc/pve/qemu-server/ID.conf``, ``qm config``) and ``storage.cfg``.
- ``libvirt``: domain XML (``virsh dumpxml``) and the ``-blockdev`` era nodes and devices.
- ``qemu``: plain QEMU's defaults, when the command line sets nothing.

Every rule cites the qemu-server function it comes from; docs/proxmox-options.md is the table.
"""

from __future__ import annotations

from types import ModuleType

from iomatrix.platform import libvirt, proxmox, qemu
from iomatrix.platform.settings import DiskSettings

PLATFORMS: dict[str, ModuleType] = {"proxmox": proxmox, "libvirt": libvirt, "qemu": qemu}
"""Platform name → its module. Each has TITLE, NAMES (each parameter as it names it),
UNEXPRESSIBLE, ``defaults(storage=, settings=)`` and ``refusal(settings)``; libvirt and proxmox
also GRAPH_DIFFERENCE, libvirt and qemu PLACEHOLDER_IMAGE. A new platform is one module and one
line here."""


def refusal(platform: str, settings: DiskSettings) -> str | None:
    """Why ``platform`` cannot give a guest ``settings``, or None."""
    module = PLATFORMS.get(platform)
    return module.refusal(settings) if module else None
