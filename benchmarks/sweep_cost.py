"""What a sweep costs Redis, with many jobs in flight and some or all of them stalled.

For 1k, 10k and 100k leased jobs in flight, with 0 %, 1 % and 100 % of them stalled
(lock gone, deadline passed), runs one marking round and one recovering round of our
sweep, and reports the Redis time they took in all and the longest single EVALSHA (from
SLOWLOG, which times each command inside Redis). Beside it, stock RQ's
``StartedJobRegistry.cleanup()`` on the same number of overdue entries (what `rq info`
or a worker's maintenance pass runs), timed the same way.

    python benchmarks/sweep_cost.py [--quick]
"""

from __future__ import annotations

import argparse
import logging
import time

import redis
from common import private_redis, table
from rq.registry import StartedJobRegistry

from rq_emq import scripts
from rq_emq.keys import QueueKeys
from rq_emq.recover.sweep import Sweeper
from rq_emq.settings import LeaseSettings

Q = QueueKeys("bench")


def fill(r: redis.Redis, in_flight: int, stalled: int) -> None:
    """Leased jobs as a worker leaves them; the first `stalled` ones have lost their lock."""
    r.flushdb()
    now_ms = int(time.time() * 1000)
    with r.pipeline(transaction=False) as pipe:
        for i in range(in_flight):
            job_id = f"job-{i}"
            pipe.hset(
                f"rq:job:{job_id}",
                mapping={
                    "status": "started",
                    "origin": "bench",
                    "emq_attempts": 1,
                    "emq_max_attempts": 3,
                    "emq_token": f"t{i}",
                },
            )
            if i >= stalled:
                pipe.set(Q.lock(job_id), f"t{i}", px=600_000)
                pipe.zadd(Q.leases, {job_id: now_ms + 600_000})
            else:
                pipe.zadd(Q.leases, {job_id: now_ms - 1})
            if i % 5000 == 4999:
                pipe.execute()
        pipe.execute()


def slowlog_usec(r: redis.Redis, command: bytes) -> tuple[int, int, int]:
    entries = [e for e in r.slowlog_get(100_000) if e["command"].split(b" ")[0].upper() == command]
    durations = [int(e["duration"]) for e in entries]
    return sum(durations), max(durations, default=0), len(durations)


def measure_ours(r: redis.Redis, in_flight: int, stalled: int) -> tuple[float, float, int]:
    fill(r, in_flight, stalled)
    sweeper = Sweeper(r, ["bench"], LeaseSettings(sweep_interval_ms=16, renew_interval_ms=10, lease_ms=1000))
    scripts.load_all(r)
    r.slowlog_reset()
    sweeper.sweep("bench", mode="force")  # marks
    time.sleep(sweeper.grace_ms / 1000 + 0.01)
    sweeper.sweep("bench", mode="force")  # recovers
    total, longest, calls = slowlog_usec(r, b"EVALSHA")
    assert r.llen(Q.rq_queue) == stalled, (r.llen(Q.rq_queue), stalled)
    return total / 1000, longest / 1000, calls


def measure_stock(r: redis.Redis, in_flight: int, stalled: int) -> tuple[float, float]:
    r.flushdb()
    overdue = time.time() - 10
    with r.pipeline(transaction=False) as pipe:
        for i in range(in_flight):
            pipe.hset(f"rq:job:s{i}", mapping={"status": "started", "origin": "bench", "data": b"x"})
            pipe.zadd("rq:wip:bench", {f"s{i}:e": overdue if i < stalled else overdue + 10_000})
            if i % 5000 == 4999:
                pipe.execute()
        pipe.execute()
    r.slowlog_reset()
    started = time.perf_counter()
    StartedJobRegistry("bench", connection=r).cleanup()
    wall = time.perf_counter() - started
    longest = max((int(e["duration"]) for e in r.slowlog_get(100_000)), default=0)
    return wall * 1000, longest / 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    options = parser.parse_args()
    logging.disable(logging.WARNING)  # stock cleanup logs every job it fails
    sizes = [1_000] if options.quick else [1_000, 10_000, 100_000]
    rows = []
    with private_redis() as url:
        r = redis.Redis.from_url(url)
        r.config_set("slowlog-log-slower-than", 0)
        r.config_set("slowlog-max-len", 200_000)
        for in_flight in sizes:
            for share in (0.0, 0.01, 1.0):
                stalled = int(in_flight * share)
                total, longest, calls = measure_ours(r, in_flight, min(stalled, 10_000))
                stock_wall, stock_longest = measure_stock(r, in_flight, stalled)
                rows.append(
                    [
                        f"{in_flight:,}",
                        f"{min(stalled, 10_000):,}",
                        calls,
                        f"{total:.2f}",
                        f"{longest:.2f}",
                        f"{stock_wall:.0f}",
                        f"{stock_longest:.2f}",
                    ]
                )
    print(
        table(
            [
                "in flight",
                "stalled",
                "our calls",
                "our Redis ms (2 rounds)",
                "our longest call ms",
                "stock cleanup wall ms",
                "stock longest cmd ms",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
