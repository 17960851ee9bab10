"""rq-emq: exact crash recovery for RQ with per-job lock leases.

Producers keep ``queue.enqueue(...)``; operators run ``rq worker -w rq_emq.LeaseWorker``.
"""

from __future__ import annotations

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
from .run.dequeue import META_MAX_ATTEMPTS, META_PROGRESS_TIMEOUT
from .run.job_lease import JobLease, current_lease
from .run.lease_mixin import LeaseMixin
from .run.startup import StartupError
from .run.worker import LeaseJobInterrupted, LeaseWorker, SimpleLeaseWorker
from .settings import (
    MAX_ATTEMPTS_LIMIT,
    PROGRESS_TIMEOUT_LIMIT_MS,
    LeaseSettings,
    SettingsError,
    job_max_attempts,
    job_progress_timeout,
)


def max_attempts(n: int, meta: dict | None = None) -> dict:
    """``meta`` for ``queue.enqueue(..., meta=max_attempts(5))``: this job may be taken at
    most ``n`` times before a stall fails it (the worker-wide default applies otherwise)."""
    if job_max_attempts(n) is None:
        raise SettingsError(f"max_attempts must be a whole number from 1 to {MAX_ATTEMPTS_LIMIT}, got {n!r}")
    return {**(meta or {}), META_MAX_ATTEMPTS: n}


def progress_timeout(ms: int, meta: dict | None = None) -> dict:
    """``meta`` for ``queue.enqueue(..., meta=progress_timeout(60_000))``: once this job has
    run that long without calling ``rq_emq.current_lease().report(...)`` (counted from its
    take, then from its last report), its run is stopped and it is recovered with the
    attempt counted; at max attempts it fails with "no progress for N ms". Composes with
    :func:`max_attempts` (``meta=progress_timeout(60_000, max_attempts(3))``)."""
    if job_progress_timeout(ms) is None:
        raise SettingsError(
            f"progress_timeout must be a whole number of ms from 1 to {PROGRESS_TIMEOUT_LIMIT_MS}, got {ms!r}"
        )
    return {**(meta or {}), META_PROGRESS_TIMEOUT: ms}


try:  # RQ 3's SpawnWorker; RQ 2 has none
    from .run.spawn import SpawnLeaseWorker  # noqa: F401
except ImportError:
    pass

__all__ = [
    "META_MAX_ATTEMPTS",
    "META_PROGRESS_TIMEOUT",
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
    "progress_timeout",
    "subscribe",
    "unsubscribe",
]

# RQ's ``worker-pool`` command imports this package for its ``-w`` option: its own process
# then says once for the pool what each member would say of the settings (and writes JSON
# in JSON mode). In any other process this does nothing.
from .run import startup as _startup  # noqa: E402

_startup.under_rq_worker_pool()
