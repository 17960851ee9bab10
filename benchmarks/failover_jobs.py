"""Jobs for benchmarks/failover.py and tests/connection/test_failover.py: each run appends a line with
its job id, worker tag and wall-clock time, so the harness can count runs, overlaps and
each worker's first start after a failover; the failure callback leaves a line too."""

from __future__ import annotations

import os
import time

from rq import get_current_job


def _line(log: str, what: str, job_id: str) -> None:
    with open(log, "a") as out:
        out.write(f"{what} {job_id} {os.environ.get('FAILOVER_WORKER', '?')} {time.time():.4f}\n")


def work(log: str, seconds: float) -> str:
    job = get_current_job()
    job_id = job.id if job is not None else "?"
    _line(log, "start", job_id)
    time.sleep(seconds)
    _line(log, "end", job_id)
    return "done"


def on_failure(job: object, connection: object, exc_type: object, exc_value: object, tb: object) -> None:
    _line(job.meta["log"], "failure_callback", job.id)  # type: ignore[attr-defined]
