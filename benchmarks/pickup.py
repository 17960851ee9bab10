"""Idle workers: how fast a new job is picked up, and what waiting costs Redis.

For one queue and for three, ours (LeaseWorker) beside stock RQ (rq.Worker), same run,
same private redis-server: the latency from enqueue to the job starting (p50, p95), and
the Redis commands per second an idle worker sends. Each job is enqueued 0.05-0.3 s after
the last one finished, so every pick-up is an idle worker's. The samples are taken in
``--rounds`` alternating rounds (stock first, then ours first), a new worker each round, so
that a slow spell of the machine falls on both: a p95 of a few dozen samples was the
second-slowest of them, and swung by 30% between runs.

    python benchmarks/pickup.py [--samples 200] [--rounds 4] [--idle-seconds 10] [--quick]
"""

from __future__ import annotations

import argparse
import random
import time

import redis
from common import OURS, STOCK, percentile, private_redis, table, wait_until, worker
from rq import Queue


def idle_commands_per_second(r: redis.Redis, seconds: float) -> float:
    r.config_resetstat()
    time.sleep(seconds)
    stats = r.info("commandstats")
    calls = sum(v["calls"] for k, v in stats.items() if k != "cmdstat_config" and k != "cmdstat_info")
    return calls / seconds


def pickup_latencies(r: redis.Redis, queues: list[str], samples: int) -> list[float]:
    target = Queue(queues[-1], connection=r)  # the last queue: the one a worker looks at last
    latencies = []
    for _ in range(samples):
        time.sleep(random.uniform(0.05, 0.3))
        sent = time.time()
        job = target.enqueue("bench_jobs.noop")
        wait_until(lambda j=job: r.hget(j.key, "started_at"), 10, interval=0.0005)
        job.refresh()
        latencies.append(job.started_at.timestamp() - sent)  # type: ignore[union-attr]
        wait_until(lambda j=job: r.hget(j.key, "status") == b"finished", 10, interval=0.001)
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=200, help="pick-ups per worker class and queue set")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    parser.add_argument("--quick", action="store_true", help="a short run that only shows the script works")
    options = parser.parse_args()
    if options.quick:
        options.samples, options.rounds, options.idle_seconds = 4, 2, 1.0
    rows = []
    with private_redis() as url:
        r = redis.Redis.from_url(url)
        for queues in (["default"], ["a", "b", "default"]):
            idle: dict[str, list[float]] = {STOCK: [], OURS: []}
            latencies: dict[str, list[float]] = {STOCK: [], OURS: []}
            per_round = max(1, options.samples // options.rounds)
            for round_ in range(options.rounds):
                for worker_class in (STOCK, OURS) if round_ % 2 == 0 else (OURS, STOCK):
                    r.flushdb()
                    with worker(url, worker_class, queues):
                        wait_until(lambda: r.scard("rq:workers") == 1, 10)
                        time.sleep(1.0)
                        if round_ == 0:
                            idle[worker_class].append(idle_commands_per_second(r, options.idle_seconds))
                        latencies[worker_class] += pickup_latencies(r, queues, per_round)
            for worker_class in (STOCK, OURS):
                lat = latencies[worker_class]
                rows.append(
                    [
                        len(queues),
                        worker_class,
                        len(lat),
                        f"{percentile(lat, 50) * 1000:.1f}",
                        f"{percentile(lat, 95) * 1000:.1f}",
                        f"{idle[worker_class][0]:.1f}",
                    ]
                )
    headers = ["queues", "worker", "pick-ups", "pick-up p50 ms", "pick-up p95 ms", "idle Redis cmds/s"]
    print(table(headers, rows))


if __name__ == "__main__":
    main()
