"""The exception tree drawn in ``iomatrix.core.errors``' docstring is read back and compared with
the real classes: the same classes, each under its real parent, in the order they are defined,
with well-formed branches and a description each; and no exception of iomatrix lives elsewhere.
So the drawing cannot drift from the code again."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import NoReturn

import pytest

import iomatrix
from iomatrix.core import errors
from iomatrix.core.errors import IomatrixError

ROOT = IomatrixError.__name__
BRANCH = re.compile(r" (?:[│ ]    )*[├└]── ")
"""What stands between the root's column and a class name: one space, then per level above the
class a continuation ("│" while that level has more siblings below, else blank) padded to five
columns, then the branch itself ("├── ", or "└── " for the last child)."""


def drawn_lines() -> list[str]:
    """The drawing: the root's line and every line after it up to the first blank one."""
    lines = (errors.__doc__ or "").splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith(ROOT + " "))
    drawing = []
    for line in lines[start:]:
        if not line.strip():
            break
        drawing.append(line)
    return drawing


def parse_drawing(drawing: list[str]) -> list[tuple[str, str, str | None, str]]:
    """Each line as (branch glyphs, class name, parent's name or None for the root, description);
    a line that is not a well-formed branch fails the test with the line."""
    column = drawing[0].index(ROOT)
    parsed: list[tuple[str, str, str | None, str]] = []
    ancestors: list[str] = []          # the open branch: ancestors[d] is the class at depth d
    for line in drawing:
        rest = line[column:]
        branch = "" if line is drawing[0] else (BRANCH.match(rest) or _bad(line)).group()
        match = re.fullmatch(r"([A-Z]\w*) {2,}(\S.*)", rest[len(branch):]) or _bad(line)
        name, description = match.groups()
        depth = 0 if not branch else (len(branch) - 5) // 5 + 1
        assert depth <= len(ancestors), f"{name} is drawn deeper than its parent: {line!r}"
        del ancestors[depth:]
        parsed.append((branch, name, ancestors[-1] if ancestors else None, description))
        ancestors.append(name)
    return parsed


def _bad(line: str) -> NoReturn:
    pytest.fail(f"not a line of the exception tree: {line!r}")


def real_classes() -> list[type[IomatrixError]]:
    """Every exception class of ``iomatrix.core.errors``, in the order they are defined."""
    return [value for value in vars(errors).values()
            if isinstance(value, type) and issubclass(value, IomatrixError)
            and value.__module__ == errors.__name__]


def draw(classes: list[type[IomatrixError]]) -> list[str]:
    """The branches and names the drawing must have, from the classes themselves."""
    children: dict[type, list[type]] = {}
    for cls in classes:
        if cls is not IomatrixError:
            children.setdefault(cls.__bases__[0], []).append(cls)
    out = [ROOT]

    def walk(parent: type, continuation: str) -> None:
        kids = children.get(parent, [])
        for i, kid in enumerate(kids):
            last = i == len(kids) - 1
            out.append(" " + continuation + ("└── " if last else "├── ") + kid.__name__)
            walk(kid, continuation + ("     " if last else "│    "))

    walk(IomatrixError, "")
    return out


def test_every_class_has_one_parent_among_iomatrix_errors() -> None:
    for cls in real_classes():
        if cls is not IomatrixError:
            assert len(cls.__bases__) == 1 and issubclass(cls.__bases__[0], IomatrixError), cls


def test_the_drawn_tree_is_the_class_hierarchy() -> None:
    parsed = parse_drawing(drawn_lines())
    drawn = {name: parent for _, name, parent, _ in parsed}
    assert len(drawn) == len(parsed), "a class is drawn twice"
    real = {cls.__name__: (None if cls is IomatrixError else cls.__bases__[0].__name__)
            for cls in real_classes()}
    assert sorted(set(real) - set(drawn)) == [], "classes missing from the drawing"
    assert sorted(set(drawn) - set(real)) == [], "drawn classes that do not exist"
    assert drawn == real
    # the same order as in the module, and every line's glyphs as the hierarchy dictates
    assert [branch + name for branch, name, _, _ in parsed] == draw(real_classes())
    assert all(description.strip() for *_, description in parsed)


def test_the_drawing_parser_catches_drift() -> None:
    """The comparison above can fail: a class left out, or drawn under the wrong parent."""
    drawing = drawn_lines()
    without_last = parse_drawing(drawing[:-1])
    assert {name for _, name, _, _ in without_last} != {c.__name__ for c in real_classes()}
    moved = [line.replace("│    └── InvalidCombination", "├── InvalidCombination     ")
             for line in drawing]
    parents = {name: parent for _, name, parent, _ in parse_drawing(moved)}
    assert parents["InvalidCombination"] == ROOT
    with pytest.raises(pytest.fail.Exception, match="not a line of the exception tree"):
        parse_drawing([drawing[0], drawing[1].replace("├── ", "+-- ")])


@pytest.mark.slow
def test_no_iomatrix_exception_is_defined_outside_errors() -> None:
    """The docstring speaks for every exception of iomatrix: none may subclass one elsewhere."""
    names = {cls.__name__ for cls in real_classes()}
    package = Path(iomatrix.__file__).parent
    elsewhere = []
    for path in package.rglob("*.py"):
        if path == Path(errors.__file__):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", None)
                         for b in node.bases}
                if bases & names:
                    elsewhere.append(f"{path.relative_to(package)}: {node.name}")
    assert elsewhere == []


def test_a_relative_program_is_found_in_the_directory_it_runs_in(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """``run(["./configure"], cwd=src)`` runs src's configure (the guests' fio build does):
    the check that the program exists looks where it will run, not in iomatrix's own cwd."""
    from iomatrix.core.errors import ToolFailed
    from iomatrix.core.proc import run
    src = tmp_path / "src"
    src.mkdir()
    (src / "configure").write_text("#!/bin/sh\necho configured in \"$PWD\"\n")
    (src / "configure").chmod(0o755)
    monkeypatch.chdir(tmp_path)                 # iomatrix's cwd has no ./configure
    assert run(["./configure"], timeout=30, cwd=src).stdout == f"configured in {src}\n"
    with pytest.raises(ToolFailed, match="not found"):
        run(["./configure"], timeout=30, cwd=tmp_path)
