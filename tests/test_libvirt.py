"""guest mode through a real libvirtd (iomatrix.drivers.libvirt), under TCG here: a suite of two
configurations leaves no domain behind; a domain a kill -9'd iomatrix left is destroyed by
`iomatrix clean`; the domain XML passes virt-xml-validate."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from iomatrix.appliance.build import build_appliance
from iomatrix.core.owner import this_process
from iomatrix.core.proc import run as run_tool
from iomatrix.drivers import libvirt as lvd
from iomatrix.drivers.guest import free_port
from iomatrix.measure.runner import run_suite
from iomatrix.store import Store
from iomatrix.suite import load_suite
from iomatrix.suite.model import Configuration
from iomatrix.target.workspace import Image
from tests.conftest import write_suite

pytestmark = pytest.mark.slow

URI = lvd.DEFAULT_URI


def _libvirtd() -> str | None:
    """Why libvirtd cannot be used here (None: it answers), starting it when it is installed
    but not running (no systemd here: `libvirtd -d`, as setup.sh does)."""
    if shutil.which("virsh") is None or shutil.which("libvirtd") is None:
        return "libvirt is not installed (libvirt-daemon-system; ./setup.sh installs it)"
    if lvd.libvirt_problem(URI) is None:
        return None
    if os.geteuid() != 0:
        return "libvirtd is not running and starting it needs root"
    for daemon in ("virtlogd", "libvirtd"):
        subprocess.run([daemon, "-d"], check=False, capture_output=True, timeout=30)
    time.sleep(2)
    return lvd.libvirt_problem(URI)


REASON = _libvirtd()
needs_libvirtd = pytest.mark.skipif(REASON is not None, reason=f"libvirtd: {REASON}")

BODY = """
[matrix]
controller = ["virtio-blk", "virtio-scsi-single"]
aio = "io_uring"
iothread = true
cache = "none"

[workloads]
rw = "randread"
iodepth = 4

[method]
mode = "guest"
ramp = 0
runtime = "{runtime}"
accel = "tcg"
vcpus = 1
memory = "384MiB"
boot_timeout = "90s"
platform = "libvirt"
libvirt_uri = "qemu:///system"
"""


def _ours() -> list[str]:
    me = os.getpid()
    return [n for n in lvd.leftover_domains(URI) if f"-p{me}-" in n]


@needs_libvirtd
def test_two_configurations_through_libvirtd(tmp_path: Path, no_leftovers: None) -> None:
    suite = load_suite(write_suite(tmp_path, BODY.format(runtime="500ms"), size="16MiB"))
    with Store(tmp_path / "r.db") as store:
        outcome = run_suite(suite, store)
        stored = store.load_run(outcome.run_id)
    assert outcome.trials_failed == 0, [t.reason for t in stored.trials if t.reason]
    assert len({t.config_key for t in stored.trials}) == 2
    for trial in stored.trials:
        applied = trial.applied
        assert applied["libvirt.uri"] == URI and applied["libvirt.domain"].startswith("iomatrix-")
        assert applied["libvirt.cache.direct"] == "true"        # through libvirt's own monitor
        assert applied["device.iothread"] == "iothread1" and applied["iothreads"] == "1"
        assert "libvirt-1-format" in trial.command and "-accel tcg" in trial.command
        assert trial.samples[0].iops > 0
    assert _ours() == []


@needs_libvirtd
def test_kill_9_leaves_a_domain_that_clean_destroys(tmp_path: Path) -> None:
    suite = write_suite(tmp_path, BODY.format(runtime="60s"), size="16MiB")
    env = os.environ | {"TMPDIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "iomatrix", "run", str(suite), "--db",
                             str(tmp_path / "r.db")], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        mine: list[str] = []
        while time.monotonic() < deadline and not mine:
            mine = [n for n in lvd.leftover_domains(URI) if f"-p{proc.pid}-" in n]
            time.sleep(0.5)
        assert mine, "the run started no domain"
        owner = lvd.owner_of(URI, mine[0])
        assert owner is not None and owner.pid == proc.pid
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert mine[0] in lvd.leftover_domains(URI)        # libvirtd keeps it: nobody destroyed it
    out = subprocess.run([sys.executable, "-m", "iomatrix", "clean", "--db",
                          str(tmp_path / "r.db")], env=env, capture_output=True, text=True,
                         timeout=120)
    assert f"destroyed libvirt domain {mine[0]}" in out.stdout, out.stdout + out.stderr
    assert not [n for n in lvd.leftover_domains(URI) if f"-p{proc.pid}-" in n]


@needs_libvirtd
def test_live_owner_is_left_alone(tmp_path: Path) -> None:
    """A domain whose owner runs (this test) is not destroyed by reclaim."""
    xml = tmp_path / "d.xml"
    xml.write_text(_domain(tmp_path, "virtio-blk", name=f"iomatrix-t-p{os.getpid()}-b1-vm0"))
    try:
        lvd.virsh(URI, "create", str(xml))
        results = {i.name: i.action for i in lvd.reclaim_domains(URI)}
        assert results[f"iomatrix-t-p{os.getpid()}-b1-vm0"] == "left"
    finally:
        lvd.destroy(URI, f"iomatrix-t-p{os.getpid()}-b1-vm0")
    assert _ours() == []


def _domain(tmp_path: Path, controller: str, *, name: str = "iomatrix-x-p1-b1-vm0") -> str:
    image = tmp_path / f"{controller}.raw"
    run_tool(["qemu-img", "create", "-q", "-f", "raw", str(image), "16M"], timeout=30)
    config = Configuration(mode="guest", controller=controller, aio="io_uring", cache="none",
                           format="raw", preallocation="off", iothread=True)
    appliance = build_appliance()
    return lvd.domain_xml(lvd.DomainSpec(
        name=name, config=config,
        image=Image(path=image, format="raw", preallocation="off", size=16 << 20),
        kernel=appliance.kernel, initrd=appliance.initrd, cmdline="console=ttyS0", accel="tcg", vcpus=1,
        memory_bytes=384 << 20, console=tmp_path / "console.log", qmp_socket=tmp_path / "qmp",
        host_port=free_port(), owner=this_process(), run="t"))


@pytest.mark.skipif(shutil.which("virt-xml-validate") is None or shutil.which("xmllint") is None,
                    reason="virt-xml-validate (libvirt-clients) and xmllint (libxml2-utils) "
                           "are not installed")
@pytest.mark.parametrize("controller", ["virtio-blk", "virtio-scsi-single", "sata", "lsi"])
def test_domain_xml_validates(tmp_path: Path, controller: str) -> None:
    xml = tmp_path / "d.xml"
    xml.write_text(_domain(tmp_path, controller))
    result = subprocess.run(["virt-xml-validate", str(xml), "domain"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
