"""Issue 37, cluster load on an rbd pool or an iSCSI LUN: what a node's ``serve-guests`` and
``serve-blocklayer`` hand QEMU comes from the suite's ``[target]`` as the node checks it, never
from the request's images: an image of another pool, one whose name is not a run's (option
syntax of QEMU's rbd filename, a path), a conf path the request names, another LUN or a device
is refused or never used; and the ceph.conf each node's fio server reads reaches the node as
ONE word of the SSH command, whatever it holds."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from iomatrix.cluster.ssh import Node
from iomatrix.core.errors import NodesError
from iomatrix.core.trust import US
from iomatrix.drivers.cluster import NodeServer
from iomatrix.measure.nodepool import lun_image, lun_regions, pool_images
from iomatrix.qemu.args import storage_daemon_argv
from iomatrix.suite import load_suite_text
from iomatrix.suite.expand import expand
from iomatrix.suite.load import with_author
from iomatrix.targets.kind import NetworkVolume
from iomatrix.targets.workspace import Image
from tests.needs import needs
from tests.tgt import tgtd


def suite_on(keyring: Path):  # type: ignore[no-untyped-def]
    suite = load_suite_text(f"""[suite]
name = "t"
[target]
size = "64MiB"
rbd = {{ pool = "bench", monitors = ["192.0.2.1:3300"], client = "c", keyring = "{keyring}" }}
[method]
mode = "guest"
concurrent_nodes = true
""")
    return with_author(suite, US)


def image(spec: str, conf: str = "/tmp/planted.conf") -> Image:
    return Image(path=Path(f"rbd:{spec}"), format="raw", preallocation="off", size=64 << 20,
                 network=NetworkVolume(protocol="rbd", name=spec, client="x", fio={},
                                       node={"driver": "rbd", "conf": conf},
                                       drive_file=f"rbd:{spec}:conf={conf}"))


def test_a_node_reaches_only_runs_images_in_the_suites_pool(tmp_path: Path) -> None:
    keyring = tmp_path / "k.keyring"
    keyring.write_text("[client.c]\n\tkey = AQ==\n")
    keyring.chmod(0o600)
    suite = suite_on(keyring)
    config = next(c for c in expand(suite).configurations if c.mode == "guest")
    for n, spec in enumerate(["other/iomatrix-1-abcdef-0", "bench/iomatrix-1-abcdef-0:conf=/x",
                              "bench/iomatrix-1-abcdef-0 --x", "bench/vm-100-disk-0",
                              "bench/../iomatrix-1-abcdef-0"]):
        where = tmp_path / str(n)
        where.mkdir()
        with pytest.raises(NodesError, match="not an image of a run in the suite's pool bench"):
            pool_images([image(spec)], config, suite, where)
    where = tmp_path / "ok"
    where.mkdir()
    (got,) = pool_images([image("bench/iomatrix-7-abcdef-0")], config, suite, where)
    assert got.network is not None and got.network.node["conf"] == str(where / "ceph.conf")
    assert "/tmp/planted.conf" not in got.model_dump_json()
    assert f"keyring = {keyring}" in (where / "ceph.conf").read_text()
    assert (where / "ceph.conf").stat().st_mode & 0o777 == 0o600


def test_the_nodes_ceph_conf_is_one_word_of_the_ssh_command(tmp_path: Path) -> None:
    hostile = "[global]\nmon_host = 192.0.2.1'; touch /tmp/pwned; '\n"
    server = NodeServer(Node(host="192.0.2.9"), tmp_path / "s.sock", tmp_path / "log", hostile)
    remote = server.argv()[-1]
    assert shlex.split(remote)[-1] == hostile
    assert shlex.split(remote)[:2] == ["sh", "-c"]


def test_a_node_reaches_only_the_suites_lun(tmp_path: Path) -> None:
    suite = with_author(load_suite_text("""[suite]
name = "t"
[target]
allow_destroy = true
[target.iscsi]
portal = "192.0.2.1:3260"
target = "iqn.2026-11.org.example:t"
lun = 1
[method]
mode = "host"
concurrent_nodes = true
"""), US)
    lun = suite.target.iscsi
    assert lun is not None
    for path in ["/dev/sda", "iscsi://192.0.2.66:3260/iqn.2026-11.org.example:t/1",
                 "iscsi://192.0.2.1:3260/iqn.2026-11.org.example:t/2"]:
        planted = Image(path=Path(path), format="raw", preallocation="off", size=1 << 20,
                        is_device=True)
        with pytest.raises(NodesError, match="not the suite's LUN"):
            lun_image([planted], suite, tmp_path)
    asked = Image(path=Path(lun.url), format="raw", preallocation="off", size=1 << 20,
                  is_device=True, network=NetworkVolume(protocol="iscsi", name="x", client="x",
                                                        fio={}, node={"portal": "192.0.2.66"},
                                                        drive_file="iscsi://192.0.2.66/x"))
    got = lun_image([asked], suite, tmp_path)
    assert got.network is not None and got.network.node["portal"] == "192.0.2.1:3260"


@needs("tgt")
def test_a_node_takes_only_aligned_regions_inside_the_lun_none_overlapping(
        tmp_path: Path) -> None:
    """Guest and blocklayer modes on a LUN: each disk a request names is a region (offset,
    size) of the suite's LUN; the node refuses, in one line, a region past the LUN's end as it
    finds it (tgtd's 8 MiB LUN, probed there), one overlapping another disk's, one not aligned
    to a MiB, and one of no bytes; regions it takes become QEMU raw's ``offset`` and ``size``."""
    with tgtd(tmp_path, 8 << 20) as server:
        suite = with_author(load_suite_text(f"""[suite]
name = "t"
[target]
allow_destroy = true
[target.iscsi]
portal = "{server.portal}"
target = "{server.iqn}"
lun = {server.lun}
[method]
mode = "blocklayer"
concurrent_nodes = true
"""), US)
        config = expand(suite).configurations[0].model_copy(update={"vms": 2})
        lun = suite.target.iscsi
        assert lun is not None

        def region(offset: int, size: int) -> Image:
            return Image(path=Path(lun.url), format="raw", preallocation="off", size=size,
                         offset=offset, is_device=True)
        mib = 1 << 20
        for asked, says in [
                ((region(0, 4 * mib), region(6 * mib, 4 * mib)), "beyond the LUN's 8388608 bytes"),
                ((region(0, 4 * mib), region(3 * mib, 2 * mib)), "overlaps another disk's region"),
                ((region(4096, mib), region(4 * mib, mib)), "not aligned to 1 MiB"),
                ((region(0, mib), region(mib, mib + 512)), "not aligned to 1 MiB"),
                ((region(0, mib), region(2 * mib, 0)), "not aligned to 1 MiB"),
                ((region(0, mib),), "1 disks for 2 guests")]:
            with pytest.raises(NodesError, match=says) as refused:
                lun_regions(asked, config, suite, tmp_path)
            assert "\n" not in str(refused.value)
        with pytest.raises(ValueError, match="greater than or equal to 0"):
            region(-mib, mib)
        got = lun_regions((region(4 * mib, 4 * mib), region(0, 4 * mib)), config, suite,
                          tmp_path)
        assert [(i.offset, i.size) for i in got] == [(4 * mib, 4 * mib), (0, 4 * mib)]
        argv = storage_daemon_argv(config, got[0], qmp_socket=tmp_path / "q.sock")
        raw = [json.loads(a) for a in argv if a.startswith("{") and '"raw"' in a]
        assert [(n["offset"], n["size"]) for n in raw] == [(4 * mib, 4 * mib)]
        assert server.connections() == ""
