"""The package's shape: no module imports, however lazily (inside a function, or only for
type checkers), a module that imports it back, and each module says in its docstring what
it owns. An ``ast`` walk over ``rq_emq/``: nothing is imported to check it."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "rq_emq"  # tests/tooling/ -> the repository


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
            named = {f"{base}.{alias.name}" for alias in node.names}  # from . import fencing
            found.update(named)
            if not named <= modules:  # a name defined in ``base`` itself, not a module of it
                found.add(base)
    return {m for m in found if m in modules and m != name}


def import_graph() -> dict[str, set[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    # an edge into the package root (the public API, which imports every room to re-export
    # it) is upward from anywhere, and a circle: it stays in the graph
    return {module_name(p): imported_modules(p, modules) for p in paths}


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


#: The rooms from the bottom up (docs/architecture.md): a module imports only its own room
#: and the rooms before it. ``shared`` is the package's top-level modules, and the
#: connection room (every Redis connection's blips and Sentinel failovers) sits beside
#: them: neither imports the other. Run and operate share the top layer and never import
#: each other (only the worker classes compose rooms, and a worker process never loads the
#: operators' tools); ``testing`` (private Redis servers for tests) is a tool room beside
#: them that nothing of the package imports and that imports none of it.
LAYERS: list[set[str]] = [
    {"shared", "connection"},
    {"fence"},
    {"hold"},
    {"intake"},
    {"recover"},
    {"run", "operate", "testing"},
]


def rooms() -> set[str]:
    return {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}


def room_of(module: str, folders: set[str]) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in folders else "shared"


def upward_imports(graph: dict[str, set[str]], folders: set[str]) -> list[str]:
    """Each import of a room that is not below the importer's own, as ``a -> b``. The
    package root (the public API, which imports every room to re-export it) is no room."""
    rank = {room: i for i, layer in enumerate(LAYERS) for room in layer}
    found = []
    for module, deps in sorted(graph.items()):
        if module == "rq_emq":
            continue
        mine = room_of(module, folders)
        for dep in sorted(deps):
            if dep == "rq_emq":
                found.append(f"{module} ({mine}) -> rq_emq (the public API)")
                continue
            theirs = room_of(dep, folders)
            if theirs != mine and rank[theirs] >= rank[mine]:
                found.append(f"{module} ({mine}) -> {dep} ({theirs})")
    return found


def test_every_room_has_its_layer() -> None:
    assert set().union(*LAYERS) == rooms() | {"shared"}


def test_no_room_imports_a_room_above_it_or_beside_it() -> None:
    upward = upward_imports(import_graph(), rooms())
    assert upward == [], "upward imports:\n" + "\n".join(upward)


def test_the_layer_check_finds_upward_and_sideways_imports() -> None:
    folders = {"fence", "hold", "intake", "recover", "run", "operate"}
    graph = {
        "rq_emq.hold.lease": {"rq_emq.fence.fencing", "rq_emq.keys", "rq_emq.recover.sweep"},
        "rq_emq.operate.inspection": {"rq_emq.run.worker", "rq_emq.recover.horse_crash"},
        "rq_emq.keys": {"rq_emq.hold.lease"},
        "rq_emq.run.spawn": {"rq_emq"},
        "rq_emq": {"rq_emq.run.worker"},
    }
    assert upward_imports(graph, folders) == [
        "rq_emq.hold.lease (hold) -> rq_emq.recover.sweep (recover)",
        "rq_emq.keys (shared) -> rq_emq.hold.lease (hold)",
        "rq_emq.operate.inspection (operate) -> rq_emq.run.worker (run)",
        "rq_emq.run.spawn (run) -> rq_emq (the public API)",
    ]


def test_an_import_of_a_name_from_the_package_root_is_an_edge_into_it(tmp_path: Path) -> None:
    (tmp_path / "rq_emq" / "run").mkdir(parents=True)
    spawn = tmp_path / "rq_emq" / "run" / "spawn.py"
    modules = {"rq_emq", "rq_emq.scripts", "rq_emq.run.spawn"}
    spawn.write_text("from .. import scripts\n")  # a module of the root: no edge into it
    assert imported_modules(spawn, modules, root=tmp_path) == {"rq_emq.scripts"}
    spawn.write_text("def f():\n    from .. import LeaseWorker, scripts\n")
    assert imported_modules(spawn, modules, root=tmp_path) == {"rq_emq", "rq_emq.scripts"}
