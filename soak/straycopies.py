"""Stray copies: a job's id pushed to its queue again by RQ's own clients, and what became
of the copy.

A client that loses a reply sends the command again (redis-py resends a transaction after
a connection error, whether or not Redis ran it), so RQ's scheduler moving a due job
through a cut connection, or a producer's enqueue in a Redis restart, can push a job
twice; RQ 3's fan-in dependents race does too (two parents ending together, the failure
path moving the dependent to ready outside its commit: each parent's step enqueues it).
None of these is our scripts' doing: ours push only a job whose lease they end in the same
step, and a lease's take removes the entry it leases, so an id twice in the queue, or
queued while leased, always holds a push that was not ours.

What is ours is what the copy does: a lease worker drops it unrun (``stray_copy`` in
lua/lib/lease.lua: the job runs under a live lease, or has left every queue) and logs one
line saying so, which this module reads from the worker logs. A sample that saw such a
copy is counted apart when one of ours dropped a copy of that job, or when a stock
neighbour (which pops without a lease, and runs whatever copy it finds) ran the job after
the sample and none of our scripts had pushed the job since its run before the sample
(a push of ours is in the queue's event stream: a sweep's recovery, a crashed horse's job
put back; ``Evidence.our_pushes``), so that a push of ours that wrongly doubled a job is
never credited to RQ. A copy run by one of ours is still judged by the repeat check, and a
copy left in the queue by the check of places at the end.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

#: the lines a LeaseWorker logs when its take drops a copy (rq_emq/intake/take.py)
DROPPED = re.compile(r"job (\S+) was (?:in one of queues|moved from queue) \S+ but .*stray copy")


def read_drops(log_dir: Path, pid_of: dict[str, int]) -> list[tuple[int, str]]:
    """(worker pid, job id) for each stray copy a worker dropped, from the worker logs under
    ``log_dir``; ``pid_of`` names each log's process (its file name without ``.log``)."""
    drops = []
    for name, pid in sorted(pid_of.items()):
        path = log_dir / f"{name}.log"
        if path.exists():
            drops += [(pid, m.group(1)) for m in DROPPED.finditer(path.read_text(errors="replace"))]
    return drops


def copy_accounted_for(line: str, ev: Any) -> bool:
    """A queue sample's line (``<time> <job> twice in the queue|queued while leased``) saw a
    stray copy that one of ours dropped unrun, or that a stock neighbour ran after the
    sample (stock RQ's own way with a copy) when none of our scripts had pushed the job
    since its last run (:func:`pushed_by_us`)."""
    parts = line.split(maxsplit=2)
    if len(parts) < 3:
        return False
    at, job_id = float(parts[0]), parts[1]
    if any(dropped == job_id for _pid, dropped in getattr(ev, "stray_drops", [])):
        return True
    stock = set(getattr(ev, "stock_workers", []))
    ran = any(run.ppid in stock and run.started >= at for run in ev.runs.get(job_id, []))
    return ran and not pushed_by_us(job_id, at, ev)


def ran_a_seen_copy(job_id: str, run: Any, ev: Any) -> bool:
    """``run`` is a stock neighbour's, begun after a sample saw a stray copy of the job that
    none of our scripts pushed: a stock worker pops without a lease, so it runs the copy
    RQ's client pushed, whoever ran the job before. The same copy run by one of ours is not
    excused."""
    if run.ppid not in set(getattr(ev, "stock_workers", [])):
        return False
    for line in ev.queue_violations:
        parts = line.split(maxsplit=2)
        if len(parts) == 3 and parts[1] == job_id and float(parts[0]) <= run.started:
            if not pushed_by_us(job_id, float(parts[0]), ev):
                return True
    return False


def pushed_by_us(job_id: str, at: float, ev: Any) -> bool:
    """One of our scripts pushed the job to its queue after its last run that began before
    ``at`` (or at any time before ``at``, if none had): the copy seen at ``at`` may be ours."""
    since = max((run.started for run in ev.runs.get(job_id, []) if run.started <= at), default=0.0)
    return any(pushed == job_id and since <= when <= at for when, pushed in getattr(ev, "our_pushes", []))
