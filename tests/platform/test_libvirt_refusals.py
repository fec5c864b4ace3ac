"""Domains libvirt refuses are refused by translate with libvirt's reason, whatever the disk
(iomatrix.platform.libvirt.validate): the cases issue 36 found given arguments. libvirt's own
answer for the same domains: tests/translate/test_libvirt_oracle.py (real libvirtd)."""

from __future__ import annotations

import pytest

from iomatrix.translate.vm import translate
from tests.translate.test_libvirt_oracle import REFUSED


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_translate_refuses_what_libvirt_refuses(name: str) -> None:
    xml, reason = REFUSED[name]
    with pytest.raises(ValueError, match="libvirt refuses this domain: ") as caught:
        translate(xml)
    assert reason in str(caught.value)
