"""The node's side of cluster load in guest mode (``iomatrix node serve-guests``, started by
the controller's ``iomatrix.drivers.cluster.ClusterGuestDriver`` over SSH): boot one
configuration's guests on the disks the controller made, exactly as a local run boots them (the
guest driver: QEMU's arguments, the checks of what it applied, the guest's view of its disk, the
private network namespace), relay each guest's fio server to a Unix socket in a fresh 0700
directory, say so in one line, and keep them until the session's standard input ends.

Nothing here listens on a network: the guests' forwarded ports are in the session's private
network namespace (loopback only; nobody else can enter it), and the relays' sockets are in a
directory only this user can enter. A node whose guests cannot have a private namespace (not
root, or libvirt's guests, on the host's network) refuses rather than open a port."""

from __future__ import annotations

import contextlib
import os
import queue
import re
import shutil
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from iomatrix.cluster.relay import Relay
from iomatrix.cluster.imagecopy import receive_image
from iomatrix.core.errors import EnvironmentProblem, NodesError, TrialFailed
from iomatrix.core.proc import first_line
from iomatrix.appliance.protocol import console_tail
from iomatrix.drivers.cluster import (GUESTS_CHECKED, GUESTS_READY, GUESTS_TRIAL, GuestCommand,
                                      GuestRequest, GuestsAnswer, GuestsReady)
from iomatrix.drivers.guest import GuestDriver, GuestSession
from iomatrix.drivers.guest.image import ImageGuest
from iomatrix.drivers.guest.kind import GuestKind
from iomatrix.drivers.guest.kinds import DEFAULT_KIND, kind_for, suite_kinds
from iomatrix.drivers.registry import driver_for
from iomatrix.measure.nodeside import request_suite, watch_stdin
from iomatrix.measure.nodepool import lun_regions, pool_images
from iomatrix.measure.prepare import PreparedRun, prepare
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.model import Suite
from iomatrix.suite.workloads import Workload
from iomatrix.targets.workspace import PREFIX, Image, image_spec
from iomatrix.vocab.words import Mode

WATCH_SECONDS = 0.5
"""How often the node looks whether a guest has ended while it serves."""
SENT_IMAGE = "guest-image"
"""The file of the session's directory the user's image is written to, as the controller sends
it (``iomatrix.cluster.imagecopy``)."""
_RUN_DIRECTORY = re.compile(rf"^{re.escape(PREFIX)}[0-9a-f]{{8}}$")


def serve_guests(request: GuestRequest, stdin: int, out: IO[str]) -> None:
    """Boot the guests ``request`` asks for and serve them, answering the controller's commands
    (``GuestCommand``) read from file descriptor ``stdin``, until interrupted (KeyboardInterrupt:
    SIGHUP, raised when ``stdin`` ends, needs a handler that raises it), then stop them and
    remove their directory; raises when they cannot be booted or a guest ends (a line saying
    why)."""
    commands: queue.Queue[GuestCommand] = queue.Queue()

    def command(line: bytes) -> None:
        with contextlib.suppress(ValueError):           # not a command: ignored
            commands.put(GuestCommand.model_validate_json(line))
    directory = Path(request.directory)
    made = False
    try:
        try:
            os.mkdir(directory, 0o700)
            made = True
        except OSError as exc:
            raise NodesError(f"cannot make {directory}: {exc.strerror} (a directory planted "
                             "there is never used)") from None
        if request.image_size is not None:    # the user's image comes first (a short one: refused)
            receive_image(stdin, directory / SENT_IMAGE, request.image_size)
        watch_stdin(stdin, command)
        _serve(request, directory, commands, out)
    finally:
        if made:
            shutil.rmtree(directory, ignore_errors=True)


def _serve(request: GuestRequest, directory: Path, commands: queue.Queue[GuestCommand],
           out: IO[str]) -> None:
    prepared, config = requested(request, Mode.GUEST)
    suite = prepared.suite
    kinds = sent_kinds(suite, config, request, directory)
    images = (pool_images(request.images, config, suite, directory)
              if suite.target.rbd is not None else
              lun_regions(request.images, config, suite, directory)
              if suite.target.iscsi is not None else
              checked_images(request.images, config, suite))
    notes: list[str] = []
    driver = driver_for(Mode.GUEST, suite.method, directory, accel=request.accel, note=notes.append)
    shared = getattr(driver, "shared_reason", None)
    if shared is not None:
        raise NodesError(f"the guests cannot have a private network namespace here ({shared}): "
                         "cluster load never opens their fio servers on the node's network; "
                         "run iomatrix as root on the node")
    if len(kinds) > 1:
        assert isinstance(driver, GuestDriver)
        driver.use_kinds(kinds, notes.append, [config])
    with driver.session(config, images) as session, contextlib.ExitStack() as relays:
        assert isinstance(session, GuestSession)
        sockets = []
        for guest in session.guests:
            # started from this thread, which is in the guests' private namespace
            relay = Relay(directory / f"vm{guest.index}.sock", guest.port).start()
            relays.callback(relay.close)
            sockets.append(str(relay.path))
        ready = GuestsReady(sockets=tuple(sockets), applied=session.applied(),
                            wrong=tuple(session.mismatches()), command=session.command(),
                            notes=tuple(notes))
        out.write(f"{GUESTS_READY} {ready.model_dump_json()}\n")
        out.flush()
        workloads = {w.key: w for w in prepared.full.workloads}
        while True:
            try:
                told: GuestCommand | None = commands.get(timeout=WATCH_SECONDS)
            except queue.Empty:
                told = None
            for guest, proc in zip(session.guests, session.procs):
                if proc.poll() is not None:
                    raise TrialFailed(f"guest vm{guest.index} exited (status {proc.returncode});"
                                      f" console: {console_tail(guest.console, 4)}")
            if told is not None:
                out.write(_answer(session, told, workloads))
                out.flush()


def sent_kinds(suite: Suite, config: Configuration, request: GuestRequest,
               directory: Path) -> list[GuestKind]:
    """The kinds of guest the node boots ``config`` with: the appliance, and where the
    configuration boots the user's image, that kind on the copy the controller sent
    (``SENT_IMAGE`` in ``directory``), opened and inspected as a local run opens the user's image
    (raw or qcow2, with no backing or data file). The suite's [guest] image path is the
    controller's, never opened here. NodesError when the configuration's kind cannot boot
    here, or the image was not sent or sent for the appliance."""
    kind = kind_for(suite_kinds(suite), config)
    if kind.cluster_refusal is not None:
        raise NodesError(f"cluster load: {kind.cluster_refusal}")
    if not isinstance(kind, ImageGuest):
        if request.image_size is not None:
            raise NodesError("a guest image was sent for a configuration that boots the "
                             "appliance")
        return [DEFAULT_KIND()]
    if request.image_size is None:
        raise NodesError(f"the configuration boots [guest] {kind.label}, whose image was not "
                         "sent")
    copy = ImageGuest(kind.own.model_copy(update={"image": directory / SENT_IMAGE,
                                                   "name": kind.label}))
    try:
        copy.open()
    except EnvironmentProblem as exc:
        raise NodesError(f"the guest image sent: {first_line(str(exc))}") from None
    return [DEFAULT_KIND(), copy]


def requested(request: GuestRequest, *modes: Mode) -> tuple[PreparedRun, Configuration]:
    """The run as the node prepares the request's suite (as the controller's user wrote it:
    ``request_suite``), and the configuration, of one of ``modes``, it asks for; NodesError
    when the suite has none such."""
    prepared = prepare(request_suite(request), accel=request.accel)
    config = next((c for c in prepared.full.configurations if c.key == request.config), None)
    if config is None or config.mode not in modes:
        raise NodesError(f"the suite has no {' or '.join(modes)} configuration "
                         f"{request.config!r} here")
    return prepared, config


def _answer(session: GuestSession, told: GuestCommand, workloads: Mapping[str, Workload]) -> str:
    """What the node does for the controller's command (the QMP readings of a local run's
    trial, in this, the main thread) and its answer line."""
    if told.kind == "trial":
        session.new_trial()
        return f"{GUESTS_TRIAL} {GuestsAnswer(n=told.n).model_dump_json()}\n"
    workload = workloads.get(told.workload)
    if workload is None:
        session.close()
        answer = GuestsAnswer(n=told.n, io_check=f"not checked: no workload {told.workload!r} "
                                                 "here")
    else:
        foreign = session.check_io(told.counted, workload)
        applied = session.applied()
        answer = GuestsAnswer(
            n=told.n, io_check=applied.get("io_check", ""), foreign=tuple(foreign),
            blockstats={k.removeprefix("blockstats."): int(v) for k, v in applied.items()
                        if k.startswith("blockstats.")})
    return f"{GUESTS_CHECKED} {answer.model_dump_json()}\n"


def checked_images(images: Sequence[Image], config: Configuration, suite: Suite) -> list[Image]:
    """The controller's disks for this node's guests, once each is what the controller's run
    makes: a regular file of this user's (not a symlink) in a run directory of one of the
    suite's target directories, of the configuration's format, or the suite's block device;
    NodesError naming the first that is not."""
    if len(images) != (config.vms or 1):
        raise NodesError(f"{len(images)} disks for {config.vms or 1} guests")
    want = image_spec(config)
    targets = [suite.target, *suite.named_targets]
    directories = {os.path.realpath(t.directory) for t in targets if t.directory is not None}
    devices = {os.path.realpath(t.device) for t in targets if t.device is not None}
    for image in images:
        path = str(image.path)
        try:
            found = os.lstat(path)
        except OSError as exc:
            raise NodesError(f"disk {path}: {exc.strerror} here (is the target shared storage, "
                             "at the same path on every node?)") from None
        if image.network is not None:
            raise NodesError(f"disk {path}: network storage is not built for cluster load")
        if image.is_device:
            if os.path.realpath(path) not in devices or not stat.S_ISBLK(
                    os.stat(path).st_mode):
                raise NodesError(f"disk {path}: not the suite's block device")
            continue
        parent = Path(path).parent
        if (not stat.S_ISREG(found.st_mode) or found.st_uid != os.geteuid()
                or not _RUN_DIRECTORY.match(parent.name)
                or os.path.realpath(parent.parent) not in directories
                or os.path.realpath(path) != path
                or (image.format, image.preallocation) != want):
            raise NodesError(f"disk {path}: not an image of this user's, of format "
                             f"{want[0]}, in a run directory of the suite's target")
    return list(images)
