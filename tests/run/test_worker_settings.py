"""Where a real ``rq worker`` reads its settings: RQ's ``-c`` settings module too, with the
same checks and one-line refusals as the environment (a single value, or two intervals out
of their relation); the environment wins over it;
misspelled names and hooks that cannot take an event are caught at startup; a progress
timeout shorter than the worker can check is held to what it can.

Real ``rq worker`` processes (``tests/procs.py``) against a real redis-server.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest
import redis
from helpers import wait_status
from jobs import runs
from procs import RQ_BIN, Processes, wait_for
from rq import Queue

import rq_emq
from rq_emq.keys import QueueKeys

pytestmark = pytest.mark.slow


def settings_module(tmp_path: Path, body: str) -> tuple[str, ...]:
    """``rq worker`` options naming a fresh settings module holding ``body``."""
    name = f"emq_settings_{secrets.token_hex(4)}"
    (tmp_path / f"{name}.py").write_text(body)
    return ("-c", name, "--path", str(tmp_path))


def one_line(output: str) -> str:
    """The one line a refused worker prints (RQ 2.0's click warnings aside)."""
    lines = [line for line in output.splitlines() if "UserWarning" not in line and not line.startswith(" ")]
    assert len(lines) == 1 and lines[0].startswith("rq-emq: "), output
    return lines[0]


@pytest.mark.parametrize(("value", "rule"), [('"abc"', "must be a whole number"), ("-5", "must be between")])
def test_a_bad_value_in_the_c_module_stops_the_worker_in_one_line(
    redis_url: str, procs: Processes, tmp_path: Path, value: str, rule: str
) -> None:
    args = settings_module(tmp_path, f"RQ_EMQ_LEASE_MS = {value}\n")
    worker = procs.worker(redis_url, burst=True, args=args)
    assert worker.wait(timeout=30) == 1
    line = one_line(procs.log(worker))
    assert line.startswith("rq-emq: invalid setting: lease_ms (RQ_EMQ_LEASE_MS) " + rule), line


def test_a_renew_interval_past_0_64_sweep_intervals_stops_the_worker_in_one_line_naming_both(
    r: redis.Redis, redis_url: str, procs: Processes
) -> None:
    job = Queue(connection=r).enqueue("jobs.noop")
    worker = procs.worker(
        redis_url,
        burst=True,
        RQ_EMQ_LEASE_MS="2000",
        RQ_EMQ_RENEW_INTERVAL_MS="1000",
        RQ_EMQ_SWEEP_INTERVAL_MS="100",
    )
    assert worker.wait(timeout=30) == 1
    assert "Traceback" not in procs.log(worker), procs.log(worker)
    assert one_line(procs.log(worker)) == (
        "rq-emq: invalid setting: renew_interval_ms (RQ_EMQ_RENEW_INTERVAL_MS) = 1000 must be at most "
        "0.64 x sweep_interval_ms (RQ_EMQ_SWEEP_INTERVAL_MS) = 100 (64): a dead worker's job would come "
        "back later than lease_ms + 2 x sweep_interval_ms"
    )
    assert r.llen("rq:queue:default") == 1 and job.get_status(refresh=True) == "queued"  # nothing taken


def lease_left_ms(r: redis.Redis, job_id: str) -> int:
    return int(r.pttl(QueueKeys("default").lock(job_id)))


@pytest.mark.parametrize(("environ", "lease_ms"), [({}, 7_000), ({"RQ_EMQ_LEASE_MS": "5000"}, 5_000)])
def test_a_worker_takes_its_lease_from_the_c_module_unless_the_environment_sets_it(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path, environ: dict[str, str], lease_ms: int
) -> None:
    log = str(tmp_path / "runs.log")
    job = Queue(connection=r).enqueue("jobs.sleep_and_record", log, 3)
    args = settings_module(tmp_path, "RQ_EMQ_LEASE_MS = 7000\n")
    procs.worker(redis_url, burst=True, args=args, **environ)
    wait_for(lambda: runs(log), timeout=15, what="the run")
    left = lease_left_ms(r, job.id)
    assert lease_ms - 1_500 <= left <= lease_ms, left  # renewed every lease / 10, never past the lease


def test_a_misspelled_setting_is_warned_about_once_naming_the_closest(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path
) -> None:
    args = settings_module(tmp_path, "RQ_EMQ_SWEEP_INTERVALMS = 900\n")
    worker = procs.worker(redis_url, burst=True, args=args, RQ_EMQ_LEASEMS="5000")
    assert worker.wait(timeout=30) == 0, procs.log(worker)
    said = [line for line in procs.log(worker).splitlines() if "is not an rq-emq setting" in line]
    assert len(said) == 2, procs.log(worker)
    assert "RQ_EMQ_LEASEMS" in said[0] and said[0].endswith("did you mean RQ_EMQ_LEASE_MS?")
    assert "RQ_EMQ_SWEEP_INTERVALMS" in said[1] and said[1].endswith("did you mean RQ_EMQ_SWEEP_INTERVAL_MS?")


def test_a_worker_pool_warns_once_for_all_its_members(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path
) -> None:
    jobs = [Queue(connection=r).enqueue("jobs.add", i, i) for i in range(4)]
    args = settings_module(tmp_path, "RQ_EMQ_SWEEP_INTERVALMS = 900\n")
    pool = procs.start(
        [RQ_BIN, "worker-pool", "-w", "rq_emq.LeaseWorker", "--url", redis_url, "-n", "2", "--burst", *args],
        env=procs.env(RQ_EMQ_LEASEMS="5000", RQ_EMQ_IDLE_POLL_MS="100"),
        name="pool",
    )
    assert pool.wait(timeout=45) == 0, procs.log(pool)
    assert all(job.get_status() == "finished" for job in jobs), procs.log(pool)
    said = procs.log(pool).splitlines()
    for warning in (
        "RQ_EMQ_LEASEMS is not",
        "RQ_EMQ_SWEEP_INTERVALMS is not",
        "(RQ_EMQ_IDLE_POLL_MS) is no longer",
    ):
        assert len([line for line in said if warning in line]) == 1, (warning, procs.log(pool))
    assert len([line for line in said if "Starting worker started" in line]) == 2  # two members built


def test_an_event_hook_that_cannot_take_an_event_stops_the_worker_in_one_line(
    redis_url: str, procs: Processes
) -> None:
    worker = procs.worker(redis_url, burst=True, RQ_EMQ_EVENT_HOOKS="jobs:add")
    assert worker.wait(timeout=30) == 1
    line = one_line(procs.log(worker))
    assert "event_hooks (RQ_EMQ_EVENT_HOOKS): 'jobs:add' cannot take an event" in line, line


def test_a_progress_timeout_shorter_than_two_renew_intervals_is_held_to_them_and_the_job_runs(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path
) -> None:
    """A job that reports every 1.9 s, asking for a 50 ms progress timeout, on a worker that
    renews every second: held to 2 s, it runs to its end on its first attempt (held to
    50 ms, the first renewal without a report since the last stopped it)."""
    log = str(tmp_path / "runs.log")
    job = Queue(connection=r).enqueue(
        "jobs.report_steadily", log, 6.0, 1.9, meta=rq_emq.progress_timeout(50, rq_emq.max_attempts(1))
    )
    worker = procs.worker(redis_url, RQ_EMQ_LEASE_MS="10000")
    wait_status(r, job.id, "finished", "failed", timeout=30)
    assert [line.split()[0] for line in runs(log)] == ["start:1", "end"], procs.log(worker)
    assert job.latest_result().return_value == 1  # type: ignore[union-attr]
    assert (
        f"job {job.id} on queue default: its progress timeout (50 ms) is shorter than this worker can "
        "check (2 renew intervals, 2000 ms); holding it to 2000 ms" in procs.log(worker)
    )


def test_a_bad_spare_age_limit_stops_the_worker_in_one_line(redis_url: str, procs: Processes) -> None:
    worker = procs.worker(redis_url, burst=True, RQ_EMQ_SPARE_MAX_AGE_MS="0")
    assert worker.wait(timeout=30) == 1
    assert one_line(procs.log(worker)) == (
        "rq-emq: invalid setting: spare_max_age_ms (RQ_EMQ_SPARE_MAX_AGE_MS) must be between 1 and "
        "86400000, got 0"
    )
