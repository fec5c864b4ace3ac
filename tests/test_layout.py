"""The package's layout is its data flow: each folder imports only from folders below it, and no
modules import each other in a cycle. This test is what keeps that true."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import iomatrix

PACKAGE = Path(iomatrix.__file__).parent

LAYERS = ["core", "vocab", "cluster", "platform", "suite", "targets", "fio", "telemetry", "qemu", "appliance", "drivers",
          "store", "analysis", "translate", "measure", "recommend", "report", "diagnose", "testing", "cli"]
"""Bottom to top, in the order data flows: a package may import from those before it. ``analysis``
sits below ``measure`` because adaptive repetition asks it when a figure is known well enough;
``translate`` sits below ``measure`` because preparing a run reads the suite's ``from_vm`` through
it."""


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(imported iomatrix module, at module level) for each import in ``path``."""
    tree = ast.parse(path.read_text())
    top = set(map(id, tree.body))
    out = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            if name.startswith("iomatrix"):
                out.append((name, id(node) in top))
    return out


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in LAYERS) else None


def test_every_package_has_a_layer():
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert packages == set(LAYERS)
    roots = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert roots == ["__init__.py", "__main__.py"]


@pytest.mark.slow
def test_imports_point_down():
    modules = _modules()
    climbing = []
    for name, path in modules.items():
        mine = _layer(name)
        for target, _ in _imports(path):
            resolved = _resolve(target, modules)
            theirs = _layer(resolved) if resolved else None
            if mine and theirs and LAYERS.index(theirs) > LAYERS.index(mine):
                climbing.append(f"{name} imports {resolved}")
    assert climbing == []


@pytest.mark.slow
def test_no_import_cycles():
    modules = _modules()
    graph = {name: {r for t, _ in _imports(path)
                    for r in [_resolve(t, modules)] if r and r != name and r != "iomatrix"}
             for name, path in modules.items()}
    cycles = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert cycles == []


def test_the_checks_see_a_climbing_import(tmp_path):
    source = tmp_path / "x.py"
    source.write_text("from iomatrix.cli.app import main\ndef f():\n    import iomatrix.report.html\n")
    assert _imports(source) == [("iomatrix.cli.app", True), ("iomatrix.cli.app.main", True),
                                ("iomatrix.report.html", False)]
