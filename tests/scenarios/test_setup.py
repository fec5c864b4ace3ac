"""setup.sh's package decision, with real dpkg-query and real apt (``apt-get -s``, this host's
package lists), on this host and on simulated Proxmox VE 8 and 9 hosts.

Proxmox VE cannot be installed here, so a PVE host is simulated, and only where it must be: a
dpkg database (``setup.sh --dry-run --admindir``) that is this host's without Debian's QEMU,
libvirt, fio and ioping, with pve-qemu-kvm, qemu-server and proxmox-ve installed; and a PATH
that holds this host's system tools but no QEMU, fio or libvirt program, plus stand-ins for the
programs pve-qemu-kvm ships and for ``pveversion`` (scripts named as such that run nothing)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import PVEVERSION, REPO, standin

# pve-qemu-kvm's relations, from proxmox/pve-qemu's debian/control, the same at 9.2.0-5 (the last
# PVE 8 build, bookworm; commit e0969989) and 10.0.2-4 (PVE 9.0, trixie; commit 839b53ba). It
# Conflicts with qemu-system-common and qemu-system-data but Provides neither. It ships
# qemu-storage-daemon and qemu-img (debian/rules: QEMU's `make install` with its tools, nothing of
# them removed; qemu-server's QSD.pm runs qemu-storage-daemon). Depends are left out: those
# packages (ceph-common, libiscsi...) are not on this host, and they decide no conflict.
PVE_QEMU = {
    "Replaces": "pve-kvm, pve-qemu-kvm-2.6.18, qemu-system-arm, qemu-system-x86, qemu-utils",
    "Provides": "qemu-system-arm, qemu-system-x86, qemu-utils",
    "Conflicts": "kvm, pve-kvm, pve-qemu-kvm-2.6.18, qemu, qemu-kvm, qemu-system-arm, "
                 "qemu-system-common, qemu-system-data, qemu-system-x86, qemu-utils",
    "Breaks": "qemu-server (<= 8.0.6)",
}
# (pve-qemu-kvm, qemu-server, proxmox-ve versions); qemu-server's Depends on pve-qemu-kvm
# (>= 7.1~) is from proxmox/qemu-server's debian/control at those versions; proxmox-ve's version
# and its Depends (cut down to the two packages) are illustrative.
PVE = {8: ("9.2.0-5", "8.3.13", "8.4.0"), 9: ("10.0.2-4", "9.0.16", "9.0.0")}
NOT_ON_PVE = ("qemu-system-x86", "qemu-system-common", "qemu-system-data", "qemu-utils",
              "libvirt-daemon-system", "fio", "ioping")
"""Taken out of this host's dpkg database (with what apt says depends on them): Debian's QEMU
and libvirt, which a PVE host has not, and two packages setup must then install."""
SYSTEM_TOOLS = ("dirname", "dpkg-query", "apt-get", "awk", "grep", "head", "timeout", "id")
"""The programs setup.sh runs besides the ones it looks for."""
PVE_PROGRAMS = ("qemu-system-x86_64", "qemu-img", "qemu-storage-daemon")


def _setup(*args: str, path: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": path} if path is not None else None
    return subprocess.run(["/bin/sh", str(REPO / "setup.sh"), *args], capture_output=True,
                          text=True, timeout=300, env=env)


def _simulate(status: Path, *packages: str) -> list[str]:
    """apt's plan for installing ``packages`` on the host ``status`` describes: its action lines."""
    out = subprocess.run(["apt-get", "-s", "-o", f"Dir::State::status={status}", "install",
                          "--no-install-recommends", *packages], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    return [line for line in out.stdout.splitlines() if line.startswith(("Inst ", "Remv "))]


def _stanza(package: str, version: str, arch: str, fields: dict[str, str]) -> str:
    lines = [f"Package: {package}", "Status: install ok installed", "Priority: optional",
             "Section: admin", "Installed-Size: 1",
             "Maintainer: Proxmox Support Team <support@proxmox.com>",
             f"Architecture: {arch}", f"Version: {version}",
             *(f"{k}: {v}" for k, v in fields.items()), f"Description: {package} (simulated)"]
    return "\n".join(lines)


def _pve_host(tmp_path: Path, generation: int, extra: tuple[str, ...] = ()) -> tuple[Path, str]:
    """A simulated PVE ``generation`` host: its dpkg admin directory and its PATH."""
    qemu, server, ve = PVE[generation]
    status = Path("/var/lib/dpkg/status").read_text()
    plan = subprocess.run(["apt-get", "-s", "remove", *NOT_ON_PVE], capture_output=True,
                          text=True, timeout=300, check=True).stdout
    gone = {line.split()[1] for line in plan.splitlines() if line.startswith("Remv ")}
    kept = [s for s in status.split("\n\n")
            if s.strip() and re.match(r"Package: (\S+)", s).group(1) not in gone]  # type: ignore[union-attr]
    pve = [_stanza("pve-qemu-kvm", qemu, "amd64", PVE_QEMU),
           _stanza("qemu-server", server, "amd64", {"Depends": "pve-qemu-kvm (>= 7.1~)"}),
           _stanza("proxmox-ve", ve, "all", {"Depends": "pve-qemu-kvm, qemu-server"})]
    admin = tmp_path / f"dpkg-pve{generation}"
    admin.mkdir()
    (admin / "status").write_text("\n\n".join(kept + pve + list(extra)) + "\n")
    tools = tmp_path / "tools"
    tools.mkdir(exist_ok=True)
    for tool in SYSTEM_TOOLS:
        found = shutil.which(tool)
        assert found, tool
        (tools / tool).unlink(missing_ok=True)
        (tools / tool).symlink_to(found)
    standins = tmp_path / "pve-programs"
    for program in PVE_PROGRAMS:
        standin(standins, program, "stand-in for pve-qemu-kvm's program")
    standin(standins, "pveversion", PVEVERSION[generation])
    return admin, f"{tools}:{standins}"


def test_this_host_has_everything_setup_installs() -> None:
    """The README's commands ran setup.sh --dev here: a dry run plans nothing and names
    Debian's QEMU."""
    out = _setup("--dev", "--dry-run")
    assert out.returncode == 0, out.stderr
    assert "setup.sh: dry run: nothing to install" in out.stdout
    assert re.search(r"^setup\.sh: using qemu-system-x86 \S+ for QEMU: /\S+/qemu-system-x86_64 ",
                     out.stdout, re.M), out.stdout


@pytest.mark.slow
@pytest.mark.parametrize("generation", sorted(PVE))
def test_on_proxmox_ve_setup_keeps_pve_qemu_and_removes_nothing(tmp_path: Path,
                                                                 generation: int) -> None:
    admin, path = _pve_host(tmp_path, generation)
    status = admin / "status"
    # what setup.sh asked apt for before: Debian's QEMU, which takes Proxmox VE away
    old = _simulate(status, "qemu-system-x86", "qemu-system-common", "qemu-utils")
    assert {"Remv proxmox-ve", "Remv pve-qemu-kvm", "Remv qemu-server"} <= {
        " ".join(line.split()[:2]) for line in old}

    out = _setup("--dev", "--dry-run", "--admindir", str(admin), path=path)
    assert out.returncode == 0, out.stdout + out.stderr
    wanted = re.search(r"^setup\.sh: dry run: would install Debian packages: (.*)$", out.stdout, re.M)
    assert wanted, out.stdout
    packages = wanted.group(1).split()
    assert {"fio", "ioping"} <= set(packages)
    assert not {p for p in packages if p.startswith(("qemu", "libvirt"))}
    assert ("setup.sh: not installing qemu-block-extra: pve-qemu-kvm has the rbd and iscsi "
            "drivers built in") in out.stdout
    plan = _simulate(status, *packages)
    assert plan and not [line for line in plan if line.startswith("Remv ")]
    assert "and to remove nothing" in out.stdout
    qemu = PVE[generation][0]
    standins = path.split(":")[1]
    assert (f"setup.sh: using pve-qemu-kvm {qemu} for QEMU: "
            + " ".join(f"{standins}/{p}" for p in PVE_PROGRAMS)) in out.stdout
    assert (f"setup.sh: not installing qemu-system-common: the installed pve-qemu-kvm {qemu} "
            "conflicts with it") in out.stdout
    assert f"not installing libvirt on Proxmox VE ({PVEVERSION[generation]})" in out.stdout


@pytest.mark.slow
def test_setup_refuses_a_plan_that_removes_a_package(tmp_path: Path) -> None:
    """Whatever asks apt to remove something (here a package that Breaks ioping, which setup
    must install), setup installs nothing and names what apt would remove."""
    breaker = _stanza("stand-in-breaks-ioping", "1.0", "all", {"Breaks": "ioping"})
    admin, path = _pve_host(tmp_path, 9, extra=(breaker,))
    out = _setup("--dry-run", "--admindir", str(admin), path=path)
    assert out.returncode == 1
    assert "apt would remove stand-in-breaks-ioping" in out.stderr
    assert "dry run: apt plans" not in out.stdout
