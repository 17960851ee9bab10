"""The faults of issue 46 judged (the witness: a job moves only once the run that had it is
over, and a death that was seen is handed back at once), and their table.

Overlaps and lost jobs are the soak's own checks (:mod:`soak.overlap`, which reads a
threaded run's end from its threads' lines too; :mod:`soak.outcomes`); this module adds
what those faults need besides:

- **No false recovery.** Every push of a job by our scripts (a sweep's recovery, a seen
  death's hand-back: ``recovered`` and ``crashed`` in the queue's event stream) follows a
  run that a fault which may repeat work hit before the push
  (:data:`soak.faults.REPEAT_EXCUSED`), or a run its own worker's local lease clock
  stopped (a self-fenced stop, counted apart as the repeats count it). A push after
  anything else recovered a healthy job and fails the soak. A push is judged by the run
  of the job begun last before it, while that run still holds the job: not ended, or
  ended within the finish's patience (one lease) and without raising; a push after that
  is of a take whose horse never reached the job function, which no log line names.
- **A slow log handler stops nothing.** A run of a worker whose handler was slow
  (``slow_log``) while it ran must end on its own: cut short (no ``end`` line) or stopped
  by its worker's lease clock with no fault that may repeat work to explain it (nor a
  cancel or delete of its job by the producer: RQ ended it), it was a healthy job killed
  because of logging, and fails the soak.
- **A running job enqueued again** (``enqueue_again``) is queued while its old run still
  holds its lease until that run is over: the copy's take is held back (a queue sample
  then sees it queued while leased: the user's copy, not ours). A stock neighbour pops
  without a lease, so it may run the copy beside ours: that overlap is stock RQ's, counted
  apart.

The table (``counts.witness_faults``, printed under the overlap table) gives per fault
(``enqueue_again``, ``cold_stop``, ``slow_log``, ``kill_worker``, and ``threads``: the
``pool`` and ``thread`` bodies run by a ``SimpleLeaseWorker``) how many there were, the
overlapping runs they let happen, the jobs they hit that were lost, and false recoveries.
"""

from __future__ import annotations

from typing import Any

from .faults import REPEAT_EXCUSED, STOPS_THREADS, Fault
from .jobs import TICK_S, Run
from .overlap import Overlap, blame
from .repeats import excused
from .verdict import Verdict

#: The faults this module tabulates, in the table's order (``threads`` is a job body).
KINDS = ("enqueue_again", "cold_stop", "slow_log", "kill_worker", "threads")
#: The job bodies that do their work on threads (soak/jobs.py).
THREADED = ("pool", "thread")


def enqueued_again_before(job_id: str, at: float, faults: list[Fault]) -> Fault | None:
    """The last ``enqueue_again`` of ``job_id`` begun at or before ``at``."""
    found = [f for f in faults if f.kind == "enqueue_again" and f.job_id == job_id and f.started <= at]
    return max(found, key=lambda f: f.started) if found else None


def copy_waiting(line: str, ev: Any) -> bool:
    """A queue sample's line (``<time> <job> queued while leased``) saw the copy a web
    process enqueued while the job ran (``enqueue_again``), before any run of the copy
    began: the take of that copy is held back until the old run is over."""
    parts = line.split(maxsplit=2)
    if len(parts) < 3 or parts[2] != "queued while leased":
        return False
    return copy_not_yet_run(parts[1], float(parts[0]), ev)


def copy_not_yet_run(job_id: str, at: float, ev: Any) -> bool:
    """The job was enqueued again (``enqueue_again``) before ``at``, and no run of it began
    since: the user's copy waits in its queue, beside where RQ put the old run's job (its
    lease, or, if the old run had just ended, its end registry: RQ's enqueue leaves it there)."""
    fault = enqueued_again_before(job_id, at, ev.faults)
    if fault is None:
        return False
    return not any(fault.started <= run.started <= at for run in ev.runs.get(job_id, []))


def stock_ran_the_copy(job_id: str, later: Run, ev: Any) -> bool:
    """``later`` is a stock neighbour's run begun after the job was enqueued again: stock RQ
    pops without a lease, so it runs a user's copy at once, whoever runs the job."""
    if later.ppid not in set(getattr(ev, "stock_workers", [])):
        return False
    return enqueued_again_before(job_id, later.started, ev.faults) is not None


def stock_ran_the_original(job_id: str, earlier: Run, later: Run, ev: Any) -> bool:
    """``earlier`` is a stock neighbour's run, and the job was enqueued again while it ran,
    before ``later`` began: a stock run holds no lease, so nothing holds the copy back (two
    stock workers run both as well)."""
    if earlier.ppid not in set(getattr(ev, "stock_workers", [])):
        return False
    again = enqueued_again_before(job_id, later.started, ev.faults)
    return again is not None and again.started >= earlier.started


def _holding_run(runs: list[Run], at: float, patience_s: float) -> Run | None:
    """The run a push at ``at`` took the job from: the last begun before it, while it
    still held the job (see the module's docstring); None for a take no run names."""
    before = [run for run in runs if run.started <= at]
    if not before:
        return None
    run = before[-1]
    if run.ended is None:
        return run
    if run.outcome == "raise" or at > run.ended + patience_s:
        return None
    return run


def _hit_by(run: Run, kind: str, until: float, faults: list[Fault]) -> bool:
    return any(
        f.kind == kind and f.covers(run.started, until) and (f.hit(run.pid) or f.hit(run.ppid))
        for f in faults
    )


def _kinds_hitting(run: Run, until: float, faults: list[Fault], ev: Any) -> set[str]:
    """The table's rows a run falls in: the tabulated faults that hit it, and ``threads``."""
    kinds = {k for k in KINDS[:-1] if _hit_by(run, k, until, faults)}
    for f in faults:  # an enqueue again hits the job, whichever process runs it
        if f.kind == "enqueue_again" and f.job_id == run.job_id and f.covers(run.started, until):
            kinds.add("enqueue_again")
    if _threaded_in_simple(run, ev):
        kinds.add("threads")
    return kinds


def _last_known(run: Run) -> float:
    """The last moment the log shows ``run`` (or a thread of it) alive, plus one tick: a
    kill lands up to a tick after a run's last line."""
    seen = [t for t in (run.ended, run.last_seen, run.threads_seen) if t is not None]
    return max([run.started, *seen]) + TICK_S


def _threaded_in_simple(run: Run, ev: Any) -> bool:
    planned = ev.jobs.get(run.job_id)
    simple = set(getattr(ev, "simple_workers", []))
    return getattr(planned, "body", "") in THREADED and run.pid in simple


def false_recoveries(ev: Any) -> tuple[list[tuple[str, float, Run]], int]:
    """(job id, push time, the run it took the job from) of each push no fault explains,
    and how many pushes a self-fenced stop explained."""
    patience_s = ev.config.lease_ms / 1000
    fenced: set[tuple[str, float]] = getattr(ev, "fenced_runs", set())
    found, self_fenced = [], 0
    for at, job_id in getattr(ev, "our_pushes", []):
        run = _holding_run(ev.runs.get(job_id, []), at, patience_s)
        if run is None or excused(run, at, ev.faults) is not None:
            continue
        if (job_id, run.started) in fenced and not _hit_by(run, "slow_log", at, ev.faults):
            self_fenced += 1
            continue
        found.append((job_id, at, run))
    return found, self_fenced


def stopped_by_slow_logging(ev: Any) -> list[Run]:
    """Runs a slow log handler's worker ran that did not end on their own (cut short, or
    stopped by the worker's lease clock) with no fault that may repeat work to explain it."""
    fenced: set[tuple[str, float]] = getattr(ev, "fenced_runs", set())
    out = []
    for job_runs in ev.runs.values():
        for i, run in enumerate(job_runs):
            following = job_runs[i + 1].started if i + 1 < len(job_runs) else None
            until = run.ended or run.last_seen or following or run.started
            if not _hit_by(run, "slow_log", until, ev.faults):
                continue
            stopped = run.ended is None or (run.job_id, run.started) in fenced
            others = [f for f in ev.faults if f.kind in REPEAT_EXCUSED]
            if stopped and excused(run, following or until, others) is None and not _ended_by_rq(run, ev):
                out.append(run)
    return out


def _ended_by_rq(run: Run, ev: Any) -> bool:
    """The producer canceled or deleted the job while ``run`` went on: RQ ended it, and the
    run's stop is that (invariant 6 judges it)."""
    planned = ev.jobs.get(run.job_id)
    since = getattr(planned, "acting_since", None)
    return getattr(planned, "kind", "") in ("cancel", "delete") and since is not None and since >= run.started


def check_witness(ev: Any, v: Verdict, found: list[Overlap]) -> None:
    """The false recoveries and slow-log stops (violations), and the table."""
    false, self_fenced = false_recoveries(ev)
    for job_id, at, run in false:
        v.violations.append(
            f"{job_id}: recovered at {at:.3f} from the run in pid {run.pid} (worker {run.ppid}), "
            "which no fault explains (a false recovery)"
        )
    slowed = stopped_by_slow_logging(ev)
    for run in slowed:
        v.violations.append(
            f"{run.job_id}: the run in pid {run.pid} (worker {run.ppid}) was stopped while its "
            "worker's log handler was slow, and no fault explains it"
        )
    v.counts["false_recoveries"] = len(false)
    v.counts["recoveries_after_a_self_fenced_stop"] = self_fenced
    v.counts["stopped_by_slow_logging"] = len(slowed)
    v.counts["witness_faults"] = table(ev, v, found, false, slowed)


def table(
    ev: Any, v: Verdict, found: list[Overlap], false: list[tuple[str, float, Run]], slowed: list[Run]
) -> dict[str, dict[str, int]]:
    """Per row of :data:`KINDS`: faults (for ``threads``: its runs by a SimpleLeaseWorker,
    and ``hit``, those a cold stop or a kill hit), overlapping runs, lost jobs hit, false
    recoveries (a slow log's stops included)."""
    rows = {k: {"faults": 0, "overlaps": 0, "lost": 0, "false_recoveries": 0} for k in KINDS}
    for f in ev.faults:
        if f.kind in rows:
            rows[f.kind]["faults"] += 1
    runs_of = getattr(ev, "runs", {})
    threaded = [r for rs in runs_of.values() for r in rs if _threaded_in_simple(r, ev)]
    rows["threads"]["faults"] = len(threaded)
    # of them, the runs a stop or kill of their worker hit (the fault's point)
    rows["threads"]["hit"] = sum(
        any(
            f.kind in STOPS_THREADS and f.covers(r.started, _last_known(r)) and f.hit(r.pid)
            for f in ev.faults
        )
        for r in threaded
    )
    for o in found:
        kind = blame(o, runs_of, ev.faults)
        job_runs = runs_of.get(o.job_id, [])
        earlier = next((r for r in job_runs if r.pid == o.earlier_pid), None)
        later = next((r for r in reversed(job_runs) if r.pid == o.later_pid), None)
        kinds = {kind} & set(KINDS)
        if earlier is not None and _threaded_in_simple(earlier, ev):
            kinds.add("threads")
        # the job enqueued again while the earlier run went on, before the later began
        again = enqueued_again_before(o.job_id, later.started, ev.faults) if later is not None else None
        if again is not None and earlier is not None and again.started >= earlier.started:
            kinds.add("enqueue_again")
        for k in kinds:
            rows[k]["overlaps"] += 1
    for job_id in v.counts.get("lost_jobs", []):
        kinds = set()
        for run in runs_of.get(job_id, []):
            kinds |= _kinds_hitting(run, float("inf"), ev.faults, ev)
        kinds |= {f.kind for f in ev.faults if f.job_id == job_id and f.kind in KINDS}
        for k in kinds:
            rows[k]["lost"] += 1
    for _job_id, at, run in false:
        for k in _kinds_hitting(run, at, ev.faults, ev):
            rows[k]["false_recoveries"] += 1
    rows["slow_log"]["false_recoveries"] += len(slowed)
    return rows
