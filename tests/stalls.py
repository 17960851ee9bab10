"""Stalled jobs made on purpose, and sweepers to find them: the sweep's tests
(recover/test_sweep.py) and the tests of what a sweep reports (shared/test_events.py,
operate/test_cli.py) share them, so they live here, beside the other helpers, on the
tests' import path."""

from __future__ import annotations

import time

import redis
from rq import Queue

from rq_emq.intake.take import Taker
from rq_emq.keys import QueueKeys
from rq_emq.recover.sweep import Sweeper
from rq_emq.settings import LeaseSettings

#: the sweep interval the shortest a 200 ms renew interval allows (0.64 sweep intervals at
#: most): a round every 0.25 s, and a grace of 1.25 renew intervals (250 ms)
SETTINGS = LeaseSettings(lease_ms=1_000, renew_interval_ms=200, sweep_interval_ms=313, sweep_batch=50)
Q = QueueKeys("q")


def sweeper(r: redis.Redis, **overrides: int) -> Sweeper:
    return Sweeper(r, ["q"], LeaseSettings(**{**SETTINGS.__dict__, **overrides}))


def stall(r: redis.Redis, n: int = 1, **enqueue: object) -> list[str]:
    """Lease n jobs, then let their worker 'die': lock gone, deadline passed."""
    queue = Queue("q", connection=r)
    ids = []
    for _ in range(n):
        job = queue.enqueue("jobs.noop", **enqueue)  # type: ignore[arg-type]
        taken = Taker(r, "dead-worker", SETTINGS).pop(["q"])
        assert taken is not None
        ids.append(job.id)
    with r.pipeline() as pipe:
        for job_id in ids:
            pipe.delete(Q.lock(job_id)).zadd(Q.leases, {job_id: 0})
        pipe.execute()
    return ids


def next_round(s: Sweeper) -> None:
    time.sleep(s.grace_ms / 1000 + 0.01)
