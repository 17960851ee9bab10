"""A model-based test of the lease protocol against a real Redis.

Hypothesis drives holders through take, renew, pause, resume, lapse (what a paused or dead
holder's lock does in time), kill, finish and sweep, in any order, and checks DESIGN.md's
invariants after every step:

- no job is lost or queued twice: each is queued once, leased, finished or failed;
- a holder that keeps renewing is never reclaimed;
- a job is never taken more than its max attempts because of stalls;
- a late finish by a holder that lost its lease changes nothing;
- a recovered job is recovered once per stall.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from rq import Queue

from rq_emq.fencing import LeaseLost, fenced
from rq_emq.keys import QueueKeys, job_key
from rq_emq.lease import Lease, LockManager
from rq_emq.settings import LeaseSettings
from rq_emq.sweep import Sweeper
from rq_emq.take import Taker

MAX_ATTEMPTS = 3
SETTINGS = LeaseSettings(
    lease_ms=60_000, renew_interval_ms=10, sweep_interval_ms=10, max_attempts=MAX_ATTEMPTS
)
Q = QueueKeys("q")
HOLDERS = ["h1", "h2"]


@dataclass
class Holder:
    name: str
    alive: bool = True
    paused: bool = False
    leases: dict[str, Lease] = field(default_factory=dict)
    #: jobs held without a pause since they were taken: these must never be lost
    steady: set[str] = field(default_factory=set)


class LeaseProtocol(RuleBasedStateMachine):
    client: redis.Redis

    def __init__(self) -> None:
        super().__init__()
        self.r = self.client
        self.r.flushdb()
        self.queue = Queue("q", connection=self.r)
        self.holders = {name: Holder(name) for name in HOLDERS}
        self.jobs: list[str] = []
        self.takes: dict[str, int] = {}
        self.sweeper = Sweeper(self.r, ["q"], SETTINGS)

    def manager(self, holder: Holder) -> LockManager:
        m = LockManager(self.r, SETTINGS.lease_ms, SETTINGS.renew_interval_ms, on_lost=lambda lease: None)
        for lease in holder.leases.values():
            m.add(lease)
        return m

    @rule()
    def enqueue(self) -> None:
        if len(self.jobs) < 6:
            self.jobs.append(self.queue.enqueue("jobs.noop").id)

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
        if not holder.alive or holder.paused or not holder.leases:
            return
        lost = self.manager(holder).tick()
        assert not (set(lost) & holder.steady), "a holder that kept renewing lost its lease"
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
        self.sweep(2)
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

    def _lapse(self, holder: Holder) -> None:
        """Time passes without renewals: the holder's own locks expire (only its own)."""
        for job_id, lease in holder.leases.items():
            if self.r.get(Q.lock(job_id)) == lease.token.encode():
                self.r.delete(Q.lock(job_id))
                self.r.zadd(Q.leases, {job_id: 0}, xx=True)

    @rule(name=st.sampled_from(HOLDERS), data=st.data())
    def finish(self, name: str, data: st.DataObject) -> None:
        holder = self.holders[name]
        if not holder.alive or holder.paused or not holder.leases:
            return
        job_id = data.draw(st.sampled_from(sorted(holder.leases)))
        lease = holder.leases.pop(job_id)
        before = self.r.hgetall(job_key(job_id))
        still_ours = before.get(b"emq_token") == lease.token.encode()
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

    @precondition(lambda self: self.jobs)
    @rule(rounds=st.integers(1, 2))
    def sweep(self, rounds: int) -> None:
        for _ in range(rounds):
            time.sleep(self.sweeper.grace_ms / 1000 + 0.002)
            report = self.sweeper.sweep("q", mode="force")
            for holder in self.holders.values():
                assert not (set(report.requeued + report.failed + report.marked) & holder.steady)

    @invariant()
    def no_job_is_lost_or_queued_twice(self) -> None:
        queued = [v.decode() for v in self.r.lrange(Q.rq_queue, 0, -1)]
        assert len(queued) == len(set(queued))
        leased = {v.decode() for v in self.r.zrange(Q.leases, 0, -1)}
        finished = {v.decode() for v in self.r.zrange("rq:finished:q", 0, -1)}
        failed = {v.decode() for v in self.r.zrange(Q.failed, 0, -1)}
        for job_id in self.jobs:
            places = (job_id in queued) + (job_id in leased) + (job_id in finished) + (job_id in failed)
            assert places == 1, (job_id, queued, leased, finished, failed)

    @invariant()
    def stalls_never_exceed_max_attempts(self) -> None:
        for job_id, takes in self.takes.items():
            assert takes <= MAX_ATTEMPTS, (job_id, takes)
            if takes == MAX_ATTEMPTS and self.r.zscore(Q.failed, job_id) is not None:
                assert self.r.hget(job_key(job_id), "status") == b"failed"


@pytest.mark.slow
def test_the_lease_protocol_holds_its_invariants(r: redis.Redis) -> None:
    LeaseProtocol.client = r
    run_state_machine_as_test(
        LeaseProtocol,
        settings=settings(
            max_examples=150,
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        ),
    )
