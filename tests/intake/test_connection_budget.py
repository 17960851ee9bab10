"""Three connections per worker at any queue count, idle or running, its horse's included;
and the idle watch of several queues that makes it so, through its watcher's death and stop.

Real ``rq worker`` processes and a real redis-server; a connection count is Redis's own
(``CLIENT LIST``), not a timing. The wait itself: :mod:`rq_emq.intake.watch`; the budget:
:mod:`rq_emq.connection.budget`."""

from __future__ import annotations

import os
import signal
import time

import pytest
import redis
from helpers import redis_quiet, wait_status
from procs import Processes, blocked_clients, wait_for
from rq import Queue
from rq.job import Job, JobStatus

from rq_emq.keys import sweeper_election_key, wake_key, watch_key
from rq_emq.testing import RedisServer

pytestmark = pytest.mark.slow

QUEUES = ("q0", "q1", "q2")
ELECTION = sweeper_election_key(list(QUEUES))
#: Nothing recovers or renews between the steps of these tests.
QUIET = {"RQ_EMQ_LEASE_MS": "600000", "RQ_EMQ_SWEEP_INTERVAL_MS": "60000"}
#: A watch that lapses within a second and a half, and a sweeper that looks as often.
SHORT = {"RQ_EMQ_LEASE_MS": "1500", "RQ_EMQ_RENEW_INTERVAL_MS": "200", "RQ_EMQ_SWEEP_INTERVAL_MS": "313"}


def clients_besides(r: redis.Redis, before: set[str]) -> int:
    return len([c for c in r.client_list() if c["id"] not in before])


@pytest.mark.parametrize("worker_class", ["rq_emq.LeaseWorker", "rq_emq.SimpleLeaseWorker"])
@pytest.mark.parametrize("queue_count", [1, 3, 10])
def test_a_worker_holds_three_connections_idle_and_running_on_any_number_of_queues(
    worker_class: str, queue_count: int, own_server: RedisServer, procs: Processes
) -> None:
    """Stock RQ holds two idle and three running (its horse's); a wait per queue held
    ``k + 2`` idle and ``k + 3`` running."""
    r = redis.Redis.from_url(own_server.url)
    before = {c["id"] for c in r.client_list()}
    queues = [f"c{i}" for i in range(queue_count)]
    worker = procs.worker(own_server.url, *queues, worker_class=worker_class, **QUIET)
    wait_for(
        lambda: (
            (blocked_clients(r, "blmove") == 1) if queue_count == 1 else r.exists(watch_key(_set(queues)))
        ),
        timeout=30,
        what="the worker waiting",
    )
    idle = clients_besides(r, before)
    job = Queue(queues[-1], connection=r).enqueue("time.sleep", 3)
    wait_status(r, job.id, "started", timeout=20)
    running = clients_besides(r, before)
    print(f"{worker_class} on {queue_count} queues: {idle} connections idle, {running} running")
    assert idle <= 3 and running <= 3, (idle, running, procs.log(worker))
    wait_status(r, job.id, "finished", timeout=20)
    assert clients_besides(r, before) <= 3


def _set(queues: list[str]) -> str:
    return sweeper_election_key(queues)


def test_under_a_client_limit_of_20_six_workers_on_three_queues_run_six_jobs_at_once(
    own_server: RedisServer, procs: Processes
) -> None:
    """As many as stock RQ's workers (three connections each while running), under the
    limit a Heroku mini plan sets: 18 connections, this test's own the nineteenth, and one
    to spare for the moment a finished horse's connection is closing while its worker
    opens its own again."""
    r = redis.Redis.from_url(own_server.url)
    r.config_set("maxclients", 20)
    workers = [procs.worker(own_server.url, *QUEUES, **QUIET) for _ in range(6)]
    wait_for(lambda: _idle_watching(r) == 6, timeout=90, what="six idle workers")
    jobs = [Queue(QUEUES[i % 3], connection=r).enqueue("time.sleep", 10) for i in range(6)]
    wait_for(
        lambda: all(Job.fetch(j.id, connection=r).get_status() == "started" for j in jobs),
        timeout=30,
        what="six jobs started at once",
    )
    for job in jobs:
        wait_status(r, job.id, "finished", timeout=30)
    # a worker opens its work connection again as its horse ends, which may for a moment
    # overlap the horse's closing one: at the very cap that connect is refused and retried
    # (seen twice under a loaded CI stage), and no job waits for it
    print(f"connections refused at the cap: {r.info('stats')['rejected_connections']}")
    for worker in workers:
        assert worker.poll() is None, procs.log(worker)


def quiet(r: redis.Redis, for_s: float = 0.3, timeout: float = 20.0) -> None:
    """Until Redis has run no command for ``for_s`` (this test's own INFO aside)."""
    redis_quiet(r, for_s, timeout)


def _idle_watching(r: redis.Redis) -> int:
    """The standbys blocked on the wake list, and the watcher once nothing waits to be handed on."""
    watching = r.exists(watch_key(ELECTION)) and not r.exists(wake_key(ELECTION))
    return blocked_clients(r, "blpop") + int(bool(watching))


def _watcher_pid(r: redis.Redis, names: dict[str, int]) -> int | None:
    """The pid of the worker holding the watch (its token ends with its name), if any."""
    token = r.get(watch_key(ELECTION))
    if token is None:
        return None
    holder = token.decode().split(":", 1)[-1]
    return names.get(holder)


def _fleet(procs: Processes, url: str, r: redis.Redis, n: int, **env: str) -> dict[str, int]:
    names = {}
    for i in range(n):
        name = f"fleet-{i}"
        names[name] = procs.worker(url, *QUEUES, name=name, **env).pid
    wait_for(lambda: _idle_watching(r) == n, timeout=60, what=f"{n} idle workers")
    return names


def test_a_push_to_an_idle_set_is_taken_by_its_watcher_and_no_standby_wakes(
    redis_url: str, r: redis.Redis, procs: Processes
) -> None:
    names = _fleet(procs, redis_url, r, 3, **QUIET)
    watcher = _watcher_pid(r, names)
    assert watcher is not None
    for queue in QUEUES:
        quiet(r)  # the watcher back in its wait, its last job's bookkeeping done
        job = Queue(queue, connection=r).enqueue("jobs.add", 1, 1)
        wait_status(r, job.id, "finished", timeout=20)
        ran_on = Job.fetch(job.id, connection=r).worker_name
        assert names[ran_on] == watcher, (ran_on, names)
    assert blocked_clients(r, "blpop") == 2  # the standbys slept through it


def test_a_busy_watcher_wakes_a_standby_for_the_next_job(
    redis_url: str, r: redis.Redis, procs: Processes
) -> None:
    names = _fleet(procs, redis_url, r, 2, **QUIET)
    watcher = _watcher_pid(r, names)
    slow = Queue("q0", connection=r).enqueue("time.sleep", 5)
    wait_status(r, slow.id, "started", timeout=20)
    quick = Queue("q2", connection=r).enqueue("jobs.add", 1, 1)
    wait_status(r, quick.id, "finished", timeout=4)  # not behind the 5 s run
    assert names[Job.fetch(quick.id, connection=r).worker_name] != watcher
    wait_status(r, slow.id, "finished", timeout=20)


def test_a_killed_watcher_is_replaced_within_its_hold_and_a_sweeper_renewal(
    redis_url: str, r: redis.Redis, procs: Processes
) -> None:
    """The watch lapses (1.5 s), the sweeper of the set finds it vacant and pushes a token,
    and a standby watches: a job pushed after the kill is taken without a standby's own
    wait running out (2 leases is 3 s here; the bound asserted is hold + the sweeper's
    idle look, with a second of slack for a loaded host)."""
    names = _fleet(procs, redis_url, r, 3, **SHORT)
    watcher = _watcher_pid(r, names)
    assert watcher is not None
    os.killpg(watcher, signal.SIGKILL)
    job = Queue("q1", connection=r).enqueue("jobs.add", 1, 1)
    wait_status(r, job.id, "finished", timeout=1.5 + 0.75 + 1.0 + 3.0)
    assert names[Job.fetch(job.id, connection=r).worker_name] != watcher
    wait_for(lambda: _watcher_pid(r, names) not in (None, watcher), timeout=5, what="a new watcher")


def test_a_stopping_watcher_hands_the_watch_on_at_once(
    redis_url: str, r: redis.Redis, procs: Processes
) -> None:
    names = _fleet(procs, redis_url, r, 2, **QUIET)  # a watch held for 10 minutes
    watcher = _watcher_pid(r, names)
    assert watcher is not None
    os.kill(watcher, signal.SIGTERM)
    wait_for(
        lambda: _watcher_pid(r, names) not in (None, watcher), timeout=10, what="the other worker watching"
    )
    job = Queue("q1", connection=r).enqueue("jobs.add", 1, 1)
    wait_status(r, job.id, "finished", timeout=10)


def test_a_busy_watcher_wakes_standbys_while_any_queue_holds_a_job_not_only_the_one_written(
    redis_url: str, r: redis.Redis, procs: Processes
) -> None:
    """Four jobs pushed in one transaction (one invalidation names q0, q1 and q2): the
    watcher takes q0's first and is busy; each take it then hears (q0 again, which the
    second take leaves empty) must wake a standby while q1 and q2 still hold jobs. Before,
    the wake looked only at the queue the write named, and the chain stopped there: q1's
    and q2's jobs waited for a standby's own wait to run out (two leases)."""
    names = _fleet(procs, redis_url, r, 4, **QUIET)
    jobs = []
    for queue in ("q0", "q0", "q1", "q2"):
        job = Job.create("time.sleep", args=(6,), connection=r, origin=queue, status=JobStatus.QUEUED)
        job.save()
        jobs.append(job)
    pipe = r.pipeline(transaction=True)
    for job in jobs:
        pipe.sadd("rq:queues", f"rq:queue:{job.origin}")
        pipe.rpush(f"rq:queue:{job.origin}", job.id)
    pipe.execute()
    wait_for(
        lambda: all(Job.fetch(j.id, connection=r).get_status() == "started" for j in jobs),
        timeout=5,
        what="the four jobs started together, one per worker",
    )
    assert len({Job.fetch(j.id, connection=r).worker_name for j in jobs}) == 4, names


def test_a_watcher_whose_pubsub_connection_reconnected_hears_the_next_push_at_once(
    redis_url: str, r: redis.Redis, procs: Processes
) -> None:
    """The tracking redirects to RQ's pubsub connection: when that connection drops and
    redis-py connects it again (a restart or a failover it rode out), the watcher tracks
    again at once, not at its next keep (a third of its 10-minute hold here: a push would
    wait that long, or for the next push)."""
    names = _fleet(procs, redis_url, r, 1, **QUIET)
    assert _watcher_pid(r, names) is not None

    def pubsub_ids() -> set[int]:
        listed = r.client_list(_type="pubsub")
        return {int(c["id"]) for c in listed if c.get("name", "").startswith("rq-emq-pubsub-")}

    (before,) = pubsub_ids()
    # the watch key is held a round trip or two before the tracking starts: a kill in between
    # would leave nothing to re-track, and the test could not tell a deaf watcher
    wait_for(
        lambda: any(c.get("redir", str(before)) == str(before) for c in r.client_list(_type="normal")),
        timeout=10,
        what="the tracking redirected to the pubsub connection",
    )
    r.client_kill_filter(_id=str(before))
    wait_for(lambda: pubsub_ids() - {before}, timeout=10, what="the pubsub connected again")
    time.sleep(0.5)  # the watcher's look after the reconnect (nothing yet)
    job = Queue("q1", connection=r).enqueue("jobs.add", 1, 1)
    wait_status(r, job.id, "finished", timeout=10)
