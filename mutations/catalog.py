"""The named mutations: one guard broken at a time, and the tests that must then fail.

Each mutation replaces ``original`` (which must occur exactly once in ``file``, so the
catalog fails loudly instead of silently testing nothing when the code moves) with
``replacement``. Snippets are kept to one line where possible so that they survive
nearby edits. ``tests`` are pytest node ids, chosen fast; ``fast`` marks the subset CI
runs (``python -m mutations --fast``).
"""

from __future__ import annotations

from dataclasses import dataclass

LEASES = "tests/hold/test_lease_scripts.py"
FENCE = "tests/fence/test_fenced_writes.py"
LIFE = "tests/lifecycle/test_lifecycle.py"
LIFE_MODEL = "tests/lifecycle/test_state_machine_lifecycle.py::test_leases_hold_across_rqs_job_lifecycle"
LIFE_REPLAY_LOSS = (
    "tests/lifecycle/test_state_machine_lifecycle.py::"
    "test_the_models_actors_replay_redis_losing_its_data_under_two_runs"
)
LIFE_REPLAY_STALE = (
    "tests/lifecycle/test_state_machine_lifecycle.py::"
    "test_the_models_actors_replay_a_stale_save_over_a_dead_holders_job"
)
SWEEP = "tests/recover/test_sweep.py"
WAKE = "tests/intake/test_wake.py"
SOAK = "tests/tooling/test_soak_checks.py"
BUDGET = "tests/intake/test_connection_budget.py"
HANDOVER = "tests/intake/test_watch_handover.py"
SETTINGS_T = "tests/shared/test_settings.py"
MODEL = "tests/lifecycle/test_state_machine.py::test_the_lease_protocol_holds_its_invariants"
OPTIONS = "tests/run/test_worker_options.py"
FLEET = "tests/recover/test_fleet_sweep.py"
CRASH = "tests/recover/test_recover_crashed_job.py"
HORSE = "tests/recover/test_horse_crash.py"
WHOLE = "tests/run/test_stop_whole.py"
WATCHDOG = "tests/run/test_watchdog.py"
FORK_AHEAD = "tests/run/test_fork_ahead.py"
JOB_LEASE = "tests/run/test_job_lease.py"
REPORTS = "tests/hold/test_reports.py"
DASHBOARD = "tests/operate/test_dashboard.py"
GUARD = "tests/operate/test_dashboard_guard.py"
SWEEP_RECORD = "tests/recover/test_record.py"
EVENTS = "tests/shared/test_events.py"
STOP_ORDER = "tests/run/test_stop_order.py"
BAD_KEYS = "tests/shared/test_malformed_keys.py"
ABORTS = "tests/fence/test_fenced_pipeline_aborts.py"
WORKER_LOGS = "tests/run/test_worker_logs.py"
WORKER_SETTINGS = "tests/run/test_worker_settings.py"
LOGS = "tests/shared/test_logs.py"
EVIDENCE = "tests/lifecycle/test_evidence_processes.py"
TAKES = "tests/connection/test_failover_takes.py"
FAILOVER = "tests/connection/test_failover.py"
HANDBACK = "tests/run/test_connection_handback.py"
WATCHED = "tests/fence/test_watched_commit.py"
SUSPENSION = "tests/run/test_suspension.py"
EVICTION = "tests/run/test_eviction_policy.py"
SIMPLE_STOP = "tests/run/test_simple_stop_ends_process.py"
STAND_IN = "tests/run/test_stand_in.py"


@dataclass(frozen=True)
class Mutation:
    name: str
    file: str
    original: str
    replacement: str
    tests: tuple[str, ...]
    why: str
    fast: bool = True


def _m(
    name: str, file: str, original: str, replacement: str, tests: list[str], why: str, fast: bool = True
) -> Mutation:
    return Mutation(name, file, original, replacement, tuple(tests), why, fast)


CATALOG: list[Mutation] = [
    # -- the watchdog's stand-in renewal of a SimpleLeaseWorker's lease ----------------------
    _m(
        "no_stand_in_renewal",
        "rq_emq/run/watchdog.py",
        'stand_in = StandIn(kit, worker) if not group and kit and "renew_sha" in kit else None',
        "stand_in = None",
        [f"{STAND_IN}::test_a_job_holding_the_gil_for_leases_keeps_its_lease_and_runs_once"],
        "a SimpleLeaseWorker's job that holds the GIL past the lease is ended and run again",
    ),
    _m(
        "stand_in_unadopted",
        "rq_emq/hold/lease.py",
        "        self._adopt_outside_renewal(lease)\n",
        "",
        [f"{STAND_IN}::test_a_job_holding_the_gil_for_leases_keeps_its_lease_and_runs_once"],
        "the worker's lease clock runs out on a lease its watchdog kept, and stops the run",
    ),
    _m(
        "stand_in_for_a_frozen_worker",
        "rq_emq/run/stand_in.py",
        'RUNNING_STATES = (b"R", b"S", b"D")',
        'RUNNING_STATES = (b"R", b"S", b"D", b"T")',
        [f"{STAND_IN}::test_a_frozen_worker_is_stood_in_for_by_no_one"],
        "a SIGSTOPped worker's lease is kept by its watchdog: its job waits for it for ever",
    ),
    _m(
        "stand_in_ignores_a_refusal",
        "rq_emq/run/stand_in.py",
        "        if job_id in refused:",
        "        if False:",
        [f"{STAND_IN}::test_a_run_whose_job_was_deleted_is_not_kept_alive_by_its_watchdog"],
        "the watchdog goes on renewing a lease Redis refused: the run outlives its lease",
    ),
    # -- the connection budget and the idle watch (issue 35) ---------------------------------
    _m(
        "horse_opens_its_own_connection",
        "rq_emq/connection/budget.py",
        "pool._available_connections[:] = [lent]",
        "pool._available_connections[:] = []",
        [
            f"{BUDGET}::test_a_worker_holds_three_connections_idle_and_running_on_any_number_of_queues[1-rq_emq.LeaseWorker]"
        ],
        "a forked horse opens a connection beside the one its worker lent it: four while a job runs",
    ),
    _m(
        "busy_watcher_looks_only_where_written",
        "rq_emq/intake/watch.py",
        "        keys = [self.keys[1], *self.queue_keys]",
        "        keys = [self.keys[1], *(self.queue_keys if written is ALL else sorted(written))]",
        [
            f"{BUDGET}::"
            "test_a_busy_watcher_wakes_standbys_while_any_queue_holds_a_job_not_only_the_one_written"
        ],
        "a take that empties one queue stops the wakes while other queues of the set hold jobs",
    ),
    _m(
        "idle_watcher_not_woken",
        "rq_emq/intake/watch.py",
        "        if idle:\n            self.arrived.set()",
        "        if idle:\n            pass",
        [f"{BUDGET}::test_a_push_to_an_idle_set_is_taken_by_its_watcher_and_no_standby_wakes"],
        "a push to an idle set of queues waits for a standby's wait to run out (two leases)",
    ),
    _m(
        "watch_start_blind_to_a_reconnect",
        "rq_emq/intake/watch.py",
        "if isinstance(tracking, Exception) or self._losses != losses:",
        "if isinstance(tracking, Exception):",
        [f"{HANDOVER}::test_a_watch_whose_pubsub_connection_reconnected_during_its_start_starts_again"],
        "a reconnect of the pubsub connection told as a watch starts leaves it deaf for a third of a hold",
    ),
    _m(
        "watch_start_keeps_a_broken_tracking",
        "rq_emq/intake/watch.py",
        '        prefixes again. Two replies, the second the tracking\'s."""\n'
        '        pipe.execute_command("CLIENT", "TRACKING", "OFF")',
        '        prefixes again. Two replies, the second the tracking\'s."""\n        pipe.ping()',
        [f"{HANDOVER}::test_a_watch_whose_pubsub_connection_reconnected_during_its_start_starts_again"],
        "a watch started again over a tracking left on is refused (its prefixes overlap)",
    ),
    _m(
        "no_spare_beside_a_job_taken_after_an_idle_wait",
        "rq_emq/run/worker.py",
        "            if end is None or not end.over_within(SPARE_AFTER_IDLE_START_S):",
        "            if end is None:",
        [
            f"{FORK_AHEAD}::"
            "test_a_job_taken_after_an_idle_wait_that_runs_on_has_the_next_horse_forked_beside_it"
        ],
        "the job behind one taken after an idle wait is forked at its take, as RQ does",
    ),
    _m(
        "busy_watcher_wakes_nobody",
        "rq_emq/intake/watch.py",
        "        elif self.watching:\n            self._wake_soon()",
        "        elif self.watching:\n            pass",
        [f"{BUDGET}::test_a_busy_watcher_wakes_a_standby_for_the_next_job"],
        "a job pushed while the watcher runs one waits behind it, idle workers beside",
    ),
    _m(
        "vacant_watch_never_taken",
        "lua/hold_watch-2.lua",
        "if holder == token or (not holder and redis.call('LLEN', wake) == 0) then",
        "if holder == token then",
        [f"{BUDGET}::test_a_push_to_an_idle_set_is_taken_by_its_watcher_and_no_standby_wakes"],
        "nobody ever watches a set of several queues: pushes wait for standby timeouts",
    ),
    _m(
        "the_lines_call_not_announced",
        "lua/hold_sweeper-5.lua",
        "    redis.call('LPUSH', line, token)\n    redis.call('PUBLISH', line, token)",
        "    redis.call('LPUSH', line, token)",
        [f"{FLEET}::test_a_standby_hears_the_sweepers_call_on_the_lines_channel_and_becomes_the_deputy"],
        "a deputy is recruited only when a standby's listening ends (one or two leases)",
    ),
    # -- the watched commit: a holder's start and finish as RQ's transaction --------------------
    _m(
        "watched_commit_trusts_any_token",
        "rq_emq/fence/watched_commit.py",
        "    if len(found) != len(LEASE_FIELDS) or found[0] != token:",
        "    if len(found) != len(LEASE_FIELDS):",
        [
            f"{WATCHED}::test_a_finish_whose_lease_was_lost_before_the_read_writes_nothing",
            f"{WATCHED}::test_a_start_whose_lease_was_lost_writes_nothing",
        ],
        "a worker that lost its lease writes its job's start and outcome over the new holder's run",
    ),
    _m(
        "watched_commit_ignores_rqs_changes",
        "rq_emq/fence/watched_commit.py",
        '        if recorded is not None and (seen or "") != recorded:',
        "        if False:",
        [
            f"{WATCHED}::test_a_finish_after_rq_ended_the_job_is_refused_and_the_job_left_as_rq_put_it",
            f"{WATCHED}::test_a_start_after_rq_ended_the_job_is_refused",
        ],
        "a job canceled while it ran is finished (or started again) over RQ's cancel",
    ),
    _m(
        "watched_finish_without_the_watch",
        "rq_emq/fence/fencing.py",
        "        keys = (*names, fence.job_key) if reads_lease else names",
        "        keys = names",
        [f"{WATCHED}::test_a_write_to_the_job_after_the_read_aborts_the_finish_and_rqs_retry_is_refused"],
        "a job recovered between the finish's read and its write gets the old holder's outcome",
    ),
    _m(
        "watched_start_without_the_watch",
        "rq_emq/fence/watched_commit.py",
        '            conn.send_packed_command(conn.pack_commands([("WATCH", fence.job_key), read]))',
        "            conn.send_packed_command(conn.pack_commands([read]))",
        [f"{WATCHED}::test_a_start_whose_job_was_written_after_the_read_is_decided_by_the_script"],
        "a job recovered between the start's read and its write is marked started by the old holder",
    ),
    _m(
        "watched_finish_re_creates_a_deleted_job",
        "rq_emq/fence/watched_commit.py",
        "        if name not in _KEEPS_JOB or args[1] not in names:",
        "        if False:",
        [f"{WATCHED}::test_a_finish_that_deletes_the_job_goes_to_the_script_that_leaves_the_tombstone"],
        "a job run with result_ttl=0 is left as a hash of lease fields that never expires",
    ),
    _m(
        "watched_finish_keeps_the_crash_history",
        "rq_emq/fence/watched_commit.py",
        '    "emq_crashes",\n)',
        ")",
        [
            f"{WATCHED}::test_a_watched_commit_leaves_the_job_as_the_fenced_script_would",
            f"{HORSE}::test_a_finish_after_crashes_starts_the_attempts_and_their_history_again",
        ],
        "a job that finished keeps crashes that no longer count",
    ),
    # -- token checks (the fence) -------------------------------------------------------------
    _m(
        "finish_job_no_token_check",
        "lua/finish_job-6.lua",
        "if state == 'lost' then\n  -- a late outcome",
        "if false then\n  -- a late outcome",
        [f"{FENCE}::test_a_late_finish_by_a_worker_that_lost_its_lease_changes_nothing"],
        "a worker that lost its lease writes the job's outcome",
    ),
    _m(
        "finish_job_no_token_check_model",
        "lua/finish_job-6.lua",
        "if state == 'lost' then\n  -- a late outcome",
        "if false then\n  -- a late outcome",
        [MODEL],
        "the model test alone reaches a late finish after a lost lease",
        fast=False,
    ),
    _m(
        "guard_job_write_no_token_check",
        "lua/guard_job_write-6.lua",
        "if state ~= 'held' then return {0, MALFORMED} end",
        "if state == 'ended' then return {0, MALFORMED} end",
        [f"{FENCE}::test_a_guarded_start_commits_only_for_the_holder_and_keeps_the_lease"],
        "a horse that wakes after its job was recovered marks it started again",
    ),
    _m(
        "return_job_to_queue_no_token_check",
        "lua/return_job_to_queue-8.lua",
        "if state ~= 'held' then return {0, MALFORMED} end",
        "if state == 'ended' then return {0, MALFORMED} end",
        [f"{LEASES}::test_a_hand_back_by_a_worker_that_lost_its_lease_changes_nothing"],
        "a cold stop hands back a job it no longer owns",
    ),
    _m(
        "return_job_to_queue_no_refund",
        "lua/return_job_to_queue-8.lua",
        "redis.call('HSET', KEYS[1], 'emq_attempts', tostring(attempts - 1))",
        "local _ = 0",
        [f"{LEASES}::test_a_hand_back_refunds_the_attempt_and_puts_the_job_first"],
        "a stopped worker's hand-back costs the job an attempt",
    ),
    _m(
        "renew_no_owner_check",
        "lua/renew_leases-3.lua",
        "if owner == token and (indexed or unreadable) then",
        "if indexed or unreadable then",
        [f"{LEASES}::test_nobody_can_renew_a_lease_they_do_not_hold"],
        "anybody can extend a lease they do not hold",
    ),
    _m(
        "renew_no_owner_check_model",
        "lua/renew_leases-3.lua",
        "if owner == token and (indexed or unreadable) then",
        "if indexed or unreadable then",
        [MODEL],
        "the model test alone reaches a renewal by a holder whose job is someone else's",
        fast=False,
    ),
    _m(
        "renew_settled_reported_lost",
        "lua/renew_leases-3.lua",
        "  elseif owner == 'done:' .. token\n",
        "  elseif false\n",
        [f"{LEASES}::test_a_renewal_racing_the_finish_is_not_a_lost_lease"],
        "a tick racing the finish reports a lost lease (and stops nothing, but logs and counts)",
    ),
    _m(
        "renew_keeps_the_mark",
        "lua/renew_leases-3.lua",
        "index_write('zset', 'ZREM', KEYS[2], job_id)",
        "local _ = 0",
        [f"{LEASES}::test_renewal_extends_the_lease_and_unmarks_it"],
        "a holder that renews after a mark still has its job recovered",
    ),
    _m(
        "renew_no_last_heartbeat",
        "lua/renew_leases-3.lua",
        "fields = {'last_heartbeat', heartbeat}",
        "fields = {}",
        [f"{LEASES}::test_renewal_records_rqs_heartbeat_on_the_job"],
        "RQ's view of the job (last_heartbeat) freezes at its start",
    ),
    _m(
        "fence_refusal_not_raised",
        "rq_emq/fence/fencing.py",
        "if outcome != 1:",
        "if False:",
        [f"{FENCE}::test_a_late_finish_by_a_worker_that_lost_its_lease_changes_nothing"],
        "a refused finish looks committed to RQ",
    ),
    _m(
        "fence_later_batches_after_refusal_run",
        "rq_emq/fence/fencing.py",
        "if session.refused:",
        "if False:",
        [f"{FENCE}::test_after_a_refused_transaction_the_rest_of_the_fenced_block_is_refused"],
        "after a refused outcome, RQ's next transaction in the block is checked again on its own",
    ),
    _m(
        "fence_scripted_batch_unchecked",
        "rq_emq/fence/fencing.py",
        "if owner is None or (owner.decode() if isinstance(owner, bytes) else owner) != fence.token:",
        "if False:",
        [f"{FENCE}::test_a_finish_that_runs_a_script_of_its_own_is_checked_then_committed"],
        "a finish holding a script of its own commits without the owner check",
    ),
    _m(
        "fence_held_back_record_not_sent_ahead",
        "rq_emq/fence/fencing.py",
        "            commands = [*ahead, *commands]",
        "            ahead = []",
        [f"{FENCE}::test_a_held_back_transaction_rides_in_the_next_guarded_write_and_is_refused_with_it"],
        "a SimpleLeaseWorker's execution record, held back for the run's start, is never written",
    ),
    _m(
        "fence_watch_with_read_dropped",
        "rq_emq/fence/fencing.py",
        '        sent = [("WATCH", *keys), args]',
        '        sent = [("PING",), args]',
        [f"{FENCE}::test_rqs_watch_goes_with_its_read_in_one_round_trip_and_still_guards_the_outcome"],
        "RQ's WATCH of a job's dependents, sent with the read after it, no longer guards its outcome",
    ),
    _m(
        "simple_worker_record_sent_alone",
        "rq_emq/run/worker.py",
        "(rq_emq.fence.job_writes)\n    _record_rides_in_start = True",
        "(rq_emq.fence.job_writes)\n    _record_rides_in_start = False",
        ["tests/run/test_worker_costs.py::test_a_job_costs_one_script_call_and_rqs_transactions"],
        "a SimpleLeaseWorker pays a transaction and a round trip more per job",
    ),
    _m(
        "forking_worker_record_sent_alone",
        "rq_emq/run/worker.py",
        "a job less)\n    _record_rides_in_start = True",
        "a job less)\n    _record_rides_in_start = False",
        ["tests/run/test_worker_costs.py::test_a_job_costs_one_script_call_and_rqs_transactions"],
        "a LeaseWorker writes RQ's execution record before the fork: a transaction more a job",
    ),
    _m(
        "forked_record_never_beaten",
        "rq_emq/run/worker.py",
        "        self._held_back_record_sent(job, landed=True)  # in the horse's memory, for its start\n",
        "",
        [
            "tests/run/test_worker_processes.py::"
            "test_a_job_running_20_times_the_lease_is_never_reclaimed_and_finishes_once"
        ],
        "a forked horse's record, sent in its start, is never beaten: RQ's view of a long run goes stale",
    ),
    _m(
        "watch_deaf_after_pubsub_reconnect",
        "rq_emq/intake/watch.py",
        "            connection.register_connect_callback(self._reconnected)",
        "            pass",
        [f"{BUDGET}::test_a_watcher_whose_pubsub_connection_reconnected_hears_the_next_push_at_once"],
        "after RQ's pubsub connection reconnected, the idle watcher hears no push until its next keep",
    ),
    # -- lease bookkeeping ----------------------------------------------------------------------
    _m(
        "take_sets_no_lock",
        "lua/lib/lease.lua",
        "redis.call('SET', lock_key, token, 'PX', lease_ms)",
        "local _ = 0",
        [f"{LEASES}::test_pop_leases_the_job_in_the_same_step"],
        "a job in flight without a lock: the first sweep marks a live worker's job",
    ),
    _m(
        "take_counts_no_attempt",
        "lua/lib/lease.lua",
        "local attempts = (count_value((hash_field(hash, 'emq_attempts'))) or 0) + 1",
        "local attempts = (count_value((hash_field(hash, 'emq_attempts'))) or 0) + 0",
        [f"{LEASES}::test_a_job_hash_with_many_fields_is_taken_again_with_its_attempts_counted"],
        "max attempts never reached: a poison job loops forever",
    ),
    _m(
        "release_keeps_lock",
        "lua/finish_job-6.lua",
        "redis.call('DEL', KEYS[2])",
        "local _ = 0",
        [f"{FENCE}::test_a_fenced_transaction_commits_and_releases_the_lease"],
        "a finished job's lock lingers",
    ),
    _m(
        "finish_keeps_attempts",
        "lua/finish_job-6.lua",
        "if redis.call('HDEL', KEYS[1], unpack(ended)) > 0 then",
        "if redis.call('HEXISTS', KEYS[1], 'emq_token') == 1 then",
        [f"{FENCE}::test_a_fenced_transaction_commits_and_releases_the_lease"],
        "a job retried by RQ after a normal finish inherits its old stall count",
    ),
    _m(
        "claim_job_without_owning_the_entry",
        "lua/claim_job-6.lua",
        "if redis.call('LREM', KEYS[1], 1, job_id) == 0 then return {-1} end",
        "redis.call('LREM', KEYS[1], 1, job_id)",
        [f"{LEASES}::test_claim_leases_a_job_moved_to_the_moving_list"],
        "two workers claim one BLMOVEd job",
    ),
    _m(
        "take_runs_a_stray_copy_of_an_ended_job",
        "lua/lib/lease.lua",
        "    if placed_by_rq(job_key, job_id, nil, rq_prefix) then return 'stray' end",
        "local _ = status",
        [
            f"{LEASES}::test_a_stray_copy_of_a_job_that_left_every_queue_is_dropped_never_run_again",
            f"{LEASES}::test_a_stray_duplicate_entry_of_a_job_in_flight_is_dropped_never_run_twice",
        ],
        "a copy RQ's client pushed again (a resent transaction) runs a finished job once more",
    ),
    _m(
        "take_runs_a_stray_copy_under_a_live_lease",
        "lua/lib/lease.lua",
        "  if leased_live(hash, lock) then return 'stray' end",
        "",
        [f"{LEASES}::test_a_stray_duplicate_entry_of_a_job_in_flight_is_dropped_never_run_twice"],
        "a copy of a job in flight is granted to a second worker: two runs overlap",
    ),
    _m(
        "take_runs_beside_an_old_run_that_holds_the_lock",
        "lua/lib/lease.lua",
        "    if left > 0 then return 'busy', left end",
        "    if false then return 'busy', left end",
        [f"{LEASES}::test_a_job_deleted_and_enqueued_again_waits_at_its_place_until_the_old_run_ends"],
        "a job deleted while it ran and enqueued again runs beside its old run until that run's renewal",
    ),
    _m(
        "take_runs_beside_an_old_run_that_holds_the_lock_processes",
        "lua/lib/lease.lua",
        "    if left > 0 then return 'busy', left end",
        "    if false then return 'busy', left end",
        [
            f"{EVIDENCE}::test_a_running_job_deleted_and_enqueued_again_runs_again_only_once_the_old_run_stopped"
        ],
        "with real workers: the two runs overlap (124-286 ms under a 3 s lease, 300 ms renewals)",
        fast=False,
    ),
    _m(
        "pop_ignores_rq_suspend",
        "lua/pop_job-3n.lua",
        "and redis.call('EXISTS', suspended_key) == 1 then",
        "and false then",
        [
            f"{SUSPENSION}::test_a_take_carrying_rqs_check_refuses_while_suspended_and_leaves_the_job_queued",
            f"{SUSPENSION}::test_rq_suspend_stops_a_backlog_after_the_running_job_and_rq_resume_takes_the_rest",
        ],
        "a worker suspended by `rq suspend` goes on taking a backlog's jobs (RQ's check rides in the take)",
    ),
    _m(
        "take_carries_no_suspension_check",
        "rq_emq/intake/take.py",
        'args.append(between.suspended_key if between is not None else "")',
        'args.append("")',
        [f"{SUSPENSION}::test_rq_suspend_stops_a_backlog_after_the_running_job_and_rq_resume_takes_the_rest"],
        "RQ's work loop leaves its `rq suspend` check to the take, which then never makes it",
    ),
    _m(
        "pop_stops_at_a_held_back_job",
        "lua/pop_job-3n.lua",
        "      at = at + 1\n",
        "      break\n",
        [f"{LEASES}::test_a_job_deleted_and_enqueued_again_waits_at_its_place_until_the_old_run_ends"],
        "one job held back by its old run holds up every job behind it in its queue",
    ),
    _m(
        "claim_drops_a_held_back_job",
        "lua/claim_job-6.lua",
        "  redis.call('LPUSH', KEYS[6], job_id)\n",
        "",
        [f"{LEASES}::test_a_job_deleted_and_enqueued_again_waits_at_its_place_until_the_old_run_ends"],
        "a job the idle wait moved while its old run held the id is in no queue: lost",
    ),
    _m(
        "a_run_over_keeps_its_lost_lock",
        "lua/lib/lease.lua",
        "    if run_over then release_own_lock(lock_key, token) end\n",
        "",
        [
            f"{LEASES}::test_a_job_deleted_and_enqueued_again_waits_at_its_place_until_the_old_run_ends",
            f"{CRASH}::test_a_crash_of_a_run_whose_job_was_deleted_releases_the_lock_it_still_holds",
        ],
        "a job deleted while it ran (or while its horse died) and enqueued again waits a lease",
    ),
    _m(
        "a_refused_write_drops_the_lease_of_a_running_job",
        "lua/guard_job_write-6.lua",
        "job_id, token, KEYS[6], ARGV[3], false)",
        "job_id, token, KEYS[6], ARGV[3], true)",
        [
            f"{LIFE}::test_a_refused_write_in_the_middle_of_a_run_leaves_its_lock_and_its_lease",
            f"{EVIDENCE}::test_a_running_job_enqueued_again_waits_for_its_old_run_though_the_run_saves_its_meta",
        ],
        "a running job enqueued again runs beside its old run once that run saves its own meta",
    ),
    _m(
        "seen_death_left_to_the_sweep",
        "rq_emq/run/watchdog.py",
        "_hand_back(deadline, kit, worker, killed, ",
        "pass  # ",
        ["tests/run/test_seen_death.py"],
        "a worker whose death its own watchdog saw still waits a whole lease before its job runs again",
    ),
    _m(
        "rate_limited_taken_as_rqs_word",
        "lua/lib/lease.lua",
        "      and redis.call('ZSCORE', rq_prefix .. 'rl:' .. limit .. ':rate_limited', job_id) ~= false",
        "      or true",
        [f"{LIFE}::test_a_rate_limited_status_is_read_from_the_limits_waiting_set"],
        "a stale save of a rate-limited copy discards the finished run and leaves the job nowhere",
    ),
    _m(
        "a_refusal_mid_run_lets_go_of_its_lock",
        "lua/lib/lease.lua",
        "  if state == 'ended' and run_over then\n",
        "  if state == 'ended' then\n",
        [f"{LIFE}::test_a_refused_write_in_the_middle_of_a_run_leaves_its_lock_and_its_lease"],
        "any refusal of RQ's end drops the lock, whoever says it: the run goes on unguarded",
    ),
    # -- the idle wait: one blocked BLMOVE per queue -------------------------------------------
    _m(
        "second_win_not_handed_back",
        "rq_emq/intake/take.py",
        "                    self._wait.hand_back(queues[index], job_id)",
        "                    pass",
        [f"{WAKE}::test_two_queues_handing_over_a_job_at_once_claim_the_first_and_hand_back_the_other"],
        "a job a second queue moved at the same moment sits in the moving list until a sweep",
    ),
    _m(
        "later_queue_claimed_first",
        "rq_emq/intake/wake.py",
        "        return sorted(moved)",
        "        return sorted(moved, reverse=True)",
        [f"{WAKE}::test_two_queues_handing_over_a_job_at_once_claim_the_first_and_hand_back_the_other"],
        "jobs arriving together are taken against the worker's queue order",
    ),
    _m(
        "other_waits_not_unblocked",
        "rq_emq/intake/wake.py",
        '                    control.send_command("CLIENT", "UNBLOCK", client_id)',
        "                    pass",
        [f"{WAKE}::test_an_idle_taker_blocks_on_every_queue_and_wakes_on_a_push_to_any"],
        "the woken worker waits out its other BLMOVEs (or they take jobs it will not run)",
    ),
    _m(
        "stop_in_the_wait_strands_the_moved_job",
        "rq_emq/intake/take.py",
        "                if not waiting.done:  # the wait was interrupted (a stop, a broken connection)",
        "                if False:",
        [f"{WAKE}::test_a_stop_during_the_wait_hands_back_a_job_moved_meanwhile"],
        "a worker stopped while idle leaves a job Redis moved for it to the sweep (or blocked waits behind)",
    ),
    _m(
        "refused_waits_keep_their_connections",
        "rq_emq/intake/wake.py",
        "                    if not _refused_for_clients(error):",
        "                    if True:",
        [
            "tests/intake/test_fleet_processes.py::"
            "test_a_worker_refused_connections_for_its_waits_still_takes_jobs_within_a_small_budget"
        ],
        "a worker on many queues at Redis's client limit never takes a job and starves other clients",
    ),
    _m(
        "lost_lease_renewed_again",
        "rq_emq/hold/lease.py",
        "return [lease for lease in self._leases.values() if not (lease.lost or lease.settled)]",
        "return list(self._leases.values())",
        [f"{LEASES}::test_a_lease_found_lost_is_not_renewed_or_reported_again"],
        "every tick re-reports (and counts) a lease already lost",
    ),
    # -- the sweep: grace, attempts, claims -----------------------------------------------------
    _m(
        "no_grace_pass",
        "lua/move_stalled_jobs_to_wait-9.lua",
        "'ZRANGEBYSCORE', stalled_key, '-inf', now - grace_ms,",
        "'ZRANGEBYSCORE', stalled_key, '-inf', now,",
        [f"{SWEEP}::test_marks_are_not_recovered_before_a_full_grace_window_even_by_an_unlimited_caller"],
        "a mark is recovered by the very next call: a holder gets no chance to renew",
    ),
    _m(
        "no_grace_pass_model",
        "lua/move_stalled_jobs_to_wait-9.lua",
        "'ZRANGEBYSCORE', stalled_key, '-inf', now - grace_ms,",
        "'ZRANGEBYSCORE', stalled_key, '-inf', now,",
        [MODEL],
        "the model test alone: a second sweeper in the same round takes a live holder's job",
        fast=False,
    ),
    _m(
        "grace_four_times_longer",
        "rq_emq/recover/sweep.py",
        "return max(self.window_ms, self.settings.renew_interval_ms * 5 // 4)",
        "return 4 * max(self.window_ms, self.settings.renew_interval_ms * 5 // 4)",
        [
            "tests/recover/test_recovery_processes.py::"
            "test_a_killed_workers_job_is_back_within_lease_plus_two_sweeps_and_finished_by_the_survivor"
        ],
        "a dead worker's job comes back far later than lease + 2 sweep intervals",
    ),
    _m(
        "phase2_ignores_the_lock",
        "lua/move_stalled_jobs_to_wait-9.lua",
        "if redis.call('EXISTS', lock_key) == 1 or not (leased or",
        "if false or not (leased or",
        [f"{SWEEP}::test_a_marked_job_whose_lock_is_back_is_unmarked_not_recovered"],
        "a job whose holder is back is recovered anyway",
    ),
    _m(
        "sweep_reads_rqs_intermediate_list",
        "rq_emq/recover/sweep.py",
        "q.moving,\n            q.started,",
        "q.intermediate,\n            q.started,",
        [f"{SWEEP}::test_a_stock_workers_job_between_its_move_and_its_start_is_never_marked"],
        "a frozen stock worker's job, just moved for it, is recovered by our sweep and runs twice",
    ),
    _m(
        "started_entry_not_pinned",
        "rq_emq/recover/registries.py",
        "        if not _held_here(execution.job_id):",
        "        if True:",
        [
            "tests/recover/test_registries.py::test_no_stock_process_fails_a_leased_job_however_long_the_fleet_is_down"
        ],
        "a stock process (rq info, a stock worker) fails a leased job once the fleet was down a while",
    ),
    _m(
        "recovery_leaves_the_pin",
        "lua/lib/lease.lua",
        "    redis.call('ZREM', started_key, pinned)\n    redis.call('HDEL', job_key, 'emq_started')",
        "    redis.call('HDEL', job_key, 'emq_started')",
        [
            "tests/recover/test_registries.py::test_no_stock_process_fails_a_leased_job_however_long_the_fleet_is_down"
        ],
        "a recovered job stays listed as started forever once RQ's execution records expired",
    ),
    _m(
        "rollback_takes_live_leases",
        "lua/release_leases_to_rq-6.lua",
        "  if redis.call('EXISTS', lock_key) == 1 then",
        "  if false then",
        ["tests/recover/test_registries.py::test_rollback_leaves_a_live_lease_and_says_so"],
        "a rollback run while a LeaseWorker still runs a job hands that job to stock cleanup",
    ),
    _m(
        "never_fail_at_max_attempts",
        "lua/lib/lease.lua",
        "local max_attempts = count_value(counts[2]) or default_max",
        "local max_attempts = math.huge",
        [f"{SWEEP}::test_a_job_at_max_attempts_fails_with_its_reason_and_rq_sees_a_failure"],
        "a poison job that kills its worker runs forever",
    ),
    _m(
        "never_fail_at_max_attempts_model",
        "lua/lib/lease.lua",
        "local max_attempts = count_value(counts[2]) or default_max",
        "local max_attempts = math.huge",
        [MODEL],
        "the model test alone reaches a recovery at max attempts",
        fast=False,
    ),
    _m(
        "attempts_read_one_short",
        "lua/lib/lease.lua",
        "local attempts = count_value(counts[1]) or 0",
        "local attempts = (count_value(counts[1]) or 0) - 1",
        [f"{SWEEP}::test_a_job_at_max_attempts_fails_with_its_reason_and_rq_sees_a_failure"],
        "a job runs one more time than its max attempts",
    ),
    _m(
        "requeue_to_the_back",
        "lua/lib/lease.lua",
        "redis.call('LPUSH', queue_key, job_id)",
        "redis.call('RPUSH', queue_key, job_id)",
        [f"{SWEEP}::test_a_recovered_job_goes_to_the_front_of_its_queue_and_leaves_rqs_started_registry"],
        "a recovered job waits behind the whole queue",
    ),
    _m(
        "recovery_leaves_rqs_started_entry",
        "lua/move_stalled_jobs_to_wait-9.lua",
        "      release_started(started_key, job_key, job_id, rq_prefix)\n",
        "",
        [f"{SWEEP}::test_a_recovered_job_goes_to_the_front_of_its_queue_and_leaves_rqs_started_registry"],
        "stock cleanup later fails the re-run job as abandoned",
    ),
    _m(
        "sweep_not_rate_limited",
        "lua/move_stalled_jobs_to_wait-9.lua",
        "if mode == 'round' and not redis.call('SET', sweep_key, '1', 'NX', 'PX', window_ms) then",
        "if false then",
        [f"{SWEEP}::test_a_lapsed_lease_is_marked_first_and_recovered_only_by_a_later_round"],
        "every worker's sweeper runs every round: Redis work grows with the fleet",
    ),
    _m(
        "sweep_stops_after_one_batch",
        "lua/move_stalled_jobs_to_wait-9.lua",
        "if #due_leases == batch then more = 1 end",
        "local _ = 0",
        [f"{SWEEP}::test_a_round_works_through_any_number_of_stalled_jobs_in_bounded_calls"],
        "a round marks one batch and leaves the rest for later rounds (recovery takes longer than the bound)",
    ),
    _m(
        "phase1_marks_a_live_lock",
        "lua/move_stalled_jobs_to_wait-9.lua",
        "  if ttl > 0 then",
        "  if false then",
        [f"{SWEEP}::test_a_stale_deadline_whose_lock_lives_is_moved_to_the_locks_end_not_marked"],
        "a live holder with a stale deadline is marked (and the index keeps falling due)",
    ),
    _m(
        "max_attempts_failure_not_in_outbox",
        "lua/lib/lease.lua",
        "index_write('zset', 'ZADD', outbox_key, now, job_id)",
        "local _ = 0",
        [f"{SWEEP}::test_a_job_at_max_attempts_fails_with_its_reason_and_rq_sees_a_failure"],
        "no Result and no failure callback for a job failed at max attempts",
    ),
    _m(
        "claim_outbox_does_not_extend_the_claim",
        "lua/claim_outbox-1.lua",
        "redis.call('ZADD', KEYS[1], now + math.max(claim_ms, timeout_s * 1000 + margin_ms), job_id)",
        "local _ = 0",
        [f"{SWEEP}::test_an_outbox_entry_is_claimed_by_one_drainer_until_its_claim_ends"],
        "two drainers run one failure callback",
    ),
    _m(
        "claim_outbox_claims_entries_not_due",
        "lua/claim_outbox-1.lua",
        "local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now,",
        "local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '+inf',",
        [f"{SWEEP}::test_an_outbox_entry_is_claimed_by_one_drainer_until_its_claim_ends"],
        "a claimed entry is claimed again at once",
    ),
    _m(
        "outbox_commit_not_fenced",
        "rq_emq/recover/outbox.py",
        'with fenced(self.client, Fence(queue, job_id, token, counter="outbox_completed", layout=layout)):',
        "if True:",
        [f"{SWEEP}::test_a_drainer_whose_claim_was_taken_over_writes_no_result"],
        "a slow drainer and its successor both write the failure Result",
    ),
    _m(
        "take_unacknowledged_by_a_replica_runs",
        "rq_emq/intake/take.py",
        "if confirm is None or confirm[1]:",
        "if True:",
        [
            "tests/connection/test_failover_takes.py::test_a_take_no_replica_acknowledged_goes_back_to_the_front_of_its_queue_unrun"
        ],
        "after SENTINEL FAILOVER the old master's takes run beside the new master's: two runs overlap",
    ),
    _m(
        "degraded_take_gate_never_probes",
        "rq_emq/intake/take.py",
        "                confirm.probed(replication)\n",
        "                pass\n",
        [f"{TAKES}::test_a_degraded_take_counts_and_asks_the_master_for_its_replicas"],
        "after a failover the take gate stays off for 30 s, through a failback",
    ),
    _m(
        "degraded_take_gate_never_probes_processes",
        "rq_emq/intake/take.py",
        "                confirm.probed(replication)\n",
        "                pass\n",
        [f"{FAILOVER}::test_after_a_failover_the_take_gate_is_on_again_for_the_failback"],
        "with real workers and Sentinel: the gate is off through the failback",
        fast=False,
    ),
    _m(
        "degraded_take_gate_ignores_an_online_replica",
        "rq_emq/connection/confirm.py",
        "        self._degraded_until, self._probing, self._rearmed = 0.0, False, True\n",
        "        self._probing, self._rearmed = False, True\n",
        [f"{TAKES}::test_a_degraded_gate_waits_again_from_the_first_take_that_finds_a_replica_online"],
        "a replica back online does not turn the take gate on again",
    ),
    _m(
        "take_gate_flaps_on_an_online_replica_that_never_acknowledges",
        "rq_emq/connection/confirm.py",
        "self._probing, self._rearmed = not self._rearmed, False",
        "self._probing, self._rearmed = True, False",
        [f"{TAKES}::test_a_degraded_gate_waits_again_from_the_first_take_that_finds_a_replica_online"],
        "a replica online but slow turns the gate on and off, 3 s of takes handed back each time",
    ),
    _m(
        "rejoining_replica_stalls_takes",
        "rq_emq/connection/confirm.py",
        "        if fresh and not online_replicas(replication):\n",
        "        if False:\n",
        [f"{TAKES}::test_just_after_a_switch_a_master_with_no_replica_online_yet_is_taken_from_at_once"],
        "after every switch the workers hand takes back for 3 s while the old master resyncs",
    ),
    _m(
        "failback_master_taken_from_without_the_gate",
        "rq_emq/connection/confirm.py",
        "fresh = replication is not None and self.just_switched() and not self._online_since_switch",
        "fresh = replication is not None and self.just_switched()",
        [f"{TAKES}::test_just_after_a_switch_a_master_with_no_replica_online_yet_is_taken_from_at_once"],
        "a failback soon after a failover meets no gate: the demoted master's takes run, two runs overlap",
    ),
    _m(
        "take_gate_waits_for_sentinels_count",
        "rq_emq/connection/confirm.py",
        "replicas = max(self.watch.live_replicas, self._seen_online)",
        "replicas = self.watch.live_replicas",
        [f"{TAKES}::test_just_after_a_switch_a_master_with_no_replica_online_yet_is_taken_from_at_once"],
        "a replica back online is waited for only once Sentinel's count, read every 5 s, has it",
    ),
    # -- the sweeper election ---------------------------------------------------------------------
    _m(
        "every_worker_sweeps",
        "rq_emq/run/lease_mixin.py",
        "elect=True,",
        "elect=False,",
        [
            "tests/recover/test_fleet_sweep.py::test_sweep_script_calls_of_an_idle_fleet_do_not_grow_with_its_size"
        ],
        "every idle worker runs sweep rounds: Redis work grows with the fleet",
        fast=False,
    ),
    _m(
        "standby_checks_too_rarely",
        "rq_emq/recover/election.py",
        "self.standby_ms = max(idle_ms * 2 // 3, 1)",
        "self.standby_ms = max(idle_ms * 20, 1)",
        [
            "tests/recover/test_fleet_sweep.py::test_a_killed_sweepers_own_job_is_recovered_by_a_standby_within_the_bound"
        ],
        "a dead sweeper's job waits for the deputy far past lease + 2 sweep intervals",
        fast=False,
    ),
    _m(
        "no_deputy_is_called",
        "lua/hold_sweeper-5.lua",
        "redis.call('LPUSH', line, token)",
        "local _ = line",
        [f"{FLEET}::test_the_election_is_kept_only_by_its_holder_and_given_up_only_by_it"],
        "no standby ever leaves the line: nobody watches the sweeper but the line's rare checks",
    ),
    _m(
        "a_lapsed_deputy_goes_to_the_line",
        "lua/hold_sweeper-5.lua",
        "if deputy_token == token or not deputy_token then",
        "if deputy_token == token then",
        [f"{FLEET}::test_a_deputy_whose_key_lapsed_takes_it_again_while_it_is_free"],
        "a deputy starved past its hold leaves the set unwatched until a line wait ends",
    ),
    _m(
        "a_sweeping_deputy_keeps_its_deputy_key",
        "lua/hold_sweeper-5.lua",
        "redis.call('DEL', deputy)  -- the deputy took over",
        "deputy_token = deputy_token  -- the deputy took over",
        [f"{FLEET}::test_the_election_is_kept_only_by_its_holder_and_given_up_only_by_it"],
        "a deputy turned sweeper blocks the call for the next deputy until its key lapses",
    ),
    _m(
        "line_waits_far_too_long",
        "rq_emq/recover/election.py",
        "LINE_LEASES = 2",
        "LINE_LEASES = 10",
        [f"{FLEET}::test_a_line_wait_that_times_out_checks_the_election_once"],
        "the sweeper and the deputy dying together leave the set unswept for ages",
    ),
    _m(
        "line_wait_ignores_a_stop",
        "rq_emq/recover/election.py",
        "        while not self.stopping.is_set():",
        "        while True:",
        [f"{FLEET}::test_a_line_wait_ends_at_once_when_its_worker_stops"],
        "a stopping worker waits out its line wait (minutes) before it exits",
    ),
    # -- settings ---------------------------------------------------------------------------------
    _m(
        "renew_interval_may_exceed_the_lease",
        "rq_emq/settings.py",
        "if self.renew_interval_ms >= self.lease_ms:",
        "if False:",
        [f"{SETTINGS_T}::test_bad_settings_name_the_setting"],
        "a lease lapses between renewals and every running job is recovered",
    ),
    _m(
        "renew_interval_may_outgrow_the_sweep_interval",
        "rq_emq/settings.py",
        "if self.renew_interval_ms * 25 > self.sweep_interval_ms * 16:",
        "if False:",
        [
            f"{SETTINGS_T}::test_a_renew_interval_past_0_64_sweep_intervals_is_refused_naming_both",
            f"{SETTINGS_T}::test_the_intervals_set_are_refused_only_for_their_own_relations",
        ],
        "the grace is then the renew interval's, and a dead worker's job comes back later than "
        "lease + 2 sweep intervals",
    ),
    # -- the soak's verdict -------------------------------------------------------------------------
    _m(
        "soak_ignores_runs_never_enqueued",
        "soak/repeats.py",
        'v.violations += [f"{j}: ran, but the soak never enqueued it" for j in sorted(unknown)]',
        "pass",
        [f"{SOAK}::test_runs_of_a_job_the_soak_never_enqueued_fail_it"],
        "a job run from nowhere (a resurrected old id) passes the soak",
    ),
    _m(
        "soak_excuses_faults_at_any_time",
        "soak/repeats.py",
        "        if not fault.covers(run.started, until):\n            continue\n",
        "",
        [f"{SOAK}::test_a_kill_before_the_run_or_after_its_repeat_explains_nothing"],
        "one kill of a worker excuses every later repeat of any job it ran",
    ),
    # conservation at every sample, and Redis losing its data (issue 33)
    _m(
        "soak_conservation_not_enforced",
        "soak/conservation.py",
        'v.violations += [f"conservation sample {line}: {what}" for line, what in bad]',
        "pass",
        [f"{SOAK}::test_a_job_in_no_place_at_a_sample_fails_the_soak_whatever_becomes_of_it"],
        "a job a sample found in no place RQ reads passes the soak once it finished",
    ),
    _m(
        "soak_conservation_allows_two_places",
        "soak/conservation.py",
        "    if len(found) == 1:",
        "    if len(found) >= 1:",
        [f"{SOAK}::test_a_job_in_two_places_fails_but_for_a_run_rq_ended_and_what_invariant_3_judges"],
        "a job both queued and finished (it would run again) passes the soak",
    ),
    _m(
        "soak_conservation_sample_misreads_a_live_lock",
        "soak/conservation.py",
        "redis.call('GET', ARGV[2] .. id .. ':lock') == owner then mark(id, 'in-flight') end",
        "true then mark(id, 'in-flight') end",
        [f"{SOAK}::test_the_conservation_sample_names_each_job_not_in_exactly_one_place"],
        "a job whose lease lapsed with no lease entry left (in no place) reads as in flight",
    ),
    _m(
        "soak_conservation_sample_misses_rqs_ready_registry",
        "soak/conservation.py",
        "'deferred', 'ready', 'finished'",
        "'deferred', 'finished'",
        [f"{SOAK}::test_the_conservation_sample_names_each_job_not_in_exactly_one_place"],
        "RQ 3's dependent on its way to its queue (the ready registry) reads as in no place",
    ),
    _m(
        "soak_credits_any_run_across_a_loss_to_stock_rq",
        "soak/dataloss.py",
        "if r.ppid in stock and begun(r) < at and (r.ended is None or r.ended >= at)",
        "if begun(r) < at and (r.ended is None or r.ended >= at)",
        [f"{SOAK}::test_a_stock_run_across_the_loss_that_finished_the_resubmitted_job_is_stock_rqs"],
        "a run of ours whose outcome landed on the resubmitted job passes as stock RQ's",
    ),
    _m(
        "soak_accepts_a_resubmitted_job_finished_by_no_run",
        "soak/dataloss.py",
        'if seen.final.get(job_id, {}).get("status") == "finished" and not ran:',
        "if False:",
        [f"{SOAK}::test_a_stock_run_across_the_loss_that_finished_the_resubmitted_job_is_stock_rqs"],
        "an old run's outcome written over the resubmitted job (a fence that let it) passes the soak",
    ),
    _m(
        "soak_conservation_credits_any_stock_run",
        "soak/conservation.py",
        "    if acted > at:\n        return False\n",
        "",
        [f"{SOAK}::test_a_job_in_two_places_fails_but_for_a_run_rq_ended_and_what_invariant_3_judges"],
        "a stock run's job found in two places passes, though the producer canceled it only later",
    ),
    _m(
        "soak_conservation_credits_any_delete",
        "soak/conservation.py",
        "    if since is not None and since <= until and at <= acted:",
        "    if since is not None:",
        [f"{SOAK}::test_a_job_in_two_places_fails_but_for_a_run_rq_ended_and_what_invariant_3_judges"],
        "a job in no place before the producer's delete began passes as the delete's doing",
    ),
    _m(
        "soak_queue_samples_judged_without_the_runs_before_a_loss",
        "soak/checks.py",
        "    check_queues(every_run, v)",
        "    check_queues(ev, v)",
        [f"{SOAK}::test_a_job_queued_twice_after_a_stock_neighbours_run_is_stock_rqs_double_enqueue"],
        "a stock double enqueue seen before a loss of Redis's data fails the soak as ours",
    ),
    _m(
        "soak_tokens_may_fall_across_a_loss",
        "soak/dataloss.py",
        "if before and after and min(after) <= max(before):",
        "if False:",
        [f"{SOAK}::test_fencing_tokens_rise_across_a_loss_and_no_two_runs_share_one"],
        "a fencing token that starts again at 1 after Redis lost its data passes the soak",
    ),
    _m(
        "soak_tokens_may_be_shared",
        "soak/dataloss.py",
        "if len(tokens) != len(set(tokens)):",
        "if False:",
        [f"{SOAK}::test_fencing_tokens_rise_across_a_loss_and_no_two_runs_share_one"],
        "two runs under one fencing token (an outside store cannot tell them apart) pass the soak",
    ),
    _m(
        "soak_judges_a_resubmitted_job_by_its_lost_runs",
        "soak/dataloss.py",
        "job_id: [r for r in runs if begun(r) >= resubmitted.get(job_id, -math.inf)]",
        "job_id: runs",
        [
            f"{SOAK}::test_a_resubmitted_jobs_run_after_a_loss_of_redis_data_is_no_duplicate_but_may_not_overlap"
        ],
        "a resubmitted job's run after Redis lost its data fails the soak as a duplicate",
    ),
    _m(
        "soak_overlap_judged_since_the_loss_only",
        "soak/checks.py",
        "check_overlap(every_run, v, lease)",
        "check_overlap(ev, v, lease)",
        [
            f"{SOAK}::test_a_resubmitted_jobs_run_after_a_loss_of_redis_data_is_no_duplicate_but_may_not_overlap"
        ],
        "an old run that goes on beside its resubmitted job's run after a loss passes the soak",
    ),
    _m(
        "soak_accepts_any_job_as_lost_with_redis",
        "soak/dataloss.py",
        'lost: dict[str, float] = getattr(ev, "lost_by_redis", {})',
        "lost: dict[str, float] = {job_id: 0.0 for job_id in ev.jobs}",
        [f"{SOAK}::test_a_job_lost_with_redis_is_accepted_only_when_redis_lost_it"],
        "a job our workers lost passes the soak as one Redis lost",
    ),
    _m(
        "soak_recovery_bound_not_enforced",
        "soak/recoverybound.py",
        "if t > bound + cfg.bound_slack_s:",
        "if False:",
        [f"{SOAK}::test_a_recovery_slower_than_the_bound_and_its_slack_fails_the_soak"],
        "a job back 498 s after its worker died passes the soak",
    ),
    _m(
        "soak_gives_every_recovery_the_double_failure_bound",
        "soak/recoverybound.py",
        "if _another_worker_hit(cfg, f, faults):",
        "if True:",
        [f"{SOAK}::test_a_recovery_while_another_worker_was_hit_too_is_held_to_the_double_failure_bound"],
        "a lone worker's crash is held only to the looser bound of two workers hit together",
    ),
    _m(
        "soak_job_never_back_not_flagged",
        "soak/recoverybound.py",
        "for f in not_back:",
        "for f in not_back[:0]:",
        [f"{SOAK}::test_a_fault_whose_job_never_came_back_fails_the_soak"],
        "a dead worker's job that is never recovered passes the soak",
    ),
    _m(
        "soak_credits_a_shared_count_without_a_clock_stop",
        "soak/attempts.py",
        "if stops[(pid, job_id)] > 0:",
        "if True:",
        [f"{SOAK}::test_two_runs_reading_one_count_pass_only_when_one_runs_worker_stopped_it_on_its_clock"],
        "two runs reading one attempt count pass the soak with no worker's evidence",
    ),
    _m(
        "soak_credits_a_listed_horse_however_late",
        "soak/repeats.py",
        "run.pid in fault.horse_pids and fault.started <= until and run.started <= end + STALE_WINDOW_S",
        "run.pid in fault.horse_pids and fault.started <= until",
        [f"{SOAK}::test_a_run_whose_start_line_follows_the_kill_of_its_worker_is_explained_by_that_kill"],
        "a repeat passes the soak on any earlier fault that listed a pid the run's horse reused",
    ),
    _m(
        "soak_credits_any_runs_copy_to_stock_rq",
        "soak/straycopies.py",
        """    if run.ppid not in set(getattr(ev, "stock_workers", [])):
        return False
    for line in ev.queue_violations:""",
        """    for line in ev.queue_violations:""",
        [f"{SOAK}::test_a_fan_in_dependents_copy_run_by_a_stock_neighbour_beside_ours_is_stock_rqs"],
        "a copy of RQ's double enqueue run by one of ours beside the other passes as stock RQ's",
    ),
    _m(
        "clock_line_missing_at_the_runs_end",
        "rq_emq/hold/lease.py",
        "            self.expire_if_due(lease, ended=True)\n",
        "            pass\n",
        [f"{LEASES}::test_a_run_that_ended_past_its_local_deadline_leaves_the_clock_line_in_the_log"],
        "a horse that fenced itself first leaves no line saying why its job runs again",
    ),
    _m(
        "clock_run_out_reported_by_every_observer",
        "rq_emq/hold/lease.py",
        "if lease.expired or lease.lost or lease.settled or lease.valid_until >= now_m:",
        "if lease.settled or lease.valid_until >= now_m:",
        [f"{EVENTS}::test_a_lease_whose_clock_ran_out_is_reported_lost_once_whoever_sees_it_first"],
        "a run-out lease clock is reported lost (and its run stopped) by each thread that sees it",
    ),
    _m(
        "untrusted_horse_death_reports_no_lost_lease",
        "rq_emq/recover/horse_crash.py",
        "            me.lock_manager.expire_if_due(lease, ended=True)\n",
        "",
        [f"{HORSE}::test_a_horse_that_dies_after_its_worker_stopped_trusting_the_lease_is_left_to_the_sweep"],
        "a worker that reaps its fenced horse before its clock thread looks never reports the lost lease",
    ),
    _m(
        "event_hooks_on_callers_thread",
        "rq_emq/events.py",
        "    _dispatcher().put(items)\n",
        "    for event, hooks in items:\n        _deliver(event, hooks)\n",
        [f"{EVENTS}::test_a_blocked_hook_never_blocks_emit_and_its_drops_are_counted_and_logged_once"],
        "a slow hook blocks the renewal that emitted its event (issue 33: a 5 s hook killed healthy jobs)",
    ),
    _m(
        "event_hooks_on_callers_thread_worker",
        "rq_emq/events.py",
        "    _dispatcher().put(items)\n",
        "    for event, hooks in items:\n        _deliver(event, hooks)\n",
        [f"{EVENTS}::test_a_hook_that_blocks_for_longer_than_the_lease_never_delays_a_renewal"],
        "a real worker's 5 s hook on reported stops the renewals: its healthy job is killed, run thrice",
        fast=False,
    ),
    _m(
        "horse_past_its_deadline_blamed_on_the_oom_killer",
        "rq_emq/recover/horse_crash.py",
        "*(job.id, describe_exit(ret_val, guess=False), why),",
        "*(job.id, cause, why),",
        [f"{HORSE}::test_a_horse_that_dies_after_its_worker_stopped_trusting_the_lease_is_left_to_the_sweep"],
        "the log blames the OOM killer for the lease clock's own kill",
    ),
    _m(
        "soak_self_fence_from_any_worker",
        "soak/selffence.py",
        "for key in ((run.ppid, job_id), (run.pid, job_id)):",
        "for key in [k for k in left if k[1] == job_id]:",
        [f"{SOAK}::test_a_repeat_after_the_workers_own_lease_clock_stopped_the_run_is_a_self_fenced_stop"],
        "a clock line logged by another worker than the earlier run's explains its repeat",
    ),
    _m(
        "soak_overlap_ignores_alive_lines",
        "soak/overlap.py",
        "seen = run.last_seen if run.last_seen is not None else run.started",
        "seen = run.started",
        [f"{SOAK}::test_a_run_stopped_without_its_end_lasts_until_its_last_alive_line"],
        "a run that went on after its job began elsewhere, then was stopped before its end, passes",
    ),
    _m(
        "idle_state_blip_ends_the_worker",
        "rq_emq/run/dequeue.py",
        "me._riding_out_blips(lambda: me.set_state(compat.WorkerStatus.IDLE))",
        "me.set_state(compat.WorkerStatus.IDLE)",
        ["tests/run/test_worker_direct.py::test_a_blip_as_the_worker_turns_idle_does_not_end_it"],
        "a CLIENT KILL as the worker turns idle ends rq worker",
    ),
    # -- evidence, not absence: RQ's word is where it put the job (issue 33) -------------------
    _m(
        "a_changed_field_ends_the_lease",
        "lua/lib/lease.lua",
        "  if placed_by_rq(job_key, job_id, queue_key, rq_prefix) then return 'ended', lease_ms end",
        "  if true then return 'ended', lease_ms end",
        [f"{LIFE}::test_a_finish_after_a_stale_save_writes_the_runs_outcome"],
        "a web process's stale job.save() discards the run's outcome and leaves the job in no place",
    ),
    _m(
        "sweep_reads_a_changed_field_as_rqs_word",
        "lua/move_stalled_jobs_to_wait-9.lua",
        "  return untouched(found, 2) or not placed_by_rq(job_key, job_id, queue_key, rq_prefix)",
        "  return untouched(found, 2)",
        [f"{LIFE}::test_the_sweep_recovers_a_job_whose_dead_run_saw_a_stale_save"],
        "a dead worker's job whose status a stale save overwrote is never recovered: lost",
    ),
    _m(
        "take_drops_a_job_by_its_status_alone",
        "lua/lib/lease.lua",
        "  return registry ~= nil and redis.call('ZSCORE', rq_prefix .. registry .. origin, job_id) ~= false",
        "  return registry ~= nil",
        [f"{LIFE}::test_a_queued_job_whose_status_a_stale_save_overwrote_is_taken_not_dropped"],
        "a requeued job whose old status a stale save wrote back is dropped from its queue: lost",
    ),
    _m(
        "take_runs_a_copy_of_a_stock_run",
        "lua/lib/lease.lua",
        "      if score and tonumber(score) ~= math.huge then return true end",
        "      if false then return true end",
        [f"{LIFE}::test_a_copy_of_a_job_a_stock_worker_runs_is_dropped"],
        "a copy of a job a stock worker runs is run beside it by a lease worker",
    ),
    # -- RQ's lifecycle: what RQ ended stays ended (issue 10) ---------------------------------
    _m(
        "fences_ignore_what_rq_did",
        "lua/lib/lease.lua",
        "  if placed_by_rq(job_key, job_id, queue_key, rq_prefix) then return 'ended', lease_ms end",
        "",
        [f"{LIFE}::test_a_late_outcome_for_a_job_rq_ended_is_discarded_and_releases_the_lease"],
        "a worker's late outcome overwrites RQ's cancel (or stock cleanup's failure)",
    ),
    _m(
        "sweep_recovers_jobs_rq_ended",
        "lua/move_stalled_jobs_to_wait-9.lua",
        "  return untouched(found, 2) or not placed_by_rq(job_key, job_id, queue_key, rq_prefix)",
        "  return true",
        [f"{LIFE}::test_the_sweep_never_recovers_a_job_rq_ended_while_it_was_leased"],
        "a canceled (or stock-failed) job is resurrected by the sweep and runs again",
    ),
    _m(
        "sweep_recovers_jobs_rq_ended_model",
        "lua/move_stalled_jobs_to_wait-9.lua",
        "  return untouched(found, 2) or not placed_by_rq(job_key, job_id, queue_key, rq_prefix)",
        "  return true",
        [LIFE_MODEL],
        "the lifecycle model test alone finds a resurrected job",
        fast=False,
    ),
    _m(
        "sweep_recovers_a_canceled_orphan",
        "lua/move_stalled_jobs_to_wait-9.lua",
        "if not leased then return found[2] == 'queued' end",
        "if not leased then return true end",
        [f"{LIFE}::test_a_job_canceled_while_in_the_moving_list_is_not_recovered"],
        "a job canceled while in the moving list is pushed back to its queue",
    ),
    _m(
        "fence_spent_on_a_read",
        "rq_emq/fence/fencing.py",
        " or reads_only(commands):",
        ":",
        [f"{LIFE}::test_a_read_only_transaction_inside_the_finish_does_not_spend_the_fence"],
        "RQ 3 reads dependents in a transaction: the fence is spent on it, the outcome goes unfenced",
    ),
    _m(
        "long_commands_not_split",
        "rq_emq/fence/packing.py",
        "MAX_PACKED_ARGS = 1000",
        "MAX_PACKED_ARGS = 1_000_000",
        [f"{LIFE}::test_a_finish_with_a_command_longer_than_luas_unpack_limit_commits_whole"],
        "a fan-in parent's outcome half-runs: Lua's unpack fails past ~8000 arguments",
    ),
    _m(
        "later_batch_stands_in_for_a_failed_outcome",
        "rq_emq/fence/fencing.py",
        "if session.error is not None:",
        "if False:",
        [f"{LIFE}::test_once_the_fenced_outcome_failed_no_later_transaction_of_the_block_releases_the_lease"],
        "RQ 2's second failure batch (worker stats) releases the lease as if it were the outcome",
    ),
    _m(
        "swallowed_outcome_error_not_retried",
        "rq_emq/fence/job_writes.py",
        "if session.error is not None and not session.committed:",
        "if False:",
        [
            "tests/connection/test_connection_faults.py"
            "::test_a_failure_whose_outcome_meets_a_blip_is_written_once_not_dropped"
        ],
        "RQ 3 swallows a blip in its failure pipeline: the outcome is dropped and the job runs again",
    ),
    _m(
        "outbox_claims_a_requeued_job",
        "lua/claim_outbox-1.lua",
        "if found[2] == 'failed' and owner and (owner == 'outbox' or owner:sub(1, 7) == 'outbox:') then",
        "if true then",
        [f"{LIFE}::test_the_outbox_drain_never_takes_a_lease_from_a_job_requeued_since"],
        "the drain steals the lease of a job an operator requeued and another worker took",
    ),
    _m(
        "outbox_claim_shorter_than_the_callback",
        "lua/claim_outbox-1.lua",
        "math.max(claim_ms, timeout_s * 1000 + margin_ms)",
        "claim_ms",
        [f"{LIFE}::test_an_outbox_claim_outlives_the_jobs_failure_callback"],
        "a second drainer runs a failure callback that is still running",
    ),
    _m(
        "deleted_hash_finish_reads_lost",
        "lua/renew_leases-3.lua",
        "or (not owner and not indexed and redis.call('GET', prefix .. job_id .. ':lock') == owner_done)",
        "",
        [f"{LIFE}::test_a_renewal_racing_a_finish_that_deleted_the_job_reads_settled_not_lost"],
        "result_ttl=0: a renewal racing the finish reports the lease lost and the job is killed",
    ),
    _m(
        "vanished_lease_reads_settled",
        "lua/renew_leases-3.lua",
        "redis.call('GET', prefix .. job_id .. ':lock') == owner_done)",
        "redis.call('EXISTS', job_key) == 0)",
        [f"{LIFE}::test_a_lease_whose_evidence_vanished_is_lost_not_settled"],
        "after Redis lost its data the old run goes on beside the resubmitted job's",
    ),
    _m(
        "vanished_lease_reads_settled_model",
        "lua/renew_leases-3.lua",
        "redis.call('GET', prefix .. job_id .. ':lock') == owner_done)",
        "redis.call('EXISTS', job_key) == 0)",
        [LIFE_REPLAY_LOSS, LIFE_MODEL],
        "the lifecycle model finds a vanished lease read as settled (its run never stops)",
        fast=False,
    ),
    _m(
        "a_changed_field_ends_the_lease_model",
        "lua/lib/lease.lua",
        "  if placed_by_rq(job_key, job_id, queue_key, rq_prefix) then return 'ended', lease_ms end",
        "  if true then return 'ended', lease_ms end",
        [LIFE_MODEL],
        "the lifecycle model finds a stale save's run outcome discarded (the job left in no place)",
        fast=False,
    ),
    _m(
        "sweep_reads_a_changed_field_as_rqs_word_model",
        "lua/move_stalled_jobs_to_wait-9.lua",
        "  return untouched(found, 2) or not placed_by_rq(job_key, job_id, queue_key, rq_prefix)",
        "  return untouched(found, 2)",
        [LIFE_REPLAY_STALE],
        "the model's replay finds a dead holder's job a stale save overwrote never recovered",
    ),
    _m(
        "take_pops_before_it_leases",
        "lua/pop_job-3n.lua",
        "local job_id = redis.call('LINDEX', queue_key, at)",
        "local job_id = redis.call('LPOP', queue_key)",
        [f"{LIFE}::test_a_take_whose_lease_cannot_be_written_leaves_the_job_in_its_queue"],
        "a take whose lease write fails has already popped the job: lost",
    ),
    _m(
        "counts_read_loosely",
        "lua/lib/lease.lua",
        "if type(value) ~= 'string' or #value > 15 or not string.match(value, '^%d+$') then return nil end",
        "if type(value) ~= 'string' then return nil end",
        [f"{LIFE}::test_malformed_attempt_counts_read_as_absent_everywhere"],
        "emq_attempts='nan' exempts a job from max attempts forever",
    ),
    _m(
        "job_hash_stamped_every_tick",
        "rq_emq/hold/lease.py",
        "stamp_jobs = time.monotonic() - self._job_heartbeat_at >= JOB_HEARTBEAT_EVERY_S",
        "stamp_jobs = True",
        [f"{LIFE}::test_renewals_stamp_rqs_job_heartbeat_only_at_rqs_pace"],
        "renewals write the job hash every tick: a fan-in parent's WATCHed finish retries forever",
    ),
    _m(
        "stop_at_the_take_not_held_back",
        "rq_emq/intake/take.py",
        "signal.signal(stop, lambda received, frame: caught.append(received))",
        "pass",
        [
            "tests/lifecycle/test_lifecycle_processes.py"
            "::test_a_warm_stop_right_after_the_take_hands_the_job_back_at_once"
        ],
        "a warm stop between the take and its record strands the leased job",
    ),
    _m(
        "fired_watch_poisons_the_block",
        "rq_emq/fence/fencing.py",
        "except (LeaseLost, WatchError):",
        "except LeaseLost:",
        [f"{LIFE}::test_a_watch_that_fires_inside_the_fenced_finish_lets_rqs_retry_commit"],
        "a WATCH that fired in the finish is kept as the block's error: RQ's retry loop spins forever",
    ),
    _m(
        "start_does_not_record_rqs_status",
        "rq_emq/fence/packing.py",
        "extra = [word for field, value in written.items() for word in (SEEN_FIELDS[field], value)]",
        "extra = []",
        [f"{LIFE}::test_a_fenced_finish_records_the_jobs_own_max_attempts_with_its_start"],
        "the run's start leaves emq_status at queued: RQ's later changes are not recognised",
    ),
    # -- the in-flight rule (issue 20): stamps, the holder's direct writes, cancel --------------
    _m(
        "in_flight_rule_compares_the_status_only",
        "lua/lib/lease.lua",
        "for i = 0, #SEEN - 1 do",
        "for i = 0, 0 do",
        [
            f"{LIFE}::test_a_status_that_left_and_came_back_is_not_the_leases",
            f"{LIFE}::test_the_sweep_leaves_a_job_whose_status_came_back_under_another_start",
        ],
        "the ABA: a job requeued and run by a stock worker reads as still in flight; the sweep runs it twice",
    ),
    _m(
        "in_flight_rule_compares_the_status_only_processes",
        "lua/lib/lease.lua",
        "for i = 0, #SEEN - 1 do",
        "for i = 0, 0 do",
        [
            "tests/lifecycle/test_rq_features_processes.py"
            "::test_a_job_a_stock_worker_runs_after_its_lease_worker_died_is_not_recovered_under_it",
            "tests/lifecycle/test_state_machine_lifecycle.py::test_the_models_stock_actors_replay_the_status_aba",
        ],
        "a LeaseWorker's sweep recovers a job a stock worker runs: two runs overlap",
        fast=False,
    ),
    _m(
        "holders_direct_writes_unguarded",
        "rq_emq/fence/direct_writes.py",
        "if fence is None or not writes_to(key, args):",
        "if True:",
        [
            "tests/lifecycle/test_rq_features_processes.py"
            "::test_a_delayed_retry_waits_in_the_scheduled_registry[rq_emq.SimpleLeaseWorker]"
        ],
        "RQ's own set_status(SCHEDULED) of a delayed Retry reads as RQ ending the job: the retry is lost",
        fast=False,
    ),
    _m(
        "a_canceled_run_keeps_no_result",
        "rq_emq/fence/job_writes.py",
        'if self._refused_as != "canceled":',
        "if True:",
        [
            "tests/lifecycle/test_rq_features_processes.py"
            "::test_a_job_canceled_while_it_runs_keeps_its_result_and_never_runs_again[rq_emq.SimpleLeaseWorker]"
        ],
        "a job canceled while it ran loses its run's Result (RQ keeps it)",
        fast=False,
    ),
    _m(
        "sweep_expires_a_failure_ttl_0_job_before_its_callback",
        "lua/lib/lease.lua",
        "elseif ttl == 0 then",
        "elseif false then",
        [
            "tests/lifecycle/test_rq_features_processes.py"
            "::test_a_failure_ttl_0_job_failed_by_the_sweep_runs_its_failure_callback"
        ],
        "a job with failure_ttl=0 failed at max attempts never runs its on_failure callback",
        fast=False,
    ),
    # -- RQ's key layout: job and queue classes with their own namespaces ----------------------
    _m(
        "take_ignores_the_job_namespace",
        "lua/pop_job-3n.lua",
        "local job_key = job_prefix .. job_id",
        "local job_key = 'rq:job:' .. job_id",
        [f"{OPTIONS}::test_a_custom_job_class_alone_is_never_dropped_by_the_take"],
        "a custom job class's job is dropped by the take as deleted: lost",
        fast=False,
    ),
    _m(
        "sweep_ignores_the_recorded_job_namespace",
        "lua/move_stalled_jobs_to_wait-9.lua",
        "  return {-1, recorded}\n",
        "  local _ = 0\n",
        [f"{OPTIONS}::test_reaper_sweeps_custom_namespaces_given_the_classes_and_refuses_without"],
        "a sweeper with another job class drops every leased job from the lease index",
        fast=False,
    ),
    # -- a horse that died without an outcome (recover_crashed_job, rq_emq/recover/horse_crash.py) ----------
    _m(
        "crash_recovery_no_token_check",
        "lua/recover_crashed_job-10.lua",
        "if state ~= 'held' then return {0, state, MALFORMED} end\n",
        "if state == 'ended' then return {0, state, MALFORMED} end\n",
        [f"{CRASH}::test_a_crash_recovery_by_a_worker_that_lost_its_lease_changes_nothing"],
        "a worker whose horse died after the job was recovered elsewhere requeues a job it no longer owns",
    ),
    _m(
        "crash_recovery_ignores_rqs_end",
        "lua/recover_crashed_job-10.lua",
        "if state ~= 'held' then return {0, state, MALFORMED} end\n",
        "if state == 'lost' then return {0, state, MALFORMED} end\n",
        [f"{CRASH}::test_a_job_rq_ended_meanwhile_is_left_as_rq_put_it"],
        "a job RQ canceled while its horse ran is queued again when the horse dies",
    ),
    _m(
        "crash_refunds_the_attempt",
        "lua/recover_crashed_job-10.lua",
        "count(stats_key, 'crashed', 1)",
        "count(stats_key, 'crashed', 1); redis.call('HINCRBY', job_key, 'emq_attempts', -1)",
        [f"{HORSE}::test_a_poison_pill_fails_after_exactly_max_attempts_runs_naming_the_cause"],
        "a poison pill that kills every horse runs forever",
        fast=False,
    ),
    _m(
        "crash_never_fails_at_max_attempts",
        "lua/recover_crashed_job-10.lua",
        "if not exhausted then",
        "if true then",
        [f"{CRASH}::test_at_max_attempts_the_job_fails_through_the_outbox_naming_each_cause"],
        "a poison pill is requeued forever, at the front, blocking its queue",
    ),
    _m(
        "crash_history_unbounded",
        "lua/recover_crashed_job-10.lua",
        "while #history > HISTORY do table.remove(history, 1) end",
        "local _ = 0",
        [f"{CRASH}::test_the_history_is_bounded"],
        "a job crashing again and again grows its hash without bound",
    ),
    _m(
        "crash_history_keeps_an_earlier_run",
        "lua/recover_crashed_job-10.lua",
        "if type(last) == 'table' and tonumber(last[1]) and tonumber(last[1]) < attempts then",
        "if type(last) == 'table' then",
        [f"{CRASH}::test_a_history_left_from_an_earlier_run_of_attempts_is_dropped"],
        "a failure reason names crashes of an earlier run of attempts",
    ),
    _m(
        "finish_keeps_the_crash_history",
        "lua/finish_job-6.lua",
        "if ARGV[4] ~= 'outbox_completed' then ended[#ended + 1] = 'emq_crashes' end",
        "local _ = 0",
        [f"{WATCHED}::test_a_watched_commit_leaves_the_job_as_the_fenced_script_would"],
        "a job that finished keeps crashes that no longer count",
        fast=False,
    ),
    _m(
        "outbox_drops_the_crash_history",
        "lua/finish_job-6.lua",
        "if ARGV[4] ~= 'outbox_completed' then ended[#ended + 1] = 'emq_crashes' end",
        "ended[#ended + 1] = 'emq_crashes'",
        [f"{HORSE}::test_a_poison_pill_fails_after_exactly_max_attempts_runs_naming_the_cause"],
        "a job failed at max attempts loses the record of what killed it",
        fast=False,
    ),
    _m(
        "worker_sent_kill_is_a_crash",
        "rq_emq/recover/horse_crash.py",
        "self._horse_killed_by_worker = True",
        "self._horse_killed_by_worker = False",
        [f"{HORSE}::test_a_horse_the_worker_killed_itself_keeps_rqs_meaning"],
        "RQ's own kill of a horse past its timeout requeues the job instead of failing it",
        fast=False,
    ),
    _m(
        "untrusted_lease_is_a_crash",
        "rq_emq/recover/horse_crash.py",
        "return not (lease.lost or lease.settled or lease.expired) and time.monotonic() <= lease.valid_until",
        "return True",
        [f"{HORSE}::test_a_horse_past_its_local_lease_deadline_is_no_crash_of_its_workers"],
        "a horse that fenced itself at its lease deadline is recovered by its worker too, racing the sweep",
        fast=False,
    ),
    _m(
        "untrusted_horse_death_failed_by_rq",
        "rq_emq/recover/horse_crash.py",
        "if at_deadline or not _trusted(lease):\n            # The horse fenced itself",
        "if at_deadline or not _trusted(lease):\n            return  # The horse fenced itself",
        [f"{HORSE}::test_a_horse_that_dies_after_its_worker_stopped_trusting_the_lease_is_left_to_the_sweep"],
        "a horse that fenced itself before its lease was marked lost: RQ fails its job through the fence",
    ),
    _m(
        "soak_crash_bound_is_the_lease_bound",
        "soak/recoverybound.py",
        "            bound = cfg.crash_bound_s\n",
        "            bound = cfg.bound_s\n",
        [f"{SOAK}::test_a_horse_crash_must_be_back_within_the_crash_bound_not_the_lease_bound"],
        "the soak lets a horse crash's job wait for the sweep (lease + 2 sweeps) unnoticed",
    ),
    _m(
        "crash_leaves_the_horses_children_running",
        "rq_emq/recover/horse_crash.py",
        "        me._end_dead_run(retpid)\n",
        "",
        [f"{HORSE}::test_the_dead_horses_child_processes_end_before_the_job_runs_again"],
        "an OOM-killed horse's subprocess runs on beside the job's next run",
        fast=False,
    ),
    _m(
        "crash_recovery_lets_rq_fail_the_job_too",
        "rq_emq/recover/horse_crash.py",
        "self._recover_crashed(job, lease, cause, rusage)\n        raise _CrashHandled\n",
        "self._recover_crashed(job, lease, cause, rusage)\n        return\n",
        [f"{HORSE}::test_a_horse_that_dies_without_an_outcome_costs_one_attempt_and_the_job_runs_again"],
        "RQ's failure of a recovered job is still tried (and refused by the fence)",
    ),
    # -- a stopped run is stopped whole (issue 21) -------------------------------------------
    _m(
        "watchdog_never_started",
        "rq_emq/run/lease_mixin.py",
        "self._start_watchdog()  # forked before RQ's and our threads start",
        "pass",
        [
            f"{WHOLE}::test_a_job_holding_the_gil_past_its_lease_ends_before_the_job_runs_elsewhere[rq_emq.LeaseWorker]"
        ],
        "a frozen worker's horse in C code (GIL held, its fence thread starved) runs on beside its recovery",
        fast=False,
    ),
    _m(
        "watchdog_never_ends_a_run",
        "rq_emq/run/watchdog.py",
        "kill_tree(pid, group=group and pid != worker)",
        "set()",
        [
            f"{WHOLE}::test_a_job_holding_the_gil_past_its_lease_ends_before_the_job_runs_elsewhere[rq_emq.SimpleLeaseWorker]"
        ],
        "a SimpleLeaseWorker job in C code starves renewals, clock and self-kill: it overlaps its recovery",
        fast=False,
    ),
    _m(
        "watchdog_outlives_its_worker",
        "rq_emq/run/watchdog.py",
        "if os.getppid() != worker:  # the worker is gone: end its run, hand its lease back, go",
        "if False:",
        [
            f"{WHOLE}::test_the_watchdog_holds_no_connection_sleeps_while_idle_and_dies_with_its_worker[rq_emq.LeaseWorker]"
        ],
        "a dead worker's watchdog lingers, and never ends the dead worker's horse",
        fast=False,
    ),
    _m(
        "simple_worker_run_not_watched",
        "rq_emq/run/simple_run.py",
        "self._horse_deadline.reset(me._run_deadline(lease), pid=os.getpid())",
        "pass",
        [
            f"{WHOLE}::test_a_job_holding_the_gil_past_its_lease_ends_before_the_job_runs_elsewhere[rq_emq.SimpleLeaseWorker]"
        ],
        "the watchdog never learns of a SimpleLeaseWorker's run: a job holding the GIL outlives its lease",
        fast=False,
    ),
    _m(
        "horse_leaves_its_watchdog_asleep",
        "rq_emq/run/horse_fence.py",
        "                os.kill(watchdog, POKE)\n",
        "                pass\n",
        [
            f"{WATCHDOG}::test_a_run_whose_worker_froze_before_telling_the_watchdog_is_still_ended_at_its_deadline"
        ],
        "a worker frozen between the fork and its poke leaves its watchdog asleep past the run's deadline",
    ),
    _m(
        "horse_pokes_whatever_holds_the_watchdogs_pid",
        "rq_emq/run/horse_fence.py",
        "if watchdog and parent_and_group(watchdog)[0] == os.getppid():",
        "if watchdog:",
        [f"{WATCHDOG}::test_a_horse_never_signals_a_process_that_is_not_its_workers_watchdog"],
        "a horse's poke (SIGUSR2, whose default ends a process) hits whatever reused a dead watchdog's pid",
    ),
    _m(
        "tree_ignores_other_sessions",
        "rq_emq/run/process_tree.py",
        "for child in children_of(todo.pop()):",
        "for child in list(children_of(todo.pop()))[:0]:",
        [f"{WHOLE}::test_kill_tree_ends_a_process_its_group_and_descendants_in_other_sessions"],
        "a stop ends the horse's group only: a child in a session of its own works on",
    ),
    _m(
        "stop_kills_only_the_group",
        "rq_emq/run/run_guard.py",
        "kill_tree(pid, group=True)",
        "pass",
        [f"{WHOLE}::test_rqs_stop_command_ends_the_jobs_child_processes[session]"],
        "RQ's killpg alone: a job's child in a session of its own survives the stop",
        fast=False,
    ),
    # -- a SimpleLeaseWorker's stopped run is over only when its process is (issue 46) -------
    _m(
        "simple_stop_hands_back_as_the_frame_unwinds",
        "rq_emq/run/simple_run.py",
        "            self._end_process(stop)\n        # a job that returned",
        "            self._hand_back_leases()  # type: ignore[attr-defined]\n        # a job that returned",
        [
            f"{SIMPLE_STOP}::test_a_cold_stop_of_a_job_working_on_threads_hands_it_back_once_its_process_is_gone[pool]"
        ],
        "a cold-stopped job moves as its frame unwinds, while threads it started work on beside the next run",
        fast=False,
    ),
    _m(
        "simple_stop_leaves_the_process_running",
        "rq_emq/run/simple_run.py",
        "            os._exit(stop.code)",
        "            return",
        [
            f"{SIMPLE_STOP}::test_a_lost_lease_ends_the_worker_process_and_its_jobs_threads_with_a_non_zero_exit[thread]",
            f"{EVIDENCE}::test_a_simple_worker_whose_running_job_is_deleted_and_enqueued_again_ends_before_the_copy_runs[pool]",
        ],
        "a stopped run's frame unwinds, its threads tick on, and the worker process lives on",
        fast=False,
    ),
    _m(
        "watchdog_ignores_the_hand_back_mode",
        "rq_emq/run/watchdog.py",
        "hand_back = deadline.hands_back",
        "hand_back = False",
        [
            f"{SIMPLE_STOP}::test_a_cold_stop_of_a_job_working_on_threads_hands_it_back_once_its_process_is_gone[thread]"
        ],
        "a cold stop's job is recovered as a crash: an attempt counted for a stop, no fault of the job",
        fast=False,
    ),
    _m(
        "simple_stop_leaves_the_hand_back_mode_unset",
        "rq_emq/run/simple_run.py",
        "                deadline.hand_back_on_death()",
        "                pass",
        [
            f"{STOP_ORDER}::test_a_cold_stop_hands_the_job_back_only_after_its_finally_block_has_run[second-sigterm]"
        ],
        "a cold stop's job is recovered as a crash: an attempt counted for a stop, no fault of the job",
        fast=False,
    ),
    _m(
        "simple_end_leaves_its_death_unregistered",
        "rq_emq/run/simple_run.py",
        "_within(me.register_death, budget)",
        "pass",
        [
            f"{SIMPLE_STOP}::test_a_lost_lease_ends_the_worker_process_and_its_jobs_threads_with_a_non_zero_exit[pool]"
        ],
        "a worker ended by a stop stays listed by `rq info` until its key expires",
        fast=False,
    ),
    _m(
        "horse_not_a_subreaper",
        "rq_emq/run/worker.py",
        "become_subreaper()",
        "pass",
        [f"{WHOLE}::test_rqs_stop_command_ends_the_jobs_child_processes[orphan]"],
        "a daemonized child (its parent exited) is re-parented to init, out of any stop's reach",
        fast=False,
    ),
    _m(
        "lifeline_not_armed",
        "rq_emq/run/worker.py",
        "self._arm_lifeline()",
        "pass",
        [
            f"{WHOLE}::test_a_horse_holding_the_gil_ends_at_once_when_its_worker_and_watchdog_die_together"
            "[rq_emq.LeaseWorker-forked for its job]"
        ],
        "a GIL-holding horse whose worker and watchdog die together runs on beside the job's next run",
        fast=False,
    ),
    _m(
        "lifeline_not_armed_in_a_spare",
        "rq_emq/run/fork_ahead.py",
        "me._arm_lifeline()",
        "pass",
        [
            f"{WHOLE}::test_a_horse_holding_the_gil_ends_at_once_when_its_worker_and_watchdog_die_together"
            "[rq_emq.LeaseWorker-forked ahead]"
        ],
        "a horse forked ahead runs its job unarmed: a double fault leaves it running",
        fast=False,
    ),
    _m(
        "lifeline_write_end_kept_by_forks",
        "rq_emq/run/lifeline.py",
        "os.register_at_fork(after_in_child=_close_write_ends)",
        "pass",
        [
            f"{WHOLE}::test_a_horse_holding_the_gil_ends_at_once_when_its_worker_and_watchdog_die_together"
            "[rq_emq.LeaseWorker-forked for its job]"
        ],
        "a horse holding the lifeline's write end itself never sees it close",
        fast=False,
    ),
    _m(
        "watchdog_not_holding_the_lifeline",
        "rq_emq/run/watchdog.py",
        "pass_fds=(fd, self.lifeline_fd) if self.lifeline_fd >= 0 else (fd,)",
        "pass_fds=(fd,)",
        [f"{WHOLE}::test_a_horse_outlives_its_worker_while_its_watchdog_holds_the_lifeline"],
        "the horse's group dies with its worker: its children in other sessions escape the watchdog",
        fast=False,
    ),
    _m(
        "dead_watchdog_replaced_only_by_the_next_run",
        "rq_emq/run/run_guard.py",
        "self._keeper.start()",
        "pass",
        [
            f"{WHOLE}::test_a_watchdog_killed_mid_run_is_replaced_at_once_so_a_gil_holding_horse_still_ends[kill]"
        ],
        "a run goes on without its backstop until its worker's next run",
        fast=False,
    ),
    _m(
        "library_lines_of_the_sweeper_reach_the_handlers",
        "rq_emq/reporter.py",
        'if getattr(_local, "renewal", False) or os.getpid() == _libraries_kept_off_in:',
        'if getattr(_local, "renewal", False):',
        [
            "tests/shared/test_reporter.py::test_a_librarys_line_made_on_any_thread_of_the_worker_goes_to_the_reporter",
            "tests/run/test_slow_log_handler.py::"
            "test_redis_stalls_under_a_log_handler_that_takes_seconds_per_record_lose_no_lease",
        ],
        "redis-py's line about a sweep's failed command holds the shared connection through a slow handler",
    ),
    _m(
        "simple_workers_group_left_running_at_its_death",
        "rq_emq/run/watchdog.py",
        "_killpg(worker)  # its job's processes",
        "pass  # its job's processes",
        [f"{WHOLE}::test_a_simple_worker_killed_alone_leaves_no_child_of_its_run_beside_the_next"],
        "a SIGKILLed SimpleLeaseWorker's job child ticks on beside the job's next run",
        fast=False,
    ),
    _m(
        "finish_reads_the_lease_off_a_closed_connection",
        "rq_emq/fence/fencing.py",
        "            except ResponseError:\n                # an error reply leaves the connection in step",
        "            except BaseException:\n                # an error reply leaves the connection in step",
        [
            "tests/fence/test_fenced_writes.py::"
            "test_a_finishs_watched_read_cut_by_a_restarting_redis_is_a_watch_error_rqs_loop_retries"
        ],
        "a finish cut by a restarting Redis fails a job whose code succeeded, its failure callback run",
    ),
    _m(
        "horse_fence_ends_only_its_pid",
        "rq_emq/run/horse_fence.py",
        "kill_tree(os.getpid(), group=os.getpgrp() == os.getpid())",
        "os.kill(os.getpid(), signal.SIGKILL)",
        [f"{WHOLE}::test_a_horse_whose_watchdog_is_gone_and_worker_frozen_ends_itself_whole_at_its_deadline"],
        "a horse fencing itself without its watchdog leaves the job's children working",
        fast=False,
    ),
    # -- the job's own lease (rq_emq.current_lease()) -----------------------------------------
    _m(
        "fencing_token_not_raised_by_a_grant",
        "lua/lib/lease.lua",
        "math.max((count_value((hash_field(hash, 'emq_fence'))) or 0) + 1, now)",
        "1",
        [f"{LEASES}::test_the_fencing_token_rises_on_every_grant_and_nothing_lowers_it"],
        "a replaced holder's fencing token equals its successor's: an outside store cannot refuse it",
    ),
    _m(
        "fencing_token_restarts_after_redis_lost_its_data",
        "lua/lib/lease.lua",
        "math.max((count_value((hash_field(hash, 'emq_fence'))) or 0) + 1, now)",
        "(count_value((hash_field(hash, 'emq_fence'))) or 0) + 1",
        [f"{LEASES}::test_a_token_granted_after_redis_lost_its_data_is_above_every_token_before"],
        "after a restart without persistence the new holder's token is below the old run's",
    ),
    _m(
        "fencing_token_restarts_after_redis_lost_its_data_model",
        "lua/lib/lease.lua",
        "math.max((count_value((hash_field(hash, 'emq_fence'))) or 0) + 1, now)",
        "(count_value((hash_field(hash, 'emq_fence'))) or 0) + 1",
        [LIFE_REPLAY_LOSS, LIFE_MODEL],
        "the lifecycle model finds a token granted after the loss of Redis's data not above the old",
        fast=False,
    ),
    _m(
        "fenced_pipeline_checks_only_its_first_execute",
        "rq_emq/run/job_lease.py",
        "        self._emq_session = JobWriteSession(self._emq_fence)\n",
        "        self._emq_session = getattr(self, '_emq_session', None)"
        " or JobWriteSession(self._emq_fence)\n",
        [f"{JOB_LEASE}::test_a_fenced_pipeline_writes_while_the_lease_holds_and_nothing_once_it_is_lost"],
        "a job's fenced pipeline, once committed, sends later writes unchecked after its lease is lost",
    ),
    _m(
        "progress_timeout_never_checked",
        "lua/renew_leases-3.lua",
        "if progress_ms and without_progress(job_key, report, progress_ms, job_id, token) then",
        "if false then",
        [f"{REPORTS}::test_a_job_silent_past_its_progress_timeout_is_refused_for_good_and_its_run_stopped"],
        "a job hung on a dead socket while its worker is healthy holds its lease forever",
    ),
    _m(
        "no_progress_revived_by_a_late_report",
        "lua/renew_leases-3.lua",
        "  if found[1] then return true end\n",
        "",
        [f"{REPORTS}::test_a_job_silent_past_its_progress_timeout_is_refused_for_good_and_its_run_stopped"],
        "a report in a tick whose refusal reply was lost renews a lease its holder already stopped",
    ),
    _m(
        "report_counts_no_progress",
        "lua/renew_leases-3.lua",
        "        fields[#fields + 1] = 'emq_progress_at'\n"
        "        fields[#fields + 1] = string.format('%d', now)\n",
        "",
        [f"{REPORTS}::test_a_job_that_reports_within_its_progress_timeout_keeps_its_lease"],
        "a job that reports on time is stopped at its progress timeout all the same",
    ),
    _m(
        "report_outlives_its_lease",
        "lua/lib/lease.lua",
        "redis.call('HDEL', job_key, 'emq_token', unpack(NOTES))",
        "redis.call('HDEL', job_key, 'emq_token')",
        [f"{REPORTS}::test_a_report_goes_when_the_lease_ends_by_a_finish_a_hand_back_or_a_recovery"],
        "a recovered job shows its dead run's report (and progress clock) as if it were live",
    ),
    _m(
        "horse_leads_no_session_of_its_own",
        "rq_emq/run/worker.py",
        "        lead_own_session()\n",
        "        pass\n",
        [f"{HORSE}::test_the_dead_horses_child_processes_end_before_the_job_runs_again"],
        "a job's child in a process group of its own outlives its OOM-killed horse",
        fast=False,
    ),
    # -- the panel's escaping and policy (rq_emq/operate/dashboard) ---------------------------
    _m(
        "panel_tooltip_through_tojson",
        "rq_emq/operate/dashboard/templates/rq_emq/panels.html",
        'title="{{ report_json(lease.report) }}"',
        'title="{{ lease.report|tojson }}"',
        [f"{DASHBOARD}::test_a_reports_tooltip_is_the_whole_report_and_adds_no_attribute"],
        "a report's note breaks out of its tooltip into live attributes (stored XSS)",
    ),
    _m(
        "panel_policy_allows_inline_handlers",
        "rq_emq/operate/dashboard/csp.py",
        '"\'none\'" if script_hashes is None else " ".join(sources)',
        "\"'self' 'unsafe-inline'\"",
        [f"{DASHBOARD}::test_the_page_lets_run_only_its_own_inline_scripts_and_the_fragment_none"],
        "an escape missed anywhere on the panel runs the attacker's handler",
    ),
    _m(
        "dashboard_listens_on_every_address",
        "rq_emq/operate/cli_dashboard.py",
        '"--bind", "-b", default="127.0.0.1"',
        '"--bind", "-b", default="0.0.0.0"',
        [f"{DASHBOARD}::test_the_dashboard_listens_on_loopback_unless_told_otherwise"],
        "rq-dashboard's unauthenticated write actions are open to the network by default",
    ),
    # -- the dashboard's guard (rq_emq/operate/dashboard/guard.py) ----------------------------
    _m(
        "guard_takes_another_origin_for_its_own",
        "rq_emq/operate/dashboard/guard.py",
        'return parts.scheme in ("http", "https") and parts.netloc.lower() == req.host.lower()',
        'return parts.scheme in ("http", "https")',
        [f"{GUARD}::test_no_action_takes_effect_from_another_sites_page"],
        "another site's page, in a browser that sends no fetch metadata, deletes jobs (CSRF)",
    ),
    _m(
        "guard_takes_same_site_for_same_origin",
        "rq_emq/operate/dashboard/guard.py",
        'return site == "same-origin"',
        'return site in ("same-origin", "same-site")',
        [f"{GUARD}::test_no_action_takes_effect_from_another_sites_page"],
        "a page on another port of the same host drives the dashboard's actions",
    ),
    _m(
        "guard_lets_an_action_take_a_get",
        "rq_emq/operate/dashboard/guard.py",
        'if request.method != "POST":',
        'if request.method not in ("POST", "GET"):',
        [f"{GUARD}::test_an_action_answers_a_get_with_405_even_where_rq_dashboard_takes_one"],
        "an <img> on any page requeues every failed job through rq-dashboard's GET",
    ),
    _m(
        "guard_answers_any_host_name",
        "rq_emq/operate/dashboard/guard.py",
        'if "*" not in allowed and not _host_allowed(_name(request.host), allowed):',
        'if "*" in allowed and not _host_allowed(_name(request.host), allowed):',
        [f"{GUARD}::test_a_host_name_it_was_not_given_is_refused"],
        "a DNS-rebinding page reads and drives the dashboard",
    ),
    _m(
        "rq_dashboards_pages_without_a_policy",
        "rq_emq/operate/dashboard/guard.py",
        'response.headers["Content-Security-Policy"] = policy(scripts, templates_compile=True)',
        "pass",
        [f"{GUARD}::test_every_page_runs_only_its_own_scripts_and_is_never_framed"],
        "a queue name or exception text runs its markup's script on rq-dashboard's pages",
    ),
    # -- the record the dashboard reads (lua/lib/record.lua) -----------------------------------
    _m(
        "recovery_not_recorded",
        "lua/move_stalled_jobs_to_wait-9.lua",
        "        record_event(prefix, counts, 'recovered', job_id, holder, why)\n",
        "",
        [
            f"{DASHBOARD}::test_stalls_recoveries_crashes_poison_pills_and_refused_outcomes_are_listed_with_the_chart"
        ],
        "the dashboard shows a stall but never its recovery",
    ),
    _m(
        "event_stream_uncapped",
        "lua/lib/record.lua",
        "'MAXLEN', '~', EVENTS_KEPT, '*'",
        "'*'",
        [f"{SWEEP_RECORD}::test_the_event_stream_keeps_about_a_thousand_entries_whatever_happens"],
        "the events stream grows without bound in Redis's memory",
    ),
    _m(
        "stale_minute_slot_added_to",
        "lua/lib/record.lua",
        "if at ~= tostring(minute) then",
        "if at == false then",
        [f"{SWEEP_RECORD}::test_the_minute_ring_has_a_fixed_size_and_starts_a_stale_slot_again"],
        "an hour-old minute's counts are added to this minute's in the chart",
    ),
    # -- bad data never wedges a queue (issue 33, rule 4: lua/lib/own_keys.lua) ---------------
    _m(
        "malformed_counter_fails_the_take",
        "lua/lib/own_keys.lua",
        "local reply = redis.pcall('HINCRBY', key, field, n)",
        "local reply = redis.call('HINCRBY', key, field, n)",
        [f"{BAD_KEYS}::test_a_take_with_malformed_stats_leases_the_job_whole_and_logs_the_key_once"],
        "a stats field that is no integer fails the take after its lease writes: the job half-claimed",
    ),
    _m(
        "index_of_another_type_not_replaced",
        "lua/lib/own_keys.lua",
        "  redis.call('DEL', key)\n",
        "  do return error(reply) end\n",
        [f"{BAD_KEYS}::test_an_index_of_another_type_is_replaced_and_each_live_lease_indexed_again"],
        "a leases index overwritten with a string fails every take and renewal of the queue",
    ),
    _m(
        "index_of_another_type_read_as_an_error",
        "lua/lib/own_keys.lua",
        "    return empty, true\n",
        "    return error(reply)\n",
        [f"{BAD_KEYS}::test_an_index_of_another_type_is_replaced_and_each_live_lease_indexed_again"],
        "a renewal reading a clobbered leases index fails, and every lease of the queue is lost",
    ),
    _m(
        "replaced_index_drops_live_leases",
        "lua/renew_leases-3.lua",
        "if owner == token and (indexed or unreadable) then",
        "if owner == token and indexed then",
        [f"{BAD_KEYS}::test_an_index_of_another_type_is_replaced_and_each_live_lease_indexed_again"],
        "a live holder whose index was clobbered loses its lease; the sweep can no longer see the job",
    ),
    _m(
        "malformed_events_stream_fails_the_sweep",
        "lua/lib/record.lua",
        "local added = redis.pcall('XADD'",
        "local added = redis.call('XADD'",
        [f"{BAD_KEYS}::test_the_sweep_recovers_with_its_record_malformed_and_says_which_keys"],
        "an events key of another type fails the sweep after it moved jobs",
    ),
    _m(
        "sweep_key_without_expiry_refuses_every_round",
        "lua/move_stalled_jobs_to_wait-9.lua",
        "  if redis.call('PTTL', sweep_key) ~= -1 then return {0} end",
        "  do return {0} end",
        [f"{BAD_KEYS}::test_a_rate_limit_key_without_an_expiry_does_not_stop_the_rounds"],
        "a rate-limit key set without an expiry stops the queue's sweep forever",
    ),
    _m(
        "rollback_writes_before_checking_rqs_keys",
        "lua/release_leases_to_rq-6.lua",
        "if refused(redis.pcall('LLEN', queue_key)) then",
        "if false then",
        [f"{BAD_KEYS}::test_rollback_hands_back_every_queue_it_can_and_names_the_one_it_cannot"],
        "rollback marks a job queued, then fails to push it to a queue list of another type",
    ),
    _m(
        "malformed_key_logged_per_job",
        "rq_emq/malformed.py",
        "            if (key, what) in _logged:",
        "            if False:",
        [f"{BAD_KEYS}::test_a_take_with_malformed_stats_leases_the_job_whole_and_logs_the_key_once"],
        "a worker logs a malformed key on every take instead of once",
    ),
    # -- a job's fenced pipeline commits as MULTI/EXEC does -------------------------------------
    _m(
        "fenced_pipeline_half_runs",
        "lua/guard_job_write-6.lua",
        "if ARGV[6] == '1' then",
        "if false then",
        [f"{ABORTS}::test_a_command_multi_refuses_as_queued_aborts_the_whole_block_writing_nothing"],
        "a fenced pipeline with a wrong-arity command commits the commands before it",
    ),
    _m(
        "fenced_pipeline_ignores_the_acl",
        "lua/lib/lease.lua",
        "    if redis.acl_check_cmd then",
        "    if false then",
        [f"{ABORTS}::test_a_command_the_acl_denies_aborts_the_whole_block_as_exec_does"],
        "a fenced pipeline with a command the ACL denies commits the commands before it (Redis >= 7)",
    ),
    # -- settings from one source, typos caught (issue 34, item 5) -----------------------------
    _m(
        "settings_module_ignored",
        "rq_emq/run/startup.py",
        "module = cli_settings() if module is None else module_settings(module)",
        "module = {} if module is None else module_settings(module)",
        [f"{WORKER_SETTINGS}::test_a_bad_value_in_the_c_module_stops_the_worker_in_one_line"],
        "a worker runs with the defaults whatever RQ_EMQ_* its rq worker -c module sets",
    ),
    _m(
        "misspelled_setting_not_warned",
        "rq_emq/settings.py",
        "        if closest:",
        "        if False:",
        [f"{SETTINGS_T}::test_a_misspelled_name_is_warned_about_once_naming_the_closest_setting"],
        "RQ_EMQ_LEASEMS=5000 is silently ignored: the worker runs a 30 s lease",
    ),
    _m(
        "hook_signature_unchecked",
        "rq_emq/events.py",
        "    _require_one_argument(path, target)",
        "    pass",
        [f"{SETTINGS_T}::test_an_event_hook_that_cannot_take_an_event_is_refused_at_startup"],
        "a hook that cannot take an event starts, then fails on every event, logged far from startup",
    ),
    _m(
        "progress_timeout_not_held",
        "rq_emq/run/dequeue.py",
        "        if asked_ms >= floor:",
        "        if True:",
        [f"{SETTINGS_T}::test_a_progress_timeout_shorter_than_two_renew_intervals_is_held_to_them"],
        "a job asking for less than the worker can check is stopped by whichever renewal it falls on",
    ),
    _m(
        "evicting_redis_unsaid",
        "rq_emq/run/startup.py",
        "    warn_if_evicting(info, where)",
        "    pass",
        [f"{EVICTION}::test_the_check_reads_the_policy_from_its_one_info_without_config"],
        "a worker on an allkeys-lru Redis starts silently, and evicted jobs read as lost leases",
    ),
    # -- logs an operator can read (issue 34, item 4) -------------------------------------------
    _m(
        "rq_emq_lines_without_handler",
        "rq_emq/run/logs.py",
        "        logger.addHandler(handler)",
        "        pass",
        [
            f"{WORKER_LOGS}::test_a_recovery_line_has_a_time_a_level_and_the_worker_and_rqs_failed_line_is_gone"
        ],
        "our lines go to Python's last resort: no time, no level, no worker, INFO dropped",
    ),
    _m(
        "rq_emq_lines_ignore_quiet",
        "rq_emq/run/logs.py",
        "    logger.setLevel(level_of(logging_level))",
        "    logger.setLevel(logging.INFO)",
        [f"{WORKER_LOGS}::test_info_lines_of_ours_show_by_default_and_quiet_drops_them"],
        "rq worker --quiet still prints our INFO lines",
    ),
    _m(
        "rq_emq_handler_beside_the_applications",
        "rq_emq/run/logs.py",
        "    elif has_handler(logger):",
        "    elif False:",
        [f"{LOGS}::test_where_the_application_configured_logging_nothing_is_added"],
        "an application that configured logging gets our lines twice, once in a format not its own",
    ),
    _m(
        "rq_lines_stay_text_in_json_mode",
        "rq_emq/run/logs.py",
        "        ColorizingStreamHandler.format = _format_as_json  # type: ignore[method-assign]",
        "        pass",
        [f"{LOGS}::test_in_json_mode_rqs_own_handlers_write_json_and_give_their_format_back_after"],
        "RQ_EMQ_LOG_FORMAT=json: RQ's lines stay text on the same stream, half the log unparsed",
    ),
    _m(
        "pool_members_warn_again",
        "rq_emq/run/startup.py",
        '    os.environ[ENV_POOL_CHECKED] = "1"',
        "    pass",
        [f"{WORKER_SETTINGS}::test_a_worker_pool_warns_once_for_all_its_members"],
        "rq worker-pool -n 8 says each misspelled setting nine times, once by the pool and once per member",
    ),
    _m(
        "fenced_outcome_job_ok_kept",
        "rq_emq/run/lease_mixin.py",
        "if self._discarded_job_id is not None and any(",
        "if self._discarded_job_id is None and any(",
        [f"{WORKER_LOGS}::test_an_outcome_the_fence_discarded_is_no_job_ok_in_the_log"],
        "RQ says Job OK, result kept, for an outcome the fence discarded",
    ),
    _m(
        "horse_death_failed_line_kept",
        "rq_emq/recover/horse_crash.py",
        "            and compat.RQ_HORSE_DIED_LINE in record.getMessage().lower()",
        "            and False",
        [
            f"{WORKER_LOGS}::test_a_recovery_line_has_a_time_a_level_and_the_worker_and_rqs_failed_line_is_gone"
        ],
        "RQ says the job failed (work-horse terminated unexpectedly) for a job we recovered",
    ),
    _m(
        "lease_stop_traceback_kept",
        "rq_emq/run/lease_mixin.py",
        "        if not isinstance(error, LeaseJobInterrupted | LeaseLost):",
        "        if True:",
        [f"{WORKER_LOGS}::test_a_run_whose_guarded_write_was_refused_is_one_line_not_a_traceback"],
        "a run whose guarded write was refused prints a whole traceback, as if the job failed",
    ),
    _m(
        "unstarted_run_failure_callback_kept",
        "rq_emq/fence/job_writes.py",
        "        compat.drop_failure_callback(job)\n        raise LeaseJobInterrupted(",
        "        raise LeaseJobInterrupted(",
        [
            "tests/run/test_worker_direct.py::"
            "test_a_job_whose_lease_is_lost_before_its_run_begins_runs_no_failure_callback"
        ],
        "a job whose lease was lost before its run began has its failure callback run",
    ),
    _m(
        "stop_leaves_watchdog_asleep",
        "rq_emq/run/simple_run.py",
        "            if self._watchdog is not None:\n"
        "                self._watchdog.poke()\n        ender = threading.Thread(",
        "        ender = threading.Thread(",
        [
            "tests/run/test_stop_order.py::"
            "test_a_simple_worker_frozen_after_a_stop_is_ended_by_its_watchdog_at_the_self_kill_moment"
        ],
        "a SimpleLeaseWorker frozen after a stop is ended by its watchdog a lease late",
    ),
    _m(
        "told_horse_left_defunct",
        "rq_emq/run/worker.py",
        "            self._horse_end.reap_exited(block=True)  # no <defunct> horse beside an idle worker",
        "            pass",
        ["tests/run/test_horse_end.py::test_a_lease_worker_leaves_no_defunct_horse_once_idle"],
        "a horse that told its end is left <defunct> beside an idle worker",
    ),
    _m(
        "horse_end_told_before_the_run",
        "rq_emq/run/worker.py",
        "        done = super().perform_job(job, *args, **kwargs)\n"
        "        if self.is_horse and self._horse_end",
        "        if self.is_horse and self._horse_end is not None:\n"
        "            self._horse_end.tell_done(self.connection)\n"
        "        done = super().perform_job(job, *args, **kwargs)\n        if False and self._horse_end",
        [
            "tests/run/test_horse_end.py::"
            "test_a_lease_worker_takes_its_next_job_only_once_the_horse_has_ended_its_run"
        ],
        "the horse tells its worker its run is over before the run: the next job runs beside it",
    ),
    _m(
        "deadline_kill_read_from_the_lease_alone",
        "rq_emq/recover/horse_crash.py",
        "at_deadline = deadline is not None and deadline.ended_at_deadline",
        "at_deadline = False",
        [
            "tests/recover/test_horse_crash.py::"
            "test_a_horse_ended_at_its_deadline_is_no_crash_though_a_late_renewal_landed_after"
        ],
        "a run its watchdog ended at the deadline, then a late renewal: a crash, blaming the OOM killer",
    ),
    _m(
        "horse_fence_kills_without_saying_so",
        "rq_emq/run/horse_fence.py",
        "            self.end_at_deadline()\n            kill_tree(",
        "            kill_tree(",
        [
            "tests/recover/test_horse_crash.py::"
            "test_a_horse_ended_at_its_deadline_is_no_crash_though_a_late_renewal_landed_after"
        ],
        "a horse that fenced itself at the deadline reads as a crash once a late renewal landed",
    ),
    _m(
        "watchdog_kills_without_saying_so",
        "rq_emq/run/watchdog.py",
        "                if deadline.pid == pid:  # still the run read (not a next one's reset memory)\n"
        "                    deadline.end_at_deadline()  # the worker reads this death as the clock's stop\n",
        "",
        [
            "tests/run/test_watchdog.py::"
            "test_a_run_whose_worker_froze_before_telling_the_watchdog_is_still_ended_at_its_deadline"
        ],
        "a run the watchdog ended at the deadline reads as a crash once a late renewal landed",
    ),
    _m(
        "horse_hands_back_nothing",
        "rq_emq/run/worker.py",
        "hand_back = self._lender.hand_back() if self._lender is not None else None",
        "hand_back = None",
        [f"{HANDBACK}::test_a_lease_worker_runs_job_after_job_on_the_connection_its_horses_hand_back"],
        "the worker connects anew after every forked run, as stock RQ's horse does",
    ),
    _m(
        "handed_back_with_a_reply_unread",
        "rq_emq/connection/budget.py",
        "            if lent.can_read(timeout=0):",
        "            if False:",
        [f"{HANDBACK}::test_a_connection_with_a_reply_nobody_read_is_not_handed_back[3]"],
        "a connection with the job's unread reply comes back: the worker reads it as its own "
        "(the lent-state proof refuses such a connection too, so this check is a second line "
        "that no test can tell apart: out of the fast set)",
        fast=False,
    ),
    _m(
        "worker_keeps_its_copy_of_the_lent_connection",
        "rq_emq/connection/budget.py",
        "                    _close_here(connection)",
        "                    pass",
        [f"{HANDBACK}::test_a_horse_that_dies_takes_its_connection_with_it"],
        "a dead horse's connection stays open in its worker: its job's blocking pop stays in Redis",
    ),
    _m(
        "horse_forked_ahead_runs_without_its_lease",
        "rq_emq/run/fork_ahead.py",
        "                manager.add(lease)",
        "                pass",
        [f"{FORK_AHEAD}::test_a_horse_forked_ahead_is_fenced_by_the_lease_it_was_handed"],
        "the lease is not handed over: a horse forked ahead writes its outcome unfenced",
    ),
    _m(
        "horse_forked_ahead_connects_anew",
        "rq_emq/run/fork_ahead.py",
        "                lender.take_handed(connection, fd)",
        "                os.close(fd)",
        [f"{HANDBACK}::test_a_lease_worker_runs_job_after_job_on_the_connection_its_horses_hand_back"],
        "the handed connection is dropped: every horse forked ahead connects and handshakes anew",
    ),
    _m(
        "job_waits_for_a_fork_taken_after_its_take",
        "rq_emq/run/fork_ahead.py",
        "            if self._young(spare) and spare.waiting():\n"
        "                self._spare = spare\n"
        "                return",
        "            if True:\n                spare.end()\n                return",
        [f"{FORK_AHEAD}::test_a_job_runs_in_a_horse_forked_before_it_was_taken"],
        "no horse is forked ahead: each job waits for its fork again",
    ),
    _m(
        "handed_horse_skips_the_steps_before_the_fork",
        "rq_emq/run/worker.py",
        "class LeaseWorker(HorseCrashMixin, HorseRunGuard, LeaseMixin, ForkAheadMixin, Worker):",
        "class LeaseWorker(ForkAheadMixin, HorseCrashMixin, HorseRunGuard, LeaseMixin, Worker):",
        [f"{FORK_AHEAD}::test_a_crash_after_a_stop_the_worker_sent_is_still_a_crash"],
        "the handover skips every part's fork step: a crash after a stop is read as the worker's own kill",
    ),
    _m(
        "worker_detaches_its_copy_without_closing_it",
        "rq_emq/connection/budget.py",
        "        os.close(sock.detach())",
        "        sock.detach()",
        [f"{HANDBACK}::test_a_horse_that_dies_takes_its_connection_with_it"],
        "the quick close at the fork leaves the worker's descriptor open: a dead horse's connection lives on",
    ),
    _m(
        "horse_end_heard_on_the_pipe_alone",
        "rq_emq/run/horse_end.py",
        "select.select([ours, self._pidfd], [], [])",
        "select.select([ours], [], [])",
        [
            "tests/run/test_horse_end.py::"
            "test_a_child_of_the_horse_holding_the_pipe_does_not_keep_its_worker_waiting"
        ],
        "a dead horse whose child holds the pipe keeps its worker waiting",
    ),
    _m(
        "horse_end_told_by_absence",
        "rq_emq/run/horse_end.py",
        "told = word in (DONE, DONE_HANDED_BACK)",
        "told = word is not None",
        ["tests/run/test_horse_end.py::test_a_horse_that_ends_without_a_word_is_left_to_rqs_reaping"],
        "a horse that died without a word reads as a run that ended well",
    ),
    _m(
        "lease_ages_read_against_a_stale_clock",
        "rq_emq/operate/lease_list.py",
        '    detail.add([], "the server\'s time", detail.pipe.time(), read_clock)\n',
        "",
        [
            "tests/operate/test_cli.py::"
            "test_a_report_or_mark_landing_after_the_readers_clock_read_is_never_shown_as_in_the_future"
        ],
        "rq-emq leases shows a report that landed after its clock read as landed in the future",
    ),
    _m(
        "status_ages_read_against_a_stale_clock",
        "rq_emq/operate/inspection.py",
        '    batch.add([], "the server\'s time", batch.pipe.time(), read_clock)\n',
        "",
        [
            "tests/operate/test_cli.py::"
            "test_a_lease_or_mark_landing_after_the_status_clock_read_is_never_shown_as_younger_than_nothing"
        ],
        "rq-emq status shows a lease granted or a mark made after its clock read with a negative age",
    ),
    _m(
        "script_prune_not_transitive",
        "rq_emq/scripts.py",
        "        pending |= (set(_IDENTIFIER.findall(defined[name])) & defined.keys()) - kept\n",
        "",
        [
            "tests/tooling/test_scripts.py::test_a_script_keeps_the_library_definitions_its_text_reaches_and_no_other"
        ],
        "a script keeps the library functions it names but not those they call: a missing global at run time",
    ),
]


def by_name() -> dict[str, Mutation]:
    names = [m.name for m in CATALOG]
    duplicates = {n for n in names if names.count(n) > 1}
    if duplicates:
        raise ValueError(f"duplicate mutation names: {sorted(duplicates)}")
    return {m.name: m for m in CATALOG}
