"""A LeaseWorker forks each next horse ahead, as its current job starts or as it goes idle
after a job, and hands that horse its job once taken (rq_emq/run/fork_ahead.py): the fork is off
the job's path, each job still runs in a process of its own, and a horse forked ahead
holds nothing until it is handed a job. Real workers, real forks and signals, a real
redis-server."""

from __future__ import annotations

import os
import signal
import time

import pytest
import redis
from helpers import stat
from procs import Processes, pid_alive, wait_for
from rq import Queue

from rq_emq.run.fork_ahead import Shared, StaleSpare
from rq_emq.testing import RedisServer

pytestmark = [
    pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="Linux 5.3+ with Python 3.9+ only"),
    pytest.mark.rq_versions,
]

#: How long the worker waits idle before the job that reads its horse's age is enqueued.
IDLE_S = 1.5
#: Nothing recovers or renews between the steps of these tests, and no spare reaches its
#: age limit (tests/run/test_spare_age.py holds spares to it).
QUIET = {
    "RQ_EMQ_LEASE_MS": "600000",
    "RQ_EMQ_SWEEP_INTERVAL_MS": "60000",
    "RQ_EMQ_SPARE_MAX_AGE_MS": str(int(IDLE_S * 20 * 1000)),
}


def _finished(job: object, timeout: float = 30) -> object:
    wait_for(lambda: job.get_status(refresh=True) == "finished", timeout=timeout, what="the job")  # type: ignore[attr-defined]
    return job.return_value()  # type: ignore[attr-defined]


def _stat(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read()
    except OSError:
        return b""


def _spares(worker_pid: int) -> list[int]:
    """The worker's children that are forks of it and lead a session of their own: its
    horse forked ahead, while no job runs (the watchdog is a program of its own)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fields = _stat(int(name))
        except OSError:
            continue
        # fields: state, ppid, pgrp, session, ...
        if int(fields[1]) == worker_pid and int(fields[3]) == int(name) and fields[0] != "Z":
            if _cmdline(int(name)) == _cmdline(worker_pid):  # a fork, not the watchdog's exec
                found.append(int(name))
    return found


def _the_spare(worker_pid: int) -> list[int]:
    """The one horse forked ahead, once the last job's horse, told done and exiting (a
    fork of the worker in a session of its own too), is gone."""
    found: list[int] = []

    def one() -> bool:
        found[:] = _spares(worker_pid)
        return len(found) == 1

    wait_for(one, timeout=10, what="exactly one horse forked ahead")
    return found


def _idle_with_a_spare(url: str, procs: Processes, **env: str) -> tuple[object, Queue]:
    r = redis.Redis.from_url(url)
    queue = Queue(connection=r)
    worker = procs.worker(url, **QUIET, **env)
    _finished(queue.enqueue("jobs.noop"))  # warmed up: its bootstrap done, its loop waiting
    return worker, queue


def test_a_job_runs_in_a_horse_forked_before_it_was_taken(own_server: RedisServer, procs: Processes) -> None:
    worker, queue = _idle_with_a_spare(own_server.url, procs)
    time.sleep(IDLE_S)
    pid, age = _finished(queue.enqueue("jobs.process_age"))  # type: ignore[misc]
    # forked while the worker waited: as old as the wait (slack: the tick's 10 ms, and the
    # warm-up job's own end, which may fork it up to half the wait later)
    assert age >= IDLE_S / 2, (age, procs.log(worker))
    assert pid != worker.pid


def test_a_job_taken_after_an_idle_wait_that_runs_on_has_the_next_horse_forked_beside_it(
    own_server: RedisServer, procs: Processes, tmp_path: object
) -> None:
    """The first job after an idle wait has its start to itself (the next horse is forked
    once it has run ``SPARE_AFTER_IDLE_START_S``, 50 ms), and a job that runs longer still
    has the next one's horse forked while it runs: the job queued behind it starts in a
    horse about as old as that run (1 s; asserted: half of it)."""
    worker, queue = _idle_with_a_spare(own_server.url, procs)
    time.sleep(IDLE_S)
    first = queue.enqueue("jobs.sleep_and_record", os.path.join(str(tmp_path), "runs.log"), 1.0)
    behind = queue.enqueue("jobs.process_age")
    _finished(first)
    _, age = _finished(behind)  # type: ignore[misc]
    assert age >= 0.5, (age, procs.log(worker))


def test_with_fork_ahead_off_the_horse_is_forked_for_its_job(
    own_server: RedisServer, procs: Processes
) -> None:
    worker, queue = _idle_with_a_spare(own_server.url, procs, RQ_EMQ_FORK_AHEAD="false")
    time.sleep(IDLE_S)
    assert _spares(worker.pid) == []
    _, age = _finished(queue.enqueue("jobs.process_age"))  # type: ignore[misc]
    assert age < IDLE_S / 2, (age, procs.log(worker))


def test_every_job_runs_in_a_process_of_its_own(own_server: RedisServer, procs: Processes) -> None:
    worker, queue = _idle_with_a_spare(own_server.url, procs)
    jobs = [queue.enqueue("jobs.process_age") for _ in range(20)]
    pids = [_finished(job)[0] for job in jobs]  # type: ignore[index]
    assert len(set(pids)) == 20 and worker.pid not in pids, pids


def test_a_horse_forked_ahead_goes_with_its_worker(own_server: RedisServer, procs: Processes) -> None:
    """A SIGKILLed worker leaves no spare behind, waiting for a job that never comes."""
    worker, _ = _idle_with_a_spare(own_server.url, procs)
    spares = _the_spare(worker.pid)
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait(timeout=10)
    wait_for(lambda: not any(pid_alive(pid) for pid in spares), timeout=5, what="the spare to exit")  # type: ignore[union-attr]


def test_a_horse_killed_while_it_waits_is_no_crash_and_its_job_runs_once(
    own_server: RedisServer, procs: Processes, tmp_path: object
) -> None:
    worker, queue = _idle_with_a_spare(own_server.url, procs)
    (spare,) = _the_spare(worker.pid)
    os.kill(spare, signal.SIGKILL)
    wait_for(lambda: not pid_alive(spare), timeout=5, what="the spare to die")
    log = f"{tmp_path}/runs.log"
    job = queue.enqueue("jobs.record", log)
    _finished(job)
    with open(log) as runs:
        lines = runs.read().splitlines()
    assert len(lines) == 1 and str(spare) not in lines[0], lines
    r = redis.Redis.from_url(own_server.url)
    assert stat(r, "default", "crashed") == 0 and stat(r, "default", "recovered") == 0
    text = procs.log(worker)
    assert "before writing an outcome" not in text and "Traceback" not in text, text
    # and the worker goes on forking ahead
    wait_for(lambda: _spares(worker.pid), timeout=10, what="a new horse forked ahead")


def test_a_handover_names_the_workers_clients_by_address_and_refuses_any_other(
    own_server: RedisServer,
) -> None:
    """The horse forked ahead holds the worker's clients at the same addresses; a client
    made since its fork cannot be named, and the worker then forks as RQ does."""
    client = redis.Redis.from_url(own_server.url)
    shared = Shared([client])
    job = Queue(connection=client).enqueue("jobs.noop")
    copy = shared.loads(shared.dumps(job))
    assert copy.connection is client and copy.id == job.id and copy.func_name == "jobs.noop"
    later = redis.Redis.from_url(own_server.url)
    with pytest.raises(StaleSpare):
        shared.dumps(Queue(connection=later).fetch_job(job.id))


def test_a_horse_forked_ahead_is_fenced_by_the_lease_it_was_handed(
    own_server: RedisServer, procs: Processes, tmp_path: object
) -> None:
    """Its lease travels in the handover: a run whose lease was taken away (as a recovery
    would) has its success refused, as a horse forked for its job has."""
    worker, queue = _idle_with_a_spare(own_server.url, procs)
    _the_spare(worker.pid)
    job = queue.enqueue("jobs.lose_lease_and_succeed", f"{tmp_path}/runs.log")
    wait_for(lambda: "outcome discarded" in procs.log(worker), timeout=30, what="the refused outcome")
    assert job.get_status(refresh=True) != "finished", procs.log(worker)
    assert "Job OK" not in procs.log(worker).split(job.id, 1)[1]


def test_a_user_class_that_overrides_a_step_before_the_fork_forks_as_rq_does() -> None:
    """A step of the user's between the take and the fork (``execute_job``, say) may leave
    state in the worker's memory for its horse; a horse forked before the take would not
    have it. Steps in the horse (``prepare_job_execution``, ``perform_job``) and RQ's own
    classes keep the fork ahead."""
    from worker_classes import LeaseAuditingWorker, LeaseHerokuWorker, SlowStartLeaseWorker

    from rq_emq import LeaseWorker
    from rq_emq.run.fork_ahead import forks_ahead_safely

    assert not forks_ahead_safely(LeaseAuditingWorker)
    assert forks_ahead_safely(LeaseWorker)
    assert forks_ahead_safely(LeaseHerokuWorker)
    assert forks_ahead_safely(SlowStartLeaseWorker)


def test_a_crash_after_a_stop_the_worker_sent_is_still_a_crash(
    own_server: RedisServer, procs: Processes, tmp_path: object
) -> None:
    """A horse the worker itself killed (RQ's stop-job command) is no crash; the next
    job's horse, handed its job, is a new run: its death by a signal the worker did not
    send is a crash, recovered at once, not RQ's failure. Every part's step before the
    fork runs for a horse forked ahead too (the soak found one skipped: a crash read as
    the worker's own kill, the job failed by RQ and its attempts counted from 1 again)."""
    from rq.command import send_stop_job_command

    worker, queue = _idle_with_a_spare(own_server.url, procs)
    r = redis.Redis.from_url(own_server.url)
    stopped = queue.enqueue("crash_jobs.sleep_then", f"{tmp_path}/stopped.log", 30, job_timeout=60)
    wait_for(lambda: stopped.get_status(refresh=True) == "started", timeout=30, what="the job to start")
    time.sleep(0.3)  # the worker's command channel is subscribed
    send_stop_job_command(r, stopped.id)
    wait_for(lambda: stopped.get_status(refresh=True) == "stopped", timeout=30, what="the stop")
    crashing = queue.enqueue("crash_jobs.crash_first", f"{tmp_path}/crash.log", "kill")
    _finished(crashing)
    assert stat(r, "default", "crashed") == 1, procs.log(worker)
