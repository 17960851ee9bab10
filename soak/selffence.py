"""The workers' own evidence for a repeat that no fault of the soak explains.

A holder whose renewals do not land for lease − margin (they time out in a Redis-wide
stall, on fsync latency under ``appendfsync always``, on a starved host) stops its run on
its local lease clock and logs one line saying so (``rq_emq/hold/lease.py``: "job J on queue Q:
local lease clock ran out ..."); the sweep then recovers the job and it runs again. That
is self-fencing doing its job, not a duplicate. The soak reads those lines from each
worker's log (one log per worker process) and counts such a repeat as a *self-fenced
stop*; a repeat with neither a fault nor such a line is still a violation, and an overlap
is one whatever the logs say (:mod:`soak.overlap`).

A horse its watchdog (or its own fence) ended at the run's local deadline, before the
clock thread looked, is said by the worker as it reaps it ("job J: work horse killed by
signal 9 (SIGKILL) after this worker stopped trusting its lease ..."): the same stop, read
so too (one stop for a job however many of the two lines say it).

A ``SimpleLeaseWorker``'s run is the worker process: past its local deadline its watchdog
ends the worker whole and hands the job back ("rq-emq watchdog W: run P past its deadline
..." then "... worker P is gone: job J ..."; its job held the GIL in C code, which
starves the renewal thread in that process, or the host starved it). That is the same
stop, logged by the watchdog, and read as one: (P, J), P being both the run's and the
worker's pid.
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
#: the line a LeaseWorker logs as it reaps a horse ended at its local deadline
STOPPED_TRUSTING = re.compile(r"job (\S+): [^\n]*? after this worker stopped trusting its lease")
#: a watchdog that ended its SimpleLeaseWorker past the run's deadline, then handed its job back
WATCHDOG_ENDED = re.compile(
    r"rq-emq watchdog \d+: run (\d+) past its deadline[^\n]*\n(?:[^\n]*\n)*?"
    r"rq-emq watchdog \d+: worker \1 is gone: job (\S+) "
)


def read_stops(log_dir: Path, pid_of: dict[str, int]) -> list[tuple[int, str]]:
    """(worker pid, job id) for each self-fenced stop in the worker logs under ``log_dir``;
    ``pid_of`` names each log's process (its file name without ``.log``)."""
    stops = []
    for name, pid in sorted(pid_of.items()):
        path = log_dir / f"{name}.log"
        if path.exists():
            text = path.read_text(errors="replace")
            clock = Counter(match.group(1) for match in CLOCK_RAN_OUT.finditer(text))
            reaped = Counter(match.group(1) for match in STOPPED_TRUSTING.finditer(text))
            for job_id in sorted(clock | reaped):  # the larger count: one stop may say both
                stops += [(pid, job_id)] * max(clock[job_id], reaped[job_id])
            stops += [(int(match.group(1)), match.group(2)) for match in WATCHDOG_ENDED.finditer(text)]
    return stops


def fenced_runs(runs: dict[str, list[Any]], stops: Iterable[tuple[int, str]]) -> set[tuple[str, float]]:
    """The runs (job id, start) that a self-fenced stop explains: each logged stop explains
    one run of that job by that worker that another run followed (the earliest first: a
    log line does not say which of a worker's runs of a job it stopped)."""
    left = Counter((int(pid), job_id) for pid, job_id in stops)
    explained = set()
    for job_id, job_runs in runs.items():
        for run, _following in zip(job_runs, job_runs[1:], strict=False):
            if run.outcome == "raise":
                continue  # RQ's Retry: that repeat needs no explaining
            # its worker is its parent (a horse), or the run's own process (SimpleLeaseWorker)
            for key in ((run.ppid, job_id), (run.pid, job_id)):
                if left[key] > 0:
                    left[key] -= 1
                    explained.add((job_id, run.started))
                    break
    return explained
