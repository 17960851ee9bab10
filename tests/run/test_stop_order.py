"""A job moves only after the run that had it is over (issue 33, rule 3).

A ``SimpleLeaseWorker`` runs the job in its own main thread: its cold stop (a second
SIGTERM, or ``RQ_EMQ_SHUTDOWN_TIMEOUT_MS`` after one) interrupts the job there, and ends
the worker process once the job's frame has unwound (its ``finally`` blocks run), or half
the self-kill's delay later if it does not give way (it swallows the interrupt); its
watchdog, seeing the process gone, hands the job back. A job that swallows the interrupt
of a lost lease is ended with its process that long after the loss.

Real ``rq worker`` processes, real signals, a real Redis, and a second worker on the same
queue that takes the job the moment it is handed back. Overlap is measured by the runs'
own timestamps (``jobs.run_spans``, CLOCK_MONOTONIC: one clock for every process here).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import redis
from helpers import stat, status, take_away
from jobs import run_spans, runs
from procs import Processes, wait_for
from rq import Queue, Worker

from rq_emq.settings import LeaseSettings

pytestmark = pytest.mark.slow

#: the one SIGTERM's wait before the cold stop (``RQ_EMQ_SHUTDOWN_TIMEOUT_MS``)
SHUTDOWN_TIMEOUT_MS = 1500
#: how each test turns the warm stop cold: a second SIGTERM (RQ ignores one within 1 s of
#: the first), or the shutdown timeout after one
STOPS = pytest.mark.parametrize("stop", ["second-sigterm", "shutdown-timeout"])

#: a lease long enough that the self-kill's delay (half the margin plus half a renew
#: interval: 8 s here, half of it for the job's code to give way) leaves a clean-up of
#: CLEANUP_S time to finish before the process ends
PATIENT = {"RQ_EMQ_LEASE_MS": "40000", "RQ_EMQ_RENEW_INTERVAL_MS": "8000"}
#: 3/4 of the 4 s PATIENT gives a job's code to give way: 1 s of room for a loaded host
CLEANUP_S = 3.0
#: a short lease, so that the sweep recovers a self-killed run's job within seconds
BRIEF = {"RQ_EMQ_LEASE_MS": "2000", "RQ_EMQ_RENEW_INTERVAL_MS": "400", "RQ_EMQ_SWEEP_INTERVAL_MS": "625"}
BRIEF_SETTINGS = LeaseSettings(lease_ms=2000, renew_interval_ms=400, sweep_interval_ms=625)
#: the second worker: takes a handed-back job at once, and sweeps every 782 ms (the shortest
#: sweep interval its renew interval allows)
TAKER = {"RQ_EMQ_LEASE_MS": "5000", "RQ_EMQ_RENEW_INTERVAL_MS": "500", "RQ_EMQ_SWEEP_INTERVAL_MS": "782"}
#: the first run would go on this long: only the stop ends it
RUN_S = 60.0
#: a later run only has to finish
LATER_S = 0.3


def _start(
    r: redis.Redis, procs: Processes, redis_url: str, log: str, first: dict[str, str], stop: str
) -> subprocess.Popen[bytes]:
    """The first worker (running the job), then the second, idle on the same queue."""
    if stop == "shutdown-timeout":
        first = {**first, "RQ_EMQ_SHUTDOWN_TIMEOUT_MS": str(SHUTDOWN_TIMEOUT_MS)}
    worker = procs.worker(redis_url, worker_class="rq_emq.SimpleLeaseWorker", **first)
    wait_for(lambda: runs(log), timeout=15, what="the first run to start")
    procs.worker(redis_url, **TAKER)
    wait_for(lambda: len(Worker.all(connection=r)) == 2, timeout=15, what="the second worker")
    time.sleep(0.3)  # registered, then blocked on the queue
    return worker


def _cold_stop(worker: subprocess.Popen[bytes], stop: str) -> float:
    """Stop the worker cold; returns when (monotonic) the cold stop was due."""
    worker.send_signal(signal.SIGTERM)  # warm: would wait for the job
    if stop == "shutdown-timeout":
        return time.monotonic() + SHUTDOWN_TIMEOUT_MS / 1000
    time.sleep(1.3)  # RQ ignores a second signal within 1 s of the first
    worker.send_signal(signal.SIGTERM)
    return time.monotonic()


def _first_run(log: str) -> tuple[int, float, float]:
    """(pid, last seen alive, the second run's start)."""
    spans = run_spans(log)
    first_pid = int(runs(log)[0].split()[1])
    later_starts = [start for pid, (start, _) in spans.items() if pid != first_pid]
    assert later_starts, "the job was not run again"
    return first_pid, spans[first_pid][1], min(later_starts)


@STOPS
def test_a_cold_stop_hands_the_job_back_only_after_its_finally_block_has_run(
    r: redis.Redis, procs: Processes, redis_url: str, tmp_path: Path, stop: str
) -> None:
    log = str(tmp_path / "runs.log")
    job = Queue(connection=r).enqueue(
        "jobs.ticking_run_with_finally", log, RUN_S, CLEANUP_S, later_s=LATER_S, job_timeout=120
    )
    worker = _start(r, procs, redis_url, log, PATIENT, stop)
    cold_at = _cold_stop(worker, stop)
    # the first run is over once its worker is: read its last line after that
    assert worker.wait(timeout=20) == 0, procs.log(worker)
    wait_for(lambda: status(r, job.id) == "finished", timeout=30, what="the job to finish")
    _, first_last, second_start = _first_run(log)
    assert first_last < second_start, f"runs overlap by {1000 * (first_last - second_start):.0f} ms"
    # the clean-up ran to its end, and the job was handed back by the worker's watchdog
    # once the process was gone (not left to the sweep)
    assert [line.split()[0] for line in runs(log)].count("cleaned") == 1
    assert first_last - cold_at >= CLEANUP_S * 0.9  # the interrupt came with the cold stop
    assert stat(r, "default", "returned") == 1
    assert "back at the front of its queue (cold stop: attempt refunded)" in procs.log(worker)


@STOPS
def test_a_job_that_swallows_the_cold_stop_ends_with_its_worker_and_is_handed_back(
    r: redis.Redis, procs: Processes, redis_url: str, tmp_path: Path, stop: str
) -> None:
    log = str(tmp_path / "runs.log")
    job = Queue(connection=r).enqueue("jobs.swallowing_run", log, RUN_S, later_s=LATER_S, job_timeout=120)
    worker = _start(r, procs, redis_url, log, BRIEF, stop)
    cold_at = _cold_stop(worker, stop)
    wait_for(lambda: worker.poll() is not None, timeout=10, what="the worker to end itself")
    # a stock cold stop's status; SIGKILL if its watchdog came first (a loaded host)
    assert worker.returncode in (0, -signal.SIGKILL), procs.log(worker)
    wait_for(lambda: status(r, job.id) == "finished", timeout=30, what="the job to finish")
    _, first_last, second_start = _first_run(log)
    assert first_last < second_start, f"runs overlap by {1000 * (first_last - second_start):.0f} ms"
    assert "swallowed" in [line.split()[0] for line in runs(log)]  # the interrupt did land
    # ended within the self-kill's delay (by itself), or a check interval later (by its
    # watchdog); the slack, three times that bound, is for a loaded host's late timers
    bound = BRIEF_SETTINGS.lease_margin_ms / 2000 + BRIEF_SETTINGS.renew_interval_ms / 2000
    bound += BRIEF_SETTINGS.lease_check_interval_s
    assert first_last - cold_at < 3 * bound
    # handed back by its watchdog once the process was gone, the attempt refunded
    assert stat(r, "default", "returned") == 1 and stat(r, "default", "crashed") == 0
    said = procs.log(worker)
    assert "stopped cold; ending the worker process" in said or "past its deadline" in said, said


#: renewals every 400 ms of an 8 s lease: the self-kill's delay is 0.6 s (half the 800 ms
#: margin and half a renew interval), while the lease clock runs out only 7.2 s past a renewal
WATCHFUL = {"RQ_EMQ_LEASE_MS": "8000", "RQ_EMQ_RENEW_INTERVAL_MS": "400"}
WATCHFUL_SETTINGS = LeaseSettings(lease_ms=8000, renew_interval_ms=400)


def test_a_job_that_swallows_the_lease_lost_interrupt_ends_with_its_worker_within_the_self_kill_delay(
    r: redis.Redis, procs: Processes, redis_url: str, tmp_path: Path
) -> None:
    """The lease found lost (recovered elsewhere: the job may already run there), the
    interrupt swallowed: the worker ends itself that long after, not when its lease clock
    runs out."""
    log = str(tmp_path / "runs.log")
    job = Queue(connection=r).enqueue("jobs.swallowing_run", log, RUN_S, job_timeout=120)
    worker = procs.worker(redis_url, worker_class="rq_emq.SimpleLeaseWorker", **WATCHFUL)
    wait_for(lambda: runs(log), timeout=15, what="the run to start")
    taken_at = time.monotonic()
    take_away(r, job.id, status="queued")
    wait_for(lambda: worker.poll() is not None, timeout=15, what="the worker to end itself")
    # exit 1, for a supervisor to start it again; SIGKILL if its watchdog came first
    assert worker.returncode in (1, -signal.SIGKILL), procs.log(worker)
    assert "swallowed" in [line.split()[0] for line in runs(log)]  # the interrupt did land
    settings = WATCHFUL_SETTINGS
    # found lost within a renew interval, then the self-kill's delay (or a check interval
    # later, by the watchdog); twice that bound is the slack for a loaded host's late timers,
    # still well short of the 7.2 s the lease clock would have let it run
    bound = settings.renew_interval_ms / 1000 + (settings.lease_margin_ms + settings.renew_interval_ms) / 2000
    bound += settings.lease_check_interval_s
    last = max(at for _, at in run_spans(log).values())
    assert last - taken_at < 2 * bound
    said = procs.log(worker)
    assert "stopped, its lease lost; ending the worker process" in said or "past its deadline" in said, said


def test_a_simple_worker_frozen_after_a_stop_is_ended_by_its_watchdog_at_the_self_kill_moment(
    r: redis.Redis, procs: Processes, redis_url: str, tmp_path: Path
) -> None:
    """The lease found lost, the interrupt swallowed, then the worker frozen before its own
    self-kill: the watchdog ends it a check interval after the self-kill's moment, not at
    the deadline it read before the stop, a lease away (4.7 s late on a loaded host)."""
    log = str(tmp_path / "runs.log")
    job = Queue(connection=r).enqueue("jobs.swallowing_run", log, RUN_S, job_timeout=120)
    worker = procs.worker(redis_url, worker_class="rq_emq.SimpleLeaseWorker", **WATCHFUL)
    wait_for(lambda: runs(log), timeout=15, what="the run to start")
    time.sleep(1.0)  # the watchdog has read the run's deadline, some 8 s away, and sleeps
    take_away(r, job.id, status="queued")
    wait_for(lambda: "swallowed" in [line.split()[0] for line in runs(log)], timeout=15, what="the interrupt")
    settings = WATCHFUL_SETTINGS
    self_kill_s = (settings.lease_margin_ms + settings.renew_interval_ms) / 2000
    time.sleep(self_kill_s / 8)  # the stop has moved the deadline; its end (half the delay) is yet to come
    frozen_at = time.monotonic()
    os.kill(worker.pid, signal.SIGSTOP)
    wait_for(lambda: worker.poll() is not None, timeout=15, what="the watchdog to end the worker")
    ended_s = time.monotonic() - frozen_at
    assert worker.returncode == -signal.SIGKILL
    # the self-kill's moment and a check interval, twice over for a loaded host's late wake;
    # the deadline read before the stop was the lease (8 s) away
    assert ended_s < 2 * (self_kill_s + settings.lease_check_interval_s), procs.log(worker)
    assert "past its deadline" in procs.log(worker)
