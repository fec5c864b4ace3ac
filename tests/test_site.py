"""The documentation site: it builds in strict mode with no warning (a broken link or anchor
fails), its generated reference holds every command, option, suite key and exit status, the
export format it documents is what ``export`` writes, and every suite in the documentation
that starts with ``[suite]`` passes ``iomatrix run --plan`` as pasted."""

from __future__ import annotations

import html
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from iomatrix.cli.status import ExitStatus
from iomatrix.store import Store
from iomatrix.store.records import EXPORT_FORMAT_VERSION
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.workloads import Workload
from iomatrix.testing.synthetic import Figures, write_run
from tests.conftest import REPO, cli_result

PAGES = sorted((REPO / "docs").rglob("*.md"))


def _hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_reference", REPO / "docs/hooks/reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


HOOK = _hook()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built as `mkdocs build --strict` builds it, into a directory of the test's."""
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}   # Material's notice of its end of life
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(out), "--config-file", str(REPO / "mkdocs.yml")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    said = [line for line in (done.stdout + done.stderr).splitlines()
            if line.strip() and not line.startswith("INFO ")]
    assert said == []                 # no warning, nor anything else but INFO lines
    return out


def _text(page: Path) -> str:
    """A built page's text: tags dropped, entities read, blanks collapsed."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page.read_text())).split())


def _squash(text: str) -> str:
    """Text without blanks and backticks: Markdown's code spans and line breaks aside."""
    return re.sub(r"[\s`]", "", text)


def _sections(page: Path) -> dict[str, str]:
    """A built page's sections by heading (its text without the permalink): each section's
    text up to the next heading."""
    parts = re.split(r"(<h[1-4] id=\"[^\"]*\">.*?</h[1-4]>)", page.read_text())
    found = {}
    for heading, body in zip(parts[1::2], parts[2::2]):
        title = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", heading)).replace("¶", "").split())
        found[title] = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", body)).split())
    return found


@pytest.mark.slow
def test_every_page_is_built_and_in_the_navigation(site: Path) -> None:
    for page in PAGES:
        built = site / page.relative_to(REPO / "docs").with_suffix(".html")
        assert built.is_file(), built
    index = (site / "index.html").read_text()
    for page in ("tutorial/first-run.html", "how-to/ceph.html", "reference/cli.html",
                 "explanation/security.html", "development/tests.html", "changelog.html"):
        assert f'href="{page}"' in index, page
    assert "Unreleased" in _text(site / "changelog.html")


@pytest.mark.slow
def test_every_command_and_option_is_in_the_reference(site: Path) -> None:
    sections = _sections(site / "reference/cli.html")
    commands = HOOK.cli_commands()
    assert {"iomatrix run", "iomatrix recommend", "iomatrix db copy", "iomatrix node run"} <= set(commands)
    for command, options in commands.items():
        section = sections[command]
        assert section.startswith(command), (command, section[:80])      # its usage first
        assert [o for o in options if o not in section] == [], command
    assert "--explain" in sections["iomatrix recommend"]


@pytest.mark.slow
def test_every_suite_key_is_in_the_reference_with_its_description(site: Path) -> None:
    sections = _sections(site / "reference/suite.html")
    tables = HOOK.suite_keys()
    assert {"[suite]", "[target]", "[target] rbd", "[[workloads]]", "[method]", "[nodes]",
            "[guest]", "[[finding]]", "[scale.NAME]"} <= set(tables)
    undocumented = []
    for name, model in HOOK.suite_tables():
        table, _, key = name.partition(" ")
        section = sections[f"{key} in {table}" if key else table]
        docs = HOOK.field_docstrings(model)
        for field in model.model_fields:
            assert f" {field} " in f" {section} ", (name, field)
            if not docs.get(field):
                undocumented.append(f"{name} {field}")
    assert undocumented == []           # a key's description is the docstring under its field


@pytest.mark.slow
def test_every_exit_status_is_in_the_reference(site: Path) -> None:
    page = _squash(_text(site / "reference/exit-status.html"))
    for code, name, meaning in HOOK.exit_statuses():
        assert meaning, name
        assert _squash(f"{code} {name} {meaning}") in page, name
    assert {s.value for s in ExitStatus} == {code for code, _, _ in HOOK.exit_statuses()}


@pytest.mark.slow
def test_the_export_format_is_what_export_writes(site: Path, tmp_path: Path) -> None:
    page = _text(site / "reference/results.html")
    assert f"JSON export ( format_version ) {EXPORT_FORMAT_VERSION}" in page
    configs = [Configuration(mode="blocklayer", aio=aio, cache="none", format="raw")
               for aio in ("native", "io_uring")]
    with Store(tmp_path / "r.db") as store:
        write_run(store, configs, [Workload(rw="randread", bs=4096, iodepth=1)],
                  lambda c, w, i: Figures(1000.0, 4096e3, 1e6, 2e6, stall_s=0.1))
    exported = json.loads(cli_result("export", "1", "--format", "json", "--db",
                                     str(tmp_path / "r.db")).stdout)
    assert list(exported)[0] == "format_version" and exported["format_version"] == EXPORT_FORMAT_VERSION
    keys = {*exported, *exported["configs"][0], *exported["workloads"][0], *exported["trials"][0],
            *exported["trials"][0]["samples"][0], *exported["trials"][0]["stall"]}
    assert [k for k in sorted(keys) if f" {k} " not in page] == []
    header = cli_result("export", "1", "--db", str(tmp_path / "r.db")).stdout.splitlines()[0]
    assert [c for c in header.split(",") if c not in ("aio", "cache", "format") and f" {c} " not in page
            and f" {c}," not in page and f" {c}(" not in page] == []


def _suites() -> list[tuple[str, int, str]]:
    """(page, index, text) of every ```toml block of the README and the documentation that
    starts with [suite]: a whole suite, to be pasted into a file."""
    found = []
    for path in [REPO / "README.md", *PAGES]:
        blocks = re.findall(r"^```toml\n(.*?)\n```", path.read_text(), re.S | re.M)
        found += [(str(path.relative_to(REPO)), i, b + "\n")
                  for i, b in enumerate(blocks) if b.startswith("[suite]")]
    return found


SUITES = _suites()


def test_the_documentation_has_suites_to_paste() -> None:
    pages = {page for page, _, _ in SUITES}
    assert {"README.md", "docs/reference/suite.md", "docs/how-to/ceph.md", "docs/how-to/iscsi.md",
            "docs/how-to/cluster.md", "docs/how-to/proxmox-storage.md"} <= pages


@pytest.mark.parametrize(("page", "index", "text"), SUITES, ids=[f"{p}#{i}" for p, i, _ in SUITES])
def test_every_suite_in_the_docs_plans(tmp_path: Path, page: str, index: int, text: str) -> None:
    """As pasted into a file; a Proxmox VE storage id gets a storage.cfg naming it (a directory
    storage here), given with --storage-cfg as the page says."""
    (tmp_path / "suite.toml").write_text(text)
    args = ["run", str(tmp_path / "suite.toml"), "--plan", "--db", str(tmp_path / "p.db")]
    storage = re.search(r'^storage = "([^":]+)', text, re.M)
    if storage:
        (tmp_path / "pve/images").mkdir(parents=True)
        (tmp_path / "storage.cfg").write_text(f"dir: {storage.group(1)}\n\tpath {tmp_path / 'pve'}\n"
                                              "\tcontent images\n")
        args += ["--storage-cfg", str(tmp_path / "storage.cfg")]
    done = cli_result(*args, cwd=tmp_path)
    assert done.returncode == 0, f"{page} suite #{index}: {done.stderr}"
    assert "trials" in done.stdout
