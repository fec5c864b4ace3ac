"""Which libvirt a run with ``[method] platform = "libvirt"`` gives its disks the nodes of, when
it only models libvirt (iomatrix's own QEMU or qemu-storage-daemon with libvirt's graph;
``iomatrix translate``): ``[method] libvirt_version``, else the libvirt installed here
(``libvirtd --version``), else :data:`iomatrix.platform.libvirt.DEFAULT_LIBVIRT`; with the QEMU
that runs the disk (its ``--version``), since libvirt's layout depends on both
(:class:`iomatrix.platform.libvirt.Versions`). Through a real libvirtd the daemon's own
versions are used instead (:func:`iomatrix.drivers.libvirt.daemon_versions`)."""

from __future__ import annotations

from iomatrix.core.errors import ToolFailed
from iomatrix.core.proc import run, which
from iomatrix.platform import libvirt as lv
from iomatrix.suite.method import Method

VERSION_TIMEOUT = 15.0


def installed_version(tool: str) -> lv.Version | None:
    """``tool --version``'s version, or None when the tool is not installed or says none."""
    if which(tool) is None:
        return None
    try:
        out = run([tool, "--version"], timeout=VERSION_TIMEOUT, check=False)
        return lv.parse_version(out.stdout or out.stderr)
    except (ToolFailed, ValueError):
        return None


def model_versions(libvirt_version: str | None, qemu: str) -> tuple[lv.Versions, str]:
    """The libvirt modelled (see the module docstring) with the QEMU of binary ``qemu``, and
    where the libvirt version came from."""
    if libvirt_version is not None:
        libvirt, source = lv.parse_version(libvirt_version), "[method] libvirt_version"
    else:
        found = installed_version("libvirtd")
        libvirt, source = ((found, "the libvirtd installed here") if found is not None else
                           (lv.DEFAULT_LIBVIRT, "no libvirtd installed: Debian 13's"))
    return lv.Versions(libvirt=libvirt, qemu=installed_version(qemu) or lv.DEFAULT_QEMU), source


def method_versions(method: Method, qemu: str) -> tuple[lv.Versions, str] | None:
    """:func:`model_versions` for a run's method; None unless its platform is libvirt."""
    if method.platform != "libvirt":
        return None
    return model_versions(method.libvirt_version, qemu)
