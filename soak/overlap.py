"""The no-overlap check: for every job, no two runs overlap in time.

A run lasts from its ``start`` line until its ``end`` line; a run with no end was cut
short: killed by a fault or stopped by its own holder (the self-fencing horse, the local
lease clock). It lasted until the fault that killed it (the soak chose a live process, so
it was alive then), else until its last ``alive`` line (a run writes one every
``soak.jobs.TICK_S``: the check's resolution for a run its holder stopped). A run whose
work is done on threads (``pool``, ``thread``) lasts until its threads' last ``alive`` line
too, wherever that falls: a thread its frame left behind (a stop that unwound the frame of
a ``SimpleLeaseWorker``'s run) is the run going on, after its ``end`` line, and beside a
later run in the same process. The times are the side-effect log's, written by every
process from one host clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .faults import Fault
from .jobs import Run
from .repeats import rq_ran_its_own_copy
from .verdict import Verdict

#: Kinds whose victim process dies at the fault (``kill_worker`` kills the horse too only
#: where it dies with its worker: rq-emq's LeaseWorker, not stock RQ).
_KILLS_HORSE = {"kill_group", "kill_horse", "oom_horse"}


@dataclass(frozen=True)
class Overlap:
    job_id: str
    earlier_pid: int
    later_pid: int
    #: how long the earlier run was still alive after the later one began (ms)
    ms: float
    #: the earlier run was frozen (SIGSTOP) when the later began: measured from its resume
    frozen: bool = False


def run_end(
    run: Run, faults: list[Fault], horse_dies_with_worker: bool, next_in_process: float | None = None
) -> float:
    """The last moment ``run`` is known to have been alive (its threads included).
    ``next_in_process``: when its process began its next run (a ``SimpleLeaseWorker`` runs
    one job's frame at a time): a kill of that process after then ended another run."""
    threads = run.threads_seen if run.threads_seen is not None else 0.0
    if run.ended is not None:
        return max(run.ended, threads)
    kills = _KILLS_HORSE | ({"kill_worker"} if horse_dies_with_worker else set())
    deaths = [
        fault.started
        for fault in faults
        if fault.kind in kills and fault.started >= run.started and fault.hit(run.pid)
    ]
    seen = run.last_seen if run.last_seen is not None else run.started
    if next_in_process is not None:
        deaths = [min(death, next_in_process) for death in deaths]
    return max(seen, min(deaths), threads) if deaths else max(seen, threads)


def next_runs(runs: dict[str, list[Run]]) -> dict[tuple[int, float], float]:
    """(pid, start) of each run -> when the same process began its next run, of any job."""
    starts: dict[int, list[float]] = {}
    for job_runs in runs.values():
        for run in job_runs:
            starts.setdefault(run.pid, []).append(run.started)
    following: dict[tuple[int, float], float] = {}
    for pid, times in starts.items():
        ordered = sorted(times)
        following.update({(pid, t): later for t, later in zip(ordered, ordered[1:], strict=False)})
    return following


def overlaps(
    runs: dict[str, list[Run]], faults: list[Fault], horse_dies_with_worker: bool = True
) -> list[Overlap]:
    """Every pair of runs of one job where the earlier was alive after the later began."""
    found: list[Overlap] = []
    following = next_runs(runs)
    for job_id, job_runs in runs.items():
        ordered = sorted(job_runs, key=lambda run: run.started)
        for i, earlier in enumerate(ordered):
            next_in_process = following.get((earlier.pid, earlier.started))
            end = run_end(earlier, faults, horse_dies_with_worker, next_in_process)
            for later in ordered[i + 1 :]:
                if later.pid == earlier.pid:
                    # one process runs one frame at a time (a SimpleLeaseWorker's runs), but
                    # the earlier run's threads may still be working beside the later one
                    if (earlier.threads_seen or 0.0) > later.started:
                        ms = 1000 * (earlier.threads_seen - later.started)  # type: ignore[operator]
                        found.append(Overlap(job_id, earlier.pid, later.pid, ms))
                    continue
                # a run frozen (SIGSTOP) while the later one began was not running: what
                # counts is how long it ran on after it was resumed
                if end <= later.started:
                    continue
                resumed = _resumed(earlier, later.started, faults)
                ms = 1000 * (end - max([later.started, *resumed]))
                found.append(Overlap(job_id, earlier.pid, later.pid, max(ms, 0.0), frozen=bool(resumed)))
    return found


def _resumed(run: Run, after: float, faults: list[Fault]) -> list[float]:
    """When a stop of ``run``'s own process, begun before ``after``, was lifted (as the
    soak recorded it, just after its SIGCONT: a run may write a line a moment before)."""
    return [
        fault.ended
        for fault in faults
        if fault.kind in ("stop_short", "stop_long")
        and fault.hit(run.pid)
        and fault.started <= after
        and fault.ended is not None
    ]


def blame(overlap: Overlap, runs: dict[str, list[Run]], faults: list[Fault]) -> str:
    """The fault kind that let the earlier run go on: the last fault that hit its worker or
    horse between its start and the later run's start ("none" if no fault did)."""
    job_runs = runs.get(overlap.job_id, [])  # in start order; one pid may run a job twice
    earlier = next((run for run in job_runs if run.pid == overlap.earlier_pid), None)
    later = next((run for run in reversed(job_runs) if run.pid == overlap.later_pid), None)
    if earlier is None or later is None:
        return "none"
    hits = [
        fault
        for fault in faults
        if earlier.started <= fault.started <= later.started
        and (fault.hit(earlier.pid) or fault.hit(earlier.ppid))
    ]
    return max(hits, key=lambda fault: fault.started).kind if hits else "none"


def by_kind(found: list[Overlap], runs: dict[str, list[Run]], faults: list[Fault]) -> dict[str, Any]:
    """Per fault kind: faults injected, overlapping runs it let happen, the longest (ms)."""
    table: dict[str, dict[str, Any]] = {}
    for fault in faults:
        if fault.kind != "crash":
            table.setdefault(fault.kind, {"faults": 0, "overlaps": 0, "longest_ms": 0.0})["faults"] += 1
    for o in found:
        row = table.setdefault(blame(o, runs, faults), {"faults": 0, "overlaps": 0, "longest_ms": 0.0})
        row["overlaps"] += 1
        row["longest_ms"] = round(max(row["longest_ms"], o.ms), 1)
    return dict(sorted(table.items()))


#: Longest a run may go on after its job began elsewhere (ms): a worker and horse frozen
#: together past the lease may, once resumed, run a few instructions before the horse's
#: self-fencing thread is scheduled; every other overlap must be 0.
FROZEN_PAIR_OVERLAP_MS = 100.0


def check_overlap(ev: Any, v: Verdict, lease: bool) -> list[Overlap]:
    """No two runs of one job overlap in time (:mod:`soak.overlap`); returns the overlaps
    that failed it (not stock RQ's, not a frozen pair's moment after its resume)."""
    from .witnesscheck import stock_ran_the_copy, stock_ran_the_original

    found = overlaps(ev.runs, ev.faults, horse_dies_with_worker=lease)
    v.counts["overlapping_runs"] = len(found)
    v.counts["longest_overlap_ms"] = round(max((o.ms for o in found), default=0.0), 1)
    v.counts["overlap_by_kind"] = by_kind(found, ev.runs, ev.faults)
    failing = []
    for o in found:
        later = next((run for run in ev.runs.get(o.job_id, []) if run.pid == o.later_pid), None)
        if later is not None and rq_ran_its_own_copy(o.job_id, later, ev):
            continue  # counted with the repeats: stock RQ's
        earlier = next((run for run in ev.runs.get(o.job_id, []) if run.pid == o.earlier_pid), None)
        if later is not None and (
            stock_ran_the_copy(o.job_id, later, ev)
            or (earlier is not None and stock_ran_the_original(o.job_id, earlier, later, ev))
        ):
            # a user's copy of a running job, beside a stock neighbour's run without a lease
            v.counts["stock_ran_an_enqueued_copy"] = v.counts.get("stock_ran_an_enqueued_copy", 0) + 1
            continue
        if o.ms > (FROZEN_PAIR_OVERLAP_MS if o.frozen else 0.0):
            failing.append(o)
            v.violations.append(
                f"{o.job_id}: the run in pid {o.earlier_pid} went on {o.ms:.0f} ms "
                f"after pid {o.later_pid} began it{' (resumed from a stop)' if o.frozen else ''}"
            )
    return failing
