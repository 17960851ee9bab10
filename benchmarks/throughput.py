"""No-op job throughput and Redis cost per job: ours beside stock RQ, same run.

LeaseWorker against rq.Worker (fork per job) and SimpleLeaseWorker against
rq.SimpleWorker, each draining the same number of no-op jobs in burst mode on the same
private redis-server. Throughput is timed from the first job's start to the last job's
end (worker start-up excluded), best of alternating runs. Cost per job comes from a
separate, instrumented run (``count_round_trips``: counting slows the worker a little):
Redis commands from INFO commandstats (every command Redis ran, those inside our scripts
included), round trips counted inside the worker and each horse, and Redis CPU (INFO
cpu, user + sys; noisy on a shared machine); a burst over no jobs is subtracted, so
start-up and exit are not counted.

    python benchmarks/throughput.py [--jobs 2000] [--quick]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import redis
from common import HERE, private_redis, table, worker
from rq import Queue
from rq.utils import utcparse

PAIRS = [("rq.Worker", "rq_emq.LeaseWorker"), ("rq.SimpleWorker", "rq_emq.SimpleLeaseWorker")]
COUNTER = HERE / "count_round_trips"
IGNORED = ("cmdstat_config", "cmdstat_info")


def enqueue(r: redis.Redis, jobs: int) -> list[str]:
    r.flushdb()
    queue = Queue(connection=r)
    ids: list[str] = []
    for start in range(0, jobs, 500):
        batch = [Queue.prepare_data("bench_jobs.noop") for _ in range(start, min(jobs, start + 500))]
        ids += [job.id for job in queue.enqueue_many(batch)]
    return ids


def drain(url: str, worker_class: str, jobs: int) -> float:
    """Jobs per second, from the first job's start to the last one's end."""
    r = redis.Redis.from_url(url)
    ids = enqueue(r, jobs)
    with worker(url, worker_class, ["default"], burst=True) as process:
        process.wait(timeout=600)
    starts, ends = [], []
    with r.pipeline() as pipe:
        for job_id in ids:
            pipe.hmget(f"rq:job:{job_id}", "started_at", "ended_at", "status")
        for started, ended, status in pipe.execute():
            assert status == b"finished", status
            starts.append(started.decode())
            ends.append(ended.decode())
    elapsed = (utcparse(max(ends)) - utcparse(min(starts))).total_seconds()
    return jobs / elapsed


def burst_cost(url: str, worker_class: str, jobs: int) -> tuple[int, int, float]:
    """Redis commands run (INFO commandstats, those inside scripts included), round trips
    sent (counted inside the worker and its horses) and Redis CPU seconds (INFO cpu) of one
    burst over ``jobs`` jobs."""
    r = redis.Redis.from_url(url)
    enqueue(r, jobs)
    r.config_resetstat()
    cpu = r.info("cpu")
    with tempfile.TemporaryDirectory() as counts:
        env = {
            "PYTHONPATH": os.pathsep.join([str(COUNTER), str(HERE), os.environ.get("PYTHONPATH", "")]),
            "BENCH_ROUND_TRIPS_DIR": counts,
        }
        with worker(url, worker_class, ["default"], burst=True, env=env) as process:
            process.wait(timeout=600)
        trips = sum(int(path.read_text()) for path in Path(counts).iterdir())
    cpu_after = r.info("cpu")
    stats = r.info("commandstats")
    assert r.llen("rq:queue:default") == 0
    used = sum(cpu_after[k] - cpu[k] for k in ("used_cpu_user", "used_cpu_sys"))
    return sum(v["calls"] for k, v in stats.items() if k not in IGNORED), trips, used


def per_job_cost(url: str, worker_class: str, jobs: int) -> tuple[float, float, float]:
    """Commands, round trips and Redis CPU microseconds per job, the worker's start-up and
    exit taken out."""
    fixed = burst_cost(url, worker_class, 0)
    total = burst_cost(url, worker_class, jobs)
    commands, trips, cpu = ((t - f) / jobs for t, f in zip(total, fixed, strict=True))
    return commands, trips, cpu * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3, help="alternating runs per worker; best kept")
    parser.add_argument("--count-jobs", type=int, default=300, help="jobs of the (separate) counting run")
    parser.add_argument("--quick", action="store_true")
    options = parser.parse_args()
    if options.quick:
        options.jobs, options.rounds, options.count_jobs = 50, 1, 20
    rows = []
    with private_redis() as url:
        for stock, ours in PAIRS:
            best: dict[str, float] = {}
            for _ in range(options.rounds):
                for worker_class in (stock, ours):
                    jobs_per_second = drain(url, worker_class, options.jobs)
                    best[worker_class] = max(best.get(worker_class, 0.0), jobs_per_second)
            cost = {w: per_job_cost(url, w, options.count_jobs) for w in (stock, ours)}
            (s_cmds, s_trips, s_cpu), (o_cmds, o_trips, o_cpu) = cost[stock], cost[ours]
            stock_row = [stock, f"{best[stock]:.0f}", "", f"{s_cmds:.1f}", "", f"{s_trips:.1f}", ""]
            rows.append([*stock_row, f"{s_cpu:.0f}"])
            rows.append(
                [
                    ours,
                    f"{best[ours]:.0f}",
                    f"{best[ours] / best[stock]:.2f}",
                    f"{o_cmds:.1f}",
                    f"{o_cmds / s_cmds:.2f}",
                    f"{o_trips:.1f}",
                    f"{o_trips / s_trips:.2f}",
                    f"{o_cpu:.0f}",
                ]
            )
    print(
        table(
            [
                "worker",
                "jobs/s",
                "throughput ratio",
                "Redis commands/job",
                "commands ratio",
                "round trips/job",
                "round trips ratio",
                "Redis CPU usec/job",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
