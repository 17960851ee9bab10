"""The package's shape: no module imports, however lazily (inside a function, or only for
type checkers), a module that imports it back, and each module says in its docstring what
it owns. An ``ast`` walk over ``rq_emq/``: nothing is imported to check it."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "rq_emq"


def module_name(path: Path, root: Path = PACKAGE.parent) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, modules: set[str], root: Path = PACKAGE.parent) -> set[str]:
    """The package's modules that ``path`` imports anywhere in its body."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)  # from . import fencing
    return {m for m in found if m in modules and m != name}


def import_graph() -> dict[str, set[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    graph = {module_name(p): imported_modules(p, modules) for p in paths}
    # the package's __init__ imports everything to re-export it: an edge into it is no layer
    return {m: deps - {"rq_emq"} for m, deps in graph.items()}


def circle_from(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle, as the list of modules along it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                return [*path[path.index(dep) :], dep]
            if dep not in state and (found := visit(dep)):
                return found
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_module_imports_one_that_imports_it_back() -> None:
    circle = circle_from(import_graph())
    assert circle is None, "import circle: " + " -> ".join(circle or [])


def test_the_circle_finder_finds_circles_lazy_ones_included(tmp_path: Path) -> None:
    # a made-up graph in the shape of the circles the layout issue found (compose -> spawn ->
    # worker -> compose, through a function-level import), so the check above can fail
    graph = {"compose": {"spawn"}, "spawn": {"worker"}, "worker": {"compose"}, "keys": set()}
    assert circle_from(graph) == ["compose", "spawn", "worker", "compose"]
    assert circle_from({"a": {"b"}, "b": set()}) is None
    (tmp_path / "rq_emq").mkdir()
    lazy = tmp_path / "rq_emq" / "worker.py"
    lazy.write_text("def f():\n    from . import fencing\n    from .compose import lease_worker\n")
    modules = {"rq_emq.fencing", "rq_emq.compose"}
    assert imported_modules(lazy, modules, root=tmp_path) == modules


def test_every_module_says_what_it_owns() -> None:
    silent = [
        module_name(p)
        for p in sorted(PACKAGE.rglob("*.py"))
        if not ast.get_docstring(ast.parse(p.read_text()))
    ]
    assert silent == []
