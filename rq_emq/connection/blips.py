"""Riding out a Redis connection blip (a reset, a restart, a short partition) around a job.

RQ treats a connection error outside its dequeue as fatal: the horse fails the job with it
or dies, and the worker quits. Under a lease that turns a sub-second blip into a re-run.
These helpers retry the idempotent or fenced steps around a job for as long as its lease
could still be alive, and let a worker wait for Redis as RQ's own dequeue loop does.
(Each case was found by the chaos soak, ``python -m soak``.)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from . import failover

logger = logging.getLogger("rq_emq.lease")

T = TypeVar("T")
BLIPS = (RedisConnectionError, RedisTimeoutError)


def through_blips(step: Callable[[], T], job_id: str, budget_s: float, what: str) -> T:
    """``step()``, tried again on connection errors until ``budget_s`` has passed (the last
    try falls on the deadline, not before it); then the error is raised."""
    deadline = time.monotonic() + budget_s
    delay = 0.05
    while True:
        try:
            return step()
        except BLIPS as error:
            left = deadline - time.monotonic()
            if left <= 0:
                raise
            pause = min(delay, left)
            logger.warning(
                "job %s: could not %s (%s); trying again in %.2fs",
                job_id,
                what,
                error,
                pause,
                extra={"job_id": job_id},
            )
            time.sleep(pause)
            delay = min(delay * 2, 0.5)


def wait_for_redis(connection: Redis, stop: Callable[[], bool]) -> None:
    """Block until Redis answers a PING (or ``stop()`` is true), backing off to 2 s."""
    delay = 0.1
    while not stop():
        try:
            connection.ping()
            return
        except BLIPS:
            failover.pause(connection, delay)  # a Sentinel switch ends it at once
            delay = min(delay * 2, 2.0)
