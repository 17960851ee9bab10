"""What the soak checks at the end, from Redis's final state, the side-effect log and the
fault record; and the numbers it reports. :func:`evaluate` runs every check in turn; each
invariant family lives in a module of its own (soak/README.md, "What it checks"):

1-3. **Outcome, nothing lost, never queued twice**, and workers that exit on their own
     (:mod:`soak.outcomes`).
4. **Attempts equal starts** (:mod:`soak.attempts`, ``--worker lease``).
5. **Repeats are explained** (:mod:`soak.repeats`, with the worker's own evidence in
   :mod:`soak.selffence` and stock RQ's credits in :mod:`soak.stockcredit`).
6. **RQ's lifecycle**: cancels, deletes, dependents, scheduled and ``result_ttl=0`` jobs
   (:mod:`soak.lifecyclecheck`).
7. **No two runs of one job overlap in time** (:mod:`soak.overlap`).
8. **Each fenced job's effect lands exactly once**, beside its plain twin's at-least-once
   count (:mod:`soak.effectcheck`).
9. **No false recovery**, no run stopped by a slow log handler, and the table of issue 46's
   faults (:mod:`soak.witnesscheck`).

At every sample, each job is in exactly one place RQ reads (:mod:`soak.conservation`). After
a loss of Redis's data (``--lose-data``) the checks that read Redis's state judge what it
kept, and no loss excuses an overlap or a fencing token that did not rise
(:mod:`soak.dataloss`).

Beside them: the recovery bound (:mod:`soak.recoverybound`, ``--worker lease``), failure
callbacks and, with Sentinel, failovers (:mod:`soak.failovercheck`). ``--worker lease``
fails on any violation; ``--worker stock`` only counts (:class:`soak.verdict.Verdict`).
"""

from __future__ import annotations

from typing import Any

from .attempts import check_attempts
from .conservation import check_conservation
from .dataloss import apply_loss, check_tokens
from .effectcheck import check_effects
from .failovercheck import check_callbacks, check_failover, with_window
from .faults import Fault
from .lifecyclecheck import check_lifecycle, ended_by_lifecycle
from .outcomes import check_crashes, check_outcomes, check_queues
from .overlap import check_overlap
from .recoverybound import check_recovery_bound
from .repeats import check_repeats, long_restart
from .stockcredit import stock_doubled
from .verdict import Verdict
from .witnesscheck import check_witness

__all__ = ["Verdict", "evaluate"]


def evaluate(ev: Any) -> Verdict:
    cfg = ev.config
    lease = cfg.worker == "lease"
    v = Verdict()
    ev.faults = [with_window(long_restart(f, cfg.grace_s), cfg) for f in ev.faults]
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

    every_run = ev
    # after a loss of Redis's data, what Redis kept: a resubmitted job's runs since, no lost job
    ev = apply_loss(every_run, v)
    check_outcomes(ev, v, lease)  # 1, 2
    check_queues(every_run, v)  # 3: its samples, and their credits, read the runs before a loss too
    check_conservation(every_run, v)  # 3, at every sample: each job in exactly one place
    check_crashes(ev, v)
    check_repeats(ev, v)  # 5
    if lease:
        check_attempts(ev, v)  # 4
    check_lifecycle(ev, v)  # 6
    # the latency from a lapsed lease to the job leaving its dead holder, and the bound
    if lease:
        ended = {
            job_id for job_id, planned in ev.jobs.items() if ended_by_lifecycle(planned, ev.final[job_id])
        }
        # a job a stock neighbour's copy finished (its double enqueue) is RQ's ended job too:
        # the sweep rightly leaves where RQ put it the lease one of ours held on the other copy
        ended |= {job_id for job_id in ev.runs if stock_doubled(job_id, ev)}
        check_recovery_bound(cfg, ev.faults, v, ended, ev.final)
    found = check_overlap(every_run, v, lease)  # 7, across a loss of Redis's data too
    check_tokens(every_run, v)  # fencing tokens: one per run, above every one before a loss
    check_callbacks(ev, v)
    check_effects(ev, v)  # 8
    if lease:
        check_witness(ev, v, found)  # 9
    if getattr(cfg, "sentinel", False):
        check_failover(ev, v)
    v.enforced = lease  # the baseline reports; it does not fail
    return v
