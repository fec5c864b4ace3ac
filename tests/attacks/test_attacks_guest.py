"""Issue 31, guest images (F5, F6) and the guest's console: an unprivileged user who writes a
suite's [guest] table, or whose guest prints on its console, gets nothing from root's run.

F5: the suite's [guest] image, kernel and initrd pass rule 1 (nobody but root could have
chosen them) and must be readable by the suite's author already: ``image = "/etc/shadow"`` in
another user's suite is refused in one line, exit 3, before anything starts. F6: a qcow2 with
an external data file is refused; a backing file named in an image's header is never opened
(``"backing": null``), and QEMU reads the image through the descriptor iomatrix opened, so a
path swapped after the checks changes nothing. The console: a failure reason carries at most
five of the guest's lines, escaped."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from iomatrix.appliance.ownimage import (IMAGE_FDSET, BaseImage, ImageFile, make_overlay,
                                         open_guest_image, system_argv, system_blockdevs)
from iomatrix.appliance.protocol import CONSOLE_LINES, ERROR_MARKER
from iomatrix.cli.status import ExitStatus
from iomatrix.core.errors import EnvironmentProblem, TrialFailed
from iomatrix.core.proc import managed, read_text, wait_for
from iomatrix.core.trust import US, Author
from iomatrix.qemu.qmp import qmp_execute
from iomatrix.store import Store
from iomatrix.store.records import StoredSuite
from iomatrix.suite.expand import expand
from iomatrix.suite.load import load_suite
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.method import Method, OwnGuest
from tests.conftest import ATTACKS, Attack, User, cli_result, our_processes, write_suite
from tests.attacks.test_untrusted_inputs import one_line

pytestmark = ATTACKS

GUEST_RUN = ('[matrix]\ncontroller = "virtio-blk"\n[workloads]\nrw = "randread"\nbs = "4k"\n'
             'iodepth = 1\n[method]\nmode = "guest"\nruntime = "1s"\nramp = "0s"\n'
             'accel = "tcg"\nbaseline = false\n')


def _dir(owner: User | None) -> Path:
    """A directory under /tmp that every user may search, owned by ``owner`` (None: root)."""
    path = Path(tempfile.mkdtemp(prefix="iomx-guest-", dir="/tmp"))
    path.chmod(0o755)
    if owner is not None:
        os.chown(path, owner.uid, owner.gid)
    return path


@pytest.fixture
def roots() -> Iterator[Path]:
    """Root's directory of files: a 1 MiB raw image and a "kernel" and "initrd" (0644), and
    root-only (0600) copies of each."""
    path = _dir(None)
    for name in ("disk.raw", "vmlinuz", "initrd"):
        (path / name).write_bytes(name.encode() + b"\0" * (1 << 20))
        (path / name).chmod(0o644)
        shutil.copy(path / name, path / f"secret-{name}")
        (path / f"secret-{name}").chmod(0o600)
    yield path
    shutil.rmtree(path)


@pytest.fixture
def theirs(attacker: User) -> Iterator[Path]:
    """The attacker's directory, with a kernel and initrd of theirs."""
    path = _dir(attacker)
    for name in ("vmlinuz", "initrd", "disk.raw"):
        (path / name).write_bytes(b"\0" * (1 << 20))
        os.chown(path / name, attacker.uid, attacker.gid)
    yield path
    shutil.rmtree(path)


def _their_suite(theirs: Path, tmp_path: Path, attacker: User, guest: dict[str, Path]) -> Path:
    """The attacker's suite (their file in their directory) with ``guest`` as its [guest]."""
    table = "[guest]\n" + "".join(f'{key} = "{value}"\n' for key, value in guest.items())
    suite = write_suite(theirs, GUEST_RUN + table, size="16MiB", target=tmp_path / "target")
    os.chown(suite, attacker.uid, attacker.gid)
    return suite


def _refused_before_anything(done: subprocess.CompletedProcess[str], status: ExitStatus,
                             tmp_path: Path, db: Path) -> str:
    """The one line of a refusal, after which no run is stored, no target made, no QEMU."""
    line = one_line(done, status)
    if db.exists():
        with Store(db) as store:
            assert store.list_runs() == []
    assert not (tmp_path / "target").exists()
    assert not [p for p in our_processes(str(tmp_path)) if "qemu" in p]
    return line


def _unreadable(key: str, path: Path, attacker: User, suite: Path) -> str:
    return (f"iomatrix: [guest] {key}: {path} is not readable by {attacker.name} (uid "
            f"{attacker.uid}), who wrote suite {suite}: the guest would show them its contents")


@pytest.mark.parametrize(("case", "key"), [
    ("/etc/shadow as the image, with their own kernel and initrd", "image"),
    ("a root-only copy of a disk image", "image"),
    ("a root-only kernel", "kernel"),
    ("a root-only initrd", "initrd"),
])
def test_f5_a_file_the_suites_author_cannot_read_is_refused_before_anything_starts(
        roots: Path, theirs: Path, tmp_path: Path, attacker: User, attack: Attack,
        case: str, key: str) -> None:
    attack(f"F5 [guest] {case} in another user's suite", "refused")
    guest = {"image": roots / "disk.raw", "kernel": roots / "vmlinuz", "initrd": roots / "initrd"}
    if case.startswith("/etc/shadow"):
        guest = {"image": Path("/etc/shadow"), "kernel": theirs / "vmlinuz",
                 "initrd": theirs / "initrd"}
    else:
        guest[key] = roots / f"secret-{guest[key].name}"
    suite = _their_suite(theirs, tmp_path, attacker, guest)
    db = tmp_path / "r.db"
    done = cli_result("run", str(suite), "--db", str(db))
    line = _refused_before_anything(done, ExitStatus.SUITE_INVALID, tmp_path, db)
    assert line == _unreadable(key, guest[key], attacker, suite)
    plan = cli_result("run", str(suite), "--plan")         # says why, reads nothing
    assert plan.returncode == 0 and f"warning: [guest] {key}: {guest[key]} is not readable" \
        in plan.stdout, plan.stdout


@pytest.mark.parametrize("key", ["image", "kernel", "initrd"])
def test_f5_a_file_another_user_could_choose_is_refused_by_rule_1(
        roots: Path, theirs: Path, tmp_path: Path, attacker: User, attack: Attack,
        key: str) -> None:
    """The user's own (readable) file is still theirs: what QEMU would read there is theirs
    to change after any check."""
    attack(f"F5 [guest] {key} a file of the suite's author", "refused")
    guest = {"image": roots / "disk.raw", "kernel": roots / "vmlinuz", "initrd": roots / "initrd"}
    guest[key] = theirs / guest[key].name
    suite = _their_suite(theirs, tmp_path, attacker, guest)
    db = tmp_path / "r.db"
    line = _refused_before_anything(cli_result("run", str(suite), "--db", str(db)),
                                    ExitStatus.SUITE_INVALID, tmp_path, db)
    assert line.startswith(f"iomatrix: [guest] {key}: {theirs}") and line.endswith(
        f"is owned by {attacker.name} (uid {attacker.uid}), not root: another user could "
        "choose what QEMU reads there"), line


@pytest.mark.slow
def test_f5_a_run_resumed_from_a_shared_store_is_anyones(roots: Path, tmp_path: Path,
                                                        pg_url: str, attack: Attack) -> None:
    """An unfinished run in the shared PostgreSQL store (which anyone with its role writes)
    whose suite names /etc/shadow as its [guest] image: ``run --resume`` judges that suite as
    anyone's, and refuses it before anything starts. (An SQLite file another user could have
    written is not opened at all.)"""
    from iomatrix.store.location import PgUrl

    attack("F5 [guest] image = /etc/shadow in a run resumed from the shared store", "refused")
    source = tmp_path / "t.toml"
    source.write_text(f'[suite]\nname = "t"\n[target]\ndirectory = "{tmp_path / "target"}"\n'
                      f'size = "16MiB"\n' + GUEST_RUN + '[guest]\nimage = "/etc/shadow"\n'
                      f'kernel = "{roots / "vmlinuz"}"\n')
    suite = load_suite(source)
    assert suite.author == Author(None, f"suite {source}")      # root's own file
    with Store(pg_url) as store:
        expansion = expand(suite)
        run_id = store.create_run(suite=StoredSuite.of(suite), host={"hostname": "h"},
                                  accelerator="tcg", notes=[], seed=1,
                                  configs=expansion.configurations,
                                  workloads=expansion.workloads)
        store.finish_run(run_id, "interrupted")
    done = cli_result("run", "--resume", str(run_id), "--db", pg_url)
    line = _refused_before_anything(done, ExitStatus.SUITE_INVALID, tmp_path, Path("/none"))
    assert line == ("iomatrix: [guest] image: /etc/shadow is not readable by every user, who "
                    f"wrote the shared store {PgUrl(pg_url).shown}: the guest would show them "
                    "its contents")


def _qcow2(path: Path, *options: str) -> Path:
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", *options, str(path), "1M"],
                   check=True, timeout=60)
    path.chmod(0o644)
    return path


def test_f6_a_qcow2_with_an_external_data_file_is_refused(
        roots: Path, theirs: Path, tmp_path: Path, attacker: User, attack: Attack) -> None:
    """Root's own world-readable qcow2 whose data lives in a root-only file: the guest would
    read that file as its disk. Refused in one line, for the attacker's suite and for root's."""
    attack("F6 qcow2 data_file naming a root-only file", "refused")
    data = roots / "secret-data"
    data.write_bytes(b"root only")
    data.chmod(0o600)
    image = _qcow2(roots / "data-file.qcow2", "-o", f"data_file={data}")
    suite = _their_suite(theirs, tmp_path, attacker, {"image": image})
    db = tmp_path / "r.db"
    line = _refused_before_anything(cli_result("run", str(suite), "--db", str(db)),
                                    ExitStatus.ENVIRONMENT, tmp_path, db)
    assert line == (f"iomatrix: [guest] image {image}: its data is in an external data file "
                    f"({str(data)!r}), which QEMU would open as named; give a standalone image")
    with pytest.raises(EnvironmentProblem, match="external data file"):
        open_guest_image(OwnGuest(image=image), US)


def _start(tmp_path: Path, base: BaseImage, fd: int, *, backing_null: bool = True):  # type: ignore[no-untyped-def]
    """QEMU (stopped, -S) with the user's guest's system disk as iomatrix builds it, reading
    the image through ``fd``; (process, QMP socket, log)."""
    overlay = tmp_path / "overlay.qcow2"
    make_overlay(base, overlay)
    system = system_argv(base, overlay, None, bootloader=True, fd=fd)
    if not backing_null:
        system = [a.replace(',"backing":null', "") for a in system]
    qmp = tmp_path / "qmp.sock"
    argv = ["qemu-system-x86_64", "-nodefaults", "-no-user-config", "-display", "none",
            "-machine", "pc", "-accel", "tcg", "-S", "-qmp", f"unix:{qmp},server=on,wait=off",
            *system]
    return managed(argv, log=tmp_path / "qemu.log", pass_fds=(fd,)), qmp


def _running(proc, qmp: Path, log: Path) -> None:  # type: ignore[no-untyped-def]
    assert wait_for(lambda: proc.poll() is not None or qmp.exists(), timeout=30), read_text(log)
    assert proc.poll() is None, read_text(log)


def test_f6_a_backing_file_in_the_images_header_is_never_opened(
        roots: Path, tmp_path: Path, no_leftovers: None, attack: Attack) -> None:
    """A qcow2 naming a backing file (here one that does not exist) is refused by the checks;
    and were the header to name one after them, QEMU, given the nodes iomatrix builds, starts
    without opening it (``"backing": null``), where without that it fails to open it."""
    attack("F6 backing file named in the image's header", "refused")
    missing = roots / "nowhere" / "backing.qcow2"
    image = _qcow2(roots / "backed.qcow2", "-u", "-F", "qcow2", "-b", str(missing))
    with pytest.raises(EnvironmentProblem, match="it has a backing file"):
        ImageFile(image)
    base = BaseImage(path=image, format="qcow2", virtual_size=1 << 20)
    nodes = {n["node-name"]: n for n in system_blockdevs(base, tmp_path / "o.qcow2")}
    assert nodes["guestos-base"]["backing"] is None
    assert nodes["guestos-root"]["backing"] == "guestos-base"     # iomatrix's own overlay
    fd = os.open(image, os.O_RDONLY | os.O_CLOEXEC)
    try:
        started, qmp = _start(tmp_path, base, fd)
        with started as proc:
            _running(proc, qmp, tmp_path / "qemu.log")
            found, = qmp_execute(qmp, [("query-named-block-nodes", None)])
        node = next(n for n in found if n["node-name"] == "guestos-base")
        assert node["backing_file_depth"] == 0 and "backing-image" not in node["image"]
        (tmp_path / "qmp.sock").unlink(missing_ok=True)
        started, qmp = _start(tmp_path, base, fd, backing_null=False)   # the check's worth
        with started as proc:
            proc.wait(timeout=30)
        assert proc.returncode != 0
        assert f"Could not open '{missing}'" in read_text(tmp_path / "qemu.log")
    finally:
        os.close(fd)


def test_the_image_swapped_after_the_checks_is_not_what_qemu_reads(
        roots: Path, tmp_path: Path, no_leftovers: None, attack: Attack) -> None:
    """The image is opened once: renaming another file over its path once the checks passed
    (as whoever could write there might) leaves QEMU reading the file that was checked."""
    attack("F6 the image swapped for another file after the checks", "harmless")
    path = roots / "swap.raw"
    path.write_bytes(b"CHECKED-IMAGE\n".ljust(1 << 20, b"\0"))
    path.chmod(0o644)
    with open_guest_image(OwnGuest(image=path), US) as image:
        other = roots / "other.raw"
        other.write_bytes(b"SWAPPED-IMAGE\n".ljust(3 << 20, b"\0"))
        other.chmod(0o644)
        os.replace(other, path)
        fd = image.descriptor()
        try:
            started, qmp = _start(tmp_path, image.base, fd)
            with started as proc:
                _running(proc, qmp, tmp_path / "qemu.log")
                _, nodes = qmp_execute(qmp, [      # qemu-io prints on QEMU's stdout: its log
                    ("human-monitor-command",
                     {"command-line": 'qemu-io guestos-root "read -v 0 16"'}),
                    ("query-named-block-nodes", None)])
        finally:
            os.close(fd)
    read = read_text(tmp_path / "qemu.log")
    assert "CHECKED.IMAGE" in read and "SWAPPED" not in read, read
    base = next(n for n in nodes if n["node-name"] == "guestos-base-file")
    assert base["file"] == f"/dev/fdset/{IMAGE_FDSET}" and base["image"]["virtual-size"] == 1 << 20


HOSTILE = ["\x1b[2J\x1b[H", "\x1b]52;c;cm0gLXJmIC8K\x07", "\u202egnp.exe", "\x9b31m", "x" * 5000]


@pytest.mark.parametrize("error_line", [False, True])
def test_a_failure_reason_keeps_a_few_escaped_lines_of_the_console(
        tmp_path: Path, attack: Attack, error_line: bool) -> None:
    """A guest that never becomes ready after printing 100 lines of screen clears, OSC 52
    (the clipboard), C1 CSI, U+202E and a 5000-character line (and, with ``error_line``, its
    error marker on such a line): the reason the trial fails with keeps at most five lines of
    it, each cut short, every such character escaped."""
    from iomatrix.drivers.guest import Guest, GuestDriver

    attack("4. guest console with ESC, OSC 52, C1, U+202E and 100 lines in a failure reason",
           "harmless")
    console = tmp_path / "boot1-vm0-console.log"
    lines = [f"line {i} {HOSTILE[i % len(HOSTILE)]}" for i in range(100)]
    if error_line:
        lines.insert(50, f"{ERROR_MARKER} \x1b]0;root-owned\x07 {HOSTILE[2]} {'y' * 3000}")
    console.write_text("\r\n".join(lines) + "\r\n")
    driver = GuestDriver(Method(mode="guest", boot_timeout=1.0), tmp_path,
                         appliance=None, accel="tcg")  # type: ignore[arg-type]
    proc = subprocess.Popen(["qemu-system-x86_64", "-nodefaults", "-display", "none",
                             "-machine", "none", "-no-such-option"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    proc.wait(timeout=30)
    guest = Guest(index=0, port=1, qmp_socket=tmp_path / "q", console=console, argv=(),
                  pid=proc.pid)
    config = Configuration(mode="guest", controller="virtio-blk")
    with pytest.raises(TrialFailed) as failed:
        driver._wait_ready(config, [guest], [proc])
    reason = str(failed.value)
    assert not any(c in reason for c in "\x1b\x07\x9b\u202e\r\n"), reason
    assert "\\x1b" in reason and "\\u202e" in reason
    shown = reason.split("; console: ", 1)[1].split(" | ")
    assert len(shown) <= CONSOLE_LINES and shown[-1].startswith("line 99 ")
    assert len(reason) < 2000, len(reason)
    said = reason.split("; console: ")[0]
    assert ("did not boot: \\x1b]0;root-owned\\x07 \\u202egnp" in said) == error_line, said


def test_f6_an_image_sent_to_a_node_is_checked_there_and_written_only_where_it_chose(
        roots: Path, tmp_path: Path, attack: Attack) -> None:
    """Cluster load of the user's own image: what a node is sent after the guest request is
    untrusted input. A qcow2 naming a backing file (a root-only file of the node's) is refused
    there before any guest boots, by the checks a local run makes of the user's image (the
    external data file of F6 too); a stream naming bytes beyond the size announced, or cut
    short, is refused. The suite's [guest] image path (the controller's) is never opened on
    the node, and the session's directory, with the copy, is gone after a refusal."""
    from iomatrix.cluster.imagecopy import HEADER, receive_image, send_image
    from iomatrix.core.errors import NodesError
    from iomatrix.measure.prepare import prepare
    from tests.scenarios.test_cluster_guests import serve

    attack("F6 an image sent to a node under cluster load", "refused")
    secret = roots / "secret-node-file"
    secret.write_bytes(b"root only")
    secret.chmod(0o600)
    body = (GUEST_RUN.replace("[matrix]\n", '[matrix]\nguest = ["appliance", "mine"]\n')
            + 'concurrent_nodes = true\n[guest]\nname = "mine"\n'
            'image = "/nonexistent/controllers-image.qcow2"\n')
    suite = write_suite(tmp_path, body)
    keys = {c.guest: c.key for c in prepare(load_suite(suite)).full.configurations}
    disk = tmp_path / "disk.raw"
    disk.write_bytes(b"")

    def request(guest: str, size: int | None) -> dict[str, object]:
        return {"suite_text": suite.read_text(), "suite_source": str(suite),
                "config": keys[guest], "accel": "tcg", "image_size": size,
                "directory": f"/tmp/iomatrix-guests-{os.urandom(8).hex()}",
                "images": [{"path": str(disk), "format": "raw", "preallocation": "off",
                            "size": 1 << 20}]}

    def stream(image: Path) -> tuple[int, bytes]:
        out = io.BytesIO()
        with open(image, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            send_image(f.fileno(), size, out)
        return size, out.getvalue()

    image = _qcow2(roots / "b.qcow2", "-F", "raw", "-b", str(secret))
    size, data = stream(image)
    asked = request("mine", size)
    done = serve(asked, data)
    err = done.stderr
    assert done.returncode != 0 and "the guest image sent: " in err, err
    assert "has a backing file" in err and len(err.strip().splitlines()) == 1, err
    assert not Path(str(asked["directory"])).exists()
    small = tmp_path / "small.raw"               # 8 KiB of data, the rest a hole: not sent
    small.write_bytes(b"\1" * 8192)
    os.truncate(small, 1 << 20)
    size, data = stream(small)
    assert len(data) < 3 * 8192
    for cut, says in [(HEADER.pack(size, 4096) + b"x" * 4096, "beyond its"),
                      (data[:-HEADER.size - 10], "cut short")]:
        read, write = os.pipe()
        os.write(write, cut)                     # small enough for the pipe's buffer
        os.close(write)
        try:
            with pytest.raises(NodesError, match=says):
                receive_image(read, tmp_path / f"copy-{len(cut)}", size)
        finally:
            os.close(read)
    assert "controllers-image" not in err
