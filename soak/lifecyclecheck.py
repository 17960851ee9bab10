"""RQ's lifecycle in the mix (invariant 6; the producer's side is :mod:`soak.lifecycle`).

A job canceled or deleted never starts after that call returned, and ends as RQ put it;
a dependent's first start follows each parent's last end, and it runs only when its
parents allow it; a scheduled job starts no earlier than it is due (less RQ's whole-second
slack) and runs once; a ``result_ttl=0`` job that finished ran to completion and left no
hash. These jobs' ends are ends for "nothing lost" (:func:`ended_by_lifecycle`).
"""

from __future__ import annotations

from typing import Any

from .faults import Fault
from .jobs import Run
from .model import kind_of
from .repeats import excused, stale, unexplained_repeats
from .stockcredit import by_stock
from .verdict import Verdict

#: RQ's scheduled registry keeps due times in whole seconds: a scheduled job may be
#: enqueued up to this long before the moment ``enqueue_in`` asked for
SCHEDULE_SLACK_S = 1.0


#: where a job can still be at the end (RQ's queue, registries we collect, our lease index)
PLACES = ("queued", "finished", "failed", "leases", "started")


def ended_by_lifecycle(planned: Any, state: dict[str, Any]) -> bool:
    """The job ended the way its lifecycle kind ends it, not ``finished``/``failed``: the
    producer canceled or deleted it, a ``result_ttl=0`` finish removed its hash, or a
    dependent was left deferred. ``check_lifecycle`` judges these; "nothing lost" skips them."""
    kind = kind_of(planned)
    if kind in ("cancel", "delete"):
        return planned.acted_at is not None
    if kind == "ttl0":
        return state["status"] is None
    if kind == "scheduled":
        return state["status"] == "scheduled"
    return kind == "dependent" and state["status"] == "deferred"


def _began(run: Run) -> float:
    """When RQ marked the run started (stamped before that write commits); the job
    function's own start where the log has no stamp."""
    return run.rq_started if run.rq_started is not None else run.started


def _check_ended_by_producer(job_id: str, planned: Any, state: dict[str, Any], ev: Any) -> list[str]:
    """A job canceled or deleted (by the producer, usually while it ran) never starts after
    that call returned; a run begun before it may go on. It ends as RQ put it: canceled, or
    with no hash; in no queue, registry of ours or lease."""
    if planned.acted_at is None:
        return []  # the soak ended before it acted: the job is an ordinary one
    what = "canceled" if planned.kind == "cancel" else "deleted"
    problems = [
        f"started at {_began(run):.3f}, after it was {what} at {planned.acted_at:.3f} (pid {run.pid})"
        for run in ev.runs.get(job_id, [])
        if _began(run) > planned.acted_at
    ]
    expected = "canceled" if planned.kind == "cancel" else None
    if by_stock(ev.runs.get(job_id, []), ev):
        # a stock neighbour ran it when the producer acted: stock RQ writes that run's
        # outcome (finished, or failed) over the cancel or into a new hash; that is RQ's
        # semantics, not ours to judge, beyond "never started after the call"
        return problems
    if state["status"] != expected:
        problems.append(
            f"{what} (status {planned.acted_on} then), yet ended {state['status'] or 'with no hash'}"
        )
    where = [name for name in PLACES if job_id in ev.registries.get(name, [])]
    if where:
        problems.append(f"{what}, yet still in {', '.join(where)} at the end")
    return problems


def _last_end(runs: list[Run], faults: list[Fault]) -> float | None:
    """The end of a parent's last run that no fault held back (a horse stopped or cut off
    mid-run may write its end after its job was finished elsewhere)."""
    ends = [
        r.ended
        for r in runs
        if r.ended is not None and excused(r, r.ended, faults) is None and not stale(r, faults)
    ]
    return max(ends) if ends else None


def _check_dependent(job_id: str, planned: Any, state: dict[str, Any], ev: Any) -> list[str]:
    """A dependent runs only once its parents ended (finished, or failed with
    ``allow_failure``): its first start after each parent's last end; it runs (exactly once)
    when they did, never when a parent failed and failure is not allowed (it stays deferred)."""
    runs = ev.runs.get(job_id, [])
    parents = {p: (ev.final.get(p) or {}).get("status") for p in planned.parents}
    met = all(s == "finished" or (planned.allow_failure and s == "failed") for s in parents.values())
    problems = []
    if runs:
        first = min(_began(r) for r in runs)
        for parent in planned.parents:
            end = _last_end(ev.runs.get(parent, []), ev.faults)
            if end is not None and first < end:
                problems.append(f"started at {first:.3f}, before its parent {parent} ended at {end:.3f}")
        if not met:
            ended = ", ".join(f"{p} {s or 'with no hash'}" for p, s in parents.items())
            problems.append(f"ran although its parents ended {ended} (allow_failure {planned.allow_failure})")
        problems += [
            f"ran again at {r.started:.3f}, no fault explains it"
            for r in unexplained_repeats(runs, ev.faults, getattr(ev, "fenced_runs", frozenset()), ev)
        ]
    elif met:
        problems.append(f"never ran, though its parents ended ({', '.join(filter(None, parents.values()))})")
    if state["status"] == "deferred" and met:
        problems.append("still deferred after its parents ended")
    return problems


def _check_scheduled(job_id: str, planned: Any, state: dict[str, Any], ev: Any) -> list[str]:
    """A scheduled job runs once, not before it is due. One still scheduled at the end was
    never enqueued: that is RQ's scheduler's doing when it quit on a Redis error (RQ then
    leaves the queue unscheduled until its lock lapses, 61 s, and a worker's maintenance
    restarts it), else a violation."""
    runs = ev.runs.get(job_id, [])
    problems = []
    if state["status"] == "scheduled" and not getattr(ev, "scheduler_deaths", 0):
        problems.append("still scheduled after the drain, and RQ's scheduler never quit")
    if (
        planned.scheduled_for is not None
        and runs
        and _began(runs[0]) < planned.scheduled_for - SCHEDULE_SLACK_S
    ):
        problems.append(f"started at {_began(runs[0]):.3f}, before it was due at {planned.scheduled_for:.3f}")
    problems += [
        f"ran again at {r.started:.3f}, no fault explains it"
        for r in unexplained_repeats(runs, ev.faults, getattr(ev, "fenced_runs", frozenset()), ev)
    ]
    return problems


def _check_ttl0(job_id: str, planned: Any, state: dict[str, Any], ev: Any) -> list[str]:
    """A ``result_ttl=0`` job that finished ran to completion, and its hash is gone."""
    if state["status"] == "finished":
        return ["finished with result_ttl=0, yet its hash is still there"]
    if state["status"] is not None:
        return []  # failed or unsettled: the ordinary checks judge it
    problems = []
    if not any(r.outcome == "ok" for r in ev.runs.get(job_id, [])):
        problems.append("its hash is gone, yet no run of it completed")
    where = [name for name in PLACES if job_id in ev.registries.get(name, [])]
    if where:
        problems.append(f"its hash is gone, yet it is still in {', '.join(where)}")
    return problems


LIFECYCLE_CHECKS = {
    "cancel": _check_ended_by_producer,
    "delete": _check_ended_by_producer,
    "dependent": _check_dependent,
    "scheduled": _check_scheduled,
    "ttl0": _check_ttl0,
}


def check_lifecycle(ev: Any, v: Verdict) -> None:
    jobs: dict[str, int] = {}
    found: dict[str, int] = {}
    for job_id, planned in ev.jobs.items():
        kind = kind_of(planned)
        jobs[kind] = jobs.get(kind, 0) + 1
        check = LIFECYCLE_CHECKS.get(kind)
        if check is None:
            continue
        problems = check(job_id, planned, ev.final[job_id], ev)
        found[kind] = found.get(kind, 0) + len(problems)
        v.violations += [f"{job_id} ({kind}): {p}" for p in problems]
    v.counts["scheduled_stranded"] = sum(
        1
        for job_id, p in ev.jobs.items()
        if kind_of(p) == "scheduled" and ev.final[job_id]["status"] == "scheduled"
    )
    v.counts["lifecycle_jobs"] = jobs
    v.counts["lifecycle_violations"] = found
    v.counts["acted"] = {
        k: sum(1 for p in ev.jobs.values() if kind_of(p) == k and p.acted_at is not None)
        for k in ("cancel", "delete")
    }
