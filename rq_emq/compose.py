"""Leases for RQ's other worker classes and users' own: :func:`lease_worker`, and the
startup check that refuses a composition that would run jobs without the lease's
guarantees.

A lease worker is the lease behaviour (:class:`rq_emq.worker.LeaseMixin`) put before an RQ
worker class, plus the parts that depend on how that class runs a job:

- a forking worker (``Worker`` and its subclasses: ``HerokuWorker``, ``RoundRobinWorker``,
  ``RandomWorker``, a user's own) needs :class:`rq_emq.LeaseWorker`'s horse parts: the
  horse dies with its worker and ends itself at its local lease deadline;
- a non-forking worker (``SimpleWorker`` and subclasses) needs
  :class:`rq_emq.SimpleLeaseWorker`'s: a lost lease interrupts the job in place;
- ``SpawnWorker`` (RQ 3) starts its horse as a fresh interpreter with ``posix_spawn``:
  it gets LeaseWorker's parts, and the spawned horse rebuilds them (its lease, its
  parent, its deadline) from what the worker hands it (:mod:`rq_emq.spawn`).

:func:`lease_worker` picks the right parts for a class; composing by hand
(``class MyWorker(rq_emq.LeaseWorker, MyBase)``) is the same thing.
"""

from __future__ import annotations

import sys
from typing import Any

import rq
from rq import SimpleWorker, Worker

from . import compat
from .startup import StartupError

_composed: dict[type[Any], type[Any]] = {}


def _lease_classes() -> tuple[type[Any], type[Any], type[Any]]:
    from .worker import LeaseMixin, LeaseWorker, SimpleLeaseWorker

    return LeaseMixin, LeaseWorker, SimpleLeaseWorker


def lease_worker(worker_class: type[Any], name: str | None = None) -> type[Any]:
    """``worker_class`` with leases: a subclass of it whose jobs hold lock leases.

    Assign the result to a module-level name (``LeaseMyWorker = lease_worker(MyWorker)``,
    the default name) and run ``rq worker -w mymodule.LeaseMyWorker``. A class that already
    has leases is returned as it is; the same class always gives the same subclass.
    """
    lease_mixin, fork_parts, simple_parts = _lease_classes()
    if not (isinstance(worker_class, type) and issubclass(worker_class, Worker | SimpleWorker)):
        raise TypeError(f"lease_worker() takes an RQ worker class, got {worker_class!r}")
    if issubclass(worker_class, lease_mixin):
        return worker_class
    if worker_class not in _composed:
        parts: tuple[type[Any], ...] = (
            simple_parts if issubclass(worker_class, SimpleWorker) else fork_parts,
        )
        if _is_spawning(worker_class):
            from .spawn import SpawnLeaseMixin

            parts = (SpawnLeaseMixin, *parts)
        composed = type(
            name or f"Lease{worker_class.__name__}",
            (*parts, worker_class),
            {
                "__module__": sys._getframe(1).f_globals.get("__name__", __name__),
                "__doc__": f"{worker_class.__name__} whose jobs hold lock leases (rq_emq.lease_worker).",
            },
        )
        _composed.setdefault(worker_class, composed)
    return _composed[worker_class]


def check_worker_class(worker: Any) -> None:
    """Refuse, in one line, a lease worker class that lacks the parts its way of running
    jobs needs (the lease mixin put by hand before a forking class)."""
    _, fork_parts, simple_parts = _lease_classes()
    kind = type(worker)
    if isinstance(worker, SimpleWorker) and not isinstance(worker, simple_parts):
        raise StartupError(
            f"worker class {kind.__module__}.{kind.__qualname__} runs jobs in-process (SimpleWorker) "
            "but lacks SimpleLeaseWorker's parts (a lost lease must interrupt the job); "
            f"use rq_emq.lease_worker({_base_name(kind)})"
        )
    if _is_spawning(kind):
        from .spawn import SpawnLeaseMixin

        if not isinstance(worker, SpawnLeaseMixin):
            raise StartupError(
                f"worker class {kind.__module__}.{kind.__qualname__} spawns each horse as a new "
                "interpreter (SpawnWorker) but lacks the parts that hand it its lease, parent and "
                f"deadline; use rq_emq.lease_worker({_base_name(kind)})"
            )
        if _rq_major() < 3:
            raise StartupError(
                f"worker class {kind.__module__}.{kind.__qualname__}: leases for SpawnWorker need "
                f"RQ 3 (this is RQ {rq.__version__}, whose spawned horse differs); use LeaseWorker"
            )
    if not isinstance(worker, SimpleWorker) and not isinstance(worker, fork_parts):
        raise StartupError(
            f"worker class {kind.__module__}.{kind.__qualname__} forks a horse per job "
            "but lacks LeaseWorker's horse parts (die with the worker, stop at the lease deadline); "
            f"use rq_emq.lease_worker({_base_name(kind)})"
        )


def _rq_major() -> int:
    return int(str(rq.__version__).split(".")[0])


def _is_spawning(kind: type[Any]) -> bool:
    spawn_worker = compat.spawn_worker_class()
    return spawn_worker is not None and issubclass(kind, spawn_worker)


def _base_name(kind: type[Any]) -> str:
    lease_mixin, _, _ = _lease_classes()
    for base in kind.__mro__:
        if not issubclass(base, lease_mixin) and issubclass(base, Worker | SimpleWorker):
            return base.__name__
    return kind.__name__
