"""A model-based test of the lease protocol against a real Redis.

Hypothesis drives holders through take, renew, pause, resume, lapse (what a paused or dead
holder's lock does in time), kill, a Redis stall (every live holder's lock lapses at once),
finish, late finish and sweeps by two sweepers, in any order, and checks DESIGN.md's
invariants after every step:

- no job is lost or queued twice: each is queued once, leased, finished or failed;
- a holder that keeps renewing is never reclaimed, even when a Redis stall let its lock
  lapse and a second sweeper runs in the same round (the grace);
- renewal extends exactly the leases the holder still owns, and reports the others lost;
- a lock, where there is one, holds its job's owner token;
- a job is never taken more than its max attempts because of stalls, and one that
  stalls at its max is failed;
- a late finish by a holder that lost its lease changes nothing;
- a recovered job is recovered once per stall.

Time is the model's: a sweep "after the grace" ages the stall marks by the grace instead
of sleeping, so the grace comparisons run in Redis's script as they do in production, and
the test stays fast. The test counts the transitions that matter (Hypothesis ``event()``
too) and fails when a run reached one of them too rarely to check it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import ClassVar

import pytest
import redis
from hypothesis import HealthCheck, event, settings, target
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from rq import Queue

from rq_emq.fence.fencing import LeaseLost, fenced
from rq_emq.hold.lease import Lease, LockManager
from rq_emq.intake.take import Taker
from rq_emq.keys import QueueKeys, job_key
from rq_emq.recover.sweep import Sweeper
from rq_emq.settings import LeaseSettings

MAX_ATTEMPTS = 3
# A grace of 1.25 s of Redis time (1.25 renew intervals, 0.8 of the shortest sweep interval
# that renew interval allows), which no step of this test comes near, so only the model
# ages marks; its sweeps are forced, so the sweep interval's rate limit plays no part.
SETTINGS = LeaseSettings(
    lease_ms=60_000, renew_interval_ms=1_000, sweep_interval_ms=1_563, max_attempts=MAX_ATTEMPTS
)
Q = QueueKeys("q")
HOLDERS = ["h1", "h2"]

#: The transitions this test exists to check, and how often each must happen per run.
LATE_FINISH = "late finish after a lost lease"
RENEW_AFTER_MARK = "renew after a mark"
FAILED_AT_MAX = "recovery at max attempts"
TWO_SWEEPERS = "two sweepers in one round"
RENEW_BY_OLD_HOLDER = "renew by a holder whose job another holds"
MINIMUM = {LATE_FINISH: 20, RENEW_AFTER_MARK: 20, FAILED_AT_MAX: 20, TWO_SWEEPERS: 20, RENEW_BY_OLD_HOLDER: 3}


@dataclass
class Holder:
    name: str
    alive: bool = True
    paused: bool = False
    leases: dict[str, Lease] = field(default_factory=dict)
    #: jobs held without a pause since they were taken: these must never be lost
    steady: set[str] = field(default_factory=set)


class LeaseProtocol(RuleBasedStateMachine):
    client: ClassVar[redis.Redis]
    counts: ClassVar[Counter[str]] = Counter()

    def __init__(self) -> None:
        super().__init__()
        self.r = self.client
        self.r.flushdb()
        self.queue = Queue("q", connection=self.r)
        self.holders = {name: Holder(name) for name in HOLDERS}
        self.jobs: list[str] = []
        self.max_of: dict[str, int] = {}
        self.takes: dict[str, int] = {}
        self.sweepers = [Sweeper(self.r, ["q"], SETTINGS, name=f"sweeper-{i}") for i in (1, 2)]
        self.grace_ms = self.sweepers[0].grace_ms
        self.late_finishes = 0
        self.counts["examples"] += 1

    def seen(self, what: str) -> None:
        event(what)
        self.counts[what] += 1

    def manager(self, holder: Holder) -> LockManager:
        m = LockManager(self.r, SETTINGS.lease_ms, SETTINGS.renew_interval_ms, on_lost=lambda lease: None)
        for lease in holder.leases.values():
            m.add(lease)
        return m

    def owner(self, job_id: str) -> bytes | None:
        return self.r.hget(job_key(job_id), "emq_token")  # type: ignore[return-value]

    def live(self) -> list[Holder]:
        return [h for h in self.holders.values() if h.alive and not h.paused]

    # -- jobs and holders ------------------------------------------------------------------
    @initialize(max_attempts=st.lists(st.sampled_from([1, 2, None]), min_size=4, max_size=4))
    def busy(self, max_attempts: list[int | None]) -> None:
        """Every run starts with jobs in flight on both holders, so each step has material."""
        for n in max_attempts:
            self.enqueue(n)
        for name in HOLDERS * 2:
            self.take(name)

    @rule(max_attempts=st.sampled_from([1, 1, 2, None]))
    def enqueue(self, max_attempts: int | None) -> None:
        if len(self.jobs) < 6:
            # ids in enqueue order: Redis orders ties by member, and a replay must see the same order
            job_id = self.queue.enqueue("jobs.noop", job_id=f"job-{len(self.jobs)}").id
            if max_attempts is not None:  # the job's own max, as a worker records it from meta
                self.r.hset(job_key(job_id), "emq_max_attempts", max_attempts)
            self.jobs.append(job_id)
            self.max_of[job_id] = max_attempts or MAX_ATTEMPTS

    @rule(name=st.sampled_from(HOLDERS))
    def take(self, name: str) -> None:
        holder = self.holders[name]
        if not holder.alive or holder.paused:
            return
        taken = Taker(self.r, name, SETTINGS).pop(["q"])
        if taken is None:
            assert self.r.llen(Q.rq_queue) == 0
            return
        holder.leases[taken.job_id] = Lease("q", taken.job_id, taken.token)
        holder.steady.add(taken.job_id)
        self.takes[taken.job_id] = self.takes.get(taken.job_id, 0) + 1

    @rule(name=st.sampled_from(HOLDERS))
    def renew(self, name: str) -> None:
        holder = self.holders[name]
        if holder.alive and not holder.paused:
            self._renew(holder)

    def _renew(self, holder: Holder) -> None:
        if not holder.leases:
            return
        owners = {job_id: self.owner(job_id) for job_id in holder.leases}
        marked = {job_id for job_id in holder.leases if self.r.zscore(Q.stalled, job_id) is not None}
        lost = self.manager(holder).tick()
        should_lose = {
            job_id
            for job_id, lease in holder.leases.items()
            if owners[job_id] not in (lease.token.encode(), f"done:{lease.token}".encode())
        }
        assert set(lost) == should_lose, "renewal must report lost exactly the leases it does not own"
        assert not (set(lost) & holder.steady), "a holder that kept renewing lost its lease"
        for job_id in lost:
            if owners[job_id] is not None:
                self.seen(RENEW_BY_OLD_HOLDER)
        for job_id in marked - set(lost):
            self.seen(RENEW_AFTER_MARK)
            assert self.r.zscore(Q.stalled, job_id) is None, "a renewal left its lease marked"
        for job_id in lost:
            holder.leases.pop(job_id)
        holder.steady |= set(holder.leases)

    @rule(name=st.sampled_from(HOLDERS))
    def pause(self, name: str) -> None:
        """A pause (GC, SIGSTOP) long enough for the holder's locks to expire."""
        holder = self.holders[name]
        if not holder.alive:
            return
        holder.paused = True
        holder.steady.clear()
        self._lapse(holder)

    @rule(name=st.sampled_from(HOLDERS))
    def long_pause(self, name: str) -> None:
        """A pause past the grace: the holder's jobs are recovered while it sleeps."""
        self.pause(name)
        self.sweep(2, 0)
        self.resume(name)

    @rule(name=st.sampled_from(HOLDERS))
    def resume(self, name: str) -> None:
        self.holders[name].paused = False

    @rule(name=st.sampled_from(HOLDERS))
    def kill(self, name: str) -> None:
        holder = self.holders[name]
        holder.alive = False
        holder.steady.clear()
        self._lapse(holder)

    @rule(name=st.sampled_from(HOLDERS))
    def restart(self, name: str) -> None:
        """A killed holder's process is replaced: same name, nothing held."""
        if not self.holders[name].alive:
            self.holders[name] = Holder(name)

    @rule()
    def redis_stall(self) -> None:
        """Redis stalls past the lease: every lock lapses at once, live holders' included.
        Those holders still hold their jobs; they renew within a renew interval, which the
        grace outlasts, so they must not lose them."""
        for holder in self.holders.values():
            self._lapse(holder)

    def _lapse(self, holder: Holder) -> None:
        """Time passes without renewals: the holder's own locks expire (only its own)."""
        for job_id, lease in holder.leases.items():
            if self.r.get(Q.lock(job_id)) == lease.token.encode():
                self.r.delete(Q.lock(job_id))
                self.r.zadd(Q.leases, {job_id: 0}, xx=True)

    # -- finishing ----------------------------------------------------------------------------
    @rule(name=st.sampled_from(HOLDERS), data=st.data())
    def finish(self, name: str, data: st.DataObject) -> None:
        holder = self.holders[name]
        if not holder.alive or holder.paused or not holder.leases:
            return
        self._finish(holder, data.draw(st.sampled_from(sorted(holder.leases))))

    def _stale(self) -> list[tuple[Holder, str]]:
        return [
            (h, job_id)
            for h in self.live()
            for job_id, lease in sorted(h.leases.items())
            if self.owner(job_id) != lease.token.encode()
        ]

    @precondition(lambda self: self._stale())
    @rule(data=st.data())
    def late_finish(self, data: st.DataObject) -> None:
        """A holder whose job was recovered (it was paused past the grace) finishes it."""
        holder, job_id = data.draw(st.sampled_from(self._stale()))
        self._finish(holder, job_id)

    def _finish(self, holder: Holder, job_id: str) -> None:
        lease = holder.leases.pop(job_id)
        before = self.r.hgetall(job_key(job_id))
        still_ours = before.get(b"emq_token") == lease.token.encode()
        if not still_ours:
            self.seen(LATE_FINISH)
            self.late_finishes += 1
        try:
            with fenced(self.r, lease.fence):
                pipe = self.r.pipeline()
                pipe.hset(job_key(job_id), "status", "finished")
                pipe.zadd("rq:finished:q", {job_id: 1})
                pipe.execute()
            assert still_ours, "a holder that lost its lease wrote the job's outcome"
        except LeaseLost:
            assert not still_ours, "the owner's finish was refused"
            assert job_id not in holder.steady, "a holder that kept renewing was fenced out"
            assert self.r.hgetall(job_key(job_id)) == before, "a fenced finish wrote to the job"
        holder.steady.discard(job_id)

    # -- sweeping -------------------------------------------------------------------------------
    def _grace_passes(self) -> None:
        """A grace goes by: live holders renew (the grace outlasts a renew interval), and
        every stall mark ages by the grace."""
        for holder in self.live():
            self._renew(holder)
        marks = self.r.zrange(Q.stalled, 0, -1, withscores=True)
        if marks:
            self.r.zadd(Q.stalled, {job_id: score - self.grace_ms - 1 for job_id, score in marks})

    def _check(self, requeued: list[str], failed: list[str], marked: list[str]) -> None:
        for holder in self.holders.values():
            assert not (set(requeued + failed) & holder.steady), "a live holder's job was recovered"
        for job_id in failed:
            assert self.takes.get(job_id, 0) >= self.max_of[job_id], "failed before its max attempts"
            self.seen(FAILED_AT_MAX)
        for job_id in requeued:
            assert self.takes.get(job_id, 0) < self.max_of[job_id], "requeued at its max attempts"

    @precondition(lambda self: self.jobs)
    @rule(rounds=st.integers(1, 2), which=st.integers(0, 1))
    def sweep(self, rounds: int, which: int) -> None:
        for _ in range(rounds):
            self._grace_passes()
            report = self.sweepers[which].sweep("q", mode="force")
            self._check(report.requeued, report.failed, report.marked)
            for holder in self.live():  # it renewed during the grace: nothing of it marked
                assert not (set(report.marked) & holder.steady)

    @precondition(lambda self: self.jobs)
    @rule(which=st.integers(0, 1))
    def second_sweeper(self, which: int) -> None:
        """Another sweeper (another worker, ``rq-emq reaper --once``) right after one in the
        same round, before any grace has passed: it may mark, never recover, fresh marks."""
        fresh = self.r.zcard(Q.stalled) > 0
        report = self.sweepers[which].sweep("q", mode="force")
        if fresh:
            self.seen(TWO_SWEEPERS)
        self._check(report.requeued, report.failed, report.marked)

    def teardown(self) -> None:
        # steer generation towards runs with many late finishes, the rarest transition
        target(float(self.late_finishes), label="late finishes")

    # -- the transitions this test exists for, reached on purpose as well as by chance --------
    @precondition(lambda self: any(h.leases for h in self.live()))
    @rule()
    def stall_then_two_sweepers(self) -> None:
        """A Redis stall, then two sweepers in one round: the first marks every live
        holder's job, the second must not recover them (the grace is still running)."""
        self.redis_stall()
        self.second_sweeper(0)
        self.second_sweeper(1)

    @precondition(lambda self: any(h.leases for h in self.live()))
    @rule(name=st.sampled_from(HOLDERS))
    def marked_while_paused_then_renew(self, name: str) -> None:
        """Paused long enough to be marked, not recovered: the renewal takes the job back."""
        if not self.holders[name].leases or not self.holders[name].alive:
            return
        self.pause(name)
        self.sweep(1, 0)
        self.resume(name)
        self.renew(name)

    @precondition(lambda self: any(h.leases for h in self.live()))
    @rule(name=st.sampled_from(HOLDERS))
    def recovered_then_taken_by_the_other(self, name: str) -> None:
        """Paused past the grace: its job goes to the other holder; then it wakes and renews."""
        if not self.holders[name].leases:
            return
        self.long_pause(name)
        for other in HOLDERS:
            if other != name:
                self.take(other)
        self.renew(name)

    # -- invariants -------------------------------------------------------------------------------
    @invariant()
    def no_job_is_lost_or_queued_twice(self) -> None:
        self.counts["steps"] += 1
        queued = [v.decode() for v in self.r.lrange(Q.rq_queue, 0, -1)]
        assert len(queued) == len(set(queued))
        leased = {v.decode() for v in self.r.zrange(Q.leases, 0, -1)}
        finished = {v.decode() for v in self.r.zrange("rq:finished:q", 0, -1)}
        failed = {v.decode() for v in self.r.zrange(Q.failed, 0, -1)}
        for job_id in self.jobs:
            places = (job_id in queued) + (job_id in leased) + (job_id in finished) + (job_id in failed)
            assert places == 1, (job_id, queued, leased, finished, failed)

    @invariant()
    def a_lock_holds_its_owners_token(self) -> None:
        for job_id in self.jobs:
            lock = self.r.get(Q.lock(job_id))
            if lock is not None:
                assert lock == self.owner(job_id), f"{job_id}: lock {lock!r} is not its owner's"

    @invariant()
    def stalls_never_exceed_max_attempts(self) -> None:
        for job_id, takes in self.takes.items():
            assert takes <= self.max_of[job_id], (job_id, takes)
            if self.r.zscore(Q.failed, job_id) is not None:
                assert takes == self.max_of[job_id]
                assert self.r.hget(job_key(job_id), "status") == b"failed"


@pytest.mark.slow
def test_the_lease_protocol_holds_its_invariants(r: redis.Redis) -> None:
    LeaseProtocol.client = r
    LeaseProtocol.counts = Counter()
    run_state_machine_as_test(
        LeaseProtocol,
        settings=settings(
            max_examples=200,
            database=None,
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        ),
    )
    counts = dict(LeaseProtocol.counts)
    print(f"\nstate machine transitions reached: {counts}")
    short = {what: counts.get(what, 0) for what, least in MINIMUM.items() if counts.get(what, 0) < least}
    assert not short, (
        f"transitions reached too rarely to be checked: {short} (minimums {MINIMUM}; all {counts})"
    )
