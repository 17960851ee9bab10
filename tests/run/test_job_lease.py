"""The job's own lease (``rq_emq.current_lease()``), read by jobs that real ``rq worker``
processes run: its attempt and a fencing token that goes up on every grant (across a
crash, a recovery and RQ's ``Retry``), its local clock (``held``), a warm stop
(``stopping``), and a pipeline whose writes land only while the lease holds."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import redis
import rq
from helpers import FAST, status, wait_status
from lease_jobs import events
from procs import Processes, wait_for
from rq import Queue, Retry

import rq_emq
from rq_emq.keys import QueueKeys, job_key

pytestmark = pytest.mark.slow
RQ_3 = int(rq.__version__.split(".")[0]) >= 3
#: leases for SpawnWorker need RQ 3 (the worker refuses it on RQ 2)
SPAWNING = ["rq_emq.SpawnLeaseWorker"] if RQ_3 else []
FORKING = ["rq_emq.LeaseWorker", *SPAWNING]
EVERY_CLASS = pytest.mark.parametrize("worker_class", [*FORKING, "rq_emq.SimpleLeaseWorker"])


def runs_of(log: str) -> list[dict[str, object]]:
    return [event for event in events(log) if event["event"] == "run"]


def test_outside_a_leased_job_there_is_no_current_lease() -> None:
    assert rq_emq.current_lease() is None


@EVERY_CLASS
def test_a_job_reads_its_own_lease_attempt_and_fencing_token(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path, worker_class: str
) -> None:
    log = str(tmp_path / "lease.log")
    job = Queue(connection=r).enqueue("lease_jobs.record_lease", log)
    worker = procs.worker(redis_url, worker_class=worker_class, burst=True, **FAST)
    assert worker.wait(timeout=30) == 0, procs.log(worker)
    (seen,) = runs_of(log)
    assert seen["job_id"] == job.id and seen["attempt"] == 1 and seen["fencing_token"] == 1
    assert seen["held"] is True and seen["stopping"] is False
    assert status(r, job.id) == "finished"
    assert r.hget(job_key(job.id), "emq_fence") == b"1"  # the finish keeps the token


@pytest.mark.parametrize("worker_class", FORKING)
def test_the_fencing_token_goes_up_across_a_crash_and_its_recovery(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path, worker_class: str
) -> None:
    log = str(tmp_path / "lease.log")
    job = Queue(connection=r).enqueue("lease_jobs.record_lease_then_crash_first", log)
    worker = procs.worker(redis_url, worker_class=worker_class, burst=True, **FAST)
    assert worker.wait(timeout=30) == 0, procs.log(worker)
    seen = runs_of(log)
    assert [run["attempt"] for run in seen] == [1, 2]
    assert [run["fencing_token"] for run in seen] == [1, 2]
    assert status(r, job.id) == "finished"


def test_the_fencing_token_goes_up_across_a_worker_killed_and_the_sweeps_recovery(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path
) -> None:
    log = str(tmp_path / "lease.log")
    job = Queue(connection=r).enqueue("lease_jobs.until_stopping", log, 30.0)
    doomed = procs.worker(redis_url, **FAST)
    wait_for(lambda: runs_of(log), timeout=15, what="the first run")
    os.killpg(doomed.pid, signal.SIGKILL)  # the worker and its horse, with its watchdog
    procs.worker(redis_url, **FAST)
    wait_for(lambda: len(runs_of(log)) == 2, timeout=20, what="the run after the sweep's recovery")
    assert [run["fencing_token"] for run in runs_of(log)] == [1, 2]
    assert [run["attempt"] for run in runs_of(log)] == [1, 2]
    r.delete(job_key(job.id))  # the second run may end now (its job is gone)


@EVERY_CLASS
def test_the_fencing_token_goes_up_across_rqs_retry_while_the_attempts_start_over(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path, worker_class: str
) -> None:
    log = str(tmp_path / "lease.log")
    job = Queue(connection=r).enqueue("lease_jobs.record_lease_then_retry_first", log, retry=Retry(max=1))
    worker = procs.worker(redis_url, worker_class=worker_class, burst=True, **FAST)
    assert worker.wait(timeout=30) == 0, procs.log(worker)
    seen = runs_of(log)
    assert [run["fencing_token"] for run in seen] == [1, 2]
    assert [run["attempt"] for run in seen] == [1, 1]  # RQ's Retry is a normal end
    assert status(r, job.id) == "finished"


def _take_the_lease_away(r: redis.Redis, job_id: str) -> None:
    """What a sweep's recovery and another worker's take leave: another owner."""
    other = "another-holder-token"
    r.hset(job_key(job_id), "emq_token", other)
    r.set(QueueKeys("default").lock(job_id), other, px=60_000)


@EVERY_CLASS
def test_a_fenced_pipeline_writes_while_the_lease_holds_and_nothing_once_it_is_lost(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path, worker_class: str
) -> None:
    """With ``stop_on_lease_lost`` off the job runs on after its lease is taken: its
    fenced writes are refused in Redis at once (before its own clock knows), then its
    ``held`` turns false and ``raise_if_lost`` raises."""
    log, flag = str(tmp_path / "lease.log"), str(tmp_path / "taken")
    job = Queue(connection=r).enqueue("lease_jobs.fenced_writes_across_a_lost_lease", log, "effect", flag)
    worker = procs.worker(
        redis_url, worker_class=worker_class, burst=True, RQ_EMQ_STOP_ON_LEASE_LOST="false", **FAST
    )
    wait_for(lambda: any(e["event"] == "before" for e in events(log)), timeout=15, what="the first write")
    assert r.get("effect:before") == b"1" and r.get("effect:count") == b"1"
    _take_the_lease_away(r, job.id)
    Path(flag).touch()
    assert worker.wait(timeout=30) == 0, procs.log(worker)
    outcome = {e["event"]: e.get("outcome") for e in events(log)}
    assert outcome == {"before": None, "after": "refused", "lost": "raised"}, events(log)
    assert r.get("effect:after") is None and r.get("effect:count") == b"1"  # nothing of it landed


@EVERY_CLASS
def test_a_warm_stop_tells_the_running_job_which_ends_early_and_finishes(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path, worker_class: str
) -> None:
    log = str(tmp_path / "lease.log")
    job = Queue(connection=r).enqueue("lease_jobs.until_stopping", log, 20.0)
    worker = procs.worker(redis_url, worker_class=worker_class, **FAST)
    wait_for(lambda: runs_of(log), timeout=15, what="the job to start")
    assert runs_of(log)[0]["stopping"] is False
    os.kill(worker.pid, signal.SIGTERM)  # a warm shutdown: RQ lets the job finish
    assert worker.wait(timeout=15) == 0, procs.log(worker)
    assert events(log)[-1] == {"pid": events(log)[-1]["pid"], "event": "end", "stopping": True}
    wait_status(r, job.id, "finished")
    assert job.latest_result().return_value == "stopped early"  # type: ignore[union-attr]
