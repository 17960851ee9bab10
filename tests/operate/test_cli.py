"""The operator's CLI (``rq-emq status | leases | sweep | metrics``) against a real Redis,
with state made by the real scripts or a real worker process holding a lease."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner, Result
from procs import RQ_BIN, Processes, wait_for
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from redis_server import RedisServer, require_redis_server
from rq import Queue
from stalls import stall

from rq_emq.intake.take import Taker
from rq_emq.keys import QueueKeys, job_key
from rq_emq.operate import inspection, lease_list
from rq_emq.operate.cli import main, redact
from rq_emq.operate.prometheus import LeaseCollector
from rq_emq.recover.sweep import Sweeper
from rq_emq.settings import LeaseSettings

Q = QueueKeys("q")
RQ_EMQ = str(Path(RQ_BIN).parent / "rq-emq")
#: a renew interval short enough that a sweep's grace (1.25 renew intervals) passes quickly,
#: and the shortest sweep interval it allows (renew <= 0.64 sweep)
QUICK_GRACE = {"RQ_EMQ_RENEW_INTERVAL_MS": "100", "RQ_EMQ_SWEEP_INTERVAL_MS": "157"}


def cli(url: str, *args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, [*args, "--url", url], env=env, catch_exceptions=False)


def cli_json(url: str, *args: str, env: dict[str, str] | None = None) -> dict:
    result = cli(url, *args, "--json", env=env)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def lease(r: redis.Redis, n: int, queue: str = "q", worker: str = "w1", **enqueue: object) -> list[str]:
    """Enqueue n jobs and take them under a lease, as a worker's pop does."""
    ids = [Queue(queue, connection=r).enqueue("jobs.noop", **enqueue).id for _ in range(n)]  # type: ignore[arg-type]
    taker = Taker(r, worker, LeaseSettings())
    for _ in ids:
        assert taker.pop([queue]) is not None
    return ids


def by_queue(document: dict) -> dict[str, dict]:
    return {entry["queue"]: entry for entry in document["queues"]}


# -- status --------------------------------------------------------------------------------
def test_status_counts_waiting_in_flight_time_left_and_stalled_jobs(r: redis.Redis, redis_url: str) -> None:
    (dead,) = stall(r, 1)  # lock gone, deadline passed
    live = lease(r, 2)
    Queue("q", connection=r).enqueue("jobs.noop")  # one waiting
    Sweeper(r, ["q"], LeaseSettings()).sweep("q", mode="force")  # marks the dead one
    q = by_queue(cli_json(redis_url, "status"))["q"]
    assert (q["waiting"], q["in_flight"], q["stalled"], q["outbox"]) == (1, 3, 1, 0)
    # the live leases have about 10 s left (the default lease); a marked lease is
    # re-indexed a grace ahead
    assert q["by_remaining"]["5-15s"] == 2 and sum(q["by_remaining"].values()) == 3
    assert q["oldest_mark"]["job_id"] == dead and q["oldest_mark"]["age_ms"] >= 0
    # the oldest lease is the least recently renewed one the sweep has not marked
    assert q["oldest_lease"]["job_id"] in live and 0 <= q["oldest_lease"]["age_ms"] < 10_000
    assert q["counters"]["taken"] == 3 and q["counters"]["marked"] == 1 and q["counters"]["recovered"] == 0
    assert q["problems"] == [] and set(live).isdisjoint({dead})


def test_status_table_has_one_aligned_row_per_queue(r: redis.Redis, redis_url: str) -> None:
    lease(r, 2, queue="alpha")
    Queue("beta", connection=r).enqueue("jobs.noop")
    result = cli(redis_url, "status")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    header, alpha, beta = lines[0], lines[1], lines[2]
    assert header.split()[:4] == ["queue", "waiting", "in", "flight"]
    assert alpha.split()[:3] == ["alpha", "0", "2"] and beta.split()[:3] == ["beta", "1", "0"]
    # right-aligned numbers end in the same column as their header
    assert alpha.index("2") + 1 == header.index("in flight") + len("in flight")
    assert "counters" in result.output and "taken" in result.output


def test_status_reports_an_overdue_lease_before_the_sweep_marks_it(r: redis.Redis, redis_url: str) -> None:
    (job_id,) = lease(r, 1)
    r.delete(Q.lock(job_id))
    r.zadd(Q.leases, {job_id: 1})  # its deadline long past
    q = by_queue(cli_json(redis_url, "status", "q"))["q"]
    assert q["by_remaining"]["overdue"] == 1 and q["stalled"] == 0
    assert q["oldest_lease"]["due_in_ms"] < 0 and q["oldest_lease"]["age_ms"] > 30_000


@pytest.mark.parametrize("worker_lease_ms", [60_000, 5_000])
def test_the_oldest_lease_age_is_its_real_age_whatever_lease_the_reader_is_configured_with(
    r: redis.Redis, redis_url: str, worker_lease_ms: int
) -> None:
    """The CLI reads with its own lease_ms (10 s by default); the workers' may differ."""
    Queue("q", connection=r).enqueue("jobs.noop")
    assert Taker(r, "w1", LeaseSettings(lease_ms=worker_lease_ms)).pop(["q"]) is not None
    granted = time.monotonic()
    time.sleep(0.3)
    q = by_queue(cli_json(redis_url, "status", "q"))["q"]
    real_age_ms = (time.monotonic() - granted) * 1000
    assert real_age_ms - 1_000 <= q["oldest_lease"]["age_ms"] <= real_age_ms + 50
    assert q["oldest_lease"]["age_ms"] >= 250


def test_a_malformed_lease_length_is_a_problem_and_the_readers_lease_ms_is_used(
    r: redis.Redis, redis_url: str
) -> None:
    (job_id,) = lease(r, 1)
    r.hset(job_key(job_id), "emq_lease_ms", "1e3")
    q = by_queue(cli_json(redis_url, "status", "q"))["q"]
    assert q["problems"] == [f"emq_lease_ms of job {job_id} is not a positive number: '1e3'"]
    assert 0 <= q["oldest_lease"]["age_ms"] < 5_000


# -- leases --------------------------------------------------------------------------------
def test_leases_of_a_real_worker_show_its_name_a_token_prefix_the_lock_and_attempts(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path
) -> None:
    log = str(tmp_path / "runs.log")
    job = Queue(connection=r).enqueue("jobs.sleep_and_record", log, 60.0, job_timeout=120)
    procs.worker(redis_url, name="cli-test-worker")
    wait_for(lambda: Path(log).exists(), timeout=20, what="the job to start")
    document = cli_json(redis_url, "leases", "default")
    (row,) = by_queue(document)["default"]["leases"]
    token = r.hget(job_key(job.id), "emq_token").decode()  # type: ignore[union-attr]
    assert row["job_id"] == job.id and row["worker"] == "cli-test-worker"
    assert row["token_prefix"] == token[:8] and token not in json.dumps(document)
    assert row["lock"] == "held" and 0 < row["lock_ttl_ms"] <= 30_000
    # no max of its own: the configured default, and `rq-emq leases` says so
    assert (row["attempts"], row["max_attempts"], row["max_attempts_source"]) == (1, 3, "default")
    assert row["status"] == "started" and row["marked_ms_ago"] is None and row["problems"] == []
    table = cli(redis_url, "leases").output
    assert job.id in table and "cli-test-worker" in table and "1/3" in table and token not in table
    status = by_queue(cli_json(redis_url, "status", "default"))["default"]
    assert status["in_flight"] == 1 and status["counters"]["taken"] == 1


def test_a_report_or_mark_landing_after_the_readers_clock_read_is_never_shown_as_in_the_future(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``rq-emq leases`` reads Redis's clock, then the leases: a renewal carrying a report (or
    a sweep's mark) can land between the two. Its age is read against the time of the
    transaction that reads it, so it is never negative (CI, RQ 2.12: a report shown as
    landed -1 ms ago)."""
    (job_id,) = lease(r, 1)
    seconds, micros = r.time()  # type: ignore[misc]
    landed_ms = int(seconds) * 1000 + int(micros) // 1000
    r.hset(job_key(job_id), mapping={"emq_report": '{"progress": 0.5}', "emq_progress_at": landed_ms})
    r.zadd(Q.stalled, {job_id: landed_ms})
    # the reader's clock, read a second before the report and the mark landed
    monkeypatch.setattr(lease_list, "redis_now_ms", lambda client: landed_ms - 1_000)
    ((info,),) = [page.leases for page in lease_list.read_leases(r, ["q"], LeaseSettings(), 10)]
    assert info.job_id == job_id and info.report == {"progress": 0.5}
    assert info.progress_ms_ago is not None and 0 <= info.progress_ms_ago < 1_000
    assert info.marked_ms_ago is not None and 0 <= info.marked_ms_ago < 1_000


def test_a_lease_or_mark_landing_after_the_status_clock_read_is_never_shown_as_younger_than_nothing(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``rq-emq status`` reads Redis's clock for its buckets' bounds, then the queues: a lease
    granted (or a sweep's mark made) between the two is aged against the time of the
    transaction that reads it, never shown with a negative age."""
    seconds, micros = r.time()  # type: ignore[misc]
    before_ms = int(seconds) * 1000 + int(micros) // 1000
    unmarked, marked = lease(r, 2)
    seconds, micros = r.time()  # type: ignore[misc]
    marked_at = int(seconds) * 1000 + int(micros) // 1000
    r.zadd(Q.stalled, {marked: marked_at})
    # the reader's clock, read a second before both leases were granted and the mark made
    monkeypatch.setattr(inspection, "redis_now_ms", lambda client: before_ms - 1_000)
    (status,) = inspection.read_status(r, ["q"], LeaseSettings())
    assert status.oldest_lease is not None and status.oldest_lease.job_id == unmarked
    assert status.oldest_lease.age_ms is not None and 0 <= status.oldest_lease.age_ms < 1_000
    assert status.oldest_mark is not None and status.oldest_mark.job_id == marked
    assert 0 <= status.oldest_mark.age_ms < 1_000


def test_leases_show_a_jobs_own_max_attempts_and_the_configured_default(
    r: redis.Redis, redis_url: str
) -> None:
    (own,) = lease(r, 1, meta={"emq_max_attempts": 5})
    r.hset(job_key(own), "emq_max_attempts", 5)  # what LeaseWorker records from the meta
    (plain,) = lease(r, 1)
    r.hdel(job_key(plain), "emq_max_attempts")  # e.g. taken by an older version
    rows = {
        row["job_id"]: row
        for row in cli_json(redis_url, "leases", env={"RQ_EMQ_MAX_ATTEMPTS": "7"})["queues"][0]["leases"]
    }
    assert (rows[own]["max_attempts"], rows[own]["max_attempts_source"]) == (5, "job")
    assert (rows[plain]["max_attempts"], rows[plain]["max_attempts_source"]) == (7, "default")
    assert "1/7*" in cli(redis_url, "leases", env={"RQ_EMQ_MAX_ATTEMPTS": "7"}).output


def test_leases_show_missing_and_malformed_data_as_such(r: redis.Redis, redis_url: str) -> None:
    gone, odd = lease(r, 2)
    r.delete(job_key(gone))
    r.hset(job_key(odd), mapping={"emq_attempts": "many", "emq_max_attempts": "lots"})
    r.hset(Q.stats, "taken", "NaN")
    rows = {row["job_id"]: row for row in cli_json(redis_url, "leases")["queues"][0]["leases"]}
    assert rows[gone]["job_exists"] is False and rows[gone]["worker"] is None
    assert rows[gone]["problems"] == ["job hash is gone (the sweep drops this entry)"]
    assert rows[odd]["attempts"] is None and any("emq_attempts" in p for p in rows[odd]["problems"])
    # as the sweep decides: a malformed max attempts means the configured default
    assert (rows[odd]["max_attempts"], rows[odd]["max_attempts_source"]) == (3, "default")
    q = by_queue(cli_json(redis_url, "status"))["q"]
    assert q["counters"]["taken"] is None and "counter taken" in q["problems"][0]
    table = cli(redis_url, "leases")
    assert table.exit_code == 0 and "(job gone)" in table.output and "?/3*" in table.output


def test_a_key_of_the_wrong_type_is_a_problem_of_its_queue_not_a_crash(
    r: redis.Redis, redis_url: str
) -> None:
    lease(r, 1, queue="good")
    Queue("bad", connection=r).enqueue("jobs.noop")
    r.set(QueueKeys("bad").leases, "not a zset")
    statuses = by_queue(cli_json(redis_url, "status"))
    assert statuses["good"]["in_flight"] == 1 and statuses["good"]["problems"] == []
    assert statuses["bad"]["in_flight"] is None and "WRONGTYPE" in " ".join(statuses["bad"]["problems"])
    pages = by_queue(cli_json(redis_url, "leases"))
    assert len(pages["good"]["leases"]) == 1 and pages["bad"]["total"] is None
    assert cli(redis_url, "metrics").exit_code == 0


def test_leases_limit_bounds_the_rows_and_says_how_many_there_are(r: redis.Redis, redis_url: str) -> None:
    lease(r, 5)
    page = cli_json(redis_url, "leases", "--limit", "2")["queues"][0]
    assert page["total"] == 5 and len(page["leases"]) == 2
    assert "q: 2 of 5" in cli(redis_url, "leases", "--limit", "2").output


# -- sweep ---------------------------------------------------------------------------------
def test_sweep_dry_run_changes_nothing_then_a_sweep_marks_and_a_later_one_recovers(
    r: redis.Redis, redis_url: str
) -> None:
    (job_id,) = stall(r, 1)
    dry = cli_json(redis_url, "sweep", "q", "--dry-run", env=QUICK_GRACE)
    assert dry["dry_run"] is True and dry["queues"][0]["marked"] == [job_id]
    assert r.zcard(Q.stalled) == 0
    assert cli_json(redis_url, "sweep", "q", env=QUICK_GRACE)["queues"][0]["marked"] == [job_id]
    time.sleep(0.3)  # the grace: 1.25 renew intervals
    second = cli(redis_url, "sweep", "q", env=QUICK_GRACE)
    assert second.exit_code == 0 and f"{job_id}  was put back at the front of q" in second.output
    assert r.lrange(Q.rq_queue, 0, -1) == [job_id.encode()]


def test_a_dry_run_says_what_would_happen_and_heads_it_nothing_changed(
    r: redis.Redis, redis_url: str
) -> None:
    (job_id,) = stall(r, 1)
    for command in (["sweep", "q", "--dry-run"], ["reaper", "--once", "--dry-run", "--queues", "q"]):
        result = cli(redis_url, *command, env=QUICK_GRACE)
        assert result.exit_code == 0, result.output
        lines = result.output.splitlines()
        assert lines[0] == "dry run: nothing changed"
        assert (
            lines[1]
            == "queue q: 1 would be marked, 0 would be recovered, 0 would be failed, 0 would be unmarked"
        )
        assert lines[2].split() == [job_id, "would", "be", "marked", *lines[2].split()[4:]]
        assert r.zcard(Q.stalled) == 0
    cli(redis_url, "sweep", "q", env=QUICK_GRACE)
    time.sleep(0.3)  # the grace
    lines = cli(redis_url, "sweep", "q", "--dry-run", env=QUICK_GRACE).output.splitlines()
    assert lines[0] == "dry run: nothing changed"
    assert "1 would be recovered" in lines[1] and f"{job_id}  would be put back at the front of q" in lines[2]
    real = cli(redis_url, "sweep", "q", env=QUICK_GRACE).output
    assert "dry run" not in real and "would" not in real and "1 recovered" in real


# -- the outbox drain in the operator's process ----------------------------------------------
def stalled_on_its_last_attempt(r: redis.Redis, log: Path, serializer: object = None) -> str:
    """A job with a failure callback whose worker died on its last attempt."""
    from rq import Callback

    job = Queue("q", connection=r, serializer=serializer).enqueue(
        "jobs.noop", on_failure=Callback("jobs.on_failure_record"), meta={"log": str(log)}
    )
    assert Taker(r, "dead-worker", LeaseSettings()).pop(["q"]) is not None
    r.hset(job_key(job.id), mapping={"emq_attempts": 1, "emq_max_attempts": 1})
    r.delete(Q.lock(job.id))
    r.zadd(Q.leases, {job.id: 0})
    return job.id


def sweep_twice(redis_url: str, *options: str) -> Result:
    """A round that marks, then (after the grace) one that fails the job and drains."""
    assert cli(redis_url, "sweep", "q", *options, env=QUICK_GRACE).exit_code == 0
    time.sleep(0.3)
    return cli(redis_url, "sweep", "q", *options, env=QUICK_GRACE)


def failure_results(r: redis.Redis, job_id: str, serializer: object = None) -> int:
    from rq.job import Job

    return len(Job.fetch(job_id, connection=r, serializer=serializer).results())


def test_sweep_drains_with_the_serializer_named_as_rqs_cli_takes_it(
    r: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    from rq.serializers import JSONSerializer

    log = tmp_path / "callback.log"
    job_id = stalled_on_its_last_attempt(r, log, serializer=JSONSerializer)
    result = sweep_twice(redis_url, "--serializer", "rq.serializers.JSONSerializer")
    assert result.exit_code == 0 and f"{job_id}  was failed at max attempts" in result.output, result.output
    assert r.zcard(Q.outbox) == 0 and failure_results(r, job_id, JSONSerializer) == 1
    assert log.read_text() == "failed JobStalled\n"  # the callback ran here, once


def test_without_the_apps_code_the_drain_fails_and_leaves_the_entry_which_no_drain_does_not_try(
    r: redis.Redis, redis_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    job_id = stalled_on_its_last_attempt(r, tmp_path / "callback.log")
    r.hset(job_key(job_id), "failure_callback_name", "app_not_installed_here.on_failure")
    assert sweep_twice(redis_url).exit_code == 0  # the drain's error is logged; the sweep succeeded
    assert "could not complete its stall failure" in caplog.text
    assert r.zcard(Q.outbox) == 1 and failure_results(r, job_id) == 0  # retried after the claim lapses
    caplog.clear()
    assert cli(redis_url, "sweep", "q", "--no-drain", env=QUICK_GRACE).exit_code == 0
    assert "could not complete" not in caplog.text


def test_no_drain_fails_the_job_and_leaves_its_result_and_callback_to_the_workers(
    r: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    log = tmp_path / "callback.log"
    job_id = stalled_on_its_last_attempt(r, log)
    result = sweep_twice(redis_url, "--no-drain")
    assert result.exit_code == 0 and f"{job_id}  was failed at max attempts" in result.output, result.output
    assert r.hget(job_key(job_id), "status") == b"failed" and r.zscore(Q.failed, job_id) is not None
    assert r.zcard(Q.outbox) == 1 and failure_results(r, job_id) == 0 and not log.exists()
    assert "left to the workers" in result.output
    # a worker's sweeper (or a sweep with the app's code) completes it later, once
    Sweeper(r, ["q"], LeaseSettings()).drain_outbox("q")
    assert (
        r.zcard(Q.outbox) == 0
        and failure_results(r, job_id) == 1
        and log.read_text() == "failed JobStalled\n"
    )


def test_the_reaper_takes_the_same_drain_options(r: redis.Redis, redis_url: str, tmp_path: Path) -> None:
    log = tmp_path / "callback.log"
    job_id = stalled_on_its_last_attempt(r, log)
    for _ in range(2):
        result = cli(redis_url, "reaper", "--once", "--no-drain", "q", env=QUICK_GRACE)
        assert result.exit_code == 0, result.output
        time.sleep(0.3)
    assert r.hget(job_key(job_id), "status") == b"failed" and r.zcard(Q.outbox) == 1 and not log.exists()
    # the long-running reaper's loop: the same sweeper, told not to drain
    Sweeper(r, ["q"], LeaseSettings(), drain=False).run_once()
    assert r.zcard(Q.outbox) == 1 and not log.exists()
    bad = cli(redis_url, "reaper", "--once", "--serializer", "no.such.Serializer", "q")
    assert bad.exit_code == 2 and "--serializer" in bad.output and "no.such.Serializer" in bad.output


def test_sweep_and_reaper_help_say_the_drain_runs_the_apps_code_here() -> None:
    for command in ("sweep", "reaper"):
        text = CliRunner().invoke(main, [command, "--help"]).output
        assert "--serializer" in text and "--no-drain" in text and "on_failure" in text, text


# -- names from Redis in text output ---------------------------------------------------------
HOSTILE = "evil\n\x1b[2J\x1b[31mred\u202e\tq"


def assert_inert(output: str) -> None:
    """No terminal escape sequence, bidi override or stray control character got through."""
    assert "\x1b" not in output and "\u202e" not in output and "\t" not in output and "\r" not in output


def test_text_output_escapes_queue_and_job_names_so_tables_keep_one_line_per_row(
    r: redis.Redis, redis_url: str
) -> None:
    (job_id,) = lease(r, 1, queue=HOSTILE)
    hostile_q = QueueKeys(HOSTILE)
    r.zadd(hostile_q.leases, {"job\x1b]0;pwned\x07\nnext": 10**13})  # a lease entry whose job is gone
    r.hset(hostile_q.stats, "odd\x1bcounter", 1)
    shown = "evil\\n\\x1b[2J\\x1b[31mred\\u202e\\tq"
    status = cli(redis_url, "status", HOSTILE)
    assert status.exit_code == 0, status.output
    assert_inert(status.output)
    row = status.output.splitlines()[1]
    assert row.startswith(shown + "  ") and len(row.split()) == 12  # one line, every column
    assert "odd\\x1bcounter" in status.output
    leases = cli(redis_url, "leases", HOSTILE)
    assert leases.exit_code == 0, leases.output
    assert_inert(leases.output)
    rows = [line for line in leases.output.splitlines() if line.startswith(shown)]
    assert len(rows) == 2 and any(job_id in row for row in rows)
    assert any("job\\x1b]0;pwned\\x07\\nnext" in row for row in rows)
    assert "\x07" not in leases.output
    swept = cli(redis_url, "sweep", "--dry-run", HOSTILE)
    assert swept.exit_code == 0 and swept.output.splitlines()[1].startswith(f"queue {shown}:"), swept.output
    assert_inert(swept.output)
    unknown = cli(redis_url, "status", "no\x1b[2Jsuch")
    assert unknown.exit_code == 2 and "no\\x1b[2Jsuch" in unknown.output
    assert_inert(unknown.output)
    # JSON keeps the names exact (its own escaping makes them inert)
    assert by_queue(cli_json(redis_url, "status", HOSTILE))[HOSTILE]["in_flight"] == 2


# -- metrics -------------------------------------------------------------------------------
def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_metrics_are_valid_prometheus_text_with_the_documented_names(r: redis.Redis, redis_url: str) -> None:
    stall(r, 1)
    lease(r, 2)
    Sweeper(r, ["q"], LeaseSettings()).sweep("q", mode="force")
    Queue('we"ird\\q', connection=r).enqueue("jobs.noop")
    result = cli(redis_url, "metrics")
    assert result.exit_code == 0, result.output
    got = samples(result.stdout)
    assert got[("rq_emq_jobs_taken_total", (("queue", "q"),))] == 3
    assert got[("rq_emq_stall_marks_total", (("queue", "q"),))] == 1
    assert got[("rq_emq_jobs_in_flight", (("queue", "q"),))] == 3
    assert got[("rq_emq_jobs_stalled", (("queue", "q"),))] == 1
    assert got[("rq_emq_leases_by_remaining", (("queue", "q"), ("remaining", "5-15s")))] == 2
    assert got[("rq_emq_oldest_stall_mark_age_seconds", (("queue", "q"),))] >= 0
    assert got[("rq_emq_jobs_waiting", (("queue", 'we"ird\\q'),))] == 1  # labels escaped
    lines = result.stdout.splitlines()
    for name in ("rq_emq_jobs_recovered_total", "rq_emq_jobs_in_flight"):
        assert f"# TYPE {name} {'counter' if name.endswith('_total') else 'gauge'}" in lines
        assert any(line.startswith(f"# HELP {name} ") for line in lines)


def test_the_prometheus_client_collector_exposes_exactly_what_the_command_prints(
    r: redis.Redis, redis_url: str
) -> None:
    stall(r, 1)
    lease(r, 2)
    registry = CollectorRegistry()
    registry.register(LeaseCollector(r))
    from_collector = generate_latest(registry).decode()
    from_command = cli(redis_url, "metrics").stdout
    collected, printed = samples(from_collector), samples(from_command)
    assert collected.keys() == printed.keys()
    ages = {key for key in printed if key[0].endswith("_age_seconds")}  # read a moment apart
    assert ages and {k: v for k, v in collected.items() if k not in ages} == {
        k: v for k, v in printed.items() if k not in ages
    }
    assert [ln for ln in from_collector.splitlines() if ln.startswith("#")] == [
        ln for ln in from_command.splitlines() if ln.startswith("#")
    ]


# -- bad input -----------------------------------------------------------------------------
def test_an_unknown_queue_exits_2_naming_it(r: redis.Redis, redis_url: str) -> None:
    lease(r, 1)
    for command in ("status", "leases", "metrics", "sweep"):
        result = cli(redis_url, command, "q", "qq")
        assert result.exit_code == 2 and "unknown queue(s): qq" in result.output, (command, result.output)


def test_the_one_shot_reaper_exits_2_on_an_unknown_queue_as_the_other_commands_do(
    r: redis.Redis, redis_url: str
) -> None:
    lease(r, 1)
    for mode in (["--once"], ["--once", "--dry-run"], ["--dry-run"]):
        result = cli(redis_url, "reaper", *mode, "nosuchqueue")
        assert result.exit_code == 2 and "unknown queue(s): nosuchqueue" in result.output, (
            mode,
            result.output,
        )


def test_a_positional_queue_name_is_one_name_even_with_a_space_in_it(r: redis.Redis, redis_url: str) -> None:
    for name in ("sp", "ace"):
        lease(r, 1, queue=name)
    for command in (["reaper", "--once"], ["sweep"], ["status"]):
        result = cli(redis_url, *command, "sp ace")
        assert result.exit_code == 2 and "unknown queue(s): sp ace" in result.output, (command, result.output)
    lease(r, 1, queue="sp ace")
    swept = cli(redis_url, "reaper", "--once", "sp ace")
    assert swept.exit_code == 0 and swept.output.startswith("queue sp ace:"), swept.output
    assert len(swept.output.splitlines()) == 1  # one queue swept, not two


def test_queues_options_still_take_lists_split_on_commas_and_spaces(r: redis.Redis, redis_url: str) -> None:
    for name in ("a", "b", "c"):
        lease(r, 1, queue=name)
    result = cli(redis_url, "reaper", "--once", "--queues", "a,b", "-q", "c")
    assert result.exit_code == 0, result.output
    assert [line.split(":")[0] for line in result.output.splitlines()] == ["queue a", "queue b", "queue c"]
    assert [q["queue"] for q in cli_json(redis_url, "status", "--queues", "a b")["queues"]] == ["a", "b"]


def test_an_unreachable_redis_exits_non_zero_naming_the_url_without_its_password() -> None:
    result = cli("redis://:s3cret@127.0.0.1:1/0", "status")
    assert result.exit_code == 1
    assert (
        "cannot reach Redis at redis://:***@127.0.0.1:1/0" in result.output and "s3cret" not in result.output
    )
    assert redact("redis://alice:pw@h:6379/2") == "redis://alice:***@h:6379/2"
    assert redact("redis://h:6379/0") == "redis://h:6379/0"


def test_a_redis_that_wants_a_password_not_given_says_so_not_noauth(procs: Processes) -> None:
    """A private redis-server with ``--requirepass``: without the password every command
    exits 2 saying where to put it (not "cannot reach Redis", not the server's NOAUTH or
    HELLO text); a wrong one is named as refused; a long-running reaper does not wait on
    it, since no restart of Redis would mend it."""
    require_redis_server()
    server = RedisServer(password="s3cret").start()
    try:
        for command in (("status",), ("reaper", "--once")):
            result = cli(server.bare_url, *command)
            assert result.exit_code == 2, result.output
            assert (
                f"Redis at {server.bare_url} requires a password: "
                "set it in the URL (redis://:PASSWORD@host) or REDIS_URL" in result.output
            ), result.output
            for text in ("cannot reach", "NOAUTH", "HELLO", "Authentication required"):
                assert text not in result.output, result.output
        wrong = cli(f"redis://:nope@127.0.0.1:{server.port}/0", "status")
        assert wrong.exit_code == 2 and "refused the user or password given" in wrong.output, wrong.output
        assert "nope" not in wrong.output
        assert cli(server.url, "status").exit_code == 0
        reaper = procs.start(
            [sys.executable, "-m", "rq_emq.operate.cli", "reaper", "--url", server.bare_url, "default"],
            name="reaper",
        )
        assert reaper.wait(timeout=30) == 2, procs.log(reaper)
        assert "requires a password" in procs.log(reaper) and "waiting for Redis" not in procs.log(reaper)
    finally:
        server.stop()


def test_malformed_settings_exit_2_naming_the_setting(
    r: redis.Redis, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad_env = cli(redis_url, "status", env={"RQ_EMQ_LEASE_MS": "soon"})
    assert bad_env.exit_code == 2 and "RQ_EMQ_LEASE_MS" in bad_env.output
    monkeypatch.chdir(tmp_path)  # `-c` imports from the working directory, as rq does
    (tmp_path / "cli_settings_broken.py").write_text("REDIS_URL = (\n")
    missing = CliRunner().invoke(main, ["status", "-c", "cli_settings_missing"])
    broken = CliRunner().invoke(main, ["status", "-c", "cli_settings_broken"])
    for result, name in ((missing, "cli_settings_missing"), (broken, "cli_settings_broken")):
        assert result.exit_code == 2 and f"cannot import settings module {name!r}" in result.output
    (tmp_path / "cli_settings_batch.py").write_text(f"REDIS_URL = {redis_url!r}\nRQ_EMQ_SWEEP_BATCH = 0\n")
    batch = CliRunner().invoke(main, ["sweep", "-c", "cli_settings_batch"])
    assert batch.exit_code == 2 and "sweep_batch (RQ_EMQ_SWEEP_BATCH)" in batch.output


def test_the_settings_module_names_the_redis_as_rq_reads_it(
    r: redis.Redis, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lease(r, 1)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("REDIS_URL", raising=False)
    (tmp_path / "cli_settings_ok.py").write_text(f"REDIS_URL = {redis_url!r}\n")
    result = CliRunner().invoke(main, ["status", "-c", "cli_settings_ok", "--json"])
    assert result.exit_code == 0, result.output
    assert by_queue(json.loads(result.stdout))["q"]["in_flight"] == 1


# -- the console script --------------------------------------------------------------------
def test_the_console_script_watches_status_as_json_lines_until_interrupted(
    r: redis.Redis, redis_url: str
) -> None:
    lease(r, 1)
    watcher = subprocess.Popen(
        [RQ_EMQ, "status", "q", "--url", redis_url, "--json", "--watch", "0.2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert watcher.stdout is not None
        first = json.loads(watcher.stdout.readline())
        lease(r, 1)
        refreshes = [json.loads(watcher.stdout.readline()) for _ in range(3)]
        assert first["queues"][0]["in_flight"] == 1
        # a refresh may have read before the second lease, not the last of three
        assert refreshes[-1]["queues"][0]["in_flight"] == 2
        watcher.send_signal(signal.SIGINT)
        _, errors = watcher.communicate(timeout=10)  # drained, so a full pipe cannot block it
        assert watcher.returncode == 0, errors
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait()


def test_the_console_script_runs_from_a_shell(r: redis.Redis, redis_url: str) -> None:
    lease(r, 1)
    env = {k: v for k, v in os.environ.items() if k != "RQ_REDIS_URL"} | {"REDIS_URL": redis_url}
    done = subprocess.run([RQ_EMQ, "leases"], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert "w1" in done.stdout and "1/3" in done.stdout


# -- cost ----------------------------------------------------------------------------------
def commands_run(r: redis.Redis) -> int:
    stats: dict = r.info("commandstats")  # type: ignore[assignment]
    return sum(int(entry["calls"]) for entry in stats.values())


def test_status_and_leases_cost_the_same_commands_whatever_the_number_in_flight(
    r: redis.Redis, redis_url: str
) -> None:
    lease(r, 1)
    costs = []
    for in_flight in (10, 3000):
        r.zadd(Q.leases, {f"synthetic-{i}": 10**13 for i in range(in_flight)})
        r.config_resetstat()
        assert cli(redis_url, "status", "q").exit_code == 0
        assert cli(redis_url, "leases", "q", "--limit", "5").exit_code == 0
        costs.append(commands_run(r))
    assert costs[0] == costs[1]


def test_the_collector_without_its_extra_names_the_extra_to_install() -> None:
    code = "import sys; sys.modules['prometheus_client'] = None; import rq_emq.operate.prometheus"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "pip install 'rq-emq[prometheus]'" in done.stderr
