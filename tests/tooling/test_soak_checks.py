"""The soak's verdict, on made-up evidence: each invariant passes when it holds and fails
when it is broken (so a soak that passes means something)."""

from __future__ import annotations

import time
from typing import Any

from soak.checks import evaluate
from soak.faults import Fault
from soak.jobs import Run, read_runs
from soak.model import Config, Evidence, Planned
from soak.selffence import read_stops
from soak.straycopies import read_drops

WORKER, HORSE, OTHER_WORKER, OTHER_HORSE = 100, 101, 200, 201


def evidence(
    runs: list[Run],
    final: dict[str, Any] | None = None,
    faults: list[Fault] | None = None,
    outcome: str = "ok",
    taken: int | None = None,
    worker: str = "lease",
    queue_violations: list[str] | None = None,
    queued: list[str] | None = None,
) -> Evidence:
    state = {"status": "finished", "attempts": None, "max_attempts": "5", "failure": None, "reason": ""}
    state.update(final or {})
    return Evidence(
        config=Config(worker=worker),
        jobs={"j": Planned("j", 0.1, outcome, 0)},
        faults=faults or [],
        queue_samples=10,
        queue_violations=queue_violations or [],
        final={"j": state},
        registries={"queued": queued or [], "finished": ["j"], "failed": [], "leases": [], "started": []},
        stats={"taken": len(runs) if taken is None else taken},
        runs={"j": runs} if runs else {},
        respawns=0,
        drained_in=1.0,
    )


def run(
    attempt: int, started: float, ended: float | None = None, outcome: str | None = None, **pids: int
) -> Run:
    return Run("j", pids.get("pid", HORSE), pids.get("ppid", WORKER), started, attempt, ended, outcome)


def kill(kind: str, at: float, worker: int = WORKER, horse: int = HORSE) -> Fault:
    return Fault(kind, at, "w", worker, [horse], "j", b"token", ended=at)


def test_one_clean_run_passes() -> None:
    verdict = evaluate(evidence([run(1, 1.0, 2.0, "ok")]))
    assert verdict.passed, verdict.violations
    assert verdict.counts["duplicates"] == 0 and verdict.counts["lost"] == 0


def test_a_second_run_with_no_fault_to_explain_it_is_a_duplicate() -> None:
    runs = [run(1, 1.0), run(2, 5.0, 6.0, "ok", pid=OTHER_HORSE, ppid=OTHER_WORKER)]
    verdict = evaluate(evidence(runs))
    assert not verdict.passed and verdict.counts["duplicates"] == 1


def test_a_second_run_after_its_worker_was_killed_is_explained() -> None:
    runs = [run(1, 1.0), run(2, 5.0, 6.0, "ok", pid=OTHER_HORSE, ppid=OTHER_WORKER)]
    verdict = evaluate(evidence(runs, faults=[kill("kill_worker", 2.0)]))
    assert verdict.passed, verdict.violations
    assert verdict.counts["repeated_runs"] == 1 and verdict.counts["duplicates"] == 0


def test_a_run_whose_start_line_follows_the_kill_of_its_worker_is_explained_by_that_kill() -> None:
    """A starved host forked the horse, then the soak killed the worker (listing that
    horse) before the horse logged its start; the watchdog ended it, and the job ran again."""
    runs = [run(1, 2.012), run(2, 4.5, 4.6, "ok", pid=OTHER_HORSE, ppid=OTHER_WORKER)]
    assert evaluate(evidence(runs, faults=[kill("kill_worker", 2.0)])).passed
    # a kill that listed another horse of that worker explains nothing of this late start
    assert not evaluate(evidence(runs, faults=[kill("kill_worker", 2.0, horse=99)])).passed
    # nor does one long over when the run began (its pid since reused)
    late = [run(1, 9.0), run(2, 11.0, 11.1, "ok", pid=OTHER_HORSE, ppid=OTHER_WORKER)]
    assert not evaluate(evidence(late, faults=[kill("kill_worker", 2.0)])).passed


def test_a_short_stop_explains_no_second_run() -> None:
    stop = Fault("stop_short", 2.0, "w", WORKER, [HORSE], "j", b"token", ended=2.5)
    runs = [run(1, 1.0), run(2, 5.0, 6.0, "ok", pid=OTHER_HORSE, ppid=OTHER_WORKER)]
    assert not evaluate(evidence(runs, faults=[stop])).passed


def test_a_fault_on_another_worker_explains_nothing() -> None:
    runs = [run(1, 1.0), run(2, 5.0, 6.0, "ok", pid=OTHER_HORSE, ppid=OTHER_WORKER)]
    assert not evaluate(evidence(runs, faults=[kill("kill_worker", 2.0, worker=999, horse=998)])).passed


def test_a_job_left_unfinished_is_lost() -> None:
    verdict = evaluate(evidence([run(1, 1.0)], final={"status": "queued"}, queued=["j"]))
    assert not verdict.passed and verdict.counts["lost"] == 1


def test_a_job_queued_twice_fails_the_soak() -> None:
    verdict = evaluate(evidence([run(1, 1.0, 2.0, "ok")], queue_violations=["1.0 j twice in the queue"]))
    assert not verdict.passed and verdict.counts["queued_twice"] == 1


def test_a_job_a_stock_neighbours_dequeue_left_in_rqs_intermediate_list_is_stock_rqs_loss() -> None:
    """Only a stock worker's BLMOVE puts a job in RQ's intermediate list: one left there
    (its dequeue's reply lost, or the worker gone before the start) is stock RQ's, which
    fails it a minute later. The same job anywhere else, or with no stock neighbour in
    the fleet, is lost."""
    stranded = evidence([], final={"status": "queued"})
    stranded.registries["intermediate"] = ["j"]
    stranded.stock_workers = [OTHER_WORKER]
    verdict = evaluate(stranded)
    assert verdict.passed, verdict.violations
    assert verdict.counts["lost"] == 0 and verdict.counts["stranded_by_stock_dequeue"] == 1
    stranded.stock_workers = []
    assert evaluate(stranded).counts["lost"] == 1
    in_our_moving_list = evidence([], final={"status": "queued"})
    in_our_moving_list.registries["moving"] = ["j"]
    in_our_moving_list.stock_workers = [OTHER_WORKER]
    verdict = evaluate(in_our_moving_list)
    assert verdict.counts["lost"] == 1 and any("in moving" in v for v in verdict.violations)


def test_a_job_queued_twice_after_a_stock_neighbours_run_is_stock_rqs_double_enqueue() -> None:
    """Stock RQ, frozen while its horse raised, enqueues the job twice on resume (the
    horse's Retry and the worker's "terminated unexpectedly"): the sample credits the stock
    actor when the job's last run before it was the neighbour's; after our run it fails."""
    line = "3.0 j twice in the queue"
    by_stock = evidence([run(1, 1.0, 2.0, "raise", ppid=OTHER_WORKER)], queue_violations=[line])
    by_stock.stock_workers = [OTHER_WORKER]
    verdict = evaluate(by_stock)
    assert verdict.counts["queued_twice"] == 0 and verdict.counts["queued_twice_by_stock"] == 1
    assert not any("queue sample" in v for v in verdict.violations)
    ours = evidence([run(1, 1.0, 2.0, "raise")], queue_violations=[line])
    ours.stock_workers = [OTHER_WORKER]
    verdict = evaluate(ours)
    assert not verdict.passed and verdict.counts["queued_twice"] == 1
    # Redis lost its data later and the producer resubmitted the job: the sample before the
    # loss is still credited by the runs before it
    by_stock.faults, by_stock.resubmitted = [Fault("lose_data", 4.0, ended=5.0)], {"j": 4.0}
    by_stock.stats["taken"] = 0
    verdict = evaluate(by_stock)
    assert verdict.counts["queued_twice_by_stock"] == 1, verdict.violations
    assert not any("queue sample" in v for v in verdict.violations)
    # a stock run that began after the sample is no double enqueue of stock RQ's: a copy
    # RQ's own client pushed, which the stock neighbour ran (soak/straycopies.py), but not
    # when one of our scripts had pushed the job since its run before the sample
    later = evidence(
        [run(1, 1.0, 2.0, "raise"), run(2, 4.0, 5.0, "ok", ppid=OTHER_WORKER)], queue_violations=[line]
    )
    later.stock_workers = [OTHER_WORKER]
    verdict = evaluate(later)
    assert verdict.counts["queued_twice"] == 0 and verdict.counts["stray_copies_seen"] == 1
    later.our_pushes = [(2.5, "j")]
    assert evaluate(later).counts["queued_twice"] == 1


def test_a_stock_neighbours_run_of_the_copy_its_own_double_enqueue_made_is_stock_rqs() -> None:
    """Stock RQ enqueued its run's job twice; ours took one copy and a stock neighbour,
    which pops without a lease, ran the other at the same time: stock RQ's repeat and
    overlap. The same copy run by one of ours, or a stock run with no such sample before
    it, still fails the soak."""
    line = "3.0 j twice in the queue"
    runs = [
        run(1, 1.0, 2.0, "raise", ppid=OTHER_WORKER),  # the stock run whose end it handled twice
        run(2, 3.1, 6.0, "ok"),  # ours, from one copy
        run(3, 3.2, 4.0, "ok", pid=OTHER_HORSE + 1, ppid=OTHER_WORKER),  # stock's, from the other
    ]
    ev = evidence(runs, queue_violations=[line], taken=1)
    ev.stock_workers = [OTHER_WORKER]
    verdict = evaluate(ev)
    assert verdict.counts["stock_ran_its_duplicate"] == 1 and verdict.counts["duplicates"] == 0
    assert not any("went on" in v or "no fault explains" in v for v in verdict.violations), verdict.violations
    for other in ([], ["9.0 j twice in the queue"]):  # no sample, or one after the stock run began
        ev = evidence(runs, queue_violations=other, taken=1)
        ev.stock_workers = [OTHER_WORKER]
        assert any("went on" in v for v in evaluate(ev).violations)
    ours = [runs[0], runs[1], run(3, 3.2, 4.0, "ok", pid=OTHER_HORSE + 1, ppid=WORKER + 1)]
    ev = evidence(ours, queue_violations=[line], taken=2)
    ev.stock_workers = [OTHER_WORKER]
    assert any("went on" in v for v in evaluate(ev).violations)


def test_a_stray_copy_that_one_of_ours_dropped_is_rqs_and_one_that_ours_ran_fails_the_soak(
    tmp_path: Any,
) -> None:
    """RQ's own clients push a job again after a lost reply (its scheduler through a cut
    connection, its fan-in dependents race, both seen in short soaks): the sample that
    saw the copy is counted apart when one of ours logged dropping it (read from the
    worker's log); a copy that one of ours ran is a duplicate; a stock neighbour's run of
    it is stock RQ's, unless one of our scripts had pushed the job since its last run."""
    line = "3.0 j twice in the queue"
    log = tmp_path / "soak-w0-1.log"
    log.write_text(
        "17:19:03 job j was in one of queues soak but its hash is gone, or the entry is a stray copy "
        "(the job runs under a live lease, or has left every queue); skipped\n"
        "17:19:04 job k was moved from queue soak but the entry is a stray copy (the job runs under "
        "a live lease, or has left every queue); skipped\n"
    )
    drops = read_drops(tmp_path, {"soak-w0-1": WORKER})
    assert drops == [(WORKER, "j"), (WORKER, "k")]
    dropped = evidence([run(1, 1.0, 2.0, "ok")], queue_violations=[line])
    dropped.stray_drops = drops
    verdict = evaluate(dropped)
    assert verdict.passed, verdict.violations
    assert verdict.counts["stray_copies_seen"] == 1 and verdict.counts["stray_copies_dropped"] == 2
    # ours ran the copy: a duplicate, and the sample stands too
    ran = evidence([run(1, 1.0, 2.0, "ok"), run(1, 3.5, 4.0, "ok")], queue_violations=[line], taken=2)
    verdict = evaluate(ran)
    assert any("no fault explains" in v for v in verdict.violations)
    assert any("queue sample" in v for v in verdict.violations)
    # a stock neighbour ran it: stock RQ's way with any copy, unless the copy may be ours
    stock_run = run(0, 3.5, 4.0, "ok", pid=OTHER_HORSE, ppid=OTHER_WORKER)
    by_stock = evidence([run(1, 1.0, 2.0, "ok"), stock_run], queue_violations=[line], taken=1)
    by_stock.stock_workers = [OTHER_WORKER]
    verdict = evaluate(by_stock)
    assert verdict.passed, verdict.violations
    by_stock.our_pushes = [(2.5, "j")]
    verdict = evaluate(by_stock)
    assert any("queue sample" in v for v in verdict.violations)
    assert any("no fault explains" in v for v in verdict.violations)


def test_attempts_that_go_back_after_a_stall_fail_the_soak() -> None:
    runs = [run(2, 1.0), run(1, 5.0, 6.0, "ok", pid=OTHER_HORSE, ppid=OTHER_WORKER)]
    verdict = evaluate(evidence(runs, faults=[kill("kill_worker", 2.0)], taken=2))
    assert any("went back" in v for v in verdict.violations)


def test_two_runs_reading_one_count_pass_only_when_one_runs_worker_stopped_it_on_its_clock() -> None:
    """A horse the host starved between its start and the job function begins after its
    lease lapsed and the job was taken again: it reads the next holder's count, and its
    worker's clock stops it (its log says so). That pair is one count read twice; the
    same pair with no such line, or a line about another job, still fails."""
    runs = [run(2, 1.0), run(2, 1.2, 2.0, "ok", pid=OTHER_HORSE, ppid=OTHER_WORKER)]

    def judged(stops: list[tuple[int, str]]) -> Any:
        ev = evidence(runs, taken=2)
        ev.self_fenced = stops
        return evaluate(ev)

    verdict = judged([(WORKER, "j")])
    assert verdict.passed, verdict.violations
    assert verdict.counts["attempts_read_after_a_self_fenced_stop"] == 1
    for stops in ([], [(WORKER, "other-job")], [(300, "j")]):
        assert any("went back" in v for v in judged(stops).violations), stops


def test_attempts_start_over_after_a_retry() -> None:
    runs = [run(1, 1.0, 1.5, "raise"), run(1, 2.0, 3.0, "ok", pid=OTHER_HORSE)]
    verdict = evaluate(evidence(runs, outcome="flaky", taken=2))
    assert verdict.passed, verdict.violations


def test_takes_redis_counted_that_no_run_accounts_for_fail_the_soak() -> None:
    verdict = evaluate(evidence([run(1, 1.0, 2.0, "ok")], taken=2))
    assert any("takes" in v for v in verdict.violations)


def test_a_finished_job_still_holding_attempts_fails_the_soak() -> None:
    verdict = evaluate(evidence([run(1, 1.0, 2.0, "ok")], final={"attempts": "1"}))
    assert not verdict.passed


def test_failed_at_max_attempts_must_hold_its_max_and_say_so() -> None:
    runs = [run(k, float(k)) for k in (1, 2)]
    faults = [kill("kill_worker", 1.5), kill("kill_worker", 2.5)]
    stalled = {
        "status": "failed",
        "attempts": None,
        "max_attempts": "2",
        "failure": "stalled on attempt 2 of 2",
        "reason": "JobStalled: job j stalled on attempt 2 of 2 (its worker died or lost its lease)",
    }
    assert evaluate(evidence(runs, final=stalled, faults=faults)).passed
    still_counting = dict(stalled, attempts="2")
    assert not evaluate(evidence(runs, final=still_counting, faults=faults)).passed
    wrong = dict(stalled, failure="stalled on attempt 1 of 2")
    assert not evaluate(evidence(runs, final=wrong, faults=faults)).passed
    no_result = dict(stalled, reason="")
    assert not evaluate(evidence(runs, final=no_result, faults=faults)).passed


def test_a_failed_job_whose_run_completed_failed_while_running() -> None:
    final = {"status": "failed", "reason": "AbandonedJobError"}
    verdict = evaluate(evidence([run(1, 1.0, 2.0, "ok")], final=final, worker="stock"))
    assert verdict.counts["failed_while_running"] == 1
    assert verdict.passed  # the stock baseline is reported, never failed on


def test_the_side_effect_log_pairs_starts_with_ends_by_pid(tmp_path: Any) -> None:
    log = tmp_path / "runs.log"
    log.write_text(
        "start j 11 10 1.0 1\nstart j 21 20 2.0 2\nend j 21 3.0 ok\nstart k 31 30 1.5 -\nend j 11 4.0 raise\n"
    )
    runs = read_runs(str(log))
    assert [(r.pid, r.attempt, r.outcome) for r in runs["j"]] == [(11, 1, "raise"), (21, 2, "ok")]
    assert runs["k"][0].attempt is None and runs["k"][0].ended is None


def test_a_worker_that_crashes_after_only_a_short_fault_fails_the_soak() -> None:
    crash = Fault("crash", 3.0, "w", WORKER, ended=3.0, detail="exit status 1")
    short_cut = Fault("cut_short", 2.0, "w", WORKER, [HORSE], ended=2.5)
    runs = [run(1, 1.0), run(2, 5.0, 6.0, "ok", pid=OTHER_HORSE, ppid=OTHER_WORKER)]
    assert not evaluate(evidence(runs, faults=[short_cut, crash])).passed
    long_cut = Fault("cut_long", 2.0, "w", WORKER, [HORSE], ended=6.0)
    assert evaluate(evidence(runs, faults=[long_cut, crash])).passed


def test_failed_at_max_attempts_after_a_completed_run_needs_its_holder_cut_off() -> None:
    stalled = {
        "status": "failed",
        "max_attempts": "1",
        "failure": "stalled on attempt 1 of 1",
        "reason": "JobStalled: job j stalled on attempt 1 of 1 (its worker died or lost its lease)",
    }
    runs = [run(1, 1.0, 2.0, "ok")]
    assert not evaluate(evidence(runs, final=stalled)).passed
    cut = Fault("cut_long", 1.5, "w", WORKER, [HORSE], "j", b"token", ended=6.0)
    verdict = evaluate(evidence(runs, final=stalled, faults=[cut]))
    assert verdict.passed, verdict.violations
    assert verdict.counts["failed_while_running"] == 1


def test_a_kill_after_the_job_returned_but_before_its_outcome_was_written_explains_the_failure() -> None:
    # the job function has returned (its end line) and the horse is writing the outcome
    # when the kill lands: to RQ and to us the run never completed, so its one attempt is spent
    crashed = {
        "status": "failed",
        "max_attempts": "1",
        "failure": "work horse killed by signal 9 (SIGKILL) on attempt 1 of 1",
        "reason": "JobStalled: job j ...",
        "ended_at": 2.3,
    }
    runs = [run(1, 1.0, 2.0, "ok")]
    verdict = evaluate(evidence(runs, final=crashed, faults=[kill("oom_horse", 2.01)]))
    assert verdict.passed, verdict.violations
    # a kill after the job was failed, or past the finish's patience (one lease), explains nothing
    late = evaluate(evidence(runs, final=crashed, faults=[kill("oom_horse", 2.5)]))
    assert not late.passed and "failed, although a run of it completed" in late.violations[0]
    patient = dict(crashed, ended_at=None, failure="stalled on attempt 1 of 1")
    assert evaluate(evidence(runs, final=patient, faults=[kill("kill_worker", 3.4)])).passed
    assert not evaluate(evidence(runs, final=patient, faults=[kill("kill_worker", 3.6)])).passed


def test_a_horse_held_back_by_a_long_stop_that_starts_late_is_a_stale_run() -> None:
    # attempt 2 was taken by WORKER, whose horse a long stop froze before the job began;
    # attempt 3 ran elsewhere and finished; the frozen horse then began, reading no count
    stop = Fault("stop_long", 2.0, "w", WORKER, [HORSE], None, None, ended=6.0)
    kill = Fault("kill_worker", 1.5, "w", 300, [301], "j", b"t", ended=1.5)
    runs = [
        run(1, 1.0, pid=301, ppid=300),
        run(3, 4.0, 5.0, "ok", pid=OTHER_HORSE, ppid=OTHER_WORKER),
        Run("j", HORSE, WORKER, 6.01, None),
    ]
    verdict = evaluate(evidence(runs, faults=[kill, stop], taken=3))
    assert verdict.passed, verdict.violations
    assert verdict.counts["stale_runs"] == 1 and verdict.counts["takes_never_started"] == 1
    # the same late start with no stop to explain it is a violation
    assert not evaluate(evidence(runs, faults=[kill], taken=3)).passed


def test_a_horse_killed_before_its_job_began_costs_an_attempt_that_its_next_run_counts() -> None:
    """Its lease worker recovers the job at once, attempt counted (no RQ failure to start
    the count over): the next run is attempt 2, and that skipped take is the killed one."""
    killed = Fault("kill_horse", 1.0, "soak-w0-1", WORKER, [HORSE], None, None, ended=1.0)
    after = [run(2, 2.0, 3.0, "ok", pid=OTHER_HORSE)]
    verdict = evaluate(evidence(after, faults=[killed], taken=2))
    assert verdict.passed, verdict.violations
    assert verdict.counts["takes_never_started"] == 1
    # a count started over (as RQ's failure of the job would) does not add up
    assert not evaluate(evidence([run(1, 2.0, 3.0, "ok", pid=OTHER_HORSE)], faults=[killed], taken=2)).passed


def test_a_job_whose_horses_the_soak_killed_may_fail_at_max_attempts_naming_sigkill() -> None:
    horses = [HORSE + 10 * i for i in range(5)]
    runs = [run(i + 1, float(i), None, pid=pid) for i, pid in enumerate(horses)]
    faults = [
        Fault("oom_horse", i + 0.5, "w", WORKER, [pid], "j", b"t", ended=i + 0.5)
        for i, pid in enumerate(horses)
    ]
    cause = "work horse killed by signal 9 (SIGKILL; the OOM killer sends this)"
    final = {
        "status": "failed",
        "failure": f"{cause} on each of 5 attempts",
        "reason": "JobStalled: job j ...",
    }
    verdict = evaluate(evidence(runs, final=final, faults=faults, taken=5))
    assert verdict.passed, verdict.violations
    # the same failure with no horse of its killed by the soak is a finding
    assert not evaluate(evidence(runs, final=final, faults=[], taken=5)).passed


def test_a_simple_workers_run_its_own_watchdog_ended_may_fail_at_max_attempts() -> None:
    """A SimpleLeaseWorker whose job held the GIL past the lease renews nothing: its
    watchdog ends the worker at the run's deadline (its line read into ``self_fenced``) and
    recovers the lease as a seen death, failing a job at its max. No fault of the soak's
    explains it; the watchdog's own line does, and nothing else may."""
    runs = [run(1, 1.0, None, pid=WORKER, ppid=1)]
    final = {
        "status": "failed",
        "failure": f"worker pid {WORKER} died (seen by its watchdog) on attempt 1 of 1",
        "max_attempts": "1",
        "reason": "JobStalled: job j ...",
    }
    ev = evidence(runs, final=final, taken=1, worker="lease")
    ev.jobs["j"] = Planned("j", 2.9, "ok", 0, max_attempts=1)
    ev.self_fenced = [(WORKER, "j")]
    verdict = evaluate(ev)
    assert verdict.passed, verdict.violations
    ev.self_fenced = [(OTHER_WORKER, "j")]  # another process's stop explains nothing here
    assert any("seen by its watchdog" in v for v in evaluate(ev).violations)


def test_a_job_without_its_own_max_may_fail_at_the_workers_default() -> None:
    runs = [run(i + 1, float(i), None, pid=HORSE + 10 * i) for i in range(5)]
    faults = [kill("kill_group", i + 0.5, horse=HORSE + 10 * i) for i in range(5)]
    final = {
        "status": "failed",
        "failure": "stalled on attempt 5 of 5",
        "max_attempts": None,
        "reason": "JobStalled",
    }
    verdict = evaluate(evidence(runs, final=final, faults=faults, taken=5))
    assert verdict.passed, verdict.violations
    assert not evaluate(
        evidence(runs, final=dict(final, failure="stalled on attempt 4 of 4"), faults=faults)
    ).passed


def _crash(at: float, back_after: float, slot: str = "w") -> Fault:
    fault = Fault("oom_horse", at, slot, WORKER, [HORSE], "j", b"token", ended=at)
    fault.lapse_at, fault.requeued_at = at, at + back_after
    return fault


def test_a_horse_crash_must_be_back_within_the_crash_bound_not_the_lease_bound() -> None:
    cfg = Config()
    runs = [run(1, 1.0), run(2, 1.2, 2.0, "ok", pid=OTHER_HORSE)]
    assert evaluate(evidence(runs, faults=[_crash(1.1, 0.05)])).passed
    slow = evaluate(evidence(runs, faults=[_crash(1.1, cfg.crash_bound_s + cfg.bound_slack_s + 0.5)]))
    assert any("a horse crash" in v for v in slow.violations), slow.violations
    # its own worker killed before the job was back: the sweep's, within the lease bound
    late = _crash(1.1, cfg.crash_bound_s + cfg.bound_slack_s + 0.5)
    worker_killed = Fault("kill_worker", 1.15, "w", WORKER, [HORSE], "j", b"token", ended=1.15)
    assert not any(
        "a horse crash" in v for v in evaluate(evidence(runs, faults=[late, worker_killed])).violations
    )


def test_runs_of_a_job_the_soak_never_enqueued_fail_it() -> None:
    ev = evidence([run(1, 1.0, 2.0, "ok")])
    ev.runs["stranger"] = [Run("stranger", OTHER_HORSE, OTHER_WORKER, 3.0, 1, 3.5, "ok")]
    verdict = evaluate(ev)
    assert not verdict.passed
    assert any("never enqueued" in v for v in verdict.violations)


def test_a_kill_before_the_run_or_after_its_repeat_explains_nothing() -> None:
    runs = [run(1, 1.0), run(2, 5.0, 6.0, "ok", pid=OTHER_HORSE, ppid=OTHER_WORKER)]

    def unexplained(faults: list[Fault]) -> list[str]:
        # the repeat check's own verdict (a kill after the repeat began also makes the
        # runs overlap, which the overlap check reports on its own)
        return [v for v in evaluate(evidence(runs, faults=faults)).violations if "no fault explains" in v]

    # the same worker had a horse killed before this run began: that fault is over
    earlier = Fault("kill_horse", 0.2, "w", WORKER, [99], "other", b"t", ended=0.2)
    assert unexplained([earlier])
    # a kill after the repeat had started cannot have caused it
    assert unexplained([kill("kill_worker", 5.5)])
    # while the run was going, it does
    assert not unexplained([kill("kill_worker", 2.0)])
    assert evaluate(evidence(runs, faults=[kill("kill_worker", 2.0)])).passed


def _lapse(kind: str, at: float, back_after: float | None, detail: str = "") -> Fault:
    fault = kill(kind, at)
    fault.lapse_at = at + 1.0
    fault.requeued_at = None if back_after is None else at + back_after
    fault.detail = detail
    return fault


def _recovered(fault: Fault, slack: float | None = None) -> Any:
    runs = [run(1, 1.0), run(2, 20.0, 21.0, "ok", pid=OTHER_HORSE, ppid=OTHER_WORKER)]
    ev = evidence(runs, faults=[fault])
    if slack is not None:
        ev.config.bound_slack_s = slack
    return evaluate(ev)


def test_a_recovery_slower_than_the_bound_and_its_slack_fails_the_soak() -> None:
    bound = Config().bound_s  # lease + 2 sweeps: 2.5 s by default
    slack = Config().bound_slack_s
    assert slack < bound  # a stated slack, not a second bound
    on_time = _recovered(_lapse("kill_worker", 2.0, bound - 0.1))
    assert on_time.passed, on_time.violations
    assert on_time.latency["over_bound"] == 0 and on_time.latency["samples"] == 1
    within_slack = _recovered(_lapse("kill_worker", 2.0, bound + slack - 0.1))
    assert within_slack.passed, within_slack.violations
    late = _recovered(_lapse("kill_worker", 2.0, bound + slack + 0.1))
    assert not late.passed and late.latency["over_bound"] == 1
    assert any("bound" in v for v in late.violations)
    assert not _recovered(_lapse("stop_long", 2.0, 498.0)).passed
    # the slack is a setting: none at all holds the soak to the promise itself
    assert not _recovered(_lapse("kill_worker", 2.0, bound + 0.1), slack=0.0).passed


def test_a_recovery_while_another_worker_was_hit_too_is_held_to_the_double_failure_bound() -> None:
    """The sweeper and its deputy hit together (one crashed host): a standby of the line
    takes over within hold + a line wait, so the job's bound is that plus 2 sweeps; a
    fault with no other worker hit near it keeps the single bound."""
    cfg = Config()
    assert cfg.double_bound_s > cfg.bound_s
    late_for_one = cfg.bound_s + cfg.bound_slack_s + 0.5
    assert late_for_one < cfg.double_bound_s + cfg.bound_slack_s
    alone = _lapse("kill_worker", 10.0, late_for_one)
    assert not evaluate(evidence([run(1, 1.0)], faults=[alone])).passed
    neighbour = Fault("kill_worker", 9.5, "other", OTHER_WORKER, [OTHER_HORSE], "k", None, ended=9.5)
    hit_together = _lapse("kill_worker", 10.0, late_for_one)
    verdict = evaluate(evidence([run(1, 1.0)], faults=[hit_together, neighbour]))
    assert verdict.passed, verdict.violations
    # long ago (more than 1.5 leases + a lease before): not the same crash
    earlier = Fault("kill_worker", 10.0 - 4 * cfg.lease_ms / 1000, "other", OTHER_WORKER, [], "k", None)
    alone_again = _lapse("kill_worker", 10.0, late_for_one)
    assert not evaluate(evidence([run(1, 1.0)], faults=[alone_again, earlier])).passed
    too_late = _lapse("kill_worker", 10.0, cfg.double_bound_s + cfg.bound_slack_s + 0.1)
    late = evaluate(evidence([run(1, 1.0)], faults=[too_late, neighbour]))
    assert not late.passed and any("another worker hit too" in v for v in late.violations)


def test_a_recovery_after_every_worker_was_hit_at_once_is_bounded_from_the_first_ones_return() -> None:
    """Nobody sweeps while every worker is stopped, cut off or killed at once (in one soak:
    the victim partitioned, then the other three stopped until 5.7-6.6 s after it, the job
    back 7.0 s after its fault): the bound counts from the end of that outage, hold + a line
    wait + 2 sweeps; one worker left free keeps the bound counted from the fault."""
    cfg = Config()
    assert cfg.workers == 4
    double = cfg.double_bound_s + cfg.bound_slack_s

    def outage(back_after_end: float, free: bool = False) -> Any:
        victim = Fault("partition_long", 10.0, "soak-w1-2", WORKER, [HORSE], "j", b"t", ended=14.6)
        victim.lapse_at, victim.requeued_at = 11.3, 16.0 + back_after_end
        others = [
            Fault("stop_worker", 11.8, "soak-w3-2", 300, [301], "k", b"t", ended=16.0),
            Fault("stop_long", 12.0, "soak-w0-2", 400, [401], "m", b"t", ended=16.5),
            # a killed worker's place is hit for a lease after the kill (its roles lapse)
            Fault("kill_worker", 12.4, "soak-w2-1", 500, [501], "n", b"t", ended=12.4),
            Fault("stop_worker", 13.5, "soak-w2-2", 600, [601], "p", b"t", ended=16.6),
        ]
        if free:  # place w2 neither killed nor stopped until 15.0: it could sweep meanwhile
            others[-2:] = [Fault("stop_worker", 15.0, "soak-w2-1", 600, [601], "p", b"t", ended=16.6)]
        # the last span with every place hit ends when the victim's partition heals, 14.6
        return evaluate(evidence([run(1, 1.0)], faults=[victim, *others]))

    assert 14.6 - 10.0 + double - 0.3 > double  # later than the bound from the fault itself
    on_time = outage(double - 0.3 - (16.0 - 14.6))
    assert on_time.passed, on_time.violations
    late = outage(double + 0.2 - (16.0 - 14.6))
    assert not late.passed and any("outage of every worker" in v for v in late.violations)
    # one place free in it: the bound counts from the fault, and the same return is late
    assert not outage(double - 0.3 - (16.0 - 14.6), free=True).passed


def test_a_fault_whose_job_never_came_back_fails_the_soak() -> None:
    never = _recovered(_lapse("kill_group", 2.0, None))
    assert not never.passed and never.latency["not_seen"] == 1
    assert any("never left its holder" in v for v in never.violations)
    # the holder finished the job just as the fault began: its lease never lapsed
    finished = _recovered(_lapse("kill_group", 2.0, None, detail=" finished by its holder (no lapse)!"))
    assert finished.passed, finished.violations


# -- RQ's lifecycle in the mix: dependents, cancels, deletes, result_ttl=0, scheduled jobs --


def _state(status: str | None) -> dict[str, Any]:
    reason = "ValueError: soak: raised as planned" if status == "failed" else ""
    return {"status": status, "attempts": None, "max_attempts": "5", "failure": None, "reason": reason}


def mix(
    jobs: list[Planned],
    final: dict[str, str | None],
    runs: list[Run],
    faults: list[Fault] | None = None,
    places: dict[str, list[str]] | None = None,
    scheduler_deaths: int = 0,
) -> Evidence:
    by_job: dict[str, list[Run]] = {}
    for r in sorted(runs, key=lambda r: r.started):
        by_job.setdefault(r.job_id, []).append(r)
    registries: dict[str, list[str]] = {
        "queued": [],
        "finished": [],
        "failed": [],
        "leases": [],
        "started": [],
    }
    for job_id, status in final.items():
        if status in ("finished", "failed"):
            registries[status].append(job_id)
    for name, ids in (places or {}).items():
        registries[name] = registries[name] + ids
    return Evidence(
        config=Config(),
        jobs={j.job_id: j for j in jobs},
        faults=faults or [],
        queue_samples=10,
        queue_violations=[],
        final={j: _state(s) for j, s in final.items()},
        registries=registries,
        stats={"taken": len(runs)},
        runs=by_job,
        respawns=0,
        drained_in=1.0,
        scheduler_deaths=scheduler_deaths,
    )


def job_run(
    job_id: str, started: float, ended: float | None, outcome: str | None = "ok", pid: int = HORSE, **kw: Any
) -> Run:
    r = Run(job_id, pid, kw.get("ppid", WORKER), started, kw.get("attempt", 1), ended, outcome)
    r.rq_started = kw.get("rq_started", started - 0.01)
    return r


def planned(job_id: str, kind: str, outcome: str = "ok", **fields: Any) -> Planned:
    return Planned(job_id, 1.0, outcome, 0, kind=kind, **fields)


def test_a_job_canceled_while_it_runs_ends_canceled_and_its_run_may_finish() -> None:
    job = planned("c", "cancel", acted_at=2.0, acted_on="started")
    verdict = evaluate(mix([job], {"c": "canceled"}, [job_run("c", 1.0, 3.0)]))
    assert verdict.passed, verdict.violations
    assert verdict.counts["lost"] == 0 and verdict.counts["acted"]["cancel"] == 1


def test_a_canceled_job_that_starts_after_the_cancel_fails_the_soak() -> None:
    job = planned("c", "cancel", acted_at=2.0, acted_on="queued")
    verdict = evaluate(mix([job], {"c": "canceled"}, [job_run("c", 2.5, 3.0, rq_started=2.4)]))
    assert any("after it was canceled" in v for v in verdict.violations)
    # the start RQ committed before the cancel returned may reach the job function after it
    late_call = evaluate(mix([job], {"c": "canceled"}, [job_run("c", 2.05, 3.0, rq_started=1.99)]))
    assert late_call.passed, late_call.violations


def test_a_canceled_job_that_a_late_outcome_finished_fails_the_soak() -> None:
    job = planned("c", "cancel", acted_at=2.0, acted_on="started")
    verdict = evaluate(mix([job], {"c": "finished"}, [job_run("c", 1.0, 3.0)]))
    assert any("yet ended finished" in v for v in verdict.violations)


def test_a_deleted_job_has_no_hash_and_sits_nowhere() -> None:
    job = planned("d", "delete", acted_at=2.0, acted_on="started")
    assert evaluate(mix([job], {"d": None}, [job_run("d", 1.0, 3.0)])).passed
    rewritten = evaluate(mix([job], {"d": "finished"}, [job_run("d", 1.0, 3.0)]))
    assert any("deleted" in v and "ended finished" in v for v in rewritten.violations)
    leased = evaluate(mix([job], {"d": None}, [job_run("d", 1.0, 3.0)], places={"leases": ["d"]}))
    assert any("still in leases" in v for v in leased.violations)
    restarted = evaluate(
        mix([job], {"d": None}, [job_run("d", 1.0, 1.5), job_run("d", 2.2, 3.0, pid=OTHER_HORSE)])
    )
    assert any("after it was deleted" in v for v in restarted.violations)


def test_a_job_the_producer_never_got_to_is_judged_as_an_ordinary_job() -> None:
    job = planned("c", "cancel")  # acted_at None: the soak ended first
    assert not evaluate(mix([job], {"c": "queued"}, [])).passed  # lost, as any job


def chain(allow_failure: bool = False, parent_outcome: str = "ok") -> list[Planned]:
    return [
        planned("a", "parent", parent_outcome),
        planned("b", "dependent", parents=["a"], allow_failure=allow_failure),
    ]


def test_a_dependent_runs_once_after_its_parent_ended() -> None:
    runs = [job_run("a", 1.0, 2.0), job_run("b", 2.5, 3.0, pid=OTHER_HORSE)]
    verdict = evaluate(mix(chain(), {"a": "finished", "b": "finished"}, runs))
    assert verdict.passed, verdict.violations


def test_a_dependent_that_starts_before_its_parent_ended_fails_the_soak() -> None:
    runs = [job_run("a", 1.0, 2.0), job_run("b", 1.5, 1.8, pid=OTHER_HORSE)]
    verdict = evaluate(mix(chain(), {"a": "finished", "b": "finished"}, runs))
    assert any("before its parent a ended" in v for v in verdict.violations)


def test_a_parent_run_a_fault_held_back_may_end_after_its_dependent_started() -> None:
    # a's first run was stopped past the grace, recovered, run again and finished; b ran;
    # then the stopped horse woke and wrote its end
    stop = Fault("stop_long", 1.2, "w", WORKER, [HORSE], "a", b"t", ended=6.0)
    runs = [
        job_run("a", 1.0, 6.1),
        job_run("a", 4.0, 4.5, pid=OTHER_HORSE, ppid=OTHER_WORKER, attempt=2),
        job_run("b", 5.0, 5.5, pid=OTHER_HORSE, ppid=OTHER_WORKER),
    ]
    verdict = evaluate(mix(chain(), {"a": "finished", "b": "finished"}, runs, faults=[stop]))
    assert verdict.passed, verdict.violations
    assert not evaluate(mix(chain(), {"a": "finished", "b": "finished"}, runs)).passed


def test_a_dependent_that_runs_twice_with_no_fault_fails_the_soak() -> None:
    runs = [
        job_run("a", 1.0, 2.0),
        job_run("b", 2.5, 3.0, pid=OTHER_HORSE),
        job_run("b", 3.5, 4.0, pid=OTHER_HORSE + 1),
    ]
    verdict = evaluate(mix(chain(), {"a": "finished", "b": "finished"}, runs))
    assert any("(dependent): ran again" in v for v in verdict.violations)


def test_a_fan_in_dependents_copy_run_by_a_stock_neighbour_beside_ours_is_stock_rqs() -> None:
    """Two parents ended together and RQ 3's fan-in race enqueued their dependent twice
    (samples saw it twice in the queue): ours ran one copy under its lease while a stock
    neighbour, which pops without one, ran the other (stress soak seed 1, kept). The repeat
    and the overlap are stock RQ's, for the dependent check too; the same second run by one
    of ours fails the soak, and so does a stock run with no such sample before it."""
    jobs = [
        planned("a", "parent"),
        planned("a2", "parent", "raise"),
        planned("b", "dependent", parents=["a", "a2"], allow_failure=True),
    ]
    final = {"a": "finished", "a2": "failed", "b": "finished"}

    def judged(second_by: int, samples: list[str]) -> list[str]:
        ours = second_by != OTHER_WORKER
        runs = [
            job_run("a", 1.0, 2.0),
            job_run("a2", 1.5, 2.0, "raise", pid=HORSE + 10),
            job_run("b", 3.0, 3.2, pid=HORSE + 20),  # ours, one copy
            # the other copy: a stock run reads no attempt and takes nothing of ours
            job_run("b", 3.01, 3.15, pid=OTHER_HORSE, ppid=second_by, attempt=1 if ours else None),
        ]
        ev = mix(jobs, final, runs)
        ev.stats["taken"] = 4 if ours else 3
        ev.stock_workers = [OTHER_WORKER]
        ev.queue_violations = samples
        return evaluate(ev).violations

    seen = ["2.5 b twice in the queue"]
    assert judged(OTHER_WORKER, seen) == []
    assert any("went on" in v for v in judged(WORKER + 1, seen))  # one of ours ran the copy
    assert any("(dependent): ran again" in v for v in judged(WORKER + 1, seen))
    assert any("went on" in v for v in judged(OTHER_WORKER, []))  # no sample saw a copy


def test_a_dependent_of_a_failed_parent_stays_deferred_unless_failure_is_allowed() -> None:
    runs = [job_run("a", 1.0, 2.0, "raise")]
    deferred = {"a": "failed", "b": "deferred"}
    assert evaluate(mix(chain(parent_outcome="raise"), deferred, runs)).passed
    ran = runs + [job_run("b", 2.5, 3.0, pid=OTHER_HORSE)]
    verdict = evaluate(mix(chain(parent_outcome="raise"), {"a": "failed", "b": "finished"}, ran))
    assert any("ran although its parents ended a failed" in v for v in verdict.violations)
    allowed = chain(allow_failure=True, parent_outcome="raise")
    assert evaluate(mix(allowed, {"a": "failed", "b": "finished"}, ran)).passed
    stuck = evaluate(mix(allowed, deferred, runs))
    assert any("never ran" in v for v in stuck.violations)


def test_a_fan_in_dependent_waits_for_every_parent() -> None:
    jobs = [
        planned("a", "parent"),
        planned("p", "parent"),
        planned("c", "dependent", parents=["a", "p"]),
    ]
    final = {"a": "finished", "p": "finished", "c": "finished"}
    runs = [job_run("a", 1.0, 2.0), job_run("p", 1.0, 4.0, pid=OTHER_HORSE), job_run("c", 3.0, 3.5, pid=301)]
    verdict = evaluate(mix(jobs, final, runs))
    assert any("before its parent p ended" in v for v in verdict.violations)


def test_a_scheduled_job_runs_once_and_not_before_it_is_due() -> None:
    job = planned("s", "scheduled", scheduled_for=10.0)
    assert evaluate(mix([job], {"s": "finished"}, [job_run("s", 9.3, 9.5)])).passed  # whole-second due times
    early = evaluate(mix([job], {"s": "finished"}, [job_run("s", 8.5, 8.7, rq_started=8.5)]))
    assert any("before it was due" in v for v in early.violations)
    twice = evaluate(mix([job], {"s": "finished"}, [job_run("s", 10.0, 10.2), job_run("s", 11.0, 11.2)]))
    assert any("(scheduled): ran again" in v for v in twice.violations)


def test_a_scheduled_job_never_enqueued_is_excused_only_by_rqs_scheduler_quitting() -> None:
    job = planned("s", "scheduled", scheduled_for=10.0)
    assert not evaluate(mix([job], {"s": "scheduled"}, [])).passed
    verdict = evaluate(mix([job], {"s": "scheduled"}, [], scheduler_deaths=1))
    assert verdict.passed and verdict.counts["scheduled_stranded"] == 1


def test_a_result_ttl_0_job_ran_and_its_hash_is_gone() -> None:
    job = planned("t", "ttl0")
    assert evaluate(mix([job], {"t": None}, [job_run("t", 1.0, 2.0)])).passed
    never_ran = evaluate(mix([job], {"t": None}, []))
    assert any("no run of it completed" in v for v in never_ran.violations)
    kept = evaluate(mix([job], {"t": "finished"}, [job_run("t", 1.0, 2.0)]))
    assert any("hash is still there" in v for v in kept.violations)


def test_a_take_refused_because_the_job_was_canceled_before_it_started_is_allowed_once() -> None:
    job = planned("c", "cancel", acted_at=2.0, acted_on="queued")
    ev = mix([job], {"c": "canceled"}, [])
    ev.stats["taken"] = 1
    assert evaluate(ev).passed
    ev.stats["taken"] = 2
    assert any("takes" in v for v in evaluate(ev).violations)


def test_a_faulted_job_that_rq_ended_need_not_come_back() -> None:
    """A job canceled (or deleted) after its worker died stays where RQ put it: the sweep
    rightly never recovers it, and the recovery bound does not count it as missing."""
    fault = _lapse("kill_worker", 2.0, None)
    ev = evidence([run(1, 1.0)], faults=[fault])
    (job_id,) = ev.jobs
    ev.jobs[job_id].kind = "cancel"
    ev.jobs[job_id].acted_at = 2.2
    ev.final[job_id]["status"] = "canceled"
    verdict = evaluate(ev)
    assert verdict.latency["not_seen"] == 0
    assert not any("never left its holder" in v for v in verdict.violations), verdict.violations


# -- no two runs of one job overlap in time ---------------------------------------------------
def _two_runs(first_end: float | None, second_start: float = 5.0) -> list[Run]:
    return [
        Run("j", HORSE, WORKER, 1.0, 1, first_end, None if first_end is None else "ok"),
        Run("j", OTHER_HORSE, OTHER_WORKER, second_start, 2, 8.0, "ok"),
    ]


def _overlap_violations(
    runs: list[Run], faults: list[Fault] | None = None, worker: str = "lease"
) -> list[str]:
    stop = faults or [Fault("kill_worker", 0.5, worker_pid=WORKER, horse_pids=[HORSE])]
    return [
        text for text in evaluate(evidence(runs, faults=stop, worker=worker)).violations if "went on" in text
    ]


def test_a_run_that_ends_before_the_next_begins_is_no_overlap() -> None:
    assert _overlap_violations(_two_runs(first_end=4.9)) == []


def test_a_run_that_writes_its_end_after_the_next_began_is_an_overlap() -> None:
    (violation,) = _overlap_violations(_two_runs(first_end=5.3))
    assert f"pid {HORSE} went on 300 ms after pid {OTHER_HORSE}" in violation


def test_a_run_cut_short_lasts_until_the_fault_that_killed_it() -> None:
    killed_late = [Fault("kill_horse", 6.0, worker_pid=WORKER, horse_pids=[HORSE], ended=6.0)]
    assert _overlap_violations(_two_runs(first_end=None), faults=killed_late)
    killed_early = [Fault("kill_horse", 4.0, worker_pid=WORKER, horse_pids=[HORSE], ended=4.0)]
    assert _overlap_violations(_two_runs(first_end=None), faults=killed_early) == []


def test_a_stock_horse_outlives_its_killed_worker_but_a_lease_horse_does_not() -> None:
    worker_killed = [Fault("kill_worker", 6.0, worker_pid=WORKER, horse_pids=[HORSE], ended=6.0)]
    assert _overlap_violations(_two_runs(first_end=None), faults=worker_killed)  # died at 6.0
    counts = evaluate(evidence(_two_runs(first_end=None), faults=worker_killed, worker="stock")).counts
    assert counts["overlapping_runs"] == 0  # stock: the horse ran on, but wrote no end: unseen


def test_a_frozen_pair_may_run_on_briefly_once_resumed_and_no_longer() -> None:
    frozen = [Fault("stop_long", 2.0, worker_pid=WORKER, horse_pids=[HORSE], ended=7.0)]
    assert _overlap_violations(_two_runs(first_end=7.05), faults=frozen) == []  # 50 ms after resume
    (violation,) = _overlap_violations(_two_runs(first_end=7.5), faults=frozen)
    assert "500 ms" in violation and "resumed from a stop" in violation
    # its end written a moment before the soak recorded the SIGCONT: no time run on
    v = evaluate(evidence(_two_runs(first_end=6.9995), faults=frozen))
    assert v.counts["overlapping_runs"] == 1 and v.counts["longest_overlap_ms"] == 0.0


def test_the_overlap_counts_are_reported_for_the_baseline_too() -> None:
    v = evaluate(evidence(_two_runs(first_end=6.0), worker="stock"))
    assert v.counts["overlapping_runs"] == 1 and v.counts["longest_overlap_ms"] == 1000.0


def test_a_run_stopped_without_its_end_lasts_until_its_last_alive_line(tmp_path: Any) -> None:
    """A run its holder did not stop (no end written, no fault killed it) but that went on
    after its job began elsewhere is seen by its ``alive`` lines."""
    log = tmp_path / "runs.log"
    log.write_text(
        f"start j {HORSE} {WORKER} 1.0 1 0.9\n"
        f"alive j {HORSE} 4.0\n"
        f"alive j {HORSE} 5.4\n"  # still going 400 ms after the second run began
        f"start j {OTHER_HORSE} {OTHER_WORKER} 5.0 2 4.9\n"
        f"end j {OTHER_HORSE} 6.0 ok\n"
    )
    runs = read_runs(str(log))["j"]
    assert runs[0].last_seen == 5.4 and runs[0].ended is None
    stop = [Fault("stop_worker", 2.0, "w", WORKER, [HORSE], "j", b"t", ended=6.0)]
    (violation,) = _overlap_violations(runs, faults=stop)
    assert "went on 400 ms" in violation and "resumed" not in violation  # its horse was not frozen
    # stopped in time (its last line before the second start): no overlap
    runs[0].last_seen = 4.0
    assert _overlap_violations(runs, faults=stop) == []


def test_overlaps_are_reported_per_fault_kind() -> None:
    faults = [
        Fault("stop_worker", 2.0, "w", WORKER, [HORSE], "j", b"t", ended=6.0),
        Fault("hang", 3.0, "x", 300, [301], "k", b"t", ended=6.0),
    ]
    v = evaluate(evidence(_two_runs(first_end=5.25), faults=faults, worker="stock"))
    assert v.counts["overlap_by_kind"] == {
        "hang": {"faults": 1, "overlaps": 0, "longest_ms": 0.0},
        "stop_worker": {"faults": 1, "overlaps": 1, "longest_ms": 250.0},
    }


def test_a_redis_restart_longer_than_the_grace_explains_a_repeat_and_a_short_one_does_not() -> None:
    """Self-fencing stops a run whose holder cannot renew for lease - margin, whatever the
    cause: a restart the soak meant to keep short that took longer (a loaded machine)
    repeats runs, one within the grace never does."""
    runs = [run(1, 1.0), run(2, 5.0, 6.0, "ok", pid=OTHER_HORSE, ppid=OTHER_WORKER)]
    grace = Config().grace_s

    def restart(down_s: float) -> Fault:
        return Fault("restart", 2.0, ended=2.0 + down_s)

    short = evaluate(evidence(runs, faults=[restart(0.8 * grace)]))
    assert any("no fault explains" in v for v in short.violations)
    long = evaluate(evidence(runs, faults=[restart(1.5 * grace)]))
    assert not any("no fault explains" in v for v in long.violations), long.violations
    assert long.counts["faults"] == {"restart_long": 1}


def test_a_fault_on_a_horse_whose_job_was_already_done_needs_no_recovery() -> None:
    """The soak read ``done:<token>``: the outcome was committed before the kill (the horse
    was in RQ's bookkeeping), so no lease was left to lapse and nothing comes back."""
    runs = [run(1, 1.0, 1.5, "ok")]
    done = kill("kill_group", 2.0)
    done.token, done.lapse_at = b"done:token", 2.0
    assert not any("never left its holder" in v for v in evaluate(evidence(runs, faults=[done])).violations)
    held = kill("kill_group", 2.0)
    held.lapse_at = 2.0
    assert any("never left its holder" in v for v in evaluate(evidence(runs, faults=[held])).violations)


def test_a_run_of_ours_after_a_frozen_stock_neighbours_run_is_a_duplicate() -> None:
    """Issue 20's mixed fleet: a stock worker frozen with a job (just moved for it, or
    mid-run) keeps it; if our sweep took it, one of ours runs it while the stock run stands,
    and no fault of the soak's excuses that."""
    freeze = Fault("stop_stock", 2.0, "s", OTHER_WORKER, [OTHER_HORSE], "j", None, ended=6.0)
    stock_run = run(0, 1.0, 7.0, "ok", pid=OTHER_HORSE, ppid=OTHER_WORKER)
    ev = evidence([stock_run, run(1, 4.0, 5.0, "ok")], faults=[freeze], taken=1)
    ev.stock_workers = [OTHER_WORKER]
    verdict = evaluate(ev)
    assert not verdict.passed and verdict.counts["duplicates"] == 1
    assert verdict.counts["overlapping_runs"] == 1


def test_a_stock_neighbours_run_counts_no_lease_attempt() -> None:
    stock_run = run(0, 1.0, 2.0, "ok", pid=OTHER_HORSE, ppid=OTHER_WORKER)
    ev = evidence([stock_run], taken=0)
    ev.stock_workers = [OTHER_WORKER]
    verdict = evaluate(ev)
    assert verdict.passed, verdict.violations


def test_a_repeat_after_the_workers_own_lease_clock_stopped_the_run_is_a_self_fenced_stop() -> None:
    """Renewals that time out together (a Redis-wide stall, fsync latency, a starved host)
    hit no worker the soak faulted: the holder's local lease clock stops the run and its
    log says so. That repeat is counted as a self-fenced stop; the same repeat without
    the line, or with a line from another worker or about another job, is a duplicate."""
    runs = [run(1, 1.0), run(2, 5.0, 6.0, "ok", pid=OTHER_HORSE, ppid=OTHER_WORKER)]

    def judged(stops: list[tuple[int, str]]) -> Any:
        ev = evidence(runs)
        ev.self_fenced = stops
        return evaluate(ev)

    fenced = judged([(WORKER, "j")])
    assert fenced.passed, fenced.violations
    assert fenced.counts["self_fenced_stops"] == 1 and fenced.counts["duplicates"] == 0
    for stops in ([], [(OTHER_WORKER, "j")], [(WORKER, "other-job")]):
        verdict = judged(stops)
        assert not verdict.passed and verdict.counts["duplicates"] == 1, stops
        assert verdict.counts["self_fenced_stops"] == 0


def test_a_self_fenced_stop_excuses_no_overlap_and_one_line_explains_one_repeat() -> None:
    # the stopped run wrote its end after the next run began: an overlap, whatever the log says
    overlapping = [run(1, 1.0, 5.5, "ok"), run(2, 5.0, 6.0, "ok", pid=OTHER_HORSE, ppid=OTHER_WORKER)]
    ev = evidence(overlapping)
    ev.self_fenced = [(WORKER, "j")]
    verdict = evaluate(ev)
    assert not verdict.passed and verdict.counts["overlapping_runs"] == 1
    # two repeats after runs by the same worker, one line: one of them is still a duplicate
    twice = [
        run(1, 1.0),
        run(2, 3.0, pid=HORSE + 1),
        run(3, 5.0, 6.0, "ok", pid=OTHER_HORSE, ppid=OTHER_WORKER),
    ]
    ev = evidence(twice)
    ev.self_fenced = [(WORKER, "j")]
    verdict = evaluate(ev)
    assert verdict.counts["self_fenced_stops"] == 1 and verdict.counts["duplicates"] == 1


def test_self_fenced_stops_are_read_from_each_worker_processs_log(tmp_path: Any) -> None:
    (tmp_path / "soak-w0-1.log").write_text(
        "12:00:01 Worker soak-w0-1 started\n"
        "12:00:05 job j1 on queue soak: local lease clock ran out (no renewal landed for 1250 ms); "
        "stopping it\n"
    )
    (tmp_path / "soak-w0-2.log").write_text(
        "job j2 on queue soak: local lease clock ran out (no renewal landed for 1250 ms) "
        "by the end of its run\n"
        "job j3 on queue soak: stopping it, its lease is lost\n"
    )
    stops = read_stops(tmp_path, {"soak-w0-1": WORKER, "soak-w0-2": OTHER_WORKER, "soak-w1-1": 7})
    assert stops == [(WORKER, "j1"), (OTHER_WORKER, "j2")]


def test_a_job_a_quitting_stock_neighbour_left_started_is_stock_rqs_loss_not_ours() -> None:
    """Stock RQ's worker quits on a Redis error outside its dequeue (a restart) and leaves
    its job started until stock cleanup fails it, a minute later: the soak notes it, it is
    no lost job of ours. The same job left by one of ours is lost."""
    stock_run = run(0, 1.0, 2.0, "ok", pid=OTHER_HORSE, ppid=OTHER_WORKER)
    quit_ = Fault("stock_exit", 2.5, "s", OTHER_WORKER, ended=2.5)
    started = {"status": "started"}
    ev = evidence([stock_run], final=started, faults=[quit_], taken=0)
    ev.stock_workers = [OTHER_WORKER]
    assert evaluate(ev).passed, evaluate(ev).violations
    ours = evidence([run(1, 1.0, 2.0, "ok")], final=started, faults=[quit_])
    assert not evaluate(ours).passed


# -- failure callbacks (every soak) and the failover checks (--sentinel, soak/failovercheck.py)


def test_a_failure_callback_for_a_job_that_finished_fails_the_soak() -> None:
    ev = evidence([run(1, 1.0, 2.0, "ok")])
    ev.failure_callbacks = {"j": [2.5]}  # e.g. the outbox drain acting on a demoted master
    verdict = evaluate(ev)
    assert not verdict.passed and verdict.counts["spurious_failure_callbacks"] == 1


def test_a_failure_callback_for_a_run_that_raised_before_its_retry_finished_is_no_finding() -> None:
    ev = evidence([run(1, 1.0, 2.0, "raise"), run(1, 3.0, 4.0, "ok")], taken=2)
    ev.failure_callbacks = {"j": [2.0]}  # RQ runs on_failure for the run that raised, then retries
    verdict = evaluate(ev)
    assert verdict.passed, verdict.violations
    assert verdict.counts["failure_callbacks"] == 1 and verdict.counts["spurious_failure_callbacks"] == 0


def _failover(at: float, switched_after: float | None, back: dict[str, float | None] | None = None) -> Fault:
    fault = Fault("failover", at, detail="master :1 -> :2")
    fault.switched_at = None if switched_after is None else at + switched_after
    fault.rejoined = {"w": 0.2} if back is None else back
    fault.ended = at + 2.0
    return fault


def _sentinel(ev: Evidence) -> Evidence:
    ev.config.sentinel = True
    return ev


#: A failover at 10 s whose switch came at 11 s: its window closes at 11 + REJOIN_S (1) +
#: the bound slack (1) + a lease (1.5) = 14.5 s.
WINDOW_END = 14.5


def test_a_rerun_of_a_run_begun_in_a_failover_window_is_explained_at_least_once() -> None:
    # a take on the old master just before the window closed, discarded with it: the next
    # take on the new master counts attempt 1 again, and Redis counted that one take only
    runs = [run(1, WINDOW_END - 0.1), run(1, 16.0, 17.0, "ok", pid=OTHER_HORSE, ppid=OTHER_WORKER)]
    verdict = evaluate(_sentinel(evidence(runs, faults=[_failover(10.0, 1.0)], taken=1)))
    assert verdict.passed, verdict.violations
    assert verdict.counts["failover"]["reruns_in_window"] == 1
    assert verdict.counts["runs_in_failover_windows"] == 1


def test_a_rerun_of_a_run_begun_after_the_failover_window_closed_is_a_duplicate() -> None:
    runs = [run(1, WINDOW_END + 0.1), run(2, 18.0, 19.0, "ok", pid=OTHER_HORSE, ppid=OTHER_WORKER)]
    verdict = evaluate(_sentinel(evidence(runs, faults=[_failover(10.0, 1.0)])))
    assert not verdict.passed and verdict.counts["duplicates"] == 1


def test_a_failover_whose_master_never_moved_explains_nothing_and_fails_the_soak() -> None:
    runs = [run(1, 10.5), run(2, 18.0, 19.0, "ok", pid=OTHER_HORSE, ppid=OTHER_WORKER)]
    verdict = evaluate(_sentinel(evidence(runs, faults=[_failover(10.0, None)])))
    assert not verdict.passed
    assert any("named no new master" in v for v in verdict.violations)


def test_a_worker_back_on_the_new_master_within_the_bound_passes() -> None:
    fault = _failover(10.0, 1.0, back={"w": 1.9})  # bound REJOIN_S 1 s + the 1 s slack
    verdict = evaluate(_sentinel(evidence([run(1, 20.0, 21.0, "ok")], faults=[fault])))
    assert verdict.passed, verdict.violations
    assert verdict.counts["failover"]["rejoin_max_s"] == 1.9


def test_a_worker_late_back_on_the_new_master_fails_the_soak() -> None:
    fault = _failover(10.0, 1.0, back={"w": 2.1})
    verdict = evaluate(_sentinel(evidence([run(1, 20.0, 21.0, "ok")], faults=[fault])))
    assert not verdict.passed and any("after 2.10s" in v for v in verdict.violations)


def test_a_worker_never_back_on_the_new_master_fails_the_soak() -> None:
    fault = _failover(10.0, 1.0, back={"w": None})
    verdict = evaluate(_sentinel(evidence([run(1, 20.0, 21.0, "ok")], faults=[fault])))
    assert not verdict.passed and any("never back" in v for v in verdict.violations)


def _crash_of(at: float, detail: str) -> Fault:
    crash = Fault("crash", at, "w", OTHER_WORKER, detail=detail)
    crash.ended = at
    return crash


def test_a_worker_whose_cli_could_not_reach_the_master_in_a_failover_window_is_no_crash() -> None:
    faults = [_failover(10.0, 1.0), _crash_of(12.0, "exit status 1; never started")]
    verdict = evaluate(_sentinel(evidence([run(1, 20.0, 21.0, "ok")], faults=faults)))
    assert verdict.passed, verdict.violations


def test_a_worker_whose_cli_could_not_reach_redis_in_a_restart_is_no_crash() -> None:
    """Respawned just before a Redis restart began (the supervisor's readiness check passed
    a moment before it), the worker's CLI met the dead server and exited before any worker
    code ran; one that had started and then died in the restart is a crash."""
    restart = Fault("restart", 10.0, ended=10.5, detail="down 500 ms")
    never_started = evidence(
        [run(1, 20.0, 21.0, "ok")], faults=[restart, _crash_of(10.4, "exit status 1; never started")]
    )
    verdict = evaluate(never_started)
    assert verdict.passed, verdict.violations
    started = evidence([run(1, 20.0, 21.0, "ok")], faults=[restart, _crash_of(10.4, "exit status 1")])
    assert not evaluate(started).passed
    long_before = evidence(
        [run(1, 20.0, 21.0, "ok")], faults=[restart, _crash_of(16.0, "exit status 1; never started")]
    )
    assert not evaluate(long_before).passed


def test_a_worker_that_started_and_then_died_in_a_failover_window_is_a_crash() -> None:
    faults = [_failover(10.0, 1.0), _crash_of(12.0, "exit status 1")]
    verdict = evaluate(_sentinel(evidence([run(1, 20.0, 21.0, "ok")], faults=faults)))
    assert not verdict.passed and any("crashed" in v for v in verdict.violations)


# -- the fenced-effect job kind (soak/effects.py, soak/effectcheck.py) ----------------------


def fenced_run(
    attempt: int,
    started: float,
    ended: float | None,
    outcome: str | None,
    effect: str | None,
    token: int | None,
    **pids: int,
) -> Run:
    r = run(attempt, started, ended, outcome, **pids)
    r.effect, r.token = effect, token
    return r


def fenced(runs: list[Run], plain: int, counted: int | None, writes: list[int], **kw: Any) -> Evidence:
    """One fenced job ``j`` and its effects in Redis at the end."""
    ev = evidence(runs, **kw)
    ev.jobs["j"].kind = "fenced"
    ev.effects = {"j": {"plain": plain, "counted": counted, "writes": writes}}
    return ev


def _killed_in_its_wrap_up() -> tuple[list[Run], list[Fault]]:
    """Run 1 wrote its effect (token 1, counted), then its worker was killed before the
    outcome; run 2, a later grant (token 2), wrote it again and finished the job."""
    runs = [
        fenced_run(1, 1.0, None, None, "counted", 1),
        fenced_run(2, 5.0, 6.0, "ok", "again", 2, pid=OTHER_HORSE, ppid=OTHER_WORKER),
    ]
    return runs, [kill("kill_worker", 2.0)]


def test_a_fenced_effect_lands_once_while_its_plain_twin_lands_at_least_once() -> None:
    runs, faults = _killed_in_its_wrap_up()
    verdict = evaluate(fenced(runs, plain=2, counted=1, writes=[1, 2], faults=faults))
    assert verdict.passed, verdict.violations
    fe = verdict.counts["fenced_effects"]
    assert (fe["jobs"], fe["plain"], fe["plain_over_one"], fe["landed"], fe["again"]) == (1, 2, 1, 1, 1)
    assert fe["by_kind"]["kill_worker"] == {
        "jobs": 1,
        "finished": 1,
        "plain": 2,
        "plain_over_one": 1,
        "landed": 1,
        "again": 1,
        "refused": 0,
        "violations": 0,
    }


def test_a_fenced_effect_that_a_later_grant_counted_again_fails_the_soak() -> None:
    runs, faults = _killed_in_its_wrap_up()
    # the effect holds the later grant's token: its write counted too (an HSET, not HSETNX)
    verdict = evaluate(fenced(runs, plain=2, counted=2, writes=[1, 2], faults=faults))
    assert not verdict.passed
    assert any("the first fenced write to commit was token 1" in v for v in verdict.violations)
    assert verdict.counts["fenced_effects"]["by_kind"]["kill_worker"]["violations"] == 1
    # two runs that each saw their write count
    runs[1].effect = "counted"
    verdict = evaluate(fenced(runs, plain=2, counted=1, writes=[1, 2], faults=faults))
    assert not verdict.passed and any(
        "each counted the effect (tokens 1, 2)" in v for v in verdict.violations
    )


def test_a_finished_job_with_no_fenced_effect_fails_the_soak_unless_a_stock_worker_finished_it() -> None:
    ours = [fenced_run(1, 1.0, 2.0, "ok", "counted", 1)]
    verdict = evaluate(fenced(ours, plain=1, counted=None, writes=[]))
    assert not verdict.passed and any("no fenced effect landed" in v for v in verdict.violations)
    # a write the run saw commit must be in Redis too
    assert any("saw its fenced write (token 1) commit" in v for v in verdict.violations)
    # a stock neighbour's run has no lease: it writes its plain twin only
    stock = [fenced_run(1, 1.0, 2.0, "ok", "nolease", None, ppid=OTHER_WORKER)]
    ev = fenced(stock, plain=1, counted=None, writes=[], taken=0)  # a stock run takes no lease
    ev.stock_workers = [OTHER_WORKER]
    verdict = evaluate(ev)
    assert verdict.passed, verdict.violations
    assert verdict.counts["fenced_effects"]["finished_without_lease"] == 1
    assert verdict.counts["fenced_effects"]["nolease_runs"] == 1


def test_a_replaced_holders_write_after_a_newer_grants_fails_the_soak() -> None:
    runs, faults = _killed_in_its_wrap_up()
    # token 1 landed after token 2: the fence let a replaced holder write
    verdict = evaluate(fenced(runs, plain=2, counted=2, writes=[2, 1], faults=faults))
    assert not verdict.passed
    assert any("token 1 landed after one under token 2" in v for v in verdict.violations)
    # the same grant's commit sent again (its reply lost) is one grant, never replaced between
    verdict = evaluate(fenced(runs, plain=3, counted=1, writes=[1, 1, 2], faults=faults))
    assert verdict.passed, verdict.violations
    assert verdict.counts["fenced_effects"]["resent"] == 1 and verdict.counts["fenced_effects"]["again"] == 2


def test_a_refused_fenced_write_is_counted_by_the_fault_that_let_its_holder_go_on() -> None:
    """A frozen pair resumed after its job was recovered and run again: its stale run's
    fenced write is refused (nothing written), it returns ``lost``, and the later grant's
    write is the one that counts."""
    stop = Fault("stop_long", 1.5, "w", WORKER, [HORSE], "j", b"t", ended=6.0)
    runs = [
        fenced_run(1, 1.0, 6.05, "lost", "refused", 1),
        fenced_run(2, 4.0, 5.0, "ok", "counted", 2, pid=OTHER_HORSE, ppid=OTHER_WORKER),
    ]
    ev = fenced(runs, plain=2, counted=2, writes=[2], faults=[stop])
    verdict = evaluate(ev)
    assert verdict.passed, verdict.violations
    row = verdict.counts["fenced_effects"]["by_kind"]["stop_long"]
    assert (row["refused"], row["plain_over_one"], row["landed"]) == (1, 1, 1)


def test_a_fenced_job_no_fault_hit_is_in_the_none_row() -> None:
    verdict = evaluate(fenced([fenced_run(1, 1.0, 2.0, "ok", "counted", 1)], plain=1, counted=1, writes=[1]))
    assert verdict.passed, verdict.violations
    assert list(verdict.counts["fenced_effects"]["by_kind"]) == ["none"]


def test_the_side_effect_log_reads_each_runs_fenced_effect(tmp_path: Any) -> None:
    log = tmp_path / "runs.log"
    log.write_text(
        f"start j {HORSE} {WORKER} 1.0 1 0.9\n"
        f"effect j {HORSE} 1.5 3 counted\n"
        f"end j {HORSE} 2.0 ok\n"
        f"start k {OTHER_HORSE} {OTHER_WORKER} 1.0 - 0.9\n"
        f"effect k {OTHER_HORSE} 1.7 - nolease\n"
        f"start l {HORSE + 1} {WORKER} 1.0 1 0.9\n"
        f"effect l {HORSE + 1} 2.5 4 refused\n"
        f"end l {HORSE + 1} 2.6 lost\n"
    )
    runs = read_runs(str(log))
    assert (runs["j"][0].effect, runs["j"][0].token, runs["j"][0].outcome) == ("counted", 3, "ok")
    assert (runs["k"][0].effect, runs["k"][0].token, runs["k"][0].last_seen) == ("nolease", None, 1.7)
    assert (runs["l"][0].effect, runs["l"][0].token, runs["l"][0].outcome) == ("refused", 4, "lost")


def test_a_fenced_job_with_a_run_in_a_failover_window_is_not_judged() -> None:
    runs = [fenced_run(1, 12.0, 13.0, "ok", "counted", 1)]  # its write may have gone with the old master
    ev = _sentinel(fenced(runs, plain=1, counted=None, writes=[], faults=[_failover(10.0, 1.0)]))
    verdict = evaluate(ev)
    assert verdict.passed, verdict.violations
    assert verdict.counts["fenced_effects"]["in_failover_windows"] == 1


def test_the_copies_of_a_frozen_neighbours_double_enqueue_overlap_by_stock_rqs_doing() -> None:
    """A stock neighbour frozen while its horse raised enqueues the job twice as it resumes;
    it runs one copy (popped without a lease) and one of ours the other, within
    milliseconds, between two queue samples: the runs, the fault and the raise are the
    evidence, and the repeat and the overlap are stock RQ's. Without the freeze over the
    raise it is still our duplicate."""
    freeze = Fault("stop_stock", 2.0, "s", OTHER_WORKER, [OTHER_HORSE], "j", None, ended=4.0)
    runs = [
        run(0, 1.0, 3.9, "raise", pid=OTHER_HORSE, ppid=OTHER_WORKER),  # raised while frozen
        run(0, 4.10, 6.0, "ok", pid=OTHER_HORSE + 1, ppid=OTHER_WORKER),  # stock's copy
        run(1, 4.15, 5.0, "ok"),  # ours, from the other copy
    ]
    # the stock copy's finish (RQ's own) leaves the attempt our take counted on the other copy
    ev = evidence(runs, final={"attempts": "1"}, faults=[freeze], taken=1)
    ev.stock_workers = [OTHER_WORKER]
    verdict = evaluate(ev)
    assert verdict.violations == [], verdict.violations
    thawed = Fault(
        "stop_stock", 5.0, "s", OTHER_WORKER, [OTHER_HORSE], "j", None, ended=5.5
    )  # not over the raise
    ev = evidence(runs, faults=[thawed], taken=1)
    ev.stock_workers = [OTHER_WORKER]
    assert any("went on" in v for v in evaluate(ev).violations)


def test_a_copy_queued_while_ours_holds_the_other_in_a_frozen_neighbours_double_enqueue_is_stock_rqs() -> (
    None
):
    """The same double enqueue, sampled between its two takes: ours holds the lease of one
    copy while the other still waits in the queue. The sample is stock
    RQ's within the double enqueue's window; with no freeze over the raise, or long after
    the resume, a job queued while leased is ours and fails the soak."""
    freeze = Fault("stop_stock", 2.0, "s", OTHER_WORKER, [OTHER_HORSE], "j", None, ended=4.0)
    runs = [
        run(0, 1.0, 3.9, "raise", pid=OTHER_HORSE, ppid=OTHER_WORKER),  # raised while frozen
        run(1, 4.05, 5.0, "ok"),  # ours, from one copy
        run(0, 4.60, 6.0, "ok", pid=OTHER_HORSE + 1, ppid=OTHER_WORKER),  # stock's, from the other
    ]
    for at, credited in (("4.3", True), ("30.0", False)):
        ev = evidence(
            runs,
            final={"attempts": "1"},
            faults=[freeze],
            taken=1,
            queue_violations=[f"{at} j queued while leased"],
        )
        ev.stock_workers = [OTHER_WORKER]
        verdict = evaluate(ev)
        assert verdict.counts["queued_twice_by_stock"] == int(credited), verdict.counts
        assert any("queue sample" in v for v in verdict.violations) != credited, verdict.violations
    # no freeze over the raise, and one of our scripts pushed the job since its last run:
    # the copy may be ours (with no such push, it is a stray copy of RQ's client, which the
    # stock neighbour then ran: soak/straycopies.py)
    thawed = Fault("stop_stock", 5.0, "s", OTHER_WORKER, [OTHER_HORSE], "j", None, ended=5.5)
    ev = evidence(runs, faults=[thawed], taken=1, queue_violations=["4.3 j queued while leased"])
    ev.stock_workers = [OTHER_WORKER]
    ev.our_pushes = [(4.2, "j")]
    assert any("queue sample" in v for v in evaluate(ev).violations)


def test_a_failure_whose_result_waits_on_a_live_outbox_claim_is_pending_not_wrong() -> None:
    """The sweep failed the job at max attempts and a drainer claimed its outbox entry,
    then the soak killed or froze that drainer: RQ's Result waits for
    the claim to lapse (it outlasts the failure callback's timeout), past the drain. While
    the claim lives that is pending, counted apart; with no live claim it fails the soak."""
    stalled = {"status": "failed", "attempts": "5", "failure": "stalled on attempt 5 of 5", "reason": ""}
    kills = [kill("kill_group", 1.5 + i) for i in range(5)]
    runs = [run(i + 1, 1.0 + i, None) for i in range(5)]
    for claimed, passes in ((["j"], True), ([], False)):
        ev = evidence(runs, final=stalled, faults=kills, taken=5)
        ev.registries["outbox_claimed"] = claimed
        verdict = evaluate(ev)
        pending = [x for x in verdict.violations if "Result" in x or "emq_attempts" in x]
        assert (not pending) == passes, verdict.violations
        assert verdict.counts.get("failure_commit_pending", 0) == int(passes), verdict.counts


def test_a_keep_directory_that_holds_an_earlier_runs_files_is_refused(tmp_path: Any, capsys: Any) -> None:
    """The side-effect log appends: a second run kept in the same directory would judge the
    first run's lines as its own (every one "ran, but the soak never enqueued it")."""
    from soak.__main__ import main

    (tmp_path / "runs.log").write_text("start j 1 1 1.0 1 1.0\n")
    try:
        main(["--keep", str(tmp_path)])
    except SystemExit as stop:
        assert stop.code == 2
    else:
        raise AssertionError("a non-empty --keep directory was accepted")
    assert "--keep" in capsys.readouterr().err


# -- conservation at every sample (soak/conservation.py) ------------------------------------


def test_a_job_in_no_place_at_a_sample_fails_the_soak_whatever_becomes_of_it() -> None:
    """The job finished in the end: a sample that found it in no place RQ reads (status
    queued in no queue list, no lease) still fails the soak."""
    clean = evidence([run(1, 1.0, 2.0, "ok")])
    assert evaluate(clean).passed and evaluate(clean).counts["conservation_violations"] == 0
    nowhere = evidence([run(1, 1.0, 2.0, "ok")])
    nowhere.conservation, nowhere.conservation_samples = ["1.5 j none"], 10
    verdict = evaluate(nowhere)
    assert not verdict.passed and verdict.counts["conservation_violations"] == 1
    assert "in no place" in verdict.violations[0]


def test_a_job_in_two_places_fails_but_for_a_run_rq_ended_and_what_invariant_3_judges() -> None:
    def verdict_for(places: str, **fields: Any) -> Any:
        stock = "stock_workers" in fields  # a stock run reads no attempt, and Redis counts no take
        ev = evidence(
            [run(None, 1.0, 2.0, "ok") if stock else run(1, 1.0, 2.0, "ok")], taken=0 if stock else 1
        )  # type: ignore[arg-type]
        ev.conservation = [f"1.5 j {places}"]
        for name, value in fields.items():
            setattr(ev, name, value)
        return evaluate(ev)

    unjudged = ("finished,queued", "deferred,queued", "failed,finished", "finished,moving", "moving,queued")
    for places in unjudged:
        verdict = verdict_for(places)
        assert not verdict.passed and verdict.counts["conservation_violations"] == 1, places
    # RQ ended a job whose run goes on (a cancel); queued while in flight (invariant 3's); a
    # stock run's trail in RQ's intermediate list
    # (and that queued copy in our moving list, between a worker's BLMOVE and its take: the
    # take holds a job back there while an earlier run of its id goes on)
    for places in (
        "canceled,in-flight",
        "finished,in-flight",
        "in-flight,queued",
        "in-flight,moving",
        "finished,intermediate",
    ):
        assert verdict_for(places).passed, places
    # a copy RQ's own client pushed of a job that finished, which one of ours dropped unrun
    assert verdict_for("finished,queued", stray_drops=[(WORKER, "j")]).passed
    assert verdict_for("finished,moving", stray_drops=[(WORKER, "j")]).passed
    # stock RQ finishing a job the producer canceled while its stock run went on, or
    # re-creating the hash of one it deleted: stock RQ's semantics, and only a stock run's
    canceled = Planned("j", 0.1, "ok", 0, kind="cancel", acted_at=1.2)
    assert verdict_for("canceled,finished", stock_workers=[WORKER], jobs={"j": canceled}).passed
    deleted = Planned("j", 0.1, "ok", 0, kind="delete", acted_at=1.2)
    assert verdict_for("none", stock_workers=[WORKER], jobs={"j": deleted}).passed
    assert not verdict_for("canceled,finished", jobs={"j": canceled}).passed
    later = Planned("j", 0.1, "ok", 0, kind="cancel", acted_at=1.9)  # canceled after the sample
    assert not verdict_for("canceled,finished", stock_workers=[WORKER], jobs={"j": later}).passed
    assert not verdict_for("none", stock_workers=[WORKER]).passed  # a plain job of stock's: judged
    # RQ's job.delete() under way as the sample ran (it takes the job out of its places,
    # then deletes the hash): RQ's; before the call began, ours to answer for
    deleting = Planned("j", 0.1, "ok", 0, kind="delete", acting_since=1.4, acted_at=1.6)
    assert verdict_for("none", jobs={"j": deleting}).counts["conservation_violations"] == 0
    deleting.acting_since = 1.55
    assert verdict_for("none", jobs={"j": deleting}).counts["conservation_violations"] == 1
    # the sample's script ran at some moment between its send (1.5) and its reply (1.56): a
    # delete begun within that span may have been under way as it ran; one begun after the
    # reply, or one that returned before the send, may not
    assert verdict_for("none 1.56", jobs={"j": deleting}).counts["conservation_violations"] == 0
    assert verdict_for("none 1.54", jobs={"j": deleting}).counts["conservation_violations"] == 1
    deleting.acting_since, deleting.acted_at = 1.3, 1.45
    assert verdict_for("none 1.56", jobs={"j": deleting}).counts["conservation_violations"] == 1


def test_the_conservation_sample_names_each_job_not_in_exactly_one_place(r: Any) -> None:
    """The sampling script against a real Redis: each job's places, read in one script."""
    from soak.conservation import sample

    q = "soak"
    for job_id in ("queued", "nowhere", "leased", "twice", "lapsed", "deleted", "ready"):
        if job_id != "deleted":
            r.hset(f"rq:job:{job_id}", mapping={"status": "queued", "emq_token": f"w:{job_id}"})
    r.rpush(f"rq:queue:{q}", "queued", "twice")
    r.zadd(f"rq:finished:{q}", {"twice": 1})
    r.set(f"emq:{{{q}}}:leased:lock", "w:leased")  # a live lock naming the owner: in flight
    r.set(f"emq:{{{q}}}:lapsed:lock", "w:another")  # a lock that names someone else
    r.rpush(f"rq:queue:{q}", "deleted")  # a deleted job's entry: no hash, not judged
    r.zadd(f"rq:ready:{q}", {"ready": 1})  # RQ 3: a dependent on its way from deferred to its queue
    ids = ["queued", "nowhere", "leased", "twice", "lapsed", "deleted", "ready"]
    sent = time.time()
    lines = sample(r, q, ids)
    replied = time.time()
    found = sorted(line.split()[1:3] for line in lines)
    assert found == [["lapsed", "none"], ["nowhere", "none"], ["twice", "finished,queued"]]
    for line in lines:  # the span in which the script ran, to the millisecond each way
        at, until = float(line.split()[0]), float(line.split()[3])
        assert sent - 0.001 <= at <= until <= replied + 0.001, (sent, line, replied)


# -- Redis losing its data, and fencing tokens (soak/dataloss.py) ----------------------------


def tokened(attempt: int, started: float, fence: int, ended: float | None = None, **pids: int) -> Run:
    made = run(attempt, started, ended, "ok" if ended else None, **pids)
    made.fence = fence
    return made


def test_a_resubmitted_jobs_run_after_a_loss_of_redis_data_is_no_duplicate_but_may_not_overlap() -> None:
    """Redis lost its data at t=3 and the producer resubmitted the job: its run since is
    judged as a new job's (no duplicate, attempts start again); without the loss it is a
    duplicate. An old run that went on past the new one's start is an overlap still."""
    runs = [tokened(1, 1.0, 1000), tokened(1, 5.0, 5000, 6.0, pid=OTHER_HORSE, ppid=OTHER_WORKER)]
    loss = Fault("lose_data", 3.0, ended=4.0)
    resubmitted = evidence(runs, faults=[loss], taken=1)
    resubmitted.resubmitted = {"j": 3.0}
    verdict = evaluate(resubmitted)
    assert verdict.passed, verdict.violations
    assert verdict.counts["duplicates"] == 0 and verdict.counts["resubmitted_after_loss"] == 1
    assert not evaluate(evidence(runs, faults=[loss], taken=1)).passed  # no resubmission recorded
    runs[0].last_seen = 5.3  # the old run went on 300 ms beside the new one
    overlapping = evidence(runs, faults=[loss], taken=1)
    overlapping.resubmitted = {"j": 3.0}
    verdict = evaluate(overlapping)
    assert not verdict.passed and verdict.counts["overlapping_runs"] == 1


def test_a_stock_run_across_the_loss_that_finished_the_resubmitted_job_is_stock_rqs() -> None:
    """A stock neighbour's run began before the loss and finished after the resubmission:
    stock RQ writes its outcome over the resubmitted job (no lease fences it), which then
    never runs. Not judged; one of ours doing so would be (its lease vanished: the fence
    refuses its outcome)."""
    loss = Fault("lose_data", 3.0, ended=4.0)

    def verdict_for(ppid: int) -> Any:
        ev = evidence([run(None, 1.0, 5.0, "ok", ppid=ppid)], faults=[loss], taken=0)  # type: ignore[arg-type]
        ev.resubmitted, ev.stock_workers = {"j": 3.0}, [OTHER_WORKER]
        return evaluate(ev)

    verdict = verdict_for(OTHER_WORKER)
    assert verdict.passed, verdict.violations
    assert verdict.counts["resubmitted_then_written_by_a_stock_run"] == 1
    assert not verdict_for(WORKER).passed


def test_a_job_lost_with_redis_is_accepted_only_when_redis_lost_it() -> None:
    gone = {"status": None}
    lost = evidence([tokened(1, 1.0, 1000)], final=gone, faults=[Fault("lose_data", 3.0, ended=4.0)], taken=0)
    lost.lost_by_redis = {"j": 3.0}
    verdict = evaluate(lost)
    assert verdict.passed, verdict.violations
    assert verdict.counts["lost_with_redis"] == 1
    assert not evaluate(evidence([tokened(1, 1.0, 1000)], final=gone, taken=0)).passed


def test_fencing_tokens_rise_across_a_loss_and_no_two_runs_share_one() -> None:
    loss = Fault("lose_data", 3.0, ended=4.0)

    def verdict_for(before: int, after: int) -> Any:
        runs = [tokened(1, 1.0, before), tokened(1, 5.0, after, 6.0, pid=OTHER_HORSE, ppid=OTHER_WORKER)]
        ev = evidence(runs, faults=[loss], taken=1)
        ev.resubmitted = {"j": 3.0}
        return evaluate(ev)

    assert verdict_for(1000, 5000).passed
    went_back = verdict_for(5000, 1000)  # a count kept in Redis starts again after the loss
    assert not went_back.passed and went_back.counts["tokens_not_above_the_loss"] == 1
    shared = verdict_for(1000, 1000)
    assert not shared.passed and shared.counts["tokens_shared"] == 1


def test_a_job_enqueued_again_while_it_ran_may_fail_past_its_max_attempts() -> None:
    """A web process enqueued the running job (max attempts 1) again; its copy's take went
    on from the old run's count, and a kill of the copy's horse failed it on attempt 2 of 1."""
    again = Fault("enqueue_again", 1.5, "w", WORKER, [HORSE], "j", b"t", ended=1.5)
    runs = [run(1, 1.0, 2.0, "ok"), run(2, 3.0, pid=OTHER_HORSE, ppid=OTHER_WORKER)]
    final = {
        "status": "failed",
        "max_attempts": "1",
        "failure": "work horse killed by signal 9 (SIGKILL; the OOM killer sends this) on attempt 2 of 1",
        "reason": "JobStalled: job j ...",
    }
    killed = kill("kill_horse", 3.5, OTHER_WORKER, OTHER_HORSE)
    verdict = evaluate(evidence(runs, final=final, faults=[again, killed], taken=2))
    assert verdict.passed, verdict.violations
    # the same count past the max with no enqueue again is a finding
    assert not evaluate(evidence(runs, final=final, faults=[killed], taken=2)).passed
