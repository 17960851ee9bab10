"""How each job ended (invariants 1-3), and workers that exited on their own.

1. **Outcome.** Every job ended ``finished``, or ``failed`` with a reason that is its own:
   its planned exception, RQ's "work-horse terminated" after the soak killed its horse
   (stock), or rq-emq's "stalled on attempt n of n" at max attempts (or, after the soak
   killed its horses, "work horse killed by signal 9 ... on each of n attempts"). A job
   that failed although a run of it completed needs a fault on that run's holder before
   its outcome was written.
2. **Nothing lost.** No job is left unfinished once the drain ends (all faults healed);
   one a stock neighbour's dequeue left in RQ's intermediate list is stock RQ's loss.
3. **Never queued twice.** Sampled atomically during the run: no id twice in the queue
   (but stock RQ's own double enqueue of its run's job, and a copy RQ's own client pushed
   that one of ours dropped unrun: soak/straycopies.py), none queued while leased; at
   the end each job sits in exactly one place.

A worker that exits without being killed (a ``crash``) must have been cut off for long
before (or, with Sentinel, never got past RQ's CLI in a failover's window).
"""

from __future__ import annotations

import re
from typing import Any

from .failovercheck import startup_exit_in_window
from .faults import CRASH_EXCUSED, Fault
from .jobs import Run
from .lifecyclecheck import ended_by_lifecycle
from .repeats import excused
from .stockcredit import left_by_a_quitting_neighbour, queued_twice_by_stock, stranded_by_a_stock_dequeue
from .straycopies import copy_accounted_for
from .verdict import Verdict
from .witnesscheck import copy_waiting

#: Kinds that kill a horse alone: under a lease worker, its worker fails the job at max attempts.
HORSE_KILLS = {"kill_horse", "oom_horse"}
#: Faults that kill a worker and leave its watchdog, which sees the death and hands the
#: job back (a crash counted: "worker pid N died (seen by its watchdog)"); a cold stop ends
#: the worker too (a SimpleLeaseWorker's job is handed back by that same witness)
WORKER_KILLS = {"kill_worker", "kill_group", "cold_stop"}


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


#: A failure at max attempts whose Result is not (yet) RQ's.
NO_RESULT = "failed at max attempts without RQ's Result saying so"


def commit_pending(job_id: str, state: dict[str, Any], ev: Any) -> bool:
    """The sweep failed the job at max attempts (``stalled on attempt n of n``) and its
    outbox entry is still under a drainer's live claim at the end of the drain: RQ's Result
    (and the count's clearing) is committed by that drainer, or by another once the claim
    lapses (it outlasts the failure callback's timeout, so a callback never runs twice at
    once). A drainer the soak killed or froze mid-drain holds it past the drain. An entry
    whose claim lapsed and was not taken again is no such credit."""
    return bool(state.get("failure")) and job_id in ev.registries.get("outbox_claimed", [])


def _reason_ok(
    planned: Any,
    state: dict[str, Any],
    runs: list[Run],
    faults: list[Fault],
    lease: bool,
    self_fenced: frozenset[tuple[int, str]] = frozenset(),
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
        # enqueued again while it ran: its copy's take may go on from the old run's count
        # (docs/guarantees.md), so its failure may come past the max
        again = any(f.kind == "enqueue_again" and f.job_id == planned.job_id for f in faults)
        if again and _at_or_past_max(state, "stalled on attempt"):
            expected = state["failure"]
        horses = {r.pid for r in runs}
        crashed = any(f.kind in HORSE_KILLS and set(f.horse_pids) & horses for f in faults)
        workers = {r.ppid for r in runs} | horses  # a SimpleLeaseWorker's run is its worker
        seen = any(f.kind in WORKER_KILLS and f.worker_pid in workers for f in faults)
        # a SimpleLeaseWorker that its own watchdog ended past its run's deadline (its job
        # held the GIL past the lease, so no renewal ran: the documented limit), told in the
        # watchdog's own line: a death seen, as a kill would be
        seen = seen or any((r.pid, planned.job_id) in self_fenced for r in runs)
        if (
            state["failure"] != expected
            and not (crashed and _crash_failure(state, again))
            and not (seen and _seen_death_failure(state, again))
        ):
            return f"failed: {state['failure']}"
        if planned.max_attempts is not None and str(planned.max_attempts) != state["max_attempts"]:
            return f"failed at {state['max_attempts']} attempts; its own max is {planned.max_attempts}"
        return None if "JobStalled" in reason else NO_RESULT
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


def failed_on_attempt(failure: str) -> int | None:
    """The attempt a job failed at max attempts on: "stalled on attempt n of n", or a horse
    crash's "... on each of n attempts" / "... on attempt n of n (earlier ...)"."""
    found = re.search(r"on attempt (\d+) of \d+|on each of (\d+) attempts", failure)
    return int(found.group(1) or found.group(2)) if found else None


def _crash_failure(state: dict[str, Any], again: bool = False) -> bool:
    """A horse crash's failure at max attempts: it names SIGKILL (the soak's kill) and the max
    (or, ``again``, a count past it)."""
    return _at_or_past_max(state, "signal 9 (SIGKILL", again)


def _seen_death_failure(state: dict[str, Any], again: bool = False) -> bool:
    """A worker death its watchdog saw, at max attempts: the watchdog's cause and the max
    (or, ``again``, a count past it)."""
    return _at_or_past_max(state, "(seen by its watchdog)", again)


def _at_or_past_max(state: dict[str, Any], cause: str, past: bool = True) -> bool:
    """The failure names ``cause`` and the attempt it failed on is the job's max (or, with
    ``past``, above it)."""
    failure = state["failure"] or ""
    held, most = failed_on_attempt(failure), int(state["max_attempts"] or -1)
    return cause in failure and held is not None and (held == most or past and held > most)


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


def check_outcomes(ev: Any, v: Verdict, lease: bool) -> None:
    """1, 2: outcomes; lost; failed while running (failed although a run completed fine)."""
    cfg, faults = ev.config, ev.faults
    self_fenced = frozenset((int(pid), job_id) for pid, job_id in getattr(ev, "self_fenced", []))
    lost, bad, failed_running, finished, failed, stranded_by_stock = [], [], [], 0, 0, 0
    unexplained_failures = 0
    for job_id, planned in ev.jobs.items():
        state, runs = ev.final[job_id], ev.runs.get(job_id, [])
        finished += state["status"] == "finished"
        failed += state["status"] == "failed"
        if ended_by_lifecycle(planned, state):
            continue  # canceled, deleted, result_ttl=0, deferred: judged by check_lifecycle
        if state["status"] not in ("finished", "failed") and left_by_a_quitting_neighbour(runs, faults, ev):
            continue  # stock RQ's own loss (its worker quit on a Redis error mid-job): not ours
        if state["status"] == "queued" and stranded_by_a_stock_dequeue(job_id, ev):
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
        problem = _reason_ok(planned, state, runs, faults, lease, self_fenced)
        if problem == NO_RESULT and commit_pending(job_id, state, ev):
            v.counts["failure_commit_pending"] = v.counts.get("failure_commit_pending", 0) + 1
            problem = None  # its Result comes when the drainer's claim lapses, past the drain
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
            if not any(excused(r, _outcome_written_by(r, state, patience_s), faults) for r in completed):
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
        lost_jobs=lost,
        stranded_by_stock_dequeue=stranded_by_stock,
        wrong_outcome=len(bad),
        failed_while_running=len(failed_running),
        failed_while_running_unexplained=unexplained_failures,
        failed_at_max_attempts=sum(1 for s in ev.final.values() if s["failure"]),
    )


def check_queues(ev: Any, v: Verdict) -> None:
    """3: never queued twice (a stock neighbour's own double enqueue is RQ's, not ours)."""
    by_stock = [line for line in ev.queue_violations if queued_twice_by_stock(line, ev)]
    # a copy RQ's own client pushed (soak/straycopies.py), dropped unrun by one of ours
    stray = [line for line in ev.queue_violations if line not in by_stock and copy_accounted_for(line, ev)]
    # a copy the user enqueued while the job ran, its take held back until the run is over
    waiting = [
        line for line in ev.queue_violations if line not in by_stock + stray and copy_waiting(line, ev)
    ]
    credited = by_stock + stray + waiting
    v.violations += [f"queue sample {line}" for line in ev.queue_violations if line not in credited]
    v.counts["enqueued_copies_waiting"] = len(waiting)
    v.counts["queued_twice_by_stock"] = len(by_stock)
    v.counts["stray_copies_seen"] = len(stray)
    v.counts["stray_copies_dropped"] = len(getattr(ev, "stray_drops", []))
    places: dict[str, int] = {}
    for name in ("queued", "finished", "failed"):
        for job_id in ev.registries[name]:
            places[job_id] = places.get(job_id, 0) + 1
    doubly = [j for j, n in places.items() if n > 1]
    v.violations += [f"{j}: in {places[j]} places at the end" for j in doubly]
    v.counts["queued_twice"] = len(ev.queue_violations) - len(credited) + len(doubly)
    v.counts["queue_samples"] = ev.queue_samples


def check_crashes(ev: Any, v: Verdict) -> None:
    """A worker that exits on its own must have been cut off for long."""
    faults: list[Fault] = ev.faults
    crashes = [f for f in faults if f.kind == "crash"]
    for crash in crashes:
        causes = [
            f
            for f in faults
            if f.kind in CRASH_EXCUSED and f.worker_pid == crash.worker_pid and f.started <= crash.started
        ] + startup_exit_in_window(crash, faults)
        simple = crash.worker_pid in getattr(ev, "simple_workers", [])
        if simple and "ended itself after a stop of its run" in crash.detail:
            # a SimpleLeaseWorker ends its process once a stop of its run (lease lost, RQ
            # ended the job) leaves no other proof that the run is over: no crash; the stop
            # itself is judged with its job (repeats, overlaps)
            v.counts["simple_workers_ended_after_a_stop"] = (
                v.counts.get("simple_workers_ended_after_a_stop", 0) + 1
            )
            continue
        if simple and any(pid == crash.worker_pid for pid, _job in getattr(ev, "self_fenced", [])):
            # a SimpleLeaseWorker its own watchdog ended past its run's deadline: a
            # self-fenced stop (soak/selffence.py), not a crash
            v.counts["ended_by_own_watchdog"] = v.counts.get("ended_by_own_watchdog", 0) + 1
            continue
        if not causes:
            v.violations.append(
                f"worker {crash.slot} (pid {crash.worker_pid}) crashed ({crash.detail}) with no long cut "
                "to explain it"
            )
    v.counts["crashes"] = len(crashes)
