"""Mixed fleets: stock RQ workers and processes beside ours, on the same queues.

A stock worker's job is never touched by our scripts in any state (idle wait, frozen
after its move, between its move and its start), and stock maintenance never fails a job
that our wait moved: our idle wait moves jobs into a list of our own, never RQ's
intermediate list.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import redis
from helpers import FAST, wait_status
from integration_scenarios import starts
from jobs import runs
from procs import Processes, blocked_clients, wait_for
from rq import Queue, SimpleWorker

from rq_emq.keys import QueueKeys
from rq_emq.recover.sweep import Sweeper
from rq_emq.settings import LeaseSettings

pytestmark = [pytest.mark.slow, pytest.mark.rq_versions]

QUEUE = "mixed"
SETTINGS = LeaseSettings(lease_ms=400, renew_interval_ms=100, sweep_interval_ms=157)


def recovery_bound_s() -> float:
    """How long any recovery of ours could take: lease + 2 sweep intervals (the guarantee),
    doubled for a loaded host."""
    return 2 * (SETTINGS.lease_ms + 2 * SETTINGS.sweep_interval_ms) / 1000


def test_a_frozen_stock_workers_job_is_never_taken_by_our_fleet(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path
) -> None:
    """A stock worker idle in its BLMOVE freezes; a pushed job is moved into RQ's
    intermediate list for it. Our workers' sweeps leave it there, however long, so the job
    runs once: when the stock worker resumes (before: our sweep requeued it, one of ours
    ran it, and the stock worker ran it again)."""
    log = str(tmp_path / "runs.log")
    stock = procs.worker(redis_url, QUEUE, worker_class="rq.Worker")
    wait_for(lambda: blocked_clients(r, "blmove") == 1, timeout=20, what="the stock worker's wait")
    os.kill(stock.pid, signal.SIGSTOP)
    try:
        ours = procs.worker(redis_url, QUEUE, **FAST)
        wait_for(lambda: blocked_clients(r, "blmove") == 2, timeout=20, what="our worker's wait too")
        job = Queue(QUEUE, connection=r).enqueue("jobs.sleep_and_record", log, 0.05)
        wait_for(
            lambda: r.lrange(QueueKeys(QUEUE).intermediate, 0, -1) == [job.id.encode()],
            what="the job moved for the frozen stock worker (it blocked first)",
        )
        # several whole recovery bounds: any sweep of ours that would take it has done so
        time.sleep(3 * recovery_bound_s())
        assert runs(log) == [], procs.log(ours)
        assert r.llen(QueueKeys(QUEUE).rq_queue) == 0
    finally:
        os.kill(stock.pid, signal.SIGCONT)
    wait_status(r, job.id, "finished", timeout=30)
    time.sleep(recovery_bound_s())
    assert starts(log) == 1, procs.log(ours)
    assert ours.poll() is None, procs.log(ours)


def test_stock_intermediate_cleanup_never_fails_a_job_our_wait_moved(r: redis.Redis) -> None:
    """A LeaseWorker died between its BLMOVE and its claim. RQ's intermediate-list cleanup,
    run by a stock worker's maintenance (twice: it acts on the second sight), does not see
    it; our sweep puts it back in its queue."""
    queue = Queue(QUEUE, connection=r)
    job = queue.enqueue("jobs.noop")
    q = QueueKeys(QUEUE)
    r.lmove(q.rq_queue, q.moving)  # our wait's move, then the worker died
    stock = SimpleWorker([queue], connection=r)
    for _ in range(2):
        queue.intermediate_queue.cleanup(stock, queue)  # type: ignore[attr-defined]
    assert job.get_status(refresh=True) == "queued"
    sweeper = Sweeper(r, [QUEUE], SETTINGS)
    assert sweeper.sweep(QUEUE).marked == [job.id]
    time.sleep(sweeper.grace_ms / 1000 + 0.01)
    assert sweeper.sweep(QUEUE).requeued == [job.id]
    assert r.lrange(q.rq_queue, 0, -1) == [job.id.encode()] and r.llen(q.moving) == 0
