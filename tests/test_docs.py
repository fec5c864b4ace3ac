"""Every command is documented: in --help, on the commands page and in the generated reference;
the README starts with the two commands, and .ci/run runs the second. (tests/test_site.py
builds the documentation site and checks what it generates.)"""

from __future__ import annotations

import re

import pytest

from iomatrix.cli.app import app
from tests.conftest import REPO, cli_result

COMMANDS = sorted(c.name or c.callback.__name__ for c in app.registered_commands)  # type: ignore[union-attr]
README = (REPO / "README.md").read_text()
COMMANDS_PAGE = (REPO / "docs/reference/commands.md").read_text()


def test_readme_starts_with_the_two_commands() -> None:
    blocks = re.findall(r"```sh\n(.*?)\n```", README, re.S)
    assert blocks[:2] == ["./setup.sh && .venv/bin/iomatrix run quick --report iomatrix-report",
                          "./setup.sh --dev && .venv/bin/pytest"]
    assert README.index("```sh") < 400
    # CI runs exactly that: on this host, then in a Debian 13 root (its two halves timed apart)
    ci = (REPO / ".ci/run").read_text().splitlines()
    assert any(line.startswith(f"{blocks[1]} && ") for line in ci)
    assert any(line.startswith(".ci/debian13 && ") for line in ci)
    setup, tests = blocks[1].split(" && ")
    debian13 = (REPO / ".ci/debian13").read_text()
    assert f"\n    {setup} || " in debian13 and f"\n    {tests} \"$@\" && " in debian13


def test_the_readme_is_short_and_links_into_the_docs() -> None:
    """About 150 lines: what iomatrix answers, the commands, how to read the first run, a suite,
    and links to the pages that hold the rest; every link leads to a file that exists."""
    assert len(README.splitlines()) <= 150
    links = re.findall(r"\]\(([^)#]+)\)", README)
    assert len(links) > 20
    assert [link for link in links if not (REPO / link).is_file()] == []
    assert "iomatrix recommend last" in README and "docs/explanation/security.md" in README


@pytest.mark.parametrize("command", COMMANDS)
def test_command_is_documented(command: str) -> None:
    assert f"iomatrix {command}" in COMMANDS_PAGE, f"docs/reference/commands.md lacks `iomatrix {command}`"
    out = cli_result(command, "--help")
    assert out.returncode == 0 and "Usage:" in out.stdout


def test_help_prints_the_suite_tables_it_names() -> None:
    """Help texts name suite tables in brackets; they are printed as written, never taken for
    markup (rich markup printed "one of its [] names")."""
    out = cli_result("runs", "--help").stdout
    assert "[[targets]]" in " ".join(out.split()) and "[]" not in out
