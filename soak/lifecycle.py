"""The producer's side of RQ's job lifecycle in the soak mix: dependents (chains and
fan-in, some with ``allow_failure``), jobs canceled or deleted while they run, jobs with
``result_ttl=0``, and scheduled jobs (``enqueue_in``); and when such a job has settled.

A quarter of the producer's ticks plan one of these units instead of a plain job, so the
plain jobs keep the older checks' statistical power.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from rq import Callback, Queue, Retry
from rq.exceptions import InvalidJobOperation, NoSuchJobError
from rq.job import Dependency, Job

from .jobs import on_failure, work
from .model import Planned

#: share of producer ticks that plan a lifecycle unit instead of one plain job
SHARE = 0.25
UNITS = ("chain", "fanin", "cancel", "delete", "ttl0", "scheduled")
#: a cancel/delete acts at the latest this long after it was planned (its job may wait)
ACT_PATIENCE_S = 15.0
#: statuses after which a job needs nothing more
TERMINAL = {"finished", "failed"}


def _id() -> str:
    return str(uuid.uuid4())


def plan_unit(rng: random.Random, plain: Planned, lease_s: float) -> list[Planned]:
    """The jobs of one lifecycle unit, parents first. ``plain`` is a freshly planned plain
    job, used as a parent (without its one-stall max attempts)."""
    unit = rng.choice(UNITS)
    if unit == "chain":  # A -> B; A finishes (perhaps after a Retry)
        parent = _parent(plain, allow_raise=False)
        return [parent, _dependent(rng, [parent.job_id], allow_failure=False)]
    if unit == "fanin":  # A, B -> C; with allow_failure, a parent may always raise
        allow = rng.random() < 0.5
        first = _parent(plain, allow_raise=allow)
        outcome = "raise" if allow and rng.random() < 0.5 else "ok"
        second = Planned(_id(), round(rng.uniform(0.01, 0.5), 3), outcome, 0)
        second.kind = "parent"
        return [first, second, _dependent(rng, [first.job_id, second.job_id], allow_failure=allow)]
    if unit in ("cancel", "delete"):  # long enough to be caught running, some past the lease
        job = Planned(_id(), round(rng.uniform(0.8, 2.2 * lease_s), 3), "ok", 0, kind=unit)
        job.act_after = round(rng.uniform(0.05, 0.9), 3)
        return [job]
    if unit == "ttl0":
        return [Planned(_id(), round(rng.uniform(0.01, 0.5), 3), "ok", 0, kind="ttl0")]
    job = Planned(_id(), round(rng.uniform(0.01, 0.5), 3), "ok", 0, kind="scheduled")
    job.scheduled_for = round(rng.uniform(1.0, 8.0), 3)  # the delay, until enqueued
    return [job]


def _parent(plain: Planned, allow_raise: bool) -> Planned:
    plain.kind, plain.max_attempts = "parent", None
    if plain.outcome == "raise" and not allow_raise:
        plain.outcome = "ok"
    return plain


def _dependent(rng: random.Random, parents: list[str], allow_failure: bool) -> Planned:
    job = Planned(_id(), round(rng.uniform(0.01, 0.3), 3), "ok", 0, kind="dependent")
    job.parents, job.allow_failure = parents, allow_failure
    return job


def enqueue(client: Any, queue_name: str, log: str, job: Planned) -> None:
    """One enqueue (idempotent: a reply lost in a Redis restart is not enqueued twice)."""
    if client.exists(f"rq:job:{job.job_id}"):
        return
    queue = Queue(queue_name, connection=client)
    kwargs: dict[str, Any] = {
        "args": (log, job.seconds, job.outcome, job.retries),
        "job_id": job.job_id,
        "job_timeout": 120,
        "retry": Retry(max=job.retries) if job.retries else None,
        "meta": {"emq_max_attempts": job.max_attempts} if job.max_attempts else None,
        "on_failure": Callback(on_failure),
    }
    if job.kind == "dependent":
        kwargs["depends_on"] = Dependency(jobs=list(job.parents), allow_failure=job.allow_failure)
    if job.kind == "ttl0":
        kwargs["result_ttl"] = 0
    if job.kind == "scheduled":
        delay = job.scheduled_for or 0.0
        job.scheduled_for = time.time() + delay  # RQ's own clock reads later, never earlier
        queue.enqueue_in(timedelta(seconds=delay), work, **kwargs)
        return
    queue.enqueue(work, **kwargs)


def wait_to_act(job: Planned, started: Callable[[], bool], stop: threading.Event) -> None:
    """Until ``job`` runs (``started()`` says so) and ``act_after`` of its duration more; or
    ACT_PATIENCE_S, whatever its state."""
    deadline = time.monotonic() + ACT_PATIENCE_S
    while time.monotonic() < deadline and not stop.is_set() and not started():
        time.sleep(0.05)
    if started():
        time.sleep(job.act_after * job.seconds)


def act(client: Any, job: Planned) -> None:
    """``job.cancel()`` or ``job.delete()``, as a producer would; records when it returned."""
    if job.acting_since is None:
        job.acting_since = time.time()
    if job.acted_on is None:
        status = client.hget(f"rq:job:{job.job_id}", "status")
        job.acted_on = status.decode() if status is not None else "none"
    try:
        rq_job = Job.fetch(job.job_id, connection=client)
        if job.kind == "cancel":
            rq_job.cancel()
        else:
            rq_job.delete()
    except (InvalidJobOperation, NoSuchJobError):
        pass  # a retry after a reply lost in a restart: the first call took effect
    job.acted_at = time.time()


def settled(job: Planned, status: str | None, parents: list[str | None]) -> bool:
    """Whether ``job`` needs nothing more (its final state is then for the checks to judge)."""
    if job.kind in ("cancel", "delete"):
        return job.acted_at is not None
    if job.kind == "ttl0" and status is None:
        return True
    if job.kind == "dependent" and status == "deferred":
        # RQ leaves it deferred for good once a parent failed (unless failure is allowed)
        return not job.allow_failure and any(p == "failed" for p in parents)
    return status in TERMINAL
