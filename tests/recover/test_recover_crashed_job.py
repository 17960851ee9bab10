"""``recover_crashed_job``, driven directly against a real Redis: what a worker does with
the job of a horse that died without an outcome (no worker process here)."""

from __future__ import annotations

import json

import pytest
import redis
from helpers import rq_moves
from rq import Queue
from rq.job import Job

from rq_emq.hold.lease import Lease
from rq_emq.intake.take import Taker
from rq_emq.keys import QueueKeys, job_key
from rq_emq.recover.horse_crash import read_crashes, recover_crashed
from rq_emq.settings import LeaseSettings

pytestmark = pytest.mark.rq_versions

Q = QueueKeys("q")
KILL = "work horse killed by signal 9 (SIGKILL; the OOM killer sends this)"
SEGV = "work horse killed by signal 11 (SIGSEGV; a segfault, in C code)"


def take(r: redis.Redis, name: str = "w1") -> Lease:
    taken = Taker(r, name, LeaseSettings(lease_ms=5_000, renew_interval_ms=1_000)).pop(["q"])
    assert taken is not None
    return Lease("q", taken.job_id, taken.token)


def leased(r: redis.Redis, **enqueue: object) -> tuple[Job, Lease]:
    job = Queue("q", connection=r).enqueue("jobs.noop", **enqueue)  # type: ignore[arg-type]
    return job, take(r)


def test_a_crash_puts_the_job_first_in_its_queue_with_the_attempt_counted(r: redis.Redis) -> None:
    job, lease = leased(r)
    behind = Queue("q", connection=r).enqueue("jobs.noop")
    assert recover_crashed(r, lease, KILL, 3) == [1, 1, 3]
    assert r.lrange(Q.rq_queue, 0, -1) == [job.id.encode(), behind.id.encode()]
    fields = r.hgetall(job_key(job.id))
    assert fields[b"status"] == b"queued" and fields[b"emq_attempts"] == b"1"  # not refunded
    assert b"emq_token" not in fields and not r.exists(Q.lock(job.id)) and r.zscore(Q.leases, job.id) is None
    assert [(c.attempt, c.cause) for c in read_crashes(fields[b"emq_crashes"]) or []] == [(1, KILL)]
    assert int(r.hget(Q.stats, "crashed")) == 1


def test_a_crash_recovery_by_a_worker_that_lost_its_lease_changes_nothing(r: redis.Redis) -> None:
    job, stale = leased(r)
    # recovered by the sweep meanwhile, and taken by another worker
    r.hdel(job_key(job.id), "emq_token")
    r.delete(Q.lock(job.id))
    r.zrem(Q.leases, job.id)
    r.lpush(Q.rq_queue, job.id)
    current = take(r, "w2")
    before = r.hgetall(job_key(job.id))
    assert recover_crashed(r, stale, KILL, 3) == [0, b"lost"]
    assert r.hgetall(job_key(job.id)) == before and r.llen(Q.rq_queue) == 0
    assert r.get(Q.lock(job.id)) == current.token.encode()
    assert r.hget(Q.stats, "crashed") is None


def test_a_job_rq_ended_meanwhile_is_left_as_rq_put_it(r: redis.Redis) -> None:
    job, lease = leased(r)
    rq_moves(r, job.id, "canceled")  # RQ's cancel while the horse ran
    assert recover_crashed(r, lease, KILL, 3) == [0, b"ended"]
    assert r.hget(job_key(job.id), "status") == b"canceled" and r.llen(Q.rq_queue) == 0
    assert not r.exists(Q.lock(job.id)) and r.zscore(Q.leases, job.id) is None  # released
    assert r.hget(job_key(job.id), "emq_crashes") is None


def test_at_max_attempts_the_job_fails_through_the_outbox_naming_each_cause(r: redis.Redis) -> None:
    job, lease = leased(r)
    assert recover_crashed(r, lease, KILL, 3)[0] == 1
    assert recover_crashed(r, take(r), SEGV, 3)[0] == 1
    reply = recover_crashed(r, take(r), KILL, 3)
    reason = f"{KILL} on attempt 3 of 3 (earlier attempt 1: {KILL}; attempt 2: {SEGV})"
    assert reply == [2, 3, 3, reason.encode()]
    fields = r.hgetall(job_key(job.id))
    assert fields[b"status"] == b"failed" and fields[b"emq_token"] == b"outbox"
    assert fields[b"emq_failure"] == reason.encode()
    assert r.zscore(Q.failed, job.id) is not None and r.zscore(Q.outbox, job.id) is not None
    assert r.llen(Q.rq_queue) == 0 and int(r.hget(Q.stats, "failed")) == 1


def test_a_jobs_own_max_attempts_applies(r: redis.Redis) -> None:
    job, lease = leased(r)
    r.hset(job_key(job.id), "emq_max_attempts", "1")
    assert recover_crashed(r, lease, KILL, 5) == [2, 1, 1, f"{KILL} on attempt 1 of 1".encode()]


def test_a_history_left_from_an_earlier_run_of_attempts_is_dropped(r: redis.Redis) -> None:
    job = Queue("q", connection=r).enqueue("jobs.noop")
    # left from an earlier run (a failed job the outbox completed, then requeued), and the
    # new run's first attempt stalled (the sweep requeued it: attempts 1)
    r.hset(job_key(job.id), mapping={"emq_crashes": json.dumps([[1, SEGV, 1], [2, SEGV, 2], [3, SEGV, 3]])})
    r.hset(job_key(job.id), "emq_attempts", "1")
    recover_crashed(r, take(r), KILL, 50)
    assert [(c.attempt, c.cause) for c in read_crashes(r.hget(job_key(job.id), "emq_crashes")) or []] == [
        (2, KILL)
    ]


def test_the_history_is_bounded(r: redis.Redis) -> None:
    job, lease = leased(r)
    recover_crashed(r, lease, KILL, 50)
    for _ in range(20):
        recover_crashed(r, take(r), KILL, 50)
    history = read_crashes(r.hget(job_key(job.id), "emq_crashes")) or []
    assert [c.attempt for c in history] == list(range(12, 22))


def test_a_malformed_history_is_replaced_not_a_script_error(r: redis.Redis) -> None:
    job, lease = leased(r)
    r.hset(job_key(job.id), "emq_crashes", "not json{")
    assert recover_crashed(r, lease, KILL, 3)[0] == 1
    assert len(read_crashes(r.hget(job_key(job.id), "emq_crashes")) or []) == 1


def test_a_crash_of_a_run_whose_job_was_deleted_releases_the_lock_it_still_holds(r: redis.Redis) -> None:
    """The job was deleted while it ran (and enqueued again under its id): the dead horse's
    lease is lost, nothing of the new job is touched, and the lock the old run still held
    goes, so the new entry (held back while it lived) is taken at once, not a lease later."""
    job, stale = leased(r)
    Job.fetch(job.id, connection=r).delete()
    Queue("q", connection=r).enqueue("jobs.noop", job_id=job.id)
    assert Taker(r, "w2", LeaseSettings(lease_ms=5_000, renew_interval_ms=1_000)).pop(["q"]) is None
    before = r.hgetall(job_key(job.id))
    assert recover_crashed(r, stale, KILL, 3) == [0, b"lost"]
    assert r.hgetall(job_key(job.id)) == before and not r.exists(Q.lock(job.id))
    assert take(r, "w2").job_id == job.id
