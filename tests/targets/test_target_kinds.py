"""The target kinds' registry (``iomatrix.targets.registry``): every [target] key a suite can
name has its kind there, and what the runner, reclaim and doctor ask of a kind is answered by
the kind, not by a type the caller knows."""

from __future__ import annotations

import ast
from pathlib import Path

from iomatrix.core.trust import US
from iomatrix.measure.reclaim import KINDS as RECLAIM_NAMES
from iomatrix.suite.model import Target
from iomatrix.suite.target import KIND_KEYS, TABLES
from iomatrix.targets import registry
from iomatrix.suite.target import IscsiTarget
from iomatrix.targets import iscsi
from iomatrix.targets.iscsi import IscsiLun
from iomatrix.targets.kind import NetworkVolume, Probe
from iomatrix.targets.lvm import KIND as LVM_VOLUME
from iomatrix.targets.pvesm import KIND as PVESM_VOLUME
from iomatrix.targets.zfs import KIND as ZFS_ZVOL
from iomatrix.targets.rbd import KIND as RBD_IMAGE, RbdPool
from iomatrix.targets.targets import TargetSet, plan_targets
from iomatrix.targets.workspace import Workspace
from iomatrix.suite.load import load_suite_text
from tests.targets.test_targets import MATRIX, SHARED


def test_every_target_key_has_a_kind() -> None:
    # "storage" is a Proxmox VE storage id, resolved into one of the others before a run
    named = set(KIND_KEYS) - {"storage"}
    assert named == {"directory", "device", *TABLES}
    assert set(registry.KINDS) == named
    assert {k for kind in registry.KINDS.values() for k in kind.keys} == named


def test_a_kind_opens_its_own_target(tmp_path: Path) -> None:
    directory = Target(directory=tmp_path, size="1MiB")
    rbd = Target(rbd={"pool": "rbd", "monitors": ["192.0.2.1"]}, size="1GiB")
    lun = Target(iscsi={"portal": "192.0.2.1", "target": "iqn.2003-01.org.example:t"},
                 allow_destroy=True)
    opened = {t.kind: registry.open_target(t, (), keep=False, author=US)
              for t in (directory, rbd, lun)}
    assert type(opened["directory"]) is Workspace
    assert type(opened["rbd"]) is RbdPool
    assert type(opened["iscsi"]) is IscsiLun
    assert registry.tools(rbd) == ("rbd",)
    assert registry.tools(directory) == ()
    assert registry.kind_of(Target(storage="local")) is None
    assert [k.cluster_load for k in (registry.kind_of(t) for t in (directory, rbd, lun))] == [
        True, True, True]


def test_several_targets_open_as_a_set(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    suite = load_suite_text(f'[suite]\nname = "two"\n[target]\nsize = "1MiB"\n'
                            f'[[targets]]\nname = "a"\ndirectory = "{a}"\n'
                            f'[[targets]]\nname = "b"\ndirectory = "{b}"\n'
                            + MATRIX + SHARED.format(runtime="1s"))
    opened = registry.open_target(suite.target, plan_targets(suite), keep=False, author=US)
    assert type(opened) is TargetSet
    assert opened.host_fields() == {"targets": "a, b"}


def test_host_fields_name_the_storage_as_given() -> None:
    rbd = registry.open_target(Target(rbd={"pool": "p", "namespace": "n",
                                           "monitors": ["192.0.2.1"]}, size="1GiB"),
                               (), keep=False, author=US)
    lun = registry.open_target(Target(iscsi={"portal": "192.0.2.1",
                                             "target": "iqn.2003-01.org.example:t", "lun": 3},
                                      allow_destroy=True), (), keep=False, author=US)
    assert rbd.host_fields() == {"target": "rbd pool p/n"}
    assert lun.host_fields() == {"target": "iscsi://192.0.2.1:3260/iqn.2003-01.org.example:t/3",
                                 "target_fs": "(iSCSI LUN)"}


def test_what_a_kind_records_is_reclaimed_by_its_name() -> None:
    assert set(registry.RESOURCES) == {RBD_IMAGE, LVM_VOLUME, PVESM_VOLUME, ZFS_ZVOL}
    assert RECLAIM_NAMES[RBD_IMAGE] == "RBD image"
    assert RECLAIM_NAMES[LVM_VOLUME] == "LVM volume"
    assert RECLAIM_NAMES[PVESM_VOLUME] == "Proxmox VE volume"
    assert RECLAIM_NAMES[ZFS_ZVOL] == "ZFS zvol"


def test_doctor_asks_each_kind_in_order(tmp_path: Path) -> None:
    asked: list[str] = []

    def which(tool: str) -> str | None:
        asked.append(tool)
        return None

    def run(argv: object) -> tuple[int | None, str, str]:
        raise AssertionError("nothing runs without a program found")

    checks = registry.host_checks(Probe(which=which, run=run, sysfs=tmp_path))
    assert [c.name for c in checks] == [
        "fio rbd engine", "rbd command", "kernel rbd (krbd)",
        "kernel iSCSI initiator (iscsi_tcp)", "tgtd (iSCSI target)", "LVM tools (lvm, lvmthin)",
        "btrfs tools (btrfs)", "Proxmox VE storage layer (pvesm)", "ZFS tools (zfs)"]
    assert asked == ["fio", "rbd", "tgtd", "lvcreate", "lvremove", "lvs", "vgs", "btrfs", "pvesm",
                     "pvesh", "zfs", "zpool"]
    assert not any(c.ok for c in checks)


def test_a_proxmox_storage_type_names_one_kind() -> None:
    kinds = list(dict.fromkeys(registry.KINDS.values()))
    types = [t for kind in kinds for t in kind.storage_types]
    assert len(types) == len(set(types))
    assert set(types) == {"dir", "nfs", "cifs", "rbd", "iscsi", "iscsidirect", "btrfs", "lvm",
                          "lvmthin", "zfspool"}
    assert [k.keys for k in kinds if k.storage_volumes] == [("iscsi",)]


def test_a_network_volume_says_how_the_drivers_reach_it() -> None:
    plain = NetworkVolume(protocol="rbd", name="pool/image", node={}, drive_file="rbd:pool/image",
                          fio={"ioengine": "rbd"}, client="librbd")
    assert (plain.host_device(), plain.host_daemon(), plain.aio_not_evaluated) == (None, None,
                                                                                  None)
    lun = iscsi.volume(IscsiTarget(portal="192.0.2.1:3260", target="iqn.2000-01.invalid:none",
                                   lun=7), chap=None, secret=None)
    assert lun.aio_not_evaluated == iscsi.AIO_NOT_EVALUATED
    assert lun.host_device() is None       # no host is logged in to a documentation address
    assert lun.host_daemon() in {iscsi.kernel_initiator_problem(),
                                 "this host is not logged in to the LUN"} - {None}


def test_no_driver_names_a_target_kind() -> None:
    """The drivers ask a volume (``NetworkVolume``) how to reach it; none imports a kind's
    module or compares with a kind's name (docstrings and comments may name one)."""
    kinds = {"iscsi", "rbd", "local"}
    root = Path(__file__).parents[2] / "iomatrix" / "drivers"
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        docs = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
                  and id(node) not in docs):
                names = [f"iomatrix.targets.{node.value.lower()}"]
            else:
                continue
            found += [f"{path.name}: {n}" for n in names
                      if n.startswith("iomatrix.targets.") and n.split(".")[2] in kinds]
    assert found == []
