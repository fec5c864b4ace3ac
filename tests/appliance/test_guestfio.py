"""The guests' fio: a static build of the host's fio version from its Debian source with the
server patch, cached in the user's appliance cache (the build, 30-60 s, happens once per
machine and serves every guest test after it); the fallback to the host's fio when its source
cannot be had. Needs no guest: the patched server is run on this host."""

from __future__ import annotations

import hashlib
import json
import os
import re
import statistics
import subprocess
import time
from pathlib import Path

import pytest

from iomatrix.appliance import guestfio
from iomatrix.appliance.build import build_appliance
from iomatrix.appliance.elf import elf_interpreter
from iomatrix.appliance.guestfio import (BUILD_PACKAGES, REQUIRED_ENGINES, UNPATCHED, GuestFio,
                                         GuestFioUnavailable, guest_fio, guest_fio_status)
from iomatrix.appliance.kernel import default_cache_dir, find_kernel
from iomatrix.appliance.libraries import hollowable, library_closure
from iomatrix.core.errors import EnvironmentProblem, FioSourceUnavailable
from iomatrix.core.proc import managed, require, run, wait_for
from iomatrix.drivers.guest import free_port
from tests.conftest import our_processes
from tests.needs import lacking


@pytest.fixture(scope="module")
def built() -> GuestFio:
    """The guests' fio of the user's cache, built now if it is not there yet. Where this host's
    archive serves no source for its fio (an archive's fact, not the build's), the build cannot
    be tested; the fallback is tested below."""
    try:
        return guest_fio(default_cache_dir())
    except FioSourceUnavailable as e:
        lacking("guest-fio", f"the guests' fio cannot be built here: {e}")


def test_guest_fio_is_static_the_hosts_version_and_has_the_engines(built: GuestFio) -> None:
    data = built.path.read_bytes()
    assert elf_interpreter(data) is None                       # static: no loader, no libraries
    host = run([require("fio"), "--version"], timeout=30).stdout.strip()
    assert run([str(built.path), "--version"], timeout=30).stdout.strip() == host == built.version
    engines = run([str(built.path), "--enghelp"], timeout=30).stdout.split()
    assert set(REQUIRED_ENGINES) <= set(engines)
    # the Debian source of the installed package, and the patch as shipped
    package = run(["dpkg-query", "-W", "-f", "${source:Package} ${source:Version}", "fio"],
                  timeout=30).stdout
    assert built.source == package
    manifest = json.loads((built.path.parent / "manifest.json").read_text())
    patch = hashlib.sha256(guestfio.patch_text().encode()).hexdigest()
    assert manifest["patch_sha256"] == built.patch_sha256 == patch
    assert manifest["bytes"] == len(data)
    # cached: found again without building, far cheaper than the build
    start = time.monotonic()
    again = guest_fio(default_cache_dir())
    assert again.cached and again.path == built.path
    assert time.monotonic() - start < built.build_seconds / 10


def _client_seconds(server: str, job: Path, rounds: int = 2) -> float:
    """Median wall time of the host's fio client running ``job`` through ``server --server``
    on a free port of this host's loopback (the first round also waits for it to listen)."""
    port = free_port()
    client = [require("fio"), f"--client=ip:127.0.0.1,{port}", str(job), "--output-format=json"]
    with managed([server, f"--server=ip:127.0.0.1,{port}"],
                 log=job.with_suffix(f".{Path(server).name}.log")):
        assert wait_for(lambda: subprocess.run(client, capture_output=True).returncode == 0,
                        timeout=30, interval=0.1)
        seconds = []
        for _ in range(rounds):
            start = time.monotonic()
            out = run(client, timeout=60).stdout
            seconds.append(time.monotonic() - start)
            assert json.loads(out[out.index("{"):])["client_stats"][0]["jobname"] == "j"
        return statistics.median(seconds)


@pytest.mark.slow
def test_patched_server_reads_run_at_once(built: GuestFio, tmp_path: Path) -> None:
    """The same short job through the host's unpatched fio --server waits for the idle server's
    1000 ms queue wait; through the patched one it does not (see the patch)."""
    job = tmp_path / "j.fio"
    job.write_text(f"[j]\nfilename={tmp_path / 'data'}\nsize=1m\nrw=read\nbs=4k\n"
                   "ioengine=psync\ntime_based=1\nruntime=200ms\n")
    patched = _client_seconds(str(built.path), job)
    unpatched = _client_seconds(require("fio"), job)
    assert unpatched - patched > 0.5, (patched, unpatched)
    assert our_processes(str(tmp_path)) == []


def _only(tmp_path: Path, *tools: str) -> dict[str, str]:
    """An environment whose PATH has only ``tools`` (links to the real ones)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in tools:
        (bin_dir / tool).symlink_to(require(tool))
    return {**os.environ, "PATH": str(bin_dir)}


def test_without_a_compiler_it_says_what_to_install(tmp_path: Path) -> None:
    env = _only(tmp_path, "fio", "dpkg-query")
    status = guest_fio_status(tmp_path / "cache", env)
    assert not status.ok and not status.cached
    assert status.detail.startswith(f"{UNPATCHED}: cannot build it: gcc, make")
    assert status.hint and BUILD_PACKAGES in status.hint
    with pytest.raises(GuestFioUnavailable, match="cannot build it: gcc"):
        guest_fio(tmp_path / "cache", env=env)
    assert not (tmp_path / "cache").exists()       # nothing downloaded, nothing remembered


@pytest.mark.slow
def test_a_missing_source_falls_back_to_the_hosts_fio(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The installed fio's source version is taken as one the archive never had: apt-get source
    really fails, the failure is remembered, and the appliance carries the host's fio with its
    libraries, saying why in its manifest and on every run."""
    try:
        kernel = find_kernel(require_modules=True)
    except EnvironmentProblem as e:
        lacking("kernel", f"no kernel with modules: {e}")
    real_plan = guestfio.source_plan
    monkeypatch.setattr(guestfio, "source_plan", lambda cache_dir, env: real_plan(cache_dir, env)
                        .model_copy(update={"version": "0.0-0iomatrix.missing"}))
    cache = tmp_path / "cache"
    cache.mkdir()
    for entry in default_cache_dir().glob("busybox-static_*"):  # else fetched again
        (cache / entry.name).symlink_to(entry)
    with pytest.raises(GuestFioUnavailable, match="no source for fio 0.0-0iomatrix.missing"):
        guest_fio(cache)
    status = guest_fio_status(cache)
    assert not status.ok and status.detail.startswith(f"{UNPATCHED}: no source for fio 0.0-")
    assert status.hint == "`iomatrix appliance build --force` tries again"
    with pytest.raises(GuestFioUnavailable, match=r"\(remembered; `iomatrix appliance build "
                                                  r"--force` tries again\)"):
        guest_fio(cache)

    appliance = build_appliance(cache_dir=cache, kernel=kernel)
    assert not appliance.fio_patched and "no source for fio 0.0-0iomatrix.missing" in \
        appliance.fio_note
    assert appliance.notes()[-1] == f"warning: {UNPATCHED} ({appliance.fio_note})"
    manifest = json.loads((appliance.initrd.parent / "manifest.json").read_text())
    assert manifest["fio_patched"] is False and manifest["fio_note"] == appliance.fio_note
    interpreter, closure = library_closure(Path(require("fio")))
    initrd = appliance.initrd.read_bytes()
    assert interpreter.lstrip("/").encode() in initrd
    assert all(f"lib/fio/{soname}".encode() in initrd for soname in closure)
    # the closure's ICU data library is hollowed (not 31 MB)
    if any(hollowable(s) for s in closure):
        assert appliance.initrd_bytes < sum(p.stat().st_size for p in closure.values())
    assert not list((cache / "guest-fio").glob(".build-*"))    # the failed build left nothing


def test_the_deb_src_entry_is_the_one_apt_names(tmp_path: Path) -> None:
    """The entry copied as deb-src is the one apt numbers in $(SOURCESENTRY): deb822 stanzas
    (Debian 13's debian.sources) counted from 1 with comment-only blocks not counted, and lines
    of a one-line file, each with its own options kept."""
    parts = tmp_path / "parts"
    parts.mkdir()
    keyring = "/usr/share/keyrings/debian-archive-keyring.gpg"
    (parts / "a.sources").write_text(
        "# Modernized from /etc/apt/sources.list\n\n"
        f"Types: deb\nURIs: http://example.invalid/debian\nSuites: s1\nComponents: main\n"
        f"Signed-By: {keyring}\n\n"
        "# the second stanza\n"
        f"Types: deb deb-src\nURIs: http://example.invalid/debian\nSuites: s2\n"
        f"Components: main contrib\nSigned-By: {keyring}\n")
    (parts / "b.list").write_text("# one-line\n"
                                  "deb [arch=amd64] http://example.invalid/debian s3 main\n")
    listed = run(["apt-get", "-oDir::Etc::SourceList=/dev/null",
                  f"-oDir::Etc::SourceParts={parts}", f"-oDir::State::Lists={tmp_path}",
                  "indextargets", "--no-release-info", "--format",
                  "$(SOURCESENTRY)\t$(RELEASE)", "Created-By: Packages"], timeout=60).stdout
    entries = {tuple(line.split("\t")) for line in listed.splitlines() if line}
    assert {release for _, release in entries} == {"s1", "s2", "s3"}
    for entry, release in entries:
        path, _, number = entry.rpartition(":")
        text = guestfio._entry_text(Path(path), int(number))
        assert text is not None, entry
        if path.endswith(".sources"):
            assert f"Suites: {release}\n" in text and "Types: deb-src\n" in text
            assert f"Signed-By: {keyring}\n" in text and "#" not in text
        else:
            assert text == f"deb-src [arch=amd64] http://example.invalid/debian {release} main\n"


def test_setup_installs_what_the_build_needs() -> None:
    setup = (Path(__file__).resolve().parents[2] / "setup.sh").read_text()
    listed = set(" ".join(re.findall(r'^packages="\$packages ([^"]*)"', setup, re.M)).split())
    assert set(BUILD_PACKAGES.split()) <= listed
