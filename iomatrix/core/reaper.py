"""The last resort for a daemon iomatrix started, once iomatrix itself is gone: run as a script
(``python -I reaper.py PARENT PID GRACE [MOUNTPOINT]``) by :func:`iomatrix.core.proc.reaper`,
standard library only (``-I``: nothing of iomatrix is imported, whatever PYTHONPATH says).

Killed outright (kill -9), iomatrix cannot stop what it started; the kernel sends each such
process its parent-death signal (SIGTERM, ``proc.orphan_guard``). That is not enough for a
qemu-storage-daemon exporting over FUSE while fio's I/O is in flight on the export: fio's job
waits in the kernel for requests only the daemon answers, and the daemon, once it stopped
serving them for its shutdown, can wait on them in turn (CI saw both outlive a kill -9, the
daemon polling, fio in ``read_events``). So this process watches the daemon: told of
iomatrix's death (its own parent-death signal, SIGURG, whose default action is to be ignored,
so one that comes before Python has set up anything is not fatal and is caught by the parent
check instead), it gives the daemon ``GRACE`` seconds to end on its SIGTERM, then SIGKILLs it
(the kernel then aborts the FUSE connection: fio's requests fail and fio ends), and lazily
unmounts ``MOUNTPOINT`` if the export is still mounted there. SIGTERM (iomatrix stopping it
when the daemon's session ends normally) ends it doing nothing.

fio needs the same (``python -I reaper.py --groups GRACE``, one per iomatrix process, started
by :func:`iomatrix.core.proc.reaped`): fio's parent-death SIGTERM reaches fio's main process
only, which then stops its job processes; a job deadlocked (CI saw one in a futex wait after
fio's main process had died) outlives both fio and iomatrix, in a session of its own (each fio
job calls setsid), its parent gone. What still tells it is its command line, fio's own (a job is
a fork), with an argument only that fio has (its ``--output=`` file in the run's private
directory). So iomatrix tells this process each fio as it starts (``+PGID HEX``: fio's process
group and that argument, hex-encoded, on its standard input) and again once it is stopped
(``-PGID``); when the input ends (iomatrix gone, its end of the pipe closed with it, however it
died), the processes left of each fio still listed (its group, and this user's processes with
that argument) get ``GRACE`` seconds to end, then SIGKILL."""

from __future__ import annotations

import ctypes
import os
import re
import select
import signal
import sys
import time

ORPHANED = signal.SIGURG
"""The parent-death signal this script is started with (``proc.reaper``)."""
_MNT_DETACH = 2


def main(argv: list[str]) -> int:
    if argv[1] == "--groups":
        return groups(float(argv[2]))
    parent, pid, grace = int(argv[1]), int(argv[2]), float(argv[3])
    mountpoint = argv[4] if len(argv) > 4 else None
    signal.pthread_sigmask(signal.SIG_BLOCK, {ORPHANED, signal.SIGTERM})
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:         # the daemon is gone already
        pidfd = None
    if os.getppid() == parent:           # else iomatrix died before the mask was set
        if signal.sigwait({ORPHANED, signal.SIGTERM}) == signal.SIGTERM:
            return 0
    if pidfd is not None and not ended(pidfd, grace):
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        ended(pidfd, 10.0)
    if mountpoint is not None and fuse_mounted(mountpoint):
        ctypes.CDLL(None, use_errno=True).umount2(os.fsencode(mountpoint), _MNT_DETACH)
    return 0


def groups(grace: float) -> int:
    """Follow the processes iomatrix lists on standard input until it ends; then give those
    still listed ``grace`` seconds, and SIGKILL what is left of them."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)      # a terminal's Ctrl-C is iomatrix's
    watched: dict[int, bytes] = {}
    for line in sys.stdin.buffer:
        sign, (number, _, argument) = line[:1], line[1:].strip().partition(b" ")
        if sign in (b"+", b"-") and number.isdigit():
            if sign == b"+":
                watched[int(number)] = bytes.fromhex(argument.decode("ascii", "replace") or "")
            else:
                watched.pop(int(number), None)
    deadline = time.monotonic() + grace
    while left(watched) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in left(watched):
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:                     # gone meanwhile
            continue
        try:
            if pid in left(watched):        # still that process (its pidfd holds it)
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        finally:
            os.close(pidfd)
    return 0


def left(watched: dict[int, bytes]) -> list[int]:
    """The live (not zombie) processes of this user in a process group of ``watched`` or with
    its argument on their command line (``/proc``)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != os.getuid():
                continue
            with open(f"/proc/{entry}/stat", "rb") as stat:
                text = stat.read()
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                argv = cmdline.read().split(b"\0")
        except OSError:
            continue
        fields = text[text.rindex(b")") + 2:].split()        # state, ppid, pgrp, ...
        if len(fields) > 2 and fields[0] != b"Z" and (
                int(fields[2]) in watched
                or any(a in argv for a in watched.values() if a)):
            found.append(int(entry))
    return found


def ended(pidfd: int, timeout: float) -> bool:
    """Whether the process of ``pidfd`` ends within ``timeout`` seconds (a pidfd polls
    readable once its process has exited)."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(timeout * 1000))


def fuse_mounted(path: str) -> bool:
    """Whether a FUSE filesystem is mounted at exactly ``path`` (``/proc/self/mountinfo``)."""
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as info:
        for line in info:
            left, _, right = line.partition(" - ")
            fields = left.split()
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
            if point == path and right.startswith("fuse"):
                return True
    return False


if __name__ == "__main__":
    sys.exit(main(sys.argv))
