"""What a job does to its Redis connection dies with the job, as with stock RQ's horse: the
selected db, the authenticated user, the protocol, CLIENT TRACKING, the client name, CLIENT
REPLY, a subscription, an open MULTI or WATCH. A LeaseWorker lends its horse the work
connection and takes it back after the run (rq_emq/connection/budget.py); it takes back
only a connection whose last round trip showed it as lent (rq_emq/connection/lent_state.py),
and closes any other. Each kind of change, with fork ahead on and off, beside stock
``rq.Worker`` doing the same: the job's connection is closed once the run is over, every
later job runs, and the worker's heartbeat stays in db 0. Real ``rq worker`` processes, a
real redis-server."""

from __future__ import annotations

import os
import time

import pytest
import redis
from procs import Processes, wait_for
from rq import Queue
from state_jobs import CHANGED_KEY, CHANGES, JOB_CHANNEL, JOB_NAME, JOB_PASSWORD, JOB_USER

from rq_emq.testing import RedisServer

pytestmark = pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="Linux 5.3+ with Python 3.9+ only")

#: Nothing recovers or renews between the steps of these tests.
QUIET = {"RQ_EMQ_LEASE_MS": "600000", "RQ_EMQ_SWEEP_INTERVAL_MS": "60000"}
LATER_JOBS = 8
#: stock RQ runs the later jobs within about 2 s here; slack 10x for a loaded 2-core host
LATER_JOBS_S = 10 * 2.0
#: stock's horse takes its connections with it as it exits, within a second; slack 5x
CLOSED_S = 5 * 1.0

FORKING = {
    "stock": ("rq.Worker", {}),
    "fork ahead": ("rq_emq.LeaseWorker", QUIET),
    "fork ahead off": ("rq_emq.LeaseWorker", {**QUIET, "RQ_EMQ_FORK_AHEAD": "false"}),
}


def _with_a_job_user(url: str) -> redis.Redis:
    r = redis.Redis.from_url(url)
    r.execute_command("ACL", "SETUSER", JOB_USER, "on", f">{JOB_PASSWORD}", "~state-test:*", "&*", "+@all")
    return r


def _later_jobs_run(r: redis.Redis, procs: Processes, worker: object) -> None:
    queue = Queue(connection=r)
    jobs = [queue.enqueue("jobs.noop") for _ in range(LATER_JOBS)]
    wait_for(
        lambda: all(job.get_status(refresh=True) == "finished" for job in jobs),
        timeout=LATER_JOBS_S,
        what=f"the {LATER_JOBS} later jobs: {procs.log(worker)[-3000:]}",  # type: ignore[arg-type]
    )


def _heartbeat_in_db_0(r: redis.Redis, url: str, name: str) -> None:
    assert r.exists(f"rq:worker:{name}"), "the worker's heartbeat left db 0"
    in_db_1 = _db_1(url)
    assert in_db_1.keys("rq:*") == [], in_db_1.keys("rq:*")


def _db_1(url: str) -> redis.Redis:
    return redis.Redis.from_url(url.rsplit("/", 1)[0] + "/1")


def _closed(r: redis.Redis, connection_id: int) -> bool:
    return not r.execute_command("CLIENT", "LIST", "ID", connection_id)


def _warm(r: redis.Redis) -> None:
    job = Queue(connection=r).enqueue("jobs.noop")
    wait_for(lambda: job.get_status(refresh=True) == "finished", timeout=30, what="the warm-up job")


@pytest.mark.parametrize("kind", sorted(CHANGES))
@pytest.mark.parametrize("worker", sorted(FORKING))
def test_a_change_a_job_leaves_on_its_connection_dies_with_the_run(
    own_server: RedisServer, procs: Processes, worker: str, kind: str
) -> None:
    worker_class, env = FORKING[worker]
    r = _with_a_job_user(own_server.url)
    name = f"state-{kind}"
    process = procs.worker(own_server.url, worker_class=worker_class, name=name, **env)
    _warm(r)
    Queue(connection=r).enqueue("state_jobs.leave_changed_beside", kind)
    changed = int(wait_for(lambda: r.get(CHANGED_KEY), timeout=30, what="the changing job"))  # type: ignore[arg-type]
    wait_for(lambda: _closed(r, changed), timeout=CLOSED_S, what=f"the changed connection closed ({kind})")
    _later_jobs_run(r, procs, process)
    _heartbeat_in_db_0(r, own_server.url, name)
    clients = r.client_list()
    assert not [c for c in clients if c["name"] == JOB_NAME or c["user"] == JOB_USER], clients
    assert r.pubsub_numsub(JOB_CHANNEL) == [(JOB_CHANNEL.encode(), 0)]


@pytest.mark.parametrize("worker", sorted(FORKING))
def test_a_select_on_the_connection_the_finish_uses_never_reaches_the_worker(
    own_server: RedisServer, procs: Processes, worker: str
) -> None:
    """The job of issue 47: ``job.connection.select(1)``. Its own finish then goes to db
    1, with stock RQ too; the worker and every later job stay on db 0."""
    worker_class, env = FORKING[worker]
    r = _with_a_job_user(own_server.url)
    process = procs.worker(own_server.url, worker_class=worker_class, name="selects", **env)
    _warm(r)
    Queue(connection=r).enqueue("state_jobs.select_db_1")
    changed = int(wait_for(lambda: r.get(CHANGED_KEY), timeout=30, what="the selecting job"))  # type: ignore[arg-type]
    wait_for(lambda: _closed(r, changed), timeout=CLOSED_S, what="the selected connection closed")
    time.sleep(0.2)  # the run's end: its horse's last commands went to db 1
    _db_1(own_server.url).flushdb()
    _later_jobs_run(r, procs, process)
    _heartbeat_in_db_0(r, own_server.url, "selects")


def test_stock_simple_worker_keeps_the_connection_a_job_changed(
    own_server: RedisServer, procs: Processes
) -> None:
    """Stock's SimpleWorker keeps a connection its job changed (a SimpleLeaseWorker runs its
    job on its own connections the same way: docs/worker-classes.md)."""
    r = _with_a_job_user(own_server.url)
    procs.worker(own_server.url, worker_class="rq.SimpleWorker", name="stock-simple")
    _warm(r)
    job = Queue(connection=r).enqueue("state_jobs.leave_changed_beside", "name")
    changed = int(wait_for(lambda: r.get(CHANGED_KEY), timeout=30, what="the changing job"))  # type: ignore[arg-type]
    wait_for(lambda: job.get_status(refresh=True) == "finished", timeout=30, what="the changing job's end")
    time.sleep(CLOSED_S / 5)
    assert not _closed(r, changed)
