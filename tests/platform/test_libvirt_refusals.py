"""Domains libvirt refuses are refused by translate with libvirt's reason, whatever the disk
(iomatrix.platform.libvirt.validate): the cases issue 36 found given arguments. libvirt's own
answer for the same domains: tests/translate/test_libvirt_oracle.py (real libvirtd)."""

from __future__ import annotations

import pytest

from iomatrix.platform import libvirt as lv
from iomatrix.translate.vm import translate
from tests.translate.test_libvirt_oracle import REFUSED


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_translate_refuses_what_libvirt_refuses(name: str) -> None:
    xml, reason = REFUSED[name]
    with pytest.raises(ValueError, match="libvirt refuses this domain: ") as caught:
        translate(xml)
    assert reason in str(caught.value)


@pytest.mark.parametrize("where", ["<target dev='sdzzzzzz' bus='sata'/>",
                                   "<target dev='sda' bus='scsi'/><address type='drive' "
                                   "controller='100000000' bus='0' target='0' unit='0'/>",
                                   "<target dev='sda' bus='scsi'/><address type='drive' "
                                   "controller='-1' bus='0' target='0' unit='0'/>"])
def test_a_controller_index_libvirt_would_add_for_ever_is_refused(where: str) -> None:
    """libvirt adds every controller up to the highest a disk names (9.0 spins for ever on
    sdzzzzzz); translate reads up to MAX_CONTROLLER and refuses beyond, with the disk named."""
    xml = ("<domain type='kvm'><name>d</name><devices><disk type='file' device='disk'>"
           f"<driver name='qemu' type='raw'/><source file='/x.raw'/>{where}</disk></devices>"
           "</domain>")
    with pytest.raises(ValueError, match="sda|sdzzzzzz"):
        translate(xml)


OLD, NEW = lv.Versions(libvirt=(9, 0, 0), qemu=(7, 2, 0)), lv.Versions()


@pytest.mark.parametrize("disk, reason", [
    ("<disk type='block' device='lun'><driver name='qemu' type='raw'/><source dev='/dev/x'/>"
     "<target dev='vda' bus='virtio'/></disk>", "SCSI emulation with 'virtio-blk' device"),
    ("<disk type='file' device='disk'><driver name='qemu' type='raw'/><source file='/x.raw'/>"
     f"<target dev='vd{'a' * 40}' bus='virtio'/></disk>", "invalid disk target"),
    ("<disk type='file' device='cdrom'><driver name='qemu' type='raw'/>"
     "<target dev='sda' bus='usb'/></disk>", "'usb' disk must not be empty"),
])
def test_what_only_newer_versions_refuse(disk: str, reason: str) -> None:
    """libvirt 9.0 with QEMU 7.2 takes these (a virtio-blk LUN, a target whose index wraps its C
    int, an empty USB CD-ROM); libvirt 11.3 with QEMU 10.0 refuses them, as the oracle found in
    Debian 13."""
    xml = f"<domain type='kvm'><name>d</name><devices>{disk}</devices></domain>"
    translate(xml, libvirt=OLD)
    with pytest.raises(ValueError, match=reason):
        translate(xml, libvirt=NEW)


@pytest.mark.parametrize("disk", [
    "<disk type='file' device='disk'><driver name='qemu' type='raw'/><source file='/x.raw'/>"
    "<target dev='sda' bus='scsi' removable='on'/></disk>",
    "<disk type='nvme' device='disk'><driver name='qemu' type='raw'/><source type='pci' "
    "managed='yes' namespace='1'><address domain='0x0000' bus='0x01' slot='0x00' "
    "function='0x0'/></source><target dev='sda' bus='usb'/></disk>"])
def test_what_only_older_versions_refuse(disk: str) -> None:
    """A removable SCSI disk: libvirt 9.0 refuses it, 11.3 takes it (and an NVMe source on USB
    is no empty USB drive): the oracle's 11.3 answers in Debian 13."""
    xml = f"<domain type='kvm'><name>d</name><devices>{disk}</devices></domain>"
    translate(xml, libvirt=NEW)
    if "removable" in disk:
        with pytest.raises(ValueError, match="removable is only valid for usb disks"):
            translate(xml, libvirt=OLD)
