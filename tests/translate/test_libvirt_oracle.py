"""`iomatrix translate` against the real libvirtd (`virsh domxml-to-native qemu-argv`, 9.0 here,
11.3 in the Debian 13 pass), disk by disk (iomatrix.testing.libvirt_oracle): generated domains
(hypothesis over iomatrix.testing.libvirt_domains; IOMATRIX_ORACLE_EXAMPLES of them, 40 by
default: bench/translate_oracle.py runs 1,000) and hand-written ones for what generation misses.
No domain may differ without a note on the disk, and none libvirt refuses may get arguments."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TypeVar

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from iomatrix.drivers import libvirt as lvd
from iomatrix.platform import libvirt as lv
from iomatrix.testing.libvirt_domains import DIR, Generated, domain
from iomatrix.testing.libvirt_oracle import Outcome, bench, compare, native
from tests.needs import needs

pytestmark = [pytest.mark.slow, needs("libvirt"), pytest.mark.timeout(4 * lvd.PROBE_TIMEOUT)]

T = TypeVar("T")
EXAMPLES = int(os.environ.get("IOMATRIX_ORACLE_EXAMPLES", "40"))
SHRINK = os.environ.get("IOMATRIX_ORACLE_SHRINK") == "1"
"""Shrink a failing domain to a smallest one (a few hundred virsh calls more)."""


class _Draw:
    """A hypothesis ``draw`` as a :class:`iomatrix.testing.libvirt_domains.Picker`: shrinks
    to each list's first option and to "not this time"."""

    def __init__(self, draw: st.DrawFn) -> None:
        self.draw = draw

    def one(self, options: Sequence[T]) -> T:
        return self.draw(st.sampled_from(options))

    def number(self, low: int, high: int) -> int:
        return self.draw(st.integers(low, high))

    def chance(self, percent: int) -> bool:
        return self.draw(st.integers(0, 99)) >= 100 - percent


@st.composite
def domains(draw: st.DrawFn) -> Generated:
    return domain(_Draw(draw))


@pytest.fixture(scope="module")
def versions() -> lv.Versions:
    return lvd.daemon_versions(lvd.DEFAULT_URI)


def test_generated_domains_differ_only_with_a_note(versions: lv.Versions) -> None:
    phases = [Phase.explicit, Phase.generate] + ([Phase.shrink] if SHRINK else [])

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              phases=phases, suppress_health_check=list(HealthCheck))
    @given(domains())
    def check(generated: Generated) -> None:
        result = compare(generated.xml, native([generated.xml])[0], versions)
        assert not result.outcome.fault, f"{result.outcome.value}\n{generated.xml}\n{result.detail}"

    check()


def _xml(devices: str, *, os: str = "", machine: str = "pc", iothreads: int = 0) -> str:
    return (f"<domain type='qemu'><name>fixture</name><memory unit='MiB'>256</memory>"
            + (f"<iothreads>{iothreads}</iothreads>" if iothreads else "")
            + f"<os><type arch='x86_64' machine='{machine}'>hvm</type>{os}</os>"
            f"<devices>{devices}</devices></domain>")


def _disk(dev: str, bus: str, *, kind: str = "file", device: str = "disk", fmt: str = "raw",
          driver: str = "", within: str = "", inner: str = "", source: str | None = None) -> str:
    where = {"file": f"file='{DIR}/ora-{dev}.{fmt}'", "block": f"dev='{DIR}/dev/ora-{dev}'"}
    return (f"<disk type='{kind}' device='{device}'><driver name='qemu' type='{fmt}' {driver}>"
            f"{within}</driver>"
            + (source if source is not None else f"<source {where.get(kind, '')}/>")
            + f"<target dev='{dev}' bus='{bus}'/>{inner}</disk>")


NBD = "<source protocol='nbd' name='pool/ora-vda'><host name='192.0.2.1'/></source>"
FIXTURES = {
    # hd's bootindex goes to the first disk of any type, here a network disk translate leaves out
    "network-first-boot-hd": _xml(_disk("vda", "virtio", kind="network", source=NBD)
                                  + _disk("vdb", "virtio"), os="<boot dev='hd'/>"),
    # a block CD-ROM that is no CD-ROM drive: host_device, not host_cdrom
    "block-cdrom": _xml(_disk("sda", "sata", kind="block", device="cdrom") + _disk("vda", "virtio")),
    # cache='default' is no cache attribute
    "cache-default": _xml(_disk("vda", "virtio", driver="cache='default'")),
    # node numbers count the floppy and the USB disk translate leaves out
    "floppy-usb-numbering": _xml(_disk("fda", "fdc", device="floppy") + _disk("sda", "usb")
                                 + _disk("vda", "virtio", fmt="qcow2")),
    # a qcow2 over a backing chain with a metadata cache
    "backing-metadata-cache": _xml(_disk(
        "vda", "virtio", fmt="qcow2",
        within="<metadata_cache><max_size unit='KiB'>512</max_size></metadata_cache>",
        inner=f"<backingStore type='file'><format type='qcow2'/>"
              f"<source file='{DIR}/ora-vda~1.qcow2'/></backingStore>")),
    # virtio-scsi with an IOThread per controller, two controllers, disks on both
    "virtio-scsi-two-controllers": _xml(
        "<controller type='scsi' index='0' model='virtio-scsi'><driver iothread='1'/></controller>"
        "<controller type='scsi' index='1' model='virtio-scsi'><driver iothread='1' queues='2'/>"
        "</controller>" + _disk("sda", "scsi")
        + _disk("sdb", "scsi", inner="<address type='drive' controller='1' bus='0' target='0' "
                                     "unit='0'/>"), iothreads=1),
}


_PAIR = _disk("vda", "virtio")
REFUSED = {   # (domain, part of libvirt's reason): issue 36's domains given arguments
    "duplicate-target": (_xml(_PAIR + _disk("vda", "virtio", fmt="qcow2")),
                         "target 'vda' duplicated for disk sources"),
    "two-disks-one-address": (_xml(
        _disk("sda", "scsi") + _disk("sdb", "scsi", inner="<address type='drive' controller='0' "
                                                          "bus='0' target='0' unit='0'/>")),
        "Found duplicate drive address"),
    "pci-address-on-sata": (_xml(_disk("sda", "sata", inner="<address type='pci' domain='0x0000' "
                                                            "bus='0x00' slot='0x09' "
                                                            "function='0x0'/>")),
                            "Invalid address type 'pci' for the disk 'sda' with the bus type"),
    "format-cow": (_xml(_disk("vda", "virtio", fmt="cow")), "'cow' storage format"),
    "format-dir": (_xml(_disk("vda", "virtio", fmt="dir")), "use 'dir' disk type instead"),
    "format-iso": (_xml(_disk("vda", "virtio", fmt="iso")), "storage format 'iso'"),
    "vendor-on-virtio": (_xml(_disk("vda", "virtio", inner="<vendor>ACME</vendor>")),
                         "Only scsi disk supports vendor and product"),
    "shareable-qcow2": (_xml(_disk("vda", "virtio", fmt="qcow2", inner="<shareable/>")),
                        "shared access for disk 'vda' requires"),
    "partition-target": (_xml(_disk("vda1", "virtio")), "partitions can't appear"),
    "floppy-on-second-controller": (_xml(_disk("fdc", "fdc", device="floppy")),
                                    "Only 1 fdc controller"),
    "native-without-cache-none": (_xml(_disk("sda", "usb", driver="io='native'")),
                                  "io='native' needs"),
    "discard-default-on-a-network-disk": (_xml(_disk("vda", "virtio", kind="network", source=NBD,
                                                     driver="discard='default'")),
                                          "Invalid value for attribute 'discard'"),
}


def test_hand_written_domains_differ_only_with_a_note(versions: lv.Versions) -> None:
    every = FIXTURES | {name: xml for name, (xml, _) in REFUSED.items()}
    names = sorted(every)
    results = [compare(every[n], real, versions)
               for n, real in zip(names, native([every[n] for n in names]))]
    faults = [f"{n}: {r.outcome.value}\n{r.detail}" for n, r in zip(names, results)
              if r.outcome.fault]
    refused = {n for n, r in zip(names, results) if r.outcome is Outcome.REFUSED_BOTH}
    assert refused >= set(REFUSED), versions.label
    assert not faults, "\n".join(faults)


BENCH = int(os.environ.get("IOMATRIX_ORACLE_BENCH", "0"))


@pytest.mark.skipif(not BENCH, reason="the bench's count (bench/translate_oracle.py), where "
                    "only a test runs (the Debian 13 pass): IOMATRIX_ORACLE_BENCH=1000")
def test_bench_counts() -> None:
    report, counts = bench(BENCH, examples=10, show=Outcome.TRANSLATE_REFUSES.value)
    print(report)
    assert not [o for o in counts if o.fault], report
