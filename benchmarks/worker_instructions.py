"""The worker's own work per job, as instructions: ours beside stock RQ, one run.

A worker that does not fork is bound by its own CPU (a no-op job's Python: RQ's loop,
redis-py packing commands and parsing replies, our lease), not by Redis's, and its jobs/s
(``cost.py``) swing with the host by ±10% from one burst to the next. The instructions it
executes for the same jobs do not. This runs ``rq worker --burst`` under ``valgrind
--tool=callgrind`` twice per class, over no jobs and over ``--jobs`` no-op jobs enqueued
beforehand, on one private redis-server: the difference over the jobs is the per-job
cost, the first run the start-up (imports, registration, script loading, exit).

What it cannot see: the kernel's work for each round trip (system CPU), where stock RQ,
with some four times our round trips a job, spends more, and the time a worker waits
for each reply. Forking workers are left out (each horse is a process of its own).

    python benchmarks/worker_instructions.py [--jobs 300] [--quick]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys

import redis
from common import HERE, RQ_BIN, private_redis, table, worker_environ
from rq import Queue

PAIRS = [("rq.SimpleWorker", "rq_emq.SimpleLeaseWorker")]


def instructions(url: str, worker_class: str, jobs: int) -> int:
    """Instructions (callgrind's Ir) of one burst worker process over ``jobs`` no-op jobs."""
    r = redis.Redis.from_url(url)
    r.flushdb()
    if jobs:
        data = [Queue.prepare_data("bench_jobs.noop") for _ in range(jobs)]
        Queue("q0", connection=r).enqueue_many(data)
    # Python's own allocator, not valgrind's view of pymalloc arenas: same counts run to run
    env = {**worker_environ(), "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    env["PYTHONMALLOC"] = "malloc"
    run = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, RQ_BIN]
        + ["worker", "-w", worker_class, "--url", url, "-q", "--burst", "q0"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        timeout=1800,
    )
    found = re.search(r"Collected : (\d+)", run.stderr)
    if run.returncode != 0 or found is None:
        sys.exit(f"worker_instructions: {worker_class} failed:\n{run.stderr[-2000:]}")
    if r.llen("rq:queue:q0"):
        sys.exit(f"worker_instructions: {worker_class} left jobs behind")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--quick", action="store_true", help="our start-up alone: shows it still runs")
    options = parser.parse_args()
    if shutil.which("valgrind") is None:
        print("worker_instructions: valgrind is not installed (Debian: apt-get install valgrind)")
        sys.exit(0 if options.quick else 1)
    rows: list[list[object]] = []
    with private_redis() as url:
        if options.quick:
            start_up = instructions(url, PAIRS[0][1], 0)
            print(table(["what", "rq-emq"], [["start-up, M instructions", f"{start_up / 1e6:.0f}"]]))
            return
        for stock_class, our_class in PAIRS:
            measured = {}
            for cls in (stock_class, our_class):
                start_up = instructions(url, cls, 0)
                measured[cls] = (start_up, (instructions(url, cls, options.jobs) - start_up) / options.jobs)
            label = f"{our_class.split('.')[-1]} vs {stock_class}"
            (stock_start, stock_job), (our_start, our_job) = measured[stock_class], measured[our_class]
            rows.append(
                [f"instructions per job (M), {label}", f"{stock_job / 1e6:.2f}", f"{our_job / 1e6:.2f}"]
                + [f"{our_job / stock_job:.2f}x"]
            )
            rows.append(
                [f"start-up (M), {label}", f"{stock_start / 1e6:.0f}", f"{our_start / 1e6:.0f}"]
                + [f"{our_start / stock_start:.2f}x"]
            )
    print(f"{options.jobs} no-op jobs on one queue; the worker process, callgrind's Ir, user space only")
    print("(ratio: ours over stock: below 1.00x is ours cheaper)")
    print(table(["what", "stock RQ", "rq-emq", "ratio"], rows))


if __name__ == "__main__":
    main()
