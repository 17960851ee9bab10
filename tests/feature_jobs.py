"""Jobs and hooks for the tests of RQ's own features under lease workers (delayed
``Retry``, exception handlers, cancel, TTLs); workers import them from tests/."""

from __future__ import annotations

from typing import Any

from jobs import record, runs
from rq import Retry


def fail_first_run(log: str) -> str:
    """Raises on its first run, succeeds on the next: one line per run in ``log``."""
    first = not runs(log)
    record(log)
    if first:
        raise ValueError("first run fails")
    return "done"


def return_retry_first_run(log: str, interval: int) -> object:
    """Returns ``Retry(max=1, interval=interval)`` on its first run (RQ 3 retries a job
    that returns one), "done" on the next."""
    first = not runs(log)
    record(log)
    return Retry(max=1, interval=interval) if first else "done"


def saving_handler(job: Any, exc_type: Any, exc_value: Any, traceback: Any) -> bool:
    """An exception handler as users write them: it notes the failure in the job's meta
    and saves the job; True lets RQ's default handling go on."""
    job.meta["handled"] = exc_type.__name__
    job.save()
    return True
