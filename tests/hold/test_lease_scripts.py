"""Take, renew and hand back, driven directly against a real Redis (no worker process);
the fence's writes are specified in tests/fence/."""

from __future__ import annotations

import logging
import time
from datetime import timezone
from types import SimpleNamespace

import pytest
import redis
from helpers import count_pipelines, leased_job, rq_moves
from rq import Queue
from rq.job import Job

from rq_emq import scripts
from rq_emq.fence.fencing import Fence
from rq_emq.hold import lease as lease_module
from rq_emq.hold.lease import Lease, LockManager
from rq_emq.intake.take import Taker
from rq_emq.keys import QueueKeys, job_key
from rq_emq.settings import LeaseSettings

SETTINGS = LeaseSettings(lease_ms=2_000, renew_interval_ms=500)


def taker(r: redis.Redis, name: str = "w1", **overrides: int) -> Taker:
    settings = LeaseSettings(**{**SETTINGS.__dict__, **overrides})
    return Taker(r, name, settings)


def manager(r: redis.Redis, lost: list[Lease]) -> LockManager:
    return LockManager(r, SETTINGS.lease_ms, SETTINGS.renew_interval_ms, on_lost=lost.append)


# -- take ---------------------------------------------------------------------------------
def test_pop_leases_the_job_in_the_same_step(r: redis.Redis) -> None:
    job = Queue("q", connection=r).enqueue("jobs.add", 1, 2)
    taken = taker(r).pop(["q"])
    assert taken is not None and taken.job_id == job.id
    q = QueueKeys("q")
    assert r.llen(q.rq_queue) == 0
    assert r.get(q.lock(job.id)).decode() == taken.token
    assert 0 < r.pttl(q.lock(job.id)) <= 2_000
    assert r.zscore(q.leases, job.id) is not None
    fields = r.hgetall(job_key(job.id))
    assert fields[b"emq_attempts"] == b"1"
    assert fields[b"emq_token"].decode() == taken.token
    # the worker-wide default is not copied in: a job without its own max reads as "default"
    assert b"emq_max_attempts" not in fields
    # the RQ status at the take: anything else later means RQ changed the job, not us
    assert fields[b"emq_status"] == b"queued"
    assert taken.raw[b"origin"] == b"q"  # the job's hash comes back with the take, as leased
    assert taken.raw[b"emq_token"].decode() == taken.token
    assert taken.raw[b"emq_attempts"] == b"1"


def test_a_job_hash_with_many_fields_is_taken_again_with_its_attempts_counted(r: redis.Redis) -> None:
    """Found by the long soak: with emq_attempts far down a big job hash, the take read its
    position as a number base and failed, crashing the worker."""
    job = Queue("q", connection=r).enqueue("jobs.noop")
    r.hset(job_key(job.id), mapping={f"field_{i}": "x" for i in range(40)})
    r.hset(job_key(job.id), "emq_attempts", "2")  # taken twice before, lease lapsed
    taken = taker(r).pop(["q"])
    assert taken is not None and taken.attempts == 3
    assert r.hget(job_key(job.id), "emq_attempts") == b"3"


def redis_ms(r: redis.Redis) -> int:
    seconds, micros = r.time()
    return int(seconds) * 1000 + int(micros) // 1000


def test_the_fencing_token_rises_on_every_grant_and_nothing_lowers_it(r: redis.Redis) -> None:
    """``emq_fence`` rises on each grant, by pop and by claim, after a hand-back (whose
    attempt is refunded) and after a finish (which clears the attempts): the job's tokens,
    in grant order, strictly increase, each at least the grant's Redis time in ms."""
    job = Queue("q", connection=r).enqueue("jobs.noop")
    q = QueueKeys("q")
    tokens = []
    before = redis_ms(r)
    first = taker(r).pop(["q"])
    assert first is not None
    tokens.append(first.fencing_token)
    scripts.load("return_job_to_queue")(r, q.returning(job.id), [job.id, first.token, "rq:"])
    r.lmove(q.rq_queue, q.moving)
    second = taker(r, "w2").claim("q", job.id)
    assert second is not None
    tokens.append(second.fencing_token)
    Fence("q", job.id, second.token).release(r)  # a normal end: the attempts start over
    assert r.hget(job_key(job.id), "emq_attempts") is None
    r.lpush(q.rq_queue, job.id)
    third = taker(r).pop(["q"])
    assert third is not None and third.attempts == 1
    tokens.append(third.fencing_token)
    assert tokens == sorted(set(tokens)) and tokens[0] >= before, tokens
    assert r.hget(job_key(job.id), "emq_fence") == str(tokens[-1]).encode()


def test_a_token_granted_after_redis_lost_its_data_is_above_every_token_before(r: redis.Redis) -> None:
    """Redis restarted without persistence (here: FLUSHALL) while a holder ran, and the
    producer resubmitted the same job id: the new grant's token is above the old one's,
    so a store that keeps the highest token refuses the old run's write, never the new."""
    queue = Queue("q", connection=r)
    for _ in range(3):  # crashes before the loss: the old token is past the first grant's
        queue.enqueue("jobs.noop", job_id="idempotent-1")
        old = taker(r).pop(["q"])
        assert old is not None
        r.delete(QueueKeys("q").lock(old.job_id))
    r.flushall()
    time.sleep(0.002)  # the token's resolution is a ms; a real restart takes far longer
    queue.enqueue("jobs.noop", job_id="idempotent-1")
    new = taker(r).pop(["q"])
    assert new is not None and new.fencing_token > old.fencing_token


def test_tokens_carry_128_random_bits_and_the_worker_name(r: redis.Redis) -> None:
    queue = Queue("q", connection=r)
    tokens = set()
    for _ in range(20):
        queue.enqueue("jobs.noop")
        taken = taker(r, name="worker-7").pop(["q"])
        assert taken is not None
        secret, _, name = taken.token.partition(":")
        assert name == "worker-7" and len(secret) == 32 and int(secret, 16) >= 0
        tokens.add(secret)
    assert len(tokens) == 20


def test_pop_honours_queue_order(r: redis.Redis) -> None:
    low = Queue("low", connection=r).enqueue("jobs.noop")
    high = Queue("high", connection=r).enqueue("jobs.noop")
    t = taker(r)
    first, second = t.pop(["high", "low"]), t.pop(["high", "low"])
    assert first is not None and second is not None
    assert (first.job_id, first.queue_index) == (high.id, 0)
    assert (second.job_id, second.queue_index) == (low.id, 1)
    assert t.pop(["high", "low"]) is None


def test_a_deleted_job_in_the_queue_is_skipped_and_logged(
    r: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    queue = Queue("q", connection=r)
    ghost = queue.enqueue("jobs.noop")
    real = queue.enqueue("jobs.noop")
    r.delete(job_key(ghost.id))
    with caplog.at_level(logging.WARNING, logger="rq_emq.lease"):
        taken = taker(r).pop(["q"])
    assert taken is not None and taken.job_id == real.id
    assert ghost.id in caplog.text
    assert not r.exists(QueueKeys("q").lock(ghost.id))


def test_claim_leases_a_job_moved_to_the_moving_list(r: redis.Redis) -> None:
    job = Queue("q", connection=r).enqueue("jobs.noop")
    q = QueueKeys("q")
    r.lmove(q.rq_queue, q.moving)
    taken = taker(r).claim("q", job.id)
    assert taken is not None and r.llen(q.moving) == 0
    assert r.get(q.lock(job.id)).decode() == taken.token
    # a second claim of the same id finds nothing to claim
    assert taker(r).claim("q", job.id) is None
    # nor once the job is back in its queue (handed back): its entry is the queue's, not a
    # moving list's, and a claim that leased it there would leave it both leased and queued
    scripts.load("return_job_to_queue")(r, q.returning(job.id), [job.id, taken.token, "rq:"])
    assert r.lrange(q.rq_queue, 0, -1) == [job.id.encode()]
    assert taker(r, "w2").claim("q", job.id) is None
    assert not r.exists(q.lock(job.id)) and r.zscore(q.leases, job.id) is None


def test_a_stray_duplicate_entry_of_a_job_in_flight_is_dropped_never_run_twice(r: redis.Redis) -> None:
    """redis-py retries a command whose reply a Redis restart lost (redis-py 8: ten times),
    so a producer's enqueue can land twice: the soak saw a job's id twice in its queue, and
    a second worker took the copy while the first ran it (an overlap of 2 s). A job that a
    live lease holds, untouched since, is never granted again: the copy goes."""
    job = Queue("q", connection=r).enqueue("jobs.noop")
    behind = Queue("q", connection=r).enqueue("jobs.noop")
    q = QueueKeys("q")
    first = taker(r, "w1").pop(["q"])
    assert first is not None and first.job_id == job.id
    r.lpush(q.rq_queue, job.id)  # the retried push, at the head as a Retry puts it
    second = taker(r, "w2").pop(["q"])
    assert second is not None and second.job_id == behind.id, "the copy was skipped, the next job taken"
    assert r.get(q.lock(job.id)).decode() == first.token
    assert r.hget(job_key(job.id), "emq_attempts") == b"1"
    # the idle wait's path: the copy moved into the moving list is dropped by the claim
    r.lpush(q.rq_queue, job.id)
    r.lmove(q.rq_queue, q.moving)
    assert taker(r, "w3").claim("q", job.id) is None
    assert r.llen(q.moving) == 0 and r.get(q.lock(job.id)).decode() == first.token
    # once RQ itself changed the job (a requeue rewrites enqueued_at), it is RQ's to run
    # again, but not beside the run that still holds its lock: held back at its place
    r.hset(job_key(job.id), "enqueued_at", "2030-01-01T00:00:00.000000Z")
    r.lpush(q.rq_queue, job.id)
    assert taker(r, "w4").pop(["q"]) is None
    assert r.lrange(q.rq_queue, 0, -1) == [job.id.encode()]
    # that run's end (its finish finds RQ moved the job on) releases the lock: taken now
    assert not Fence("q", job.id, first.token).release(r) and not r.exists(q.lock(job.id))
    again = taker(r, "w4").pop(["q"])
    assert again is not None and again.job_id == job.id


def test_a_job_deleted_and_enqueued_again_waits_at_its_place_until_the_old_run_ends(r: redis.Redis) -> None:
    """``job.delete()`` of a running job, then its id enqueued again: the old run's lock is
    live, so no take starts a second run beside it. The entry stays at the head of its
    queue (a pop looks past it; a claim puts it back where the BLMOVE took it), the old
    holder's renewal finds its lease lost, and its refused finish releases the lock: then
    the job is taken. A finish's `done:` mark holds nothing back."""
    queue = Queue("q", connection=r)
    q = QueueKeys("q")
    job = queue.enqueue("jobs.noop", job_id="order-20")
    old = taker(r, "w1").pop(["q"])
    assert old is not None
    Job.fetch(job.id, connection=r).delete()
    queue.enqueue("jobs.noop", job_id="order-20")
    behind = queue.enqueue("jobs.noop")
    second = taker(r, "w2").pop(["q"])
    assert second is not None and second.job_id == behind.id, "the job behind it is taken"
    assert r.lrange(q.rq_queue, 0, -1) == [b"order-20"] and r.get(q.lock("order-20")).decode() == old.token
    assert taker(r, "w2").pop(["q"]) is None
    # the idle wait's path: the claim puts it back at the head of its queue
    r.lmove(q.rq_queue, q.moving)
    assert taker(r, "w3").claim("q", "order-20") is None
    assert r.lrange(q.rq_queue, 0, -1) == [b"order-20"] and r.llen(q.moving) == 0
    assert r.hget(job_key("order-20"), "emq_token") is None  # nothing granted
    # the old holder hears its lease is lost; its run's refused finish releases its lock
    lost: list[Lease] = []
    held = manager(r, lost)
    held.add(Lease("q", "order-20", old.token))
    assert held.tick() == ["order-20"]
    assert not Fence("q", "order-20", old.token).release(r) and not r.exists(q.lock("order-20"))
    again = taker(r, "w3").pop(["q"])
    assert again is not None and again.job_id == "order-20" and r.llen(q.rq_queue) == 0
    # a finish that deleted its job (result_ttl=0) leaves `done:<token>`: no run holds the id
    r.set(q.lock("order-21"), "done:" + again.token, px=5_000)
    queue.enqueue("jobs.noop", job_id="order-21")
    taken = taker(r, "w4").pop(["q"])
    assert taken is not None and taken.job_id == "order-21"


@pytest.mark.parametrize(
    "status",
    [
        "finished",
        "failed",
        "stopped",
        "canceled",
        "scheduled",
        "deferred",
        "rate_limited",
        "ready_to_enqueue",
    ],
)
def test_a_stray_copy_of_a_job_that_left_every_queue_is_dropped_never_run_again(
    r: redis.Redis, caplog: pytest.LogCaptureFixture, status: str
) -> None:
    """A push sent again after a lost reply (redis-py resends a transaction after a
    connection error, whether or not Redis ran it: RQ's scheduler moving a due job through
    a cut connection, as the soak's cuts provoke) can land after the job already ran: the copy then
    finds it finished, or failed, or waiting elsewhere (a delayed Retry, its parents, its
    rate limit). RQ writes these statuses only with the job in no queue, and every push
    writes ``queued``: the copy is dropped, and logged, by the pop and by the claim."""
    queue = Queue("q", connection=r)
    job, behind = queue.enqueue("jobs.noop"), queue.enqueue("jobs.noop")
    q = QueueKeys("q")
    rq_moves(r, job.id, status)
    with caplog.at_level(logging.WARNING, logger="rq_emq.lease"):
        taken = taker(r).pop(["q"])
    assert taken is not None and taken.job_id == behind.id, "the copy was skipped, the next job taken"
    assert job.id in caplog.text and "stray copy" in caplog.text
    assert not r.exists(q.lock(job.id)) and r.llen(q.rq_queue) == 0
    assert r.hget(job_key(job.id), "status") == status.encode(), "the job itself is left as it was"
    # the idle wait's path: the copy moved into the moving list is dropped by the claim
    r.lpush(q.rq_queue, job.id)
    r.lmove(q.rq_queue, q.moving)
    assert taker(r).claim("q", job.id) is None
    assert r.llen(q.moving) == 0 and not r.exists(q.lock(job.id))


def test_a_job_pushed_again_with_status_queued_is_taken_whatever_it_was_before(r: redis.Redis) -> None:
    """A requeue, a Retry, a scheduler's move, the sweep's return: each writes ``queued``
    with its push, so a job that finished or failed before and was enqueued again runs."""
    queue = Queue("q", connection=r)
    job = queue.enqueue("jobs.noop")
    first = taker(r).pop(["q"])
    assert first is not None
    r.hset(job_key(job.id), "status", "finished")
    r.hset(job_key(job.id), "status", "queued")  # enqueued again: RQ's _enqueue_job
    r.rpush(QueueKeys("q").rq_queue, job.id)
    r.delete(QueueKeys("q").lock(job.id))  # the first run's lease ended with its outcome
    again = taker(r, "w2").pop(["q"])
    assert again is not None and again.job_id == job.id


def calls(r: redis.Redis, command: str) -> int:
    return int(r.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


def test_a_taker_back_from_the_wait_waits_at_once_and_a_busy_one_pops_straight_away(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trickle finds the queues empty after nearly every job: the BLMOVEs are the look.
    A wait answered at once means a backlog, which is taken with one script call a job."""
    monkeypatch.setattr("rq_emq.intake.take.AT_ONCE_S", 0.15)  # "at once" on a loaded machine too
    t = taker(r)
    scripts.load_all(r)
    queues = ["a", "b", "c"]
    assert t.take(queues, timeout=0.2) is None  # a new worker pops first, then waits
    first, second, third = (Queue("c", connection=r).enqueue("jobs.noop") for _ in range(3))
    r.config_resetstat()
    taken = t.take(queues, timeout=2)  # back from a wait: straight to its waits
    assert taken is not None and taken.job_id == first.id
    assert (calls(r, "blmove"), calls(r, "evalsha")) == (3, 1)  # the claim
    r.config_resetstat()
    for job in (second, third):  # answered at once: a backlog, taken by pop_job
        taken = t.take(queues, timeout=2)
        assert taken is not None and taken.job_id == job.id
    assert (calls(r, "blmove"), calls(r, "evalsha")) == (0, 2)
    r.config_resetstat()
    assert t.take(queues, timeout=0.2) is None  # the pop found nothing, then it waited
    assert (calls(r, "blmove"), calls(r, "evalsha")) == (3, 1)
    r.config_resetstat()
    assert t.take(queues, timeout=0.2) is None  # and the next take waits without a pop
    assert (calls(r, "blmove"), calls(r, "evalsha")) == (3, 0)
    assert all(r.llen(QueueKeys(q).moving) == 0 for q in queues)


def test_a_wait_that_ends_a_moment_before_the_takes_deadline_is_not_followed_by_another(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis counts a wait's timeout in whole milliseconds, rounded down: a wait may end
    just before the take's deadline (one idle take once sent six BLMOVEs)."""
    clock = [1000.0]
    waits: list[float] = []

    def wait(queues: object, remaining: float, record: object) -> None:
        waits.append(remaining)
        clock[0] += remaining - (0.0005 if len(waits) == 1 else 0)  # the first, 0.5 ms early
        return None

    monkeypatch.setattr("rq_emq.intake.take.time", SimpleNamespace(monotonic=lambda: clock[0]))
    t = taker(r)
    monkeypatch.setattr(t, "_wait_and_claim", wait)
    t._expect_empty = True  # back from a wait: no pop first
    assert t.take(["q"], timeout=0.2) is None
    assert waits == [pytest.approx(0.2)]


def test_blocking_take_wakes_up_for_a_job_that_arrives(r: redis.Redis, redis_url: str) -> None:
    import threading

    def enqueue_later() -> None:
        Queue("q", connection=redis.Redis.from_url(redis_url)).enqueue("jobs.noop")

    timer = threading.Timer(0.2, enqueue_later)
    timer.start()
    taken = taker(r).take(["q"], timeout=5)
    timer.join()
    assert taken is not None
    assert r.llen(QueueKeys("q").moving) == 0


def test_with_several_queues_a_job_on_any_queue_is_taken(r: redis.Redis) -> None:
    job = Queue("c", connection=r).enqueue("jobs.noop")
    taken = taker(r).take(["a", "b", "c"], timeout=1)
    assert taken is not None and taken.job_id == job.id and taken.queue_index == 2


# -- renew ------------------------------------------------------------------------------------
def test_renewal_extends_the_lease_and_unmarks_it(r: redis.Redis) -> None:
    job, lease = leased_job(r)
    q = QueueKeys("q")
    r.pexpire(q.lock(job.id), 50)
    r.zadd(q.stalled, {job.id: 1})
    lost: list[Lease] = []
    m = manager(r, lost)
    m.add(lease)
    assert m.tick() == []
    assert r.pttl(q.lock(job.id)) > 1_000
    assert r.zscore(q.stalled, job.id) is None
    assert lost == []


def test_a_holder_whose_lock_lapsed_sets_it_again_while_the_job_is_still_its_own(r: redis.Redis) -> None:
    job, lease = leased_job(r)
    q = QueueKeys("q")
    r.delete(q.lock(job.id))  # as if the lock expired during a pause
    m = manager(r, [])
    m.add(lease)
    assert m.tick() == []
    assert r.get(q.lock(job.id)).decode() == lease.token


def test_nobody_can_renew_a_lease_they_do_not_hold(r: redis.Redis) -> None:
    job, lease = leased_job(r)
    q = QueueKeys("q")
    lost: list[Lease] = []
    m = manager(r, lost)
    intruder = Lease("q", job.id, "f" * 32 + ":intruder")
    m.add(intruder)
    assert m.tick() == [job.id]
    assert r.get(q.lock(job.id)).decode() == lease.token  # untouched
    assert lost == [intruder] and intruder.lost


def test_a_recovered_job_is_reported_lost_to_its_old_holder(r: redis.Redis) -> None:
    job, lease = leased_job(r)
    r.hdel(job_key(job.id), "emq_token")  # what a recovery does to the owner record
    r.delete(QueueKeys("q").lock(job.id))
    lost: list[Lease] = []
    m = manager(r, lost)
    m.add(lease)
    assert m.tick() == [job.id]
    assert not r.exists(QueueKeys("q").lock(job.id))
    assert int(r.hget(QueueKeys("q").stats, "lease_lost")) == 1


def test_a_tick_is_one_round_trip_for_any_number_of_leases(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue_a, queue_b = Queue("a", connection=r), Queue("b", connection=r)
    m = manager(r, [])
    for i in range(60):
        (queue_a if i % 2 else queue_b).enqueue("jobs.noop")
        taken = taker(r).pop(["a", "b"])
        assert taken is not None
        m.add(Lease("b" if taken.queue_index else "a", taken.job_id, taken.token))
    scripts.load_all(r)  # as a worker does at startup
    sent = count_pipelines(monkeypatch)
    r.config_resetstat()
    m.tick()
    stats = r.info("commandstats")
    assert sent == [2]  # one pipeline: one renew script per queue
    assert stats["cmdstat_evalsha"]["calls"] == 2
    assert int(r.hget(QueueKeys("a").stats, "renewed")) + int(r.hget(QueueKeys("b").stats, "renewed")) == 60


def test_a_tick_splits_many_leases_into_bounded_script_calls_in_one_round_trip(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lease_module, "RENEW_BATCH", 4)
    queue = Queue("q", connection=r)
    lost: list[Lease] = []
    m = manager(r, lost)
    for _ in range(10):
        queue.enqueue("jobs.noop")
        taken = taker(r).pop(["q"])
        assert taken is not None
        m.add(Lease("q", taken.job_id, taken.token))
    stolen = m.held()[-1]  # its call is the last of three
    r.hset(job_key(stolen.job_id), "emq_token", "someone-else")
    scripts.load_all(r)
    sent = count_pipelines(monkeypatch)
    assert m.tick() == [stolen.job_id]
    assert sent == [3]  # one pipeline holding ceil(10 / 4) renew calls
    assert int(r.hget(QueueKeys("q").stats, "renewed")) == 9
    assert [lease.job_id for lease in lost] == [stolen.job_id]


def test_a_renewal_racing_the_finish_is_not_a_lost_lease(r: redis.Redis) -> None:
    job, lease = leased_job(r)
    assert lease.fence.release(r)
    lost: list[Lease] = []
    m = manager(r, lost)
    m.add(lease)
    assert m.tick() == []
    assert lost == [] and lease.settled


def test_renewal_records_rqs_heartbeat_on_the_job(r: redis.Redis) -> None:
    """RQ's views (rq info, dashboards) read the job's last heartbeat; a renewal is one."""
    from rq.utils import utcparse

    job, lease = leased_job(r)
    r.hset(job_key(job.id), "last_heartbeat", "2000-01-01T00:00:00.000000Z")
    m = manager(r, [])
    m.add(lease)
    before = time.time()
    assert m.tick() == []
    beat = utcparse(r.hget(job_key(job.id), "last_heartbeat").decode())
    assert beat.replace(tzinfo=timezone.utc).timestamp() >= before - 1


def test_a_lease_found_lost_is_not_renewed_or_reported_again(r: redis.Redis) -> None:
    job, lease = leased_job(r)
    r.hset(job_key(job.id), "emq_token", "someone-else")
    lost: list[Lease] = []
    m = manager(r, lost)
    m.add(lease)
    assert m.tick() == [job.id]
    assert m.tick() == [] and m.tick() == []
    assert lost == [lease]
    assert int(r.hget(QueueKeys("q").stats, "lease_lost")) == 1


def test_a_run_that_ended_past_its_local_deadline_leaves_the_clock_line_in_the_log(
    r: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """A horse fences itself on the same local deadline as its worker's clock check, and
    may win: its worker then ends the run before check_expiry ran. The worker still says,
    in the same one line, that the lease clock ran out (the soak explains the job's next
    run by it). A run that ended within its deadline says nothing."""
    m = manager(r, [])
    m.add(Lease("q", "late", "t1", valid_until=time.monotonic() - 0.001))
    m.add(Lease("q", "in-time", "t2", valid_until=time.monotonic() + 60))
    with caplog.at_level(logging.WARNING, logger="rq_emq.lease"):
        assert m.remove("late") is not None and m.remove("in-time") is not None
    lines = [rec.getMessage() for rec in caplog.records]
    assert len(lines) == 1 and lines[0].startswith("job late on queue q: local lease clock ran out"), lines


# -- hand back (a cold stop) --------------------------------------------------------------------
def test_a_hand_back_refunds_the_attempt_and_puts_the_job_first(r: redis.Redis) -> None:
    job, lease = leased_job(r)
    behind = Queue("q", connection=r).enqueue("jobs.noop")
    q = QueueKeys("q")
    assert lease.hand_back(r) is True
    assert r.lrange(q.rq_queue, 0, -1) == [job.id.encode(), behind.id.encode()]
    assert r.hget(job_key(job.id), "emq_attempts") == b"0"
    assert r.hget(job_key(job.id), "status") == b"queued"
    assert not r.exists(q.lock(job.id)) and r.zscore(q.leases, job.id) is None
    assert r.hget(job_key(job.id), "emq_token") is None


def test_a_hand_back_by_a_worker_that_lost_its_lease_changes_nothing(r: redis.Redis) -> None:
    """A worker stopped cold after its job was recovered and taken by another worker must
    not hand back (requeue, refund, unlock) a job it no longer owns."""
    job, stale = leased_job(r)
    q = QueueKeys("q")
    # recovered from this worker, then taken by another one
    r.hdel(job_key(job.id), "emq_token")
    r.delete(q.lock(job.id))
    r.zrem(q.leases, job.id)
    r.lpush(q.rq_queue, job.id)
    current = taker(r, "w2").pop(["q"])
    assert current is not None and current.job_id == job.id
    before = r.hgetall(job_key(job.id))
    assert stale.hand_back(r) is False
    assert r.hgetall(job_key(job.id)) == before
    assert r.get(q.lock(job.id)) == current.token.encode() and r.zscore(q.leases, job.id) is not None
    assert r.llen(q.rq_queue) == 0
    assert int(r.hget(q.stats, "fenced")) == 1
