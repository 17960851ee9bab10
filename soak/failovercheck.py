"""The checks a Redis failover adds (``--sentinel``, soak/sentinel.py), and the failure
callback check every soak runs.

**No failure callback for a job that finished.** Every soak job's ``on_failure`` writes a
``failure`` line (soak/jobs.py). RQ runs it in the horse for a run that raised (and a
flaky job then finishes on its ``Retry``: that callback reported a real failure), so a job
that ended ``finished`` may have had at most one failure callback per run of it that
raised. One more is a callback for a failure that did not happen: the outbox drain acting
on a master that was no longer the master (issue 26), or any other path that reports a
failure for a job that goes on to finish.

**The failover window** (the rule for reruns). A ``failover`` or ``kill_master`` may cost
a rerun (at-least-once, docs/guarantees.md): a take, renewal or finish written to the old
master after its replica was promoted is discarded by its resync (or dies with it). Its
window runs from the fault to the moment every worker must be back on the new master
(Sentinel named it + :data:`soak.model.REJOIN_S` + the soak's bound slack), plus one
lease: a job taken on the old master by then begins its run within its lease, or its lease
lapses. A repeat is explained by a failover when the earlier run had begun before the
window closed and the next run began after the fault: any worker's run, since the fault
hits every worker at once. A repeat outside every window needs another explanation.

The same runs (begun in the window, or up to :data:`REPL_SLACK_S` before the fault: a take
the replica had not yet received) are left out of "attempts equal starts": a take discarded
with the old master is counted nowhere, so the next take repeats its attempt number and
Redis's ``taken`` counter falls short by one per such run.

**Back at work.** After each failover, every lease worker that was up must hold a
connection to the new master and none to the old within :data:`soak.model.REJOIN_S`
+ the bound slack of Sentinel naming the new master; one never back (10 s) fails the soak.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .faults import SENTINEL_KINDS, Fault
from .jobs import Run
from .model import REJOIN_S

#: A take made this long before a failover may not have reached the replica (asynchronous
#: replication on loopback lags by milliseconds; this is a loaded host's margin).
REPL_SLACK_S = 0.5


def window_end(fault: Fault, cfg: Any) -> float | None:
    """When a failover's window closes (None: never, the master never moved)."""
    if fault.switched_at is None:
        return None
    return fault.switched_at + REJOIN_S + cfg.bound_slack_s + cfg.lease_ms / 1000


def with_window(fault: Fault, cfg: Any) -> Fault:
    """A failover fault whose ``ended`` is its window's end (idempotent: it is derived from
    ``switched_at``), so that the repeat rule's ``covers`` reads the window."""
    if fault.kind not in SENTINEL_KINDS:
        return fault
    return dataclasses.replace(fault, ended=window_end(fault, cfg))


def taken_in_window(run: Run, faults: list[Fault]) -> bool:
    """The run began in a failover's window (``faults`` as :func:`with_window` made them)."""
    return any(
        f.kind in SENTINEL_KINDS
        and f.started - REPL_SLACK_S <= run.started
        and (f.ended is None or run.started <= f.ended)
        for f in faults
    )


#: Faults that take Redis away from every worker at once: a failover's window, a restart.
REDIS_AWAY = (*SENTINEL_KINDS, "restart", "restart_long")


def startup_exit_in_window(crash: Fault, faults: list[Fault]) -> list[Fault]:
    """The failover (its window) or Redis restart that a worker's start fell in, when that
    worker never got past RQ's CLI (its log has no "started with PID": ``rq worker`` exits
    at once when the Redis it is pointed at is unreachable, before any worker code runs; the
    soak's supervisor checks that Redis answers before it respawns a worker, and a restart
    that begins just after that check races it). A worker that started and then died in a
    window or a restart is a crash like any other."""
    if not crash.detail.endswith("never started"):
        return []
    return [f for f in faults if f.kind in REDIS_AWAY and f.covers(crash.started - 5.0, crash.started)]


def check_callbacks(ev: Any, v: Any) -> None:
    calls: dict[str, list[float]] = getattr(ev, "failure_callbacks", {}) or {}
    spurious = 0
    for job_id, times in sorted(calls.items()):
        state = ev.final.get(job_id)
        if state is None or state["status"] != "finished":
            continue
        raised = sum(1 for r in ev.runs.get(job_id, []) if r.outcome == "raise")
        if len(times) > raised:
            spurious += len(times) - raised
            v.violations.append(
                f"{job_id}: finished, yet its failure callback ran {len(times)} time(s) for "
                f"{raised} run(s) that raised"
            )
    v.counts["failure_callbacks"] = sum(len(t) for t in calls.values())
    v.counts["spurious_failure_callbacks"] = spurious


def check_failover(ev: Any, v: Any) -> None:
    cfg = ev.config
    moves = [f for f in ev.faults if f.kind in SENTINEL_KINDS]
    bound = REJOIN_S
    times: list[float] = []
    for f in moves:
        if f.detail.startswith("injection failed"):
            continue  # reported with the faults (no replica in sync for the round)
        if f.switched_at is None:
            v.violations.append(f"{f.kind} at {f.started:.3f}: Sentinel named no new master")
            continue
        for worker, took in sorted(f.rejoined.items()):
            if took is None:
                v.violations.append(f"{f.kind} at {f.started:.3f}: worker {worker} never back on the new one")
                continue
            times.append(took)
            if took > bound + cfg.bound_slack_s:
                v.violations.append(
                    f"{f.kind} at {f.started:.3f}: worker {worker} back on the new master after "
                    f"{took:.2f}s (bound {bound:.1f}s + {cfg.bound_slack_s:.1f}s slack)"
                )
    reruns = 0
    for runs in ev.runs.values():
        for run, following in zip(runs, runs[1:], strict=False):
            if run.outcome != "raise" and any(
                f.covers(run.started, following.started) for f in moves if f.switched_at is not None
            ):
                reruns += 1
    v.counts["failover"] = {
        "moves": len(moves),
        "injection_failed": sum(f.detail.startswith("injection failed") for f in moves),
        "rejoin_samples": len(times),
        "rejoin_max_s": max(times, default=None),
        "rejoin_bound_s": bound,
        "slack_s": cfg.bound_slack_s,
        "reruns_in_window": reruns,
    }
