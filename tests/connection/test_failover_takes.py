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


def _replication(state: str, lag: int = 0) -> dict[str, Any]:
    """A master's ``INFO replication`` as redis-py parses it, with one replica in ``state``."""
    replica = {"ip": "10.0.0.2", "port": 6379, "state": state, "offset": 100, "lag": lag}
    return {"role": "master", "connected_slaves": 1, "slave0": replica}


def _degrade(gate: confirm.TakeConfirmation, clock: list[float]) -> None:
    gate.unacked("a")
    clock[0] += confirm.DEGRADE_AFTER_S + 0.1
    gate.unacked("b")
    assert not gate.wanted()


def test_a_degraded_gate_waits_again_from_the_first_take_that_finds_a_replica_online(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After a failover the new master's only replica is the old master, demoted up to 10 s
    later and then resynced: takes go on without it meanwhile, and wait for it again as soon
    as the master lists it online, not 30 s later (a failback needs it then). A replica that
    is "online" yet never acknowledges in time turns the gate back on once, not every 3 s."""
    clock = [1000.0]
    monkeypatch.setattr(confirm.time, "monotonic", lambda: clock[0])
    gate = confirm.TakeConfirmation(Watch())  # type: ignore[arg-type]
    _degrade(gate, clock)
    assert gate.probing()
    gate.probed(_replication("send_bulk"))  # resyncing: cannot acknowledge yet
    gate.probed(_replication("online", lag=5))  # behind
    gate.probed({"role": "master", "connected_slaves": 0})
    assert not gate.wanted() and gate.probing()
    clock[0] += 1.0
    gate.probed(_replication("online"))
    assert gate.wanted() and not gate.probing()
    # no take acknowledged since: the next degrade lasts DEGRADED_S whatever replicas say
    _degrade(gate, clock)
    assert not gate.probing()
    gate.probed(_replication("online"))
    assert not gate.wanted()
    clock[0] += confirm.DEGRADED_S
    assert gate.wanted()
    # an acknowledged take lets a later degrade end early again
    gate.acked()
    _degrade(gate, clock)
    assert gate.probing()


def test_a_degraded_take_counts_and_asks_the_master_for_its_replicas(
    r: redis.Redis, gate: confirm.TakeConfirmation, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe rides in the take's own pipeline: no round trip more, and the take is
    run (not handed back)."""
    clock = [1000.0]
    monkeypatch.setattr(confirm.time, "monotonic", lambda: clock[0])
    _degrade(gate, clock)
    seen: list[Any] = []
    monkeypatch.setattr(gate, "probed", seen.append)
    job = Queue(connection=r).enqueue("jobs.noop")
    taken = Taker(r, "w", LeaseSettings()).pop(["default"])
    assert taken is not None and taken.job_id == job.id
    assert len(seen) == 1 and seen[0]["role"] == "master"


def test_just_after_a_switch_a_master_with_no_replica_online_yet_is_taken_from_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After a switch the new master's replica is the old master, on its way back: a take it
    does not acknowledge, from a master that lists no replica online and had none since the
    switch, turns the gate off at once (before: 3 s of takes handed back first). Sentinel's
    count of live replicas, read every few seconds, may still be 0 once the master lists one
    online: the gate waits for it all the same. A master that had a replica online since the
    switch and lists none now may be being replaced (a failback): its takes are handed back."""
    clock = [1000.0]
    monkeypatch.setattr(confirm.time, "monotonic", lambda: clock[0])
    watch: Any = Watch(live_replicas=0)
    gate = confirm.TakeConfirmation(watch)
    watch.moves += 1  # the switch
    assert gate.just_switched()
    gate.unacked("a", {"role": "master", "connected_slaves": 0})
    assert not gate.wanted() and gate.probing() and watch.paused == []
    clock[0] += 8.0
    gate.probed(_replication("online"))
    assert gate.wanted()  # though Sentinel's count is still 0
    # the failback: the master's replica was promoted away, and the master lists none now
    gate.unacked("b", {"role": "master", "connected_slaves": 0})
    assert gate.wanted() and watch.paused == [confirm.UNCONFIRMED_PAUSE_S]
    # long after a switch, a master without a replica online is a slow or gone replica: 3 s first
    clock[0] += confirm.REJOIN_S
    watch.live_replicas = 1
    other = confirm.TakeConfirmation(watch)
    assert not other.just_switched()
    other.unacked("c", {"role": "master", "connected_slaves": 0})
    assert other.wanted()
