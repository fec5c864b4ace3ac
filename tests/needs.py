"""What a test needs of the machine, and what happens where it is missing.

    from tests.needs import needs

    @needs("fio")
    def test_...
    pytestmark = needs("ceph")                   # a whole module
    lacking("chromium", "no Chromium")           # found missing while the test runs

A test that needs a capability this machine lacks skips, saying why. Where the environment
variable ``IOMATRIX_TEST_REQUIRE`` names the capability (a comma-separated list of
``CAPABILITIES``' names: what this machine is meant to have, e.g. CI's), it fails instead: a
machine that lost its Ceph, or a probe that broke, cannot hide behind a skip. KVM has a switch of
its own (``IOMATRIX_EXPECT_KVM``, ``tests.conftest.for_kvm``). A skip that is no missing
capability (a case PostgreSQL itself refuses, a file system this host's temporary directory is
not on) stays a plain ``pytest.skip``.

Each probe runs once per process, when the first test that needs it starts (not at import: a
module collects quickly everywhere, and libvirtd is started only for the tests that need it)."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from typing import NoReturn

import pytest

REQUIRE = "IOMATRIX_TEST_REQUIRE"
"""The environment variable naming the capabilities this machine must have."""

Probe = Callable[[], "str | None"]
"""Why a capability is missing here, or None where it is present."""


def _programs(*names: str, hint: str) -> Probe:
    def probe() -> str | None:
        gone = [n for n in names if shutil.which(n) is None]
        return f"{', '.join(gone)} not installed ({hint})" if gone else None
    return probe


def _root() -> str | None:
    return None if os.geteuid() == 0 else "needs root"


def _attacker() -> str | None:
    if os.geteuid() != 0 or shutil.which("python3", path="/usr/bin:/bin") is None or not all(
            shutil.which(t) for t in ("useradd", "userdel", "setpriv")):
        return "needs root, useradd, userdel, setpriv and a system python3 (a user of its own)"
    return None


def _ceph() -> str | None:
    from tests import ceph

    return ceph.missing()


def _tgt() -> str | None:
    from tests.tgt import tgt_problem

    return tgt_problem()


def _postgresql() -> str | None:
    from iomatrix.testing.pgserver import binaries

    return None if binaries() is not None else \
        "no PostgreSQL server programs (initdb; ./setup.sh --dev installs postgresql)"


def _libvirt() -> str | None:
    """Why libvirtd cannot be used here (None: it answers), starting it when it is installed
    but not running (no systemd here: ``libvirtd -d``, as setup.sh does)."""
    from iomatrix.drivers import libvirt as lvd

    if shutil.which("virsh") is None or shutil.which("libvirtd") is None:
        return "libvirtd: libvirt is not installed (libvirt-daemon-system; ./setup.sh installs it)"
    if lvd.libvirt_problem(lvd.DEFAULT_URI) is None:
        return None
    if os.geteuid() != 0:
        return "libvirtd: libvirtd is not running and starting it needs root"
    for daemon in ("virtlogd", "libvirtd"):
        subprocess.run([daemon, "-d"], check=False, capture_output=True, timeout=30)
    time.sleep(2)
    problem = lvd.libvirt_problem(lvd.DEFAULT_URI)
    return None if problem is None else f"libvirtd: {problem}"


def _sshd() -> str | None:
    from tests.sshnodes import problem

    return problem()


def _ioping() -> str | None:
    from iomatrix.fio.ioping import find_ioping

    return None if find_ioping() is not None else \
        "ioping 1.0 or later is not installed (setup.sh installs it)"


def _chromium() -> str | None:
    from tests.browser import CHROMIUM, chromium_available

    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (./setup.sh --dev installs it)"
    return None if chromium_available() else f"no {CHROMIUM} (./setup.sh --dev installs chromium)"


CAPABILITIES: dict[str, Probe] = {
    "root": _root,
    "attacker": _attacker,
    "fio": _programs("fio", hint="./setup.sh installs it"),
    "qemu": _programs("qemu-system-x86_64", "qemu-storage-daemon", "qemu-img",
                      hint="QEMU 7.2: qemu-system-x86, qemu-system-common, qemu-utils"),
    "ioping": _ioping,
    "xorriso": _programs("xorriso", hint="./setup.sh installs it"),
    "mmdebstrap": _programs("mmdebstrap", hint="./setup.sh --dev installs it"),
    "libvirt-clients": _programs("virt-xml-validate", "xmllint",
                                 hint="libvirt-clients and libxml2-utils"),
    "perf": _programs("perf", hint="apt-get install linux-perf"),
    "mingw": _programs("x86_64-w64-mingw32-gcc-posix", "x86_64-w64-mingw32-strip",
                       hint="./setup.sh --dev installs gcc-mingw-w64-x86-64-posix"),
    "wine": _programs("wine", hint="./setup.sh --dev installs Debian's wine"),
    "rbd": _programs("rbd", hint="Ceph's rbd command: ceph-common, ./setup.sh installs it"),
    "ceph": _ceph,
    "tgt": _tgt,
    "postgresql": _postgresql,
    "libvirt": _libvirt,
    "sshd": _sshd,
    "chromium": _chromium,
    # found out while a test runs (``lacking``): no probe of their own
    "guest-fio": lambda: None,          # the guests' static fio, built from the host's fio source
    "kernel": lambda: None,             # a kernel to boot, with its modules (the host's or Debian's)
    "loop": lambda: None,               # loop devices
    "fuse": lambda: None,               # qemu-storage-daemon's FUSE exports
    "busybox": lambda: None,            # a static busybox (Debian's, fetched once)
    "mount-namespace": lambda: None,    # a private mount namespace (unshare -m)
}
"""Every capability a test may need, by name, with its probe."""


def required() -> frozenset[str]:
    """The capabilities ``IOMATRIX_TEST_REQUIRE`` names (an unknown name is an error)."""
    names = frozenset(n.strip() for n in os.environ.get(REQUIRE, "").split(",") if n.strip())
    unknown = sorted(names - CAPABILITIES.keys())
    if unknown:
        raise pytest.UsageError(f"{REQUIRE}: unknown capabilities {', '.join(unknown)} "
                                f"(known: {', '.join(sorted(CAPABILITIES))})")
    return names


def needs(*capabilities: str) -> pytest.MarkDecorator:
    """A mark (for a test, a class or ``pytestmark``): the test needs ``capabilities``."""
    unknown = [c for c in capabilities if c not in CAPABILITIES]
    if unknown or not capabilities:
        raise KeyError(f"unknown capabilities {unknown!r}")
    return pytest.mark.needs(*capabilities)


def need(capability: str) -> None:
    """At run time: ``capability`` is here, or the test skips (fails where required)."""
    reason = problem(capability)
    if reason is not None:
        lacking(capability, reason)


@functools.cache
def problem(capability: str) -> str | None:
    """Why ``capability`` is missing here (its probe's answer, once per process), or None."""
    return CAPABILITIES[capability]()


def lacking(capability: str, reason: str) -> NoReturn:
    """``capability`` is missing here, for ``reason``: the test skips, or fails where the
    capability is required."""
    if capability not in CAPABILITIES:
        raise KeyError(f"unknown capability {capability!r}")
    if capability in required():
        pytest.fail(f"{REQUIRE} requires {capability} on this machine, but: {reason}",
                    pytrace=False)
    pytest.skip(reason)


def check(item: pytest.Item) -> None:
    """Before ``item`` runs: every capability its ``needs`` marks name is here, or it skips
    (fails where required)."""
    for mark in item.iter_markers("needs"):
        for capability in mark.args:
            need(capability)
