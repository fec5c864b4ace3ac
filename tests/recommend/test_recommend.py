"""``iomatrix recommend``: the decision rule on made-up runs written to a real store; the Proxmox
``qm set`` line and the libvirt XML checked against what docs/qemu-disk-options.md says those
platforms accept (lists written out again here, so they are checked, not reused, and compared
with the document's tables); and the QEMU arguments started for real under TCG, with QEMU asked
over QMP what it applied."""

from __future__ import annotations

import itertools
import random
import re
import shlex
import subprocess
from collections.abc import Callable
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from iomatrix.core.errors import InvalidCombination
from iomatrix.core.proc import managed, read_text, run as run_tool, wait_for, which
from iomatrix.qemu.args import expected_guest_settings, read_guest_settings
from iomatrix.qemu.procinspect import inspect_process
from iomatrix.qemu.qmp import qmp_execute
from iomatrix.recommend.decide import Recommendation, recommend
from iomatrix.recommend.render import render
from iomatrix.recommend.verdict import pasted_lines
from iomatrix.store.records import StoredRun
from iomatrix.store import Store
from iomatrix.suite.expand import invalid_reason
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.workloads import Workload
from iomatrix.testing.synthetic import Figures, configurations, stored_run, write_run
from tests.conftest import cli_result, reference_table
from tests.needs import needs

WORKLOADS = [Workload(rw="randread", bs=bs, iodepth=qd) for bs in (4096, 65536) for qd in (1, 8, 32)]
Effect = Callable[[Configuration], float]


def _one(_: Configuration) -> float:
    return 1.0


def make_run(tmp_path: Path, mode: str, axes: dict[str, list[object]], iops: Effect = _one,
             latency: Effect | None = None, *, noise: float = 0.01, accelerator: str = "none",
             extra: list[Configuration] | None = None,
             method: dict[str, str | int] | None = None) -> StoredRun:
    """A stored run of every valid combination of ``axes``: IOPS scaled by ``iops(config)``,
    mean latency by ``latency(config)`` (default: Little's law, iodepth / IOPS), with a seeded
    noise of about ``noise`` on both."""
    configs = [c for c in configurations(mode, axes) if invalid_reason(c) is None] + (extra or [])

    def figures(config: Configuration, workload: Workload, index: int) -> Figures:
        rng = random.Random(f"{config.key}|{workload.key}|{index}")
        base = 20000 * 4096 / workload.bs * (1 + workload.iodepth / 8)
        value = base * iops(config) * (1 + rng.gauss(0, noise))
        lat = (workload.iodepth / value * 1e9 if latency is None
               else workload.iodepth / base * 1e9 * latency(config) * (1 + rng.gauss(0, noise)))
        return Figures(value, value * workload.bs, lat, 2 * lat)

    tmp_path.mkdir(parents=True, exist_ok=True)
    return stored_run(tmp_path / "r.db", configs, WORKLOADS, figures, accelerator=accelerator,
                      method=method)


def decision(rec: Recommendation, axis: str):  # type: ignore[no-untyped-def]
    return next(d for d in rec.decisions if d.axis == axis)


SEED_000 = {"controller": ["virtio-scsi-single"], "aio": ["native", "io_uring"],
            "iothread": [True, False], "cache": ["none"], "format": ["raw"]}


def seed_000_effect(config: Configuration) -> float:
    """Seed 000's shape: an iothread helps a lot, native a little."""
    return (1.15 if config.iothread else 1.0) * (1.03 if config.aio == "native" else 1.0)


# -- the decision rule ------------------------------------------------------------------------

def test_seed_000_recommendation_for_proxmox(tmp_path: Path) -> None:
    rec = recommend(make_run(tmp_path, "guest", SEED_000, seed_000_effect), "proxmox")
    aio, iothread = decision(rec, "aio"), decision(rec, "iothread")
    assert (aio.status, aio.value, aio.default.level) == ("change", "native", "io_uring")
    assert "significant" in aio.evidence[0].iops.verdict and aio.evidence[0].iops.relative > 0
    # PVE's GUI default already has an iothread: off is worse, so keep it
    assert (iothread.status, iothread.value, iothread.default.level) == ("keep", "on", "on")
    assert "keep the default" in iothread.reason
    assert decision(rec, "controller").status == "not measured"
    assert render("proxmox", rec.config).text == (
        "qm set <vmid> --scsihw virtio-scsi-single "
        "--scsi0 <storage>:<volume>,aio=native,iothread=1,cache=none")
    # made with iomatrix's own graph, not PVE's: said (rule 9)
    assert len(rec.warnings) == 1 and "block graph differed from Proxmox VE's" in rec.warnings[0]


def test_seed_000_for_libvirt_compares_with_libvirts_defaults(tmp_path: Path) -> None:
    rec = recommend(make_run(tmp_path, "guest", SEED_000, seed_000_effect), "libvirt")
    iothread = decision(rec, "iothread")
    assert (iothread.status, iothread.value, iothread.default.level) == ("change", "on", "off")
    # libvirt's default aio is QEMU's threads, which the run did not measure
    assert decision(rec, "aio").status == "not evaluated"
    assert decision(rec, "aio").value == "threads"
    # the cache stays QEMU's writeback, which is never given without its caveat
    cache = decision(rec, "cache")
    assert cache.value == "writeback" and "flushes" in cache.caveat
    assert "the run used none only" in cache.reason


def test_no_significant_difference_keeps_the_default(tmp_path: Path) -> None:
    rec = recommend(make_run(tmp_path, "guest", SEED_000, noise=0.05), "proxmox")
    for axis, default in (("aio", "io_uring"), ("iothread", "on")):
        d = decision(rec, axis)
        assert (d.status, d.value) == ("keep", default), d.reason
        assert d.reason.startswith("keep the default: no level has significantly more IOPS")
        assert d.evidence[0].iops.verdict.startswith("no significant difference")


def test_more_iops_with_significantly_higher_latency_is_not_recommended(tmp_path: Path) -> None:
    run = make_run(tmp_path, "guest", SEED_000,
                   iops=lambda c: 1.1 if c.aio == "native" else 1.0,
                   latency=lambda c: 1.2 if c.aio == "native" else 1.0)
    aio = decision(recommend(run, "proxmox"), "aio")
    assert (aio.status, aio.value) == ("keep", "io_uring")
    assert "significantly higher latency" in aio.reason
    assert aio.evidence[0].latency.better is False


def test_unsafe_is_never_recommended_and_writeback_carries_a_caveat(tmp_path: Path) -> None:
    axes = {"controller": ["virtio-blk"], "aio": ["threads"], "iothread": [True],
            "cache": ["none", "writeback", "unsafe"], "format": ["raw"]}
    speed = {"none": 1.0, "writeback": 1.2, "unsafe": 1.5}
    rec = recommend(make_run(tmp_path, "guest", axes, lambda c: speed[str(c.cache)]), "proxmox")
    cache = decision(rec, "cache")
    assert (cache.status, cache.value) == ("change", "writeback")
    assert "only while the guest issues flushes" in cache.caveat
    assert "cache=unsafe ignores the guest's flushes" in cache.caveat
    assert render("proxmox", rec.config).text.endswith("cache=writeback")

    only_unsafe = {"none": 1.0, "writeback": 1.0, "unsafe": 1.5}
    rec = recommend(make_run(tmp_path / "b", "guest", axes, lambda c: only_unsafe[str(c.cache)]),
                    "proxmox")
    cache = decision(rec, "cache")
    assert (cache.status, cache.value) == ("keep", "none")
    assert "unsafe measured better" in cache.reason and "corrupt" in cache.caveat


def test_a_combination_qemu_refuses_is_never_emitted(tmp_path: Path) -> None:
    """native and writeback both measure better, but QEMU 7.2 refuses them together: the
    stronger change wins and the other is dropped with QEMU's reason."""
    axes = {"controller": ["virtio-blk"], "aio": ["native", "io_uring", "threads"],
            "iothread": [True], "cache": ["none", "writeback"], "format": ["raw"]}

    def effect(config: Configuration) -> float:
        return (1.3 if config.cache == "writeback" else 1.0) * (1.1 if config.aio == "native" else 1.0)

    for platform in ("proxmox", "libvirt", "qemu"):
        rec = recommend(make_run(tmp_path / platform, "guest", axes, effect), platform)  # type: ignore[arg-type]
        assert (rec.config.aio, rec.config.cache) != ("native", "writeback")
        assert invalid_reason(rec.config) is None
        assert rec.config.cache == "writeback"
        dropped = [n for n in rec.notes if n.startswith("aio=native dropped")]
        assert dropped and "requires cache.direct=on" in dropped[0], rec.notes
        text = render(platform, rec.config).text
        assert "native" not in text


def test_blocklayer_run_covers_aio_cache_format_only(tmp_path: Path) -> None:
    axes = {"aio": ["native", "io_uring", "threads"], "iothread": [True, False],
            "cache": ["none", "writeback"], "format": ["raw", "qcow2"]}
    run = make_run(tmp_path, "blocklayer", axes, lambda c: 1.2 if c.format == "raw" else 1.0,
                   extra=[Configuration(mode="host")])
    rec = recommend(run, "proxmox")
    assert decision(rec, "format").mode == "blocklayer"
    assert decision(rec, "format").value == "raw"
    assert decision(rec, "aio").mode == "blocklayer"
    iothread = decision(rec, "iothread")
    assert iothread.status == "not measured" and "FUSE export" in iothread.reason
    assert decision(rec, "controller").reason == "not measured: keep the default"
    assert decision(rec, "num_queues").value is None


def test_guest_evidence_is_preferred_and_emulation_is_said(tmp_path: Path) -> None:
    guest = configurations("guest", {"controller": ["virtio-blk", "virtio-scsi-single"],
                                     "aio": ["io_uring"], "iothread": [True, False],
                                     "cache": ["none"], "format": ["raw"]})
    run = make_run(tmp_path, "blocklayer", {"aio": ["io_uring", "threads"], "cache": ["none"],
                                            "format": ["raw"]},
                   lambda c: 1.3 if c.controller == "virtio-blk" else 1.0,
                   accelerator="tcg", extra=guest)
    rec = recommend(run, "libvirt")
    assert rec.emulated and "EMULATED (TCG)" in rec.warnings[0]
    controller = decision(rec, "controller")
    assert (controller.status, controller.value, controller.mode) == ("choose", "virtio-blk", "guest")
    assert decision(rec, "aio").mode == "blocklayer"


def test_a_level_the_platform_cannot_take_is_shown_not_recommended(tmp_path: Path) -> None:
    axes = {"controller": ["virtio-scsi-single", "nvme"], "aio": ["io_uring"],
            "iothread": [False], "cache": ["none"], "format": ["raw"]}
    run = make_run(tmp_path, "guest", axes, lambda c: 1.5 if c.controller == "nvme" else 1.0)
    pve = decision(recommend(run, "proxmox"), "controller")
    assert pve.value == "virtio-scsi-single" and "no NVMe drive bus" in pve.reason
    assert decision(recommend(run, "qemu"), "controller").value == "nvme"


def test_not_varied_parameters_keep_the_default(tmp_path: Path) -> None:
    rec = recommend(make_run(tmp_path, "guest", SEED_000, seed_000_effect), "qemu")
    for axis in ("cache", "num_queues", "queue_size"):
        assert decision(rec, axis).status == "not measured"
    assert decision(rec, "format").value == "raw"          # the one format the run used
    assert decision(rec, "controller").value == "virtio-scsi-single"


def test_queues_against_qemus_default_are_not_evaluated(tmp_path: Path) -> None:
    """num_queues = [0, 4]: 0 (QEMU's default) is stored as no value, which has no twin."""
    axes = {"controller": ["virtio-blk"], "aio": ["io_uring"], "iothread": [True],
            "cache": ["none"], "format": ["raw"], "num_queues": [None, 4]}
    vhost = Configuration(mode="guest", data_path="vhost-user-blk", aio="io_uring", cache="none",
                          format="raw", iothread=True)
    rec = recommend(make_run(tmp_path, "guest", axes, lambda c: 2.0 if c.num_queues else 1.0,
                             extra=[vhost]), "libvirt")
    queues = decision(rec, "num_queues")
    assert (queues.status, queues.value) == ("not evaluated", None)
    assert "compared 4 with QEMU's default" in queues.reason
    assert any(n.startswith("data_path (set in this run) is not turned into a setting")
               for n in rec.notes)
    assert rec.config.num_queues is None


# -- Proxmox: the qm line against reference §1 -------------------------------------------------

PVE_SCSIHW = {"lsi", "megasas", "pvscsi", "virtio-scsi-pci", "virtio-scsi-single"}  # §1 iothread
PVE_AIO = {"native", "io_uring", "threads"}                                          # §1 Default aio
PVE_CACHE = {"none", "writeback", "writethrough", "directsync", "unsafe"}            # §1 cache table
PVE_BUSES = {"virtio", "scsi", "sata", "ide"}
DIRECT = {"none", "directsync"}                                                      # §4 first row


def parse_qm(text: str) -> tuple[str | None, str, str, dict[str, str]]:
    """``qm set VMID [--scsihw X] --<bus>0 VOLUME,k=v,...`` → (scsihw, bus, volume, options)."""
    argv = shlex.split(text)
    assert argv[:3] == ["qm", "set", "<vmid>"], argv
    args = dict(zip(argv[3::2], argv[4::2], strict=True))
    scsihw = args.pop("--scsihw", None)
    (key, value), = args.items()
    assert key.startswith("--") and key.endswith("0"), key
    volume, *pairs = value.split(",")
    options = dict(p.split("=", 1) for p in pairs)
    return scsihw, key[2:-1], volume, options


def check_proxmox(text: str) -> dict[str, str]:
    scsihw, bus, volume, options = parse_qm(text)
    assert bus in PVE_BUSES and volume == "<storage>:<volume>"
    assert set(options) <= {"aio", "iothread", "cache", "queues"}, options
    assert options["aio"] in PVE_AIO and options["cache"] in PVE_CACHE
    if options["aio"] == "native":   # PVE passes it on; QEMU 7.2 refuses it without direct (§1, §4)
        assert options["cache"] in DIRECT
    assert (scsihw is not None) == (bus == "scsi")
    if scsihw is not None:
        assert scsihw in PVE_SCSIHW
    if "iothread" in options:
        # only virtio disks and scsi disks on virtio-scsi-single get one; sata/ide have no key
        assert options["iothread"] in {"0", "1"}
        assert bus == "virtio" or scsihw == "virtio-scsi-single"
    if "queues" in options:
        assert bus == "scsi" and scsihw == "virtio-scsi-single" and int(options["queues"]) >= 2
    return options


def every_valid_configuration() -> list[Configuration]:
    out = []
    for controller, aio, iothread, cache, fmt, queues, size in itertools.product(
            ["virtio-blk", "virtio-scsi", "virtio-scsi-single", "pvscsi", "sata", "ide"],
            sorted(PVE_AIO), [True, False], sorted(PVE_CACHE), ["raw", "qcow2"], [None, 1, 4],
            [None, 512]):
        config = Configuration(mode="guest", controller=controller, aio=aio, iothread=iothread,
                               cache=cache, format=fmt, num_queues=queues, queue_size=size)
        if invalid_reason(config) is None:
            out.append(config)
    return out


VALID = every_valid_configuration()


def test_every_proxmox_line_is_one_proxmox_accepts() -> None:
    assert len(VALID) > 500
    for config in VALID:
        options = check_proxmox(render("proxmox", config).text)
        assert options["aio"] == config.aio and options["cache"] == config.cache
        if config.iothread and config.controller in ("virtio-blk", "virtio-scsi", "virtio-scsi-single"):
            assert options["iothread"] == "1", config.key


def test_what_proxmox_cannot_express_is_said() -> None:
    config = Configuration(mode="guest", controller="virtio-blk", aio="io_uring", iothread=True,
                           cache="none", format="qcow2", num_queues=4, queue_size=512)
    rendered = render("proxmox", config)
    assert rendered.text == ("qm set <vmid> --virtio0 "
                             "<storage>:<volume>,aio=io_uring,iothread=1,cache=none")
    notes = " ".join(rendered.notes)
    assert "num_queues=4 left out" in notes and "queue_size=512 left out" in notes
    assert "the volume must be qcow2" in notes
    shared = config.model_copy(update={"controller": "virtio-scsi"})
    assert parse_qm(render("proxmox", shared).text)[0] == "virtio-scsi-single"


def test_refused_combinations_are_never_rendered() -> None:
    refused = [Configuration(mode="guest", controller="virtio-blk", aio="native", cache="writeback"),
               Configuration(mode="guest", controller="sata", aio="threads", cache="none",
                             iothread=True)]
    for platform in ("proxmox", "libvirt", "qemu"):
        for config in refused:
            with pytest.raises(InvalidCombination):
                render(platform, config)  # type: ignore[arg-type]
    nvme = Configuration(mode="guest", controller="nvme", aio="threads", cache="none")
    for platform in ("proxmox", "libvirt"):
        with pytest.raises(InvalidCombination, match="NVMe"):
            render(platform, nvme)  # type: ignore[arg-type]


# -- libvirt: the XML against reference §2 -----------------------------------------------------

LIBVIRT_IO = {"native", "threads", "io_uring"}                          # §2 io=
LIBVIRT_CACHE = PVE_CACHE                                               # §3 cache modes
SCSI_MODELS = {"virtio-scsi", "lsilogic", "lsisas1078", "vmpvscsi"}   # §2; libvirt formatdomain
TARGET_PREFIX = {"virtio": "vd", "scsi": "sd", "sata": "sd", "ide": "hd"}


def check_libvirt(fragments: tuple[tuple[str, str], ...]) -> ET.Element:
    """Each fragment parses; the disk's driver and the controller are what libvirt accepts."""
    parsed = [(where, ET.fromstring(xml)) for where, xml in fragments]
    iothreads = [e for where, e in parsed if e.tag == "iothreads"]
    for e in iothreads:
        assert int(e.text or "") >= 1
    count = int(iothreads[0].text or "0") if iothreads else 0
    disks = [e for where, e in parsed if e.tag == "disk"]
    assert len(disks) == 1 and all(where == "<devices>" for where, e in parsed if e.tag != "iothreads")
    disk, = disks
    driver, target, source = disk.find("driver"), disk.find("target"), disk.find("source")
    assert driver is not None and target is not None and source is not None
    attrs = driver.attrib
    assert attrs["name"] == "qemu" and attrs["type"] in {"raw", "qcow2"}
    assert attrs["cache"] in LIBVIRT_CACHE and attrs["io"] in LIBVIRT_IO
    assert set(attrs) <= {"name", "type", "cache", "io", "iothread", "queues", "queue_size"}
    bus = target.attrib["bus"]
    assert target.attrib["dev"].startswith(TARGET_PREFIX[bus])
    if attrs["io"] == "native":   # "native I/O needs either no disk cache or directsync cache mode"
        assert attrs["cache"] in DIRECT
    if "iothread" in attrs:       # "IOThreads only available for virtio pci and virtio ccw disk"
        assert bus == "virtio" and 1 <= int(attrs["iothread"]) <= count
    if "queues" in attrs or "queue_size" in attrs:
        assert bus == "virtio"
    if "queue_size" in attrs:
        size = int(attrs["queue_size"])
        assert size & (size - 1) == 0 and size <= 1024
    controllers = [e for where, e in parsed if e.tag == "controller"]
    if bus == "scsi":
        controller, = controllers
        assert controller.attrib["type"] == "scsi" and controller.attrib["model"] in SCSI_MODELS
        cdriver = controller.find("driver")
        if cdriver is not None:
            assert controller.attrib["model"] == "virtio-scsi"
            assert set(cdriver.attrib) <= {"iothread", "queues"}
            if "iothread" in cdriver.attrib:
                assert 1 <= int(cdriver.attrib["iothread"]) <= count
    elif bus == "sata":
        assert [c.attrib["type"] for c in controllers] == ["sata"]
    else:
        assert not controllers
    return disk


def test_every_libvirt_xml_is_one_libvirt_accepts() -> None:
    for config in VALID:
        rendered = render("libvirt", config)
        disk = check_libvirt(rendered.fragments)
        driver = disk.find("driver")
        assert driver is not None
        assert (driver.attrib["io"], driver.attrib["cache"]) == (config.aio, config.cache)
        # an iothread is configured wherever the configuration has one
        assert ("<iothreads>1</iothreads>" in rendered.text) == bool(config.iothread)


def test_libvirt_virtio_scsi_iothread_goes_on_the_controller() -> None:
    config = Configuration(mode="guest", controller="virtio-scsi-single", aio="native",
                           iothread=True, cache="none", format="raw", num_queues=4)
    rendered = render("libvirt", config, image="/dev/vg/disk")
    assert rendered.text == """<!-- in <domain> -->
<iothreads>1</iothreads>
<!-- in <devices> -->
<controller type='scsi' index='0' model='virtio-scsi'>
  <driver iothread='1' queues='4'/>
</controller>
<!-- in <devices> -->
<disk type='block' device='disk'>
  <driver name='qemu' type='raw' cache='none' io='native'/>
  <source dev='/dev/vg/disk'/>
  <target dev='sda' bus='scsi'/>
</disk>"""


def quoted(cell: str) -> set[str]:
    """The `quoted` values of a table cell."""
    return set(re.findall(r"`([^`]+)`", cell))


def test_the_accepted_values_are_the_references() -> None:
    """The lists above are the reference's tables (docs/qemu-disk-options.md, in the repository,
    written from the project's notes on Proxmox qemu-server, libvirt and QEMU 7.2)."""
    pve = reference_table("## 1.", "Option")
    assert quoted(pve["scsihw (per VM)"][0]) == PVE_SCSIHW
    assert "`virtio-scsi-single` with IO Thread on" in pve["scsihw (per VM)"][1]   # PVE's GUI
    assert quoted(pve["aio"][0]) == PVE_AIO and quoted(pve["aio"][1]) == {"io_uring"}
    assert quoted(pve["cache"][0]) == PVE_CACHE
    assert {v for v in quoted(pve["bus"][0]) if not v[-1].isdigit()} == PVE_BUSES
    assert quoted(pve["iothread"][0]) == {"0", "1"}
    direct_table = reference_table("## 1.", "PVE `cache`")
    assert set(direct_table) == PVE_CACHE | {"unset"}
    assert {c for c, cells in direct_table.items() if cells[1].startswith("true")} == DIRECT | {"unset"}

    libvirt = reference_table("## 2.", "Element or attribute")
    assert quoted(libvirt["<driver io=…>"][0]) == LIBVIRT_IO
    assert quoted(libvirt["<driver cache=…>"][0]) == LIBVIRT_CACHE
    assert quoted(libvirt["<controller type='scsi' model=…>"][0]) == SCSI_MODELS
    buses = libvirt["<target bus=…>"][0]
    names = re.findall(r"`(\w+X)`", buses)                 # vdX, sdX, ...: one per bus, in order
    assert quoted(buses) - set(names) == set(TARGET_PREFIX)
    assert [f"{p}X" for p in TARGET_PREFIX.values()] == names
    assert "power of two up to 1024" in libvirt["<driver queues='4' queue_size='256'>"][0]

    modes = reference_table("## 3.", "cache=")
    assert set(modes) == LIBVIRT_CACHE
    assert {c for c, (_, direct, _) in modes.items() if direct == "on"} == DIRECT

    refused = reference_table("## 4.", "Combination")
    native = next(r for c, r in refused.items() if c.startswith("aio=native without a direct"))
    assert "requires cache.direct=on" in native[0]      # so PVE's pass-through of aio= fails


# -- the CLI ---------------------------------------------------------------------------------


def _pasted(lines: list[str]) -> str:
    """The command after "# ready to paste", its continuation lines joined as the shell would."""
    block = lines[lines.index(next(l for l in lines if l.startswith("# ready to paste"))) + 1:]
    return " ".join(l.strip().removesuffix(" \\") for l in block if not l.startswith("#"))


def test_cli_leads_with_the_verdict_then_the_paste(tmp_path: Path) -> None:
    make_run(tmp_path, "guest", SEED_000, seed_000_effect, accelerator="tcg")
    db = str(tmp_path / "r.db")
    result = cli_result("recommend", "last", "--for", "proxmox", "--db", db, "--vmid", "100",
                 "--volume", "local-lvm:vm-100-disk-1", "--storage-type", "lvm")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "run 1 · suite synthetic · recommendation for Proxmox VE (storage type lvm)"
    assert lines[1].startswith("⚠ EMULATED (TCG)")
    verdict = lines[lines.index("verdict (IOPS against the reference, with its 95 % CI):") + 1:]
    # one line per parameter, in order: what to do, the setting, the gain and its CI
    rows = [line.split() for line in verdict if line.startswith("  ") and not line.startswith("   ")]
    assert [r[0] if r[0] != "not" else " ".join(r[:2]) for r in rows][:5] == [
        "not measured", "keep", "keep", "not measured", "not measured"]
    iothread = " ".join(next(verdict[i:i + 2] for i, line in enumerate(verdict) if "iothread=on" in line))
    assert re.search(r"^  keep +iothread=on +off: −1[23]\.\d % IOPS \(95 % CI −\S+ … −\S+ %\), +"
                     r"significantly fewer IOPS$", iothread), iothread
    # on thick LVM the default aio is native already: nothing to change
    assert any(line.split()[:2] == ["keep", "aio=native"] for line in verdict)
    assert "iomatrix recommend last --explain" in result.stdout
    assert "rule:" not in result.stdout and "what it does" not in result.stdout
    assert _pasted(lines) == ("qm set 100 --scsihw virtio-scsi-single "
                              "--scsi0 local-lvm:vm-100-disk-1,aio=native,iothread=1,cache=none")
    assert max(map(len, lines)) <= 100

    explained = cli_result("recommend", "last", "--for", "proxmox", "--db", db, "--storage-type", "lvm", "--explain")
    lines = explained.stdout.splitlines()
    assert explained.returncode == 0 and max(map(len, lines)) <= 100
    assert "guest configurations all have controller=virtio-scsi-single, cache=none, format=raw" in lines
    assert "Async IO (aio=): native (default)" in lines
    assert any(line.startswith("  Proxmox VE default: ") for line in lines)
    assert any(line.startswith("rule: A level other than the platform's default") for line in lines)
    assert any(line.startswith("  · off vs on: IOPS ") for line in lines)

    qemu = cli_result("recommend", "last", "--db", db).stdout.splitlines()     # made for QEMU: iomatrix's own graph
    assert qemu[0] == "run 1 · suite synthetic · recommendation for QEMU 7.2"
    assert any(re.search(r"^  set +iothread=on +\+1[45]\.\d % IOPS \(95 % CI \+\S+ … \+\S+ %\) "
                         r"over off$", line) for line in qemu), qemu
    libvirt = cli_result("recommend", "last", "--for", "libvirt", "--db", db)
    assert libvirt.returncode == 0 and "<driver iothread='1'/>" in libvirt.stdout
    bad = cli_result("recommend", "last", "--for", "vmware", "--db", db)
    assert bad.returncode == 2 and "choose proxmox, libvirt, qemu" in bad.stderr


def _shell_words(text: str) -> list[str]:
    """The words ``sh`` reads from ``text`` (a pasted command's arguments)."""
    done = subprocess.run(["sh", "-c", f"for a in {text}\ndo printf '%s\\0' \"$a\"; done"],
                          capture_output=True, text=True, check=True)
    return done.stdout.split("\0")[:-1]


def test_what_is_pasted_is_wrapped_where_it_still_pastes() -> None:
    """A pasted line longer than the terminal is broken where the shell reads it back the same:
    a -blockdev JSON between its members (whitespace JSON allows, inside the quotes), a
    -device's options after a comma (backslash-newline joins them), a qm set line between its
    arguments."""
    import json

    config = qemu_configs()[0]
    for platform in ("qemu", "proxmox"):
        pasted = render(platform, config, vmid="100", volume="local-lvm:vm-100-disk-0",
                        image="/var/lib/images/a-long-name-for-an-image-file.qcow2")
        lines = pasted_lines(platform, pasted, 60)
        # only a member, option or argument longer than the line itself may pass it
        assert all(len(line) <= 60 or len(line.removesuffix(" \\").split()) == 1
                   for line in lines), lines
        assert len(lines) > len(pasted.text.splitlines())
        words, before = _shell_words("\n".join(lines)), _shell_words(pasted.text)
        assert [json.loads(w) if w.startswith("{") else w for w in words] == [
            json.loads(w) if w.startswith("{") else w for w in before]


@pytest.mark.parametrize(("method", "host", "title"), [
    ({"mode": "guest", "platform": "proxmox", "pve_version": 8}, None, "Proxmox VE"),
    (None, {"hostname": "pve1", "kernel": "6.8.12-4-pve"}, "Proxmox VE"),
    ({"mode": "guest", "platform": "libvirt"}, None, "libvirt"),
    (None, {"hostname": "h", "kernel": "6.1.0-40-amd64"}, "QEMU"),
])
def test_for_defaults_to_what_the_run_was_made_for(tmp_path: Path, method: dict[str, str | int] | None,
                                                   host: dict[str, str] | None, title: str) -> None:
    configs = [c for c in configurations("guest", SEED_000) if invalid_reason(c) is None]
    with Store(tmp_path / "r.db") as store:
        write_run(store, configs, WORKLOADS, lambda c, w, i: Figures(1000 * seed_000_effect(c),
                  4096e3, 1e6, 2e6), method=method, host=host)
    done = cli_result("recommend", "1", "--db", str(tmp_path / "r.db"))
    assert done.returncode == 0, done.stderr
    first, why = done.stdout.splitlines()[:2]
    assert first.startswith(f"run 1 · suite synthetic · recommendation for {title}")
    assert why.startswith("(the run ") and "--for" in done.stdout.split("verdict")[0]
    assert f"# ready to paste ({title}" in done.stdout


# -- QEMU: the arguments start a guest under TCG ----------------------------------------------

needs_qemu = needs("qemu")


def qemu_configs() -> list[Configuration]:
    """Recommended configurations: from a run that favours virtio-blk, native, none and an
    iothread, and a few more that cover SCSI, qcow2 and the caches without direct I/O."""
    return [
        Configuration(mode="guest", controller="virtio-scsi-single", aio="io_uring", iothread=True,
                      cache="writethrough", format="qcow2", num_queues=2, queue_size=512),
        Configuration(mode="guest", controller="virtio-scsi", aio="threads", iothread=False,
                      cache="writeback", format="raw"),
        Configuration(mode="guest", controller="sata", aio="native", iothread=False,
                      cache="directsync", format="raw"),
    ]


def recommended_for_qemu(tmp_path: Path) -> Configuration:
    axes = {"controller": ["virtio-blk", "virtio-scsi-single"], "aio": ["native", "threads"],
            "iothread": [True, False], "cache": ["none", "writeback"], "format": ["raw"]}

    def effect(c: Configuration) -> float:
        return ((1.2 if c.controller == "virtio-blk" else 1.0) * (1.1 if c.aio == "native" else 1.0)
                * (1.15 if c.iothread else 1.0) * (1.05 if c.cache == "none" else 1.0))

    rec = recommend(make_run(tmp_path, "guest", axes, effect), "qemu")
    assert (rec.config.controller, rec.config.aio, rec.config.cache, rec.config.iothread) == (
        "virtio-blk", "native", "none", True), [d.reason for d in rec.decisions]
    return rec.config


@needs_qemu
@pytest.mark.parametrize("which_config", ["recommended", "scsi-qcow2", "shared-scsi", "sata"])
def test_emitted_qemu_arguments_start_a_guest_under_tcg(tmp_path: Path, no_leftovers: None,
                                                        which_config: str) -> None:
    configs = dict(zip(["scsi-qcow2", "shared-scsi", "sata"], qemu_configs()))
    config = (recommended_for_qemu(tmp_path / "run") if which_config == "recommended"
              else configs[which_config])
    image = tmp_path / f"disk.{config.format}"
    run_tool(["qemu-img", "create", "-q", "-f", str(config.format), str(image), "32M"], timeout=30)
    rendered = render("qemu", config, image=str(image))
    # what a user pastes: the text, shell-split, not the argv list
    pasted = shlex.split(rendered.text.replace(" \\\n", " "))
    assert pasted == list(rendered.argv)
    qmp, log = tmp_path / "qmp.sock", tmp_path / "qemu.log"
    argv = ["qemu-system-x86_64", "-machine", "pc", "-accel", "tcg", "-m", "128M", "-smp", "1",
            "-nodefaults", "-display", "none", "-S",
            "-qmp", f"unix:{qmp},server=on,wait=off", *pasted]
    with managed(argv, log=log) as proc:
        up = wait_for(lambda: proc.poll() is not None or qmp.exists(), timeout=15)
        assert up and proc.poll() is None, f"QEMU refused the arguments: {read_text(log)}"
        # QEMU applied what the configuration asks: cache flags, write cache, device, iothread,
        # queues over QMP; the aio mode (which QMP does not report) from the kernel objects
        # QEMU made for it, once a read went through the disk's node: from QEMU 9.0 on they
        # appear at the file's first request, not when it is opened (qemu.procinspect)
        assert read_guest_settings(qmp) == expected_guest_settings(config, vcpus=1)
        refused, = qmp_execute(qmp, [("human-monitor-command",   # qemu-io prints to stdout
                                      {"command-line": 'qemu-io disk0 "read 0 4096"'})])
        assert refused == ""
        assert inspect_process(proc.pid).aio == config.aio
        nodes, = qmp_execute(qmp, [("query-named-block-nodes", None)])
        file_node = next(n for n in nodes if n.get("node-name") == "file0")
        assert file_node["drv"] == "file" and file_node["file"] == str(image)
        _, status = qmp_execute(qmp, [("cont", None), ("query-status", None)])
        assert status["status"] == "running"
        qmp_execute(qmp, [("quit", None)])
        proc.wait(timeout=15)
    assert proc.returncode == 0, read_text(log)
    assert "read 4096/4096 bytes at offset 0" in read_text(log)


# -- platform graphs and corrected Proxmox defaults (issue 11) --------------------------------

def test_a_run_with_pves_graph_says_its_findings_transfer(tmp_path: Path) -> None:
    run = make_run(tmp_path, "guest", SEED_000, seed_000_effect,
                   method={"mode": "guest", "platform": "proxmox", "pve_version": 8})
    rec = recommend(run, "proxmox")
    assert not rec.warnings
    assert any("Proxmox VE's own block graph" in n and "PVE 8" in n for n in rec.notes)
    # for libvirt the same run is another platform's graph
    assert "differed from libvirt's" in recommend(run, "libvirt").warnings[0]
    assert not any("block graph" in w for w in recommend(run, "qemu").warnings)


def test_a_run_with_iomatrixs_graph_warns_for_proxmox(tmp_path: Path) -> None:
    rec = recommend(make_run(tmp_path, "guest", SEED_000, seed_000_effect), "proxmox")
    warning = rec.warnings[0]
    assert 'platform = "qemu"' in warning and "detect-zeroes=on" in warning
    assert "throttle filter" in warning


def test_virtio_scsi_iothread_default_is_off_on_proxmox() -> None:
    from iomatrix.recommend.defaults import defaults
    scsi = defaults("proxmox", settings={"controller": "virtio-scsi"})["iothread"]
    assert scsi.level == "off" and "ignored by qemu-server" in scsi.shown
    assert defaults("proxmox", settings={"controller": "virtio-scsi-single"})["iothread"].level == "on"
    assert defaults("proxmox", settings={"controller": "virtio-blk"})["iothread"].level == "on"


def test_librbd_has_no_aio_and_the_recommendation_says_so(tmp_path: Path) -> None:
    from iomatrix.recommend.defaults import defaults
    aio = defaults("proxmox", storage="rbd")["aio"]
    assert aio.level is None and "does nothing" in aio.note
    assert defaults("proxmox", storage="krbd", settings={"cache": "writeback"})["aio"].level == "threads"
    rec = recommend(make_run(tmp_path, "guest", SEED_000, seed_000_effect), "proxmox",
                    storage="rbd")
    decided = decision(rec, "aio")
    assert decided.status == "not evaluated" and "does nothing on librbd" in decided.reason
    pasted = render("proxmox", rec.config, storage="rbd")
    assert "aio=" not in pasted.text and any("no aio=" in n for n in pasted.notes)


def test_btrfs_nocow_is_direct() -> None:
    from iomatrix.platform.proxmox import STORAGE_CHOICES as PROXMOX_STORAGES
    from iomatrix.recommend.defaults import defaults
    assert "btrfs-nocow" in PROXMOX_STORAGES
    assert defaults("proxmox", storage="btrfs")["cache"].level == "writeback"
    assert defaults("proxmox", storage="btrfs-nocow")["cache"].level == "none"
