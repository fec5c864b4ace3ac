"""What refuses a run before anything is stored or created, in one line: the programs it needs,
what its suite's author may not have this host do, what cluster load cannot reach, and its
target, opened by its kind (``iomatrix.targets.registry``) and checked. The runner and a
cluster's controller (``iomatrix.measure.cluster``) ask here alike."""

from __future__ import annotations

import os
from collections.abc import Sequence

from iomatrix.cluster.ssh import Node
from iomatrix.core import cpuset
from iomatrix.core.errors import EnvironmentProblem, SuiteError, UntrustedFile
from iomatrix.core.proc import require
from iomatrix.drivers.cluster import on_every_node
from iomatrix.drivers.guest.kind import GuestKind
from iomatrix.drivers.guest.kinds import check_kinds, cluster_refusal, opened_kinds
from iomatrix.measure.prepare import PreparedRun
from iomatrix.platform import proxmox as pve
from iomatrix.qemu import version as qemu_version
from iomatrix.suite.expand import Expansion
from iomatrix.suite.model import Suite
from iomatrix.targets import registry
from iomatrix.targets.kind import OpenTarget
from iomatrix.vocab.axes import AFFINITY_AXES
from iomatrix.vocab.words import Mode


def tools_for(expansion: Expansion) -> list[str]:
    """The programs a run needs, checked before anything starts."""
    tools = ["fio", "qemu-img"]
    configs = expansion.configurations
    if any(c.mode == Mode.BLOCKLAYER or c.data_path == "vhost-user-blk" for c in configs):
        tools.append("qemu-storage-daemon")
    if any(c.mode == Mode.BLOCKLAYER and c.iothread for c in configs):
        tools.append("fusermount3")
    if any(c.mode == Mode.GUEST for c in configs):
        tools.append("qemu-system-x86_64")
    return tools


def check_run(prepared: PreparedRun, keep: bool,
              nodes: Sequence[Node]) -> tuple[OpenTarget, list[GuestKind]]:
    """Everything a run is refused for, checked before anything is stored or created: the
    programs it needs, cluster load, what the suite's author may not ask, the target (opened
    by its kind, nothing made yet); with what the guests read ([guest]'s image) opened once:
    every QEMU reads that descriptor."""
    suite = prepared.suite
    for tool in tools_for(prepared.full):
        require(tool)
    for tool in registry.tools(suite.target):
        require(tool)
    if suite.method.concurrent_nodes and not nodes:
        raise SuiteError("[method] concurrent_nodes needs the cluster's nodes: give [nodes] or --nodes")
    if suite.method.concurrent_nodes:
        check_cluster_load(suite, prepared.full)
        check_node_counts(prepared.full, nodes)
    check_author(suite)
    check_chain_qemu(suite, prepared.full)
    check_libvirt_mapping(suite, prepared.full)   # libvirtd's own answer first: its QEMU runs
    check_iothreads_qemu(prepared.full)
    check_affinity(prepared.full, suite.method.irq_affinity)
    guests = opened_kinds(suite)            # their files checked just above
    workspace = workspace_of(prepared, keep)
    # under cluster load, each node's guests get disks of their own on the shared target
    workspace.check([on_every_node(c, len(nodes)) if suite.method.concurrent_nodes else c
                     for c in prepared.full.configurations])
    return workspace, guests


def check_author(suite: Suite, *, guest_files: bool = True) -> None:
    """What the suite's author (``Suite.author``) may not have this host do, refused in one line
    (``UntrustedFile``) before anything starts, is stored, or logs in anywhere (a node, a
    portal, a monitor): destroy a device or LUN (``Suite.destroy_refused``); hand QEMU a
    [guest] file they could not choose or read (``check_guest_files``); send a key of a file
    they cannot read to monitors or a portal they chose (each target kind's ``check_author``:
    ``rbd.locate``, ``iscsi.read_chap``). Without ``guest_files``, the [guest] files are not
    looked at (a node's preflight under cluster load: they are the controller's, which sends
    the image; the node checks its copy)."""
    if (refused := suite.destroy_refused()) is not None:
        raise UntrustedFile(refused, hint="destroy a device only with a suite that only root "
                                          "(or you) can write, in a directory likewise")
    if guest_files:
        check_kinds(suite)
    registry.check_author((suite.target, *suite.targets), suite.author)


BINARY = {Mode.BLOCKLAYER: "qemu-storage-daemon", Mode.GUEST: "qemu-system-x86_64"}
"""The QEMU program each mode runs the graph in."""


def check_chain_qemu(suite: Suite, expansion: Expansion) -> None:
    """A qcow2 volume chain (``[target] lvm`` ``volume_chain``) is refused in one line before
    anything is created, rather than every trial failing in the graph builder's or QEMU's
    words: with ``snapshots`` under a graph that has no backing chain (libvirt's, Proxmox VE
    8's: a chain is Proxmox VE 9's); and under Proxmox VE 9's graph, which sets
    ``discard-no-unref`` on its qcow2 nodes, on a QEMU without the option
    (``qemu.version.DISCARD_NO_UNREF``), the QEMU asked being each mode's own (blocklayer:
    qemu-storage-daemon, guest: qemu-system-x86_64)."""
    lvm = suite.target.lvm
    method = suite.method
    qcow2 = [c for c in expansion.configurations if c.format == "qcow2" and c.mode in BINARY]
    if lvm is None or not lvm.volume_chain or not qcow2:
        return
    pve_version = method.pve_version or pve.DEFAULT_PVE_VERSION
    if lvm.snapshots and (method.platform == "libvirt"
                          or (method.platform == "proxmox" and pve_version < 9)):
        graph = "libvirt's" if method.platform == "libvirt" else f"Proxmox VE {pve_version}'s"
        raise SuiteError(
            f"[target] lvm snapshots = {lvm.snapshots}: {graph} graph has no qcow2 backing "
            "chain (snapshot-as-volume-chain is Proxmox VE 9's)",
            hint="set [method] pve_version = 9 with platform = \"proxmox\", use platform = "
                 "\"qemu\", or drop snapshots")
    if method.platform != "proxmox" or pve_version < 9:
        return
    for binary in sorted({BINARY[c.mode] for c in qcow2}):
        found = qemu_version.installed(binary)
        if found is not None and found < qemu_version.DISCARD_NO_UNREF:
            raise EnvironmentProblem(
                f"[target] lvm volume_chain under platform = \"proxmox\" (PVE 9's graph sets "
                f"discard-no-unref on the chain's qcow2 nodes) needs QEMU "
                f"{qemu_version.shown(qemu_version.DISCARD_NO_UNREF)} or later; {binary} here is "
                f"{qemu_version.shown(found)}",
                hint="run on a host with QEMU 8.1+ (Proxmox VE 9 ships 10.0), or measure the "
                     "chain with [method] platform = \"qemu\"")


def check_libvirt_mapping(suite: Suite, expansion: Expansion) -> None:
    """Several IOThreads per disk under ``platform = "libvirt"`` are refused in one line before
    the run where the libvirtd asked (``virsh version --daemon``) or its QEMU lacks them
    (``platform.libvirt.Versions.mapping_refusal``): libvirt 9.0's domxml-to-native drops a
    disk's ``<driver><iothreads>`` without a word. A libvirtd that does not answer is the
    driver's to report."""
    method = suite.method
    several = [c for c in expansion.configurations
               if c.mode == Mode.GUEST and c.iothread and (c.iothreads or 0) > 1]
    if method.platform != "libvirt" or not several:
        return
    from iomatrix.drivers import libvirt as lvd
    uri = method.libvirt_uri or lvd.DEFAULT_URI
    if lvd.libvirt_problem(uri) is not None:
        return
    scsi = any(c.controller in ("virtio-scsi", "virtio-scsi-single") for c in several)
    refused = lvd.daemon_versions(uri).mapping_refusal(scsi=scsi)
    if refused is not None:
        raise EnvironmentProblem(
            f"iothreads = {several[0].iothreads} under platform = \"libvirt\": {refused} "
            f"(libvirtd at {uri})",
            hint="run on a host with libvirt 10.0+ and QEMU 9.0+ (Debian 13: 11.3 with 10.0), "
                 "or measure several IOThreads with [method] platform = \"qemu\"")


def check_iothreads_qemu(expansion: Expansion,
                         found: qemu_version.QemuVersion | None = None) -> None:
    """Several IOThreads per disk (``iothreads``) refused in one line before anything runs
    where this host's qemu-system-x86_64 (or ``found``) predates its controller's
    ``iothread-vq-mapping`` (``qemu.version.IOTHREAD_VQ_MAPPING``: virtio-blk 9.0,
    virtio-scsi 10.0), rather than every trial failing in QEMU's words. A suite that sets
    skip_invalid has them skipped with that reason instead (``measure.prepare``)."""
    wanted = [c for c in expansion.configurations if c.mode == Mode.GUEST and c.iothreads]
    if not wanted:
        return
    found = found or qemu_version.installed(BINARY[Mode.GUEST])
    for config in wanted:
        refused = qemu_version.mapping_refusal(str(config.controller), config.iothreads, found,
                                               BINARY[Mode.GUEST])
        if refused is not None:
            raise EnvironmentProblem(
                refused,
                hint="run on a host with a newer QEMU (Debian 13 and Proxmox VE 9 ship 10.0), "
                     "or leave iothreads out (one IOThread per disk)")


def check_affinity(expansion: Expansion, irq_affinity: str | None = None) -> None:
    """A CPU set ([matrix] vcpu_affinity, iothread_affinity, main_affinity; [method]
    irq_affinity) naming CPUs this host does not have online is refused in one line before
    anything starts ("numa" is resolved per session, for the device holding its image), and
    irq_affinity without root (only root writes /proc/irq)."""
    online = cpuset.online()
    levels = [(f"[matrix] {axis}", getattr(config, axis))
              for config in expansion.configurations for axis in AFFINITY_AXES]
    for where, level in [*levels, ("[method] irq_affinity", irq_affinity)]:
        if level is None or level == cpuset.NUMA:
            continue
        missing = cpuset.parse(level) - online
        if missing:
            raise EnvironmentProblem(
                f"{where} = \"{level}\": CPU {cpuset.shown(missing)} is not an online CPU of "
                f"this host (online: {cpuset.shown(online)})",
                hint="name CPUs of /sys/devices/system/cpu/online, or \"numa\"")
    if irq_affinity is not None and os.geteuid() != 0:
        raise EnvironmentProblem("[method] irq_affinity steers the target device's IRQs "
                                 "(/proc/irq): only root may",
                                 hint="run as root, or leave irq_affinity out (the IRQs' "
                                      "affinity is reported as found)")


def check_cluster_load(suite: Suite, expansion: Expansion) -> None:
    """SuiteError when ``suite`` asks cluster load of what is not built for it."""
    kind = registry.kind_of(suite.target)
    if kind is not None and not kind.cluster_load:
        raise SuiteError("[method] concurrent_nodes loads a directory or device target only, "
                         f"so far (the target is {suite.target.kind})")
    if suite.target.rbd is not None:
        check_pool_load(suite)
    if suite.target.iscsi is not None:
        check_lun_load(suite, expansion)
    if suite.target.rbd is None and suite.target.iscsi is None and any(
            c.mode == Mode.BLOCKLAYER for c in expansion.configurations):
        raise SuiteError("[method] concurrent_nodes loads a blocklayer part on an rbd pool "
                         "or an iSCSI LUN only, so far (each node's qemu-storage-daemon on "
                         "its own image, or its own region of the LUN)")
    pinned = sorted({axis for c in expansion.configurations for axis in AFFINITY_AXES
                     if getattr(c, axis) is not None})
    if pinned:
        raise SuiteError(f"[method] concurrent_nodes: {pinned[0]} is not applied on the nodes "
                         "(iomatrix pins threads on this host only, so far)")
    if (refused := cluster_refusal(suite)) is not None:
        raise SuiteError(f"[method] concurrent_nodes: {refused}")


def check_node_counts(expansion: Expansion, nodes: Sequence[Node]) -> None:
    """SuiteError when a configuration's ``node_count`` asks for more nodes than the run has."""
    most = max((c.node_count or 0 for c in expansion.configurations), default=0)
    if most > len(nodes):
        raise SuiteError(f"[matrix] node_count {most}: the run has {len(nodes)} node(s)",
                         hint="name more nodes in [nodes] or --nodes, or lower node_count")


def check_lun_load(suite: Suite, expansion: Expansion) -> None:
    """SuiteError for what cluster load on an iSCSI LUN does not do: guest and blocklayer
    modes give each node's disks a region of the LUN as platform qemu's graph (a raw node's
    ``offset`` and ``size``) only."""
    if suite.method.platform != "qemu" and any(c.mode != Mode.HOST
                                               for c in expansion.configurations):
        raise SuiteError("[method] concurrent_nodes on an iSCSI LUN: guest and blocklayer "
                         "modes build each node's region of the LUN on platform qemu's graph "
                         f"only (not {suite.method.platform}'s)",
                         hint='leave [method] platform out, or set it to "qemu"')


def check_pool_load(suite: Suite) -> None:
    """SuiteError for what cluster load on an rbd pool does not do yet: krbd (each node would
    map the images in its kernel)."""
    assert suite.target.rbd is not None
    if suite.target.rbd.krbd:
        origin = suite.target.from_storage
        given = (f"krbd 1 of Proxmox VE storage {origin.id}" if origin is not None
                 else "krbd = true")
        raise SuiteError(f"[method] concurrent_nodes on an rbd pool: {given} is not built: each "
                         "node would map the images in its own kernel; the nodes reach the pool "
                         "through librbd only")


def workspace_of(prepared: PreparedRun, keep: bool) -> OpenTarget:
    """The run's target, opened by its kind (``iomatrix.targets.registry``)."""
    return registry.open_target(prepared.suite.target, prepared.targets, keep=keep,
                                author=prepared.suite.author)
