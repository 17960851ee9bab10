"""Redis losing its data (the ``lose_data`` fault, ``--lose-data``: a restart without
persistence), and the fencing tokens of every job's runs.

Redis then holds none of what the checks read for a job enqueued before the loss: its
hash, its attempts, its effects, Redis's counters. The producer resubmits its plain jobs
under their ids (a new job for Redis); a lifecycle unit's jobs are lost with Redis.
So the checks that read what Redis kept (1-6, 8) judge a resubmitted job by its runs since
the loss alone, and leave a lost job out (:func:`apply_loss`); what Redis itself lost is
accepted, nothing else.

What no loss excuses (:func:`check_tokens`, and the overlap check over every run):

- no two runs of one job overlap, across the loss too: an old run whose lease vanished
  stops at its holder's next renewal, before a resubmitted copy runs;
- each run holds a token of its own, and every run begun since a loss holds a higher
  fencing token than every run of the job begun before it (tokens are the grant's Redis
  time in ms, or one more than the last: they rise across a loss).
"""

from __future__ import annotations

import math
from copy import copy
from typing import Any

from .jobs import Run
from .verdict import Verdict


def begun(run: Run) -> float:
    """When the run began: its start line, or RQ's start stamp when that is earlier."""
    return min(run.started, run.rq_started or math.inf)


def apply_loss(ev: Any, v: Verdict) -> Any:
    """The evidence as the checks that read Redis's state see it after a loss (a copy):
    a resubmitted job's runs, failure callbacks and faults since the loss only, a job lost
    with Redis left out. Counts both; ``ev`` itself keeps every run."""
    resubmitted: dict[str, float] = getattr(ev, "resubmitted", {})
    lost: dict[str, float] = getattr(ev, "lost_by_redis", {})
    v.counts["resubmitted_after_loss"] = len(resubmitted)
    v.counts["lost_with_redis"] = len(lost)
    if not resubmitted and not lost:
        return ev
    # a stock neighbour's run that went on across the loss writes its outcome over the
    # resubmitted job as stock RQ does (no lease fences it): stock RQ's, not judged
    stock = set(getattr(ev, "stock_workers", []))
    by_stock = {
        job_id
        for job_id, at in resubmitted.items()
        for r in ev.runs.get(job_id, [])
        if r.ppid in stock and begun(r) < at and (r.ended is None or r.ended >= at)
    }
    v.counts["resubmitted_then_written_by_a_stock_run"] = len(by_stock)
    lost = {**lost, **{job_id: resubmitted[job_id] for job_id in by_stock}}
    seen = copy(ev)
    seen.runs = {
        job_id: [r for r in runs if begun(r) >= resubmitted.get(job_id, -math.inf)]
        for job_id, runs in ev.runs.items()
        if job_id not in lost
    }
    seen.jobs = {job_id: planned for job_id, planned in ev.jobs.items() if job_id not in lost}
    seen.final = {job_id: state for job_id, state in ev.final.items() if job_id not in lost}
    seen.failure_callbacks = {
        job_id: [t for t in times if t >= resubmitted.get(job_id, -math.inf)]
        for job_id, times in getattr(ev, "failure_callbacks", {}).items()
        if job_id not in lost
    }
    # a fault on a run before the loss: the loss, not the sweep, took that lease
    seen.faults = [
        f
        for f in ev.faults
        if not (f.job_id in resubmitted or f.job_id in lost)
        or f.started >= resubmitted.get(f.job_id, lost.get(f.job_id, math.inf))
    ]
    # its outcome must be a run's since the loss: an old run's is fenced out (its lease vanished)
    for job_id in resubmitted.keys() - lost.keys():
        ran = any(r.outcome == "ok" for r in seen.runs.get(job_id, []))
        if seen.final.get(job_id, {}).get("status") == "finished" and not ran:
            v.violations.append(f"{job_id}: resubmitted after Redis lost its data, finished by no run since")
    return seen


def check_tokens(ev: Any, v: Verdict) -> None:
    """Each run of a job holds a fencing token of its own, and each run begun since a loss of
    Redis's data holds a higher one than every run begun before it."""
    loss_at: dict[str, float] = {**getattr(ev, "lost_by_redis", {}), **getattr(ev, "resubmitted", {})}
    shared = went_back = 0
    for job_id, runs in ev.runs.items():
        tokens = [run.fence for run in runs if run.fence is not None]
        if len(tokens) != len(set(tokens)):
            shared += 1
            v.violations.append(f"{job_id}: two runs under one fencing token ({sorted(tokens)})")
        at = loss_at.get(job_id)
        if at is None:
            continue
        before = [r.fence for r in runs if r.fence is not None and begun(r) < at]
        after = [r.fence for r in runs if r.fence is not None and begun(r) >= at]
        if before and after and min(after) <= max(before):
            went_back += 1
            v.violations.append(
                f"{job_id}: fencing token {min(after)} granted after Redis lost its data, "
                f"not above {max(before)} granted before"
            )
    v.counts["runs_with_a_token"] = sum(1 for runs in ev.runs.values() for r in runs if r.fence is not None)
    v.counts["tokens_shared"] = shared
    v.counts["tokens_not_above_the_loss"] = went_back
