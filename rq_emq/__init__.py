"""rq-emq: exact crash recovery for RQ with per-job lock leases.

Producers keep ``queue.enqueue(...)``; operators run ``rq worker -w rq_emq.LeaseWorker``.
"""

from __future__ import annotations

from types import ModuleType

from . import _moved
from ._version import __version__
from .events import LeaseEvent, subscribe, unsubscribe
from .fence.fencing import LeaseLost
from .recover.registries import (
    LeasedJobRegistry,
    LeaseQueue,
    LeaseQueueMixin,
    LeaseStartedJobRegistry,
    StalledJobRegistry,
    lease_queue_class,
    patch_stock_started_registry,
)
from .run.compose import lease_worker
from .run.dequeue import META_MAX_ATTEMPTS
from .run.job_lease import JobLease, current_lease
from .run.lease_mixin import LeaseMixin
from .run.startup import StartupError
from .run.worker import LeaseJobInterrupted, LeaseWorker, SimpleLeaseWorker
from .settings import MAX_ATTEMPTS_LIMIT, LeaseSettings, SettingsError, job_max_attempts


def max_attempts(n: int, meta: dict | None = None) -> dict:
    """``meta`` for ``queue.enqueue(..., meta=max_attempts(5))``: this job may be taken at
    most ``n`` times before a stall fails it (the worker-wide default applies otherwise)."""
    if job_max_attempts(n) is None:
        raise SettingsError(f"max_attempts must be a whole number from 1 to {MAX_ATTEMPTS_LIMIT}, got {n!r}")
    return {**(meta or {}), META_MAX_ATTEMPTS: n}


_moved.install()  # rq_emq.<module> paths from before the rooms (issue 23), for one release


def __getattr__(name: str) -> ModuleType:
    """``rq_emq.sweep`` and the other moved modules by their old attribute name."""
    return _moved.old_module(name)


try:  # RQ 3's SpawnWorker; RQ 2 has none
    from .run.spawn import SpawnLeaseWorker  # noqa: F401
except ImportError:
    pass

__all__ = [
    "META_MAX_ATTEMPTS",
    "JobLease",
    "LeaseEvent",
    "LeaseJobInterrupted",
    "LeaseLost",
    "LeaseMixin",
    "LeaseQueue",
    "LeaseQueueMixin",
    "LeaseStartedJobRegistry",
    "LeaseSettings",
    "LeaseWorker",
    "LeasedJobRegistry",
    "SettingsError",
    "StartupError",
    "SimpleLeaseWorker",
    "StalledJobRegistry",
    "__version__",
    "current_lease",
    "lease_queue_class",
    "lease_worker",
    "max_attempts",
    "patch_stock_started_registry",
    "subscribe",
    "unsubscribe",
]
