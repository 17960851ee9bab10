"""A horse whose run is over hands its worker back the Redis connection it was lent: the
worker goes on with the same connection, job after job, instead of a connect and a
handshake each (rq_emq/connection/budget.py, rq_emq/run/horse_end.py). Only a connection
as the worker's pool would hand it out comes back; one with a reply nobody read, or one
of a horse that died, never does. Real forks, real processes, a real redis-server."""

from __future__ import annotations

import os
import select
import signal
from collections.abc import Callable
from typing import Any

import pytest
import redis
from procs import Processes, wait_for
from rq import Queue

from rq_emq.connection.budget import WorkConnectionLender, control_client
from rq_emq.run.horse_end import HorseEnd
from rq_emq.testing import RedisServer

pytestmark = pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="Linux 5.3+ with Python 3.9+ only")

#: Nothing recovers or renews between the steps of these tests.
QUIET = {"RQ_EMQ_LEASE_MS": "600000", "RQ_EMQ_SWEEP_INTERVAL_MS": "60000"}


def connections_received(r: redis.Redis) -> int:
    return int(r.info("stats")["total_connections_received"])


@pytest.mark.parametrize(("function", "ends"), [("jobs.noop", "finished"), ("jobs.fail", "failed")])
@pytest.mark.parametrize("worker_class", ["rq_emq.LeaseWorker", "rq_emq.SimpleLeaseWorker"])
def test_a_lease_worker_runs_job_after_job_on_the_connection_its_horses_hand_back(
    own_server: RedisServer, procs: Processes, worker_class: str, function: str, ends: str
) -> None:
    """Stock RQ's horse connects anew for every job; so did our worker after each run. The
    proof that the connection comes back as lent rides the finish's round trips, failed
    or not (rq_emq/connection/lent_state.py): no connect per job. A SimpleLeaseWorker
    keeps its connection the same way."""
    r = redis.Redis.from_url(own_server.url)
    queue = Queue(connection=r)
    worker = procs.worker(own_server.url, worker_class=worker_class, **QUIET)
    warm_up = queue.enqueue(function)
    wait_for(lambda: warm_up.get_status(refresh=True) == ends, timeout=30, what="the warm-up job")
    before = connections_received(r)
    jobs = [queue.enqueue(function) for _ in range(20)]
    wait_for(
        lambda: all(job.get_status(refresh=True) == ends for job in jobs),
        timeout=60,
        what="the jobs to finish",
    )
    opened = connections_received(r) - before
    # slack: none of the worker's three connections is expected to open again in these
    # seconds; a connect per job would be 20
    assert opened <= 2, (opened, procs.log(worker))


def _finish(c: redis.Redis) -> None:
    """The horse's finish as RQ's ends it: a transaction, after the job's code."""
    with c.pipeline() as pipe:
        pipe.set("finished", "by the horse").execute()


def _run_in_a_horse(
    url: str, horse: Callable[[redis.Redis], Any], protocol: int = 2, finish: bool = True
) -> tuple[redis.Redis, WorkConnectionLender, int, bool]:
    """A worker's client and lender around one real fork: the horse adopts the lent
    connection, runs ``horse`` (the job), then, as a LeaseWorker's does, shows the lent
    connection's state on its finish's round trip, and tells its end. Returns the
    client, the lender, the lent connection's id and whether the horse told its end."""
    client = redis.Redis.from_url(url, protocol=protocol)
    lender = WorkConnectionLender(client, control_client(client))
    lent_id = int(client.client_id())
    horse_end = HorseEnd()
    lender.before_fork()
    horse_end.before_fork()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the horse)
        try:
            horse_end.in_horse()
            lender.adopt()
            horse(client)
            lender.prove_state()
            if finish:
                _finish(client)
            horse_end.tell_done(client, lender.hand_back())
        finally:
            os._exit(0)
    horse_end.forked(pid)
    lender.lent()
    told = horse_end.wait_told(pid)
    lender.returned(horse_end.take_handed_back())
    os.waitpid(pid, 0)
    horse_end.close()
    return client, lender, lent_id, told


def test_a_horse_hands_back_the_connection_it_used_and_the_worker_goes_on_with_it(
    own_server: RedisServer,
) -> None:
    client, lender, lent_id, told = _run_in_a_horse(
        own_server.url, lambda c: c.set("written", "by the horse")
    )
    assert told and lender.handed_back == 1
    assert int(client.client_id()) == lent_id
    assert client.get("written") == b"by the horse"


@pytest.mark.parametrize("protocol", [2, 3])
def test_a_connection_with_a_reply_nobody_read_is_not_handed_back(
    own_server: RedisServer, protocol: int
) -> None:
    """With RESP3 redis-py's pool hands out a connection without looking for unread data:
    one handed back so would answer the worker's next command with the job's reply."""

    def leaves_a_reply_unread(c: redis.Redis) -> None:
        connection = c.connection_pool.get_connection()
        connection.send_command("ECHO", "the job's reply")
        # arrived, and unread (one still in flight is seen neither here nor by redis-py's
        # own pool check: the limit stated in WorkConnectionLender.hand_back)
        select.select([connection._sock], [], [], 5)
        c.connection_pool.release(connection)

    client, lender, lent_id, told = _run_in_a_horse(
        own_server.url, leaves_a_reply_unread, protocol, finish=False
    )
    assert told and lender.handed_back == 0
    assert client.echo("the worker's") == b"the worker's"
    assert int(client.client_id()) != lent_id


def test_a_horse_that_dies_takes_its_connection_with_it(own_server: RedisServer) -> None:
    """The worker closed its copy at the fork: nothing holds a dead horse's connection open
    (a blocking command of its job would otherwise stay in Redis and take data)."""
    r = redis.Redis.from_url(own_server.url)

    def dies_blocked(c: redis.Redis) -> None:
        connection = c.connection_pool.get_connection()
        connection.send_command("BLPOP", "never-pushed", 0)
        os.kill(os.getpid(), signal.SIGKILL)

    client, lender, lent_id, told = _run_in_a_horse(own_server.url, dies_blocked)
    assert not told and lender.handed_back == 0
    wait_for(
        lambda: not r.execute_command("CLIENT", "LIST", "ID", lent_id),
        timeout=5,
        what="the dead horse's connection closed",
    )
    r.rpush("never-pushed", "kept")
    assert r.lrange("never-pushed", 0, -1) == [b"kept"]
    assert client.ping() and int(client.client_id()) != lent_id
