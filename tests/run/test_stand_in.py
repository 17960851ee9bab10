"""A ``SimpleLeaseWorker`` runs the job in the process whose thread renews its lease: a job
that holds the GIL in C code starves that thread. Its watchdog, a process of its own,
renews in the worker's place while the worker runs (rq_emq/run/stand_in.py): nothing the
job does stands between the lease and its renewal. It stands in for no stopped process,
and a renewal Redis refuses (the job deleted) leaves the run to end at its deadline."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import redis
from helpers import status
from jobs import run_spans, runs
from procs import Processes, pid_alive, wait_for
from rq import Queue

pytestmark = pytest.mark.slow

# lease 3 s, renewals every 300 ms: the worker trusts a renewal for 2.7 s; its watchdog
# stands in 0.9 s before that runs out, and ends the run 0.35 s after it (the self-kill's
# delay and a check interval): 1.25 s for a loaded host to schedule the watchdog
LEASE = {"RQ_EMQ_LEASE_MS": "3000", "RQ_EMQ_RENEW_INTERVAL_MS": "300", "RQ_EMQ_SWEEP_INTERVAL_MS": "500"}
#: ~2**28 backtracking steps in one C call holding the GIL: about 10 s here, 3 leases
GIL_LETTERS = 28
STOOD_IN = "in the place of worker"
CLOCK_RAN_OUT = "local lease clock ran out"


def _gil_job(r: redis.Redis, log: str) -> str:
    return str(Queue(connection=r).enqueue("jobs.hold_gil_first_run", log, GIL_LETTERS, job_timeout=300).id)


def test_a_job_holding_the_gil_for_leases_keeps_its_lease_and_runs_once(
    r: redis.Redis, procs: Processes, redis_url: str, tmp_path: Path
) -> None:
    """Beside an idle worker whose sweep would take the job the moment its lease lapsed,
    the GIL-holding run goes on to its end: one run, finished, its lease never lost."""
    log = str(tmp_path / "runs.log")
    job_id = _gil_job(r, log)
    simple = procs.worker(redis_url, worker_class="rq_emq.SimpleLeaseWorker", **LEASE)
    wait_for(lambda: runs(log), timeout=15, what="the run to start")
    procs.worker(redis_url, **LEASE)  # idle, sweeping
    wait_for(lambda: status(r, job_id) in ("finished", "failed"), timeout=120, what="the job to end")
    assert status(r, job_id) == "finished"
    assert len(run_spans(log)) == 1, f"the job ran again: {run_spans(log)}\n{procs.log(simple)[-3000:]}"
    log_text = procs.log(simple)
    assert STOOD_IN in log_text, log_text[-3000:]
    assert CLOCK_RAN_OUT not in log_text, log_text[-3000:]
    assert pid_alive(simple.pid), "the worker ended"


def test_a_frozen_worker_is_stood_in_for_by_no_one(
    r: redis.Redis, procs: Processes, redis_url: str, tmp_path: Path
) -> None:
    """SIGSTOP of the worker while its job holds the GIL: no process runs that job any more,
    so its watchdog renews nothing, ends it at its deadline, and the job runs elsewhere."""
    log = str(tmp_path / "runs.log")
    job_id = _gil_job(r, log)
    simple = procs.worker(redis_url, worker_class="rq_emq.SimpleLeaseWorker", **LEASE)
    wait_for(lambda: runs(log), timeout=15, what="the run to start")
    os.kill(simple.pid, signal.SIGSTOP)
    try:
        procs.worker(redis_url, **LEASE)
        wait_for(lambda: not pid_alive(simple.pid), timeout=10, what="the frozen run to be ended")
        wait_for(lambda: status(r, job_id) == "finished", timeout=30, what="the job to finish elsewhere")
        assert len(run_spans(log)) == 2
        assert STOOD_IN not in procs.log(simple)
    finally:
        if pid_alive(simple.pid):
            os.kill(simple.pid, signal.SIGCONT)


def test_a_run_whose_job_was_deleted_is_not_kept_alive_by_its_watchdog(
    r: redis.Redis, procs: Processes, redis_url: str, tmp_path: Path
) -> None:
    """The job is deleted while its run holds the GIL: the watchdog's renewal is refused
    (the lease is lost), so the run is ended at its deadline, long before its C call ends."""
    log = str(tmp_path / "runs.log")
    job_id = _gil_job(r, log)
    simple = procs.worker(redis_url, worker_class="rq_emq.SimpleLeaseWorker", **LEASE)
    wait_for(lambda: runs(log), timeout=15, what="the run to start")
    wait_for(lambda: STOOD_IN in procs.log(simple), timeout=10, what="the watchdog to stand in")
    Queue(connection=r).fetch_job(job_id).delete()  # type: ignore[union-attr]
    # refused at the next stand-in, ended a lease (3 s) and the run's delay after at most
    wait_for(lambda: not pid_alive(simple.pid), timeout=8, what="the run to be ended")
    assert "not renewed" in procs.log(simple), procs.log(simple)[-3000:]
    assert len(runs(log)) == 2, runs(log)  # its first lines, and never past the C call


def test_a_cold_stopped_run_that_then_holds_the_gil_is_not_kept_alive(
    r: redis.Redis, procs: Processes, redis_url: str, tmp_path: Path
) -> None:
    """A cold stop (two SIGTERMs) interrupts the job, which swallows the interrupt and then
    holds the GIL in C code for seconds: no thread of the worker runs, and the stopped run
    is no run to renew, so its watchdog ends the process the self-kill's delay and a check
    interval after the stop (0.375 s here), not when the C call returns."""
    log = str(tmp_path / "runs.log")
    job = Queue(connection=r).enqueue("jobs.swallow_then_hold_gil", log, GIL_LETTERS, job_timeout=300)
    simple = procs.worker(redis_url, worker_class="rq_emq.SimpleLeaseWorker", **LEASE)
    wait_for(lambda: len(runs(log)) > 3, timeout=15, what="the run to tick")
    os.kill(simple.pid, signal.SIGTERM)  # warm: the job may finish
    time.sleep(1.2)  # RQ takes a second stop signal within a second of the first as the same
    stopped_at = time.monotonic()
    os.kill(simple.pid, signal.SIGTERM)  # cold
    wait_for(lambda: simple.poll() is not None, timeout=30, what="the worker to end")
    ended_after = time.monotonic() - stopped_at
    lines = runs(log)
    assert any(line.startswith("swallowed") for line in lines), lines[-5:]
    assert not any(line.startswith("end") for line in lines), "the C call ran to its end"
    # 0.375 s by the settings; 5 s of slack for a loaded host, half the C call's length
    assert ended_after < 5.0, f"ended {ended_after:.2f} s after the cold stop"
    assert STOOD_IN not in procs.log(simple)
    wait_for(lambda: status(r, job.id) == "queued", timeout=10, what="the job handed back")
