"""No-op job throughput and Redis cost per job: ours beside stock RQ, same run.

LeaseWorker against rq.Worker (fork per job) and SimpleLeaseWorker against
rq.SimpleWorker, each draining the same number of no-op jobs in burst mode on the same
private redis-server. Throughput is timed from the first job's start to the last job's
end (worker start-up excluded); Redis cost is INFO commandstats: every command Redis ran
per job, those inside our scripts included.

    python benchmarks/throughput.py [--jobs 2000] [--quick]
"""

from __future__ import annotations

import argparse

import redis
from common import private_redis, table, worker
from rq import Queue
from rq.utils import str_to_date

PAIRS = [("rq.Worker", "rq_emq.LeaseWorker"), ("rq.SimpleWorker", "rq_emq.SimpleLeaseWorker")]


def drain(url: str, worker_class: str, jobs: int) -> tuple[float, float, float]:
    r = redis.Redis.from_url(url)
    r.flushdb()
    queue = Queue(connection=r)
    with r.pipeline() as pipe:
        ids = [queue.enqueue_call("bench_jobs.noop", pipeline=pipe).id for _ in range(jobs)]
        pipe.execute()
    r.config_resetstat()
    with worker(url, worker_class, ["default"], burst=True) as process:
        process.wait(timeout=600)
    stats = r.info("commandstats")
    total = sum(v["calls"] for k, v in stats.items() if k not in ("cmdstat_config", "cmdstat_info"))
    script_calls = sum(stats.get(k, {"calls": 0})["calls"] for k in ("cmdstat_evalsha", "cmdstat_eval"))
    starts, ends = [], []
    with r.pipeline() as pipe:
        for job_id in ids:
            pipe.hmget(f"rq:job:{job_id}", "started_at", "ended_at", "status")
        for started, ended, status in pipe.execute():
            assert status == b"finished", status
            starts.append(started.decode())
            ends.append(ended.decode())
    elapsed = (str_to_date(max(ends)) - str_to_date(min(starts))).total_seconds()
    return jobs / elapsed, total / jobs, script_calls / jobs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3, help="alternating runs per worker; best kept")
    parser.add_argument("--quick", action="store_true")
    options = parser.parse_args()
    if options.quick:
        options.jobs, options.rounds = 50, 1
    rows = []
    with private_redis() as url:
        for stock, ours in PAIRS:
            best: dict[str, tuple[float, float, float]] = {}
            for _ in range(options.rounds):
                for worker_class in (stock, ours):
                    result = drain(url, worker_class, options.jobs)
                    if worker_class not in best or result[0] > best[worker_class][0]:
                        best[worker_class] = result
            s, o = best[stock], best[ours]
            rows.append([stock, f"{s[0]:.0f}", f"{s[1]:.1f}", "", ""])
            rows.append([ours, f"{o[0]:.0f}", f"{o[1]:.1f}", f"{o[0] / s[0]:.2f}", f"{o[1] / s[1]:.2f}"])
    print(table(["worker", "jobs/s", "Redis commands/job", "throughput ratio", "commands ratio"], rows))


if __name__ == "__main__":
    main()
