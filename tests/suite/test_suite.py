"""The suite loader and expansion: every error names the file, the key and the bad value."""

from __future__ import annotations

from pathlib import Path

import pytest

from iomatrix.core.errors import InvalidCombination, SuiteError
from iomatrix.suite import builtin_suites, expand, load_suite, load_suite_text

BASE = """
[suite]
name = "t"
[target]
directory = "/tmp/iomatrix-test"
size = "64MiB"
"""


def load(extra: str, base: str = BASE):
    return load_suite_text(base + extra, source="t.toml")


def error(extra: str, base: str = BASE) -> str:
    with pytest.raises(SuiteError) as info:
        suite = load(extra, base)
        expand(suite)
    return str(info.value)


@pytest.mark.parametrize("extra, expected", [
    ("[matrix]\naio = ['native', 'nativ']\n", "t.toml: [matrix] aio[1] = 'nativ': Input should be 'native', 'io_uring' or 'threads'"),
    ("[matrix]\ncache = 'writebak'\n", "t.toml: [matrix] cache[0] = 'writebak'"),
    ("[matrix]\nformat = ['vmdk']\n", "[matrix] format[0] = 'vmdk'"),
    ("[matrix]\npreallocation = 'thick'\n", "[matrix] preallocation[0] = 'thick'"),
    ("[matrix]\ncontroller = 'lsi53c810'\n", "[matrix] controller[0] = 'lsi53c810'"),
    ("[matrix]\niothread = 'yes'\n", "[matrix] iothread[0] = 'yes'"),
    ("[matrix]\naio = []\n", "[matrix] aio = []"),
    ("[matrix]\nbogus = 1\n", "[matrix] bogus = 1: unknown key"),
    ("[workloads]\nbs = ['4k', '3000']\n", "[workloads] bs[1] = '3000': block size 3000 is not a multiple of 512"),
    ("[workloads]\nbs = 'huge'\n", "[workloads] bs[0] = 'huge': not a size"),
    ("[workloads]\nrw = 'randomread'\n", "[workloads] rw[0] = 'randomread'"),
    ("[workloads]\niodepth = 0\n", "[workloads] iodepth[0] = 0: Input should be greater than or equal to 1"),
    ("[workloads]\nnumjobs = -1\n", "[workloads] numjobs[0] = -1"),
    ("[workloads]\nrate_iops = -5\n", "[workloads] rate_iops[0] = -5"),
    ("[workloads]\noptions = { filename = '/dev/sda' }\n", "[workloads] options: fio option 'filename' is set by iomatrix"),
    ("[workloads]\noptions = { opendir = '/dev' }\n", "fio option 'opendir' is refused: it names, creates or reads files"),
    ("[workloads]\noptions = { rwmixread = \"70\\nfilename=/dev/sdz\" }\n", "no line break, '$'"),
    ("[workloads]\noptions = { 'a b' = 1 }\n", "'a b' is not a fio option name"),
    ("[[workloads]]\nrw = 'read'\n[[workloads]]\nbs = '1k1'\n", "[[workloads]] #2 bs[0] = '1k1'"),
    ("[method]\nmode = 'vm'\n", "[method] mode = 'vm': Input should be 'host', 'blocklayer' or 'guest'"),
    ("[method]\nramp = 'fast'\n", "[method] ramp = 'fast': not a duration"),
    ("[method]\nruntime = '100ms'\n", "[method] runtime = '100ms': runtime must be at least 500ms"),
    ("[method]\nsamples = 0\n", "[method] samples = 0"),
    ("[method]\nengine = 'spdk'\n", "[method] engine = 'spdk'"),
    ("[method]\ntarget_ci = 'two'\n", "[method] target_ci = 'two': not a percentage"),
    ("[method]\ntarget_ci = '150%'\n", "[method] target_ci = '150%'"),
    ("[method]\nsamples = 5\nmax_samples = 3\n", "max_samples (3) is below samples (5)"),
    ("[method]\nsteady_state = true\nmin_runtime = '2s'\n", "steady_state needs 5s <= min_runtime"),
    ("[extra]\nx = 1\n", "t.toml: [extra]: unknown table"),
])
def test_bad_values_name_file_key_and_value(extra: str, expected: str) -> None:
    assert expected in error(extra)


@pytest.mark.parametrize("base, expected", [
    ("[suite]\nname='t'\n", "t.toml: [target]: required table is missing"),
    ("[target]\ndirectory='/tmp'\nsize='1G'\n", "t.toml: [suite]: required table is missing"),
    ("[suite]\nname='bad name'\n[target]\ndirectory='/tmp'\nsize='1G'\n", "[suite] name = 'bad name'"),
    ("[suite]\nname='t'\n[target]\ndirectory='/tmp'\n", "[target]: a directory target needs a size"),
    ("[suite]\nname='t'\n[target]\nsize='1G'\n", "[target]: give one of directory"),
    ("[suite]\nname='t'\n[target]\ndirectory='/tmp'\ndevice='/dev/loop0'\nallow_destroy=true\nsize='1G'\n", "not directory and device"),
    ("[suite]\nname='t'\n[target]\ndevice='/dev/loop0'\n", "device /dev/loop0 is written to and destroyed; say so with allow_destroy = true"),
    ("[suite]\nname='t'\n[target]\ndirectory='/tmp'\nsize='12k'\n", "below the minimum of 1MiB"),
    ("[suite]\nname='t'\n[target]\ndirectory='/tmp'\nsize='lots'\n", "[target] size = 'lots': not a size"),
    ("[suite\nname='t'\n", "t.toml: TOML syntax error"),
])
def test_structural_errors(base: str, expected: str) -> None:
    assert expected in error("", base=base)


def test_invalid_combination_carries_qemu_reason() -> None:
    with pytest.raises(InvalidCombination) as info:
        expand(load("[matrix]\naio = 'native'\ncache = ['none', 'writeback']\n[method]\nmode='blocklayer'\n"))
    assert "aio=native was specified, but it requires cache.direct=on" in str(info.value)
    assert "cache=writeback" in str(info.value)
    assert "skip_invalid" in (info.value.hint or "")


def test_raw_metadata_preallocation_is_invalid() -> None:
    with pytest.raises(InvalidCombination, match="Unsupported preallocation mode: metadata"):
        expand(load("[matrix]\nformat = 'raw'\npreallocation = 'metadata'\n"))


def test_iothread_on_a_controller_without_one_is_invalid_in_guest_mode() -> None:
    with pytest.raises(InvalidCombination, match="Property 'nvme.iothread' not found"):
        expand(load("[matrix]\ncontroller = 'nvme'\niothread = true\n[method]\nmode = 'guest'\n"))


def test_skip_invalid_drops_and_lists() -> None:
    exp = expand(load("[matrix]\naio = ['native', 'threads']\ncache = ['none', 'writeback']\n"
                      "format = ['raw', 'qcow2']\npreallocation = ['off', 'metadata']\n"
                      "skip_invalid = true\n"))
    keys = [c.key for c in exp.configurations]
    assert not any("aio=native" in k and "cache=writeback" in k for k in keys)
    assert not any("format=raw" in k and "preallocation=metadata" in k for k in keys)
    # native: none × (raw off, qcow2 off, qcow2 metadata) = 3; threads: 2 caches × 3 = 6
    assert len(keys) == 9
    assert len(exp.skipped) == 16 - 9
    assert sum(n.startswith("skipped ") for n in exp.notes) == 7


def test_axis_ignored_by_mode_is_reported() -> None:
    exp = expand(load("[matrix]\ncontroller = ['virtio-blk', 'nvme']\n[method]\nmode = 'blocklayer'\n"))
    assert any("[matrix] controller is ignored in blocklayer mode" in n for n in exp.notes)
    assert all(c.controller is None for c in exp.configurations)
    exp = expand(load("[matrix]\naio = ['native', 'threads']\n[method]\nmode = 'host'\n"))
    assert any("[matrix] aio is ignored in host mode" in n for n in exp.notes)
    assert [c.key for c in exp.configurations] == ["host"]


@pytest.mark.parametrize("qemu, aborts", [((7, 2, 22), True), ((8, 2, 2), True),
                                          ((10, 0, 13), False), (None, False)])
def test_the_export_note_names_the_nbd_abort_only_before_qemu_9(
        qemu: tuple[int, int, int] | None, aborts: bool) -> None:
    exp = expand(load("[matrix]\niothread = [true, false]\n[method]\nmode = 'blocklayer'\n"),
                 qemu=qemu)
    note, = [n for n in exp.notes if "iothread in blocklayer mode" in n]
    assert note.startswith("[matrix] iothread in blocklayer mode: on = FUSE export with an "
                           "iothread, off = NBD export")
    assert ("can abort an NBD export with an iothread" in note) == aborts
    assert ("7.2" in note) == aborts


def test_cross_product_and_workload_groups() -> None:
    exp = expand(load("[matrix]\naio = ['io_uring', 'threads']\ncache = ['none', 'writeback', 'unsafe']\n"
                      "[[workloads]]\nrw = 'randread'\nbs = ['4k', '64k']\niodepth = [1, 8, 32]\n"
                      "[[workloads]]\nrw = 'randwrite'\nbs = '4k'\niodepth = 32\noptions = { fsync = 1 }\n"
                      "[method]\nbaseline = true\n"))
    assert len(exp.configurations) == 1 + 2 * 3
    assert exp.configurations[0].mode == "host"
    assert len(exp.workloads) == 2 * 3 + 1
    assert exp.workloads[-1].options == (("fsync", "1"),)
    assert len({w.key for w in exp.workloads}) == len(exp.workloads)
    assert len({c.key for c in exp.configurations}) == len(exp.configurations)


def test_units() -> None:
    s = load("[workloads]\nbs = ['512', '4k', '1m']\n[method]\nramp='500ms'\nruntime='2m'\n")
    assert s.workloads[0].bs == (512, 4096, 1 << 20)
    assert s.method.ramp == 0.5 and s.method.runtime == 120
    assert s.target.size == 64 << 20


def test_file_and_builtin_loading(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text(BASE)
    assert load_suite(path).source_path == str(path)
    assert load_suite("quick").source_path == "builtin:quick"
    with pytest.raises(SuiteError, match="nope: no such file and no built-in suite"):
        load_suite("nope")
    bad = tmp_path / "bin.toml"
    bad.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(SuiteError, match="cannot read"):
        load_suite(bad)


def test_quick_suite_shape() -> None:
    """The default main job: host baseline plus blocklayer aio × cache × format, invalid skipped."""
    exp = expand(load_suite("quick"))
    assert exp.configurations[0].mode == "host"
    bl = [c for c in exp.configurations if c.mode == "blocklayer"]
    assert len(bl) == (3 * 2 - 1) * 2
    assert {c.aio for c in bl} == {"native", "io_uring", "threads"}
    assert len(exp.skipped) == 2 and all("aio=native" in s.reason for s in exp.skipped)
    assert [w.key for w in exp.workloads] == ["randread/4k/qd1/nj1", "randread/4k/qd32/nj1",
                                              "randwrite/4k/qd32/nj1"]
    guests = [c for c in exp.configurations if c.mode == "guest"]
    assert {(c.controller, c.iothread) for c in guests} == {
        ("virtio-blk", True), ("virtio-blk", False),
        ("virtio-scsi-single", True), ("virtio-scsi-single", False)}
    assert exp.trials_per_sample == (1 + 10 + 4) * 3
    # under TCG: one emulated guest trial, said in the notes
    tcg = exp.for_accel("tcg")
    assert [c for c in tcg.configurations if c.mode == "guest"] == guests[:1]
    assert tcg.workloads_for(guests[0]) == exp.workloads[:1]
    assert tcg.trials_per_sample == (1 + 10) * 3 + 1
    assert any("guests are emulated (TCG)" in n for n in tcg.notes)
    assert exp.for_accel("kvm") is exp


@pytest.mark.parametrize("name", sorted(builtin_suites()))
def test_every_builtin_suite_is_valid(name: str) -> None:
    """Each built-in suite loads by its name, is named as its file, describes itself, and
    expands (with guests under KVM or TCG alike) to configurations that each get workloads."""
    suite = load_suite(name)
    assert suite.source_path == f"builtin:{name}"
    assert suite.source_text == builtin_suites()[name]
    assert suite.name == name, f"{name}.toml says [suite] name = {suite.name!r}"
    assert (suite.suite.description or "").strip()
    for accel in ("kvm", "tcg"):
        exp = expand(suite).for_accel(accel)
        assert len(exp.configurations) > 0 and len(exp.workloads) > 0, accel
        assert len({c.key for c in exp.configurations}) == len(exp.configurations)
        assert len({w.key for w in exp.workloads}) == len(exp.workloads)
        assert all(exp.workloads_for(c) for c in exp.configurations), accel


def test_there_are_builtin_suites_and_quick_is_one() -> None:
    suites = builtin_suites()
    assert "quick" in suites
    assert all(text.strip() for text in suites.values())


@pytest.mark.parametrize("matrix, reason", [
    ("controller = 'virtio-blk'\nnum_queues = 1025", "QEMU 7.2 aborts (exit 134)"),
    ("controller = 'virtio-scsi-single'\nnum_queues = 1023", "Invalid number of queues (= 1023), must be a positive integer less than 1022."),
    ("controller = 'virtio-blk'\nqueue_size = 100", "invalid queue-size property (100), must be a power of 2 (max 1024)"),
    ("data_path = 'vhost-user-blk'\nqueue_size = 2048", "queue size must not exceed 1024"),
    ("controller = 'sata'\niothread = false\nnum_queues = 4", "Property 'ide-hd.num-queues' not found"),
    ("controller = 'pvscsi'\niothread = false\nqueue_size = 256", "Property 'pvscsi.queue-size' not found"),
])
def test_queue_limits_in_guest_mode(matrix: str, reason: str) -> None:
    with pytest.raises(InvalidCombination) as info:
        expand(load(f"[matrix]\n{matrix}\n[method]\nmode = 'guest'\n"))
    assert reason in str(info.value)


def test_guest_axes_vms_and_vhost_user_blk() -> None:
    exp = expand(load("[matrix]\ncontroller = ['virtio-blk', 'virtio-scsi-single']\n"
                      "data_path = ['emulated', 'vhost-user-blk']\niothread = [true, false]\n"
                      "vms = [1, 4]\n[method]\nmode = 'guest'\n"))
    # emulated: 2 controllers × 2 iothread; vhost-user-blk: the controller does not apply
    assert len(exp.configurations) == (2 * 2 + 2) * 2
    vhost = [c for c in exp.configurations if c.data_path == "vhost-user-blk"]
    assert all(c.controller is None for c in vhost) and {c.iothread for c in vhost} == {True, False}
    assert {c.vms for c in exp.configurations} == {1, 4}
    assert all(c.data_path in (None, "vhost-user-blk") and c.num_queues is None
               for c in exp.configurations)
    exp = expand(load("[method]\nmode = 'guest'\nvms = 3\n"))
    assert [c.vms for c in exp.configurations] == [3]
    exp = expand(load("[matrix]\nvms = [2]\n[method]\nmode = 'blocklayer'\n"))
    assert any("[matrix] vms is ignored in blocklayer mode" in n for n in exp.notes)
