"""The package's layout is its data flow: each folder imports only from folders below it, and no
modules import each other in a cycle. This test is what keeps that true."""

from __future__ import annotations

import ast
import re
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


# -- the sizes and seams issue 32 set ---------------------------------------------------------------
MAX_MODULE_LINES = 800
MAX_FUNCTION_LINES = 80
_LOOSE = re.compile(r"dict\[str,\s*(?:Any|object)\]")


def _trees() -> dict[str, tuple[Path, ast.Module]]:
    return {name: (path, ast.parse(path.read_text())) for name, path in _modules().items()}


def test_no_module_over_its_size():
    big = {name: n for name, path in _modules().items()
           if (n := path.read_text().count("\n")) > MAX_MODULE_LINES}
    assert big == {}


@pytest.mark.slow
def test_no_function_over_its_size():
    long = [f"{name}.{node.name}: {node.end_lineno - node.lineno + 1} lines"
            for name, (_, tree) in _trees().items() for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert long == []


def _loose_names(tree: ast.Module) -> set[str]:
    """The public functions and classes of a module whose signature or fields are a loose
    ``dict[str, Any]`` (or ``dict[str, object]``)."""
    loose = set()
    for node in tree.body:
        members = node.body if isinstance(node, ast.ClassDef) else [node]
        for member in members:
            if isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if member.name.startswith("_") and member is not node:
                    continue
                text = ast.unparse(member.args) + (ast.unparse(member.returns) if member.returns else "")
            elif isinstance(member, ast.AnnAssign) and member is not node:
                text = ast.unparse(member.annotation)
            else:
                continue
            if _LOOSE.search(text):
                loose.add(node.name if isinstance(node, ast.ClassDef) else member.name)
    return {name for name in loose if not name.startswith("_")}


@pytest.mark.slow
def test_no_loose_dict_crosses_a_package():
    """A function or class another package imports takes and gives typed records, not a
    ``dict[str, Any]`` (issue 32): data crossing a boundary says what it holds."""
    trees = _trees()
    loose = {name: _loose_names(tree) for name, (_, tree) in trees.items()}
    crossing = sorted(
        f"{name} imports {node.module}.{alias.name}"
        for name, (_, tree) in trees.items() for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module in loose
        and _layer(node.module) != _layer(name)
        for alias in node.names if alias.name in loose[node.module])
    assert crossing == []


@pytest.mark.slow
def test_target_kinds_are_asked_not_typed():
    """Outside ``targets/`` nothing asks which kind a target is (``isinstance`` on a class of
    ``targets/``): the registry and the kind's interface answer (issue 32)."""
    kinds = {node.name for name, (_, tree) in _trees().items() if _layer(name) == "targets"
             for node in tree.body if isinstance(node, ast.ClassDef)}
    asking = sorted(
        f"{name}:{node.lineno}" for name, (_, tree) in _trees().items() if _layer(name) != "targets"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance"
        and len(node.args) == 2 and kinds & {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)})
    assert asking == []


def test_axes_are_listed_in_vocab_only():
    """An axis is declared once, in ``vocab`` (issue 32): no other module lists the axes by
    hand (a literal tuple, list or set of three or more of them and nothing else: a platform's
    own keys may share their names); they take the lists vocab
    derives (CONFIG_AXES, BLOCKLAYER_AXES, PARAMETERS...)."""
    from iomatrix.vocab.axes import CONFIG_AXES
    axes = set(CONFIG_AXES)
    listing = sorted(
        f"{name}:{node.lineno}" for name, (_, tree) in _trees().items() if _layer(name) != "vocab"
        for node in ast.walk(tree) if isinstance(node, (ast.Tuple, ast.List, ast.Set))
        for words in [{e.value for e in node.elts if isinstance(e, ast.Constant)}]
        if len(words) >= 3 and words <= axes)
    assert listing == []
