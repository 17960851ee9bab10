"""Attempts equal starts (invariant 4, ``--worker lease``).

``emq_attempts`` counts takes since the job's last normal finish. Each run logs the value
it sees as it starts; so runs after a stall continue the count (k, k+1, ...), a run after
a committed finish (``Retry``) starts over at 1, a number is skipped only for a take that
never reached the job function, and the sum of takes so derived equals Redis's ``taken``
counter. Runs a long stop or cut held back until after their lease was lost ("stale")
read someone else's count and are left out; so are a stock neighbour's runs (no lease)
and, with Sentinel, runs begun in a failover's window. After a running job was enqueued
again (``enqueue_again``) its copy's count may start over; after a cold stop (which hands
the job back, its attempt refunded) the next run reads the stopped run's number again.
A job failed at max attempts was failed on attempt max ("stalled on attempt n of n"), or
past it after it was enqueued again;
once its Result is written, like a finished job, it holds no ``emq_attempts``.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from .failovercheck import taken_in_window
from .faults import Fault
from .jobs import Run
from .model import kind_of
from .outcomes import commit_pending, failed_on_attempt
from .repeats import stale
from .stockcredit import by_stock, stock_doubled
from .verdict import Verdict
from .witnesscheck import enqueued_again_before


def _rq_finished(run: Run, faults: list[Fault]) -> bool:
    """RQ's own finish code ran for this run (and may have retried the job): it raised. A
    horse the soak killed is a crash its lease worker recovers, attempt counted."""
    return run.outcome == "raise"


def check_attempts(ev: Any, v: Verdict) -> None:
    total_takes, skipped, stale_runs, inferred, in_window = 0, 0, 0, 0, 0
    stock = set(getattr(ev, "stock_workers", []))
    # a run its own worker stopped on the local lease clock may have begun after its lease
    # lapsed (a horse the host starved between its start and the job function): it reads
    # the next holder's count, so two runs show one number. Each such stop, by the worker
    # of one of the two runs, explains one such pair once; a pair without it still fails.
    clock_stops = Counter((int(pid), job_id) for pid, job_id in getattr(ev, "self_fenced", []))
    self_fenced, refunded = 0, 0
    for job_id in ev.jobs:
        runs, state = ev.runs.get(job_id, []), ev.final[job_id]
        takes, previous = 0, None
        for run in runs:
            if run.ppid in stock:
                continue  # a stock neighbour's run: taken without a lease, counts no attempt
            if stale(run, ev.faults):
                stale_runs += 1
                continue
            if taken_in_window(run, ev.faults):
                in_window += 1  # its take may have gone with the old master (failovercheck)
                continue
            if run.attempt is None:
                # the job function could not read its count (Redis restarting as it began):
                # it is the take after the previous run's, as far as this log can tell
                inferred += 1
                run.attempt = (previous.attempt or 0) + 1 if previous is not None else 1
            restarted = previous is not None and run.attempt <= (previous.attempt or 0)
            if previous is None or restarted and _rq_finished(previous, ev.faults):
                base = 0  # the first take, or the first after a finish RQ committed (Retry)
            elif (
                restarted
                and (again := enqueued_again_before(job_id, run.started, ev.faults))
                and (again.started >= previous.started)
            ):
                # the user enqueued it again while it ran: its count may start over with the
                # copy (the old run's finish committed) or go on (a take of the copy counted)
                base = 0
            else:
                base = previous.attempt or 0
            if run.attempt <= base and _handed_back(previous, run, ev.faults):
                refunded += 1
                takes += 1  # Redis counted the take: the refund undid the stopped run's
                previous = run
                continue
            stopper = _clock_stopped(clock_stops, job_id, run, previous) if run.attempt <= base else None
            if stopper is not None:
                clock_stops[stopper] -= 1
                self_fenced += 1
                continue  # the pair is one take's number, read twice: no take more
            if run.attempt <= base:
                v.violations.append(
                    f"{job_id}: attempt {run.attempt} started after attempt {base}: the count went back"
                )
            else:
                takes += run.attempt - base
                skipped += run.attempt - base - 1
            previous = run
        if state["failure"]:
            # the count as the sweep failed the job: "stalled on attempt n of n" (the field
            # itself is cleared when the failure's Result is committed through finish_job)
            last = previous.attempt if previous is not None and previous.attempt else 0
            held = failed_on_attempt(state["failure"]) or 0
            most = int(state["max_attempts"] or -1)
            # a copy a web process enqueued while it ran may go on from the old run's count
            if held != most and not (held > most and enqueued_again_before(job_id, math.inf, ev.faults)):
                v.violations.append(f"{job_id}: failed at max attempts on attempt {held}")
            if state["attempts"] is not None and not commit_pending(job_id, state, ev):
                v.violations.append(f"{job_id}: failed, its Result written, still holds emq_attempts")
            takes += max(0, held - last)
            skipped += max(0, held - last)
        elif (
            state["status"] == "finished"
            and state["attempts"] is not None
            and not by_stock(runs, ev)
            and not stock_doubled(job_id, ev)  # a stock copy's finish leaves our fields
        ):
            v.violations.append(f"{job_id}: finished but still holds emq_attempts={state['attempts']}")
        total_takes += takes
    # a horse killed before its job began leaves no run; its worker's crash recovery counts
    # the attempt, so the next run's number (or the failure's) accounts for that take
    # a take handed back before its job began (a horse that could not reach Redis for a
    # whole lease) had its attempt refunded: it too shows in no run
    returned = ev.stats.get("returned", 0)
    total_takes += returned
    skipped += returned
    taken = ev.stats.get("taken", 0)
    # a cold stop's hand-back refunds a take that its run showed: counted in ``returned``
    # too (at most once per cold stop that hit a run)
    if not -_cold_stopped_runs(ev) <= taken - total_takes <= _refused_starts(ev) + in_window:
        v.violations.append(
            f"Redis counted {taken} takes; the runs' attempt numbers account for {total_takes}"
        )
    v.counts["takes"] = taken
    v.counts["takes_never_started"] = skipped
    v.counts["stale_runs"] = stale_runs
    v.counts["attempts_read_after_a_self_fenced_stop"] = self_fenced
    v.counts["attempts_inferred"] = inferred
    v.counts["attempts_refunded_by_a_cold_stop"] = refunded
    v.counts["runs_in_failover_windows"] = in_window


def _clock_stopped(
    stops: Counter[tuple[int, str]], job_id: str, run: Run, previous: Run | None
) -> tuple[int, str] | None:
    """The self-fenced stop (worker pid, job id) left that explains ``run`` reading the
    same count as ``previous``: one logged by either run's worker; None without one."""
    for holder in (run, previous):
        # its worker: the horse's parent, or the run's own process (a SimpleLeaseWorker)
        for pid in (holder.ppid, holder.pid) if holder is not None else ():
            if stops[(pid, job_id)] > 0:
                return (pid, job_id)
    return None


def _handed_back(previous: Run | None, run: Run, faults: list[Fault]) -> bool:
    """``previous`` was cold-stopped before ``run`` began: a worker's cold stop hands its job
    back with the attempt refunded (Redis counts it ``returned``), so ``run`` reads
    ``previous``'s number again and adds no take."""
    return (
        previous is not None
        and run.attempt == previous.attempt
        and any(
            f.kind == "cold_stop"
            # its horse may have been forked ahead, listed before its start line
            and f.covers(previous.started, run.started)
            and (f.hit(previous.pid) or f.hit(previous.ppid))
            for f in faults
        )
    )


def _cold_stopped_runs(ev: Any) -> int:
    """Cold stops that hit a run of ours: each may have handed its job back, its attempt
    refunded (``returned``), after the run had read its number."""
    runs = [run for job_runs in ev.runs.values() for run in job_runs]
    return sum(
        any(f.covers(r.started, r.ended or float("inf")) and (f.hit(r.pid) or f.hit(r.ppid)) for r in runs)
        for f in ev.faults
        if f.kind == "cold_stop"
    )


def _refused_starts(ev: Any) -> int:
    """Takes that may show in no run: a job the producer canceled or deleted between its
    take and its (guarded) start is refused there, at most once (it is in no queue after)."""
    return sum(1 for p in ev.jobs.values() if kind_of(p) in ("cancel", "delete") and p.acted_at is not None)
