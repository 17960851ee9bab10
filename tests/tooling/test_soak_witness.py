"""The soak's checks for issue 46's faults, on made-up evidence: a running job enqueued
again, threads in a simple-mode job, a slow DEBUG log handler, worker-only kills. Each
check passes when its invariant holds and fails when it is broken (soak/witnesscheck.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from soak.checks import evaluate
from soak.faults import Fault
from soak.jobs import Run, read_runs
from soak.model import Config, Evidence, Planned
from soak.selffence import read_stops

WORKER, HORSE, OTHER_WORKER, OTHER_HORSE = 100, 101, 200, 201
#: a SimpleLeaseWorker: its run is its own process (the run's pid), its parent the soak
SIMPLE, SIMPLE_TWO, SOAK = 300, 400, 1


def evidence(
    runs: list[Run],
    faults: list[Fault] | None = None,
    body: str = "sleep",
    pushes: list[tuple[float, str]] | None = None,
    queue_violations: list[str] | None = None,
    simple: list[int] | None = None,
    stock: list[int] | None = None,
    self_fenced: list[tuple[int, str]] | None = None,
) -> Evidence:
    """One job ``j`` that finished, the runs given, and what the soak saw."""
    state = {"status": "finished", "attempts": None, "max_attempts": "5", "failure": None, "reason": ""}
    return Evidence(
        config=Config(),
        jobs={"j": Planned("j", 0.1, "ok", 0, body=body)},
        faults=faults or [],
        queue_samples=10,
        queue_violations=queue_violations or [],
        final={"j": state},
        registries={"queued": [], "finished": ["j"], "failed": [], "leases": [], "started": []},
        stats={"taken": len([r for r in runs if r.ppid not in (stock or [])])},
        runs={"j": runs} if runs else {},
        respawns=0,
        drained_in=1.0,
        our_pushes=pushes or [],
        simple_workers=simple or [],
        stock_workers=stock or [],
        self_fenced=self_fenced or [],
    )


def fault(
    kind: str, at: float, worker: int = WORKER, horse: int = HORSE, ended: float | None = None
) -> Fault:
    return Fault(kind, at, "w", worker, [horse], "j", b"token", ended=at if ended is None else ended)


def went_on(verdict: Any) -> list[str]:
    return [text for text in verdict.violations if "went on" in text]


# -- threads in a simple-mode job ------------------------------------------------------


def _threaded_log(tmp_path: Path, second_pid: int, threads_until: float, end: bool) -> list[Run]:
    """A SimpleLeaseWorker's run of ``j`` on threads, begun at 1.0, whose frame unwound
    (``end``: its end line written at 2.0) while its threads wrote on until ``threads_until``;
    a second run begins at 3.0 in ``second_pid``."""
    log = tmp_path / "runs.log"
    lines = [f"start j {SIMPLE} {SOAK} 1.000000 1 0.9 5", f"alive j {SIMPLE} 1.500000 1.000000"]
    lines += [f"end j {SIMPLE} 2.000000 ok"] if end else []
    lines += [f"alive j {SIMPLE} {threads_until:.6f} 1.000000"]
    lines += [f"start j {second_pid} {SOAK} 3.000000 2 2.9 6", f"end j {second_pid} 4.000000 ok"]
    log.write_text("\n".join(lines) + "\n")
    return read_runs(str(log))["j"]


def test_a_thread_of_a_simple_run_that_outlives_its_frame_is_the_run_going_on(tmp_path: Path) -> None:
    runs = _threaded_log(tmp_path, SIMPLE_TWO, threads_until=3.4, end=False)
    assert runs[0].threads_seen == 3.4 and runs[0].ended is None
    stop = [fault("cold_stop", 1.8, SIMPLE, SIMPLE, ended=2.9)]
    verdict = evaluate(evidence(runs, stop, body="pool", simple=[SIMPLE, SIMPLE_TWO]))
    (violation,) = went_on(verdict)
    assert f"pid {SIMPLE} went on 400 ms after pid {SIMPLE_TWO}" in violation
    assert verdict.counts["witness_faults"]["threads"] == {
        "faults": 2,  # two runs of a threaded job in a SimpleLeaseWorker, one of them hit
        "hit": 1,
        "overlaps": 1,
        "lost": 0,
        "false_recoveries": 0,
    }
    assert verdict.counts["witness_faults"]["cold_stop"]["overlaps"] == 1
    # its threads done before the next run began: no overlap
    runs = _threaded_log(tmp_path, SIMPLE_TWO, threads_until=2.9, end=False)
    assert went_on(evaluate(evidence(runs, stop, body="pool", simple=[SIMPLE, SIMPLE_TWO]))) == []


def test_a_thread_that_writes_after_its_runs_end_line_is_the_run_going_on(tmp_path: Path) -> None:
    runs = _threaded_log(tmp_path, SIMPLE_TWO, threads_until=3.25, end=True)
    assert runs[0].ended == 2.0 and runs[0].threads_seen == 3.25
    (violation,) = went_on(evaluate(evidence(runs, body="thread", simple=[SIMPLE, SIMPLE_TWO])))
    assert "went on 250 ms" in violation


def test_threads_of_an_earlier_run_in_the_same_process_overlap_its_next_run(tmp_path: Path) -> None:
    """A SimpleLeaseWorker that lived on after a stop runs the job again itself: one frame
    at a time, but the first run's threads work beside the second."""
    runs = _threaded_log(tmp_path, SIMPLE, threads_until=3.5, end=False)
    assert [r.pid for r in runs] == [SIMPLE, SIMPLE] and runs[0].threads_seen == 3.5
    (violation,) = went_on(evaluate(evidence(runs, body="pool", simple=[SIMPLE])))
    assert f"pid {SIMPLE} went on 500 ms after pid {SIMPLE} began it" in violation
    runs = _threaded_log(tmp_path, SIMPLE, threads_until=2.5, end=False)
    assert went_on(evaluate(evidence(runs, body="pool", simple=[SIMPLE]))) == []


def test_a_thread_line_names_its_run_by_its_start_not_by_pid_alone(tmp_path: Path) -> None:
    log = tmp_path / "runs.log"
    log.write_text(
        f"start j {SIMPLE} {SOAK} 1.000000 1 0.9 5\nend j {SIMPLE} 2.000000 ok\n"
        f"start j {SIMPLE} {SOAK} 3.000000 2 2.9 6\n"
        f"alive j {SIMPLE} 3.500000 3.000000\n"  # the second run's thread, not the first's
        f"end j {SIMPLE} 4.000000 ok\n"
    )
    first, second = read_runs(str(log))["j"]
    assert first.threads_seen is None and second.threads_seen == 3.5


# -- a running job enqueued again ------------------------------------------------------


def _enqueued_again(at: float) -> Fault:
    return Fault(
        "enqueue_again", at, "w", WORKER, [HORSE], "j", b"token", ended=at, detail="enqueue under its id"
    )


def test_a_copy_enqueued_while_its_job_runs_must_wait_for_the_runs_end() -> None:
    """The repeat is the user's (enqueued again), but the copy may start only once the old
    run is over."""
    waited = [
        Run("j", HORSE, WORKER, 1.0, 1, 3.0, "ok"),
        Run("j", OTHER_HORSE, OTHER_WORKER, 3.1, 1, 4.0, "ok"),
    ]
    verdict = evaluate(evidence(waited, [_enqueued_again(2.0)]))
    assert verdict.passed, verdict.violations
    overlapped = [
        Run("j", HORSE, WORKER, 1.0, 1, 3.0, "ok"),
        Run("j", OTHER_HORSE, OTHER_WORKER, 2.1, 1, 4.0, "ok"),
    ]
    verdict = evaluate(evidence(overlapped, [_enqueued_again(2.0)]))
    (violation,) = went_on(verdict)
    assert "went on 900 ms" in violation
    assert verdict.counts["witness_faults"]["enqueue_again"]["overlaps"] == 1
    # without the fault the second run is a duplicate as well
    assert any("no fault explains" in v for v in evaluate(evidence(waited)).violations)


def test_the_copy_queued_while_the_old_run_holds_its_lease_is_the_users_until_it_runs() -> None:
    runs = [
        Run("j", HORSE, WORKER, 1.0, 1, 3.0, "ok"),
        Run("j", OTHER_HORSE, OTHER_WORKER, 3.1, 1, 4.0, "ok"),
    ]
    waiting = ["2.500 j queued while leased"]
    verdict = evaluate(evidence(runs, [_enqueued_again(2.0)], queue_violations=waiting))
    assert verdict.passed, verdict.violations
    assert verdict.counts["enqueued_copies_waiting"] == 1
    # queued while leased with no enqueue again, or after its copy's run began: ours, a failure
    assert not evaluate(
        evidence(runs, [_enqueued_again(2.0)], queue_violations=["3.5 j queued while leased"])
    ).passed
    assert not evaluate(evidence(runs, queue_violations=waiting)).passed
    twice = ["2.500 j twice in the queue"]
    assert not evaluate(evidence(runs, [_enqueued_again(2.0)], queue_violations=twice)).passed


def test_a_stock_neighbour_that_runs_the_copy_at_once_is_stock_rqs_overlap() -> None:
    stock_worker, stock_horse = 500, 501
    runs = [
        Run("j", HORSE, WORKER, 1.0, 1, 3.0, "ok"),
        Run("j", stock_horse, stock_worker, 2.1, None, 4.0, "ok"),
    ]
    verdict = evaluate(evidence(runs, [_enqueued_again(2.0)], stock=[stock_worker]))
    assert went_on(verdict) == [] and verdict.counts["stock_ran_an_enqueued_copy"] == 1
    # one of ours running it beside the old run is no stock credit
    ours = [
        Run("j", HORSE, WORKER, 1.0, 1, 3.0, "ok"),
        Run("j", OTHER_HORSE, OTHER_WORKER, 2.1, 1, 4.0, "ok"),
    ]
    assert went_on(evaluate(evidence(ours, [_enqueued_again(2.0)], stock=[stock_worker])))


def test_one_of_ours_running_the_copy_beside_a_stock_neighbours_run_is_stock_rqs_overlap() -> None:
    """The job ran on a stock neighbour (no lease) when it was enqueued again: nothing holds
    the copy back, and one of ours runs it beside the stock run, as a second stock worker
    would. With no enqueue in between, the same overlap fails."""
    stock_worker, stock_horse = 500, 501
    runs = [
        Run("j", stock_horse, stock_worker, 1.0, None, 4.0, "ok"),
        Run("j", HORSE, WORKER, 2.1, 1, 3.0, "ok"),
    ]
    verdict = evaluate(evidence(runs, [_enqueued_again(2.0)], stock=[stock_worker]))
    assert went_on(verdict) == [] and verdict.counts["stock_ran_an_enqueued_copy"] == 1
    assert went_on(evaluate(evidence(runs, stock=[stock_worker])))


# -- false recoveries, a slow log handler ----------------------------------------------


def _recovered_runs() -> list[Run]:
    """A run cut short at about 2.0 and the job's next run at 3.0; the push between them."""
    first = Run("j", HORSE, WORKER, 1.0, 1, None, None)
    first.last_seen = 2.0
    return [first, Run("j", OTHER_HORSE, OTHER_WORKER, 3.0, 2, 4.0, "ok")]


def test_a_recovery_after_a_worker_only_kill_is_explained_and_one_after_nothing_is_false() -> None:
    pushes = [(2.5, "j")]
    killed = evaluate(evidence(_recovered_runs(), [fault("kill_worker", 1.9)], pushes=pushes))
    assert killed.passed, killed.violations
    assert killed.counts["false_recoveries"] == 0
    nothing = evaluate(evidence(_recovered_runs(), pushes=pushes))
    assert any("a false recovery" in v for v in nothing.violations), nothing.violations
    assert nothing.counts["false_recoveries"] == 1
    # a fault on another worker explains nothing
    elsewhere = evaluate(evidence(_recovered_runs(), [fault("kill_worker", 1.9, 900, 901)], pushes=pushes))
    assert elsewhere.counts["false_recoveries"] == 1


def test_a_recovery_after_a_self_fenced_stop_is_counted_apart_but_not_under_a_slow_log() -> None:
    fenced = [(WORKER, "j")]
    pushes = [(2.5, "j")]
    alone = evaluate(evidence(_recovered_runs(), pushes=pushes, self_fenced=fenced))
    assert alone.counts["false_recoveries"] == 0 and alone.counts["recoveries_after_a_self_fenced_stop"] == 1
    slow = [fault("slow_log", 1.5, ended=6.0)]
    slowed = evaluate(evidence(_recovered_runs(), slow, pushes=pushes, self_fenced=fenced))
    assert slowed.counts["false_recoveries"] == 1
    assert slowed.counts["witness_faults"]["slow_log"]["false_recoveries"] >= 1
    assert not slowed.passed


def test_a_run_cut_short_while_its_workers_log_handler_was_slow_fails_the_soak() -> None:
    slow = [fault("slow_log", 1.5, ended=6.0)]
    verdict = evaluate(evidence(_recovered_runs(), slow))
    assert any("log handler was slow" in v for v in verdict.violations), verdict.violations
    assert verdict.counts["stopped_by_slow_logging"] == 1
    # a kill of its worker as well explains the stop; a run that ended on its own is fine
    killed = evaluate(evidence(_recovered_runs(), [*slow, fault("kill_worker", 1.9)]))
    assert killed.counts["stopped_by_slow_logging"] == 0
    ended = [Run("j", HORSE, WORKER, 1.0, 1, 2.0, "ok")]
    assert evaluate(evidence(ended, slow)).counts["stopped_by_slow_logging"] == 0
    # the producer deleted the job while it ran: RQ ended it, and so the run
    deleted = evidence(_recovered_runs()[:1], slow)
    deleted.jobs["j"].kind, deleted.jobs["j"].acting_since, deleted.jobs["j"].acted_at = "delete", 1.6, 1.7
    assert evaluate(deleted).counts["stopped_by_slow_logging"] == 0


def test_a_worker_only_kill_seen_by_its_watchdog_is_held_to_the_seen_death_bound() -> None:
    cfg = Config()
    runs = [
        Run("j", HORSE, WORKER, 1.0, 1),
        Run("j", OTHER_HORSE, OTHER_WORKER, 5.0, 2, 6.0, "ok"),
    ]

    def back_after(seconds: float, detail: str) -> Any:
        killed = fault("kill_worker", 2.0)
        killed.detail, killed.lapse_at, killed.requeued_at = detail, 2.0, 2.0 + seconds
        return evaluate(evidence(runs, [killed]))

    in_time = back_after(0.3, "watchdog 102")
    assert in_time.passed, in_time.violations
    assert in_time.latency["crash_samples"] == 1
    late = cfg.crash_bound_s + cfg.bound_slack_s + 0.3
    assert any("a seen death (kill_worker)" in v for v in back_after(late, "watchdog 102").violations)
    # no watchdog seen at the kill: the lease's bound, which that time is within
    assert back_after(late, "").passed


# -- a cold stop, and a SimpleLeaseWorker its own watchdog ended -----------------------


def test_a_cold_stop_hands_the_job_back_with_its_attempt_refunded() -> None:
    runs = [
        Run("j", HORSE, WORKER, 1.0, 1, None, None),
        Run("j", OTHER_HORSE, OTHER_WORKER, 3.0, 1, 4.0, "ok"),
    ]
    ev = evidence(runs, [fault("cold_stop", 1.5, ended=2.8)])
    ev.stats["returned"] = 1
    verdict = evaluate(ev)
    assert verdict.passed, verdict.violations
    assert verdict.counts["attempts_refunded_by_a_cold_stop"] == 1
    # the same count read again after a kill is a count that went back
    ev = evidence(runs, [fault("kill_worker", 1.5)])
    ev.stats["returned"] = 1
    assert any("the count went back" in v for v in evaluate(ev).violations)


def test_a_simple_worker_its_own_watchdog_ended_past_the_deadline_is_a_self_fenced_stop(
    tmp_path: Path,
) -> None:
    logs = tmp_path / "workers"
    logs.mkdir()
    (logs / "soak-w3-1.log").write_text(
        f"15:28:50 Worker soak-w3-1: soak: soak.jobs.work(...) (j), attempt 1\n"
        f"rq-emq watchdog 777: run {SIMPLE} past its deadline by 0 ms: ended 1 processes\n"
        f"rq-emq watchdog 777: worker {SIMPLE} is gone: job j back at the front of its queue "
        "(attempt 1 of 5)\n"
    )
    stops = read_stops(logs, {"soak-w3-1": SIMPLE})
    assert stops == [(SIMPLE, "j")]
    runs = [
        Run("j", SIMPLE, SOAK, 1.0, 1, None, None),
        Run("j", OTHER_HORSE, OTHER_WORKER, 3.0, 2, 4.0, "ok"),
    ]
    runs[0].last_seen = 1.9
    crash = Fault("crash", 2.0, "soak-w3-1", SIMPLE, detail="exit status -9", ended=2.0)
    ev = evidence(runs, [crash], simple=[SIMPLE], self_fenced=stops)
    verdict = evaluate(ev)
    assert verdict.passed, verdict.violations
    assert verdict.counts["ended_by_own_watchdog"] == 1
    # with no such line the exit is a crash, which fails the soak
    bare = evaluate(evidence(runs, [crash], simple=[SIMPLE]))
    assert any("crashed" in v for v in bare.violations)
    # and a fork worker's clock line explains no exit of its own: it never ends its worker
    fork = evaluate(evidence(runs, [crash], self_fenced=stops))
    assert any("crashed" in v for v in fork.violations)


def test_a_horse_reaped_after_its_local_deadline_is_a_self_fenced_stop_said_once(tmp_path: Path) -> None:
    """The worker says a stop its watchdog made at the run's deadline as it reaps the horse;
    a stop its clock thread also said is one stop, not two."""
    logs = tmp_path / "workers"
    logs.mkdir()
    reaped = (
        "15:32:40 WARNING [MainThread] rq_emq.lease: job {job}: work horse killed by signal 9 "
        "(SIGKILL) after this worker stopped trusting its lease (the run passed its local lease "
        "deadline); left to the sweep\n"
    )
    clock = "15:32:40 WARNING rq_emq.lease: job {job} on queue soak: local lease clock ran out\n"
    (logs / "soak-w0-1.log").write_text(
        reaped.format(job="a") + clock.format(job="b") + reaped.format(job="b") + reaped.format(job="c") * 2
    )
    assert sorted(read_stops(logs, {"soak-w0-1": WORKER})) == [
        (WORKER, "a"),
        (WORKER, "b"),
        (WORKER, "c"),
        (WORKER, "c"),
    ]


def test_a_copy_enqueued_as_its_run_ended_sits_beside_the_end_registry_until_it_runs() -> None:
    """RQ's enqueue of a job that has just finished leaves it in its finished registry:
    the user's copy, queued beside it, until a run takes it; anything else is no credit."""
    runs = [
        Run("j", HORSE, WORKER, 1.0, 1, 1.9, "ok"),
        Run("j", OTHER_HORSE, OTHER_WORKER, 3.0, 1, 4.0, "ok"),
    ]
    ev = evidence(runs, [_enqueued_again(2.0)])
    ev.conservation = ["2.500 j finished,queued 2.501"]
    assert evaluate(ev).passed, evaluate(ev).violations
    for line in ("3.500 j finished,queued 3.501", "2.500 j failed,finished,queued 2.501"):
        ev.conservation = [line]
        assert any("conservation sample" in v for v in evaluate(ev).violations)
    plain = evidence(runs)
    plain.conservation = ["2.500 j finished,queued 2.501"]
    assert not evaluate(plain).passed


def test_a_cold_stop_that_listed_a_horse_forked_ahead_explains_the_refund() -> None:
    """A LeaseWorker forks its next horse ahead: a cold stop lists it before its start line."""
    runs = [
        Run("j", HORSE, WORKER, 1.5, 1, None, None),
        Run("j", OTHER_HORSE, OTHER_WORKER, 3.0, 1, 4.0, "ok"),
    ]
    ev = evidence(runs, [fault("cold_stop", 1.45, ended=2.7)])
    ev.stats["returned"] = 1
    assert evaluate(ev).passed, evaluate(ev).violations


def test_a_kill_of_a_simple_worker_ends_only_the_run_it_was_running(tmp_path: Path) -> None:
    """A SimpleLeaseWorker's run stopped without an end line, then the process's next run:
    a later kill of that process ended the next run, not the first."""
    runs = [
        Run("j", SIMPLE, SOAK, 1.0, 1, None, None),
        Run("j", OTHER_HORSE, OTHER_WORKER, 2.5, 2, 4.0, "ok"),
    ]
    runs[0].last_seen = 1.5
    other = Run("k", SIMPLE, SOAK, 2.0, 1, None, None)
    ev = evidence(runs, [fault("kill_worker", 3.0, SIMPLE, SIMPLE)], simple=[SIMPLE])
    ev.runs["k"] = [other]
    assert went_on(evaluate(ev)) == []
    # without the process's next run, the kill is the first run's last known moment
    ev.runs.pop("k")
    (violation,) = went_on(evaluate(ev))
    assert "went on 500 ms" in violation


def test_a_simple_worker_that_ended_itself_after_a_stop_of_its_run_is_no_crash() -> None:
    """A SimpleLeaseWorker ends its process once a stop leaves no other proof that its run
    is over (soak/watchers.py notes it on the exit); a fork worker's exit is still a crash."""
    runs = [Run("j", SIMPLE, SOAK, 1.0, 1, 2.0, "ok")]
    ended = Fault(
        "crash", 2.5, "soak-w3-1", SIMPLE, detail="exit status 1; ended itself after a stop of its run"
    )
    verdict = evaluate(evidence(runs, [ended], simple=[SIMPLE]))
    assert verdict.passed, verdict.violations
    assert verdict.counts["simple_workers_ended_after_a_stop"] == 1
    assert any("crashed" in v for v in evaluate(evidence(runs, [ended])).violations)
    bare = Fault("crash", 2.5, "soak-w3-1", SIMPLE, detail="exit status 1")
    assert any("crashed" in v for v in evaluate(evidence(runs, [bare], simple=[SIMPLE])).violations)
