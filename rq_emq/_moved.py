"""The old import paths of the modules that moved into rooms (issue 23), kept for one
release (deprecated: docs/migrating.md lists each move).

``import rq_emq.sweep``, ``from rq_emq import sweep``, ``rq_emq.sweep`` after ``import
rq_emq`` and ``python -m rq_emq.cli`` all still work, and give the module at its new path
itself, not a copy: a patch through the old name patches the one module the code uses. A
finder at the end of ``sys.meta_path`` answers only names no file answers, so it costs an
import nothing until an old path is asked for.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
import warnings
from collections.abc import Sequence
from types import CodeType, ModuleType
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from importlib.abc import Loader

PACKAGE = "rq_emq"

#: old module name (below ``rq_emq``) -> its new place (below ``rq_emq``)
MOVED: dict[str, str] = {
    "direct_writes": "fence.direct_writes",
    "fencing": "fence.fencing",
    "job_writes": "fence.job_writes",
    "packing": "fence.packing",
    "background": "hold.background",
    "heartbeats": "hold.heartbeats",
    "lease": "hold.lease",
    "take": "intake.take",
    "wake": "intake.wake",
    "election": "recover.election",
    "horse_crash": "recover.horse_crash",
    "outbox": "recover.outbox",
    "registries": "recover.registries",
    "rollback": "recover.rollback",
    "sweep": "recover.sweep",
    "compose": "run.compose",
    "dequeue": "run.dequeue",
    "horse_fence": "run.horse_fence",
    "process_tree": "run.process_tree",
    "run_guard": "run.run_guard",
    "spawn": "run.spawn",
    "startup": "run.startup",
    "watchdog": "run.watchdog",
    "worker": "run.worker",
    "worker_check": "run.worker_check",
    "cli": "operate.cli",
    "cli_connect": "operate.cli_connect",
    "cli_output": "operate.cli_output",
    "inspection": "operate.inspection",
    "metrics": "operate.metrics",
    "prometheus": "operate.prometheus",
    # the shared modules that became rooms (issue 23, second pass): failover is now three
    # modules, and its old path gives the watch, which still answers the other two's names
    "blips": "connection.blips",
    "failover": "connection.failover",
    "testing_sentinel": "testing.sentinel",
}


def new_name(fullname: str) -> str | None:
    """``rq_emq.<room>.<module>`` for an old ``rq_emq.<module>``, else None."""
    package, _, name = fullname.partition(".")
    moved = MOVED.get(name) if package == PACKAGE else None
    return f"{PACKAGE}.{moved}" if moved else None


class _OldPath:
    """The loader of an old path (duck-typed: ``importlib.abc`` costs an import)."""

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None  # a placeholder: exec_module puts the real module in its place

    def exec_module(self, module: ModuleType) -> None:
        new = new_name(module.__name__)
        assert new is not None
        warnings.warn(
            f"{module.__name__} moved to {new}; the old path goes in the next release",
            DeprecationWarning,
            stacklevel=2,  # the import statement: warnings skips importlib's own frames
        )
        # importlib returns what sys.modules holds under the name once this returns
        sys.modules[module.__name__] = importlib.import_module(new)

    def get_code(self, fullname: str) -> CodeType:
        """``python -m rq_emq.cli``: run the module at its new path as ``__main__``."""
        new = new_name(fullname)
        source = f"import runpy\nrunpy.run_module({new!r}, run_name='__main__', alter_sys=True)\n"
        return compile(source, f"<{fullname}, moved to {new}>", "exec")


class _OldPaths:
    """The finder of the old paths, last on ``sys.meta_path``."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if new_name(fullname) is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, cast("Loader", _LOADER))


_LOADER = _OldPath()


def install() -> None:
    """Answer the old paths (once per process)."""
    if not any(isinstance(finder, _OldPaths) for finder in sys.meta_path):
        sys.meta_path.append(_OldPaths())


def old_module(name: str) -> ModuleType:
    """``rq_emq.<name>`` for an attribute of the package by an old module name."""
    if name not in MOVED:
        raise AttributeError(f"module {PACKAGE!r} has no attribute {name!r}")
    return importlib.import_module(f"{PACKAGE}.{name}")
