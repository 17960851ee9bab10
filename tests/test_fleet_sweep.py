"""Idle fleets: one elected sweeper per queue set, so the Redis work of idle workers does
not grow with their number; a dead sweeper's successor recovers its job in the bound."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import redis
from jobs import runs
from procs import Processes, wait_for
from rq import Queue

from rq_emq.election import SweeperElection
from rq_emq.keys import QueueKeys, job_key, sweeper_election_key

pytestmark = pytest.mark.slow
Q = QueueKeys("default")
ELECTION = sweeper_election_key(["default"])

#: Short timings so a few leases pass in seconds: idle sweeper looks every 0.75 s, holds
#: the election 1 s, standbys check every 0.25-0.5 s.
IDLE = {"RQ_EMQ_LEASE_MS": "1500", "RQ_EMQ_RENEW_INTERVAL_MS": "150", "RQ_EMQ_SWEEP_INTERVAL_MS": "250"}
IDLE_LEASE_S = 1.5


def calls(r: redis.Redis) -> dict[str, int]:
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in r.info("commandstats").items()}


def idle_fleet_commands(
    r: redis.Redis, redis_url: str, procs: Processes, workers: int, seconds: float, in_flight: bool
) -> dict[str, int]:
    """Commands Redis ran for ``workers`` idle LeaseWorkers on one queue over ``seconds``;
    ``in_flight`` plants a live lease (a job held elsewhere) so that every sweep is a real
    round of the sweep script rather than a look that finds nothing."""
    if in_flight:
        r.set(Q.lock("held-elsewhere"), "t", px=600_000)
        r.zadd(Q.leases, {"held-elsewhere": time.time() * 1000 + 600_000})
    for i in range(workers):
        procs.worker(redis_url, name=f"idle-{i}", **IDLE)
    wait_for(lambda: r.scard("rq:workers") == workers, timeout=30, what="the workers to register")
    time.sleep(2.0)  # every worker's start-up round is over, and a sweeper elected
    r.config_resetstat()
    time.sleep(seconds)
    counted = calls(r)
    procs.stop_all()
    procs.started.clear()
    r.flushdb()
    return counted


def test_sweep_script_calls_of_an_idle_fleet_do_not_grow_with_its_size(
    r: redis.Redis, redis_url: str, procs: Processes
) -> None:
    """One worker and six on the same queue, with a job in flight elsewhere: the sweep
    script runs about as often for both (one sweeper sweeps; the standbys only check the
    election with one SET now and then). Before the election every worker tried a round
    per 0.9 sweep interval: six times as many calls."""
    window = 4.0
    one = idle_fleet_commands(r, redis_url, procs, 1, window, in_flight=True)
    six = idle_fleet_commands(r, redis_url, procs, 6, window, in_flight=True)
    # rounds every 0.9 x 0.25 s: ~18 in the window, plus the election renewals
    assert one.get("evalsha", 0) >= 10, one
    assert six.get("evalsha", 0) <= 1.5 * one.get("evalsha", 0) + 4, (one, six)
    assert six.get("lrange", 0) <= 1.5 * one.get("lrange", 0) + 4, (one, six)  # lrange: a full round


def test_an_idle_worker_costs_at_most_nine_commands_per_lease(
    r: redis.Redis, redis_url: str, procs: Processes
) -> None:
    """Nothing in flight: the sweeper looks (one EXISTS) and renews its election every
    half lease, and each standby checks the election every 1/6 to 1/3 lease. Nine
    commands per worker per lease is 0.3 commands per second at the default 30 s lease."""
    window = 4 * IDLE_LEASE_S
    for workers in (1, 6):
        counted = idle_fleet_commands(r, redis_url, procs, workers, window, in_flight=False)
        total = sum(counted.values()) - counted.get("config|resetstat", 0) - counted.get("info", 0)
        per_worker_per_lease = total / workers / (window / IDLE_LEASE_S)
        assert per_worker_per_lease <= 9, (workers, per_worker_per_lease, counted)
        assert counted.get("lrange", 0) == 0, counted  # no sweep round ran: nothing was in flight


def elected(r: redis.Redis) -> str:
    token = r.get(ELECTION)
    return token.decode().split(":", 1)[1] if token else ""


# Settings of the recovery bound (as in test_recovery_processes): lease + 2 sweep intervals.
BOUND = {"RQ_EMQ_LEASE_MS": "400", "RQ_EMQ_RENEW_INTERVAL_MS": "60", "RQ_EMQ_SWEEP_INTERVAL_MS": "200"}
BOUND_LEASE_S, BOUND_SWEEP_S = 0.4, 0.2
SCHEDULING_SLACK_S = 0.15


def test_a_killed_sweepers_own_job_is_recovered_by_a_standby_within_the_bound(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path
) -> None:
    """The elected sweeper runs a job and is SIGKILLed: its election lapses (hold = 2/3
    lease) and a standby takes over (within 1/3 lease more) before the job's lease lapses,
    so the job is back within lease + 2 sweep intervals, as with a live sweeper."""
    log = str(tmp_path / "runs.log")
    a = procs.worker(redis_url, name="worker-a", **BOUND)
    wait_for(lambda: elected(r) == "rq-emq-sweeper:worker-a", timeout=15, what="worker-a to be the sweeper")
    # a minute on its first run (killed long before that), at once on the next
    job = Queue(connection=r).enqueue("integration_jobs.slow_on_first_run", log, 60.0, job_timeout=120)
    wait_for(lambda: runs(log), timeout=10, what="the job to start")
    assert r.hget(job_key(job.id), "worker_name") == b"worker-a"
    procs.worker(redis_url, name="worker-b", **BOUND)
    wait_for(lambda: r.scard("rq:workers") == 2, timeout=15, what="worker-b to register")
    time.sleep(0.5)  # b's start-up round is over: from now on it stands by
    assert elected(r) == "rq-emq-sweeper:worker-a"
    token = r.hget(job_key(job.id), "emq_token")
    assert token == r.get(Q.lock(job.id))  # a holds the running job
    killed_at = time.monotonic()
    os.killpg(a.pid, signal.SIGKILL)
    wait_for(
        lambda: r.hget(job_key(job.id), "emq_token") != token, timeout=10, interval=0.005, what="the recovery"
    )
    after_kill = time.monotonic() - killed_at
    assert after_kill <= BOUND_LEASE_S + 2 * BOUND_SWEEP_S + SCHEDULING_SLACK_S, after_kill
    assert elected(r) == "rq-emq-sweeper:worker-b"
    wait_for(lambda: r.hget(job_key(job.id), "status") == b"finished", timeout=15, what="the job to finish")
    assert [line.split()[0] for line in runs(log)] == ["start", "start", "end"]


def test_a_worker_that_stops_gives_its_election_up(r: redis.Redis, redis_url: str, procs: Processes) -> None:
    a = procs.worker(redis_url, name="worker-a", **IDLE)
    wait_for(lambda: elected(r) == "rq-emq-sweeper:worker-a", timeout=15, what="worker-a to be the sweeper")
    os.kill(a.pid, signal.SIGTERM)
    assert a.wait(timeout=15) == 0
    assert not r.exists(ELECTION)


def test_workers_on_different_queue_sets_each_have_a_sweeper(
    r: redis.Redis, redis_url: str, procs: Processes
) -> None:
    procs.worker(redis_url, "a", "b", name="ab", **IDLE)
    procs.worker(redis_url, "b", "c", name="bc", **IDLE)
    wait_for(lambda: r.exists(sweeper_election_key(["a", "b"])), timeout=15, what="a sweeper of a, b")
    wait_for(lambda: r.exists(sweeper_election_key(["c", "b"])), timeout=15, what="a sweeper of b, c")


def test_the_election_is_kept_only_by_its_holder_and_given_up_only_by_it(r: redis.Redis) -> None:
    a = SweeperElection(r, ["q"], idle_ms=3_000, name="a")
    b = SweeperElection(r, ["q"], idle_ms=3_000, name="b")
    assert a.hold() and not b.hold()  # one SET NX each: a takes it, b stands by
    assert 3_500 < r.pttl(a.key) <= 4_000  # hold = 4/3 idle
    b.resign()  # not b's to give up
    assert r.get(a.key) == a.token.encode()
    r.delete(a.key)  # a's hold lapsed (a froze) ...
    assert b.hold()  # ... b takes over
    a._renewed_at = -1e9  # a wakes: its renewal finds b's token and it stands by
    assert not a.hold() and not a.elected and r.get(a.key) == b.token.encode()
    b.resign()
    assert not r.exists(a.key)


def test_a_standby_whose_set_nx_answer_was_lost_finds_the_election_its_own(r: redis.Redis) -> None:
    a = SweeperElection(r, ["q"], idle_ms=3_000, name="a")
    r.set(a.key, a.token, px=4_000)  # its SET NX landed; the reply did not
    a._unsure = True
    assert a.hold() and a.elected  # not a wait for its own hold to lapse
