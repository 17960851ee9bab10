"""What the integration tests share: optional packages that CI must have, and the crash
scenario a job viewer (rq-dashboard, django-rq) is checked against.

The scenario runs real ``rq worker -w rq_emq.LeaseWorker`` processes and a real
``rq-emq reaper``, SIGKILLs the worker mid-job, and asks the viewer at each step where it
lists the job: started while leased (even after stock cleanup ran through the viewer),
queued once recovered, finished after a second worker ran it, and failed (with our
reason) for a job that stalled at its last attempt.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Protocol

import pytest
import redis
from helpers import FAST, status, wait_status
from jobs import runs
from procs import Processes, unseen, wait_for
from redis_server import in_ci
from rq import Queue
from rq.job import Job

import rq_emq
from rq_emq.keys import QueueKeys

QUEUE = "default"


def require(module: str) -> None:
    """An optional package must be installed: skipped locally when missing, a failure in CI.
    Not imported here (django_rq must not be imported before Django is configured)."""
    if importlib.util.find_spec(module) is None:
        message = f"{module} is not installed (pip install -e '.[integrations]')"
        if in_ci():
            pytest.fail(f"{message}; CI (CI=true) must run these tests")
        pytest.skip(message)


class JobViewer(Protocol):
    """A job browser as its users see it."""

    def listed(self, registry: str) -> set[str]:
        """Job ids the viewer lists under ``registry``: queued, started, finished or failed."""
        ...

    def job_status(self, job_id: str) -> str:
        """The status the viewer shows for one job."""
        ...


def reaper(procs: Processes, url: str, *extra: str) -> subprocess.Popen[bytes]:
    return procs.start(
        [sys.executable, "-m", "rq_emq.operate.cli", "reaper", "--url", url, *extra, QUEUE],
        env=procs.env(**FAST),
        name="reaper",
    )


def starts(log: str) -> int:
    return sum(line.startswith("start") for line in runs(log))


def kill_mid_job(r: redis.Redis, procs: Processes, url: str, job: Job, log: str, runs_before: int) -> None:
    """Start a LeaseWorker, wait until it runs ``job``, SIGKILL it (its horse dies with
    it) and wait for the lease to lapse."""
    worker = procs.worker(url, QUEUE, **FAST)
    wait_for(lambda: starts(log) > runs_before, timeout=20, what=f"job {job.id} to start")
    os.kill(unseen(worker.pid), signal.SIGKILL)
    worker.wait(timeout=10)
    wait_for(lambda: not r.exists(QueueKeys(QUEUE).lock(job.id)), timeout=10, what="the lease to lapse")


def check_viewer_through_a_crash(
    r: redis.Redis, url: str, procs: Processes, tmp_path: Path, viewer: JobViewer
) -> tuple[str, str]:
    """Returns the ids of the recovered-then-finished job and of the failed one."""
    queue = Queue(QUEUE, connection=r)

    # 1. a leased job is listed as started, and stays so while its worker is dead and
    #    nobody has swept yet (viewers that run RQ's stock cleanup must not fail it)
    log = str(tmp_path / "recovered.log")
    job = queue.enqueue("integration_jobs.slow_on_first_run", log, 120.0, job_timeout=300)
    worker = procs.worker(url, QUEUE, **FAST)
    wait_for(lambda: starts(log) == 1, timeout=20, what="the job to start")
    assert job.id in viewer.listed("started")
    assert viewer.job_status(job.id) == "started"
    os.kill(unseen(worker.pid), signal.SIGKILL)
    worker.wait(timeout=10)
    wait_for(lambda: not r.exists(QueueKeys(QUEUE).lock(job.id)), timeout=10, what="the lease to lapse")
    assert job.id in viewer.listed("started") and status(r, job.id) == "started"

    # 2. our sweep recovers it: the viewer lists it queued, no longer started
    sweeper = reaper(procs, url)
    wait_status(r, job.id, "queued", timeout=20)
    assert job.id in viewer.listed("queued") and job.id not in viewer.listed("started")
    assert viewer.job_status(job.id) == "queued"

    # 3. another worker runs it: finished, once more, and nowhere else
    survivor = procs.worker(url, QUEUE, burst=True, **FAST)
    assert survivor.wait(timeout=30) == 0, procs.log(survivor)
    assert status(r, job.id) == "finished" and starts(log) == 2
    assert job.id in viewer.listed("finished")
    assert job.id not in viewer.listed("queued") | viewer.listed("started") | viewer.listed("failed")
    assert viewer.job_status(job.id) == "finished"

    # 4. a job that stalls on its last attempt is listed failed, with our reason
    last_log = str(tmp_path / "failed.log")
    doomed = queue.enqueue(
        "integration_jobs.slow_on_first_run",
        last_log,
        120.0,
        job_timeout=300,
        meta=rq_emq.max_attempts(1),
    )
    kill_mid_job(r, procs, url, doomed, last_log, 0)
    wait_status(r, doomed.id, "failed", timeout=20)
    wait_for(lambda: Job.fetch(doomed.id, connection=r).results(), timeout=15, what="the failure Result")
    assert doomed.id in viewer.listed("failed")
    assert doomed.id not in viewer.listed("queued") | viewer.listed("started")
    assert viewer.job_status(doomed.id) == "failed"
    sweeper.send_signal(signal.SIGTERM)
    assert sweeper.wait(timeout=15) == 0, procs.log(sweeper)
    return job.id, doomed.id
