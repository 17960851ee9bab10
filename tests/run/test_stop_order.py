"""A job moves only after the run that had it is over (issue 33, rule 3).

A ``SimpleLeaseWorker`` job interrupted on a lost lease that does not give way within the
self-kill's delay (it swallows the interrupt) is ended with its worker process.

Real ``rq worker`` processes, real signals, a real Redis. Times are the runs' own
timestamps (``jobs.run_spans``, CLOCK_MONOTONIC: one clock for every process here).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
import redis
from helpers import take_away
from jobs import run_spans, runs
from procs import Processes, wait_for
from rq import Queue

from rq_emq.settings import LeaseSettings

pytestmark = pytest.mark.slow

#: the first run would go on this long: only the stop ends it
RUN_S = 60.0


#: renewals every 400 ms of an 8 s lease: the self-kill's delay is 0.6 s (half the 800 ms
#: margin and half a renew interval), while the lease clock runs out only 7.2 s past a renewal
WATCHFUL = {"RQ_EMQ_LEASE_MS": "8000", "RQ_EMQ_RENEW_INTERVAL_MS": "400"}
WATCHFUL_SETTINGS = LeaseSettings(lease_ms=8000, renew_interval_ms=400)


def test_a_job_that_swallows_the_lease_lost_interrupt_ends_with_its_worker_within_the_self_kill_delay(
    r: redis.Redis, procs: Processes, redis_url: str, tmp_path: Path
) -> None:
    """The lease found lost (recovered elsewhere: the job may already run there), the
    interrupt swallowed: the worker ends itself that long after, not when its lease clock
    runs out."""
    log = str(tmp_path / "runs.log")
    job = Queue(connection=r).enqueue("jobs.swallowing_run", log, RUN_S, job_timeout=120)
    worker = procs.worker(redis_url, worker_class="rq_emq.SimpleLeaseWorker", **WATCHFUL)
    wait_for(lambda: runs(log), timeout=15, what="the run to start")
    taken_at = time.monotonic()
    take_away(r, job.id, status="queued")
    wait_for(lambda: worker.poll() is not None, timeout=15, what="the worker to end itself")
    assert worker.returncode == -signal.SIGKILL, procs.log(worker)
    assert "swallowed" in [line.split()[0] for line in runs(log)]  # the interrupt did land
    settings = WATCHFUL_SETTINGS
    # found lost within a renew interval, then the self-kill's delay (or a check interval
    # later, by the watchdog); twice that bound is the slack for a loaded host's late timers,
    # still well short of the 7.2 s the lease clock would have let it run
    bound = settings.renew_interval_ms / 1000 + (settings.lease_margin_ms + settings.renew_interval_ms) / 2000
    bound += settings.lease_check_interval_s
    last = max(at for _, at in run_spans(log).values())
    assert last - taken_at < 2 * bound
    said = procs.log(worker)
    assert "did not stop when its lease was lost" in said or "past its deadline" in said, said
