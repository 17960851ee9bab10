"""The no-overlap check: for every job, no two runs overlap in time.

A run lasts from its ``start`` line until its ``end`` line; a run with no end was cut
short, and lasted until the fault that killed its process (from the fault record), if
one did. A run that wrote no end and that no recorded fault killed was stopped by its own
holder (the self-fencing horse, the local lease clock) and wrote nothing after its start:
nothing shows it alive past that, so it is measured as ending at its last line. The times
are the side-effect log's, written by every process from one host clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from .faults import Fault
from .jobs import Run

#: Kinds whose victim process dies at the fault (``kill_worker`` kills the horse too only
#: where it dies with its worker: rq-emq's LeaseWorker, not stock RQ).
_KILLS_HORSE = {"kill_group", "kill_horse"}


@dataclass(frozen=True)
class Overlap:
    job_id: str
    earlier_pid: int
    later_pid: int
    #: how long the earlier run was still alive after the later one began (ms)
    ms: float
    #: the earlier run was frozen (SIGSTOP) when the later began: measured from its resume
    frozen: bool = False


def run_end(run: Run, faults: list[Fault], horse_dies_with_worker: bool) -> float:
    """The last moment ``run`` is known to have been alive."""
    if run.ended is not None:
        return run.ended
    kills = _KILLS_HORSE | ({"kill_worker"} if horse_dies_with_worker else set())
    deaths = [
        fault.started
        for fault in faults
        if fault.kind in kills and fault.started >= run.started and fault.hit(run.pid)
    ]
    return min(deaths) if deaths else run.started


def overlaps(
    runs: dict[str, list[Run]], faults: list[Fault], horse_dies_with_worker: bool = True
) -> list[Overlap]:
    """Every pair of runs of one job where the earlier was alive after the later began."""
    found: list[Overlap] = []
    for job_id, job_runs in runs.items():
        ordered = sorted(job_runs, key=lambda run: run.started)
        for i, earlier in enumerate(ordered):
            end = run_end(earlier, faults, horse_dies_with_worker)
            for later in ordered[i + 1 :]:
                if later.pid == earlier.pid:
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
