"""What a worker costs, ours beside stock RQ in one run: connections, throughput, Redis CPU.

One private redis-server; every number is a ratio of two measured the same way:

- **connections** of one worker idle on 1, 3 and 10 queues, and while it runs a job
  (``CLIENT LIST``, the horse's included);
- **throughput** of no-op jobs, start-up included: the wall time of ``rq worker --burst``
  from its launch to its exit over ``--jobs`` jobs enqueued beforehand, ``rq.Worker``
  beside ``LeaseWorker`` (a fork per job) and ``rq.SimpleWorker`` beside
  ``SimpleLeaseWorker``; alternating rounds, the best of each kept;
- **Redis CPU per job** (``INFO cpu``, user + sys) over those same burst runs, on one queue
  and on three (jobs spread over the three).

The machine's load average, and the share of its CPU other guests of its host took during
the run (``/proc/stat``'s steal), are printed with the table: the throughput rows are only
worth reading on a quiet machine.

    python benchmarks/cost.py [--jobs 1000] [--rounds 3] [--quick]
"""

from __future__ import annotations

import argparse
import os
import time

import redis
from common import private_redis, table, worker
from rq import Queue

PAIRS = [("rq.Worker", "rq_emq.LeaseWorker"), ("rq.SimpleWorker", "rq_emq.SimpleLeaseWorker")]
QUEUE_SETS = {1: ["q0"], 3: ["q0", "q1", "q2"]}


def cpu_s(r: redis.Redis) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def connections(url: str, worker_class: str, queue_count: int) -> tuple[int, int]:
    """Connections of one worker: idle, then while it runs a job."""
    r = redis.Redis.from_url(url)
    r.flushdb()
    before = {c["id"] for c in r.client_list()}
    queues = [f"c{i}" for i in range(queue_count)]

    def count() -> int:
        return len([c for c in r.client_list() if c["id"] not in before])

    with worker(url, worker_class, queues):
        time.sleep(4.0)  # registered, its threads started, waiting
        idle = count()
        job = Queue(queues[-1], connection=r).enqueue("bench_jobs.hold", 3.0)
        deadline = time.monotonic() + 20
        while r.get(f"bench:runner:{job.id}") is None and time.monotonic() < deadline:
            time.sleep(0.05)
        running = count()
    return idle, running


def burst(url: str, worker_class: str, queues: list[str], jobs: int) -> tuple[float, float]:
    """Seconds from the burst worker's launch to its exit, and Redis CPU seconds meanwhile."""
    r = redis.Redis.from_url(url)
    r.flushdb()
    for start in range(0, jobs, 500):
        count = min(jobs, start + 500) - start
        for i, queue in enumerate(queues):
            share = [Queue.prepare_data("bench_jobs.noop") for _ in range(i, count, len(queues))]
            if share:
                Queue(queue, connection=r).enqueue_many(share)
    cpu_before, started = cpu_s(r), time.perf_counter()
    with worker(url, worker_class, queues, burst=True) as process:
        process.wait(timeout=900)
    elapsed = time.perf_counter() - started
    assert r.llen("rq:queue:q0") == 0, f"{worker_class} left jobs behind"
    return elapsed, cpu_s(r) - cpu_before


def cpu_ticks() -> tuple[int, int]:
    """The host's CPU time so far (``/proc/stat``, all CPUs): in all, and stolen by the
    hypervisor for other guests (its ``steal`` column); (0, 0) where there is no such file."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(v) for v in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    # user nice system idle iowait irq softirq steal (guest time is counted in user already)
    return sum(fields[:8]), fields[7] if len(fields) > 7 else 0


def ratio(stock: float, ours: float, higher_is_better: bool) -> str:
    if not stock or not ours:
        return "-"
    return f"{(stock / ours if not higher_is_better else ours / stock):.2f}x"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3, help="alternating runs per pair; best kept")
    parser.add_argument("--quick", action="store_true")
    options = parser.parse_args()
    jobs, rounds = (100, 1) if options.quick else (options.jobs, options.rounds)
    rows: list[list[object]] = []
    ticks_before = cpu_ticks()
    with private_redis() as url:
        for queue_count in (1, 3, 10):
            stock = connections(url, "rq.Worker", queue_count)
            ours = connections(url, "rq_emq.LeaseWorker", queue_count)
            rows.append(
                [
                    f"connections on {queue_count} queue(s), idle / running",
                    f"{stock[0]} / {stock[1]}",
                    f"{ours[0]} / {ours[1]}",
                    "-",
                ]
            )
        for stock_class, our_class in PAIRS:
            for queue_count, queues in QUEUE_SETS.items():
                best = {stock_class: float("inf"), our_class: float("inf")}
                cpu = {stock_class: float("inf"), our_class: float("inf")}
                for _ in range(rounds):
                    for cls in (stock_class, our_class):
                        elapsed, spent = burst(url, cls, queues, jobs)
                        best[cls] = min(best[cls], elapsed)
                        cpu[cls] = min(cpu[cls], spent)
                per_s = {cls: jobs / best[cls] for cls in best}
                per_job_us = {cls: cpu[cls] / jobs * 1e6 for cls in cpu}
                label = f"{our_class.split('.')[-1]} vs {stock_class}, {queue_count} queue(s)"
                rows.append(
                    [
                        f"jobs/s, {label}",
                        f"{per_s[stock_class]:.0f}",
                        f"{per_s[our_class]:.0f}",
                        ratio(per_s[stock_class], per_s[our_class], higher_is_better=True),
                    ]
                )
                rows.append(
                    [
                        f"Redis CPU µs per job, {label}",
                        f"{per_job_us[stock_class]:.0f}",
                        f"{per_job_us[our_class]:.0f}",
                        ratio(per_job_us[stock_class], per_job_us[our_class], higher_is_better=False),
                    ]
                )
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    total, stolen = (after - before for after, before in zip(cpu_ticks(), ticks_before, strict=True))
    steal = f"; CPU stolen by other guests meanwhile {100 * stolen / total:.1f}%" if total else ""
    print(
        f"{jobs} no-op jobs, best of {rounds} alternating burst runs, start-up included; "
        f"load average {load}{steal}"
    )
    print("(ratio: ours over stock for jobs/s, stock over ours for CPU: above 1.00x is ours ahead)")
    print(table(["what", "stock RQ", "rq-emq", "ratio"], rows))


if __name__ == "__main__":
    main()
