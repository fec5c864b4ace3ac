"""Every command is documented: in --help and in the README; the README starts with the two
commands, and .ci/run runs the second."""

from __future__ import annotations

import re

import pytest

from iomatrix.cli.app import app
from iomatrix.cli.status import ExitStatus
from tests.conftest import REPO, cli_result

COMMANDS = sorted(c.name or c.callback.__name__ for c in app.registered_commands)  # type: ignore[union-attr]
README = (REPO / "README.md").read_text()


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


@pytest.mark.parametrize("command", COMMANDS)
def test_command_is_documented(command: str) -> None:
    assert f"iomatrix {command}" in README, f"README does not mention `iomatrix {command}`"
    out = cli_result(command, "--help")
    assert out.returncode == 0 and "Usage:" in out.stdout


def test_every_exit_status_is_documented() -> None:
    for status in ExitStatus:
        assert re.search(rf"^\| {status.value} \|", README, re.M), status


def test_the_readmes_example_suite_is_a_valid_suite():
    from iomatrix.suite import expand, load_suite_text

    examples = [b for b in re.findall(r"```toml\n(.*?)\n```", README, re.S) if "[suite]" in b]
    assert examples
    for text in examples:
        suite = load_suite_text(text, source="README.md")
        assert expand(suite).configurations


def test_help_prints_the_suite_tables_it_names() -> None:
    """Help texts name suite tables in brackets; they are printed as written, never taken for
    markup (rich markup printed "one of its [] names")."""
    out = cli_result("runs", "--help").stdout
    assert "[[targets]]" in " ".join(out.split()) and "[]" not in out
