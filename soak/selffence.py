"""The workers' own evidence for a repeat that no fault of the soak explains.

A holder whose renewals do not land for lease − margin (they time out in a Redis-wide
stall, on fsync latency under ``appendfsync always``, on a starved host) stops its run on
its local lease clock and logs one line saying so (``rq_emq/hold/lease.py``: "job J on queue Q:
local lease clock ran out ..."); the sweep then recovers the job and it runs again. That
is self-fencing doing its job, not a duplicate. The soak reads those lines from each
worker's log (one log per worker process) and counts such a repeat as a *self-fenced
stop*; a repeat with neither a fault nor such a line is still a violation, and an overlap
is one whatever the logs say (:mod:`soak.overlap`).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

#: the line a LeaseWorker logs when its local lease clock stops a run (or finds it ran out
#: by the run's end, when the horse fenced itself first)
CLOCK_RAN_OUT = re.compile(r"job (\S+) on queue \S+: local lease clock ran out")


def read_stops(log_dir: Path, pid_of: dict[str, int]) -> list[tuple[int, str]]:
    """(worker pid, job id) for each self-fenced stop in the worker logs under ``log_dir``;
    ``pid_of`` names each log's process (its file name without ``.log``)."""
    stops = []
    for name, pid in sorted(pid_of.items()):
        path = log_dir / f"{name}.log"
        if path.exists():
            text = path.read_text(errors="replace")
            stops += [(pid, match.group(1)) for match in CLOCK_RAN_OUT.finditer(text)]
    return stops


def fenced_runs(runs: dict[str, list[Any]], stops: Iterable[tuple[int, str]]) -> set[tuple[str, float]]:
    """The runs (job id, start) that a self-fenced stop explains: each logged stop explains
    one run of that job by that worker that another run followed (the earliest first: a
    log line does not say which of a worker's runs of a job it stopped)."""
    left = Counter((int(pid), job_id) for pid, job_id in stops)
    explained = set()
    for job_id, job_runs in runs.items():
        for run, _following in zip(job_runs, job_runs[1:], strict=False):
            key = (run.ppid, job_id)
            if run.outcome == "raise":
                continue  # RQ's Retry: that repeat needs no explaining
            if left[key] > 0:
                left[key] -= 1
                explained.add((job_id, run.started))
    return explained
