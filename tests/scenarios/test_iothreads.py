"""Several IOThreads per disk measured for real (issue 35): a TCG guest whose virtio-blk disk two
IOThreads serve, round-robin and mapped queue by queue, and (QEMU 10.0) a virtio-scsi
controller's; QMP reads back what QEMU applied into each trial's record. Needs QEMU 9.0 (the
Debian 13 pass has 10.0); this host's older QEMU refuses the run in one line
(tests/qemu/test_iothreads_qemu.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from iomatrix.qemu import version as qemu_version
from tests.conftest import BOOT_TIMEOUT, run_guests
from tests.needs import needs

pytestmark = pytest.mark.slow

BODY = """
[matrix]
controller = "virtio-blk"
iothread = true
iothreads = 2
num_queues = 2
vq_mapping = ["round-robin", "1:0"]
{part}
[[workloads]]
rw = "randread"
iodepth = 4
[method]
mode = "guest"
ramp = 0
runtime = "500ms"
accel = "tcg"
vcpus = 2
memory = "384MiB"
""" + BOOT_TIMEOUT

SCSI_PART = """
[[part]]
mode = "guest"
controller = "virtio-scsi-single"
iothread = true
iothreads = 2
num_queues = 2
"""


@needs("qemu", "fio")
def test_two_iothreads_in_a_guest(tmp_path: Path, no_leftovers: None) -> None:
    found = qemu_version.installed("qemu-system-x86_64")
    assert found is not None
    if found < qemu_version.IOTHREAD_VQ_MAPPING["virtio-blk"]:
        pytest.skip(f"QEMU {qemu_version.shown(found)} has no iothread-vq-mapping (virtio-blk: "
                    "9.0): the Debian 13 pass (QEMU 10.0) runs this")
    scsi = found >= qemu_version.IOTHREAD_VQ_MAPPING["virtio-scsi"]
    outcome, stored = run_guests(tmp_path, BODY.format(part=SCSI_PART if scsi else ""))
    assert outcome.trials_failed == 0, [t.reason for t in stored.trials if t.reason]
    by_label = {c.key: c.label for c in stored.configs}
    mappings = {}
    for trial in stored.trials:
        applied = trial.applied
        assert applied["accel"] == "tcg" and trial.samples[0].iops > 0
        assert applied["iothreads"] == "2" and applied["device.iothread"] == ""
        ids = dict(item.split("=") for item in applied["iothreads.thread-ids"].split(","))
        assert len(ids) == 2 and len(set(ids.values())) == 2, applied
        assert applied["guest.queues"] == "2", applied           # the guest sees both queues
        mappings[by_label[trial.config_key]] = applied["device.iothread-vq-mapping"]
    want = {"guest virtio-blk/io_uring/none/raw iothread×2 q=2": "round-robin×2",
            "guest virtio-blk/io_uring/none/raw iothread×2 vq=1:0 q=2": "1:0"}
    if scsi:
        want["guest virtio-scsi-single/io_uring/none/raw iothread×2 q=2"] = "round-robin×2"
    assert mappings == want
    assert all('"iothread-vq-mapping"' in t.command for t in stored.trials)
