"""The worker's RQ methods called directly, as tools and RQ's own tests call them: no
``work()`` has bootstrapped the worker, and each still works under a lease."""

from __future__ import annotations

import inspect
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.exceptions import ConnectionError as RedisConnectionError
from rq import Callback, Queue
from rq.job import Job

from rq_emq import LeaseWorker, SimpleLeaseWorker
from rq_emq.keys import QueueKeys, job_key

pytestmark = pytest.mark.rq_versions

WORKERS = [LeaseWorker, SimpleLeaseWorker]


@pytest.fixture(params=WORKERS, ids=lambda cls: cls.__name__)
def worker(request: pytest.FixtureRequest, r: redis.Redis) -> Iterator[LeaseWorker]:
    w = request.param([Queue("q", connection=r)], connection=r, lease_ms=5_000)
    yield w
    w.teardown()


def test_dequeue_then_execute_job_without_work_runs_the_job_under_a_lease(
    r: redis.Redis, worker: LeaseWorker
) -> None:
    job = Queue("q", connection=r).enqueue("jobs.add", 2, 3)
    taken = worker.dequeue_job_and_maintain_ttl(None)
    assert taken is not None and taken[0].id == job.id
    assert r.exists(QueueKeys("q").lock(job.id))  # leased, and renewed by a lock manager
    assert worker.lock_manager is not None and worker.lock_manager.get(job.id) is not None
    worker.execute_job(*taken)
    job.refresh()
    assert job.get_status() == "finished" and job.return_value() == 5
    assert not r.exists(QueueKeys("q").lock(job.id)) and r.zscore(QueueKeys("q").leases, job.id) is None


def test_dequeue_then_perform_job_without_work_runs_the_job(r: redis.Redis, worker: LeaseWorker) -> None:
    job = Queue("q", connection=r).enqueue("jobs.add", 1, 1)
    taken = worker.dequeue_job_and_maintain_ttl(None)
    assert taken is not None
    assert perform(worker, *taken) is True
    assert r.hget(job_key(job.id), "status") == b"finished"


def perform(worker: LeaseWorker, job: Job, queue: Queue) -> bool:
    """RQ's own call, as its horse makes it (RQ 3 passes the execution it prepared)."""
    if "execution" in inspect.signature(worker.perform_job).parameters:
        return bool(worker.perform_job(job, queue, worker.prepare_execution(job)))
    return bool(worker.perform_job(job, queue))


def test_perform_job_on_a_job_never_taken_runs_it_as_rq_would(r: redis.Redis, worker: LeaseWorker) -> None:
    queue = Queue("q", connection=r)
    job = queue.enqueue("jobs.add", 5, 5)
    assert perform(worker, job, queue) is True
    assert r.hget(job_key(job.id), "status") == b"finished"


def test_execute_job_on_a_job_never_taken_runs_it_as_rq_would(r: redis.Redis, worker: LeaseWorker) -> None:
    queue = Queue("q", connection=r)
    job = queue.enqueue("jobs.add", 4, 4)
    worker.execute_job(job, queue)
    job.refresh()
    assert job.get_status() == "finished" and job.return_value() == 8


def test_unsubscribing_ends_the_pubsub_thread_without_waiting_out_its_join(worker: LeaseWorker) -> None:
    """RQ's order (UNSUBSCRIBE, then stop) let its pubsub thread take the reply and wait
    60 s more, so each worker exit waited the whole 1 s join: ours tells the thread first."""
    worker.subscribe()
    thread, pubsub = worker.pubsub_thread, worker.pubsub
    assert thread is not None and pubsub is not None and thread.is_alive()
    # in its loop (redis-py's thread ignores a stop that comes before its loop starts)
    deadline = time.monotonic() + 10
    while not thread._running.is_set() and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.5)  # it has read the SUBSCRIBE replies and sits in its 60 s read
    send_unsubscribe = pubsub.unsubscribe

    def reply_taken_at_once(*args: object) -> object:
        sent = send_unsubscribe(*args)
        time.sleep(0.2)  # the thread has the reply before RQ's next line tells it to stop
        return sent

    pubsub.unsubscribe = reply_taken_at_once  # type: ignore[method-assign]
    began = time.monotonic()
    worker.unsubscribe()
    assert not thread.is_alive()
    # redis-py 8.2's stop() joins the thread: told before the UNSUBSCRIBE, it must not wait
    # out the thread's 60 s read (0.2 s of the test's own sleep; slack 10x for a loaded host)
    assert time.monotonic() - began < 2.0


def test_unsubscribing_as_the_pubsub_thread_closes_its_connection_raises_nothing(
    r: redis.Redis, worker: LeaseWorker
) -> None:
    """Told to stop, the thread closes the pubsub's connection as its last step; a reply
    it was already reading (the SUBSCRIBE's, late on a loaded host) lets it close it under
    the UNSUBSCRIBE being sent, which raises (``Bad file descriptor``).
    The subscription ends with the connection: the worker's stop goes on."""
    worker.subscribe()
    thread, pubsub = worker.pubsub_thread, worker.pubsub
    assert thread is not None and pubsub is not None
    deadline = time.monotonic() + 10
    while not thread._running.is_set() and time.monotonic() < deadline:
        time.sleep(0.01)

    def closed_under_the_send(*args: object) -> object:
        # a message (one RQ ignores) wakes the stopped thread
        r.publish(worker.pubsub_channel_name, '{"command": "none"}')
        thread.join(timeout=5)  # it has closed the pubsub
        raise RedisConnectionError("Error 9 while writing to socket. Bad file descriptor.")

    pubsub.unsubscribe = closed_under_the_send  # type: ignore[method-assign]
    worker.unsubscribe()
    assert not thread.is_alive()


def test_a_redis_blip_as_the_scheduler_starts_is_waited_out(
    worker: LeaseWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--with-scheduler``: Redis restarting as the worker starts its scheduler (right
    after it registered) no longer ends the worker; the start is tried again."""
    from rq.scheduler import RQScheduler

    tries: list[int] = []
    acquire = RQScheduler.acquire_locks

    def flaky(self: RQScheduler, *args: object, **kwargs: object) -> object:
        tries.append(1)
        if len(tries) == 1:
            raise RedisConnectionError("Connection closed by server.")
        return acquire(self, *args, **kwargs)

    monkeypatch.setattr(RQScheduler, "acquire_locks", flaky)
    worker._start_scheduler(burst=True)
    assert len(tries) == 2


def test_an_empty_queue_gives_none_without_work(worker: LeaseWorker) -> None:
    assert worker.dequeue_job_and_maintain_ttl(None) is None


def take_line(caplog: pytest.LogCaptureFixture) -> str:
    (line,) = [rec.getMessage() for rec in caplog.records if "attempt" in rec.getMessage()]
    return line


def rqs_prefix(worker: LeaseWorker) -> str:
    """RQ's own dequeue line names the worker from 2.12 on (rq.worker a package), not in 2.0."""
    from rq_emq import compat

    return f"Worker {worker.name}: " if compat.WORKER_NAMED_IN_LOGS else ""


def test_the_take_logs_rqs_dequeue_line_with_the_attempt(
    r: redis.Redis, worker: LeaseWorker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    job = Queue("q", connection=r).enqueue("jobs.add", 2, 3)
    assert worker.dequeue_job_and_maintain_ttl(None) is not None
    assert take_line(caplog) == f"{rqs_prefix(worker)}q: jobs.add(2, 3) ({job.id}), attempt 1"


def test_the_take_line_leaves_the_description_out_when_rq_is_told_to(
    r: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    worker = LeaseWorker([Queue("q", connection=r)], connection=r, log_job_description=False)
    try:
        job = Queue("q", connection=r).enqueue("jobs.add", 2, 3)
        assert worker.dequeue_job_and_maintain_ttl(None) is not None
        assert take_line(caplog) == f"{rqs_prefix(worker)}q: {job.id}, attempt 1"
    finally:
        worker.teardown()


def test_a_blip_as_the_worker_turns_idle_does_not_end_it(
    r: redis.Redis, worker: LeaseWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RQ's wait loop writes the idle state before its own retry loop: a connection error
    there (a CLIENT KILL, found by the soak) ended `rq worker`. The worker waits for Redis
    and goes on to take the job."""
    job = Queue("q", connection=r).enqueue("jobs.add", 2, 3)
    real = type(worker).set_state
    blips: list[str] = []

    def set_state(self: LeaseWorker, state: object, *args: object, **kwargs: object) -> None:
        if not blips:
            blips.append(str(state))
            raise redis.ConnectionError("Connection closed by server.")
        real(self, state, *args, **kwargs)

    monkeypatch.setattr(type(worker), "set_state", set_state)
    taken = worker.dequeue_job_and_maintain_ttl(None)
    assert blips and taken is not None and taken[0].id == job.id


class _SweeperWhoseThreadRecoversTheJob:
    """A burst worker's sweeper as it was seen to race: the first look finds the job marked,
    and while the worker waits out the grace its own sweeper thread recovers the job, so
    the second look finds neither a mark nor a recovery of its own."""

    grace_ms = 10

    def __init__(self) -> None:
        self.marks = [True, False]

    def sweep_now(self) -> list:
        return []

    def jobs_waiting(self) -> bool:
        return False

    def marks_standing(self) -> bool:
        return self.marks.pop(0)


def test_a_burst_worker_whose_waited_mark_was_recovered_meanwhile_takes_again_before_exiting() -> None:
    from rq_emq.run.dequeue import DequeueMixin

    worker = type("W", (), {"sweeper": _SweeperWhoseThreadRecoversTheJob(), "_stop_requested": False})()
    assert DequeueMixin._recover_before_exit(worker) is True  # type: ignore[arg-type]
    # with no mark standing at all there is nothing to wait for: it exits
    idle = type("W", (), {"sweeper": _SweeperWhoseThreadRecoversTheJob(), "_stop_requested": False})()
    idle.sweeper.marks = [False]
    assert DequeueMixin._recover_before_exit(idle) is False  # type: ignore[arg-type]


def test_a_job_whose_lease_is_lost_before_its_run_begins_runs_no_failure_callback(
    r: redis.Redis, worker: LeaseWorker, tmp_path: Path
) -> None:
    """The run never began (another holder has the job by then, as after a failover): RQ's
    failure path, which the interruption enters, must not run the job's failure callback,
    nor fail the job (on RQ 2.12 a Sentinel failover trial otherwise met a spurious callback)."""
    log = tmp_path / "callbacks.log"
    queue = Queue("q", connection=r)
    on_failure = Callback("jobs.on_failure_record")
    job = queue.enqueue("jobs.add", 1, 1, on_failure=on_failure, meta={"log": str(log)})
    taken = worker.dequeue_job_and_maintain_ttl(None)
    assert taken is not None
    takes_execution = "execution" in inspect.signature(worker.perform_job).parameters  # RQ 3
    execution = (worker.prepare_execution(taken[0]),) if takes_execution else ()
    r.hset(job_key(job.id), "emq_token", "another-holders-token")  # the sweep gave it on
    assert worker.perform_job(*taken, *execution) is False
    assert not log.exists()
    assert r.hget(job_key(job.id), "status") != b"failed"


def test_a_stop_whose_signal_a_wait_swallowed_still_ends_the_idle_wait(
    worker: LeaseWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RQ's stop handler raises StopRequested into whatever the main thread runs, a wait's
    own cleanup included; the flag it sets first still ends the idle wait, at once."""
    from rq_emq import compat

    takes: list[float | None] = []

    def take_swallowing_the_stop(timeout: float | None) -> None:
        takes.append(timeout)
        assert len(takes) == 1, "waited again after the stop"
        worker._stop_requested = True  # the handler ran; its exception was caught inside
        return None

    monkeypatch.setattr(worker, "_take", take_swallowing_the_stop)
    with pytest.raises(compat.StopRequested):
        worker.dequeue_job_and_maintain_ttl(1)
    assert len(takes) == 1


def test_a_stop_lost_as_the_worker_forks_its_next_horse_never_starts_the_idle_wait(
    worker: LeaseWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pool's SIGINT may reach a member as it forks its spare horse: RQ's handler then
    runs in logging's at-fork hook, where Python ignores exceptions, and the member would
    wait out RQ's dequeue timeout. The flag the handler set first is read before the wait
    begins."""
    from rq_emq import compat

    def fork_while_told_to_stop() -> None:
        worker._stop_requested = True  # the handler ran; its StopRequested was ignored

    monkeypatch.setattr(worker, "_before_idle_wait", fork_while_told_to_stop)
    started = time.monotonic()
    with pytest.raises(compat.StopRequested):
        worker.dequeue_job_and_maintain_ttl(30)
    assert time.monotonic() - started < 3  # a tenth of the wait's 30 s


def test_a_stop_lost_while_the_worker_waits_ends_the_wait_within_a_poll(worker: LeaseWorker) -> None:
    """The same flag, set while the worker already waits: its wait looks at it every
    quarter second (no Redis command), and ends."""
    from rq_emq import compat

    threading.Timer(0.5, lambda: setattr(worker, "_stop_requested", True)).start()
    started = time.monotonic()
    with pytest.raises(compat.StopRequested):
        worker.dequeue_job_and_maintain_ttl(30)
    assert time.monotonic() - started < 3  # the flag at 0.5 s, a quarter second's poll; of 30 s


def test_a_stop_signal_to_an_idle_worker_sets_rqs_flag_as_well_as_raising(
    worker: LeaseWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RQ raises StopRequested at an idle worker and sets its flag only for a busy one; ours
    sets the flag too, so that a raise a handler caught still ends the wait (above)."""
    import signal

    from rq_emq import compat

    monkeypatch.setattr(signal, "signal", lambda *args: None)  # RQ re-arms SIGINT for a cold stop
    with pytest.raises(compat.StopRequested):
        worker.request_stop(signal.SIGINT, None)
    assert worker._stop_requested
