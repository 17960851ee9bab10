"""Apply one mutation in a scratch copy of the repository and run its tests there.

The scratch copy is the whole source tree (no virtualenvs, caches or git data). pytest
runs with the copy as its working directory and first on ``PYTHONPATH``, so the test
process, and the real ``rq worker`` processes the tests start (they inherit
``PYTHONPATH``), import ``rq_emq`` and its Lua scripts from the copy, not from the
editable install. :func:`check_isolation` proves that before any result is trusted.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .catalog import Mutation

ROOT = Path(__file__).resolve().parent.parent
_SKIP = {".git", ".venv", ".venv2", ".ci-venvs", ".hypothesis", "build", "dist", "mutants", "__pycache__"}
#: A mutation whose tests run longer than this is counted as killed (they hung).
TIMEOUT_S = 600


class CatalogError(Exception):
    """A mutation no longer applies: its original text is not in its file exactly once."""


@dataclass
class Outcome:
    name: str
    verdict: str  # killed | survived | timeout
    seconds: float
    detail: str = ""

    @property
    def killed(self) -> bool:
        return self.verdict != "survived"


def _ignore(_dir: str, names: list[str]) -> set[str]:
    return {n for n in names if n in _SKIP or n.endswith((".egg-info", "_cache")) or n.startswith(".venv")}


def scratch_copy(into: Path) -> Path:
    target = into / "repo"
    shutil.copytree(ROOT, target, ignore=_ignore, symlinks=True)
    return target


def apply(mutation: Mutation, tree: Path) -> None:
    path = tree / mutation.file
    text = path.read_text()
    found = text.count(mutation.original)
    if found != 1:
        raise CatalogError(
            f"mutation {mutation.name}: {mutation.original!r} occurs {found} times in {mutation.file} "
            "(it must occur exactly once; re-anchor it in mutations/catalog.py)"
        )
    path.write_text(text.replace(mutation.original, mutation.replacement))


def env_for(tree: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree)
    env.pop("PYTHONSTARTUP", None)
    return env


def check_isolation(tree: Path) -> None:
    """The copy's package and Lua scripts are the ones imported, from the tests' folder
    (where worker processes start) as from the root (where pytest starts)."""
    probe = "import rq_emq, rq_emq.scripts as s; print(rq_emq.__file__); print(s.lua_dir())"
    for cwd in (tree, tree / "tests"):
        out = subprocess.run(
            [sys.executable, "-c", probe], cwd=cwd, env=env_for(tree), capture_output=True, text=True
        )
        lines = out.stdout.split()
        if out.returncode != 0 or len(lines) != 2 or not all(line.startswith(str(tree)) for line in lines):
            raise SystemExit(f"scratch copy not isolated (from {cwd}): {out.stdout}{out.stderr}")


def run_tests(tree: Path, tests: tuple[str, ...]) -> tuple[int | None, str]:
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "--no-header", *tests]
    try:
        done = subprocess.run(
            cmd, cwd=tree, env=env_for(tree), capture_output=True, text=True, timeout=TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        return None, f"timed out after {TIMEOUT_S}s"
    return done.returncode, done.stdout + done.stderr


def _failed_test(output: str) -> str:
    for line in output.splitlines():
        if line.startswith(("FAILED ", "ERROR ")):
            return line.split(" - ")[0].split("::")[-1]
    return ""


def run(mutation: Mutation, keep: bool = False) -> Outcome:
    """Mutate a fresh scratch copy, run the mutation's tests, and say whether they failed."""
    workdir = Path(tempfile.mkdtemp(prefix=f"mutation-{mutation.name}-"))
    try:
        tree = scratch_copy(workdir)
        apply(mutation, tree)
        started = time.monotonic()
        code, output = run_tests(tree, mutation.tests)
        seconds = time.monotonic() - started
        if code is None:
            return Outcome(mutation.name, "timeout", seconds, output)
        if code == 0:
            return Outcome(mutation.name, "survived", seconds)
        if code != 1:  # collection errors, usage errors, no tests: the catalog is wrong
            raise CatalogError(f"mutation {mutation.name}: pytest exit {code}\n{output[-3000:]}")
        return Outcome(mutation.name, "killed", seconds, _failed_test(output))
    finally:
        if keep:
            print(f"  kept {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
