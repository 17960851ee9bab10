"""Leases for RQ's other worker classes and users' own: :func:`lease_worker`. (The startup
check that refuses a composition lacking a part is :mod:`rq_emq.run.worker_check`.)

A lease worker is the lease behaviour (:class:`rq_emq.run.worker.LeaseMixin`) put before an RQ
worker class, plus the parts that depend on how that class runs a job:

- a forking worker (``Worker`` and its subclasses: ``HerokuWorker``, ``RoundRobinWorker``,
  ``RandomWorker``, a user's own) needs :class:`rq_emq.LeaseWorker`'s horse parts: the
  horse dies once its worker and watchdog are gone and ends itself at its local lease
  deadline;
- a non-forking worker (``SimpleWorker`` and subclasses) needs
  :class:`rq_emq.SimpleLeaseWorker`'s: a lost lease interrupts the job in place;
- ``SpawnWorker`` (RQ 3) starts its horse as a fresh interpreter with ``posix_spawn``:
  it gets LeaseWorker's parts, and the spawned horse rebuilds them (its lease, its
  parent, its deadline) from what the worker hands it (:mod:`rq_emq.run.spawn`).

:func:`lease_worker` picks the right parts for a class; composing by hand
(``class MyWorker(rq_emq.LeaseWorker, MyBase)``) is the same thing.
"""

from __future__ import annotations

import sys
from typing import Any

from rq import SimpleWorker, Worker

from .spawn import SpawnLeaseMixin
from .worker import LeaseMixin, LeaseWorker, SimpleLeaseWorker
from .worker_check import check_worker_class, is_spawning

_composed: dict[type[Any], type[Any]] = {}


def lease_worker(worker_class: type[Any], name: str | None = None) -> type[Any]:
    """``worker_class`` with leases: a subclass of it whose jobs hold lock leases.

    Assign the result to a module-level name (``LeaseMyWorker = lease_worker(MyWorker)``,
    the default name) and run ``rq worker -w mymodule.LeaseMyWorker``. A class that already
    has leases is returned as it is; the same class always gives the same subclass.
    """
    if not (isinstance(worker_class, type) and issubclass(worker_class, Worker | SimpleWorker)):
        raise TypeError(f"lease_worker() takes an RQ worker class, got {worker_class!r}")
    if issubclass(worker_class, LeaseMixin):
        return worker_class
    if worker_class not in _composed:
        parts: tuple[type[Any], ...] = (
            SimpleLeaseWorker if issubclass(worker_class, SimpleWorker) else LeaseWorker,
        )
        if is_spawning(worker_class):
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


__all__ = ["check_worker_class", "lease_worker"]  # the check's old home, kept for one release
