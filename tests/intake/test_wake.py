"""The idle wait on several queues: one blocked BLMOVE per queue, one worker woken per push,
a second job that arrived at the same moment handed back, nothing left behind.

In-process against a real redis-server; the same with real ``rq worker`` processes is in
``test_fleet_processes.py``."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from rq_emq.intake.take import Taker
from rq_emq.keys import QueueKeys
from rq_emq.settings import LeaseSettings

QUEUES = ["q0", "q1", "q2"]


def _job(r: redis.Redis, job_id: str) -> None:
    r.hset(f"rq:job:{job_id}", mapping={"status": "queued", "origin": "q"})


def _blocked_clients(r: redis.Redis) -> list[dict[str, object]]:
    return [c for c in r.client_list() if "b" in str(c.get("flags")) and c.get("cmd") == "blmove"]


def _later(seconds: float, action: object) -> threading.Timer:
    timer = threading.Timer(seconds, action)  # type: ignore[arg-type]
    timer.start()
    return timer


def test_an_idle_taker_blocks_on_every_queue_and_wakes_on_a_push_to_any(r: redis.Redis) -> None:
    taker = Taker(r, "w1", LeaseSettings())
    _job(r, "j2")
    _later(0.5, lambda: r.rpush("rq:queue:q2", "j2"))
    watcher = redis.Redis(connection_pool=redis.ConnectionPool.from_url(_url(r)))
    seen: list[int] = []
    _later(0.3, lambda: seen.append(len(_blocked_clients(watcher))))
    started = time.monotonic()
    taken = taker.take(QUEUES, timeout=10)
    assert taken is not None and taken.job_id == "j2" and taken.queue_index == 2
    assert time.monotonic() - started < 3
    assert seen == [3]  # one blocked BLMOVE per queue while idle
    assert _blocked_clients(watcher) == []  # the other two were cancelled
    assert all(r.llen(QueueKeys(q).moving) == 0 for q in QUEUES)


def test_two_queues_handing_over_a_job_at_once_claim_the_first_and_hand_back_the_other(
    r: redis.Redis,
) -> None:
    taker = Taker(r, "w1", LeaseSettings())
    for job_id in ("a", "b"):
        _job(r, job_id)

    def both_at_once() -> None:
        pipe = r.pipeline(transaction=True)  # served together after EXEC: both waits win
        pipe.rpush("rq:queue:q2", "b")
        pipe.rpush("rq:queue:q0", "a")
        pipe.execute()

    _later(0.3, both_at_once)
    taken = taker.take(QUEUES, timeout=10)
    assert taken is not None and (taken.job_id, taken.queue_index) == ("a", 0)  # queue order wins
    assert r.lrange("rq:queue:q2", 0, -1) == [b"b"]  # handed back to the head of its queue
    assert all(r.llen(QueueKeys(q).moving) == 0 for q in QUEUES)
    again = taker.take(QUEUES, timeout=1)
    assert again is not None and again.job_id == "b"


def test_a_wait_that_times_out_leaves_no_blocked_client_and_moves_nothing(r: redis.Redis) -> None:
    taker = Taker(r, "w1", LeaseSettings())
    started = time.monotonic()
    assert taker.take(QUEUES, timeout=0.5) is None
    assert 0.4 < time.monotonic() - started < 3
    assert _blocked_clients(r) == []


def test_a_stop_during_the_wait_hands_back_a_job_moved_meanwhile(r: redis.Redis) -> None:
    # the wait is interrupted after Redis moved a job for it (as RQ's SIGTERM handler does)
    taker = Taker(r, "w1", LeaseSettings())
    _job(r, "j")
    real_ready = taker._wait.start

    class Stop(Exception):
        pass

    def start(queues: list[QueueKeys], timeout: float) -> object:
        waiting = real_ready(queues, timeout)
        r.rpush("rq:queue:q1", "j")
        time.sleep(0.2)  # Redis has served the wait: the job sits in q1's moving list

        def interrupted(timeout: float) -> bool:
            raise Stop

        waiting.ready = interrupted  # type: ignore[method-assign]
        return waiting

    taker._wait.start = start  # type: ignore[method-assign]
    try:
        taker.take(QUEUES, timeout=10)
    except Stop:
        pass
    else:
        raise AssertionError("the stop did not reach the caller")
    assert r.lrange("rq:queue:q1", 0, -1) == [b"j"]
    assert r.llen(QueueKeys("q1").moving) == 0
    assert _blocked_clients(r) == []


def test_without_client_unblock_a_wait_is_cancelled_by_closing_and_loses_nothing(r: redis.Redis) -> None:
    taker = Taker(r, "w1", LeaseSettings())
    taker._wait.can_unblock = False  # as under an ACL refusing CLIENT ID / CLIENT UNBLOCK
    for job_id in ("a", "b"):
        _job(r, job_id)
    _later(0.3, lambda: r.rpush("rq:queue:q1", "a"))
    taken = taker.take(QUEUES, timeout=10)
    assert taken is not None and taken.job_id == "a"
    wait_gone = time.monotonic() + 5
    while _blocked_clients(r) and time.monotonic() < wait_gone:
        time.sleep(0.02)
    assert _blocked_clients(r) == []  # the closed waits are gone: a later push stays queued
    r.rpush("rq:queue:q0", "b")
    time.sleep(0.2)
    assert r.lrange("rq:queue:q0", 0, -1) == [b"b"]


def test_an_idle_worker_keeps_one_connection_per_queue_and_reuses_them(r: redis.Redis) -> None:
    taker = Taker(r, "w1", LeaseSettings())
    before = len(r.client_list())
    for _ in range(3):
        assert taker.take(QUEUES, timeout=0.2) is None
    pool = r.connection_pool
    assert len(r.client_list()) - before <= len(QUEUES) + 1  # the pool's, reused: no churn
    assert len(pool._available_connections) + len(pool._in_use_connections) <= len(QUEUES) + 2  # type: ignore[attr-defined]


def _url(r: redis.Redis) -> str:
    kwargs = r.connection_pool.connection_kwargs
    return f"redis://{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}/{kwargs.get('db', 0)}"


def test_a_wait_whose_connection_was_reset_raises_a_connection_error(r: redis.Redis) -> None:
    """Seen under load across a Redis restart: a blocked wait's connection was reset, and
    redis-py's readiness check (``can_read``) dropped the connection as it raised. The read
    that followed hit redis-py's torn-down parser (AttributeError), which ended the worker.
    It is connection trouble like any other, and the take retries it."""
    from rq_emq.intake.wake import QueueWait

    waiting = QueueWait(r).start([QueueKeys("q0")], timeout=10)
    connection = waiting._blocked[0].connection

    def reset(timeout: float = 0) -> bool:  # what redis-py does on ECONNRESET in can_read
        connection.disconnect()
        raise redis.ConnectionError("Error while reading from Redis: (104, 'Connection reset by peer')")

    connection.can_read = reset
    with pytest.raises(redis.ConnectionError):
        waiting.collect()
