"""Jobs for the crash demo (workers import this module; examples/ is on their PYTHONPATH)."""

from __future__ import annotations

import os
import time


def work(seconds: float, log: str) -> str:
    from rq import get_current_job

    job = get_current_job()
    with open(log, "a") as out:
        out.write(f"start {job.id if job else '-'} {os.getpid()}\n")
    time.sleep(seconds)
    return f"done by pid {os.getpid()}"
