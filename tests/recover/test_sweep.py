"""The two-phase stalled sweep against a real Redis: mark, then recover or fail."""

from __future__ import annotations

import logging
import multiprocessing
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from rq import Queue
from rq.job import Job
from stalls import SETTINGS, Q, next_round, stall, sweeper

from rq_emq import LeaseWorker, scripts
from rq_emq.hold.lease import Lease, LockManager
from rq_emq.intake.take import Taker
from rq_emq.keys import job_key
from rq_emq.recover.sweep import Sweeper
from rq_emq.settings import LeaseSettings

pytestmark = pytest.mark.rq_versions


def test_a_lapsed_lease_is_marked_first_and_recovered_only_by_a_later_round(r: redis.Redis) -> None:
    (job_id,) = stall(r)
    s = sweeper(r)
    first = s.sweep("q")
    assert first.ran and first.marked == [job_id] and first.requeued == []
    assert r.llen(Q.rq_queue) == 0
    assert not s.sweep("q").ran  # rate limited: one round per window, fleet-wide
    next_round(s)
    second = s.sweep("q")
    assert second.requeued == [job_id]
    assert r.lrange(Q.rq_queue, 0, -1) == [job_id.encode()]
    assert r.hget(job_key(job_id), "status") == b"queued"
    assert r.zscore(Q.leases, job_id) is None and r.zscore(Q.stalled, job_id) is None
    assert r.hget(job_key(job_id), "emq_token") is None
    assert r.hget(job_key(job_id), "emq_attempts") == b"1"


def test_a_recovered_job_goes_to_the_front_of_its_queue_and_leaves_rqs_started_registry(
    r: redis.Redis,
) -> None:
    (job_id,) = stall(r)
    waiting = Queue("q", connection=r).enqueue("jobs.noop")
    # RQ's view of the execution, as prepare_execution leaves it
    r.zadd(Q.started, {f"{job_id}:exec1": time.time() + 100})
    r.zadd(f"rq:executions:{job_id}", {"exec1": 1})
    r.hset(f"rq:execution:{job_id}:exec1", mapping={"worker_name": "dead-worker"})
    r.sadd("rq:worker:dead-worker:executions", f"{job_id}:exec1")
    s = sweeper(r)
    s.sweep("q")
    next_round(s)
    s.sweep("q")
    assert r.lrange(Q.rq_queue, 0, -1) == [job_id.encode(), waiting.id.encode()]
    assert r.zcard(Q.started) == 0
    assert not r.exists(f"rq:executions:{job_id}", f"rq:execution:{job_id}:exec1")
    assert r.scard("rq:worker:dead-worker:executions") == 0


def test_a_holder_that_renews_between_the_rounds_keeps_its_job(r: redis.Redis) -> None:
    queue = Queue("q", connection=r)
    job = queue.enqueue("jobs.noop")
    taken = Taker(r, "paused-worker", SETTINGS).pop(["q"])
    assert taken is not None
    r.delete(Q.lock(job.id))
    r.zadd(Q.leases, {job.id: 0})
    s = sweeper(r)
    assert s.sweep("q").marked == [job.id]
    manager = LockManager(r, SETTINGS.lease_ms, SETTINGS.renew_interval_ms, on_lost=lambda lease: None)
    manager.add(Lease("q", job.id, taken.token))
    assert manager.tick() == []  # the paused worker wakes up and renews
    next_round(s)
    second = s.sweep("q")
    assert second.requeued == [] and second.failed == []
    assert r.llen(Q.rq_queue) == 0 and r.get(Q.lock(job.id)) == taken.token.encode()


def test_a_job_at_max_attempts_fails_with_its_reason_and_rq_sees_a_failure(
    r: redis.Redis, tmp_path: Path
) -> None:
    from rq import Callback

    log = tmp_path / "callback.log"
    (job_id,) = stall(
        r, on_failure=Callback("jobs.on_failure_record"), failure_ttl=300, meta={"log": str(log)}
    )
    r.hset(job_key(job_id), mapping={"emq_attempts": 3, "emq_max_attempts": 3})
    s = sweeper(r)
    s.sweep("q")
    next_round(s)
    report = s.sweep("q")
    assert report.failed == [job_id] and report.requeued == []
    assert r.hget(job_key(job_id), "status") == b"failed"
    assert r.zscore(Q.failed, job_id) == pytest.approx(time.time() + 300, abs=5)
    assert 290 < r.ttl(job_key(job_id)) <= 300
    assert r.llen(Q.rq_queue) == 0
    assert s.drain_outbox("q") == 1
    assert s.drain_outbox("q") == 0  # the outbox entry is gone: exactly once
    job = Job.fetch(job_id, connection=r)
    results = job.results()
    assert len(results) == 1
    assert "stalled on attempt 3 of 3" in (results[0].exc_string or "")
    assert log.read_text().count("failed") == 1
    assert r.zcard(Q.outbox) == 0


def test_a_drainer_that_dies_after_claiming_is_taken_over_once(r: redis.Redis) -> None:
    (job_id,) = stall(r)
    r.hset(job_key(job_id), mapping={"emq_attempts": 1, "emq_max_attempts": 1})
    s = sweeper(r)
    s.sweep("q")
    next_round(s)
    assert s.sweep("q").failed == [job_id]
    # a 1 ms claim (no callback timeout, no margin), then this drainer dies
    claim = [1, 0, 0, "rq:job:", "outbox:" + "t" * 32 + ":dead-drainer"]
    claimed = scripts.load("claim_outbox")(r, [Q.outbox], claim)
    assert claimed[0] == job_id.encode()  # this drainer dies here
    time.sleep(0.01)
    assert s.drain_outbox("q") == 1
    assert len(Job.fetch(job_id, connection=r).results()) == 1


def test_a_lockless_entry_in_our_moving_list_is_recovered(r: redis.Redis) -> None:
    job = Queue("q", connection=r).enqueue("jobs.noop")
    r.lmove(Q.rq_queue, Q.moving)  # a worker's BLMOVE, then it died
    s = sweeper(r)
    assert s.sweep("q").marked == [job.id]
    next_round(s)
    assert s.sweep("q").requeued == [job.id]
    assert r.llen(Q.moving) == 0 and r.lrange(Q.rq_queue, 0, -1) == [job.id.encode()]


def test_stock_rq_jobs_are_left_alone(r: redis.Redis) -> None:
    job = Queue("q", connection=r).enqueue("jobs.noop")
    # a stock worker: BLMOVE to RQ's intermediate list, an execution, a started entry
    r.lmove(Q.rq_queue, Q.intermediate)
    r.zadd(f"rq:executions:{job.id}", {"e": 1})
    r.zadd(Q.started, {f"{job.id}:e": 1})  # even overdue, that is RQ's business
    s = sweeper(r)
    for _ in range(3):
        report = s.sweep("q", mode="force")
        assert report.marked == report.requeued == report.failed == []
    assert r.lrange(Q.intermediate, 0, -1) == [job.id.encode()]
    assert r.zcard(Q.started) == 1


def test_a_stock_workers_job_between_its_move_and_its_start_is_never_marked(r: redis.Redis) -> None:
    """A stock worker frozen right after its BLMOVE (no execution, no started entry yet)
    looks like nothing at all to the sweep: RQ's intermediate list is not ours."""
    job = Queue("q", connection=r).enqueue("jobs.noop")
    r.lmove(Q.rq_queue, Q.intermediate)
    s = sweeper(r)
    for _ in range(3):
        report = s.sweep("q", mode="force")
        assert report.marked == report.requeued == report.failed == []
        next_round(s)
    assert r.lrange(Q.intermediate, 0, -1) == [job.id.encode()] and r.llen(Q.rq_queue) == 0
    assert r.zcard(Q.stalled) == 0


def test_a_lease_entry_for_a_deleted_job_is_dropped_and_logged(
    r: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    (job_id,) = stall(r)
    r.delete(job_key(job_id))
    with caplog.at_level(logging.WARNING, logger="rq_emq.sweep"):
        report = sweeper(r).sweep("q")
    assert report.dropped == [job_id]
    assert r.zcard(Q.leases) == 0 and job_id in caplog.text
    assert not r.exists(job_key(job_id))


def test_dry_run_reports_and_changes_nothing(r: redis.Redis) -> None:
    marked_before = stall(r, 2)
    s = sweeper(r)
    s.sweep("q")
    next_round(s)
    fresh = stall(r, 1)
    before = {k: r.dump(k) for k in r.keys("*")}
    report = s.sweep("q", mode="dry-run")
    assert sorted(report.requeued) == sorted(marked_before) and report.marked == fresh
    assert {k: r.dump(k) for k in r.keys("*")} == before


def test_a_round_works_through_any_number_of_stalled_jobs_in_bounded_calls(r: redis.Redis) -> None:
    ids = stall(r, 600)
    s = sweeper(r, sweep_batch=50)
    first = s.sweep("q")
    assert len(first.marked) == 600 and first.calls >= 12
    next_round(s)
    second = s.sweep("q")
    assert sorted(second.requeued) == sorted(ids)
    assert r.llen(Q.rq_queue) == 600


def _hammer(url: str, rounds: int, barrier: multiprocessing.synchronize.Barrier) -> None:
    client = redis.Redis.from_url(url)
    s = Sweeper(client, ["q"], SETTINGS)
    barrier.wait()
    for _ in range(rounds):
        s.sweep("q", mode="force")


def test_eight_concurrent_sweepers_never_recover_a_job_twice(r: redis.Redis, redis_url: str) -> None:
    ids = stall(r, 300)
    sweeper(r).sweep("q", mode="force")  # everyone's marked; grace starts now
    time.sleep(sweeper(r).grace_ms / 1000 + 0.01)
    barrier = multiprocessing.Barrier(8)
    workers = [multiprocessing.Process(target=_hammer, args=(redis_url, 20, barrier)) for _ in range(8)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
        assert w.exitcode == 0
    queued = Counter(v.decode() for v in r.lrange(Q.rq_queue, 0, -1))
    assert set(queued) == set(ids)
    assert max(queued.values()) == 1  # no duplicate recovery
    assert int(r.hget(Q.stats, "recovered")) == 300
    assert all(r.hget(job_key(i), "emq_attempts") == b"1" for i in ids)


def test_marks_are_not_recovered_before_a_full_grace_window_even_by_an_unlimited_caller(
    r: redis.Redis,
) -> None:
    (job_id,) = stall(r)
    s = sweeper(r, sweep_interval_ms=2_000)
    assert s.sweep("q", mode="force").marked == [job_id]
    again = s.sweep("q", mode="force")  # e.g. a continuation call, or `rq-emq reaper --once`
    assert again.requeued == [] and again.failed == []
    assert r.llen(Q.rq_queue) == 0


def test_dependents_of_a_job_failed_at_max_attempts_follow_rqs_rules(r: redis.Redis) -> None:
    from rq.job import Dependency

    (job_id,) = stall(r)
    r.hset(job_key(job_id), mapping={"emq_attempts": 3, "emq_max_attempts": 3})
    queue = Queue("q", connection=r)
    tolerant = queue.enqueue("jobs.noop", depends_on=Dependency(jobs=[job_id], allow_failure=True))
    strict = queue.enqueue("jobs.noop", depends_on=job_id)
    s = sweeper(r)
    s.sweep("q")
    next_round(s)
    assert s.sweep("q").failed == [job_id]
    assert s.drain_outbox("q") == 1
    assert r.hget(job_key(tolerant.id), "status") == b"queued"
    assert r.hget(job_key(strict.id), "status") == b"deferred"


# -- RQ's execution records and a stale lock manager ----------------------------------------
def _worker_with_a_running_job(r: redis.Redis) -> tuple[LeaseWorker, Job, str]:
    """A LeaseWorker's lease, lock manager and RQ execution record for one job, without
    its threads: the test decides when the lock manager ticks."""
    worker = LeaseWorker(["q"], connection=r, name="frozen", **SETTINGS.__dict__)
    worker._taker = Taker(r, worker.name, worker.lease_settings)
    worker.lock_manager = worker._new_lock_manager(r)  # not started
    Queue("q", connection=r).enqueue("jobs.noop")
    taken = worker._take(1)
    assert taken is not None
    job = taken[0]
    execution = worker.prepare_execution(job)
    worker.prepare_job_execution(job)  # the horse's start, which carries the record
    return worker, job, f"{job.id}:{execution.id}"


def rq_execution_keys(r: redis.Redis) -> list[bytes]:
    return sorted(r.keys("rq:execution:*") + r.keys("rq:executions:*"))


def test_a_live_leases_tick_keeps_rqs_execution_record_ahead(r: redis.Redis) -> None:
    worker, job, member = _worker_with_a_running_job(r)
    assert worker.lock_manager is not None
    before = r.zscore(Q.started, member)
    r.expire(f"rq:execution:{member}", 1)
    for _ in range(4):  # RQ's registry scores are in whole seconds; a live lease ticks
        time.sleep(0.3)
        assert worker.lock_manager.tick() == []
    assert r.zscore(Q.started, member) > before  # type: ignore[operator]
    assert r.ttl(f"rq:execution:{member}") > 1


def test_a_stale_tick_after_the_recovery_recreates_none_of_rqs_execution_records(r: redis.Redis) -> None:
    """The worker froze past its lease; the sweep recovered its job and removed RQ's view
    of the run; then the worker wakes and its lock manager ticks before it learns why."""
    worker, job, member = _worker_with_a_running_job(r)
    assert worker.lock_manager is not None
    assert r.zscore(Q.started, member) is not None and r.exists(f"rq:execution:{member}")
    r.delete(Q.lock(job.id))
    r.zadd(Q.leases, {job.id: 0})
    s = sweeper(r)
    s.sweep("q")
    next_round(s)
    assert s.sweep("q").requeued == [job.id]
    assert rq_execution_keys(r) == [] and r.zcard(Q.started) == 0
    assert worker.lock_manager.tick() == [job.id]
    assert rq_execution_keys(r) == [] and r.zcard(Q.started) == 0


def test_a_tick_racing_the_finish_recreates_none_of_rqs_execution_records(r: redis.Redis) -> None:
    worker, job, member = _worker_with_a_running_job(r)
    assert worker.lock_manager is not None
    lease = worker.lock_manager.get(job.id)
    assert lease is not None and lease.fence.release(r)  # the fenced finish released it...
    with r.pipeline() as pipe:  # ...and RQ's finish removed its execution
        pipe.delete(f"rq:execution:{member}", f"rq:executions:{job.id}").zrem(Q.started, member)
        pipe.execute()
    assert worker.lock_manager.tick() == []
    assert lease.settled
    assert rq_execution_keys(r) == [] and r.zcard(Q.started) == 0


def test_a_mark_stands_at_least_one_renew_interval_when_sweeps_come_faster(r: redis.Redis) -> None:
    """After a Redis stall lets every lease lapse at once, a live holder gets one renew
    interval to come back, however often the sweep runs: at the shortest sweep interval
    its renew interval allows, and rounds forced faster still (``rq-emq sweep``)."""
    (job_id,) = stall(r)
    s = sweeper(r, lease_ms=5_000, renew_interval_ms=1_000, sweep_interval_ms=1_563)
    assert s.grace_ms >= 1_000
    assert s.sweep("q", mode="force").marked == [job_id]
    for _ in range(3):  # rounds 0.3 s apart, inside the renew interval
        time.sleep(0.3)
        report = s.sweep("q", mode="force")
        assert report.requeued == [] and report.failed == []
    assert r.zscore(Q.stalled, job_id) is not None
    time.sleep(s.grace_ms / 1000 - 0.9 + 0.05)
    assert s.sweep("q", mode="force").requeued == [job_id]


def test_a_marked_job_whose_lock_is_back_is_unmarked_not_recovered(r: redis.Redis) -> None:
    (job_id,) = stall(r)
    s = sweeper(r)
    assert s.sweep("q").marked == [job_id]
    r.set(Q.lock(job_id), "holder", px=5_000)  # its holder set it again (the mark stays)
    next_round(s)
    report = s.sweep("q")
    assert report.requeued == [] and report.failed == [] and report.unmarked == 1
    assert r.zscore(Q.stalled, job_id) is None and r.llen(Q.rq_queue) == 0


def test_a_stale_deadline_whose_lock_lives_is_moved_to_the_locks_end_not_marked(r: redis.Redis) -> None:
    queue = Queue("q", connection=r)
    job = queue.enqueue("jobs.noop")
    taken = Taker(r, "live-worker", SETTINGS).pop(["q"])
    assert taken is not None
    r.zadd(Q.leases, {job.id: 0})  # a deadline behind its lock (e.g. a renewal's reply lost)
    report = sweeper(r).sweep("q")
    assert report.marked == [] and r.zscore(Q.stalled, job.id) is None
    lock_ends = time.time() * 1000 + r.pttl(Q.lock(job.id))
    assert r.zscore(Q.leases, job.id) == pytest.approx(lock_ends, abs=200)


def _failed_at_max_attempts(r: redis.Redis, s: Sweeper) -> str:
    (job_id,) = stall(r)
    r.hset(job_key(job_id), mapping={"emq_attempts": 1, "emq_max_attempts": 1})
    s.sweep("q")
    next_round(s)
    assert s.sweep("q").failed == [job_id]
    return job_id


def _claim_outbox(r: redis.Redis, claim_ms: int) -> Callable[..., list[bytes]]:
    """claim_outbox for claims of exactly ``claim_ms`` (no callback timeout, no margin)."""
    return lambda *tokens: scripts.load("claim_outbox")(r, [Q.outbox], [claim_ms, 0, 0, "rq:job:", *tokens])


def test_an_outbox_entry_is_claimed_by_one_drainer_until_its_claim_ends(r: redis.Redis) -> None:
    s = sweeper(r)
    job_id = _failed_at_max_attempts(r, s)
    claim = _claim_outbox(r, 60_000)
    first = claim("outbox:" + "a" * 32 + ":drainer-a", "outbox:" + "a" * 32 + ":spare")
    assert first == [job_id.encode(), ("outbox:" + "a" * 32 + ":drainer-a").encode()]
    assert r.zscore(Q.outbox, job_id) > time.time() * 1000 + 50_000  # claimed for claim_ms
    # while drainer A holds its claim, nobody else gets the entry
    assert claim("outbox:" + "b" * 32 + ":drainer-b") == []
    assert s.drain_outbox("q") == 0
    assert Job.fetch(job_id, connection=r).results() == []
    assert r.hget(job_key(job_id), "emq_token") == ("outbox:" + "a" * 32 + ":drainer-a").encode()


def test_a_drainer_whose_claim_was_taken_over_writes_no_result(r: redis.Redis) -> None:
    s = sweeper(r)
    job_id = _failed_at_max_attempts(r, s)
    slow = "outbox:" + "a" * 32 + ":slow-drainer"
    assert _claim_outbox(r, 1)(slow) == [job_id.encode(), slow.encode()]
    time.sleep(0.01)  # its claim ends; another drainer takes the entry over
    successor = "outbox:" + "b" * 32 + ":successor"
    assert _claim_outbox(r, 60_000)(successor) == [job_id.encode(), successor.encode()]
    assert s._complete_failure("q", job_id, slow) == 0  # the slow one commits late: fenced
    assert Job.fetch(job_id, connection=r).results() == []
    assert r.zscore(Q.outbox, job_id) is not None  # still the successor's to complete
    assert s._complete_failure("q", job_id, successor) == 1
    assert len(Job.fetch(job_id, connection=r).results()) == 1 and r.zcard(Q.outbox) == 0


def test_a_sweeper_that_starts_sweeps_at_once_not_after_a_random_phase(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    (job_id,) = stall(r)
    monkeypatch.setattr("rq_emq.recover.sweep.random.uniform", lambda low, high: high)  # the longest phase
    s = Sweeper(r, ["q"], LeaseSettings(lease_ms=60_000, sweep_interval_ms=60_000))
    s.start()
    try:
        deadline = time.monotonic() + 5
        while r.zscore(Q.stalled, job_id) is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert r.zscore(Q.stalled, job_id) is not None  # marked by the first round, within 5 s
    finally:
        s.stop()
