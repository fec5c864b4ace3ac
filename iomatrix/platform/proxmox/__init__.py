"""Proxmox VE's qemu-server: a drive line → the QEMU arguments it generates (pure).

Transcribed from qemu-server's source (``src/PVE/QemuServer.pm`` ``config_to_command`` and
``print_drive_commandline_full``, ``src/PVE/QemuServer/Drive.pm``, ``DriveDevice.pm``
``print_drivedevice_full`` and ``scsihw_infos``, ``Blockdev.pm`` ``generate_drive_blockdev``)
and checked against its ``test/cfg2cmd`` fixtures; docs/proxmox-options.md has the table.

Two generations:

- **PVE 8** (qemu-server 8.x, and any VM whose machine version is below 10.0): one ``-drive
  file=…,if=none,id=drive-<bus><n>,…`` per disk; QEMU names the nodes itself.
- **PVE 9** (qemu-server 9.x with machine version 10.0 or later): an empty ``throttle-group``
  object per disk and one nested ``-blockdev``: a ``throttle`` filter node ``drive-<bus><n>`` over
  the format node ``f<hash>`` over the protocol node ``e<hash>``, every node with ``discard``
  and ``detect-zeroes``; the device gets ``write-cache=`` (and SCSI disks ``device_id=``).

What does not bear on I/O is left out and said so (``OMITTED``): PCI addresses (``bus=pci.N,
addr=…``) and the rest of the VM. A drive's ``bootindex`` is qemu-server's (:func:`boot_order`).

The package, by qemu-server's seams: :mod:`.config` (a VM configuration read: drives, boot
order, machine version), :mod:`.storage` (``storage.cfg`` and a drive's volume on it),
:mod:`.rules` (Drive.pm's cache, aio, detect-zeroes and throttling rules), :mod:`.drive` (a
drive's command line: PVE 8's ``-drive``, the devices, controllers, EFI disk and TPM),
:mod:`.blockdev` (PVE 9's ``-blockdev`` under a throttle filter, and a storage daemon's graph),
:mod:`.defaults` (defaults, refusals and the ``qm set`` line a user pastes) and :mod:`.disk`
(an iomatrix disk as a drive line, in a guest and a daemon, and a drive back as iomatrix
values). Everything public is re-exported here: the platform module
``iomatrix.platform.PLATFORMS`` names is this package.
"""

from __future__ import annotations

from iomatrix.platform.proxmox.blockdev import (DaemonGraph, daemon_detect_zeroes, daemon_graph,
                                                drive_blockdev, node_name, throttle_group, to_json)
from iomatrix.platform.proxmox.config import (BUSES, DEFAULT_PVE_VERSION, DRIVE_KEY, IO_OPTIONS,
                                              NON_QEMU_OPTIONS, OMITTED, PVE_VERSIONS, SCSIHW,
                                              SCSIHW_DEFAULT, THROTTLE_OPTIONS, UNMODELLED_OPTIONS,
                                              Drive, PveVersion, VmConfig, boot_order, drive_order,
                                              is_q35, machine_type, parse_config, parse_drive,
                                              pinned_version, version_of_machine,
                                              version_of_pveversion)
from iomatrix.platform.proxmox.defaults import (CONTROLLER_BUS, GRAPH_DIFFERENCE,
                                                IOTHREAD_CONTROLLERS, NAMES, NON_IO_URING_STORAGES,
                                                NO_AIO_STORAGES, PLACEHOLDER_VMID,
                                                PLACEHOLDER_VOLUME, SCSIHW_CONTROLLER,
                                                STORAGE_CHOICES, TITLE, UNEXPRESSIBLE, aio_default,
                                                cache_default, defaults, pasted, qm_set, refusal)
from iomatrix.platform.proxmox.disk import (DAEMON_BUS, configuration_of, drive_for, graph_shape,
                                            guest_disk_argv, storage_graph)
from iomatrix.platform.proxmox.drive import (OVMF_DIR, OVMF_VARS_SIZE, DiskArgs, controller_of,
                                             disk_args, efidisk_args, ovmf_code, tpm_args)
from iomatrix.platform.proxmox.rules import (aio_option, allows_io_uring_default,
                                             detect_zeroes_option, throttle_limits,
                                             uses_cache_direct)
from iomatrix.platform.proxmox.storage import (BLOCK_STORAGES, CDROM_PATH, CEPH_PRIV,
                                               DEFAULT_STORAGES, FILE_STORAGES, STORAGE_TYPES,
                                               Storage, Volume, parse_storage_cfg, resolve_volume)
from iomatrix.platform.proxmox.args import (ARGS_WARNING, ArgsDisk, affinity_of, args_line,
                                            parse_args)
