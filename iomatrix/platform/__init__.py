"""What Proxmox VE and libvirt do with a disk's settings (pure): their configuration formats read,
and the QEMU arguments (block graph and devices) they generate for one disk, so that a guest
iomatrix measures can have exactly the platform's graph and a finding transfers.

- ``proxmox``: qemu-server 8 (``-drive``) and 9 (``-blockdev`` under a throttle filter), VM
  configurations (``/etc/pve/qemu-server/ID.conf``, ``qm config``) and ``storage.cfg``.
- ``libvirt``: domain XML (``virsh dumpxml``) and the ``-blockdev`` era nodes and devices.

Every rule cites the qemu-server function it comes from; docs/proxmox-options.md is the table.
"""
