"""What Proxmox VE and libvirt do with a disk's settings (pure): their configuration formats read,
and the QEMU arguments (block graph and devices) they generate for one disk, so that a guest
iomatrix measures can have exactly the platform's graph and a finding transfers.

- ``proxmox``: qemu-server 8 (``-drive``) and 9 (``-blockdev`` under a throttle filter), VM
  configurations (``/etc/pve/qemu-server/ID.conf``, ``qm config``) and ``storage.cfg``.
- ``libvirt``: domain XML (``virsh dumpxml``) and the ``-blockdev`` era nodes and devices.
- ``qemu``: plain QEMU's defaults, when the command line sets nothing, and iomatrix's own graph
  and devices (what a guest gets on platform ``qemu``).

Every rule cites the qemu-server function it comes from; docs/proxmox-options.md is the table.
"""

from __future__ import annotations

from types import ModuleType

from iomatrix.platform import libvirt, proxmox, qemu
from iomatrix.platform.settings import DiskSettings

PLATFORMS: dict[str, ModuleType] = {"proxmox": proxmox, "libvirt": libvirt, "qemu": qemu}
"""Platform name → its module. Each has TITLE, NAMES (each parameter as it names it),
UNEXPRESSIBLE, ``defaults(storage=, settings=)``, ``refusal(settings)``, and for a disk's
settings (``DiskSettings``) at the platform's ``version`` (None: its default):
``guest_disk_argv(settings, image, version)`` (the disk's QEMU arguments in a guest),
``storage_graph(settings, image, version)`` (its graph in a qemu-storage-daemon),
``graph_shape(settings, version, is_device=)`` (what QEMU must report of that graph) and
``pasted(settings, image=, vmid=, volume=, storage=)`` (what a user pastes); libvirt and
proxmox also GRAPH_DIFFERENCE. A new platform is one module and one line here."""


def platform_version(pve_version: proxmox.PveVersion | None,
                     versions: libvirt.Versions | None) -> object:
    """The version a platform's graph is built for, from a run's settings (None: the
    platform's default). A run sets at most one: ``pve_version`` only on proxmox
    (suite.method.Method), libvirt's versions only on libvirt (drivers.versions)."""
    return pve_version if pve_version is not None else versions


def refusal(platform: str, settings: DiskSettings) -> str | None:
    """Why ``platform`` cannot give a guest ``settings``, or None."""
    module = PLATFORMS.get(platform)
    return module.refusal(settings) if module else None
