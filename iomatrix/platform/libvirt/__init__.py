"""libvirt: a domain's disks → the QEMU arguments libvirt generates for them (pure).

The ``-blockdev`` era (libvirt 5.10 on), as libvirt's qemu driver builds it (qemu_block.c,
qemu_command.c, qemu_domain.c, qemu_alias.c, conf/domain_conf.c), checked argument by argument
against ``virsh domxml-to-native qemu-argv`` of libvirtd 9.0 (Debian 12, QEMU 7.2) and 11.3
(Debian 13, QEMU 10.0) in tests/scenarios/test_libvirt.py; PCI placement (``bus``/``addr``) is left out:

* **Disk order.** Each disk joins the disks of its bus, ordered by the index of its target
  name; a disk of a bus not seen yet goes last (virDomainDiskInsert).
* **Node numbers.** libvirt walks the disks from the last to the first and numbers each one,
  every disk of the domain (those not rendered here too: network, floppy, USB, volume, NVMe),
  CD-ROMs included, an empty drive too (its number names no node: it opens nothing):
  ``libvirt-N-storage`` and, where there is one, ``libvirt-N-format``; then the disk's data
  store (libvirt 10.10 on) and its ``<backingStore>`` images (:mod:`.elements`,
  :mod:`.nodes`). A chain the XML does not give, which a real start probes, is not numbered by
  ``domxml-to-native`` either.
* **The nodes, by version** (:class:`Versions`). Up to libvirt 10.0 every disk gets a format
  node, also a raw one (qemuBlockStorageSourceNeedsFormatLayer in 10.0.0 skips it only for a
  raw ``<slice>``). From :data:`RAW_LAYER_DROPPED` a raw disk has none when the QEMU has
  ``backing-mask-protocol`` on block-commit/block-stream (QEMU 9.0, :data:`BACKING_MASK_QEMU`):
  the device sits on the storage node, which then carries ``read-only``, discard and
  detect-zeroes itself (libvirt commit 6eaf3614, "Stop using the 'raw' format driver in cases
  when it's not needed"). libvirt 10.0 also reordered the storage node's keys
  (qemuBlockStorageSourceAddBlockdevCommonProps): ``auto-read-only``, ``discard``, then
  ``cache``.
* **Ids.** ``virtio-disk<i>`` from the target name's index; ``<bus><controller>-<bus>-<unit>``
  (and ``-<target>-`` for SCSI but LSI) from the drive address, by default the target name's
  index split as SCSI 7 units a controller, SATA 6, IDE 2 units on 2 buses
  (virDomainDiskDefAssignAddress). A controller a disk names but the XML lacks is added (SCSI:
  lsilogic, QEMU's default on x86); the PIIX IDE of ``pc`` and the SATA of ``q35`` are built in.
* **Devices.** ``bootindex`` from ``<boot order>`` or ``<os><boot dev>`` (default ``hd``): the
  first disk of any type and bus gets the ``hd`` index, the first CD-ROM the ``cdrom`` one
  (qemuProcessPrepareDeviceBootorder); ``write-cache`` where a cache mode is set; ``<serial>``
  (spaces escaped), SCSI's ``device_id`` (the serial, else ``drive-<id>``), ``werror``/``rerror``
  from the error policies. CD-ROMs are ``ide-cd``/``scsi-cd`` and read-only.

The package, by libvirt's seams: :mod:`.versions` (the libvirt and QEMU modelled),
:mod:`.domain` (the domain XML read: disks, addresses, controllers), :mod:`.args` (the
arguments: iothreads, controllers, nodes, devices), :mod:`.defaults` (defaults, refusals and
the XML a user pastes) and :mod:`.disk` (an iomatrix disk in a guest and a daemon, and a
``<disk>`` back as iomatrix values). Everything public is re-exported here: the platform module
``iomatrix.platform.PLATFORMS`` names is this package.
"""

from __future__ import annotations

from iomatrix.platform.libvirt.args import (SCSI_MODELS, DiskArgs, DomainArgs,
                                            disk_args, domain_args)
from iomatrix.platform.libvirt.defaults import (BUS_OF, CONTROLLER_MODEL, GRAPH_DIFFERENCE,
                                                MODEL_CONTROLLER, NAMES, PLACEHOLDER_IMAGE, TITLE,
                                                UNEXPRESSIBLE, cputune_xml, defaults, disk_for,
                                                disk_xml, pasted, refusal)
from iomatrix.platform.libvirt.nodes import CACHE_FLAGS
from iomatrix.platform.libvirt.disk import (DAEMON_BUS, configuration_of, graph_shape,
                                            guest_disk_argv, storage_graph)
from iomatrix.platform.libvirt.domain import (CONTROLLER_DRIVER_ATTRS, DRIVER_ATTRS, MAX_IOTHREADS,
                                              UNMODELLED_CHILDREN, Controller, CpuTune, Disk,
                                              Domain, disk_index, one_disk_domain, parse_domain)
from iomatrix.platform.libvirt.versions import (BACKING_MASK_QEMU, DEFAULT_LIBVIRT, DEFAULT_QEMU,
                                                IOTHREAD_MAPPING, PROPS_REORDERED,
                                                RAW_LAYER_DROPPED, Version, Versions,
                                                has_format_node, parse_version, shown)
