"""The startup check that a lease worker class has the parts its way of running jobs
needs, so that a class composed by hand never runs jobs without the lease's guarantees.

Each set of parts marks itself with a class attribute (LeaseWorker's horse parts
``_fork_parts``, SimpleLeaseWorker's ``_in_process_parts``, the spawn hand-over's
``_spawn_parts``), so the check reads the worker's class and imports none of them: the
worker classes call it, and :mod:`rq_emq.run.compose` builds them, with no import circle.
"""

from __future__ import annotations

from typing import Any

import rq
from rq import SimpleWorker, Worker

from .. import compat
from .startup import StartupError


def check_worker_class(worker: Any) -> None:
    """Refuse, in one line, a lease worker class that lacks the parts its way of running
    jobs needs (the lease mixin put by hand before a forking class)."""
    kind = type(worker)
    name = f"{kind.__module__}.{kind.__qualname__}"
    use = f"use rq_emq.lease_worker({_base_name(kind)})"
    if isinstance(worker, SimpleWorker) and not getattr(worker, "_in_process_parts", False):
        raise StartupError(
            f"worker class {name} runs jobs in-process (SimpleWorker) but lacks SimpleLeaseWorker's "
            f"parts (a lost lease must interrupt the job); {use}"
        )
    if is_spawning(kind):
        if not getattr(worker, "_spawn_parts", False):
            raise StartupError(
                f"worker class {name} spawns each horse as a new interpreter (SpawnWorker) but lacks "
                f"the parts that hand it its lease, parent and deadline; {use}"
            )
        if compat.RQ_MAJOR < 3:
            raise StartupError(
                f"worker class {name}: leases for SpawnWorker need RQ 3 (this is RQ {rq.__version__}, "
                "whose spawned horse differs); use LeaseWorker"
            )
    if not isinstance(worker, SimpleWorker) and not getattr(worker, "_fork_parts", False):
        raise StartupError(
            f"worker class {name} forks a horse per job but lacks LeaseWorker's horse parts (die "
            f"with the worker, stop at the lease deadline); {use}"
        )


def is_spawning(kind: type[Any]) -> bool:
    """Whether ``kind`` starts its horse with ``posix_spawn`` (RQ 3's ``SpawnWorker``)."""
    spawn_worker = compat.spawn_worker_class()
    return spawn_worker is not None and issubclass(kind, spawn_worker)


def _base_name(kind: type[Any]) -> str:
    """The RQ worker class a lease class was built on (what ``lease_worker`` takes)."""
    for base in kind.__mro__:
        if not getattr(base, "_is_lease_worker", False) and issubclass(base, Worker | SimpleWorker):
            return base.__name__
    return kind.__name__
