"""Repeats are explained (invariant 5), and the rules the other checks share for telling an
explained repeat from a duplicate.

A run followed by another run of the same job either raised (RQ's ``Retry``) or was hit
by a fault that legitimately repeats work: its worker or horse killed, stopped or cut off
past the grace (:data:`soak.faults.REPEAT_EXCUSED`, while that run could still be going
on). Short stops and cuts, ``CLIENT KILL`` and Redis restarts shorter than the grace must
never repeat a run; a restart that outlasted the grace is a ``restart_long``, which may.
A repeat with no such fault is a *self-fenced stop* when the earlier run's worker logged
that its local lease clock stopped that job (:mod:`soak.selffence`), and stock RQ's own
when a stock neighbour ran the copy its double enqueue made (:mod:`soak.stockcredit`);
with none of these, it is a duplicate and fails the soak. A *stale* run (a horse that a
long stop or cut held back between its take and its job function) is judged by none of
these rules: it began after its lease was lost.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .faults import GLOBAL, REPEAT_EXCUSED, Fault
from .jobs import Run
from .selffence import fenced_runs
from .stockcredit import stock_ran_its_own_duplicate
from .straycopies import ran_a_seen_copy
from .verdict import Verdict


def excused(run: Run, until: float, faults: list[Fault]) -> Fault | None:
    for fault in faults:
        if fault.kind not in REPEAT_EXCUSED:
            continue
        if _hit_before_its_start_line(run, until, fault):
            return fault
        if not fault.covers(run.started, until):
            continue
        if fault.hit(run.ppid) or fault.hit(run.pid) or fault.kind in GLOBAL:
            return fault
    return None


def _hit_before_its_start_line(run: Run, until: float, fault: Fault) -> bool:
    """The run's horse was alive as the fault began (the fault lists it), though its
    start line comes after the fault: a starved host ran the fork and the kill of its
    worker before the horse reached the job function, which then ran until the watchdog
    ended it (stress soak seed 3: the line 12 ms after the kill ended). A horse is one run, so
    the fault hit this one; within :data:`STALE_WINDOW_S` of the fault's end, so that a
    pid reused much later is never credited."""
    end = fault.ended if fault.ended is not None else run.started
    return run.pid in fault.horse_pids and fault.started <= until and run.started <= end + STALE_WINDOW_S


def long_restart(fault: Fault, grace_s: float) -> Fault:
    """A Redis restart the soak meant to keep within the grace that took longer (a loaded
    machine: the AOF load, the process start) is a ``restart_long``: every holder's local
    lease clock may run out in it, and self-fencing then stops its run, which runs again."""
    if fault.kind == "restart" and fault.ended is not None and fault.ended - fault.started > grace_s:
        return dataclasses.replace(fault, kind="restart_long")
    return fault


#: How long after a stop or cut ends a held-back horse may still begin its job function.
STALE_WINDOW_S = 1.0


def stale(run: Run, faults: list[Fault]) -> bool:
    """A run begun by a horse that a long stop or cut held back between its take and the
    job function: it starts late, after its lease was lost (its worker stops it at the
    next renewal), and the attempt number it reads belongs to whoever holds the job now."""
    return any(
        f.kind in ("stop_long", "cut_long")
        and run.pid in f.horse_pids  # a horse that already existed when the fault began
        and f.started <= run.started <= (f.ended if f.ended is not None else run.started) + STALE_WINDOW_S
        for f in faults
    )


def rq_ran_its_own_copy(job_id: str, run: Run, ev: Any) -> bool:
    """``run`` is a stock neighbour's, of a copy that stock RQ itself pushed: its double
    enqueue of a job frozen while it raised (:mod:`soak.stockcredit`), or a stray copy one
    of RQ's clients pushed, such as RQ 3's fan-in dependents race (:mod:`soak.straycopies`).
    A stock worker pops without a lease, so it runs that copy whoever runs the other, and
    the repeat, and any overlap with the other copy's run, are stock RQ's."""
    return stock_ran_its_own_duplicate(job_id, run, ev) or ran_a_seen_copy(job_id, run, ev)


def unexplained_repeats(
    runs: list[Run],
    faults: list[Fault],
    fenced: set[tuple[str, float]] | frozenset[tuple[str, float]] = frozenset(),
    ev: Any = None,
) -> list[Run]:
    """Runs that followed a run that neither raised (Retry), nor was hit by a fault, nor
    was stopped by its worker's local lease clock (``fenced``, :mod:`soak.selffence`), and
    (given the evidence ``ev``) that are no stock neighbour's run of RQ's own copy."""
    return [
        following
        for run, following in zip(runs, runs[1:], strict=False)
        if run.outcome != "raise"
        and excused(run, following.started, faults) is None
        and not stale(following, faults)
        and (run.job_id, run.started) not in fenced
        and not (ev is not None and rq_ran_its_own_copy(following.job_id, following, ev))
    ]


def check_repeats(ev: Any, v: Verdict) -> None:
    """5: every repeat is explained; the baseline's "duplicates" are the unexplained ones."""
    faults: list[Fault] = ev.faults
    repeats, unexplained, self_fenced, stock_duplicates = 0, 0, 0, 0
    ev.fenced_runs = fenced_runs(ev.runs, getattr(ev, "self_fenced", []))
    for job_id, runs in ev.runs.items():
        for run, following in zip(runs, runs[1:], strict=False):
            if run.outcome == "raise":
                continue  # RQ's Retry
            repeats += 1
            if excused(run, following.started, faults) is None and not stale(following, faults):
                if (job_id, run.started) in ev.fenced_runs:
                    self_fenced += 1
                    continue
                if rq_ran_its_own_copy(job_id, following, ev):
                    stock_duplicates += 1
                    continue
                unexplained += 1
                v.violations.append(
                    f"{job_id}: ran again at {following.started:.3f} after a run by pid {run.pid} "
                    f"(worker {run.ppid}) that no fault explains"
                )
    v.counts["repeated_runs"] = repeats
    v.counts["duplicates"] = unexplained
    v.counts["self_fenced_stops"] = self_fenced
    v.counts["stock_ran_its_duplicate"] = stock_duplicates
    v.counts["runs"] = sum(len(r) for r in ev.runs.values())
    unknown = set(ev.runs) - set(ev.jobs)
    v.violations += [f"{j}: ran, but the soak never enqueued it" for j in sorted(unknown)]
