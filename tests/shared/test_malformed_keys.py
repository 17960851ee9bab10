"""Bad data never wedges a queue (issue 33, rule 4): a key of ours of the wrong type, or a
counter that holds no integer, costs no job and stops no worker (lua/lib/own_keys.lua).

Telemetry (the stats hash, the events stream, the minutes ring) is skipped and left for the
operator to look at; an index (the leases and stalled zsets) of another type holds no entry
of ours and is replaced. Either way the Python side logs the key once per process."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator

import pytest
import redis
from click.testing import CliRunner
from helpers import FAST, leased_job, wait_status
from procs import Processes, pid_alive, wait_for
from rq import Queue
from stalls import Q, next_round, stall, sweeper

from rq_emq import malformed, scripts
from rq_emq.hold.lease import LockManager
from rq_emq.intake.take import Taker
from rq_emq.keys import QueueKeys, job_key
from rq_emq.operate.cli import main
from rq_emq.recover.rollback import release_to_rq
from rq_emq.settings import LeaseSettings

SETTINGS = LeaseSettings(lease_ms=2_000, renew_interval_ms=500)

#: Ways a counter hash of ours can be malformed: another type, a field that is no count.
BAD_STATS: dict[str, Callable[[redis.Redis, str], object]] = {
    "a string": lambda r, key: r.set(key, "oops"),
    "a list": lambda r, key: (r.delete(key), r.rpush(key, "oops")),
    "taken = abc": lambda r, key: r.hset(key, "taken", "abc"),
}


@pytest.fixture(autouse=True)
def log_each_key_again() -> Iterator[None]:
    malformed.forget()
    yield
    malformed.forget()


def malformed_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "is malformed" in r.getMessage()]


@pytest.mark.parametrize("bad", BAD_STATS)
def test_a_take_with_malformed_stats_leases_the_job_whole_and_logs_the_key_once(
    r: redis.Redis, caplog: pytest.LogCaptureFixture, bad: str
) -> None:
    """The old take counted `taken` last, after the lock, the lease entry and the job's
    fields: its WRONGTYPE left the job half-claimed (leased, status queued, in no queue list)
    and every worker crashed on the next job the same way."""
    BAD_STATS[bad](r, Q.stats)
    jobs = [Queue("q", connection=r).enqueue("jobs.noop") for _ in range(2)]
    taker = Taker(r, "w1", SETTINGS)
    with caplog.at_level(logging.WARNING, logger="rq_emq.lease"):
        taken = [taker.pop(["q"]), taker.pop(["q"])]
    assert [t.job_id if t else None for t in taken] == [job.id for job in jobs]
    for t in taken:
        assert t is not None
        assert r.get(Q.lock(t.job_id)) == t.token.encode() and r.zscore(Q.leases, t.job_id) is not None
        assert r.hget(job_key(t.job_id), "emq_token") == t.token.encode()
    assert r.llen(Q.rq_queue) == 0
    lines = malformed_lines(caplog)
    assert len(lines) == 1 and Q.stats in lines[0], lines  # once per process, naming the key
    left_as_found = {"a string": b"string", "a list": b"list", "taken = abc": b"hash"}
    assert r.type(Q.stats) == left_as_found[bad]  # telemetry: skipped, not replaced


@pytest.mark.parametrize("bad", BAD_STATS)
def test_a_lease_with_malformed_stats_renews_finishes_and_hands_back(r: redis.Redis, bad: str) -> None:
    job, lease = leased_job(r)
    BAD_STATS[bad](r, Q.stats)
    manager = LockManager(r, SETTINGS.lease_ms, SETTINGS.renew_interval_ms, on_lost=lambda lease: None)
    manager.add(lease)
    assert manager.tick() == [] and not lease.lost  # renewed, whatever the counters
    assert lease.hand_back(r)
    assert r.lrange(Q.rq_queue, 0, -1) == [job.id.encode()] and r.zcard(Q.leases) == 0
    taken = Taker(r, "w2", SETTINGS).pop(["q"])
    assert taken is not None
    keys = [job_key(job.id), Q.lock(job.id), Q.leases, Q.stalled, Q.stats, Q.rq_queue]
    outcome = [1, 4, "HSET", job_key(job.id), "status", "finished"]  # one packed command
    reply = scripts.load("finish_job")(r, keys, [job.id, taken.token, "rq:", "finished", *outcome])
    assert int(reply[0]) == 1 and r.hget(job_key(job.id), "status") == b"finished"
    assert not r.exists(Q.lock(job.id)) or r.get(Q.lock(job.id)).startswith(b"done:")
    assert r.zscore(Q.leases, job.id) is None


def test_an_index_of_another_type_is_replaced_and_each_live_lease_indexed_again(r: redis.Redis) -> None:
    """The leases and stalled zsets hold only what our scripts wrote there: one of another
    type holds nothing of ours. The take replaces it; a renewal whose job still names its
    holder puts its lease back into a replaced index (the job hash says who holds it)."""
    r.rpush(Q.leases, "not-a-lease")
    job, lease = leased_job(r)
    assert r.type(Q.leases) == b"zset" and r.zscore(Q.leases, job.id) is not None
    r.set(Q.leases, "clobbered")
    r.set(Q.stalled, "clobbered")
    manager = LockManager(r, SETTINGS.lease_ms, SETTINGS.renew_interval_ms, on_lost=lambda lease: None)
    manager.add(lease)
    assert manager.tick() == [] and not lease.lost
    assert r.type(Q.leases) == b"zset" and r.zscore(Q.leases, job.id) is not None
    assert r.type(Q.stalled) == b"zset" or not r.exists(Q.stalled)


def test_the_sweep_recovers_with_its_record_malformed_and_says_which_keys(r: redis.Redis) -> None:
    (job_id,) = stall(r)
    r.set(Q.stats, "oops")
    r.set(Q.events, "oops")
    r.rpush(Q.minutes, "oops")
    s = sweeper(r)
    first = s.sweep("q")
    assert first.marked == [job_id]
    next_round(s)
    second = s.sweep("q")
    assert second.requeued == [job_id]
    assert r.lrange(Q.rq_queue, 0, -1) == [job_id.encode()]
    assert r.zscore(Q.leases, job_id) is None and r.hget(job_key(job_id), "status") == b"queued"
    named = " ".join(first.problems + second.problems)
    for key in (Q.stats, Q.events, Q.minutes):
        assert key in named
    assert r.get(Q.stats) == b"oops" and r.get(Q.events) == b"oops"  # telemetry: left as found


def test_a_rate_limit_key_without_an_expiry_does_not_stop_the_rounds(r: redis.Redis) -> None:
    """Ours always lapses; one set without an expiry would refuse every round forever."""
    (job_id,) = stall(r)
    r.set(Q.sweep, "1")
    report = sweeper(r).sweep("q")
    assert report.ran and report.marked == [job_id]
    assert 0 < r.pttl(Q.sweep) and any(Q.sweep in problem for problem in report.problems)


def test_rq_emq_sweep_exits_0_when_it_did_its_work_and_reports_the_problem(
    r: redis.Redis, redis_url: str
) -> None:
    (job_id,) = stall(r)
    r.hset(Q.stats, "marked", "abc")
    env = {"RQ_EMQ_LEASE_MS": "1000", "RQ_EMQ_RENEW_INTERVAL_MS": "200", "RQ_EMQ_SWEEP_INTERVAL_MS": "313"}
    first = CliRunner().invoke(main, ["sweep", "q", "--url", redis_url, "--json"], env=env)
    assert first.exit_code == 0, first.output
    (queue,) = json.loads(first.output)["queues"]
    assert queue["marked"] == [job_id] and any("field marked" in p for p in queue["problems"])
    next_round(sweeper(r))
    second = CliRunner().invoke(main, ["sweep", "q", "--url", redis_url], env=env)
    assert second.exit_code == 0, second.output
    assert "1 recovered" in second.output
    assert r.lrange(Q.rq_queue, 0, -1) == [job_id.encode()]


def dead_lease(r: redis.Redis, queue: str) -> str:
    """A job leased on ``queue`` by a worker that died (its lock gone)."""
    job = Queue(queue, connection=r).enqueue("jobs.noop")
    taken = Taker(r, "dead", SETTINGS).pop([queue])
    assert taken is not None
    r.delete(QueueKeys(queue).lock(job.id))
    return job.id


def test_rollback_hands_back_every_queue_it_can_and_names_the_one_it_cannot(
    r: redis.Redis, redis_url: str
) -> None:
    """The old rollback stopped at the first WRONGTYPE: the queues after it were never
    handed back, and ``--json`` printed nothing of those before it."""
    first, broken, last = dead_lease(r, "a"), dead_lease(r, "b"), dead_lease(r, "c")
    r.set(QueueKeys("a").stats, "oops")  # ours: no reason to stop
    r.set(QueueKeys("b").rq_queue, "oops")  # RQ's queue list: nothing can go back there
    r.hset(QueueKeys("c").stats, "released_to_rq", "abc")
    released = {r.queue: r for r in release_to_rq(r, ["a", "b", "c"])}
    assert released["a"].requeued == 1 and released["c"].requeued == 1
    assert r.lrange(QueueKeys("a").rq_queue, 0, -1) == [first.encode()]
    assert r.lrange(QueueKeys("c").rq_queue, 0, -1) == [last.encode()]
    assert released["b"].error and QueueKeys("b").rq_queue in released["b"].error
    # nothing was written on the queue that could not be handed back: still leased as it was
    assert r.zscore(QueueKeys("b").leases, broken) is not None
    assert r.hget(job_key(broken), "emq_token") is not None
    assert released["a"].problems and released["c"].problems

    r.delete(QueueKeys("a").rq_queue, QueueKeys("c").rq_queue)
    dead_lease(r, "a")
    result = CliRunner().invoke(main, ["rollback", "a", "b", "c", "--url", redis_url, "--json"])
    assert result.exit_code == 1
    document = json.loads(result.output[: result.output.rindex("}") + 1])
    assert [q["queue"] for q in document["queues"]] == ["a", "b", "c"]
    assert document["queues"][0]["requeued"] == 1 and document["queues"][1]["error"]
    assert "could not hand back queue(s) b" in result.output
    text = CliRunner().invoke(main, ["rollback", "a", "b", "c", "--url", redis_url])
    assert text.exit_code == 1
    assert "b: 0 started run(s)" in text.output and "NOT handed back" in text.output


def test_a_worker_on_a_queue_with_malformed_stats_runs_its_jobs_and_stays(
    r: redis.Redis, redis_url: str, procs: Processes
) -> None:
    """A real `rq worker -w rq_emq.LeaseWorker`: the old one exited with a traceback at its
    first take, leaving that job half-claimed."""
    r.hset(QueueKeys("default").stats, "taken", "abc")
    r.set(QueueKeys("default").events, "oops")
    queue = Queue(connection=r)
    jobs = [queue.enqueue("jobs.add", i, 1) for i in range(3)]
    worker = procs.worker(redis_url, **FAST)
    for job in jobs:
        wait_status(r, job.id, "finished", timeout=30)
    later = queue.enqueue("jobs.add", 5, 5)
    wait_status(r, later.id, "finished", timeout=30)
    wait_for(lambda: True, timeout=1)
    assert worker.poll() is None and pid_alive(worker.pid), procs.log(worker)
    log = procs.log(worker)
    assert "Traceback" not in log
    assert log.count(f"rq-emq key {QueueKeys('default').stats} is malformed") == 1, log
    assert r.hget(QueueKeys("default").stats, "taken") == b"abc"
