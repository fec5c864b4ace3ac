"""``iomatrix translate`` against qemu-server's own expectations.

qemu-server's test ``cfg2cmd`` turns VM configurations into the command line ``qm showcmd``
prints and compares it with one written down beside each. For every one of its fixtures with a
drive, of qemu-server 9.2.6 and (``--pve-version 8``) 8.3.13, translate must give each drive
the arguments qemu-server's test expects for it, argument by argument, in order, except where
translate says it leaves them out: PCI placement (``bus=pci.N,addr=…``).

The fixtures (tests/fixtures/cfg2cmd/qemu-server-VERSION/NAME.txt, made by make.py there from a
fetched qemu-server) hold each configuration and each drive's expected arguments, byte for
byte; storage.cfg holds the storages qemu-server's test defines. Where translate differs on
purpose, ``DIFFERING`` says why, and the test checks that the difference is exactly that.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any, Callable, NamedTuple

import pytest

from iomatrix.platform import proxmox as pve
from iomatrix.translate.vm import translate

FIXTURES = Path(__file__).parents[1] / "fixtures" / "cfg2cmd"
VERSIONS = {"qemu-server-9.2.6": 9, "qemu-server-8.3.13": 8}
"""Fixture folder → the PVE version translate is asked for (9: its default)."""
VMID = "8006"
"""run_config2command_tests.pl: ``$base_env->{vmid}``."""
# qemu-server's test host has no /etc/pve/priv/ceph: no keyring, no ceph configuration file.
STORAGES = {ident: storage.model_copy(update={"keyring": False, "ceph_conf": False})
            for ident, storage in pve.parse_storage_cfg(
                (FIXTURES / "storage.cfg").read_text()).items()}
PLACEMENT = re.compile(r",bus=pci\.\d+,addr=0x[0-9a-f]+(?:\.0x[0-9a-f]+)?")

Args = list[tuple[str, str]]


class Fixture(NamedTuple):
    folder: str
    name: str
    config: str
    error: str | None
    drives: dict[str, Args]
    """Drive → the arguments qemu-server's test expects for it, placement left out."""


def _expected(flag: str, value: str) -> tuple[str, str]:
    """An argument as translate gives it: a device without its PCI placement;
    of ``-machine`` only the EFI flash items (the rest is the VM's)."""
    if flag == "-device":
        return flag, PLACEMENT.sub("", value)
    if flag == "-machine":
        return flag, ",".join(p for p in value.split(",") if p.startswith("pflash"))
    return flag, value


def _load(path: Path) -> Fixture:
    sections: dict[str, list[str]] = {}
    current = None
    for line in path.read_text().splitlines():
        if (m := re.match(r"^--- ([\w-]+)$", line)) is not None:
            current = sections.setdefault(m.group(1), [])
        elif current is not None and not line.startswith("#"):
            current.append(line)
    config = "\n".join(sections.pop("config")) + "\n"
    error = sections.pop("error", [None])[0]
    drives = {key: [_expected(*shlex.split(line)) for line in lines if line]
              for key, lines in sections.items()}
    return Fixture(path.parent.name, path.stem, config, error, drives)


ALL = [_load(p) for folder in VERSIONS for p in sorted((FIXTURES / folder).glob("*.txt"))]


def _without_backing(args: Args) -> Args:
    """The snapshot chain left out: translate cannot know it (see DIFFERING)."""
    def strip(node: Any) -> Any:
        if not isinstance(node, dict):
            return node
        return {k: strip(v) for k, v in node.items() if k != "backing"}
    return [(f, pve.to_json(strip(json.loads(v))) if f == "-blockdev" else v) for f, v in args]


def _as_scsi_block(args: Args) -> Args:
    """scsi-block instead of scsi-hd: no device_id and no write-cache (DriveDevice.pm)."""
    block = re.compile(r",device_id=[^,]*|,write-cache=\w+")
    return [(f, block.sub("", v.replace("scsi-hd,", "scsi-block,"))
             if f == "-device" and v.startswith("scsi-hd,") else v) for f, v in args]


DIFFERING: dict[tuple[str, str, str], tuple[str, Callable[[Args], Args]]] = {
    ("qemu-server-9.2.6", "simple-backingchain", "scsi0"): (
        "the VM has snapshots kept as qcow2 files: qemu-server nests the backing chain the "
        "storage reports (mocked in its test); a configuration does not hold it: left out, with "
        "a note", _without_backing),
    ("qemu-server-9.2.6", "simple-backingchain", "scsi1"): (
        "the same, for qcow2 on LVM", _without_backing),
    ("qemu-server-9.2.6", "scsiblk", "scsi0"): (
        "scsiblock=1 on /dev/sdg: qemu-server asks the device (SCSI inquiry), and its test host "
        "has no SCSI disk there, so it falls back to scsi-hd; translate gives what a SCSI disk "
        "gets, scsi-block, with a note", _as_scsi_block),
}


def _translated(fixture: Fixture) -> dict[str, Any]:
    version = VERSIONS[fixture.folder]
    result = translate(fixture.config, pve_version=version,  # type: ignore[arg-type]
                       storages=STORAGES, vmid=VMID)
    return {d.name: d for d in result.drives}


@pytest.mark.parametrize("fixture", ALL, ids=[f"{f.folder}/{f.name}" for f in ALL])
def test_translate_gives_qemu_servers_arguments(fixture: Fixture) -> None:
    drives = _translated(fixture)
    if fixture.error is not None:       # qemu-server refuses the VM: translate refuses the drive
        assert any(fixture.error in d.notes for d in drives.values()), fixture.error
        return
    assert list(drives) == list(fixture.drives)            # every drive, in qemu-server's order
    for key, expected in fixture.drives.items():
        argv = drives[key].argv
        got = [(argv[i], argv[i + 1]) for i in range(0, len(argv), 2)]
        known = DIFFERING.get((fixture.folder, fixture.name, key))
        if known is None:
            assert got == expected, key
        else:
            assert got != expected and got == known[1](expected), key


def test_counts() -> None:
    """Every drive of every fixture is compared; the ones that differ are those DIFFERING
    names (the counts are in the issue's closing note)."""
    counts = {}
    for folder in VERSIONS:
        fixtures = [f for f in ALL if f.folder == folder]
        drives = sum(len(f.drives) for f in fixtures)
        differing = sum(1 for f, _, _ in DIFFERING if f == folder)
        counts[folder] = (len(fixtures), sum(f.error is not None for f in fixtures),
                          drives - differing, differing)
    # (fixtures with a drive, of them refused by qemu-server, drives identical, differing)
    assert counts == {"qemu-server-9.2.6": (51, 2, 139, 3),
                      "qemu-server-8.3.13": (43, 2, 113, 0)}
