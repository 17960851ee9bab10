"""`rq suspend` and `rq resume` under our workers: RQ's check before each take rides in the
take's own round trip (rq_emq.run.dequeue), and the take refuses while suspended."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
import redis
from helpers import status, wait_status
from jobs import runs
from procs import Processes, wait_for
from rq import Queue
from rq.suspension import resume, suspend

from rq_emq import SimpleLeaseWorker
from rq_emq.intake.take import Between, Taker, WorkersSuspended
from rq_emq.keys import QueueKeys
from rq_emq.settings import LeaseSettings

WORKERS = ["rq_emq.LeaseWorker", "rq_emq.SimpleLeaseWorker"]


def test_a_take_carrying_rqs_check_refuses_while_suspended_and_leaves_the_job_queued(r: redis.Redis) -> None:
    job = Queue("q", connection=r).enqueue("jobs.noop")
    worker = SimpleLeaseWorker(["q"], connection=r, name="w")
    worker.register_birth()
    worker.set_state("busy")
    taker = Taker(r, "w", LeaseSettings())

    def owed() -> Between | None:
        worker._suspension_owed = False  # as RQ's work loop leaves it to the take
        worker.hold_state("idle")
        return worker._owed_check()

    suspend(r)
    with pytest.raises(WorkersSuspended):
        taker.take([QueueKeys("q")], None, between=owed())
    assert r.lrange("rq:queue:q", 0, -1) == [job.id.encode()]
    assert r.hget(worker.key, "state") == b"idle"  # what rode with the check landed
    resume(r)
    taken = taker.take([QueueKeys("q")], None, between=owed())
    assert taken is not None and taken.job_id == job.id
    assert worker._suspension_owed is None


def test_a_take_whose_heartbeat_and_state_fail_still_takes_its_job_and_holds_the_state_again(
    r: redis.Redis,
) -> None:
    """What rides with a take is the worker's bookkeeping: an error there (a worker key of
    another type) is logged, never raised over a job the same round trip leased."""
    job = Queue("q", connection=r).enqueue("jobs.noop")
    worker = SimpleLeaseWorker(["q"], connection=r, name="w")
    r.set(worker.key, "not a hash")
    worker._suspension_owed = False
    worker.hold_state("idle")
    taken = Taker(r, "w", LeaseSettings()).take([QueueKeys("q")], None, between=worker._owed_check())
    assert taken is not None and taken.job_id == job.id
    assert worker._state_pending == "idle" and worker._suspension_owed is False


@pytest.mark.slow
@pytest.mark.parametrize("worker_class", WORKERS)
def test_rq_suspend_stops_a_backlog_after_the_running_job_and_rq_resume_takes_the_rest(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path, worker_class: str
) -> None:
    log = str(tmp_path / "first.log")
    queue = Queue("q", connection=r)
    first = queue.enqueue("jobs.sleep_and_record", log, 1.0)
    rest = [queue.enqueue("jobs.noop") for _ in range(5)]
    worker = procs.worker(redis_url, "q", worker_class=worker_class)
    wait_for(lambda: runs(log), what="the first job to start")
    suspend(r)
    wait_status(r, first.id, "finished")
    time.sleep(1.5)  # RQ's check looks once a second: time for a take it let through
    assert [status(r, job.id) for job in rest] == ["queued"] * 5, procs.log(worker)
    assert [r.hget(key, "state") for key in r.smembers("rq:workers")] == [b"suspended"], procs.log(worker)
    resume(r)
    for job in rest:
        wait_status(r, job.id, "finished")


@pytest.mark.slow
@pytest.mark.parametrize("worker_class", WORKERS)
def test_a_burst_worker_suspended_within_a_backlog_exits_after_the_running_job(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path, worker_class: str
) -> None:
    """As RQ's own burst worker: `rq worker` refuses to start while suspended, and one
    suspended later exits at its next take, the rest left queued."""
    log = str(tmp_path / "first.log")
    queue = Queue("q", connection=r)
    first = queue.enqueue("jobs.sleep_and_record", log, 1.0)
    rest = [queue.enqueue("jobs.noop") for _ in range(3)]
    worker = procs.worker(redis_url, "q", worker_class=worker_class, burst=True)
    wait_for(lambda: runs(log), what="the first job to start")
    suspend(r)
    assert worker.wait(timeout=30) == 0, procs.log(worker)
    assert "suspended in burst mode" in procs.log(worker).lower()  # RQ 2.0 capitalises it
    assert status(r, first.id) == "finished"
    assert [status(r, job.id) for job in rest] == ["queued"] * 3


@pytest.mark.slow
@pytest.mark.parametrize("worker_class", WORKERS)
def test_a_worker_waiting_out_a_suspension_stops_on_sigterm_and_takes_nothing(
    r: redis.Redis, redis_url: str, procs: Processes, worker_class: str
) -> None:
    """An idle worker's wait takes a job pushed after `rq suspend` (as RQ's own blocking
    wait does); the check after that job finds the suspension, and RQ's wait for a resume
    ends on the stop."""
    queue = Queue("q", connection=r)
    worker = procs.worker(redis_url, "q", worker_class=worker_class)
    wait_for(lambda: r.smembers("rq:workers"), what="the worker registered")
    suspend(r)
    queue.enqueue("jobs.noop")  # wakes it, unless its first take already met the suspension
    wait_for(
        lambda: [r.hget(key, "state") for key in r.smembers("rq:workers")] == [b"suspended"],
        what="the worker suspended",
    )
    jobs = [queue.enqueue("jobs.noop") for _ in range(3)]
    time.sleep(0.5)
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=15) == 0, procs.log(worker)
    assert [status(r, job.id) for job in jobs] == ["queued"] * 3
