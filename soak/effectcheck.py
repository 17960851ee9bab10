"""Each fenced job's effect landed exactly once (invariant 8), beside its plain twin's
at-least-once count, and the table of both per fault kind.

The evidence (:mod:`soak.effects`): per fenced job, what Redis holds at the end (how many
plain twins landed; the token whose fenced effect counted; the log of every fenced write
that committed, in commit order), and each run's ``effect`` line (what became of its
write, under which token). What is judged:

(a) **At most one effect counts, and every finished job has exactly one.** The effect that
    counted is the first fenced write in the log (a later write, by a later grant or sent
    again, committed and counted nothing); an effect without a write in the log, or writes
    without an effect, would mean the two commands of one ``execute()`` did not commit
    together. At most one run says its write counted, under the token that counted. Every
    write a run saw commit is in the log (``appendfsync always``: an acknowledged write
    outlives a restart). A job that finished by a run of ours (its last completed run: a
    lease worker's) has its effect; one a stock worker finished has no lease to fence by,
    and is counted apart.
(b) **No replaced holder wrote after a newer grant.** The fence commits a write only while
    its token owns the job, and a newer grant's take replaced that token for good, so the
    tokens in a job's write log never go back: a lower token after a higher one is a
    replaced holder's write that landed, and fails the soak. The same token twice in a
    row is one grant's commit sent again after its reply was lost (a cut, a ``CLIENT
    KILL``, a restart: redis-py resends a pipeline after a connection error, and the run
    tries again), each send checked on its own while that grant still held the job:
    counted apart, never a violation. A refused write raised ``LeaseLost`` and wrote
    nothing: it shows as its run's ``refused`` line, and in no log.
(c) **Per fault kind**, the fenced jobs a fault of that kind hit (a fault on a run's
    worker or horse, or on Redis, from the run's start until its outcome could still be
    being written, one lease after its end): their plain effects (and how many jobs got
    more than one), the fenced effects that landed, the fenced writes that committed
    without counting, and those refused. A job hit by two kinds counts in both rows.

Not judged: jobs with a run begun in a Sentinel failover's window (a write on the old
master may be discarded with it, and the take's token with it: at least once), counted
apart. Nothing here depends on timing: the checks hold on a loaded machine as on a quiet
one, and only the table's attribution reads the clock.
"""

from __future__ import annotations

from typing import Any

from .failovercheck import taken_in_window
from .faults import GLOBAL, Fault
from .jobs import Run
from .model import kind_of
from .overlap import run_end
from .verdict import Verdict

#: Fault kinds that hit every run at once (Redis itself), whatever its process.
EVERYONE = GLOBAL | {"restart"}
#: The per-job numbers that the table adds up per fault kind.
COLUMNS = ("jobs", "finished", "plain", "plain_over_one", "landed", "again", "refused", "violations")


def check_effects(ev: Any, v: Verdict) -> None:
    cfg = ev.config
    lease = cfg.worker == "lease"
    stock = set(getattr(ev, "stock_workers", []))
    effects: dict[str, dict[str, Any]] = getattr(ev, "effects", {}) or {}
    total = dict.fromkeys(COLUMNS, 0)
    apart = {"finished_without_lease": 0, "resent": 0, "nolease_runs": 0, "in_failover_windows": 0}
    by_kind: dict[str, dict[str, int]] = {}
    for job_id, planned in ev.jobs.items():
        if kind_of(planned) != "fenced":
            continue
        runs: list[Run] = ev.runs.get(job_id, [])
        if any(taken_in_window(run, ev.faults) for run in runs):
            apart["in_failover_windows"] += 1
            continue
        effect = effects.get(job_id, {})
        counted, writes = effect.get("counted"), [int(t) for t in effect.get("writes", [])]
        finished = ev.final[job_id]["status"] == "finished"
        without_lease = finished and _finished_without_lease(runs, stock)
        problems = effect_problems(runs, counted, writes, finished and not without_lease)
        v.violations += [f"{job_id} (fenced): {problem}" for problem in problems]
        row = {
            "jobs": 1,
            "finished": int(finished),
            "plain": int(effect.get("plain", 0)),
            "plain_over_one": int(effect.get("plain", 0) > 1),
            "landed": int(counted is not None),
            "again": len(writes) - int(counted is not None),
            "refused": sum(1 for run in runs if run.effect == "refused"),
            "violations": int(bool(problems)),
        }
        for kind in sorted(kinds_hitting(runs, ev.faults, lease, cfg.lease_ms / 1000)) or ["none"]:
            _add(by_kind.setdefault(kind, dict.fromkeys(COLUMNS, 0)), row)
        _add(total, row)
        apart["finished_without_lease"] += int(without_lease)
        apart["resent"] += sum(1 for a, b in zip(writes, writes[1:], strict=False) if a == b)
        apart["nolease_runs"] += sum(1 for run in runs if run.effect == "nolease")
    v.counts["fenced_effects"] = {**total, **apart, "by_kind": dict(sorted(by_kind.items()))}


def effect_problems(runs: list[Run], counted: int | None, writes: list[int], must_have: bool) -> list[str]:
    """What is wrong with one fenced job's effect ((a) and (b) of the module's docstring);
    ``must_have``: it finished by a run of ours, so its effect must have landed."""
    problems = []
    if writes and counted != writes[0]:
        what = "no effect counted" if counted is None else f"the effect counted under token {counted}"
        problems.append(f"{what}, yet the first fenced write to commit was token {writes[0]} (log {writes})")
    if counted is not None and not writes:
        problems.append(f"the effect counted under token {counted}, yet no fenced write is in the log")
    counting = [run for run in runs if run.effect == "counted"]
    if len(counting) > 1:
        tokens = ", ".join(str(run.token) for run in counting)
        problems.append(f"{len(counting)} runs' fenced writes each counted the effect (tokens {tokens})")
    problems += [
        f"the run in pid {run.pid} counted the effect under token {run.token}, yet it holds token {counted}"
        for run in counting
        if counted is not None and run.token != counted
    ]
    problems += [
        f"the run in pid {run.pid} saw its fenced write (token {run.token}) commit, yet it is not in the log"
        for run in runs
        if run.effect in ("counted", "again") and run.token not in writes
    ]
    if must_have and counted is None:
        problems.append("finished by a run of ours, yet no fenced effect landed")
    problems += [
        f"a fenced write under token {b} landed after one under token {a}: a replaced holder wrote "
        "after a newer grant"
        for a, b in zip(writes, writes[1:], strict=False)
        if b < a
    ]
    return problems


def _finished_without_lease(runs: list[Run], stock: set[int]) -> bool:
    """The job's last completed run (the one that finished it) had no lease: a stock
    worker's, which writes no fenced effect."""
    completed = [run for run in runs if run.outcome == "ok"]
    return bool(completed) and (completed[-1].ppid in stock or completed[-1].effect == "nolease")


def kinds_hitting(runs: list[Run], faults: list[Fault], lease: bool, lease_s: float) -> set[str]:
    """The kinds of the faults that hit a run of the job: on its worker or horse (or on
    Redis), from its start until one lease after its end (its outcome's patience)."""
    kinds = set()
    for run in runs:
        until = run_end(run, faults, horse_dies_with_worker=lease) + lease_s
        kinds |= {
            f.kind
            for f in faults
            if f.covers(run.started, until) and (f.kind in EVERYONE or f.hit(run.pid) or f.hit(run.ppid))
        }
    return kinds


def _add(into: dict[str, int], row: dict[str, int]) -> None:
    for key, value in row.items():
        into[key] += value
