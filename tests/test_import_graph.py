"""The package's import graph: every module imports, and no import cycle hides in a function.

The graph holds every import of one radixgen module by another, wherever it is written: module
level, inside a function, or under ``if TYPE_CHECKING:``. A function-level or type-only import
that closes a cycle works at run time but hides the cycle from readers; the test finds it. Two
modules that need each other's names share a concept: it moves to one of them, or to a third.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
# Source folder -> the package it installs as (pyproject's [tool.setuptools.package-dir]).
SOURCE_ROOTS = {
    "radixgen": "radixgen",
    "grammar": "radixgen.grammar",
    "kernels": "radixgen.kernels",
}


def _modules() -> dict[str, Path]:
    """Every module of the installed package: dotted name -> source file."""
    found: dict[str, Path] = {}
    for folder, package in SOURCE_ROOTS.items():
        root = REPO_ROOT / folder
        for path in sorted(root.rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    return found


def _import_nodes(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement in ``tree``, at any depth."""
    return [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]


def _targets(module: str, is_package: bool, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The dotted names ``node`` imports, resolved against ``module``."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level == 0:
        base = node.module or ""
    else:
        parts = module.split(".")
        anchor = parts if is_package else parts[:-1]
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join(anchor + ([node.module] if node.module else []))
    return [base, *(f"{base}.{alias.name}" for alias in node.names)]


def import_graph() -> dict[str, set[str]]:
    """module -> the package modules it imports (a ``from pkg import name`` counts as ``pkg.name``
    when that is a module, else as ``pkg``)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        edges: set[str] = set()
        for node in _import_nodes(ast.parse(path.read_text(), str(path))):
            targets = _targets(name, is_package, node)
            names = [t for t in targets[1:] if t in modules] if len(targets) > 1 else []
            if isinstance(node, ast.ImportFrom) and names:
                edges.update(names)
            elif isinstance(node, ast.ImportFrom):
                edges.update(t for t in targets[:1] if t in modules)
            else:
                edges.update(t for t in targets if t in modules)
        edges.discard(name)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path that starts and ends at the same module, or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)) is not None:
            return cycle
    return None


def test_find_cycle_reports_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_graph_sees_function_level_and_type_only_imports() -> None:
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from .engine import Engine\n"
        "def f():\n    from .scoring import score\n"
    )
    targets = [t for n in _import_nodes(tree) for t in _targets("radixgen.x", False, n)]
    assert {"radixgen.scoring.score", "radixgen.engine.Engine"} <= set(targets)


def test_no_import_cycles() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_every_module_imports() -> None:
    """Import each module in one fresh interpreter (no test fixtures, nothing preloaded);
    ``__main__`` modules run the CLI when imported, so they are left out."""
    names = sorted(n for n in _modules() if not n.endswith(".__main__"))
    code = "import importlib, sys\nfor name in sys.argv[1:]:\n    importlib.import_module(name)\n"
    done = subprocess.run(
        [sys.executable, "-c", code, *names], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-4000:]


def test_a_cpu_engine_never_loads_triton(tiny_model_folder) -> None:
    """Triton is imported on a Triton kernel's first launch only: a CPU engine that loads a
    model and generates leaves it unloaded (~70 MB resident, and nanobind's leak report)."""
    code = (
        "import sys\nfrom radixgen import Engine, SamplingParams\n"
        "engine = Engine(sys.argv[1], max_total_tokens=1024)\n"
        "engine.generate(['hi'], SamplingParams(max_new_tokens=4))\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'triton'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tiny_model_folder)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
