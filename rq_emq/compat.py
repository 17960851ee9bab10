"""Differences between the RQ releases we support (2.0 … 3.x), in one place.

RQ 2.0 is the oldest release supported: it introduced Executions (started-registry
members ``<job_id>:<execution_id>`` with a per-job ``rq:executions:<id>`` index, which the
sweep uses to clean RQ's view of a recovered job) and the intermediate list behind its
single-queue BLMOVE. RQ 1.x has neither.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from rq.utils import now
from rq.worker import WorkerStatus

try:  # what RQ's warm-stop signal handler raises in an idle worker
    from rq.exceptions import StopRequested
except ImportError:  # RQ 2.0 keeps it in rq.worker
    from rq.worker import StopRequested  # type: ignore[attr-defined,no-redef]


def resp2_callbacks() -> dict[str, Any]:
    """redis-py's reply callbacks for RESP2-shaped replies (what Lua hands back, whatever
    protocol the client speaks), giving the Python shapes RQ's code expects.

    redis-py 8 builds them per protocol; 5 to 7 keep two dicts to merge.
    """
    try:
        from redis._parsers.response_callbacks import get_response_callbacks

        return dict(get_response_callbacks(user_protocol=2, legacy_responses=True))
    except ImportError:
        from redis._parsers.helpers import _RedisCallbacks, _RedisCallbacksRESP2

        return {**_RedisCallbacks, **_RedisCallbacksRESP2}


def run_failure_callback(job: Any, error: BaseException) -> None:
    """Run ``job``'s failure callback for ``error`` under its timeout, from any thread
    (RQ 3 moved this from a Job method to ``rq.callbacks``). A raising callback is logged,
    as RQ does, and does not stop the failure from being recorded."""
    from rq.timeouts import TimerDeathPenalty

    if getattr(job, "failure_callback", None) is None:
        return
    exc_info = (type(error), error, None)
    try:
        try:
            from rq.callbacks import execute_failure_callback
        except ImportError:
            job.execute_failure_callback(TimerDeathPenalty, *exc_info)
        else:
            execute_failure_callback(job, TimerDeathPenalty, *exc_info)
    except Exception:
        logging.getLogger("rq_emq.sweep").exception("job %s: failure callback raised", job.id)


def is_repeated_stop_signal(worker: Any) -> bool:
    """True when RQ ignores this cold-stop signal as a duplicate (within 1 s of the first).

    Every supported release debounces the pool's echo of Ctrl+C the same way; we must not
    hand a job back for a signal that RQ then ignores.
    """
    requested: datetime | None = getattr(worker, "_shutdown_requested_date", None)
    return requested is not None and (now() - requested) < timedelta(seconds=1)


__all__ = [
    "StopRequested",
    "WorkerStatus",
    "is_repeated_stop_signal",
    "resp2_callbacks",
    "run_failure_callback",
]
