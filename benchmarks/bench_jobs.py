"""Jobs the benchmarks enqueue (benchmarks/ is on the workers' PYTHONPATH)."""

from __future__ import annotations

import os
import time

from rq import get_current_job


def noop() -> None:
    return None


def hold(seconds: float) -> None:
    """Record which processes run the job, the horse and its worker (so that a benchmark
    can kill them), then keep running."""
    job = get_current_job()
    assert job is not None
    job.connection.set(f"bench:runner:{job.id}", f"{os.getpid()} {os.getppid()}", ex=600)
    time.sleep(seconds)
