"""Leases across RQ's whole job lifecycle, driven directly against a real Redis.

A lease is in flight only while its holder owns the job *and* nothing RQ did has changed
the job since the lease's own last write. Whatever RQ ends or moves (cancel, stock
cleanup failing or requeueing it, delete, a requeue from failed) is left as RQ put it:
never recovered, never run again, never overwritten by a late outcome. (Real worker
processes for the same promises: ``test_lifecycle_processes.py``.)
"""

from __future__ import annotations

import time

import pytest
import redis
from helpers import rq_moves
from rq import Queue
from rq.job import Job
from rq.registry import FailedJobRegistry

import rq_emq
from rq_emq import scripts
from rq_emq.fence.fencing import Fence, LeaseLost, fenced
from rq_emq.fence.packing import MAX_PACKED_ARGS
from rq_emq.hold.lease import Lease, LockManager
from rq_emq.intake.take import Taker
from rq_emq.keys import QueueKeys, job_key
from rq_emq.recover.sweep import Sweeper
from rq_emq.settings import MAX_INTERVAL_MS, LeaseSettings, SettingsError

pytestmark = pytest.mark.rq_versions

SETTINGS = LeaseSettings(lease_ms=1_000, renew_interval_ms=200, sweep_interval_ms=313, sweep_batch=50)
Q = QueueKeys("q")


def take(r: redis.Redis, worker: str = "w1") -> Lease:
    taken = Taker(r, worker, SETTINGS).pop(["q"])
    assert taken is not None
    return Lease("q", taken.job_id, taken.token)


def lapse(r: redis.Redis, job_id: str) -> None:
    """What time does to a dead holder's lease: the lock is gone, the deadline passed."""
    r.delete(Q.lock(job_id))
    r.zadd(Q.leases, {job_id: 0})


def sweep_twice(r: redis.Redis) -> tuple[Sweeper, list[object]]:
    """A marking round, then (past the grace) the round that may recover."""
    s = Sweeper(r, ["q"], SETTINGS)
    first = s.sweep("q")
    time.sleep(s.grace_ms / 1000 + 0.01)
    return s, [first, s.sweep("q")]


def start(r: redis.Redis, lease: Lease) -> None:
    """The horse's guarded start: RQ marks the job started, under the lease."""
    with fenced(r, lease.fence, release=False):
        pipe = r.pipeline()
        pipe.hset(job_key(lease.job_id), mapping={"status": "started", "worker_name": "w1"})
        pipe.execute()


def finish(r: redis.Redis, lease: Lease, status: str = "finished") -> None:
    with fenced(r, lease.fence):
        pipe = r.pipeline()
        pipe.hset(job_key(lease.job_id), "status", status)
        pipe.execute()


def queued_ids(r: redis.Redis) -> list[str]:
    return [v.decode() for v in r.lrange(Q.rq_queue, 0, -1)]


def status(r: redis.Redis, job_id: str) -> str | None:
    value = r.hget(job_key(job_id), "status")
    return value.decode() if value else None


# -- the fence is spent only by the outcome -----------------------------------------------
def test_a_read_only_transaction_inside_the_finish_does_not_spend_the_fence(r: redis.Redis) -> None:
    queue = Queue("q", connection=r)
    parent = queue.enqueue("jobs.noop")
    dependent = queue.enqueue("jobs.noop", depends_on=parent)
    lease = take(r)
    start(r, lease)
    with fenced(r, lease.fence):
        # RQ 3 reads the dependents with a MULTI/EXEC of HGETALLs before its outcome
        (fetched,) = Job.fetch_many([dependent.id], connection=r)
        assert fetched is not None and fetched.id == dependent.id
        assert r.hget(job_key(parent.id), "emq_token").decode() == lease.token  # still ours
        assert r.exists(Q.lock(parent.id))
        pipe = r.pipeline()
        pipe.hset(job_key(parent.id), "status", "finished")
        pipe.execute()
    assert status(r, parent.id) == "finished"
    assert r.hget(job_key(parent.id), "emq_token").decode() == "done:" + lease.token
    assert r.zscore(Q.leases, parent.id) is None


def test_a_stale_holders_outcome_with_dependents_is_fenced_out(r: redis.Redis) -> None:
    queue = Queue("q", connection=r)
    parent = queue.enqueue("jobs.noop")
    dependent = queue.enqueue("jobs.noop", depends_on=parent)
    stale = take(r)
    start(r, stale)
    lapse(r, parent.id)
    _, (_, recovery) = sweep_twice(r)
    assert recovery.requeued == [parent.id]  # type: ignore[attr-defined]
    with pytest.raises(LeaseLost), fenced(r, stale.fence):
        Job.fetch_many([dependent.id], connection=r)  # a read first, as RQ 3 does
        pipe = r.pipeline()
        pipe.hset(job_key(parent.id), "status", "finished")
        pipe.srem(parent.dependents_key, dependent.id)
        pipe.execute()  # refused: nothing written
    assert status(r, parent.id) == "queued"
    assert r.smembers(parent.dependents_key) == {dependent.id.encode()}


def test_a_finish_with_a_command_longer_than_luas_unpack_limit_commits_whole(r: redis.Redis) -> None:
    Queue("q", connection=r).enqueue("jobs.noop")
    lease = take(r)
    ids = [f"dependent-{i}" for i in range(10_000)]
    r.sadd("fan-in:dependents", *ids, "keeps-waiting")
    r.zadd("ready", {"existing": 1})
    with fenced(r, lease.fence):
        pipe = r.pipeline()
        pipe.srem("fan-in:dependents", *ids)
        pipe.zadd("ready", {job_id: 2 for job_id in ids})
        pipe.rpush("ready-list", *ids)
        pipe.hset(job_key(lease.job_id), "status", "finished")
        replies = pipe.execute()
    assert len(ids) + 2 > MAX_PACKED_ARGS
    assert replies[:3] == [10_000, 10_000, 10_000]  # each command's reply, as EXEC gives it
    assert r.smembers("fan-in:dependents") == {b"keeps-waiting"}
    assert r.zcard("ready") == 10_001 and r.llen("ready-list") == 10_000
    assert r.lindex("ready-list", 0) == b"dependent-0" and r.lindex("ready-list", -1) == b"dependent-9999"
    assert r.hget(job_key(lease.job_id), "emq_token").decode() == "done:" + lease.token


def test_once_the_fenced_outcome_failed_no_later_transaction_of_the_block_releases_the_lease(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RQ 2 runs its failure pipeline twice, the first under suppress(ConnectionError):
    the second batch (worker stats) must not pass as the outcome."""
    Queue("q", connection=r).enqueue("jobs.noop")
    lease = take(r)
    start(r, lease)
    original = redis.client.Pipeline.execute
    calls = {"n": 0}

    def blip_once(self: redis.client.Pipeline, *args: object, **kwargs: object) -> object:
        calls["n"] += 1
        if calls["n"] == 1:
            raise redis.exceptions.ConnectionError("blip")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(redis.client.Pipeline, "execute", blip_once)
    with pytest.raises(redis.exceptions.ConnectionError), fenced(r, lease.fence) as session:
        first = r.pipeline()
        first.hset(job_key(lease.job_id), "status", "failed")
        try:
            first.execute()
        except redis.exceptions.ConnectionError:
            pass  # what RQ 2's suppress does
        second = r.pipeline()
        second.hincrby("rq:worker:w1", "failed_job_count", 1)
        second.execute()
    assert session.error is not None and not session.committed
    assert r.hget(job_key(lease.job_id), "emq_token").decode() == lease.token  # the lease lives on
    assert r.exists(Q.lock(lease.job_id)) and status(r, lease.job_id) == "started"


# -- the sweep leaves what RQ ended -------------------------------------------------------
@pytest.mark.parametrize("ended_as", ["canceled", "failed", "stopped", "finished"])
def test_the_sweep_never_recovers_a_job_rq_ended_while_it_was_leased(r: redis.Redis, ended_as: str) -> None:
    job = Queue("q", connection=r).enqueue("jobs.noop")
    lease = take(r)
    start(r, lease)
    rq_moves(r, job.id, ended_as)  # job.cancel(), stock cleanup, an operator...
    lapse(r, job.id)  # ...then its worker dies
    _, (first, second) = sweep_twice(r)
    assert second.requeued == [] and second.failed == []  # type: ignore[attr-defined]
    assert job.id in first.ended + second.ended  # type: ignore[attr-defined]
    assert status(r, job.id) == ended_as and queued_ids(r) == []
    assert r.zscore(Q.leases, job.id) is None and r.zscore(Q.stalled, job.id) is None
    assert r.zcard(Q.outbox) == 0


def test_a_job_stock_cleanup_requeued_is_not_queued_twice(r: redis.Redis) -> None:
    job = Queue("q", connection=r).enqueue("jobs.noop")
    lease = take(r)
    start(r, lease)
    # stock cleanup through Retry: status queued, back in its queue
    r.hset(job_key(job.id), "status", "queued")
    r.rpush(Q.rq_queue, job.id)
    lapse(r, job.id)
    sweep_twice(r)
    assert queued_ids(r) == [job.id]


def test_a_worker_that_dies_between_the_take_and_the_start_still_has_its_job_recovered(
    r: redis.Redis,
) -> None:
    job = Queue("q", connection=r).enqueue("jobs.noop")
    take(r)  # RQ's status is still `queued` here: that is not "RQ requeued it"
    lapse(r, job.id)
    _, (_, second) = sweep_twice(r)
    assert second.requeued == [job.id]  # type: ignore[attr-defined]
    assert queued_ids(r) == [job.id] and status(r, job.id) == "queued"


def test_a_job_canceled_while_in_the_moving_list_is_not_recovered(r: redis.Redis) -> None:
    job = Queue("q", connection=r).enqueue("jobs.noop")
    r.lmove(Q.rq_queue, Q.moving)  # a worker's BLMOVE, then it died
    r.hset(job_key(job.id), "status", "canceled")
    _, (first, second) = sweep_twice(r)
    assert first.marked == [job.id] and second.ended == [job.id]  # type: ignore[attr-defined]
    assert queued_ids(r) == [] and r.llen(Q.moving) == 0 and status(r, job.id) == "canceled"


def test_a_late_outcome_for_a_job_rq_ended_is_discarded_and_releases_the_lease(r: redis.Redis) -> None:
    job = Queue("q", connection=r).enqueue("jobs.noop")
    lease = take(r)
    start(r, lease)
    rq_moves(r, job.id, "canceled")  # canceled while it ran
    with pytest.raises(LeaseLost):
        finish(r, lease, "finished")  # its worker lives and finishes: RQ's cancel stands
    assert status(r, job.id) == "canceled"
    assert r.zscore(Q.leases, job.id) is None and not r.exists(Q.lock(job.id))
    assert int(r.hget(Q.stats, "ended_by_rq") or 0) == 1
    manager = LockManager(r, SETTINGS.lease_ms, SETTINGS.renew_interval_ms, on_lost=lambda lease: None)
    manager.add(lease)
    assert manager.tick() == [] and lease.settled  # no lease_lost for a job RQ ended


def test_a_status_that_left_and_came_back_is_not_the_leases(r: redis.Redis) -> None:
    """The ABA: the job was requeued and started again by someone else (a stock worker)
    while the lease's holder was gone; its status reads `started` again, as the lease
    left it, but its start stamp is another's: the lease is ended, not in flight."""
    job = Queue("q", connection=r).enqueue("jobs.noop")
    lease = take(r)
    start(r, lease)
    rq_moves(r, job.id, "queued", enqueued_at="2030-01-01T00:00:00.000001Z")
    r.lrem(Q.rq_queue, 0, job.id)  # a stock worker took it...
    rq_moves(r, job.id, "started", started_at="2030-01-01T00:00:01.000001Z")  # ...and runs it
    with pytest.raises(LeaseLost):
        finish(r, lease, "finished")
    assert status(r, job.id) == "started"
    assert int(r.hget(Q.stats, "ended_by_rq") or 0) == 1


def test_the_sweep_leaves_a_job_whose_status_came_back_under_another_start(r: redis.Redis) -> None:
    job = Queue("q", connection=r).enqueue("jobs.noop")
    lease = take(r)
    start(r, lease)
    lapse(r, job.id)  # its holder died
    rq_moves(r, job.id, "queued", enqueued_at="2030-01-01T00:00:00.000001Z")
    r.lrem(Q.rq_queue, 0, job.id)  # a stock worker took it...
    rq_moves(r, job.id, "started", started_at="2030-01-01T00:00:01.000001Z")  # ...and runs it
    _, (first, second) = sweep_twice(r)
    assert first.marked == [job.id] and second.ended == [job.id]  # type: ignore[attr-defined]
    assert second.requeued == [] and status(r, job.id) == "started"  # type: ignore[attr-defined]
    assert queued_ids(r) == []


def test_a_start_refused_because_rq_ended_the_job_leaves_the_lease_to_lapse(r: redis.Redis) -> None:
    """The refusal of a run's own write proves nothing about the run's end: its lease and
    lock stay (a copy of the job enqueued again is held back by the lock) until its holder,
    which renews it no more, lets it lapse; the sweep then leaves the job as RQ put it."""
    job = Queue("q", connection=r).enqueue("jobs.noop")
    lease = take(r)
    rq_moves(r, job.id, "canceled")  # canceled between the take and the start
    with pytest.raises(LeaseLost):
        start(r, lease)
    assert status(r, job.id) == "canceled"
    assert r.get(Q.lock(job.id)) == lease.token.encode() and r.zscore(Q.leases, job.id) is not None
    time.sleep(SETTINGS.lease_ms / 1000 + 0.05)  # renewed no more, its lock lapses
    assert not r.exists(Q.lock(job.id))
    sweeper = Sweeper(r, ["q"], SETTINGS)
    for _ in range(3):  # mark, then (past the mark's grace) let go: a job RQ ended stays put
        sweeper.sweep("q", mode="force")
        time.sleep(SETTINGS.sweep_interval_ms / 1000)
    assert status(r, job.id) == "canceled" and queued_ids(r) == []
    assert r.zscore(Q.leases, job.id) is None


def test_a_refused_write_in_the_middle_of_a_run_leaves_its_lock_and_its_lease(r: redis.Redis) -> None:
    """RQ enqueued the running job again; the run's own guarded write is refused, and the
    lease stays whole: the lock holds the new entry's take back, and the next renewal still
    renews it (the run is not settled: its deadline holds)."""
    queue = Queue("q", connection=r)
    job = queue.enqueue("jobs.noop")
    lease = take(r)
    start(r, lease)
    queue.enqueue_job(Job.fetch(job.id, connection=r))  # a web process enqueues it again
    with pytest.raises(LeaseLost):
        start(r, lease)  # a guarded write of the run's own
    assert r.get(Q.lock(job.id)) == lease.token.encode() and r.zscore(Q.leases, job.id) is not None
    assert r.hget(job_key(job.id), "emq_token") == lease.token.encode()
    manager = LockManager(r, SETTINGS.lease_ms, SETTINGS.renew_interval_ms, on_lost=lambda _: None)
    manager.add(lease)
    manager.tick()
    assert not lease.settled and not lease.lost


def test_a_cold_stop_does_not_hand_back_a_job_rq_ended(r: redis.Redis) -> None:
    job = Queue("q", connection=r).enqueue("jobs.noop")
    lease = take(r)
    rq_moves(r, job.id, "canceled")
    assert lease.hand_back(r) is False
    assert queued_ids(r) == [] and status(r, job.id) == "canceled"


def test_a_cold_stop_hands_back_without_scanning_the_queue(r: redis.Redis) -> None:
    queue = Queue("q", connection=r)
    job = queue.enqueue("jobs.noop")
    lease = take(r)
    for _ in range(3):
        queue.enqueue("jobs.noop")
    assert lease.hand_back(r) is True
    assert queued_ids(r)[0] == job.id and len(queued_ids(r)) == 4
    assert r.hget(job_key(job.id), "emq_attempts") == b"0"


# -- the failure outbox ---------------------------------------------------------------------
def _fail_at_max_attempts(r: redis.Redis, **enqueue: object) -> tuple[Job, Sweeper]:
    job = Queue("q", connection=r).enqueue("jobs.noop", **enqueue)  # type: ignore[arg-type]
    take(r)
    r.hset(job_key(job.id), "emq_max_attempts", 1)
    lapse(r, job.id)
    s, (_, second) = sweep_twice(r)
    assert second.failed == [job.id]  # type: ignore[attr-defined]
    return job, s


def test_the_outbox_drain_never_takes_a_lease_from_a_job_requeued_since(r: redis.Redis) -> None:
    job, s = _fail_at_max_attempts(r)
    FailedJobRegistry("q", connection=r).requeue(job.id)  # an operator's `rq requeue`
    worker_b = take(r, "worker-b")
    assert worker_b.job_id == job.id
    assert s.drain_outbox("q") == 0
    assert r.hget(job_key(job.id), "emq_token").decode() == worker_b.token
    assert r.zcard(Q.outbox) == 0 and Job.fetch(job.id, connection=r).results() == []
    manager = LockManager(r, SETTINGS.lease_ms, SETTINGS.renew_interval_ms, on_lost=lambda lease: None)
    manager.add(worker_b)
    assert manager.tick() == []  # worker B still holds it


def test_the_outbox_drain_skips_a_job_failed_again_by_its_own_run(r: redis.Redis) -> None:
    job, s = _fail_at_max_attempts(r)
    FailedJobRegistry("q", connection=r).requeue(job.id)
    worker_b = take(r, "worker-b")
    start(r, worker_b)
    finish(r, worker_b, "failed")  # B's own run failed, with its own Result
    assert s.drain_outbox("q") == 0
    assert Job.fetch(job.id, connection=r).results() == []


def test_a_completed_stall_failure_counts_as_an_outbox_completion_not_a_finish(r: redis.Redis) -> None:
    job, s = _fail_at_max_attempts(r)
    assert s.drain_outbox("q") == 1
    stats = {k.decode(): int(v) for k, v in r.hgetall(Q.stats).items()}
    assert stats.get("outbox_completed") == 1 and stats.get("finished", 0) == 0
    assert len(Job.fetch(job.id, connection=r).results()) == 1


def test_an_outbox_claim_outlives_the_jobs_failure_callback(r: redis.Redis) -> None:
    job, _ = _fail_at_max_attempts(r, on_failure=rq_emq_failure_callback(timeout=300))
    before = time.time() * 1000
    claim = [1_000, 30_000, 60, "rq:job:", "outbox:claim-token"]
    assert scripts.load("claim_outbox")(r, [Q.outbox], claim)[0] == job.id.encode()
    due = r.zscore(Q.outbox, job.id)
    assert due is not None and due >= before + 300_000 + 30_000 - 1_000


def rq_emq_failure_callback(timeout: int) -> object:
    from rq import Callback

    return Callback("jobs.on_failure_record", timeout=timeout)


# -- result_ttl=0 and other finishes that delete the job ---------------------------------
def test_a_renewal_racing_a_finish_that_deleted_the_job_reads_settled_not_lost(r: redis.Redis) -> None:
    Queue("q", connection=r).enqueue("jobs.noop", result_ttl=0)
    lease = take(r)
    lost: list[Lease] = []
    manager = LockManager(r, SETTINGS.lease_ms, SETTINGS.renew_interval_ms, on_lost=lost.append)
    manager.add(lease)
    with fenced(r, lease.fence):
        pipe = r.pipeline()
        pipe.delete(job_key(lease.job_id))  # what RQ's finish does with result_ttl=0
        pipe.execute()
    assert manager.tick() == [] and lost == [] and lease.settled
    assert int(r.hget(Q.stats, "lease_lost") or 0) == 0


def test_a_job_deleted_while_it_runs_is_a_lost_lease(r: redis.Redis) -> None:
    Queue("q", connection=r).enqueue("jobs.noop")
    lease = take(r)
    lost: list[Lease] = []
    manager = LockManager(r, SETTINGS.lease_ms, SETTINGS.renew_interval_ms, on_lost=lost.append)
    manager.add(lease)
    Job.fetch(lease.job_id, connection=r).delete()
    assert manager.tick() == [lease.job_id] and lost == [lease]


def test_a_lease_whose_evidence_vanished_is_lost_not_settled(r: redis.Redis) -> None:
    """Redis lost its data while the job ran (a restart without persistence; here FLUSHALL):
    no hash, no owner, no index entry, no lock. Only the holder's own finish settles a
    lease, and this one left nothing: the lease is lost and its run stops."""
    Queue("q", connection=r).enqueue("jobs.noop", result_ttl=0)
    lease = take(r)
    lost: list[Lease] = []
    manager = LockManager(r, SETTINGS.lease_ms, SETTINGS.renew_interval_ms, on_lost=lost.append)
    manager.add(lease)
    r.flushall()
    assert manager.tick() == [lease.job_id] and lost == [lease] and not lease.settled


# -- bad input never crashes a worker, never loses a job ----------------------------------
@pytest.mark.parametrize("value", [True, "5", 5.0, 0, -1, 10**9, None])
def test_max_attempts_helper_rejects_anything_but_a_sane_whole_number(value: object) -> None:
    with pytest.raises(SettingsError, match="max_attempts"):
        rq_emq.max_attempts(value)  # type: ignore[arg-type]


def test_settings_have_upper_bounds() -> None:
    with pytest.raises(SettingsError, match="lease_ms"):
        LeaseSettings(lease_ms=100_000_000_000_000_000)
    with pytest.raises(SettingsError, match="max_attempts"):
        LeaseSettings(max_attempts=10**6)
    assert LeaseSettings(lease_ms=MAX_INTERVAL_MS, renew_interval_ms=1_000).lease_ms == MAX_INTERVAL_MS


def test_a_take_whose_lease_cannot_be_written_leaves_the_job_in_its_queue(r: redis.Redis) -> None:
    job = Queue("q", connection=r).enqueue("jobs.noop")
    args = ["token", "w1", 100_000_000_000_000_000, 100, Q.prefix]  # a lease Redis refuses
    with pytest.raises(redis.ResponseError):
        scripts.load("pop_job")(r, [Q.rq_queue, Q.leases, Q.stats], args)
    assert queued_ids(r) == [job.id]


@pytest.mark.parametrize("raw", ["nan", "1e3", "-4", "2.5", "inf", " 7", "x"])
def test_malformed_attempt_counts_read_as_absent_everywhere(r: redis.Redis, raw: str) -> None:
    job = Queue("q", connection=r).enqueue("jobs.noop")
    r.hset(job_key(job.id), mapping={"emq_attempts": raw, "emq_max_attempts": raw})
    taken = Taker(r, "w1", SETTINGS).pop(["q"])
    assert taken is not None and taken.attempts == 1
    r.hset(job_key(job.id), "emq_max_attempts", raw)
    lapse(r, job.id)
    _, (_, second) = sweep_twice(r)
    # attempt 1 of the default 3: requeued, neither exempt from max attempts nor failed early
    assert second.requeued == [job.id]  # type: ignore[attr-defined]
    assert r.hget(job_key(job.id), "emq_attempts") == b"1"


def test_a_fenced_finish_records_the_jobs_own_max_attempts_with_its_start(r: redis.Redis) -> None:
    Queue("q", connection=r).enqueue("jobs.noop")
    lease = take(r)
    lease.max_attempts = 7
    start(r, lease)
    assert r.hget(job_key(lease.job_id), "emq_max_attempts") == b"7"
    assert r.hget(job_key(lease.job_id), "emq_status") == b"started"


def test_fence_counters_name_what_was_written(r: redis.Redis) -> None:
    Queue("q", connection=r).enqueue("jobs.noop")
    lease = take(r)
    fence = Fence("q", lease.job_id, lease.token, counter="unreadable")
    assert fence.release(r) is True
    assert int(r.hget(Q.stats, "unreadable") or 0) == 1 and r.hget(Q.stats, "finished") is None


def test_renewals_stamp_rqs_job_heartbeat_only_at_rqs_pace(r: redis.Redis) -> None:
    """RQ WATCHes a finished job's hash while it checks its dependents: a renewal writing
    to it every tick would make a big fan-in parent's finish retry forever."""
    Queue("q", connection=r).enqueue("jobs.noop")
    lease = take(r)
    manager = LockManager(r, SETTINGS.lease_ms, SETTINGS.renew_interval_ms, on_lost=lambda _: None)
    manager.add(lease)
    assert manager.tick() == []
    stamped = r.hget(job_key(lease.job_id), "last_heartbeat")
    assert stamped is not None  # the first tick stamps it, as RQ's heartbeat would
    r.hset(job_key(lease.job_id), "last_heartbeat", "untouched")
    for _ in range(3):
        assert manager.tick() == []
    assert r.hget(job_key(lease.job_id), "last_heartbeat") == b"untouched"
    assert r.pttl(Q.lock(lease.job_id)) > 0 and int(r.hget(Q.stats, "renewed") or 0) == 4


def test_a_watch_that_fires_inside_the_fenced_finish_lets_rqs_retry_commit(r: redis.Redis) -> None:
    """RQ's success path WATCHes the dependents key and retries on WatchError: a fired
    WATCH wrote nothing, so the retry must be free to commit the outcome."""
    Queue("q", connection=r).enqueue("jobs.noop")
    lease = take(r)
    scripts.load_all(r)  # as a worker does at startup (a NOSCRIPT retry would add a try)
    other = redis.Redis(connection_pool=redis.ConnectionPool(**r.connection_pool.connection_kwargs))
    tries = 0
    with fenced(r, lease.fence), r.pipeline() as pipe:
        while True:
            tries += 1
            try:
                pipe.watch("parent:dependents")
                pipe.smembers("parent:dependents")  # RQ reads the dependents it watches: WATCH rides with it
                if tries == 1:
                    other.sadd("parent:dependents", "a-new-dependent")  # the WATCH fires
                pipe.multi()
                pipe.hset(job_key(lease.job_id), "status", "finished")
                pipe.execute()
                break
            except redis.WatchError:
                assert tries < 5, "the fenced finish never commits after a fired WATCH"
                continue
    assert tries == 2 and status(r, lease.job_id) == "finished"
    assert r.hget(job_key(lease.job_id), "emq_token").decode() == "done:" + lease.token


# -- evidence, not absence: a changed field is not RQ's word (issue 33, rule 1) ------------
def stale_save(r: redis.Redis, job_id: str, status: str = "queued") -> None:
    """A web process's ``job.save()`` of a copy read earlier: the old status written back,
    the job put nowhere."""
    r.hset(job_key(job_id), mapping={"status": status, "meta": "stale"})


def test_a_finish_after_a_stale_save_writes_the_runs_outcome(r: redis.Redis) -> None:
    job = Queue("q", connection=r).enqueue("jobs.noop")
    lease = take(r)
    start(r, lease)
    stale_save(r, job.id)  # status queued, in no queue list
    finish(r, lease, "finished")  # RQ's outcome goes through: the job was still this run's
    assert status(r, job.id) == "finished" and queued_ids(r) == []
    assert r.zscore(Q.leases, job.id) is None and not r.exists(Q.lock(job.id))
    assert int(r.hget(Q.stats, "ended_by_rq") or 0) == 0


@pytest.mark.parametrize("limited", [False, True], ids=["saved as rate_limited", "rate limited by RQ"])
def test_a_rate_limited_status_is_read_from_the_limits_waiting_set(r: redis.Redis, limited: bool) -> None:
    """A copy a web process read while the job waited on its rate limit (RQ 3), saved whole
    while the job runs, writes ``rate_limited`` back and puts the job in no waiting set: the
    run's outcome goes through (before: taken as RQ's word, the outcome was discarded and
    the job left in no place). Only with the job in the waiting set of the limit it names
    is the status RQ's: the run's outcome is then refused."""
    job = Queue("q", connection=r).enqueue("jobs.noop")
    lease = take(r)
    start(r, lease)
    if limited:
        rq_moves(r, job.id, "rate_limited")
    else:
        stale_save(r, job.id, "rate_limited")
        r.hset(job_key(job.id), "rate_limit_key", "api")  # the copy names its limit too
    if limited:
        with pytest.raises(LeaseLost):
            finish(r, lease, "finished")
    else:
        finish(r, lease, "finished")
    assert status(r, job.id) == ("rate_limited" if limited else "finished")
    assert int(r.hget(Q.stats, "ended_by_rq") or 0) == int(limited)
    assert r.zscore(Q.leases, job.id) is None and not r.exists(Q.lock(job.id))


def test_the_sweep_recovers_a_job_whose_dead_run_saw_a_stale_save(r: redis.Redis) -> None:
    job = Queue("q", connection=r).enqueue("jobs.noop")
    lease = take(r)
    start(r, lease)
    stale_save(r, job.id, "failed")  # a copy read after an earlier failed run: not in the registry
    lapse(r, job.id)  # then its worker dies
    _, (first, second) = sweep_twice(r)
    assert first.marked == [job.id] and second.requeued == [job.id]  # type: ignore[attr-defined]
    assert queued_ids(r) == [job.id] and status(r, job.id) == "queued"


@pytest.mark.parametrize("written", ["failed", "finished", "started", "canceled"])
def test_a_queued_job_whose_status_a_stale_save_overwrote_is_taken_not_dropped(
    r: redis.Redis, written: str
) -> None:
    """A failed job requeued by an operator, then a web process's stale save writes its old
    status back: the job sits in its queue, in no registry, and must run (it was dropped
    as a stray copy, and lost)."""
    job = Queue("q", connection=r).enqueue("jobs.noop")
    stale_save(r, job.id, written)
    lease = take(r)
    assert lease.job_id == job.id


def test_a_copy_of_a_job_a_stock_worker_runs_is_dropped(r: redis.Redis) -> None:
    queue = Queue("q", connection=r)
    job, behind = queue.enqueue("jobs.noop"), queue.enqueue("jobs.noop")
    r.lrem(Q.rq_queue, 0, job.id)
    rq_moves(r, job.id, "started")  # a stock worker took the first entry and runs it
    r.lpush(Q.rq_queue, job.id)  # the resent push
    assert take(r).job_id == behind.id and queued_ids(r) == []
    assert not r.exists(Q.lock(job.id)) and status(r, job.id) == "started"
