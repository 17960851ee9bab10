"""What a running job tells its lease, driven directly against a real Redis: a report rides
on the next renewal (no round trip of its own) and goes with the lease; a job silent past
its progress timeout has its renewals refused, for good, and the sweep then recovers it,
or fails it at max attempts saying why."""

from __future__ import annotations

import json
import os
import time

import pytest
import redis
from helpers import count_pipelines
from rq import Queue
from stalls import next_round, sweeper

import rq_emq
from rq_emq import events, scripts
from rq_emq.fence.fencing import fenced
from rq_emq.hold.lease import Lease, LockManager
from rq_emq.intake.take import Taker
from rq_emq.keys import QueueKeys, job_key
from rq_emq.run.horse_fence import REPORT_LIMIT_BYTES, HorseDeadline
from rq_emq.run.job_lease import encode_report
from rq_emq.settings import LeaseSettings, SettingsError

SETTINGS = LeaseSettings(lease_ms=2_000, renew_interval_ms=500)
Q = QueueKeys("q")


class Held:
    """One job taken, its lease in a lock manager that nothing ticks but the test."""

    def __init__(self, r: redis.Redis, progress_timeout_ms: int | None = None, **enqueue: object) -> None:
        self.r = r
        self.job = Queue("q", connection=r).enqueue("jobs.noop", **enqueue)  # type: ignore[arg-type]
        taken = Taker(r, "w1", SETTINGS).pop(["q"])
        assert taken is not None
        self.lease = Lease("q", taken.job_id, taken.token, progress_timeout_ms=progress_timeout_ms)
        self.lease.valid_until = time.monotonic() + 60
        self.stopped: list[Lease] = []
        self.manager = LockManager(
            r, SETTINGS.lease_ms, SETTINGS.renew_interval_ms, on_lost=self.stopped.append,
            on_expired=self.stopped.append,
        )  # fmt: skip
        self.manager.add(self.lease)

    def field(self, name: str) -> bytes | None:
        return self.r.hget(job_key(self.job.id), name)  # type: ignore[return-value]


# -- a report -------------------------------------------------------------------------------
def test_a_report_rides_on_the_next_renewal_and_lands_with_the_time_it_landed(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch, seen: list[events.LeaseEvent]
) -> None:
    held = Held(r)
    granted_at = int(held.field("emq_progress_at") or 0)
    assert granted_at > 0 and held.field("emq_report") is None  # the grant is the first progress
    held.lease.post_report(encode_report(0.25, {"step": "load"}))
    scripts.load_all(r)
    sent = count_pipelines(monkeypatch)
    time.sleep(0.01)
    held.manager.tick()
    assert sent == [1]  # the renewal's own round trip, its own one script call
    assert json.loads(held.field("emq_report") or b"") == {"progress": 0.25, "step": "load"}
    assert int(held.field("emq_progress_at") or 0) > granted_at
    events.flush()
    assert [(e.kind, e.job_id, e.report) for e in seen] == [
        ("reported", held.job.id, '{"progress":0.25,"step":"load"}')
    ]
    # nothing new: the next tick writes no report and tells no hook
    landed_at = held.field("emq_progress_at")
    time.sleep(0.01)
    held.manager.tick()
    events.flush()
    assert held.field("emq_progress_at") == landed_at and len(seen) == 1


def test_of_reports_between_two_ticks_only_the_newest_is_written(r: redis.Redis) -> None:
    held = Held(r)
    for step in range(5):
        held.lease.post_report(encode_report(step / 4, {}))
    held.manager.tick()
    assert json.loads(held.field("emq_report") or b"") == {"progress": 1.0}
    assert held.lease.report_sent == 5


def test_a_report_goes_when_the_lease_ends_by_a_finish_a_hand_back_or_a_recovery(r: redis.Redis) -> None:
    finished = Held(r)
    finished.lease.post_report(encode_report(1, {}))
    finished.manager.tick()
    with fenced(r, finished.lease.fence):
        r.pipeline().hset(job_key(finished.job.id), "status", "finished").execute()
    handed_back = Held(r)
    handed_back.lease.post_report(encode_report(1, {}))
    handed_back.manager.tick()
    assert handed_back.lease.hand_back(r)
    r.lrem(Q.rq_queue, 0, handed_back.job.id)  # out of the way of the next take
    recovered = Held(r)
    recovered.lease.post_report(encode_report(1, {}))
    recovered.manager.tick()
    r.delete(Q.lock(recovered.job.id))
    r.zadd(Q.leases, {recovered.job.id: 0})
    s = sweeper(r)
    s.sweep("q")
    next_round(s)
    assert s.sweep("q").requeued == [recovered.job.id]
    for held in (finished, handed_back, recovered):
        assert held.field("emq_report") is None and held.field("emq_progress_at") is None


def test_a_report_from_a_horse_crosses_the_memory_it_shares_with_its_worker() -> None:
    shared = HorseDeadline()
    shared.reset(time.monotonic() + 60)
    assert shared.read_report() is None
    pid = os.fork()
    if pid == 0:  # the horse
        shared.post_report('{"progress":1}')
        shared.post_report('{"progress":2}')
        os._exit(0)
    os.waitpid(pid, 0)
    number, text = shared.read_report() or (0, "")
    assert text == '{"progress":2}' and number > 0
    lease = Lease("q", "j", "t", report_source=shared.read_report)
    assert lease.pending_report() == (number, text)
    lease.report_sent = number
    assert lease.pending_report() is None  # sent once
    shared.reset(time.monotonic() + 60)  # the next run starts with none
    assert shared.read_report() is None


@pytest.mark.parametrize(
    ("progress", "details", "why"),
    [
        (object(), {}, "must be JSON"),
        (float("nan"), {}, "must be JSON"),
        ("x" * REPORT_LIMIT_BYTES, {}, f"at most {REPORT_LIMIT_BYTES} bytes"),
        (1, {"when": time}, "must be JSON"),
    ],
)
def test_a_report_that_is_not_small_json_is_refused_by_name(
    progress: object, details: dict, why: str
) -> None:
    with pytest.raises(ValueError, match=why):
        encode_report(progress, details)


# -- the progress timeout --------------------------------------------------------------------
def test_a_job_that_reports_within_its_progress_timeout_keeps_its_lease(r: redis.Redis) -> None:
    held = Held(r, progress_timeout_ms=300)
    for step in range(8):  # 1.6 s in all: five progress timeouts
        time.sleep(0.1)
        held.lease.post_report(encode_report(step, {}))
        held.manager.tick()
        time.sleep(0.1)
        held.manager.tick()  # a tick with no new report: the last one's time counts
    assert held.stopped == [] and not held.lease.lost
    assert r.pttl(Q.lock(held.job.id)) > SETTINGS.lease_ms - 500


def test_a_job_silent_past_its_progress_timeout_is_refused_for_good_and_its_run_stopped(
    r: redis.Redis, seen: list[events.LeaseEvent]
) -> None:
    held = Held(r, progress_timeout_ms=200)
    held.manager.tick()
    assert held.stopped == []
    held.lease.post_report(encode_report("last words", {}))
    held.manager.tick()
    time.sleep(0.25)
    lock_ttl = r.pttl(Q.lock(held.job.id))
    held.manager.tick()
    # stopped as a run whose lease clock ran out: its writes fenced out, the lock not renewed
    assert held.stopped == [held.lease] and held.lease.expired and held.lease.lost
    assert 0 < r.pttl(Q.lock(held.job.id)) <= lock_ttl
    assert held.field("emq_no_progress") == b"no progress for 200 ms"
    assert r.hget(Q.stats, "no_progress") == b"1"
    events.flush()
    assert [e.report for e in seen if e.kind == "no_progress"] == ['{"progress":"last words"}']
    # a report after the refusal (a tick whose reply was lost sends one more) revives nothing
    args = [
        SETTINGS.lease_ms,
        Q.prefix,
        "",
        Q.job_prefix,
        held.job.id,
        held.lease.token,
        '{"progress":9}',
        "200",
    ]
    lost, settled, stuck, malformed = scripts.load("renew_leases")(r, [Q.leases, Q.stalled, Q.stats], args)
    assert stuck == [held.job.id.encode()] and lost == [] and settled == [] and malformed == []
    assert 0 < r.pttl(Q.lock(held.job.id)) <= lock_ttl


def test_a_silent_job_is_recovered_by_the_sweep_and_at_max_attempts_failed_saying_why(
    r: redis.Redis,
) -> None:
    again = Held(r, progress_timeout_ms=100)
    last = Held(r, progress_timeout_ms=100)
    r.hset(job_key(last.job.id), "emq_max_attempts", 1)  # as the worker's start records it
    time.sleep(0.15)
    again.manager.tick()
    last.manager.tick()
    assert again.lease.lost and last.lease.lost
    for held in (again, last):  # the lock lapses: its holder renews no more
        r.delete(Q.lock(held.job.id))
        r.zadd(Q.leases, {held.job.id: 0})
    s = sweeper(r)
    s.sweep("q")
    next_round(s)
    report = s.sweep("q")
    assert report.requeued == [again.job.id] and report.failed == [last.job.id]
    assert again.field("emq_no_progress") is None  # the next grant starts clean
    assert s.drain_outbox("q") == 1
    (result,) = last.job.results()
    assert "no progress for 100 ms on attempt 1 of 1" in (result.exc_string or "")


def test_progress_timeout_composes_with_max_attempts_and_refuses_nonsense_by_name() -> None:
    meta = rq_emq.progress_timeout(60_000, rq_emq.max_attempts(3, {"mine": 1}))
    assert meta == {"mine": 1, "emq_max_attempts": 3, "emq_progress_timeout_ms": 60_000}
    for wrong in (0, -5, 1.5, "60000", True, 10**12):
        with pytest.raises(SettingsError, match="progress_timeout"):
            rq_emq.progress_timeout(wrong)  # type: ignore[arg-type]
