"""A ``SimpleLeaseWorker``'s stopped run is over only when its process is (issue 46, rule 1).

The job's work runs on threads (a ``ThreadPoolExecutor`` whose result it waits for, a
``Thread`` it joins): a stop interrupts the job's frame, which unwinds at once, while the
threads work on. So a stop that is not the job returning ends the worker process (every
thread with it), and the job moves only once its watchdog has seen the process gone: a
cold stop's job is handed back with no attempt counted; a lost lease's is left to whoever
holds the job now, and the worker exits non-zero, so that a supervisor starts it again.

Real ``rq worker`` processes, real signals, a real Redis, and a second worker on the same
queue that takes the job the moment it is back. Overlap is measured by the runs' own
timestamps (CLOCK_MONOTONIC, one clock for every process here): no tick of the old run's
threads may come after the next run's start.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from subprocess import Popen

import pytest
import redis
from helpers import stat, status, take_away
from jobs import run_spans, runs
from procs import Processes, wait_for
from rq import Queue, Worker

from rq_emq.settings import LeaseSettings

pytestmark = pytest.mark.slow

#: how the job's work runs on threads
THREADS = pytest.mark.parametrize("how", ["pool", "thread"])
#: renewals every 400 ms of a 4 s lease: the self-kill's delay is 0.4 s (half the 400 ms
#: margin and half a renew interval), a check interval 0.1 s
LEASE = {"RQ_EMQ_LEASE_MS": "4000", "RQ_EMQ_RENEW_INTERVAL_MS": "400"}
SETTINGS = LeaseSettings(lease_ms=4000, renew_interval_ms=400)
#: the second worker: takes a job at once when it is back in the queue
TAKER = {"RQ_EMQ_LEASE_MS": "5000", "RQ_EMQ_RENEW_INTERVAL_MS": "500"}
#: the first run's threads would work this long: only the end of their process ends them
RUN_S = 30.0
#: a later run only has to finish
LATER_S = 0.3
#: slack on every bound below: a loaded 2-core host's late timers and scheduling
SLACK = 4


def _end_bound_s() -> float:
    """How long after a stop the process ends at the latest: the self-kill's delay, and
    then a check interval for the watchdog, should no thread of it run."""
    delay = (SETTINGS.lease_margin_ms + SETTINGS.renew_interval_ms) / 2000
    return delay + SETTINGS.lease_check_interval_s


def _start(r: redis.Redis, procs: Processes, redis_url: str, log: str) -> tuple[Popen, Popen]:
    """The first worker (running the job, its threads ticking), then the second, idle."""
    worker = procs.worker(redis_url, worker_class="rq_emq.SimpleLeaseWorker", **LEASE)
    wait_for(lambda: len(runs(log)) > 3, timeout=15, what="the first run's threads to tick")
    taker = procs.worker(redis_url, worker_class="rq_emq.SimpleLeaseWorker", **TAKER)
    wait_for(lambda: len(Worker.all(connection=r)) == 2, timeout=15, what="the second worker")
    time.sleep(0.3)  # registered, then blocked on the queue
    return worker, taker


def _old_run_over_before_the_next(log: str, old_pid: int) -> None:
    spans = run_spans(log)
    later = [start for pid, (start, _) in spans.items() if pid != old_pid]
    assert later, f"the job was not run again: {spans}"
    overlap_ms = 1000 * (spans[old_pid][1] - min(later))
    assert overlap_ms < 0, f"the old run's threads ticked {overlap_ms:.0f} ms into the next run"


@THREADS
def test_a_cold_stop_of_a_job_working_on_threads_hands_it_back_once_its_process_is_gone(
    r: redis.Redis, procs: Processes, redis_url: str, tmp_path: Path, how: str
) -> None:
    log = str(tmp_path / "runs.log")
    job = Queue(connection=r).enqueue("thread_jobs.threaded_run", log, RUN_S, how, LATER_S, job_timeout=120)
    worker, taker = _start(r, procs, redis_url, log)
    worker.send_signal(signal.SIGTERM)  # warm: would wait for the job
    time.sleep(1.3)  # RQ ignores a second signal within 1 s of the first
    worker.send_signal(signal.SIGTERM)
    cold_at = time.monotonic()
    assert worker.wait(timeout=SLACK * _end_bound_s() + 10) == 0, procs.log(worker)  # a stock cold stop's
    ended_s = time.monotonic() - cold_at
    wait_for(lambda: status(r, job.id) == "finished", timeout=30, what="the job to finish")
    _old_run_over_before_the_next(log, worker.pid)
    assert ended_s < SLACK * _end_bound_s(), f"the worker ended {ended_s:.2f} s after the cold stop"
    # handed back by the watchdog, the attempt refunded: the second run is attempt 1
    assert stat(r, "default", "returned") == 1 and stat(r, "default", "crashed") == 0
    assert f"({job.id}), attempt 1" in procs.log(taker), procs.log(taker)
    said = procs.log(worker)
    assert "stopped cold; ending the worker process" in said, said
    assert f"job {job.id} back at the front of its queue (cold stop: attempt refunded)" in said, said
    assert len(Worker.all(connection=r)) == 1  # its death is registered: `rq info` lists the other only


@THREADS
def test_a_lost_lease_ends_the_worker_process_and_its_jobs_threads_with_a_non_zero_exit(
    r: redis.Redis, procs: Processes, redis_url: str, tmp_path: Path, how: str
) -> None:
    """The lease taken away (recovered elsewhere: the job may run there already). Before,
    the interrupted frame unwound, the threads ticked on, and the worker took its next job."""
    log = str(tmp_path / "runs.log")
    job = Queue(connection=r).enqueue("thread_jobs.threaded_run", log, RUN_S, how, LATER_S, job_timeout=120)
    worker = procs.worker(redis_url, worker_class="rq_emq.SimpleLeaseWorker", **LEASE)
    wait_for(lambda: len(runs(log)) > 3, timeout=15, what="the run's threads to tick")
    taken_at = time.monotonic()
    take_away(r, job.id, status="queued")
    # found lost within a renew interval, then the process ends
    bound = SETTINGS.renew_interval_ms / 1000 + _end_bound_s()
    wait_for(lambda: worker.poll() is not None, timeout=SLACK * bound + 10, what="the worker to end")
    assert worker.returncode == 1, procs.log(worker)
    last = run_spans(log)[worker.pid][1]
    assert last - taken_at < SLACK * bound, f"its threads ticked {last - taken_at:.2f} s after the loss"
    assert "stopped, its lease lost; ending the worker process" in procs.log(worker), procs.log(worker)
    # its watchdog, seeing it gone, left the job to its new holder
    wait_for(
        lambda: "left as it is (its lease was lost)" in procs.log(worker), timeout=10, what="the watchdog"
    )
    assert Worker.all(connection=r) == []  # its death is registered: `rq info` lists it no more
