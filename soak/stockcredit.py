"""What the soak credits to stock RQ in a mixed fleet (issue 20): the stock neighbour's own
losses, double enqueues and the repeats they make, which are RQ's semantics, not ours.

A stock worker pops without a lease and finishes a job with RQ's own code, so what it does
to a job (left in RQ's intermediate list by its dequeue, left started when it quits on a
Redis error, enqueued twice when frozen while its horse raised, and the copy it then runs)
is counted apart by the checks that would otherwise fail on it. The same thing done by one
of ours is never credited.
"""

from __future__ import annotations

from typing import Any

from .faults import Fault
from .jobs import Run


def left_by_a_quitting_neighbour(runs: list[Run], faults: list[Fault], ev: Any) -> bool:
    """The job's last run was a stock neighbour's, and that worker quit (a Redis error, as
    stock RQ's worker does outside its dequeue) after the run began: stock RQ leaves such a
    job started until its cleanup fails it, a minute or more later, past the drain."""
    if not by_stock(runs, ev):
        return False
    last = runs[-1]
    quits = [f for f in faults if f.kind == "stock_exit" and f.worker_pid == last.ppid]
    return any(f.started >= last.started for f in quits)


def stranded_by_a_stock_dequeue(job_id: str, ev: Any) -> bool:
    """The job sits in RQ's intermediate list, where only a stock worker's ``BLMOVE`` puts
    a job (ours use a moving list of their own): a stock neighbour dequeued it and never
    started it (its dequeue's reply lost in a Redis restart, or the worker quit between
    the two). Stock RQ fails such a job a minute later ("stuck in intermediate queue"):
    its loss, not ours."""
    return bool(getattr(ev, "stock_workers", [])) and job_id in ev.registries.get("intermediate", [])


def queued_twice_by_stock(line: str, ev: Any) -> bool:
    """A sample's "twice in the queue" that a stock neighbour made: the job's last run
    before the sample was that neighbour's, and stock RQ handled its end twice (a worker
    frozen while its horse raised: the horse's ``Retry`` and, on resume, the worker's
    "terminated unexpectedly" failure each enqueue it). Our workers pushed neither copy.
    Or a sample's "queued while leased" in that double enqueue's window: one of ours holds
    the lease of one copy while the other waits; the frozen neighbour's
    runs and faults show the double enqueue (:func:`frozen_double_enqueues`)."""
    parts = line.split(maxsplit=2)
    if len(parts) < 3:
        return False
    at, job_id, what = float(parts[0]), parts[1], parts[2]
    if what == "queued while leased":
        return in_a_frozen_double_enqueue(job_id, at, ev)
    if what != "twice in the queue":
        return False
    before = [run for run in ev.runs.get(job_id, []) if run.started <= at]
    return by_stock(before, ev)


def stock_ran_its_own_duplicate(job_id: str, run: Run, ev: Any) -> bool:
    """``run`` is a stock neighbour's, begun after a sample saw the job twice in the queue
    by stock RQ's own double enqueue (:func:`queued_twice_by_stock`): a stock worker pops
    without a lease, so it runs the copy that stock RQ made, whoever runs the other one.
    The same copy run by one of ours would be our fault (``pop_job`` drops a copy of a job
    in flight under a live lease), and is not excused."""
    if doubled_by_a_frozen_neighbour(job_id, run, ev):
        return True
    if run.ppid not in set(getattr(ev, "stock_workers", [])):
        return False
    for line in ev.queue_violations:
        parts = line.split(maxsplit=2)
        if len(parts) == 3 and parts[1] == job_id and float(parts[0]) <= run.started:
            if queued_twice_by_stock(line, ev):
                return True
    return False


def by_stock(runs: list[Run], ev: Any) -> bool:
    """The job's last run was a stock neighbour's (its finish is RQ's own, which leaves
    our fields as they were)."""
    return bool(runs) and runs[-1].ppid in set(getattr(ev, "stock_workers", []))


def stock_doubled(job_id: str, ev: Any) -> bool:
    """Some run of the job took a copy of a frozen neighbour's double enqueue."""
    return any(doubled_by_a_frozen_neighbour(job_id, run, ev) for run in ev.runs.get(job_id, []))


#: How soon after a frozen neighbour resumes its double enqueue's two copies are taken.
DOUBLE_ENQUEUE_WINDOW_S = 10.0


def doubled_by_a_frozen_neighbour(job_id: str, run: Run, ev: Any) -> bool:
    """``run`` took one of the two copies that stock RQ's own double enqueue made, by the
    evidence of the runs and faults rather than a queue sample (the two copies can be taken
    within milliseconds, between two samples): ``run`` began within
    :data:`DOUBLE_ENQUEUE_WINDOW_S` of such a double enqueue (:func:`frozen_double_enqueues`).
    Whoever runs the other copy, the two runs' overlap is stock RQ's: the neighbour's copy
    holds no lease to refuse it."""
    return in_a_frozen_double_enqueue(job_id, run.started, ev)


def in_a_frozen_double_enqueue(job_id: str, at: float, ev: Any) -> bool:
    """``at`` falls within :data:`DOUBLE_ENQUEUE_WINDOW_S` after a frozen neighbour's
    double enqueue of the job (:func:`frozen_double_enqueues`)."""
    return any(
        resumed <= at <= resumed + DOUBLE_ENQUEUE_WINDOW_S for resumed in frozen_double_enqueues(job_id, ev)
    )


def frozen_double_enqueues(job_id: str, ev: Any) -> list[float]:
    """When stock RQ enqueued the job twice, by the runs and faults: a stock neighbour's run
    of the job raised while that neighbour was frozen (``stop_stock``), and the neighbour
    itself ran the job again within :data:`DOUBLE_ENQUEUE_WINDOW_S` after it resumed (one
    copy, popped without a lease). Returns each such resume time."""
    stock = set(getattr(ev, "stock_workers", []))
    runs = ev.runs.get(job_id, [])
    resumes = []
    for earlier in runs:
        if earlier.ppid not in stock or earlier.outcome != "raise" or earlier.ended is None:
            continue
        for fault in ev.faults:
            if fault.kind != "stop_stock" or fault.worker_pid != earlier.ppid or fault.ended is None:
                continue
            if not fault.started <= earlier.ended <= fault.ended + 0.5:
                continue
            resumed = fault.ended
            if any(
                r.ppid == earlier.ppid and resumed <= r.started <= resumed + DOUBLE_ENQUEUE_WINDOW_S
                for r in runs
            ):
                resumes.append(resumed)
    return resumes
