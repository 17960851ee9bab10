"""Idle fleets: one elected sweeper per queue set, so the Redis work of idle workers does
not grow with their number; a dead sweeper's successor recovers its job in the bound."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from jobs import runs
from procs import Processes, blocked_clients, unseen, wait_for
from rq import Queue

from rq_emq.keys import QueueKeys, job_key, sweeper_deputy_key, sweeper_election_key, sweeper_line_key
from rq_emq.recover.election import SweeperElection

pytestmark = pytest.mark.slow
Q = QueueKeys("default")
ELECTION = sweeper_election_key(["default"])
DEPUTY, LINE = sweeper_deputy_key(ELECTION), sweeper_line_key(ELECTION)

#: Short timings so a few leases pass in seconds: idle sweeper looks every 0.75 s, holds
#: the election 1 s, standbys check every 0.25-0.5 s.
IDLE = {"RQ_EMQ_LEASE_MS": "1500", "RQ_EMQ_RENEW_INTERVAL_MS": "150", "RQ_EMQ_SWEEP_INTERVAL_MS": "250"}
IDLE_LEASE_S = 1.5


def line_waits(r: redis.Redis) -> int:
    """Standbys listening in an election's line (each test has one election): the
    workers' pubsub connections (each subscribes the line's channel; ``PUBSUB NUMSUB``
    reads wrong on Valkey 9 over RESP3), less the sweeper and the deputy."""
    listening = sum("P" in str(c.get("flags")) for c in r.client_list())
    return listening - int(bool(r.exists(ELECTION))) - int(bool(r.exists(DEPUTY)))


#: What a connection sends once when it opens (redis-py's handshake).
CONNECTION_SETUP = ("hello", "client|setinfo", "client|setname", "select", "auth")


def calls(r: redis.Redis) -> dict[str, int]:
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in r.info("commandstats").items()}


def idle_fleet_commands(
    r: redis.Redis,
    redis_url: str,
    procs: Processes,
    workers: int,
    seconds: float,
    in_flight: bool,
    settings: dict[str, str] = IDLE,
) -> dict[str, int]:
    """Commands Redis ran for ``workers`` idle LeaseWorkers on one queue over ``seconds``;
    ``in_flight`` plants a live lease (a job held elsewhere) so that every sweep is a real
    round of the sweep script rather than a look that finds nothing."""
    if in_flight:
        r.set(Q.lock("held-elsewhere"), "t", px=600_000)
        r.zadd(Q.leases, {"held-elsewhere": time.time() * 1000 + 600_000})
    for i in range(workers):
        procs.worker(redis_url, name=f"idle-{i}", **settings)
    wait_for(lambda: r.scard("rq:workers") == workers, timeout=30, what="the workers to register")
    # Steady state, not a fixed sleep: on a loaded host a worker may still be opening its
    # connections (HELLO, CLIENT SETINFO) seconds after it registered.
    wait_for(
        lambda: blocked_clients(r, "blmove") == workers and line_waits(r) == max(workers - 2, 0),
        timeout=30,
        what="every worker to wait on its queue and every standby but the deputy in the line",
    )
    time.sleep(1.0)  # the sweeper's start-up round is over
    r.config_resetstat()
    time.sleep(seconds)
    # A new pooled connection's handshake is a one-off, not idle traffic: on a loaded host a
    # worker's threads may still open one (two of them wanting the pool at once) well
    # after it settled, and CI once counted 4 HELLOs in the window.
    counted = {name: n for name, n in calls(r).items() if name not in CONNECTION_SETUP}
    procs.stop_all()
    procs.started.clear()
    r.flushdb()
    return counted


def kill_the_sweeper_with_its_job_and_see_it_recovered_in_the_bound(r: redis.Redis, a: Any, job: Any) -> None:
    token = r.hget(job_key(job.id), "emq_token")
    assert token == r.get(Q.lock(job.id))  # a holds the running job
    killed_at = time.monotonic()
    os.killpg(unseen(a.pid), signal.SIGKILL)
    wait_for(
        lambda: r.hget(job_key(job.id), "emq_token") != token, timeout=10, interval=0.005, what="the recovery"
    )
    after_kill = time.monotonic() - killed_at
    assert after_kill <= BOUND_LEASE_S + 2 * BOUND_SWEEP_S + SCHEDULING_SLACK_S, after_kill


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


def test_an_idle_worker_costs_at_most_nine_commands_per_lease_and_a_fleet_not_much_more(
    r: redis.Redis, redis_url: str, procs: Processes
) -> None:
    """Nothing in flight: the sweeper looks (one EXISTS) and renews its election every
    half lease (EVALSHA, MGET, SET); a lone sweeper looks at the line for a deputy every
    fourth renewal. In a fleet the deputy checks the election every 1/6 to 1/3 lease
    (EVALSHA, MGET, SET); every other worker waits in the line and sends nothing but a
    BLPOP and a SET NX when its wait (1-2 leases) ends. Nine commands per lease is 0.3
    commands per second at the default 30 s lease; six workers cost about 20 per lease
    plus their four line waits, each ending at most once a lease (its BLPOP and a SET NX,
    and a third command when the end was a call for a deputy)."""
    window = 4 * IDLE_LEASE_S
    for workers, most in ((1, 9), (6, 20 + 4 * 3)):
        counted = idle_fleet_commands(r, redis_url, procs, workers, window, in_flight=False)
        total = sum(counted.values()) - counted.get("config|resetstat", 0) - counted.get("info", 0)
        per_lease = total / (window / IDLE_LEASE_S)
        assert per_lease <= most, (workers, per_lease, counted)
        assert counted.get("lrange", 0) == 0, counted  # no sweep round ran: nothing was in flight


#: A short lease, so that a measurement window holds several of them: the sweeper renews
#: every 0.3 s, the deputy checks every 0.1-0.2 s, a line wait lasts 0.6-1.2 s.
SHORT = {"RQ_EMQ_LEASE_MS": "600", "RQ_EMQ_RENEW_INTERVAL_MS": "60", "RQ_EMQ_SWEEP_INTERVAL_MS": "100"}


def test_an_idle_fleets_election_costs_do_not_grow_with_its_size(
    r: redis.Redis, redis_url: str, procs: Processes
) -> None:
    """Two idle workers and eight on one queue: Redis runs about as many commands per
    second for both (the sweeper's renewals, the deputy's checks); the six more standbys
    wait in the line, and each ends its wait once per 0.6-1.2 s with a SET NX and the
    next BLPOP (the ended BLPOP counts too). Before the deputy every standby checked the
    election every 0.1-0.2 s (three commands): 8 workers cost three times what 2 did, and
    this test fails on that code."""
    window = 3.0
    line_waits_ending = 6 * 5 * 3 / window  # each of the six ends at most 5 waits of >= 0.6 s
    two = idle_fleet_commands(r, redis_url, procs, 2, window, in_flight=False, settings=SHORT)
    eight = idle_fleet_commands(r, redis_url, procs, 8, window, in_flight=False, settings=SHORT)

    def per_second(counted: dict[str, int]) -> float:
        ignored = counted.get("config|resetstat", 0) + counted.get("info", 0)
        return (sum(counted.values()) - ignored) / window

    assert per_second(two) >= 10, two  # the election is at work
    allowed = 1.2 * per_second(two) + line_waits_ending
    assert per_second(eight) <= allowed, (per_second(two), per_second(eight), allowed, two, eight)


def elected(r: redis.Redis) -> str:
    token = r.get(ELECTION)
    return token.decode().split(":", 1)[1] if token else ""


# Settings of the recovery bound (as in test_recovery_processes): lease + 2 sweep intervals.
BOUND = {"RQ_EMQ_LEASE_MS": "400", "RQ_EMQ_RENEW_INTERVAL_MS": "60", "RQ_EMQ_SWEEP_INTERVAL_MS": "200"}
BOUND_LEASE_S, BOUND_SWEEP_S = 0.4, 0.2
#: What a loaded machine may add: two graces (0.8 sweep interval each), as in test_recovery_processes
SCHEDULING_SLACK_S = 2 * 0.8 * BOUND_SWEEP_S


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
    kill_the_sweeper_with_its_job_and_see_it_recovered_in_the_bound(r, a, job)
    assert elected(r) == "rq-emq-sweeper:worker-b"
    wait_for(lambda: r.hget(job_key(job.id), "status") == b"finished", timeout=15, what="the job to finish")
    assert [line.split()[0] for line in runs(log)] == ["start", "start", "end"]


def deputy(r: redis.Redis) -> str:
    token = r.get(DEPUTY)
    return token.decode().split(":", 1)[1] if token else ""


def start_fleet(
    r: redis.Redis, redis_url: str, procs: Processes, names: list[str], **settings: str
) -> dict[str, subprocess.Popen[bytes]]:
    """Workers started one after the other (the first becomes the sweeper), with a deputy
    in place and every other worker blocked in the line."""
    started = {}
    for name in names:
        started[name] = procs.worker(redis_url, name=name, **settings)
        if name == names[0]:
            wait_for(lambda: elected(r) == f"rq-emq-sweeper:{names[0]}", timeout=15, what="the sweeper")
    wait_for(lambda: r.scard("rq:workers") == len(names), timeout=30, what="the workers to register")
    wait_for(lambda: deputy(r), timeout=10, what="a deputy")
    wait_for(lambda: line_waits(r) == len(names) - 2, timeout=10, what="the others to wait in the line")
    # every worker in its work loop (its signal handlers in place), idle on its queue
    wait_for(lambda: blocked_clients(r, "blmove") == len(names), timeout=10, what="every worker idle")
    return started


def test_a_killed_deputy_is_replaced_and_the_new_one_recovers_a_killed_sweepers_job_in_the_bound(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path
) -> None:
    """The deputy is SIGKILLed: its key lapses (hold = 2/3 lease) and the sweeper's next
    renewal calls the line, whose longest waiter becomes the deputy. Then the sweeper is
    SIGKILLed with a job of its own: the new deputy takes over in time, and the job is back
    within lease + 2 sweep intervals."""
    log = str(tmp_path / "runs.log")
    a = procs.worker(redis_url, name="worker-a", **BOUND)
    wait_for(lambda: elected(r) == "rq-emq-sweeper:worker-a", timeout=15, what="worker-a to be the sweeper")
    job = Queue(connection=r).enqueue("integration_jobs.slow_on_first_run", log, 60.0, job_timeout=120)
    wait_for(lambda: runs(log), timeout=10, what="the job to start")
    others = {name: procs.worker(redis_url, name=name, **BOUND) for name in ("worker-b", "worker-c")}
    wait_for(lambda: r.scard("rq:workers") == 3, timeout=30, what="the workers to register")
    wait_for(lambda: deputy(r) and line_waits(r) == 1, timeout=10, what="a deputy and one line wait")
    first = deputy(r).removeprefix("rq-emq-sweeper:")
    killed_at = time.monotonic()
    os.killpg(unseen(others[first].pid), signal.SIGKILL)
    (second,) = set(others) - {first}
    wait_for(lambda: deputy(r) == f"rq-emq-sweeper:{second}", timeout=10, interval=0.005, what="a new deputy")
    # its key lapses within hold (0.27 s), the sweeper looks within its renewal (0.2 s)
    assert time.monotonic() - killed_at <= 2 / 3 * BOUND_LEASE_S + BOUND_LEASE_S / 2 + 0.3
    assert line_waits(r) == 0 and elected(r) == "rq-emq-sweeper:worker-a"

    kill_the_sweeper_with_its_job_and_see_it_recovered_in_the_bound(r, a, job)
    assert elected(r) == f"rq-emq-sweeper:{second}"
    wait_for(lambda: r.hget(job_key(job.id), "status") == b"finished", timeout=15, what="the job to finish")


def test_when_the_sweeper_and_the_deputy_die_together_a_line_waiter_sweeps_within_hold_and_a_line_wait(
    r: redis.Redis, redis_url: str, procs: Processes
) -> None:
    """Nobody calls the line any more: each waiter's BLPOP ends after at most 2 leases
    (a random 1 to 2), and then checks the election once (SET NX). The set has a sweeper
    again within hold + 2 leases of the last renewal, and a deputy just after."""
    fleet = start_fleet(r, redis_url, procs, ["worker-a", "worker-b", "worker-c", "worker-d"], **BOUND)
    sweeper_name = elected(r).removeprefix("rq-emq-sweeper:")
    deputy_name = deputy(r).removeprefix("rq-emq-sweeper:")
    killed_at = time.monotonic()
    for name in (sweeper_name, deputy_name):
        os.killpg(unseen(fleet[name].pid), signal.SIGKILL)
    survivors = {f"rq-emq-sweeper:{name}" for name in set(fleet) - {sweeper_name, deputy_name}}
    wait_for(lambda: elected(r) in survivors, timeout=20, interval=0.01, what="a new sweeper")
    after_kill = time.monotonic() - killed_at
    hold_s, line_s = 2 / 3 * BOUND_LEASE_S, 2 * BOUND_LEASE_S
    assert after_kill <= hold_s + line_s + 0.3, after_kill
    wait_for(lambda: deputy(r) in survivors - {elected(r)}, timeout=5, what="the new sweeper's deputy")


def test_a_worker_stopped_while_waiting_in_the_line_or_as_deputy_exits_at_once_and_resigns(
    r: redis.Redis, redis_url: str, procs: Processes
) -> None:
    fleet = start_fleet(r, redis_url, procs, ["worker-a", "worker-b", "worker-c"], **IDLE)
    in_charge = {elected(r), deputy(r)}
    (waiter,) = [name for name in fleet if f"rq-emq-sweeper:{name}" not in in_charge]
    stopped_at = time.monotonic()
    os.kill(fleet[waiter].pid, signal.SIGTERM)
    assert fleet[waiter].wait(timeout=15) == 0
    assert time.monotonic() - stopped_at < 2.0
    assert line_waits(r) == 0 and {elected(r), deputy(r)} == in_charge  # its wait went, nothing else
    deputy_name = deputy(r).removeprefix("rq-emq-sweeper:")
    stopped_at = time.monotonic()
    os.kill(fleet[deputy_name].pid, signal.SIGTERM)
    assert fleet[deputy_name].wait(timeout=15) == 0
    assert time.monotonic() - stopped_at < 2.0
    assert not r.exists(DEPUTY)  # given up, not left to lapse
    # nobody is left to call: the sweeper's call waits in the line for the next standby
    wait_for(lambda: r.llen(LINE) == 1, timeout=5, what="the sweeper's call")


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
    c = SweeperElection(r, ["q"], idle_ms=3_000, name="c")
    # a SET NX each: a takes the election, b (a SET NX more) the free deputy key, c waits in the line
    assert a.hold() and not b.hold() and not c.hold()
    assert (b.role, c.role) == ("deputy", "line")
    assert 3_500 < r.pttl(a.key) <= 4_000 and 3_500 < r.pttl(a.deputy_key) <= 4_000  # hold = 4/3 idle
    c.resign()  # nothing of c's to give up
    assert r.get(a.key) == a.token.encode() and r.get(a.deputy_key) == b.token.encode()
    a._renewed_at = -1e9
    assert a.hold() and not r.exists(a.line_key)  # a deputy is in place: no call to the line
    r.pexpire(a.deputy_key, 1_000)
    assert not b.hold() and b.role == "deputy"  # the deputy's check renews its key
    assert 3_500 < r.pttl(a.deputy_key) <= 4_000
    r.delete(a.key)  # a's hold lapsed (a froze) ...
    assert b.hold() and b.elected  # ... the deputy takes over, drops its deputy key, calls the line
    assert not r.exists(a.deputy_key) and r.lrange(a.line_key, 0, -1) == [b.token.encode()]
    assert not c.hold() and c.role == "deputy"  # c's line wait takes the call at once
    assert r.get(a.deputy_key) == c.token.encode() and not r.exists(a.line_key)
    a._renewed_at = -1e9  # a wakes: its renewal finds b's token and it goes to the line
    assert not a.hold() and not a.elected and a.role == "line" and r.get(a.key) == b.token.encode()
    c.resign()  # the deputy gives its key up ...
    assert not r.exists(a.deputy_key)
    b._renewed_at = -1e9
    assert b.hold() and r.lrange(a.line_key, 0, -1) == [b.token.encode()]  # ... b calls the next
    b.resign()
    assert not r.exists(a.key)


def test_a_lone_sweeper_looks_at_its_unanswered_call_only_every_fourth_renewal(r: redis.Redis) -> None:
    a = SweeperElection(r, ["q"], idle_ms=3_000, name="a")
    assert a.hold()
    looks = []
    for _ in range(9):
        a._renewed_at = -1e9
        r.config_resetstat()
        assert a.hold()
        looks.append(int(r.info("commandstats").get("cmdstat_exists", {}).get("calls", 0)))
    assert r.llen(a.line_key) == 1  # one call, waiting for a standby
    assert looks == [1, 1, 0, 0, 0, 1, 0, 0, 0], looks  # the first found the line empty and called


def test_a_deputy_whose_key_went_or_was_taken_goes_back_to_the_line(r: redis.Redis) -> None:
    a = SweeperElection(r, ["q"], idle_ms=3_000, name="a")
    b = SweeperElection(r, ["q"], idle_ms=3_000, name="b")
    assert a.hold()
    r.set(a.deputy_key, b.token)
    b.role = "deputy"
    r.set(a.deputy_key, "another")  # b froze past its deputy hold, another was recruited
    assert not b.hold() and b.role == "line"
    assert r.get(a.deputy_key) == b"another"
    b.resign()  # not b's to give up either
    assert r.get(a.deputy_key) == b"another" and r.get(a.key) == a.token.encode()


def test_a_deputy_whose_key_lapsed_takes_it_again_while_it_is_free(r: redis.Redis) -> None:
    """A deputy's thread starved past its hold (a loaded host) must not drop to the line
    while the key is free: the set would have no watcher until a line wait ends, and a
    sweeper dying meanwhile would leave its job far past the bound (seen in the crash demo
    under a full test run: 16.8 s against 4 s)."""
    a = SweeperElection(r, ["q"], idle_ms=3_000, name="a")
    b = SweeperElection(r, ["q"], idle_ms=3_000, name="b")
    assert a.hold() and not b.hold() and b.role == "deputy"
    r.delete(a.deputy_key)  # b's key lapsed
    assert not b.hold() and b.role == "deputy"
    assert r.get(a.deputy_key) == b.token.encode()


def test_a_standby_whose_set_nx_answer_was_lost_finds_the_election_its_own(r: redis.Redis) -> None:
    a = SweeperElection(r, ["q"], idle_ms=3_000, name="a")
    r.set(a.key, a.token, px=4_000)  # its SET NX landed; the reply did not
    a._unsure = True
    assert a.hold() and a.elected  # not a wait for its own hold to lapse


def test_a_standby_whose_deputy_set_nx_answer_was_lost_finds_the_deputy_its_own(r: redis.Redis) -> None:
    a = SweeperElection(r, ["q"], idle_ms=3_000, name="a")
    b = SweeperElection(r, ["q"], idle_ms=3_000, name="b")
    assert a.hold()
    r.set(a.deputy_key, b.token, px=4_000)  # b's SET NX on the deputy landed; the reply did not
    b.role, b._unsure = "line", True
    assert not b.hold() and b.role == "deputy"


def test_a_line_wait_ends_at_once_when_its_worker_stops(r: redis.Redis) -> None:
    a = SweeperElection(r, ["q"], idle_ms=3_000, name="a")
    deputy = SweeperElection(r, ["q"], idle_ms=3_000, name="deputy")
    b = SweeperElection(r, ["q"], idle_ms=3_000, name="b")
    assert a.hold() and not deputy.hold() and not b.hold()
    waiter = threading.Thread(target=b.hold)  # b looks for a call (none), then listens (up to 12 s)
    waiter.start()
    time.sleep(0.3)
    assert waiter.is_alive()
    stopped_at = time.monotonic()
    b.stopping.set()
    waiter.join(timeout=5)
    assert not waiter.is_alive() and time.monotonic() - stopped_at < 0.5
    b.resign()
    assert r.get(a.key) == a.token.encode()  # nothing else changed


def test_a_line_wait_that_times_out_checks_the_election_once(r: redis.Redis) -> None:
    """The sweeper and the deputy died together: nobody calls the line, so a standby
    takes the free election when its wait ends (at most 2 leases)."""
    lease_ms = 500
    a, deputy, b = (SweeperElection(r, ["q"], lease_ms // 2, name, lease_ms=lease_ms) for name in "adb")
    assert a.hold() and not deputy.hold() and not b.hold() and b.role == "line"
    r.delete(a.key, a.deputy_key)  # a and the deputy died together
    started = time.monotonic()
    assert b.hold() and b.elected  # one wait of 0.5..1 s, then one SET NX
    assert 0.45 <= time.monotonic() - started <= 1.0 + 0.5


def test_a_standby_hears_the_sweepers_call_on_the_lines_channel_and_becomes_the_deputy(
    r: redis.Redis,
) -> None:
    """The call goes out on the line's channel (RQ's pubsub connection, which every worker
    holds): a listening standby wakes at once and takes it, where it would otherwise
    listen for a lease or two (12 s here)."""
    a, deputy, b = (SweeperElection(r, ["q"], idle_ms=3_000, name=name) for name in ("a", "deputy", "b"))
    assert a.hold() and not deputy.hold() and not b.hold() and b.role == "line"
    pubsub = r.pubsub()
    pubsub.subscribe(**{b.line_key: lambda message: b.heard()})
    listener = pubsub.run_in_thread(sleep_time=0.05, daemon=True)
    try:
        waiter = threading.Thread(target=b.hold)
        waiter.start()
        time.sleep(0.3)
        r.delete(a.deputy_key)  # the deputy died
        a._renewed_at = -1e9
        called_at = time.monotonic()
        assert a.hold()  # its renewal calls the line
        waiter.join(timeout=5)
        assert not waiter.is_alive() and time.monotonic() - called_at < 1.0
        assert b.role == "deputy" and r.get(a.deputy_key) == b.token.encode()
        assert not r.exists(a.line_key)  # the call taken
    finally:
        listener.stop()
        listener.join(timeout=2)
        pubsub.close()
