"""Fenced writes, driven directly against a real Redis (no worker process): a write to a
leased job lands only while its lease holds, a refused one changes nothing and is counted,
and what RQ's own transactions rely on (WATCH, scripts of their own) keeps working inside
the fence."""

from __future__ import annotations

import logging

import pytest
import redis
from helpers import leased_job
from rq import Queue
from rq.job import Job

import rq_emq
from rq_emq import SimpleLeaseWorker, scripts
from rq_emq.fence.fencing import Fence, LeaseLost, fenced
from rq_emq.keys import QueueKeys, job_key

pytestmark = pytest.mark.rq_versions


def test_a_fenced_transaction_commits_and_releases_the_lease(r: redis.Redis) -> None:
    job, lease = leased_job(r)
    q = QueueKeys("q")
    with fenced(r, lease.fence):
        pipe = r.pipeline()
        pipe.hset(job_key(job.id), "status", "finished")
        pipe.hgetall(job_key(job.id))
        pipe.zadd("rq:finished:q", {job.id: 1})
        replies = pipe.execute()
    assert replies[0] == 0 and replies[1][b"status"] == b"finished" and replies[2] == 1
    assert not r.exists(q.lock(job.id)) and r.zscore(q.leases, job.id) is None
    assert r.hget(job_key(job.id), "status") == b"finished"
    assert r.hget(job_key(job.id), "emq_attempts") is None


def test_a_releasing_commit_is_announced_the_moment_it_lands_and_a_refusal_is_not(r: redis.Redis) -> None:
    """What RQ does after its outcome's transaction (enqueuing the dependents it marked
    ready) is bookkeeping, not a run: the horse learns of the commit before it starts."""
    job, lease = leased_job(r)
    landed: list[bool] = []
    with fenced(r, lease.fence, on_commit=lambda: landed.append(True)):
        pipe = r.pipeline()
        pipe.hset(job_key(job.id), "status", "finished")
        pipe.execute()
        assert landed == [True]
        after = r.pipeline()
        after.rpush("rq:queue:q", "dependent")
        after.execute()
    assert landed == [True]
    other, stale = leased_job(r)
    r.hset(job_key(other.id), "emq_token", "someone-else")
    with fenced(r, stale.fence, on_commit=lambda: landed.append(False)):
        pipe = r.pipeline()
        pipe.hset(job_key(other.id), "status", "finished")
        with pytest.raises(LeaseLost):
            pipe.execute()
    assert landed == [True]


def test_a_late_finish_by_a_worker_that_lost_its_lease_changes_nothing(
    r: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    job, lease = leased_job(r)
    r.hset(job_key(job.id), "emq_token", "someone-else")
    before = r.hgetall(job_key(job.id))
    with caplog.at_level(logging.WARNING, logger="rq_emq.lease"), fenced(r, lease.fence):
        pipe = r.pipeline()
        pipe.hset(job_key(job.id), "status", "finished")
        pipe.zadd("rq:finished:q", {job.id: 1})
        with pytest.raises(LeaseLost):
            pipe.execute()
    assert r.hgetall(job_key(job.id)) == before
    assert not r.exists("rq:finished:q")
    assert job.id in caplog.text
    assert int(r.hget(QueueKeys("q").stats, "fenced")) == 1


def test_a_delayed_retry_refused_by_the_fence_schedules_nothing(r: redis.Redis) -> None:
    """RQ 2.x queues a delayed ``Retry``'s registry entry outside the transaction it is
    given; in a lease worker's process it rides in it, so a refused outcome leaves the job
    in no scheduled registry (the sweep hands it on: due there too, it would run twice)."""
    SimpleLeaseWorker(["q"], connection=r)  # what a lease worker's process installs
    job, lease = leased_job(r)
    job = Job.fetch(job.id, connection=r)
    job.retries_left, job.retry_intervals = 2, [600]
    r.hset(job_key(job.id), "emq_token", "someone-else")
    with fenced(r, lease.fence):
        pipe = r.pipeline()
        job.retry(Queue("q", connection=r), pipe)
        with pytest.raises(LeaseLost):
            pipe.execute()
    assert not r.exists("rq:scheduled:q")


def test_after_a_refused_transaction_the_rest_of_the_fenced_block_is_refused(r: redis.Redis) -> None:
    """RQ may open a second transaction after its outcome's (stats, dependents); once the
    outcome was refused, those write nothing either."""
    job, lease = leased_job(r)
    r.hset(job_key(job.id), "emq_token", "someone-else")
    with fenced(r, lease.fence):
        first = r.pipeline()
        first.hset(job_key(job.id), "status", "finished")
        with pytest.raises(LeaseLost):
            first.execute()
        second = r.pipeline()
        second.rpush("rq:queue:q", "dependent")
        second.hset(job_key(job.id), "emq_token", lease.token)
        with pytest.raises(LeaseLost):
            second.execute()
    assert not r.exists("rq:queue:q")
    assert r.hget(job_key(job.id), "emq_token") == b"someone-else"
    assert int(r.hget(QueueKeys("q").stats, "fenced")) == 1  # refused here, never sent to Redis


def test_a_guarded_start_commits_only_for_the_holder_and_keeps_the_lease(r: redis.Redis) -> None:
    job, lease = leased_job(r)
    q = QueueKeys("q")
    with fenced(r, lease.fence, release=False):
        pipe = r.pipeline()
        pipe.hset(job_key(job.id), "status", "started")
        assert pipe.execute() == [0]  # the field existed: RQ's reply, parsed as RQ expects
    assert r.hget(job_key(job.id), "status") == b"started"
    assert r.get(q.lock(job.id)) == lease.token.encode() and r.zscore(q.leases, job.id) is not None
    assert r.hget(job_key(job.id), "emq_token") == lease.token.encode()
    # recovered and finished elsewhere: a late start writes nothing
    r.hset(job_key(job.id), mapping={"emq_token": "someone-else", "status": "finished"})
    with fenced(r, lease.fence, release=False):
        pipe = r.pipeline()
        pipe.hset(job_key(job.id), "status", "started")
        with pytest.raises(LeaseLost):
            pipe.execute()
    assert r.hget(job_key(job.id), "status") == b"finished"
    assert int(r.hget(q.stats, "fenced")) == 1


def test_a_held_back_transaction_rides_in_the_next_guarded_write_and_is_refused_with_it(
    r: redis.Redis,
) -> None:
    """A SimpleLeaseWorker's execution record is held back and sent in its run's start's
    one script call: it lands with the start, and a refused start refuses it too."""
    job, lease = leased_job(r)
    held: list[object] = []
    with fenced(r, lease.fence, release=False, hold_back=held):
        pipe = r.pipeline()
        pipe.set("record", "1")
        assert pipe.execute() == [None]
    assert not r.exists("record") and len(held) == 1  # nothing sent yet
    with fenced(r, lease.fence, release=False, ahead=held):
        pipe = r.pipeline()
        pipe.hset(job_key(job.id), "status", "started")
        assert pipe.execute() == [0]  # the start's own reply only
    assert r.get("record") == b"1"
    r.delete("record")
    r.hset(job_key(job.id), "emq_token", "someone-else")
    with fenced(r, lease.fence, release=False, ahead=held):
        pipe = r.pipeline()
        pipe.hset(job_key(job.id), "status", "started")
        with pytest.raises(LeaseLost):
            pipe.execute()
    assert not r.exists("record")


def _sends(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """From now on, one entry per send to Redis (a round trip)."""
    from redis.connection import AbstractConnection

    sent: list[int] = []
    original = AbstractConnection.send_packed_command

    def counting(self: AbstractConnection, command: object, check_health: bool = True) -> None:
        sent.append(1)
        original(self, command, check_health)  # type: ignore[arg-type]

    monkeypatch.setattr(AbstractConnection, "send_packed_command", counting)
    return sent


def test_rqs_watch_goes_with_its_read_in_one_round_trip_and_still_guards_the_outcome(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RQ's finish WATCHes the job's dependents key, reads it, then writes: the WATCH
    rides with the read, and a dependent added after the read still aborts the EXEC."""
    job, lease = leased_job(r)
    scripts.load_all(r)  # a first call under a WATCH would retry for the load
    dependents = f"rq:job:{job.id}:dependents"
    sent = _sends(monkeypatch)
    with fenced(r, lease.fence, release=False):
        with r.pipeline() as pipe:
            pipe.watch(dependents)
            assert pipe.smembers(dependents) == set()
            assert len(sent) == 1  # the WATCH and the read together
            r.sadd(dependents, "late")  # another client, between the read and the write
            pipe.multi()
            pipe.hset(job_key(job.id), "status", "started")
            with pytest.raises(redis.WatchError):
                pipe.execute()
    assert r.hget(job_key(job.id), "status") == b"queued"  # nothing written
    with fenced(r, lease.fence, release=False):
        with r.pipeline() as pipe:
            pipe.watch(dependents)
            assert pipe.smembers(dependents) == {b"late"}
            pipe.multi()
            pipe.hset(job_key(job.id), "status", "started")
            assert pipe.execute() == [0]
    assert r.hget(job_key(job.id), "status") == b"started"


def test_a_watch_with_no_read_after_it_is_sent_before_the_transaction(r: redis.Redis) -> None:
    job, lease = leased_job(r)
    scripts.load_all(r)
    with fenced(r, lease.fence, release=False):
        with r.pipeline() as pipe:
            pipe.watch(f"rq:job:{job.id}:dependents")
            pipe.multi()
            pipe.hset(job_key(job.id), "status", "started")
            assert pipe.execute() == [0]
            assert not pipe.watching
    assert r.hget(job_key(job.id), "status") == b"started"


def test_transactions_after_the_outcome_run_unfenced(r: redis.Redis) -> None:
    job, lease = leased_job(r)
    with fenced(r, lease.fence):
        first = r.pipeline()
        first.hset(job_key(job.id), "status", "finished")
        first.execute()
        second = r.pipeline()  # e.g. RQ enqueueing dependents after the commit
        second.rpush("rq:queue:q", "dependent")
        assert second.execute() == [1]


def test_the_fence_keeps_rqs_watch(r: redis.Redis) -> None:
    job, lease = leased_job(r)
    with fenced(r, lease.fence):
        pipe = r.pipeline()
        pipe.watch("dependents")
        r.sadd("dependents", "x")  # changed under the watch
        pipe.multi()
        pipe.hset(job_key(job.id), "status", "finished")
        with pytest.raises(redis.exceptions.WatchError):
            pipe.execute()
    assert r.hget(job_key(job.id), "emq_token").decode() == lease.token  # still ours, nothing written


def test_a_flushed_script_cache_is_reloaded(r: redis.Redis) -> None:
    job, lease = leased_job(r)
    r.script_flush()
    with fenced(r, lease.fence):
        pipe = r.pipeline()
        pipe.hset(job_key(job.id), "status", "finished")
        assert pipe.execute() == [0]
    r.script_flush()
    assert scripts.load("pop_job")(r, [], ["t", "w", 1000, 3, 10]) == []


def test_release_reports_whether_the_lease_was_ours(r: redis.Redis) -> None:
    job, lease = leased_job(r)
    assert Fence("q", job.id, "not-mine").release(r) is False
    assert lease.fence.release(r) is True


def test_a_finish_that_runs_a_script_of_its_own_is_checked_then_committed(r: redis.Redis) -> None:
    # Lua cannot nest scripts: such a batch is owner-checked, committed, then released
    job, lease = leased_job(r)
    incr = r.register_script("return redis.call('INCR', KEYS[1])")
    with fenced(r, lease.fence):
        pipe = r.pipeline()
        pipe.hset(job_key(job.id), "status", "finished")
        incr(keys=["counter"], client=pipe)
        assert pipe.execute() == [0, 1]
    assert r.hget(job_key(job.id), "emq_token") == f"done:{lease.token}".encode()
    assert not r.exists(QueueKeys("q").lock(job.id))

    other, other_lease = leased_job(r)
    r.hset(job_key(other.id), "emq_token", "someone-else")
    with fenced(r, other_lease.fence):
        pipe = r.pipeline()
        pipe.hset(job_key(other.id), "status", "finished")
        incr(keys=["counter"], client=pipe)
        with pytest.raises(LeaseLost):
            pipe.execute()
    assert r.get("counter") == b"1" and r.hget(job_key(other.id), "status") == b"queued"


@pytest.mark.skipif(
    not rq_emq.compat.SUCCESS_LOOP_RETRIES_WHOLE, reason="a finish reads its lease with RQ 3's watch"
)
def test_a_finishs_watched_read_cut_by_a_restarting_redis_is_a_watch_error_rqs_loop_retries(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The finish's WATCH, RQ's read and the lease's read go in one send. A Redis that is
    loading its data after a restart answers the read with ``LOADING``, which redis-py
    raises as a connection error and closes the connection on: the lease's reply is not
    read from the closed connection (that raised AttributeError, which RQ took for the
    job's own failure and ran its failure callback for a run that succeeded). It is a
    WatchError, which RQ's finish loop retries, within the blip budget."""
    from redis.connection import AbstractConnection

    job, lease = leased_job(r)
    scripts.load_all(r)
    dependents = f"rq:job:{job.id}:dependents"
    original = AbstractConnection.read_response
    reads: list[int] = []

    def loading_on_the_read(self: AbstractConnection, *args: object, **kwargs: object) -> object:
        reads.append(1)
        if len(reads) == 2:  # the WATCH's reply was read; RQ's read meets a loading Redis
            self.disconnect()
            raise redis.exceptions.BusyLoadingError("Redis is loading the dataset in memory")
        return original(self, *args, **kwargs)  # type: ignore[arg-type]

    with fenced(r, lease.fence):
        with r.pipeline() as pipe:
            pipe.watch(dependents)
            monkeypatch.setattr(AbstractConnection, "read_response", loading_on_the_read)
            with pytest.raises(redis.WatchError):
                pipe.smembers(dependents)
            monkeypatch.undo()
