"""Guest kinds (iomatrix.drivers.guest.kind, .kinds): which kinds a suite boots, which kind boots
a configuration, and what each says without booting (booting them: test_guest.py,
test_own_guest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from iomatrix.appliance.protocol import GuestDisk
from iomatrix.core.errors import TrialFailed
from iomatrix.drivers.guest import kinds
from iomatrix.drivers.guest.appliance import ApplianceGuest
from iomatrix.drivers.guest.image import ImageGuest
from iomatrix.drivers.guest.kinds import cluster_refusal, kind_for, suite_kinds
from iomatrix.drivers.guest.windows import WindowsGuest
from iomatrix.suite.load import load_suite_text
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.model import Suite

DISK = GuestDisk(name="sdb", size_bytes=1 << 26, queues=1, scheduler="none", rotational=False)


def _suite(tmp_path: Path, body: str = "") -> Suite:
    return load_suite_text(f'[suite]\nname = "t"\n[target]\ndirectory = "{tmp_path}"\n'
                           'size = "64MiB"\n[method]\nmode = "guest"\n' + body, source="t.toml")


def _config(guest: str | None) -> Configuration:
    return Configuration(mode="guest", controller="virtio-blk", guest=guest)


def test_a_suite_boots_the_appliance_and_the_kind_its_guest_table_asks_for(
        tmp_path: Path) -> None:
    plain = suite_kinds(_suite(tmp_path))
    assert [type(k) for k in plain] == [ApplianceGuest] and plain[0].label == "appliance"
    for guest in (None, "appliance", "anything"):       # no other kind: the appliance boots
        assert kind_for(plain, _config(guest)) is plain[0]
    assert cluster_refusal(_suite(tmp_path)) is None

    own = _suite(tmp_path, '[guest]\nimage = "/srv/deb.qcow2"\n')
    both = suite_kinds(own)
    assert [type(k) for k in both] == [ApplianceGuest, ImageGuest]
    assert [k.label for k in both] == ["appliance", "deb"]
    assert kind_for(both, _config(None)) is both[0]
    assert kind_for(both, _config("appliance")) is both[0]
    assert kind_for(both, _config("deb")) is both[1]
    with pytest.raises(TrialFailed, match="no guest called 'other' in this run"):
        kind_for(both, _config("other"))
    assert cluster_refusal(own) is None           # the image is sent to the nodes
    booted = _suite(tmp_path, '[guest]\nimage = "/srv/deb.raw"\nkernel = "/srv/vmlinuz"\n')
    assert "kernel and initrd are not sent to the nodes" in (cluster_refusal(booted) or "")


def test_a_kind_listed_before_the_image_takes_the_guest_tables_it_claims(
        tmp_path: Path) -> None:
    """A new kind is one module and one line in KINDS: the Windows kind, listed before the
    general image kind, boots the [guest] tables with os = "windows", and the image kind the
    rest."""
    assert kinds.KINDS.count(WindowsGuest) == 1
    assert kinds.KINDS.index(WindowsGuest) < kinds.KINDS.index(ImageGuest)
    windows = _suite(tmp_path, '[guest]\nimage = "/srv/win.qcow2"\nos = "windows"\n')
    linux = _suite(tmp_path, '[guest]\nimage = "/srv/deb.qcow2"\n')
    assert [type(k) for k in suite_kinds(windows)] == [ApplianceGuest, WindowsGuest]
    assert [type(k) for k in suite_kinds(linux)] == [ApplianceGuest, ImageGuest]
    assert cluster_refusal(windows) == "[guest] (your own Windows image) is not built for it"


def test_each_kind_aims_fio_at_the_disk_as_its_guest_names_it(tmp_path: Path) -> None:
    (appliance, linux) = suite_kinds(_suite(tmp_path, '[guest]\nimage = "/srv/deb.qcow2"\n'))
    libaio = {"ioengine": "libaio", "direct": "1", "filename": "/dev/sdb"}
    assert appliance.fio_target(DISK) == libaio and linux.fio_target(DISK) == libaio
    windows = suite_kinds(_suite(tmp_path, '[guest]\nimage = "/srv/w.qcow2"\nos = "windows"\n'))[1]
    drive = DISK.model_copy(update={"name": "PhysicalDrive1"})
    assert windows.fio_target(drive) == {"ioengine": "windowsaio", "direct": "1", "thread": "1",
                                         "filename": "\\\\.\\PhysicalDrive1"}
    with pytest.raises(ValueError, match="not a Windows physical drive"):
        windows.fio_target(DISK)         # the guest's console named it: checked, never passed on
