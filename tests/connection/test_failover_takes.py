"""Behind Sentinel, a take counts only once a replica has it: after ``SENTINEL FAILOVER``
promotes the replica, the old master grants takes until the switch is announced, none of
which reaches the new master, where another worker takes the same job (two runs that
overlap). A real Redis with no replica stands in for that old master: ``WAIT 1`` gets no
acknowledgement there, as on a master whose replica was just promoted."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from rq import Queue

from rq_emq.connection import confirm, failover
from rq_emq.intake.take import Taker
from rq_emq.keys import QueueKeys
from rq_emq.settings import LeaseSettings

Q = QueueKeys("default")


class Watch:
    """What a take's gate reads of a process's failover watch."""

    def __init__(self, live_replicas: int = 1) -> None:
        self.live_replicas = live_replicas
        self.moves = 0
        self.paused: list[float] = []

    def pause(self, seconds: float) -> None:
        self.paused.append(seconds)


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> confirm.TakeConfirmation:
    confirmation = confirm.TakeConfirmation(Watch())  # type: ignore[arg-type]
    monkeypatch.setattr(failover, "take_confirmation", lambda client: confirmation)
    return confirmation


def test_a_take_no_replica_acknowledged_goes_back_to_the_front_of_its_queue_unrun(
    r: redis.Redis, gate: confirm.TakeConfirmation
) -> None:
    first = Queue(connection=r).enqueue("jobs.noop")
    second = Queue(connection=r).enqueue("jobs.noop")
    taker = Taker(r, "w", LeaseSettings())
    assert taker.pop(["default"]) is None
    assert [m.decode() for m in r.lrange(Q.rq_queue, 0, -1)] == [first.id, second.id]
    assert r.hget(f"rq:job:{first.id}", "emq_attempts") in (None, b"0")  # the attempt refunded
    assert not r.exists(Q.lock(first.id)) and r.zcard(Q.leases) == 0
    assert r.hget(Q.stats, "returned") == b"1"
    assert gate.watch.paused == [confirm.UNCONFIRMED_PAUSE_S]  # type: ignore[attr-defined]
    # the moving-list claim (the idle wait's path) is gated the same way
    r.lmove(Q.rq_queue, Q.moving, "LEFT", "RIGHT")
    assert taker.claim("default", first.id) is None
    assert [m.decode() for m in r.lrange(Q.rq_queue, 0, -1)] == [first.id, second.id]
    assert r.llen(Q.moving) == 0


def test_without_sentinel_or_a_live_replica_a_take_waits_for_nobody(r: redis.Redis) -> None:
    job = Queue(connection=r).enqueue("jobs.noop")
    assert failover.take_confirmation(r) is None  # not Sentinel-managed
    taken = Taker(r, "w", LeaseSettings()).pop(["default"])
    assert taken is not None and taken.job_id == job.id
    assert not confirm.TakeConfirmation(Watch(live_replicas=0)).wanted()  # type: ignore[arg-type]


def test_takes_unacknowledged_with_no_switch_announced_stop_waiting_for_a_while(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A replica that is slow or gone must not stop a fleet: past DEGRADE_AFTER_S of
    unacknowledged takes and no switch, takes go on without it for DEGRADED_S."""
    clock = [1000.0]
    monkeypatch.setattr(confirm.time, "monotonic", lambda: clock[0])
    watch: Any = Watch()
    gate = confirm.TakeConfirmation(watch)
    gate.unacked("a")
    clock[0] += confirm.DEGRADE_AFTER_S / 2
    gate.unacked("b")
    assert gate.wanted()  # a promotion is announced within this: keep waiting for it
    clock[0] += confirm.DEGRADE_AFTER_S
    gate.unacked("c")
    assert not gate.wanted()
    clock[0] += confirm.DEGRADED_S
    assert gate.wanted()
    # a switch heard in between starts the count again
    gate.unacked("d")
    watch.moves += 1
    clock[0] += confirm.DEGRADE_AFTER_S * 2
    gate.unacked("e")
    assert gate.wanted()
