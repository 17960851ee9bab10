"""What the soak checks at the end, from Redis's final state, the side-effect log and the
fault record; and the numbers it reports.

Invariants (``--worker lease`` fails on any violation; ``--worker stock`` only counts):

1. **Outcome.** Every job ended ``finished``, or ``failed`` with a reason that is its own:
   its planned exception, RQ's "work-horse terminated" after the soak killed its horse
   (stock), or rq-emq's "stalled on attempt n of n" at max attempts (or, after the soak
   killed its horses, "work horse killed by signal 9 ... on each of n attempts").
2. **Nothing lost.** No job is left unfinished once the drain ends (all faults healed);
   one a stock neighbour's dequeue left in RQ's intermediate list is stock RQ's loss.
3. **Never queued twice.** Sampled atomically during the run: no id twice in the queue
   (but stock RQ's own double enqueue of its run's job), none queued while leased; at
   the end each job sits in exactly one place.
4. **Attempts equal starts.** ``emq_attempts`` counts takes since the job's last normal
   finish. Each run logs the value it sees as it starts; so runs after a stall continue
   the count (k, k+1, ...), a run after a committed finish (``Retry``) starts over at 1, a
   number is skipped only for a take that never reached the job function, and the sum of
   takes so derived equals Redis's ``taken`` counter. Runs a long stop or cut held back
   until after their lease was lost ("stale") read someone else's count and are left out.
   A job failed at max attempts was failed on attempt max ("stalled on attempt n of n");
   once its Result is written, like a finished job, it holds no ``emq_attempts``.
5. **Repeats are explained.** A run followed by another run of the same job either
   raised (RQ's ``Retry``) or was hit by a fault that legitimately repeats work: its
   worker or horse killed, stopped or cut off past the grace. Short stops and cuts,
   ``CLIENT KILL`` and Redis restarts (shorter than the grace) must never repeat a run.
   A repeat with no such fault is a *self-fenced stop* when the earlier run's worker logged
   that its local lease clock stopped that job (renewals that timed out: a Redis-wide stall,
   fsync latency, a starved host; :mod:`soak.selffence`); with neither, it is a duplicate.
"""

from __future__ import annotations

import dataclasses
import re
import statistics
from dataclasses import dataclass, field
from typing import Any

from .failovercheck import (
    check_callbacks,
    check_failover,
    startup_exit_in_window,
    taken_in_window,
    with_window,
)
from .faults import CRASH_EXCUSED, CRASHING, GLOBAL, HELD, LAPSING, REPEAT_EXCUSED, Fault
from .jobs import Run
from .overlap import by_kind, overlaps
from .selffence import fenced_runs

#: Kinds that kill a horse alone: under a lease worker, its worker fails the job at max attempts.
HORSE_KILLS = {"kill_horse", "oom_horse"}


@dataclass
class Verdict:
    counts: dict[str, Any] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    latency: dict[str, Any] = field(default_factory=dict)
    #: False for the stock baseline: its violations are reported, not failed on
    enforced: bool = True

    @property
    def passed(self) -> bool:
        return not (self.enforced and self.violations)


def _excused(run: Run, until: float, faults: list[Fault]) -> Fault | None:
    for fault in faults:
        if fault.kind not in REPEAT_EXCUSED or not fault.covers(run.started, until):
            continue
        if fault.hit(run.ppid) or fault.hit(run.pid) or fault.kind in GLOBAL:
            return fault
    return None


def _outcome_written_by(run: Run, state: dict[str, Any], patience_s: float) -> float:
    """The latest moment the holder of a run that returned could still have been writing its
    outcome: the function's end plus the finish's patience (one lease), and never after the
    job was failed (RQ's ``ended_at``, when the evidence has it)."""
    until = (run.ended or run.started) + patience_s
    failed_at = state.get("ended_at")
    return min(until, float(failed_at)) if failed_at else until


def _failure_context(state: dict[str, Any], runs: list[Run], faults: list[Fault]) -> str:
    """What a failed-yet-completed job's report needs to be read without a rerun: its
    failure, each run, and the faults that hit those runs' processes."""
    pids = {p for r in runs for p in (r.pid, r.ppid)}
    hits = [f"{f.kind}@{f.started:.3f}" for f in faults if any(f.hit(p) for p in pids)]
    shown = [f"{r.outcome or 'cut'} pid {r.pid}/{r.ppid} {r.started:.3f}-{r.ended or 0:.3f}" for r in runs]
    return (
        f"failure {state.get('failure') or state.get('reason', '')[-80:]!r}; runs {'; '.join(shown)}; "
        f"faults on them {', '.join(hits) or 'none'}"
    )


def _long_restart(fault: Fault, grace_s: float) -> Fault:
    """A Redis restart the soak meant to keep within the grace that took longer (a loaded
    machine: the AOF load, the process start) is a ``restart_long``: every holder's local
    lease clock may run out in it, and self-fencing then stops its run, which runs again."""
    if fault.kind == "restart" and fault.ended is not None and fault.ended - fault.started > grace_s:
        return dataclasses.replace(fault, kind="restart_long")
    return fault


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def _reason_ok(
    planned: Any, state: dict[str, Any], runs: list[Run], faults: list[Fault], lease: bool
) -> str | None:
    """None when the job's final state is one the invariants allow, else what is wrong."""
    status = state["status"]
    if status == "finished":
        return None if planned.outcome != "raise" else "finished, but it always raises"
    if status != "failed":
        return f"ended {status or 'with no job hash'}"
    reason = state["reason"] or ""
    if lease and state["failure"]:
        expected = f"stalled on attempt {state['max_attempts']} of {state['max_attempts']}"
        horses = {r.pid for r in runs}
        crashed = any(f.kind in HORSE_KILLS and set(f.horse_pids) & horses for f in faults)
        if state["failure"] != expected and not (crashed and _crash_failure(state)):
            return f"failed: {state['failure']}"
        if planned.max_attempts is not None and str(planned.max_attempts) != state["max_attempts"]:
            return f"failed at {state['max_attempts']} attempts; its own max is {planned.max_attempts}"
        return None if "JobStalled" in reason else "failed at max attempts without RQ's Result saying so"
    if "ValueError: soak" in reason:
        return None if planned.outcome in ("raise", "flaky") else "failed with a planned error it never plans"
    if "AbandonedJobError" in reason and any(
        f.kind == "stock_exit" and f.worker_pid in {r.ppid for r in runs} for f in faults
    ):
        return None  # a stock neighbour quit mid-job: stock cleanup failed its job, as RQ does
    if "Work-horse terminated unexpectedly" in reason:
        horses = {r.pid for r in runs}
        for f in faults:
            # its horse, seen running it, or killed (before its start line) on its last worker
            ran_it = bool(set(f.horse_pids) & horses) or (f.slot and f.slot == state.get("worker"))
            if f.kind in HORSE_KILLS | {"kill_group"} and ran_it:
                return None
        return "failed: work-horse terminated, and the soak killed none of its horses"
    return "failed: " + (reason.strip().splitlines() or ["no reason"])[-1][:160]


def _failed_on_attempt(failure: str) -> int | None:
    """The attempt a job failed at max attempts on: "stalled on attempt n of n", or a horse
    crash's "... on each of n attempts" / "... on attempt n of n (earlier ...)"."""
    found = re.search(r"on attempt (\d+) of \d+|on each of (\d+) attempts", failure)
    return int(found.group(1) or found.group(2)) if found else None


def _crash_failure(state: dict[str, Any]) -> bool:
    """A horse crash's failure at max attempts: it names SIGKILL (the soak's kill) and the max."""
    failure = state["failure"] or ""
    return "signal 9 (SIGKILL" in failure and str(_failed_on_attempt(failure)) == state["max_attempts"]


def _reason_kind(state: dict[str, Any]) -> str:
    reason = state["reason"] or ""
    if state["failure"]:
        return "stalled at max attempts"
    for needle, name in (
        ("ValueError: soak", "its own exception"),
        ("Work-horse terminated", "work-horse terminated"),
        ("AbandonedJobError", "abandoned (stock cleanup)"),
        ("moved to FailedJobRegistry", "abandoned (stock cleanup)"),
    ):
        if needle in reason:
            return name
    return "other"


def evaluate(ev: Any) -> Verdict:
    cfg = ev.config
    lease = cfg.worker == "lease"
    v = Verdict()
    ev.faults = [with_window(_long_restart(f, cfg.grace_s), cfg) for f in ev.faults]
    faults: list[Fault] = ev.faults
    for state in ev.final.values():
        if state.get("max_attempts") is None and state.get("failure"):
            # a job without its own max failed at the workers' default (found by a 180 s
            # soak: such a failure read as "failed at max attempts on attempt 5" of none)
            state["max_attempts"] = str(cfg.max_attempts)
    kinds: dict[str, int] = {}
    for fault in faults:
        kinds[fault.kind] = kinds.get(fault.kind, 0) + 1
    v.counts["faults"] = kinds
    v.counts["jobs"] = len(ev.jobs)
    v.counts["respawns"] = ev.respawns

    # 1, 2: outcomes; lost; failed while running (failed although a run completed fine)
    lost, bad, failed_running, finished, failed, stranded_by_stock = [], [], [], 0, 0, 0
    unexplained_failures = 0
    for job_id, planned in ev.jobs.items():
        state, runs = ev.final[job_id], ev.runs.get(job_id, [])
        finished += state["status"] == "finished"
        failed += state["status"] == "failed"
        if _ended_by_lifecycle(planned, state):
            continue  # canceled, deleted, result_ttl=0, deferred: judged by _check_lifecycle
        if state["status"] not in ("finished", "failed") and _left_by_a_quitting_neighbour(runs, faults, ev):
            continue  # stock RQ's own loss (its worker quit on a Redis error mid-job): not ours
        if state["status"] == "queued" and _stranded_by_a_stock_dequeue(job_id, ev):
            stranded_by_stock += 1
            continue
        if state["status"] not in ("finished", "failed"):
            lost.append(job_id)
            locations = ("queued", "started", "leases", "intermediate", "moving")
            where = [name for name in locations if job_id in ev.registries.get(name, [])]
            v.violations.append(
                f"{job_id}: not finished after the drain: status {state['status']}, "
                f"in {', '.join(where) or 'no queue or registry'}"
            )
            continue
        problem = _reason_ok(planned, state, runs, faults, lease)
        if problem:
            bad.append(job_id)
            v.violations.append(f"{job_id}: {problem}")
        completed = [r for r in runs if r.outcome == "ok"]
        if state["status"] == "failed" and completed:
            failed_running.append(job_id)
            # allowed only when that run's holder was killed, cut off or away past the grace
            # before its outcome was written: the sweep (or the crash recovery) rightly took
            # the job from it. The outcome is written after the job function returned (its
            # ``end`` line), within the finish's patience, so a fault up to then counts.
            patience_s = cfg.lease_ms / 1000
            if not any(_excused(r, _outcome_written_by(r, state, patience_s), faults) for r in completed):
                unexplained_failures += 1
                context = _failure_context(state, runs, faults)
                v.violations.append(f"{job_id}: failed, although a run of it completed ({context})")
    reasons: dict[str, int] = {}
    for state in ev.final.values():
        if state["status"] == "failed":
            key = _reason_kind(state)
            reasons[key] = reasons.get(key, 0) + 1
    v.counts["failed_by_reason"] = reasons
    v.counts.update(
        finished=finished,
        failed=failed,
        lost=len(lost),
        stranded_by_stock_dequeue=stranded_by_stock,
        wrong_outcome=len(bad),
        failed_while_running=len(failed_running),
        failed_while_running_unexplained=unexplained_failures,
        failed_at_max_attempts=sum(1 for s in ev.final.values() if s["failure"]),
    )

    # 3: never queued twice (a stock neighbour's own double enqueue is RQ's, not ours)
    by_stock = [line for line in ev.queue_violations if _queued_twice_by_stock(line, ev)]
    v.violations += [f"queue sample {line}" for line in ev.queue_violations if line not in by_stock]
    v.counts["queued_twice_by_stock"] = len(by_stock)
    places: dict[str, int] = {}
    for name in ("queued", "finished", "failed"):
        for job_id in ev.registries[name]:
            places[job_id] = places.get(job_id, 0) + 1
    doubly = [j for j, n in places.items() if n > 1]
    v.violations += [f"{j}: in {places[j]} places at the end" for j in doubly]
    v.counts["queued_twice"] = len(ev.queue_violations) - len(by_stock) + len(doubly)
    v.counts["queue_samples"] = ev.queue_samples

    # a worker that exits on its own must have been cut off for long
    crashes = [f for f in faults if f.kind == "crash"]
    for crash in crashes:
        causes = [
            f
            for f in faults
            if f.kind in CRASH_EXCUSED and f.worker_pid == crash.worker_pid and f.started <= crash.started
        ] + startup_exit_in_window(crash, faults)
        if not causes:
            v.violations.append(
                f"worker {crash.slot} (pid {crash.worker_pid}) crashed ({crash.detail}) with no long cut "
                "to explain it"
            )
    v.counts["crashes"] = len(crashes)

    # 5: repeats; the baseline's "duplicates" are the unexplained ones
    repeats, unexplained, self_fenced, stock_duplicates = 0, 0, 0, 0
    ev.fenced_runs = fenced_runs(ev.runs, getattr(ev, "self_fenced", []))
    for job_id, runs in ev.runs.items():
        for run, following in zip(runs, runs[1:], strict=False):
            if run.outcome == "raise":
                continue  # RQ's Retry
            repeats += 1
            if _excused(run, following.started, faults) is None and not _stale(following, faults):
                if (job_id, run.started) in ev.fenced_runs:
                    self_fenced += 1
                    continue
                if _stock_ran_its_own_duplicate(job_id, following, ev):
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

    # 4: attempts equal starts
    if lease:
        _check_attempts(ev, v)
    _check_lifecycle(ev, v)

    # the latency from a lapsed lease to the job leaving its dead holder, and the bound
    if lease:
        ended = {
            job_id for job_id, planned in ev.jobs.items() if _ended_by_lifecycle(planned, ev.final[job_id])
        }
        _check_recovery_bound(cfg, faults, v, ended)
    _check_overlap(ev, v, lease)
    check_callbacks(ev, v)
    if getattr(cfg, "sentinel", False):
        check_failover(ev, v)
    v.enforced = lease  # the baseline reports; it does not fail
    return v


#: Longest a run may go on after its job began elsewhere (ms): a worker and horse frozen
#: together past the lease may, once resumed, run a few instructions before the horse's
#: self-fencing thread is scheduled; every other overlap must be 0.
FROZEN_PAIR_OVERLAP_MS = 100.0


def _check_overlap(ev: Any, v: Verdict, lease: bool) -> None:
    """No two runs of one job overlap in time (:mod:`soak.overlap`)."""
    found = overlaps(ev.runs, ev.faults, horse_dies_with_worker=lease)
    v.counts["overlapping_runs"] = len(found)
    v.counts["longest_overlap_ms"] = round(max((o.ms for o in found), default=0.0), 1)
    v.counts["overlap_by_kind"] = by_kind(found, ev.runs, ev.faults)
    for o in found:
        later = next((run for run in ev.runs.get(o.job_id, []) if run.pid == o.later_pid), None)
        if later is not None and _stock_ran_its_own_duplicate(o.job_id, later, ev):
            continue  # counted with the repeats: stock RQ's
        if o.ms > (FROZEN_PAIR_OVERLAP_MS if o.frozen else 0.0):
            v.violations.append(
                f"{o.job_id}: the run in pid {o.earlier_pid} went on {o.ms:.0f} ms "
                f"after pid {o.later_pid} began it{' (resumed from a stop)' if o.frozen else ''}"
            )


def _check_recovery_bound(
    cfg: Any, faults: list[Fault], v: Verdict, ended: frozenset[str] | set[str] = frozenset()
) -> None:
    """A dead (or long-stopped, or cut-off) holder's job must leave it within the bound,
    lease + 2 sweep intervals from the fault, plus a stated slack for a loaded machine; a
    job that never left its holder at all fails the soak too, unless RQ ended it (a
    cancel, a delete: ``ended``), which the sweep rightly leaves where RQ put it."""
    lapsed = [
        f
        for f in faults
        if f.kind in LAPSING | CRASHING
        and f.lapse_at
        and f.token
        and f.job_id not in ended
        and not _done_before(f)
    ]
    seen = [f for f in lapsed if f.requeued_at]
    # "!": the holder finished the job as the fault began; its lease never lapsed
    not_back = [f for f in lapsed if not f.requeued_at and not f.detail.endswith("!")]
    after_lapse = [max(0.0, f.requeued_at - f.lapse_at) for f in seen if f.kind not in CRASHING]  # type: ignore[operator]
    after_fault = [f.requeued_at - f.started for f in seen]  # type: ignore[operator]
    after_crash = [t for f, t in zip(seen, after_fault, strict=True) if f.kind in CRASHING]
    over, double = 0, 0
    for f, t in zip(seen, after_fault, strict=True):
        bound, what = cfg.bound_s, "lease + 2 sweeps"
        if f.kind in CRASHING and not _own_worker_hit(cfg, f, faults):
            bound, what = cfg.crash_bound_s, "a horse crash: its worker recovers it at once"
        elif _another_worker_hit(cfg, f, faults):
            double += 1
            bound, what = cfg.double_bound_s, "another worker hit too: hold + a line wait + 2 sweeps"
        if t > bound + cfg.bound_slack_s:
            over += 1
            v.violations.append(
                f"{f.job_id}: back {t:.2f}s after its {f.kind}; the bound is {bound:.2f}s "
                f"({what}) + {cfg.bound_slack_s:.2f}s slack"
            )
    for f in not_back:
        v.violations.append(f"{f.job_id}: never left its holder after its {f.kind} at {f.started:.3f}")
    after_fault = [t for f, t in zip(seen, after_fault, strict=True) if f.kind not in CRASHING]
    v.latency = {
        "crash_samples": len(after_crash),
        "crash_bound_s": cfg.crash_bound_s,
        "crash_p50": statistics.median(after_crash) if after_crash else None,
        "crash_max": max(after_crash) if after_crash else None,
        "samples": len(seen) - len(after_crash),
        "not_seen": len(not_back),
        "bound_s": cfg.bound_s,
        "double_bound_s": cfg.double_bound_s,
        "double": double,
        "slack_s": cfg.bound_slack_s,
        "lapse_p50": statistics.median(after_lapse) if after_lapse else None,
        "lapse_p95": _percentile(after_lapse, 0.95) if after_lapse else None,
        "lapse_max": max(after_lapse) if after_lapse else None,
        "fault_p50": statistics.median(after_fault) if after_fault else None,
        "fault_p95": _percentile(after_fault, 0.95) if after_fault else None,
        "fault_max": max(after_fault) if after_fault else None,
        "over_bound": over,
    }


def _another_worker_hit(cfg: Any, fault: Fault, faults: list[Fault]) -> bool:
    """Another worker was killed, stopped or cut off between 1.5 leases before this fault
    and its job's return: the election's sweeper and deputy may both have been hit, which
    has its own, longer bound (a killed worker counts as hit for a lease after its kill,
    until its roles lapse)."""
    lease_s = cfg.lease_ms / 1000
    start, end = fault.started - 1.5 * lease_s, fault.requeued_at or fault.started
    return any(
        other is not fault
        and other.slot != fault.slot
        and other.kind in LAPSING | HELD
        and other.started <= end
        and max(other.ended or other.started, other.started + lease_s) >= start
        for other in faults
    )


def _own_worker_hit(cfg: Any, fault: Fault, faults: list[Fault]) -> bool:
    """A horse crash whose own worker was then killed, stopped or cut off before the job
    was back: the sweep recovers it, within the lease bound, not the crash bound."""
    end = fault.requeued_at or fault.started
    return any(
        other is not fault
        and other.slot == fault.slot
        and other.kind in LAPSING | HELD
        and fault.started <= other.started <= end
        for other in faults
    )


def _done_before(fault: Fault) -> bool:
    """The fault hit a horse whose job's outcome was already committed (the token the soak
    read at the fault is the finish's ``done:<token>``): no lease was left to lapse."""
    token = fault.token
    text = token.decode(errors="replace") if isinstance(token, bytes) else str(token or "")
    return text.startswith(("done:", "b'done:", 'b"done:'))


def _rq_finished(run: Run, faults: list[Fault]) -> bool:
    """RQ's own finish code ran for this run (and may have retried the job): it raised. A
    horse the soak killed is a crash its lease worker recovers, attempt counted."""
    return run.outcome == "raise"


#: How long after a stop or cut ends a held-back horse may still begin its job function.
STALE_WINDOW_S = 1.0


def _stale(run: Run, faults: list[Fault]) -> bool:
    """A run begun by a horse that a long stop or cut held back between its take and the
    job function: it starts late, after its lease was lost (its worker stops it at the
    next renewal), and the attempt number it reads belongs to whoever holds the job now."""
    return any(
        f.kind in ("stop_long", "cut_long")
        and run.pid in f.horse_pids  # a horse that already existed when the fault began
        and f.started <= run.started <= (f.ended if f.ended is not None else run.started) + STALE_WINDOW_S
        for f in faults
    )


def _left_by_a_quitting_neighbour(runs: list[Run], faults: list[Fault], ev: Any) -> bool:
    """The job's last run was a stock neighbour's, and that worker quit (a Redis error, as
    stock RQ's worker does outside its dequeue) after the run began: stock RQ leaves such a
    job started until its cleanup fails it, a minute or more later, past the drain."""
    if not _by_stock(runs, ev):
        return False
    last = runs[-1]
    quits = [f for f in faults if f.kind == "stock_exit" and f.worker_pid == last.ppid]
    return any(f.started >= last.started for f in quits)


def _stranded_by_a_stock_dequeue(job_id: str, ev: Any) -> bool:
    """The job sits in RQ's intermediate list, where only a stock worker's ``BLMOVE`` puts
    a job (ours use a moving list of their own): a stock neighbour dequeued it and never
    started it (its dequeue's reply lost in a Redis restart, or the worker quit between
    the two). Stock RQ fails such a job a minute later ("stuck in intermediate queue"):
    its loss, not ours."""
    return bool(getattr(ev, "stock_workers", [])) and job_id in ev.registries.get("intermediate", [])


def _queued_twice_by_stock(line: str, ev: Any) -> bool:
    """A sample's "twice in the queue" that a stock neighbour made: the job's last run
    before the sample was that neighbour's, and stock RQ handled its end twice (a worker
    frozen while its horse raised: the horse's ``Retry`` and, on resume, the worker's
    "terminated unexpectedly" failure each enqueue it). Our workers pushed neither copy."""
    parts = line.split(maxsplit=2)
    if len(parts) < 3 or parts[2] != "twice in the queue":
        return False
    at, job_id = float(parts[0]), parts[1]
    before = [run for run in ev.runs.get(job_id, []) if run.started <= at]
    return _by_stock(before, ev)


def _stock_ran_its_own_duplicate(job_id: str, run: Run, ev: Any) -> bool:
    """``run`` is a stock neighbour's, begun after a sample saw the job twice in the queue
    by stock RQ's own double enqueue (:func:`_queued_twice_by_stock`): a stock worker pops
    without a lease, so it runs the copy that stock RQ made, whoever runs the other one.
    The same copy run by one of ours would be our fault (``pop_job`` drops a copy of a job
    in flight under a live lease), and is not excused."""
    if run.ppid not in set(getattr(ev, "stock_workers", [])):
        return False
    for line in ev.queue_violations:
        parts = line.split(maxsplit=2)
        if len(parts) == 3 and parts[1] == job_id and float(parts[0]) <= run.started:
            if _queued_twice_by_stock(line, ev):
                return True
    return False


def _by_stock(runs: list[Run], ev: Any) -> bool:
    """The job's last run was a stock neighbour's (its finish is RQ's own, which leaves
    our fields as they were)."""
    return bool(runs) and runs[-1].ppid in set(getattr(ev, "stock_workers", []))


def _check_attempts(ev: Any, v: Verdict) -> None:
    total_takes, skipped, stale, inferred, in_window = 0, 0, 0, 0, 0
    stock = set(getattr(ev, "stock_workers", []))
    for job_id in ev.jobs:
        runs, state = ev.runs.get(job_id, []), ev.final[job_id]
        takes, previous = 0, None
        for run in runs:
            if run.ppid in stock:
                continue  # a stock neighbour's run: taken without a lease, counts no attempt
            if _stale(run, ev.faults):
                stale += 1
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
            else:
                base = previous.attempt or 0
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
            held = _failed_on_attempt(state["failure"]) or 0
            if held != int(state["max_attempts"] or -1):
                v.violations.append(f"{job_id}: failed at max attempts on attempt {held}")
            if state["attempts"] is not None:
                v.violations.append(f"{job_id}: failed, its Result written, still holds emq_attempts")
            takes += max(0, held - last)
            skipped += max(0, held - last)
        elif state["status"] == "finished" and state["attempts"] is not None and not _by_stock(runs, ev):
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
    if not 0 <= taken - total_takes <= _refused_starts(ev) + in_window:
        v.violations.append(
            f"Redis counted {taken} takes; the runs' attempt numbers account for {total_takes}"
        )
    v.counts["takes"] = taken
    v.counts["takes_never_started"] = skipped
    v.counts["stale_runs"] = stale
    v.counts["attempts_inferred"] = inferred
    v.counts["runs_in_failover_windows"] = in_window


# -- RQ's lifecycle: the mix's dependents, cancels, deletes, result_ttl=0 and scheduled jobs --

#: RQ's scheduled registry keeps due times in whole seconds: a scheduled job may be
#: enqueued up to this long before the moment ``enqueue_in`` asked for
SCHEDULE_SLACK_S = 1.0
#: where a job can still be at the end (RQ's queue, registries we collect, our lease index)
PLACES = ("queued", "finished", "failed", "leases", "started")


def _kind(planned: Any) -> str:
    return getattr(planned, "kind", "plain") or "plain"


def _ended_by_lifecycle(planned: Any, state: dict[str, Any]) -> bool:
    """The job ended the way its lifecycle kind ends it, not ``finished``/``failed``: the
    producer canceled or deleted it, a ``result_ttl=0`` finish removed its hash, or a
    dependent was left deferred. ``_check_lifecycle`` judges these; "nothing lost" skips them."""
    kind = _kind(planned)
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


def _unexplained_repeats(
    runs: list[Run],
    faults: list[Fault],
    fenced: set[tuple[str, float]] | frozenset[tuple[str, float]] = frozenset(),
) -> list[Run]:
    """Runs that followed a run that neither raised (Retry), nor was hit by a fault, nor
    was stopped by its worker's local lease clock (``fenced``, :mod:`soak.selffence`)."""
    return [
        following
        for run, following in zip(runs, runs[1:], strict=False)
        if run.outcome != "raise"
        and _excused(run, following.started, faults) is None
        and not _stale(following, faults)
        and (run.job_id, run.started) not in fenced
    ]


def _repeats(runs: list[Run], faults: list[Fault]) -> list[str]:
    return [f"ran again at {r.started:.3f}, no fault explains it" for r in _unexplained_repeats(runs, faults)]


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
    if _by_stock(ev.runs.get(job_id, []), ev):
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
        if r.ended is not None and _excused(r, r.ended, faults) is None and not _stale(r, faults)
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
            for r in _unexplained_repeats(runs, ev.faults, getattr(ev, "fenced_runs", frozenset()))
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
        for r in _unexplained_repeats(runs, ev.faults, getattr(ev, "fenced_runs", frozenset()))
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


def _check_lifecycle(ev: Any, v: Verdict) -> None:
    jobs: dict[str, int] = {}
    found: dict[str, int] = {}
    for job_id, planned in ev.jobs.items():
        kind = _kind(planned)
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
        if _kind(p) == "scheduled" and ev.final[job_id]["status"] == "scheduled"
    )
    v.counts["lifecycle_jobs"] = jobs
    v.counts["lifecycle_violations"] = found
    v.counts["acted"] = {
        k: sum(1 for p in ev.jobs.values() if _kind(p) == k and p.acted_at is not None)
        for k in ("cancel", "delete")
    }


def _refused_starts(ev: Any) -> int:
    """Takes that may show in no run: a job the producer canceled or deleted between its
    take and its (guarded) start is refused there, at most once (it is in no queue after)."""
    return sum(1 for p in ev.jobs.values() if _kind(p) in ("cancel", "delete") and p.acted_at is not None)
