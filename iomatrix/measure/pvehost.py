"""On a Proxmox VE host a suite measures Proxmox's block graph unless it chooses another.

A suite measured through QEMU (blocklayer or guest mode) whose [method] does not set
``platform`` gets ``platform = "proxmox"`` and the host's generation as ``pve_version``, read
from ``pveversion`` (``pve-manager/9.0.3/025864202ebb6109 (running kernel: 6.14.8-2-pve)``): the
layers and devices the admin's VMs get, so that the first run's findings transfer. A suite that
sets ``platform = "proxmox"`` without ``pve_version`` gets the host's generation. Both are set
in the suite's [method] (``suite.load.with_tables``), part of the spec the run stores, so
--resume, recommend and the report read them back on any host.

The suite stays as it is, with a note saying why, where it sets another platform (no note), where
Proxmox's graph cannot give what it asks for (vhost-user-blk, NVMe, without skip_invalid), and
where pveversion says nothing iomatrix can read (a generation other than 8 or 9, garbled output,
pveversion failing).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from iomatrix.core.errors import SuiteError, ToolFailed
from iomatrix.core.proc import first_line, run, which
from iomatrix.platform import proxmox as pve
from iomatrix.suite.expand import expand
from iomatrix.suite.load import with_tables
from iomatrix.suite.model import Suite
from iomatrix.vocab.words import Mode

PVEVERSION_TIMEOUT = 10.0


@dataclass(frozen=True)
class PveHost:
    """What ``pveversion`` told about this host: the generation iomatrix models, or None with
    ``said`` telling why not."""

    version: pve.PveVersion | None
    said: str


def detect_pve(env: Mapping[str, str] | None = None) -> PveHost | None:
    """This host's Proxmox VE, from ``pveversion`` on the PATH of ``env``; None where there is
    no pveversion (not a PVE host)."""
    tool = which("pveversion", env)
    if tool is None:
        return None
    try:
        out = run([tool], timeout=PVEVERSION_TIMEOUT, env=env)
    except ToolFailed as exc:
        return PveHost(version=None, said=str(exc))
    line = first_line(out.stdout)
    return PveHost(version=pve.version_of_pveversion(line),
                   said=f"pveversion printed {line[:120]!r}")


def on_host(suite: Suite, host: PveHost | None) -> tuple[Suite, tuple[str, ...]]:
    """``suite`` as it runs on ``host`` (None: not Proxmox VE), and the notes that say so."""
    modes = {suite.method.mode, *(p.mode for p in suite.part)}
    chosen = suite.method.model_fields_set
    if (host is None or not modes & {Mode.BLOCKLAYER, Mode.GUEST} or "pve_version" in chosen
            or ("platform" in chosen and suite.method.platform != "proxmox")):
        return suite, ()
    keeps = f'the suite measures platform = "{suite.method.platform}"'
    if host.version is None:
        return suite, (f"{host.said}: not Proxmox VE {' or '.join(map(str, pve.PVE_VERSIONS))}, "
                       f"the generations iomatrix models; {keeps} (set [method] platform and "
                       "pve_version to choose)",)
    values = {"pve_version": host.version} if "platform" in chosen else {
        "platform": "proxmox", "pve_version": host.version}
    try:
        proxmox = with_tables(suite, "method", values)
        expand(proxmox)     # what qemu-server cannot build (vhost-user-blk, NVMe...) is refused
    except SuiteError as exc:
        return suite, (f"this host runs Proxmox VE {host.version}, but {keeps} ({exc})",)
    return proxmox, (f"platform: proxmox (PVE {host.version}, from pveversion): the disks get the "
                   "block graph this host's VMs get; set [method] platform to measure another",)

