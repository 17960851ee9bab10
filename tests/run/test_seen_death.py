"""A worker death its watchdog saw is recovered at once, at the default settings: the
worker process alone is SIGKILLed (the OOM killer choosing it, a ``kill -9`` of its pid)
while its job runs; its watchdog, which outlives it, ends the run's processes, sees them
gone, and hands the job back with the attempt counted. An idle worker runs it again
within about a second, not a lease (10 s by default) and the sweep's intervals later, and never beside
the old run."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import redis
from helpers import wait_status
from jobs import run_spans, runs
from procs import Processes, wait_for
from rq import Queue
from rq.worker import Worker

from rq_emq.settings import LeaseSettings

pytestmark = pytest.mark.slow
#: the bound at the default settings is a second; five for a loaded 2-core host, still
#: half the default lease, which an unseen death waits at least before the sweep can act
SEEN_BOUND_S = 5.0


@pytest.mark.parametrize("worker_class", ["rq_emq.LeaseWorker", "rq_emq.SimpleLeaseWorker"])
def test_a_killed_workers_job_runs_again_at_once_when_its_watchdog_saw_it_die(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path, worker_class: str
) -> None:
    assert SEEN_BOUND_S * 2 <= LeaseSettings().lease_ms / 1000  # the defaults are what run here
    log = str(tmp_path / "runs.log")
    job = Queue("q", connection=r).enqueue("jobs.ticking_run", log, 60.0, 0.3, job_timeout=300)
    victim = procs.worker(redis_url, "q", worker_class=worker_class)
    wait_for(lambda: len(runs(log)) > 2, timeout=30, what="the first run to tick")
    procs.worker(redis_url, "q", worker_class=worker_class)  # idle: takes the job once it is back
    wait_for(lambda: len(Worker.all(connection=r)) == 2, timeout=30, what="the second worker")
    time.sleep(0.5)  # the idle worker waits on the queue
    os.kill(victim.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    victim.wait()
    wait_for(lambda: len(run_spans(log)) == 2, timeout=30, what="the job's second run")
    (first, (_, first_last)), (second, (second_start, _)) = sorted(
        run_spans(log).items(), key=lambda item: item[1][0]
    )
    print(f"back and running {second_start - killed_at:.3f} s after the kill ({worker_class})")
    assert second_start - killed_at < SEEN_BOUND_S, "the death was seen: no lease to wait out"
    assert first_last < second_start, "the old run still ran as the job ran again"
    wait_status(r, job.id, "finished", timeout=30)
    assert f"is gone: job {job.id} back at the front of its queue (attempt 1 of 3)" in procs.log(victim)
    assert int(r.hget("emq:{q}:stats", "crashed") or 0) == 1  # one attempt counted, once
