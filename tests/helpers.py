"""Small readers of Redis state shared by the process tests."""

from __future__ import annotations

import time

import redis
from procs import wait_for
from rq import Queue
from rq.job import Job

from rq_emq.hold.lease import Lease
from rq_emq.intake.take import Taker
from rq_emq.keys import QueueKeys, job_key
from rq_emq.settings import LeaseSettings

# Short settings so that a test sees many lease lifetimes in a few seconds. The lease is
# 800 ms (trusted locally for about 720 ms past a renewal sent every 100 ms): at 400 ms a
# worker beside two CPU burners and three other test processes went 452 ms without a
# renewal landing, and its watchdog rightly ended the run (.ci/stress); twice the room.
# The sweep interval is the shortest the renew interval allows (renew <= 0.64 sweep).
FAST = {"RQ_EMQ_LEASE_MS": "800", "RQ_EMQ_RENEW_INTERVAL_MS": "100", "RQ_EMQ_SWEEP_INTERVAL_MS": "157"}
#: For tests of RQ's own behaviour that need no recovery (an order of takes, a job timeout,
#: a stop command): a lease far longer than any run, so a starved host never makes a
#: worker stop a run on its lease clock and the sweep run it again.
STEADY = {"RQ_EMQ_LEASE_MS": "10000"}


def status(r: redis.Redis, job_id: str) -> str | None:
    value = r.hget(job_key(job_id), "status")
    return value.decode() if value else None


def wait_status(r: redis.Redis, job_id: str, *wanted: str, timeout: float = 15.0) -> str:
    return str(
        wait_for(
            lambda: status(r, job_id) in wanted and status(r, job_id),
            timeout=timeout,
            what=f"job {job_id} status in {wanted}",
        )
    )


def stat(r: redis.Redis, queue: str, name: str) -> int:
    return int(r.hget(QueueKeys(queue).stats, name) or 0)


def started_members(r: redis.Redis, queue: str) -> list[str]:
    return [m.decode() for m in r.zrange(QueueKeys(queue).started, 0, -1)]


def horse_pid_from(lines: list[str]) -> int:
    return int(lines[0].split()[1])


def lease_state(r: redis.Redis, queue: str, job_id: str) -> dict[str, object]:
    q = QueueKeys(queue)
    return {
        "lock": r.get(q.lock(job_id)),
        "indexed": r.zscore(q.leases, job_id) is not None,
        "token": r.hget(job_key(job_id), "emq_token"),
        "attempts": r.hget(job_key(job_id), "emq_attempts"),
    }


def take_away(r: redis.Redis, job_id: str, status: str, new_owner: str | None = None) -> None:
    """What a recovery elsewhere does to the holder: lease gone, owner record changed."""
    q = QueueKeys("default")
    with r.pipeline() as pipe:
        pipe.zrem(q.leases, job_id).delete(q.lock(job_id)).hset(job_key(job_id), "status", status)
        if new_owner:
            pipe.hset(job_key(job_id), "emq_token", new_owner)
        else:
            pipe.hdel(job_key(job_id), "emq_token")
        pipe.execute()


def now() -> float:
    return time.time()


def count_pipelines(monkeypatch: object) -> list[int]:
    """From now on in this test, the size of every pipeline sent (one entry per round trip)."""
    sent: list[int] = []
    original = redis.client.Pipeline.execute

    def counting(self: redis.client.Pipeline, *args: object, **kwargs: object) -> object:
        sent.append(len(self))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(redis.client.Pipeline, "execute", counting)  # type: ignore[attr-defined]
    return sent


def leased_job(r: redis.Redis, queue: str = "q") -> tuple[Job, Lease]:
    """A no-op job taken from ``queue`` by worker w1 (2 s lease), and its lease."""
    job = Queue(queue, connection=r).enqueue("jobs.noop")
    taken = Taker(r, "w1", LeaseSettings(lease_ms=2_000, renew_interval_ms=500)).pop([queue])
    assert taken is not None and taken.job_id == job.id
    return job, Lease(queue, job.id, taken.token)


#: Where RQ (2.0 to 3.x) puts a job as it writes each status that takes it out of the
#: queues: its registry, ``rq:<name>:<origin>`` (``stopped`` goes to the failed registry).
REGISTRY_OF = {
    "finished": "finished",
    "failed": "failed",
    "stopped": "failed",
    "canceled": "canceled",
    "scheduled": "scheduled",
    "deferred": "deferred",
    "ready_to_enqueue": "ready",
}


def rq_moves(r: redis.Redis, job_id: str, status: str, origin: str = "q", **fields: str) -> None:
    """What RQ does as it ends or moves a job on with ``status`` (a cancel, stock cleanup, a
    requeue, a stock worker's run): the status (and ``fields``, its stamps) on the job hash,
    and the job where that status says: its registry, its queue list (``queued``), the
    waiting set of its rate limit (``rate_limited``, limit key ``api``), or an execution of
    its own in the started registry (``started``: a stock run, finite score).
    A write of the status alone is what a stale ``job.save()`` does instead."""
    r.hset(job_key(job_id), mapping={"status": status, **fields})
    if status == "rate_limited":  # RQ 3: the waiting set of the limit key the job names
        r.hset(job_key(job_id), "rate_limit_key", "api")
        r.zadd("rq:rl:api:rate_limited", {job_id: time.time()})
    elif status in REGISTRY_OF:
        r.zadd(f"rq:{REGISTRY_OF[status]}:{origin}", {job_id: time.time() + 600})
    elif status == "queued":
        r.rpush(QueueKeys(origin).rq_queue, job_id)
    elif status == "started":
        r.zadd(f"rq:executions:{job_id}", {"stock-run": time.time()})
        r.zadd(f"rq:wip:{origin}", {f"{job_id}:stock-run": time.time() + 600})


def redis_quiet(
    r: redis.Redis, for_s: float, timeout: float = 20.0, ignoring: tuple[str, ...] = ("cmdstat_info",)
) -> None:
    """Wait until Redis has run no command for ``for_s`` (the commandstats entries in
    ``ignoring``, a test's own reads, aside), or ``timeout`` has passed: a worker's threads
    settled (its first sweep round, its watcher's last look) before a test counts."""

    def calls() -> int:
        return sum(int(v["calls"]) for k, v in r.info("commandstats").items() if k not in ignoring)

    deadline, last = time.monotonic() + timeout, calls()
    while time.monotonic() < deadline:
        time.sleep(for_s)
        now = calls()
        if now == last:
            return
        last = now
