"""RQ's own features under lease workers (issue 20, items 1 and 5), as an RQ user meets
them: a delayed ``Retry`` raised or returned, a rate-limited retry, an exception handler
that saves the job, ``job.cancel()`` of a running job, TTLs of 0 on the sweep's failure,
and a job that a stock worker took over after its lease worker died (the status ABA).
Each against stock RQ's behaviour, with real ``rq worker`` processes and a real Redis."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar

import pytest
import redis
import rq
from helpers import FAST, STEADY, stat, status, wait_status
from jobs import run_spans, runs
from procs import Processes, unseen, wait_for
from redis.backoff import NoBackoff
from redis.retry import Retry as RedisRetry
from rq import Queue, Retry
from rq.job import Job
from rq.registry import FailedJobRegistry, FinishedJobRegistry, ScheduledJobRegistry, StartedJobRegistry
from rq.scheduler import RQScheduler

import rq_emq

pytestmark = [pytest.mark.slow, pytest.mark.rq_versions]
RQ_3 = int(rq.__version__.split(".")[0]) >= 3
LEASE_S = int(FAST["RQ_EMQ_LEASE_MS"]) / 1000
SWEEP_S = int(FAST["RQ_EMQ_SWEEP_INTERVAL_MS"]) / 1000
# a lease lapses, one sweep marks the job, the next (a grace later) acts; room for a busy host
RECOVERY_S = LEASE_S + 2 * SWEEP_S + 1.5
# RQ's scheduler polls every second (RQ 2.x: its own interval) and takes a lock first
SCHEDULER_S = 15.0
WORKERS = pytest.mark.parametrize(
    "worker_class", ["rq_emq.LeaseWorker", "rq_emq.SimpleLeaseWorker", "rq.Worker"]
)


def in_registries(queue: Queue, job_id: str) -> set[str]:
    registries = {
        "started": StartedJobRegistry(queue=queue),
        "scheduled": ScheduledJobRegistry(queue=queue),
        "failed": FailedJobRegistry(queue=queue),
        "finished": FinishedJobRegistry(queue=queue),
    }
    found = {name for name, registry in registries.items() if job_id in registry.get_job_ids(cleanup=False)}
    if job_id in queue.get_job_ids():
        found.add("queue")
    return found


def kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL a worker and its horse in a death no process of ours sees, so the dead
    lease is left to a sweep (its watchdog would hand the job back at once)."""
    os.killpg(unseen(process.pid), signal.SIGKILL)
    process.wait(timeout=10)


# -- delayed Retry ------------------------------------------------------------------------
@WORKERS
def test_a_delayed_retry_that_the_job_raised_runs_again_and_finishes(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path, worker_class: str
) -> None:
    """``Retry(max=2, interval=1)``, the first run raises: scheduled for a second later,
    in the ScheduledJobRegistry with one retry used, then run again by the scheduler's
    enqueue and finished, as with stock RQ (it was left ``scheduled`` in no registry)."""
    log = str(tmp_path / "runs.log")
    queue = Queue(connection=r)
    job = queue.enqueue("feature_jobs.fail_first_run", log, retry=Retry(max=2, interval=1))
    worker = procs.worker(redis_url, worker_class=worker_class, args=("--with-scheduler",), **FAST)
    wait_for(lambda: runs(log), timeout=30, what="the first run")
    wait_status(r, job.id, "scheduled", "queued", "started", "finished")
    wait_status(r, job.id, "finished", timeout=SCHEDULER_S)
    assert len(runs(log)) == 2 + procs.self_fenced_stops(job.id), procs.log(worker)
    fetched = Job.fetch(job.id, connection=r)
    assert fetched.retries_left == 1
    assert in_registries(queue, job.id) == {"finished"}
    assert "RQ ended it" not in procs.log(worker)


@WORKERS
def test_a_delayed_retry_waits_in_the_scheduled_registry(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path, worker_class: str
) -> None:
    """Between the failure and its retry the job is where RQ puts it: status
    ``scheduled``, in the ScheduledJobRegistry, one retry used, its lease gone."""
    log = str(tmp_path / "runs.log")
    queue = Queue(connection=r)
    job = queue.enqueue("feature_jobs.fail_first_run", log, retry=Retry(max=2, interval=600))
    # RQ's placement of the job, not a recovery: a lease no load can run out (under FAST, two
    # suites side by side may starve a renewal, and the self-fenced job's rerun finishes it)
    worker = procs.worker(redis_url, worker_class=worker_class, **STEADY)
    # RQ sets the status before its transaction of the rest: wait for the registry (a
    # worker's start under load included, as the other first runs here allow)
    wait_for(
        lambda: in_registries(queue, job.id) == {"scheduled"},
        timeout=30,
        what="the job in the scheduled registry",
    )
    assert status(r, job.id) == "scheduled"
    # one step: RQ 2.x's registry ZADD rides in the retry's transaction under a lease
    # worker (rq_emq.compat.schedule_in_the_callers_transaction), so no reader sees the
    # job scheduled before its retry is counted (1 in 20 runs on a loaded host without it)
    retries_left = Job.fetch(job.id, connection=r).retries_left
    assert retries_left == 1, procs.log(worker)
    assert r.zcard(rq_emq.keys.QueueKeys("default").leases) == 0


@pytest.mark.skipif(not RQ_3, reason="RQ 2.x does not retry a job that returns Retry")
@WORKERS
def test_a_returned_delayed_retry_runs_again_and_finishes(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path, worker_class: str
) -> None:
    log = str(tmp_path / "runs.log")
    queue = Queue(connection=r)
    job = queue.enqueue("feature_jobs.return_retry_first_run", log, 1)
    worker = procs.worker(redis_url, worker_class=worker_class, args=("--with-scheduler",), **FAST)
    wait_for(lambda: runs(log), timeout=30, what="the first run")
    wait_status(r, job.id, "finished", timeout=SCHEDULER_S)
    assert len(runs(log)) == 2 + procs.self_fenced_stops(job.id), procs.log(worker)
    assert in_registries(queue, job.id) == {"finished"}


@WORKERS
def test_a_retry_without_interval_is_enqueued_again_and_finishes(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path, worker_class: str
) -> None:
    log = str(tmp_path / "runs.log")
    queue = Queue(connection=r)
    job = queue.enqueue("feature_jobs.fail_first_run", log, retry=Retry(max=2))
    procs.worker(redis_url, worker_class=worker_class, **FAST)
    wait_status(r, job.id, "finished")
    assert len(runs(log)) == 2 + procs.self_fenced_stops(job.id)
    assert Job.fetch(job.id, connection=r).retries_left == 1
    assert in_registries(queue, job.id) == {"finished"}


@pytest.mark.skipif(not RQ_3, reason="rate limits are new in RQ 3")
def test_a_delayed_retry_of_a_rate_limited_job_is_scheduled_then_finishes(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path
) -> None:
    from rq import RateLimit

    log = str(tmp_path / "runs.log")
    queue = Queue(connection=r)
    job = queue.enqueue(
        "feature_jobs.fail_first_run", log, retry=Retry(max=2, interval=3), rate_limit=RateLimit("api", 1)
    )
    procs.worker(redis_url, args=("--with-scheduler",), **FAST)
    wait_for(lambda: "scheduled" in in_registries(queue, job.id), what="the retry in the scheduled registry")
    wait_status(r, job.id, "finished", timeout=SCHEDULER_S)
    assert len(runs(log)) == 2 + procs.self_fenced_stops(job.id)
    assert in_registries(queue, job.id) == {"finished"}


@pytest.mark.skipif(not RQ_3, reason="rate limits are new in RQ 3")
@pytest.mark.parametrize("worker_class", ["rq_emq.LeaseWorker", "rq_emq.SimpleLeaseWorker"])
def test_a_stale_save_of_a_rate_limited_copy_loses_neither_the_run_nor_the_limits_slot(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path, worker_class: str
) -> None:
    """A web process read a job while it waited on its rate limit and saves that copy whole
    while the job runs: ``rate_limited`` is written back, the job in no waiting set. The
    run's outcome is still written and the limit's slot given back (before: the status was
    taken as RQ's word, the finished run discarded, the job left in no place and still
    holding the slot)."""
    from rq import RateLimit

    queue = Queue(connection=r)
    log = str(tmp_path / "runs.log")
    ahead = queue.enqueue("jobs.sleep_and_record", log, 1.0, rate_limit=RateLimit("api", 1))
    job = queue.enqueue("jobs.sleep_and_record", log, 2.0, rate_limit=RateLimit("api", 1))
    copy = Job.fetch(job.id, connection=r)
    assert copy.get_status() == "rate_limited"  # waiting on the slot the first one holds
    procs.worker(redis_url, worker_class=worker_class, **STEADY)
    wait_status(r, ahead.id, "finished", timeout=30)
    wait_status(r, job.id, "started", timeout=30)
    copy.meta["seen_by"] = "web"
    copy.save()  # status rate_limited, the job in no waiting set
    wait_for(lambda: status(r, job.id) != "rate_limited", timeout=30, what="the run's outcome")
    assert status(r, job.id) == "finished"
    # RQ gives the slot back right after the outcome, in a call of its own
    wait_for(lambda: r.zcard("rq:rl:api:allowed") == 0, timeout=10, what="the limit's slot back")
    assert r.zcard("rq:rl:api:rate_limited") == 0


# -- a push sent twice -------------------------------------------------------------------
class ReplyLostOnce(redis.connection.Connection):
    """Loses the reply to the first transaction that pushes to a list once Redis has run
    it, as a cut connection or a Redis restart does: redis-py then sends it again."""

    landed: ClassVar[list[Callable[[], object]]] = []

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        parts = command if isinstance(command, list) else [command]
        payload = b"".join(bytes(part) for part in parts)
        self.sent_exec = b"\r\nEXEC\r\n" in payload and b"PUSH\r\n" in payload
        super().send_packed_command(command, check_health)

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, "sent_exec", False) and self.landed:
            wait_for(self.landed.pop(), what="the first send to land")
            raise redis.ConnectionError("the reply was lost")
        return super().read_response(*args, **kwargs)


@WORKERS
def test_a_due_job_that_rqs_scheduler_enqueues_twice_runs_once(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path, worker_class: str
) -> None:
    """RQ's scheduler moves a due job to its queue in one transaction; a connection cut as
    the reply comes back (as the soak's cuts do) makes redis-py send it again, and the
    job's id lands in the queue twice. A lease worker drops the copy it finds once the job
    has run (its status finished: lua/lib/lease.lua ``stray_copy``), so the job runs once;
    stock RQ runs it twice."""
    log = str(tmp_path / "runs.log")
    queue = Queue(connection=r)
    job = queue.enqueue_in(timedelta(seconds=-1), "jobs.sleep_and_record", log, 0.05)
    flaky = redis.Redis.from_url(
        redis_url,
        connection_class=ReplyLostOnce,
        retry=RedisRetry(NoBackoff(), 1),
        retry_on_error=[redis.ConnectionError],
    )
    ReplyLostOnce.landed[:] = [lambda: job.id.encode() in r.lrange(queue.key, 0, -1)]
    scheduler = RQScheduler([queue], connection=flaky)
    assert scheduler.acquire_locks()
    scheduler.enqueue_scheduled_jobs()
    assert r.lrange(queue.key, 0, -1) == [job.id.encode()] * 2, "the transaction was sent twice"
    worker = procs.worker(redis_url, worker_class=worker_class, burst=True, **STEADY)
    assert worker.wait(timeout=30) == 0, procs.log(worker)
    assert status(r, job.id) == "finished"
    expected = 2 if worker_class == "rq.Worker" else 1
    assert [line.split()[0] for line in runs(log)] == ["start", "end"] * expected, procs.log(worker)
    if expected == 1:
        assert "stray copy" in procs.log(worker)


# -- exception handlers -------------------------------------------------------------------
@pytest.mark.parametrize(
    "command",
    [
        ["worker", "-w", "rq_emq.LeaseWorker"],
        ["worker", "-w", "rq_emq.SimpleLeaseWorker"],
        ["worker-pool", "-w", "rq_emq.LeaseWorker", "-n", "1"],
    ],
)
def test_a_failed_job_whose_exception_handler_saves_it_is_in_the_failed_registry(
    r: redis.Redis, redis_url: str, procs: Processes, command: list[str]
) -> None:
    queue = Queue(connection=r)
    job = queue.enqueue("jobs.fail")
    rq_bin = str(Path(sys.executable).parent / "rq")
    if command[0] == "worker-pool" and not _worker_pool_takes_exception_handlers(rq_bin):
        pytest.skip("this RQ's worker-pool takes no --exception-handler")
    procs.start(
        [
            rq_bin,
            *command,
            "--url",
            redis_url,
            "--exception-handler",
            "feature_jobs.saving_handler",
            "default",
        ],
        env=procs.env(**FAST),
        name="worker",
    )
    wait_status(r, job.id, "failed")
    wait_for(lambda: in_registries(queue, job.id) == {"failed"}, what="the job in the failed registry")
    fetched = Job.fetch(job.id, connection=r)
    assert fetched.meta["handled"] == "ValueError"
    assert r.hget(fetched.key, "emq_status") is None  # the lease's record went with its outcome


def _worker_pool_takes_exception_handlers(rq_bin: str) -> bool:
    usage = subprocess.run([rq_bin, "worker-pool", "--help"], capture_output=True, text=True, check=False)
    return "--exception-handler" in usage.stdout


# -- cancel -------------------------------------------------------------------------------
@pytest.mark.parametrize("worker_class", ["rq_emq.LeaseWorker", "rq_emq.SimpleLeaseWorker", "rq.Worker"])
def test_a_job_canceled_while_it_runs_keeps_its_result_and_never_runs_again(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path, worker_class: str
) -> None:
    """RQ lets a canceled job's run go on and record its result; so do we. The cancel
    ends the job's future: it stays canceled, neither recovered nor run again."""
    log = str(tmp_path / "runs.log")
    queue = Queue(connection=r)
    job = queue.enqueue("jobs.sleep_and_record", log, 1.0, result="kept")
    worker = procs.worker(redis_url, worker_class=worker_class, **FAST)
    wait_for(lambda: runs(log), what="the run")
    wait_status(r, job.id, "started")
    Job.fetch(job.id, connection=r).cancel()
    wait_for(lambda: len(runs(log)) == 2, what="the run's end")
    fetched = Job.fetch(job.id, connection=r)
    wait_for(lambda: fetched.latest_result() is not None, what="the run's result")
    assert fetched.latest_result().return_value == "kept"  # type: ignore[union-attr]
    wait_for(lambda: r.zcard(rq_emq.keys.QueueKeys("default").leases) == 0, what="the lease to go")
    # a recovery would have happened within this
    time.sleep(RECOVERY_S)
    assert [line.split()[0] for line in runs(log)] == ["start", "end"], procs.log(worker)
    assert "queue" not in in_registries(queue, job.id)
    if not worker_class.startswith("rq."):  # stock RQ writes `finished` over the cancel
        assert status(r, job.id) == "canceled" and job.id in queue.canceled_job_registry


# -- the status ABA -----------------------------------------------------------------------
@pytest.mark.parametrize("back_by", ["Retry", "rq requeue"])
def test_a_job_a_stock_worker_runs_after_its_lease_worker_died_is_not_recovered_under_it(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path, back_by: str
) -> None:
    """A LeaseWorker is SIGKILLed mid-job. Stock cleanup requeues the job through its
    ``Retry`` (or fails it, and an operator runs ``rq requeue``), a stock ``rq worker``
    runs it (status ``started`` again, the dead lease's token still on the hash), and
    only then a LeaseWorker's sweep looks at the lease: it must see that RQ changed the
    job, drop the lease, and leave the stock run alone. Stock RQ alone runs it twice
    (the killed run and the one after it); so must we, and never two at once."""
    log = str(tmp_path / "runs.log")
    queue = Queue(connection=r)
    retry = {"retry": Retry(max=1)} if back_by == "Retry" else {}
    job = queue.enqueue("jobs.ticking_run", log, 8.0, job_timeout=60, **retry)
    first = procs.worker(redis_url, **FAST)
    wait_for(lambda: runs(log), what="the first run")
    wait_status(r, job.id, "started")
    kill_group(first)
    # a leased run's started entry is pinned (+inf: no stock cleanup ever finds it due,
    # test_registries.py); scored due here, it stands for one that fell due anyway (written
    # by an rq-emq from before the pin, or re-scored by a tool)
    started = StartedJobRegistry(queue=queue)
    for member in r.zrange(started.key, 0, -1):
        r.zadd(started.key, {member: 1}, xx=True)
    # stock maintenance, as time passing makes it act: RQ's own cleanup, from far ahead
    started.cleanup(timestamp=10**10)
    if back_by == "rq requeue":  # stock cleanup failed it; an operator requeues it
        wait_status(r, job.id, "failed", timeout=5)
        rq_bin = str(Path(sys.executable).parent / "rq")
        subprocess.run([rq_bin, "requeue", "--url", redis_url, "--queue", "default", job.id], check=True)
    wait_status(r, job.id, "queued", timeout=5)
    procs.worker(redis_url, worker_class="rq.Worker", burst=True)
    wait_for(lambda: len(run_spans(log)) == 2, what="the stock run")
    wait_status(r, job.id, "started")
    procs.worker(redis_url, **FAST)
    wait_for(
        lambda: stat(r, "default", "ended_by_rq") + stat(r, "default", "recovered") >= 1,
        timeout=RECOVERY_S + 5,
        what="the sweep to act on the dead lease",
    )
    wait_status(r, job.id, "finished", timeout=30)
    assert stat(r, "default", "recovered") == 0
    assert stat(r, "default", "ended_by_rq") == 1
    spans = sorted(run_spans(log).values())
    assert len(spans) == 2, spans
    assert spans[0][1] < spans[1][0]


# -- TTLs of 0 ----------------------------------------------------------------------------
@pytest.mark.parametrize("failure_ttl", [0, 1])
def test_a_failure_ttl_0_job_failed_by_the_sweep_runs_its_failure_callback(
    r: redis.Redis, redis_url: str, procs: Processes, tmp_path: Path, failure_ttl: int
) -> None:
    """Stock RQ runs a failed job's ``on_failure`` and then, with ``failure_ttl=0``,
    deletes it; the sweep's failure at max attempts does the same (the job was deleted
    before its callback could run)."""
    from rq import Callback

    log, callbacks = str(tmp_path / "runs.log"), str(tmp_path / "callbacks.log")
    job = Queue(connection=r).enqueue(
        "jobs.sleep_and_record",
        log,
        60.0,
        job_timeout=120,
        failure_ttl=failure_ttl,
        on_failure=Callback("jobs.on_failure_record"),
        meta={"log": callbacks, **rq_emq.max_attempts(1)},
    )
    worker = procs.worker(redis_url, **FAST)
    wait_for(lambda: runs(log), what="the run")
    wait_status(r, job.id, "started")
    kill_group(worker)
    procs.worker(redis_url, **FAST)  # its sweep fails the job at max attempts
    wait_for(lambda: runs(callbacks), timeout=RECOVERY_S + 10, what="the failure callback")
    assert runs(callbacks) == ["failed JobStalled"]
    if failure_ttl == 0:
        wait_for(lambda: not r.exists(job.key), what="the job to go, as failure_ttl=0 says")
    else:
        assert status(r, job.id) == "failed"
    assert [line.split()[0] for line in runs(log)] == ["start"]


TTL_OPTIONS = [{}, {"result_ttl": 0}, {"result_ttl": 5}, {"failure_ttl": 0}, {"failure_ttl": 5}, {"ttl": 5}]


def _outcomes(
    r: redis.Redis, redis_url: str, procs: Processes, worker_class: str, queue_name: str
) -> list[object]:
    """What each job of every TTL option and outcome (success, failure) is left as after
    one burst worker of ``worker_class``: whether its hash and a Result exist, its status,
    its registries."""
    queue = Queue(queue_name, connection=r)
    jobs = [
        queue.enqueue(func, **options)  # type: ignore[arg-type]
        for options in TTL_OPTIONS
        for func in ("jobs.noop", "jobs.fail")
    ]
    worker = procs.worker(redis_url, queue_name, worker_class=worker_class, burst=True, **FAST)
    assert worker.wait(timeout=60) == 0, procs.log(worker)
    return [
        (
            job.func_name,
            TTL_OPTIONS[index // 2],
            bool(r.exists(job.key)),
            status(r, job.id),
            bool(r.exists(f"rq:results:{job.id}")),
            sorted(in_registries(queue, job.id)),
        )
        for index, job in enumerate(jobs)
    ]


@pytest.mark.parametrize(
    ("ours", "stock"), [("rq_emq.LeaseWorker", "rq.Worker"), ("rq_emq.SimpleLeaseWorker", "rq.SimpleWorker")]
)
def test_ttls_of_0_and_small_values_leave_each_outcome_as_stock_rq_does(
    r: redis.Redis, redis_url: str, procs: Processes, ours: str, stock: str
) -> None:
    assert _outcomes(r, redis_url, procs, ours, "ours") == _outcomes(r, redis_url, procs, stock, "stock")
