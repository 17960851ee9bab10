"""A worker's log an operator can read: our lines through a handler that follows RQ's
logging options (``--log-format``, ``--date-format``, ``--quiet``) and names the worker,
JSON lines for pipelines (``RQ_EMQ_LOG_FORMAT=json``), and RQ's lines that would say the
wrong thing about a job we handled replaced by ours.

Real ``rq worker`` processes (``tests/procs.py``); their stdout and stderr are one log.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import redis
from helpers import STEADY, wait_status
from procs import RQ_BIN, Processes, wait_for
from rq import Queue

import rq_emq
from rq_emq.compat import RQ_MAJOR
from rq_emq.keys import sweeper_election_key

pytestmark = [pytest.mark.slow, pytest.mark.rq_versions]

#: RQ's default ``--date-format`` (``%H:%M:%S``) and ``--log-format``, with our level and name
TEXT_LINE = r"^\d\d:\d\d:\d\d (?P<level>[A-Z]+) Worker (?P<worker>[\w.-]+): (?P<message>.*)$"
#: a lease whose worker recovers a crashed horse at once (the sweep is far off)
SLOW_LEASE = {
    "RQ_EMQ_LEASE_MS": "4000",
    "RQ_EMQ_RENEW_INTERVAL_MS": "1000",
    "RQ_EMQ_SWEEP_INTERVAL_MS": "1563",
}


def ours(log: str) -> list[re.Match[str]]:
    return [m for line in log.splitlines() if (m := re.match(TEXT_LINE, line))]


def test_a_recovery_line_has_a_time_a_level_and_the_worker_and_rqs_failed_line_is_gone(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path
) -> None:
    log = str(tmp_path / "runs.log")
    job = Queue(connection=r).enqueue("crash_jobs.crash_first", log, "kill", 1)
    worker = procs.worker(redis_url, burst=True, name="w-logs", **SLOW_LEASE)
    assert worker.wait(timeout=30) == 0, procs.log(worker)
    said = procs.log(worker)
    (line,) = [m for m in ours(said) if f"job {job.id}: work horse killed by signal 9" in m["message"]]
    assert line["level"] == "WARNING" and line["worker"] == "w-logs", said
    assert "returned to the front of queue default (attempt 1 of 3)" in line["message"]
    # RQ's "job X failed (Work-horse terminated unexpectedly ...)": the job did not fail
    assert "terminated unexpectedly" not in said.lower(), said


def elected(r: redis.Redis, queue: str, worker: str) -> bool:
    """Whether ``worker`` holds the sweeper election of ``queue`` (its INFO line's event)."""
    holder = r.get(sweeper_election_key([queue]))
    return holder is not None and worker in holder.decode()


def test_info_lines_of_ours_show_by_default_and_quiet_drops_them(
    r: redis.Redis, redis_url: str, procs: Processes
) -> None:
    loud = procs.worker(redis_url, "logs-loud", name="w-loud", **STEADY)
    wait_for(lambda: "elected sweeper" in procs.log(loud), timeout=15, what="the election line")
    (line,) = [m for m in ours(procs.log(loud)) if m["message"].startswith("elected sweeper")]
    assert line["level"] == "INFO" and line["worker"] == "w-loud", procs.log(loud)
    quiet = procs.worker(redis_url, "logs-quiet", name="w-quiet", args=("--quiet",), **STEADY)
    wait_for(lambda: elected(r, "logs-quiet", "w-quiet"), timeout=15, what="the quiet worker's election")
    time.sleep(0.5)  # a line would be written by now
    assert "elected sweeper" not in procs.log(quiet), procs.log(quiet)


def test_our_lines_follow_rqs_log_and_date_formats(redis_url: str, procs: Processes) -> None:
    worker = procs.worker(
        redis_url,
        "logs-format",
        name="w-format",
        args=("--log-format", "[%(asctime)s] %(name)s %(message)s", "--date-format", "%Y-%m-%d"),
        **STEADY,
    )
    line = re.compile(r"^\[\d{4}-\d\d-\d\d\] rq_emq\.\w+ INFO Worker w-format: elected sweeper of ")
    wait_for(
        lambda: any(line.match(text) for text in procs.log(worker).splitlines()),
        timeout=15,
        what=f"a line in the given formats: {procs.log(worker)}",
    )


def test_json_lines_parse_and_carry_the_worker_job_and_queue(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path
) -> None:
    log = str(tmp_path / "runs.log")
    job = Queue("logs-json", connection=r).enqueue("crash_jobs.crash_first", log, "kill", 1)
    worker = procs.worker(
        redis_url, "logs-json", burst=True, name="w-json", RQ_EMQ_LOG_FORMAT="json", **SLOW_LEASE
    )
    assert worker.wait(timeout=30) == 0, procs.log(worker)
    entries = [json.loads(line) for line in procs.log(worker).splitlines() if line.startswith("{")]
    (crash,) = [e for e in entries if "work horse killed" in e["message"]]
    assert crash["level"] == "WARNING" and crash["worker"] == "w-json" and crash["logger"] == "rq_emq.lease"
    assert crash["job_id"] == job.id and crash["queue"] == "logs-json"
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00$", crash["time"]), crash


#: What click prints as it parses RQ 2.0's command line, before any code of a worker runs:
#: RQ 2.0 declares some options twice (a Python warning, then its source line).
CLICK_WARNING = re.compile(r"UserWarning: The parameter \S+ is used more than once")


def json_entries(log: str) -> list[dict[str, object]]:
    """Each non-empty line of ``log`` as its JSON object (fails naming the first that is not)."""
    entries = []
    lines = log.splitlines()
    for before, line in zip(["", *lines], lines, strict=False):
        if CLICK_WARNING.search(line) or CLICK_WARNING.search(before):
            continue
        if line.strip():
            try:
                entries.append(json.loads(line))
            except ValueError:
                pytest.fail(f"not a JSON line: {line!r}\nin:\n{log}")
    return entries


def test_in_json_mode_every_line_of_a_worker_is_json_rqs_own_included(
    r: redis.Redis, redis_url: str, procs: Processes
) -> None:
    queue = Queue("logs-all-json", connection=r)
    ok, failing = queue.enqueue("jobs.add", 1, 2), queue.enqueue("jobs.fail", "boom")
    worker = procs.worker(
        redis_url,
        "logs-all-json",
        burst=True,
        name="w-all-json",
        args=("--with-scheduler",),
        RQ_EMQ_LOG_FORMAT="json",
        RQ_EMQ_LEASEMS="5000",  # warned about as the worker is built, before any handler exists
    )
    assert worker.wait(timeout=30) == 0, procs.log(worker)
    entries = json_entries(procs.log(worker))
    loggers = {entry["logger"] for entry in entries}
    assert {"rq.worker", "rq_emq.startup"} | ({"rq.scheduler"} if RQ_MAJOR >= 3 else set()) <= loggers, (
        entries
    )
    (taken,) = [e for e in entries if e.get("job_id") == ok.id and "attempt 1" in str(e["message"])]
    assert taken["logger"] == "rq.worker" and taken["worker"] == "w-all-json" and taken["queue"] == queue.name
    (raised,) = [e for e in entries if "exception raised while executing" in str(e["message"])]
    assert raised["level"] == "ERROR" and raised["job_id"] == failing.id  # RQ's traceback in its message
    assert "ValueError: boom" in str(raised["message"]) + str(raised.get("exception"))
    (misspelled,) = [e for e in entries if "is not an rq-emq setting" in str(e["message"])]
    assert misspelled["level"] == "WARNING" and "RQ_EMQ_LEASEMS" in str(misspelled["message"])


def test_in_json_mode_every_line_of_a_worker_pool_is_json_and_a_misspelled_name_is_warned_once(
    r: redis.Redis, redis_url: str, procs: Processes
) -> None:
    queue = Queue("logs-pool-json", connection=r)
    jobs = [queue.enqueue("jobs.add", 1, 2), queue.enqueue("jobs.fail", "boom")]
    pool = procs.start(
        [RQ_BIN, "worker-pool", "-w", "rq_emq.LeaseWorker", "--url", redis_url, "-n", "2", "--burst"]
        + [queue.name],
        env=procs.env(RQ_EMQ_LOG_FORMAT="json", RQ_EMQ_LEASEMS="5000"),
        name="pool",
    )
    assert pool.wait(timeout=45) == 0, procs.log(pool)
    assert [job.get_status() for job in jobs] == ["finished", "failed"]
    entries = json_entries(procs.log(pool))
    assert {"rq.worker_pool", "rq.worker"} <= {entry["logger"] for entry in entries}, entries
    said = [e for e in entries if "is not an rq-emq setting" in str(e["message"])]
    assert len(said) == 1, entries  # by the pool, for its members


def test_a_bad_log_format_setting_stops_the_worker_in_one_line(redis_url: str, procs: Processes) -> None:
    worker = procs.worker(redis_url, burst=True, RQ_EMQ_LOG_FORMAT="yaml")
    assert worker.wait(timeout=30) == 1
    said = procs.log(worker)
    assert "rq-emq: invalid setting: log_format (RQ_EMQ_LOG_FORMAT) must be one of text, json" in said
    assert "Traceback" not in said


def test_an_outcome_the_fence_discarded_is_no_job_ok_in_the_log(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path
) -> None:
    log = str(tmp_path / "runs.log")
    job = Queue("logs-fenced", connection=r).enqueue("jobs.lose_lease_and_succeed", log)
    worker = procs.worker(redis_url, "logs-fenced", burst=True, name="w-fenced", **STEADY)
    assert worker.wait(timeout=30) == 0, procs.log(worker)
    said = procs.log(worker)
    assert "Job OK" not in said and "result is kept" not in said.lower(), said
    (line,) = [
        m for m in ours(said) if m["message"].startswith(f"job {job.id} on queue logs-fenced: lease lost")
    ]
    assert line["level"] == "WARNING" and "outcome discarded" in line["message"]


def test_a_simple_workers_progress_timeout_stop_is_one_line_not_a_traceback(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path
) -> None:
    log = str(tmp_path / "lease.log")
    job = Queue("logs-silent", connection=r).enqueue(
        "lease_jobs.silent",
        log,
        60.0,
        job_timeout=120,
        meta=rq_emq.progress_timeout(800, rq_emq.max_attempts(1)),
    )
    worker = procs.worker(
        redis_url,
        "logs-silent",
        worker_class="rq_emq.SimpleLeaseWorker",
        name="w-simple",
        RQ_EMQ_LEASE_MS="2000",
        RQ_EMQ_RENEW_INTERVAL_MS="250",
        RQ_EMQ_SWEEP_INTERVAL_MS="500",
    )
    wait_status(r, job.id, "failed", timeout=30)
    said = procs.log(worker)
    assert "Traceback" not in said and "LeaseJobInterrupted" not in said, said
    # the run is over only with its process: one line names the job and why, then it ends
    said = f"job {job.id}: stopped, no progress for 800 ms (its progress timeout); ending the worker process"
    (line,) = [m for m in ours(procs.log(worker)) if said in m["message"]]
    assert line["worker"] == "w-simple"


def test_a_run_whose_guarded_write_was_refused_is_one_line_not_a_traceback(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path
) -> None:
    """The job's own write (``save_meta``) is refused once its lease is no longer its
    worker's, and the refusal propagates out of the job: the run did not fail (the sweep
    decides what becomes of the job), so RQ's traceback of it is one line of ours."""
    log = str(tmp_path / "runs.log")
    job = Queue("logs-refused", connection=r).enqueue("jobs.lose_lease_then_save_meta", log)
    worker = procs.worker(redis_url, "logs-refused", burst=True, name="w-refused", **STEADY)
    assert worker.wait(timeout=30) == 0, procs.log(worker)
    said = procs.log(worker)
    assert "Traceback" not in said, said
    (line,) = [
        m for m in ours(said) if m["message"].startswith(f"job {job.id} on queue logs-refused: run stopped")
    ]
    assert line["level"] == "WARNING" and "no longer this worker's" in line["message"]
